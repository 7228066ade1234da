"""Checks `dspark-serve worker` makes before it starts any engine: the GPUs its pod was given
are visible, and the drafter speculative decoding will use exists and fits the model. Each
failure is a SystemExit with a one-line message, so the container exits non-zero with the
reason in its log instead of serving on CPU or failing inside a Ray actor."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import EngineConfig

PREFIX = "dspark-serve worker: "


def _what_to_check(resource: str) -> str:
    if resource.startswith("amd.com/"):
        return (
            f"that the AMD device plugin advertises {resource} on the node, that /dev/kfd and /dev/dri "
            "exist in the container, and that the chart value accelerator.vendors.amd.supplementalGroups holds "
            "the node's video and render group ids (`getent group render` on the node)"
        )
    if resource.startswith("nvidia.com/"):
        return (
            f"that the NVIDIA device plugin advertises {resource} on the node and that the pod runs "
            "with the NVIDIA container runtime (/dev/nvidia* in the container)"
        )
    return "the node's device plugin and the GPU device files in the container"


def require_visible_gpus(required: int, resource: str) -> None:
    """Exit unless torch sees at least `required` GPUs (0: no requirement). `resource` is the
    extended resource the pod requested them as (e.g. amd.com/gpu), named in the message."""
    if required <= 0:
        return
    import torch

    seen = torch.cuda.device_count()
    if seen >= required:
        return
    requested = f"{required} {resource}" if resource else f"{required} GPUs"
    raise SystemExit(
        f"{PREFIX}this container sees {seen} GPUs but its pod requests {requested} "
        f"(--require-gpus / DSPARK_REQUIRE_GPUS={required}); not starting a CPU engine. Check "
        f"{_what_to_check(resource)}"
    )


def check_speculative(config: EngineConfig) -> None:
    """Exit when speculative decoding is on and no drafter is found for the model, or the
    drafter was made for a target of another shape. Reads the drafter's drafter.json and the
    model's config (GGUF header or config.json), no weights."""
    if config.speculative is None:
        return
    from engine.loader.load import open_checkpoint
    from engine.speculative.checkpoint import DrafterMismatchError
    from engine.speculative.setup import check_drafter_fits, drafter_directory

    try:
        directory = drafter_directory(config.speculative, config.model)
    except ValueError as exc:
        raise SystemExit(f"{PREFIX}{exc}; set --drafter (DSPARK_DRAFTER) or --speculative off") from None
    try:
        check_drafter_fits(directory, config.model, open_checkpoint(config.model).config)
    except (DrafterMismatchError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"{PREFIX}{exc}") from None
