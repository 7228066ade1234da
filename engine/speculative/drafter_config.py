"""The shape of a DSpark drafter and the target it was trained for (docs/design.md §3).

A drafter is bound to one target: it reads the target's residual streams after
`capture_layers` (`[N, K*H]`) and shares the target's embedding and LM head, so its hidden
size and vocabulary are the target's. The target identity fields are checked when a
drafter checkpoint is loaded (engine.speculative.checkpoint).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.config import AttentionHeads, ModelConfig, RopeScaling, check_positive

DEFAULT_GAMMA = 7
DEFAULT_MARKOV_RANK = 64
MAX_DRAFTER_LAYERS = 3


def default_capture_layers(num_layers: int, k: int) -> tuple[int, ...]:
    """K target layer ids, spread evenly over the depth, whose residual stream (the output
    of that layer) the drafter reads.

    One layer: the middle one. Several: evenly over `[1, num_layers - 3]`, so the drafter
    sees a low, mid-depth and late-but-not-final view; the last two layers specialise in
    the target's own next-token output, which the drafter gets through the shared LM head
    anyway. Shallow targets widen the range to `[0, num_layers - 1]`.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if not 1 <= k <= num_layers:
        raise ValueError(f"can capture 1..{num_layers} layers of a {num_layers}-layer target, got k={k}")
    if k == 1:
        return (num_layers // 2,)
    lo, hi = 1, num_layers - 3
    if hi - lo + 1 < k:
        lo, hi = 0, num_layers - 1
    return tuple(lo + round(i * (hi - lo) / (k - 1)) for i in range(k))


def default_mask_token_id(target: ModelConfig) -> int:
    """The id fed at the block's mask positions: the target's pad token, else its first EOS,
    else BOS, else 0.

    Inside a draft block only row 0 carries a real token (the anchor); rows 1..gamma-1 are
    always the mask, so the id need not be unused by the target. It must only have a fixed,
    trained (non-zero) embedding row: a zero row would make every mask row's first-layer
    query zero and so identical. Special tokens qualify and are what the reference
    drafters use. The id is embedded, never sampled, and is part of the trained checkpoint.
    """
    if target.pad_token_id is not None:
        return target.pad_token_id
    if target.eos_token_ids:
        return target.eos_token_ids[0]
    if target.bos_token_id is not None:
        return target.bos_token_id
    return 0


@dataclass(frozen=True)
class DrafterConfig(AttentionHeads):
    # Target identity: a drafter is only valid for the target it was trained on.
    target_name: str
    target_vocab_size: int
    target_hidden_size: int
    target_num_layers: int
    mask_token_id: int
    # Target layers whose residual stream (output) is read; () picks
    # default_capture_layers(target_num_layers, min(3, target_num_layers)).
    capture_layers: tuple[int, ...] = ()
    gamma: int = DEFAULT_GAMMA  # draft tokens per block; the verify window is gamma + 1
    num_layers: int = 1
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 1536
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rope_dim: int | None = None  # partial rotary; None = head_dim
    max_position: int = 8192
    markov_rank: int = DEFAULT_MARKOV_RANK  # r of the low-rank bigram bias w2(w1[prev])
    confidence_head: bool = True

    def __post_init__(self) -> None:
        if not self.capture_layers:
            k = min(3, self.target_num_layers)
            object.__setattr__(self, "capture_layers", default_capture_layers(self.target_num_layers, k))
        object.__setattr__(self, "capture_layers", tuple(int(i) for i in self.capture_layers))
        check_positive(
            self,
            (
                "target_vocab_size",
                "target_hidden_size",
                "target_num_layers",
                "gamma",
                "num_heads",
                "num_kv_heads",
                "head_dim",
                "intermediate_size",
                "max_position",
                "markov_rank",
            ),
        )
        if not 1 <= self.num_layers <= MAX_DRAFTER_LAYERS:
            raise ValueError(f"DrafterConfig.num_layers must be in [1, {MAX_DRAFTER_LAYERS}], got {self.num_layers}")
        self.check_head_groups()
        if not 0 <= self.mask_token_id < self.target_vocab_size:
            raise ValueError(
                f"DrafterConfig.mask_token_id must be in [0, {self.target_vocab_size}), got {self.mask_token_id}"
            )
        if list(self.capture_layers) != sorted(set(self.capture_layers)) or not all(
            0 <= i < self.target_num_layers for i in self.capture_layers
        ):
            raise ValueError(
                f"DrafterConfig.capture_layers must be distinct increasing ids in "
                f"[0, {self.target_num_layers}), got {self.capture_layers}"
            )
        if self.rope_dim is not None and (self.rope_dim <= 0 or self.rope_dim > self.head_dim or self.rope_dim % 2):
            raise ValueError(
                f"DrafterConfig.rope_dim must be even and in (0, head_dim={self.head_dim}], got {self.rope_dim}"
            )
        if self.head_dim % 2:
            raise ValueError(f"DrafterConfig.head_dim must be even, got {self.head_dim}")

    @property
    def hidden_size(self) -> int:
        """The drafter's hidden size: the target's (embedding and LM head are shared)."""
        return self.target_hidden_size

    @property
    def vocab_size(self) -> int:
        return self.target_vocab_size

    @property
    def num_capture_layers(self) -> int:
        return len(self.capture_layers)

    @property
    def window(self) -> int:
        """W: tokens per request in the target's verify forward (anchor + gamma drafts)."""
        return self.gamma + 1

    @classmethod
    def for_target(cls, target: ModelConfig, target_name: str, **overrides: Any) -> DrafterConfig:
        """A drafter shaped like one layer of `target` (attention heads, head size, MLP width,
        RoPE) unless overridden; mask token from default_mask_token_id."""
        fields: dict[str, Any] = dict(
            target_name=target_name,
            target_vocab_size=target.vocab_size,
            target_hidden_size=target.hidden_size,
            target_num_layers=target.num_layers,
            mask_token_id=default_mask_token_id(target),
            num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim,
            intermediate_size=target.intermediate_size,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            rope_scaling=target.rope_scaling,
            rope_dim=target.rope_dim,
            max_position=target.max_position,
        )
        fields.update(overrides)
        return cls(**fields)

    def replace(self, **changes: Any) -> DrafterConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["capture_layers"] = list(self.capture_layers)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DrafterConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown DrafterConfig fields: {unknown}")
        fields = dict(data)
        if fields.get("rope_scaling") is not None:
            fields["rope_scaling"] = RopeScaling(**fields["rope_scaling"])
        if "capture_layers" in fields:
            fields["capture_layers"] = tuple(fields["capture_layers"])
        return cls(**fields)
