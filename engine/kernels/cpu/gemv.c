/* Linear layers on any CPU's vector unit, for the few rows of decode and verify (batch-1 GEMV
   and small-M GEMM; any M is correct): y[M, N] = x[M, K] @ W[N, K]^T (+ bias), fp32 or bf16.

   The weight is packed once into panels of PANEL = 32 output columns, so that each thread
   streams whole panels, contiguous in memory, and each weight byte is read once per call:
       fp32: packed[panel][k][column]              [N / 32, K, 32]
       bf16: packed[panel][k_pair][column][2]      [N / 32, K / 2, 32, 2]  (gemm.c's AMX layout)
   A panel's product keeps a block of rows x 32 (or 16) columns of fp32 sums in vector
   registers (vector.h); per k (per k pair in bf16) it loads the panel's weights once and
   multiplies them into every row's sums. The sums run over k in order, one fused multiply-add
   per weight (a pair per vdpbf16ps with AVX512-BF16), and round once to the output dtype,
   bias added in fp32 first.
   A SwiGLU [gate | up] weight packed with 16 gate and their 16 up columns per panel (gemv.py)
   gets silu(gate) * up written instead, rounded where the separate linear, silu and product
   round (elementwise.c).

   The vector width comes from the build's target (isa.py): AVX-512 (16 lanes), AVX2 + FMA (8),
   or the portable path, GCC/Clang vector extensions of 4 lanes that compile to SSE2 on any
   x86-64 and to NEON on ARM64. bf16 weights are widened to fp32 by a shift (the even k of a
   pair) and a mask (the odd one) where the CPU has no bf16 dot product. */

#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "vector.h" /* PANEL, LANES, ROW_BLOCK, vfloat and panel_sums_f32, shared with quant_gemm.c */

/* 16 (AVX-512; 8 AVX2, 4 portable) bf16 pairs (k even, k odd) -> the even and the odd values as fp32. */
#if defined(__AVX512F__)
static inline void vwiden_pairs(const bf16 *p, vfloat *even, vfloat *odd) {
    const __m512i v = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}
#define ISA_NAME (BF16_DOT ? "avx512bf16" : "avx512")
#elif defined(__AVX2__) && defined(__FMA__)
static inline void vwiden_pairs(const bf16 *p, vfloat *even, vfloat *odd) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}
#define ISA_NAME "avx2"
#else
typedef uint32_t vuint __attribute__((vector_size(16)));
static inline void vwiden_pairs(const bf16 *p, vfloat *even, vfloat *odd) {
    vuint v;
    memcpy(&v, p, sizeof(v));
    *even = (vfloat)(v << 16);
    *odd = (vfloat)(v & 0xffff0000u);
}
#define ISA_NAME "portable"
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define BF16_DOT 1 /* bf16 activations x bf16 weights: vdpbf16ps, a k pair per instruction */
#else
#define BF16_DOT 0
#endif

/* The vector path this library was built with. */
const char *gemv_isa(void) { return ISA_NAME; }

static inline int64_t panels_of(int64_t n) { return (n + PANEL - 1) / PANEL; }

/* weight [n, k] fp32 (row stride ldw) -> packed [panels_of(n), k, PANEL], zero past n. */
void gemv_pack_f32(const float *weight, int64_t ldw, float *packed, int64_t n, int64_t k, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < panels_of(n); p++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t c = 0; c < PANEL; c++) {
                const int64_t row = p * PANEL + c;
                packed[(p * k + kk) * PANEL + c] = row < n ? weight[row * ldw + kk] : 0.0f;
            }
}

