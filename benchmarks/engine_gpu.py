"""Engine speed on one GPU, measured side by side in one run (random weights in real shapes:
speed does not depend on weight values).

    python benchmarks/engine_gpu.py --out DIR [--sections ceilings,decode,prefill,hf,dspark,expansion]

- ceilings: device copy bandwidth (bytes read + written) and bf16 matmul rate, measured.
- decode: a Llama-3-8B-shaped model, tokens/s at batch 1/16/64/256 against the
  memory floor (weight bytes + KV bytes read per step, over the measured copy bandwidth).
- prefill: one 4k-token prompt, FLOP/s as a fraction of the measured matmul rate.
- hf: transformers `generate` on the same shapes and batches (the peer).
- dspark: tokens/s against a forced DSpark accept length (`simulated_acceptance`, passed to
  the runner as its accept rule) at batch 1/16/64.
- expansion: prefill expansion with vs without `repeat_interleave(output_size=...)` under a
  burst of concurrent prompts: TTFT and host time per launch.

Prints a table per section and writes results.json into --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig, ModelConfig, RopeScaling, SpeculativeConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.engine_setup import EngineParts, build_engine_parts  # noqa: E402
from engine.loader.load import LoadedModel, build_model  # noqa: E402
from engine.loader.resolve import ModelSource  # noqa: E402
from engine.loader.tokenizer import Tokenizer  # noqa: E402
from engine.runner.options import AcceptRule, RunnerOptions  # noqa: E402
from engine.runner.step_output import PendingStep  # noqa: E402
from engine.sampling.rng import uniform  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.scheduler import ScheduledStep  # noqa: E402

# Counter-based stream of the simulated acceptance's coin flips.
_SIMULATE_STREAM = 0x5D_AC_03

LLAMA3_8B = ModelConfig(
    architecture="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=RopeScaling(
        kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192
    ),
    max_position=8192,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_ids=(2,),
)


def word_tokenizer(vocab_size: int) -> Tokenizer:
    """A real (word-level) tokenizer over `vocab_size` ids, so outputs detokenise."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t2"))


def random_model(config: ModelConfig, dtype: torch.dtype, device: str = "cuda") -> torch.nn.Module:
    model = build_model(config, dtype, device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.02, generator=gen)
            else:
                param.fill_(1.0)
    return model


def engine_for(
    loaded: LoadedModel,
    runner_options: RunnerOptions | None = None,
    engine_class: type[EngineCore] = EngineCore,
    **options: Any,
) -> EngineCore:
    options.setdefault("max_model_len", 4096)
    config = EngineConfig(model="random", device="cuda", dtype="bfloat16", **options)
    return engine_class(config, parts=build_engine_parts(config, loaded=loaded, runner_options=runner_options))


