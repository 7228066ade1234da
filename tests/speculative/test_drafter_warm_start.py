"""Warm-starting a drafter from a trained checkpoint (`init_from_drafter`): a deeper drafter
starts as exactly the trained one; anything but depth and gamma must match."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from spec_helpers import make_drafter, make_scenario, tiny_config

from engine.speculative.checkpoint import save_drafter
from engine.speculative.drafter import DSparkDrafter
from engine.speculative.weight_encoding import round_trip
from training.init import init_from_drafter


def propose(drafter: DSparkDrafter, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = drafter.config
    scen = make_scenario(cfg, [6, 3], seed=seed)
    aux, positions, slots = scen.flat_context()
    drafter.inject_kv(aux, positions, slots, scen.pool)
    ctx, pos = scen.block_context(cfg.gamma)
    anchors = torch.tensor([3, 7])
    zeros = torch.zeros(2, dtype=torch.int64)
    out = drafter.propose(anchors, ctx, pos, torch.zeros(2), zeros, zeros)
    return out.draft_tokens, out.draft_logits


@pytest.mark.parametrize("encoding", ["plain", "int8"])
def test_a_deeper_drafter_starts_as_the_trained_one(tmp_path: Path, encoding: str) -> None:
    trained, target = make_drafter(tiny_config(num_layers=2), seed=3)
    save_drafter(tmp_path, trained, weight_encoding=encoding)  # type: ignore[arg-type]
    deeper, _ = make_drafter(tiny_config(num_layers=3), seed=11)  # random everywhere to begin with
    deeper.bind_target(target.embed, target.compute_logits)
    report = init_from_drafter(deeper, str(tmp_path), "cpu")
    assert report["layers_copied"] == 2 and report["layers_added"] == [2]
    assert torch.count_nonzero(deeper.layers[2].self_attn.o_proj.weight) == 0
    assert torch.count_nonzero(deeper.layers[2].down_proj.weight) == 0
    assert torch.count_nonzero(deeper.layers[2].gate_up_proj.weight) > 0  # still trainable paths in
    # What the checkpoint holds: the trained weights, through the file's encoding.
    trained.load_state_dict(round_trip(trained.state_dict(), encoding, torch.float32))  # type: ignore[arg-type]
    assert torch.equal(deeper.kv_proj[:2], trained.kv_proj)
    tokens, logits = propose(deeper, seed=5)
    trained_tokens, trained_logits = propose(trained, seed=5)
    assert torch.equal(tokens, trained_tokens)
    torch.testing.assert_close(logits, trained_logits, atol=1e-5, rtol=1e-5)


def test_a_checkpoint_of_another_shape_is_refused(tmp_path: Path) -> None:
    trained, _ = make_drafter(tiny_config(num_layers=2, markov_rank=8), seed=3)
    save_drafter(tmp_path, trained)
    other, _ = make_drafter(tiny_config(num_layers=2, markov_rank=4))
    with pytest.raises(ValueError, match="markov_rank is 8 there but 4 here"):
        init_from_drafter(other, str(tmp_path), "cpu")
    shallower, _ = make_drafter(tiny_config(num_layers=1))
    with pytest.raises(ValueError, match="2 layers, more than the 1 here"):
        init_from_drafter(shallower, str(tmp_path), "cpu")
    longer_block, _ = make_drafter(tiny_config(num_layers=2, gamma=6))
    init_from_drafter(longer_block, str(tmp_path), "cpu")  # gamma may differ
