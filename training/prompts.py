"""The training prompt set: chat conversations across many domains, built combinatorially
from templates x topics (training.prompt_topics, read from data/prompt_topics.json),
deterministic given a seed.

The drafter learns the target's distribution over its own answers, so the prompts should
cover what a chat model is asked: code, arithmetic word problems, explanations, how-tos,
creative writing, summaries and rewrites, translations, lists, dialogue and role-play,
tool-call style JSON answers, e-mails, advice, and multi-turn follow-ups. About ten thousand
distinct conversations can be built; `build_prompt_set(n, seed)` mixes the domains by weight
and returns the first n.

A prompt is held out for evaluation when the hash of its canonical text says so
(`ChatPrompt.is_heldout`), so the split is stable whatever n, seed or order.
"""

from __future__ import annotations

import collections
import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from training import prompt_topics as t

Turn = tuple[str, str]  # (role, content)


@dataclass(frozen=True)
class ChatPrompt:
    domain: str
    turns: tuple[Turn, ...]

    @property
    def key(self) -> str:
        """The canonical text of the conversation (what the split hashes)."""
        return json.dumps(self.turns, ensure_ascii=False)

    def messages(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.turns]

    def is_heldout(self, permille: int) -> bool:
        return heldout_by_hash(self.key, permille)


