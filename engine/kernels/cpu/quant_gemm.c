/* Linear layers on GGUF block-quantized weights: y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias),
   x, y and bias fp32, W as llama.cpp stores it (ggml-common.h), one row of K / 32 blocks after
   another:

       Q8_0  34 bytes per 32 weights: fp16 d, int8 q[32]          w[j] = d * q[j]
       Q4_1  20 bytes per 32 weights: fp16 d, fp16 m, u8 qs[16]   w[j] = d * (qs[j] & 15) + m,
                                                                  w[j + 16] = d * (qs[j] >> 4) + m

   The weights are dequantised inside the kernel, a panel of a few rows at a time into a
   per-thread fp32 buffer that stays in cache, and never expanded in memory: the step streams
   the file's bytes (0.625 bytes a weight for Q4_1, 1.0625 for Q8_0, against 4 for fp32), which
   is what bounds a decode step. Each dequantised value is the one gguf.quants.dequantize gives
   (d * q is exact in fp32: 11 significant bits times at most 8, so fused or not, the sum
   with m rounds once), so the product differs from F.linear on the dequantised matrix only in
   the order of its fp32 sums.

   Threads take panels of output rows. In a panel the rows are multiplied MR input rows by
   NR weight rows at a time (MR x NR vector accumulators over K, each summed across its lanes
   at the end): the AVX-512 and AVX2 paths with intrinsics, elsewhere (ARM64) GCC's generic
   vectors. K must be a multiple of 32 (a whole number of blocks, as GGUF requires). */

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(__F16C__)
#include <immintrin.h>
#endif

#define BLOCK 32   /* weights per block, both formats */
#define NR 4       /* weight rows per micro-kernel */
#define PANEL_BYTES (128 * 1024) /* dequantised panel per thread: fits L2, leaves room for x */

enum format { Q8_0 = 0, Q4_1 = 1 };
static const int64_t BLOCK_BYTES[] = {34, 20};

static inline float fp16_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (exponent == 0x1f) {
        v.u = sign | 0x7f800000u | (mantissa << 13); /* inf, NaN */
    } else if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact in fp32 */
        v.f = (float)mantissa * 0x1p-24f;
        v.u |= sign;
    } else {
        v.u = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    return v.f;
#endif
}

static inline uint16_t read_u16(const uint8_t *p) {
    uint16_t value;
    memcpy(&value, p, sizeof value); /* blocks are 2-byte aligned at best */
    return value;
}

/* ---- dequantisation of one row of k weights (k / 32 blocks at src) into dst ---- */

static void dequant_row_q8_0(const uint8_t *src, float *dst, int64_t k) {
    for (int64_t b = 0; b < k / BLOCK; b++, src += 34, dst += BLOCK) {
        const float d = fp16_to_float(read_u16(src));
        const int8_t *q = (const int8_t *)(src + 2);
#if defined(__AVX512F__)
        const __m512 scale = _mm512_set1_ps(d);
        for (int half = 0; half < 2; half++) {
            const __m128i bytes = _mm_loadu_si128((const __m128i *)(q + 16 * half));
            _mm512_storeu_ps(dst + 16 * half, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), scale));
        }
#elif defined(__AVX2__) && defined(__FMA__)
        const __m256 scale = _mm256_set1_ps(d);
        for (int quarter = 0; quarter < 4; quarter++) {
            const __m128i bytes = _mm_loadl_epi64((const __m128i *)(q + 8 * quarter));
            _mm256_storeu_ps(dst + 8 * quarter, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), scale));
        }
#else
        for (int j = 0; j < BLOCK; j++) dst[j] = (float)q[j] * d;
#endif
    }
}

static void dequant_row_q4_1(const uint8_t *src, float *dst, int64_t k) {
    for (int64_t b = 0; b < k / BLOCK; b++, src += 20, dst += BLOCK) {
        const float d = fp16_to_float(read_u16(src)), m = fp16_to_float(read_u16(src + 2));
        const uint8_t *qs = src + 4;
#if defined(__AVX512F__)
        const __m128i bytes = _mm_loadu_si128((const __m128i *)qs), low4 = _mm_set1_epi8(0x0f);
        const __m128i low = _mm_and_si128(bytes, low4), high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
        const __m512 scale = _mm512_set1_ps(d), offset = _mm512_set1_ps(m);
        _mm512_storeu_ps(dst, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(low)), scale, offset));
        _mm512_storeu_ps(dst + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(high)), scale, offset));
#elif defined(__AVX2__) && defined(__FMA__)
        const __m128i bytes = _mm_loadu_si128((const __m128i *)qs), low4 = _mm_set1_epi8(0x0f);
        const __m128i nibbles[2] = {_mm_and_si128(bytes, low4), _mm_and_si128(_mm_srli_epi16(bytes, 4), low4)};
        const __m256 scale = _mm256_set1_ps(d), offset = _mm256_set1_ps(m);
        for (int half = 0; half < 2; half++) {
            const __m128i part = nibbles[half];
            const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part));
            const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(part, 8)));
            _mm256_storeu_ps(dst + 16 * half, _mm256_fmadd_ps(q0, scale, offset));
            _mm256_storeu_ps(dst + 16 * half + 8, _mm256_fmadd_ps(q1, scale, offset));
        }
#else
        for (int j = 0; j < BLOCK / 2; j++) {
            dst[j] = (float)(qs[j] & 0x0f) * d + m;
            dst[j + BLOCK / 2] = (float)(qs[j] >> 4) * d + m;
        }
