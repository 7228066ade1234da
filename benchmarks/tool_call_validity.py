"""How often the embedded SmolLM2 writes a usable tool call, with and without the grammar that a
forced `tool_choice` puts on its output (docs/design.md §2.8, §6.6).

    python benchmarks/tool_call_validity.py [--device cpu] [--model smollm2-135m] [--dtype float32]
        [--max-tokens 128] [--batch 16] [--temperature 1.0] [--parallel-tool-calls] [--out results.json]

58 prompts (weather, search, calendar, email, units, currency, timers, travel, music...), each
offered 2-4 tools with bounded parameter schemas. Every prompt becomes an OpenAI chat body and
goes through the gateway's own planning (`services.gateway.endpoints.CHAT`: the same body
checks, chat template, tool parser and `chat_grammar` as the server), then through the engine
offline. Four systems see every prompt:

- constrained: `tool_choice: "required"`, so the output is constrained to calls in the model's
  own (Hermes) syntax, each call's arguments to its function's schema;
- unconstrained: `tool_choice: "auto"`: the same tools in the same prompt, the output free;

each greedy and sampled once (--temperature, seed = the prompt's index). The output is read by
the gateway's own whole-message path (`ChoiceToolCalls.message`, the hermes parser). A prompt
counts as valid when the output parses into at least one call and every call names an offered
tool and has arguments that validate (jsonschema) against its schema; "intended" also asks the
first call to name the tool the prompt is about.

Without --parallel-tool-calls the bodies send `parallel_tool_calls: false` (one call, then the
grammar allows only a stop token); with it, `required` lets the model call again and again.
The waves of --batch prompts are interleaved across the four systems; tokens/s counts the
generated tokens over the wall time of the waves (prefill and grammar compilation included),
"decode" the tokens after each request's first over the time after a wave's last first token.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.smollm2_offline import git_commit, machine_name  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.engine_setup import build_engine_parts  # noqa: E402
from engine.loader.load import load_model  # noqa: E402
from services.gateway.chat_tool_calls import ChoiceToolCalls  # noqa: E402
from services.gateway.endpoints import CHAT, Plan, Served  # noqa: E402
from services.gateway.responses import ChatFormatter, TokenText  # noqa: E402


def _string(max_length: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length}


def _pattern(regex: str, description: str) -> dict[str, Any]:
    """A string bounded by an anchored pattern (xgrammar ignores maxLength beside a pattern)."""
    return {"type": "string", "pattern": regex, "description": description}


def _integer(minimum: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


DATE = _pattern(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "YYYY-MM-DD")
CLOCK = _pattern(r"^[0-2][0-9]:[0-5][0-9]$", "HH:MM, 24-hour")
AIRPORT = _pattern(r"^[A-Z]{3}$", "IATA airport code")
CURRENCY = _pattern(r"^[A-Z]{3}$", "ISO 4217 code")
UNITS = ["meter", "kilometer", "mile", "foot", "inch", "kilogram", "pound", "celsius", "fahrenheit", "liter", "gallon"]
LANGUAGES = ["english", "french", "spanish", "german", "italian", "japanese", "chinese"]

TOOLS: dict[str, dict[str, Any]] = {
    tool["function"]["name"]: tool
    for tool in [
        _function(
            "get_weather",
            "Current weather in a city",
            {"city": _string(30), "unit": {"enum": ["celsius", "fahrenheit"]}},
            ["city"],
        ),
        _function(
            "get_forecast",
            "Weather forecast for the next days",
            {"city": _string(30), "days": _integer(1, 7)},
            ["city", "days"],
        ),
        _function("search_web", "Search the web", {"query": _string(60), "num_results": _integer(1, 10)}, ["query"]),
        _function(
            "create_calendar_event",
            "Add an event to the user's calendar",
            {"title": _string(50), "date": DATE, "start_time": CLOCK, "duration_minutes": _integer(5, 480)},
            ["title", "date", "start_time"],
        ),
        _function(
            "send_email",
            "Send an email",
            {"to": _string(60), "subject": _string(80), "body": _string(300)},
            ["to", "subject", "body"],
        ),
        _function(
            "convert_units",
            "Convert a quantity between units",
            {"value": {"type": "number"}, "from_unit": {"enum": UNITS}, "to_unit": {"enum": UNITS}},
            ["value", "from_unit", "to_unit"],
        ),
        _function(
            "convert_currency",
            "Convert money between currencies at today's rate",
            {"amount": {"type": "number", "minimum": 0}, "from_currency": CURRENCY, "to_currency": CURRENCY},
            ["amount", "from_currency", "to_currency"],
        ),
        _function(
            "get_stock_price",
            "Latest price of a stock",
            {"ticker": _pattern(r"^[A-Z]{1,5}$", "the stock symbol")},
            ["ticker"],
        ),
        _function(
            "set_timer", "Start a countdown timer", {"minutes": _integer(1, 1440), "label": _string(30)}, ["minutes"]
        ),
        _function(
            "set_reminder",
            "Remind the user of something at a time",
            {"text": _string(100), "time": CLOCK},
            ["text", "time"],
        ),
        _function(
            "translate_text",
            "Translate text into another language",
            {"text": _string(200), "target_language": {"enum": LANGUAGES}},
            ["text", "target_language"],
        ),
        _function(
            "book_restaurant",
            "Reserve a table at a restaurant",
            {"restaurant": _string(50), "party_size": _integer(1, 20), "date": DATE, "time": CLOCK},
            ["restaurant", "party_size", "date", "time"],
        ),
        _function(
            "search_flights",
            "Find flights between two airports on a date",
            {"origin": AIRPORT, "destination": AIRPORT, "date": DATE},
            ["origin", "destination", "date"],
        ),
        _function(
            "play_music", "Play a song or an artist", {"query": _string(60), "shuffle": {"type": "boolean"}}, ["query"]
        ),
        _function(
            "get_news", "Latest news headlines on a topic", {"topic": _string(40), "count": _integer(1, 10)}, ["topic"]
        ),
        _function("calculator", "Evaluate an arithmetic expression", {"expression": _string(80)}, ["expression"]),
        _function("define_word", "Dictionary definition of a word", {"word": _string(30)}, ["word"]),
        _function(
            "get_directions",
            "Route between two places",
            {
                "origin": _string(60),
                "destination": _string(60),
                "mode": {"enum": ["driving", "walking", "transit", "cycling"]},
            },
            ["origin", "destination"],
        ),
        _function(
            "find_recipe",
            "Find a recipe",
            {"dish": _string(40), "max_minutes": _integer(5, 240), "vegetarian": {"type": "boolean"}},
            ["dish"],
        ),
        _function(
            "set_lights",
            "Switch the lights of a room",
            {
                "room": {"enum": ["kitchen", "bedroom", "living room", "office", "bathroom"]},
                "brightness": _integer(0, 100),
            },
            ["room", "brightness"],
        ),
    ]
}


@dataclass(frozen=True)
class ToolPrompt:
    messages: list[dict[str, str]]
    tools: tuple[str, ...]  # offered, in this order
    intended: str  # the tool the prompt asks for


def _ask(text: str, tools: str, system: str | None = None) -> ToolPrompt:
    """`tools`: space-separated names, the intended one first (offered in a rotated order)."""
    names = tools.split()
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    rotated = names[len(text) % len(names) :] + names[: len(text) % len(names)]
    return ToolPrompt(messages, tuple(rotated), names[0])


ASSISTANT = "You are a helpful assistant with access to tools. Use them when they help."
PROMPTS: list[ToolPrompt] = [
    _ask("What's the weather like in Paris right now?", "get_weather search_web"),
    _ask("Is it raining in Tokyo?", "get_weather get_news calculator set_lights"),
    _ask("how hot is it in cairo today in fahrenheit", "get_weather convert_units"),
    _ask("Tell me the temperature in Oslo, in celsius please.", "get_weather get_forecast set_timer"),
    _ask("Will I need an umbrella in London over the next 3 days?", "get_forecast get_weather search_web"),
    _ask("Give me the 5-day forecast for Lima.", "get_forecast get_news"),
    _ask("Search the web for the best hiking trails in Colorado.", "search_web get_directions find_recipe play_music"),
    _ask("Look up who won the 2018 football world cup.", "search_web define_word"),
    _ask("Find me three articles about quantum computing.", "search_web get_news translate_text"),
    _ask("Can you google 'how to repot a cactus'?", "search_web find_recipe calculator"),
    _ask(
        "Put a dentist appointment in my calendar on 2026-03-14 at 09:30 for 45 minutes.",
        "create_calendar_event set_reminder",
    ),
    _ask("Schedule 'Team sync' on 2026-05-02 at 14:00.", "create_calendar_event send_email set_timer set_reminder"),
    _ask(
        "Add my mum's birthday dinner to the calendar: 2026-07-19, 19:00, two hours.",
        "create_calendar_event book_restaurant",
    ),
    _ask(
        "Block out Friday 2026-01-09 from 08:00 for a 30 minute run.", "create_calendar_event set_reminder get_weather"
    ),
    _ask(
        "Email bob@example.com and tell him the report is late, subject 'Report'.",
        "send_email create_calendar_event",
    ),
    _ask(
        "Send a short thank-you note to anna@example.org for the flowers.",
        "send_email translate_text set_reminder search_web",
    ),
    _ask(
        "Write to hr@company.com asking for a day off next Monday.",
        "send_email create_calendar_event search_web",
        ASSISTANT,
    ),
    _ask("Let my landlord (landlord@mail.com) know the heating is broken.", "send_email search_web"),
    _ask("How many kilometers is 26.2 miles?", "convert_units calculator"),
    _ask("Convert 180 pounds to kilograms.", "convert_units convert_currency calculator"),
    _ask("What is 5 feet in meters?", "convert_units define_word"),
    _ask("I have 3 gallons of water; how many liters is that?", "convert_units calculator search_web"),
    _ask("Turn 350 degrees fahrenheit into celsius for my oven.", "convert_units get_weather"),
    _ask("How much is 250 US dollars in euros?", "convert_currency convert_units"),
    _ask("Convert 1000 JPY to GBP.", "convert_currency get_stock_price calculator convert_units"),
    _ask("I need to pay 75 swiss francs, what's that in USD?", "convert_currency calculator"),
    _ask("What's Apple's stock price?", "get_stock_price search_web get_news"),
    _ask("Check the price of TSLA for me.", "get_stock_price convert_currency"),
    _ask("How is Microsoft (MSFT) trading today?", "get_stock_price get_news search_web calculator"),
    _ask("Set a timer for 12 minutes for the pasta.", "set_timer set_reminder"),
    _ask("Start a 25 minute pomodoro timer.", "set_timer create_calendar_event play_music"),
    _ask("Timer: 3 minutes, label it tea.", "set_timer set_lights"),
    _ask("Remind me to call the bank at 16:30.", "set_reminder set_timer send_email"),
    _ask("Please remind me to take my pills at 08:00.", "set_reminder create_calendar_event"),
    _ask("Don't let me forget to water the plants at 19:00!", "set_reminder set_timer set_lights"),
    _ask("Translate 'Where is the train station?' into German.", "translate_text define_word"),
    _ask("How do you say 'thank you very much' in Japanese?", "translate_text search_web"),
    _ask("Put this into Spanish: I would like a coffee with milk.", "translate_text send_email define_word"),
    _ask("Book a table for 4 at Luigi's on 2026-02-14 at 20:00.", "book_restaurant create_calendar_event"),
    _ask(
        "Reserve dinner for two at The Green Fork, 2026-06-01, 19:30.",
        "book_restaurant find_recipe get_directions",
    ),
    _ask("Find flights from JFK to LHR on 2026-04-10.", "search_flights convert_currency"),
    _ask("Any flights Paris CDG to Tokyo HND on 2026-09-03?", "search_flights get_weather search_web book_restaurant"),
    _ask("I need to fly from SFO to SEA on 2026-11-20.", "search_flights create_calendar_event book_restaurant"),
    _ask("Play some Miles Davis.", "play_music search_web"),
    _ask("Put on 'Bohemian Rhapsody' by Queen.", "play_music get_news set_lights"),
    _ask("I want to hear relaxing piano music, shuffled.", "play_music set_timer"),
    _ask("What's the latest news about electric cars?", "get_news search_web"),
    _ask("Give me 5 headlines about the economy.", "get_news get_stock_price search_web translate_text"),
    _ask("What is 17 times 23 plus 4?", "calculator convert_units"),
    _ask("Compute (1250 * 0.18) / 12.", "calculator convert_currency get_stock_price"),
    _ask("What does 'ephemeral' mean?", "define_word translate_text search_web calculator"),
    _ask("Define the word serendipity.", "define_word search_web"),
    _ask("How do I get from the Louvre to the Eiffel Tower on foot?", "get_directions search_web get_weather"),
    _ask("Directions from Berlin Hauptbahnhof to Alexanderplatz by transit, please.", "get_directions search_flights"),
    _ask(
        "Find a vegetarian lasagna recipe that takes under an hour.", "find_recipe search_web book_restaurant set_timer"
    ),
    _ask("What can I cook with chickpeas in 20 minutes?", "find_recipe calculator"),
    _ask("Dim the bedroom lights to 30 percent.", "set_lights set_timer"),
    _ask("Turn the kitchen lights all the way up.", "set_lights play_music set_reminder", ASSISTANT),
]


@dataclass(frozen=True)
class System:
    name: str
    tool_choice: str
    temperature: float  # 0: greedy


@dataclass
class Outcome:
    text: str = ""
    tokens: int = 0
    finish_reason: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    valid: bool = False
    intended: bool = False


@dataclass
class Timing:
    tokens: int = 0
    seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0


def body(prompt: ToolPrompt, system: System, index: int, max_tokens: int, parallel: bool) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": "bench",
        "messages": prompt.messages,
        "tools": [TOOLS[name] for name in prompt.tools],
        "tool_choice": system.tool_choice,
        "max_tokens": max_tokens,
        "temperature": system.temperature,
    }
    if not parallel:
        request["parallel_tool_calls"] = False
    if system.temperature > 0:
        request["seed"] = index
    return request


def plan(engine: EngineCore, request: dict[str, Any]) -> Plan:
    """The request as the server would run it: parsed, rendered, its grammar built."""
    tokenizer = engine.tokenizer
    served = Served("bench", "bench", engine.max_model_len, tokenizer, TokenText(tokenizer), include_usage=False)
    return CHAT.plan(CHAT.parse(request), served)


def judge(prompt: ToolPrompt, plan_: Plan, text: str, finish_reason: str | None, tokens: int) -> Outcome:
    formatter = plan_.formatter
    assert isinstance(formatter, ChatFormatter) and isinstance(formatter.tool_calls, ChoiceToolCalls)
    message, reason = formatter.tool_calls.message(text, finish_reason)
    calls = [call["function"] for call in message.get("tool_calls", [])]
    valid = bool(calls) and all(_valid_call(prompt, call) for call in calls)
    return Outcome(text, tokens, reason, calls, valid, valid and calls[0]["name"] == prompt.intended)


def _valid_call(prompt: ToolPrompt, call: dict[str, Any]) -> bool:
    if call["name"] not in prompt.tools:
        return False
    try:
        jsonschema.validate(json.loads(call["arguments"]), TOOLS[call["name"]]["function"]["parameters"])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def run_wave(engine: EngineCore, plans: list[Plan]) -> tuple[list[tuple[str, str | None, int]], Timing]:
    """Every plan's one job in one batch; (text, finish reason, tokens) per plan, and the timing."""
    start = time.perf_counter()
    ids = [f"w{time.perf_counter_ns()}-{i}" for i in range(len(plans))]
    for request_id, plan_ in zip(ids, plans, strict=True):
        (job,) = plan_.jobs
        engine.add_request(request_id, job.prompt_token_ids, job.params)
    texts = dict.fromkeys(ids, "")
    results: dict[str, tuple[str | None, int]] = {}
    first_token_s = start
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts[out.request_id] += out.new_text
            if out.finished:
                results[out.request_id] = (out.finish_reason, len(out.token_ids))
                if out.timings is not None and out.timings.first_token_s is not None:
                    first_token_s = max(first_token_s, out.timings.first_token_s)
    end = time.perf_counter()
    produced = sum(n for _, n in results.values())
    timing = Timing(produced, end - start, produced - len(plans), end - first_token_s)
    return [(texts[i], *results[i]) for i in ids], timing


