"""Tensor-parallel linear and embedding layers (Megatron-style).

Column-parallel layers split their output features across ranks and need no communication;
row-parallel layers split their input features and all-reduce the partial sums. A column
layer followed by a row layer (attention qkv → o, MLP gate/up → down) costs one all-reduce.

Every layer allocates only its own shard (on the default device and dtype, so build the model
under `with torch.device(...)` and the wanted default dtype) and loads it from the full
checkpoint tensor with `weight_loader(param, full_tensor, shard_id=None)`. At TP=1 each layer
is a plain `F.linear` / `F.embedding`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from engine.distributed.parallel import all_gather, all_reduce, divide, tp_rank, tp_size
from engine.kernels.cpu.linear import embedding
from engine.kernels.linear import RowNorm, apply_row_norm, linear, linear_swiglu, norm_linear


def _check_shape(name: str, full: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(full.shape) != expected:
        raise ValueError(f"{name}: checkpoint tensor has shape {tuple(full.shape)}, expected {expected}")


def default_weight_loader(param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
    """A replicated parameter (norm weights): the whole tensor on every rank."""
    _check_shape("replicated parameter", full, tuple(param.shape))
    param.data.copy_(full)


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's rows (output features) split across ranks: y is sharded on its
    last dim unless `gather_output`."""

    packable_weight = True  # engine.kernels.cpu.linear may swap in a packed CPU weight
    packs_gated = False  # the weight is [gate | up] with SwiGLU after it

    def __init__(self, input_size: int, output_size: int, bias: bool = False, gather_output: bool = False):
        super().__init__()
        self.tp_size, self.tp_rank = tp_size(), tp_rank()
        self.input_size = input_size
        self.output_size = output_size
        self.output_size_per_rank = divide(output_size, self.tp_size)
        self.gather_output = gather_output
        self.weight = _param(self.output_size_per_rank, input_size)
        self.bias = _param(self.output_size_per_rank) if bias else None

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        _check_shape(type(self).__name__, full, (self.output_size, *param.shape[1:]))
        rows = self.output_size_per_rank
        param.data.copy_(full.narrow(0, self.tp_rank * rows, rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, self.bias)
        return all_gather(y, dim=-1) if self.gather_output else y

    def normed(self, x: torch.Tensor, norm: RowNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(rms_norm(x + residual)), x + residual): the pre-norm layer's RMSNorm and this
        projection, in one kernel where one takes both (engine.kernels.linear.norm_linear)."""
        if self.gather_output:
            normed, stream = apply_row_norm(x, norm)
            return self(normed), stream
        return norm_linear(x, norm, self.weight, self.bias, gated=self.packs_gated)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one matmul (the MLP's
    gate and up). Each rank holds its slice of every part, laid out part after part."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False):
        self.output_sizes = tuple(output_sizes)
        super().__init__(input_size, sum(self.output_sizes), bias=bias)
        for size in self.output_sizes:
            divide(size, self.tp_size)

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        if shard_id is None:  # the checkpoint stores the parts already fused
            _check_shape(type(self).__name__, full, (self.output_size, *param.shape[1:]))
            for index, part in enumerate(full.split(self.output_sizes, dim=0)):
                self.weight_loader(param, part, index)
            return
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"{type(self).__name__}: shard_id must be in [0, {len(self.output_sizes)})")
        _check_shape(type(self).__name__, full, (self.output_sizes[shard_id], *param.shape[1:]))
        rows = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        param.data.narrow(0, offset, rows).copy_(full.narrow(0, self.tp_rank * rows, rows))


class SwiGLUParallelLinear(MergedColumnParallelLinear):
    """An MLP's gate and up projections with SwiGLU after them: x -> silu(x Wg^T) * (x Wu^T),
    [..., I / tp]. Each rank's weight is its [gate | up] slice, so the activation needs no
    communication. On CPU with AMX the packed kernel applies it to the sums directly."""

    packs_gated = True  # engine.kernels.cpu.linear packs [gate | up] for linear_swiglu

    def __init__(self, input_size: int, intermediate_size: int, bias: bool = False):
        super().__init__(input_size, [intermediate_size, intermediate_size], bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_swiglu(x, self.weight, self.bias)


class QKVParallelLinear(ColumnParallelLinear):
    """The fused q/k/v projection, split by heads. Each rank holds `num_heads / tp` query
    heads and the KV heads those queries read: `num_kv_heads / tp` of them, or, when there are
    fewer KV heads than ranks (GQA), one KV head replicated on `tp / num_kv_heads` ranks.
    Output per rank: `[q (num_heads_per_rank*D) | k (num_kv_heads_per_rank*D) | v (same)]`."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        tp = tp_size()
        self.head_dim = head_dim
        self.total_num_heads = num_heads
        self.total_num_kv_heads = num_kv_heads
        self.num_heads = divide(num_heads, tp)
        if tp >= num_kv_heads:
            if tp % num_kv_heads:
                raise ValueError(
                    f"tensor parallel size {tp} exceeds num_kv_heads ({num_kv_heads}) and is not a multiple of it"
                )
            self.num_kv_heads = 1
            self.kv_head_start = tp_rank() // (tp // num_kv_heads)
        else:
            self.num_kv_heads = divide(num_kv_heads, tp)
            self.kv_head_start = tp_rank() * self.num_kv_heads
        self.q_size = self.num_heads * head_dim  # per rank
        self.kv_size = self.num_kv_heads * head_dim  # per rank
        super().__init__(hidden_size, (self.q_size + 2 * self.kv_size) * tp, bias=bias)

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        d = self.head_dim
        if shard_id is None:  # one fused qkv tensor in the checkpoint
            sizes = [self.total_num_heads * d, self.total_num_kv_heads * d, self.total_num_kv_heads * d]
            _check_shape(type(self).__name__, full, (sum(sizes), *param.shape[1:]))
            for part, name in zip(full.split(sizes, dim=0), "qkv", strict=True):
                self.weight_loader(param, part, name)
            return
        if shard_id == "q":
            total, offset, rows = self.total_num_heads, 0, self.q_size
            start = self.tp_rank * self.num_heads * d
        elif shard_id in ("k", "v"):
            total, rows = self.total_num_kv_heads, self.kv_size
            offset = self.q_size if shard_id == "k" else self.q_size + self.kv_size
            start = self.kv_head_start * d
        else:
            raise ValueError(f"{type(self).__name__}: shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        _check_shape(f"{type(self).__name__}[{shard_id}]", full, (total * d, *param.shape[1:]))
        param.data.narrow(0, offset, rows).copy_(full.narrow(0, start, rows))


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's columns (input features) split across ranks: the input arrives
    sharded on its last dim (from a column-parallel layer), the partial products are summed
    with one all-reduce, then the (replicated) bias is added once."""

    packable_weight = True

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True):
        super().__init__()
        self.tp_size, self.tp_rank = tp_size(), tp_rank()
        self.input_size = input_size
        self.output_size = output_size
        self.input_size_per_rank = divide(input_size, self.tp_size)
        self.reduce_results = reduce_results
        self.weight = _param(output_size, self.input_size_per_rank)
        self.bias = _param(output_size) if bias else None

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        if param.dim() == 1:  # bias: replicated
            default_weight_loader(param, full)
            return
        _check_shape(type(self).__name__, full, (self.output_size, self.input_size))
        cols = self.input_size_per_rank
        param.data.copy_(full.narrow(1, self.tp_rank * cols, cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return linear(x, self.weight, self.bias)
        y = linear(x, self.weight)
        if self.reduce_results:
            y = all_reduce(y)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows. Each rank holds `ceil(V / tp)` rows (the last
    rank's tail is zero padding); ids outside a rank's range look up zeros there, and one
    all-reduce assembles the full embedding."""

    reads_packed_rows = True  # a tied LM head's CPU packing serves the lookup (cpu/linear.py)

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_size, self.tp_rank = tp_size(), tp_rank()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.num_embeddings_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.num_embeddings_per_rank
        self.vocab_end = min(self.vocab_start + self.num_embeddings_per_rank, num_embeddings)
        self.weight = _param(self.num_embeddings_per_rank, embedding_dim)

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        _check_shape(type(self).__name__, full, (self.num_embeddings, self.embedding_dim))
        rows = max(self.vocab_end - self.vocab_start, 0)
        param.data.zero_()
        param.data.narrow(0, 0, rows).copy_(full.narrow(0, self.vocab_start, rows))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return embedding(input_ids, self.weight)
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local_ids = (input_ids - self.vocab_start).masked_fill(outside, 0)
        y = embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection hidden → vocab, split by vocabulary rows like the embedding (so a
    tied head can share the embedding's parameter). Logits are gathered to the full vocab."""

    packable_weight = True  # a tied embedding then reads its rows from the packing

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [R, H] -> [R, V]
        logits = linear(hidden, self.weight)
        if self.tp_size == 1:
            return logits
        return all_gather(logits, dim=-1)[..., : self.num_embeddings]
