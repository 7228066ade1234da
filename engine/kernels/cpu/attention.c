/* Paged attention on CPU, reading K/V in place through the request -> slot table.

   The torch path gathers every request's keys into a padded [B, L, Hkv, D] copy per layer and
   then calls SDPA; for a few query rows per request (decode, DSpark verify and drafter blocks)
   both steps cost far more than the arithmetic. Here one task is (request, kv head, block of
   up to QUERY_BLOCK query positions): it reads each visible key row once from the cache,
   scores it against the task's G * n query rows (the G query heads sharing the kv head, for
   n positions), takes a two-pass softmax in fp32, and accumulates the value rows in fp32.

   Layouts (strides in elements):
     q        [T, Hq, D]            q[t, h, :] at q + t * q_stride_t + h * q_stride_h
     k/v      [num_slots + 1, Hkv, D]  row at cache + slot * kv_stride_s + h * kv_stride_h
     out      [T, Hq, D]            like q, with out strides
     req_to_token [R, C] int32; req_rows [B] int64; seq_lens, extend_lens, q_start [B] int32
   Request b's queries are rows q_start[b] ... q_start[b] + extend_lens[b] - 1 at positions
   seq_lens[b] - extend_lens[b] + j. Causal: query j sees keys [0, seq_lens[b] - extend_lens[b]
   + j]; otherwise all keys [0, seq_lens[b]). A request with seq_len 0 writes zeros.

   kv_len: the host's bound on seq_lens (and at most the table's width); the workspace is sized
   for it, and a longer seq_len is read as kv_len.
   workspace: num_threads * workspace_floats(kv_len, ...) floats, one slice per OpenMP thread.
   Mirrors engine.attention.torch_backend.paged_attention_torch (the reference in tests). */

#define _GNU_SOURCE /* syscall() under -std=c11, for the tile state (attention_amx.h) */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define QUERY_BLOCK 8
/* Keys are rows scattered over the cache: ask for the row this many keys ahead, so that
   several cache misses are in flight instead of one at a time. */
#define PREFETCH_AHEAD 8

static inline void prefetch_row(const void *row, int64_t bytes) {
    for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch((const char *)row + offset);
}

ALWAYS_INLINE const void *element_address(const void *base, int64_t i, const int is_bf16) {
    return is_bf16 ? (const void *)((const bf16 *)base + i) : (const void *)((const float *)base + i);
}

/* Element offset of query row r of a task (position j0 + r / group, head kv_head * group +
   r % group) in a [T, Hq, D] tensor with the given strides. */
ALWAYS_INLINE int64_t query_row_offset(int64_t first_token, int64_t j0, int64_t r, int64_t group, int64_t kv_head,
                                       int64_t stride_t, int64_t stride_h) {
    return (first_token + j0 + r / group) * stride_t + (kv_head * group + r % group) * stride_h;
}

/* Key j's row of `cache` (head_offset picks the task's kv head) as fp32 into `row`, asking
   for the row PREFETCH_AHEAD keys on meanwhile. */
ALWAYS_INLINE void load_kv_row(const void *cache, const int32_t *slots, int64_t j, int64_t kv_end,
                               int64_t kv_stride_s, int64_t head_offset, const int64_t D, float *row,
                               const int is_bf16) {
    if (j + PREFETCH_AHEAD < kv_end)
        prefetch_row(element_address(cache, slots[j + PREFETCH_AHEAD] * kv_stride_s + head_offset, is_bf16),
                     D * (is_bf16 ? 2 : 4));
    const int64_t start = slots[j] * kv_stride_s + head_offset;
    for (int64_t d = 0; d < D; d++) row[d] = load_elem(cache, start + d, is_bf16);
}

/* scores [rows, kv_end] -> softmax probabilities per row, in place, in fp32. Row r (query
   position j0 + r / group) sees keys [0, visible); the rest of its scores become probability 0. */
static void softmax_rows(float *scores, int64_t rows, int64_t kv_end, int causal, int64_t prefix, int64_t j0,
                         int64_t group) {
    for (int64_t r = 0; r < rows; r++) {
        float *sr = scores + r * kv_end;
        int64_t visible = causal ? prefix + j0 + r / group + 1 : kv_end;
        if (visible > kv_end) visible = kv_end;
        float row_max = -INFINITY;
        for (int64_t j = 0; j < visible; j++) row_max = sr[j] > row_max ? sr[j] : row_max;
        float total = 0.0f;
        for (int64_t j = 0; j < visible; j++) {
            sr[j] = exp_approx(sr[j] - row_max);
            total += sr[j];
        }
        for (int64_t j = visible; j < kv_end; j++) sr[j] = 0.0f;
        const float inv = 1.0f / total;
        for (int64_t j = 0; j < visible; j++) sr[j] *= inv;
    }
}

#include "attention_amx.h"

/* Whether a task of this call runs on the tiles (attention_amx.h), and the query positions per
   task: at most 16 rows (positions x group) there, QUERY_BLOCK positions otherwise. */
