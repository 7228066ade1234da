/* bf16 linear layers on the CPU's matrix unit (Intel AMX): y[M, N] = x[M, K] @ W[N, K]^T (+ bias).

   The weight is packed once (pack_weight_bf16) into panels of PANEL = 32 output columns,
       packed[panel][k_pair][column][2]      (bf16; K padded to a multiple of 32, N to one of 32,
                                              with zeros)
   which is the pair-interleaved layout a B tile wants: 16 k pairs of 16 columns are 16 rows of
   64 bytes, row stride PANEL * 4 bytes. x is copied into a zero-padded [M16, K32] buffer, so
   every tile is whole. Each thread takes whole panels; per block of 16 rows it sums two
   16 x 16 fp32 C tiles over K (tdpbf16ps: C += A[16, 32] . B[16 pairs, 16, 2]; two blocks of
   rows share each B tile when there are more) and rounds once to bf16, bias added in fp32
   first, as oneDNN's bf16 linear does: only the order of the fp32 sum differs. A SwiGLU
   gate/up weight packed with 16 gate and their 16 up columns per panel gets silu(gate) * up
   written instead (linear_swiglu_bf16).

   Why not oneDNN: at decode, the rows are few and every weight byte is read once per step.
   The matrix unit makes the arithmetic nearly free, so the product should run at memory
   speed, and oneDNN's small-M path also costs ~40 us of fixed work per call, ~120 calls a step
   (benchmarks/cpu_kernels.py).

   Built only where the compiler targets AMX-BF16; elsewhere amx_supported() returns 0 and
   the engine keeps oneDNN. amx_init() asks Linux for the tile state once per process. */

#define _GNU_SOURCE /* syscall() under -std=c11 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define PANEL 32  /* output columns per panel: two C tiles */
#define K_BLOCK 32 /* bf16 of K per A tile row (64 bytes) */
#define M_BLOCK 16 /* rows per tile */

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include "amx.h"

/* Tile registers (the intrinsics take literals). */
#define TILE_C0 0
#define TILE_C1 1
#define TILE_A 2
#define TILE_B0 3
#define TILE_B1 4
#define TILE_C2 5
#define TILE_C3 6
#define TILE_A2 7

int amx_supported(void) { return 1; }

/* 0 when this process may use the tile registers (Linux grants them per process, on request). */
int amx_init(void) { return amx_request_tiles(); }

static inline int64_t padded(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

int64_t packed_size_bf16(int64_t n, int64_t k) { return padded(n, PANEL) * padded(k, K_BLOCK); }

/* weight [n, k] (row stride ldw) -> packed (packed_size_bf16(n, k) elements). */
void pack_weight_bf16(const bf16 *weight, int64_t ldw, bf16 *packed, int64_t n, int64_t k, int threads) {
    const int64_t k_pairs = padded(k, K_BLOCK) / 2, panels = padded(n, PANEL) / PANEL;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        bf16 *out = packed + p * k_pairs * PANEL * 2;
        for (int64_t kp = 0; kp < k_pairs; kp++)
            for (int64_t c = 0; c < PANEL; c++)
                for (int64_t half = 0; half < 2; half++) {
                    const int64_t row = p * PANEL + c, col = 2 * kp + half;
                    out[(kp * PANEL + c) * 2 + half] = (row < n && col < k) ? weight[row * ldw + col] : 0;
                }
    }
}

/* The tile registers are not renamed, so a tile load waits for the product that last read its
   register: the weight stream must come from cache. Panels are contiguous, so prefetching
   PREFETCH_BLOCKS K blocks ahead (2 KB each) runs into the next panel as well. */
#define PREFETCH_BLOCKS 8

static inline void prefetch_block(const bf16 *block) {
    for (int line = 0; line < K_BLOCK * PANEL * (int)sizeof(bf16) / 64; line++)
        _mm_prefetch((const char *)block + 64 * line, _MM_HINT_T0);
}

/* 16 rows x 16 columns of fp32 sums (row stride PANEL) + bias -> out columns [col, col + 16),
   masked past n. */
