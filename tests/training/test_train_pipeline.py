"""`dspark-serve train-drafter` end to end on CPU: a tiny Hugging Face target directory (random
weights, character tokenizer, ChatML template) -> prompts answered by the target -> training
-> held-out acceptance -> a drafter checkpoint the engine loads; then --resume reuses it all."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import save_hf_target, tiny_target, tiny_target_config

from engine.speculative.checkpoint import load_drafter, read_drafter_config
from services.cli import build_parser, main
from training.command import run_config
from training.pipeline import RunConfig


@pytest.fixture(scope="module")
def hf_target(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("tiny-hf")
    config = tiny_target_config()
    save_hf_target(directory, tiny_target(config, seed=7), config)
    return directory, config


ARGS = [
    "--device",
    "cpu",
    "--generator",
    "dense",
    "--num-prompts",
    "40",
    "--temperatures",
    "0,0.7",
    "--max-new-tokens",
    "24",
    "--max-prompt-tokens",
    "160",
    "--chunk-size",
    "32",
    "--heldout-permille",
    "150",
    "--steps",
    "30",
    "--batch-size",
    "8",
    "--anchors-per-seq",
    "8",
    "--gamma",
    "4",
    "--markov-rank",
    "8",
    "--lr",
    "3e-3",
    "--warmup-steps",
    "5",
    "--checkpoint-every",
    "20",
    "--eval-sequences",
    "12",
    "--target-name",
    "tiny-hf",
    "--no-progress",
    "--log-level",
    "WARNING",
]


def test_cli_trains_a_loadable_drafter_and_resumes(hf_target, tmp_path, capsys) -> None:
    directory, config = hf_target
    out = tmp_path / "drafter"
    assert main(["train-drafter", "--model", str(directory), "--out", str(out), *ARGS]) == 0
    assert "drafter written to" in capsys.readouterr().out
    drafter_config, training = read_drafter_config(out)
    assert drafter_config.target_name == "tiny-hf" and drafter_config.gamma == 4
    assert drafter_config.markov_rank == 8 and drafter_config.num_layers == 1
    assert training["train"]["steps_done"] == 30 and training["partial"] is False
    assert training["data"]["sequences"] > 40 and training["data"]["heldout_sequences"] > 0
    assert training["initialised_from_target_layers"] == [1]
    acceptance = training["acceptance"]
    assert 1.0 <= acceptance["greedy_accept_len"] <= 5.0 and len(acceptance["greedy_per_position"]) == 4
    assert acceptance["sampled_anchors"] > 0
    drafter, _ = load_drafter(out, config, "cpu", torch.float32)
    assert next(drafter.parameters()).dtype == torch.float32
    from safetensors import safe_open

    with safe_open(str(out / "drafter.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118

    work = tmp_path / "drafter-work"
    assert (work / "train_state.pt").is_file() and (work / "report.json").is_file()
    shards = sorted(p.name for p in (work / "data").iterdir())
    # Without --resume an existing run is refused; with it, data and training state are reused.
    assert main(["train-drafter", "--model", str(directory), "--out", str(out), *ARGS]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["train-drafter", "--model", str(directory), "--out", str(out), "--resume", *ARGS]) == 0
    again = json.loads((work / "report.json").read_text())
    assert "generation" not in again["data"]  # nothing was generated again
    assert again["train"]["steps_done"] == 30
    assert sorted(p.name for p in (work / "data").iterdir()) == shards


def test_env_variables_set_options() -> None:
    env = {
        "DSPARK_TRAIN_OUT": "/tmp/d",
        "DSPARK_TRAIN_MAX_MINUTES": "7.5",
        "DSPARK_TRAIN_TEMPERATURES": "0,0.9",
        "DSPARK_TRAIN_RESUME": "1",
        "DSPARK_TRAIN_NO_PROGRESS": "true",
    }
    config = run_config(build_parser(env).parse_args(["train-drafter", "--gamma", "5"]))
    assert isinstance(config, RunConfig)
    assert config.out == "/tmp/d" and config.max_minutes == 7.5 and config.resume and not config.progress
    assert config.generation.temperatures == (0.0, 0.9) and config.gamma == 5
    del env["DSPARK_TRAIN_MAX_MINUTES"]
    args = build_parser(env).parse_args(["train-drafter"])
    with pytest.raises(ValueError, match="max-minutes"):
        run_config(args)


def test_cli_warm_starts_a_deeper_drafter_and_writes_int8(hf_target, tmp_path, capsys) -> None:
    """--init-from a 1-layer checkpoint with --layers 2: the trained layer is kept, the new one
    starts as an identity; --weight-encoding int8 stores the matrices as int8 that load back."""
    directory, config = hf_target
    first, second = tmp_path / "one-layer", tmp_path / "two-layers"
    model = ["--model", str(directory)]
    assert main(["train-drafter", *model, "--out", str(first), *ARGS]) == 0
    warm = ["--init-from", str(first), "--layers", "2", "--weight-encoding", "int8"]
    assert main(["train-drafter", *model, "--out", str(second), *ARGS, *warm]) == 0
    assert "drafter written to" in capsys.readouterr().out
    drafter_config, training = read_drafter_config(second)
    assert drafter_config.num_layers == 2 and training["weight_encoding"] == "int8"
    assert training["initialised_from_drafter"] == {
        "checkpoint": str(first),
        "layers_copied": 1,
        "layers_added": [1],
    }
    assert training["acceptance"]["greedy_verifies"] > 0
    from safetensors import safe_open

    with safe_open(str(second / "drafter.safetensors"), "pt") as f:
        stored = {k: f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118
    assert stored["fc.weight"] == torch.int8 and stored["norm.weight"] == torch.bfloat16
    drafter, _ = load_drafter(second, config, "cpu", torch.float32)
    assert drafter.fc.weight.dtype == torch.float32 and torch.count_nonzero(drafter.layers[1].down_proj.weight) > 0
