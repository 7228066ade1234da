"""The whole drafter-training run, inside a time budget: load the target, let it answer the
prompt set (plus an optional text corpus), train the drafter, measure held-out acceptance,
and write the drafter checkpoint (engine.speculative.checkpoint) with the run's metadata.

Everything but the final checkpoint lives in the work directory, so a rerun with
`resume=True` reuses the generated shards and continues training where it stopped:

    <work_dir>/data/gen-00000.safetensors ...   generated sequences (one shard per chunk)
    <work_dir>/data/corpus-00000.safetensors    the optional corpus
    <work_dir>/train_state.pt, train_log.jsonl  training state and metrics
    <work_dir>/report.json                      the run's summary (also in drafter.json)

Budget: generation gets `gen_minutes` (it stops between shards); evaluation has
`eval_minutes` kept for it at the end; training gets what is left of `max_minutes`.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from engine.loader.load import load_model
from engine.speculative.checkpoint import save_drafter
from engine.speculative.drafter import DSparkDrafter
from engine.speculative.drafter_config import DrafterConfig
from engine.speculative.weight_encoding import WeightEncoding, round_trip
from training.data import SequenceSet, ShardStore, corpus_sequences
from training.evaluate import AcceptanceReport, evaluate_acceptance
from training.generate import (
    ENGINE_MAX_NUM_SEQS,
    AnswerGenerator,
    DenseGenerator,
    EngineGenerator,
    GenerationPlan,
    GenerationReport,
    generate_dataset,
    missing_chunks,
    plan_jobs,
)
from training.init import init_from_drafter, init_from_target
from training.prompts import build_prompt_set
from training.trainer import TrainConfig, Trainer, TrainReport

log = logging.getLogger(__name__)

GeneratorKind = Literal["auto", "engine", "dense"]
SAVE_MARGIN_S = 20.0  # kept at the end of the budget for writing the checkpoint


@dataclass(frozen=True)
class RunConfig:
    model: str = "smollm2-135m"
    out: str = "drafter"
    work_dir: str | None = None  # None: "<out>-work" beside the output
    device: str = "auto"
    target_name: str | None = None  # recorded in the checkpoint; None: the model argument's name
    # drafter shape
    gamma: int = 7
    layers: int = 1
    markov_rank: int = 64
    capture_layers: tuple[int, ...] = ()  # () = default_capture_layers
    init: Literal["target", "random"] = "target"
    init_from: str | None = None  # a drafter checkpoint to start from (more layers allowed), after `init`
    weight_encoding: WeightEncoding = "plain"  # how the exported checkpoint stores its matrices
    # data
    num_prompts: int = 6000
    generation: GenerationPlan = GenerationPlan()
    generator: GeneratorKind = "auto"
    generator_batch: int = 256  # rows decoded together
    corpus: str | None = None
    corpus_max_tokens: int | None = 2_000_000
    # training and evaluation
    train: TrainConfig = TrainConfig()
    eval_sequences: int = 200
    eval_temperature: float = 0.7
    # time
    max_minutes: float | None = None
    gen_minutes: float | None = None  # None: 35% of max_minutes
    eval_minutes: float | None = None  # None: 10% of max_minutes, at most 1.5
    resume: bool = False
    progress: bool = True

    @property
    def work_path(self) -> Path:
        if self.work_dir:
            return Path(self.work_dir)
        out = Path(self.out)
        return out.with_name(out.name + "-work")


@dataclass(frozen=True)
class TargetBundle:
    """A loaded target: what `engine.loader.load.load_model` returns, or a model built in code."""

    model: torch.nn.Module
    config: Any  # engine.config.ModelConfig
    tokenizer: Any  # training.data.ChatTokenizer
    name: str


@dataclass(frozen=True)
class RunResult:
    out: Path
    train: TrainReport
    acceptance: AcceptanceReport | None
    metadata: dict[str, Any]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Budget:
    """Deadlines (time.monotonic seconds) derived from the run's minutes."""

    def __init__(self, config: RunConfig, start: float):
        self.start = start
        total = config.max_minutes * 60 if config.max_minutes else None
        self.end = start + total if total else None
        gen = config.gen_minutes * 60 if config.gen_minutes is not None else (0.35 * total if total else None)
        self.generation = start + gen if gen is not None else None
        reserve = (
            config.eval_minutes * 60 if config.eval_minutes is not None else (min(90.0, 0.1 * total) if total else 0.0)
        )
        self.training = self.end - reserve - SAVE_MARGIN_S if self.end is not None else None