/* weight [n, k] bf16 (row stride ldw; k even) -> packed [panels_of(n), k / 2, PANEL, 2]. */
void gemv_pack_bf16(const bf16 *weight, int64_t ldw, bf16 *packed, int64_t n, int64_t k, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < panels_of(n); p++)
        for (int64_t kp = 0; kp < k / 2; kp++)
            for (int64_t c = 0; c < PANEL; c++)
                for (int64_t half = 0; half < 2; half++) {
                    const int64_t row = p * PANEL + c;
                    packed[((p * k / 2 + kp) * PANEL + c) * 2 + half] = row < n ? weight[row * ldw + 2 * kp + half] : 0;
                }
}

/* sums [rows][PANEL] of bf16 rows row0.. over one bf16 panel, whole panels, `rows` <= WIDE_ROWS
   a literal at each call, so that the sums stay in registers; from zero or (resume) from the
   sums already there, as vector.h's fp32 product. */
ALWAYS_INLINE void panel_sums_bf16(const bf16 *x, int64_t ldx, const bf16 *panel, int64_t k, int64_t row0,
                                   const int rows, float *sums, const int resume) {
    vfloat acc[WIDE_ROWS][VECTORS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < VECTORS; v++) acc[r][v] = resume ? vload(sums + r * PANEL + v * LANES) : vzero();
    const bf16 *w = panel, *xs = x + row0 * ldx;
    for (int64_t kk = 0; kk < k; kk += 2, w += 2 * PANEL) {
#if BF16_DOT
        __m512bh wv[VECTORS];
        for (int v = 0; v < VECTORS; v++) wv[v] = (__m512bh)_mm512_loadu_si512(w + 2 * v * LANES);
        for (int r = 0; r < rows; r++) {
            int32_t pair;
            memcpy(&pair, xs + r * ldx + kk, sizeof(pair));
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            for (int v = 0; v < VECTORS; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xv, wv[v]);
        }
#else
        vfloat even[VECTORS], odd[VECTORS];
        for (int v = 0; v < VECTORS; v++) vwiden_pairs(w + 2 * v * LANES, &even[v], &odd[v]);
        for (int r = 0; r < rows; r++) {
            const vfloat x0 = vset1(bf16_to_float(xs[r * ldx + kk]));
            const vfloat x1 = vset1(bf16_to_float(xs[r * ldx + kk + 1]));
            for (int v = 0; v < VECTORS; v++) acc[r][v] = vfma(x1, odd[v], vfma(x0, even[v], acc[r][v]));
        }
#endif
    }
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < VECTORS; v++) vstore(sums + r * PANEL + v * LANES, acc[r][v]);
}

/* sums [rows][PANEL] of rows row0.. over one panel (k in order; from zero, or resumed from the
   sums there), `rows` <= ROW_BLOCK a literal at each call. x rows: fp32 or bf16 (is_bf16, the
   weight's dtype too), row stride ldx. fp32 is vector.h's product, which quant_gemm.c shares;
   bf16 takes WIDE_ROWS rows at a time. */
ALWAYS_INLINE void panel_sums(const void *x, int64_t ldx, const void *panel, int64_t k, int64_t row0, const int rows,
                              float *sums, const int resume, const void *ahead, const int is_bf16) {
    if (!is_bf16) {
        panel_sums_f32(x, ldx, panel, k, row0, rows, sums, resume, ahead);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += WIDE_ROWS)
        panel_sums_bf16(x, ldx, panel, k, row0 + r0, rows - r0 < WIDE_ROWS ? rows - r0 : WIDE_ROWS,
                        sums + r0 * PANEL, resume);
}

/* panel_sums for a row count known only at run time, each count its own unrolled copy. */
ALWAYS_INLINE void block_sums(const void *x, int64_t ldx, const void *panel, int64_t k, int64_t row0, int64_t rows,
                              float *sums, const int resume, const void *ahead, const int is_bf16) {
    switch (rows) {
#define BLOCK_OF(R) \
    case R: panel_sums(x, ldx, panel, k, row0, R, sums, resume, ahead, is_bf16); break;
        FOR_EACH_BLOCK_ROWS(BLOCK_OF)
#undef BLOCK_OF
        default: break;
    }
}

