"""The CPU kernels built for ARM64 and run there, under user-mode emulation.

Every source of engine/kernels/cpu is cross-compiled by build.compile_command, the command
build.load runs, for the target isa.resolve gives an ARM64 machine (the portable level: no
target flags, so the kernels take their plain-C paths and GCC's generic vectors become NEON).
arm64_driver.c, cross-compiled too (with that folder on its include path, for the kernels'
signatures in kernel_signatures.h), opens the libraries with dlopen, runs their entry points on
the inputs written here (two OpenMP threads) and writes the outputs back; it runs under
qemu-aarch64 with Debian's ARM64 C library and libgomp. The outputs are held to the bounds of
the x86 tests: the linear products to the summation bound of test_cpu_gemv.py (fp32, bf16) or
test_quant_gemm.py (Q8_0, Q4_1), the SwiGLU forms to silu_and_mul of the same run's product,
the elementwise kernels to test_cpu_elementwise.py's tolerances, attention to
attention_cases.py's; dequantised rows and stored cache rows bit for bit.

Skips where the cross compiler, the ARM64 C library and libgomp, or qemu-aarch64 are missing;
`make test-arm64` installs them (Debian packages) and runs this file. Each test prints the
largest error of its kernels against the reference (`pytest -rP` shows it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from test_cpu_elementwise import close
from test_cpu_gemv import assert_within_sum_bound
from test_quant_gemm import assert_within_summation_order, random_blocks

from engine.kernels.activation import silu_and_mul_torch
from engine.kernels.cpu import build, gemv, isa
from engine.kernels.cpu.quant_gemm import FORMATS, dequantize_torch, linear_q_torch
from engine.kernels.norm import add_rms_norm_torch, rms_norm_torch
from engine.kernels.rope import rope_tables_torch, rotate_torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "attention"))
from attention_cases import (  # noqa: E402
    AttentionCase,
    make_case,
    reference_attention,
    scenario_case,
    stored_caches_float64,
    tolerance,
)

CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's ARM64 cross C library and libgomp
DRIVER = Path(__file__).with_name("arm64_driver.c")
ARM64 = isa.resolve(None, "aarch64", None)  # what an ARM64 machine builds: the portable level
EM_AARCH64 = 183  # ELF e_machine of ARM64
RUN_TIMEOUT_S = 120

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
ROWS = [1, 3, 16]  # a decode row, a row-block tail of the portable path, a decode batch
SHAPES = [(256, 576), (64, 1536)]  # (N, K): SmolLM2's hidden size and its MLP width
SEED = 19 + int(os.environ.get("DSPARK_TEST_SEED", "0"))


def missing_tools() -> list[str]:
    tools = [tool for tool in (CROSS_CC, QEMU) if shutil.which(tool) is None]
    files = [SYSROOT / "include" / "stdio.h", SYSROOT / "lib" / "libgomp.so.1"]
    return tools + [str(path) for path in files if not path.exists()]


pytestmark = pytest.mark.skipif(
    bool(missing_tools()),
    reason=f"no ARM64 cross compiler, C library or emulator (missing {', '.join(missing_tools())}): "
    "`make test-arm64` installs them",
)


@dataclass
class Case:
    """One line of the driver's cases.txt and the inputs it reads."""

    op: str  # arm64_driver.c's op: linear, quant, rows, norm, silu, rope, attention
    kind: str  # f32 or bf16 (the activations), or q8_0 or q4_1 (the block format)
    name: str
    sizes: tuple[int, ...]
    inputs: dict[str, torch.Tensor]
    scalar: float | None = None  # eps or scale, passed exactly as a hex float
    attention: AttentionCase | None = None  # the forward an attention case runs, for its reference

    def line(self) -> str:
        scalar = [] if self.scalar is None else [float(self.scalar).hex()]
        return " ".join([self.op, self.kind, self.name, *map(str, self.sizes), *scalar])


@dataclass
class Arm64Run:
    libraries: Path
    data: Path
    report: str  # the driver's stdout
    cases: list[Case]

    def output(self, case: Case, array: str, dtype: torch.dtype, *shape: int) -> torch.Tensor:
        raw = np.fromfile(self.data / f"{case.name}.{array}", dtype=np.int16 if dtype == torch.bfloat16 else np.float32)
        values = torch.from_numpy(raw)
        return (values.view(torch.bfloat16) if dtype == torch.bfloat16 else values).view(*shape)

    def of(self, op: str) -> list[Case]:
        return [case for case in self.cases if case.op == op]


