/* The GGUF block formats of quant_gemm.c and their dequantisation into vectors (LANES lanes of
   vector.h), as llama.cpp stores them (ggml-common.h), one row of K / 32 blocks after another:

       Q8_0  34 bytes per 32 weights: fp16 d, int8 q[32]          w[j] = d * q[j]
       Q4_1  20 bytes per 32 weights: fp16 d, fp16 m, u8 qs[16]   w[j] = d * (qs[j] & 15) + m,
                                                                  w[j + 16] = d * (qs[j] >> 4) + m

   Two forms: a block of one row into that row's vectors (dequant_block: the few-rows kernel's
   registers, and the row lookups), and a panel of PANEL rows into gemv.c's fp32 layout
   [k][PANEL] (dequant_panel: the many-rows kernel's buffer). Each value is the one
   gguf.quants.dequantize gives: d * q is exact in fp32 (11 significant bits times at most 8),
   so fused or not, the sum with m rounds once. */

#ifndef DSPARK_CPU_QUANT_BLOCKS_H
#define DSPARK_CPU_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "vector.h"

#if defined(__F16C__) && !defined(__AVX2__)
#include <immintrin.h>
#endif

#define BLOCK 32   /* weights per block, both formats */

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

/* ---- per ISA: a block dequantised into vectors, and the low 16 bits of each 32-bit lane
   read as fp16 ---- */

typedef int32_t vint __attribute__((vector_size(sizeof(vfloat)))); /* LANES 32-bit lanes */
typedef uint32_t vuint __attribute__((vector_size(sizeof(vfloat))));

#if defined(__AVX512F__)
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
static inline vfloat vhalf_to_float(vint words) { /* the 8 low halves packed (F16C is in x86-64-v3) */
    const __m256i low = _mm256_and_si256((__m256i)words, _mm256_set1_epi32(0xffff));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1)));
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

/* words[c] lane l = the 32-bit word at rows[l] + offset + 4 c, for c < 4. The x86 paths load
   16 bytes of each row (4 rows a vector, one per 128-bit lane) and transpose the 4 x 4 words of
   each lane in registers, several times cheaper than a gather per word (the head of a block,
   a word, is read so too: inserting 16 words one at a time cost a third of the panel's time). */
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
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < LANES; l++) {
            int32_t word;
            memcpy(&word, rows[l] + offset + 4 * c, sizeof word);
            words[c][l] = word;
        }
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
    const int64_t column_bytes = PANEL * BLOCK_BYTES[format]; /* a block column's share of a panel's bytes */
    for (int64_t b = 0; b < k / BLOCK; b++) {
        const int64_t block = b * BLOCK_BYTES[format];
        float *out = panel + b * BLOCK * PANEL;
        /* PANEL interleaved row streams defeat the hardware prefetcher: ask for the next panel
           (contiguous bytes, PANEL rows on) a share at a time; past the weight's end is harmless */
        for (int64_t line = 0; line < column_bytes; line += 64)
            __builtin_prefetch(weight + PANEL * row_bytes + b * column_bytes + line);
        for (int g = 0; g < PANEL; g += LANES) {
            const uint8_t *const *lanes = rows + g;
            vint head[4]; /* head[0]: fp16 d, then Q4_1's m or Q8_0's first 2 quants */
            gather_words4(lanes, block, head);
            const vfloat scale = vhalf_to_float(head[0]);
            if (format == Q8_0) {
                const vfloat scale_top = scale * vset1(0x1p-24f);
                for (int quarter = 0; quarter < 2; quarter++) {
                    vint quants[4]; /* quants 16 quarter + 4 word .. + 3 */
                    gather_words4(lanes, block + 2 + 16 * quarter, quants);
                    for (int word = 0; word < 4; word++)
                        for (int byte = 0; byte < 4; byte++) {
                            const vint top = (vint)(((vuint)quants[word] << (24 - 8 * byte)) & 0xff000000u);
                            vstore(out + (16 * quarter + 4 * word + byte) * PANEL + g,
                                   __builtin_convertvector(top, vfloat) * scale_top);
                        }
                }
            } else {
                const vfloat minimum = vhalf_to_float((vint)((vuint)head[0] >> 16));
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

#endif
