"""Four host costs of serving, each against what it replaced, side by side:

    python benchmarks/host_costs.py [--model smollm2-135m] [--tokens 4000] [--rounds 5]

1. Detokenizing: an IncrementalDetokenizer (engine/detokenizer.py) fed `tokens` random ids
   one at a time, decoding through the engine's `Tokenizer.decode` (the Rust tokenizer's own
   decode where that gives the same text) and through the Hugging Face wrapper's `decode`;
   microseconds per token. Both must produce the same text.
2. The common prefix of two histories held as lists (engine/kv/token_prefix.py, what the
   scheduler compares for every queued request each step): 3,000 and 2,976 ids sharing
   2,048, by list slices and by converting both to arrays; microseconds per call.
3. One streaming output of a request `tokens` tokens into its generation, built, pickled and
   unpickled (the worker's outbox to the gateway over Ray): a one-token delta as outputs are
   now, and the same delta carrying the request's whole token list as every output did.
4. Tokenising the rendered prompts of `dspark-serve bench --workload agentic` (32 sessions of
   3-8 turns over one shared system prompt, in the order their turns arrive): the tokenizer's
   segment cache (engine/loader/segment_cache.py), empty at the start of each round, against
   the Hugging Face tokenizer on each whole text, as before; microseconds per prompt. Both must give the same ids.

Best of `rounds` rounds, the variants interleaved in each round.
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.detokenizer import IncrementalDetokenizer, TokenDecoder  # noqa: E402
from engine.kv.token_prefix import common_prefix_len  # noqa: E402
from engine.loader.resolve import resolve_model  # noqa: E402
from engine.loader.tokenizer import Tokenizer  # noqa: E402
from engine.outputs import RequestOutput, RequestTimings  # noqa: E402
from services.bench.workloads import AgenticWorkload, WorkloadConfig  # noqa: E402


class WrapperDecode:
    """Decoding through the Hugging Face wrapper, as `Tokenizer.decode` did before."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.hf_tokenizer = tokenizer.hf_tokenizer

    def decode(self, token_ids: list[int], /, *, skip_special_tokens: bool) -> str:
        return str(self.hf_tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))


def prefix_by_arrays(a: Sequence[int], b: Sequence[int]) -> int:
    """The common prefix as computed before: both sequences converted to arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(differ[0]) if differ.size else n


def detokenize(decoder: TokenDecoder, ids: list[int]) -> str:
    detok = IncrementalDetokenizer(decoder, ids[:3])
    return "".join(detok.push([token]) for token in ids[3:]) + detok.flush()


def output_round_trip(generated: list[int], whole_list: bool) -> Callable[[], object]:
    """Build, pickle and unpickle one step's output of a request that has `generated` tokens."""

    def once() -> object:
        out = RequestOutput(
            request_id="chatcmpl-0123456789abcdef",
            new_token_ids=(generated[-1],),
            new_text=" word",
            token_ids=tuple(generated) if whole_list else (),
            timings=RequestTimings(1.0, 2.0, 3.0, None),
        )
        return pickle.loads(pickle.dumps(out, protocol=5))

    return once


def agentic_prompts(tokenizer: Tokenizer, sessions: int) -> list[str]:
    """The rendered prompts of `sessions` agentic sessions, turn by turn across the sessions;
    each reply is a tool call of the kind the workload asks for."""
    workload = AgenticWorkload(WorkloadConfig(), seed=0)
    live = [workload.new_session() for _ in range(sessions)]
    texts = []
    while live:
        still = []
        for session in live:
            request = session.next_request()
            if request is None:
                continue
            texts.append(tokenizer.apply_chat_template(request.messages))
            session.record(f'{{"tool": "search", "arguments": {{"query": "step {len(texts)}"}}}}')
            still.append(session)
        live = still
    return texts


