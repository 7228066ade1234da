#!/usr/bin/env bash
# One device call on the H200: GPU tests (kernels against their torch references, the sync
# guard in CUDA's "error" mode), then the engine benchmarks. Usage (repo root, on the GPU):
#   bash benchmarks/h200_engine.sh [SECTIONS]        # results under $OUT (default ./gpu-out)
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels \
  2>&1 | tee "$OUT/kernel_tests.log" | tail -5  # every fused kernel compiled against its torch reference
timeout 360 python3 -m pytest -q -m gpu -p no:cacheprovider tests/attention tests/speculative tests/sampling tests/engine tests/kv tests/test_sync_guard.py \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -25
timeout 330 python3 benchmarks/engine_gpu.py --out "$OUT" --sections "${1:-ceilings,decode,prefill,hf}" \
  2>&1 | tee "$OUT/engine_bench.log" | grep -E "^(==|copy)|Error|error" | cut -c1-1500
