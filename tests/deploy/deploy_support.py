"""Helpers of the deployment tests: chart rendering, CRD schemas, PromQL parsing, a live Prometheus.

Metric names always come from services/metrics.py (`METRIC_SPECS`, `exported_series_names`).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from services.metrics import METRIC_SPECS, exported_series_names

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "dspark-serve"
PROFILE_DIR = CHART_DIR / "profiles"
RULES_FILE = CHART_DIR / "files" / "rules.yaml"
RULES_TEST_FILE = Path(__file__).resolve().parent / "promtool" / "rules_test.yaml"
DASHBOARD_DIR = REPO / "dashboards"
CRD_DIR = REPO / "tests" / "data" / "crds"

RELEASE = "dspark"
NAMESPACE = "llm"
KUBE_VERSION = "1.33.0"
PROFILES = tuple(sorted(p.stem for p in PROFILE_DIR.glob("*.yaml")))
CRD_KINDS = ("RayCluster", "ServiceMonitor", "PrometheusRule", "ScaledObject")

# Every name Prometheus stores for our metrics (histograms as _bucket/_sum/_count).
EXPORTED_SERIES: frozenset[str] = frozenset(n for s in METRIC_SPECS for n in exported_series_names(s))


# --- Values and rendering -------------------------------------------------------------------


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Layer values the way `helm -f a.yaml -f b.yaml` does: maps merge, everything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_profile(profile: str) -> dict[str, Any]:
    return yaml.safe_load((PROFILE_DIR / f"{profile}.yaml").read_text()) or {}


@functools.lru_cache(maxsize=1)
def _chart() -> Any:
    import helm_python

    return helm_python.Chart.load(CHART_DIR)


@functools.lru_cache(maxsize=64)
def _render_cached(values_json: str, name: str, namespace: str) -> tuple[tuple[str, str], ...]:
    rendered = _chart().render(json.loads(values_json), name=name, namespace=namespace)
    return tuple(sorted(rendered.items()))


def render_files(
    values: dict[str, Any] | None = None,
    profile: str | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included)."""
    merged = deep_merge(load_profile(profile) if profile else {}, values or {})
    return dict(_render_cached(json.dumps(merged, sort_keys=True), name, namespace))


