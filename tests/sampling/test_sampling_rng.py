"""engine.sampling.rng: Philox-4x32-10 known answers, the (0, 1) range, statistical quality
of 1e6 draws, independence across counters/keys/streams, and the Triton kernel against the
torch path (in the interpreter on CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from engine.sampling import rng

P_MIN = 1e-3  # a fixed-seed test fails by chance with probability < 0.1 %


def _one(v: int) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.int64)


@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [  # Random123 kat_vectors, philox4x32_10
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_known_answers(counter: tuple[int, ...], key: tuple[int, ...], expected: tuple[int, ...]) -> None:
    words = rng.philox4x32(*(_one(c) for c in counter), *(_one(k) for k in key))
    assert tuple(int(w) for w in words) == expected


def test_uniform_shape_range_and_prefix_consistency() -> None:
    key = torch.tensor([0, -1, 2**63 - 1, -(2**63), 12345])
    counter = torch.tensor([0, 1, 2**40 + 7, 2**63 - 1, 5])
    u = rng.uniform(key, counter, 4099, stream=2)
    assert u.shape == (5, 4099) and u.dtype == torch.float32
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert torch.equal(rng.uniform(key, counter, 7, stream=2), u[:, :7])
    assert torch.equal(rng.uniform(key, counter, 0, stream=2), u[:, :0])
    assert torch.equal(rng.uniform(key, counter, 4099, stream=2), u)  # stateless


def test_extreme_words_stay_inside_open_interval() -> None:
    words = torch.tensor([0, 2**32 - 1], dtype=torch.int64)
    u = rng.words_to_uniform(words)
    assert float(u[0]) == 2.0**-24 and float(u[1]) == 1 - 2.0**-24


def test_rows_do_not_depend_on_the_batch() -> None:
    key = torch.tensor([11, 22, 33, 44])
    counter = torch.tensor([5, 6, 7, 8])
    batch = rng.uniform(key, counter, 300, stream=0)
    for b in range(4):
        alone = rng.uniform(key[b : b + 1], counter[b : b + 1], 300, stream=0)
        assert torch.equal(alone[0], batch[b])
    swapped = rng.uniform(key.flip(0), counter.flip(0), 300, stream=0)
    assert torch.equal(swapped.flip(0), batch)


def test_chunked_path_matches_single_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    key = torch.arange(9, dtype=torch.int64)
    counter = torch.arange(9, dtype=torch.int64) * 3
    whole = rng.random_words(key, counter, 1000, 1)
    monkeypatch.setattr(rng, "_BLOCKS_PER_CHUNK", 500)  # 2 rows per chunk
    assert torch.equal(rng.random_words(key, counter, 1000, 1), whole)


def test_uniform_at_equals_dense_gather() -> None:
    key = torch.tensor([3, -9, 2**50])
    counter = torch.tensor([0, 17, 2**33])
    dense = rng.uniform(key, counter, 1000, stream=3)
    columns = torch.tensor([[0, 1, 2, 3, 999, 4], [998, 5, 5, 100, 0, 7], [500, 501, 502, 503, 3, 2]])
    assert torch.equal(rng.uniform_at(key, counter, columns, stream=3), dense.gather(1, columns))


def test_one_million_draws_are_uniform() -> None:
    key = torch.arange(100, dtype=torch.int64) * 7919 - 50
    counter = torch.arange(100, dtype=torch.int64)
    u = rng.uniform(key, counter, 10_000, stream=0).reshape(-1).double().numpy()  # 1e6 draws
    counts, _ = np.histogram(u, bins=1000, range=(0.0, 1.0))
    assert stats.chisquare(counts).pvalue > P_MIN
    assert stats.kstest(u, "uniform").pvalue > P_MIN
    assert abs(u.mean() - 0.5) < 5 * (1 / 12) ** 0.5 / 1000


def test_bits_are_balanced() -> None:
    words = rng.random_words(torch.arange(25), torch.zeros(25, dtype=torch.int64), 4000, 0).reshape(-1)
    bits = (words[:, None] >> torch.arange(32)) & 1  # [1e5, 32]
    ones = bits.sum(0).double()
    n = words.shape[0]
    z = (ones - n / 2) / (n / 4) ** 0.5
    assert float(z.abs().max()) < 4.5  # 32 z-scores; P(max |z| > 4.5) ~ 2e-4


def _pair_independent(a: torch.Tensor, b: torch.Tensor) -> None:
    """u and v independent uniforms: correlation ~ 0 and a 2-D histogram that is flat."""
    x, y = a.reshape(-1).double().numpy(), b.reshape(-1).double().numpy()
    n = x.size
    assert abs(np.corrcoef(x, y)[0, 1]) < 5 / n**0.5
    grid, _, _ = np.histogram2d(x, y, bins=32, range=[[0, 1], [0, 1]])
    assert stats.chisquare(grid.reshape(-1)).pvalue > P_MIN


def test_adjacent_counters_keys_streams_and_columns_are_independent() -> None:
    key = torch.arange(200, dtype=torch.int64)
    counter = torch.full((200,), 1000, dtype=torch.int64)
    base = rng.uniform(key, counter, 1000, stream=0)  # 2e5 draws
    _pair_independent(base, rng.uniform(key, counter + 1, 1000, stream=0))
    _pair_independent(base, rng.uniform(key + 1, counter, 1000, stream=0))
    _pair_independent(base, rng.uniform(key, counter, 1000, stream=1))
    _pair_independent(base[:, :-1], base[:, 1:])  # neighbouring columns, same Philox block or not
    _pair_independent(base[:-1], base[1:])  # neighbouring rows (keys)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="key and counter"):
        rng.uniform(torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 4, 0)
    with pytest.raises(ValueError, match="stream"):
        rng.uniform(torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), 4, -1)


def test_exponential_is_finite_and_positive() -> None:
    e = rng.exponential(torch.arange(10), torch.arange(10), 5000, 0)
    assert bool(torch.isfinite(e).all()) and bool((e > 0).all())
    assert abs(float(e.double().mean()) - 1.0) < 0.02


def test_request_keys() -> None:
    seeded = rng.request_key(42, engine_seed=0, request_index=0)
    assert seeded == rng.request_key(42, engine_seed=7, request_index=99)  # the seed alone decides
    assert seeded != rng.request_key(43, engine_seed=0, request_index=0)
    unseeded = {rng.request_key(None, engine_seed=0, request_index=i) for i in range(1000)}
    assert len(unseeded) == 1000
    assert rng.request_key(None, 0, 5) != rng.request_key(None, 1, 5)
    assert rng.request_key(None, 3, 5) == rng.request_key(None, 3, 5)
    for seed in (-(2**63), -1, 0, 2**64 - 1):
        assert -(2**63) <= rng.request_key(seed, 0, 0) < 2**63


@pytest.fixture
def interpreted_rng_kernel(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    rng_triton = pytest.importorskip("engine.kernels.triton.rng")
    if not rng_triton.available():
        pytest.skip("triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rng_triton._compiled.cache_clear()
    yield rng_triton
    rng_triton._compiled.cache_clear()  # later GPU tests compile it for real


def test_triton_kernel_matches_torch_path(interpreted_rng_kernel) -> None:  # type: ignore[no-untyped-def]
    key = torch.tensor([0, -1, 2**62 + 5, -12345, 77])
    counter = torch.tensor([0, 7, 2**40 + 3, 99, 2**63 - 1])
    for n, stream in ((1, 0), (6, 1), (1029, 2), (2500, 2**32 - 1)):
        expected = rng.words_to_uniform(rng.random_words(key, counter, n, stream))
        assert torch.equal(interpreted_rng_kernel.uniform(key, counter, n, stream), expected), (n, stream)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_gpu_uniform_matches_cpu() -> None:
    key = torch.tensor([1, -2, 2**60, 9])
    counter = torch.tensor([0, 3, 2**35, 12])
    cpu = rng.uniform(key, counter, 50_000, 3)
    gpu = rng.uniform(key.cuda(), counter.cuda(), 50_000, 3)
    assert torch.equal(gpu.cpu(), cpu)
