"""The systems that benchmarks/cpu_vs_llamacpp.py times, each a callable from prompt ids to
(Timing, generated ids per prompt), and the machine's memory-copy bandwidth it compares them to.

- `EngineBatch1`: our EngineCore, one prompt at a time, greedy with ignore_eos.
- `LlamaCppPeer`: llama.cpp in its own process from its own virtualenv
  (benchmarks/llamacpp_runner.py), one JSON line per call each way.
- `ensure_f32_gguf`: llama.cpp's f32 conversion of the GGUF, made once and kept.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import IO, Any

import torch

from benchmarks.cpu_peer_report import Timing
from engine.core import EngineCore
from engine.models.context import CausalLM
from engine.runner.cpu_decoder_stack import CpuStackedLM
from engine.sampling_params import SamplingParams

RUNNER = Path(__file__).with_name("llamacpp_runner.py")
Generated = list[list[int]]


def copy_read_gbs(mib: int, repeats: int = 5) -> float:
    """GB/s (1e9) read by a plain copy of a `mib` MiB fp32 buffer into another (torch's
    multi-threaded copy_, best of `repeats`): the bytes of the source over the time. The copy
    also writes as many bytes, so the bus carries at least twice this."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # both buffers faulted in before timing
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return src.nbytes / best / 1e9


def plain_read_gbs(mib: int, repeats: int = 5) -> float:
    """GB/s (1e9) of a plain multi-threaded read of a `mib` MiB fp32 buffer (a max-reduction,
    which reads every byte once and writes nothing), best of `repeats`: the rate a weight
    stream can approach. A copy's source rate is well below it, since the copy also writes
    (and, without streaming stores, reads its destination first)."""
    src = torch.ones(mib * 2**20 // 4)
    src.amax()  # faulted in before timing
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        src.amax()
        best = min(best, time.perf_counter() - start)
    return src.nbytes / best / 1e9


def model_weight_bytes(model: CausalLM | torch.nn.Module) -> int:
    """Bytes of the parameters and persistent buffers of a runner's model (the module itself
    where the one-call decoder stack wraps it), each tensor's elements once (a tied LM head
    counts once). By elements, not storages: packed weights are views of shared chunks
    (engine/kernels/cpu/weight_memory.py)."""
    module = model.model if isinstance(model, CpuStackedLM) else model
    assert isinstance(module, torch.nn.Module), "every model family is an nn.Module"
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in module.state_dict(keep_vars=True).values():
        nbytes = tensor.numel() * tensor.element_size()
        key = (id(tensor) if tensor.is_mkldnn else tensor.data_ptr(), nbytes)
        if key in seen:
            continue
        seen.add(key)
        total += nbytes
    return total


def gguf_tensor_stats(path: Path) -> tuple[int, int]:
    """(bytes, elements) of every tensor in a GGUF file. The embedded model ties its LM head to
    token_embd, so at batch 1 each token streams every tensor's bytes once (one embedding row
    aside)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    return sum(int(t.n_bytes) for t in reader.tensors), sum(int(t.n_elements) for t in reader.tensors)


class EngineBatch1:
    """Greedy decoding of one prompt after the other on `engine`; EOS does not stop a request
    (ignore_eos), so every prompt generates `new_tokens` tokens, as llama.cpp's runner does."""

    def __init__(self, engine: EngineCore, new_tokens: int) -> None:
        self.engine = engine
        self.params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        self.calls = 0

    def __call__(self, prompts: list[list[int]]) -> tuple[Timing, Generated]:
        timing, generated = Timing(), []
        for prompt in prompts:
            self.calls += 1
            tokens: list[int] = []
            start = time.perf_counter()
            first = start
            self.engine.add_request(f"b1-{self.calls}", prompt, self.params)
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.new_token_ids and not tokens:
                        first = time.perf_counter()
                    tokens.extend(out.new_token_ids)
            end = time.perf_counter()
            timing += Timing(len(tokens), end - start, len(tokens) - 1, end - first)
            generated.append(tokens)
        return timing, generated


def llamacpp_version(python: Path) -> str | None:
    """llama_cpp's version in the virtualenv of `python`; None where it is not installed there."""
    try:
        done = subprocess.run(
            [str(python), "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True, text=True
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_f32_gguf(python: Path, source: Path, target: Path, threads: int) -> str:
    """llama.cpp's own f32 conversion of `source` at `target` (kept: made only when missing);
    returns how it was made."""
    how = f"llama_model_quantize(LLAMA_FTYPE_ALL_F32, allow_requantize) of {source.name}"
    if target.exists():
        return how + " (kept from an earlier run)"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    subprocess.run(
        [str(python), str(RUNNER), "to-f32", str(source), str(partial), "--threads", str(threads)], check=True
    )
    partial.rename(target)
    return how


class LlamaCppPeer:
    """llama.cpp's runner process on one GGUF, loaded once and fed a list of prompts per call."""

    def __init__(self, python: Path, model: Path, threads: int, no_repack: bool = False) -> None:
        self.model = model
        self.process = subprocess.Popen(
            [str(python), str(RUNNER), "decode", str(model), "--threads", str(threads)]
            + (["--no-repack"] if no_repack else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.load_seconds = float(self._reply()["load_seconds"])
        self.new_tokens = 0

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None  # PIPE above
        return self.process.stdin, self.process.stdout

    def _reply(self) -> dict[str, Any]:
        line = self._pipes()[1].readline()
        if not line:
            raise RuntimeError(f"llama.cpp runner on {self.model} exited ({self.process.wait()}); see its stderr")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def decode(self, prompts: list[list[int]], new_tokens: int) -> tuple[Timing, Generated]:
        stdin, _ = self._pipes()
        stdin.write(json.dumps({"prompts": prompts, "new_tokens": new_tokens}) + "\n")
        stdin.flush()
        timing, generated = Timing(), []
        for run in self._reply()["runs"]:
            n = len(run["tokens"])
            timing += Timing(n, float(run["seconds"]), n - 1, float(run["decode_seconds"]))
            generated.append([int(t) for t in run["tokens"]])
        return timing, generated

    def close(self) -> None:
        stdin, _ = self._pipes()
        stdin.close()  # the runner's loop ends at EOF
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