def render(
    values: dict[str, Any] | None = None,
    profile: str | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
) -> list[dict[str, Any]]:
    """The chart's Kubernetes objects for a profile (or the defaults) plus extra values."""
    docs: list[dict[str, Any]] = []
    for path, text in render_files(values, profile, name=name, namespace=namespace).items():
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return copy.deepcopy(docs)


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in objects(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def worker_group(docs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    groups = one(docs, "RayCluster")["spec"]["workerGroupSpecs"]
    (group,) = [g for g in groups if g["groupName"] == role]
    return group


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod spec) for every pod the chart defines, RayCluster groups included."""
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "Deployment":
            yield where, doc["spec"]["template"]["spec"]
        elif doc["kind"] == "RayCluster":
            yield f"{where}/head", doc["spec"]["headGroupSpec"]["template"]["spec"]
            for group in doc["spec"]["workerGroupSpecs"]:
                yield f"{where}/{group['groupName']}", group["template"]["spec"]


# --- Schemas ----------------------------------------------------------------------------------


def kubernetes_errors(docs: list[dict[str, Any]]) -> list[str]:
    """Validate core objects against the Kubernetes 1.33 schemas, strictly: the function the
    `kubernetes-validate -k 1.33.0 --strict` command runs, in process. Unlike the command, an
    object whose kind has no schema is an error, not a warning."""
    import kubernetes_validate
    import kubernetes_validate.utils

    # The library re-reads its (large) schema files for every object; they never change.
    if not hasattr(kubernetes_validate.utils.schema_contents, "cache_info"):
        kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
            kubernetes_validate.utils.schema_contents
        )
    errors = []
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{where}: {e.message}")
    return errors


def kubernetes_validate_cli(docs: list[dict[str, Any]], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the `kubernetes-validate -k 1.33.0 --strict` command over the objects, one file each."""
    exe = shutil.which("kubernetes-validate")
    assert exe, "kubernetes-validate is not installed (pip install kubernetes-validate==1.37.0)"
    paths = []
    for i, doc in enumerate(docs):
        path = tmp_path / f"{i:03d}-{doc['kind']}-{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        paths.append(str(path))
    return subprocess.run(
        [exe, "-k", KUBE_VERSION, "--strict", "--quiet", *paths], capture_output=True, text=True, timeout=120
    )


def embedded_objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Core objects nested in a custom resource, wrapped so kubernetes-validate can check them:
    each RayCluster pod template as a v1 PodTemplate, and every CR's metadata as a ConfigMap's."""
    name = doc["metadata"]["name"]
    wrapped: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
    ]
    if doc["kind"] == "RayCluster":
        templates = [("head", doc["spec"]["headGroupSpec"]["template"])]
        templates += [(g["groupName"], g["template"]) for g in doc["spec"]["workerGroupSpecs"]]
        for group, template in templates:
            wrapped.append(
                {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": f"{name}-{group}"},
                    "template": template,
                }
            )
    return wrapped


def _strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD structural schema as JSON Schema that rejects unknown fields (the API server would
    prune them silently) except where the CRD preserves them."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: _strict_schema(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict_schema(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = _strict_schema(out["items"])
    if "anyOf" in out:
        out["anyOf"] = [_strict_schema(s) for s in out["anyOf"]]
    return out


_FORMATS = jsonschema.FormatChecker()


@_FORMATS.checks("int32")
def _is_int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """(apiVersion, kind) -> validator, from the vendored CRDs in tests/data/crds."""
    validators = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            schema = _strict_schema(version["schema"]["openAPIV3Schema"])
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            validators[key] = jsonschema.Draft7Validator(schema, format_checker=_FORMATS)
    return validators


def crd_errors(doc: dict[str, Any]) -> list[str]:
    validator = crd_validators().get((doc["apiVersion"], doc["kind"]))
    assert validator is not None, f"no vendored CRD schema for {doc['apiVersion']} {doc['kind']}"
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)]


# --- PromQL -----------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
# Identifiers not inside another token (so `5m:1m` in a subquery range is not one).
_IDENT = re.compile(r"(?<![\w:.$])[A-Za-z_:][A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"\b(dspark_[A-Za-z0-9_]+)\s*(\{[^}]*\})?")


def series_names_in(expr: str) -> set[str]:
    """Metric and recording-rule names a PromQL expression reads: identifiers that start with
    `dspark_` or contain a colon (recording-rule convention), outside string literals."""
    bare = _STRING.sub('""', expr)
    return {m for m in _IDENT.findall(bare) if m.startswith("dspark_") or ":" in m}


def selectors_in(expr: str) -> list[tuple[str, str]]:
    """(metric name, label-matcher text) for every `dspark_*` selector in the expression."""
    return [(m.group(1), m.group(2) or "") for m in _SELECTOR.finditer(expr)]


# Grafana renders these before a query reaches Prometheus. The live test substitutes them the
# same way: template variables select everything (an "All" multi-value variable is the regex
# `.*`), and interval macros become windows that hold several samples of a 1 s scrape.
GRAFANA_SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1m",
    "$namespace": ".*",
    "$model": ".*",
}


def grafana_to_promql(expr: str) -> str:
    """A dashboard query as Prometheus receives it; fails on a variable we do not know."""
    out = expr
    for macro in sorted(GRAFANA_SUBSTITUTIONS, key=len, reverse=True):
        out = out.replace("${" + macro[1:] + "}", GRAFANA_SUBSTITUTIONS[macro])
        out = out.replace(macro, GRAFANA_SUBSTITUTIONS[macro])
    assert "$" not in out, f"unknown Grafana variable left in {out!r}"
    return out


_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def parse_label_values(query: str) -> tuple[str | None, str]:
    """Grafana's `label_values(selector, label)` variable query -> (selector, label)."""
    match = _LABEL_VALUES.match(query)
    assert match, f"not a label_values() query: {query!r}"
    return match.group(1), match.group(2)


# --- Dashboards -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARD_DIR.glob("*.json"))


def load_dashboard(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # panels inside collapsed rows


def panel_queries() -> list[PanelQuery]:
    queries = []
    for path in dashboard_files():
        for panel in panels(load_dashboard(path)):
            for target in panel.get("targets", []):
                queries.append(PanelQuery(path.name, panel["title"], target["expr"]))
    return queries


def variable_queries() -> list[tuple[str, str, str]]:
    """(dashboard, variable, query) for every query-type template variable."""
    out = []
    for path in dashboard_files():
        for var in load_dashboard(path)["templating"]["list"]:
            if var["type"] == "query":
                query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                out.append((path.name, var["name"], query))
    return out


# --- Rules ------------------------------------------------------------------------------------


def load_rules() -> dict[str, Any]:
    return yaml.safe_load(RULES_FILE.read_text())


def rules_of(groups: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for group in groups:
        yield from group["rules"]


# --- A live Prometheus scraping an exporter -----------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _MetricsHandler(BaseHTTPRequestHandler):
    body_fn: Any = None  # set per server class

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        from prometheus_client import CONTENT_TYPE_LATEST

        body = type(self).body_fn() if self.path.startswith("/metrics") else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def serve_metrics(body_fn: Any) -> tuple[ThreadingHTTPServer, int]:
    """An HTTP server on loopback whose /metrics answers body_fn()."""
    handler = type("Handler", (_MetricsHandler,), {"body_fn": staticmethod(body_fn)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


class LivePrometheus:
    """A real Prometheus on loopback (ephemeral port, temporary directory) with the given
    scrape targets and rule files, scraping every second."""

    def __init__(self, targets: list[tuple[int, dict[str, str]]], rule_files: list[Path], workdir: Path):
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed"
        self.binary: str = binary
        self.port = free_port()
        self.workdir = workdir
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {
                    "job_name": "dspark-serve",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{port}"], "labels": labels} for port, labels in targets
                    ],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "prometheus.log"

    def __enter__(self) -> LivePrometheus:
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        self._wait(self._is_ready, 60, "Prometheus to be ready")
        return self

    def _is_ready(self) -> bool:
        """/-/ready answers 503 while the TSDB is still opening and 200 once queries work."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:  # HTTPError (503 while starting) and refused connections alike
            return False

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _get(self, path: str, params: dict[str, Any] | list[tuple[str, str]] | None = None) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            if e.code >= 500:  # starting up or overloaded: no answer yet, callers wait or fail
                return None
            body = e.read()  # Prometheus explains a bad query in a 4xx JSON body
        except OSError:
            return None
        return json.loads(body) if path.startswith("/api/") else body

    def _wait(self, ready: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"Prometheus exited:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def wait_for_samples(self, metric: str, samples: int, timeout_s: float = 30) -> None:
        """Until every target has been scraped `samples` times (so rate() has points)."""

        def enough() -> bool:
            result = self.query(f"count_over_time({metric}[1m])", check=False)
            return bool(result) and min(float(r["value"][1]) for r in result) >= samples

        self._wait(enough, timeout_s, f"{samples} scrapes of {metric}")

    def wait_for_rule_evaluations(self, timeout_s: float = 30) -> None:
        """Until every rule has been evaluated at least once."""

        def evaluated() -> bool:
            groups = (self._get("/api/v1/rules") or {}).get("data", {}).get("groups", [])
            rules = [r for g in groups for r in g["rules"]]
            # Prometheus reports a rule never evaluated with the zero time, 0001-01-01T00:00:00Z.
            return bool(rules) and all(not r.get("lastEvaluation", "0001").startswith("0001") for r in rules)

        self._wait(evaluated, timeout_s, "rule evaluations")

    def query(self, expr: str, *, check: bool = True) -> list[dict[str, Any]]:
        answer = self._get("/api/v1/query", {"query": expr})
        if check:
            assert answer is not None, f"no answer for {expr!r}"
            assert answer.get("status") == "success", f"{expr!r}: {answer}"
        if not answer or answer.get("status") != "success":
            return []
        return list(answer["data"]["result"])

    def label_values(self, label: str, match: str | None) -> list[str]:
        params = [("match[]", match)] if match else []
        answer = self._get(f"/api/v1/label/{label}/values", params)
        assert answer and answer.get("status") == "success", f"label_values({match}, {label}): {answer}"
        return list(answer["data"])

    def rules(self) -> list[dict[str, Any]]:
        answer = self._get("/api/v1/rules")
        assert answer and answer.get("status") == "success", answer
        return [r for g in answer["data"]["groups"] for r in g["rules"]]


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result if math.isfinite(float(r["value"][1]))]


# --- values.yaml documentation ------------------------------------------------------------------

_KEY_LINE = re.compile(r"^(\s*)([A-Za-z0-9_.\-/]+):(\s|$)")
_COMMENTED_KEY = re.compile(r"^(\s*)#\s+([A-Za-z0-9_]+):(\s|$)")


def documented_values(text: str) -> dict[str, str]:
    """Dotted path -> description for every key with a `# --` comment (the helm-docs convention:
    the comment documents the key below it as a whole). A documented key that is commented out
    (`# gpusPerPod: 8`) is an optional value that is unset by default."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        match = _KEY_LINE.match(line) or (_COMMENTED_KEY.match(line) if pending else None)
        if match and not stripped.startswith("- "):
            indent, key = len(match.group(1)), match.group(2)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = ".".join([k for _, k in stack] + [key])
            if pending:
                docs[path] = " ".join(pending)
                pending = []
            if not stripped.startswith("#"):
                stack.append((indent, key))
        elif pending and stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
    return docs


def leaf_paths(values: Any, prefix: str = "") -> set[str]:
    if isinstance(values, dict) and values:
        out: set[str] = set()
        for key, value in values.items():
            out |= leaf_paths(value, f"{prefix}.{key}" if prefix else key)
        return out
    return {prefix}
