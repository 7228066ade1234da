"""Chaos soak: agentic load on a real local stack while its workers are killed and drained.

    PYTHONPATH=. .venv/bin/python -m benchmarks.chaos_soak --duration-s 180 --baseline-s 60 \\
        [--sessions 6] [--request-timeout 60] [--json OUT.json]

1. Starts a prefill worker and two decode workers (Ray actors, CPU, the embedded SmolLM2-135M;
   any engine option of `dspark-serve up` is taken) on a private Ray cluster, and
   `dspark-serve gateway` as its own process with --request-timeout (benchmarks/chaos_stack.py).
2. Baseline: --baseline-s of the load with no fault (benchmarks/chaos_load.py).
3. Chaos: --duration-s of the same load while, one at a time, at random moments, a worker is
   hit: SIGKILL of the prefill worker's process, SIGKILL of the decode worker holding the most
   requests, and once a drain with a short grace followed by SIGTERM; each comes back as a new
   process (Ray restarts it) before the next is hit. Clients also hang up mid-stream.
4. Reference: every greedy stream that completed during the chaos is run again on the healthy
   stack; its text must be equal (docs/design.md §5.6: a moved request continues exactly).
5. Checks, printed with the table: no stream failed (every one completed, was hung up by its
   client, or ended with an error event and `[DONE]`: never a cut body, never a hang, never a
   500), greedy texts equal their reference, no request outlived --request-timeout plus
   --deadline-margin, and every worker's KV slots are free at the end. Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ray

from benchmarks.chaos_load import OK_OUTCOMES, LoadConfig, LoadRun, StreamRecord, replay_greedy
from benchmarks.chaos_stack import Fault, Stack, StackConfig, local_ray, running_stack
from services.cli.options import add_engine_options, engine_config_from_args


@dataclass(frozen=True)
class SoakConfig:
    baseline_s: float = 60.0
    chaos_s: float = 180.0
    fault_gap_s: tuple[float, float] = (3.0, 10.0)  # random wait after a worker is back before the next fault
    drain_grace_s: float = 1.0  # short, so that a drain hands requests back to be moved
    deadline_margin_s: float = 3.0  # a request may end this long after its deadline (scheduling, one step)
    recovery_timeout_s: float = 300.0
    seed: int = 0
    load: LoadConfig = field(default_factory=LoadConfig)
    progress_interval_s: float = 5.0


@dataclass
class SoakResult:
    config: SoakConfig
    request_timeout_s: float
    records: list[StreamRecord]
    faults: list[Fault]
    migrations: dict[str, dict[str, float]]  # phase -> reason -> requests moved
    final_workers: dict[str, dict[str, int]]  # worker -> kv_used_slots, num_running, num_waiting, num_held

    def phase(self, name: str) -> list[StreamRecord]:
        return [r for r in self.records if r.phase == name]


def _moved_since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {reason: after[reason] - before.get(reason, 0.0) for reason in after}


class _Progress:
    """A line every few seconds: outcomes so far and faults done."""

    def __init__(self, stack: Stack, interval_s: float) -> None:
        self.stack = stack
        self.interval_s = interval_s
        self.counts: Counter[str] = Counter()
        self.phase = ""
        self.started = time.monotonic()

    def record(self, record: StreamRecord) -> None:
        self.counts[record.outcome] += 1
        if record.outcome not in ("completed", "client_aborted"):
            print(f"  {record.phase} stream {record.outcome}: {record.detail}", file=sys.stderr, flush=True)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
            print(
                f"[{time.monotonic() - self.started:6.1f} s] {self.phase}: {outcomes or 'no stream ended yet'}; "
                f"faults {len(self.stack.faults)}",
                file=sys.stderr,
                flush=True,
            )


class _Faults:
    """Hits workers one at a time at random moments (docs/design.md §5.6, §6.9): kill -9 of the
    prefill worker, kill -9 of the decode worker holding the most requests, one drain with a
    short grace followed by SIGTERM of another decode worker, then kills of either role in turn.
    The first three happen however long it takes (`planned` is set after them); the rest while
    the phase lasts.

    A worker is hit only while the gateway sees it healthy and at least one other worker
    healthy, so that what it held has somewhere to go; the others may still be restarting.
    """

    PLAN = (("kill9", "prefill"), ("kill9", "decode"), ("drain", "decode"))

    def __init__(self, stack: Stack, cfg: SoakConfig, started: float) -> None:
        self.stack = stack
        self.cfg = cfg
        self.started = started
        self.rng = random.Random(cfg.seed ^ 0xC4A05)
        self.seen_down: set[int] = set()  # indexes of faults whose worker the gateway has seen down
        self.planned = threading.Event()

    def _healthy(self) -> set[str]:
        """Workers the gateway routes to now and not hit since; notes when a hit one is back."""
        try:
            workers = self.stack.ready()["workers"]
        except (httpx.HTTPError, ValueError):
            return set()
        healthy = {w["id"] for w in workers if w["healthy"]}
        now = time.monotonic() - self.started
        for i, fault in enumerate(self.stack.faults):
            if fault.back_after_s:
                continue
            if fault.worker not in healthy:
                self.seen_down.add(i)
            elif i in self.seen_down or self._restarted(fault):
                fault.back_after_s = now - fault.at_s
        # a hit worker counts once it is healthy again after going down: the gateway needs a
        # moment to see a kill, and may call it healthy until then
        return healthy - {f.worker for f in self.stack.faults if not f.back_after_s}

    def _restarted(self, fault: Fault) -> bool:
        """Whether the hit worker already runs as a new process. Between two polls a worker can go
        down and come back unseen (the polls pause while the load's last streams end), so the
        gateway calling it healthy is not enough: it may not have noticed the kill yet."""
        try:
            return self.stack.pid(fault.worker, timeout_s=1.0) != fault.pid
        except ray.exceptions.RayError:  # still restarting (or the call timed out)
            return False

    def _victim(self, kind: str, role: str, healthy: set[str]) -> str | None:
        names = [n for n in self.stack.names(role) if n in healthy]  # type: ignore[arg-type]
        if kind == "drain" and self.stack.faults:
            names = [n for n in names if n != self.stack.faults[-1].worker] or names
        if not names or len(healthy) < 2:
            return None
        try:
            held = {n: s.num_held for n, s in self.stack.stats(names).items()}
        except ray.exceptions.RayError:  # went down since /ready said otherwise
            return None
        most = max(held.values())
        return self.rng.choice([n for n in names if held[n] == most])

    def run(self, stop_at: float, stop: threading.Event) -> None:
        step = 0
        while not stop.is_set():
            if step >= len(self.PLAN):
                self.planned.set()
            kind, role = self.PLAN[step] if step < len(self.PLAN) else ("kill9", ("prefill", "decode")[step % 2])
            gap_ends = time.monotonic() + self.rng.uniform(*self.cfg.fault_gap_s)
            name = None
            while name is None:
                if (self.planned.is_set() and time.monotonic() >= stop_at) or stop.wait(0.25):
                    return
                healthy = self._healthy()
                if time.monotonic() >= gap_ends:
                    name = self._victim(kind, role, healthy)
            at_s = time.monotonic() - self.started
            if kind == "kill9":
                fault = self.stack.kill9(name, at_s)
            else:
                fault = self.stack.drain_and_restart(name, self.cfg.drain_grace_s, at_s)
            print(f"[{at_s:6.1f} s] {kind} {name} (held {fault.held} requests)", file=sys.stderr, flush=True)
            step += 1

    def settle(self, timeout_s: float) -> None:
        """Wait until every worker is back, noting when each hit one came back."""
        deadline = time.monotonic() + timeout_s
        while len(self._healthy()) < len(self.stack.handles):
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not all back after {timeout_s:g} s: {self.stack.ready()}")
            time.sleep(0.25)
        self.stack.wait_all_healthy(timeout_s)


async def _phase(
    stack: Stack, cfg: SoakConfig, name: str, duration_s: float, model: str, progress: _Progress
) -> LoadRun:
    limit_s = stack.config.request_timeout_s + cfg.load.hang_margin_s
    seed = cfg.seed if name == "baseline" else cfg.seed + 1
    run = LoadRun(stack.url, model, cfg.load, seed, name, limit_s)
    progress.phase, progress.counts = name, Counter()
    stop_at = time.monotonic() + duration_s
    ticker = asyncio.create_task(progress.run())
    try:
        if name != "chaos":
            await run.run(lambda: time.monotonic() < stop_at, progress.record)
            return run
        stop = threading.Event()
        faults = _Faults(stack, cfg, progress.started)
        injecting = asyncio.create_task(asyncio.to_thread(faults.run, stop_at, stop))
        try:
            # at least until the planned faults are done, so that a slow restart cannot skip one (the
            # load stops at once if injecting fails: `await injecting` raises its error)
            await run.run(
                lambda: not injecting.done() and (time.monotonic() < stop_at or not faults.planned.is_set()),
                progress.record,
            )
        finally:
            stop.set()
            await injecting
        await asyncio.to_thread(faults.settle, cfg.recovery_timeout_s)
        return run
    finally:
        ticker.cancel()


def _wait_idle(stack: Stack, timeout_s: float) -> dict[str, dict[str, int]]:
    """Every worker's KV use and queues, once they are all 0 or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = stack.stats()
        final = {
            name: {
                "kv_used_slots": s.engine.kv_used_slots,
                "num_running": s.engine.num_running,
                "num_waiting": s.engine.num_waiting,
                "num_held": s.num_held,
            }
            for name, s in stats.items()
        }
        if all(not any(v.values()) for v in final.values()) or time.monotonic() > deadline:
            return final
        time.sleep(0.2)


def run_soak(stack: Stack, cfg: SoakConfig) -> SoakResult:
    """Baseline, chaos, recovery, the greedy references and the final worker state."""
    model = str(stack.ready()["model"])
    progress = _Progress(stack, cfg.progress_interval_s)
    migrations: dict[str, dict[str, float]] = {}
    runs: list[LoadRun] = []
    for name, duration_s in (("baseline", cfg.baseline_s), ("chaos", cfg.chaos_s)):
        before = stack.migrations()
        runs.append(asyncio.run(_phase(stack, cfg, name, duration_s, model, progress)))
        stack.wait_all_healthy(cfg.recovery_timeout_s)
        migrations[name] = _moved_since(before, stack.migrations())
    records = [r for run in runs for r in run.records]
    limit_s = stack.config.request_timeout_s + cfg.load.hang_margin_s
    asyncio.run(replay_greedy(stack.url, [r for r in records if r.phase == "chaos"], limit_s))
    final = _wait_idle(stack, 30.0)
    return SoakResult(cfg, stack.config.request_timeout_s, records, list(stack.faults), migrations, final)


def violations(result: SoakResult) -> list[str]:
    """Each broken invariant, in words; empty when the soak passed."""
    found: list[str] = []
    failed = [r for r in result.records if r.outcome not in OK_OUTCOMES]
    found += [f"{r.phase} stream failed: {r.detail}" for r in failed[:10]]
    refused = [r for r in result.records if r.outcome == "refused" and r.status != 504]
    found += [f"{r.phase} request refused: {r.detail}" for r in refused[:10]]
    unequal = [r for r in result.records if r.reference is not None and r.text != r.reference]
    found += [f"greedy text differs from its reference: {r.text!r} != {r.reference!r}" for r in unequal[:10]]
    bound_s = result.request_timeout_s + result.config.deadline_margin_s
    late = [r for r in result.records if r.outcome != "client_aborted" and r.e2e_s > bound_s]
    found += [f"{r.phase} request took {r.e2e_s:.1f} s > {bound_s:g} s ({r.outcome})" for r in late[:10]]
    found += [
        f"{name} not idle at the end: {state}" for name, state in result.final_workers.items() if any(state.values())
    ]
    return found


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered))) - 1))]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def table(result: SoakResult) -> str:
    """The soak's counts, baseline against chaos, as a markdown table."""
    columns = {name: result.phase(name) for name in ("baseline", "chaos")}
    faults = Counter(f"{f.kind} {f.worker.rsplit('-', 2)[1]}" for f in result.faults)

    def count(rows: list[StreamRecord], outcome: str) -> str:
        return str(sum(r.outcome == outcome for r in rows))

    def equal(rows: list[StreamRecord]) -> str:
        checked = [r for r in rows if r.reference is not None]
        return f"{sum(r.text == r.reference for r in checked)} / {len(checked)}" if checked else "-"

    def moved(phase: str) -> str:
        by_reason = result.migrations.get(phase, {})
        parts = ", ".join(f"{reason} {n:.0f}" for reason, n in sorted(by_reason.items()) if n)
        return f"{sum(by_reason.values()):.0f}" + (f" ({parts})" if parts else "")

    def ttft(rows: list[StreamRecord], q: float) -> str:
        return _ms(_percentile([r.ttft_s for r in rows if r.ttft_s is not None], q))

    rows = [
        ("requests sent", lambda p, r: str(len(r))),
        ("completed", lambda p, r: count(r, "completed")),
        ("greedy, equal to the undisturbed run", lambda p, r: equal(r)),
        ("moved to another worker (migrations)", lambda p, r: moved(p)),
        ("hung up by the client", lambda p, r: count(r, "client_aborted")),
        ("ended with an error event + [DONE]", lambda p, r: count(r, "error_event")),
        ("refused (429/503/504)", lambda p, r: count(r, "refused")),
        ("failed otherwise (cut, hang, 5xx)", lambda p, r: count(r, "failed")),
        ("TTFT p50 (ms)", lambda p, r: ttft(r, 50)),
        ("TTFT p99 (ms)", lambda p, r: ttft(r, 99)),
        ("longest request (s)", lambda p, r: f"{max((x.e2e_s for x in r), default=0.0):.1f}"),
    ]
    lines = ["| | baseline | chaos |", "|---|---:|---:|"]
    lines += [
        f"| {label} | {cell('baseline', columns['baseline'])} | {cell('chaos', columns['chaos'])} |"
        for label, cell in rows
    ]
    lines.append(f"| faults | 0 | {', '.join(f'{k} x{n}' for k, n in sorted(faults.items())) or '0'} |")
    kv = ", ".join(f"{name} {state['kv_used_slots']}" for name, state in sorted(result.final_workers.items()))
    lines.append(f"\nKV slots in use at the end: {kv}.")
    return "\n".join(lines)


