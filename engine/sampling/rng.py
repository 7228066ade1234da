"""Counter-based randomness: the same numbers on every device, with no generator state.

A draw is a pure function of (key, counter, column, stream), computed with Philox-4x32-10
(Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11; the generator of
cuRAND, Triton and JAX's `rbg`). One Philox call maps a 128-bit counter and a 64-bit key to
four 32-bit words:

    counter = (column // 4, counter & 0xFFFFFFFF, counter >> 32, stream),  key = key (64 bits)

and word `column % 4` becomes column `column`'s uniform. Because nothing depends on the
batch or on `n`, a request's draws at a position are the same whatever else is batched and
however many columns are asked for (`uniform(..., n=8)[:, :5] == uniform(..., n=5)`).

The torch path keeps every 32-bit word in an int64 tensor and splits each 32x32-bit
multiply into 16-bit halves, so no intermediate leaves [0, 2^49) and nothing overflows:
the result is bit-identical on every backend. On CUDA/ROCm a Triton kernel computes the
same words in one pass (`engine.kernels.triton.rng`).
"""

from __future__ import annotations

import enum

import torch

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
# Random123's Philox-4x32 multipliers and Weyl key increments.
_ROUND_A = 0xD2511F53
_ROUND_B = 0xCD9E8D57
_KEY_A = 0x9E3779B9
_KEY_B = 0xBB67AE85
PHILOX_ROUNDS = 10
# A word's top 23 bits plus one half: centres of 2^23 equal cells, all in (0, 1) and
# exactly representable in float32 (24 significant bits), min 2^-24, max 1 - 2^-24.
_UNIFORM_SHIFT = 9
_UNIFORM_SCALE = 2.0**-23


class Stream(enum.IntEnum):
    """Separates the uses of one request's randomness at one position."""

    TARGET = 0  # sampling the target model's token
    DRAFT = 1  # the drafter's Gumbel-max block
    ACCEPT = 2  # rejection-sampling coins, one per draft position
    RESIDUAL = 3  # resampling from norm(max(p - q, 0)) after a rejection


