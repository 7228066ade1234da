"""`make serve`'s stack on this CPU, measured as a user meets it: `dspark-serve up` with its
defaults (one prefill and one decode worker, the embedded model), `dspark-serve bench` at
concurrency 1 and 4, and the resident set of each Ray worker holding the model. Run it on the
tree before a change and on the tree after, with the same arguments:

    python benchmarks/serve_cpu_stream.py --label before [--dtype auto] [--concurrency 1,4]
        [--num-requests 8] [--output-len 96] [--output-dir bench-results/serve-cpu]

The bench is the `random` workload (--input-len words, --output-len tokens, ignore_eos, greedy),
so every request streams the same count of tokens on either tree. The stack is started in a
session of its own on a free port and stopped (SIGTERM, as Kubernetes sends, then SIGKILL of
its session) when the bench ends or fails; its log is kept in the output directory. Writes
<output-dir>/<label>.json, and the bench's own JSON, PNG and table under <output-dir>/<label>/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(log: Path, process: subprocess.Popen[bytes], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("dspark-serve ready:"):
                return line
        if process.poll() is not None:
            break
        time.sleep(1.0)
    raise RuntimeError(f"dspark-serve up did not come up; log tail:\n{log.read_text(errors='replace')[-3000:]}")


def _proc(pid: str, name: str) -> str:
    return (Path("/proc") / pid / name).read_text(errors="replace")


def descendants(root_pid: int) -> list[str]:
    """The pids below `root_pid`, from /proc's parent links (Linux)."""
    children: dict[str, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces
                ppid = _proc(entry.name, "stat").rpartition(")")[2].split()[1]
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(entry.name)
    found, todo = [], [str(root_pid)]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def worker_rss(root_pid: int) -> dict[str, int]:
    """RSS bytes of each Ray worker actor below `root_pid`, by actor class (Ray titles an actor's
    process `ray::Class.method`)."""
    found: dict[str, int] = {}
    for pid in descendants(root_pid):
        try:
            title = _proc(pid, "cmdline").split("\0")[0]
            status = _proc(pid, "status")
        except OSError:
            continue  # exited meanwhile
        if title.startswith("ray::") and "Worker" in title:
            name = title.removeprefix("ray::").split(".")[0].split()[0]
            rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            found[name] = found.get(name, 0) + rss_kb * 1024
    return found


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the stack drains and stops its Ray cluster), then SIGKILL to whatever of its
    session is left (the session is the stack's own: start_new_session)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(90)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def bench(args: argparse.Namespace, url: str, out_dir: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    command = [
        sys.executable,
        "-m",
        "services.cli",
        "bench",
        "--url",
        url,
        "--workload",
        "random",
        "--concurrency",
        args.concurrency,
        "--num-requests",
        str(args.num_requests),
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--ignore-eos",
        "--temperature",
        "0",
        "--label",
        args.label,
        "--progress",
        "off",
        "--output-dir",
        str(out_dir),
    ]
    print("+ " + " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    levels: list[dict[str, Any]] = json.loads((out_dir / "bench_random.json").read_text())["levels"]
    return levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True, help="names this tree's results, e.g. before or after")
    parser.add_argument("--dtype", default="auto", help="the stack's --dtype (default: %(default)s, as make serve)")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--num-requests", type=int, default=8, help="requests per concurrency level")
    parser.add_argument("--input-len", type=int, default=64, help="prompt words")
    parser.add_argument("--output-len", type=int, default=96, help="tokens streamed per request")
    parser.add_argument("--output-dir", type=Path, default=Path("bench-results/serve-cpu"))
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds")
    args = parser.parse_args()
    out_dir = args.output_dir / args.label
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    log = out_dir / "up.log"
    up = [sys.executable, "-m", "services.cli", "up", "--port", str(port), "--dtype", args.dtype]
    print("+ " + " ".join(up[1:]), flush=True)
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            up, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        started = time.monotonic()
        print(wait_ready(log, process, args.startup_timeout), flush=True)
        ready_s = time.monotonic() - started
        rss = worker_rss(process.pid)
        levels = bench(args, f"http://127.0.0.1:{port}", out_dir, env)
        rss_after = worker_rss(process.pid)
    finally:
        stop(process)
    result = {
        "label": args.label,
        "dtype": args.dtype,
        "date": time.strftime("%Y-%m-%d"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "startup_s": ready_s,
        "worker_rss_bytes_idle": rss,
        "worker_rss_bytes_after": rss_after,
        "output_tokens_per_s": {str(level["concurrency"]): level["output_tokens_per_s"] for level in levels},
        "command": " ".join(sys.argv),
    }
    (args.output_dir / f"{args.label}.json").write_text(json.dumps(result, indent=2))
    print(f"\n| {args.label} (--dtype {args.dtype}) | value |\n|---|---|")
    for concurrency, speed in result["output_tokens_per_s"].items():
        print(f"| output tok/s at concurrency {concurrency} | {speed:.1f} |")
    for name, value in rss_after.items():
        print(f"| {name} RSS after the bench (idle) MB | {value / 1e6:.0f} ({rss.get(name, 0) / 1e6:.0f}) |")


if __name__ == "__main__":
    main()
