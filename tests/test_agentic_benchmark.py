"""benchmarks/agentic_engine.py run as a GPU session runs it, on a CPU with the tiny random
model: every configuration of one invocation serves the same closed-loop workload, and the
host's step splits into parts that add up. (Device time is scarce: a broken benchmark is
found here, not on the GPU.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_both_schedules_and_heaps_serve_the_same_workload(tmp_path: Path) -> None:
    out = tmp_path / "agentic.json"
    command = [
        sys.executable, "benchmarks/agentic_engine.py", "--device", "cpu", "--model", "random-tiny",
        "--shared-prefix", "64", "--turns", "2", "--turn-tokens", "8,16", "--output-tokens", "4,8",
        "--kv-cache-bytes", "200000000", "--max-model-len", "512", "--max-num-batched-tokens", "128",
        "--page-size", "16", "--sessions", "4", "--scheduling", "both", "--gc-freeze", "both", "--out", str(out),
    ]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=300)
    results = json.loads(out.read_text())["results"]
    assert [(r["scheduling"], r["gc_freeze"]) for r in results] == [
        ("alternating", False),
        ("alternating", True),
        ("mixed", False),
        ("mixed", True),
    ]
    for r in results:
        assert r["output_tokens"] > 0 and r["steps"] > 0
        assert (r["mixed_steps"] > 0) == (r["scheduling"] == "mixed")
        assert r["launch_ms_per_step"] > 0 and r["wait_ms_per_step"] >= 0
        assert r["launch_ms_per_step"] + r["wait_ms_per_step"] <= r["host_ms_per_step"]
        assert r["gc_full_collections"] >= 0 and r["gc_total_ms"] >= r["gc_full_max_ms"] >= 0
        assert r["triton_misses"] == 0 and r["triton_miss_kernels"] == []  # no Triton kernel runs on this CPU
    for schedule in ("alternating", "mixed"):  # greedy, one seed: the heap changes no token
        unfrozen, frozen = (r for r in results if r["scheduling"] == schedule)
        assert (unfrozen["output_tokens"], unfrozen["steps"]) == (frozen["output_tokens"], frozen["steps"])
