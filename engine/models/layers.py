"""Building blocks shared by the decoder families: RMSNorm and rotary embedding (their
arithmetic, torch and fused Triton, lives in engine.kernels; SwiGLU's silu_and_mul too)."""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.config import RopeScaling
from engine.kernels import add_rms_norm, rms_norm
from engine.kernels.linear import RowNorm
from engine.kernels.rope import RotaryAngles


class RMSNorm(nn.Module):
    """y = w * x / rms(x), computed in float32 and returned in the input dtype (the weight is
    applied after the cast back, as Hugging Face's LlamaRMSNorm does)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., dim] -> [..., dim]."""
        return rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual [T, dim] -> (norm(x + residual), x + residual): the residual add that
        precedes the norm in a decoder layer, fused with it on GPU."""
        return add_rms_norm(x, residual, self.weight, self.eps)

    def row_norm(self, residual: torch.Tensor | None) -> RowNorm:
        """This norm for the projection after it to apply to its input (plus `residual`, the
        stream before that input joins it; None at a model's first layer)."""
        return RowNorm(self.weight, self.eps, residual)


def rope_inv_freq(
    rope_dim: int, theta: float, scaling: RopeScaling | None, max_position: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [rope_dim / 2] (float32) and the factor cos/sin are multiplied by.

    Mirrors transformers' `ROPE_INIT_FUNCTIONS` value for value (float32 arithmetic in the
    same order), so logits match Hugging Face's implementation.
    """
    exponent = torch.arange(0, rope_dim, 2, dtype=torch.int64).float() / rope_dim
    inv_freq = 1.0 / (theta**exponent)
    kind = scaling.kind if scaling is not None else "default"
    if scaling is None or kind == "default":
        return inv_freq, 1.0
    factor = scaling.factor
    original = scaling.original_max_position or max_position
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "dynamic":
        # Dynamic NTK (Hugging Face recomputes the base whenever the batch's longest sequence
        # grows past the original context). We compute it once, for the full cache length
        # `max_position`: identical to Hugging Face at that length, a slightly larger base than
        # Hugging Face uses for shorter sequences. A per-step base would need the batch's max
        # position on the host, i.e. a device sync; vLLM makes the same choice.
        seq_len = max(max_position, original)
        base = theta * ((factor * seq_len / original) - (factor - 1)) ** (rope_dim / (rope_dim - 2))
        return 1.0 / (base**exponent), 1.0
    if kind == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        low_freq_wavelen = original / scaling.low_freq_factor
        high_freq_wavelen = original / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(rope_dim, theta, scaling, original)
    raise ValueError(f"unsupported rope scaling kind {kind!r}")


def _yarn_inv_freq(rope_dim: int, theta: float, scaling: RopeScaling, original: int) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023, arXiv:2309.00071): interpolate low frequencies, extrapolate high
    ones with a linear ramp between, and scale attention by `mscale` (folded into cos/sin)."""
    factor = scaling.factor

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    if scaling.mscale and scaling.mscale_all_dim:
        attention_factor = get_mscale(factor, scaling.mscale) / get_mscale(factor, scaling.mscale_all_dim)
    else:
        attention_factor = get_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return (rope_dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(scaling.beta_fast)), 0)
    high: float = min(math.ceil(correction_dim(scaling.beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, rope_dim, 2).float() / rope_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, NeoX / Hugging Face Llama layout (`rotate_half`: the two
    halves of the rotated dims form the pairs), applied to the first `rope_dim` dims of each
    head (partial rotary leaves the rest untouched).

    cos/sin for every position in `[0, max_position)` are precomputed in float32 (scaled by
    the YaRN attention factor where it applies), so a forward is an index_select: no host sync,
    graph-capturable. Positions at or past `max_position` are out of range.
    """

    def __init__(
        self,
        head_dim: int,
        rope_dim: int,
        max_position: int,
        theta: float,
        scaling: RopeScaling | None = None,
    ):
        super().__init__()
        if rope_dim % 2 or not 0 < rope_dim <= head_dim:
            raise ValueError(f"rope_dim must be even and in (0, head_dim={head_dim}], got {rope_dim}")
        self.head_dim = head_dim
        self.rope_dim = rope_dim
        self.max_position = max_position
        inv_freq, attention_factor = rope_inv_freq(rope_dim, theta, scaling, max_position)
        inv_freq = inv_freq.to(torch.get_default_device())
        positions = torch.arange(max_position, dtype=torch.float32, device=inv_freq.device)
        freqs = positions[:, None] * inv_freq[None, :]  # [max_position, rope_dim / 2]
        cos_sin = torch.cat([freqs.cos() * attention_factor, freqs.sin() * attention_factor], dim=-1)
        self.cos_sin_cache: torch.Tensor
        self.register_buffer("cos_sin_cache", cos_sin, persistent=False)  # [max_position, rope_dim] fp32

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64, q [T, Hq, D], k [T, Hkv, D] (strided views are fine) -> new
        rotated (q, k), same dtypes; the inputs are left as they were."""
        return self.at(positions)(q, k)

    def at(self, positions: torch.Tensor) -> RotaryAngles:
        """RoPE at `positions` [T] int64, to apply to every layer of one forward."""
        return RotaryAngles(positions, self.cos_sin_cache)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rope_dim={self.rope_dim}, max_position={self.max_position}"
