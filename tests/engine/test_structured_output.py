"""Structured output in the engine: constrained greedy output equals a reference that applies
the grammar token by token to full-forward logits; grammar requests lag a step without
slowing the others; DSpark stays lossless under a grammar; a sampled grammar output always
matches; the step loop passes the sync guard; bad grammars are ValueErrors naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.config import SpeculativeConfig
from engine.sampling.grammar_mask import apply_token_bitmask
from engine.sampling_params import SamplingParams
from engine.structured import GrammarSpec
from engine.structured.compiler import GrammarCompiler
from engine.structured.matcher import RequestGrammar, bitmask_words
from engine.sync_guard import SyncGuard
from tests.data.prompts import CHAT_PROMPTS
from tests.engine.conftest import random_drafter_dir
from tests.engine.engine_driver import chat_ids, run
from tests.models.model_harness import last_logits

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Tokyo", "Lima"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def _validate_person(value: object) -> None:
    """PERSON's schema checked by jsonschema, a dependency of the serve and dev extras only: a
    GPU machine with the engine alone still runs this file's other tests and checks."""
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(value, PERSON)


GRAMMARS = {
    "json_schema": GrammarSpec.json_schema(PERSON),
    "json_object": GrammarSpec("json_object"),
    "regex": GrammarSpec("regex", r"(yes|no), because [a-z ]{1,20}\."),
    "choice": GrammarSpec.choice(["red", "green", "blue"]),
}
PROMPT = [{"role": "user", "content": "Describe a person as JSON with name, age and city."}]


def _greedy(grammar: GrammarSpec | None, max_tokens: int = 40) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, grammar=grammar)


def _reference(engine, model, prompt: list[int], spec: GrammarSpec, max_tokens: int) -> list[int]:
    """Greedy decoding that applies the grammar token by token: full forward, mask, argmax."""
    tokenizer = engine.tokenizer
    vocab = engine.model_config.vocab_size
    eos = set(engine.tokenizer.eos_token_ids) | set(engine.model_config.eos_token_ids)
    grammar = RequestGrammar(GrammarCompiler(tokenizer.hf_tokenizer, vocab, eos).compile(spec))
    bitmask = np.zeros((1, bitmask_words(vocab)), dtype=np.int32)
    tokens: list[int] = []
    with torch.inference_mode():
        for _ in range(max_tokens):
            grammar.fill(bitmask, 0)
            logits = last_logits(model, [prompt + tokens])
            token = int(apply_token_bitmask(logits.float(), torch.from_numpy(bitmask)).argmax(dim=-1)[0])
            tokens.append(token)
            assert grammar.accept(token)
            if token in eos:
                break
    return tokens


@pytest.mark.parametrize("kind", sorted(GRAMMARS))
def test_constrained_greedy_equals_the_token_by_token_reference(make_engine, smollm, kind):
    engine = make_engine(max_num_seqs=4)
    prompt = chat_ids(engine, PROMPT)
    (got,) = run(engine, [prompt], _greedy(GRAMMARS[kind]))
    assert got.token_ids == _reference(engine, smollm.model, prompt, GRAMMARS[kind], 40)
    assert got.finish_reason == "stop"
    if kind in ("json_schema", "json_object"):
        value = json.loads(got.text)
        if kind == "json_schema":
            _validate_person(value)
    assert engine.kv.usage().used_slots == 0


def test_grammar_rows_leave_the_other_rows_unchanged(make_engine):
    """A batch mixing grammar and plain requests: the plain ones produce what they produce
    alone, the grammar ones what they produce alone."""
    engine = make_engine(max_num_seqs=8)
    prompts = [chat_ids(engine, c) for c in CHAT_PROMPTS[:4]]
    plain = run(engine, prompts, _greedy(None, 24))
    constrained = run(engine, prompts[:2], _greedy(GRAMMARS["json_schema"], 40))
    mixed = run(
        engine,
        prompts + prompts[:2],
        [_greedy(None, 24)] * 4 + [_greedy(GRAMMARS["json_schema"], 40)] * 2,
    )
    assert [m.token_ids for m in mixed[:4]] == [p.token_ids for p in plain]
    assert [m.token_ids for m in mixed[4:]] == [c.token_ids for c in constrained]


