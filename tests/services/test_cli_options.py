"""The CLI: subcommand discovery and DSPARK_* environment variables."""

from __future__ import annotations

import argparse

import pytest

from engine.config import SpeculativeConfig
from services.cli import build_parser, discover_commands
from services.cli.options import (
    CPU_SPECULATIVE_MAX_BATCH_SIZE,
    add_engine_options,
    add_gateway_options,
    apply_env_defaults,
    engine_config_from_args,
    env_var_for,
    gateway_config_from_args,
)


def test_env_var_names() -> None:
    assert env_var_for("--foo-bar") == "DSPARK_FOO_BAR"
    assert env_var_for("--prefill-workers") == "DSPARK_PREFILL_WORKERS"


def test_subcommands_are_discovered() -> None:
    names = [c.name for c in discover_commands()]
    assert {"up", "gateway", "worker", "bench", "train-drafter"} <= set(names)
    assert names[:4] == ["up", "gateway", "worker", "bench"]


def parse(argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    return build_parser(env).parse_args(argv)


def test_env_sets_defaults_and_the_command_line_wins() -> None:
    env = {
        "DSPARK_PORT": "9001",
        "DSPARK_COLOCATED": "true",
        "DSPARK_API_KEYS": "a, b",
        "DSPARK_MODEL": "tiny",
        "DSPARK_PREFIX_CACHE": "off",
        "DSPARK_MAX_MODEL_LEN": "512",
    }
    args = parse(["up"], env)
    assert args.port == 9001 and args.colocated is True and args.api_keys == ("a", "b")
    assert args.model == "tiny" and args.prefix_cache is False and args.max_model_len == 512
    args = parse(["up", "--port", "9002", "--prefix-cache"], env)
    assert args.port == 9002 and args.prefix_cache is True


def test_env_reaches_every_subcommand() -> None:
    env = {
        "DSPARK_RAY_ADDRESS": "ray://head:10001",
        "DSPARK_ROLE": "prefill",
        "DSPARK_REPLICAS": "3",
        "DSPARK_BENCH_CONCURRENCY": "2,4",
        "DSPARK_BENCH_WORKLOAD": "chat",
    }
    worker = parse(["worker"], env)
    assert worker.ray_address == "ray://head:10001" and worker.role == "prefill" and worker.replicas == 3
    assert parse(["gateway"], env).ray_address == "ray://head:10001"
    bench = parse(["bench"], env)
    assert bench.concurrency == (2, 4) and bench.workload == "chat"


@pytest.mark.parametrize(
    ("name", "value"), [("DSPARK_PORT", "eighty"), ("DSPARK_COLOCATED", "maybe"), ("DSPARK_ROLE", "janitor")]
)
def test_bad_env_values_are_reported_with_the_variable(
    name: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse(["worker" if name == "DSPARK_ROLE" else "up"], {name: value})
    assert name in capsys.readouterr().err


def test_help_names_the_variable() -> None:
    parser = argparse.ArgumentParser()
    add_gateway_options(parser)
    apply_env_defaults(parser, {})
    assert "[env: DSPARK_MAX_BODY_BYTES]" in " ".join(parser.format_help().split())


def test_engine_and_gateway_configs_from_args() -> None:
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    add_gateway_options(parser)
    args = parser.parse_args(
        [
            "--speculative",
            "off",
            "--max-num-seqs",
            "8",
            "--api-keys",
            "k1,k2",
            "--max-queued-per-worker",
            "2",
            "--router-block-tokens",
            "32",
        ]
    )
    engine = engine_config_from_args(args)
    assert engine.speculative is None and engine.max_num_seqs == 8 and engine.model == "smollm2-135m"
    gateway = gateway_config_from_args(args)
    assert gateway.api_keys == ("k1", "k2") and gateway.pool.max_queued_per_worker == 2
    assert gateway.router.block_tokens == 32
    forced = engine_config_from_args(parser.parse_args(["--speculative", "on", "--gamma", "4", "--device", "cuda"]))
    assert forced.speculative is not None and forced.speculative.gamma == 4
    assert forced.speculative.max_batch_size is None  # a GPU drafts at every batch size
    capped = engine_config_from_args(parser.parse_args(["--speculative", "on", "--speculative-max-batch-size", "4"]))
    assert capped.speculative is not None and capped.speculative.max_batch_size == 4
    parser_from_env = argparse.ArgumentParser()
    add_engine_options(parser_from_env)
    apply_env_defaults(parser_from_env, {"DSPARK_SPECULATIVE_MAX_BATCH_SIZE": "2", "DSPARK_SPECULATIVE": "on"})
    from_env = engine_config_from_args(parser_from_env.parse_args([]))
    assert from_env.speculative is not None and from_env.speculative.max_batch_size == 2
    with pytest.raises(ValueError, match="max_batch_size must be at least 1"):
        engine_config_from_args(parser.parse_args(["--speculative", "on", "--speculative-max-batch-size", "0"]))


def test_speculative_defaults_on_cpu() -> None:
    """On CPU DSpark pays in bfloat16 at low concurrency: `auto` turns it on there (not in
    float32), and without an explicit cap it drafts for batches up to 4."""
    parser = argparse.ArgumentParser()
    add_engine_options(parser)

    def spec(*argv: str) -> SpeculativeConfig | None:
        return engine_config_from_args(parser.parse_args(["--device", "cpu", *argv])).speculative

    assert spec() is None and spec("--dtype", "float32") is None
    auto_bf16 = spec("--dtype", "bfloat16")
    assert auto_bf16 is not None and auto_bf16.max_batch_size == CPU_SPECULATIVE_MAX_BATCH_SIZE == 4
    forced = spec("--speculative", "on")
    assert forced is not None and forced.max_batch_size == CPU_SPECULATIVE_MAX_BATCH_SIZE
    explicit = spec("--dtype", "bfloat16", "--speculative-max-batch-size", "16")
    assert explicit is not None and explicit.max_batch_size == 16
    assert spec("--dtype", "bfloat16", "--speculative", "off") is None
