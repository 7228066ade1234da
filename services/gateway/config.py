"""Gateway settings (the CLI fills them from flags and DSPARK_* variables)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.gateway.pool import PoolConfig
from services.gateway.protocol import MAX_N
from services.router import RouterConfig


@dataclass(frozen=True)
class AdmissionConfig:
    """What one request may ask of the gateway and the workers (docs/design.md §6.8)."""

    max_choices_per_request: int = 128  # prompts x n
    # sum over the choices of (prompt tokens + max_tokens); None: 16 x the model's context
    # length, what one prompt with the largest n may already ask for
    max_tokens_per_request: int | None = None
    tokenizer_threads: int = 2  # threads decoding, rendering and tokenising request bodies
    rate_limit_rpm: int = 0  # requests per minute per API key (client address without keys); 0: off
    rate_limit_tpm: int = 0  # prompt + completion tokens per minute, likewise; 0: off
    body_timeout_s: float = 60.0  # the whole body must arrive within this (408 after)

    def __post_init__(self) -> None:
        if self.max_choices_per_request < 1:
            raise ValueError(f"max_choices_per_request must be >= 1, got {self.max_choices_per_request}")
        if self.max_tokens_per_request is not None and self.max_tokens_per_request < 2:
            raise ValueError(f"max_tokens_per_request must be >= 2, got {self.max_tokens_per_request}")
        if self.tokenizer_threads < 1:
            raise ValueError(f"tokenizer_threads must be >= 1, got {self.tokenizer_threads}")
        if self.rate_limit_rpm < 0 or self.rate_limit_tpm < 0:
            raise ValueError("rate limits must be >= 0 (0: off)")
        if self.body_timeout_s <= 0:
            raise ValueError(f"body_timeout_s must be > 0, got {self.body_timeout_s}")

    def tokens_per_request(self, max_model_len: int) -> int:
        if self.max_tokens_per_request is not None:
            return self.max_tokens_per_request
        return MAX_N * max_model_len


@dataclass(frozen=True)
class GatewayConfig:
    # ids the model is served as: /v1/models lists them, responses report the first; requests may
    # also name the workers' own id
    served_model_names: tuple[str, ...] = ()
    api_keys: tuple[str, ...] = ()  # empty: no authentication
    tool_call_parser: str | None = None  # None: chosen from the chat template (tool_parsers.parser_for)
    max_body_bytes: int = 8 * 1024 * 1024
    add_timeout_s: float = 60.0  # a worker must accept (or refuse) a request within this
    kv_transfer_timeout_s: float = 30.0
    retry_after_s: int = 1
    migration_limit: int = 3  # moves of a request off dead or draining workers (docs/design.md §5.6)
    shutdown_grace_s: float = 30.0  # after SIGTERM, for running requests to finish (§6.9)
    request_timeout_s: float | None = None  # arrival to last byte (§6.10); None: no limit
    queue_timeout_s: float | None = None  # arrival to first token; None: no limit
    keepalive_s: float = 15.0  # a silent stream sends an SSE comment this often
    pool: PoolConfig = field(default_factory=PoolConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.kv_transfer_timeout_s <= 0:
            raise ValueError(f"kv_transfer_timeout_s must be > 0, got {self.kv_transfer_timeout_s}")
        if self.migration_limit < 0:
            raise ValueError(f"migration_limit must be >= 0, got {self.migration_limit}")
        for name in ("request_timeout_s", "queue_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 (or None for no limit), got {value}")
        if self.keepalive_s <= 0:
            raise ValueError(f"keepalive_s must be > 0, got {self.keepalive_s}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        if any(not key for key in self.api_keys):
            raise ValueError("api_keys must not contain empty keys")
        if self.tool_call_parser is not None:
            from services.gateway.tool_parsers import PARSERS

            if self.tool_call_parser not in PARSERS:
                raise ValueError(
                    f"tool_call_parser: unknown {self.tool_call_parser!r}; known: {', '.join(sorted(PARSERS))}"
                )
