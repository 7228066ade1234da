"""int8 per-group weight encoding of drafter checkpoints: error bound, what is encoded, and
the refusals of malformed files."""

from __future__ import annotations

import pytest
import torch

from engine.speculative.weight_encoding import (
    GROUP_SIZE,
    SCALE_SUFFIX,
    decode_state,
    dequantize_int8,
    encode_state,
    quantize_int8,
    round_trip,
)


@pytest.mark.parametrize("shape", [(64, 96), (3, 40, 64), (8, 49152 // 64)])
def test_each_weight_lands_within_half_a_step_of_its_group(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(shape, generator=gen) * torch.rand(shape[:-1] + (1,), generator=gen) * 3
    weight[..., :GROUP_SIZE] = 0.0  # an all-zero group
    values, scale = quantize_int8(weight)
    assert values.dtype == torch.int8 and values.shape == weight.shape
    assert scale.shape == (*shape[:-1], shape[-1] // GROUP_SIZE) and scale.dtype == torch.float32
    decoded = dequantize_int8(values, scale, torch.float32)
    step = scale.repeat_interleave(GROUP_SIZE, dim=-1)
    assert torch.all((decoded - weight).abs() <= step / 2 + 1e-7)
    assert torch.all(decoded[..., :GROUP_SIZE] == 0.0)
    assert values.abs().max() <= 127


def test_only_matrices_with_whole_groups_are_encoded() -> None:
    state = {
        "fc.weight": torch.randn(32, 96),
        "norm.weight": torch.ones(32),  # 1-D
        "confidence.proj.weight": torch.randn(1, 608),  # under the size floor
        "down_proj.weight": torch.randn(32, 48),  # 48 is not a multiple of 32
        "kv_proj": torch.randn(2, 32, 32),
        "steps": torch.tensor([3]),  # not floating point
    }
    stored = encode_state(state, "int8")
    assert {n for n, t in stored.items() if t.dtype == torch.int8} == {"fc.weight", "kv_proj"}
    assert set(stored) == set(state) | {"fc.weight" + SCALE_SUFFIX, "kv_proj" + SCALE_SUFFIX}
    decoded = decode_state(stored, torch.bfloat16)
    assert set(decoded) == set(state)
    assert decoded["fc.weight"].dtype == torch.bfloat16
    torch.testing.assert_close(decoded["fc.weight"].float(), state["fc.weight"], atol=0.03, rtol=0.02)
    for name in ("norm.weight", "confidence.proj.weight", "down_proj.weight", "steps"):
        assert torch.equal(decoded[name], state[name]), name
    plain = round_trip(state, "plain", torch.float32)
    assert all(torch.equal(plain[n], state[n]) for n in state)


def test_malformed_encodings_are_refused() -> None:
    stored = encode_state({"w": torch.randn(32, 64)}, "int8")
    with pytest.raises(ValueError, match="scales without their tensor"):
        decode_state({"w" + SCALE_SUFFIX: stored["w" + SCALE_SUFFIX]}, torch.float32)
    with pytest.raises(ValueError, match="not int8"):
        decode_state({"w": stored["w"].float(), "w" + SCALE_SUFFIX: stored["w" + SCALE_SUFFIX]}, torch.float32)
    with pytest.raises(ValueError, match="weight encoding must be one of"):
        encode_state({"w": torch.randn(32, 64)}, "fp4")  # type: ignore[arg-type]
