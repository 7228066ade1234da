"""Device-to-device KV hand-off between two processes on one GPU (docs/design.md §5.7): a
prefill engine in a child process holds each request's slots and sends `CudaIpcTransfer`
tickets; this process maps the child's pools, copies the slots out, reports the copies, and
decodes. Greedy tokens equal a colocated engine's, DSpark's draft KV travels with the target
KV, and the producer ends with no slot held."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
    pytest.mark.timeout(600),
]

PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPTS = [[1 + (7 * i + 3 * j) % 500 for j in range(40 + 53 * i)] for i in range(5)]


@dataclass(frozen=True)
class QueueReleaseSink:
    queue: Any  # a multiprocessing.Manager queue proxy (picklable)

    def release(self, request_id: str) -> None:
        self.queue.put(request_id)


def producer_main(model_dir: str, drafter_dir: str | None, tickets: Any, releases: Any, report: Any) -> None:
    """Child process: prefill every prompt, hold the slots, send the tickets, then free each
    hold as its release arrives; report the slots still used at the end."""
    from services.workers.device_transfer import CudaIpcTransfer
    from tests.engine.gpu_models import gpu_engine_from

    engine = gpu_engine_from(Path(model_dir), None if drafter_dir is None else Path(drafter_dir), dtype=torch.float32)
    transfer = CudaIpcTransfer(hold_s=120.0)
    transfer.bind(engine.kv_pools(), QueueReleaseSink(releases))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, PARAMS, prefill_only=True)
    handed = 0
    while handed < len(PROMPTS):
        for out in engine.step():
            if out.finish_reason == "handoff":
                held = engine.hold_kv(out.request_id, transfer.hold_s)
                tickets.put((list(out.token_ids), transfer.send_held(out.request_id, held, 0)))
                handed += 1
    while engine.num_held:
        engine.release_held(releases.get(timeout=120))
    torch.cuda.synchronize()
    report.put(engine.kv.usage().used_slots)


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "dspark"])
def test_device_handoff_between_two_processes_equals_colocated(tmp_path: Path, speculative: bool) -> None:
    from services.workers.device_transfer import CudaIpcTransfer
    from tests.engine.engine_driver import run
    from tests.engine.gpu_models import gpu_engine_from, gpu_model_dirs

    model_dir, drafter_dir = gpu_model_dirs(tmp_path, speculative)
    colocated = gpu_engine_from(model_dir, drafter_dir, dtype=torch.float32)
    expected = [r.token_ids for r in run(colocated, PROMPTS, PARAMS)]
    del colocated

    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        tickets, releases, report = manager.Queue(), manager.Queue(), manager.Queue()
        drafter = None if drafter_dir is None else str(drafter_dir)
        child = ctx.Process(target=producer_main, args=(str(model_dir), drafter, tickets, releases, report))
        child.start()
        try:
            decode = gpu_engine_from(model_dir, drafter_dir, dtype=torch.float32)
            receiver = CudaIpcTransfer()
            first_tokens = {}
            for _ in PROMPTS:
                first, ticket = tickets.get(timeout=300)
                handoff = receiver.copy_out(ticket)
                assert handoff.target_kv.is_cuda and (handoff.draft_kv is not None) == speculative
                first_tokens[ticket.request_id] = first
                decode.add_decode_request(ticket.request_id, handoff)
            finished = {}
            while decode.has_unfinished_requests():
                for out in decode.step():
                    if out.finished:
                        finished[out.request_id] = list(out.token_ids)
            assert report.get(timeout=120) == 0  # every hold released by the copies' reports
        finally:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()
    assert child.exitcode == 0
    got = [finished[f"r{i}"] for i in range(len(PROMPTS))]
    assert [first_tokens[f"r{i}"][0] for i in range(len(PROMPTS))] == [e[0] for e in expected]
    assert got == expected
