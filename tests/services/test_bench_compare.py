"""Bench runs side by side, and the request options a peer server needs: no server required."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import httpx
import pytest

from services.bench.client import RequestResult, stream_chat
from services.bench.compare import BenchRun, common_levels, main, ratios, side_by_side_table, write_comparison
from services.bench.report import read_json, summarize, write_json
from services.bench.workloads import BenchRequest


def result(ttft: float, itl: list[float], tokens: int, e2e: float) -> RequestResult:
    return RequestResult(
        ok=True, start_s=0.0, end_s=e2e, ttft_s=ttft, itl_s=itl, prompt_tokens=10, output_tokens=tokens
    )


def write_run(path: Path, label: str, scale: float, levels: tuple[int, ...]) -> Path:
    """A run whose latencies are `scale` times a fixed set and whose duration too (so rates are 1/scale)."""
    results = [
        result(0.1 * scale, [0.02 * scale, 0.04 * scale], 3, 0.2 * scale),
        result(0.3 * scale, [], 1, 0.3 * scale),
    ]
    summaries = [summarize(c, results, duration_s=2.0 * scale) for c in levels]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"label": label, "url": "http://x"}, summaries)
    return path


def test_read_json_inverts_write_json(tmp_path: Path) -> None:
    path = write_run(tmp_path / "a.json", "ours", 1.0, (1, 4))
    meta, levels = read_json(path)
    assert meta["label"] == "ours" and [s.concurrency for s in levels] == [1, 4]
    assert levels[0].ttft_s.p50 == pytest.approx(0.2) and levels[0].itl_s.count == 2
    assert levels[0].errors == () and levels[0].tpot_s.p99 > 0
    # a single-token answer has no TPOT: a level where no request has one stores NaN and reads it back
    write_json(tmp_path / "b.json", {}, [summarize(1, [result(0.1, [], 1, 0.1)], 1.0)])
    assert math.isnan(read_json(tmp_path / "b.json")[1][0].tpot_s.mean)


def test_ratios_are_run_over_reference_on_common_levels(tmp_path: Path) -> None:
    ours = BenchRun.load(write_run(tmp_path / "ours" / "bench.json", "ours", 1.0, (1, 4, 16)))
    peer = BenchRun.load(write_run(tmp_path / "peer" / "bench.json", "peer", 2.0, (1, 4)), label="transformers")
    assert peer.label == "transformers" and common_levels([ours, peer]) == [1, 4]
    by_level = ratios([ours, peer], reference=peer)
    assert [(r.concurrency, r.numerator, r.denominator) for r in by_level] == [
        (1, "ours", "transformers"),
        (4, "ours", "transformers"),
    ]
    assert by_level[0].latencies["ttft_s"]["p50"] == pytest.approx(0.5)
    assert by_level[0].latencies["itl_s"]["p99"] == pytest.approx(0.5)
    assert by_level[0].output_tokens_per_s == pytest.approx(2.0) and by_level[0].qps == pytest.approx(2.0)
    table = side_by_side_table([ours, peer], peer)
    assert table.count("\n") == 2 + 2 * 3 - 1  # head, rule, then per level: two runs and one ratio row
    assert "| 4 | **ours / transformers** | | | **2.00** | **2.00** | 0.50 / 0.50 / 0.50 / 0.50 |" in table


def test_write_comparison_files(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a" / "bench.json", "ours", 1.0, (1, 4))
    b = write_run(tmp_path / "b" / "bench.json", "peer", 3.0, (1, 4))
    main([f"ours={a}", f"peer={b}", "--out", str(tmp_path / "out" / "cmp")])
    data = json.loads((tmp_path / "out" / "cmp.json").read_text())  # strict JSON: no NaN
    assert [r["label"] for r in data["runs"]] == ["ours", "peer"]
    assert data["ratios"][1]["concurrency"] == 4 and data["ratios"][1]["qps"] == pytest.approx(3.0)
    assert (tmp_path / "out" / "cmp.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "out" / "cmp.md").read_text().startswith("| conc | server |")
    # a third run, divided by the one named as reference
    c = write_run(tmp_path / "c" / "bench.json", "other", 2.0, (1, 4))
    table = write_comparison(tmp_path / "three", "t", {}, [BenchRun.load(p) for p in (a, b, c)], "peer")
    assert "**ours / peer** | | | **3.00**" in table and "**other / peer** | | | **1.50**" in table
    with pytest.raises(ValueError):
        write_comparison(tmp_path / "x", "t", {}, [BenchRun.load(a), BenchRun.load(b)], reference="nope")
    with pytest.raises(ValueError):
        write_comparison(tmp_path / "x", "t", {}, [BenchRun.load(a)])
    with pytest.raises(ValueError):
        write_comparison(tmp_path / "x", "t", {}, [BenchRun.load(a), BenchRun.load(b, label="ours")])


def sent_body(temperature: float | None) -> dict[str, object]:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        chunk = {"choices": [{"delta": {"content": "hi"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
        return httpx.Response(200, text=f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n")

    async def go() -> RequestResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            request = BenchRequest([{"role": "user", "content": "x"}], 4)
            return await stream_chat(client, "http://s/v1/chat/completions", "m", request, {}, 10, temperature)

    assert asyncio.run(go()).ok
    return bodies[0]


def test_temperature_is_sent_only_when_asked() -> None:
    assert "temperature" not in sent_body(None)
    body = sent_body(0.0)
    assert body["temperature"] == 0.0 and body["max_tokens"] == 4 and body["stream"] is True
