"""Token ids of rendered chat prompts, with the segments between special tokens cached.

A multi-turn conversation is sent whole every turn, and many conversations open with the same
system prompt, so most of a rendered prompt was tokenised before. The Rust tokenizer splits a
text at its special tokens before anything else and tokenises the pieces between them apart,
so the ids of `a + b`, where `b` begins with a special token, are the ids of `a` then those of
`b`. A text is cut where each special token of the chat template begins, and each segment's ids
are kept by the segment's text: they do not depend on what came before it (every segment but
the first begins with a special token, and the first is never anything else), so only the
segments not seen before are tokenised.

That splitting rule is a property of the tokenizer's configuration (normalisers,
pre-tokenisers and the added tokens' `lstrip`, `single_word` and `normalized` flags can break
it), so `segment_cache` never cuts at such tokens, checks the rule on probe texts and gives no
cache where any of them tokenises differently in pieces. The cache holds at most `max_tokens`
ids; past that it starts again empty.
"""

from __future__ import annotations

import re
import threading
from array import array
from collections.abc import Callable, Iterable
from itertools import pairwise
from typing import Any

Encode = Callable[[str], list[int]]  # text -> ids, no special tokens added

_PROBE_BODIES = (
    "system\nYou are a helpful assistant.  ",
    "user\nHi there!\n\n  Two spaces, a tab\tand 3.14159 🙂 é 中文",
    " assistant\n",
    "\n",
    'tool\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n ',
    "",
)


class SegmentCache:
    """`encode(text)` = the tokenizer's ids of `text`, from cached segments where it can."""

    def __init__(self, encode: Encode, boundaries: Iterable[str], max_tokens: int = 1 << 20) -> None:
        self._encode = encode
        self._cut = re.compile("|".join(re.escape(b) for b in sorted(set(boundaries), key=len, reverse=True)))
        self.max_tokens = max_tokens
        self._ids: dict[str, array[int]] = {}  # int64 ids: 8 bytes each, not a Python int's 32
        self._tokens = 0  # ids held
        self._lock = threading.Lock()  # the gateway tokenises on several threads
        self.cached_tokens_served = 0  # ids taken from the cache, for tests and benchmarks

    def segments(self, text: str) -> list[str]:
        """`text` cut where each boundary token begins."""
        edges = [0, *(m.start() for m in self._cut.finditer(text) if m.start() > 0), len(text)]
        return [text[a:b] for a, b in pairwise(edges) if b > a]

    def encode(self, text: str) -> list[int]:
        pieces = self.segments(text)
        if len(pieces) < 2:  # no special token to cut at (a plain completion prompt): not kept
            return self._encode(text)
        with self._lock:
            known = [self._ids.get(piece) for piece in pieces]
            self.cached_tokens_served += sum(len(piece_ids) for piece_ids in known if piece_ids is not None)
        ids: list[int] = []
        fresh: dict[str, array[int]] = {}
        for piece, piece_ids in zip(pieces, known, strict=True):
            if piece_ids is None:
                piece_ids = fresh.get(piece) or array("q", self._encode(piece))
                fresh[piece] = piece_ids
            ids.extend(piece_ids)
        if fresh:
            self._keep(fresh)
        return ids

    def _keep(self, fresh: dict[str, array[int]]) -> None:
        added = sum(len(piece_ids) for piece_ids in fresh.values())
        if added > self.max_tokens:  # one prompt past the whole budget: kept nowhere, nothing dropped
            return
        with self._lock:
            if self._tokens + added > self.max_tokens:
                self._ids, self._tokens = {}, 0
            for piece, piece_ids in fresh.items():
                if piece not in self._ids:
                    self._ids[piece] = piece_ids
                    self._tokens += len(piece_ids)


def segment_cache(hf_tokenizer: Any, chat_template: str | None) -> SegmentCache | None:
    """A SegmentCache over `hf_tokenizer`'s fast backend, cutting at the special tokens its
    chat template uses, or None where there is none to use or the pieces of a text do not
    tokenise as the whole does, by the backend and by the Hugging Face wrapper (checked on
    probe texts)."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    added = getattr(hf_tokenizer, "added_tokens_decoder", None)
    if backend is None or not added or not chat_template:
        return None
    boundaries = [
        token.content
        for token in added.values()
        if token.special
        and not (token.normalized or token.lstrip or token.single_word)
        and token.content in chat_template
    ]
    if not boundaries:
        return None

    def encode(text: str) -> list[int]:  # encode_batch releases the GIL (the gateway's other threads stream)
        return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)

    cache = SegmentCache(encode, boundaries)
    for first in boundaries:
        for second in boundaries:
            text = "Plain text first. " + "".join(f"{mark}{body}" for mark in (first, second) for body in _PROBE_BODIES)
            in_pieces = [i for piece in cache.segments(text) for i in encode(piece)]
            # the whole text, by the backend and by the wrapper (what encode called before)
            if in_pieces != encode(text) or in_pieces != list(hf_tokenizer.encode(text, add_special_tokens=False)):
                return None
    return cache
