"""How a drafter checkpoint stores its tensors: plain (each tensor in its own dtype) or
int8 with one float32 scale per group of GROUP_SIZE consecutive elements of the last dim.

int8 halves a bf16 checkpoint, which is what lets a 3-layer SmolLM2 drafter (15.4M
parameters, 30 MB in bf16) ship under the repository's 25 MB limit. Symmetric per-group
rounding keeps each weight within half a step (amax / 254) of its value, about the error
bf16's 8-bit mantissa makes on a group's largest elements; the engine serves the decoded
tensors in its own dtype, so nothing downstream knows the file was int8.

Only matrices are encoded (ndim >= 2, at least MIN_ELEMENTS, last dim a multiple of
GROUP_SIZE); norms, biases and small heads stay as they are. An encoded tensor `name` is
stored as `name` (int8, the original shape) beside `name` + SCALE_SUFFIX (float32,
`[..., last_dim // GROUP_SIZE]`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch

WeightEncoding = Literal["plain", "int8"]
WEIGHT_ENCODINGS: tuple[WeightEncoding, ...] = ("plain", "int8")
GROUP_SIZE = 32  # divides every SmolLM2-drafter last dim: 32 (Markov rank), 576, 1536, 1728, 49152
MIN_ELEMENTS = 1024  # smaller tensors (the confidence head, 608 weights) stay plain
SCALE_SUFFIX = ".int8_scale"
INT8_MAX = 127.0


def encodable(tensor: torch.Tensor) -> bool:
    return (
        tensor.is_floating_point()
        and tensor.dim() >= 2
        and tensor.numel() >= MIN_ELEMENTS
        and tensor.shape[-1] % GROUP_SIZE == 0
    )


def quantize_int8(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values in `tensor`'s shape, float32 scales `[..., last // GROUP_SIZE]`)."""
    groups = tensor.detach().float().reshape(*tensor.shape[:-1], -1, GROUP_SIZE)  # [..., G, 32]
    amax = groups.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))  # an all-zero group decodes to 0
    values = torch.round(groups / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return values.reshape(tensor.shape), scale.squeeze(-1)


def dequantize_int8(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    groups = values.float().reshape(*values.shape[:-1], -1, GROUP_SIZE)
    return (groups * scale.unsqueeze(-1)).reshape(values.shape).to(dtype)


def encode_state(state: Mapping[str, torch.Tensor], encoding: WeightEncoding) -> dict[str, torch.Tensor]:
    """The tensors to write for `state` under `encoding` (CPU, contiguous)."""
    if encoding not in WEIGHT_ENCODINGS:
        raise ValueError(f"weight encoding must be one of {WEIGHT_ENCODINGS}, got {encoding!r}")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
        if encoding == "int8" and encodable(tensor):
            out[name], out[name + SCALE_SUFFIX] = quantize_int8(tensor)
        else:
            out[name] = tensor.contiguous()
    return out


def decode_state(stored: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The inverse of `encode_state`: int8 tensors with a scale become `dtype` again; the
    others are returned as stored (the loader casts them)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in stored.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        scale = stored.get(name + SCALE_SUFFIX)
        if scale is not None:
            if tensor.dtype != torch.int8:
                raise ValueError(f"{name} has a scale but is stored as {tensor.dtype}, not int8")
            out[name] = dequantize_int8(tensor, scale, dtype)
        else:
            out[name] = tensor
    orphans = [n for n in stored if n.endswith(SCALE_SUFFIX) and n.removesuffix(SCALE_SUFFIX) not in stored]
    if orphans:
        raise ValueError(f"scales without their tensor: {orphans[:4]}")
    return out


def round_trip(
    state: Mapping[str, torch.Tensor], encoding: WeightEncoding, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """`state` as a checkpoint written with `encoding` gives it back (what the engine serves)."""
    return decode_state(encode_state(state, encoding), dtype)
