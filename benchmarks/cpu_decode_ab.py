"""Batch-1 greedy decode on the CPU engine, this tree against git revision REV, side by side:
a SmolLM2-135M-shaped model (30 layers, hidden 576, tied 49152-token head) of random weights
in fp32, so that no model file is needed (a GPU machine's host CPU can run it as it comes).

    python benchmarks/cpu_decode_ab.py --baseline REV [--pairs 3] [--waves 5] [--new-tokens 96]

REV's engine, benchmarks, tests and training are taken out with `git archive` into a scratch
folder; each pair runs REV's tree, then this one, each in a process of its own with the same
thread count (torch's, or OMP_NUM_THREADS), and each process decodes one warm wave, then
`--waves` timed ones of one 40-token prompt. A process prints the median of its waves'
decode-only tok/s (first token to last); the table gives every pair and the ratio.
Speed does not depend on weight values, only on shapes, dtype and token count (random
weights may stop early at the end-of-text id; the rate counts the tokens decoded).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("engine", "benchmarks", "tests", "training")


def decode_rates(root: Path, waves: int, new_tokens: int) -> list[float]:
    """Decode-only tok/s of each timed wave, on the engine of the tree at `root`."""
    sys.path.insert(0, str(root))
    import torch

    from benchmarks.engine_gpu import word_tokenizer
    from benchmarks.smollm2_offline import run_engine
    from engine.config import EngineConfig, ModelConfig
    from engine.core import EngineCore
    from engine.engine_setup import build_engine_parts
    from engine.loader.load import LoadedModel, build_model
    from engine.loader.resolve import ModelSource

    shape = ModelConfig(
        architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0, max_position=8192,
        tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,),
    )  # fmt: skip
    model = build_model(shape, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02, generator=gen) if param.dim() > 1 else param.fill_(1.0)
    source = ModelSource(name="smollm2-135m-shaped", kind="hf", path=Path("."))
    loaded = LoadedModel(model, shape, word_tokenizer(shape.vocab_size), source)
    config = EngineConfig(
        model="random", device="cpu", dtype="float32", max_num_seqs=1, max_model_len=2048, enable_prefix_cache=False
    )
    engine = EngineCore(config, parts=build_engine_parts(config, loaded=loaded))
    prompt = [[int(i) for i in torch.randint(3, shape.vocab_size, (40,), generator=gen)]]
    run_engine(engine, prompt, new_tokens)
    timings = [run_engine(engine, prompt, new_tokens) for _ in range(waves)]
    return [t.decode_tokens / t.decode_seconds for t in timings]


def extract(revision: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", revision, *TREES], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as file:
        file.write(archive)
        file.seek(0)
        with tarfile.open(fileobj=file) as tar:
            tar.extractall(into, filter="data")
    return into


def run_child(root: Path, args: argparse.Namespace) -> float:
    command = [sys.executable, __file__, "--child", str(root), "--waves", str(args.waves)]
    command += ["--new-tokens", str(args.new_tokens)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["median_tok_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="git revision to run against this tree")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--waves", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        rates = decode_rates(args.child, args.waves, args.new_tokens)
        print(json.dumps({"median_tok_s": statistics.median(rates), "waves": rates}))
        return
    if not args.baseline:
        parser.error("--baseline REV is required")
    with tempfile.TemporaryDirectory() as scratch:
        before_root = extract(args.baseline, Path(scratch))
        print(f"| pair | {args.baseline} tok/s | this tree tok/s | this / {args.baseline} |")
        print("|---:|---:|---:|---:|")
        for pair in range(1, args.pairs + 1):
            before, after = run_child(before_root, args), run_child(ROOT, args)
            print(f"| {pair} | {before:.1f} | {after:.1f} | {after / before:.2f} |", flush=True)


if __name__ == "__main__":
    main()
