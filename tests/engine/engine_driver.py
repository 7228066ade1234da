"""Drive an EngineCore to completion and collect what it produced, per request."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.core import EngineCore
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

_ids = itertools.count()


@dataclass
class Finished:
    token_ids: list[int]
    text: str
    finish_reason: str | None
    outputs: list[RequestOutput] = field(default_factory=list)


def chat_ids(engine: EngineCore, conversation: list[dict[str, str]]) -> list[int]:
    text = engine.tokenizer.apply_chat_template(conversation, add_generation_prompt=True)  # type: ignore[attr-defined]
    return engine.tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]


def run(
    engine: EngineCore,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams],
    max_steps: int = 100_000,
    arrival_steps: Sequence[int] | None = None,
) -> list[Finished]:
    """Add every prompt at once (or prompt i before step `arrival_steps[i]`), step until all
    finish, return results in prompt order."""
    plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    ids = [f"req-{next(_ids)}" for _ in prompts]
    arrivals = list(arrival_steps) if arrival_steps is not None else [0] * len(prompts)
    collected: dict[str, list[RequestOutput]] = {i: [] for i in ids}
    done: dict[str, Finished] = {}
    for step in range(max_steps):
        for request_id, prompt, p, arrival in zip(ids, prompts, plist, arrivals, strict=True):
            if arrival == step:
                engine.add_request(request_id, list(prompt), p)
        if len(done) == len(ids):
            break
        for out in engine.step():
            if out.request_id not in collected:
                continue
            collected[out.request_id].append(out)
            if out.finished:
                outs = collected[out.request_id]
                done[out.request_id] = Finished(
                    list(out.token_ids), "".join(o.new_text for o in outs), out.finish_reason, outs
                )
    else:
        raise AssertionError(f"requests did not finish within {max_steps} steps")
    while engine.has_unfinished_requests():
        engine.step()
    return [done[i] for i in ids]
