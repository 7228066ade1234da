"""Which drafter a model gets: the shipped one for its alias or for a copy of the alias's GGUF
file (as a cluster mounts it), and a refusal naming both when a drafter does not fit."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from spec_helpers import make_drafter, tiny_config, tiny_target

from engine.config import SpeculativeConfig
from engine.loader.resolve import ALIASES, resolve_model, shipped_drafter
from engine.speculative.checkpoint import DrafterMismatchError, save_drafter
from engine.speculative.setup import check_drafter_fits, drafter_directory
from services.cli.options import add_engine_options, engine_config_from_args

ALIAS = "smollm2-135m"


@pytest.fixture(scope="module")
def shipped_file() -> Path:
    return resolve_model(ALIAS).path


def test_the_alias_and_a_copy_of_its_file_get_the_shipped_drafter(shipped_file: Path, tmp_path: Path) -> None:
    expected = shipped_drafter(ALIAS)
    assert expected is not None and (expected / "drafter.json").is_file()
    assert shipped_drafter(ALIAS.upper()) == expected
    assert shipped_drafter(str(shipped_file)) == expected
    # A model volume: the file under its own name, given as the file or as its directory.
    volume = tmp_path / "models"
    volume.mkdir()
    (volume / shipped_file.name).symlink_to(shipped_file)
    assert shipped_drafter(str(volume / shipped_file.name)) == expected
    assert shipped_drafter(str(volume)) == expected


def test_other_files_and_names_get_none(shipped_file: Path, tmp_path: Path) -> None:
    # Same name, other size: not the shipped model.
    (tmp_path / "fake").mkdir()
    fake = tmp_path / "fake" / ALIASES[ALIAS].filename
    fake.write_bytes(b"GGUF" + bytes(64))
    assert shipped_drafter(str(fake)) is None
    # Same bytes, other name.
    renamed = tmp_path / "renamed.gguf"
    renamed.symlink_to(shipped_file)
    assert shipped_drafter(str(renamed)) is None
    # A directory with two GGUF files names neither.
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / shipped_file.name).symlink_to(shipped_file)
    (tmp_path / "two" / "other.gguf").write_bytes(b"GGUF")
    assert shipped_drafter(str(tmp_path / "two")) is None
    for name in (str(tmp_path / "missing.gguf"), "HuggingFaceTB/SmolLM2-135M-Instruct", "llama"):
        assert shipped_drafter(name) is None


def test_auto_turns_speculative_on_for_the_mounted_file(shipped_file: Path) -> None:
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    args = parser.parse_args(["--model", str(shipped_file), "--device", "cpu", "--dtype", "bfloat16"])
    assert engine_config_from_args(args).speculative is not None


@pytest.mark.parametrize(
    ("served", "what"),
    [
        ({"vocab_size": 50}, "vocabulary size 48"),
        ({"hidden_size": 64}, "hidden size 32"),
        ({"num_layers": 3}, "layer count 6"),
    ],
)
def test_a_drafter_for_another_target_is_refused_naming_both(
    tmp_path: Path, served: dict[str, object], what: str
) -> None:
    cfg = tiny_config(capture_layers=(1, 4))
    drafter, _ = make_drafter(cfg)
    directory = save_drafter(tmp_path / "drafter", drafter)
    check_drafter_fits(directory, "/models/tiny", tiny_target())
    with pytest.raises(DrafterMismatchError) as info:
        check_drafter_fits(directory, "/models/tiny", tiny_target(**served))
    message = str(info.value)
    assert str(directory) in message and "'/models/tiny'" in message and what in message
    assert "\n" not in message


def test_a_drafter_must_be_named_or_shipped(tmp_path: Path) -> None:
    assert drafter_directory(SpeculativeConfig(drafter=str(tmp_path)), "/models/tiny") == tmp_path
    assert drafter_directory(SpeculativeConfig(), ALIAS) == shipped_drafter(ALIAS)
    with pytest.raises(ValueError, match="no drafter ships with '/models/tiny'"):
        drafter_directory(SpeculativeConfig(), "/models/tiny")


def test_the_shipped_drafter_fits_its_model() -> None:
    from engine.loader.load import open_checkpoint

    directory = shipped_drafter(ALIAS)
    assert directory is not None
    check_drafter_fits(directory, ALIAS, open_checkpoint(ALIAS).config)
