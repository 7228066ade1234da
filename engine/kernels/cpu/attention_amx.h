/* One attention task of attention.c on the CPU's matrix unit (Intel AMX), for bf16 caches with
   head_dim 64 or 128 and at most 16 query rows per task.

   The generic task scores a key against each query row with a dot product and a horizontal
   sum, then adds the value row into each row's sums: ~70 cycles a key for 3 rows. Here both
   products are tile products over blocks of keys:
     scores:  C[16 keys, 16 rows] += K[16 keys, 32 dims] . Q^T[16 dim pairs, 16 rows, 2]
              (Q^T packed once per task and held in tiles; K rows gathered through the slot
              table into a contiguous block);
     output:  C[16 rows, 16 dims] += P[16 rows, 32 keys] . V[16 key pairs, 16 dims, 2]
              (P the softmax probabilities rounded to bf16, as torch's CPU flash attention
              rounds them for its value product; V rows gathered and pair-interleaved).
   The softmax between them is the generic task's, in fp32, on scores scaled after the
   product. Output rounds once to bf16. */

#ifndef DSPARK_CPU_ATTENTION_AMX_H
#define DSPARK_CPU_ATTENTION_AMX_H

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BW__)
#define ATTENTION_AMX 1
#include "amx.h"

#define AMX_ROWS 16      /* query rows per task, keys per score block */
#define AMX_KEY_PAIRS 16 /* key pairs per value block (32 keys) */
#define AMX_DIM_CHUNK 64 /* output dims per value pass: four 16-column C tiles */
/* Rows are gathered a block at a time: ask for the rows this many keys ahead meanwhile. */
#define AMX_PREFETCH_AHEAD 32

/* Tile registers (the intrinsics take literals). Scores: C 0, K 1, Q^T 2 .. 5 (one per 32
   dims). Output: P 1, V 0, C 4 .. 7 (one per 16 dims of the chunk). */
#define T_SCORES 0
#define T_KEYS 1
#define T_QUERY0 2
#define T_QUERY1 3
#define T_QUERY2 4
#define T_QUERY3 5
#define T_PROBS 1
#define T_VALUES 0
#define T_OUT0 4
#define T_OUT1 5
#define T_OUT2 6
#define T_OUT3 7

static int amx_ready;

/* Asks Linux for the tile state (granted per process); 1 when the AMX task may run. */
int attention_amx_init(void) {
    amx_ready = amx_request_tiles() == 0;
    return amx_ready;
}

/* The four permutations that interleave two 32-lane bf16 vectors a, b (dims 0-31) into
   (a[d], b[d]) pairs, 16 dims per output vector; dims 32-63 use the same on the upper halves. */
struct interleave { __m512i index[2]; };

static inline struct interleave interleave_indices(void) {
    struct interleave result;
    for (int part = 0; part < 2; part++) {
        uint16_t index[32];
        for (int i = 0; i < 16; i++) {
            index[2 * i] = (uint16_t)(16 * part + i);          /* lane of a */
            index[2 * i + 1] = (uint16_t)(32 + 16 * part + i); /* lane of b (bit 5 picks b) */
        }
        result.index[part] = _mm512_loadu_si512(index);
    }
    return result;
}

/* Rows a and b (AMX_DIM_CHUNK bf16 each, NULL = zeros) -> out[AMX_DIM_CHUNK][2] = (a[d], b[d]). */
static inline void interleave_pair(const bf16 *a, const bf16 *b, bf16 *out, const struct interleave *how) {
    for (int half = 0; half < 2; half++) { /* dims [32 half, 32 half + 32) */
        const __m512i va = a ? _mm512_loadu_si512(a + 32 * half) : _mm512_setzero_si512();
        const __m512i vb = b ? _mm512_loadu_si512(b + 32 * half) : _mm512_setzero_si512();
        _mm512_storeu_si512(out + 64 * half, _mm512_permutex2var_epi16(va, how->index[0], vb));
        _mm512_storeu_si512(out + 64 * half + 32, _mm512_permutex2var_epi16(va, how->index[1], vb));
    }
}

/* The task of attention_task (same arguments, bf16 only) with rows = n * group <= 16 and
   D in {64, 128}, a literal at each call (so the row copies are a few vector moves);
   `scores` is the task's [rows, kv_len] fp32 workspace. */
