"""llama.cpp's side of benchmarks/cpu_vs_llamacpp.py, run by the Python of the llama.cpp
virtualenv (`make llamacpp-peer`), never by the project's: it imports only llama_cpp, numpy and
the standard library.

    python llamacpp_runner.py decode MODEL.gguf --threads N [--no-repack]
        stdin, one JSON object a line: {"prompts": [[ids], ...], "new_tokens": 96}
        stdout, one JSON object a line for each: {"runs": [{"tokens": [ids], "seconds": s,
            "decode_seconds": s}, ...]}; a first line {"ready": true, "load_seconds": s} once
            the model is loaded
    python llamacpp_runner.py to-f32 IN.gguf OUT.gguf --threads N

`decode` is greedy batch-1 decoding: each prompt is evaluated in one call (prefill), then the
argmax of the last logits is fed back, one token a call, `new_tokens` tokens in all; EOS does
not stop it (it is fed back like any token), so every system generates the same count.
`seconds` runs from the prompt's evaluation to the last token's argmax; `decode_seconds` from
the first token's argmax to the last's (new_tokens - 1 tokens). `--no-repack` loads the
weights without llama.cpp's extra buffer types (its runtime repacking and its AMX buffers:
llama.cpp's `--no-repack`, the model parameter `use_extra_bufts`), for hosts where loading
through them crashes.

`to-f32` is llama.cpp's own conversion (llama_model_quantize, the library call behind
llama-quantize, with LLAMA_FTYPE_ALL_F32 and requantizing allowed): every quantized tensor is
dequantised by llama.cpp and written as f32.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

import llama_cpp
import numpy as np


def greedy_decode(llm: llama_cpp.Llama, prompt: list[int], new_tokens: int) -> dict[str, object]:
    vocab = llm.n_vocab()
    tokens: list[int] = []
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    first = start
    while True:
        # the logits of the last evaluated position, [vocab] float32 owned by the context
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
        tokens.append(int(np.argmax(logits)))
        if len(tokens) == 1:
            first = time.perf_counter()
        if len(tokens) == new_tokens:
            break
        llm.eval([tokens[-1]])
    end = time.perf_counter()
    return {"tokens": tokens, "seconds": end - start, "decode_seconds": end - first}


def without_extra_buffer_types() -> None:
    """Every model loaded from here on takes `use_extra_bufts = false` (the high-level Llama
    exposes no argument for it: it starts from the library's default parameters)."""
    default_params = llama_cpp.llama_cpp.llama_model_default_params

    def params() -> llama_cpp.llama_model_params:
        chosen = default_params()
        chosen.use_extra_bufts = False
        return chosen

    llama_cpp.llama_cpp.llama_model_default_params = params


def serve_decode(model: str, threads: int) -> None:
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=model, n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    print(json.dumps({"ready": True, "load_seconds": time.perf_counter() - start}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        runs = [greedy_decode(llm, p, int(request["new_tokens"])) for p in request["prompts"]]
        print(json.dumps({"runs": runs}), flush=True)


def to_f32(source: str, target: str, threads: int) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True  # dequantise Q4_1/Q8_0 tensors rather than refusing them
    params.quantize_output_tensor = True
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))
    if status != 0:
        raise SystemExit(f"llama_model_quantize({source} -> {target}) returned {status}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("decode", "to-f32"))
    parser.add_argument("model")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--no-repack", action="store_true", help="decode: no extra buffer types (see above)")
    args = parser.parse_args()
    if args.no_repack:
        without_extra_buffer_types()
    if args.mode == "decode":
        serve_decode(args.model, args.threads)
    else:
        if args.out is None:
            parser.error("to-f32 needs OUT.gguf")
        to_f32(args.model, args.out, args.threads)


if __name__ == "__main__":
    main()
