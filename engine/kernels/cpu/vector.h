/* The vector type of the build's ISA (isa.py picks the target) and the fp32 product of one
   weight panel, shared by gemv.c (packed fp32 weights) and quant_gemm.c (GGUF blocks
   dequantised into a panel), so that both sum the same products in the same order.

   A panel is PANEL = 32 output features of a weight laid out [k][PANEL] (feature c of the
   panel at column c). Its product keeps up to ROW_BLOCK input rows of fp32 sums in vector
   registers; per k it loads the panel's weights once and multiplies them into every row's
   sums: the sums run over k in order, one multiply-add per weight (fused where the ISA has
   FMA), from zero. Up to WIDE_ROWS rows hold all 32 columns at once (one pass over the
   panel: the batch-1 GEMV streams each weight byte once). Where the registers cannot hold
   a whole block at full width (AVX2's 16), a block of 5 or 6 rows takes the panel in two
   passes of 16 columns, 6 rows x 16 columns each, so that each weight loaded feeds 6
   multiply-adds instead of 2 (the register tile of BLIS's Haswell kernel). Either way
   every output's sum is the same sequence of operations, so the results are the same to
   the bit.

   AVX-512: 16 lanes; AVX2 + FMA: 8; otherwise GCC/Clang vector extensions of 4 lanes, which
   compile to SSE2 on any x86-64 and to NEON on ARM64. */

#ifndef DSPARK_CPU_VECTOR_H
#define DSPARK_CPU_VECTOR_H

#include <stdint.h>
#include <string.h>

#include "bf16.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define PANEL 32 /* output features per panel */

#if defined(__AVX512F__)
#define LANES 16
#define ROW_BLOCK 6 /* 12 sums of 16 lanes + 2 weight vectors + a broadcast, of 32 registers */
#define WIDE_ROWS 6
typedef __m512 vfloat;
static inline vfloat vzero(void) { return _mm512_setzero_ps(); }
static inline vfloat vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vfloat v) { _mm512_storeu_ps(p, v); }
static inline vfloat vset1(float x) { return _mm512_set1_ps(x); }
static inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
#define LANES 8
#define ROW_BLOCK 6 /* half panels: 12 sums of 8 lanes + 2 weight vectors + a broadcast, of 16 registers */
#define WIDE_ROWS 2 /* whole panels: 8 sums + 4 weight vectors + a broadcast */
#define HALF_FROM 5 /* rows from which a block takes half panels */
typedef __m256 vfloat;
static inline vfloat vzero(void) { return _mm256_setzero_ps(); }
static inline vfloat vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vfloat v) { _mm256_storeu_ps(p, v); }
static inline vfloat vset1(float x) { return _mm256_set1_ps(x); }
static inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm256_fmadd_ps(a, b, c); }
#else
#define LANES 4
#define ROW_BLOCK 2
#define WIDE_ROWS 2
typedef float vfloat __attribute__((vector_size(16)));
static inline vfloat vzero(void) { return (vfloat){0, 0, 0, 0}; }
static inline vfloat vload(const float *p) {
    vfloat v;
    memcpy(&v, p, sizeof(v));
    return v;
}
static inline void vstore(float *p, vfloat v) { memcpy(p, &v, sizeof(v)); }
static inline vfloat vset1(float x) { return (vfloat){x, x, x, x}; }
/* A product then a sum (no fused multiply-add is assumed): other roundings than the FMA paths. */
static inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return a * b + c; }
#endif

#define VECTORS (PANEL / LANES) /* vectors per row of a panel's sums */

/* The row counts of a block, for a switch that hands a count known at run time to a call with
   that count as a literal (each count its own unrolled copy): a `case R: ...; break;` per
   count from CASE(R). */
#if ROW_BLOCK > 2
#define FOR_EACH_BLOCK_ROWS(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#else
#define FOR_EACH_BLOCK_ROWS(CASE) CASE(1) CASE(2)
#endif

/* sums [rows][PANEL] of x's rows row0.. (row stride ldx) over one fp32 panel [k][PANEL], k in
   order, all 32 columns at once; `rows` <= WIDE_ROWS is a literal at each call, so that the
   sums stay in registers. From zero, or (resume) from the sums already there: a panel taken
   in runs of k continues each sum exactly where the last run stored it. */
