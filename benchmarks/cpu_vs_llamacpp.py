"""Our CPU engine against llama.cpp on the same GGUF, and against transformers at batch 16: the
figures of issue 19's "What it must show", in one run on one machine.

    make llamacpp-peer        # once: llama-cpp-python built for this CPU in .bench/llamacpp-venv
    python benchmarks/cpu_vs_llamacpp.py [--model smollm2-135m] [--rounds 3] [--prompts 6]
        [--new-tokens 96] [--threads N] [--engine-dtypes float32,bfloat16] [--native-dtype auto]
        [--batch 16] [--json OUT.json] [--plot OUT.png]
    DSPARK_CPU_ISA=avx512bf16 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 ATEN_CPU_CAPABILITY=avx512 \
        python benchmarks/cpu_vs_llamacpp.py ...   # AMX capped off, as `make test-isa` caps it

Batch 1, greedy, `--new-tokens` tokens from each of the first `--prompts` chat prompts of
tests/data/prompts.py (rendered by the model's chat template through our tokenizer, so every
system gets the same prompt ids), EOS ignored so that every system generates the same count:
- engine_fp32 (and engine_bf16 ...): our engine, weights dequantised at load to that dtype;
- engine_native: our engine with `--native-dtype` (auto: the GGUF's own quantized format). The
  row is skipped, with a note, when the engine refuses the dtype or holds its weights at more
  than 40% of the float32 bytes (not the file's own format on this tree);
- llamacpp_gguf: llama.cpp on the GGUF file itself (Q4_1 for the embedded model);
- llamacpp_f32: llama.cpp on its own f32 conversion of that file (benchmarks/llamacpp_runner.py
  to-f32, kept in .bench/), so both fp32 rows multiply the same dequantised weights.
Batch `--batch`: the engine at each engine dtype (engine_fp32_batch, engine_bf16_batch) and at
`--native-dtype` (engine_native_batch) against transformers_batch (fp32) on one wave of that many
prompts, benchmarks/smollm2_offline.py's runners, stopping at EOS as it does.

Every system runs one untimed pass first, then once per round, in an order rotated each round
so that a slow spell of a shared machine does not land on one system. llama.cpp runs in its own
process from its own virtualenv with the same thread count as the engine (default: all cores).
The batch-1 bars use decode-only tokens/s (each prompt's first token to its last), the batch
bar tokens/s with prefill included.
The weight stream of a batch-1 row is weights bytes per token x decode tokens/s, against the
rate of a plain multi-threaded read (a max-reduction; a copy's source rate, also printed, is
about half of it because the copy writes too), best of before and after the rounds. Float32
and bfloat16 rows stream the GGUF's elements at 4 and 2 bytes, the quantized rows the file's
own tensor bytes. Greedy agreement counts, per prompt,
the tokens before the first difference. Last: the RSS of an engine process per dtype
(benchmarks/engine_rss.py).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import cpu_peer_report as report  # noqa: E402
from benchmarks import engine_rss  # noqa: E402
from benchmarks.cpu_peer_systems import (  # noqa: E402
    EngineBatch1,
    Generated,
    LlamaCppPeer,
    copy_read_gbs,
    ensure_f32_gguf,
    gguf_tensor_stats,
    llamacpp_version,
    model_weight_bytes,
    plain_read_gbs,
)
from benchmarks.smollm2_offline import git_commit, load_hf, machine_name, run_engine, run_hf  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.engine_setup import build_engine_parts  # noqa: E402
from engine.kernels.cpu import isa  # noqa: E402
from engine.loader.load import load_model  # noqa: E402
from engine.loader.resolve import resolve_model  # noqa: E402
from tests.data.prompts import CHAT_PROMPTS  # noqa: E402

System = Callable[[list[list[int]]], tuple[report.Timing, Generated]]
NATIVE_MAX_SHARE = 0.4  # of the float32 weight bytes: above it, --native-dtype is not a quantized format
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def isa_report() -> dict[str, Any]:
    flags = isa.cpu_flags() or frozenset()
    return {
        "cpu_flags": {f: f in flags for f in ISA_FLAGS},
        "kernel_level": isa.target().level,
        "env": {k: os.environ.get(k) for k in (isa.ENV, "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")},
    }


def engine_for(model: str, dtype: str, batch: int, loaded: Any = None) -> EngineCore:
    config = EngineConfig(
        model=model, device="cpu", dtype=dtype, max_num_seqs=batch, max_model_len=2048, enable_prefix_cache=False
    )  # the CPU engine, also on a machine with a GPU
    return EngineCore(config, parts=build_engine_parts(config, loaded=loaded))


def native_engine(model: str, dtype: str, batch: int, fp32_bytes: int) -> tuple[EngineCore | None, str]:
    """The engine on the GGUF's own format, or None and why not."""
    try:
        engine = engine_for(model, dtype, batch)
    except (ValueError, NotImplementedError, TypeError) as exc:
        return None, f"engine --dtype {dtype} refused: {exc}"
    held = model_weight_bytes(engine.runner.model)
    if held > NATIVE_MAX_SHARE * fp32_bytes:
        return None, (
            f"engine --dtype {dtype} holds {held / 1e6:.0f} MB of weights as {engine.parts.dtype} "
            f"(float32: {fp32_bytes / 1e6:.0f} MB): not the GGUF's own format on this tree; row skipped"
        )
    return engine, f"engine --dtype {dtype} holds {held / 1e6:.0f} MB of weights"


