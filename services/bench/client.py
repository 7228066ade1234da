"""One streamed chat completion against any OpenAI-compatible server, timed as the client
sees it: TTFT (send -> first content chunk), ITL (between content chunks), e2e."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from services.bench.workloads import BenchRequest


@dataclass
class RequestResult:
    ok: bool
    start_s: float  # perf_counter at send
    end_s: float
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # per content chunk after the first
    prompt_tokens: int = 0
    output_tokens: int = 0
    text: str = ""
    error: str | None = None

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    request: BenchRequest,
    headers: dict[str, str],
    timeout_s: float,
    temperature: float | None = None,
) -> RequestResult:
    """`temperature=None` leaves sampling to the server's default (which differs between servers)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": request.messages,
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **request.extra_body,
    }
    if temperature is not None:
        body["temperature"] = temperature
    start = time.perf_counter()
    result = RequestResult(ok=False, start_s=start, end_s=start)
    last_content: float | None = None
    chunks_with_content = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers, timeout=timeout_s) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", "replace")[:300]
                result.error = f"HTTP {response.status_code}: {detail}"
                result.end_s = time.perf_counter()
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                payload = json.loads(data)
                if "error" in payload:
                    result.error = str(payload["error"].get("message", payload["error"]))
                    break
                now = time.perf_counter()
                for choice in payload.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        chunks_with_content += 1
                        result.text += content
                        if result.ttft_s is None:
                            result.ttft_s = now - start
                        elif last_content is not None:
                            result.itl_s.append(now - last_content)
                        last_content = now
                usage = payload.get("usage")
                if usage:
                    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    result.output_tokens = int(usage.get("completion_tokens") or 0)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.end_s = time.perf_counter()
    if result.output_tokens == 0:
        result.output_tokens = chunks_with_content
    result.ok = result.error is None
    return result
