"""Held-out acceptance of several drafter checkpoints on the same sequences, side by side.

Each checkpoint is loaded as the engine loads it (`load_drafter`: its weight encoding decoded,
cast to the target's dtype) and walked over the held-out split of a training run's data
(training.evaluate): greedy committed tokens per verify and the expected value at
`--temperature`, with P(draft i accepted) per position.

The held-out sequences come from a training run's work directory (`--work`), or are made
again (`--heldout-prompts N`): the greedy and `--temperature` answers of the held-out prompts
among the first N of the built-in prompt set, with the seeds the training plan gives them, so
that checkpoints from different runs meet on one fixed set.

    python3 benchmarks/drafter_acceptance.py --model .device/model/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --work runs/tdw --drafters engine/assets/drafters/smollm2-135m runs/out/drafter --json OUT.json
    python3 benchmarks/drafter_acceptance.py --model ... --heldout-prompts 16384 --drafters ...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.loader.load import LoadedModel, load_model  # noqa: E402
from engine.speculative.checkpoint import load_drafter, read_drafter_document  # noqa: E402
from training.data import SequenceSet, ShardStore  # noqa: E402
from training.evaluate import evaluate_acceptance  # noqa: E402
from training.generate import DenseGenerator, GenerationPlan, job_seed, plan_jobs  # noqa: E402
from training.prompts import build_prompt_set  # noqa: E402


def regenerated_heldout(loaded: LoadedModel, num_prompts: int, temperature: float, device: torch.device) -> SequenceSet:
    """The target's greedy and `temperature` answers to the held-out prompts among the first
    `num_prompts` of the built-in set, as the training plan (seed 0) generates them."""
    plan = GenerationPlan(temperatures=(0.0, temperature), max_new_tokens=256, seed=0)
    prompts = build_prompt_set(num_prompts, plan.seed)  # a prefix of any larger set
    jobs = [job for chunk in plan_jobs(prompts, loaded.tokenizer, plan) for job in chunk if job.heldout]
    eos = tuple(loaded.tokenizer.eos_token_ids)
    generator = DenseGenerator(loaded.model, loaded.config, eos, device, max_rows=1024)
    answers = generator.generate(
        [job.prompt_ids for job in jobs],
        [job.temperature for job in jobs],
        [job_seed(plan.seed, job.prompt_index, job.temperature, job.sample) for job in jobs],
        plan.max_new_tokens,
    )
    return SequenceSet.from_lists(
        [job.prompt_ids + answer for job, answer in zip(jobs, answers, strict=True)],
        [len(job.prompt_ids) for job in jobs],
        [job.temperature for job in jobs],
        [True] * len(jobs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="the target: alias, GGUF or HF directory")
    heldout_source = parser.add_mutually_exclusive_group(required=True)
    heldout_source.add_argument("--work", help="a train-drafter work directory (its data/ holds the split)")
    heldout_source.add_argument(
        "--heldout-prompts", type=int, help="make the held-out answers of the first N built-in prompts again"
    )
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
    if args.work:
        heldout = ShardStore(Path(args.work) / "data").load_all().split(heldout=True)
    else:
        heldout = regenerated_heldout(loaded, args.heldout_prompts, args.temperature, device)
    print(f"{len(heldout)} held-out sequences; target {loaded.name} in {dtype} on {device}", flush=True)

    reports = []
    for directory in args.drafters:
        start = time.monotonic()
        config, training, encoding = read_drafter_document(directory)
        drafter, _ = load_drafter(directory, loaded.config, device, dtype)
        drafter.bind_target(target.embed, target.compute_logits)  # type: ignore[arg-type]
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
