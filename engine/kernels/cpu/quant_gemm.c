/* Linear layers on GGUF block-quantized weights: y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias),
   x, y and bias fp32, W in Q8_0 or Q4_1 as the file stores it (quant_blocks.h). K must be a
   multiple of 32 (a whole number of blocks, as GGUF requires).

   The weights are dequantised inside the kernel and never expanded in memory:
   - a few input rows (m <= MR: decode, small verify windows): each block of NR weight rows
     straight into vector registers where it is multiplied by the MR rows (MR x NR vector
     accumulators over K, each summed across its lanes at the end); threads take groups of NR
     output features. The step streams the file's bytes (0.625 bytes a weight for Q4_1,
     1.0625 for Q8_0, against 4 for fp32), which is what bounds a decode step.
   - more rows (prefill, batched decode): a panel of PANEL = 32 output features at a time into
     a per-thread fp32 buffer in gemv.c's layout, which stays in cache while vector.h's panel
     product (gemv.c's own) multiplies it into every input row; threads take panels. Each
     weight is dequantised once per call, and the result is gemv.c's fp32 product on the
     dequantised weight bit for bit.
   Each dequantised value is the one gguf.quants.dequantize gives, so a product differs from
   F.linear on the dequantised matrix only in the order of its fp32 sums. The AVX-512 and AVX2
   paths use intrinsics, elsewhere (ARM64) GCC's generic vectors. */

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "quant_blocks.h" /* the formats, dequant_block and dequant_panel */
#include "vector.h"       /* LANES, vfloat, PANEL, ROW_BLOCK and panel_sums_f32, shared with gemv.c */

#define NR 4 /* weight rows per few-rows kernel */
#define PREFETCH_BLOCKS 64 /* blocks ahead that the few-rows kernel prefetches in each weight row's stream */

/* The few-rows kernel's input rows (MR x NR accumulators) and a vector's lane sum. */
#if defined(__AVX512F__)
#define MR 4 /* 16 accumulators + 4 weight vectors of 32 registers */
static inline float vsum(vfloat v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
#define MR 2 /* 8 accumulators + 4 weight vectors of 16 registers */
static inline float vsum(vfloat v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
#define MR 2
static inline float vsum(vfloat v) {
    float s = 0.0f;
    for (int i = 0; i < LANES; i++) s += v[i];
    return s;
}
#endif

/* out[i][r] (+ bias[r]) = x[i] . w[r] for rows < rows_m (<= MR, a literal, so each count gets
   its own unrolled code) of x and NR weight rows held as blocks (row stride row_bytes), each
   block dequantised into registers where it is used: MR x NR vector accumulators over k, each
   summed across its lanes at the end. Rows past rows_n read the last row again and are not
   stored. */
ALWAYS_INLINE void block_kernel(const enum format format, const float *x, int64_t ldx, const uint8_t *w,
                                int64_t row_bytes, int64_t k, const float *bias, float *out, int64_t ldo,
                                const int rows_m, int rows_n) {
    vfloat acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) acc[i][r] = vzero();
    const uint8_t *rows[NR];
    for (int r = 0; r < NR; r++) rows[r] = w + (r < rows_n ? r : rows_n - 1) * row_bytes;
    for (int64_t b = 0; b < k / BLOCK; b++)
        for (int r = 0; r < NR; r++) {
            vfloat wv[VPB];
            /* NR interleaved streams defeat the hardware prefetcher: each asks ahead, into the
               next rows where a row is shorter (a prefetch past the weight's end is harmless) */
            __builtin_prefetch(rows[r] + (b + PREFETCH_BLOCKS) * BLOCK_BYTES[format]);
            dequant_block(format, rows[r] + b * BLOCK_BYTES[format], wv);
            for (int i = 0; i < rows_m; i++)
                for (int v = 0; v < VPB; v++)
                    acc[i][r] = vfma(vload(x + i * ldx + b * BLOCK + v * LANES), wv[v], acc[i][r]);
        }
    for (int i = 0; i < rows_m; i++)
        for (int r = 0; r < rows_n; r++) out[i * ldo + r] = vsum(acc[i][r]) + (bias ? bias[r] : 0.0f);
}

/* The few-rows product (m <= MR: decode, small verify windows), threads taking groups of NR
   output features: each weight byte is read once, straight into registers. */
ALWAYS_INLINE void linear_few_rows(const enum format format, const float *x, int64_t ldx, const uint8_t *weight,
                                   const float *bias, float *out, int64_t ldo, int64_t m, int64_t n, int64_t k,
                                   int threads) {
    const int64_t row_bytes = k / BLOCK * BLOCK_BYTES[format];
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n0 = 0; n0 < n; n0 += NR) {
        const int rows_n = (int)(n - n0 < NR ? n - n0 : NR);
        const uint8_t *w = weight + n0 * row_bytes;
        const float *b = bias ? bias + n0 : NULL;
        switch (m) { /* literal row counts: unrolled accumulators */
#define ROWS_OF(M) \
    case M: block_kernel(format, x, ldx, w, row_bytes, k, b, out + n0, ldo, M, rows_n); break;
            ROWS_OF(1)
            ROWS_OF(2)
#if MR > 2
            ROWS_OF(3)
            ROWS_OF(4)
#endif
#undef ROWS_OF
            default: break;
        }
    }
}

