/* The decoder layer's elementwise ops on CPU, one pass each: RMSNorm (alone or after the
   residual add), SwiGLU's silu-and-mul, and the RoPE rotation.

   Each rounds where its torch reference in engine/kernels/{norm,activation,rope}.py rounds
   (a bf16 torch op computes in fp32 and rounds its result to bf16), so in bf16 the results
   are those of the reference up to the last bit of a tie, and in fp32 up to summation order.
   Rows are the first dim; the last dim of every input is contiguous, outputs are contiguous.
   Element pointers are bf16 or fp32 as the exported name says. Work is split over rows with
   OpenMP when a call has enough of it to pay for the threads. */

#include <math.h>
#include <stdint.h>

#include "bf16.h"

/* A parallel region costs a few microseconds: below this many elements one thread is faster. */
#define PARALLEL_ELEMENTS 16384

/* Row t: out = weight * round(x32 / sqrt(mean(x32^2) + eps)), where x is first replaced by
   round(x + residual), also written to residual_out, when residual is not NULL. */
ALWAYS_INLINE void rms_norm_row(const void *x, int64_t x_stride, const void *residual, int64_t residual_stride,
                                const void *weight, void *out, void *residual_out, int64_t t, int64_t n, float eps,
                                const int is_bf16) {
    const int64_t x_row = t * x_stride, out_row = t * n;
    float sum_sq = 0.0f;
    if (residual != 0) {
        const int64_t residual_row = t * residual_stride;
        for (int64_t i = 0; i < n; i++) {
            const float v = round_elem(load_elem(x, x_row + i, is_bf16) + load_elem(residual, residual_row + i, is_bf16), is_bf16);
            store_elem(residual_out, out_row + i, v, is_bf16);
            sum_sq += v * v;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            const float v = load_elem(x, x_row + i, is_bf16);
            sum_sq += v * v;
        }
    }
    const float inv_rms = 1.0f / sqrtf(sum_sq / (float)n + eps);
    const void *source = residual != 0 ? residual_out : x;
    const int64_t source_row = residual != 0 ? out_row : x_row;
    for (int64_t i = 0; i < n; i++) {
        const float normed = round_elem(load_elem(source, source_row + i, is_bf16) * inv_rms, is_bf16);
        store_elem(out, out_row + i, load_elem(weight, i, is_bf16) * normed, is_bf16);
    }
}

/* Row t of x [rows, 2I] laid [gate | up] -> out [rows, I] = round(silu(gate)) * up */
ALWAYS_INLINE void silu_and_mul_row(const void *x, int64_t x_stride, void *out, int64_t t, int64_t inter,
                                    const int is_bf16) {
    const int64_t gate_row = t * x_stride, up_row = gate_row + inter, out_row = t * inter;
    for (int64_t i = 0; i < inter; i++) {
        const float g = load_elem(x, gate_row + i, is_bf16);
        const float silu = round_elem(g / (1.0f + exp_approx(-g)), is_bf16);
        store_elem(out, out_row + i, silu * load_elem(x, up_row + i, is_bf16), is_bf16);
    }
}

/* Token t of x [T, H, D] (token and head strides given) -> out [T, H, D]: the first rope_dim
   dims of each head rotated by the tables cos = [c | c], sin = [-s | s] ([T, rope_dim], already
   rounded to the activation dtype): out = round(round(x * cos) + round(partner * sin)), where
   partner is x with its two halves swapped; the other dims are copied. */
ALWAYS_INLINE void rope_token(const void *x, int64_t x_stride_t, int64_t x_stride_h, const void *cos,
                              const void *sin, void *out, int64_t t, int64_t heads, int64_t head_dim,
                              int64_t rope_dim, const int is_bf16) {
    const int64_t half = rope_dim / 2, table_row = t * rope_dim;
    for (int64_t h = 0; h < heads; h++) {
        const int64_t x_row = t * x_stride_t + h * x_stride_h, out_row = (t * heads + h) * head_dim;
        for (int64_t i = 0; i < half; i++) {
            const float a = round_elem(load_elem(x, x_row + i, is_bf16) * load_elem(cos, table_row + i, is_bf16), is_bf16);
            const float b = round_elem(load_elem(x, x_row + half + i, is_bf16) * load_elem(sin, table_row + i, is_bf16), is_bf16);
            store_elem(out, out_row + i, a + b, is_bf16);
        }
        for (int64_t i = half; i < rope_dim; i++) {
            const float a = round_elem(load_elem(x, x_row + i, is_bf16) * load_elem(cos, table_row + i, is_bf16), is_bf16);
            const float b = round_elem(load_elem(x, x_row + i - half, is_bf16) * load_elem(sin, table_row + i, is_bf16), is_bf16);
            store_elem(out, out_row + i, a + b, is_bf16);
        }
        for (int64_t i = rope_dim; i < head_dim; i++) store_elem(out, out_row + i, load_elem(x, x_row + i, is_bf16), is_bf16);
    }
}

/* The exported kernels, per dtype: the row loop (parallel when it pays) around the row function. */
#define EXPORT_FOR_DTYPE(SUFFIX, IS_BF16)                                                                          \
    void rms_norm_##SUFFIX(const void *x, int64_t x_stride, const void *residual, int64_t residual_stride,        \
                           const void *weight, void *out, void *residual_out, int64_t rows, int64_t n, float eps, \
                           int num_threads) {                                                                     \
        _Pragma("omp parallel for num_threads(num_threads) if (rows * n >= PARALLEL_ELEMENTS)")                  \
        for (int64_t t = 0; t < rows; t++)                                                                        \
            rms_norm_row(x, x_stride, residual, residual_stride, weight, out, residual_out, t, n, eps, IS_BF16);  \
    }                                                                                                             \
    void silu_and_mul_##SUFFIX(const void *x, int64_t x_stride, void *out, int64_t rows, int64_t inter,          \
                               int num_threads) {                                                                 \
        _Pragma("omp parallel for num_threads(num_threads) if (rows * inter >= PARALLEL_ELEMENTS)")              \
        for (int64_t t = 0; t < rows; t++) silu_and_mul_row(x, x_stride, out, t, inter, IS_BF16);                 \
    }                                                                                                             \
    void rope_##SUFFIX(const void *x, int64_t x_stride_t, int64_t x_stride_h, const void *cos, const void *sin,   \
                       void *out, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rope_dim,              \
                       int num_threads) {                                                                         \
        _Pragma("omp parallel for num_threads(num_threads) if (tokens * heads * head_dim >= PARALLEL_ELEMENTS)") \
        for (int64_t t = 0; t < tokens; t++)                                                                      \
            rope_token(x, x_stride_t, x_stride_h, cos, sin, out, t, heads, head_dim, rope_dim, IS_BF16);          \
    }

EXPORT_FOR_DTYPE(bf16, 1)
EXPORT_FOR_DTYPE(f32, 0)