def simulated_acceptance(mean: float, window: int) -> AcceptRule:
    """Commit a forced number of tokens per verify (mean `mean`, in [1, window]), taking the
    drafts as if accepted. Output text is meaningless; speed is real."""
    whole = int(mean)

    def accept(drafts: torch.Tensor, keys: torch.Tensor, counter: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        coin = uniform(keys, counter, 1, _SIMULATE_STREAM)[:, 0]  # [B]
        accept_len = (whole + (coin < mean - whole).to(torch.int32)).clamp(1, window).to(torch.int32)
        cols = torch.arange(window, device=drafts.device)
        padded = torch.cat((drafts, drafts[:, -1:]), dim=1)  # [B, W]
        forced = torch.where(cols < accept_len[:, None].long(), padded, torch.full_like(padded, -1))
        return forced, accept_len

    return accept


class LaunchTimedEngine(EngineCore):
    """Records the host time of every launch (`launch_times`, seconds)."""

    def __init__(self, config: EngineConfig, *, parts: EngineParts) -> None:
        super().__init__(config, parts=parts)
        self.launch_times: list[float] = []

    def _launch(self, step: ScheduledStep) -> PendingStep:
        start = time.perf_counter()
        pending = super()._launch(step)
        self.launch_times.append(time.perf_counter() - start)
        return pending


def timed(fn: Any) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


# -- sections -------------------------------------------------------------------------------


def ceilings() -> dict[str, float]:
    n = 1 << 30  # 2 GiB of bf16 per buffer
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    runs = [timed(lambda d=dst, s=src: d.copy_(s)) for _ in range(10)]
    copy_bw = 2 * src.numel() * 2 / statistics.median(runs)
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    mm = [timed(lambda: a @ b) for _ in range(10)]
    return {"copy_bytes_per_s": copy_bw, "bf16_flops_per_s": 2 * 8192**3 / statistics.median(mm)}


def _decode_rate(
    engine: EngineCore, batch: int, prompt_len: int, steps: int, tokens_per_step: int = 1
) -> tuple[float, float]:
    """(seconds per decode step, context length at the middle of the timed window). Every
    request runs through the whole window: max_tokens covers `tokens_per_step` per step."""
    gen = torch.Generator().manual_seed(batch)
    for i in range(batch):
        prompt = torch.randint(3, engine.model_config.vocab_size, (prompt_len,), generator=gen).tolist()
        engine.add_request(
            f"d{i}", prompt, SamplingParams(max_tokens=(steps + 40) * tokens_per_step, temperature=0.0, ignore_eos=True)
        )
    return timed_decode_steps(engine, steps), prompt_len + 5 + steps / 2


def timed_decode_steps(engine: EngineCore, steps: int) -> float:
    """Seconds per step over `steps` steps of the requests already added, once each has its
    first token and 5 more steps have run; then every request is aborted."""
    while any(len(r.output_ids) == 0 for r in engine.requests.values()):
        engine.step()
    for _ in range(5):
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    for rid in list(engine.requests):
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    return elapsed / steps


def decode(loaded: LoadedModel, ceil: dict[str, float], batches: list[int]) -> list[dict[str, Any]]:
    cfg = loaded.config
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    rows = []
    for batch in batches:
        engine = engine_for(loaded, max_num_seqs=batch, kv_cache_memory_bytes=24 << 30)
        step_s, ctx = _decode_rate(engine, batch, 512, 64)
        floor_s = (weight_bytes + batch * ctx * kv_bytes_per_token) / ceil["copy_bytes_per_s"]
        rows.append(
            {
                "batch": batch,
                "step_ms": step_s * 1e3,
                "tokens_per_s": batch / step_s,
                "floor_ms": floor_s * 1e3,
                "x_floor": step_s / floor_s,
            }
        )
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def prefill(loaded: LoadedModel, ceil: dict[str, float], tokens: int = 4096) -> dict[str, Any]:
    cfg = loaded.config
    engine = engine_for(
        loaded, max_num_seqs=4, max_num_batched_tokens=tokens, kv_cache_memory_bytes=8 << 30, max_model_len=2 * tokens
    )
    gen = torch.Generator().manual_seed(1)
    times = []
    for i in range(4):
        prompt = torch.randint(3, cfg.vocab_size, (tokens,), generator=gen).tolist()
        engine.add_request(f"p{i}", prompt, SamplingParams(max_tokens=1, temperature=0.0))
        times.append(timed(lambda: [engine.step() for _ in range(2)]))
        while engine.has_unfinished_requests():
            engine.step()
    seconds = statistics.median(times[1:])
    params = sum(p.numel() for n, p in loaded.model.named_parameters() if "embed" not in n)
    flops = 2 * params * tokens + 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * tokens
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tflops": flops / seconds / 1e12,
        "fraction_of_matmul_peak": flops / seconds / ceil["bf16_flops_per_s"],
    }


def hf_peer(config: ModelConfig, batches: list[int], prompt_len: int = 512, new_tokens: int = 32) -> list[dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position,
        rope_theta=config.rope_theta,
        tie_word_embeddings=False,
    )
    with torch.device("cuda"):
        model = LlamaForCausalLM(hf_config).to(torch.bfloat16).eval()
    rows = []
    for batch in batches:
        ids = torch.randint(3, config.vocab_size, (batch, prompt_len), device="cuda")

        def gen(n: int, ids: torch.Tensor = ids, model: Any = model) -> None:
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

        gen(2)
        t_short = timed(lambda: gen(1))
        t_long = timed(lambda: gen(new_tokens + 1))
        step_s = (t_long - t_short) / new_tokens
        rows.append({"batch": batch, "step_ms": step_s * 1e3, "tokens_per_s": batch / step_s})
    del model
    torch.cuda.empty_cache()
    return rows


