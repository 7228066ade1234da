"""Fused elementwise ops of the decoder layers: RMSNorm (alone or with the residual add
before it), rotary embedding of q and k, and SwiGLU's silu-and-mul.

Each op has a torch reference (`*_torch`, what Hugging Face computes), a Triton kernel
(`*_triton`, one launch; graph-capturable) checked against it in tests/kernels, a C kernel
for CPU rows (engine/kernels/cpu/, compiled at first use; tests/cpu_kernels), and a
dispatcher (the plain name) that runs the Triton kernel on CUDA/ROCm tensors when triton is
installed, the C kernel on CPU when it is built, and the reference otherwise, or whenever
autograd has to record the op (engine.kernels.dispatch.use_triton). Triton is imported only
if installed, so CPU installs need none.

On a GPU a Llama decoder layer then launches 4 elementwise kernels (add+norm, RoPE,
add+norm, silu-and-mul) around its 4 GEMMs and its attention, where the torch ops launched
39 (bf16 decode; tests/kernels/test_fused_paths.py counts them).
"""

from engine.kernels.activation import silu_and_mul
from engine.kernels.norm import add_rms_norm, rms_norm
from engine.kernels.rope import rotary_embedding

__all__ = ["add_rms_norm", "rms_norm", "rotary_embedding", "silu_and_mul"]
