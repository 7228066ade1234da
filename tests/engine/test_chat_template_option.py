"""`EngineConfig.chat_template` (`--chat-template`): the engine's tokenizer renders chats with
it instead of the model's (or the shipped) template; the loaded model's tokenizer is left as it
was, and a template that does not compile stops the engine before it serves."""

from __future__ import annotations

import pytest

from engine.loader.load import LoadedModel
from engine.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory

PLAIN = (
    "{% for m in messages %}<|im_start|>{{ m.role | upper }}: {{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>ASSISTANT:{% endif %}"
)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_the_engine_renders_chats_with_the_given_template(make_engine: EngineFactory, smollm: LoadedModel) -> None:
    engine = make_engine(chat_template=PLAIN)
    assert engine.tokenizer.chat_template == PLAIN
    assert engine.tokenizer.apply_chat_template(CHAT) == (
        "<|im_start|>SYSTEM: Be brief.<|im_end|>\n<|im_start|>USER: Hi<|im_end|>\n<|im_start|>ASSISTANT:"
    )
    assert engine.tokenizer.eos_token_ids == smollm.tokenizer.eos_token_ids
    assert smollm.tokenizer.chat_template != PLAIN  # other engines over the same weights keep theirs
    assert make_engine().tokenizer.apply_chat_template(CHAT) != engine.tokenizer.apply_chat_template(CHAT)
    prompt = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(CHAT), add_special_tokens=False)
    engine.add_request("chat", prompt, SamplingParams(max_tokens=4, temperature=0.0))
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    assert outputs[-1].finished and sum(len(o.new_token_ids) for o in outputs) >= 1


def test_a_template_that_does_not_compile_is_refused(make_engine: EngineFactory) -> None:
    with pytest.raises(ValueError, match=r"chat template, line 1: .*'endfor'"):
        make_engine(chat_template="{% for m in messages %}{{ m.content }}")
