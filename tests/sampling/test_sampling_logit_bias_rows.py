"""The runner's per-row logit-bias state: `LogitBiasTable` is allocated by the first biased
request, grows to wider buckets keeping earlier rows, forgets a reused row's old bias,
never lets an id outside the vocabulary reach the scatter, and gathers what a direct build
gives; every row of a DSpark verify window gets its request's bias (with the penalties it
would see); all of it, admission included, runs under the CPU sync guard."""

from __future__ import annotations

import numpy as np
import torch
from sampling_reference import reference_logit_bias, reference_penalties, reference_probs

from engine.request import Request
from engine.runner.row_sampling import RowSampling
from engine.sampling.logit_bias import LogitBiasTable, batch_bias_width
from engine.sampling.sampler import Sampler, SamplingTensors
from engine.sampling_params import SamplingParams
from engine.sync_guard import SyncGuard

VOCAB = 50
CPU = torch.device("cpu")


def _row(row: int) -> torch.Tensor:
    return torch.tensor([row], dtype=torch.int64)


def _request(params: SamplingParams, row: int, prompt: list[int]) -> Request:
    req = Request(request_id=f"r{row}", prompt_ids=prompt, params=params, arrival_s=0.0, rng_key=100 + row)
    req.row = row
    return req


def test_table_is_allocated_by_the_first_biased_request_only() -> None:
    table = LogitBiasTable(max_rows=4, vocab_size=VOCAB, device=CPU)
    for row in range(4):
        table.set_row(row, None, _row(row))
    assert table.token_ids is None and table.width == 0
    assert table.gather(torch.arange(4), 0) is None
    table.set_row(2, {4: 1.0}, _row(2))
    assert table.width == 8 and table.token_ids is not None
    assert table.gather(torch.arange(4), 0) is None  # a batch without a biased row skips the op


def test_table_gather_matches_the_direct_build() -> None:
    params = [
        SamplingParams(logit_bias={3: 1.0, 9: -2.0}),
        SamplingParams(),
        SamplingParams(logit_bias=dict.fromkeys(range(10, 30), 0.5)),  # 20 entries: width 32
        SamplingParams(logit_bias={49: -100.0}),
    ]
    table = LogitBiasTable(max_rows=8, vocab_size=VOCAB, device=CPU)
    rows = [6, 1, 4, 0]
    for row, p in zip(rows, params, strict=True):
        table.set_row(row, p.logit_bias, _row(row))
    order = [3, 0, 1]  # a batch of three, in another order than admission
    batch = [params[i] for i in order]
    gathered = table.gather(torch.tensor([rows[i] for i in order]), batch_bias_width(batch))
    direct = SamplingTensors.from_params(batch, [0] * 3, CPU, vocab_size=VOCAB).logit_bias
    assert gathered is not None and direct is not None
    assert gathered.token_ids.shape == (3, 8)  # the batch's own width, not the table's 32
    assert torch.equal(gathered.token_ids, direct.token_ids) and torch.equal(gathered.values, direct.values)
    wide = table.gather(torch.tensor(rows), batch_bias_width(params))
    assert wide is not None and wide.token_ids.shape == (4, 32)
    assert wide.token_ids[2, :20].tolist() == list(range(10, 30)) and (wide.token_ids[2, 20:] == -1).all()


def test_the_table_grows_keeping_earlier_rows() -> None:
    table = LogitBiasTable(max_rows=3, vocab_size=VOCAB, device=CPU)
    table.set_row(0, {1: 2.0, 2: 3.0}, _row(0))
    table.set_row(1, dict.fromkeys(range(40), 0.25), _row(1))  # 40 entries: width 64
    assert table.width == 64 and table.token_ids is not None and table.values is not None
    assert table.token_ids[0, :3].tolist() == [1, 2, -1] and table.values[0, :3].tolist() == [2.0, 3.0, 0.0]
    assert (table.token_ids[0, 2:] == -1).all() and (table.token_ids[2] == -1).all()
    assert table.token_ids[1, :40].tolist() == list(range(40))


def test_a_reused_row_forgets_its_previous_bias() -> None:
    table = LogitBiasTable(max_rows=2, vocab_size=VOCAB, device=CPU)
    table.set_row(1, {5: 10.0, 6: -10.0, 7: 1.0}, _row(1))
    table.set_row(1, {8: 1.0}, _row(1))  # the next request in that row
    assert table.token_ids is not None and table.values is not None
    assert table.token_ids[1, :3].tolist() == [8, -1, -1] and table.values[1, :3].tolist() == [1.0, 0.0, 0.0]
    table.set_row(1, None, _row(1))  # then one without a bias
    assert (table.token_ids[1] == -1).all() and (table.values[1] == 0).all()


def test_ids_outside_the_vocabulary_never_reach_the_scatter() -> None:
    """The engine's boundary refuses them (SamplingParams.check_vocab); should one slip
    through, the row keeps its valid ids and the step cannot index past the logits."""
    table = LogitBiasTable(max_rows=1, vocab_size=VOCAB, device=CPU)
    table.set_row(0, {3: 1.0, VOCAB: 5.0, 10 * VOCAB: -5.0}, _row(0))
    bias = table.gather(torch.tensor([0]), 8)
    assert bias is not None and bias.token_ids[0, :2].tolist() == [3, -1]
    logits = torch.zeros(1, VOCAB)
    assert bias.apply(logits)[0].tolist() == [1.0 if t == 3 else 0.0 for t in range(VOCAB)]
    assert (logits == 0).all()  # the raw logits are left intact


