"""End to end, colocated: one Worker actor on a local Ray cluster, the gateway in front, the
official openai client and the load generator as clients."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.cli import main as cli_main
from tests.services.conftest import MODEL
from tests.services.stack import (
    QUESTIONS,
    Stack,
    concurrent_streams,
    disconnects_and_streams,
    gateway,
    offline_answers,
    workers,
)

pytestmark = pytest.mark.timeout(900)
DEPLOYMENT = "colo"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def handles(ray_cluster: None) -> Iterator[dict[str, Any]]:
    with workers([("worker", 1)], DEPLOYMENT) as spawned:
        yield spawned


@pytest.fixture(scope="module")
def reference(handles: dict[str, Any], engine_core: Any) -> list[str]:
    """Offline greedy answers, computed while the worker loads its model."""
    return offline_answers(engine_core, MAX_TOKENS)


@pytest.fixture(scope="module")
def stack(handles: dict[str, Any], reference: list[str]) -> Iterator[Stack]:
    with gateway(handles, DEPLOYMENT) as running:
        yield running


def test_twenty_concurrent_streams_match_the_offline_engine(stack: Stack, reference: list[str]) -> None:
    assert len(QUESTIONS) == 20
    assert concurrent_streams(stack.client, QUESTIONS, MAX_TOKENS) == reference
    stack.wait_workers_idle()


def test_disconnected_clients_are_aborted(stack: Stack, reference: list[str]) -> None:
    assert disconnects_and_streams(stack, QUESTIONS[:5], MAX_TOKENS, num_disconnects=5) == reference[:5]
    stack.wait_workers_idle(15)
    metrics = httpx.get(f"{stack.url}/metrics").text
    assert f'dspark_requests_total{{model="{MODEL}",role="gateway",status="499"}} 5.0' in metrics


def test_next_turn_reuses_the_cached_history(stack: Stack) -> None:
    history = [
        {"role": "system", "content": "You are terse. " * 40},
        {"role": "user", "content": "List three rivers."},
    ]
    first = stack.client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, temperature=0)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And three mountains?"},
    ]
    second = stack.client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, temperature=0)
    details = second.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.cached_tokens >= first.usage.prompt_tokens - 1  # type: ignore


def test_load_generator_against_the_stack(stack: Stack, tmp_path: Path) -> None:
    code = cli_main(
        [
            "bench",
            "--url",
            stack.url,
            "--workload",
            "agentic",
            "--concurrency",
            "1,2",
            "--num-requests",
            "4",
            "--think-time",
            "0.05",
            "--max-tokens",
            "6",
            "--system-prompt-words",
            "150",
            "--turns",
            "2,3",
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "bench_agentic.json").read_text())
    assert [level["concurrency"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert level["completed"] == 4 and level["failed"] == 0
        assert level["ttft_s"]["p50"] > 0 and level["output_tokens_per_s"] > 0
    assert (tmp_path / "bench_agentic.png").stat().st_size > 1000
    assert "| conc |" in (tmp_path / "bench_agentic.md").read_text()
