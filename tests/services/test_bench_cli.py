"""`dspark-serve bench` as a user runs it: its own environment variables, its live progress,
and no credential in anything it prints or writes, against the real in-process gateway (with
API keys) over the embedded model."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.bench.client import RequestResult
from services.bench.progress import BenchProgress
from services.bench.redact import REDACTED, Redactor
from services.cli import build_parser
from services.cli import main as cli_main
from services.gateway import GatewayConfig
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import MODEL, start_gateway
from tests.services.serving import wait_ready

pytestmark = pytest.mark.timeout(600)

KEY = "sk-bench-7f3a9c1e5d"
WRONG_KEY = "sk-wrong-42b8e6d0a1"
URL_PASSWORD = "pw-c0ffee-9d2b"


@pytest.fixture(scope="module")
def keyed_url(loop: EngineLoop) -> Iterator[str]:
    """A gateway that accepts only `KEY`."""
    with start_gateway(loop, GatewayConfig(api_keys=(KEY,))) as base:
        wait_ready(base, 60)
        yield base


def bench_argv(url: str, out: Path, *extra: str) -> list[str]:
    """A short random workload: two levels of three requests, a few tokens each."""
    return [
        "bench",
        "--url",
        url,
        "--workload",
        "random",
        "--input-len",
        "12",
        "--output-len",
        "4",
        "--concurrency",
        "1,2",
        "--num-requests",
        "3",
        "--temperature",
        "0",
        "--output-dir",
        str(out),
        *extra,
    ]


def run_bench(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr("sys.argv", ["dspark-serve", *argv])  # what the JSON records as its command
    return cli_main(argv)


def assert_nowhere(secrets: tuple[str, ...], out: Path, printed: str) -> None:
    files = sorted(out.iterdir())
    assert {f.suffix for f in files} == {".json", ".md", ".png"}
    for path in files:
        content = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in content, f"{secret} in {path.name}"
    for secret in secrets:
        assert secret not in printed


def test_bench_reads_only_its_own_variables(capsys: pytest.CaptureFixture[str]) -> None:
    server_env = {"DSPARK_MODEL": "server-model", "DSPARK_SEED": "7", "DSPARK_API_KEYS": KEY, "DSPARK_PORT": "9"}
    bench = build_parser(server_env).parse_args(["bench"])
    assert bench.model is None and bench.seed == 0 and bench.api_key is None
    assert bench.url == "http://127.0.0.1:8000" and bench.progress == "auto"
    own = {
        "DSPARK_BENCH_MODEL": "peer-model",
        "DSPARK_BENCH_API_KEY": KEY,
        "DSPARK_BENCH_PROGRESS": "lines",
        "DSPARK_BENCH_PROGRESS_INTERVAL": "2.5",
    }
    bench = build_parser(server_env | own).parse_args(["bench", "--progress", "off"])
    assert bench.model == "peer-model" and bench.api_key == KEY and bench.progress_interval == 2.5
    assert bench.progress == "off"  # the command line wins
    assert build_parser(own).parse_args(["up"]).model == build_parser({}).parse_args(["up"]).model
    with pytest.raises(SystemExit):
        build_parser({"DSPARK_BENCH_PROGRESS": "blink"})
    assert "DSPARK_BENCH_PROGRESS" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["bench", "--progress-interval", "0"])
    assert "--progress-interval" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["bench", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "[env: DSPARK_BENCH_API_KEY]" in help_text and "[env: DSPARK_MODEL]" not in help_text


def test_a_keyed_run_keeps_its_key_out_of_every_output(
    keyed_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    assert run_bench(bench_argv(keyed_url, out, "--api-key", KEY, "--progress", "lines"), monkeypatch) == 0
    printed = capsys.readouterr()
    report = json.loads((out / "bench_random.json").read_text())
    # every request carried the key (the gateway refuses any other), and the model came from /v1/models
    assert [(level["completed"], level["failed"]) for level in report["levels"]] == [(3, 0), (3, 0)]
    assert report["meta"]["model"] == MODEL and report["meta"]["run"]["api_key"] == REDACTED
    assert f"--api-key {REDACTED}" in report["meta"]["command"]
    assert_nowhere((KEY,), out, printed.out + printed.err)
    # stderr is not a terminal here: plain progress lines, one per level at its end, no redraws
    assert "\r" not in printed.err
    assert "bench: c=1 done in" in printed.err and "bench: c=2 done in" in printed.err
    assert "3 ok, 0 failed" in printed.err

    env_out = tmp_path / "env"
    monkeypatch.setenv("DSPARK_BENCH_API_KEY", KEY)
    assert run_bench(bench_argv(keyed_url, env_out, "--progress", "off"), monkeypatch) == 0
    printed = capsys.readouterr()
    assert json.loads((env_out / "bench_random.json").read_text())["levels"][1]["completed"] == 3
    assert "bench: c=1" not in printed.err
    assert_nowhere((KEY,), env_out, printed.out + printed.err)


def test_refused_requests_are_reported_without_the_credentials(
    keyed_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = keyed_url.replace("http://", f"http://bench:{URL_PASSWORD}@")
    monkeypatch.setenv("DSPARK_BENCH_API_KEY", WRONG_KEY)
    assert run_bench(bench_argv(url, tmp_path / "discover"), monkeypatch) == 2  # /v1/models refuses the key
    printed = capsys.readouterr()
    assert "cannot list the models" in printed.err and "401" in printed.err
    for secret in (WRONG_KEY, URL_PASSWORD):
        assert secret not in printed.out + printed.err

    out = tmp_path / "refused"
    assert run_bench(bench_argv(url, out, "--model", MODEL), monkeypatch) == 0
    printed = capsys.readouterr()
    report = json.loads((out / "bench_random.json").read_text())
    assert [(level["completed"], level["failed"]) for level in report["levels"]] == [(0, 3), (0, 3)]
    assert all(error.startswith("HTTP 401") for level in report["levels"] for error in level["errors"])
    assert report["meta"]["url"] == f"http://bench:{REDACTED}@" + keyed_url.removeprefix("http://")
    assert "requests failed" in printed.err
    assert_nowhere((WRONG_KEY, URL_PASSWORD), out, printed.out + printed.err)


def test_the_redactor_replaces_every_secret_in_nested_values() -> None:
    redact = Redactor.for_run(KEY, f"http://u:{URL_PASSWORD}@h:1/v1")
    echoed = {"errors": (f"HTTP 401: bad key {KEY}",), "urls": [f"http://u:{URL_PASSWORD}@h:1"], "n": 3}
    assert redact.value(echoed) == {
        "errors": (f"HTTP 401: bad key {REDACTED}",),
        "urls": [f"http://u:{REDACTED}@h:1"],
        "n": 3,
    }
    assert Redactor.for_run(None, "http://h:1").secrets == ()


def ok(ttft_s: float, itl_s: list[float], tokens: int) -> RequestResult:
    return RequestResult(ok=True, start_s=0.0, end_s=1.0, ttft_s=ttft_s, itl_s=itl_s, output_tokens=tokens)


def show(progress: BenchProgress, results: list[RequestResult], *, num_requests: int | None, run_s: float) -> None:
    """One level of `progress` that sees `results` finish, then runs on for `run_s` seconds."""

    async def level() -> None:
        duration_s = None if num_requests is not None else run_s
        async with progress.level(2, duration_s=duration_s, num_requests=num_requests) as on_result:
            for result in results:
                on_result(result)
            await asyncio.sleep(run_s)

    asyncio.run(level())


def test_progress_lines_and_bar() -> None:
    results = [ok(0.1, [0.02, 0.04], 3), ok(0.3, [], 1), RequestResult(ok=False, start_s=0, end_s=1, error="x")]
    log = io.StringIO()
    lines = BenchProgress("auto", interval_s=0.05, stream=log)
    assert lines.mode == "lines"  # not a terminal
    show(lines, results, num_requests=4, run_s=0.2)
    printed = log.getvalue().splitlines()
    assert len(printed) >= 3 and "\r" not in log.getvalue()
    assert printed[0].startswith("bench: c=2 3/4 requests: 2 ok, 1 failed, ")
    assert "TTFT p50 200 ms, ITL mean 30.0 ms" in printed[0]
    assert printed[-1].startswith("bench: c=2 done in 0.2 s: 2 ok, 1 failed")

    terminal = io.StringIO()
    show(BenchProgress("bar", stream=terminal), results, num_requests=None, run_s=0.6)
    drawn = terminal.getvalue()
    assert drawn.startswith("\rc=2") and "/0.6 s" in drawn and "2 ok, 1 failed" in drawn

    silent = io.StringIO()
    show(BenchProgress("off", stream=silent), results, num_requests=3, run_s=0.0)
    assert silent.getvalue() == ""
    with pytest.raises(ValueError):
        BenchProgress("blink")
