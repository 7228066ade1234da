/* The signatures of this folder's exported kernels, as function-pointer types for the C code
   that reaches them by address: decoder.c, through the pointers cpu_decoder_stack.py hands it,
   and tests/cpu_kernels/arm64_driver.c, through dlsym. Each library defines its kernels itself
   (one per dtype or weight format, the suffix in the exported name); a change to one of these
   signatures is a change to every definition named beside it and to its ctypes binding.

   Strides and sizes are in elements of the pointed-to dtype unless a comment says bytes;
   `threads` is the number of OpenMP threads the kernel spreads its work over. */

#ifndef KERNEL_SIGNATURES_H
#define KERNEL_SIGNATURES_H

#include <stdint.h>

/* The linear layers' contract (gemm.c's AMX kernels, gemv.c's vector kernels, and any weight
   format that keeps it, a quantized one included): out [m, n] (row stride ldo) = x [m, k] (row
   stride ldx) @ W^T (+ bias [n], or NULL), x, bias and out in the forward's activation dtype
   (fp32 or bf16); `packed` is the weight in whatever layout the kernel packed it into, read
   only; the kernel returns 0, or -1 when it could not allocate scratch (quant_gemm.c: -2 when
   k is not a multiple of its 32-weight blocks). The SwiGLU form takes n = inter and a
   [gate | up] weight of 2 inter rows, and writes silu(gate) * up [m, inter].
   gemm.c: linear_bf16, linear_swiglu_bf16; gemv.c: gemv_linear_<dtype>, gemv_swiglu_<dtype>;
   quant_gemm.c: linear_<format>, swiglu_<format> (fp32 activations). */
typedef int (*linear_fn)(const void *x, int64_t ldx, const void *packed, const void *bias, void *out, int64_t ldo,
                         int64_t m, int64_t n, int64_t k, int threads);

/* weight [n, k] (row stride ldw) -> `packed`, the layout the same library's linear_fn reads.
   gemv.c: gemv_pack_<dtype>; gemm.c: pack_weight_bf16 (packed_size_bf16(n, k) elements). */
typedef void (*pack_fn)(const void *weight, int64_t ldw, void *packed, int64_t n, int64_t k, int threads);

/* The embedding lookup of a quantized table: out [count, k] fp32 (row stride ldo) = rows
   ids [count] of the table [n, k] dequantised. 0, or -2 when k is not a multiple of 32.
   quant_gemm.c: dequant_rows_<format>. */
typedef int (*rows_fn)(const void *qweight, const int64_t *ids, int64_t count, float *out, int64_t ldo, int64_t k,
                       int threads);

/* RMSNorm of x [rows, n] (row stride x_stride) into out [rows, n] (contiguous), scaled by
   weight [n]. With residual [rows, n] (row stride residual_stride) not NULL, x is first
   replaced by x + residual, which is also written to residual_out [rows, n] (contiguous; it
   may be `residual` itself when that is contiguous). elementwise.c: rms_norm_<dtype>. */
typedef void (*rms_norm_fn)(const void *x, int64_t x_stride, const void *residual, int64_t residual_stride,
                            const void *weight, void *out, void *residual_out, int64_t rows, int64_t n, float eps,
                            int threads);

/* x [rows, 2 inter] (row stride x_stride) laid [gate | up] -> out [rows, inter] (contiguous) =
   silu(gate) * up. elementwise.c: silu_and_mul_<dtype>. */
typedef void (*silu_and_mul_fn)(const void *x, int64_t x_stride, void *out, int64_t rows, int64_t inter, int threads);

/* x [tokens, heads, head_dim] (token and head strides given) -> out [tokens, heads, head_dim]
   (contiguous): the first rope_dim dims of each head rotated by the tables cos = [c | c],
   sin = [-s | s] ([tokens, rope_dim]), the other dims copied. elementwise.c: rope_<dtype>. */
typedef void (*rope_fn)(const void *x, int64_t x_stride_t, int64_t x_stride_h, const void *cos, const void *sin,
                        void *out, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rope_dim, int threads);

/* Token t's row of row_elems elements of k and v (token strides k_stride_t, v_stride_t) into
   row out_slots[t] of k_cache and v_cache ([slots, row_elems] contiguous); slot -1 skips the
   token. elem_bytes: 4 (fp32) or 2 (bf16). attention.c: store_kv. */
typedef void (*store_kv_fn)(const void *k, int64_t k_stride_t, const void *v, int64_t v_stride_t, void *k_cache,
                            void *v_cache, const int64_t *out_slots, int64_t tokens, int64_t row_elems,
                            int64_t elem_bytes);

/* Paged attention of q [T, Hq, D] over the caches [slots, Hkv, D] through req_to_token; the
   layouts, the per-request metadata and the causal rule are in attention.c's opening comment.
   workspace: num_threads slices of workspace_per_thread floats (workspace_floats_fn).
   attention.c: paged_attention_<dtype>. */
typedef void (*attention_fn)(const void *q, int64_t q_stride_t, int64_t q_stride_h, const void *k_cache,
                             const void *v_cache, int64_t kv_stride_s, int64_t kv_stride_h,
                             const int32_t *req_to_token, int64_t table_stride, const int64_t *req_rows,
                             const int32_t *seq_lens, const int32_t *extend_lens, const int32_t *q_start,
                             int64_t batch, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                             int64_t max_extend, int64_t kv_len, int causal, float scale, void *out,
                             int64_t out_stride_t, int64_t out_stride_h, float *workspace,
                             int64_t workspace_per_thread, int num_threads);

/* Floats of attention workspace one thread needs for keys up to max_seq_len and `group` query
   heads per kv head. attention.c: workspace_floats. */
typedef int64_t (*workspace_floats_fn)(int64_t max_seq_len, int64_t group, int64_t head_dim);

#endif
