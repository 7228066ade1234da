"""One closed-loop run of the agentic workload on an engine (benchmarks/agentic_engine.py):
the engine timing its host time's parts, the run's loop with its steady window, and the
engine's prefill rate that the cold burst is measured against."""

from __future__ import annotations

import cProfile
import time

import numpy as np
import torch

from benchmarks.agentic_results import ContextSample, PolicyResult, SteadyWindow
from benchmarks.agentic_workload import Workload, make_sessions
from benchmarks.gpu_busy import BusyWindow
from engine.core import EngineCore
from engine.outputs import RequestOutput
from engine.runner.step_output import PendingStep
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledStep


class LaunchTimedEngine(EngineCore):
    """The engine, timing the parts of a step's host time: its launch (on a GPU the host's cost
    of launching the forward; on a CPU the forward itself), its wait for the previous step's
    outputs (on a GPU the device running ahead of the host; on a CPU nothing), and the rest,
    the host's bookkeeping (scheduling, the output path, releasing finished requests)."""

    launch_s = 0.0
    wait_s = 0.0

    def _launch(self, step: ScheduledStep) -> PendingStep:
        start = time.perf_counter()
        try:
            return super()._launch(step)
        finally:
            self.launch_s += time.perf_counter() - start

    def _finish_step(self, step: ScheduledStep, pending: PendingStep) -> list[RequestOutput]:
        start = time.perf_counter()
        pending.wait()  # the step's one blocking wait, timed apart: the wait inside returns at once
        self.wait_s += time.perf_counter() - start
        return super()._finish_step(step, pending)


def run_policy(
    engine: LaunchTimedEngine,
    load: Workload,
    scheduling: str,
    expansion: str = "host-sized",
    window_steps: int = 0,
    profile: bool = False,
    host_profiler: cProfile.Profile | None = None,
) -> tuple[PolicyResult, SteadyWindow | None]:
    """One closed-loop run; `window_steps` steady steps timed (and profiled if `profile`; the
    host's Python under `host_profiler` over the same steps if given)."""
    sessions = make_sessions(load, engine.model_config.vocab_size)
    submitted: dict[str, tuple[int, float, int]] = {}  # request id -> session, submit time, O

    def submit(index: int) -> None:
        session = sessions[index]
        user, out_len = session.turns[session.done]
        session.history.extend(user)
        request_id = f"s{index}-t{session.done}"
        params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
        submitted[request_id] = (index, time.perf_counter(), out_len)
        if in_window and contexts is not None:
            contexts.submitted(len(session.history))
        engine.add_request(request_id, list(session.history), params)

    before = engine.stats()
    launch_before, wait_before = engine.launch_s, engine.wait_s
    shared_before = engine.runner.shared_prefix_steps
    ttft: list[float] = []
    cold_ttft: list[float] = []
    tpot: list[float] = []
    output_tokens = requests_done = 0
    step_s = 0.0
    profiler = BusyWindow() if profile else None
    contexts = ContextSample() if profile else None
    in_window, window_start, window_host_s, counted = False, 0.0, 0.0, 0
    steady: SteadyWindow | None = None
    start = time.perf_counter()
    for index in range(len(sessions)):
        submit(index)
    while engine.has_unfinished_requests():
        if window_steps and steady is None and not in_window and len(ttft) >= load.sessions:
            in_window, window_start = True, time.perf_counter()
            if profiler is not None:
                profiler.start()
            if host_profiler is not None:
                host_profiler.enable()
        if in_window and contexts is not None:
            contexts.add(engine, load.shared_prefix)
        t0 = time.perf_counter()
        outputs = engine.step()
        step_s += time.perf_counter() - t0
        if in_window:
            counted += 1
            window_host_s += time.perf_counter() - t0
        for out in outputs:
            if not out.finished:
                continue
            index, submit_s, out_len = submitted.pop(out.request_id)
            timings = out.timings
            assert timings is not None and timings.first_token_s is not None and timings.finished_s is not None
            ttft.append(timings.first_token_s - submit_s)
            if out.request_id.endswith("-t0"):
                cold_ttft.append(timings.first_token_s - submit_s)
            if out_len > 1:
                tpot.append((timings.finished_s - timings.first_token_s) / (out_len - 1))
            output_tokens += len(out.token_ids)
            requests_done += 1
            session = sessions[index]
            session.history.extend(out.token_ids)
            session.done += 1
            if session.done < len(session.turns):
                submit(index)
        if in_window and counted == window_steps:
            in_window = False
            if host_profiler is not None:
                host_profiler.disable()
            if profiler is not None:
                torch.cuda.synchronize()
            wall = time.perf_counter() - window_start
            busy = profiler.stop(counted) if profiler is not None else None  # after the clock stops
            steady = SteadyWindow(counted, wall, window_host_s, busy, contexts)
    wall = time.perf_counter() - start
    if in_window and host_profiler is not None:
        host_profiler.disable()
    if in_window and profiler is not None:
        profiler.stop(max(counted, 1))  # the run ended inside the window: too short to call steady
    after = engine.stats()
    steps = after.steps_total - before.steps_total
    prefill_tokens = after.prefill_tokens_computed_total - before.prefill_tokens_computed_total
    result = PolicyResult(
        scheduling=scheduling,
        sessions=load.sessions,
        wall_s=wall,
        output_tokens=output_tokens,
        output_tokens_per_s=output_tokens / wall,
        ttft_mean_ms=1e3 * float(np.mean(ttft)),
        ttft_p50_ms=1e3 * float(np.percentile(ttft, 50)),
        ttft_p90_ms=1e3 * float(np.percentile(ttft, 90)),
        tpot_mean_ms=1e3 * float(np.mean(tpot)),
        tpot_p99_ms=1e3 * float(np.percentile(tpot, 99)),
        steps=steps,
        mixed_steps=after.mixed_steps_total - before.mixed_steps_total,
        prefill_tokens_computed=prefill_tokens,
        prefix_cache_hits=after.prefix_cache_hits_total - before.prefix_cache_hits_total,
        host_ms_per_step=1e3 * step_s / max(steps, 1),
        launch_ms_per_step=1e3 * (engine.launch_s - launch_before) / max(steps, 1),
        wait_ms_per_step=1e3 * (engine.wait_s - wait_before) / max(steps, 1),
        decode_rows_per_step=(output_tokens - requests_done) / max(steps, 1),
        prefill_tokens_per_step=prefill_tokens / max(steps, 1),
        expansion=expansion,
        shared_prefix_steps=engine.runner.shared_prefix_steps - shared_before,
        cold_ttft_p90_ms=1e3 * float(np.percentile(cold_ttft, 90)),
        cold_distinct_tokens=load.shared_prefix + sum(len(s.turns[0][0]) for s in sessions),
    )
    return result, steady


def prefill_rate(engine: EngineCore, tokens: int) -> float:
    """Prompt tokens per second of one fresh `tokens`-long prompt (ids from the vocabulary's
    upper half, which the sessions never use, so nothing of it is cached): chunks of the
    full step budget, the rate a cold burst's distinct tokens could at best be computed at."""
    high = engine.model_config.vocab_size
    prompt = [high // 2 + (7919 * i) % (high // 2 - 1) for i in range(tokens)]
    start = time.perf_counter()
    engine.add_request("prefill-rate", prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return tokens / (time.perf_counter() - start)
