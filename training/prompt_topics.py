"""Vocabulary of the training prompt set (training.prompts): topics, tasks, short texts and
arithmetic problems that the templates there combine, read from data/prompt_topics.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

_DATA: dict[str, Any] = json.loads(
    resources.files("training").joinpath("data/prompt_topics.json").read_text(encoding="utf-8")
)


@dataclass(frozen=True)
class MathProblem:
    template: str  # str.format fields: the names of `ranges`, and optionally {name}
    ranges: dict[str, tuple[int, int, int]]  # field -> (low, high, step) of random.randrange


def _texts(name: str) -> tuple[str, ...]:
    return tuple(str(text) for text in _DATA[name])


def _pairs(name: str) -> tuple[tuple[str, str], ...]:
    return tuple((str(a), str(b)) for a, b in _DATA[name])


def _triples(name: str) -> tuple[tuple[str, str, str], ...]:
    return tuple((str(a), str(b), str(c)) for a, b, c in _DATA[name])


def _math_problems() -> tuple[MathProblem, ...]:
    return tuple(
        MathProblem(
            str(entry["template"]),
            {field: (int(low), int(high), int(step)) for field, (low, high, step) in entry["ranges"].items()},
        )
        for entry in _DATA["math_problems"]
    )


LANGUAGES = _texts("languages")
CODING_TASKS = _texts("coding_tasks")
CODE_SNIPPETS = _texts("code_snippets")
CODE_QUESTIONS = _texts("code_questions")
CODING_CONCEPT_PAIRS = _triples("coding_concept_pairs")
CONCEPTS = _texts("concepts")
EXPLAIN_TEMPLATES = _texts("explain_templates")
HOWTO_TASKS = _texts("howto_tasks")
HOWTO_TEMPLATES = _texts("howto_templates")
CREATIVE_FORMS = _texts("creative_forms")
CREATIVE_SUBJECTS = _texts("creative_subjects")
PASSAGES = _texts("passages")
PASSAGE_TASKS = _texts("passage_tasks")
SENTENCES = _texts("sentences")
REWRITE_INSTRUCTIONS = _texts("rewrite_instructions")
TARGET_LANGUAGES = _texts("target_languages")
LIST_THINGS = _texts("list_things")
DIALOGUE_PARTIES = _texts("dialogue_parties")  # who talks: "a teacher and a student"
DIALOGUE_TOPICS = _texts("dialogue_topics")
PERSONAS = _texts("personas")
PERSONA_QUESTIONS = _texts("persona_questions")
FACT_QUESTIONS = _texts("fact_questions")
COMPARE_PAIRS = _pairs("compare_pairs")
COMPARE_TEMPLATES = _texts("compare_templates")
DECISIONS = _texts("decisions")
FEELINGS = _texts("feelings")
EMAIL_TONES = _texts("email_tones")
EMAIL_RECIPIENTS = _texts("email_recipients")
EMAIL_SUBJECTS = _texts("email_subjects")
FOLLOW_UPS = _texts("follow_ups")
FIRST_TURNS = _pairs("first_turns")
CITIES = _texts("cities")
WHEN = _texts("when")
PEOPLE = _texts("people")
CURRENCIES = _texts("currencies")
SEARCH_TOPICS = _texts("search_topics")
STOCKS = _texts("stocks")
RESTAURANTS = _texts("restaurants")
EVENTS = _texts("events")
MATH_PROBLEMS = _math_problems()