ALWAYS_INLINE void attention_task_amx(const void *q_any, int64_t q_stride_t, int64_t q_stride_h, const void *k_any,
                                      const void *v_any, int64_t kv_stride_s, int64_t kv_stride_h,
                                      const int32_t *slots, int64_t seq_len, int64_t prefix, int64_t first_token,
                                      int64_t j0, int64_t n, int64_t kv_head, int64_t group, const int64_t D,
                                      int causal, float scale, void *out_any, int64_t out_stride_t,
                                      int64_t out_stride_h, float *scores) {
    const bf16 *q = q_any, *k_cache = k_any, *v_cache = v_any;
    const int64_t rows = n * group, head_offset = kv_head * kv_stride_h, dim_blocks = D / 32;
    int64_t kv_end = causal ? prefix + j0 + n : seq_len;
    if (kv_end > seq_len) kv_end = seq_len;
    bf16 query_t[4][16][16][2] __attribute__((aligned(64))); /* [dim block][dim pair][row][2] */
    bf16 keys[AMX_ROWS][128] __attribute__((aligned(64)));
    bf16 probs[AMX_ROWS][2 * AMX_KEY_PAIRS] __attribute__((aligned(64)));
    bf16 values[AMX_KEY_PAIRS][AMX_DIM_CHUNK][2] __attribute__((aligned(64)));
    float key_scores[AMX_ROWS][AMX_ROWS] __attribute__((aligned(64))); /* [key][row] of one block */
    float acc[AMX_ROWS][128] __attribute__((aligned(64)));
    const struct interleave how = interleave_indices();
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i key_offsets = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(AMX_ROWS)); /* key i's row, in floats */
    memset(query_t, 0, sizeof(query_t));
    memset(probs, 0, sizeof(probs));
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *row = q + query_row_offset(first_token, j0, r, group, kv_head, q_stride_t, q_stride_h);
        for (int64_t d = 0; d < D; d++) query_t[d / 32][(d % 32) / 2][r][d % 2] = row[d];
    }
    amx_configure_tiles();
    _tile_loadd(T_QUERY0, query_t[0], 64);
    _tile_loadd(T_QUERY1, query_t[1], 64);
    if (dim_blocks > 2) {
        _tile_loadd(T_QUERY2, query_t[2], 64);
        _tile_loadd(T_QUERY3, query_t[3], 64);
    }
    /* Scores, 16 keys at a time: C[key, row] = K . Q^T, scaled into scores[row, key]. */
    for (int64_t k0 = 0; k0 < kv_end; k0 += AMX_ROWS) {
        const int64_t count = kv_end - k0 < AMX_ROWS ? kv_end - k0 : AMX_ROWS;
        for (int64_t i = 0; i < AMX_ROWS; i++) {
            if (i < count) {
                if (k0 + i + AMX_PREFETCH_AHEAD < kv_end)
                    prefetch_row(k_cache + slots[k0 + i + AMX_PREFETCH_AHEAD] * kv_stride_s + head_offset, D * 2);
                memcpy(keys[i], k_cache + slots[k0 + i] * kv_stride_s + head_offset, (size_t)D * sizeof(bf16));
            } else {
                memset(keys[i], 0, (size_t)D * sizeof(bf16));
            }
        }
        _tile_zero(T_SCORES);
        for (int64_t b = 0; b < dim_blocks; b++) {
            _tile_loadd(T_KEYS, &keys[0][32 * b], sizeof(keys[0]));
            switch (b) { /* Q^T stays in its tiles for the whole task */
                case 0: _tile_dpbf16ps(T_SCORES, T_KEYS, T_QUERY0); break;
                case 1: _tile_dpbf16ps(T_SCORES, T_KEYS, T_QUERY1); break;
                case 2: _tile_dpbf16ps(T_SCORES, T_KEYS, T_QUERY2); break;
                default: _tile_dpbf16ps(T_SCORES, T_KEYS, T_QUERY3); break;
            }
        }
        _tile_stored(T_SCORES, key_scores, sizeof(key_scores[0]));
        const __mmask16 valid = (__mmask16)((1u << count) - 1);
        for (int64_t r = 0; r < rows; r++) { /* column r: row r's scores of these keys */
            const __m512 column = _mm512_i32gather_ps(key_offsets, &key_scores[0][r], sizeof(float));
            _mm512_mask_storeu_ps(scores + r * kv_end + k0, valid, _mm512_mul_ps(column, _mm512_set1_ps(scale)));
        }
    }
    softmax_rows(scores, rows, kv_end, causal, prefix, j0, group);
    /* Output, AMX_DIM_CHUNK dims at a time: C[row, dim] = P . V over blocks of 32 keys. */
    for (int64_t d0 = 0; d0 < D; d0 += AMX_DIM_CHUNK) {
        _tile_zero(T_OUT0);
        _tile_zero(T_OUT1);
        _tile_zero(T_OUT2);
        _tile_zero(T_OUT3);
        for (int64_t k0 = 0; k0 < kv_end; k0 += 2 * AMX_KEY_PAIRS) {
            const int64_t count = kv_end - k0 < 2 * AMX_KEY_PAIRS ? kv_end - k0 : 2 * AMX_KEY_PAIRS;
            const __mmask16 low = count >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << count) - 1);
            const __mmask16 high =
                count >= 32 ? (__mmask16)0xffff : count > 16 ? (__mmask16)((1u << (count - 16)) - 1) : 0;
            for (int64_t r = 0; r < rows; r++) { /* these keys' probabilities in bf16, zero past count */
                const float *row = scores + r * kv_end + k0;
                const __m512 first = _mm512_maskz_loadu_ps(low, row), second = _mm512_maskz_loadu_ps(high, row + 16);
                _mm256_storeu_si256((__m256i *)&probs[r][0], (__m256i)_mm512_cvtneps_pbh(first));
                _mm256_storeu_si256((__m256i *)&probs[r][16], (__m256i)_mm512_cvtneps_pbh(second));
            }
            for (int64_t i = 0; i < 2 * AMX_KEY_PAIRS && k0 + i + AMX_PREFETCH_AHEAD < kv_end; i++)
                prefetch_row(v_cache + slots[k0 + i + AMX_PREFETCH_AHEAD] * kv_stride_s + head_offset + d0,
                             AMX_DIM_CHUNK * 2);
            for (int64_t pair = 0; pair < AMX_KEY_PAIRS; pair++) {
                const int64_t i = 2 * pair;
                const bf16 *a = i < count ? v_cache + slots[k0 + i] * kv_stride_s + head_offset + d0 : NULL;
                const bf16 *b = i + 1 < count ? v_cache + slots[k0 + i + 1] * kv_stride_s + head_offset + d0 : NULL;
                interleave_pair(a, b, values[pair][0], &how);
            }
            _tile_loadd(T_PROBS, probs, sizeof(probs[0]));
            _tile_loadd(T_VALUES, &values[0][0][0], sizeof(values[0]));
            _tile_dpbf16ps(T_OUT0, T_PROBS, T_VALUES);
            _tile_loadd(T_VALUES, &values[0][16][0], sizeof(values[0]));
            _tile_dpbf16ps(T_OUT1, T_PROBS, T_VALUES);
            _tile_loadd(T_VALUES, &values[0][32][0], sizeof(values[0]));
            _tile_dpbf16ps(T_OUT2, T_PROBS, T_VALUES);
            _tile_loadd(T_VALUES, &values[0][48][0], sizeof(values[0]));
            _tile_dpbf16ps(T_OUT3, T_PROBS, T_VALUES);
        }
        _tile_stored(T_OUT0, &acc[0][d0], sizeof(acc[0]));
        _tile_stored(T_OUT1, &acc[0][d0 + 16], sizeof(acc[0]));
        _tile_stored(T_OUT2, &acc[0][d0 + 32], sizeof(acc[0]));
        _tile_stored(T_OUT3, &acc[0][d0 + 48], sizeof(acc[0]));
    }
    _tile_release();
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = query_row_offset(first_token, j0, r, group, kv_head, out_stride_t, out_stride_h);
        bf16 *row = (bf16 *)out_any + o;
        for (int64_t d = 0; d < D; d++) row[d] = float_to_bf16(acc[r][d]);
    }
}

#else
#define ATTENTION_AMX 0
int attention_amx_init(void) { return 0; }
#endif

#endif
