"""Resident memory of one engine process holding the embedded model (what a CPU worker holds),
per --dtype: float32 against auto (the GGUF's own quantized format once the engine serves it).

    python benchmarks/engine_rss.py [--model smollm2-135m] [--dtypes float32,auto] [--json OUT]

Each dtype runs in a fresh process (this script again, with --one): it builds an EngineCore as a
worker does (EngineConfig's defaults, so the KV pool of a default worker), greedy-decodes one
chat prompt so every lazy buffer exists, then reports VmRSS and VmHWM from /proc/self/status
with the bytes of the weights and of the KV pool, so that the weights' share can be read off
(the KV pool is allocated zeroed, so it is resident).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def status_bytes(field: str) -> int:
    """A `kB` line of /proc/self/status (VmRSS, VmHWM) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def measure_one(model: str, dtype: str) -> dict[str, Any]:

    from benchmarks.cpu_peer_report import prompt_ids
    from benchmarks.cpu_peer_systems import model_weight_bytes
    from engine.config import EngineConfig
    from engine.core import EngineCore
    from engine.sampling_params import SamplingParams
    from tests.data.prompts import CHAT_PROMPTS

    engine = EngineCore(EngineConfig(model=model, device="cpu", dtype=dtype))
    prompt = prompt_ids(engine.tokenizer, CHAT_PROMPTS[:1])[0]
    engine.add_request("rss", prompt, SamplingParams(max_tokens=16, temperature=0.0))
    while engine.has_unfinished_requests():
        engine.step()
    pool = engine.runner.kv_pool
    return {
        "dtype": dtype,
        "resolved_dtype": str(engine.parts.dtype).removeprefix("torch."),
        "rss_bytes": status_bytes("VmRSS"),
        "peak_rss_bytes": status_bytes("VmHWM"),
        "weight_bytes": model_weight_bytes(engine.runner.model),
        "kv_pool_bytes": pool.k.nbytes + pool.v.nbytes,
    }


def measure(model: str, dtypes: list[str]) -> list[dict[str, Any]]:
    """One fresh process per dtype; a dtype the engine refuses is reported with its error."""
    rows = []
    for dtype in dtypes:
        done = subprocess.run(
            [sys.executable, __file__, "--one", "--model", model, "--dtypes", dtype],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        else:
            rows.append({"dtype": dtype, "error": (done.stderr.strip().splitlines() or ["failed"])[-1]})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| --dtype | weights | RSS (peak) MB | weights MB | KV pool MB | RSS less KV pool MB |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['dtype']} | error: {r['error']} | - | - | - | - |")
            continue
        mb = {k: r[k] / 1e6 for k in ("rss_bytes", "peak_rss_bytes", "weight_bytes", "kv_pool_bytes")}
        lines.append(
            f"| {r['dtype']} | {r['resolved_dtype']} | {mb['rss_bytes']:.0f} ({mb['peak_rss_bytes']:.0f}) | "
            f"{mb['weight_bytes']:.0f} | {mb['kv_pool_bytes']:.0f} | {mb['rss_bytes'] - mb['kv_pool_bytes']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,auto")
    parser.add_argument("--one", action="store_true", help="measure this process (one dtype) and print JSON")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.one:
        print(json.dumps(measure_one(args.model, dtypes[0])))
        return
    rows = measure(args.model, dtypes)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
