"""What one request may ask for (docs/design.md §6.8): at most `max_choices_per_request`
choices (prompts x n) and at most `max_tokens_per_request` tokens, counted before the work
they bound is done.

The choices are counted on the raw body, before it is validated or anything is tokenised: a
body of a million one-character prompts is refused for the cost of reading it. The tokens are
the sum over the choices of prompt tokens plus the most each choice may generate (its
max_tokens, or the rest of the context when unset): what the request may cost a worker.
The completion part is checked before tokenising; the prompt part prompt by prompt while
tokenising, which stops at the first prompt past the limit.
"""

from __future__ import annotations

import sys
import threading

from services.gateway.errors import InvalidRequest


def prompt_count(prompt: object) -> int:
    """How many prompts a completion's `prompt` holds, from its shape alone (reads a raw body
    as well as a validated one): a string or a list of token ids is one prompt; a list of
    strings or of id lists is one per item."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def check_choices(num_prompts: int, n: int, limit: int) -> None:
    """400 naming `prompt` when the prompts alone pass the limit, else `n`."""
    if num_prompts * n <= limit:
        return
    param = "prompt" if num_prompts > limit else "n"
    raise InvalidRequest(
        f"{param}: {num_prompts} prompt(s) with n={n} ask for {num_prompts * n} choices; "
        f"this server takes at most {limit} per request",
        param=param,
        code="too_many_choices",
    )


class RequestAbandoned(Exception):
    """The request's client left: its preparation stops at the next prompt."""


class TokenBudget:
    """The tokens one request may ask for, filled as its prompts are tokenised.

    Lives in one preparation thread; `abandon` alone is called from the event loop."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._abandoned = threading.Event()

    @classmethod
    def unlimited(cls) -> TokenBudget:
        return cls(sys.maxsize)

    def abandon(self) -> None:
        self._abandoned.set()

    def checkpoint(self) -> None:
        """Raise RequestAbandoned once the client has left (called before each prompt)."""
        if self._abandoned.is_set():
            raise RequestAbandoned

    def check_completions(self, choices: int, max_tokens: int | None, max_model_len: int, param: str) -> None:
        """Before any tokenising: the completion tokens alone must fit. A choice takes at most
        the context (a larger max_tokens is the context-length error, once the prompt is known)."""
        if max_tokens is None or max_tokens < 1:
            return
        tokens = choices * min(max_tokens, max_model_len)
        if tokens > self.limit:
            raise self._exceeded(param, tokens, "max_tokens over the choices")

    def take(self, prompt_tokens: int, max_tokens: int, n: int, param: str) -> None:
        """One prompt's share: its n choices of `prompt_tokens + max_tokens` each."""
        self.checkpoint()
        self.used += (prompt_tokens + max_tokens) * n
        if self.used > self.limit:
            raise self._exceeded(param, self.used, "prompt tokens plus max_tokens, summed over the choices so far")

    def _exceeded(self, param: str, tokens: int, what: str) -> InvalidRequest:
        return InvalidRequest(
            f"{param}: the request asks for at least {tokens} tokens ({what}); "
            f"this server takes at most {self.limit} per request",
            param=param,
            code="too_many_tokens",
        )
