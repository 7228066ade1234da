"""DSPARK_CPU_ISA (engine/kernels/cpu/isa.py): parsing, clamping to what the CPU reports, the
compiler flags chosen per level, and a cache entry of the kernels per level."""

from __future__ import annotations

import logging

import pytest

from engine.kernels.cpu import build, isa

AVX2 = isa._REQUIRED["avx2"]
AVX512 = AVX2 | isa._REQUIRED["avx512"]
AVX512BF16 = AVX512 | isa._REQUIRED["avx512bf16"]
AMX = AVX512BF16 | isa._REQUIRED["amx"]
CPUS = {
    isa.PORTABLE: frozenset({"sse4_2", "avx"}),
    "avx2": AVX2,
    "avx512": AVX512,
    "avx512bf16": AVX512BF16,
    "amx": AMX,
}
LOWER = ("avx2", "avx512", "avx512bf16")


@pytest.mark.parametrize("value", [None, "", "native", " Native "])
def test_unset_or_native_is_no_cap(value):
    assert isa.parse(value) is None


@pytest.mark.parametrize("value", ["portable", "avx2", "AVX512", "avx512bf16", " amx "])
def test_levels_parse(value):
    assert isa.parse(value) == value.strip().lower()


@pytest.mark.parametrize("value", ["avx-512", "sse4", "neon", "1"])
def test_unknown_level_is_a_configuration_error(value):
    with pytest.raises(ValueError, match="DSPARK_CPU_ISA"):
        isa.parse(value)


@pytest.mark.parametrize("level", list(CPUS))
def test_cpu_level_is_the_highest_whose_flags_are_all_there(level):
    assert isa.cpu_level(CPUS[level]) == level


def test_a_level_needs_every_flag_of_the_ones_below():
    assert isa.cpu_level(AVX512BF16 - {"avx512vl"}) == "avx2"
    assert isa.cpu_level(AMX - {"fma"}) == isa.PORTABLE


def test_below_the_cpus_level_the_psabi_level_is_targeted():
    flags = {cap: isa.resolve(cap, "x86_64", AMX).compile_flags() for cap in isa.LEVELS[:-1]}
    assert flags[isa.PORTABLE] == ()  # the compiler's baseline
    assert flags["avx2"] == ("-march=x86-64-v3",)  # 256-bit vectors: no AVX-512 to prefer
    assert flags["avx512"] == ("-march=x86-64-v4", "-mprefer-vector-width=512")
    assert flags["avx512bf16"] == ("-march=x86-64-v4", "-mavx512bf16", "-mprefer-vector-width=512")
    assert isa.resolve("avx512", "x86_64", AMX).level == "avx512"


@pytest.mark.parametrize("cpu", list(CPUS))
@pytest.mark.parametrize("cap", [None, "amx"])
def test_no_cap_or_one_at_or_above_the_cpu_builds_native_at_the_cpus_level(cpu, cap):
    target = isa.resolve(cap, "x86_64", CPUS[cpu])
    assert target.level == cpu and target.march == ("-march=native",)
    assert ("-mprefer-vector-width=512" in target.compile_flags()) == target.allows("avx512")


def test_a_cap_above_the_cpu_is_clamped_and_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(isa, "cpu_flags", lambda: AVX2)
    monkeypatch.setattr(isa.platform, "machine", lambda: "x86_64")
    isa._target.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=isa.__name__):
            targets = [isa._target("amx") for _ in range(3)]
        assert {t.level for t in targets} == {"avx2"} and not targets[0].allows("avx512")
        assert len([r for r in caplog.records if "above what this CPU reports" in r.message]) == 1
    finally:
        isa._target.cache_clear()


def test_allows_orders_the_levels():
    target = isa.Target("avx512", ("-march=x86-64-v4",))
    assert target.allows("avx2") and target.allows("avx512")
    assert not target.allows("avx512bf16") and not target.allows("amx")
    assert isa.Target(None, ("-march=native",)).allows("amx")  # unknown CPU: the C macros decide


def test_unreadable_flags_take_the_cap_as_given():
    assert isa.resolve(None, "x86_64", None) == isa.Target(None, ("-march=native",))
    assert isa.resolve("avx2", "x86_64", None) == isa.Target("avx2", ("-march=x86-64-v3",))


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "ppc64le"])
@pytest.mark.parametrize("cap", [None, "avx2", "amx"])
def test_other_architectures_get_a_portable_build(machine, cap):
    target = isa.resolve(cap, machine, None)
    assert target == isa.Target(isa.PORTABLE, ()) and target.compile_flags() == ()
    assert not target.allows("avx2")


def test_each_level_has_its_own_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path))
    targets = [isa.resolve(cap, "x86_64", AMX) for cap in (*isa.LEVELS, None)]
    paths = {build._library_path("gemm", "cc", target) for target in targets}
    # portable, avx2, avx512, avx512bf16 apart; amx and no cap are the same native build
    assert len(paths) == 5 and all(p.parent == tmp_path / "cpu-kernels" for p in paths)


def test_the_process_target_reads_the_variable(monkeypatch):
    monkeypatch.setenv(isa.ENV, "avx2")
    if isa.is_x86() and isa.cpu_level(isa.cpu_flags() or frozenset()) != isa.PORTABLE:
        assert isa.target().level == "avx2" and not isa.target().allows("amx")
    monkeypatch.setenv(isa.ENV, "bogus")
    with pytest.raises(ValueError):
        isa.target()


@pytest.mark.parametrize(
    ("cpu", "below"),
    [("avx2", (isa.PORTABLE,)), ("avx512bf16", (isa.PORTABLE, "avx2", "avx512")), ("amx", (isa.PORTABLE, *LOWER))],
)
def test_levels_below_the_cpu(monkeypatch, cpu, below):
    monkeypatch.setattr(isa, "cpu_flags", lambda: CPUS[cpu])
    monkeypatch.setattr(isa.platform, "machine", lambda: "x86_64")
    assert isa.levels_below_cpu() == below
    monkeypatch.setattr(isa.platform, "machine", lambda: "aarch64")
    assert isa.levels_below_cpu() == ()
