"""Engine-wide DSpark counters, kept on the host from each step's output copy."""

from __future__ import annotations


class SpecCounters:
    def __init__(self, gamma: int) -> None:
        self.gamma = gamma
        self.verify_steps = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0  # drafts accepted (the bonus token is not a draft)
        self.accept_length_counts = [0] * (gamma + 2)  # [n]: verifies that committed n tokens
        self.accepted_per_position = [0] * gamma  # [i]: verifies whose draft i was accepted
        self.undrafted_tokens = 0  # decode tokens of steps over SpeculativeConfig.max_batch_size

    def record(self, committed: int) -> None:
        """One verify of one request committed `committed` tokens (accepted drafts + bonus)."""
        accepted = committed - 1
        self.verify_steps += 1
        self.draft_tokens += self.gamma
        self.accepted_tokens += accepted
        self.accept_length_counts[committed] += 1
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    def record_undrafted(self) -> None:
        """One request decoded one token in a step that did not draft (batch over the cap)."""
        self.undrafted_tokens += 1

    @property
    def mean_accept_length(self) -> float:
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    def acceptance_curve(self) -> list[float]:
        """[i]: fraction of verifies whose first i+1 drafts were all accepted."""
        return [n / self.verify_steps if self.verify_steps else 0.0 for n in self.accepted_per_position]
