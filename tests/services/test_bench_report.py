"""Load-generator pieces that need no server: workloads, percentiles, report files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.bench.client import RequestResult
from services.bench.report import markdown_table, percentile, summarize, write_json, write_plots
from services.bench.runner import RunConfig, api_base
from services.bench.workloads import WorkloadConfig, make_workload


def test_percentile_matches_linear_interpolation() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([5.0], 99) == 5.0


def test_agentic_sessions_grow_a_shared_history() -> None:
    workload = make_workload("agentic", WorkloadConfig(turns_min=3, turns_max=3, think_time_s=0.1), seed=1)
    a, b = workload.new_session(), workload.new_session()
    first_a, first_b = a.next_request(), b.next_request()
    assert first_a and first_b
    assert first_a.messages[0] == first_b.messages[0]  # the shared system prompt
    assert len(first_a.messages[0]["content"].split()) > 500
    a.record('{"tool": "search", "arguments": {}}')
    second = a.next_request()
    assert second and second.messages[: len(first_a.messages)] == first_a.messages
    assert len(second.messages) == len(first_a.messages) + 2
    a.record("x")
    assert a.next_request() is not None and a.next_request() is None
    assert a.think_time_s > 0


def test_workloads_are_reproducible() -> None:
    one = make_workload("chat", WorkloadConfig(), seed=3).new_session().next_request()
    two = make_workload("chat", WorkloadConfig(), seed=3).new_session().next_request()
    assert one == two
    rand = make_workload("random", WorkloadConfig(input_len=10, output_len=7, ignore_eos=True), 0)
    request = rand.new_session().next_request()
    assert request and request.max_tokens == 7 and request.extra_body == {"ignore_eos": True}
    with pytest.raises(ValueError):
        make_workload("nope", WorkloadConfig(), 0)


def result(ttft: float, itl: list[float], tokens: int, e2e: float, ok: bool = True) -> RequestResult:
    return RequestResult(
        ok=ok,
        start_s=0.0,
        end_s=e2e,
        ttft_s=ttft,
        itl_s=itl,
        prompt_tokens=10,
        output_tokens=tokens,
        error=None if ok else "boom",
    )


def test_summary_and_files(tmp_path: Path) -> None:
    results = [
        result(0.1, [0.02, 0.03], 3, 0.15),
        result(0.2, [0.05], 2, 0.25),
        result(0, [], 0, 1, ok=False),
    ]
    summary = summarize(4, results, duration_s=2.0)
    assert summary.completed == 2 and summary.failed == 1
    assert summary.qps == 1.0 and summary.output_tokens_per_s == 2.5 and summary.total_tokens_per_s == 12.5
    assert summary.ttft_s.p50 == pytest.approx(0.15) and summary.itl_s.count == 3
    assert summary.tpot_s.mean == pytest.approx(((0.15 - 0.1) / 2 + (0.25 - 0.2) / 1) / 2)
    table = markdown_table([summary])
    assert table.count("\n") == 2 and "| 4 | 2 | 1 |" in table
    write_json(tmp_path / "r.json", {"x": 1}, [summary])
    assert json.loads((tmp_path / "r.json").read_text())["levels"][0]["concurrency"] == 4
    write_plots(tmp_path / "r.png", "t", [summary, summarize(8, results, 1.0)])
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_run_config() -> None:
    assert api_base("http://h:1") == "http://h:1/v1" and api_base("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(ValueError):
        RunConfig("http://h", "m", (1,))
    with pytest.raises(ValueError):
        RunConfig("http://h", "m", (0,), num_requests=1)
