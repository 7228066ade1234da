"""The engine's `Tokenizer.decode` returns exactly what the Hugging Face tokenizer's `decode`
does, on the path it takes (the Rust decoder directly, engine/loader/tokenizer.py) and on the
fallback (a tokenizer that cleans up tokenization spaces)."""

from __future__ import annotations

import random

import pytest

from engine.loader.load import LoadedModel
from engine.loader.tokenizer import Tokenizer


def _sequences(vocab_size: int, special_ids: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(0)
    sequences = [[], [special_ids[0]], list(special_ids)]
    for length in (1, 2, 3, 5, 8, 40):
        for _ in range(40):
            ids = [rng.randrange(vocab_size) for _ in range(length)]
            if rng.random() < 0.3:
                ids.insert(rng.randrange(len(ids) + 1), rng.choice(special_ids))
            sequences.append(ids)
    return sequences


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_equals_the_hugging_face_decode(smollm: LoadedModel, skip_special_tokens: bool) -> None:
    tokenizer = smollm.tokenizer
    hf = tokenizer.hf_tokenizer
    assert tokenizer._backend_decode is not None  # the embedded model's tokenizer takes the direct path
    for ids in _sequences(tokenizer.vocab_size, tokenizer.all_special_ids):
        expected = hf.decode(ids, skip_special_tokens=skip_special_tokens)
        assert tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) == expected
        assert tokenizer.decode(tuple(ids), skip_special_tokens=skip_special_tokens) == expected


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_hugging_face(smollm: LoadedModel) -> None:
    hf = smollm.tokenizer.hf_tokenizer
    cleaning = type(hf)(tokenizer_object=hf.backend_tokenizer, clean_up_tokenization_spaces=True)
    tokenizer = Tokenizer(cleaning)
    assert tokenizer._backend_decode is None
    ids = cleaning.encode("I do n't know . Hello , world !", add_special_tokens=False)
    assert tokenizer.decode(ids) == cleaning.decode(ids, skip_special_tokens=True)
