"""engine.sampling.logprobs against torch.log_softmax."""

from __future__ import annotations

import torch

from engine.sampling.logprobs import compute_logprobs


def test_top_and_chosen_logprobs_match_log_softmax() -> None:
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0)) * 4
    tokens = torch.tensor([0, 17, 299, 5, 5])
    result = compute_logprobs(logits, tokens, num_top=7)
    reference = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(result.chosen, reference.gather(1, tokens[:, None])[:, 0])
    expected_values, expected_ids = reference.topk(7, dim=-1)
    assert result.top_ids.shape == (5, 7) and result.top_logprobs.dtype == torch.float32
    assert torch.equal(result.top_ids, expected_ids)
    torch.testing.assert_close(result.top_logprobs, expected_values)


def test_zero_top_means_chosen_only_and_half_precision_is_accepted() -> None:
    logits = torch.randn(3, 50).to(torch.bfloat16)
    result = compute_logprobs(logits, torch.tensor([1, 2, 3]), num_top=0)
    assert result.top_ids.shape == (3, 0) and result.top_logprobs.shape == (3, 0)
    torch.testing.assert_close(result.chosen, torch.log_softmax(logits.float(), -1)[[0, 1, 2], [1, 2, 3]])
