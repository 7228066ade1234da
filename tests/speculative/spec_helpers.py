"""Shared pieces of the engine.speculative tests: a tiny drafter, a fake target, a paged draft pool
and the block metadata, plus SyncGuard when the engine has one."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import ModelConfig
from engine.kv.pool import KVPool
from engine.models.context import ForwardContext
from engine.runner.batch_inputs import uniform_window
from engine.speculative.drafter import DSparkDrafter
from engine.speculative.drafter_config import DrafterConfig


@contextlib.contextmanager
def sync_guard(device: torch.device | str = "cpu") -> Iterator[None]:
    """engine.sync_guard.SyncGuard when it exists (it fails on host syncs), else nothing."""
    if importlib.util.find_spec("engine.sync_guard") is None:
        yield
        return
    from engine.sync_guard import SyncGuard

    with SyncGuard(torch.device(device)):
        yield


def tiny_target(**overrides: object) -> ModelConfig:
    """A small Llama target config whose shapes the tiny drafters fit."""
    fields: dict[str, object] = dict(
        architecture="llama",
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_layers=6,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
    )
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def tiny_config(**overrides: object) -> DrafterConfig:
    fields: dict[str, object] = dict(
        target_name="tiny-target",
        target_vocab_size=48,
        target_hidden_size=32,
        target_num_layers=6,
        mask_token_id=1,
        gamma=4,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        markov_rank=8,
        max_position=64,
        rope_theta=1000.0,
    )
    fields.update(overrides)
    return DrafterConfig(**fields)  # type: ignore[arg-type]


class FakeTarget:
    """A target's shared modules: a random embedding tied to the LM head."""

    def __init__(self, vocab_size: int, hidden_size: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.embedding = torch.randn(vocab_size, hidden_size, generator=gen)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding[ids]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return (hidden @ self.embedding.T).float()


def make_drafter(config: DrafterConfig, seed: int = 0) -> tuple[DSparkDrafter, FakeTarget]:
    """A drafter with every weight random (norm weights near 1, a non-zero Markov head)."""
    torch.manual_seed(seed)
    drafter = DSparkDrafter(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(noise * param.shape[-1] ** -0.5)
    target = FakeTarget(config.vocab_size, config.hidden_size, seed + 1)
    drafter.bind_target(target.embed, target.compute_logits)
    return drafter, target


@dataclass
class Scenario:
    """B requests with committed context, their rows in a shuffled (paged) slot table, and the
    captured target hidden of every context token."""

    pool: KVPool
    req_to_token: torch.Tensor  # [max_reqs, max_ctx] int32
    rows: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64
    aux: list[torch.Tensor]  # per request [seq_len, K*H]

    @property
    def batch(self) -> int:
        return int(self.rows.shape[0])

    def context_slots(self, b: int) -> torch.Tensor:
        return self.req_to_token[self.rows[b], : int(self.seq_lens[b])].long()

    def flat_context(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(aux [N, K*H], positions [N], slots [N]) of every context token."""
        aux = torch.cat(self.aux)
        positions = torch.cat([torch.arange(int(n)) for n in self.seq_lens])
        slots = torch.cat([self.context_slots(b) for b in range(self.batch)])
        return aux, positions, slots

    def block_context(self, gamma: int, causal: bool = False) -> tuple[ForwardContext, torch.Tensor]:
        """ForwardContext of the draft block (gamma rows per request from seq_len) and its
        positions [B, gamma]."""
        inputs = uniform_window(
            self.req_to_token,
            self.rows,
            self.seq_lens,
            gamma,
            int(self.seq_lens.max()) + gamma,
            causal=causal,
        )
        ctx = ForwardContext(meta=inputs.meta, kv=self.pool, backend=TorchAttentionBackend())
        return ctx, inputs.positions.view(self.batch, gamma)


def make_scenario(
    config: DrafterConfig,
    seq_lens: list[int],
    max_ctx: int = 32,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Scenario:
    gen = torch.Generator().manual_seed(seed)
    max_reqs = len(seq_lens) + 1
    num_slots = max_reqs * max_ctx
    req_to_token = torch.randperm(num_slots, generator=gen).view(max_reqs, max_ctx).to(torch.int32)
    pool = KVPool(config.num_layers, num_slots, config.num_kv_heads, config.head_dim, dtype, torch.device("cpu"))
    # Poison the pool: anything read that was not written shows up as NaN.
    pool.k.fill_(float("nan"))
    pool.v.fill_(float("nan"))
    width = config.num_capture_layers * config.hidden_size
    aux = [torch.randn(n, width, generator=gen) for n in seq_lens]
    rows = torch.randperm(max_reqs, generator=gen)[: len(seq_lens)]
    return Scenario(pool, req_to_token, rows, torch.tensor(seq_lens, dtype=torch.int64), aux)