def heldout_by_hash(key: str, permille: int) -> bool:
    """True for about `permille`/1000 of all keys, chosen by a hash of the key."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % 1000 < permille


def _user(domain: str, text: str) -> ChatPrompt:
    return ChatPrompt(domain, (("user", text),))


def _coding(rng: random.Random) -> Iterator[ChatPrompt]:
    forms = (
        "Write a {lang} function that {task}.",
        "In {lang}, how would I write a function that {task}? Include a short usage example.",
        "Implement a function in {lang} that {task}, and state its time complexity.",
    )
    for lang in t.LANGUAGES:
        for task in t.CODING_TASKS:
            for form in rng.sample(forms, 2):
                yield _user("coding", form.format(lang=lang, task=task))
    for snippet in t.CODE_SNIPPETS:
        for question in t.CODE_QUESTIONS:
            yield _user("code-review", f"{question}\n\n```\n{snippet}\n```")
    for a, b, area in t.CODING_CONCEPT_PAIRS:
        yield _user("coding", f"What is the difference between {a.strip()} and {b} in {area}?")
        yield _user("coding", f"When should I use {a.strip()} instead of {b} in {area}? Give an example.")


_MATH_SUFFIXES = (
    "",
    " Show your reasoning step by step.",
    " Give just the final answer.",
    " Explain your answer briefly.",
)


def _math(rng: random.Random) -> Iterator[ChatPrompt]:
    for _ in range(90):
        for problem in t.MATH_PROBLEMS:
            values: dict[str, object] = {
                k: rng.randrange(lo, hi + 1, step) for k, (lo, hi, step) in problem.ranges.items()
            }
            values["name"] = rng.choice(t.PEOPLE)
            yield _user("math", problem.template.format(**values) + rng.choice(_MATH_SUFFIXES))
    for _ in range(60):
        start, step = rng.randrange(1, 30), rng.randrange(2, 9)
        seq = ", ".join(str(start + i * step) for i in range(5))
        yield _user("math", f"Find the next number in the sequence: {seq}. Explain the pattern.")


def _explain(rng: random.Random) -> Iterator[ChatPrompt]:
    for concept in t.CONCEPTS:
        for template in t.EXPLAIN_TEMPLATES:
            yield _user("explain", template.format(x=concept))


def _howto(rng: random.Random) -> Iterator[ChatPrompt]:
    for task in t.HOWTO_TASKS:
        for template in t.HOWTO_TEMPLATES:
            yield _user("howto", template.format(x=task))


def _creative(rng: random.Random) -> Iterator[ChatPrompt]:
    for form in t.CREATIVE_FORMS:
        for subject in t.CREATIVE_SUBJECTS:
            verb = rng.choice(("Write", "Compose", "Please write"))
            yield _user("creative", f"{verb} {form} about {subject}.")


def _text_work(rng: random.Random) -> Iterator[ChatPrompt]:
    for passage in t.PASSAGES:
        for task in t.PASSAGE_TASKS:
            yield _user("summary", f"{task}\n\n{passage}")
    for sentence in t.SENTENCES:
        for instruction in t.REWRITE_INSTRUCTIONS:
            yield _user("rewrite", f'{instruction}: "{sentence}"')
        for language in t.TARGET_LANGUAGES:
            yield _user("translate", f'Translate into {language}: "{sentence}"')


def _lists(rng: random.Random) -> Iterator[ChatPrompt]:
    forms = ("List {n} {x}.", "Give me {n} {x}, with one sentence about each.", "What are {n} {x}?")
    for thing in t.LIST_THINGS:
        for n in (3, 5, 7, 10):
            for form in rng.sample(forms, 2):
                yield _user("list", form.format(n=n, x=thing))


def _dialogue(rng: random.Random) -> Iterator[ChatPrompt]:
    for who in t.DIALOGUE_PARTIES:
        for topic in t.DIALOGUE_TOPICS:
            yield _user("dialogue", f"Write a short dialogue between {who} about {topic}.")
    for persona in t.PERSONAS:
        for question in t.PERSONA_QUESTIONS:
            yield ChatPrompt("roleplay", (("system", f"You are {persona}. Stay in character."), ("user", question)))


_TOOLS: dict[str, tuple[str, dict[str, str]]] = {
    "get_weather": ("Get the weather forecast for a city.", {"city": "string", "date": "string"}),
    "convert_currency": (
        "Convert an amount of money between currencies.",
        {"amount": "number", "from": "string", "to": "string"},
    ),
    "search_web": ("Search the web and return the top results.", {"query": "string"}),
    "create_event": (
        "Add an event to the user's calendar.",
        {"title": "string", "date": "string", "time": "string", "duration_minutes": "integer"},
    ),
    "send_email": ("Send an e-mail.", {"to": "string", "subject": "string", "body": "string"}),
    "get_stock_price": ("Get the latest price of a stock.", {"ticker": "string"}),
    "book_table": (
        "Book a restaurant table.",
        {"restaurant": "string", "party_size": "integer", "time": "string"},
    ),
    "set_timer": ("Start a countdown timer.", {"minutes": "integer", "label": "string"}),
}


def _tool_system(name: str) -> str:
    description, params = _TOOLS[name]
    schema = {
        "type": "object",
        "properties": {k: {"type": v} for k, v in params.items()},
        "required": list(params),
    }
    return (
        f"You can call one tool.\nTool: {name}\nDescription: {description}\nParameters (JSON schema): "
        f"{json.dumps(schema)}\nWhen the request needs the tool, reply with only a JSON object of the form "
        f'{{"tool": "{name}", "arguments": {{...}}}}.'
    )


def _tools(rng: random.Random) -> Iterator[ChatPrompt]:
    def call(name: str, text: str) -> ChatPrompt:
        return ChatPrompt("tool-call", (("system", _tool_system(name)), ("user", text)))

    times = ("9am", "noon", "3:30pm", "7pm")
    for city in t.CITIES:
        for when in t.WHEN:
            yield call(
                "get_weather",
                rng.choice(
                    (
                        "What's the weather like in {c} {w}?",
                        "Will it rain in {c} {w}?",
                        "Do I need a jacket in {c} {w}?",
                    )
                ).format(c=city, w=when),
            )
    for _ in range(60):
        a, b = rng.sample(t.CURRENCIES, 2)
        yield call("convert_currency", f"How much is {rng.randrange(5, 5000)} {a} in {b}?")
    for topic in t.SEARCH_TOPICS:
        yield call("search_web", f"Search the web for {topic}.")
        yield call("search_web", f"Can you find me information about {topic}?")
    for event in t.EVENTS:
        for when in t.WHEN:
            yield call("create_event", f"Add a {event} {when} at {rng.choice(times)} to my calendar.")
    messages = (
        "the meeting is moved to 4pm",
        "thanks for the birthday gift",
        "the report is ready for review",
        "I will be late tomorrow",
        "dinner is on Saturday",
        "the tickets are booked",
    )
    for person in t.PEOPLE:
        for message in rng.sample(messages, 3):
            yield call("send_email", f"Email {person} to say that {message}.")
    for ticker in t.STOCKS:
        yield call("get_stock_price", f"What is the current price of {ticker}?")
        yield call("get_stock_price", f"How is {ticker} trading right now?")
    for restaurant in t.RESTAURANTS:
        for when in t.WHEN:
            yield call(
                "book_table",
                f"Book a table for {rng.randrange(2, 9)} at {restaurant} {when} at {rng.choice(times)}.",
            )
    for label in ("pasta", "laundry", "tea", "workout", "meeting", "bread"):
        for minutes in rng.sample(range(1, 60), 4):
            yield call("set_timer", f"Set a timer for {minutes} minutes for the {label}.")
    for _ in range(80):
        person, city = rng.choice(t.PEOPLE), rng.choice(t.CITIES)
        yield _user(
            "json",
            f"Extract the name, age and city from this sentence and return them as JSON: "
            f'"{person} is {rng.randrange(18, 90)} years old and lives in {city}."',
        )
    things = (
        "a book you would recommend",
        "a healthy recipe",
        "a planet of the solar system",
        "a famous painting",
        "a city worth visiting",
        "a programming language",
        "a dog breed",
        "a board game",
    )
    field_sets = (
        "name, description and three tags",
        "title, year and a one-sentence summary",
        "name, pros and cons",
    )
    for thing in things:
        for fields in field_sets:
            yield _user("json", f"Return a JSON object describing {thing}, with the fields {fields}.")


def _multi_turn(rng: random.Random) -> Iterator[ChatPrompt]:
    for question, answer in t.FIRST_TURNS:
        for follow_up in t.FOLLOW_UPS:
            yield ChatPrompt("multi-turn", (("user", question), ("assistant", answer), ("user", follow_up)))


def _everyday(rng: random.Random) -> Iterator[ChatPrompt]:
    for question in t.FACT_QUESTIONS:
        yield _user("facts", question)
        yield _user("facts", f"{question} Answer in one sentence, then add an interesting related fact.")
    for a, b in t.COMPARE_PAIRS:
        for template in t.COMPARE_TEMPLATES:
            yield _user("compare", template.format(a=a, b=b))
    for decision in t.DECISIONS:
        yield _user("advice", f"Should I {decision}? Give me the pros and cons.")
        yield _user("advice", f"Help me decide whether to {decision}.")
    for feeling in t.FEELINGS:
        yield _user("advice", f"I feel {feeling}. What should I do?")
        yield _user("advice", f"I'm {feeling}. Any practical tips?")
    for tone in t.EMAIL_TONES:
        for recipient in t.EMAIL_RECIPIENTS:
            for subject in t.EMAIL_SUBJECTS:
                yield _user("email", f"Write a {tone} e-mail to {recipient} about {subject}.")


# domain builder -> share of the mix
_BUILDERS: tuple[tuple[Callable[[random.Random], Iterator[ChatPrompt]], float], ...] = (
    (_coding, 0.16),
    (_math, 0.14),
    (_explain, 0.12),
    (_howto, 0.08),
    (_creative, 0.10),
    (_text_work, 0.08),
    (_lists, 0.06),
    (_dialogue, 0.05),
    (_tools, 0.08),
    (_multi_turn, 0.04),
    (_everyday, 0.09),
)

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant. Keep answers short.",
    "You are a patient teacher who explains things step by step.",
    "You are a friendly assistant. Use a warm tone.",
)
SYSTEM_PROMPT_SHARE = 0.25  # of the conversations that have no system prompt of their own


MAX_ROUNDS = 12  # rounds of the builders (each with its own randomness) a prompt set may draw


def _round_prompts(seed: int, round_index: int) -> Iterator[ChatPrompt]:
    """One round of every builder's conversations, mixed by domain weight. Round 0 is the
    seed's own draw; later rounds redraw the builders' random choices (names, numbers,
    pairings), which yields conversations the earlier rounds did not have."""
    tag = f"{seed}" if round_index == 0 else f"{seed}.{round_index}"
    pools: list[list[ChatPrompt]] = []
    weights: list[float] = []
    for builder, weight in _BUILDERS:
        pool = list(builder(random.Random(f"{tag}:{builder.__name__}")))
        random.Random(f"{tag}:{builder.__name__}:order").shuffle(pool)
        pools.append(pool)
        weights.append(weight)
    rng = random.Random(f"{tag}:mix")
    cursors = [0] * len(pools)
    while True:
        live = [i for i, pool in enumerate(pools) if cursors[i] < len(pool)]
        if not live:
            return
        i = rng.choices(live, weights=[weights[j] for j in live])[0]
        prompt = pools[i][cursors[i]]
        cursors[i] += 1
        if prompt.turns[0][0] != "system" and rng.random() < SYSTEM_PROMPT_SHARE:
            prompt = ChatPrompt(prompt.domain, (("system", rng.choice(SYSTEM_PROMPTS)), *prompt.turns))
        yield prompt


def build_prompt_set(num_prompts: int, seed: int = 0) -> list[ChatPrompt]:
    """`num_prompts` distinct conversations (fewer if MAX_ROUNDS rounds run out), mixed by
    domain weight; the same (num_prompts, seed) always gives the same list, and a larger
    num_prompts extends a smaller one's list. One round gives about 7,000; each further
    round adds the conversations its redrawn choices make new, no more per domain
    than round 0 had."""
    seen: set[str] = set()
    out: list[ChatPrompt] = []
    round_zero: collections.Counter[str] = collections.Counter()  # new prompts per domain in round 0
    for round_index in range(MAX_ROUNDS):
        new_in_round: collections.Counter[str] = collections.Counter()
        for prompt in _round_prompts(seed, round_index):
            if len(out) == num_prompts:
                return out
            # a domain adds no more per round than in round 0: rounds keep the mix
            if prompt.key in seen or (round_index and new_in_round[prompt.domain] >= round_zero[prompt.domain]):
                continue
            seen.add(prompt.key)
            out.append(prompt)
            new_in_round[prompt.domain] += 1
        if round_index == 0:
            round_zero = new_in_round
    return out
