"""The pure parts of benchmarks/cpu_vs_llamacpp.py: command line, prompt ids, sums and rates,
the bars' ratios, greedy agreement, weight-stream figures and tables. Neither llama.cpp nor a
model's weights are needed; the peer itself runs only in the benchmark."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks import cpu_peer_report as report
from benchmarks.cpu_peer_systems import model_weight_bytes
from engine.loader.resolve import resolve_model
from engine.loader.tokenizer import Tokenizer
from tests.data.prompts import CHAT_PROMPTS


def test_defaults_and_plot_path() -> None:
    args = report.parse_args(["--json", "out/cpu.json"])
    assert (args.new_tokens, args.rounds, args.batch, args.native_dtype) == (96, 3, 16, "auto")
    assert args.engine_dtypes == ("float32", "bfloat16")
    assert str(args.plot) == "out/cpu.png"
    assert report.parse_args([]).plot is None
    assert not args.llamacpp_no_repack  # llama.cpp loads as it would by default
    assert report.parse_args(["--llamacpp-no-repack"]).llamacpp_no_repack


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--new-tokens", "0"], ["--threads", "0"], ["--batch", "-1"]])
def test_bad_counts_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        report.parse_args(argv)


def test_engine_dtypes_keep_float32_first_once() -> None:
    assert report.engine_dtypes("bfloat16, float32,bfloat16") == ("float32", "bfloat16")
    assert report.engine_dtypes("") == ("float32",)
    assert [report.engine_row_name(d) for d in ("float32", "bfloat16", "q8")] == [
        report.ENGINE_FP32,
        report.ENGINE_BF16,
        "engine_q8",
    ]


def test_prompt_ids_render_the_chat_template_with_our_tokenizer() -> None:
    tokenizer = Tokenizer.from_source(resolve_model("smollm2-135m"))
    ids = report.prompt_ids(tokenizer, CHAT_PROMPTS[:3])
    assert len(ids) == 3 and len({tuple(p) for p in ids}) == 3
    for conversation, prompt in zip(CHAT_PROMPTS[:3], ids, strict=True):
        rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
        assert tokenizer.decode(prompt, skip_special_tokens=False) == rendered
        assert conversation[-1]["content"] in rendered
    # the template's special tokens are single ids, not spelled out as text
    start = tokenizer.encode("<|im_start|>", add_special_tokens=False)
    assert len(start) == 1 and ids[0][0] == start[0]


def test_timing_sums_and_rates() -> None:
    total = report.Timing(96, 2.0, 95, 1.9) + report.Timing(96, 2.0, 95, 1.9)
    assert total == report.Timing(192, 4.0, 190, 3.8)
    assert total.tokens_per_s == pytest.approx(48.0)
    assert total.decode_tokens_per_s == pytest.approx(50.0)
    assert report.Timing().tokens_per_s == 0.0 and report.Timing().decode_tokens_per_s == 0.0


def test_agreement_counts_tokens_before_the_first_difference() -> None:
    tokens = {
        "a": [[1, 2, 3, 4], [5, 6, 7, 8]],
        "b": [[1, 2, 9, 4], [5, 6, 7, 8]],  # differs at position 2, then equal again: not counted
    }
    result = report.agreement("a", "b", tokens)
    assert result == report.Agreement("a", "b", matching=6, total=8, identical_prompts=1, prompts=2)
    assert report.agreement("a", "missing", tokens) is None
    assert report.common_prefix([1, 2], [1, 2, 3]) == 2


def test_bars_use_decode_rate_at_batch_1_and_total_rate_for_the_batch() -> None:
    timings = {
        report.ENGINE_FP32: report.Timing(96, 3.0, 95, 2.5),  # decode 38/s
        report.LLAMACPP_F32: report.Timing(96, 2.5, 95, 2.0),  # decode 47.5/s
        report.ENGINE_FP32_BATCH: report.Timing(1536, 4.0),  # 384/s, no decode time (prefill incl.)
        report.TRANSFORMERS_BATCH: report.Timing(1536, 12.0),  # 128/s
    }
    by_label = {r.bar.numerator: r for r in report.bar_results(timings)}
    assert by_label[report.ENGINE_FP32].ratio == pytest.approx(38 / 47.5)
    assert by_label[report.ENGINE_FP32].verdict == "below"
    assert by_label[report.ENGINE_NATIVE].ratio is None
    assert by_label[report.ENGINE_NATIVE].verdict == "not run"
    assert by_label[report.ENGINE_FP32_BATCH].ratio == pytest.approx(3.0)
    assert by_label[report.ENGINE_FP32_BATCH].verdict == "meets"
    assert by_label[report.ENGINE_NATIVE_BATCH].verdict == "not run"
    table = report.bars_table(list(by_label.values()))
    assert "| 0.80 | 1 | below |" in table and "| - | 0.8 | not run |" in table


def test_stream_share_in_the_systems_table() -> None:
    assert report.stream_gbs(538_000_000, 35.0) == pytest.approx(18.83)
    rows = [
        report.SystemRow("engine_fp32", "engine float32", 1, report.Timing(96, 3.0, 95, 2.5), 500_000_000),
        report.SystemRow("transformers_batch", "transformers", 16, report.Timing(1536, 12.0), None),
    ]
    table = report.systems_table(rows, read_gbs=38.0)
    # 500 MB x 38 tok/s = 19 GB/s, half of a plain read's 38 GB/s
    assert "| engine_fp32 | engine float32 | 1 | 32.00 (38.00) | 500.00 | 19.0 (50%) |" in table
    assert "| transformers_batch | transformers | 16 | 128.00 (-) | - | - |" in table


def test_model_weight_bytes_counts_a_tied_weight_once() -> None:
    embed = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = nn.ModuleDict({"embed": embed, "head": head, "norm": nn.LayerNorm(4)})
    assert model_weight_bytes(model) == (10 * 4 + 4 + 4) * 4
    model.to(torch.bfloat16)
    assert model_weight_bytes(model) == (10 * 4 + 4 + 4) * 2