ALWAYS_INLINE void wide_sums_f32(const float *x, int64_t ldx, const float *panel, int64_t k, int64_t row0,
                                 const int rows, float *sums, const int resume, const float *ahead) {
    vfloat acc[WIDE_ROWS][VECTORS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < VECTORS; v++) acc[r][v] = resume ? vload(sums + r * PANEL + v * LANES) : vzero();
    const float *w = panel, *xs = x + row0 * ldx;
    for (int64_t kk = 0; kk < k; kk++, w += PANEL) {
        if (ahead) {
            __builtin_prefetch(ahead + kk * PANEL);
            __builtin_prefetch(ahead + kk * PANEL + PANEL / 2);
        }
        vfloat wv[VECTORS];
        for (int v = 0; v < VECTORS; v++) wv[v] = vload(w + v * LANES);
        for (int r = 0; r < rows; r++) {
            const vfloat xv = vset1(xs[r * ldx + kk]);
            for (int v = 0; v < VECTORS; v++) acc[r][v] = vfma(xv, wv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < VECTORS; v++) vstore(sums + r * PANEL + v * LANES, acc[r][v]);
}

#if WIDE_ROWS < ROW_BLOCK
/* The same for columns [col0, col0 + 2 * LANES) (half a panel), `rows` <= ROW_BLOCK a literal. */
ALWAYS_INLINE void half_sums_f32(const float *x, int64_t ldx, const float *panel, int64_t k, int64_t row0,
                                 const int rows, const int col0, float *sums, const int resume, const float *ahead) {
    vfloat acc[ROW_BLOCK][2];
    for (int r = 0; r < rows; r++) {
        acc[r][0] = resume ? vload(sums + r * PANEL + col0) : vzero();
        acc[r][1] = resume ? vload(sums + r * PANEL + col0 + LANES) : vzero();
    }
    const float *w = panel + col0, *xs = x + row0 * ldx;
    for (int64_t kk = 0; kk < k; kk++, w += PANEL) {
        if (col0 == 0) /* the other half's cache line too, so that the second pass finds it in cache */
            __builtin_prefetch(w + PANEL / 2);
        if (ahead) __builtin_prefetch(ahead + kk * PANEL + col0);
        const vfloat w0 = vload(w), w1 = vload(w + LANES);
        for (int r = 0; r < rows; r++) {
            const vfloat xv = vset1(xs[r * ldx + kk]);
            acc[r][0] = vfma(xv, w0, acc[r][0]);
            acc[r][1] = vfma(xv, w1, acc[r][1]);
        }
    }
    for (int r = 0; r < rows; r++) {
        vstore(sums + r * PANEL + col0, acc[r][0]);
        vstore(sums + r * PANEL + col0 + LANES, acc[r][1]);
    }
}
#endif

/* sums [rows][PANEL] of x's rows row0.. over one fp32 panel (from zero or resumed, as above);
   `rows` <= ROW_BLOCK a literal:
   two passes of half a panel from HALF_FROM rows on, else whole panels, WIDE_ROWS rows at a
   time. Four rows stay on whole panels: where the weights stream from memory (a decode step
   of four requests), two passes of two rows read them faster than two half panels of four
   (benchmarks/cpu_gemv.py --rows, docs/benchmarks.md). */
ALWAYS_INLINE void panel_sums_f32(const float *x, int64_t ldx, const float *panel, int64_t k, int64_t row0,
                                  const int rows, float *sums, const int resume, const float *ahead) {
#if WIDE_ROWS < ROW_BLOCK
    if (rows >= HALF_FROM) {
        half_sums_f32(x, ldx, panel, k, row0, rows, 0, sums, resume, ahead);
        half_sums_f32(x, ldx, panel, k, row0, rows, PANEL / 2, sums, resume, ahead);
        return;
    }
#endif
    for (int r0 = 0; r0 < rows; r0 += WIDE_ROWS)
        wide_sums_f32(x, ldx, panel, k, row0 + r0, rows - r0 < WIDE_ROWS ? rows - r0 : WIDE_ROWS, sums + r0 * PANEL,
                      resume, r0 == 0 ? ahead : NULL);
}

#endif
