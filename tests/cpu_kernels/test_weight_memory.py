"""engine/kernels/cpu/weight_memory.py: packed weights carved out of shared chunks, each on a
cache line, none overlapping another, and alive while a view of its chunk is."""

from __future__ import annotations

import gc

import pytest
import torch

from engine.kernels.cpu import gemv, weight_memory


def test_weights_are_aligned_disjoint_and_writable() -> None:
    shapes = [(30, 576, 32), (7, 3), (18, 288, 32, 2), (1,)]
    dtypes = [torch.float32, torch.float32, torch.bfloat16, torch.bfloat16]
    tensors = [weight_memory.empty(s, d) for s, d in zip(shapes, dtypes, strict=True)]
    spans = []
    for tensor, shape, dtype in zip(tensors, shapes, dtypes, strict=True):
        assert tensor.shape == shape and tensor.dtype == dtype and tensor.is_contiguous()
        assert tensor.data_ptr() % weight_memory.ALIGN == 0
        tensor.fill_(len(spans) + 1)
        spans.append((tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()))
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
    assert [t.flatten()[-1].item() for t in tensors] == [1, 2, 3, 4]  # no write landed in another


def test_a_large_weight_gets_its_own_chunk_and_outlives_the_allocator() -> None:
    n = weight_memory.CHUNK_BYTES // 4  # fp32 elements of a whole chunk: past half a chunk
    before = weight_memory.empty((16,), torch.float32)
    big = weight_memory.empty((n,), torch.float32)
    after = weight_memory.empty((16,), torch.float32)
    # the shared chunk goes on where it was: the big weight took none of it (chunks are separate
    # mappings, so where the big one lies relative to the shared one is the OS's choice)
    assert after.data_ptr() == before.data_ptr() + weight_memory.ALIGN
    big_span = (big.data_ptr(), big.data_ptr() + n * 4)
    assert all(not big_span[0] <= t.data_ptr() < big_span[1] for t in (before, after))
    big[-1] = 7.0
    gc.collect()
    assert big[-1].item() == 7.0


def test_empty_shape() -> None:
    assert weight_memory.empty((0, 576, 32), torch.float32).shape == (0, 576, 32)


@pytest.mark.skipif(not gemv.available(), reason="no C compiler: the kernels cannot be built")
def test_packed_weights_live_in_weight_memory_and_multiply_as_before() -> None:
    weight = torch.randn(96, 64)
    packed = gemv.pack(weight)
    assert packed.data_ptr() % weight_memory.ALIGN == 0
    x = torch.randn(3, 64)
    torch.testing.assert_close(gemv.linear(x, packed), x @ weight.T, rtol=1e-5, atol=1e-5)
