"""The whole sampling path (table gather, penalties, filters, Gumbel draws, logprobs,
processed_probs, penalty updates) runs under SyncGuard on CPU: no host reads anywhere."""

from __future__ import annotations

import torch

from engine.sampling import rng
from engine.sampling.penalties import PenaltyState
from engine.sampling.sampler import Sampler, SamplingTensors, processed_probs
from engine.sampling.tensors import SamplingFlags
from engine.sampling_params import SamplingParams
from engine.sync_guard import SyncGuard


def test_sampling_step_is_sync_free() -> None:
    vocab = 512
    params = [
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(temperature=0.8, top_k=20, seed=1),
        SamplingParams(temperature=1.2, top_p=0.9, min_p=0.05, repetition_penalty=1.2, logprobs=4),
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.3, top_k=50, top_p=0.8),
    ]
    keys = [rng.request_key(p.seed, 0, i) for i, p in enumerate(params)]
    penalties = PenaltyState(max_rows=8, vocab=vocab, device="cpu")
    for row in range(4):
        penalties.reset(row, [row, row + 10, 7])
    table = SamplingTensors.empty(8, "cpu", vocab_size=vocab)
    slots = torch.tensor([3, 0, 1, 2])
    table.write_rows(slots, SamplingTensors.from_params(params, keys, "cpu", vocab_size=vocab))
    flags = SamplingFlags.from_params(params, vocab)
    logits = torch.randn(4, vocab)
    counters = torch.tensor([5, 9, 2, 40])
    sampler = Sampler()
    with SyncGuard("cpu") as guard:
        for step in range(3):
            st = table.gather(slots, flags)
            result = sampler.sample(logits, st, counters + step, penalties, slots)
            probs = processed_probs(logits, st, penalties, slots)
            verify_rows = torch.arange(8) // 2  # a [B*W] expansion, W = 2
            sampler.sample(
                logits[verify_rows],
                st.gather(verify_rows),
                counters[verify_rows],
                penalties,
                slots[verify_rows],
            )
            sparse_st = SamplingTensors.from_params(params[1:2], keys[1:2], "cpu", vocab_size=vocab)
            sampler.sample(logits[:1], sparse_st, counters[:1])
            penalties.update(slots, torch.stack([result.tokens, torch.full_like(result.tokens, -1)], 1))
            with guard.permitted("previous step's output tokens"):
                host_tokens = result.tokens.tolist()
    assert guard.waits == 3
    assert len(host_tokens) == 4 and result.logprobs is not None
    assert result.logprobs.top_ids.shape == (4, 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