def best_us(variants: dict[str, Callable[[], object]], rounds: int, per: int) -> dict[str, float]:
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], 1e6 * (time.perf_counter() - start) / per)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    tokenizer = Tokenizer.from_source(resolve_model(args.model))
    rng = random.Random(0)
    ids = [rng.randrange(1000, tokenizer.vocab_size - 1000) for _ in range(args.tokens + 3)]
    wrapper = WrapperDecode(tokenizer)
    if detokenize(tokenizer, ids) != detokenize(wrapper, ids):
        raise SystemExit("the two decode paths gave different text")
    detok = best_us(
        {
            "engine Tokenizer.decode": lambda: detokenize(tokenizer, ids),
            "Hugging Face wrapper": lambda: detokenize(wrapper, ids),
        },
        args.rounds,
        args.tokens,
    )

    a = list(range(3000))
    b = list(range(2048)) + [7] * 928
    calls = 500

    def repeat(fn: Callable[[Sequence[int], Sequence[int]], int]) -> Callable[[], object]:
        return lambda: [fn(a, b) for _ in range(calls)]

    if common_prefix_len(a, b) != prefix_by_arrays(a, b):
        raise SystemExit("the two common-prefix paths disagree")
    prefix = best_us({"list slices": repeat(common_prefix_len), "arrays": repeat(prefix_by_arrays)}, args.rounds, calls)

    outputs = 200

    def repeat_output(whole_list: bool) -> Callable[[], object]:
        once = output_round_trip(ids[: args.tokens], whole_list)
        return lambda: [once() for _ in range(outputs)]

    output = best_us({"delta": repeat_output(False), "whole list": repeat_output(True)}, args.rounds, outputs)

    prompts = agentic_prompts(tokenizer, sessions=32)
    hf = tokenizer.hf_tokenizer

    def tokenise_whole() -> list[list[int]]:  # Tokenizer.encode before: the Hugging Face wrapper's
        return [list(hf.encode(text, add_special_tokens=False)) for text in prompts]

    def tokenise_segments() -> Callable[[], list[list[int]]]:
        fresh = Tokenizer(tokenizer.hf_tokenizer, tokenizer.chat_template)  # an empty cache each round
        return lambda: [fresh.encode(text, add_special_tokens=False) for text in prompts]

    whole_ids = tokenise_whole()
    if tokenise_segments()() != whole_ids:
        raise SystemExit("the segment cache gave other ids than the whole texts")
    tokenising = dict.fromkeys(("segments", "whole"), float("inf"))
    for _ in range(args.rounds):
        for name, run in (("segments", tokenise_segments()), ("whole", tokenise_whole)):
            start = time.perf_counter()
            run()
            tokenising[name] = min(tokenising[name], 1e6 * (time.perf_counter() - start) / len(prompts))
    mean_tokens = sum(len(ids) for ids in whole_ids) / len(prompts)

    print(f"best of {args.rounds} rounds, interleaved")
    print("| cost | now, us | before, us | before / now |")
    print("|---|---:|---:|---:|")
    print(
        f"| detokenizing a token | {detok['engine Tokenizer.decode']:.1f} | {detok['Hugging Face wrapper']:.1f} | "
        f"{detok['Hugging Face wrapper'] / detok['engine Tokenizer.decode']:.2f}x |"
    )
    print(
        f"| common prefix of two list histories | {prefix['list slices']:.0f} | {prefix['arrays']:.0f} | "
        f"{prefix['arrays'] / prefix['list slices']:.2f}x |"
    )
    print(
        f"| a streaming output at {args.tokens} tokens, built and sent | {output['delta']:.1f} | "
        f"{output['whole list']:.1f} | {output['whole list'] / output['delta']:.2f}x |"
    )
    print(
        f"| tokenising an agentic prompt ({len(prompts)} prompts, {mean_tokens:.0f} tokens mean) | "
        f"{tokenising['segments']:.0f} | {tokenising['whole']:.0f} | "
        f"{tokenising['whole'] / tokenising['segments']:.2f}x |"
    )


if __name__ == "__main__":
    main()
