"""The agentic workload of benchmarks/agentic_engine.py: sessions that share a system prompt,
each a few turns of new user tokens and a reply of a drawn length, all from one seed."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    sessions: int
    shared_prefix: int
    turns: int
    turn_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    seed: int


@dataclass
class Session:
    history: list[int]
    turns: list[tuple[list[int], int]]  # per turn: the new user ids, the output length
    done: int = 0


def make_sessions(load: Workload, vocab_size: int) -> list[Session]:
    rng = random.Random(load.seed)
    high = vocab_size // 2

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, high) for _ in range(n)]

    system = ids(load.shared_prefix)
    return [
        Session(
            history=list(system),
            turns=[(ids(rng.randint(*load.turn_tokens)), rng.randint(*load.output_tokens)) for _ in range(load.turns)],
        )
        for _ in range(load.sessions)
    ]
