"""Compile the C kernels of this folder at first use and load them with ctypes.

Each `<name>.c` becomes one shared library, built with the system C compiler (`$CC`, else
`cc`) for this CPU (`-march=native`), or for the lower level `DSPARK_CPU_ISA` caps it at
(isa.py), with OpenMP, and cached under `$DSPARK_CACHE_DIR/cpu-kernels` (default
`~/.cache/dspark-serve`), keyed by a hash of the sources (every .c and .h of this folder, so
an edited shared header such as kernel_signatures.h rebuilds every library), the flags, the
level, the compiler and the CPU's flags, so a change to any of them builds again. Only CPU
processes build them (Triton needs a C compiler at run time anyway, for its launchers); a CPU
install without a compiler falls back to the torch path (`load` returns None and says why,
once).

The library links OpenMP by its soname, libgomp.so.1; torch has loaded its own copy by that
name already, so the kernels share torch's thread pool instead of starting a second one.
`DSPARK_CPU_KERNELS=0` turns the kernels off; a comma-separated list of names
(`attention,elementwise,gemm,gemv,quant_gemm,decoder`: the libraries of this folder) keeps only those.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.kernels.cpu import isa

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
# No -ffast-math: masked scores are -inf, which finite-math-only would be free to break.
# Reassociation alone lets the compiler vectorise the dot products and sums. The target flags
# (-march, vector width) come from isa.target().
CFLAGS = (
    "-O3", "-fPIC", "-shared", "-fopenmp", "-std=c11",
    "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
)  # fmt: skip


def enabled(name: str) -> bool:
    setting = os.environ.get("DSPARK_CPU_KERNELS", "1").strip().lower()
    if setting in ("1", "true", "yes", "on"):
        return True
    if setting in ("0", "false", "no", "off"):
        return False
    return name in {part.strip() for part in setting.split(",")}


def cache_dir() -> Path:
    root = os.environ.get("DSPARK_CACHE_DIR") or Path.home() / ".cache" / "dspark-serve"
    return Path(root) / "cpu-kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _flags(target: isa.Target) -> tuple[str, ...]:
    return (*CFLAGS, *target.compile_flags())


def compile_command(name: str, compiler: str, target: isa.Target, output: Path) -> list[str]:
    """The command that builds `<name>.c` of this folder into the shared library `output` with
    `compiler` for `target`: what `load` runs, and what tests/cpu_kernels/test_arm64_build.py
    runs with a cross compiler for isa.resolve's ARM64 target."""
    source = str(SOURCE_DIR / f"{name}.c")
    return [compiler, *_flags(target), "-I", str(SOURCE_DIR), source, "-o", str(output), "-lm"]


def _library_path(name: str, compiler: str, target: isa.Target) -> Path:
    digest = hashlib.sha256()
    cpu = isa.cpu_flags() or frozenset()
    for part in (*_flags(target), f"level={target.level}", compiler, " ".join(sorted(cpu))):
        digest.update(part.encode())
    for source in sorted(SOURCE_DIR.glob("*.[ch]")):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return cache_dir() / f"{name}-{digest.hexdigest()[:16]}.so"


def _build(name: str, compiler: str, target: isa.Target, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        partial = Path(tmp) / path.name
        command = compile_command(name, compiler, target, partial)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise OSError(f"{' '.join(command)} failed:\n{result.stderr.strip()}")
        os.replace(partial, path)  # atomic: a concurrent builder sees a whole library or none


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The compiled `<name>.c` of this folder, built now if its cache entry is missing; None
    when the kernels are off or cannot be built here (logged once)."""
    if not enabled(name):
        return None
    compiler = _compiler()
    if compiler is None:
        logger.warning("no C compiler found ($CC, cc, gcc): CPU kernels %s fall back to torch", name)
        return None
    target = isa.target()
    path = _library_path(name, compiler, target)
    try:
        if not path.exists():
            _build(name, compiler, target, path)
        return ctypes.CDLL(str(path))
    except OSError as exc:
        logger.warning("CPU kernels %s fall back to torch: %s", name, exc)
        return None


def bind(library: ctypes.CDLL, name: str, argtypes: Sequence[Any], restype: Any = None) -> Callable[..., Any]:
    """`library`'s function `name`, with its C signature declared (ctypes then converts and
    checks every argument instead of guessing)."""
    function = getattr(library, name)
    function.argtypes = list(argtypes)
    function.restype = restype
    return function
