"""The RotaryEmbedding a config asks for: the target's ModelConfig and a DrafterConfig name
their RoPE with the same fields, and each model builds one table for all its layers."""

from __future__ import annotations

from typing import Protocol

from engine.config import RopeScaling
from engine.models.layers import RotaryEmbedding


class RopeFields(Protocol):
    @property
    def head_dim(self) -> int: ...
    @property
    def rope_dim(self) -> int | None: ...  # partial rotary; None = head_dim
    @property
    def max_position(self) -> int: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def rope_scaling(self) -> RopeScaling | None: ...


def rotary_embedding(config: RopeFields) -> RotaryEmbedding:
    """cos/sin for positions [0, config.max_position), rotating the first rope_dim dims of a head."""
    return RotaryEmbedding(
        config.head_dim,
        config.rope_dim or config.head_dim,
        config.max_position,
        config.rope_theta,
        config.rope_scaling,
    )
