"""Wires DSpark into an engine: finds the drafter (the one given, or the one shipped with the
model, engine.loader.resolve.shipped_drafter), checks that it fits the target, loads it, binds
it to the target, and sizes its KV (the draft pool shares the target's slot ids, docs/design.md §2)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import ModelConfig, SpeculativeConfig
from engine.kv.pool import KVPool
from engine.loader.resolve import shipped_drafter
from engine.models.context import CausalLM
from engine.speculative.checkpoint import DrafterMismatchError, check_target, load_drafter, read_drafter_config
from engine.speculative.drafter import DSparkDrafter
from engine.speculative.drafter_config import DrafterConfig


@dataclass
class SpecSetup:
    drafter: DSparkDrafter
    config: DrafterConfig
    max_batch_size: int | None = None  # SpeculativeConfig.max_batch_size

    def drafts_at(self, batch: int) -> bool:
        """Whether a decode step of `batch` requests drafts (else one token per request)."""
        return self.max_batch_size is None or batch <= self.max_batch_size

    @property
    def gamma(self) -> int:
        return self.config.gamma

    @property
    def window(self) -> int:
        return self.config.window

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return self.config.capture_layers

    def kv_bytes_per_slot(self, dtype: torch.dtype) -> int:
        return KVPool.bytes_per_slot(self.config.num_layers, self.config.num_kv_heads, self.config.head_dim, dtype)

    def new_pool(self, num_slots: int, dtype: torch.dtype, device: torch.device) -> KVPool:
        return KVPool(self.config.num_layers, num_slots, self.config.num_kv_heads, self.config.head_dim, dtype, device)


def drafter_directory(spec: SpeculativeConfig, model_name: str) -> Path:
    """The drafter `spec` names, else the one shipped with `model_name`; ValueError if neither."""
    directory = Path(spec.drafter) if spec.drafter else shipped_drafter(model_name)
    if directory is None:
        raise ValueError(
            f"speculative: no drafter ships with {model_name!r}; pass the path of one "
            f"(train it with `dspark-serve train-drafter`)"
        )
    return directory


def check_drafter_fits(directory: Path, model_name: str, target_config: ModelConfig) -> None:
    """Raise DrafterMismatchError, naming the drafter and the model, unless the checkpoint in
    `directory` was made for a target shaped like `target_config` (reads drafter.json only)."""
    config, _ = read_drafter_config(directory)
    try:
        check_target(config, target_config)
    except DrafterMismatchError as exc:
        raise DrafterMismatchError(f"drafter {directory} does not fit the model {model_name!r}: {exc}") from None


def build_spec(
    spec: SpeculativeConfig,
    model_name: str,
    target: CausalLM,
    target_config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
) -> SpecSetup:
    directory = drafter_directory(spec, model_name)
    check_drafter_fits(directory, model_name, target_config)
    drafter, config = load_drafter(directory, target_config, device, dtype)
    if spec.gamma is not None and spec.gamma != config.gamma:
        config = dataclasses.replace(config, gamma=spec.gamma)
        drafter.config = config
    drafter.bind_target(target.embed, target.compute_logits)
    return SpecSetup(drafter=drafter, config=config, max_batch_size=spec.max_batch_size)