/* Where a panel's sums go. Plain: columns [col0, col0 + 32) of out [m, n] (row stride ldo),
   + bias [n]. SwiGLU: the panel holds 16 gate then their 16 up columns, and out [m, inter]
   gets silu(gate) * up at [col0 / 2, col0 / 2 + 16); bias is [gate | up], [2 inter]. */
struct epilogue {
    const void *bias;
    void *out;
    int64_t ldo, n, inter;
};

ALWAYS_INLINE void store_sums(const float *sums, int rows, int64_t row0, int64_t col0, const struct epilogue *e,
                              const int swiglu, const int is_bf16) {
    for (int r = 0; r < rows; r++) {
        const float *row = sums + r * PANEL;
        const int64_t out_row = (row0 + r) * e->ldo;
        if (swiglu) { /* in branch-free loops of 16, which vectorise (a bias test inside did not) */
            const int64_t col = col0 / 2;
            float gate[PANEL / 2], up[PANEL / 2];
            for (int c = 0; c < PANEL / 2; c++) gate[c] = row[c], up[c] = row[PANEL / 2 + c];
            if (e->bias)
                for (int c = 0; c < PANEL / 2; c++) {
                    gate[c] += load_elem(e->bias, col + c, is_bf16);
                    up[c] += load_elem(e->bias, e->inter + col + c, is_bf16);
                }
            for (int c = 0; c < PANEL / 2; c++) {
                const float g = round_elem(gate[c], is_bf16);
                const float silu = round_elem(g / (1.0f + exp_approx(-g)), is_bf16);
                store_elem(e->out, out_row + col + c, silu * round_elem(up[c], is_bf16), is_bf16);
            }
        } else {
            const int64_t columns = e->n - col0 < PANEL ? e->n - col0 : PANEL;
            for (int64_t c = 0; c < columns; c++) {
                const float bias = e->bias ? load_elem(e->bias, col0 + c, is_bf16) : 0.0f;
                store_elem(e->out, out_row + col0 + c, row[c] + bias, is_bf16);
            }
        }
    }
}

/* One panel's block of `rows` rows (a literal) from row0: sums, then the epilogue. */
ALWAYS_INLINE void panel_block(const void *x, int64_t ldx, const void *panel, int64_t k, int64_t row0,
                               const int rows, int64_t col0, const struct epilogue *e, const int swiglu,
                               const int is_bf16) {
    float sums[ROW_BLOCK * PANEL] __attribute__((aligned(64)));
    panel_sums(x, ldx, panel, k, row0, rows, sums, 0, NULL, is_bf16);
    store_sums(sums, rows, row0, col0, e, swiglu, is_bf16);
}

/* Every row block of a panel, the panel taken in runs of K_RUN k (K_RUN * PANEL weights, 2 KB
   in fp32): each run is read from memory once, by the first block's pass, and from L1 by every
   other pass over it, before the next run. Taken whole instead, a panel (72-192 KB) is read
   from memory by the first block while the cores idle, then from L2 by the others while the
   memory idles, so that a step of 10 rows costs the read plus the multiply-adds where it could
   cost the larger of the two; the first block's pass also prefetches the next run (fp32), so
   that its read overlaps this run's multiply-adds. The sums of all `m` <= RUN_ROWS rows wait
   in L1 between runs; each resumes where it stopped, so the results are those of whole panels
   to the bit. Past three blocks whole panels measured faster (benchmarks/cpu_gemv.py --rows,
   docs/benchmarks.md). */
