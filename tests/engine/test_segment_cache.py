"""Rendered chat prompts tokenised from cached segments give exactly the Rust tokenizer's ids of
the whole text (engine/loader/segment_cache.py), across turns, threads, a full cache and a
pickled tokenizer; a tokenizer whose pieces tokenise differently gets no cache."""

from __future__ import annotations

import pickle
import random
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from tokenizers import AddedToken

from engine.loader.load import LoadedModel
from engine.loader.segment_cache import SegmentCache, segment_cache
from engine.loader.tokenizer import Tokenizer
from tests.data.prompts import CHAT_PROMPTS

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}


def _conversations(tokenizer: Tokenizer) -> list[list[dict[str, str]]]:
    """Every chat prompt, then multi-turn sessions over one shared system prompt whose contents
    hold special tokens, odd whitespace and non-ASCII text."""
    rng = random.Random(0)
    marks = [t for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>") if t in tokenizer.hf_tokenizer.get_vocab()]
    words = ["Paris", " ", "\n\n", "  spaced ", "é", "中文", "🙂", "3.14", "\t", "tool_call", *marks]
    conversations: list[list[dict[str, str]]] = [list(c) for c in CHAT_PROMPTS]
    for _ in range(6):
        session = [SYSTEM]
        for turn in range(4):
            session = [*session, {"role": "user", "content": "".join(rng.choices(words, k=30))}]
            conversations.append(session)
            session = [
                *session,
                {"role": "assistant", "content": f"Answer {turn}:" + "".join(rng.choices(words, k=20))},
            ]
    return conversations


def _whole(tokenizer: Tokenizer, text: str) -> list[int]:
    return list(tokenizer.hf_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)


def test_rendered_prompts_tokenise_exactly_and_reuse_segments(smollm: LoadedModel) -> None:
    tokenizer = Tokenizer(smollm.tokenizer.hf_tokenizer, smollm.tokenizer.chat_template)
    cache = tokenizer._segments
    assert cache is not None  # the embedded model's tokenizer cuts at its ChatML tokens
    texts = [tokenizer.apply_chat_template(c) for c in _conversations(tokenizer)]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == _whole(tokenizer, text) == list(tokenizer.hf_tokenizer.encode(text, add_special_tokens=False))
    assert cache.cached_tokens_served > 5 * len(_whole(tokenizer, texts[-1]))  # system prompt and earlier turns
    assert tokenizer.encode("a plain completion prompt", add_special_tokens=False) == _whole(
        tokenizer, "a plain completion prompt"
    )


def test_threads_and_a_full_cache_stay_exact(smollm: LoadedModel) -> None:
    tokenizer = Tokenizer(smollm.tokenizer.hf_tokenizer, smollm.tokenizer.chat_template)
    texts = [tokenizer.apply_chat_template(c) for c in _conversations(tokenizer)]
    assert tokenizer._segments is not None
    tokenizer._segments.max_tokens = 400  # empties itself many times over these texts
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: tokenizer.encode(t, add_special_tokens=False), texts * 3))
    assert got == [_whole(tokenizer, t) for t in texts * 3]
    assert tokenizer._segments._tokens <= 400


def test_a_pickled_tokenizer_starts_with_an_empty_cache(smollm: LoadedModel) -> None:
    tokenizer = Tokenizer(smollm.tokenizer.hf_tokenizer, smollm.tokenizer.chat_template)
    text = tokenizer.apply_chat_template([SYSTEM, {"role": "user", "content": "Hi"}])
    tokenizer.encode(text, add_special_tokens=False)
    copy = pickle.loads(pickle.dumps(tokenizer))
    assert copy._segments is not None and copy._segments.cached_tokens_served == 0
    assert copy.encode(text, add_special_tokens=False) == _whole(tokenizer, text)


def test_a_tokenizer_whose_pieces_tokenise_differently_gets_no_cache() -> None:
    def context_dependent(texts: list[str], add_special_tokens: bool) -> list[SimpleNamespace]:
        return [SimpleNamespace(ids=[len(text)] + [ord(c) for c in text]) for text in texts]  # sees the whole text

    mark = AddedToken("<|turn|>", special=True, normalized=False)
    backend = SimpleNamespace(encode_batch=context_dependent)
    wrapper_encode = lambda text, add_special_tokens: context_dependent([text], add_special_tokens)[0].ids  # noqa: E731
    hf = SimpleNamespace(backend_tokenizer=backend, added_tokens_decoder={7: mark}, encode=wrapper_encode)
    assert segment_cache(hf, "{{ '<|turn|>' + message }}") is None
    assert segment_cache(hf, "a template without the token") is None


def test_segments_cut_where_each_boundary_begins() -> None:
    cache = SegmentCache(lambda text: [ord(c) for c in text], ["<a>", "<ab>"])
    assert cache.segments("x<ab>y<a>z<a>") == ["x", "<ab>y", "<a>z", "<a>"]
    assert cache.segments("<a>only") == ["<a>only"]
