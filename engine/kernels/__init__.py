"""Every kernel of the engine, grouped by backend, each beside its torch reference.

- `<op>.py` (this package): the torch reference of an op (`*_torch`, what Hugging Face
  computes) and, for the ops the models call, its dispatcher (the plain name): the Triton
  kernel on CUDA/ROCm tensors when triton is installed, the C kernel on CPU when it is built,
  the reference otherwise, or whenever autograd has to record the op (dispatch.use_triton).
  Ops: norm (RMSNorm, alone or after the residual add), rope (rotary embedding of q and k),
  activation (SwiGLU's silu-and-mul), store_kv (new K/V into the paged cache), kv_inject
  (DSpark's draft-KV injection) and attention (paged attention).
- `attention_metadata.py`: AttentionMetadata, what one forward tells every attention kernel.
- `triton/`: every Triton kernel with its launcher (triton/launch.py: what they share;
  triton/online_softmax.py: the attention tile both attention kernels run), checked against
  the references in tests/kernels/triton and tests/attention. Triton is imported only if
  installed, so CPU installs need none; the attention kernels are imported only when the
  Triton attention backend is chosen.
- `cpu/`: the C kernels of CPU rows and their ctypes bindings (compiled at first use;
  tests/cpu_kernels).

Nothing here imports an engine module outside engine.kernels: the backends (engine.attention)
and the models call in, never the other way round.

On a GPU a Llama decoder layer then launches 4 elementwise kernels (add+norm, RoPE,
add+norm, silu-and-mul) around its 4 GEMMs and its attention, where the torch ops launched
39 (bf16 decode; tests/kernels/test_fused_paths.py counts them).
"""

from engine.kernels.activation import silu_and_mul
from engine.kernels.norm import add_rms_norm, rms_norm
from engine.kernels.rope import rotary_embedding

__all__ = ["add_rms_norm", "rms_norm", "rotary_embedding", "silu_and_mul"]
