"""Per-request sampling and stopping parameters, validated once at the boundary."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_LOGPROBS = 20
# Below this a temperature divides logits past float32 range (inf - inf = NaN in softmax):
# such requests are greedy, as in vLLM.
GREEDY_TEMPERATURE = 1e-5


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field_name}: {message}")


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 (or below GREEDY_TEMPERATURE) means greedy. top_k <= 0 and top_p == 1
    and min_p == 0 disable those filters. `seed` makes a request's samples reproducible
    whatever else is batched with it. Penalties follow OpenAI (frequency/presence, over
    generated tokens) and HF (repetition, over prompt and generated tokens)."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top-N alternatives per token; 0 = only the chosen token
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.stop_token_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self._validate()

    def _validate(self) -> None:
        _require(
            isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool) and self.max_tokens >= 1,
            "max_tokens",
            f"must be an integer >= 1, got {self.max_tokens!r}",
        )
        _require(
            isinstance(self.min_tokens, int)
            and not isinstance(self.min_tokens, bool)
            and 0 <= self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"must be an integer in [0, max_tokens], got {self.min_tokens!r}",
        )
        _require(
            _finite(self.temperature) and 0.0 <= self.temperature <= 100.0,
            "temperature",
            f"must be a finite number in [0, 100], got {self.temperature!r}",
        )
        _require(_finite(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        _require(
            isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= -1,
            "top_k",
            f"must be an integer >= -1 (0 or -1 disables), got {self.top_k!r}",
        )
        _require(_finite(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p!r}")
        _require(
            self.seed is None
            or (isinstance(self.seed, int) and not isinstance(self.seed, bool) and -(2**63) <= self.seed < 2**64),
            "seed",
            f"must be an integer or None, got {self.seed!r}",
        )
        _require(
            _finite(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 10.0,
            "repetition_penalty",
            f"must be in (0, 10], got {self.repetition_penalty!r}",
        )
        _require(
            _finite(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty!r}",
        )
        _require(
            _finite(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"must be in [-2, 2], got {self.presence_penalty!r}",
        )
        _require(
            all(isinstance(s, str) and s for s in self.stop), "stop", f"must be non-empty strings, got {self.stop!r}"
        )
        _require(len(self.stop) <= 16, "stop", f"at most 16 stop strings, got {len(self.stop)}")
        _require(
            all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            f"must be non-negative integers, got {self.stop_token_ids!r}",
        )
        _require(
            self.logprobs is None
            or (
                isinstance(self.logprobs, int)
                and not isinstance(self.logprobs, bool)
                and 0 <= self.logprobs <= MAX_LOGPROBS
            ),
            "logprobs",
            f"must be None or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