def write_json(path: Path, result: SoakResult, meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "meta": meta,
        "config": dataclasses.asdict(result.config),
        "request_timeout_s": result.request_timeout_s,
        "faults": [dataclasses.asdict(f) for f in result.faults],
        "migrations": result.migrations,
        "final_workers": result.final_workers,
        "violations": violations(result),
        "records": [r.summary() for r in result.records],
    }
    path.write_text(json.dumps(body, indent=1))


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=180.0, help="seconds of chaos (default: %(default)s)")
    parser.add_argument("--baseline-s", type=float, default=60.0, help="seconds of load without faults first")
    parser.add_argument("--sessions", type=int, default=6, help="concurrent agentic sessions (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=24, help="per turn (default: %(default)s)")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="the gateway's --request-timeout")
    parser.add_argument(
        "--fault-gap",
        type=float,
        nargs=2,
        default=(3.0, 10.0),
        metavar=("MIN_S", "MAX_S"),
        help="seconds between faults",
    )
    parser.add_argument("--decode-workers", type=int, default=2, help="(default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="write every stream's outcome here")
    add_engine_options(parser)
    parser.set_defaults(device="cpu", max_num_seqs=16, kv_cache_memory_bytes=512 * 1024 * 1024)
    return parser


def configs_from_args(args: argparse.Namespace) -> tuple[StackConfig, SoakConfig]:
    load = LoadConfig(sessions=args.sessions, max_tokens=args.max_tokens)
    soak = SoakConfig(
        baseline_s=args.baseline_s,
        chaos_s=args.duration_s,
        fault_gap_s=tuple(args.fault_gap),
        seed=args.seed,
        load=load,
    )
    stack = StackConfig(
        engine_config_from_args(args), decode_workers=args.decode_workers, request_timeout_s=args.request_timeout
    )
    return stack, soak


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    stack_cfg, cfg = configs_from_args(args)
    started = time.time()
    with local_ray(), running_stack(stack_cfg) as stack:
        print(f"stack ready: {stack.url}, workers {sorted(stack.handles)}", file=sys.stderr, flush=True)
        result = run_soak(stack, cfg)
        broken = violations(result)
        if broken:
            print(f"the gateway's log ends:\n{stack.gateway_log_tail()}", file=sys.stderr)
    print(table(result))
    print("\n".join(["", "invariants: all hold"] if not broken else ["", "VIOLATIONS:", *broken]))
    if args.json is not None:
        meta = {"command": " ".join(sys.argv), "started_unix": started, "machine": platform.platform()}
        write_json(args.json, result, meta)
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
