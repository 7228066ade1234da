/* Linear layers on GGUF block-quantized weights: y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias),
   x, y and bias fp32, W as llama.cpp stores it (ggml-common.h), one row of K / 32 blocks after
   another:

       Q8_0  34 bytes per 32 weights: fp16 d, int8 q[32]          w[j] = d * q[j]
       Q4_1  20 bytes per 32 weights: fp16 d, fp16 m, u8 qs[16]   w[j] = d * (qs[j] & 15) + m,
                                                                  w[j + 16] = d * (qs[j] >> 4) + m

   The weights are dequantised inside the kernel and never expanded in memory: with a few
   input rows (m <= MR: decode) each block straight into vector registers where it is
   multiplied; with more, a panel of weight rows at a time into a per-thread fp32 buffer
   that stays in cache, so each weight is dequantised once per call. The step streams
   the file's bytes (0.625 bytes a weight for Q4_1, 1.0625 for Q8_0, against 4 for fp32), which
   is what bounds a decode step. Each dequantised value is the one gguf.quants.dequantize gives
   (d * q is exact in fp32: 11 significant bits times at most 8, so fused or not, the sum
   with m rounds once), so the product differs from F.linear on the dequantised matrix only in
   the order of its fp32 sums.

   Threads take groups or panels of output rows. The rows are multiplied MR input rows by
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
#define PREFETCH_BLOCKS 64 /* blocks ahead that the few-rows kernel prefetches in each weight row's stream */
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

/* ---- the vector type of the micro-kernel ---- */

#if defined(__AVX512F__)
typedef __m512 vec;
#define VL 16
#define MR 4 /* 16 accumulators + 4 weight vectors of 32 registers */
#define vzero() _mm512_setzero_ps()
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, v) _mm512_storeu_ps(p, v)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
/* The 32 weights of the block at src, dequantised into two vectors. */
ALWAYS_INLINE void dequant_block(const enum format format, const uint8_t *src, vec w[BLOCK / VL]) {
    if (format == Q8_0) {
        const __m512 scale = _mm512_set1_ps(fp16_to_float(read_u16(src)));
        for (int half = 0; half < 2; half++) {
            const __m128i bytes = _mm_loadu_si128((const __m128i *)(src + 2 + 16 * half));
            w[half] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), scale);
        }
    } else { /* the 16 values q d + m as a table, looked up by each nibble (vpermps reads an
                index's low 4 bits, so the low nibble needs no mask and the high one a shift) */
        uint32_t scale_min; /* fp16 d and m, converted together */
        memcpy(&scale_min, src, sizeof scale_min);
        const __m512 both = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)scale_min)));
        const __m512 scale = _mm512_broadcastss_ps(_mm512_castps512_ps128(both));
        const __m512 offset = _mm512_permutexvar_ps(_mm512_set1_epi32(1), both);
        const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 table = _mm512_fmadd_ps(levels, scale, offset);
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + 4)));
        w[0] = _mm512_permutexvar_ps(bytes, table);
        w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
#define VL 8
#define MR 2 /* 8 accumulators + 4 weight vectors of 16 registers */
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, v) _mm256_storeu_ps(p, v)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
ALWAYS_INLINE void dequant_block(const enum format format, const uint8_t *src, vec w[BLOCK / VL]) {
    const __m256 scale = _mm256_set1_ps(fp16_to_float(read_u16(src)));
    if (format == Q8_0) {
        for (int quarter = 0; quarter < 4; quarter++) {
            const __m128i bytes = _mm_loadl_epi64((const __m128i *)(src + 2 + 8 * quarter));
            w[quarter] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), scale);
        }
    } else {
        const __m128i bytes = _mm_loadu_si128((const __m128i *)(src + 4)), low4 = _mm_set1_epi8(0x0f);
        const __m128i nibbles[2] = {_mm_and_si128(bytes, low4), _mm_and_si128(_mm_srli_epi16(bytes, 4), low4)};
        const __m256 offset = _mm256_set1_ps(fp16_to_float(read_u16(src + 2)));
        for (int half = 0; half < 2; half++) {
            const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nibbles[half]));
            const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(nibbles[half], 8)));
            w[2 * half] = _mm256_fmadd_ps(q0, scale, offset);
            w[2 * half + 1] = _mm256_fmadd_ps(q1, scale, offset);
        }
    }
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
static inline void vstore(float *p, vec v) { memcpy(p, &v, sizeof v); }
#define vfma(a, b, c) ((a) * (b) + (c))
static inline float vsum(vec v) {
    float s = 0.0f;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}
