"""The target answers the training prompts itself: greedy answers and answers sampled at the
plan's temperatures, so that the drafter learns the target's own distribution.

Two generators give the same law (plain temperature sampling, no top-k/top-p):

- `EngineGenerator`: the offline engine (`engine.LLM`), continuous batching, the path the
  server uses;
- `DenseGenerator`: a small batched sampler over the target module with a contiguous
  per-row cache (training.dense_attention.StaticCacheAttention). It needs nothing
  of the engine's scheduler, so it serves tests and any machine where the engine cannot run.

`plan_jobs` renders the prompts with the chat template into jobs (prompt x temperature) in
fixed-size chunks; `generate_dataset` writes one shard per chunk, skips the chunks already on
disk (resume), and stops between chunks at a deadline.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from engine.config import ModelConfig
from engine.models.context import ForwardContext
from training.data import ChatTokenizer, SequenceSet, ShardStore
from training.dense_attention import StaticCache, StaticCacheAttention, dense_metadata
from training.prompts import ChatPrompt

log = logging.getLogger(__name__)

GEN_SHARD_PREFIX = "gen-"
FINISHED_CHECK_EVERY = 16  # decode steps between host checks that every row has finished
PREFILL_ROWS = 64  # prompts prefilled together
# The engine's KV pool during generation (of free device memory): training runs after it on the
# same device, and what the engine reserved may not all be handed back.
ENGINE_KV_MEMORY_FRACTION = 0.4
ENGINE_MAX_NUM_SEQS = 256


class AnswerGenerator(Protocol):
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        temperatures: Sequence[float],
        seeds: Sequence[int],
        max_new_tokens: int,
    ) -> list[list[int]]:
        """The answer token ids of each prompt (ending with an EOS id when it stopped on one)."""
        ...


class EngineGenerator:
    """Answers through `engine.LLM` (which loads its own copy of the target)."""

    def __init__(
        self,
        model: str,
        device: str = "auto",
        max_num_seqs: int = 256,
        seed: int = 0,
        kv_memory_fraction: float = ENGINE_KV_MEMORY_FRACTION,
        **engine_options: Any,  # further EngineConfig fields
    ) -> None:
        from engine.llm import LLM

        self.llm = LLM(
            model=model,
            device=device,
            max_num_seqs=max_num_seqs,
            seed=seed,
            kv_memory_fraction=kv_memory_fraction,
            **engine_options,
        )
        tokenizer: Any = self.llm.tokenizer
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        temperatures: Sequence[float],
        seeds: Sequence[int],
        max_new_tokens: int,
    ) -> list[list[int]]:
        from engine.sampling_params import SamplingParams

        params = [
            SamplingParams(max_tokens=max_new_tokens, temperature=float(t), seed=int(s))
            for t, s in zip(temperatures, seeds, strict=True)
        ]
        outputs = self.llm.generate([list(p) for p in prompts], params)
        answers = []
        for out in outputs:
            ids = list(out.token_ids)
            if out.finish_reason == "stop" and self.eos_token_ids and (not ids or ids[-1] not in self.eos_token_ids):
                ids.append(self.eos_token_ids[0])  # stopped on EOS without reporting it: keep it in the data
            answers.append(ids)
        return answers


class DenseGenerator:
    """Batched temperature sampling over the target module (rows of similar prompt length
    together); randomness from one seeded generator per batch."""

    def __init__(
        self,
        model: nn.Module,
        config: ModelConfig,
        eos_token_ids: Sequence[int],
        device: torch.device,
        max_rows: int = 256,
    ) -> None:
        self.model = model
        self.config = config
        self.eos = torch.tensor(sorted(set(eos_token_ids)) or [-1], device=device)
        self.device = device
        self.max_rows = max_rows
        self.dtype = next(model.parameters()).dtype

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        temperatures: Sequence[float],
        seeds: Sequence[int],
        max_new_tokens: int,
    ) -> list[list[int]]:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        answers: list[list[int]] = [[] for _ in prompts]
        for start in range(0, len(order), self.max_rows):
            rows = order[start : start + self.max_rows]
            batch = self._generate_rows(
                [prompts[i] for i in rows], [temperatures[i] for i in rows], seeds[rows[0]], max_new_tokens
            )
            for i, answer in zip(rows, batch, strict=True):
                answers[i] = answer
        return answers

    @torch.no_grad()
    def _generate_rows(
        self, prompts: list[Sequence[int]], temperatures: list[float], seed: int, max_new_tokens: int
    ) -> list[list[int]]:
        device, cfg = self.device, self.config
        rows = len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        prompt_len = int(max(len(p) for p in prompts))
        max_len = prompt_len + max_new_tokens
        tokens = torch.zeros(rows, prompt_len, dtype=torch.int64)
        for r, p in enumerate(prompts):
            tokens[r, : len(p)] = torch.tensor(list(p), dtype=torch.int64)
        tokens = tokens.to(device)
        cache = StaticCache(cfg.num_layers, rows, max_len, cfg.num_kv_heads, cfg.head_dim, self.dtype, device)
        backend = StaticCacheAttention()
        temps = torch.tensor(temperatures, dtype=torch.float32, device=device)
        gen = torch.Generator(device=device).manual_seed(int(seed) % (2**63))

        last = torch.empty(rows, cfg.hidden_size, dtype=self.dtype, device=device)  # [B, H] at each prompt's end
        for r0 in range(0, rows, PREFILL_ROWS):  # prefill in row groups: bounded activation memory
            r1 = min(rows, r0 + PREFILL_ROWS)
            positions = torch.arange(prompt_len, device=device).expand(r1 - r0, prompt_len)
            backend.set_positions(positions, max_len)
            ctx = ForwardContext(
                meta=dense_metadata(r1 - r0, prompt_len, device), kv=cache.rows(r0, r1), backend=backend
            )
            hidden = self.model(tokens[r0:r1].reshape(-1), positions.reshape(-1), ctx).view(r1 - r0, prompt_len, -1)
            last[r0:r1] = hidden[torch.arange(r1 - r0, device=device), lengths[r0:r1] - 1]
        next_ids = self._sample(self.model.compute_logits(last), temps, gen)  # type: ignore[operator]
        position = lengths.clone()  # where next_ids goes
        out = torch.full((rows, max_new_tokens), -1, dtype=torch.int64, device=device)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        for step in range(max_new_tokens):
            out[:, step] = torch.where(finished, -1, next_ids)
            finished |= torch.isin(next_ids, self.eos)
            if step == max_new_tokens - 1 or (
                step % FINISHED_CHECK_EVERY == FINISHED_CHECK_EVERY - 1 and bool(finished.all())
            ):
                break
            backend.set_positions(position[:, None], max_len)
            ctx = ForwardContext(meta=dense_metadata(rows, 1, device), kv=cache, backend=backend)
            hidden = self.model(next_ids, position, ctx)
            next_ids = self._sample(self.model.compute_logits(hidden), temps, gen)  # type: ignore[operator]
            position += 1
        host = out.cpu().numpy()
        return [[int(t) for t in row[row >= 0]] for row in host]

    @staticmethod
    def _sample(logits: torch.Tensor, temps: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """[B, V] -> [B]: argmax where temps == 0, else a Gumbel-max draw from softmax(logits / T)."""
        logits = logits.float()
        greedy = logits.argmax(dim=-1)
        u = torch.rand(logits.shape, generator=gen, device=logits.device).clamp_(1e-20, 1.0 - 1e-7)
        safe_t = torch.where(temps > 0, temps, torch.ones_like(temps))[:, None]
        sampled = (logits / safe_t - torch.log(-torch.log(u))).argmax(dim=-1)
        return torch.where(temps > 0, sampled, greedy)


@dataclass(frozen=True)
class GenerationPlan:
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)  # answers per prompt at each
    samples_per_temperature: int = 1  # answers per prompt at each temperature > 0 (greedy: one)
    max_new_tokens: int = 256
    max_prompt_tokens: int = 1024  # longer prompts are skipped
    heldout_permille: int = 30
    chunk_size: int = 512  # jobs (prompt x temperature) per shard
    seed: int = 0

    def __post_init__(self) -> None:
        if self.samples_per_temperature < 1:
            raise ValueError(f"samples_per_temperature must be >= 1, got {self.samples_per_temperature}")


@dataclass(frozen=True)
class GenerationReport:
    shards_written: int
    shards_reused: int
    shards_total: int
    sequences: int  # generated by this call
    tokens: int  # generated answer tokens by this call
    seconds: float
    stopped_by_deadline: bool


def job_seed(seed: int, prompt_index: int, temperature: float, sample: int = 0) -> int:
    tag = f"{seed}:{prompt_index}:{temperature}" + (f":{sample}" if sample else "")
    digest = hashlib.sha1(tag.encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class Job:
    prompt_index: int
    prompt_ids: list[int]
    temperature: float
    heldout: bool
    sample: int = 0  # which of the prompt's answers at this temperature


def plan_jobs(prompts: Sequence[ChatPrompt], tokenizer: ChatTokenizer, plan: GenerationPlan) -> list[list[Job]]:
    """Render every prompt with the chat template; one job per (prompt, temperature, sample)
    (greedy answers once), in chunks of plan.chunk_size (chunk c becomes shard gen-c).
    Prompts longer than plan.max_prompt_tokens are skipped."""
    jobs: list[Job] = []
    for index, prompt in enumerate(prompts):
        text = tokenizer.apply_chat_template(prompt.messages(), add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > plan.max_prompt_tokens:
            continue
        heldout = prompt.is_heldout(plan.heldout_permille)
        for temp in plan.temperatures:
            samples = plan.samples_per_temperature if temp > 0 else 1
            jobs.extend(Job(index, ids, float(temp), heldout, sample) for sample in range(samples))
    return [jobs[i : i + plan.chunk_size] for i in range(0, len(jobs), plan.chunk_size)]


def shard_name(chunk_index: int) -> str:
    return f"{GEN_SHARD_PREFIX}{chunk_index:05d}"


def missing_chunks(store: ShardStore, chunks: Sequence[Sequence[Job]]) -> int:
    return sum(not store.has(shard_name(c)) for c in range(len(chunks)))


def generate_dataset(
    store: ShardStore,
    chunks: Sequence[Sequence[Job]],
    generator: AnswerGenerator,
    plan: GenerationPlan,
    deadline: float | None = None,
    progress: bool = True,
) -> GenerationReport:
    """Answer the jobs of every chunk whose shard is missing. `deadline` (time.monotonic
    seconds) stops before a chunk that would likely end past it."""
    store.check_meta({"kind": "generated", "jobs": sum(len(c) for c in chunks), **asdict(plan)})
    start = time.monotonic()
    written = reused = sequences = tokens = 0
    chunk_seconds = 0.0
    stopped = False
    bar = tqdm(total=len(chunks), desc="generating", unit="shard", disable=not progress)
    for c, chunk in enumerate(chunks):
        name = shard_name(c)
        if store.has(name):
            reused += 1
            bar.update(1)
            continue
        if deadline is not None and time.monotonic() + chunk_seconds > deadline:
            stopped = True
            break
        t0 = time.monotonic()
        answers = generator.generate(
            [j.prompt_ids for j in chunk],
            [j.temperature for j in chunk],
            [job_seed(plan.seed, j.prompt_index, j.temperature, j.sample) for j in chunk],
            plan.max_new_tokens,
        )
        seqs = [np.asarray(j.prompt_ids + a, dtype=np.int32) for j, a in zip(chunk, answers, strict=True)]
        store.write(
            name,
            SequenceSet.from_lists(
                seqs,
                [len(j.prompt_ids) for j in chunk],
                [j.temperature for j in chunk],
                [j.heldout for j in chunk],
            ),
        )
        chunk_seconds = time.monotonic() - t0
        written += 1
        sequences += len(chunk)
        tokens += sum(len(a) for a in answers)
        bar.update(1)
        bar.set_postfix(tok_s=f"{tokens / max(time.monotonic() - start, 1e-9):.0f}")
    bar.close()
    report = GenerationReport(written, reused, len(chunks), sequences, tokens, time.monotonic() - start, stopped)
    log.info("generation: %s", report)
    return report