def write(path: Path, tensor: torch.Tensor) -> None:
    tensor = tensor.contiguous()
    (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy().tofile(path)


class ErrorLog:
    """The largest error of each kernel against its reference over the cases of a test, and
    the largest |reference| value beside it, printed at the end of the test."""

    def __init__(self) -> None:
        self.worst: dict[str, tuple[float, float]] = {}

    def add(self, kernel: str, got: torch.Tensor, expected: torch.Tensor) -> None:
        error = (got.double() - expected.double()).abs().nan_to_num(0.0).max().item()
        scale = expected.double().abs().nan_to_num(0.0).max().item()
        previous = self.worst.get(kernel, (0.0, 0.0))
        self.worst[kernel] = (max(previous[0], error), max(previous[1], scale))

    def print(self) -> None:
        for kernel, (error, scale) in self.worst.items():
            print(f"arm64 {kernel}: max |error| {error:.3g} (largest |reference| {scale:.3g})")


def linear_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for kind, dtype in DTYPES.items():
        for n, k in SHAPES:
            weight = torch.randn(n, k, generator=gen).to(dtype)
            # [gate | up] -> 16 gate then their 16 up columns per panel (gemv.pack_gated's order)
            blocks = n // (2 * gemv.GATED_COLUMNS)
            gated = weight.reshape(2, blocks, gemv.GATED_COLUMNS, k).transpose(0, 1).reshape(n, k)
            bias = torch.randn(n, generator=gen).to(dtype)
            for m in ROWS:
                x = torch.randn(m, k, generator=gen).to(dtype)
                inputs = {"x": x, "weight": weight, "gated": gated, "bias": bias}
                cases.append(Case("linear", kind, f"linear-{kind}-{m}x{n}x{k}", (m, n, k), inputs))
    return cases


def quant_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for fmt in FORMATS:
        for n, k in SHAPES:
            weight = random_blocks(fmt, n, k, rng)
            bias = torch.from_numpy(rng.standard_normal(n, dtype=np.float32))
            for m in ROWS:
                x = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
                inputs = {"x": x, "weight": weight, "bias": bias}
                cases.append(Case("quant", fmt.lower(), f"quant-{fmt}-{m}x{n}x{k}", (m, n, k), inputs))
        weight = random_blocks(fmt, 100, 576, rng)
        ids = torch.from_numpy(rng.integers(0, 100, 7))
        cases.append(Case("rows", fmt.lower(), f"rows-{fmt}", (7, 100, 576), {"weight": weight, "ids": ids}))
    return cases


def elementwise_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for kind, dtype in DTYPES.items():
        for rows in (1, 16):
            x, residual = (torch.randn(rows, 576, generator=gen).to(dtype) for _ in range(2))
            weight = (1 + 0.1 * torch.randn(576, generator=gen)).to(dtype)
            inputs = {"x": x, "residual": residual, "weight": weight}
            cases.append(Case("norm", kind, f"norm-{kind}-{rows}", (rows, 576), inputs, scalar=1e-5))
        gate_up = (4 * torch.randn(16, 2 * 1536, generator=gen)).to(dtype)
        gate_up[0, :8] = torch.tensor([-100.0, -88.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 100.0])  # tails of exp
        cases.append(Case("silu", kind, f"silu-{kind}", (16, 1536), {"x": gate_up}))
        for rope_dim in (64, 32):  # whole head, and a partial rotation
            q = torch.randn(16, 9, 64, generator=gen).to(dtype)
            positions = torch.randint(0, 4096, (16,), generator=gen)
            cos, sin = rope_tables_torch(positions, torch.randn(4096, rope_dim, generator=gen), dtype)
            inputs = {"x": q, "cos": cos.squeeze(1), "sin": sin.squeeze(1)}
            cases.append(Case("rope", kind, f"rope-{kind}-{rope_dim}", (16, 9, 64, rope_dim), inputs))
    return cases


def attention_cases() -> list[Case]:
    cases = []
    for kind, dtype in DTYPES.items():
        decode = make_case(
            SEED, [1, 3, 8, 1], [150, 0, 37, 199], num_q_heads=9, num_kv_heads=3, head_dim=64, dtype=dtype
        )
        drafter = scenario_case("drafter", SEED, num_q_heads=8, num_kv_heads=2, head_dim=128, dtype=dtype)
        for label, case in (("causal", decode), ("drafter", drafter)):
            meta = case.meta
            table = meta.req_to_token.to(torch.int32)
            inputs = {
                "q": case.q, "k": case.k, "v": case.v, "k_cache": case.k_cache, "v_cache": case.v_cache,
                "out_slots": meta.out_slots.to(torch.int64), "req_to_token": table,
                "req_rows": meta.req_rows.to(torch.int64), "seq_lens": meta.seq_lens.to(torch.int32),
                "extend_lens": meta.extend_lens.to(torch.int32), "q_start": meta.q_start.to(torch.int32),
            }  # fmt: skip
            tokens, heads, head_dim = case.q.shape
            kv_len = max(1, min(meta.max_seq_len, table.shape[1]))  # as attention.py bounds it
            sizes = (
                tokens, meta.batch_size, heads, case.k_cache.shape[1], head_dim, case.k_cache.shape[0],
                *table.shape, meta.max_extend_len, kv_len, int(meta.causal),
            )  # fmt: skip
            cases.append(Case("attention", kind, f"attention-{kind}-{label}", sizes, inputs, case.scale, case))
    return cases


def cross_build(libraries: Path) -> None:
    """Every kernel source of engine/kernels/cpu -> <name>.so for ARM64, as build.load builds it."""
    for source in sorted(build.SOURCE_DIR.glob("*.c")):
        library = libraries / f"{source.stem}.so"
        command = build.compile_command(source.stem, CROSS_CC, ARM64, library)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{' '.join(command)} failed on ARM64:\n{result.stderr}"


@pytest.fixture(scope="module")
def arm64(tmp_path_factory: pytest.TempPathFactory) -> Arm64Run:
    """The kernels and the driver built for ARM64, and the driver run once over every case."""
    root = tmp_path_factory.mktemp("arm64")
    libraries, data = root / "lib", root / "data"
    libraries.mkdir()
    data.mkdir()
    cross_build(libraries)
    driver = root / "arm64_driver"
    command = [
        CROSS_CC, "-O2", "-std=c11", "-Wall", "-Wextra", "-I", str(build.SOURCE_DIR),
        str(DRIVER), "-o", str(driver), "-ldl",
    ]  # fmt: skip
    subprocess.run(command, check=True)
    gen = torch.Generator().manual_seed(SEED)
    cases = linear_cases(gen) + quant_cases(np.random.default_rng(SEED)) + elementwise_cases(gen) + attention_cases()
    for case in cases:
        for array, tensor in case.inputs.items():
            write(data / f"{case.name}.{array}", tensor)
    (data / "cases.txt").write_text("".join(case.line() + "\n" for case in cases))
    result = subprocess.run(
        [QEMU, "-L", str(SYSROOT), str(driver), str(libraries), str(data)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"the driver failed under {QEMU}:\n{result.stdout}\n{result.stderr}"
    return Arm64Run(libraries, data, result.stdout, cases)


def test_every_kernel_source_builds_for_arm64_and_runs(arm64: Arm64Run):
    assert ARM64.level == isa.PORTABLE and ARM64.compile_flags() == ()
    for library in sorted(arm64.libraries.glob("*.so")):
        header = library.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64, library
    sources = {source.stem for source in build.SOURCE_DIR.glob("*.c")}
    assert {library.stem for library in arm64.libraries.glob("*.so")} == sources
    # the portable paths, and the AMX kernels reported absent rather than failing
    assert arm64.report.splitlines()[:3] == ["gemv_isa portable", "amx_supported 0", "attention_amx 0"]
    assert {line.split()[1] for line in arm64.report.splitlines()[3:]} == {case.name for case in arm64.cases}
    print(f"arm64: {len(sources)} libraries built ({', '.join(sorted(sources))}), {len(arm64.cases)} cases run")


def test_vector_linears_on_arm64(arm64: Arm64Run):
    log = ErrorLog()
    for case in arm64.of("linear"):
        dtype, (m, n, _) = DTYPES[case.kind], case.sizes
        x, weight, bias = case.inputs["x"], case.inputs["weight"], case.inputs["bias"]
        out, out_bias = (arm64.output(case, array, dtype, m, n) for array in ("out", "out_bias"))
        assert_within_sum_bound(out, x, weight, None)
        assert_within_sum_bound(out_bias, x, weight, bias)
        swiglu, swiglu_ref = arm64.output(case, "swiglu", dtype, m, n // 2), silu_and_mul_torch(out_bias)
        close(swiglu, swiglu_ref, bf16_steps=1)
        log.add(f"gemv_linear_{case.kind} (vs float64)", out_bias, x.double() @ weight.double().T + bias.double())
        log.add(f"gemv_swiglu_{case.kind} (vs silu_and_mul of the product)", swiglu, swiglu_ref)
    log.print()


def test_quantized_linears_and_rows_on_arm64(arm64: Arm64Run):
    log = ErrorLog()
    for case in arm64.of("quant"):
        fmt, (m, n, k) = case.kind.upper(), case.sizes
        x, weight, bias = case.inputs["x"], case.inputs["weight"], case.inputs["bias"]
        magnitude = x.abs() @ dequantize_torch(weight, fmt).abs().T
        out, out_bias = (arm64.output(case, array, torch.float32, m, n) for array in ("out", "out_bias"))
        expected = linear_q_torch(x, weight, fmt)
        assert_within_summation_order(out, expected, magnitude, k)
        assert_within_summation_order(out_bias, linear_q_torch(x, weight, fmt, bias), magnitude + bias.abs(), k)
        swiglu, swiglu_ref = arm64.output(case, "swiglu", torch.float32, m, n // 2), silu_and_mul_torch(out_bias)
        close(swiglu, swiglu_ref)
        log.add(f"linear_{case.kind} (vs F.linear on the dequantised weight)", out, expected)
        log.add(f"swiglu_{case.kind} (vs silu_and_mul of the product)", swiglu, swiglu_ref)
    for case in arm64.of("rows"):
        count, _, k = case.sizes
        got = arm64.output(case, "out", torch.float32, count, k)
        expected = dequantize_torch(case.inputs["weight"], case.kind.upper())[case.inputs["ids"]]
        assert torch.equal(got, expected)
        log.add(f"dequant_rows_{case.kind} (vs gguf.quants)", got, expected)
    log.print()


def test_elementwise_kernels_on_arm64(arm64: Arm64Run):
    log = ErrorLog()
    for case in arm64.of("norm"):
        dtype, (rows, n) = DTYPES[case.kind], case.sizes
        x, residual, weight = case.inputs["x"], case.inputs["residual"], case.inputs["weight"]
        normed_ref, summed_ref = add_rms_norm_torch(x, residual, weight, 1e-5)
        normed, out = (arm64.output(case, array, dtype, rows, n) for array in ("normed", "out"))
        close(normed, rms_norm_torch(x, weight, 1e-5), bf16_steps=2)
        close(out, normed_ref, bf16_steps=2)
        close(arm64.output(case, "residual_out", dtype, rows, n), summed_ref)
        log.add(f"rms_norm_{case.kind} (with the residual add)", out, normed_ref)
    for case in arm64.of("silu"):
        dtype, (rows, inter) = DTYPES[case.kind], case.sizes
        got, expected = arm64.output(case, "out", dtype, rows, inter), silu_and_mul_torch(case.inputs["x"])
        close(got, expected, bf16_steps=1)
        log.add(f"silu_and_mul_{case.kind}", got, expected)
    for case in arm64.of("rope"):
        dtype, (tokens, heads, head_dim, _) = DTYPES[case.kind], case.sizes
        cos, sin = case.inputs["cos"].unsqueeze(1), case.inputs["sin"].unsqueeze(1)
        got, expected = (
            arm64.output(case, "out", dtype, tokens, heads, head_dim),
            rotate_torch(case.inputs["x"], cos, sin),
        )
        close(got, expected)
        log.add(f"rope_{case.kind}", got, expected)
    log.print()


def test_paged_attention_on_arm64(arm64: Arm64Run):
    log = ErrorLog()
    for case in arm64.of("attention"):
        dtype, source = DTYPES[case.kind], case.attention
        assert source is not None
        tokens, _, heads, kv_heads, head_dim, slots = case.sizes[:6]
        k_ref, v_ref = stored_caches_float64(source)
        for array, expected in (("k_cache", k_ref), ("v_cache", v_ref)):
            got = arm64.output(case, array, dtype, slots, kv_heads, head_dim)
            torch.testing.assert_close(got.double(), expected, equal_nan=True, atol=0, rtol=0)
        out = arm64.output(case, "out", dtype, tokens, heads, head_dim)
        expected = reference_attention(source)
        torch.testing.assert_close(out.double(), expected, **tolerance(dtype))
        log.add(f"paged_attention_{case.kind} (vs float64)", out, expected)
    log.print()
