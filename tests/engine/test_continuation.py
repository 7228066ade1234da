"""A request continued on a second engine after some of its tokens (docs/design.md §5.6), as a
migrated request is: the continuation's tokens and text equal what the first engine went on
to produce, greedy or sampled, with stop strings holding text across the cut; also when the
continuation runs disaggregated (prefilled on one engine, handed off to another)."""

from __future__ import annotations

import pytest

from engine.core import EngineCore
from engine.handoff import Continuation
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from tests.data.prompts import CHAT_PROMPTS
from tests.engine.conftest import EngineFactory
from tests.engine.engine_driver import Finished, chat_ids, run

KEY = 0x5EED_CAFE


def continue_from(engine: EngineCore, prompt: list[int], params: SamplingParams, start: Continuation) -> Finished:
    engine.add_request("continued", prompt, params, continuation=start)
    outputs: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        outputs.extend(o for o in engine.step() if o.request_id == "continued")
    assert outputs and outputs[-1].finished
    return Finished(list(outputs[-1].token_ids), "".join(o.new_text for o in outputs), outputs[-1].finish_reason)


def cuts(whole: Finished) -> list[tuple[int, str]]:
    """(tokens so far, text shown so far) at each output boundary of `whole`'s stream, as a
    gateway following it saw them."""
    seen: list[tuple[int, str]] = []
    count, text = 0, ""
    for out in whole.outputs[:-1]:
        count += len(out.new_token_ids)
        text += out.new_text
        seen.append((count, text))
    return seen


def continue_handed_off(
    prefill: EngineCore, decode: EngineCore, prompt: list[int], params: SamplingParams, start: Continuation
) -> Finished:
    """The continuation prefilled on `prefill` (one more token), then decoded on `decode`
    from the handed-off KV, as a migration to a prefill/decode pair runs it."""
    prefill.add_request("continued", prompt, params, prefill_only=True, continuation=start)
    outputs: list[RequestOutput] = []
    while not (outputs and (outputs[-1].finished or outputs[-1].finish_reason == "handoff")):
        outputs.extend(o for o in prefill.step() if o.request_id == "continued")
    if outputs[-1].finish_reason == "handoff":
        decode.add_decode_request("continued", prefill.export_kv("continued"))
        while decode.has_unfinished_requests():
            outputs.extend(o for o in decode.step() if o.request_id == "continued")
    assert outputs[-1].finished
    return Finished(list(outputs[-1].token_ids), "".join(o.new_text for o in outputs), outputs[-1].finish_reason)


def check_continuations(
    make_engine: EngineFactory,
    params: SamplingParams,
    rng_key: int | None,
    every: int,
    handed_off: bool = False,
    **engine_options: object,
) -> list[str]:
    """Continue the request from every `every`-th output boundary (`handed_off`: through a
    prefill engine and a decode engine); returns the text held back (for a possible stop
    string) at each cut."""
    first, second = make_engine(**engine_options), make_engine(**engine_options)
    third = make_engine(**engine_options) if handed_off else None
    prompt = chat_ids(first, CHAT_PROMPTS[0])
    if rng_key is None:
        (whole,) = run(first, [prompt], params)
    else:
        first.add_request("whole", prompt, params, continuation=Continuation(rng_key))
        outputs: list[RequestOutput] = []
        while first.has_unfinished_requests():
            outputs.extend(first.step())
        whole = Finished(list(outputs[-1].token_ids), "".join(o.new_text for o in outputs), "", outputs)
    points = cuts(whole)[::every]
    assert len(points) >= 3, "the request must run long enough to be cut in several places"
    held = []
    for count, shown in points:
        start = Continuation(rng_key, tuple(whole.token_ids[:count]))
        if third is None:
            rest = continue_from(second, prompt, params, start)
        else:
            rest = continue_handed_off(second, third, prompt, params, start)
        assert rest.token_ids == whole.token_ids, f"cut after {count} tokens"
        assert shown + rest.text == whole.text, f"cut after {count} tokens"
        held.append(first.tokenizer.decode(whole.token_ids[:count])[len(shown) :])  # type: ignore[attr-defined]
    return held


def test_greedy_continuation_equals_the_undisturbed_run(make_engine: EngineFactory) -> None:
    check_continuations(make_engine, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), None, every=5)


def test_seeded_sampling_continues_the_same_random_stream(make_engine: EngineFactory) -> None:
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=11, frequency_penalty=0.5, ignore_eos=True)
    check_continuations(make_engine, params, None, every=5)


def test_an_assigned_key_continues_an_unseeded_request(make_engine: EngineFactory) -> None:
    check_continuations(make_engine, SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True), KEY, every=5)


def test_text_held_for_a_stop_string_is_held_across_the_cut(make_engine: EngineFactory) -> None:
    # " the" and "," begin stop strings that never complete: their text is held back until the
    # next token settles it, so some cuts fall while text is held
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, stop=(" the zebra", ", zebra"))
    held = check_continuations(make_engine, params, None, every=1)
    assert " the" in held


def test_a_handed_off_continuation_keeps_every_character(make_engine: EngineFactory) -> None:
    # the prefill engine's one token can end in text the detokenizer or a stop string still
    # holds (a bare space before digits, " the"): the decode engine must emit it, not take it
    # as shown
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, stop=(" the zebra", ", zebra"))
    held = check_continuations(make_engine, params, None, every=1, handed_off=True)
    assert " the" in held


def test_a_held_space_sampled_by_the_prefill_engine_reaches_the_client(make_engine: EngineFactory) -> None:
    # a bare space token is held back (it may yet become " ." and be cleaned up), so the
    # prefill engine's one token can be text it has not shown when it hands off: the decode
    # engine must show it, not take it as shown. `logit_bias` makes the space every token.
    first, prefill, decode = make_engine(), make_engine(), make_engine()
    prompt = chat_ids(first, CHAT_PROMPTS[0])
    space = first.tokenizer.encode("Task 6915", add_special_tokens=False)[1]  # type: ignore[attr-defined]
    assert first.tokenizer.decode([space]) == " "  # type: ignore[attr-defined]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logit_bias={space: 100.0})
    for start in (Continuation(), Continuation(None, (space,))):  # a plain hand-off, a moved request
        colocated = continue_from(first, prompt, params, start)
        handed_off = continue_handed_off(prefill, decode, prompt, params, start)
        assert handed_off.token_ids == colocated.token_ids
        # a moved request's own first space was held where it ran, never shown: it goes out here
        assert handed_off.text == colocated.text == " " * 4


def test_dspark_greedy_continuation(make_engine: EngineFactory) -> None:
    from engine.config import SpeculativeConfig
    from engine.loader.resolve import shipped_drafter

    drafter = shipped_drafter("smollm2-135m")
    assert drafter is not None
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    check_continuations(make_engine, params, None, every=1, speculative=SpeculativeConfig(drafter=str(drafter)))


@pytest.mark.parametrize(
    ("start", "message"),
    [
        (Continuation(None, (1, -2)), "continuation: output token ids"),
        (Continuation(None, tuple(range(8))), "max_tokens=8"),
    ],
)
def test_bad_continuations_are_refused_naming_the_field(
    make_engine: EngineFactory, start: Continuation, message: str
) -> None:
    engine = make_engine()
    with pytest.raises(ValueError, match=message):
        engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=8), continuation=start)
    assert not engine.requests