def _mulhilo(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of multiplier * x, for x in [0, 2^32) held in int64."""
    low_product = x * (multiplier & 0xFFFF)  # < 2^48
    carry = x * (multiplier >> 16) + (low_product >> 16)  # < 2^49; product = carry * 2^16 + low16
    high = carry >> 16
    low = ((carry & 0xFFFF) << 16) | (low_product & 0xFFFF)
    return high, low


def philox4x32(
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor,
    c3: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
    rounds: int = PHILOX_ROUNDS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32 on int64 tensors holding unsigned 32-bit words (broadcasting)."""
    for round_index in range(rounds):
        if round_index:
            k0 = (k0 + _KEY_A) & _MASK32
            k1 = (k1 + _KEY_B) & _MASK32
        high_a, low_a = _mulhilo(_ROUND_A, c0)
        high_b, low_b = _mulhilo(_ROUND_B, c2)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
    return c0, c1, c2, c3


def _split64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Low and high 32-bit words of int64 values (two's complement), as int64 in [0, 2^32)."""
    return x & _MASK32, (x >> 32) & _MASK32


# Rows per torch-path chunk: about 2^16 Philox blocks, so the dozen live int64 temporaries
# stay in a CPU's cache (several times faster than one [B, V] pass at B=64, V=49152).
_BLOCKS_PER_CHUNK = 1 << 16


def _check(key: torch.Tensor, counter: torch.Tensor, stream: int) -> None:
    if key.dim() != 1 or key.shape != counter.shape:
        raise ValueError(f"key and counter must be [B], got {tuple(key.shape)} and {tuple(counter.shape)}")
    if not 0 <= stream <= _MASK32:
        raise ValueError(f"stream must be in [0, 2^32), got {stream}")


def _row_words(
    key: torch.Tensor, counter: torch.Tensor, stream: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row Philox inputs, each [B, 1]: (c1, c2, c3, k0, k1)."""
    k0, k1 = _split64(key.to(torch.int64)[:, None])
    c1, c2 = _split64(counter.to(torch.int64)[:, None])
    c3 = torch.full_like(c1, stream)
    return c1, c2, c3, k0, k1


def _words_at_blocks(key: torch.Tensor, counter: torch.Tensor, blocks: torch.Tensor, stream: int) -> torch.Tensor:
    """[B, J, 4] words of Philox blocks `blocks` ([1, J] or [B, J] int64)."""
    c1, c2, c3, k0, k1 = _row_words(key, counter, stream)
    c0 = blocks.expand(key.shape[0], blocks.shape[-1])
    words = philox4x32(c0, c1, c2, c3, k0, k1)  # all [B, J] after the third round
    return torch.stack(words, dim=-1)


def random_words(key: torch.Tensor, counter: torch.Tensor, n: int, stream: int) -> torch.Tensor:
    """[B, n] int64 in [0, 2^32): the raw Philox words behind `uniform` (torch path)."""
    _check(key, counter, stream)
    batch, blocks = key.shape[0], (n + 3) // 4
    block_ids = torch.arange(blocks, device=key.device, dtype=torch.int64)[None, :]
    rows_per_chunk = max(1, _BLOCKS_PER_CHUNK // max(blocks, 1))
    if batch <= rows_per_chunk:
        return _words_at_blocks(key, counter, block_ids, stream).reshape(batch, 4 * blocks)[:, :n]
    out = torch.empty(batch, 4 * blocks, dtype=torch.int64, device=key.device)
    for start in range(0, batch, rows_per_chunk):  # host-known chunking, fixed shapes
        end = min(batch, start + rows_per_chunk)
        words = _words_at_blocks(key[start:end], counter[start:end], block_ids, stream)
        out[start:end] = words.reshape(end - start, 4 * blocks)
    return out[:, :n]


def words_to_uniform(words: torch.Tensor) -> torch.Tensor:
    """32-bit words (any int dtype, values in [0, 2^32)) to float32 in (0, 1)."""
    return ((words >> _UNIFORM_SHIFT).to(torch.float32) + 0.5) * _UNIFORM_SCALE


def uniform(key: torch.Tensor, counter: torch.Tensor, n: int, stream: int) -> torch.Tensor:
    """[B, n] float32 uniforms in (0, 1) for rows with `key` [B] and `counter` [B] (int64).

    Column j of row b depends only on (key[b], counter[b], j, stream). Pure device work: no
    host reads, fixed shape, capturable in a CUDA graph.
    """
    if key.is_cuda and n > 0:
        from engine.kernels.triton import rng as rng_triton

        if rng_triton.available():
            _check(key, counter, stream)
            return rng_triton.uniform(key, counter, n, stream)
    return words_to_uniform(random_words(key, counter, n, stream))


def uniform_at(key: torch.Tensor, counter: torch.Tensor, columns: torch.Tensor, stream: int) -> torch.Tensor:
    """[B, K] float32: `uniform(key, counter, V, stream)` gathered at `columns` [B, K] (int64,
    in [0, 2^34)) without computing the other columns. Sparse samplers (top-k candidates)
    draw exactly the numbers the dense path would."""
    _check(key, counter, stream)
    columns = columns.to(torch.int64)
    words = _words_at_blocks(key, counter, columns >> 2, stream)  # [B, K, 4]
    word = words.gather(-1, (columns & 3)[..., None])[..., 0]
    return words_to_uniform(word)


def exponential(key: torch.Tensor, counter: torch.Tensor, n: int, stream: int) -> torch.Tensor:
    """[B, n] float32 Exp(1) draws, -log(u): within [6e-8, 16.7], never 0 or inf."""
    return -torch.log(uniform(key, counter, n, stream))


# ---- host side: request keys -------------------------------------------------------------


def splitmix64(x: int) -> int:
    """Steele et al.'s SplitMix64 finaliser on a Python int (host only)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _as_int64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_UNSEEDED_DOMAIN = 0x6473706B5F726E67  # keeps unseeded keys apart from splitmix64(seed)


def request_key(seed: int | None, engine_seed: int, request_index: int) -> int:
    """The signed int64 Philox key of a request (host side, at admission).

    With a `seed` the key depends on the seed alone, so the same seed gives the same text
    whatever else is batched. Without one it mixes the engine seed with `request_index`,
    a per-request counter the host assigns, so a restarted engine repeats its choices.
    """
    if seed is not None:
        return _as_int64(splitmix64(seed & _MASK64))
    engine_part = splitmix64((engine_seed & _MASK64) ^ _UNSEEDED_DOMAIN)
    return _as_int64(splitmix64(engine_part ^ (request_index & _MASK64)))