def _window_case() -> tuple[RowSampling, list[Request], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three requests in rows 2, 0, 3 of a RowSampling: unbiased sampled, biased greedy with a
    repetition penalty, biased sampled with frequency/presence penalties; a W = 4 window."""
    sampling = RowSampling(max_rows=5, vocab_size=VOCAB, device=CPU)
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, seed=1),
        SamplingParams(temperature=0.0, repetition_penalty=1.5, logit_bias={4: 3.0, 11: -100.0}),
        SamplingParams(temperature=1.2, top_k=12, frequency_penalty=0.8, presence_penalty=0.3, logit_bias={7: 2.0}),
    ]
    prompts = [[1, 2], [4, 5, 11], [7, 8]]
    reqs = [_request(p, row, prompt) for p, row, prompt in zip(params, [2, 0, 3], prompts, strict=True)]
    for req in reqs:
        sampling.set_row(req.row, req.params, req.rng_key, req.prompt_ids, [])
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, VOCAB, generator=gen) * 2  # [B, W, V]
    drafts = torch.tensor([[4, 4, 9], [4, 11, 4], [7, 1, 7]])  # [B, gamma]
    return sampling, reqs, torch.tensor([r.row for r in reqs]), logits, drafts


def test_every_verify_row_gets_its_requests_bias() -> None:
    """Row j of a window: the request's bias, then the penalties counting d_0 .. d_{j-1} as
    generated: the logits greedy acceptance compares against and the law p of sampled
    acceptance, exactly what plain decoding would use at that position."""
    sampling, reqs, rows_d, logits, drafts = _window_case()
    penalized = sampling.penalized(logits, rows_d, drafts, reqs)  # [B, W, V]
    target_probs = sampling.target_probs(logits, rows_d, drafts, reqs)  # [B, W, V]
    for b, req in enumerate(reqs):
        for j in range(logits.shape[1]):
            raw = logits[b, j].numpy()
            generated = drafts[b, :j].tolist()
            expected = reference_penalties(reference_logit_bias(raw, req.params), req.params, req.prompt_ids, generated)
            np.testing.assert_allclose(penalized[b, j].numpy(), expected, rtol=1e-6, atol=1e-5)
            law = reference_probs(expected, req.params)
            np.testing.assert_allclose(target_probs[b, j].double().numpy(), law, atol=1e-6)
    assert (target_probs[1, :, 11] == 0).all()  # banned on every verify row


def test_plain_and_window_sampling_agree_on_the_first_row() -> None:
    """Verify row 0 has no draft before it: its law is the one RowSampling.sample draws from."""
    sampling, reqs, rows_d, logits, drafts = _window_case()
    first = sampling.target_probs(logits, rows_d, drafts, reqs)[:, 0]
    st = sampling.batch(rows_d, reqs)
    assert st.logit_bias is not None and st.logit_bias.token_ids.shape == (3, 8)
    plain = Sampler().processed_probs(logits[:, 0], st, sampling.penalties, rows_d)
    torch.testing.assert_close(first, plain, rtol=0, atol=1e-7)


def test_logit_bias_paths_are_sync_free() -> None:
    sampling = RowSampling(max_rows=6, vocab_size=VOCAB, device=CPU)
    params = [
        SamplingParams(temperature=0.0, logit_bias={3: 100.0}),
        SamplingParams(temperature=0.8, top_k=10, seed=2, logit_bias={5: -100.0, 6: 2.0}, logprobs=2),
        SamplingParams(temperature=1.0, top_p=0.9, frequency_penalty=0.5),
        SamplingParams(temperature=0.7, logit_bias=dict.fromkeys(range(20), 1.0)),
    ]
    reqs = [_request(p, row, [1, 2, 3]) for row, p in enumerate(params)]
    rows_d = torch.tensor([r.row for r in reqs])
    logits = torch.randn(4, VOCAB)
    window = torch.randn(4, 3, VOCAB)
    drafts = torch.tensor([[3, 3], [5, 6], [1, 1], [0, 2]])
    with SyncGuard("cpu") as guard:
        for req in reqs:  # admission happens inside the step loop
            sampling.set_row(req.row, req.params, req.rng_key, req.prompt_ids, [])
        for step in range(3):
            sample = sampling.sample(logits, rows_d, torch.full((4,), 10 + step), reqs)
            sampling.record_outputs(rows_d, sample.tokens[:, None])
            sampling.target_probs(window, rows_d, drafts, reqs)
            sampling.penalized(window, rows_d, drafts, reqs)
            sampling.set_row(0, SamplingParams(temperature=0.0), 7, [1], [])  # row reuse clears
            sampling.set_row(0, params[0], 7, [1], [])
            with guard.permitted("previous step's output tokens"):
                host_tokens = sample.tokens.tolist()
    assert guard.waits == 3
    assert host_tokens[0] == 3 and host_tokens[1] != 5