static inline int use_amx(int64_t group, int64_t head_dim, const int is_bf16) {
#if ATTENTION_AMX
    return is_bf16 && amx_ready && (head_dim == 64 || head_dim == 128) && group <= AMX_ROWS;
#else
    (void)group, (void)head_dim, (void)is_bf16;
    return 0;
#endif
}

static inline int64_t task_positions(int64_t group, int64_t head_dim, const int is_bf16) {
#if ATTENTION_AMX
    if (use_amx(group, head_dim, is_bf16)) return AMX_ROWS / group < QUERY_BLOCK ? AMX_ROWS / group : QUERY_BLOCK;
#else
    (void)group, (void)head_dim, (void)is_bf16;
#endif
    return QUERY_BLOCK;
}

/* Floats of workspace one thread needs for `max_seq_len` keys and `group` query heads per kv head. */
int64_t workspace_floats(int64_t max_seq_len, int64_t group, int64_t head_dim) {
    int64_t rows = (int64_t)QUERY_BLOCK * group;
    return rows * (max_seq_len + 2 * head_dim) + head_dim;
}

/* One task: request b's kv head `kv_head`, query positions j0 .. j0 + n - 1 of its extend.
   Element pointers are bf16 (is_bf16) or fp32; D is a literal in the calls that matter. */
ALWAYS_INLINE void attention_task(const void *q, int64_t q_stride_t, int64_t q_stride_h, const void *k_cache,
                                  const void *v_cache, int64_t kv_stride_s, int64_t kv_stride_h, const int32_t *slots,
                                  int64_t seq_len, int64_t prefix, int64_t first_token, int64_t j0, int64_t n,
                                  int64_t kv_head, int64_t group, const int64_t D, int causal, float scale, void *out,
                                  int64_t out_stride_t, int64_t out_stride_h, float *ws, const int is_bf16) {
    const int64_t rows = n * group; /* row r: query position j0 + r / group, head r % group */
    const int64_t head_offset = kv_head * kv_stride_h;
    float *qf = ws;                 /* [rows, D] scaled queries */
    float *acc = qf + rows * D;     /* [rows, D] */
    float *kv_row = acc + rows * D; /* [D] */
    float *scores = kv_row + D;     /* [rows, kv_end] */
    if (seq_len <= 0) {
        for (int64_t r = 0; r < rows; r++) {
            const int64_t o = query_row_offset(first_token, j0, r, group, kv_head, out_stride_t, out_stride_h);
            for (int64_t d = 0; d < D; d++) store_elem(out, o + d, 0.0f, is_bf16);
        }
        return;
    }
    int64_t kv_end = causal ? prefix + j0 + n : seq_len;
    if (kv_end > seq_len) kv_end = seq_len;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t qr = query_row_offset(first_token, j0, r, group, kv_head, q_stride_t, q_stride_h);
        for (int64_t d = 0; d < D; d++) qf[r * D + d] = load_elem(q, qr + d, is_bf16) * scale;
    }
    for (int64_t j = 0; j < kv_end; j++) {
        load_kv_row(k_cache, slots, j, kv_end, kv_stride_s, head_offset, D, kv_row, is_bf16);
        for (int64_t r = 0; r < rows; r++) {
            const float *qv = qf + r * D;
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += qv[d] * kv_row[d];
            scores[r * kv_end + j] = s;
        }
    }
    softmax_rows(scores, rows, kv_end, causal, prefix, j0, group);
    memset(acc, 0, (size_t)(rows * D) * sizeof(float));
    for (int64_t j = 0; j < kv_end; j++) {
        load_kv_row(v_cache, slots, j, kv_end, kv_stride_s, head_offset, D, kv_row, is_bf16);
        for (int64_t r = 0; r < rows; r++) {
            const float p = scores[r * kv_end + j];
            float *a = acc + r * D;
            for (int64_t d = 0; d < D; d++) a[d] += p * kv_row[d];
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = query_row_offset(first_token, j0, r, group, kv_head, out_stride_t, out_stride_h);
        for (int64_t d = 0; d < D; d++) store_elem(out, o + d, acc[r * D + d], is_bf16);
    }
}

/* Task `task` of the call: finds its request, kv head and query block, and runs it with D as a
   literal for the common head sizes (so the inner loops have fixed trip counts). */
