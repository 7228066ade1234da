"""A Llama decoder stack's few-row forwards on CPU in one C call (engine/kernels/cpu/decoder.c).

In a decode step on CPU the Python around a layer's kernels (~10 calls, each a wrapper of
~10-15 us: argument checks, `torch.empty`, ctypes, module calls) cost about a third of the
step. `CpuDecoderStack` runs the same kernels in the same order from C, so its output is
bit-identical to the layers' own forward (tests/engine/test_cpu_decoder_stack.py); on the
2-core VM with AMX a bf16 batch-16 step went from ~44 to ~28 ms (benchmarks/cpu_kernels.py).

It serves fp32 and bf16 forwards when everything it would call is there: every linear weight
packed for one of our kernels (engine/kernels/cpu/linear.py: the AMX tile kernel, or the
vector kernel of gemv.c built for the ISA this CPU reports, isa.py) and SwiGLU's gate/up
packed gated, or, in fp32, every linear a GGUF's blocks in one format (QuantizedLinear,
quant_gemm.c, docs/design.md §2.9), no biases or q/k-norm, one tensor-parallel rank, the attention backend's C
kernel built and serving the forward (a few rows per request), and contiguous caches of the
activation dtype. Anything else takes the layers' Python forward, as does every forward on
another device.

The runner decides: `with_cpu_decoder_stack` wraps a CPU target whose weights the stack can
run, and the wrapper sends each forward the stack serves to it; the model knows nothing of it.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import ModelConfig
from engine.kernels.cpu import gemv
from engine.kernels.cpu.attention import MAX_EXTEND
from engine.kernels.cpu.build import load
from engine.kernels.cpu.linear import kernel_of
from engine.kernels.cpu.quant_gemm import FORMATS
from engine.kernels.rope import RotaryAngles
from engine.models.context import CausalLM, ForwardContext, LayerContext
from engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from engine.models.quantized import QuantizedLinear

_P, _I, _F, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


class _Kernels(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("linear", "linear_swiglu", "rms_norm", "rope", "store_kv", "attention")]


class _Layer(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("input_norm", "qkv", "o", "gate_up", "down", "post_norm", "k_cache", "v_cache")]


class _Forward(ctypes.Structure):
    _fields_ = [
        *[(name, _I) for name in ("tokens", "hidden", "heads", "kv_heads", "head_dim", "inter", "rope_dim")],
        ("eps", _F), ("scale", _F), ("threads", _N), ("causal", _N), ("elem_bytes", _I),
        ("cos", _P), ("sin", _P), ("out_slots", _P), ("req_to_token", _P), ("table_stride", _I),
        ("req_rows", _P), ("seq_lens", _P), ("extend_lens", _P), ("q_start", _P),
        ("batch", _I), ("max_extend", _I), ("kv_len", _I), ("workspace", _P), ("workspace_per_thread", _I),
        *[(name, _P) for name in ("normed", "qkv_out", "rotated", "attn", "o_out", "act")],
    ]  # fmt: skip


@functools.cache
def _library(dtype: torch.dtype, linear_kernel: str) -> tuple[ctypes.CDLL, _Kernels] | None:
    """decoder.c and the addresses of the kernels it calls for activations of `dtype` and
    linears packed for `linear_kernel` ("amx" or "gemv", linear.kernel_of), or held in a GGUF
    block format ("Q8_0", "Q4_1": quant_gemm.c); None when any is missing. Made at first use,
    from the libraries built for this CPU's ISA."""
    quantized = linear_kernel in FORMATS  # a GGUF block format: quant_gemm.c, fp32 activations only
    if quantized and dtype != torch.float32:
        return None
    linear_library = "quant_gemm" if quantized else linear_kernel.replace("amx", "gemm")
    libraries = [load(name) for name in ("decoder", "elementwise", "attention", linear_library)]
    if any(library is None for library in libraries):
        return None
    decoder, elementwise, attention, linears = (library for library in libraries if library is not None)
    suffix = gemv.DTYPES[dtype]

    def address(library: ctypes.CDLL, name: str) -> int | None:
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value

    linear_names = ("linear_bf16", "linear_swiglu_bf16")
    if linear_kernel == "gemv":
        linear_names = (f"gemv_linear_{suffix}", f"gemv_swiglu_{suffix}")
    elif quantized:
        linear_names = (f"linear_{linear_kernel.lower()}", f"swiglu_{linear_kernel.lower()}")
    kernels = _Kernels(
        *(address(linears, name) for name in linear_names),
        address(elementwise, f"rms_norm_{suffix}"), address(elementwise, f"rope_{suffix}"),
        address(attention, "store_kv"), address(attention, f"paged_attention_{suffix}"),
    )  # fmt: skip
    function = decoder.decoder_layers
    function.argtypes = [ctypes.POINTER(_Kernels), ctypes.POINTER(_Forward), ctypes.POINTER(_Layer), _I, _P, _P]
    function.restype = _N
    return decoder, kernels


