"""Attention backends: what a model calls to store a forward's new K/V and attend.

- backend.py: the AttentionBackend protocol the models call;
- torch_backend.py: TorchAttentionBackend (the C kernel of engine.kernels.cpu.attention for
  short CPU forwards, else the torch reference of engine.kernels.attention);
- triton_backend.py: TritonAttentionBackend (the kernels of engine.kernels.triton).

The kernels themselves, and the AttentionMetadata they read, live in engine.kernels.
`select_backend("auto", device)` gives the Triton backend on CUDA/ROCm devices and the torch
backend on CPU. Triton is imported only when the Triton backend is chosen, so CPU installs
need no triton.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.torch_backend import TorchAttentionBackend

if TYPE_CHECKING:
    from engine.attention.triton_backend import TritonAttentionBackend

__all__ = ["AttentionBackend", "TorchAttentionBackend", "select_backend"]

logger = logging.getLogger(__name__)


def select_backend(name: str, device: torch.device | str) -> TorchAttentionBackend | TritonAttentionBackend:
    """The attention backend called `name` ("auto", "torch" or "triton") for `device`; both
    satisfy AttentionBackend (and take an optional `out=`).

    "auto" is Triton on a GPU (falling back to torch, with a warning, when triton is not
    installed) and torch on CPU. "triton" on CPU works only under TRITON_INTERPRET=1.
    """
    device = torch.device(device)
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"unknown attention backend {name!r}; expected 'auto', 'torch' or 'triton'")
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttentionBackend()
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"the triton attention backend needs a CUDA/ROCm device (got {device}); "
            "on CPU use 'torch', or set TRITON_INTERPRET=1 to run the kernels interpreted"
        )
    try:
        from engine.attention.triton_backend import TritonAttentionBackend
    except ImportError as exc:
        if name == "triton":
            raise ValueError(f"the triton attention backend needs triton installed: {exc}") from exc
        logger.warning("triton is not installed (%s); attention falls back to the torch backend", exc)
        return TorchAttentionBackend()
    return TritonAttentionBackend()
