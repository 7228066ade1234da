"""Varied chat prompts for parity, acceptance and benchmark tests.

`CHAT_PROMPTS` are conversations (OpenAI-style message lists): facts, arithmetic, code,
lists, creative writing, translation, reasoning, a system prompt, and multi-turn exchanges
whose earlier turns share a prefix (prefix-cache reuse). `PROMPTS` are the last user turns as
plain strings.
"""

from __future__ import annotations

Message = dict[str, str]


def _user(text: str) -> list[Message]:
    return [{"role": "user", "content": text}]


CHAT_PROMPTS: list[list[Message]] = [
    _user("What is the capital of France?"),
    _user("Write a haiku about the sea."),
    _user("Explain in two sentences why the sky is blue."),
    _user("What is 17 multiplied by 23? Show your working."),
    _user("Write a Python function that returns the n-th Fibonacci number."),
    _user("List five fruits that are rich in vitamin C."),
    _user("Translate 'Good morning, how are you?' into French and Spanish."),
    _user("Give me three tips for a good night's sleep."),
    _user("What is the difference between a list and a tuple in Python?"),
    _user("Summarise the plot of Romeo and Juliet in one paragraph."),
    _user("If a train travels 120 km in 1.5 hours, what is its average speed?"),
    _user("Write a short story opening that begins with a knock at the door."),
    _user("What are the three states of matter? Describe each briefly."),
    _user("Suggest a name for a coffee shop run by cats."),
    _user("How do I reverse a string in JavaScript?"),
    [
        {"role": "system", "content": "You are a pirate. Answer every question in pirate speech."},
        {"role": "user", "content": "How do I bake bread?"},
    ],
    [
        {"role": "system", "content": "You answer with a single word."},
        {"role": "user", "content": "What colour is grass?"},
    ],
    [
        {"role": "user", "content": "My name is Ada and I like astronomy."},
        {"role": "assistant", "content": "Nice to meet you, Ada! Astronomy is a wonderful hobby."},
        {"role": "user", "content": "Which planet should I look at tonight with a small telescope?"},
    ],
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And what is its population, roughly?"},
    ],
    [
        {"role": "user", "content": "Write a SQL query that counts the rows of a table named orders."},
        {"role": "assistant", "content": "SELECT COUNT(*) FROM orders;"},
        {
            "role": "user",
            "content": "Now count only the orders placed in 2024, assuming a created_at column.",
        },
    ],
]

PROMPTS: list[str] = [conversation[-1]["content"] for conversation in CHAT_PROMPTS]
