"""The chaos soak (benchmarks/chaos_soak.py) on a real local stack: a prefill worker and two
decode workers on Ray, the gateway as its own process, agentic streams while workers are
SIGKILLed, drained and SIGTERMed (docs/design.md §5.6, §6.9, §6.10). The soak's own checks are
the assertions: no stream cut, hung or answered 5xx; greedy texts equal an undisturbed rerun;
no request past its deadline; every worker's KV slots free at the end."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from benchmarks.chaos_load import StreamRecord
from benchmarks.chaos_soak import SoakResult, configs_from_args, parser, run_soak, table, violations
from benchmarks.chaos_stack import running_stack

pytestmark = pytest.mark.timeout(1200)


def soak(argv: Sequence[str]) -> SoakResult:
    stack_config, soak_config = configs_from_args(parser().parse_args(list(argv)))
    with running_stack(stack_config) as stack:
        result = run_soak(stack, soak_config)
        broken = violations(result)
        log = stack.gateway_log_tail() if broken else ""
    print(table(result))
    assert not broken, "\n".join([*broken, "gateway log:", log])
    return result


def assert_every_fault_and_some_traffic(result: SoakResult) -> None:
    hits = {(f.kind, f.worker.rsplit("-", 2)[1]) for f in result.faults}
    assert {("kill9", "prefill"), ("kill9", "decode"), ("drain_and_restart", "decode")} <= hits, result.faults
    chaos: list[StreamRecord] = result.phase("chaos")
    assert any(r.outcome == "completed" for r in chaos), [r.summary() for r in chaos]
    assert any(r.reference is not None for r in chaos), "no greedy stream completed under chaos"
    assert any(r.outcome == "completed" for r in result.phase("baseline"))


def test_short_soak_keeps_every_invariant(ray_cluster: None) -> None:
    """About a minute of load on two cores: each fault once, a few dozen streams."""
    result = soak(
        ["--baseline-s", "5", "--duration-s", "20", "--sessions", "3", "--max-tokens", "16", "--fault-gap", "1", "3"]
    )
    assert_every_fault_and_some_traffic(result)


@pytest.mark.slow
def test_long_soak_keeps_every_invariant(ray_cluster: None) -> None:
    """Three minutes of chaos: workers of both roles killed again and again."""
    result = soak(["--baseline-s", "30", "--duration-s", "180", "--sessions", "6"])
    assert_every_fault_and_some_traffic(result)
    assert len(result.faults) >= 6