ALWAYS_INLINE void dequant_block(const enum format format, const uint8_t *src, vec w[BLOCK / VL]) {
    const float d = fp16_to_float(read_u16(src));
    float values[BLOCK];
    if (format == Q8_0) {
        for (int j = 0; j < BLOCK; j++) values[j] = (float)(int8_t)src[2 + j] * d;
    } else {
        const float m = fp16_to_float(read_u16(src + 2));
        for (int j = 0; j < BLOCK / 2; j++) {
            values[j] = (float)(src[4 + j] & 0x0f) * d + m;
            values[j + BLOCK / 2] = (float)(src[4 + j] >> 4) * d + m;
        }
    }
    memcpy(w, values, sizeof values);
}
#endif

#define VPB (BLOCK / VL) /* vectors per block */

/* Row of k weights (k / 32 blocks at src) -> dst, dequantised. */
ALWAYS_INLINE void dequant_row_of(const enum format format, const uint8_t *src, float *dst, int64_t k) {
    for (int64_t b = 0; b < k / BLOCK; b++) {
        vec w[VPB];
        dequant_block(format, src + b * BLOCK_BYTES[format], w);
        for (int v = 0; v < VPB; v++) vstore(dst + b * BLOCK + v * VL, w[v]);
    }
}

static void dequant_row(enum format format, const uint8_t *src, float *dst, int64_t k) {
    if (format == Q8_0)
        dequant_row_of(Q8_0, src, dst, k);
    else
        dequant_row_of(Q4_1, src, dst, k);
}

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

/* micro_kernel's sums for rows < rows_m (<= MR, a literal) of x and NR weight rows held as
   blocks (row stride row_bytes), each block dequantised into registers where it is used:
   the same products, summed in the same order (k ascending, lane by lane), so the same bits,
   without a buffer. Rows past rows_n read the last row again and are not stored. */
ALWAYS_INLINE void block_kernel(const enum format format, const float *x, int64_t ldx, const uint8_t *w,
                                int64_t row_bytes, int64_t k, const float *bias, float *out, int64_t ldo,
                                const int rows_m, int rows_n) {
    vec acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) acc[i][r] = vzero();
    const uint8_t *rows[NR];
    for (int r = 0; r < NR; r++) rows[r] = w + (r < rows_n ? r : rows_n - 1) * row_bytes;
    for (int64_t b = 0; b < k / BLOCK; b++)
        for (int r = 0; r < NR; r++) {
            vec wv[VPB];
            /* NR interleaved streams defeat the hardware prefetcher: each asks ahead, into the
               next rows where a row is shorter (a prefetch past the weight's end is harmless) */
            __builtin_prefetch(rows[r] + (b + PREFETCH_BLOCKS) * BLOCK_BYTES[format]);
            dequant_block(format, rows[r] + b * BLOCK_BYTES[format], wv);
            for (int i = 0; i < rows_m; i++)
                for (int v = 0; v < VPB; v++)
                    acc[i][r] = vfma(vload(x + i * ldx + b * BLOCK + v * VL), wv[v], acc[i][r]);
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
    /* Many rows: the largest panel of weight rows that fits PANEL_BYTES, dequantised into a
       per-thread buffer once per call and multiplied from cache. */
    int64_t panel = PANEL_BYTES / ((int64_t)sizeof(float) * k) / NR * NR;
    panel = panel < NR ? NR : panel;
    const int64_t panels = (n + panel - 1) / panel, row_bytes = k / BLOCK * BLOCK_BYTES[format];
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