static inline void store_rows(const float *sums, int64_t rows, const bf16 *bias, bf16 *out, int64_t ldo,
                              int64_t col, int64_t n) {
    const __mmask16 mask = col + 16 <= n ? (__mmask16)0xffff : (__mmask16)((1u << (n - col)) - 1);
    const __m512 bias_lanes = bias ? bf16x16_to_float(_mm256_maskz_loadu_epi16(mask, bias + col)) : _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; r++) {
        const __m512 row = _mm512_add_ps(_mm512_loadu_ps(sums + r * PANEL), bias_lanes);
        _mm256_mask_storeu_epi16(out + r * ldo + col, mask, (__m256i)_mm512_cvtneps_pbh(row));
    }
}

/* Where a block's sums go. Plain: columns [col0, col0 + 32) of out [m, n], + bias [n].
   SwiGLU (gated): the panel holds 16 gate columns then the 16 matching up columns, and
   out [m, inter] gets silu(gate) * up at [col0 / 2, col0 / 2 + 16); bias is [gate | up], [2 inter]. */
struct epilogue {
    const bf16 *bias;
    bf16 *out;
    int64_t ldo, n, inter;
};

/* exp_approx (bf16.h) on 16 lanes, the same operations in the same order. */
static inline __m512 exp_approx16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f))),
                                   _mm512_mul_ps(n, _mm512_set1_ps(1.42860682030941723e-6f)));
    const float coefficients[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    __m512 p = _mm512_set1_ps(coefficients[0]);
    for (int i = 1; i < 7; i++) p = _mm512_add_ps(_mm512_set1_ps(coefficients[i]), _mm512_mul_ps(r, p));
    const __m512i two_to_n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(two_to_n));
}

static inline __m512 round_to_bf16(__m512 x) { return bf16x16_to_float((__m256i)_mm512_cvtneps_pbh(x)); }

static inline void store_swiglu_rows(const float *sums, int64_t rows, const struct epilogue *e, bf16 *out,
                                     int64_t col) {
    const __m512 gate_bias = e->bias ? bf16x16_to_float(_mm256_loadu_si256((const __m256i *)(e->bias + col)))
                                     : _mm512_setzero_ps();
    const __m512 up_bias = e->bias ? bf16x16_to_float(_mm256_loadu_si256((const __m256i *)(e->bias + e->inter + col)))
                                   : _mm512_setzero_ps();
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t r = 0; r < rows; r++) { /* rounded where the linear, silu and product round */
        const __m512 gate = round_to_bf16(_mm512_add_ps(_mm512_loadu_ps(sums + r * PANEL), gate_bias));
        const __m512 up = round_to_bf16(_mm512_add_ps(_mm512_loadu_ps(sums + r * PANEL + 16), up_bias));
        const __m512 denominator = _mm512_add_ps(one, exp_approx16(_mm512_sub_ps(_mm512_setzero_ps(), gate)));
        const __m512 silu = round_to_bf16(_mm512_div_ps(gate, denominator));
        _mm256_storeu_si256((__m256i *)(out + r * e->ldo + col), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(silu, up)));
    }
}

/* One block of sums [16, PANEL] (row stride PANEL) -> its first min(rows, 16) rows, from row0. */
ALWAYS_INLINE void store_block(const float *sums, int64_t rows, int64_t row0, int64_t col0,
                               const struct epilogue *e, const int swiglu) {
    rows = rows < M_BLOCK ? rows : M_BLOCK;
    bf16 *out = e->out + row0 * e->ldo;
    if (swiglu) {
        store_swiglu_rows(sums, rows, e, out, col0 / 2);
        return;
    }
    store_rows(sums, rows, e->bias, out, e->ldo, col0, e->n);
    if (col0 + 16 < e->n) store_rows(sums + 16, rows, e->bias, out, e->ldo, col0 + 16, e->n);
}

/* x [m, k] bf16 (row stride ldx) @ packed weight [n, k] -> the epilogue. Returns 0, or -1 when
   the padded copy of x cannot be allocated. */
