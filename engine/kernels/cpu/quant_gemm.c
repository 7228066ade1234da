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
#include "vector.h" /* LANES, vfloat, PANEL, ROW_BLOCK and panel_sums_f32, shared with gemv.c */

#if defined(__F16C__) && !defined(__AVX2__)
#include <immintrin.h>
#endif

#define BLOCK 32   /* weights per block, both formats */
#define NR 4       /* weight rows per few-rows kernel */
#define PREFETCH_BLOCKS 64 /* blocks ahead that the few-rows kernel prefetches in each weight row's stream */

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

/* ---- per ISA: the few-rows kernel's row count, a vector's lane sum, a block dequantised into
   vectors, and the low 16 bits of each 32-bit lane read as fp16 ---- */

typedef int32_t vint __attribute__((vector_size(sizeof(vfloat)))); /* LANES 32-bit lanes */
typedef uint32_t vuint __attribute__((vector_size(sizeof(vfloat))));

#if defined(__AVX512F__)
#define MR 4 /* 16 accumulators + 4 weight vectors of 32 registers */
static inline float vsum(vfloat v) { return _mm512_reduce_add_ps(v); }
static inline vfloat vhalf_to_float(vint words) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16((__m512i)words)); }
/* The 32 weights of the block at src, dequantised into two vectors. */
ALWAYS_INLINE void dequant_block(const enum format format, const uint8_t *src, vfloat w[BLOCK / LANES]) {
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
#define MR 2 /* 8 accumulators + 4 weight vectors of 16 registers */
static inline vfloat vhalf_to_float(vint words) { /* the 8 low halves packed (F16C is in x86-64-v3) */
    const __m256i low = _mm256_and_si256((__m256i)words, _mm256_set1_epi32(0xffff));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1)));
}
static inline float vsum(vfloat v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
ALWAYS_INLINE void dequant_block(const enum format format, const uint8_t *src, vfloat w[BLOCK / LANES]) {
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
#define MR 2
static inline float vsum(vfloat v) {
    float s = 0.0f;
    for (int i = 0; i < LANES; i++) s += v[i];
    return s;
}
static inline vfloat vhalf_to_float(vint words) {
    vfloat v;
    for (int i = 0; i < LANES; i++) v[i] = fp16_to_float((uint16_t)words[i]);
    return v;
}
ALWAYS_INLINE void dequant_block(const enum format format, const uint8_t *src, vfloat w[BLOCK / LANES]) {
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

#define VPB (BLOCK / LANES) /* vectors per block */

/* Row of k weights (k / 32 blocks at src) -> dst, dequantised. */
ALWAYS_INLINE void dequant_row_of(const enum format format, const uint8_t *src, float *dst, int64_t k) {
    for (int64_t b = 0; b < k / BLOCK; b++) {
        vfloat w[VPB];
        dequant_block(format, src + b * BLOCK_BYTES[format], w);
        for (int v = 0; v < VPB; v++) vstore(dst + b * BLOCK + v * LANES, w[v]);
    }
}

static void dequant_row(enum format format, const uint8_t *src, float *dst, int64_t k) {
    if (format == Q8_0)
        dequant_row_of(Q8_0, src, dst, k);
    else
        dequant_row_of(Q4_1, src, dst, k);
}

/* The 32-bit word at rows[l] + offset in lane l. */
static inline vint gather_word(const uint8_t *const rows[LANES], int64_t offset) {
    vint words;
    for (int l = 0; l < LANES; l++) {
        int32_t word;
        memcpy(&word, rows[l] + offset, sizeof word);
        words[l] = word;
    }
    return words;
}

/* words[c] lane l = the 32-bit word at rows[l] + offset + 4 c, for c < 4. The x86 paths load
   16 bytes of each row (4 rows a vector, one per 128-bit lane) and transpose the 4 x 4 words of
   each lane in registers, several times cheaper than a gather per word. */
static inline void gather_words4(const uint8_t *const rows[LANES], int64_t offset, vint words[4]) {
#if defined(__AVX512F__) || defined(__AVX2__)
#define ROW_BYTES16(l) _mm_loadu_si128((const __m128i *)(rows[l] + offset))
#if defined(__AVX512F__)
#define vint_of(i) _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(ROW_BYTES16(i)), \
                                      ROW_BYTES16(4 + (i)), 1), ROW_BYTES16(8 + (i)), 2), ROW_BYTES16(12 + (i)), 3)
#define unpack(kind, a, b) _mm512_unpack##kind(a, b)
    __m512i a[4] = {vint_of(0), vint_of(1), vint_of(2), vint_of(3)};
#else
#define vint_of(i) _mm256_inserti128_si256(_mm256_castsi128_si256(ROW_BYTES16(i)), ROW_BYTES16(4 + (i)), 1)
#define unpack(kind, a, b) _mm256_unpack##kind(a, b)
    __m256i a[4] = {vint_of(0), vint_of(1), vint_of(2), vint_of(3)};
#endif
    /* a[i], 128-bit lane L: the 4 words of row 4 L + i */
    const __typeof__(a[0]) pairs[4] = {unpack(lo_epi32, a[0], a[1]), unpack(hi_epi32, a[0], a[1]),
                                       unpack(lo_epi32, a[2], a[3]), unpack(hi_epi32, a[2], a[3])};
    words[0] = (vint)unpack(lo_epi64, pairs[0], pairs[2]);
    words[1] = (vint)unpack(hi_epi64, pairs[0], pairs[2]);
    words[2] = (vint)unpack(lo_epi64, pairs[1], pairs[3]);
    words[3] = (vint)unpack(hi_epi64, pairs[1], pairs[3]);
#undef ROW_BYTES16
#undef vint_of
#undef unpack
#else
    for (int c = 0; c < 4; c++) words[c] = gather_word(rows, offset + 4 * c);
#endif
}

