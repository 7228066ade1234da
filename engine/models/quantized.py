"""Layers that serve a GGUF's block-quantized tensors as the file stores them (CPU, fp32
activations; docs/design.md §2.9), and the swap that puts them in a Llama-family model before
its weights load.

`QuantizedLinear` holds the raw blocks of one checkpoint tensor, or of several stacked by rows
(q/k/v, gate/up: the fused projections of engine/models/llama.py), as one flat uint8 parameter
and multiplies with quant_gemm's kernels, one call per run of parts in the same format, each
writing its own columns of the output. `QuantizedEmbedding` dequantises the looked-up rows; a
tied LM head is a `QuantizedLinear` over the same bytes. Resident weights are the file's bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from engine.distributed.layers import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    SwiGLUParallelLinear,
    VocabParallelEmbedding,
)
from engine.distributed.parallel import tp_size
from engine.kernels import silu_and_mul
from engine.kernels.cpu.quant_gemm import FORMATS, BlockTensor, embedding_q, linear_q
from engine.kernels.linear import RowNorm, apply_row_norm
from engine.models.llama import FUSED_PROJECTIONS


@dataclass(frozen=True)
class QuantPart:
    """One checkpoint tensor inside a (fused) quantized weight."""

    shard_id: object  # as the model's load_weights names the part: "q"/"k"/"v", 0/1, or None
    fmt: str  # a key of quant_gemm.FORMATS
    rows: int  # output features
    row_offset: int  # its first output feature
    byte_offset: int  # its first byte in the flat weight


class QuantizedLinear(nn.Module):
    """y [..., N] = x [..., K] fp32 @ dequant(W)^T (+ bias), W the parts' blocks stacked by rows;
    with `swiglu`, silu(gate) * up of the [gate | up] result instead ([..., N / 2])."""

    tp_size = 1  # whole tensors: what the dense layers call one tensor-parallel rank

    def __init__(
        self,
        input_size: int,
        parts: Sequence[tuple[object, str, int]],  # (shard_id, format, rows), in output order
        bias: bool = False,
        swiglu: bool = False,
        shared_weight: nn.Parameter | None = None,  # a tied head: the embedding's blocks
    ):
        super().__init__()
        self.input_size = input_size
        self.swiglu = swiglu
        placed: list[QuantPart] = []
        rows = size = 0
        for shard_id, fmt, count in parts:
            placed.append(QuantPart(shard_id, fmt, count, rows, size))
            rows += count
            size += count * FORMATS[fmt].row_bytes(input_size)
        self.parts = tuple(placed)
        self.output_size = rows
        if shared_weight is not None and shared_weight.numel() != size:
            raise ValueError(f"a shared quantized weight of {shared_weight.numel()} bytes for {size} expected")
        empty = torch.empty(size, dtype=torch.uint8, device="cpu")
        self.weight = shared_weight if shared_weight is not None else nn.Parameter(empty, requires_grad=False)
        self.bias = nn.Parameter(torch.empty(rows, device="cpu"), requires_grad=False) if bias else None
        # Runs of consecutive parts in one format: (format, first row, rows, first byte), one call each.
        runs: list[tuple[str, int, int, int]] = []
        for part in self.parts:
            if runs and runs[-1][0] == part.fmt:
                fmt, first, count, offset = runs[-1]
                runs[-1] = (fmt, first, count + part.rows, offset)
            else:
                runs.append((part.fmt, part.row_offset, part.rows, part.byte_offset))
        self.runs = tuple(runs)

    def _blocks(self, fmt: str, rows: int, byte_offset: int) -> torch.Tensor:
        """[rows, row_bytes] uint8 view of the flat weight (of whichever parameter it holds now)."""
        row_bytes = FORMATS[fmt].row_bytes(self.input_size)
        return self.weight.detach().narrow(0, byte_offset, rows * row_bytes).view(rows, row_bytes)

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor | BlockTensor, shard_id: object = None) -> None:
        part = next((p for p in self.parts if p.shard_id == shard_id), None)
        if part is None:
            raise ValueError(f"{type(self).__name__}: no part {shard_id!r}")
        if param is self.bias:
            if not isinstance(full, torch.Tensor) or tuple(full.shape) != (part.rows,):
                raise ValueError(f"{type(self).__name__}[{shard_id}]: bias of shape {getattr(full, 'shape', None)}")
            param.data.narrow(0, part.row_offset, part.rows).copy_(full)
            return
        blocks = self._blocks(part.fmt, part.rows, part.byte_offset)
        if not isinstance(full, BlockTensor) or full.fmt != part.fmt or full.data.shape != blocks.shape:
            raise ValueError(
                f"{type(self).__name__}[{shard_id}]: expected {part.fmt} blocks {tuple(blocks.shape)}, got {full!r}"
            )
        blocks.copy_(full.data)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.runs) == 1:
            fmt, _, rows, offset = self.runs[0]
            y = linear_q(x, self._blocks(fmt, rows, offset), fmt, self.bias)
        else:
            rows_in = x.reshape(-1, self.input_size)
            y = torch.empty((rows_in.shape[0], self.output_size), dtype=torch.float32)
            for fmt, first, rows, offset in self.runs:
                bias = None if self.bias is None else self.bias.narrow(0, first, rows)
                linear_q(rows_in, self._blocks(fmt, rows, offset), fmt, bias, out=y.narrow(1, first, rows))
            y = y.view(*x.shape[:-1], self.output_size)
        return silu_and_mul(y) if self.swiglu else y

    def normed(self, x: torch.Tensor, norm: RowNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """As ColumnParallelLinear.normed: the norm, then this projection."""
        normed, stream = apply_row_norm(x, norm)
        return self(normed), stream

    def block_format(self) -> str | None:
        """The one format of a weight whose parts all share it (its blocks then start at byte 0
        and kernels take the flat weight as one [N, row_bytes] matrix); None for mixed ones."""
        return self.runs[0][0] if len(self.runs) == 1 else None

    def extra_repr(self) -> str:
        formats = "+".join(sorted({p.fmt for p in self.parts}))
        return f"in={self.input_size}, out={self.output_size}, {formats}, bias={self.bias is not None}"


class QuantizedQKVLinear(QuantizedLinear):
    """The fused q/k/v projection (one rank): what LlamaAttention reads of QKVParallelLinear."""

    def __init__(self, dense: QKVParallelLinear, formats: Sequence[str]):
        sizes = (dense.q_size, dense.kv_size, dense.kv_size)
        parts = [(name, fmt, rows) for name, fmt, rows in zip("qkv", formats, sizes, strict=True)]
        super().__init__(dense.input_size, parts, bias=dense.bias is not None)
        self.q_size, self.kv_size = dense.q_size, dense.kv_size
        self.num_heads, self.num_kv_heads = dense.num_heads, dense.num_kv_heads


class QuantizedEmbedding(nn.Module):
    """Embedding lookup in a quantized [V, H] table: each looked-up row dequantised, [T] -> [T, H] fp32."""

    def __init__(self, num_embeddings: int, embedding_dim: int, fmt: str):
        super().__init__()
        self.fmt = fmt
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        row_bytes = FORMATS[fmt].row_bytes(embedding_dim)
        self.weight = nn.Parameter(torch.empty(num_embeddings * row_bytes, dtype=torch.uint8), requires_grad=False)

    def table(self) -> torch.Tensor:
        return self.weight.detach().view(self.num_embeddings, -1)  # [V, row_bytes]

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor | BlockTensor, shard_id: object = None) -> None:
        if not isinstance(full, BlockTensor) or full.fmt != self.fmt or full.data.shape != self.table().shape:
            raise ValueError(
                f"QuantizedEmbedding: expected {self.fmt} blocks {tuple(self.table().shape)}, got {full!r}"
            )
        self.table().copy_(full.data)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return embedding_q(input_ids, self.table(), self.fmt)


def _parts_of(name: str, module: nn.Module) -> list[tuple[str, object]] | None:
    """(checkpoint weight name, shard id) of each part of a linear or embedding module called
    `name` (checkpoint naming, engine/models/llama.py); None for other modules."""
    if isinstance(module, VocabParallelEmbedding | RowParallelLinear):
        return [(f"{name}.weight", None)]
    if not isinstance(module, ColumnParallelLinear):
        return None
    prefix, _, own = name.rpartition(".")
    fused = [(part, shard) for part, (target, shard) in FUSED_PROJECTIONS.items() if target == own]
    if not fused:
        return [(f"{name}.weight", None)]
    return [(f"{prefix}.{part}.weight", shard) for part, shard in fused]


def quantize_modules(model: nn.Module, formats: Mapping[str, str], tied_head: bool) -> frozenset[str]:
    """Swap, before its weights load, each linear and embedding module of `model` whose every
    checkpoint part `formats` names (checkpoint weight name -> block format with a kernel) for
    its quantized layer. The others stay dense (their tensors load dequantised). A tied head
    shares a quantized embedding's bytes. Returns the checkpoint names to load as blocks."""
    if tp_size() != 1:
        return frozenset()  # the quantized layers hold whole tensors: one rank only
    kept: set[str] = set()
    swaps: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        parts = _parts_of(name, module)
        if parts is None or (name == "lm_head" and tied_head) or not all(part in formats for part, _ in parts):
            continue
        part_formats = [formats[part] for part, _ in parts]
        if isinstance(module, VocabParallelEmbedding) and name != "lm_head":
            swaps[name] = QuantizedEmbedding(module.num_embeddings, module.embedding_dim, part_formats[0])
        elif isinstance(module, VocabParallelEmbedding):  # an untied head
            swaps[name] = QuantizedLinear(module.embedding_dim, [(None, part_formats[0], module.num_embeddings)])
        elif isinstance(module, QKVParallelLinear):
            swaps[name] = QuantizedQKVLinear(module, part_formats)
        else:
            assert isinstance(module, ColumnParallelLinear | RowParallelLinear)
            sizes = module.output_sizes if isinstance(module, SwiGLUParallelLinear) else (module.output_size,)
            specs = [(shard, fmt, rows) for (_, shard), fmt, rows in zip(parts, part_formats, sizes, strict=True)]
            bias = module.bias is not None
            swaps[name] = QuantizedLinear(module.input_size, specs, bias, isinstance(module, SwiGLUParallelLinear))
        kept.update(part for part, _ in parts)
    for name, replacement in swaps.items():
        model.set_submodule(name, replacement)
    embedding = swaps.get("model.embed_tokens")
    if tied_head and isinstance(embedding, QuantizedEmbedding):
        rows = [(None, embedding.fmt, embedding.num_embeddings)]
        head = QuantizedLinear(embedding.embedding_dim, rows, shared_weight=embedding.weight)
        model.set_submodule("lm_head", head)
    return frozenset(kept)