class CpuDecoderStack:
    """The decoder layers of one LlamaModel, ready for decoder.c (see the module docstring)."""

    def __init__(self, layers: Sequence[LlamaDecoderLayer], config: ModelConfig) -> None:
        self.decoder_layers = tuple(layers)
        self.config = config
        self._weights: list[tuple[torch.Tensor, ...]] | None = None  # per layer, once packed
        self._linear_kernel = "gemv"  # the kernel every packed linear of _weights runs on
        self._weights_of: torch.Tensor | None = None  # layer 0's qkv weight when _weights was made
        self._layers: ctypes.Array[_Layer] | None = None
        self._caches_key: tuple[int, int] | None = None

    def serves(self, hidden: torch.Tensor, ctx: ForwardContext) -> bool:
        backend = ctx.backend
        if not (hidden.is_cpu and hidden.dtype in gemv.DTYPES and hidden.dim() == 2):
            return False
        if not isinstance(backend, TorchAttentionBackend) or backend.cpu_kernel is None:
            return False
        meta = ctx.meta
        if meta.max_extend_len > MAX_EXTEND or meta.batch_size == 0 or hidden.shape[0] == 0:
            return False
        if meta.out_slots.dtype != torch.int64 or not meta.out_slots.is_contiguous():
            return False
        k_cache, _ = ctx.kv.layer(0)
        if k_cache.dtype != hidden.dtype or not k_cache.is_contiguous():
            return False
        weights = self._packed_weights()
        if weights is None or weights[0][0].dtype != hidden.dtype:
            return False
        return _library(hidden.dtype, self._linear_kernel) is not None

    def __call__(
        self, rope: RotaryAngles, hidden: torch.Tensor, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (the last layer's MLP output, the stream before it), [T, H]
        """Every layer on the embeddings `hidden` [T, H] (serves() said yes); captures the
        residual streams ctx.capture_layers asks for, as the Python loop does."""
        dtype = hidden.dtype
        library = _library(dtype, self._linear_kernel)
        assert library is not None
        decoder, kernels = library
        config = self.config
        tokens, width = hidden.shape
        threads = torch.get_num_threads()
        backend = ctx.backend
        assert isinstance(backend, TorchAttentionBackend) and backend.cpu_kernel is not None
        heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim  # one rank
        args = backend.cpu_kernel.prepare(ctx.meta, heads // kv_heads, head_dim, threads)
        table, req_rows, seq_lens, extend_lens, q_start = args.tensors
        cos, sin = (t.contiguous() for t in rope.tables(dtype))
        scratch = {
            "normed": (tokens, width), "qkv_out": (tokens, (heads + 2 * kv_heads) * head_dim),
            "rotated": (tokens, (heads + kv_heads) * head_dim), "attn": (tokens, heads * head_dim),
            "o_out": (tokens, width), "act": (tokens, config.intermediate_size),
        }  # fmt: skip
        buffers = {name: torch.empty(shape, dtype=dtype) for name, shape in scratch.items()}
        meta = ctx.meta
        forward = _Forward(
            tokens, width, heads, kv_heads, head_dim, config.intermediate_size, cos.shape[-1],
            config.rms_norm_eps, self.decoder_layers[0].self_attn.scale, threads, int(meta.causal),
            hidden.element_size(),
            cos.data_ptr(), sin.data_ptr(), meta.out_slots.data_ptr(), table.data_ptr(), table.stride(0),
            req_rows.data_ptr(), seq_lens.data_ptr(), extend_lens.data_ptr(), q_start.data_ptr(),
            meta.batch_size, meta.max_extend_len, args.kv_len, backend.cpu_kernel.workspace.data_ptr(),
            args.floats_per_thread, *(buffers[name].data_ptr() for name in scratch),
        )  # fmt: skip
        layers = self._layer_structs(ctx)
        # layer 0 normalises the embeddings alone: a zero branch output added to them is exact
        residual = hidden.clone()
        hidden = torch.zeros_like(residual)
        captured: dict[int, torch.Tensor] = {}
        start = 0
        for end in sorted({layer_id + 1 for layer_id in ctx.capture_layers} | {len(layers)}):
            offset = ctypes.byref(layers, start * ctypes.sizeof(_Layer))
            layer_pointer = ctypes.cast(offset, ctypes.POINTER(_Layer))
            status = decoder.decoder_layers(
                ctypes.byref(kernels), ctypes.byref(forward), layer_pointer, end - start,
                hidden.data_ptr(), residual.data_ptr(),
            )  # fmt: skip
            if status != 0:
                raise MemoryError("decoder_layers: out of memory")
            if end - 1 in ctx.capture_layers:
                captured[end - 1] = hidden + residual
            start = end
        ctx.captured.extend(captured[layer_id] for layer_id in ctx.capture_layers)
        return hidden, residual

    def runs_weights(self) -> bool:
        """Whether every layer's weights are in the form the C stack takes (see _collect_weights)."""
        return self._packed_weights() is not None

    def _packed_weights(self) -> list[tuple[torch.Tensor, ...]] | None:
        """Per layer (input norm, qkv, o, gate_up, down, post norm) when every layer qualifies."""
        first = self.decoder_layers[0].self_attn.qkv_proj.weight
        if self._weights_of is not first:  # made again once packing has replaced the weights
            self._weights, self._weights_of, self._layers = self._collect_weights(), first, None
        return self._weights

    def _collect_weights(self) -> list[tuple[torch.Tensor, ...]] | None:
        """Also sets the one kernel every linear runs on, the one the layers' forward calls
        (linear.kernel_of); None where they do not all run on the same one of ours."""
        weights: list[tuple[torch.Tensor, ...]] = []
        kernels: set[str] = set()
        dtype = self.decoder_layers[0].input_layernorm.weight.dtype
        for layer in self.decoder_layers:
            attn, mlp = layer.self_attn, layer.mlp
            linears: tuple[nn.Module, ...] = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            if attn.q_norm is not None or any(p.bias is not None or p.tp_size != 1 for p in linears):
                return None
            served = [_served_linear(p, gated=p is mlp.gate_up_proj, dtype=dtype) for p in linears]
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            if None in served or any(n.dtype != dtype or not n.is_contiguous() for n in norms):
                return None
            kernels.update(kernel for kernel, _ in filter(None, served))
            qkv, o, gate_up, down = (weight for _, weight in filter(None, served))
            weights.append((norms[0], qkv, o, gate_up, down, norms[1]))
        if len(kernels) != 1 or not kernels <= {"amx", "gemv", *FORMATS}:
            return None
        self._linear_kernel = kernels.pop()
        return weights

    def _layer_structs(self, ctx: ForwardContext) -> ctypes.Array[_Layer]:
        """The layers' structs, made again only when the forward's KV pool is another one."""
        k0, v0 = ctx.kv.layer(0)
        key = (k0.data_ptr(), v0.data_ptr())
        if self._layers is None or self._caches_key != key:
            weights = self._packed_weights()
            assert weights is not None
            layers = (_Layer * len(weights))()
            for i, (input_norm, qkv, o, gate_up, down, post_norm) in enumerate(weights):
                k_cache, v_cache = ctx.kv.layer(i)
                layers[i] = _Layer(
                    input_norm.data_ptr(), qkv.data_ptr(), o.data_ptr(), gate_up.data_ptr(), down.data_ptr(),
                    post_norm.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                )  # fmt: skip
            self._layers, self._caches_key = layers, key
        return self._layers


def _served_linear(module: nn.Module, gated: bool, dtype: torch.dtype) -> tuple[str, torch.Tensor] | None:
    """(kernel, the weight decoder.c reads) of one linear: a weight packed for one of our
    kernels (gated: for SwiGLU), or a quantized layer's blocks in one format (fp32 forwards);
    None where the stack cannot run it."""
    if isinstance(module, QuantizedLinear):
        fmt = module.block_format()
        if fmt is None or module.swiglu != gated or dtype != torch.float32:
            return None
        return fmt, module.weight
    weight = module.weight
    if not isinstance(weight, torch.Tensor) or weight.dtype != dtype:
        return None
    if not (gemv.is_packed_gated(weight) if gated else gemv.is_packed(weight)):
        return None
    return kernel_of(weight), weight


class CpuStackedLM:
    """A Llama target whose forwards run in one C call where the stack serves them; every other
    forward is the model's own. The same operations in the same order either way, so tokens
    and logprobs are those of the model alone (tests/engine/test_cpu_decoder_stack.py)."""

    def __init__(self, model: LlamaForCausalLM, stack: CpuDecoderStack) -> None:
        self.model = model
        self.stack = stack

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        hidden = self.model.embed(input_ids)  # [T, H]
        if not isinstance(ctx, ForwardContext) or not self.stack.serves(hidden, ctx):
            return self.model(input_ids, positions, ctx, input_embeds=hidden)
        decoder = self.model.model
        hidden, stream = self.stack(decoder.rotary_emb.at(positions), hidden, ctx)
        return decoder.norm.add_and_norm(hidden, stream)[0]  # [T, H], final norm applied

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)


def with_cpu_decoder_stack(model: CausalLM) -> CausalLM:
    """A CPU target behind the one-call stack when it is a Llama whose every layer's weights
    the stack can run (fp32 or bf16 packed for our kernels, one rank); else `model` itself."""
    if not isinstance(model, LlamaForCausalLM):
        return model
    stack = CpuDecoderStack([cast(LlamaDecoderLayer, layer) for layer in model.model.layers], model.config)
    return CpuStackedLM(model, stack) if stack.runs_weights() else model
