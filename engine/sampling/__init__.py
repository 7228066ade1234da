"""Token sampling: counter-based randomness (rng), per-row parameters as device tensors
(tensors), filters, penalties, logit bias, logprobs and the sampler. All of it is fixed-shape
device work with no host reads (docs/design.md §2, §4)."""

from engine.sampling.logit_bias import LogitBiasRows, LogitBiasTable
from engine.sampling.logprobs import TokenLogprobs, compute_logprobs
from engine.sampling.penalties import PenaltyState
from engine.sampling.rng import Stream, request_key, uniform, uniform_at
from engine.sampling.sampler import Sampler, SampleResult, processed_probs, sample_from_probs
from engine.sampling.tensors import SamplingFlags, SamplingTensors

__all__ = [
    "LogitBiasRows",
    "LogitBiasTable",
    "PenaltyState",
    "SampleResult",
    "Sampler",
    "SamplingFlags",
    "SamplingTensors",
    "Stream",
    "TokenLogprobs",
    "compute_logprobs",
    "processed_probs",
    "request_key",
    "sample_from_probs",
    "uniform",
    "uniform_at",
]
