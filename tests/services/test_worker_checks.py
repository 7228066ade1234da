"""What `dspark-serve worker` checks before it starts an engine: the pod's GPUs are visible, and
the drafter exists and fits the model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig, SpeculativeConfig
from engine.loader.resolve import resolve_model
from engine.speculative.checkpoint import save_drafter
from engine.speculative.drafter import DSparkDrafter
from engine.speculative.drafter_config import DrafterConfig
from services.cli.worker_checks import check_speculative, require_visible_gpus

REPO = Path(__file__).resolve().parents[2]


def see_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def gpu_error(required: int, resource: str) -> str:
    with pytest.raises(SystemExit) as info:
        require_visible_gpus(required, resource)
    return str(info.value.code)


def test_fewer_gpus_than_requested_exits_naming_counts_resource_and_what_to_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    see_gpus(monkeypatch, 0)
    message = gpu_error(8, "amd.com/gpu")
    assert "sees 0 GPUs" in message and "requests 8 amd.com/gpu" in message
    for hint in ("device plugin", "/dev/kfd", "/dev/dri", "accelerator.vendors.amd.supplementalGroups"):
        assert hint in message
    assert "\n" not in message
    see_gpus(monkeypatch, 4)
    nvidia = gpu_error(8, "nvidia.com/gpu")
    assert "sees 4 GPUs" in nvidia and "requests 8 nvidia.com/gpu" in nvidia and "NVIDIA" in nvidia


def test_enough_gpus_or_no_requirement_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    see_gpus(monkeypatch, 8)
    require_visible_gpus(8, "amd.com/gpu")
    see_gpus(monkeypatch, 0)
    require_visible_gpus(0, "")


def spec_config(model: str, drafter: Path | None = None) -> EngineConfig:
    return EngineConfig(
        model=model, device="cpu", speculative=SpeculativeConfig(drafter=str(drafter) if drafter else None)
    )


def test_speculative_on_without_a_drafter_exits(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        check_speculative(spec_config(str(tmp_path / "other.gguf")))
    message = str(info.value.code)
    assert "no drafter ships with" in message and "other.gguf" in message and "DSPARK_DRAFTER" in message


def test_a_drafter_for_another_target_exits_naming_both(tmp_path: Path) -> None:
    """SmolLM2 (hidden 576, 30 layers) served with a drafter made for a tiny target."""
    config = DrafterConfig(
        target_name="tiny-target",
        target_vocab_size=49152,
        target_hidden_size=32,
        target_num_layers=6,
        mask_token_id=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        markov_rank=4,
        max_position=64,
    )
    drafter_dir = save_drafter(tmp_path / "drafter", DSparkDrafter(config), config)
    model = str(resolve_model("smollm2-135m").path)
    with pytest.raises(SystemExit) as info:
        check_speculative(spec_config(model, drafter_dir))
    message = str(info.value.code)
    assert str(drafter_dir) in message and model in message
    assert "hidden size 32" in message and "hidden size 576" in message


def test_the_shipped_drafter_fits_its_model_given_as_a_path() -> None:
    check_speculative(spec_config(str(resolve_model("smollm2-135m").path)))
    check_speculative(EngineConfig(model="smollm2-135m", device="cpu", speculative=None))


def test_the_worker_command_exits_before_touching_ray(tmp_path: Path) -> None:
    """What a pod's log shows: one line, non-zero status, no Ray connection attempted."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "CUDA_VISIBLE_DEVICES": "",
        "HIP_VISIBLE_DEVICES": "",
        "DSPARK_REQUIRE_GPUS": "8",
        "DSPARK_GPU_RESOURCE": "amd.com/gpu",
        "DSPARK_RAY_ADDRESS": str(tmp_path / "no-ray-here"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "worker"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("dspark-serve worker: this container sees 0 GPUs")
