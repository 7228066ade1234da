"""benchmarks/triton_compiles.py counts Triton's JIT misses through the hooks Triton calls around
a compile; no compile can run without a GPU, so the hooks are called here as Triton calls them."""

from __future__ import annotations

import time
from typing import Any

import pytest

from benchmarks.triton_compiles import TritonCompiles

knobs = pytest.importorskip("triton").knobs
JitFunctionInfo = pytest.importorskip("triton.runtime.jit").JitFunctionInfo


def compile_as_triton_does(name: str, key: str, seconds: float = 0.0) -> bool | None:
    """What JITFunction._do_compile does around one miss: the cache hook, the compile, the post hook."""
    hook: dict[str, Any] = {"key": key, "repr": name, "fn": JitFunctionInfo(None, name, None), "compile": {}}
    skipped = knobs.runtime.jit_cache_hook(**hook, is_manual_warmup=False, already_compiled=False)
    if skipped:
        return skipped
    time.sleep(seconds)
    knobs.runtime.jit_post_compile_hook(**hook, is_manual_warmup=False, already_compiled=False)
    return None


def test_counts_each_miss_and_its_time_per_kernel() -> None:
    with TritonCompiles() as compiles:
        compile_as_triton_does("split_kv", "a", seconds=0.02)
        compile_as_triton_does("split_kv", "b")
        compile_as_triton_does("merge", "c")
    assert compiles.available and compiles.misses == 3
    assert compiles.kernels == {"split_kv": 2, "merge": 1}
    assert 20.0 <= compiles.max_ms <= compiles.total_ms


def test_earlier_hooks_still_run_and_are_restored() -> None:
    seen: list[str] = []

    def earlier_before(**hook: Any) -> bool:
        seen.append("before " + hook["fn"].name)
        return hook["fn"].name == "skipped"  # asks Triton not to compile this one

    def earlier_after(**hook: Any) -> None:
        seen.append("after " + hook["fn"].name)

    knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = earlier_before, earlier_after
    try:
        with TritonCompiles() as compiles:
            compile_as_triton_does("kept", "a")
            assert compile_as_triton_does("skipped", "b") is True
        assert compiles.misses == 1 and seen == ["before kept", "after kept", "before skipped"]
        assert knobs.runtime.jit_cache_hook is earlier_before
        assert knobs.runtime.jit_post_compile_hook is earlier_after
    finally:
        knobs.runtime.jit_cache_hook = knobs.runtime.jit_post_compile_hook = None
