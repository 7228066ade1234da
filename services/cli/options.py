"""Command-line options shared by the subcommands, and the configs made from them.

Every long option also reads a `DSPARK_*` environment variable (services/cli/env.py). The
spellings a `vllm serve` user brings (a positional MODEL, `--api-key`, `-tp`,
`--speculative-config`, ...) are options here too (services/cli/vllm_options.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from services.cli._admission_options import add_admission_options, admission_config_from_args
from services.cli.reliability_options import add_reliability_options
from services.cli.vllm_options import (
    AppendOnCommandLine,
    ModelAction,
    chat_template_text,
    memory_fraction,
    resolve_speculative,
    speculative_config,
)

# DSpark drafts for decode batches up to this size on CPU: 1.5-1.8x plain decoding at
# batches 1-4, slower than plain at 16 on a 2-core machine (docs/benchmarks.md).
CPU_SPECULATIVE_MAX_BATCH_SIZE = 4


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


# -- option groups ------------------------------------------------------------------------


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--model",
        action=ModelAction,
        default="smollm2-135m",
        help="model alias, Hugging Face directory or GGUF file (default: %(default)s)",
    )
    group.add_argument(
        "model",
        nargs="?",
        action=ModelAction,
        default=argparse.SUPPRESS,
        metavar="MODEL",
        help="the model, as `vllm serve MODEL` takes it: the same as --model",
    )
    group.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default: %(default)s)")
    group.add_argument(
        "--dtype",
        default="auto",
        help="auto (bfloat16 on GPU; float32 on CPU, a GGUF's Q8_0/Q4_1 weights kept as stored), float32, bfloat16, "
        "float16 (default: %(default)s)",
    )
    group.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    group.add_argument("--max-num-seqs", type=int, default=64, help="requests batched per step (default: %(default)s)")
    group.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="tokens per step, the prefill chunk; smaller tightens the TPOT tail of many concurrent decodes "
        "at the cost of TTFT (docs/design.md §2.3) (default: %(default)s)",
    )
    group.add_argument(
        "--scheduling",
        choices=("auto", "alternating", "mixed"),
        default="auto",
        help="alternating: a step prefills or decodes; mixed: each step carries the decode rows and prefill "
        "chunks under one token budget (docs/design.md §2.3); auto: mixed on GPU (1.04-1.18x the tokens/s of "
        "alternating at 32-256 agentic sessions on an H100), alternating on CPU (default: %(default)s)",
    )
    group.add_argument("--page-size", type=int, default=0, help="KV page size, 0 = auto (default: %(default)s)")
    group.add_argument("--kv-cache-memory-bytes", type=int, default=0, help="KV pool size, 0 = auto")
    group.add_argument(
        "--gpu-memory-utilization",
        type=memory_fraction,
        default=None,
        metavar="F",
        help="fraction in (0, 1] of the GPU memory free when the engine starts that its weights and KV "
        "pool may take; the KV pool gets what the weights leave of it (activations and CUDA graphs "
        "come on top: leave headroom). Refused on CPU and with --kv-cache-memory-bytes. Default: the "
        "KV pool takes 0.6 of the memory free after loading",
    )
    group.add_argument(
        "--chat-template",
        type=chat_template_text,
        default=None,
        metavar="PATH_OR_TEMPLATE",
        help="a Jinja file, or an inline template, that replaces the model's chat template (and the one "
        "shipped for it); it also decides the tool-call syntax when --tool-call-parser is unset",
    )
    group.add_argument(
        "--prefix-cache",
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse KV of shared prompt prefixes (default: on)",
    )
    group.add_argument(
        "--speculative",
        choices=("auto", "on", "off"),
        default="auto",
        help="DSpark speculative decoding; auto = on when the model ships a drafter and the engine runs "
        "on a GPU, or on CPU in bfloat16. On CPU it pays only in bfloat16 and at low concurrency (1.7x "
        "at batch 1, 0.9x at batch 16; in float32 a verify window costs several single-token steps: "
        "docs/benchmarks.md), hence the CPU default of --speculative-max-batch-size",
    )
    group.add_argument("--drafter", default=None, help="drafter checkpoint directory (default: the shipped one)")
    group.add_argument("--gamma", type=int, default=None, help="draft block size (default: the drafter's)")
    group.add_argument(
        "--speculative-config",
        type=speculative_config,
        default=None,
        metavar="JSON",
        help='vLLM\'s spelling, \'{"method": "dspark", "model": DRAFTER, "num_speculative_tokens": GAMMA}\' '
        "(model and num_speculative_tokens optional): --speculative on with that --drafter and --gamma; "
        "other methods are refused",
    )
    group.add_argument(
        "--speculative-max-batch-size",
        type=int,
        default=None,
        help="decode steps of more requests than this decode one token each without drafting (the "
        "drafter keeps up and resumes when the batch shrinks); default: always draft on a GPU, "
        f"{CPU_SPECULATIVE_MAX_BATCH_SIZE} on CPU",
    )
    group.add_argument("--seed", type=int, default=0, help="engine seed (default: %(default)s)")
    group.add_argument(
        "--tensor-parallel-size", "-tp", type=int, default=1, metavar="N", help="GPUs per worker (default: 1)"
    )


def shipped_drafter_available(model: str) -> bool:
    try:
        from engine.loader.resolve import shipped_drafter
    except ImportError:
        return False
    return shipped_drafter(model) is not None


def runs_on_gpu(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def engine_config_from_args(args: argparse.Namespace) -> Any:
    """The EngineConfig the options describe; ValueError naming the options that contradict
    each other (the CLI reports it as a usage error before starting anything)."""
    from engine.config import EngineConfig, SpeculativeConfig

    on_gpu = runs_on_gpu(args.device)
    if args.gpu_memory_utilization is not None:
        if args.kv_cache_memory_bytes:
            raise ValueError("--gpu-memory-utilization and --kv-cache-memory-bytes both size the KV pool; give one")
        if not on_gpu:
            raise ValueError(
                "--gpu-memory-utilization sizes the KV pool from GPU memory, and this engine runs on CPU "
                f"({'no GPU is visible' if args.device == 'auto' else '--device ' + args.device}); size it with "
                "--kv-cache-memory-bytes"
            )
    if args.chat_template is not None:
        from engine.loader.tokenizer import check_chat_template

        check_chat_template(args.chat_template)
    choice = resolve_speculative(args.speculative, args.drafter, args.gamma, args.speculative_config)
    # DSpark pays on CPU in bfloat16 at low concurrency only (docs/benchmarks.md)
    worth_it = on_gpu or args.dtype == "bfloat16"
    speculative = None
    if (
        choice.mode == "on"
        or choice.drafter
        or (choice.mode == "auto" and worth_it and shipped_drafter_available(args.model))
    ):
        max_batch_size = args.speculative_max_batch_size
        if max_batch_size is None and not on_gpu:
            max_batch_size = CPU_SPECULATIVE_MAX_BATCH_SIZE
        speculative = SpeculativeConfig(drafter=choice.drafter, gamma=choice.gamma, max_batch_size=max_batch_size)
    if choice.mode == "off":
        speculative = None
    return EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        scheduling=args.scheduling,
        page_size=args.page_size,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        chat_template=args.chat_template,
        enable_prefix_cache=args.prefix_cache,
        tensor_parallel_size=args.tensor_parallel_size,
        speculative=speculative,
    )


def add_ray_options(parser: argparse.ArgumentParser, *, address_default: str | None) -> None:
    group = parser.add_argument_group("ray")
    group.add_argument(
        "--ray-address",
        default=address_default,
        help="Ray cluster to join ('auto': this node's; unset: a new local one; default: %(default)s)",
    )
    group.add_argument("--namespace", default="dspark", help="Ray namespace of the workers (default: %(default)s)")
    group.add_argument("--deployment", default="dspark", help="name prefix of the worker actors (default: %(default)s)")


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workers")
    group.add_argument("--worker-cpus", type=float, default=1.0, help="Ray CPUs per worker (default: 1)")
    group.add_argument(
        "--worker-gpus",
        type=float,
        default=None,
        help="Ray GPUs per worker (default: tensor-parallel-size when a GPU is present, else 0)",
    )
    group.add_argument("--torch-threads", type=int, default=0, help="torch threads per worker, 0 = torch's default")
    group.add_argument(
        "--max-restarts",
        type=int,
        default=-1,
        help="restarts of a crashed worker, -1 = always (default: %(default)s)",
    )
    group.add_argument(
        "--kv-transfer",
        default="ray",
        choices=("ray", "cuda-ipc", "inprocess"),
        help="KV hand-off transport: ray (object store, any node) or cuda-ipc (device to device, one node)",
    )
    group.add_argument(
        "--consumer-lease",
        type=float,
        default=30.0,
        help="seconds without a poll after which a worker drops a gateway's requests",
    )
    group.add_argument(
        "--ready-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for workers to load the model (default: %(default)s)",
    )


def worker_options_from_args(args: argparse.Namespace, *, detached: bool, pin_to_local_node: bool = False) -> Any:
    from services.workers.deploy import WorkerOptions

    gpus = args.worker_gpus
    if gpus is None:
        gpus = float(args.tensor_parallel_size) if args.device != "cpu" and _gpu_present() else 0.0
    return WorkerOptions(
        kv_transfer=args.kv_transfer,
        consumer_lease_s=args.consumer_lease,
        max_restarts=args.max_restarts,
        num_cpus=args.worker_cpus,
        num_gpus=gpus,
        torch_threads=args.torch_threads,
        detached=detached,
        pin_to_local_node=pin_to_local_node,
    )


def _gpu_present() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def add_gateway_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("gateway")
    group.add_argument("--host", default="127.0.0.1", help="listen address (default: %(default)s)")
    group.add_argument("--port", type=int, default=8000, help="listen port (default: %(default)s)")
    group.add_argument(
        "--api-keys",
        type=comma_list,
        default=(),
        help="comma-separated keys accepted as 'Authorization: Bearer KEY' (default: none)",
    )
    group.add_argument(
        "--api-key",
        action=AppendOnCommandLine,
        default=(),
        metavar="KEY",
        help="a key accepted as 'Authorization: Bearer KEY', as vLLM takes it; repeat it for several; "
        "adds to --api-keys",
    )
    group.add_argument(
        "--served-model-name",
        type=comma_list,
        default=(),
        help="model ids to serve the model as (comma-separated): responses and /v1/models report these, the "
        "first in responses; the workers' own id stays accepted in requests",
    )
    group.add_argument(
        "--tool-call-parser",
        default=None,
        help="tool-call syntax of the model's output: hermes, llama3_json or mistral (default: from the chat template)",
    )
    group.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="accepted as vLLM takes it; tool_choice 'auto' is always on here once the tool-call syntax "
        "is known (from --tool-call-parser or the chat template)",
    )
    group.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024, help="request body limit (413 above)")
    group.add_argument(
        "--max-queued-per-worker",
        type=int,
        default=None,
        help="requests queued per worker beyond its batch before 429 (default: max-num-seqs)",
    )
    group.add_argument(
        "--max-inflight-per-worker",
        type=int,
        default=None,
        help="hard cap on requests per worker (default: none)",
    )
    group.add_argument("--kv-transfer-timeout", type=float, default=30.0, help="seconds per KV hand-off")
    group.add_argument("--stats-interval", type=float, default=0.5, help="seconds between worker stats polls")
    group.add_argument("--router-block-tokens", type=int, default=16, help="tokens per prefix-affinity block")
    group.add_argument(
        "--router-balance-slack",
        type=int,
        default=4,
        help="extra queued requests accepted to follow a cached prefix",
    )
    group.add_argument(
        "--skip-prefill-max-tokens",
        type=int,
        default=0,
        help="decode directly when at most this many prompt tokens are uncached (0: never)",
    )
    add_admission_options(group)
    group.add_argument("--log-level", default="info", help="debug, info, warning (default: %(default)s)")
    add_reliability_options(parser)


def gateway_config_from_args(args: argparse.Namespace) -> Any:
    from services.gateway.config import GatewayConfig
    from services.gateway.pool import PoolConfig
    from services.router import RouterConfig

    return GatewayConfig(
        served_model_names=tuple(args.served_model_name),
        api_keys=tuple(dict.fromkeys((*args.api_keys, *args.api_key))),
        tool_call_parser=args.tool_call_parser,
        max_body_bytes=args.max_body_bytes,
        kv_transfer_timeout_s=args.kv_transfer_timeout,
        migration_limit=args.migration_limit,
        shutdown_grace_s=args.shutdown_grace,
        request_timeout_s=args.request_timeout or None,
        queue_timeout_s=args.queue_timeout or None,
        keepalive_s=args.keepalive_interval,
        pool=PoolConfig(
            stats_interval_s=args.stats_interval,
            max_queued_per_worker=args.max_queued_per_worker,
            max_inflight_per_worker=args.max_inflight_per_worker,
            shared_admission=args.shared_admission,
        ),
        router=RouterConfig(
            block_tokens=args.router_block_tokens,
            balance_slack=args.router_balance_slack,
            skip_prefill_max_tokens=args.skip_prefill_max_tokens,
        ),
        admission=admission_config_from_args(args),
    )
