"""The model's tokenizer: a Hugging Face fast tokenizer plus the chat template, rendered here
with jinja2 in the same sandboxed environment transformers uses.

From a Hugging Face directory it is `AutoTokenizer.from_pretrained(dir, local_files_only=True)`.
From a GGUF file it is built from the file's metadata (vocabulary, merges, special ids, chat
template) with transformers' GGUF converter: ~1.6 s for SmolLM2 against ~4.5 s for
`AutoTokenizer.from_pretrained(dir, gguf_file=name)`, which is the fallback. Neither path
touches the network.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine.loader.resolve import ModelNotFoundError, ModelSource, shipped_chat_template
from engine.loader.segment_cache import segment_cache

ROLES = ("system", "user", "assistant", "tool")
# Turn-end tokens that chat templates close each message with; a model that is prompted with
# such a template stops on them, so they count as EOS when the template uses them.
_TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")


class Tokenizer:
    def __init__(
        self,
        hf_tokenizer: Any,  # transformers PreTrainedTokenizerFast
        chat_template: str | None = None,
        extra_eos_token_ids: Iterable[int] = (),
    ):
        self.hf_tokenizer = hf_tokenizer
        self.extra_eos_token_ids = tuple(extra_eos_token_ids)
        template = chat_template if chat_template is not None else getattr(hf_tokenizer, "chat_template", None)
        if isinstance(template, dict):  # several named templates: use the default one
            template = template.get("default") or next(iter(template.values()), None)
        self.chat_template: str | None = template
        self.vocab_size: int = len(hf_tokenizer)
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id
        self.all_special_ids: tuple[int, ...] = tuple(hf_tokenizer.all_special_ids)
        eos: list[int] = []
        if hf_tokenizer.eos_token_id is not None:
            eos.append(int(hf_tokenizer.eos_token_id))
        eos.extend(int(i) for i in self.extra_eos_token_ids)
        if self.chat_template:
            vocab = hf_tokenizer.get_vocab()
            eos.extend(vocab[t] for t in _TURN_END_TOKENS if t in self.chat_template and t in vocab)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))
        self._backend_decode = _backend_decode(hf_tokenizer)
        self._segments = segment_cache(hf_tokenizer, self.chat_template)

    def __getstate__(self) -> dict[str, Any]:
        """Sent without its segment cache (a lock and what this process tokenised)."""
        state = dict(self.__dict__)
        del state["_segments"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._segments = segment_cache(self.hf_tokenizer, self.chat_template)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_source(cls, source: ModelSource, extra_eos_token_ids: Iterable[int] = ()) -> Tokenizer:
        """The source's tokenizer, with the chat template shipped for it if there is one
        (engine.loader.resolve.shipped_chat_template)."""
        shipped = shipped_chat_template(source.name) or shipped_chat_template(str(source.path))
        if source.kind == "gguf":
            return cls.from_gguf(source.path, extra_eos_token_ids, chat_template=shipped)
        return cls.from_hf_dir(source.path, extra_eos_token_ids, chat_template=shipped)

    @classmethod
    def from_hf_dir(
        cls, path: Path, extra_eos_token_ids: Iterable[int] = (), chat_template: str | None = None
    ) -> Tokenizer:
        if not ((path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()):
            raise ModelNotFoundError(
                f"no tokenizer in {path}: expected tokenizer.json (and tokenizer_config.json for the chat template)"
            )
        from transformers import AutoTokenizer

        hf_tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        return cls(hf_tokenizer, chat_template, extra_eos_token_ids)

    @classmethod
    def from_gguf(
        cls, path: Path, extra_eos_token_ids: Iterable[int] = (), chat_template: str | None = None
    ) -> Tokenizer:
        try:
            from transformers import PreTrainedTokenizerFast
            from transformers.integrations.gguf.gguf_tokenizer_mapping import (
                convert_gguf_tokenizer,
                get_gguf_tokenizer,
            )
        except ImportError:  # other transformers versions: the public (slower) path
            from transformers import AutoTokenizer

            hf_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
            return cls(hf_tokenizer, chat_template, extra_eos_token_ids)
        architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(path))
        backend, extra_kwargs = convert_gguf_tokenizer(architecture, tokenizer_dict)
        hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config, **extra_kwargs)
        return cls(hf_tokenizer, chat_template, extra_eos_token_ids)

    def with_chat_template(self, chat_template: str) -> Tokenizer:
        """This tokenizer with `chat_template` (Jinja text) in place of its own, its turn-end
        tokens counted as EOS; ValueError when the template does not compile."""
        check_chat_template(chat_template)
        return Tokenizer(self.hf_tokenizer, chat_template, self.extra_eos_token_ids)

    # -- text <-> ids -----------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Text rendered by `apply_chat_template` already holds its special
        tokens: encode it with `add_special_tokens=False`, which reuses the ids of the segments
        between special tokens seen before (engine/loader/segment_cache.py)."""
        if not add_special_tokens and self._segments is not None:
            return self._segments.encode(text)
        return list(self.hf_tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        id_list = ids if isinstance(ids, list) else list(ids)
        if self._backend_decode is not None:
            return str(self._backend_decode(id_list, skip_special_tokens=skip_special_tokens))
        return self.hf_tokenizer.decode(id_list, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return list(self.hf_tokenizer.convert_ids_to_tokens(list(ids)))

    # -- chat -------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """Render `messages` ({"role", "content"} mappings) with the model's chat template."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; send a plain completion prompt instead")
        validate_messages(messages)
        special = {
            name: getattr(self.hf_tokenizer, name, None)
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        return _compile(self.chat_template).render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            tools=[dict(t) for t in tools] if tools else None,
            **{k: v for k, v in special.items() if v is not None},
        )


def _backend_decode(hf_tokenizer: Any) -> Any:
    """The Rust tokenizer's own `decode` where it returns what the Hugging Face wrapper's does:
    a fast tokenizer that does not clean up tokenization spaces (the wrapper then only converts
    its argument to a list and calls it). The detokenizer decodes twice per generated token, and
    the wrapper's Python costs about 8x the Rust call; else None (decode through the wrapper)."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(hf_tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return backend.decode


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """ValueError naming the offending field unless every message has a known role and string
    content (an assistant message carrying tool_calls may have content None)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError("messages must be a list of {role, content} objects")
    if not messages:
        raise ValueError("messages must not be empty")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] must be an object with role and content, got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}; got {role!r}")
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            continue
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, got {type(content).__name__}")


def check_chat_template(template: str) -> None:
    """ValueError with the line and reason when `template` is not a Jinja template."""
    import jinja2

    try:
        _compile(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template, line {exc.lineno}: {exc.message}") from None


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text for training masks;
        rendering just keeps the body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, GenerationTag]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)
