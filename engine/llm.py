"""Offline use: `LLM(model).generate(prompts, params)` and `.chat(messages, params)`, and a
streaming iterator. Drives the same `EngineCore.step()` as the serving workers."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from engine.config import EngineConfig, SpeculativeConfig
from engine.core import EngineCore
from engine.outputs import Completion, RequestOutput, TokenLogprob
from engine.sampling_params import SamplingParams

Prompt = str | Sequence[int]
Message = Mapping[str, object]  # {"role": ..., "content": ...}


def speculative_config(speculative: str | SpeculativeConfig | None) -> SpeculativeConfig | None:
    """ "dspark": the drafter that ships with the model; a path: that drafter; None: off."""
    if speculative is None or isinstance(speculative, SpeculativeConfig):
        return speculative
    if speculative == "dspark":
        return SpeculativeConfig()
    return SpeculativeConfig(drafter=speculative)


class LLM:
    def __init__(
        self, model: str = "smollm2-135m", *, speculative: str | SpeculativeConfig | None = None, **engine_options: Any
    ) -> None:
        self.config = EngineConfig(model=model, speculative=speculative_config(speculative), **engine_options)
        self.engine = EngineCore(self.config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[Completion]:
        """Generate for every prompt (text or token ids) together; results in prompt order."""
        prompt_list = self._prompt_list(prompts)
        param_list = self._param_list(params, len(prompt_list))
        ids = [self._add(p, sp) for p, sp in zip(prompt_list, param_list, strict=True)]
        return self._collect(ids)

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Completion]:
        """One conversation (a list of {"role", "content"}) or several; the model's chat
        template renders each with the assistant prompt appended."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.chat_prompt(c) for c in conversations]  # type: ignore[arg-type]
        return self.generate(prompts, params)

    def chat_prompt(self, conversation: Sequence[Message]) -> list[int]:
        text = self.tokenizer.apply_chat_template(list(conversation), add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Yield the request's deltas as the engine produces them."""
        request_id = self._add(prompt, params or SamplingParams())
        while True:
            for out in self.engine.step():
                if out.request_id == request_id:
                    yield out
                    if out.finished:
                        return

    def _add(self, prompt: Prompt, params: SamplingParams) -> str:
        request_id = f"offline-{next(self._ids)}"
        ids = self.tokenizer.encode(prompt, add_special_tokens=True) if isinstance(prompt, str) else list(prompt)
        self.engine.add_request(request_id, ids, params)
        return request_id

    def _collect(self, request_ids: list[str]) -> list[Completion]:
        pending = set(request_ids)
        parts: dict[str, list[RequestOutput]] = {rid: [] for rid in request_ids}
        prompts = {rid: self.engine.requests[rid].prompt_ids for rid in request_ids}
        while pending:
            for out in self.engine.step():
                if out.request_id in parts:
                    parts[out.request_id].append(out)
                    if out.finished:
                        pending.discard(out.request_id)
        return [self._completion(rid, prompts[rid], parts[rid]) for rid in request_ids]

    @staticmethod
    def _completion(request_id: str, prompt: list[int], outs: list[RequestOutput]) -> Completion:
        last = outs[-1]
        logprobs: tuple[TokenLogprob, ...] = tuple(lp for o in outs for lp in o.new_logprobs)
        prompt_logprobs = next((o.prompt_logprobs for o in outs if o.prompt_logprobs is not None), None)
        return Completion(
            request_id=request_id,
            prompt_token_ids=tuple(prompt),
            token_ids=last.token_ids,
            text="".join(o.new_text for o in outs),
            finish_reason=last.finish_reason,
            stop_reason=last.stop_reason,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=last.num_cached_tokens,
            timings=last.timings,
            spec=last.spec,
        )

    @staticmethod
    def _prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        if isinstance(prompts, str):
            return [prompts]
        if prompts and all(isinstance(t, int) for t in prompts):
            return [prompts]  # type: ignore[list-item]
        return list(prompts)  # type: ignore[arg-type]

    @staticmethod
    def _param_list(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * n
        if isinstance(params, SamplingParams):
            return [params] * n
        if len(params) != n:
            raise ValueError(f"params: got {len(params)} SamplingParams for {n} prompts")
        return list(params)
