"""A Kubernetes API server for custom objects on loopback, as strict about writes as kube-apiserver.

No API server can run here and kmock accepts any PATCH body under any content type, so the
planner's writes are checked against this instead. It serves GET and PATCH of namespaced
custom objects (`/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}`) to the official
client and, like kube-apiserver for a custom resource:

- takes `application/json-patch+json` (a list of RFC 6902 operations; a failed `test` or a
  bad path is 422), `application/merge-patch+json` (RFC 7386, a JSON object) and
  `application/apply-patch+yaml` (needs `fieldManager`; applied here as a merge);
  `application/strategic-merge-patch+json` and anything else is 415;
- refuses a body that does not parse or has the wrong shape for its type with 400;
- is optimistic: a write whose result carries a `metadata.resourceVersion` other than the
  stored one is 409 Conflict; every accepted write bumps the version.

Every request is recorded (`requests`) so tests can check what was sent.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    content_type: str
    body: Any


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer {path!r} does not start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"path {path!r} does not exist") from None
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, key = _parent(doc, parts, path)
    try:
        return parent[int(key)] if isinstance(parent, list) else parent[key]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, "Invalid", f"path {path!r} does not exist") from None


def _add(doc: Any, path: str, value: Any) -> None:
    parent, key = _parent(doc, _pointer(path), path)
    if isinstance(parent, list):
        index = len(parent) if key == "-" else int(key)
        if not 0 <= index <= len(parent):
            raise ApiError(422, "Invalid", f"index of {path!r} out of range")
        parent.insert(index, value)
    elif isinstance(parent, dict):
        parent[key] = value
    else:
        raise ApiError(422, "Invalid", f"path {path!r} does not exist")


def _remove(doc: Any, path: str) -> Any:
    _get(doc, path)
    parent, key = _parent(doc, _pointer(path), path)
    return parent.pop(int(key) if isinstance(parent, list) else key)


def apply_json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 on a copy of `doc`."""
    if not isinstance(operations, list) or not all(isinstance(op, dict) for op in operations):
        raise ApiError(400, "BadRequest", "a JSON Patch must be a list of operations")
    result = copy.deepcopy(doc)
    for op in operations:
        kind, path = op.get("op"), op.get("path", "")
        if kind == "test":
            if _get(result, path) != op.get("value"):
                raise ApiError(422, "Invalid", f"testing value {path} failed")
        elif kind == "add":
            _add(result, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(result, path)
        elif kind == "replace":
            _remove(result, path)
            _add(result, path, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            value = _remove(result, op["from"]) if kind == "move" else copy.deepcopy(_get(result, op["from"]))
            _add(result, path, value)
        else:
            raise ApiError(400, "BadRequest", f"unknown JSON Patch operation {kind!r}")
    return result


def apply_merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


class StrictKubeApi:
    """Serves `objects` ({(api path of the collection, namespace, name): object}) until `close`.
    `on_write(key, before, after)` runs after every accepted write, as a controller would."""

    def __init__(self, on_write: Callable[[tuple[str, str, str], dict[str, Any], dict[str, Any]], None] | None = None):
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.requests: list[Recorded] = []
        self.on_write = on_write
        self._version = 1000
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                api._serve(self, "GET")

            def do_PATCH(self) -> None:  # noqa: N802
                api._serve(self, "PATCH")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def put(self, collection: str, obj: dict[str, Any]) -> None:
        """Store `obj` under `collection` (e.g. 'apis/ray.io/v1/rayclusters') with a fresh version."""
        meta = obj["metadata"]
        with self._lock:
            stored = copy.deepcopy(obj)
            stored["metadata"]["resourceVersion"] = self._next_version()
            self.objects[(collection, meta["namespace"], meta["name"])] = stored

    def get(self, collection: str, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.objects[(collection, namespace, name)])

    def patches(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "PATCH"]

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _key(self, path: str) -> tuple[str, str, str]:
        # /apis/{group}/{version}/namespaces/{ns}/{plural}/{name}
        parts = path.strip("/").split("/")
        if len(parts) != 7 or parts[0] != "apis" or parts[3] != "namespaces":
            raise ApiError(404, "NotFound", f"no route {path}")
        return f"apis/{parts[1]}/{parts[2]}/{parts[5]}", parts[4], parts[6]

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(handler.path)
        content_type = (handler.headers.get("Content-Type") or "").split(";")[0].strip()
        raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append(Recorded(method, url.path, content_type, body))
        try:
            key = self._key(url.path)
            with self._lock:
                if key not in self.objects:
                    raise ApiError(404, "NotFound", f"{key[0]} {key[1]}/{key[2]} not found")
                if method == "GET":
                    result = copy.deepcopy(self.objects[key])
                else:
                    result = self._patch(key, content_type, raw, parse_qs(url.query))
        except ApiError as exc:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": exc.message}
            self._reply(handler, exc.code, {**status, "reason": exc.reason, "code": exc.code})
            return
        self._reply(handler, 200, result)

    def _patch(self, key: tuple[str, str, str], content_type: str, raw: bytes, query: dict[str, list[str]]) -> Any:
        current = self.objects[key]
        try:
            body = json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "the patch body is not JSON") from None
        if content_type == JSON_PATCH:
            patched = apply_json_patch(current, body)
        elif content_type == MERGE_PATCH:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            patched = apply_merge_patch(current, body)
        elif content_type == APPLY_PATCH:
            if not query.get("fieldManager"):
                raise ApiError(400, "BadRequest", "fieldManager is required for apply patch")
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "an apply patch must be an object")
            patched = apply_merge_patch(current, body)
        else:
            raise ApiError(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
            )
        version = current["metadata"]["resourceVersion"]
        sent = patched.get("metadata", {}).get("resourceVersion", version)
        if sent != version:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {key[0]} "{key[2]}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )
        patched["metadata"]["resourceVersion"] = self._next_version()
        self.objects[key] = patched
        if self.on_write is not None:
            self.on_write(key, current, patched)
        return copy.deepcopy(patched)

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, code: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
