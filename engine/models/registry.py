"""Architecture registry: `ModelConfig.architecture` → model class, one file per family.

A family module registers its class with `@register_model("key", ...)`; the loaders fill
`ModelConfig.architecture` with one of those keys (from config.json's `model_type` or the
GGUF `general.architecture`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

from torch import nn

from engine.config import ModelConfig

ModelClass = TypeVar("ModelClass", bound=type[nn.Module])

# Modules imported on the first lookup so that their @register_model decorators run.
_FAMILY_MODULES = ("engine.models.llama",)
_registry: dict[str, type[nn.Module]] = {}
_families_imported = False


def register_model(*names: str) -> Callable[[ModelClass], ModelClass]:
    def decorate(cls: ModelClass) -> ModelClass:
        for name in names:
            if name in _registry and _registry[name] is not cls:
                raise ValueError(f"architecture {name!r} is already registered to {_registry[name].__name__}")
            _registry[name] = cls
        return cls

    return decorate


def _import_families() -> None:
    global _families_imported
    if not _families_imported:
        for module in _FAMILY_MODULES:
            importlib.import_module(module)
        _families_imported = True


def supported_architectures() -> tuple[str, ...]:
    _import_families()
    return tuple(sorted(_registry))


def get_model_class(config: ModelConfig) -> type[nn.Module]:
    _import_families()
    try:
        return _registry[config.architecture]
    except KeyError:
        raise ValueError(
            f"unsupported model architecture {config.architecture!r}; supported: {', '.join(supported_architectures())}"
        ) from None
