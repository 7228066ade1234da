"""What benchmarks/agentic_engine.py reports per run: the result record, the steady window it
is completed with (device time, the floor of its token mix), and the printed line."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.agentic_workload import Workload
from benchmarks.gpu_busy import BusyShare
from benchmarks.step_floor import StepMix, projection_rate, step_floor
from engine.config import ModelConfig
from engine.core import EngineCore
from engine.request import RequestStatus

PRINTED_KERNELS = 12  # of the JSON's top_kernels_ms, in the printed report


@dataclass(frozen=True)
class PolicyResult:
    scheduling: str
    sessions: int
    wall_s: float
    output_tokens: int
    output_tokens_per_s: float
    ttft_mean_ms: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    tpot_mean_ms: float
    tpot_p99_ms: float
    steps: int
    mixed_steps: int
    prefill_tokens_computed: int
    prefix_cache_hits: int
    host_ms_per_step: float
    launch_ms_per_step: float  # of host_ms_per_step, in launching steps (on a CPU: their compute too)
    wait_ms_per_step: float  # of host_ms_per_step, blocked on the previous step's outputs (the device)
    decode_rows_per_step: float
    prefill_tokens_per_step: float
    expansion: str = "host-sized"
    extend_graphs: bool = True  # prefill and mixed forwards replay piecewise CUDA graphs
    cascade: bool = True  # shared prefixes attended once (RunnerOptions.cascade_attention)
    shared_prefix_steps: int = 0  # steps whose forward used the shared pass
    gc_freeze: bool = False
    gc_full_collections: int = 0  # the collector's generation-2 passes during the run
    gc_full_max_ms: float = 0.0  # the longest of them: every thread stopped
    gc_total_ms: float = 0.0  # all the collector's passes during the run
    # Triton kernel variants first met during the run (benchmarks/triton_compiles.py); None: no hooks
    triton_misses: int | None = None
    triton_miss_ms: float = 0.0  # compiling them or loading them from the disk cache, on the step's path
    triton_miss_max_ms: float = 0.0
    triton_miss_kernels: tuple[tuple[str, int], ...] = ()  # kernel name -> misses
    # the cold burst: every session's first turn, submitted together
    cold_ttft_p90_ms: float = 0.0
    cold_distinct_tokens: int = 0  # the shared prefix once, plus each first turn's own tokens
    prefill_tokens_per_s: float = 0.0  # one long fresh prompt on the same engine, before the run
    cold_floor_ms: float = 0.0  # cold_distinct_tokens at that rate: its distinct tokens prefilled once
    window_steps: int = 0  # steady steps measured; 0: none (CPU, or the run ended first)
    window_wall_ms_per_step: float | None = None  # timed pass, no profiler
    window_host_ms_per_step: float | None = None  # inside EngineCore.step, timed pass
    device_ms_per_step: float | None = None  # profiled pass, same steps
    gpu_busy_share: float | None = None  # device ms / wall ms per window step
    profiled_span_busy_share: float | None = None  # busy / span under the profiler (biased low)
    top_kernels_ms: tuple[tuple[str, float], ...] = ()  # over the profiled window
    # the window's mean step against what its token mix needs (benchmarks/step_floor.py)
    step_mix: dict[str, float] | None = None
    floor_peak_ms: float | None = None  # at the device's peak matmul rate
    floor_at_shape_ms: float | None = None  # at the rate of the model's projections at the step's tokens
    floor_parts_ms: dict[str, float] | None = None  # at the peak rate: linear, weights, kv, attention


@dataclass(frozen=True)
class SteadyWindow:
    steps: int
    wall_s: float  # the loop's wall time over the window's steps
    host_s: float  # of which inside EngineCore.step
    busy: BusyShare | None  # the profiler's reading (profiled pass only)
    contexts: ContextSample | None = None  # profiled pass only (the timed pass's wall stays clean)


@dataclass
class ContextSample:
    """What the profiled window's steps read: the decode rows' contexts, sampled before each
    step, and the turns submitted in the window (each turn's new tokens are one chunk: turns
    are shorter than the step budget)."""

    steps: int = 0
    decode_requests: int = 0
    decode_own_keys: int = 0  # past the shared prefix
    turns: int = 0
    turn_prompt_tokens: int = 0

    def add(self, engine: EngineCore, shared_prefix: int) -> None:
        self.steps += 1
        for request in engine.requests.values():
            if request.status is RequestStatus.DECODING:
                self.decode_requests += 1
                self.decode_own_keys += max(request.kv_len - shared_prefix, 0)

    def submitted(self, prompt_tokens: int) -> None:
        self.turns += 1
        self.turn_prompt_tokens += prompt_tokens

    def mix(self, result: PolicyResult, shared_prefix: int) -> StepMix:
        chunks = self.turns / max(self.steps, 1)
        chunk_tokens = result.prefill_tokens_per_step / max(chunks, 1e-9)
        return StepMix(
            decode_rows=result.decode_rows_per_step,
            prefill_tokens=result.prefill_tokens_per_step,
            decode_own_keys=self.decode_own_keys / max(self.decode_requests, 1),
            chunks=chunks,
            chunk_context=max(self.turn_prompt_tokens / max(self.turns, 1) - chunk_tokens, 0.0),
            shared_keys=shared_prefix,
        )


def with_window(result: PolicyResult, timed: SteadyWindow | None, profiled: SteadyWindow | None) -> PolicyResult:
    """`result` with the timed pass's steady window and the profiled pass's device time."""
    if timed is None:
        return result
    wall_ms = 1e3 * timed.wall_s / timed.steps
    fields: dict[str, Any] = {
        "window_steps": timed.steps,
        "window_wall_ms_per_step": wall_ms,
        "window_host_ms_per_step": 1e3 * timed.host_s / timed.steps,
    }
    if profiled is not None and profiled.busy is not None and profiled.steps == timed.steps:
        busy = profiled.busy
        fields |= {
            "device_ms_per_step": busy.device_ms_per_step,
            "gpu_busy_share": busy.device_ms_per_step / wall_ms,
            "profiled_span_busy_share": busy.busy_share,
            "top_kernels_ms": busy.top_kernels,
        }
    return dataclasses.replace(result, **fields)


def with_floor(
    result: PolicyResult, profiled: SteadyWindow | None, load: Workload, config: ModelConfig, rates: dict[str, float]
) -> PolicyResult:
    """`result` with the floor of its window's mean token mix (benchmarks/step_floor.py)."""
    if profiled is None or profiled.contexts is None or result.device_ms_per_step is None:
        return result
    mix = profiled.contexts.mix(result, load.shared_prefix)
    copy, peak = rates["copy_bytes_per_s"], rates["bf16_flops_per_s"]
    at_peak = step_floor(config, mix, copy, peak)
    at_shape = step_floor(config, mix, copy, projection_rate(config, round(mix.decode_rows + mix.prefill_tokens)))
    return dataclasses.replace(
        result,
        step_mix=asdict(mix),
        floor_peak_ms=at_peak.total_ms,
        floor_at_shape_ms=at_shape.total_ms,
        floor_parts_ms=asdict(at_peak),
    )