#endif
    }
}

static inline void dequant_row(enum format format, const uint8_t *src, float *dst, int64_t k) {
    if (format == Q8_0)
        dequant_row_q8_0(src, dst, k);
    else
        dequant_row_q4_1(src, dst, k);
}

/* ---- the vector type of the micro-kernel ---- */

#if defined(__AVX512F__)
typedef __m512 vec;
#define VL 16
#define MR 4 /* 16 accumulators + 4 weight vectors of 32 registers */
#define vzero() _mm512_setzero_ps()
#define vload(p) _mm512_loadu_ps(p)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
#define VL 8
#define MR 2 /* 8 accumulators + 4 weight vectors of 16 registers */
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
typedef float vec __attribute__((vector_size(16))); /* NEON's width; GCC splits or joins it elsewhere */
#define VL 4
#define MR 2
static inline vec vzero(void) { return (vec){0}; }
static inline vec vload(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}
#define vfma(a, b, c) ((a) * (b) + (c))
static inline float vsum(vec v) {
    float s = 0.0f;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}
#endif

/* out[i][r] (+ bias[r]) = x[i] . w[r] for rows < rows_m (<= MR) of x and NR rows of w (K
   floats each, row stride k). `rows_m` is a literal at each call, so each count gets its own
   unrolled code; weight rows past `rows_n` are skipped on store. */
static inline __attribute__((always_inline)) void micro_kernel(const float *x, int64_t ldx, const float *w,
                                                               int64_t k, const float *bias, float *out,
                                                               int64_t ldo, const int rows_m, int rows_n) {
    vec acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) acc[i][r] = vzero();
    for (int64_t c = 0; c < k; c += VL) {
        vec wv[NR];
        for (int r = 0; r < NR; r++) wv[r] = vload(w + r * k + c);
        for (int i = 0; i < rows_m; i++) {
            const vec xv = vload(x + i * ldx + c);
            for (int r = 0; r < NR; r++) acc[i][r] = vfma(xv, wv[r], acc[i][r]);
        }
    }
    for (int i = 0; i < rows_m; i++)
        for (int r = 0; r < rows_n; r++) out[i * ldo + r] = vsum(acc[i][r]) + (bias ? bias[r] : 0.0f);
}

/* Rows [n0, n0 + rows) of the output, all m input rows, from their dequantised weights `w`. */
static void panel_product(const float *x, int64_t ldx, const float *w, const float *bias, float *out, int64_t ldo,
                          int64_t m, int64_t n0, int64_t rows, int64_t k) {
    for (int64_t i = 0; i < m; i += MR) {
        const int64_t rows_m = m - i < MR ? m - i : MR;
        for (int64_t r = 0; r < rows; r += NR) {
            const int rows_n = (int)(rows - r < NR ? rows - r : NR);
            const float *xi = x + i * ldx, *wr = w + r * k, *br = bias ? bias + n0 + r : NULL;
            float *o = out + i * ldo + n0 + r;
            switch (rows_m) { /* literal row counts: unrolled accumulators */
            case MR: micro_kernel(xi, ldx, wr, k, br, o, ldo, MR, rows_n); break;
#if MR > 2
            case 3: micro_kernel(xi, ldx, wr, k, br, o, ldo, 3, rows_n); break;
            case 2: micro_kernel(xi, ldx, wr, k, br, o, ldo, 2, rows_n); break;
#endif
            default: micro_kernel(xi, ldx, wr, k, br, o, ldo, 1, rows_n); break;
            }
        }
    }
}

static int linear_quant(enum format format, const float *x, int64_t ldx, const void *qweight, const float *bias,
                        float *out, int64_t ldo, int64_t m, int64_t n, int64_t k, int threads) {
    if (k % BLOCK) return -2;
    if (m <= 0 || n <= 0) return 0;
    /* Few input rows: a panel of NR rows, dequantised and used at once from L1. Many: the
       largest panel that fits PANEL_BYTES, so each weight is dequantised once per call. */
    int64_t panel = NR;
    if (m > MR) {
        panel = PANEL_BYTES / ((int64_t)sizeof(float) * k) / NR * NR;
        panel = panel < NR ? NR : panel;
    }
    const int64_t panels = (n + panel - 1) / panel, row_bytes = k / BLOCK * BLOCK_BYTES[format];
    if (threads < 1) threads = 1;
    if (threads > panels) threads = (int)panels;
    float *buffers = aligned_alloc(64, (size_t)(threads * panel * k) * sizeof(float)); /* k % 32 == 0: a multiple of 64 bytes */
    if (!buffers) return -1;
    const uint8_t *weight = qweight;
#pragma omp parallel num_threads(threads)
    {
        float *w = buffers + (int64_t)omp_get_thread_num() * panel * k;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int64_t n0 = p * panel, rows = n - n0 < panel ? n - n0 : panel;
            for (int64_t r = 0; r < rows; r++) dequant_row(format, weight + (n0 + r) * row_bytes, w + r * k, k);
            if (rows % NR) memset(w + rows * k, 0, (size_t)((NR - rows % NR) * k) * sizeof(float));
            panel_product(x, ldx, w, bias, out, ldo, m, n0, rows, k);
        }
    }
    free(buffers);
    return 0;
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

/* The exported kernels, one per format, all with decoder.c's linear_fn signature (fp32
   activations), so the one-call decoder stack calls them through its function pointers.
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
