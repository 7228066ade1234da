"""Held-out chat prompts for DSpark tests: conversations of the drafter-training prompt set
that its held-out split (30 per mille, the training default) never showed the drafter."""

from __future__ import annotations

from training.prompts import build_prompt_set

HELDOUT_PERMILLE = 30


def spec_prompt_conversations(count: int) -> list[list[dict[str, str]]]:
    heldout = [p for p in build_prompt_set(6000) if p.is_heldout(HELDOUT_PERMILLE)]
    if len(heldout) < count:
        raise ValueError(f"only {len(heldout)} held-out prompts, {count} asked for")
    return [p.messages() for p in heldout[:count]]