/* The many-rows product (m > MR: prefill, batched decode), threads taking panels of PANEL
   output features: each panel is dequantised once into the thread's buffer (from cache
   thereafter) and multiplied into every input row, ROW_BLOCK rows at a time, by vector.h's
   panel product, bias added as gemv.c adds it: gemv.c's fp32 result on the dequantised
   weight, bit for bit. */
/* This thread's buffer of at least `floats` floats (64-byte aligned), NULL out of memory. It is
   kept for the thread's next call: an allocation per call, past glibc's mmap threshold for
   most K, cost a fresh mapping and its page faults every call (a fifth of a 576 x 1536
   product of 16 rows). The OpenMP pool's threads live as long as the process. */
static float *thread_buffer(int64_t floats) {
    static _Thread_local float *buffer = NULL;
    static _Thread_local int64_t capacity = 0;
    if (floats > capacity) {
        free(buffer);
        capacity = (floats + 15) / 16 * 16;
        buffer = aligned_alloc(64, (size_t)capacity * sizeof(float));
        if (!buffer) capacity = 0;
    }
    return buffer;
}

ALWAYS_INLINE int linear_many_rows(const enum format format, const float *x, int64_t ldx, const uint8_t *weight,
                                   const float *bias, float *out, int64_t ldo, int64_t m, int64_t n, int64_t k,
                                   int threads) {
    const int64_t row_bytes = k / BLOCK * BLOCK_BYTES[format], panels = (n + PANEL - 1) / PANEL;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *panel = thread_buffer(k * PANEL); /* [k][PANEL] */
        failed = panel == NULL;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            if (!panel) continue;
            const int64_t n0 = p * PANEL, columns = n - n0 < PANEL ? n - n0 : PANEL;
            dequant_panel(format, weight + n0 * row_bytes, row_bytes, (int)columns, k, panel);
            for (int64_t row0 = 0; row0 < m; row0 += ROW_BLOCK) {
                float sums[ROW_BLOCK * PANEL] __attribute__((aligned(64)));
                const int64_t rows = m - row0 < ROW_BLOCK ? m - row0 : ROW_BLOCK;
                switch (rows) { /* each row count its own unrolled copy */
#define BLOCK_OF(R) \
    case R: panel_sums_f32(x, ldx, panel, k, row0, R, sums, 0, NULL); break;
                    FOR_EACH_BLOCK_ROWS(BLOCK_OF)
#undef BLOCK_OF
                    default: break;
                }
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < columns; c++)
                        out[(row0 + r) * ldo + n0 + c] = sums[r * PANEL + c] + (bias ? bias[n0 + c] : 0.0f);
            }
        }
    }
    return failed ? -1 : 0;
}

static int linear_quant(enum format format, const float *x, int64_t ldx, const void *qweight, const float *bias,
                        float *out, int64_t ldo, int64_t m, int64_t n, int64_t k, int threads) {
    if (k % BLOCK) return -2;
    if (m <= 0 || n <= 0) return 0;
    if (threads < 1) threads = 1;
    if (m <= MR) {
        if (format == Q8_0)
            linear_few_rows(Q8_0, x, ldx, qweight, bias, out, ldo, m, n, k, threads);
        else
            linear_few_rows(Q4_1, x, ldx, qweight, bias, out, ldo, m, n, k, threads);
        return 0;
    }
    const int64_t panels = (n + PANEL - 1) / PANEL;
    if (threads > panels) threads = (int)panels;
    if (format == Q8_0) return linear_many_rows(Q8_0, x, ldx, qweight, bias, out, ldo, m, n, k, threads);
    return linear_many_rows(Q4_1, x, ldx, qweight, bias, out, ldo, m, n, k, threads);
}