def make_generator(
    config: RunConfig,
    target: torch.nn.Module,
    target_config: Any,
    eos: tuple[int, ...],
    device: torch.device,
    engine_allowed: bool = True,
) -> AnswerGenerator:
    """The engine (which loads `config.model` itself) when allowed and chosen, else the dense sampler."""
    if config.generator == "engine" or (config.generator == "auto" and engine_allowed):
        try:
            return EngineGenerator(
                config.model,
                device=str(device),
                max_num_seqs=min(config.generator_batch, ENGINE_MAX_NUM_SEQS),
                seed=config.generation.seed,
            )
        except Exception as e:  # the engine may be unavailable on this machine; the dense path always works
            if config.generator == "engine":
                raise
            log.warning("engine.LLM unavailable (%s: %s); generating with the dense sampler", type(e).__name__, e)
    return DenseGenerator(target, target_config, eos, device, max_rows=config.generator_batch)


def _free_memory() -> None:
    """Return what a dropped generator (the engine's KV pool, CUDA graphs) held to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def served_drafter(
    drafter: DSparkDrafter, device: torch.device, dtype: torch.dtype, weight_encoding: WeightEncoding = "plain"
) -> DSparkDrafter:
    """A `dtype` copy of the training drafter on `device`, as `load_drafter` gives it to the
    engine from a checkpoint written with `weight_encoding` (weights in `dtype`, RoPE tables
    fp32, eval mode): what the held-out acceptance is measured on. The fp32 training copy
    under autocast would mix dtypes in the fused GPU kernels (a bf16 branch output beside an
    fp32 residual) and is not what ships. The copy still needs `bind_target`."""
    with torch.device(device):
        copy = DSparkDrafter(drafter.config)
    copy.load_state_dict(round_trip(drafter.state_dict(), weight_encoding, dtype))
    copy.requires_grad_(False).to(dtype)
    copy.rotary_emb.cos_sin_cache = copy.rotary_emb.cos_sin_cache.float()
    return copy.eval()


def export_drafter(
    drafter: DSparkDrafter,
    out: Path,
    metadata: dict[str, Any],
    dtype: torch.dtype = torch.bfloat16,
    weight_encoding: WeightEncoding = "plain",
) -> Path:
    """Write a `dtype` copy of the drafter's weights (the training copy stays fp32), its
    matrices stored as `weight_encoding` says."""
    copy = DSparkDrafter(drafter.config).to(dtype)
    copy.load_state_dict({k: v.detach().to("cpu", dtype) for k, v in drafter.state_dict().items()})
    return save_drafter(out, copy, training=metadata, weight_encoding=weight_encoding)


def prepare_data(
    config: RunConfig,
    store: ShardStore,
    tokenizer: Any,
    target: torch.nn.Module,
    target_config: Any,
    device: torch.device,
    budget: Budget,
    engine_allowed: bool = True,
) -> dict[str, Any]:
    """Generate the missing answer shards (and the corpus shard); returns what was done."""
    prompts = build_prompt_set(config.num_prompts, config.generation.seed)
    chunks = plan_jobs(prompts, tokenizer, config.generation)
    info: dict[str, Any] = {"prompts": len(prompts), "jobs": sum(len(c) for c in chunks)}
    if missing_chunks(store, chunks):
        eos = tuple(tokenizer.eos_token_ids)
        generator = make_generator(config, target, target_config, eos, device, engine_allowed)

        def generate(generator: AnswerGenerator) -> GenerationReport:
            return generate_dataset(
                store, chunks, generator, config.generation, deadline=budget.generation, progress=config.progress
            )

        try:
            report = generate(generator)
        except Exception as e:
            if config.generator != "auto" or isinstance(generator, DenseGenerator):
                raise
            log.warning(
                "engine generation failed (%s: %s); continuing with the dense sampler "
                "(shards already written are kept)",
                type(e).__name__,
                e,
            )
            del generator
            _free_memory()
            generator = DenseGenerator(target, target_config, eos, device, max_rows=config.generator_batch)
            report = generate(generator)
        info["generator"] = type(generator).__name__
        info["generation"] = dataclasses.asdict(report)
        del generator
        _free_memory()
    if config.corpus and not store.has("corpus-00000"):
        corpus = corpus_sequences(
            config.corpus,
            tokenizer,
            min(config.train.max_seq_len, 512),
            config.generation.heldout_permille,
            config.corpus_max_tokens,
        )
        store.write("corpus-00000", corpus)
        info["corpus_sequences"] = len(corpus)
    return info


def data_summary(sequences: SequenceSet) -> dict[str, Any]:
    answer_tokens = int((sequences.lengths - sequences.prompt_lens).sum())
    temps = {f"{t:g}": int((sequences.temperatures == t).sum()) for t in np.unique(sequences.temperatures)}
    return {
        "sequences": len(sequences),
        "tokens": sequences.num_tokens,
        "answer_tokens": answer_tokens,
        "heldout_sequences": int(sequences.heldout.sum()),
        "by_temperature": temps,
    }


def run(config: RunConfig, target_bundle: TargetBundle | None = None) -> RunResult:
    """The whole run; `target_bundle` replaces loading `config.model` (tests build one in code)."""
    start = time.monotonic()
    budget = Budget(config, start)
    device = resolve_device(config.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    work = config.work_path
    work.mkdir(parents=True, exist_ok=True)
    if not config.resume and (work / "train_state.pt").exists():
        raise ValueError(
            f"{work} holds an earlier run's training state: pass resume (--resume) to continue it, "
            "or use another work directory"
        )

    loaded_here = target_bundle is None
    if target_bundle is None:
        loaded = load_model(config.model, dtype=dtype, device=device, progress=config.progress)
        target_bundle = TargetBundle(loaded.model, loaded.config, loaded.tokenizer, loaded.name)
    target, target_config, tokenizer = target_bundle.model, target_bundle.config, target_bundle.tokenizer
    target.requires_grad_(False)
    timings = {"load_s": round(time.monotonic() - start, 1)}

    store = ShardStore(work / "data")
    # The engine loads config.model itself: only when that is the target trained here.
    data_info = prepare_data(
        config, store, tokenizer, target, target_config, device, budget, engine_allowed=loaded_here
    )
    timings["data_s"] = round(time.monotonic() - start - timings["load_s"], 1)
    sequences = store.load_all()
    train_set, heldout_set = sequences.split(heldout=False), sequences.split(heldout=True)
    log.info(
        "data: %d train / %d held-out sequences, %d tokens",
        len(train_set),
        len(heldout_set),
        sequences.num_tokens,
    )

    target_name = config.target_name or target_bundle.name
    overrides: dict[str, Any] = {
        "gamma": config.gamma,
        "num_layers": config.layers,
        "markov_rank": config.markov_rank,
    }
    if config.capture_layers:
        overrides["capture_layers"] = config.capture_layers
    drafter_config = DrafterConfig.for_target(target_config, target_name, **overrides)
    with torch.device(device):
        drafter = DSparkDrafter(drafter_config)
    copied = init_from_target(drafter, target, target_config) if config.init == "target" else []
    warm_start = init_from_drafter(drafter, config.init_from, device) if config.init_from else None
    drafter.bind_target(target.embed, target.compute_logits)  # type: ignore[arg-type]

    out = Path(config.out)
    base_meta = {
        "target": target_name,
        "model_argument": config.model,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "initialised_from_target_layers": copied,
        "initialised_from_drafter": warm_start,
        "weight_encoding": config.weight_encoding,
        "data": {**data_info, **data_summary(sequences)},
        "generation_plan": dataclasses.asdict(config.generation),
        "train_config": dataclasses.asdict(config.train),
    }

    def on_checkpoint(d: DSparkDrafter, step: int) -> None:
        export_drafter(
            d, out, {**base_meta, "partial": True, "steps_done": step}, weight_encoding=config.weight_encoding
        )

    trainer = Trainer(
        drafter,
        target,
        train_set,
        config.train,
        work,
        device,
        autocast_dtype=torch.bfloat16 if device.type == "cuda" else None,
        on_checkpoint=on_checkpoint,
    )
    if config.resume:
        trainer.load_state()
    train_report = trainer.run(deadline=budget.training, progress=config.progress)
    timings["train_s"] = round(train_report.seconds, 1)
    log.info("training: %s", train_report)

    acceptance = None
    if len(heldout_set):
        t0 = time.monotonic()
        served = served_drafter(drafter, device, dtype, config.weight_encoding)  # as served: bf16 on GPU
        served.bind_target(target.embed, target.compute_logits)  # type: ignore[arg-type]
        acceptance = evaluate_acceptance(
            served,
            target,
            heldout_set,
            device,
            config.eval_temperature,
            config.eval_sequences,
            max_seq_len=config.train.max_seq_len,
        )
        timings["eval_s"] = round(time.monotonic() - t0, 1)
        print(acceptance.table(), flush=True)
    timings["total_s"] = round(time.monotonic() - start, 1)
    metadata = {
        **base_meta,
        "partial": train_report.stopped == "signal",
        "train": dataclasses.asdict(train_report),
        "acceptance": acceptance.to_dict() if acceptance else None,
        "timings": timings,
    }
    export_drafter(drafter, out, metadata, weight_encoding=config.weight_encoding)
    (work / "report.json").write_text(json.dumps(metadata, indent=2, default=str) + "\n")
    log.info("drafter written to %s (%.1f s in all)", out, timings["total_s"])
    return RunResult(out=out, train=train_report, acceptance=acceptance, metadata=metadata)
