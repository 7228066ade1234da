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
) -> list[Finished]:
    """Add every prompt at once, step until all finish, return results in prompt order."""
    plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    ids = [f"req-{next(_ids)}" for _ in prompts]
    for request_id, prompt, p in zip(ids, prompts, plist, strict=True):
        engine.add_request(request_id, list(prompt), p)
    collected: dict[str, list[RequestOutput]] = {i: [] for i in ids}
    done: dict[str, Finished] = {}
    for _ in range(max_steps):
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
