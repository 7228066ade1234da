"""The ModelRunner owns every device tensor: weights, KV pools, per-row state, and launches
one forward per scheduled step without waiting for the device.

Per-row device state (a row is a request's line in the req→token table):
- `last_token[row]`: the newest sampled token, the next step's input (the DSpark anchor);
- `kv_len[row]`: the row's committed KV length (DSpark advances it on the device).
The host learns both one step later from the step's output copy.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.attention import select_backend
from engine.kernels.attention_metadata import SharedPrefix
from engine.kv.pool import KVPool
from engine.models.context import CausalLM, ForwardContext
from engine.request import Request
from engine.runner.batch_inputs import uniform_window
from engine.runner.cpu_decoder_stack import with_cpu_decoder_stack
from engine.runner.cuda_graphs import DEFAULT_BUCKETS, GraphedStep
from engine.runner.extend_step import commit_one_token, launch_extend
from engine.runner.grammar_rows import GrammarRows, HostGrammarRows
from engine.runner.h2d import to_device
from engine.runner.options import RunnerOptions
from engine.runner.piecewise_graphs import PiecewiseForward
from engine.runner.row_sampling import RowSampling
from engine.runner.shared_prefix_rows import SharedRows, find_shared_prefix
from engine.runner.spec_decode import SpecDecoder
from engine.runner.step_output import DeviceStepOutput, PendingStep
from engine.scheduler import ScheduledStep, longest_kv_within
from engine.speculative.setup import SpecSetup

Shared = SharedPrefix | None
Output = DeviceStepOutput


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        vocab_size: int,
        num_slots: int,
        max_rows: int,
        dtype: torch.dtype,
        device: torch.device,
        attention_backend: str,
        req_to_token: torch.Tensor,
        req_to_token_host: np.ndarray,
        page_size: int = 1,
        spec: SpecSetup | None = None,
        options: RunnerOptions | None = None,
    ) -> None:
        # On CPU the runner sends the forwards the one-call decoder stack serves to it.
        self.model = with_cpu_decoder_stack(model) if device.type == "cpu" else model
        self.device = device
        self.dtype = dtype
        self.vocab_size = vocab_size
        self.kv_pool = KVPool(num_layers, num_slots, num_kv_heads, head_dim, dtype, device)
        self.backend = select_backend(attention_backend, device)
        self.req_to_token = req_to_token  # [max_rows, max_context] int32, device
        self.req_to_token_host = req_to_token_host  # its host mirror (the host owns it)
        self.page_size = page_size
        self.shared_prefix_steps = 0  # steps whose forward read a shared prefix once (§4.9)
        # One more row than requests can hold: the padding row of fixed-size batches.
        self.last_token = torch.zeros(max_rows + 1, dtype=torch.int64, device=device)
        self.kv_len = torch.zeros(max_rows + 1, dtype=torch.int32, device=device)
        self.sampling = RowSampling(max_rows + 1, vocab_size, device)
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.options = options = options or RunnerOptions()
        self.dspark: SpecDecoder | None = None
        self.capture_layers: tuple[int, ...] = ()
        self.graphs: GraphedStep | None = None
        self.graphs_without_draft: GraphedStep | None = None  # DSpark batches over max_batch_size
        self.piecewise: PiecewiseForward | None = None  # prefill and mixed forwards, by token count
        if spec is not None:
            draft_pool = spec.new_pool(num_slots, dtype, device)
            self.dspark = SpecDecoder(
                spec, self.model, self.kv_pool, draft_pool, self.backend, self.sampling, options.accept_rule
            )
            self.capture_layers = spec.capture_layers

    # -- admission ------------------------------------------------------------------------

    def admit(self, req: Request) -> None:
        """Stage the request's sampling parameters and penalty state in its row."""
        self.sampling.set_row(req.row, req.params, req.rng_key, req.prompt_ids, req.output_ids)

    # -- disaggregation: KV in and out ---------------------------------------------------

    def export_kv(self, req: Request) -> tuple[torch.Tensor, torch.Tensor | None]:
        """CPU copies of the request's KV for positions [0, kv_len): target [L, 2, n, Hkv, D]
        and draft. Runs between steps; waits for the device (a handoff, not the step loop)."""
        slots = to_device(self.req_to_token_host_slots(req, 0, req.kv_len), self.device)
        target = self.kv_pool.read(slots).cpu()
        draft = self.dspark.draft_pool.read(slots).cpu() if self.dspark is not None else None
        return target, draft

    def import_kv(
        self, req: Request, target_kv: torch.Tensor, draft_kv: torch.Tensor | None, start: int, last_token: int
    ) -> None:
        """Write handed-off KV for positions [start, req.kv_len) into the request's slots and
        make its last token the next input."""
        slots = to_device(self.req_to_token_host_slots(req, start, req.kv_len), self.device)
        self.kv_pool.write(slots, target_kv[:, :, start:].to(self.device, non_blocking=True))
        if self.dspark is not None:
            if draft_kv is None:
                raise ValueError("handoff: this engine runs DSpark but the handoff carries no draft KV")
            self.dspark.draft_pool.write(slots, draft_kv[:, :, start:].to(self.device, non_blocking=True))
        row = to_device(np.array([req.row], dtype=np.int64), self.device)
        self.last_token[row] = to_device(np.array([last_token], dtype=np.int64), self.device)
        self.kv_len[row] = to_device(np.array([req.kv_len], dtype=np.int32), self.device)

    def req_to_token_host_slots(self, req: Request, start: int, end: int) -> np.ndarray:
        return self.req_to_token_host[req.row, start:end].astype(np.int64)

    # -- steps ----------------------------------------------------------------------------

    def shared_rows(self, rows: np.ndarray, visible: np.ndarray) -> SharedRows | None:
        """The keys a forward's requests (table `rows`, each seeing at least `visible` keys
        before its own rows) read through the same slots, when the backend attends them once
        (docs/design.md §4.9); None otherwise."""
        if not self.options.cascade_attention or self.backend.name != "triton":
            return None
        shared = find_shared_prefix(self.req_to_token_host, rows, visible, self.page_size)
        self.shared_prefix_steps += shared is not None
        return shared

    @torch.inference_mode()
    def launch(self, step: ScheduledStep) -> PendingStep:
        """A pure decode step takes the decode path (graph replay on GPU); a step with chunks,
        prefill or mixed, is one ragged forward (engine/runner/extend_step.py)."""
        if step.chunks:
            return PendingStep(launch_extend(self, step), self.copy_stream)
        return self._decode(step)

    def drafts_for(self, reqs: list[Request], graphable: bool = False) -> bool:
        """Whether DSpark drafts for these decode rows. A grammar row commits one token per
        verify (docs/design.md §2.8): a batch of nothing else takes the one-token step, which
        keeps the draft KV just as a step over the cap does; unless only the drafted step has
        a graph for it (`graphable`: the batch may replay), since a replayed verify costs
        less than an eager decode step."""
        if self.dspark is None or not self.dspark.setup.drafts_at(len(reqs)):
            return False
        if not all(r.grammar is not None for r in reqs):
            return True
        return graphable and _replays(self.graphs, reqs) and not _replays(self.graphs_without_draft, reqs)

    def _decode(self, step: ScheduledStep) -> PendingStep:
        reqs = step.decode
        rows = np.array([r.row for r in reqs], dtype=np.int64)
        starts = np.array(step.kv_before, dtype=np.int32)  # plain decode: exact positions
        # The captured body samples plain greedy (grammar masks included): no penalties,
        # logprobs or logit bias.
        graphable = all(
            r.params.greedy
            and not r.params.uses_penalties
            and r.params.logprobs is None
            and r.params.logit_bias is None
            for r in reqs
        )
        drafting = self.drafts_for(reqs, graphable)
        graphs = self.graphs if drafting or self.dspark is None else self.graphs_without_draft
        grammar = HostGrammarRows.fill(reqs, self.vocab_size)
        replay = graphs if graphs is not None and graphable and graphs.bucket_for(len(reqs)) is not None else None
        shared = None  # a replayed bucket without the shared pass has no use for it
        if replay is None or replay.replays_shared(len(reqs)):
            shared = self.shared_rows(rows, np.array([r.kv_len for r in reqs]))  # kv_len: a lower bound
        if replay is not None:
            return PendingStep(replay.replay(rows, starts, grammar, shared), self.copy_stream)
        rows_d = to_device(rows, self.device)
        starts_d = to_device(starts, self.device)
        grammar_d = None if grammar is None else grammar.to_device(self.device)
        shared_d = None if shared is None else shared.to_device(self.device, shared.length)
        max_len = int(starts.max())
        if self.dspark is None:
            outputs = self._plain_decode(rows_d, starts_d, max_len + 1, reqs, grammar_d, shared_d)
        elif drafting:
            outputs = self.dspark.step(
                rows_d, max_len, reqs, self.req_to_token, self.last_token, self.kv_len, grammar_d, shared_d
            )
        else:  # DSpark's host knows only a bound on each row's length: the device has it
            outputs = self._plain_decode(rows_d, self.kv_len[rows_d], max_len + 1, reqs, grammar_d, shared_d)
        return PendingStep(outputs, self.copy_stream)

    def _plain_decode(
        self,
        rows_d: torch.Tensor,
        starts_d: torch.Tensor,
        max_seq_len: int,
        reqs: list[Request],
        grammar: GrammarRows | None,
        shared: SharedPrefix | None,
    ) -> DeviceStepOutput:
        """One token per row at position starts_d[b] [B] int32, under `grammar`'s masks where
        given. `reqs` empty: greedy without penalties or logprobs (the captured variant).
        With DSpark (a batch over its cap) the drafter's layers are captured and the token's
        KV injected into the draft pool, and the token is sampled exactly as plain decoding
        samples it."""
        inputs = uniform_window(self.req_to_token, rows_d, starts_d, 1, max_seq_len, causal=True, shared=shared)
        ctx = ForwardContext(inputs.meta, self.kv_pool, self.backend, capture_layers=self.capture_layers)
        hidden = self.model(self.last_token[rows_d], inputs.positions, ctx)  # [B, H]
        aux = ctx.aux_hidden()
        return commit_one_token(self, hidden, aux, rows_d, inputs.positions, inputs.meta.out_slots, reqs, grammar)

    # -- CUDA graphs ----------------------------------------------------------------------

    def capture_graphs(self, max_batch: int, max_context: int, padding_row: int, max_tokens: int) -> None:
        """Capture the decode step (plain or DSpark) per batch-size bucket, and the target's
        forward in pieces per token-count bucket up to `max_tokens` (GPU only)."""
        if self.device.type != "cuda":
            return
        if self.options.piecewise_extend_graphs:
            with torch.inference_mode():
                self.piecewise = PiecewiseForward(self.model, self.capture_layers, max_tokens, self.device)
        vocab = self.vocab_size
        # Larger buckets capture the shared pass of docs/design.md §4.9, sized for any context.
        cascade = self.options.cascade_attention and self.backend.name == "triton"
        shared_bound = max_context if cascade else None
        if self.dspark is None:

            def body(rows_d: torch.Tensor, starts_d: torch.Tensor, grammar: GrammarRows, shared: Shared) -> Output:
                return self._plain_decode(rows_d, starts_d, max_context, [], grammar, shared)

            with torch.inference_mode():
                self.graphs = GraphedStep(body, max_batch, padding_row, vocab, self.device, shared_bound=shared_bound)
            return

        dspark = self.dspark
        max_len = longest_kv_within(max_context, dspark.setup.window)

        def drafted(rows_d: torch.Tensor, starts_d: torch.Tensor, grammar: GrammarRows, shared: Shared) -> Output:
            return dspark.step(rows_d, max_len, [], self.req_to_token, self.last_token, self.kv_len, grammar, shared)

        def undrafted(rows_d: torch.Tensor, starts_d: torch.Tensor, grammar: GrammarRows, shared: Shared) -> Output:
            return self._plain_decode(rows_d, self.kv_len[rows_d], max_context, [], grammar, shared)

        limit = dspark.setup.max_batch_size
        with torch.inference_mode():
            self.graphs = GraphedStep(
                drafted, min(max_batch, limit or max_batch), padding_row, vocab, self.device, shared_bound=shared_bound
            )
            if limit is not None and limit < max_batch:
                above = tuple(b for b in DEFAULT_BUCKETS if b > limit)  # the smaller ones never replay
                self.graphs_without_draft = GraphedStep(
                    undrafted, max_batch, padding_row, vocab, self.device, above, shared_bound=shared_bound
                )


def _replays(graphs: GraphedStep | None, reqs: list[Request]) -> bool:
    """A captured family has a bucket for this batch."""
    return graphs is not None and graphs.bucket_for(len(reqs)) is not None