ALWAYS_INLINE int linear_tiles(const bf16 *x, int64_t ldx, const bf16 *packed, int64_t m, int64_t n, int64_t k,
                               int threads, const struct epilogue *e, const int swiglu) {
    const int64_t k_padded = padded(k, K_BLOCK), m_padded = padded(m, M_BLOCK);
    const int64_t panels = padded(n, PANEL) / PANEL, panel_elems = k_padded * PANEL;
    bf16 *x_padded = aligned_alloc(64, (size_t)(m_padded * k_padded) * sizeof(bf16));
    if (!x_padded) return -1;
    for (int64_t r = 0; r < m_padded; r++) {
        bf16 *row = x_padded + r * k_padded;
        const int64_t copied = r < m ? k : 0;
        if (copied) memcpy(row, x + r * ldx, (size_t)copied * sizeof(bf16));
        memset(row + copied, 0, (size_t)(k_padded - copied) * sizeof(bf16));
    }
#pragma omp parallel num_threads(threads)
    {
        amx_configure_tiles();
        float sums[M_BLOCK * PANEL] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const bf16 *panel = packed + p * panel_elems;
            const int64_t col0 = p * PANEL;
            for (int64_t row0 = 0; row0 < m; row0 += 2 * M_BLOCK) {
                const bf16 *a_rows = x_padded + row0 * k_padded;
                const int two = row0 + M_BLOCK < m; /* a second block of rows shares each B tile */
                _tile_zero(TILE_C0);
                _tile_zero(TILE_C1);
                if (two) {
                    _tile_zero(TILE_C2);
                    _tile_zero(TILE_C3);
                }
                for (int64_t k0 = 0; k0 < k_padded; k0 += K_BLOCK) {
                    const bf16 *w = panel + (k0 / 2) * PANEL * 2;
                    if (row0 == 0) prefetch_block(w + PREFETCH_BLOCKS * K_BLOCK * PANEL);
                    _tile_loadd(TILE_B0, w, PANEL * 2 * sizeof(bf16));
                    _tile_loadd(TILE_B1, w + 32, PANEL * 2 * sizeof(bf16));
                    _tile_loadd(TILE_A, a_rows + k0, k_padded * sizeof(bf16));
                    _tile_dpbf16ps(TILE_C0, TILE_A, TILE_B0);
                    _tile_dpbf16ps(TILE_C1, TILE_A, TILE_B1);
                    if (two) {
                        _tile_loadd(TILE_A2, a_rows + M_BLOCK * k_padded + k0, k_padded * sizeof(bf16));
                        _tile_dpbf16ps(TILE_C2, TILE_A2, TILE_B0);
                        _tile_dpbf16ps(TILE_C3, TILE_A2, TILE_B1);
                    }
                }
                _tile_stored(TILE_C0, sums, PANEL * sizeof(float));
                _tile_stored(TILE_C1, sums + 16, PANEL * sizeof(float));
                store_block(sums, m - row0, row0, col0, e, swiglu);
                if (two) {
                    _tile_stored(TILE_C2, sums, PANEL * sizeof(float));
                    _tile_stored(TILE_C3, sums + 16, PANEL * sizeof(float));
                    store_block(sums, m - row0 - M_BLOCK, row0 + M_BLOCK, col0, e, swiglu);
                }
            }
        }
        _tile_release();
    }
    free(x_padded);
    return 0;
}

/* out [m, n] (row stride ldo) = x [m, k] (row stride ldx) @ W^T + bias ([n] or NULL). */
int linear_bf16(const void *x, int64_t ldx, const void *packed, const void *bias, void *out, int64_t ldo,
                int64_t m, int64_t n, int64_t k, int threads) { /* kernel_signatures.h's linear_fn */
    const struct epilogue e = {bias, out, ldo, n, 0};
    return linear_tiles(x, ldx, packed, m, n, k, threads, &e, 0);
}

/* out [m, inter] (row stride ldo) = silu(gate) * up of x @ W^T + bias, for W = [gate | up]
   [2 inter, k] packed gated (pack_weight_bf16 of its rows interleaved 16 gate, 16 up, ...;
   inter a multiple of 16), bias [2 inter] in the original [gate | up] order or NULL. */
int linear_swiglu_bf16(const void *x, int64_t ldx, const void *packed, const void *bias, void *out,
                       int64_t ldo, int64_t m, int64_t inter, int64_t k, int threads) {
    const struct epilogue e = {bias, out, ldo, 2 * inter, inter};
    return linear_tiles(x, ldx, packed, m, 2 * inter, k, threads, &e, 1);
}

#else

int amx_supported(void) { return 0; }

#endif
