"""Every kernel source compiles without a warning under -Wall -Wextra at every ISA level the
engine builds for (engine/kernels/cpu/isa.py), this CPU's or not: a level's code paths are
only compiled where its macros are on, so a warning in the AMX or AVX2 branch shows only
when that level is the target. Syntax-only: what the compiler front end checks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from engine.kernels.cpu import build, isa

COMPILER = shutil.which("gcc") or shutil.which("cc")
EVERY_FEATURE = frozenset().union(*isa._REQUIRED.values())
TARGETS = {
    isa.PORTABLE: isa.Target(isa.PORTABLE, ()),
    **{level: isa.resolve(level, "x86_64", EVERY_FEATURE) for level in isa.LEVELS[1:-1]},
    "amx": isa.Target("amx", ("-march=sapphirerapids",)),  # the top level builds -march=native elsewhere
}

pytestmark = pytest.mark.skipif(COMPILER is None or not isa.is_x86(), reason="needs a C compiler on x86-64")


@pytest.mark.parametrize("level", list(TARGETS))
@pytest.mark.parametrize("source", sorted(p.stem for p in build.SOURCE_DIR.glob("*.c")))
def test_kernel_source_compiles_without_warnings(source: str, level: str, tmp_path: Path) -> None:
    assert COMPILER is not None
    command = build.compile_command(source, COMPILER, TARGETS[level], tmp_path / f"{source}.so")
    command += ["-Wall", "-Wextra", "-Werror", "-fsyntax-only"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stderr}"
