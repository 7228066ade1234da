"""The CLI: subcommand discovery and DSPARK_* environment variables."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import SpeculativeConfig
from services.cli import build_parser, discover_commands, parse_command_line
from services.cli.env import apply_env_defaults, env_var_for
from services.cli.options import (
    CPU_SPECULATIVE_MAX_BATCH_SIZE,
    add_engine_options,
    add_gateway_options,
    engine_config_from_args,
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


# -- what a `vllm serve` user types (services/cli/vllm_options.py) ----------------------------


def parse_checked(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    """As `dspark-serve` parses: options, then the subcommand's rules across options."""
    return parse_command_line(argv, env or {})


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str], env: dict[str, str] | None = None) -> str:
    """The message of the usage error `argv` gets (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        parse_checked(argv, env)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("command", ["up", "worker"])
def test_the_model_may_be_positional(command: str) -> None:
    repo = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert parse_checked([command, repo, "--device", "cpu"]).model == repo
    assert parse_checked([command, "--device", "cpu", "/models/llama.gguf"]).model == "/models/llama.gguf"
    assert parse_checked([command, "tiny", "--model", "tiny", "--device", "cpu"]).model == "tiny"
    assert parse_checked([command, "--device", "cpu"], {"DSPARK_MODEL": "from-env"}).model == "from-env"
    assert parse_checked([command, "given", "--device", "cpu"], {"DSPARK_MODEL": "from-env"}).model == "given"
    assert parse_checked([command, "--model", "a", "--model", "b", "--device", "cpu"]).model == "b"


def test_a_positional_model_and_another_model_option_conflict(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(["up", "a", "--model", "b"], capsys) == (
        "dspark-serve up: error: argument --model: 'b' conflicts with MODEL 'a'; give the model once"
    )
    assert usage_error(["worker", "--model", "b", "a"], capsys) == (
        "dspark-serve worker: error: argument MODEL: 'a' conflicts with --model 'b'; give the model once"
    )
    assert "unrecognized arguments: some-model" in usage_error(["gateway", "some-model"], capsys)


def test_api_key_as_vllm_takes_it_adds_to_api_keys() -> None:
    args = parse_checked(["up", "--device", "cpu", "--api-key", "k1", "--api-key", "k2", "--api-keys", "k0,k1"])
    assert gateway_config_from_args(args).api_keys == ("k0", "k1", "k2")
    one = parse_checked(["up", "--device", "cpu", "--api-key", "secret", "my-model"])
    assert one.model == "my-model" and gateway_config_from_args(one).api_keys == ("secret",)
    from_env = parse_checked(["gateway"], {"DSPARK_API_KEY": "e1, e2"})
    assert gateway_config_from_args(from_env).api_keys == ("e1", "e2")
    overridden = parse_checked(["gateway", "--api-key", "cli"], {"DSPARK_API_KEY": "e1"})
    assert gateway_config_from_args(overridden).api_keys == ("cli",)  # the command line wins
    assert gateway_config_from_args(parse_checked(["gateway"])).api_keys == ()


def test_gpu_memory_utilization_reaches_the_engine_on_a_gpu() -> None:
    args = parse_checked(["up", "--device", "cuda", "--gpu-memory-utilization", "0.85"])
    assert engine_config_from_args(args).gpu_memory_utilization == 0.85
    from_env = parse_checked(["up", "--device", "cuda:1"], {"DSPARK_GPU_MEMORY_UTILIZATION": "1"})
    assert engine_config_from_args(from_env).gpu_memory_utilization == 1.0
    unset = engine_config_from_args(parse_checked(["up", "--device", "cuda"]))
    assert unset.gpu_memory_utilization is None and unset.kv_memory_fraction == 0.6


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu-memory-utilization", "0"], "argument --gpu-memory-utilization: 0 is not a fraction in (0, 1]"),
        (["--gpu-memory-utilization", "1.5"], "argument --gpu-memory-utilization: 1.5 is not a fraction in (0, 1]"),
        (["--gpu-memory-utilization", "nan"], "argument --gpu-memory-utilization: nan is not a fraction in (0, 1]"),
        (["--gpu-memory-utilization", "most"], "argument --gpu-memory-utilization: 'most' is not a number"),
        (
            ["--device", "cpu", "--gpu-memory-utilization", "0.9"],
            "--gpu-memory-utilization sizes the KV pool from GPU memory, and this engine runs on CPU (--device "
            "cpu); size it with --kv-cache-memory-bytes",
        ),
        (
            ["--device", "cuda", "--gpu-memory-utilization", "0.9", "--kv-cache-memory-bytes", "1073741824"],
            "--gpu-memory-utilization and --kv-cache-memory-bytes both size the KV pool; give one",
        ),
    ],
)
def test_gpu_memory_utilization_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(["up", *argv], capsys) == f"dspark-serve up: error: {message}"


def test_chat_template_from_a_file_or_inline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    path = tmp_path / "plain.jinja"
    path.write_text(template)
    from_file = parse_checked(["up", "--device", "cpu", "--chat-template", str(path)])
    assert engine_config_from_args(from_file).chat_template == template
    inline = parse_checked(["worker", "--device", "cpu", "--chat-template", template])
    assert engine_config_from_args(inline).chat_template == template
    from_env = parse_checked(["up", "--device", "cpu"], {"DSPARK_CHAT_TEMPLATE": str(path)})
    assert engine_config_from_args(from_env).chat_template == template
    assert engine_config_from_args(parse_checked(["up", "--device", "cpu"])).chat_template is None
    missing = tmp_path / "missing.jinja"
    assert usage_error(["up", "--chat-template", str(missing)], capsys) == (
        f"dspark-serve up: error: argument --chat-template: {str(missing)!r} is neither a file nor an inline "
        "Jinja template (it holds no '{{' or '{%')"
    )
    assert usage_error(["up", "--device", "cpu", "--chat-template", "{{ messages"], capsys).startswith(
        "dspark-serve up: error: chat template, line 1: unexpected end of template"
    )


def test_scheduling_reaches_the_engine_from_the_flag_or_the_environment() -> None:
    assert engine_config_from_args(parse_checked(["up"])).scheduling == "auto"
    assert engine_config_from_args(parse_checked(["up", "--scheduling", "mixed"])).scheduling == "mixed"
    assert engine_config_from_args(parse_checked(["up"], {"DSPARK_SCHEDULING": "mixed"})).scheduling == "mixed"


def test_enable_prefix_caching_is_prefix_cache() -> None:
    assert parse_checked(["up", "--device", "cpu", "--no-enable-prefix-caching"]).prefix_cache is False
    assert parse_checked(["up", "--device", "cpu", "--enable-prefix-caching"]).prefix_cache is True
    args = parse_checked(["up", "--device", "cpu"], {"DSPARK_ENABLE_PREFIX_CACHING": "false"})
    assert args.prefix_cache is False and engine_config_from_args(args).enable_prefix_cache is False
    agreeing = {"DSPARK_ENABLE_PREFIX_CACHING": "off", "DSPARK_PREFIX_CACHE": "0"}
    assert parse_checked(["up", "--device", "cpu"], agreeing).prefix_cache is False


def test_two_spellings_of_one_option_disagreeing_in_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    env = {"DSPARK_PREFIX_CACHE": "on", "DSPARK_ENABLE_PREFIX_CACHING": "off"}
    assert usage_error(["up"], capsys, env) == (
        "dspark-serve up: error: environment variables DSPARK_PREFIX_CACHE='on' and "
        "DSPARK_ENABLE_PREFIX_CACHING='off' set one option to different values"
    )


def test_enable_auto_tool_choice_is_accepted_and_changes_nothing() -> None:
    plain = parse_checked(["up", "--device", "cpu", "--tool-call-parser", "hermes"])
    flagged = parse_checked(["up", "--device", "cpu", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"])
    assert flagged.enable_auto_tool_choice is True
    assert gateway_config_from_args(flagged) == gateway_config_from_args(plain)
    assert parse_checked(["gateway"], {"DSPARK_ENABLE_AUTO_TOOL_CHOICE": "1"}).enable_auto_tool_choice is True


def test_speculative_config_maps_onto_speculative_drafter_and_gamma() -> None:
    def spec(*argv: str, env: dict[str, str] | None = None) -> SpeculativeConfig | None:
        return engine_config_from_args(parse_checked(["up", "--device", "cpu", *argv], env)).speculative

    full = spec("--speculative-config", '{"method": "dspark", "model": "/drafters/x", "num_speculative_tokens": 6}')
    assert full == SpeculativeConfig(drafter="/drafters/x", gamma=6, max_batch_size=CPU_SPECULATIVE_MAX_BATCH_SIZE)
    assert full == spec("--speculative", "on", "--drafter", "/drafters/x", "--gamma", "6")
    assert spec("--speculative-config", '{"method": "dspark"}') == SpeculativeConfig(max_batch_size=4)
    assert spec("--speculative-config", "{}") == SpeculativeConfig(max_batch_size=4)  # float32 CPU: auto is off
    agreeing = spec("--gamma", "6", "--speculative", "on", "--speculative-config", '{"num_speculative_tokens": 6}')
    assert agreeing is not None and agreeing.gamma == 6
    mixed = spec("--drafter", "/d", "--speculative-config", '{"num_speculative_tokens": 3}')
    assert mixed is not None and (mixed.drafter, mixed.gamma) == ("/d", 3)
    from_env = spec(env={"DSPARK_SPECULATIVE_CONFIG": '{"method": "dspark", "num_speculative_tokens": 5}'})
    assert from_env is not None and from_env.gamma == 5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--speculative-config", '{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B"}'],
            "argument --speculative-config: method 'eagle' is not supported: dspark-serve drafts with DSpark only "
            "(method 'dspark')",
        ),
        (
            ["--speculative-config", '{"method": "dspark", "draft_tensor_parallel_size": 1}'],
            "argument --speculative-config: unknown key(s) 'draft_tensor_parallel_size'; dspark-serve reads "
            "method, model, num_speculative_tokens",
        ),
        (
            ["--speculative-config", '{"num_speculative_tokens": "5"}'],
            "argument --speculative-config: num_speculative_tokens must be a positive integer, got '5'",
        ),
        (
            ["--speculative-config", '{"model": ""}'],
            "argument --speculative-config: model must be the drafter's checkpoint directory, got ''",
        ),
        (
            ["--speculative-config", "dspark"],
            "argument --speculative-config: not JSON (Expecting value: line 1 column 1 (char 0))",
        ),
        (
            ["--speculative-config", '["dspark"]'],
            'argument --speculative-config: expected a JSON object such as {"method": "dspark", '
            '"num_speculative_tokens": 8}',
        ),
        (
            ["--speculative", "off", "--speculative-config", '{"method": "dspark"}'],
            "--speculative-config turns DSpark on; it conflicts with --speculative off",
        ),
        (
            ["--drafter", "/a", "--speculative-config", '{"model": "/b"}'],
            "--speculative-config model '/b' conflicts with --drafter '/a'",
        ),
        (
            ["--gamma", "4", "--speculative-config", '{"num_speculative_tokens": 8}'],
            "--speculative-config num_speculative_tokens 8 conflicts with --gamma 4",
        ),
    ],
)
def test_speculative_config_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(["up", "--device", "cpu", *argv], capsys) == f"dspark-serve up: error: {message}"


def test_tp_is_tensor_parallel_size() -> None:
    args = parse_checked(["worker", "-tp", "4", "--device", "cuda"])
    assert args.tensor_parallel_size == 4 and engine_config_from_args(args).tensor_parallel_size == 4
    assert parse_checked(["up", "--tensor-parallel-size", "2", "--device", "cuda"]).tensor_parallel_size == 2


def test_up_help_lists_the_vllm_spellings() -> None:
    """The installed entry point, as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "up", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for expected in (
        "[MODEL]",
        "--api-key KEY",
        "--gpu-memory-utilization F",
        "--chat-template PATH_OR_TEMPLATE",
        "--enable-prefix-caching, --no-enable-prefix-caching",
        "[env: DSPARK_PREFIX_CACHE, DSPARK_ENABLE_PREFIX_CACHING]",
        "--tool-call-parser TOOL_CALL_PARSER",
        "--enable-auto-tool-choice",
        "--speculative-config JSON",
        "--tensor-parallel-size N, -tp N",
        "[env: DSPARK_SPECULATIVE_CONFIG]",
        "[env: DSPARK_GPU_MEMORY_UTILIZATION]",
    ):
        assert expected in text, expected
