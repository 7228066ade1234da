"""Request bodies of the tokenizer routes, in vLLM's shapes: `POST /tokenize` with a `prompt`
or with chat `messages`, and `POST /detokenize`. Validated as strictly as the generation
bodies (protocol.py): a wrong type is a 400 naming the field.

Like vLLM, `model` may be left out (the served model is meant). Fields of vLLM's chat form
that would render the conversation otherwise than the chat endpoint does are refused, not
ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError

from services.gateway.errors import InvalidRequest
from services.gateway.protocol import ChatMessage, ToolDefinition, _Body, validation_error


class TokenizePromptRequest(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Body):
    model: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    continue_final_message: bool = False
    tools: list[ToolDefinition] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


TokenizeRequest = TokenizePromptRequest | TokenizeChatRequest


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def parse_tokenize(body: dict[str, Any]) -> TokenizeRequest:
    """The form is chosen by the body's keys: `messages` for a conversation, else `prompt`."""
    if "messages" in body and "prompt" in body:
        raise InvalidRequest("prompt: send either prompt or messages, not both", param="prompt", code="invalid_value")
    try:
        if "messages" in body:
            request: TokenizeRequest = TokenizeChatRequest.model_validate(body)
        else:
            request = TokenizePromptRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if isinstance(request, TokenizeChatRequest):
        _check_chat_fields(request)
    return request


def _check_chat_fields(request: TokenizeChatRequest) -> None:
    # The conversation is rendered by preprocess.chat_prompt exactly as for a chat completion;
    # options of other renderings are refused rather than ignored.
    refused = {
        "continue_final_message": "not supported by this server" if request.continue_final_message else "",
        "chat_template": "not supported by this server" if request.chat_template is not None else "",
        "chat_template_kwargs": "not supported by this server" if request.chat_template_kwargs else "",
    }
    for field, why in refused.items():
        if why:
            raise InvalidRequest(f"{field}: {why}", param=field, code="unsupported_parameter")


def parse_detokenize(body: dict[str, Any]) -> DetokenizeRequest:
    try:
        return DetokenizeRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