def bookkeeping_ms(result: PolicyResult) -> float:
    return result.host_ms_per_step - result.launch_ms_per_step - result.wait_ms_per_step


def report_line(result: PolicyResult) -> str:
    """One run's printed summary: its figures, then the steady window's and its top kernels."""
    line = (
        f"sessions={result.sessions:4d} {result.scheduling:11s} {result.expansion:12s} "
        f"{'graphs' if result.extend_graphs else 'eager ':6s} "
        f"{'cascade ' if result.cascade else 'own-keys':8s} "
        f"{result.output_tokens_per_s:8.1f} tok/s  "
        f"TTFT mean/p50/p90 {result.ttft_mean_ms:6.0f}/{result.ttft_p50_ms:6.0f}/{result.ttft_p90_ms:6.0f} ms  "
        f"TPOT mean/p99 {result.tpot_mean_ms:5.1f}/{result.tpot_p99_ms:5.1f} ms  "
        f"steps {result.steps} (mixed {result.mixed_steps})  prefill computed {result.prefill_tokens_computed}  "
        f"host {result.host_ms_per_step:.1f} ms/step (launch {result.launch_ms_per_step:.1f}, "
        f"waiting on the device {result.wait_ms_per_step:.1f}, bookkeeping {bookkeeping_ms(result):.1f})  "
        f"shared pass in {result.shared_prefix_steps} steps  "
        f"GC {'frozen' if result.gc_freeze else 'unfrozen'}: {result.gc_full_collections} full passes, "
        f"longest {result.gc_full_max_ms:.1f} ms, all passes {result.gc_total_ms:.0f} ms"
    )
    if result.triton_misses is not None:
        kernels = ", ".join(f"{name} x{count}" for name, count in result.triton_miss_kernels)
        line += (
            f"  Triton variants first met in the run: {result.triton_misses}, {result.triton_miss_ms:.0f} ms"
            f" (longest {result.triton_miss_max_ms:.0f} ms{': ' + kernels if kernels else ''})"
        )
    line += f"  mix {result.decode_rows_per_step:.0f} decode rows"
    line += f" + {result.prefill_tokens_per_step:.0f} prefill tokens/step"
    line += (
        f"  cold burst: TTFT p90 {result.cold_ttft_p90_ms:.0f} ms, {result.cold_distinct_tokens} distinct tokens"
        f" once at {result.prefill_tokens_per_s:.0f} tok/s = {result.cold_floor_ms:.0f} ms"
        f" ({result.cold_ttft_p90_ms / result.cold_floor_ms:.2f}x)"
    )
    if result.gpu_busy_share is not None:
        line += (
            f"  | {result.window_steps} steady steps: wall {result.window_wall_ms_per_step:.2f} "
            f"host {result.window_host_ms_per_step:.2f} device {result.device_ms_per_step:.2f} ms/step, "
            f"GPU busy {100 * result.gpu_busy_share:.1f} % (under the profiler "
            f"{100 * (result.profiled_span_busy_share or 0):.1f} %)"
        )
        device_ms = result.device_ms_per_step
        if device_ms is not None and result.floor_peak_ms is not None and result.floor_at_shape_ms is not None:
            line += (
                f"\n    floor of the mix {result.floor_peak_ms:.2f} ms at peak matmul rate "
                f"({device_ms / result.floor_peak_ms:.2f}x), {result.floor_at_shape_ms:.2f} ms at the projections' "
                f"rate at this token count ({device_ms / result.floor_at_shape_ms:.2f}x); parts {result.floor_parts_ms}"
                f"; mix {result.step_mix}"
            )
        for name, ms in result.top_kernels_ms[:PRINTED_KERNELS]:
            line += f"\n    {ms:9.1f} ms  {name[:110]}"
    return line
