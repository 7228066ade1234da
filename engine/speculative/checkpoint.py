"""The drafter checkpoint format: a directory holding

- `drafter.safetensors`: the drafter's own parameters, named as in `DSparkDrafter`'s
  state_dict (the shared embedding and LM head are the target's and are not stored), each
  in its own dtype or, with `weight_encoding: "int8"`, its matrices as int8 with per-group
  scales (engine.speculative.weight_encoding);
- `drafter.json`: `{"format": "dspark-drafter", "format_version": 1, "config": DrafterConfig,
  "weight_encoding": "plain" | "int8", "training": {...}}`, where `training` is free-form
  metadata of the run that made it (data, steps, loss, acceptance measured), kept for
  provenance and never interpreted. A missing `weight_encoding` means "plain".

A drafter reads the hidden states of one target, so loading checks the target identity
recorded in the config against the target actually served.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig
from engine.speculative.drafter import DSparkDrafter
from engine.speculative.drafter_config import DrafterConfig
from engine.speculative.weight_encoding import WEIGHT_ENCODINGS, WeightEncoding, decode_state, encode_state

FORMAT_NAME = "dspark-drafter"
FORMAT_VERSION = 1
WEIGHTS_FILE = "drafter.safetensors"
CONFIG_FILE = "drafter.json"


class DrafterMismatchError(ValueError):
    """The drafter was trained for a different target than the one being served."""


def save_drafter(
    directory: str | Path,
    drafter: DSparkDrafter,
    config: DrafterConfig | None = None,
    training: Mapping[str, Any] | None = None,
    weight_encoding: WeightEncoding = "plain",
) -> Path:
    """Write `drafter` (and `config`, default drafter.config) into `directory`, created if
    needed, its tensors stored as `weight_encoding` says; returns the directory."""
    config = config if config is not None else drafter.config
    if config != drafter.config:
        raise ValueError("save_drafter: config differs from the drafter's own config")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = encode_state(drafter.state_dict(), weight_encoding)
    save_file(
        tensors,
        str(out / WEIGHTS_FILE),
        metadata={
            "format": FORMAT_NAME,
            "format_version": str(FORMAT_VERSION),
            "weight_encoding": weight_encoding,
        },
    )
    document = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "weight_encoding": weight_encoding,
        "training": dict(training or {}),
    }
    (out / CONFIG_FILE).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return out


def read_drafter_config(directory: str | Path) -> tuple[DrafterConfig, dict[str, Any]]:
    """(DrafterConfig, training metadata) of a checkpoint directory."""
    config, training, _ = read_drafter_document(directory)
    return config, training


def read_drafter_document(directory: str | Path) -> tuple[DrafterConfig, dict[str, Any], WeightEncoding]:
    """(DrafterConfig, training metadata, weight encoding) of a checkpoint directory."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no drafter checkpoint at {directory}: {CONFIG_FILE} is missing")
    document = json.loads(path.read_text())
    if document.get("format") != FORMAT_NAME:
        raise ValueError(f"{path}: not a {FORMAT_NAME} checkpoint (format={document.get('format')!r})")
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {version!r} is not supported (this build reads {FORMAT_VERSION})")
    encoding = document.get("weight_encoding", "plain")
    if encoding not in WEIGHT_ENCODINGS:
        raise ValueError(f"{path}: weight_encoding {encoding!r} is not one of {WEIGHT_ENCODINGS}")
    return DrafterConfig.from_dict(document["config"]), dict(document.get("training") or {}), encoding


def check_target(config: DrafterConfig, target: ModelConfig) -> None:
    """Raise DrafterMismatchError unless `config` was made for a target shaped like `target`:
    the drafter embeds tokens and scores drafts through the target's embedding and LM head
    (vocabulary and hidden size) and reads the residual streams of `capture_layers`, ids that
    DrafterConfig keeps below `target_num_layers`, so equal layer counts make them exist."""
    pairs = (
        ("vocabulary size", config.target_vocab_size, target.vocab_size),
        ("hidden size", config.target_hidden_size, target.hidden_size),
        ("layer count", config.target_num_layers, target.num_layers),
    )
    for what, trained, served in pairs:
        if trained != served:
            raise DrafterMismatchError(
                f"drafter was trained for target {config.target_name!r} with {what} {trained}, "
                f"but the served model has {what} {served}"
            )


def load_drafter(
    directory: str | Path, target_config: ModelConfig, device: torch.device | str, dtype: torch.dtype
) -> tuple[DSparkDrafter, DrafterConfig]:
    """Load a checkpoint for `target_config` onto `device` in `dtype` (RoPE tables stay
    float32), in eval mode without gradients. The drafter still needs
    `bind_target(embed, lm_head)` before it can draft."""
    config, _ = read_drafter_config(directory)
    check_target(config, target_config)
    with torch.device(device):
        drafter = DSparkDrafter(config)
    state = read_drafter_state(directory, device, dtype)
    weights_path = Path(directory) / WEIGHTS_FILE
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{weights_path}: missing tensors {missing[:4]}, unexpected tensors {unexpected[:4]}")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{weights_path}: {name} has shape {tuple(tensor.shape)}, "
                f"the config implies {tuple(expected[name].shape)}"
            )
    drafter.load_state_dict(state)
    drafter.requires_grad_(False)  # served: no autograd graphs (training turns it back on)
    drafter.to(dtype=dtype)
    drafter.rotary_emb.cos_sin_cache = drafter.rotary_emb.cos_sin_cache.float()  # RoPE tables stay fp32
    return drafter.eval(), config


def read_drafter_state(
    directory: str | Path, device: torch.device | str, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors on `device`, int8-encoded ones decoded to `dtype` (the others
    in their stored dtype), named as in `DSparkDrafter.state_dict()`."""
    _, _, encoding = read_drafter_document(directory)
    weights_path = Path(directory) / WEIGHTS_FILE
    if not weights_path.is_file():
        raise FileNotFoundError(f"no drafter weights at {weights_path}")
    stored = load_file(str(weights_path), device=str(torch.device(device)))
    if encoding == "plain" and any(t.dtype == torch.int8 for t in stored.values()):
        raise ValueError(f"{weights_path}: int8 tensors in a checkpoint whose weight_encoding is 'plain'")
    return decode_state(stored, dtype)