def test_dspark_under_a_grammar_equals_plain_decoding(make_engine, smollm, tmp_path_factory):
    spec = SpeculativeConfig(drafter=str(random_drafter_dir(tmp_path_factory.mktemp("drafter"), smollm)))
    plain = make_engine(max_num_seqs=4)
    dspark = make_engine(max_num_seqs=4, speculative=spec)
    prompts = [chat_ids(plain, c) for c in CHAT_PROMPTS[:3]]
    params = [_greedy(GRAMMARS["json_schema"]), _greedy(None, 24), _greedy(GRAMMARS["regex"])]
    expected = run(plain, prompts, params)
    got = run(dspark, prompts, params)
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    assert dspark.stats().spec_verify_steps_total > 0
    assert dspark.kv.usage().used_slots == 0


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_sampled_outputs_always_match_the_schema(make_engine, smollm, tmp_path_factory, speculative):
    spec = None
    if speculative:
        spec = SpeculativeConfig(drafter=str(random_drafter_dir(tmp_path_factory.mktemp("drafter"), smollm)))
    engine = make_engine(max_num_seqs=8, speculative=spec)
    prompt = chat_ids(engine, PROMPT)
    params = [
        SamplingParams(max_tokens=60, temperature=1.0, top_p=0.95, seed=seed, grammar=GRAMMARS["json_schema"])
        for seed in range(8)
    ]
    outputs = run(engine, [prompt] * 8, params)
    finished = [o for o in outputs if o.finish_reason == "stop"]
    assert len(finished) >= 6  # max_tokens may cut a long string short; most end
    for out in finished:
        _validate_person(json.loads(out.text))


def test_the_step_loop_with_grammar_rows_passes_the_sync_guard(make_engine):
    engine = make_engine(max_num_seqs=4)
    prompts = [chat_ids(engine, c) for c in CHAT_PROMPTS[:3]]
    with SyncGuard("cpu") as guard:
        engine.attach_sync_guard(guard)
        outputs = run(engine, prompts, [_greedy(GRAMMARS["choice"]), _greedy(None, 8), _greedy(GRAMMARS["regex"])])
    assert outputs[0].text in ("red", "green", "blue")
    assert guard.waits > 0


@pytest.mark.parametrize(
    ("grammar", "field"),
    [
        (GrammarSpec("regex", "(unclosed"), "grammar"),
        (GrammarSpec("json_schema", '{"type": "no-such-type"}'), "grammar"),
        (GrammarSpec("ebnf", "root ::= "), "grammar"),
    ],
)
def test_a_grammar_that_does_not_compile_is_refused_naming_the_field(make_engine, grammar, field):
    engine = make_engine(max_num_seqs=2)
    with pytest.raises(ValueError, match=f"^{field}: "):
        engine.add_request("bad", chat_ids(engine, PROMPT), _greedy(grammar))
    assert not engine.has_unfinished_requests()


def test_options_that_forbid_stop_tokens_cannot_take_a_grammar():
    with pytest.raises(ValueError, match="^ignore_eos: "):
        SamplingParams(ignore_eos=True, grammar=GRAMMARS["choice"])
    with pytest.raises(ValueError, match="^min_tokens: "):
        SamplingParams(min_tokens=2, grammar=GRAMMARS["choice"])


def test_a_grammar_no_token_can_start_is_refused_at_admission(make_engine):
    """Sampling under an empty mask would pick a token the grammar refuses: such a grammar
    (a character whose bytes the vocabulary lacks) is a ValueError naming it, nothing queued."""
    engine = make_engine()
    with pytest.raises(ValueError, match="grammar: no token"):
        engine.add_request("r", [1, 2, 3], _greedy(GrammarSpec("regex", "\U00040000")))
    assert not engine.requests