def summary(outcomes: list[Outcome], timing: Timing) -> dict[str, Any]:
    n = len(outcomes)
    return {
        "prompts": n,
        "valid": sum(o.valid for o in outcomes) / n,
        "intended": sum(o.intended for o in outcomes) / n,
        "with_calls": sum(bool(o.calls) for o in outcomes) / n,
        "finished_length": sum(o.finish_reason == "length" for o in outcomes),
        "mean_tokens": sum(o.tokens for o in outcomes) / n,
        "tokens_per_s": timing.tokens / timing.seconds,
        "decode_tokens_per_s": timing.decode_tokens / timing.decode_seconds if timing.decode_seconds > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="smollm2-135m", help="alias or path; its chat template must write calls")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on CPU, else bfloat16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="prompts per wave (max_num_seqs)")
    parser.add_argument("--temperature", type=float, default=1.0, help="of the sampled runs (OpenAI's default)")
    parser.add_argument("--parallel-tool-calls", action="store_true", help="let `required` call more than once")
    parser.add_argument("--limit", type=int, default=len(PROMPTS), help="only the first N prompts")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("float32" if args.device == "cpu" else "bfloat16"))
    loaded = load_model(args.model, dtype=dtype, device=args.device, progress=False)
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=str(dtype).removeprefix("torch."),
        max_num_seqs=args.batch,
        max_model_len=2048,
        enable_prefix_cache=False,  # every system prefills its prompts itself
    )
    engine = EngineCore(config, parts=build_engine_parts(config, loaded=loaded))
    systems = [
        System("constrained greedy", "required", 0.0),
        System("unconstrained greedy", "auto", 0.0),
        System(f"constrained T={args.temperature:g}", "required", args.temperature),
        System(f"unconstrained T={args.temperature:g}", "auto", args.temperature),
    ]
    prompts = PROMPTS[: args.limit]
    indexed = list(enumerate(prompts))
    for system in systems:  # warm-up: the grammar compiler's tokenizer index, first-call costs
        run_wave(engine, [plan(engine, body(p, system, i, 8, args.parallel_tool_calls)) for i, p in indexed[:2]])
    outcomes: dict[str, list[Outcome]] = {s.name: [] for s in systems}
    timings = {s.name: Timing() for s in systems}
    for wave in (indexed[i : i + args.batch] for i in range(0, len(indexed), args.batch)):
        for system in systems:  # interleaved, so that a slow spell of the machine hits every system
            plans = [plan(engine, body(p, system, i, args.max_tokens, args.parallel_tool_calls)) for i, p in wave]
            results, timing = run_wave(engine, plans)
            for (_, prompt), plan_, (text, reason, tokens) in zip(wave, plans, results, strict=True):
                outcomes[system.name].append(judge(prompt, plan_, text, reason, tokens))
            total = timings[system.name]
            total.tokens += timing.tokens
            total.seconds += timing.seconds
            total.decode_tokens += timing.decode_tokens
            total.decode_seconds += timing.decode_seconds
        print(f"wave done: {len(outcomes[systems[0].name])} prompts", flush=True)
    rows = {name: summary(outcomes[name], timings[name]) for name in outcomes}
    print(
        "\n| system | valid calls | intended tool | any call parsed | cut at max_tokens | mean tokens "
        "| tokens/s | decode tokens/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        decode = row["decode_tokens_per_s"]
        print(
            f"| {name} | {row['valid']:.0%} | {row['intended']:.0%} | {row['with_calls']:.0%} | "
            f"{row['finished_length']} | {row['mean_tokens']:.1f} | {row['tokens_per_s']:.1f} | "
            f"{'-' if decode is None else f'{decode:.1f}'} |"
        )
    if args.out:
        record = {
            "date": time.strftime("%Y-%m-%d"),
            "device": args.device,
            "dtype": str(dtype),
            "machine": machine_name(args.device),
            "commit": git_commit(),
            "threads": torch.get_num_threads(),
            "max_tokens": args.max_tokens,
            "batch": args.batch,
            "parallel_tool_calls": args.parallel_tool_calls,
            "summary": rows,
            "prompts": [
                {
                    "messages": prompt.messages,
                    "tools": list(prompt.tools),
                    "intended": prompt.intended,
                    **{name: vars(outcomes[name][i]) for name in outcomes},
                }
                for i, prompt in enumerate(prompts)
            ],
        }
        args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
