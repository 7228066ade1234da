"""Builds an engine's parts from an EngineConfig: device and dtype, model and tokenizer,
KV sizing from the memory budget, the KV manager, the scheduler and the model runner."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import cast

import torch

from engine.config import EngineConfig, ModelConfig, SchedulingChoice, SchedulingPolicyName
from engine.kernels.cpu import quant_gemm
from engine.kernels.cpu.linear import pack_module_weights
from engine.kv.budget import DeviceMemory, kv_budget_bytes
from engine.kv.manager import KVManager
from engine.kv.pool import KVPool
from engine.loader.load import LoadedModel, load_model
from engine.loader.tokenizer import Tokenizer
from engine.models.context import CausalLM
from engine.runner.model_runner import ModelRunner
from engine.runner.options import RunnerOptions
from engine.scheduler import Scheduler, kv_reserve
from engine.speculative.setup import SpecSetup, build_spec


@dataclass
class EngineParts:
    model_name: str
    model_config: ModelConfig
    tokenizer: Tokenizer
    max_model_len: int
    device: torch.device
    dtype: torch.dtype
    kv: KVManager
    scheduler: Scheduler
    runner: ModelRunner
    spec: SpecSetup | None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but no CUDA/ROCm GPU is visible")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def scheduling_policy(choice: SchedulingChoice, device: torch.device) -> SchedulingPolicyName:
    if choice == "auto":
        return "mixed" if device.type == "cuda" else "alternating"
    return choice


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The activations' (and KV cache's) dtype; `auto` on CPU also keeps a GGUF's quantized
    weights in their formats (`quantized_weights`)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtypes = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if name not in dtypes:
        raise ValueError(f"dtype: {name!r} is not one of {', '.join(dtypes)} or 'auto'")
    return dtypes[name]


def quantized_weights(name: str, device: torch.device) -> bool:
    """Whether dtype `name` on `device` serves a GGUF's block-quantized tensors as stored (with
    float32 activations): `auto` on CPU where the block kernels are built (docs/design.md
    §2.9; without a C compiler, or with them off, the tensors load dense). Other checkpoints
    load dense."""
    return name == "auto" and device.type == "cpu" and quant_gemm.available()


def _free_gpu_bytes(device: torch.device) -> int | None:
    """Free memory on `device` with the allocator's cache given back; None on CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def _ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def build_engine_parts(
    config: EngineConfig, loaded: LoadedModel | None = None, *, runner_options: RunnerOptions | None = None
) -> EngineParts:
    """`loaded` reuses weights already in memory (several engines over one model);
    `runner_options` are a benchmark's or a test's alternatives (engine/runner/options.py)."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    free_at_start = _free_gpu_bytes(device)
    if loaded is None:
        loaded = load_model(
            config.model,
            dtype=dtype,
            device=device,
            tokenizer=config.tokenizer,
            tensor_parallel_size=config.tensor_parallel_size,
            quantized=quantized_weights(config.dtype, device),
        )
    if device.type == "cpu":
        pack_module_weights(loaded.model, dtype)  # bf16/fp16 on a CPU with the instructions for it
    mc = loaded.config
    tokenizer = loaded.tokenizer
    if config.chat_template is not None:
        tokenizer = tokenizer.with_chat_template(config.chat_template)
    target = cast(CausalLM, loaded.model)  # every registered family has the CausalLM shape
    # Under tensor parallelism each rank caches its own share of the KV heads.
    local_kv_heads = loaded.model.model.layers[0].self_attn.num_kv_heads  # type: ignore[union-attr,index]
    max_model_len = min(config.max_model_len or mc.max_position, mc.max_position)
    spec = build_spec(config.speculative, loaded.name, target, mc, device, dtype) if config.speculative else None
    if spec is not None and device.type == "cpu":
        pack_module_weights(spec.drafter, dtype)
    step_width = spec.window if spec else 1
    page_size = config.page_size or (1 if device.type == "cpu" else 16)
    max_context = -(-kv_reserve(max_model_len, step_width) // page_size) * page_size + page_size

    bytes_per_slot = KVPool.bytes_per_slot(mc.num_layers, local_kv_heads, mc.head_dim, dtype)
    if spec is not None:
        bytes_per_slot += spec.kv_bytes_per_slot(dtype)
    free_now = _free_gpu_bytes(device)
    memory = None if free_at_start is None or free_now is None else DeviceMemory(free_at_start, free_now)
    num_slots = kv_budget_bytes(config, memory, _ram_bytes()) // bytes_per_slot
    num_slots = min(num_slots, config.max_num_seqs * max_context) // page_size * page_size
    if num_slots < max_context:
        raise ValueError(
            f"the KV budget holds {num_slots} tokens, fewer than one request of max_model_len "
            f"{max_model_len}; raise the budget (kv_cache_memory_bytes, gpu_memory_utilization) or lower max_model_len"
        )

    kv = KVManager(num_slots, page_size, config.max_num_seqs, max_context, config.enable_prefix_cache, device)
    scheduler = Scheduler(
        kv,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        chunked_prefill=config.chunked_prefill,
        max_model_len=max_model_len,
        step_width=step_width,
        spec_gamma=spec.gamma if spec else None,
        policy=scheduling_policy(config.scheduling, device),
    )
    runner = ModelRunner(
        target,
        num_layers=mc.num_layers,
        num_kv_heads=local_kv_heads,
        head_dim=mc.head_dim,
        vocab_size=mc.vocab_size,
        num_slots=num_slots,
        max_rows=config.max_num_seqs,
        dtype=dtype,
        device=device,
        attention_backend=config.attention_backend,
        req_to_token=kv.table.device_table,
        req_to_token_host=kv.table.host,
        page_size=page_size,
        spec=spec,
        options=runner_options,
    )
    if config.cuda_graphs and device.type == "cuda":
        runner.capture_graphs(config.max_num_seqs, max_context, kv.table.padding_row, config.max_num_batched_tokens)
    return EngineParts(
        model_name=loaded.name,
        model_config=mc,
        tokenizer=tokenizer,
        max_model_len=max_model_len,
        device=device,
        dtype=dtype,
        kv=kv,
        scheduler=scheduler,
        runner=runner,
        spec=spec,
    )
