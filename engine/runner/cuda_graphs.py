"""Decode steps captured as CUDA (HIP) graphs, one per batch-size bucket.

A step body reads its inputs from static buffers (`rows`, `starts`) and writes fixed-shape
outputs; replay launches the whole step at once, so a decode step costs the host a few
microseconds instead of one launch per kernel. Unused bucket entries take the padding row,
whose slots are all -1 (writes land in the sink row). Attention grids are sized for the
longest context, so one graph serves every sequence length.

Grammar rows replay too: the body always applies the token bitmasks of static `grammar`
buffers. A batch with grammar rows copies its masks in (one [B, V / 32] int32 copy);
after it, the next batch without them resets the buffers to "all allowed" on the device,
so a batch of no grammar rows copies nothing. Only batches whose sampling the captured body
covers replay (greedy, no penalties, logprobs or logit bias); the others run the same body
eagerly.

Buckets of CASCADE_MIN_BATCH rows and more, when `shared_bound` is given, are captured twice:
as above, and with the shared pass of docs/design.md §4.9, whose body reads a packed static
buffer (P, the table row, the per-row lengths; engine/runner/shared_prefix_rows.py) staged
before each replay. A batch that shares a prefix replays the second, any other the first, so
a batch that shares nothing pays nothing for the shared pass. Smaller buckets, batch 1
included, have the plain graph only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.kernels.attention_metadata import SharedPrefix
from engine.runner.grammar_rows import ALL_ALLOWED, GrammarRows, HostGrammarRows
from engine.runner.h2d import copy_into
from engine.runner.shared_prefix_rows import SharedRows, stage, unpack
from engine.runner.step_output import DeviceStepOutput

StepBody = Callable[[torch.Tensor, torch.Tensor, GrammarRows, SharedPrefix | None], DeviceStepOutput]
CASCADE_MIN_BATCH = 8

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


class GraphedStep:
    def __init__(
        self,
        body: StepBody,
        max_batch: int,
        padding_row: int,
        vocab_size: int,
        device: torch.device,
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
        shared_bound: int | None = None,  # the longest context, to capture the shared pass
    ) -> None:
        self.buckets = tuple(b for b in buckets if b <= max_batch)
        if not self.buckets or self.buckets[-1] < max_batch:
            self.buckets = (*self.buckets, max_batch)
        self.padding_row = padding_row
        size = self.buckets[-1]
        self.rows = torch.full((size,), padding_row, dtype=torch.int64, device=device)
        self.starts = torch.zeros(size, dtype=torch.int32, device=device)
        self.grammar = GrammarRows.all_allowed(size, vocab_size, device)
        self.shared = torch.zeros(2 + size, dtype=torch.int32, device=device)  # packed SharedRows
        self.shared_from = CASCADE_MIN_BATCH if shared_bound is not None else None
        self._grammar_dirty = False  # the buffers hold some batch's masks
        # keyed by (bucket, whether the graph runs the shared pass)
        self._graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._outputs: dict[tuple[int, bool], DeviceStepOutput] = {}
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):  # largest first: smaller ones reuse its pool
            rows, starts, grammar = self.rows[:bucket], self.starts[:bucket], self.grammar[:bucket]
            for cascade in (False, True) if self._captures_shared(bucket) else (False,):
                shared = unpack(self.shared[: 2 + bucket], shared_bound or 0) if cascade else None
                warmup = torch.cuda.Stream(device)
                warmup.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(warmup):
                    for _ in range(2):
                        body(rows, starts, grammar, shared)
                torch.cuda.current_stream(device).wait_stream(warmup)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._outputs[bucket, cascade] = body(rows, starts, grammar, shared)
                self._graphs[bucket, cascade] = graph

    def bucket_for(self, batch: int) -> int | None:
        for bucket in self.buckets:
            if bucket >= batch:
                return bucket
        return None

    def _captures_shared(self, bucket: int) -> bool:
        return self.shared_from is not None and bucket >= self.shared_from

    def replays_shared(self, batch: int) -> bool:
        """Whether a batch of this size replays a graph that can run the shared pass."""
        bucket = self.bucket_for(batch)
        return bucket is not None and self._captures_shared(bucket)

    def replay(
        self, rows: np.ndarray, starts: np.ndarray, grammar: HostGrammarRows | None, shared: SharedRows | None = None
    ) -> DeviceStepOutput:
        """Run the step for len(rows) requests (`grammar`: their masks, None when none has a
        grammar; `shared`: the keys they share, if any); returns outputs cut to that batch,
        copied out of the graph's buffers (the next replay overwrites them)."""
        batch = len(rows)
        bucket = self.bucket_for(batch)
        assert bucket is not None
        padded_rows = np.full(bucket, self.padding_row, dtype=np.int64)
        padded_rows[:batch] = rows
        padded_starts = np.zeros(bucket, dtype=np.int32)
        padded_starts[:batch] = starts
        copy_into(self.rows[:bucket], padded_rows)
        copy_into(self.starts[:bucket], padded_starts)
        self._stage_grammar(bucket, grammar)
        cascade = shared is not None and self._captures_shared(bucket)
        if shared is not None and cascade:
            stage(self.shared, shared, bucket)
        self._graphs[bucket, cascade].replay()
        return self._outputs[bucket, cascade].map(lambda t: t[:batch].clone())

    def _stage_grammar(self, bucket: int, grammar: HostGrammarRows | None) -> None:
        if grammar is None:
            if self._grammar_dirty:
                self.grammar.token_bitmask.fill_(ALL_ALLOWED)
                self.grammar.is_grammar.fill_(False)
                self._grammar_dirty = False
            return
        batch = len(grammar.is_grammar)  # the padding rows' stale masks only touch outputs cut off
        copy_into(self.grammar.token_bitmask[:batch], grammar.token_bitmask)
        copy_into(self.grammar.is_grammar[:batch], grammar.is_grammar)
        self._grammar_dirty = True