ALWAYS_INLINE void run_task(int64_t task, const void *q, int64_t q_stride_t, int64_t q_stride_h, const void *k_cache,
                            const void *v_cache, int64_t kv_stride_s, int64_t kv_stride_h, const int32_t *req_to_token,
                            int64_t table_stride, const int64_t *req_rows, const int32_t *seq_lens,
                            const int32_t *extend_lens, const int32_t *q_start, int64_t num_q_heads,
                            int64_t num_kv_heads, int64_t head_dim, int64_t blocks, int64_t kv_len, int causal,
                            float scale, void *out, int64_t out_stride_t, int64_t out_stride_h, float *ws,
                            const int is_bf16) {
    const int64_t group = num_q_heads / num_kv_heads;
    const int64_t b = task / (num_kv_heads * blocks);
    const int64_t kv_head = (task / blocks) % num_kv_heads;
    const int64_t positions = task_positions(group, head_dim, is_bf16);
    const int64_t j0 = (task % blocks) * positions;
    const int64_t extend = extend_lens[b];
    if (j0 >= extend) return;
    const int64_t n = extend - j0 < positions ? extend - j0 : positions;
    const int32_t *slots = req_to_token + req_rows[b] * table_stride;
    const int64_t seq_len = seq_lens[b] < kv_len ? seq_lens[b] : kv_len;
    const int64_t prefix = seq_len - extend;
#if ATTENTION_AMX
    if (seq_len > 0 && use_amx(group, head_dim, is_bf16)) {
#define AMX_TASK_WITH_HEAD_DIM(D)                                                                                  \
    attention_task_amx(q, q_stride_t, q_stride_h, k_cache, v_cache, kv_stride_s, kv_stride_h, slots, seq_len,     \
                       prefix, q_start[b], j0, n, kv_head, group, D, causal, scale, out, out_stride_t, out_stride_h, \
                       ws)
        if (head_dim == 64)
            AMX_TASK_WITH_HEAD_DIM(64);
        else
            AMX_TASK_WITH_HEAD_DIM(128);
#undef AMX_TASK_WITH_HEAD_DIM
        return;
    }
#endif
#define TASK_WITH_HEAD_DIM(D)                                                                                        \
    attention_task(q, q_stride_t, q_stride_h, k_cache, v_cache, kv_stride_s, kv_stride_h, slots, seq_len, prefix, \
                   q_start[b], j0, n, kv_head, group, D, causal, scale, out, out_stride_t, out_stride_h, ws, is_bf16)
    if (head_dim == 64)
        TASK_WITH_HEAD_DIM(64);
    else if (head_dim == 128)
        TASK_WITH_HEAD_DIM(128);
    else
        TASK_WITH_HEAD_DIM(head_dim);
#undef TASK_WITH_HEAD_DIM
}

int omp_get_thread_num(void);

/* The exported kernels, per dtype: tasks (request, kv head, query block) spread over threads. */
#define EXPORT_FOR_DTYPE(SUFFIX, IS_BF16)                                                                            \
    void paged_attention_##SUFFIX(                                                                                 \
        const void *q, int64_t q_stride_t, int64_t q_stride_h, const void *k_cache, const void *v_cache,          \
        int64_t kv_stride_s, int64_t kv_stride_h, const int32_t *req_to_token, int64_t table_stride,              \
        const int64_t *req_rows, const int32_t *seq_lens, const int32_t *extend_lens, const int32_t *q_start,     \
        int64_t batch, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t max_extend,           \
        int64_t kv_len, int causal, float scale, void *out, int64_t out_stride_t, int64_t out_stride_h,           \
        float *workspace, int64_t workspace_per_thread, int num_threads) {                                         \
        const int64_t positions = task_positions(num_q_heads / num_kv_heads, head_dim, IS_BF16);                  \
        const int64_t blocks = (max_extend + positions - 1) / positions;                                          \
        _Pragma("omp parallel for schedule(dynamic, 1) num_threads(num_threads)")                                \
        for (int64_t task = 0; task < batch * num_kv_heads * blocks; task++)                                      \
            run_task(task, q, q_stride_t, q_stride_h, k_cache, v_cache, kv_stride_s, kv_stride_h, req_to_token,   \
                     table_stride, req_rows, seq_lens, extend_lens, q_start, num_q_heads, num_kv_heads, head_dim, \
                     blocks, kv_len, causal, scale, out, out_stride_t, out_stride_h,                              \
                     workspace + (int64_t)omp_get_thread_num() * workspace_per_thread, IS_BF16);                   \
    }

EXPORT_FOR_DTYPE(bf16, 1)
EXPORT_FOR_DTYPE(f32, 0)

/* The new tokens' keys and values into the cache: token t's row of Hkv * D elements (contiguous
   in k and v, at token strides k_stride_t and v_stride_t) goes to cache row out_slots[t];
   slot -1 skips the token. Element size in bytes: 2 (bf16) or 4 (fp32). */
void store_kv(const void *k, int64_t k_stride_t, const void *v, int64_t v_stride_t, void *k_cache, void *v_cache,
              const int64_t *out_slots, int64_t tokens, int64_t row_elems, int64_t elem_bytes) {
    const int64_t row_bytes = row_elems * elem_bytes;
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t slot = out_slots[t];
        if (slot < 0) continue;
        memcpy((char *)k_cache + slot * row_bytes, (const char *)k + t * k_stride_t * elem_bytes, (size_t)row_bytes);
        memcpy((char *)v_cache + slot * row_bytes, (const char *)v + t * v_stride_t * elem_bytes, (size_t)row_bytes);
    }
}
