"""The drafter checkpoint format: roundtrip, and refusal of a drafter made for another target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from spec_helpers import make_drafter, make_scenario, tiny_config, tiny_target

from engine.speculative.checkpoint import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    DrafterMismatchError,
    load_drafter,
    read_drafter_config,
    save_drafter,
)


def test_roundtrip_keeps_weights_config_and_behaviour(tmp_path: Path) -> None:
    cfg = tiny_config(rope_dim=4, capture_layers=(1, 4))
    drafter, target = make_drafter(cfg, seed=4)
    save_drafter(tmp_path / "d", drafter, cfg, training={"steps": 10, "data": "unit test"})
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    loaded, loaded_cfg = load_drafter(tmp_path / "d", tiny_target(), "cpu", torch.float32)
    assert loaded_cfg == cfg
    assert read_drafter_config(tmp_path / "d")[1] == {"steps": 10, "data": "unit test"}
    original = drafter.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, original[name]), name
    loaded.bind_target(target.embed, target.compute_logits)
    proposals = []
    for model in (drafter, loaded):
        scen = make_scenario(cfg, [5, 2], seed=6)
        aux, positions, slots = scen.flat_context()
        model.inject_kv(aux, positions, slots, scen.pool)
        ctx, pos = scen.block_context(cfg.gamma)
        z = torch.zeros(2, dtype=torch.int64)
        proposals.append(model.propose(z, ctx, pos, torch.tensor([0.0, 1.0]), z, z))
    assert torch.equal(proposals[0].draft_tokens, proposals[1].draft_tokens)
    assert torch.equal(proposals[0].draft_logits, proposals[1].draft_logits)


def test_load_casts_to_dtype_but_keeps_rope_tables_fp32(tmp_path: Path) -> None:
    cfg = tiny_config()
    drafter, _ = make_drafter(cfg)
    save_drafter(tmp_path, drafter)
    loaded, _ = load_drafter(tmp_path, tiny_target(), torch.device("cpu"), torch.bfloat16)
    assert loaded.fc.weight.dtype == torch.bfloat16 and loaded.markov.w2.dtype == torch.bfloat16
    assert loaded.rotary_emb.cos_sin_cache.dtype == torch.float32


@pytest.mark.parametrize(
    ("field", "served", "what"),
    [
        ("vocab_size", 50, "vocabulary size"),
        ("hidden_size", 64, "hidden size"),
        ("num_layers", 12, "layer count"),
    ],
)
def test_refuses_a_drafter_for_another_target(tmp_path: Path, field: str, served: int, what: str) -> None:
    cfg = tiny_config()
    drafter, _ = make_drafter(cfg)
    save_drafter(tmp_path, drafter)
    trained = {"vocab_size": 48, "hidden_size": 32, "num_layers": 6}[field]
    with pytest.raises(DrafterMismatchError) as info:
        load_drafter(tmp_path, tiny_target(**{field: served}), "cpu", torch.float32)
    message = str(info.value)
    assert what in message and str(trained) in message and str(served) in message and "tiny-target" in message
    assert isinstance(info.value, ValueError)


def test_bad_directories_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=CONFIG_FILE):
        load_drafter(tmp_path, tiny_target(), "cpu", torch.float32)
    cfg = tiny_config()
    drafter, _ = make_drafter(cfg)
    save_drafter(tmp_path, drafter)
    doc = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**doc, "format_version": 99}))
    with pytest.raises(ValueError, match="format_version 99"):
        load_drafter(tmp_path, tiny_target(), "cpu", torch.float32)
    # A config that no longer matches the stored tensors.
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**doc, "config": {**doc["config"], "markov_rank": 4}}))
    with pytest.raises(ValueError, match="has shape .* the config implies"):
        load_drafter(tmp_path, tiny_target(), "cpu", torch.float32)
    (tmp_path / CONFIG_FILE).write_text(json.dumps(doc))
    (tmp_path / WEIGHTS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=WEIGHTS_FILE):
        load_drafter(tmp_path, tiny_target(), "cpu", torch.float32)


def test_save_refuses_a_config_that_is_not_the_drafters(tmp_path: Path) -> None:
    drafter, _ = make_drafter(tiny_config())
    with pytest.raises(ValueError, match="config"):
        save_drafter(tmp_path, drafter, tiny_config(gamma=3))


def test_int8_checkpoint_is_smaller_and_serves_close_to_the_original(tmp_path: Path) -> None:
    cfg = tiny_config(rope_dim=4, capture_layers=(1, 4))
    drafter, target = make_drafter(cfg, seed=9)
    save_drafter(tmp_path / "plain", drafter)
    save_drafter(tmp_path / "int8", drafter, weight_encoding="int8")
    assert json.loads((tmp_path / "int8" / CONFIG_FILE).read_text())["weight_encoding"] == "int8"
    plain_bytes = (tmp_path / "plain" / WEIGHTS_FILE).stat().st_size
    assert (tmp_path / "int8" / WEIGHTS_FILE).stat().st_size < 0.5 * plain_bytes  # fp32 here: ~1/4 + scales
    loaded, _ = load_drafter(tmp_path / "int8", tiny_target(), "cpu", torch.float32)
    original = drafter.state_dict()
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, original[name], atol=0.02, rtol=0.02, msg=name)
    assert not torch.equal(loaded.fc.weight, drafter.fc.weight)  # it was encoded
    loaded.bind_target(target.embed, target.compute_logits)
    scen = make_scenario(cfg, [5, 2], seed=6)
    aux, positions, slots = scen.flat_context()
    loaded.inject_kv(aux, positions, slots, scen.pool)
    ctx, pos = scen.block_context(cfg.gamma)
    z = torch.zeros(2, dtype=torch.int64)
    proposal = loaded.propose(z, ctx, pos, torch.tensor([0.0, 1.0]), z, z)
    assert proposal.draft_tokens.shape == (2, cfg.gamma) and torch.isfinite(proposal.draft_logits).all()


def test_an_encoding_that_does_not_match_the_file_is_refused(tmp_path: Path) -> None:
    drafter, _ = make_drafter(tiny_config())
    save_drafter(tmp_path, drafter, weight_encoding="int8")
    doc = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**doc, "weight_encoding": "plain"}))
    with pytest.raises(ValueError, match="int8 tensors in a checkpoint whose weight_encoding is 'plain'"):
        load_drafter(tmp_path, tiny_target(), "cpu", torch.float32)
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**doc, "weight_encoding": "fp4"}))
    with pytest.raises(ValueError, match="weight_encoding 'fp4'"):
        load_drafter(tmp_path, tiny_target(), "cpu", torch.float32)