/* Rows ids[0..count) of the dequantised [*, k] weight -> out[count, k] (row stride ldo): the
   embedding lookup of a quantized table, one looked-up row at a time. */
static int dequant_rows(enum format format, const void *qweight, const int64_t *ids, int64_t count, float *out,
                        int64_t ldo, int64_t k, int threads) {
    if (k % BLOCK) return -2;
    const uint8_t *weight = qweight;
    const int64_t row_bytes = k / BLOCK * BLOCK_BYTES[format];
#pragma omp parallel for num_threads(threads) schedule(static) if (count > 64)
    for (int64_t i = 0; i < count; i++) dequant_row(format, weight + ids[i] * row_bytes, out + i * ldo, k);
    return 0;
}

/* SwiGLU on a [gate | up] weight of 2 inter rows: out [m, inter] (row stride ldo) = silu(gate) * up
   of x @ dequant(W)^T (+ bias [2 inter]), through a [m, 2 inter] scratch. The sums are
   linear_quant's and the silu elementwise.c's silu_and_mul_f32 (the same exp_approx), so the
   result is bit for bit the separate linear then silu-and-mul of the layers' Python forward. */
static int swiglu_quant(enum format format, const float *x, int64_t ldx, const void *qweight, const float *bias,
                        float *out, int64_t ldo, int64_t m, int64_t inter, int64_t k, int threads) {
    if (m <= 0) return 0;
    float *sums = malloc((size_t)(m * 2 * inter) * sizeof(float));
    if (!sums) return -1;
    const int status = linear_quant(format, x, ldx, qweight, bias, sums, 2 * inter, m, 2 * inter, k, threads);
    if (status == 0)
        for (int64_t t = 0; t < m; t++) {
            const float *gate = sums + t * 2 * inter, *up = gate + inter;
            for (int64_t i = 0; i < inter; i++) out[t * ldo + i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
        }
    free(sums);
    return status;
}

/* The exported kernels, one per format, all with kernel_signatures.h's linear_fn signature
   (fp32 activations), so the one-call decoder stack calls them through its function pointers.
   0 on success, -1 out of memory, -2 k not a multiple of 32. */
int linear_q8_0(const float *x, int64_t ldx, const void *qweight, const float *bias, float *out, int64_t ldo,
                int64_t m, int64_t n, int64_t k, int threads) {
    return linear_quant(Q8_0, x, ldx, qweight, bias, out, ldo, m, n, k, threads);
}

int linear_q4_1(const float *x, int64_t ldx, const void *qweight, const float *bias, float *out, int64_t ldo,
                int64_t m, int64_t n, int64_t k, int threads) {
    return linear_quant(Q4_1, x, ldx, qweight, bias, out, ldo, m, n, k, threads);
}

int swiglu_q8_0(const float *x, int64_t ldx, const void *qweight, const float *bias, float *out, int64_t ldo,
                int64_t m, int64_t inter, int64_t k, int threads) {
    return swiglu_quant(Q8_0, x, ldx, qweight, bias, out, ldo, m, inter, k, threads);
}

int swiglu_q4_1(const float *x, int64_t ldx, const void *qweight, const float *bias, float *out, int64_t ldo,
                int64_t m, int64_t inter, int64_t k, int threads) {
    return swiglu_quant(Q4_1, x, ldx, qweight, bias, out, ldo, m, inter, k, threads);
}

int dequant_rows_q8_0(const void *qweight, const int64_t *ids, int64_t count, float *out, int64_t ldo, int64_t k,
                      int threads) {
    return dequant_rows(Q8_0, qweight, ids, count, out, ldo, k, threads);
}

int dequant_rows_q4_1(const void *qweight, const int64_t *ids, int64_t count, float *out, int64_t ldo, int64_t k,
                      int threads) {
    return dequant_rows(Q4_1, qweight, ids, count, out, ldo, k, threads);
}