#define K_RUN 16
#define RUN_ROWS (3 * ROW_BLOCK)
ALWAYS_INLINE void panel_in_runs(const void *x, int64_t ldx, const void *panel, int64_t m, int64_t k, int64_t col0,
                                 const struct epilogue *e, const int swiglu, const int is_bf16) {
    float sums[RUN_ROWS * PANEL] __attribute__((aligned(64)));
    for (int64_t k0 = 0; k0 < k; k0 += K_RUN) {
        const int64_t run = k - k0 < K_RUN ? k - k0 : K_RUN;
        const void *x_run = is_bf16 ? (const void *)((const bf16 *)x + k0) : (const void *)((const float *)x + k0);
        const void *panel_run = is_bf16 ? (const void *)((const bf16 *)panel + k0 * PANEL)
                                        : (const void *)((const float *)panel + k0 * PANEL);
        const void *next_run = k0 + K_RUN < k && !is_bf16 ? (const float *)panel_run + K_RUN * PANEL : NULL;
        for (int64_t row0 = 0; row0 < m; row0 += ROW_BLOCK) {
            const int64_t rows = m - row0 < ROW_BLOCK ? m - row0 : ROW_BLOCK;
            block_sums(x_run, ldx, panel_run, run, row0, rows, sums + row0 * PANEL, k0 > 0, row0 == 0 ? next_run : NULL,
                       is_bf16);
        }
    }
    for (int64_t row0 = 0; row0 < m; row0 += ROW_BLOCK)
        store_sums(sums + row0 * PANEL, (int)(m - row0 < ROW_BLOCK ? m - row0 : ROW_BLOCK), row0, col0, e, swiglu,
                   is_bf16);
}

/* x [m, k] @ packed [n, k]^T -> the epilogue for one block of fp32 rows over fewer than four
   panels per thread (a 576-feature layer on 16 threads has 18 panels, so that whole panels
   leave two threads reading two while fourteen read one): the weight's bytes split evenly,
   each thread a contiguous range of the panels' k rows, so a panel may be begun by one thread
   and finished by the next. Its sums still run over k in order, as a whole panel's: thread t
   first sums the start of the panel its range ends in and publishes those sums, then takes
   its whole panels, then resumes the panel that thread t - 1 began, once t - 1 has
   published (the first thing t - 1 does). Every output is the same sequence of multiply-adds
   as in linear_panels, bit for bit. `threads` <= panels, so a range spans at least one
   panel's rows and a panel is split between two threads at most. */
ALWAYS_INLINE void linear_even_split(const float *x, int64_t ldx, const float *packed, int64_t m, int64_t n, int64_t k,
                                     int threads, const struct epilogue *e, const int swiglu) {
    const int64_t panel_elems = k * PANEL, units = panels_of(n) * k; /* a unit: one k row of one panel */
    float begun[threads][ROW_BLOCK * PANEL]; /* thread t's sums of the start of its last panel */
    int published[threads];
    for (int t = 0; t < threads; t++) published[t] = 0;
#pragma omp parallel num_threads(threads)
    {
        const int count = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t start = units * t / count, end = units * (t + 1) / count;
        const int64_t first = start / k, first_k = start % k; /* first_k > 0: t - 1 began `first` */
        const int64_t last = (end - 1) / k, last_k = end - last * k; /* last_k < k: t + 1 finishes `last` */
        if (last_k < k) {
            block_sums(x, ldx, packed + last * panel_elems, last_k, 0, m, begun[t], 0, NULL, 0);
            __atomic_store_n(&published[t], 1, __ATOMIC_RELEASE);
        }
        for (int64_t p = first_k ? first + 1 : first; p < (last_k < k ? last : last + 1); p++)
            switch (m) {
#define BLOCK_OF(R) \
    case R: panel_block(x, ldx, packed + p * panel_elems, k, 0, R, p * PANEL, e, swiglu, 0); break;
                FOR_EACH_BLOCK_ROWS(BLOCK_OF)
#undef BLOCK_OF
                default: break;
            }
        if (first_k) {
            while (!__atomic_load_n(&published[t - 1], __ATOMIC_ACQUIRE)) {
            }
            block_sums(x + first_k, ldx, packed + first * panel_elems + first_k * PANEL, k - first_k, 0, m, begun[t - 1],
                       1, NULL, 0);
            store_sums(begun[t - 1], (int)m, 0, first * PANEL, e, swiglu, 0);
        }
    }
}