def dspark(loaded: LoadedModel, batches: list[int], accept_lens: list[float]) -> list[dict[str, Any]]:
    from engine.speculative.checkpoint import save_drafter
    from engine.speculative.drafter import DSparkDrafter
    from engine.speculative.drafter_config import DrafterConfig

    drafter_config = DrafterConfig.for_target(loaded.config, "llama3-8b-shaped")
    tmp = Path(tempfile.mkdtemp())
    with torch.device("cuda"):
        drafter = DSparkDrafter(drafter_config).to(torch.bfloat16)
    save_drafter(tmp, drafter, drafter_config)
    del drafter
    rows = []
    for batch in batches:
        for accept in accept_lens:
            spec = SpeculativeConfig(drafter=str(tmp))
            forced = RunnerOptions(accept_rule=simulated_acceptance(accept, drafter_config.window))
            engine = engine_for(loaded, forced, max_num_seqs=batch, kv_cache_memory_bytes=24 << 30, speculative=spec)
            step_s, _ = _decode_rate(engine, batch, 512, 24, tokens_per_step=drafter_config.window)
            rows.append(
                {"batch": batch, "accept_len": accept, "step_ms": step_s * 1e3, "tokens_per_s": batch * accept / step_s}
            )
            del engine
            gc.collect()
            torch.cuda.empty_cache()
    return rows


def expansion(loaded: LoadedModel, num_requests: int = 128) -> list[dict[str, Any]]:
    rows = []
    for host_sized in (True, False):
        engine = engine_for(
            loaded,
            RunnerOptions(host_sized_expansion=host_sized),
            LaunchTimedEngine,
            max_num_seqs=num_requests,
            max_num_batched_tokens=8192,
            kv_cache_memory_bytes=32 << 30,
        )
        assert isinstance(engine, LaunchTimedEngine)
        launch_times = engine.launch_times
        gen = torch.Generator().manual_seed(7)
        for round_ in range(2):  # the first round warms up kernels
            launch_times.clear()
            first: dict[str, float] = {}
            arrival = time.perf_counter()
            for i in range(num_requests):
                n = int(torch.randint(256, 2048, (1,), generator=gen))
                prompt = torch.randint(3, loaded.config.vocab_size, (n,), generator=gen).tolist()
                engine.add_request(
                    f"e{round_}-{i}", prompt, SamplingParams(max_tokens=16, temperature=0.0), arrival_s=arrival
                )
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.request_id not in first and out.new_token_ids:
                        first[out.request_id] = time.perf_counter() - arrival
        ttft = sorted(first.values())
        rows.append(
            {
                "output_size": host_sized,
                "ttft_mean_s": statistics.mean(ttft),
                "ttft_p50_s": ttft[len(ttft) // 2],
                "ttft_p90_s": ttft[int(len(ttft) * 0.9)],
                "host_ms_per_launch": 1e3 * statistics.mean(launch_times),
            }
        )
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", default="ceilings,decode,prefill,hf,dspark,expansion")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--dspark-batches", default="1,16,64")
    parser.add_argument("--accept-lens", default="1,2,3,4,5,6")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sections = args.sections.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    ceil = ceilings()
    results["ceilings"] = ceil
    print(
        f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {ceil['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s",
        flush=True,
    )
    loaded = LoadedModel(
        random_model(LLAMA3_8B, torch.bfloat16),
        LLAMA3_8B,
        word_tokenizer(LLAMA3_8B.vocab_size),
        ModelSource(name="llama3-8b-shaped", kind="hf", path=Path(".")),
    )

    def run(name: str, fn: Any) -> None:
        if name not in sections:
            return
        try:
            results[name] = fn()
        except Exception:  # one failing section must not lose the others' numbers
            results[name] = {"error": traceback.format_exc()}
        print(f"== {name}: {json.dumps(results[name], indent=None, default=str)[:3000]}", flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))

    run("decode", lambda: decode(loaded, ceil, batches))
    run("prefill", lambda: prefill(loaded, ceil))
    run(
        "dspark",
        lambda: dspark(
            loaded, [int(b) for b in args.dspark_batches.split(",")], [float(a) for a in args.accept_lens.split(",")]
        ),
    )
    run("expansion", lambda: expansion(loaded))
    if "hf" in sections:
        del loaded
        torch.cuda.empty_cache()
        run("hf", lambda: hf_peer(LLAMA3_8B, batches))
    print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
