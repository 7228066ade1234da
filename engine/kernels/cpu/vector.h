/* The vector type of the build's ISA (isa.py picks the target) and the fp32 product of one
   weight panel, shared by gemv.c (packed fp32 weights) and quant_gemm.c (GGUF blocks
   dequantised into a panel), so that both sum the same products in the same order.

   A panel is PANEL = 32 output features of a weight laid out [k][PANEL] (feature c of the
   panel at column c). Its product keeps ROW_BLOCK input rows x 32 columns of fp32 sums in
   vector registers; per k it loads the panel's 32 weights once and multiplies them into every
   row's sums: the sums run over k in order, one multiply-add per weight (fused where the
   ISA has FMA), from zero.

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
typedef __m512 vfloat;
static inline vfloat vzero(void) { return _mm512_setzero_ps(); }
static inline vfloat vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vfloat v) { _mm512_storeu_ps(p, v); }
static inline vfloat vset1(float x) { return _mm512_set1_ps(x); }
static inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
#define LANES 8
#define ROW_BLOCK 2 /* 8 sums of 8 lanes + 4 weight vectors + a broadcast, of 16 registers */
typedef __m256 vfloat;
static inline vfloat vzero(void) { return _mm256_setzero_ps(); }
static inline vfloat vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vfloat v) { _mm256_storeu_ps(p, v); }
static inline vfloat vset1(float x) { return _mm256_set1_ps(x); }
static inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm256_fmadd_ps(a, b, c); }
#else
#define LANES 4
#define ROW_BLOCK 2
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

/* sums [rows][PANEL] of x's rows row0.. (row stride ldx) over one fp32 panel [k][PANEL], k in
   order; `rows` <= ROW_BLOCK is a literal at each call, so that the sums stay in registers. */
ALWAYS_INLINE void panel_sums_f32(const float *x, int64_t ldx, const float *panel, int64_t k, int64_t row0,
                                  const int rows, float *sums) {
    vfloat acc[ROW_BLOCK][VECTORS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < VECTORS; v++) acc[r][v] = vzero();
    const float *w = panel, *xs = x + row0 * ldx;
    for (int64_t kk = 0; kk < k; kk++, w += PANEL) {
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

#endif