/* x [m, k] @ packed [n, k]^T -> the epilogue, threads taking contiguous runs of panels
   (static split). A panel that more than one pass reads (more rows than WIDE_ROWS) is taken in
   runs of k (above) for at most RUN_ROWS rows where there are panels enough to share out
   four per thread (a 576-feature layer on 16 threads has 18: there, each (panel, block of
   rows) is a task of its own, reading the whole panel, from cache after the first block). */
ALWAYS_INLINE void linear_panels(const void *x, int64_t ldx, const void *packed, int64_t m, int64_t n, int64_t k,
                                 int threads, const struct epilogue *e, const int swiglu, const int is_bf16) {
    const int64_t panels = panels_of(n), panel_elems = k * PANEL;
    if (!is_bf16 && m <= ROW_BLOCK && panels >= threads && panels < 4 * (int64_t)threads && panels % threads) {
        linear_even_split(x, ldx, packed, m, n, k, threads, e, swiglu);
        return;
    }
    const int in_runs = m > WIDE_ROWS && m <= RUN_ROWS && panels >= 4 * (int64_t)threads;
    const int64_t blocks = in_runs ? 1 : (m + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t task = 0; task < panels * blocks; task++) {
        const int64_t p = task / blocks, row0 = (task % blocks) * ROW_BLOCK;
        const void *panel = is_bf16 ? (const void *)((const bf16 *)packed + p * panel_elems)
                                    : (const void *)((const float *)packed + p * panel_elems);
        if (in_runs) {
            panel_in_runs(x, ldx, panel, m, k, p * PANEL, e, swiglu, is_bf16);
            continue;
        }
        switch (m - row0 < ROW_BLOCK ? m - row0 : ROW_BLOCK) { /* each row count its own unrolled copy */
#define BLOCK_OF(R) \
    case R: panel_block(x, ldx, panel, k, row0, R, p * PANEL, e, swiglu, is_bf16); break;
            FOR_EACH_BLOCK_ROWS(BLOCK_OF)
#undef BLOCK_OF
            default: break;
        }
    }
}

/* The exported kernels, per dtype (x, bias and out in the weight's dtype). They share the
   signature of gemm.c's AMX kernels (kernel_signatures.h's linear_fn) and return 0: nothing
   to fail.
     linear:  out [m, n] (row stride ldo) = x [m, k] (row stride ldx) @ W^T + bias ([n] or NULL)
     swiglu:  out [m, inter] = silu(gate) * up of x @ W^T + bias, W = [gate | up] [2 inter, k]
              packed gated (gemv.py), bias [2 inter] in [gate | up] order or NULL. */
#define EXPORT_FOR_DTYPE(SUFFIX, IS_BF16)                                                                          \
    int gemv_linear_##SUFFIX(const void *x, int64_t ldx, const void *packed, const void *bias, void *out,         \
                             int64_t ldo, int64_t m, int64_t n, int64_t k, int threads) {                        \
        const struct epilogue e = {bias, out, ldo, n, 0};                                                        \
        linear_panels(x, ldx, packed, m, n, k, threads, &e, 0, IS_BF16);                                         \
        return 0;                                                                                                 \
    }                                                                                                             \
    int gemv_swiglu_##SUFFIX(const void *x, int64_t ldx, const void *packed, const void *bias, void *out,         \
                             int64_t ldo, int64_t m, int64_t inter, int64_t k, int threads) {                    \
        const struct epilogue e = {bias, out, ldo, 2 * inter, inter};                                            \
        linear_panels(x, ldx, packed, m, 2 * inter, k, threads, &e, 1, IS_BF16);                                 \
        return 0;                                                                                                 \
    }

EXPORT_FOR_DTYPE(f32, 0)
EXPORT_FOR_DTYPE(bf16, 1)