def _decode_rate(timing: report.Timing) -> str:
    """The decode-only rate in brackets where the system times its decode apart, else nothing."""
    return f" ({timing.decode_tokens_per_s:.1f})" if timing.decode_seconds > 0 else ""


def run_rounds(
    systems: dict[str, System], prompts: list[list[int]], rounds: int
) -> tuple[dict[str, report.Timing], dict[str, Generated]]:
    """One untimed pass, then `rounds` timed ones, the order rotated each round; the tokens
    are those of the first timed round."""
    for run in systems.values():
        run(prompts)
    names = list(systems)
    totals = {name: report.Timing() for name in names}
    tokens: dict[str, Generated] = {}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            timing, generated = systems[name](prompts)
            totals[name] += timing
            tokens.setdefault(name, generated)
        so_far = [f"{n} {totals[n].tokens_per_s:.1f}" + _decode_rate(totals[n]) for n in names]
        print(f"round {r + 1}/{rounds}, tok/s so far (decode only): " + ", ".join(so_far), flush=True)
    return totals, tokens


def main() -> None:
    args = report.parse_args(description=__doc__)
    torch.set_num_threads(args.threads)
    source = resolve_model(args.model)
    gguf_bytes, elements = gguf_tensor_stats(source.path)
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": machine_name("cpu"),
        "commit": git_commit(),
        "threads": args.threads,
        "model": str(source.path),
        "isa": isa_report(),
        "command": " ".join(sys.argv),
        "notes": [],
    }
    print(json.dumps({k: results[k] for k in ("date", "machine", "commit", "threads", "isa")}))
    if os.environ.get(isa.ENV) and not os.environ.get("ONEDNN_MAX_CPU_ISA"):
        results["notes"].append(f"{isa.ENV} caps our kernels only: oneDNN and ATen are uncapped (see make test-isa)")
    results["copy_read_gbs"] = copy_read_gbs(args.copy_mib)
    results["plain_read_gbs"] = plain_read_gbs(args.copy_mib)
    print(f"memory: plain read {results['plain_read_gbs']:.1f} GB/s, copy {results['copy_read_gbs']:.1f} GB/s read")

    loaded = load_model(args.model, dtype=torch.float32, progress=False)
    prompts = report.prompt_ids(loaded.tokenizer, CHAT_PROMPTS[: args.prompts])
    systems: dict[str, System] = {}
    labels: dict[str, str] = {}
    weights: dict[str, int] = {}
    for dtype in args.engine_dtypes:
        name = report.engine_row_name(dtype)
        reuse = loaded if dtype == "float32" else None
        systems[name] = EngineBatch1(engine_for(args.model, dtype, 1, reuse), args.new_tokens)
        labels[name] = f"engine {dtype}"
        weights[name] = elements * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    native, note = native_engine(args.model, args.native_dtype, 1, weights[report.ENGINE_FP32])
    print(note)
    results["notes"].append(note)
    if native is not None:
        systems[report.ENGINE_NATIVE] = EngineBatch1(native, args.new_tokens)
        labels[report.ENGINE_NATIVE] = f"engine --dtype {args.native_dtype}"
        weights[report.ENGINE_NATIVE] = gguf_bytes
    peers: list[LlamaCppPeer] = []
    version = llamacpp_version(args.llamacpp_python)
    if version is not None:
        f32_path = args.f32_gguf or Path(".bench") / f"{source.path.stem}.f32.gguf"
        how = ensure_f32_gguf(args.llamacpp_python, source.path, f32_path, args.threads)
        results["notes"].append(f"llama.cpp f32 file: {how}")
        if args.llamacpp_no_repack:
            results["notes"].append("llama.cpp without its extra buffer types (no runtime repacking, no AMX buffers)")
        for name, path, what in (
            (report.LLAMACPP_Q, source.path, "the GGUF as shipped"),
            (report.LLAMACPP_F32, f32_path, "its f32 conversion"),
        ):
            peer = LlamaCppPeer(args.llamacpp_python, path, args.threads, args.llamacpp_no_repack)
            peers.append(peer)
            systems[name] = partial(peer.decode, new_tokens=args.new_tokens)
            labels[name] = f"llama-cpp-python {version}, {what}"
            weights[name] = gguf_tensor_stats(path)[0]
    else:
        results["notes"].append(f"no llama.cpp at {args.llamacpp_python}: run `make llamacpp-peer`; rows skipped")
    try:
        totals, tokens = run_rounds(systems, prompts, args.rounds)
    finally:
        for peer in peers:
            peer.close()
    # a shared machine's bandwidth moves: the best of before and after the batch-1 rounds
    results["plain_read_gbs"] = max(results["plain_read_gbs"], plain_read_gbs(args.copy_mib))
    results["copy_read_gbs"] = max(results["copy_read_gbs"], copy_read_gbs(args.copy_mib))
    print(f"memory: plain read {results['plain_read_gbs']:.1f} GB/s, copy {results['copy_read_gbs']:.1f} GB/s read")
    rows = [report.SystemRow(n, labels[n], 1, totals[n], weights[n]) for n in systems]

    if args.batch:
        eos = set(loaded.config.eos_token_ids) | set(loaded.tokenizer.eos_token_ids)
        wave = report.prompt_ids(loaded.tokenizer, (CHAT_PROMPTS * args.batch)[: args.batch])
        batch_engines = {
            f"{report.engine_row_name(dtype)}_batch": engine_for(
                args.model, dtype, args.batch, loaded if dtype == "float32" else None
            )
            for dtype in args.engine_dtypes
        }
        if native is not None:
            batch_engines[report.ENGINE_NATIVE_BATCH] = engine_for(args.model, args.native_dtype, args.batch)
        hf = load_hf(args.model, "cpu", torch.float32)
        batch_systems: dict[str, System] = {
            name: partial(_wave_system, partial(run_engine, engine, new_tokens=args.new_tokens))
            for name, engine in batch_engines.items()
        }
        batch_systems[report.TRANSFORMERS_BATCH] = partial(
            _wave_system, partial(run_hf, hf, new_tokens=args.new_tokens, device="cpu", eos=eos)
        )
        batch_totals, _ = run_rounds(batch_systems, wave, args.rounds)
        for name, timing in batch_totals.items():
            rows.append(report.SystemRow(name, name.removesuffix("_batch").replace("_", " "), args.batch, timing, None))

    bars = report.bar_results({r.name: r.timing for r in rows})
    agreements = [a for s, ref in report.AGREEMENT_PAIRS if (a := report.agreement(s, ref, tokens)) is not None]
    rss = [] if args.skip_rss else engine_rss.measure(args.model, [*args.engine_dtypes, args.native_dtype])
    print()
    print(report.systems_table(rows, results["plain_read_gbs"]))
    print()
    print(report.bars_table(bars))
    print()
    print(report.agreement_table(agreements))
    if rss:
        print()
        print(engine_rss.table(rss))
    for note in results["notes"]:
        print(f"note: {note}")
    results |= {
        "rows": [
            {"name": r.name, "label": r.label, "batch": r.batch, "weight_bytes": r.weight_bytes}
            | {"tokens_per_s": r.timing.tokens_per_s, "decode_tokens_per_s": r.timing.decode_tokens_per_s}
            | vars(r.timing)
            for r in rows
        ],
        "bars": [{"bar": b.bar.label, "ratio": b.ratio, "at_least": b.bar.at_least} for b in bars],
        "agreement": [vars(a) for a in agreements],
        "rss": rss,
        "tokens": tokens,
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.plot:
        title = f"{source.path.name} on {results['machine']}, {args.threads} threads, {results['date']}"
        report.write_plot(args.plot, title, rows, results["plain_read_gbs"])


def _wave_system(run: Callable[[list[list[int]]], Any], wave: list[list[int]]) -> tuple[report.Timing, Generated]:
    """smollm2_offline's WaveTiming of one wave as a Timing (that runner keeps no tokens)."""
    t = run(wave)
    return report.Timing(t.tokens, t.seconds, t.decode_tokens, t.decode_seconds), []


if __name__ == "__main__":
    main()
