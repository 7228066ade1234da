"""Held-out acceptance of several drafter checkpoints on the same sequences, side by side.

Each checkpoint is loaded as the engine loads it (`load_drafter`: its weight encoding decoded,
cast to the target's dtype) and walked over the held-out split of a training run's data
(engine.spec.train.evaluate): greedy committed tokens per verify and the expected value at
`--temperature`, with P(draft i accepted) per position.

    python3 benchmarks/drafter_acceptance.py --model .device/model/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --work runs/tdw --drafters engine/spec/drafters/smollm2-135m runs/out/drafter --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.loader.load import load_model  # noqa: E402
from engine.spec.checkpoint import load_drafter, read_drafter_document  # noqa: E402
from engine.spec.train.data import ShardStore  # noqa: E402
from engine.spec.train.evaluate import evaluate_acceptance  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="the target: alias, GGUF or HF directory")
    parser.add_argument("--work", required=True, help="a train-drafter work directory (its data/ holds the split)")
    parser.add_argument("--drafters", nargs="+", required=True, help="checkpoint directories")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-sequences", type=int, default=1000, help="held-out sequences per mode")
    parser.add_argument("--max-seq-len", type=int, default=768)
    parser.add_argument("--json", help="write the reports here")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    loaded = load_model(args.model, dtype=dtype, device=device, progress=False)
    target = loaded.model.requires_grad_(False)
    heldout = ShardStore(Path(args.work) / "data").load_all().split(heldout=True)
    print(f"{len(heldout)} held-out sequences; target {loaded.name} in {dtype} on {device}", flush=True)

    reports = []
    for directory in args.drafters:
        start = time.monotonic()
        config, training, encoding = read_drafter_document(directory)
        drafter, _ = load_drafter(directory, loaded.config, device, dtype)
        drafter.bind_target(target.embed, target.compute_logits)
        report = evaluate_acceptance(
            drafter, target, heldout, device, args.temperature, args.max_sequences, max_seq_len=args.max_seq_len
        )
        size = (Path(directory) / "drafter.safetensors").stat().st_size
        reports.append(
            {
                "drafter": str(directory),
                "num_layers": config.num_layers,
                "weight_encoding": encoding,
                "file_bytes": size,
                "steps": (training.get("train") or {}).get("steps_done"),
                "seconds": round(time.monotonic() - start, 1),
                **report.to_dict(),
            }
        )
        print(
            f"\n{directory} ({config.num_layers} layers, {encoding}, {size / 1e6:.1f} MB)\n{report.table()}", flush=True
        )

    print(f"\n| drafter | layers | encoding | MB | greedy tokens/verify | T={args.temperature:g} tokens/verify |")
    print("|---|---:|---|---:|---:|---:|")
    for r in reports:
        print(
            f"| {r['drafter']} | {r['num_layers']} | {r['weight_encoding']} | {r['file_bytes'] / 1e6:.1f} "
            f"| {r['greedy_accept_len']:.3f} | {r['sampled_accept_len']:.3f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "reports": reports}, indent=2) + "\n")


if __name__ == "__main__":
    main()
