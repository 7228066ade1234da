"""`gpu_memory_utilization` on a real GPU (engine/kv/budget.py): the engine's weights, KV pool
and the rest it allocates at start-up take about that share of the memory free before it
started, and the KV pool grows with it."""

from __future__ import annotations

import gc

import pytest
import torch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("utilization", [0.3, 0.6])
def test_the_engine_takes_its_share_of_free_memory(tmp_path_factory, utilization):
    from tests.engine.gpu_models import gpu_engine

    gc.collect()
    torch.cuda.empty_cache()
    free_at_start = torch.cuda.mem_get_info()[0]
    engine = gpu_engine(
        tmp_path_factory.mktemp("util"), speculative=False, kv_cache_memory_bytes=0, gpu_memory_utilization=utilization
    )
    torch.cuda.synchronize()
    taken = free_at_start - torch.cuda.mem_get_info()[0]
    share = taken / free_at_start
    pool = engine.runner.kv_pool
    pool_share = (pool.k.nbytes + pool.v.nbytes) / free_at_start
    print(f"utilization {utilization}: took {share:.3f} of {free_at_start / 2**30:.1f} GiB free, pool {pool_share:.3f}")
    # The pool is sized to the share; CUDA graphs, workspaces and the allocator's rounding
    # come on top (a few hundred MiB on an 80-140 GiB card).
    assert utilization - 0.02 <= share <= utilization + 0.03
    assert utilization - 0.05 <= pool_share <= utilization
    del engine
    gc.collect()
    torch.cuda.empty_cache()
