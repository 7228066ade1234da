"""Load-generator pieces that need no server: workloads, percentiles, report files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.bench.client import RequestResult
from services.bench.plots import plot_figure, write_plots
from services.bench.report import markdown_table, percentile, summarize, write_json
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
    assert table.endswith("| 200.0 / 200.0 / 240.0 / 245.0 / 249.0 |")  # E2E of the two completed
    write_json(tmp_path / "r.json", {"x": 1}, [summary])
    assert json.loads((tmp_path / "r.json").read_text())["levels"][0]["concurrency"] == 4
    write_plots(tmp_path / "r.png", "t", [summary, summarize(8, results, 1.0)])
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_plots_show_every_latency_with_its_sample_count_and_the_failures() -> None:
    results = [result(0.1, [0.02, 0.03], 3, 0.15), result(0.2, [0.05], 2, 0.25), result(0, [], 0, 1, ok=False)]
    all_failed = [result(0, [], 0, 1, ok=False)] * 2
    levels = [summarize(1, results, 2.0), summarize(4, all_failed, 1.0)]
    figure = plot_figure("t", levels)
    panels = {ax.get_title(): ax for ax in figure.axes}
    assert list(panels) == [
        "TTFT",
        "TPOT",
        "ITL",
        "end-to-end latency",
        "throughput",
        "completed requests/s",
        "requests per level",
        "failed requests",
    ]

    def notes(title: str) -> list[str]:
        return [text.get_text() for text in panels[title].texts]

    # n per point: requests for TTFT and end-to-end, gaps between chunks for ITL; no point, no n
    assert notes("TTFT") == ["n=2"] and notes("end-to-end latency") == ["n=2"] and notes("ITL") == ["n=3"]
    completed, failed = panels["requests per level"].get_lines()
    assert list(completed.get_ydata()) == [2, 0] and list(failed.get_ydata()) == [1, 2]
    (share,) = panels["failed requests"].get_lines()
    assert list(share.get_ydata()) == pytest.approx([100 / 3, 100.0])
    p50 = panels["ITL"].get_lines()[0]
    assert p50.get_label() == "p50" and p50.get_ydata()[0] == pytest.approx(30.0)


def test_run_config() -> None:
    assert api_base("http://h:1") == "http://h:1/v1" and api_base("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(ValueError):
        RunConfig("http://h", "m", (1,))
    with pytest.raises(ValueError):
        RunConfig("http://h", "m", (0,), num_requests=1)
