"""Tensor-parallel process-group state.

One process per rank; each calls `init_tensor_parallel` once before building the model. At
TP=1 nothing is initialised and every collective is the identity, so single-device code
pays nothing. Backends: NCCL on CUDA (RCCL answers to the same name on ROCm), gloo on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class _TPState:
    size: int = 1
    rank: int = 0
    group: dist.ProcessGroup | None = None


_state = _TPState()


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_tensor_parallel(
    tp_size: int,
    rank: int,
    backend: str | None = None,
    init_method: str | None = None,
) -> None:
    """Join a TP group of `tp_size` ranks as `rank`.

    If torch.distributed is not initialised yet it is, with `init_method` (default
    `env://`, i.e. MASTER_ADDR/MASTER_PORT) and `backend` (default NCCL on GPU, gloo on CPU);
    the TP group is then the whole world. If it is already initialised (say by a launcher
    running other groups too) the TP group is created over ranks `0 .. tp_size-1`.
    """
    global _state
    if tp_size < 1 or not 0 <= rank < tp_size:
        raise ValueError(f"tensor parallel rank {rank} is not in [0, {tp_size})")
    if tp_size == 1:
        _state = _TPState()
        return
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend or default_backend(),
            init_method=init_method or "env://",
            world_size=tp_size,
            rank=rank,
        )
    if dist.get_world_size() == tp_size:
        group = dist.group.WORLD
    else:
        group = dist.new_group(list(range(tp_size)))
    _state = _TPState(size=tp_size, rank=rank, group=group)


def destroy_tensor_parallel() -> None:
    """Leave the TP group (and tear torch.distributed down if this module set it up)."""
    global _state
    if _state.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
    _state = _TPState()


def tp_rank() -> int:
    return _state.rank


def tp_size() -> int:
    return _state.size


def tp_group() -> dist.ProcessGroup | None:
    return _state.group


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the TP ranks, in place; returns `x`."""
    if _state.size == 1:
        return x
    dist.all_reduce(x, group=_state.group)
    return x


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` (same shape on all ranks) along `dim`, in rank order."""
    if _state.size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(_state.size)]
    dist.all_gather(parts, x, group=_state.group)
    return torch.cat(parts, dim=dim)


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by the tensor parallel size {denominator}")
    return numerator // denominator
