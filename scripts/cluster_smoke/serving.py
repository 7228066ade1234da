"""Serving checks against the gateway pod: a streamed chat completion through the official
`openai` client, and the TTFT/TPOT histograms on /metrics."""

from __future__ import annotations

import time

from scripts.cluster_smoke.pods import Pod, SmokeError

HISTOGRAMS = ("dspark_time_to_first_token_seconds", "dspark_time_per_output_token_seconds")


def stream_chat(gateway: Pod, prompt: str, max_tokens: int = 24) -> float:
    """One streamed completion; seconds from the request to the first content token."""
    import openai

    port = gateway.plan.ports["http"]
    client = openai.OpenAI(base_url=f"http://{gateway.address}:{port}/v1", api_key="smoke", timeout=120, max_retries=0)
    try:
        model = client.models.list().data[0].id
        started = time.monotonic()
        first, text = 0.0, []
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True
        )
        for chunk in stream:
            delta = chunk.choices[0].delta.content if chunk.choices else None
            if delta:
                first = first or time.monotonic() - started
                text.append(delta)
    except openai.OpenAIError as e:
        raise SmokeError(f"streamed chat completion failed: {e!r}", gateway) from e
    if not text:
        raise SmokeError("the streamed completion returned no content", gateway)
    print(f"  chat ({model}): {''.join(text)!r}", flush=True)
    return first


def histogram_counts(metrics_text: str) -> dict[str, float]:
    """`<histogram>_count` summed over label sets, for each histogram that has _bucket series."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    buckets: set[str] = set()
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.add(sample.name[: -len("_bucket")])
            elif sample.name.endswith("_count"):
                base = sample.name[: -len("_count")]
                counts[base] = counts.get(base, 0.0) + sample.value
    return {name: value for name, value in counts.items() if name in buckets}


def check_metrics(gateway: Pod) -> dict[str, float]:
    status, body = gateway.http_get("/metrics", gateway.plan.ports["http"], 10)
    if status != 200:
        raise SmokeError(f"/metrics answered {status}", gateway)
    counts = histogram_counts(body)
    missing = [name for name in HISTOGRAMS if counts.get(name, 0) < 1]
    if missing:
        raise SmokeError(f"/metrics: histograms without observations: {missing} (have {counts})", gateway)
    print("  /metrics: " + ", ".join(f"{name}_count={counts[name]:g}" for name in HISTOGRAMS), flush=True)
    return counts
