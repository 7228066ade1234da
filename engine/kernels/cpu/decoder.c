/* A run of Llama decoder layers on CPU in one call, for fp32 or bf16 forwards of a few rows per
   request (decode, DSpark verify windows): the same kernels, in the same order, as the model's
   Python layer (engine/models/llama.py), so the result is bit-identical; only the ~10 Python
   calls a layer (each ~10-15 us of wrapper) are gone. Activations, norm weights and caches are
   all of one dtype, the forward's (elem_bytes: 4 for fp32, 2 for bf16); the kernels are that
   dtype's (cpu_decoder_stack.py picks them at first use for the ISA the CPU reports, isa.py).

   Per layer, with hidden / residual the stream pair of engine/models/llama.py:
     normed, residual = add_rms_norm(hidden, residual, input_norm)
     qkv = normed @ Wqkv^T;  q, k = rope(q, k) (one call over the q and k heads of qkv)
     store k, v at out_slots;  attn = paged_attention(q)
     normed, residual = add_rms_norm(attn @ Wo^T, residual, post_norm)
     hidden = swiglu(normed @ Wgate_up^T) @ Wdown^T
   The kernels come from their own libraries (gemm.c or gemv.c, elementwise.c, attention.c) as
   function pointers of kernel_signatures.h's types, so each keeps one definition. */

#include <stdint.h>

#include "kernel_signatures.h"

struct kernels {
    linear_fn linear, linear_swiglu;
    rms_norm_fn rms_norm;
    rope_fn rope;
    store_kv_fn store_kv;
    attention_fn attention;
};

struct layer { /* one decoder layer: norm weights [H], packed linears (linear_fn), its caches */
    const void *input_norm, *qkv, *o, *gate_up, *down, *post_norm;
    void *k_cache, *v_cache; /* [num_slots + 1, Hkv, D] contiguous */
};

struct forward { /* what every layer of one forward shares */
    int64_t tokens, hidden, heads, kv_heads, head_dim, inter, rope_dim;
    float eps, scale;
    int threads, causal;
    int64_t elem_bytes;          /* of the activation dtype: 4 (fp32) or 2 (bf16) */
    const void *cos, *sin;       /* [T, rope_dim] */
    const int64_t *out_slots;    /* [T] */
    const int32_t *req_to_token; /* attention metadata in the kernel's types (cpu_kernel.py) */
    int64_t table_stride;
    const int64_t *req_rows;
    const int32_t *seq_lens, *extend_lens, *q_start;
    int64_t batch, max_extend, kv_len;
    float *workspace;
    int64_t workspace_per_thread;
    void *normed, *qkv_out, *rotated, *attn, *o_out, *act; /* scratch: [T, H], [T, (Hq + 2 Hkv) D],
                                                              [T, Hq + Hkv, D], [T, Hq D], [T, H], [T, I] */
};

/* `base` + `elems` elements of the forward's dtype. */
static inline void *at(void *base, int64_t elems, int64_t elem_bytes) { return (char *)base + elems * elem_bytes; }

/* Layers [0, count) of `layers` over hidden / residual [T, H] (both updated in place).
   Returns 0, or the first kernel's failure (-1: out of memory). */
int decoder_layers(const struct kernels *k, const struct forward *f, const struct layer *layers, int64_t count,
                   void *hidden, void *residual) {
    const int64_t T = f->tokens, H = f->hidden, D = f->head_dim, Hq = f->heads, Hkv = f->kv_heads;
    const int64_t qkv_width = (Hq + 2 * Hkv) * D, rotated_width = (Hq + Hkv) * D, bytes = f->elem_bytes;
    for (int64_t i = 0; i < count; i++) {
        const struct layer *l = layers + i;
        k->rms_norm(hidden, H, residual, H, l->input_norm, f->normed, residual, T, H, f->eps, f->threads);
        if (k->linear(f->normed, H, l->qkv, 0, f->qkv_out, qkv_width, T, qkv_width, H, f->threads)) return -1;
        k->rope(f->qkv_out, qkv_width, D, f->cos, f->sin, f->rotated, T, Hq + Hkv, D, f->rope_dim, f->threads);
        k->store_kv(at(f->rotated, Hq * D, bytes), rotated_width, at(f->qkv_out, rotated_width, bytes), qkv_width,
                    l->k_cache, l->v_cache, f->out_slots, T, Hkv * D, bytes);
        k->attention(f->rotated, rotated_width, D, l->k_cache, l->v_cache, Hkv * D, D, f->req_to_token,
                     f->table_stride, f->req_rows, f->seq_lens, f->extend_lens, f->q_start, f->batch, Hq, Hkv, D,
                     f->max_extend, f->kv_len, f->causal, f->scale, f->attn, Hq * D, D, f->workspace,
                     f->workspace_per_thread, f->threads);
        if (k->linear(f->attn, Hq * D, l->o, 0, f->o_out, H, T, H, Hq * D, f->threads)) return -1;
        k->rms_norm(f->o_out, H, residual, H, l->post_norm, f->normed, residual, T, H, f->eps, f->threads);
        if (k->linear_swiglu(f->normed, H, l->gate_up, 0, f->act, f->inter, T, f->inter, H, f->threads)) return -1;
        if (k->linear(f->act, f->inter, l->down, 0, hidden, H, T, H, f->inter, f->threads)) return -1;
    }
    return 0;
}
