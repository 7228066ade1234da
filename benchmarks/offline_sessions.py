"""`dspark-serve bench`'s workload through the offline engine, in-process: the same sessions
(same workload, seed and settings), the same closed loop (one session per client, think time
between turns, a request budget per level), timed the way the HTTP client times a server,
and written in `bench`'s JSON, so that `python -m services.bench.compare` sets a service run
against it: what the gateway, Ray and streaming add to TTFT and TPOT. The engine here runs
plain decoding: serve with `--speculative off` to compare like with like.

    python benchmarks/offline_sessions.py --model PATH [--device cuda] [--concurrency 32,128]
        [--num-requests 256] [--warmup-requests 8] [--temperature 1.0] [--max-num-seqs 256]
        [--max-model-len 8192] [--max-num-batched-tokens 2048] [--kv-cache-memory-bytes N]
        [--output-dir DIR] [bench's workload options: --workload agentic --seed 0 --turns 3,8 ...]

Per request: the prompt is the conversation rendered by the model's chat template, as the
gateway renders it; TTFT runs from the moment the client is ready to send (its think time
over) to the first step output with text (the first content chunk a client would see). A
request that comes due while a step runs is added when the step ends, as a server adds it
after the step in flight, and that wait counts, as it does for a client of the server. ITL
between outputs with text; output tokens are the engine's count. Sessions record the decoded
reply, so later turns carry it. An untimed warm-up of the same workload (another seed) runs
first, as stack_overhead.sh runs one against the service.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig  # noqa: E402
from engine.core import EngineCore  # noqa: E402
from engine.outputs import RequestOutput  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from services.bench import add_workload_arguments, workload_config_from_args  # noqa: E402
from services.bench.client import RequestResult  # noqa: E402
from services.bench.report import LevelSummary, markdown_table, summarize, write_json  # noqa: E402
from services.bench.workloads import Session, Workload, make_workload  # noqa: E402


@dataclass
class _Client:
    """One closed-loop client: its session, when it may send next, and its request in flight."""

    session: Session | None = None
    ready_s: float = 0.0
    request_id: str | None = None
    result: RequestResult | None = None
    last_text_s: float | None = None
    done: bool = False


@dataclass
class ClosedLoop:
    """One concurrency level: `run(concurrency)` clients replay sessions, each its next turn
    after the previous reply and a think time, until `budget` requests were sent and answered."""

    engine: EngineCore
    workload: Workload
    budget: int
    temperature: float
    results: list[RequestResult] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def send(self, client: _Client, ready_s: float) -> None:
        """Start the client's next request, opening a new session when its last one ended;
        marks the client done once the level's budget is spent."""
        while True:
            if client.session is None:
                client.session = self.workload.new_session()
            request = client.session.next_request()
            if request is not None:
                break
            client.session = None
        if self.budget <= 0:
            client.done = True
            return
        self.budget -= 1
        tokenizer = self.engine.tokenizer
        text = tokenizer.apply_chat_template(request.messages, add_generation_prompt=True)
        prompt = list(tokenizer.encode(text, add_special_tokens=False))
        params = SamplingParams(max_tokens=request.max_tokens, temperature=self.temperature)
        client.request_id = f"r{next(self.ids)}"
        client.result = RequestResult(ok=False, start_s=ready_s, end_s=ready_s, prompt_tokens=len(prompt))
        client.last_text_s = None
        self.engine.add_request(client.request_id, prompt, params)

    def run(self, concurrency: int) -> float:
        clients = [_Client() for _ in range(concurrency)]
        by_id: dict[str, _Client] = {}
        start = time.perf_counter()
        while True:
            now = time.perf_counter()
            for client in clients:
                if not client.done and client.request_id is None and client.ready_s <= now:
                    self.send(client, max(client.ready_s, start))
                    if client.request_id is not None:
                        by_id[client.request_id] = client
            if self.engine.has_unfinished_requests():
                outputs = self.engine.step()
                now = time.perf_counter()
                for out in outputs:
                    self._observe(by_id, out, now)
                continue
            waiting = [c.ready_s for c in clients if not c.done and c.request_id is None]
            if not waiting:
                return time.perf_counter() - start
            time.sleep(max(0.0, min(waiting) - time.perf_counter()))

    def _observe(self, by_id: dict[str, _Client], out: RequestOutput, now: float) -> None:
        client = by_id.get(out.request_id)
        if client is None or client.result is None:
            return
        result = client.result
        if out.new_text:
            result.text += out.new_text
            if result.ttft_s is None:
                result.ttft_s = now - result.start_s
            elif client.last_text_s is not None:
                result.itl_s.append(now - client.last_text_s)
            client.last_text_s = now
        if not out.finished:
            return
        result.end_s = now
        result.output_tokens = len(out.token_ids)
        result.error = out.error
        result.ok = out.error is None
        self.results.append(result)
        del by_id[out.request_id]
        client.request_id = None
        assert client.session is not None
        if result.ok:
            client.session.record(result.text)
            client.ready_s = now + client.session.think_time_s
        else:
            client.session = None  # the conversation cannot continue without its answer


def _levels(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="what `dspark-serve up --model` takes")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--concurrency", type=_levels, default=(1, 8))
    parser.add_argument("--num-requests", type=int, default=64, help="requests per concurrency level")
    parser.add_argument("--warmup-requests", type=int, default=8, help="untimed, at concurrency 4, seed + 1")
    add_workload_arguments(parser)
    parser.add_argument("--temperature", type=float, default=1.0, help="pass bench the same (default: the API's 1.0)")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=0, help="0: the engine's default sizing")
    parser.add_argument("--output-dir", type=Path, default=Path("offline-results"))
    args = parser.parse_args()
    workload_cfg = workload_config_from_args(args)
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
    )
    engine = EngineCore(config)
    if args.warmup_requests:  # kernels compiled or tuned per shape are ready before the clock starts
        warmup = make_workload(args.workload, workload_cfg, args.seed + 1)
        ClosedLoop(engine, warmup, args.warmup_requests, args.temperature).run(4)
    summaries: list[LevelSummary] = []
    workload = make_workload(args.workload, workload_cfg, args.seed)  # one for every level, as in `bench`
    for concurrency in args.concurrency:
        level = ClosedLoop(engine, workload, args.num_requests, args.temperature)
        elapsed = level.run(concurrency)
        summaries.append(summarize(concurrency, level.results, elapsed))
    print(markdown_table(summaries))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "label": "offline engine",
        "model": args.model,
        "workload": args.workload,
        "started_unix": time.time(),
        "machine": platform.platform(),
        "workload_config": vars(args) | {"output_dir": str(args.output_dir)},
        "command": " ".join(sys.argv),
    }
    write_json(args.output_dir / f"bench_{args.workload}.json", meta, summaries)


if __name__ == "__main__":
    main()
