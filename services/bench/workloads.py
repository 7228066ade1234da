"""Synthetic workloads for the load generator. Text is made from a fixed word list by a
seeded generator, so runs are reproducible and need no dataset download.

- agentic: multi-turn sessions over a long shared system prompt (a tool manual); each turn
  asks for a short, tool-call-like answer, appends it and a tool result to the history, and
  waits a think time before the next turn. The history grows, so each turn's prompt starts
  with the previous turn's prompt: the case prefix caching and affinity routing are for.
- chat: independent single-turn questions of varied length, medium answers.
- random: prompts of a fixed number of random words and a fixed output budget.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

_WORD_TEXT = """
the of and to in is that for it as with was on be by this are or from at which an but not have has
had were can all their there been one more if will would so what about up out them some time only
into other could than then now its also two like over such our after most very well these may first
data model server request token cache prefix latency queue worker router gateway stream batch kernel
memory device thread sample output input value error status result search file query table record
update create delete list index score rank user session agent tool call plan step check retry fetch
parse write read open close start stop build test deploy metric trace log event alert config option
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())

TOOLS = ("search", "read_file", "write_file", "run_tests", "list_dir", "http_get", "sql_query", "calculator")


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def sentences(rng: random.Random, count_words: int) -> str:
    out: list[str] = []
    remaining = count_words
    while remaining > 0:
        n = min(remaining, rng.randint(6, 16))
        sentence = words(rng, n)
        out.append(sentence[0].upper() + sentence[1:] + ".")
        remaining -= n
    return " ".join(out)


@dataclass(frozen=True)
class BenchRequest:
    messages: list[dict[str, str]]
    max_tokens: int
    extra_body: dict[str, Any] = field(default_factory=dict)


class Session:
    """A conversation: `next_request()` until it returns None; `record(text)` after each."""

    think_time_s: float = 0.0

    def next_request(self) -> BenchRequest | None:
        raise NotImplementedError

    def record(self, text: str) -> None:
        pass


@dataclass(frozen=True)
class WorkloadConfig:
    system_prompt_words: int = 600  # agentic: the shared tool manual
    turns_min: int = 3
    turns_max: int = 8
    think_time_s: float = 0.5  # mean of an exponential think time between turns
    tool_result_words: tuple[int, int] = (30, 120)
    agentic_max_tokens: int = 48
    chat_prompt_words: tuple[int, int] = (40, 400)
    chat_max_tokens: int = 128
    input_len: int = 256  # random: prompt words
    output_len: int = 128  # random: max tokens
    ignore_eos: bool = False  # random: ask the server to ignore EOS (a common server extension)
    max_tokens: int | None = None  # override every request's max_tokens


class _AgenticSession(Session):
    def __init__(self, rng: random.Random, system_prompt: str, cfg: WorkloadConfig) -> None:
        self.rng = rng
        self.cfg = cfg
        self.turns_left = rng.randint(cfg.turns_min, cfg.turns_max)
        task = f"Task {rng.randint(1000, 9999)}: {sentences(rng, rng.randint(20, 60))}"
        self.history: list[dict[str, str]] = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": task},
        ]
        self.think_time_s = rng.expovariate(1.0 / cfg.think_time_s) if cfg.think_time_s > 0 else 0.0

    def next_request(self) -> BenchRequest | None:
        if self.turns_left <= 0:
            return None
        self.turns_left -= 1
        return BenchRequest(list(self.history), self.cfg.max_tokens or self.cfg.agentic_max_tokens)

    def record(self, text: str) -> None:
        self.history.append({"role": "assistant", "content": text})
        low, high = self.cfg.tool_result_words
        tool = self.rng.choice(TOOLS)
        self.history.append(
            {
                "role": "user",
                "content": f"Tool {tool} returned: {sentences(self.rng, self.rng.randint(low, high))}"
                " Decide the next tool call.",
            }
        )
        self.think_time_s = self.rng.expovariate(1.0 / self.cfg.think_time_s) if self.cfg.think_time_s > 0 else 0.0


class _SingleTurn(Session):
    def __init__(self, request: BenchRequest) -> None:
        self._request: BenchRequest | None = request

    def next_request(self) -> BenchRequest | None:
        request, self._request = self._request, None
        return request


class Workload:
    name = "abstract"

    def __init__(self, cfg: WorkloadConfig, seed: int) -> None:
        self.cfg = cfg
        self.rng = random.Random(seed)

    def new_session(self) -> Session:
        raise NotImplementedError


class AgenticWorkload(Workload):
    name = "agentic"

    def __init__(self, cfg: WorkloadConfig, seed: int) -> None:
        super().__init__(cfg, seed)
        manual_rng = random.Random(seed ^ 0x5EED)
        tools = "\n".join(f"- {tool}: {sentences(manual_rng, 20)}" for tool in TOOLS)
        self.system_prompt = (
            "You are an agent that solves tasks by calling tools. Answer with exactly one tool call as "
            f'JSON: {{"tool": NAME, "arguments": {{...}}}}.\nTools:\n{tools}\n'
            f"Guidelines: {sentences(manual_rng, cfg.system_prompt_words)}"
        )

    def new_session(self) -> Session:
        return _AgenticSession(random.Random(self.rng.getrandbits(64)), self.system_prompt, self.cfg)


class ChatWorkload(Workload):
    name = "chat"

    def new_session(self) -> Session:
        low, high = self.cfg.chat_prompt_words
        question = sentences(self.rng, self.rng.randint(low, high)) + " Explain briefly."
        return _SingleTurn(
            BenchRequest([{"role": "user", "content": question}], self.cfg.max_tokens or self.cfg.chat_max_tokens)
        )


class RandomWorkload(Workload):
    name = "random"

    def new_session(self) -> Session:
        extra = {"ignore_eos": True} if self.cfg.ignore_eos else {}
        return _SingleTurn(
            BenchRequest(
                [{"role": "user", "content": words(self.rng, self.cfg.input_len)}],
                self.cfg.max_tokens or self.cfg.output_len,
                extra,
            )
        )


WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (AgenticWorkload, ChatWorkload, RandomWorkload)}


def make_workload(name: str, cfg: WorkloadConfig, seed: int) -> Workload:
    try:
        return WORKLOADS[name](cfg, seed)
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}") from None
