"""A request continued on a second engine after some of its tokens (docs/design.md §5.6), as a
migrated request is: the continuation's tokens and text equal what the first engine went on
to produce, greedy or sampled, with stop strings holding text across the cut."""

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


def check_continuations(
    make_engine: EngineFactory, params: SamplingParams, rng_key: int | None, every: int, **engine_options: object
) -> list[str]:
    """Continue the request from every `every`-th output boundary; returns the text held
    back (for a possible stop string) at each cut."""
    first, second = make_engine(**engine_options), make_engine(**engine_options)
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
        rest = continue_from(second, prompt, params, Continuation(rng_key, tuple(whole.token_ids[:count])))
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
