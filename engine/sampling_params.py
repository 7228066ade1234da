"""Per-request sampling and stopping parameters, validated once at the boundary."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from engine.structured.spec import GrammarSpec

MAX_LOGPROBS = 20
# OpenAI's limits on `logit_bias`: at most 300 entries, each bias in [-100, 100].
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0
# Below this a temperature divides logits past float32 range (inf - inf = NaN in softmax):
# such requests are greedy, as in vLLM.
GREEDY_TEMPERATURE = 1e-5


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field_name}: {message}")


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class LogitBias(Mapping[int, float]):
    """An immutable token id -> bias map, ids ascending. Hashable and picklable, so a
    SamplingParams holding one stays a frozen value that crosses process boundaries."""

    def __init__(self, biases: Mapping[int, float]) -> None:
        self._pairs = tuple(sorted((int(t), float(b)) for t, b in biases.items()))
        self._by_id = dict(self._pairs)

    def __getitem__(self, token_id: int) -> float:
        return self._by_id[token_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._pairs)

    def __hash__(self) -> int:
        return hash(self._pairs)

    def __repr__(self) -> str:
        return f"LogitBias({self._by_id!r})"


def _logit_bias(value: object) -> LogitBias | None:
    """OpenAI's `logit_bias` (token id -> bias), validated; None when absent or empty."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"logit_bias: must be a mapping of token id to bias, got {value!r}")
    _require(
        len(value) <= MAX_LOGIT_BIAS_ENTRIES,
        "logit_bias",
        f"at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(value)}",
    )
    for token_id, bias in value.items():
        _require(
            isinstance(token_id, int) and not isinstance(token_id, bool) and token_id >= 0,
            "logit_bias",
            f"token ids must be integers >= 0, got {token_id!r}",
        )
        _require(
            _finite(bias) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS,
            "logit_bias",
            f"biases must be finite numbers in [-100, 100], got {bias!r} for token {token_id}",
        )
    return LogitBias(value) if value else None


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 (or below GREEDY_TEMPERATURE) means greedy. top_k <= 0 and top_p == 1
    and min_p == 0 disable those filters. `seed` makes a request's samples reproducible
    whatever else is batched with it. Penalties follow OpenAI (frequency/presence, over
    generated tokens) and HF (repetition, over prompt and generated tokens). `logit_bias`
    follows OpenAI (docs/design.md §2.4)."""

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
    # Logprobs of the prompt's tokens 1.. (each under the model at the position before), with
    # top-N alternatives; 0 = only the prompt token. max_tokens 0 with them scores a prompt
    # without generating (docs/design.md §2.4).
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # OpenAI `logit_bias`: token id -> bias in [-100, 100] added to the logits the token is
    # sampled from (not to the reported logprobs). Stored as a LogitBias; {} becomes None.
    logit_bias: Mapping[int, float] | None = None
    # Structured output: the grammar every generated token must follow (docs/design.md §2.8).
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.stop_token_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        self._validate()

    def _validate(self) -> None:
        _require(
            isinstance(self.max_tokens, int)
            and not isinstance(self.max_tokens, bool)
            and (self.max_tokens >= 1 or (self.max_tokens == 0 and self.prompt_logprobs is not None)),
            "max_tokens",
            f"must be an integer >= 1 (0 only with prompt_logprobs), got {self.max_tokens!r}",
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
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _require(
                value is None
                or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_LOGPROBS),
                name,
                f"must be None or an integer in [0, {MAX_LOGPROBS}], got {value!r}",
            )
        if self.grammar is not None:
            _require(isinstance(self.grammar, GrammarSpec), "grammar", f"must be a GrammarSpec, got {self.grammar!r}")
            # A finished grammar allows only stop tokens: both options would forbid them.
            _require(not self.ignore_eos, "ignore_eos", "cannot be combined with a grammar")
            _require(self.min_tokens == 0, "min_tokens", "cannot be combined with a grammar")

    def check_vocab(self, vocab_size: int) -> None:
        """The checks that need the model's vocabulary: every logit_bias id in [0, vocab_size)."""
        if self.logit_bias:
            largest = max(self.logit_bias)
            _require(
                largest < vocab_size,
                "logit_bias",
                f"token id {largest} is out of range [0, {vocab_size})",
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
