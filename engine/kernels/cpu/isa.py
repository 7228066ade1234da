"""The instruction sets the CPU kernels of this folder may use: what the CPU reports, capped by
`DSPARK_CPU_ISA`.

`DSPARK_CPU_ISA` takes one of the levels below, lowest first; unset, empty or `native` means
no cap (whatever the CPU reports). A cap below the CPU's level builds the kernels for that
level and switches off at run time what it lacks (the AMX tile kernels below `amx`), so the
fallbacks can be run, and tested, on a bigger CPU. A cap above the CPU's level is clamped to
it (logged once). An unknown name is a configuration error.

- `portable`: no target flags: the compiler's baseline (SSE2 on x86-64), the build every other
  architecture (ARM64) gets; the kernels take their plain-C paths.
- `avx2`: x86-64-v3 (AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE).
- `avx512`: x86-64-v4 (x86-64-v3 and AVX-512 F, BW, CD, DQ, VL).
- `avx512bf16`: x86-64-v4 and AVX512-BF16.
- `amx`: x86-64-v4, AVX512-BF16, AMX-TILE and AMX-BF16 (the tile kernels of gemm.c and
  attention_amx.h).

The kernels choose their code by the build's macros (gemv.c: AVX-512 with vdpbf16ps where
AVX512-BF16 is there, AVX-512, AVX2 + FMA, or portable vector C), so what the CPU reports
decides at first use, when the libraries are built.

The compiler targets the psABI levels (`-march=x86-64-v3`, `-march=x86-64-v4`, gcc >= 11,
clang >= 12) rather than CPU names (haswell, skylake-avx512, cooperlake), because a level is
exactly the feature list checked here, while a CPU name also enables extensions (ADX, CLWB,
PKU, SGX, ...) that a virtual machine may hide. Uncapped, or capped at or above the CPU's own
level, the kernels are built for this CPU (`-march=native`), as without the variable. Where
an x86 CPU's flags cannot be read (no /proc/cpuinfo), a cap is taken as given. Other
architectures (ARM64) get a portable build: no target flags, and no level but `portable`.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

ENV = "DSPARK_CPU_ISA"
PORTABLE = "portable"  # not an x86-64 CPU with AVX2, or not x86 at all
LEVELS = (PORTABLE, "avx2", "avx512", "avx512bf16", "amx")  # lowest first; each includes the ones before
_UNCAPPED = ("", "native")

# /proc/cpuinfo flags each level adds to the one before (LZCNT is reported as abm).
_REQUIRED: dict[str, frozenset[str]] = {
    "avx2": frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    "avx512bf16": frozenset({"avx512_bf16"}),
    "amx": frozenset({"amx_tile", "amx_bf16"}),
}
# Compiler target flags of a level below the CPU's own.
_MARCH: dict[str, tuple[str, ...]] = {
    PORTABLE: (),
    "avx2": ("-march=x86-64-v3",),
    "avx512": ("-march=x86-64-v4",),
    "avx512bf16": ("-march=x86-64-v4", "-mavx512bf16"),
    "amx": ("-march=native",),  # the top level: no cap
}


@dataclass(frozen=True)
class Target:
    """What the kernels are built for. `level` is None where an x86 CPU's flags could not be
    read (no /proc/cpuinfo) and nothing caps it: the build is native and every level counts as
    allowed (the C code checks its own macros)."""

    level: str | None
    march: tuple[str, ...]  # the compiler's target flags

    def allows(self, level: str) -> bool:
        return self.level is None or LEVELS.index(self.level) >= LEVELS.index(level)

    def compile_flags(self) -> tuple[str, ...]:
        """`march`, and 512-bit vectors preferred where AVX-512 is there to use (gcc's default
        for x86-64-v4 is 256)."""
        wide = self.march and self.allows("avx512")
        return self.march + (("-mprefer-vector-width=512",) if wide else ())


def is_x86(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags as Linux reports them; None where they cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return None


def cpu_level(flags: frozenset[str]) -> str:
    """The highest level whose features `flags` (of an x86 CPU) all include."""
    level = PORTABLE
    for candidate in LEVELS[1:]:
        if not _REQUIRED[candidate] <= flags:
            break
        level = candidate
    return level


def parse(value: str | None) -> str | None:
    """`DSPARK_CPU_ISA`'s value -> the level it caps at, None for no cap."""
    name = (value or "").strip().lower()
    if name in _UNCAPPED:
        return None
    if name not in LEVELS:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(('native', *LEVELS))}")
    return name


def resolve(cap: str | None, machine: str, flags: frozenset[str] | None) -> Target:
    """The target for a cap (parse()) on a CPU of `machine` with `flags` (None: unknown)."""
    if not is_x86(machine):
        return Target(PORTABLE, ())
    if flags is None:
        if cap is None:
            return Target(None, ("-march=native",))
        return Target(cap, _MARCH[cap])  # nothing to clamp against: the cap is taken as given
    own = cpu_level(flags)
    if cap is None or LEVELS.index(cap) >= LEVELS.index(own):
        return Target(own, ("-march=native",))
    return Target(cap, _MARCH[cap])


def target() -> Target:
    """The target of this process: `DSPARK_CPU_ISA` on this CPU."""
    return _target(os.environ.get(ENV))


@functools.cache
def _target(value: str | None) -> Target:
    cap = parse(value)
    chosen = resolve(cap, platform.machine(), cpu_flags() if is_x86() else None)
    if cap is not None and chosen.level != cap:
        logger.warning("%s=%s is above what this CPU reports: CPU kernels built for %s", ENV, value, chosen.level)
    return chosen


def levels_below_cpu() -> tuple[str, ...]:
    """The caps that change what this CPU builds: the levels from portable up to, not
    including, its own (none off x86 or where its flags cannot be read)."""
    flags = cpu_flags() if is_x86() else None
    if flags is None:
        return ()
    return LEVELS[: LEVELS.index(cpu_level(flags))]
