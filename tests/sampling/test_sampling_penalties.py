"""engine.sampling.penalties against a one-row-at-a-time reference (HF repetition penalty,
OpenAI frequency/presence) and against transformers' own RepetitionPenaltyLogitsProcessor."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from sampling_reference import reference_penalties

from engine.sampling.penalties import PenaltyState
from engine.sampling.tensors import SamplingTensors
from engine.sampling_params import SamplingParams

VOCAB = 60


def _tensors(params: list[SamplingParams]) -> SamplingTensors:
    return SamplingTensors.from_params(params, [0] * len(params), "cpu", vocab_size=VOCAB)


def _pad(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int64)


def test_state_is_allocated_on_first_reset_only() -> None:
    state = PenaltyState(max_rows=4, vocab=VOCAB, device="cpu")
    logits = torch.randn(2, VOCAB)
    st = _tensors([SamplingParams(repetition_penalty=2.0)] * 2)
    assert not state.allocated
    state.update(torch.tensor([0, 1]), torch.tensor([[3], [4]]))  # no-op
    assert state.apply(logits, torch.tensor([0, 1]), st) is logits
    state.reset(1, [5, 6])
    assert state.allocated and state.output_counts is not None
    assert state.output_counts.shape == (4, VOCAB) and state.output_counts.dtype == torch.int32


def test_penalties_match_reference_over_several_steps() -> None:
    rand = random.Random(0)
    state = PenaltyState(max_rows=6, vocab=VOCAB, device="cpu")
    params = [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(frequency_penalty=0.7, presence_penalty=-0.4),
        SamplingParams(repetition_penalty=0.8, frequency_penalty=-1.0, presence_penalty=1.5),
        SamplingParams(),  # neutral: untouched
    ]
    rows = [4, 0, 2, 5]  # PenaltyState rows of batch rows 0..3
    prompts = [[rand.randrange(VOCAB) for _ in range(rand.randint(0, 12))] for _ in params]
    outputs: list[list[int]] = [[] for _ in params]
    for b, row in enumerate(rows):
        state.reset(row, prompts[b])
    state.update(torch.tensor([1, 3]), torch.tensor([[7, 7], [8, -1]]))  # other rows: must not leak
    state.reset(1, [])
    state.reset(3, [])
    st = _tensors(params)
    rows_d = torch.tensor(rows)
    for _ in range(4):
        new = [[rand.randrange(VOCAB) for _ in range(rand.randint(0, 3))] for _ in params]
        state.update(rows_d, _pad(new, 3))
        for b in range(len(params)):
            outputs[b] += new[b]
        logits = torch.randn(len(params), VOCAB) * 3
        got = state.apply(logits, rows_d, st)
        for b, p in enumerate(params):
            expected = reference_penalties(logits[b].numpy(), p, prompts[b], outputs[b])
            np.testing.assert_allclose(got[b].numpy(), expected, rtol=1e-6, atol=1e-5)
        assert torch.equal(got[3], logits[3])


def test_reset_forgets_the_previous_request_and_seeds_resumed_outputs() -> None:
    state = PenaltyState(max_rows=2, vocab=VOCAB, device="cpu")
    state.reset(0, [1, 2, 3])
    state.update(torch.tensor([0]), torch.tensor([[9, 9, 9]]))
    state.reset(0, [4], output_ids=[5, 5, 6])  # a preempted request resuming
    assert state.prompt_seen is not None and state.output_counts is not None
    assert state.prompt_seen[0].nonzero().flatten().tolist() == [4]
    assert state.output_counts[0, 5] == 2 and state.output_counts[0, 6] == 1 and state.output_counts[0, 9] == 0


def test_padding_rows_and_tokens_are_ignored() -> None:
    state = PenaltyState(max_rows=3, vocab=VOCAB, device="cpu")
    state.reset(0, [])
    state.update(torch.tensor([-1, 0]), torch.tensor([[1, 2], [-1, 3]]))
    assert state.output_counts is not None
    assert state.output_counts.sum() == 1 and state.output_counts[0, 3] == 1
    logits = torch.randn(2, VOCAB)
    st = _tensors([SamplingParams(frequency_penalty=2.0, repetition_penalty=3.0)] * 2)
    got = state.apply(logits, torch.tensor([-1, 0]), st)
    assert torch.equal(got[0], logits[0])


def test_bad_reset_arguments() -> None:
    state = PenaltyState(max_rows=2, vocab=VOCAB, device="cpu")
    with pytest.raises(ValueError, match="row"):
        state.reset(2, [1])
    with pytest.raises(ValueError, match="prompt_ids"):
        state.reset(0, [VOCAB])


def test_repetition_matches_transformers_processor() -> None:
    processors = pytest.importorskip("transformers.generation.logits_process")
    rand = random.Random(1)
    prompt = [rand.randrange(VOCAB) for _ in range(10)]
    generated = [rand.randrange(VOCAB) for _ in range(6)]
    state = PenaltyState(max_rows=1, vocab=VOCAB, device="cpu")
    state.reset(0, prompt)
    state.update(torch.tensor([0]), torch.tensor([generated]))
    logits = torch.randn(1, VOCAB) * 4
    hf = processors.RepetitionPenaltyLogitsProcessor(penalty=1.7)(torch.tensor([prompt + generated]), logits.clone())
    ours = state.apply(logits, torch.tensor([0]), _tensors([SamplingParams(repetition_penalty=1.7)]))
    torch.testing.assert_close(ours, hf)


def test_extra_counts_act_like_committed_tokens() -> None:
    state = PenaltyState(max_rows=2, vocab=VOCAB, device="cpu")
    st = _tensors([SamplingParams(repetition_penalty=1.4, frequency_penalty=0.3, presence_penalty=0.2)])
    state.reset(1, [2, 3])
    state.update(torch.tensor([1]), torch.tensor([[4, 5]]))
    logits = torch.randn(1, VOCAB) * 3
    extra = torch.zeros(1, VOCAB, dtype=torch.int32)
    extra[0, 5] = 1
    extra[0, 9] = 2
    got = state.apply(logits, torch.tensor([1]), st, extra_counts=extra)
    committed = PenaltyState(max_rows=2, vocab=VOCAB, device="cpu")
    committed.reset(1, [2, 3], output_ids=[4, 5, 5, 9, 9])
    torch.testing.assert_close(got, committed.apply(logits, torch.tensor([1]), st))
