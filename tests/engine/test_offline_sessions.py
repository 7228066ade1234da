"""benchmarks/offline_sessions.py's closed loop: `bench`'s agentic sessions through the
engine in-process, each client one session at a time, until the level's request budget is
spent, timed as a client times a server."""

from __future__ import annotations

from benchmarks.offline_sessions import ClosedLoop
from services.bench.report import summarize
from services.bench.workloads import WorkloadConfig, make_workload


def test_a_level_spends_its_budget_in_whole_turns(make_engine) -> None:
    engine = make_engine(max_num_seqs=4)
    cfg = WorkloadConfig(system_prompt_words=30, turns_min=2, turns_max=2, think_time_s=0.01, max_tokens=4)
    level = ClosedLoop(engine, make_workload("agentic", cfg, seed=3), budget=6, temperature=0.0)
    elapsed = level.run(concurrency=2)

    assert len(level.results) == 6 and all(r.ok for r in level.results)
    for result in level.results:
        assert result.ttft_s is not None and 0 < result.ttft_s <= result.e2e_s
        assert 1 <= result.output_tokens <= 4 and result.text
        assert len(result.itl_s) <= result.output_tokens - 1
    # second turns carry the first turn's reply and a tool result: their prompts are longer
    prompts = sorted(r.prompt_tokens for r in level.results)
    assert prompts[-1] > prompts[0]
    assert not engine.has_unfinished_requests()
    summary = summarize(2, level.results, elapsed)
    assert summary.completed == 6 and summary.failed == 0