/* Weight rows [0, features) (row stride row_bytes, features <= PANEL) dequantised into
   panel [k][PANEL], gemv.c's fp32 layout (feature c at column c), LANES features per vector:
   each block's quants are read a 32-bit word per feature (4 Q8_0 quants, 4 Q4_1 bytes of
   nibbles) into the lanes of one vector, and weight j is masked in place rather than shifted
   down: the lane holds q 2^s (s = 24 for Q8_0's quant moved to the top byte, so its sign is
   the word's; 8 t or 8 t + 4 for Q4_1's nibble of byte t, 4 taken off the high nibbles first),
   which converts exactly, and is multiplied by d 2^-s (exact: a power of two, d >= 2^-24 stays
   normal), so each value is d q (+ m) rounded as dequant_block rounds it. Columns past
   `features` repeat the last row and are never stored. */
ALWAYS_INLINE void dequant_panel(const enum format format, const uint8_t *weight, int64_t row_bytes, int features,
                                 int64_t k, float *panel) {
    const uint8_t *rows[PANEL];
    for (int c = 0; c < PANEL; c++) rows[c] = weight + (c < features ? c : features - 1) * row_bytes;
    for (int64_t b = 0; b < k / BLOCK; b++) {
        const int64_t block = b * BLOCK_BYTES[format];
        float *out = panel + b * BLOCK * PANEL;
        for (int g = 0; g < PANEL; g += LANES) {
            const uint8_t *const *lanes = rows + g;
            const vint head = gather_word(lanes, block); /* fp16 d, then Q4_1's m or Q8_0's first 2 quants */
            const vfloat scale = vhalf_to_float(head);
            if (format == Q8_0) {
                const vfloat scale_top = scale * vset1(0x1p-24f);
                for (int quarter = 0; quarter < 2; quarter++) {
                    vint quants[4]; /* quants 16 quarter + 4 word .. + 3 */
                    gather_words4(lanes, block + 2 + 16 * quarter, quants);
                    for (int word = 0; word < 4; word++)
                        for (int byte = 0; byte < 4; byte++) {
                            const vint top = (quants[word] << (24 - 8 * byte)) & (int32_t)0xff000000u;
                            vstore(out + (16 * quarter + 4 * word + byte) * PANEL + g,
                                   __builtin_convertvector(top, vfloat) * scale_top);
                        }
                }
            } else {
                const vfloat minimum = vhalf_to_float((vint)((vuint)head >> 16));
                vfloat scales[4];
                for (int byte = 0; byte < 4; byte++) scales[byte] = scale * vset1(1.0f / (float)(1u << (8 * byte)));
                vint nibbles[4]; /* weights 4 word + byte (low nibbles) and + 16 (high) */
                gather_words4(lanes, block + 4, nibbles);
                for (int word = 0; word < 4; word++) {
                    const vint high = (vint)((vuint)nibbles[word] >> 4);
                    for (int byte = 0; byte < 4; byte++) {
                        const int32_t mask = 0x0f << (8 * byte);
                        float *low_out = out + (4 * word + byte) * PANEL + g;
                        vstore(low_out, vfma(__builtin_convertvector(nibbles[word] & mask, vfloat), scales[byte], minimum));
                        vstore(low_out + BLOCK / 2 * PANEL,
                               vfma(__builtin_convertvector(high & mask, vfloat), scales[byte], minimum));
                    }
                }
            }
        }
    }
}

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
ALWAYS_INLINE void linear_many_rows(const enum format format, const float *x, int64_t ldx, const uint8_t *weight,
                                    const float *bias, float *out, int64_t ldo, int64_t m, int64_t n, int64_t k,
                                    float *buffers, int threads) {
    const int64_t row_bytes = k / BLOCK * BLOCK_BYTES[format], panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel num_threads(threads)
    {
        float *panel = buffers + (int64_t)omp_get_thread_num() * k * PANEL;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int64_t n0 = p * PANEL, columns = n - n0 < PANEL ? n - n0 : PANEL;
            dequant_panel(format, weight + n0 * row_bytes, row_bytes, (int)columns, k, panel);
            for (int64_t row0 = 0; row0 < m; row0 += ROW_BLOCK) {
                float sums[ROW_BLOCK * PANEL] __attribute__((aligned(64)));
                const int64_t rows = m - row0 < ROW_BLOCK ? m - row0 : ROW_BLOCK;
                switch (rows) { /* each row count its own unrolled copy */
#define BLOCK_OF(R) \
    case R: panel_sums_f32(x, ldx, panel, k, row0, R, sums); break;
                    BLOCK_OF(1)
                    BLOCK_OF(2)
#if ROW_BLOCK > 2
                    BLOCK_OF(3)
                    BLOCK_OF(4)
                    BLOCK_OF(5)
                    BLOCK_OF(6)
#endif
#undef BLOCK_OF
                    default: break;
                }
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < columns; c++)
                        out[(row0 + r) * ldo + n0 + c] = sums[r * PANEL + c] + (bias ? bias[n0 + c] : 0.0f);
            }
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
    /* Many rows: each thread dequantises a panel at a time into its buffer, [k][PANEL] floats
       (k % 32 == 0: a multiple of 64 bytes) */
    const int64_t panels = (n + PANEL - 1) / PANEL;
    if (threads > panels) threads = (int)panels;
    float *buffers = aligned_alloc(64, (size_t)(threads * k * PANEL) * sizeof(float));
    if (!buffers) return -1;
    if (format == Q8_0)
        linear_many_rows(Q8_0, x, ldx, qweight, bias, out, ldo, m, n, k, buffers, threads);
    else
        linear_many_rows(Q4_1, x, ldx, qweight, bias, out, ldo, m, n, k, buffers, threads);
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
