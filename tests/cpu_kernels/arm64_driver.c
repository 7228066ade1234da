/* Runs the kernels of engine/kernels/cpu, cross-built for ARM64, on inputs the test wrote and
   writes their outputs back: tests/cpu_kernels/test_arm64_build.py runs it under qemu-aarch64
   and compares the outputs with the torch references.

   usage: arm64_driver LIBDIR DATADIR

   LIBDIR holds <name>.so for each kernel source, built by build.compile_command. Each is opened
   with dlopen on its own and its functions looked up by name, as build.load and the ctypes
   bindings do. DATADIR/cases.txt has one case a line, "<op> <dtype> <case> <sizes...>"; a case
   reads its inputs from DATADIR/<case>.<input> (raw little-endian arrays in C order, of exactly
   the size the sizes give) and writes its outputs to DATADIR/<case>.<output>. Every kernel runs
   on THREADS OpenMP threads. Prints what the libraries report about their build, one case name
   a line as it completes, and exits 0; on the first failure, says why and exits 1. */

#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_signatures.h"

#define THREADS 2
#define MAX_HELD 32

static const char *lib_dir, *data_dir, *current_case = "";
static void *held[MAX_HELD]; /* the current case's buffers */
static int held_count;

static void fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "case %s: ", current_case);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

static void *hold(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || held_count == MAX_HELD) fail("out of memory (%zu bytes)", bytes);
    held[held_count++] = p;
    return p;
}

static void release_all(void) {
    while (held_count) free(held[--held_count]);
}

/* <name>.so of LIBDIR's function `function`. */
static void *symbol(const char *name, const char *function) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.so", lib_dir, name);
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL); /* the loader keeps one handle per path */
    if (!library) fail("dlopen: %s", dlerror());
    void *address = dlsym(library, function);
    if (!address) fail("%s has no %s", path, function);
    return address;
}

static void case_path(char *path, size_t size, const char *array) {
    snprintf(path, size, "%s/%s.%s", data_dir, current_case, array);
}

/* The case's input `array`, which must be `bytes` long. */
static void *input(const char *array, size_t bytes) {
    char path[4096];
    case_path(path, sizeof path, array);
    FILE *file = fopen(path, "rb");
    if (!file) fail("cannot open %s", path);
    void *data = hold(bytes);
    const size_t got = fread(data, 1, bytes, file);
    const int extra = fgetc(file) != EOF;
    fclose(file);
    if (got != bytes || extra) fail("%s is not %zu bytes", path, bytes);
    return data;
}

static void output(const char *array, const void *data, size_t bytes) {
    char path[4096];
    case_path(path, sizeof path, array);
    FILE *file = fopen(path, "wb");
    if (!file || fwrite(data, 1, bytes, file) != bytes || fclose(file)) fail("cannot write %s", path);
}

static size_t elem_bytes(const char *dtype) {
    if (strcmp(dtype, "f32") == 0) return 4;
    if (strcmp(dtype, "bf16") == 0) return 2;
    fail("unknown dtype %s", dtype);
    return 0;
}

static void function_name(char *name, size_t size, const char *format, const char *suffix) {
    snprintf(name, size, format, suffix);
}

/* gemv.c: x [m, k] @ weight [n, k]^T, without and with bias [n]; and the SwiGLU form on `gated`,
   the same weight read as [gate | up] and interleaved for gemv_pack (gemv.pack_gated's order). */
static void run_linear(const char *dtype, int64_t m, int64_t n, int64_t k) {
    const size_t e = elem_bytes(dtype);
    char name[64];
    const void *x = input("x", m * k * e), *weight = input("weight", n * k * e);
    const void *gated = input("gated", n * k * e), *bias = input("bias", n * e);
    void *packed = hold(n * k * e), *packed_gated = hold(n * k * e);
    void *out = hold(m * n * e), *out_bias = hold(m * n * e), *swiglu = hold(m * n / 2 * e);
    function_name(name, sizeof name, "gemv_pack_%s", dtype);
    const pack_fn pack = (pack_fn)symbol("gemv", name);
    pack(weight, k, packed, n, k, THREADS);
    pack(gated, k, packed_gated, n, k, THREADS);
    function_name(name, sizeof name, "gemv_linear_%s", dtype);
    const linear_fn linear = (linear_fn)symbol("gemv", name);
    function_name(name, sizeof name, "gemv_swiglu_%s", dtype);
    const linear_fn linear_swiglu = (linear_fn)symbol("gemv", name);
    if (linear(x, k, packed, NULL, out, n, m, n, k, THREADS) ||
        linear(x, k, packed, bias, out_bias, n, m, n, k, THREADS) ||
        linear_swiglu(x, k, packed_gated, bias, swiglu, n / 2, m, n / 2, k, THREADS))
        fail("a gemv kernel failed");
    output("out", out, m * n * e);
    output("out_bias", out_bias, m * n * e);
    output("swiglu", swiglu, m * n / 2 * e);
}

/* quant_gemm.c, format `format` (q8_0, q4_1; block_bytes per 32 weights): x [m, k] fp32 @
   dequant(weight [n, k])^T without and with bias [n]; the SwiGLU form on the same weight as
   [gate | up]. */
static void run_quant(const char *format, int64_t m, int64_t n, int64_t k, int64_t block_bytes) {
    char name[64];
    const float *x = input("x", m * k * 4), *bias = input("bias", n * 4);
    const void *weight = input("weight", n * k / 32 * block_bytes);
    float *out = hold(m * n * 4), *out_bias = hold(m * n * 4), *swiglu = hold(m * n / 2 * 4);
    function_name(name, sizeof name, "linear_%s", format);
    const linear_fn linear = (linear_fn)symbol("quant_gemm", name);
    function_name(name, sizeof name, "swiglu_%s", format);
    const linear_fn linear_swiglu = (linear_fn)symbol("quant_gemm", name);
    if (linear(x, k, weight, NULL, out, n, m, n, k, THREADS) ||
        linear(x, k, weight, bias, out_bias, n, m, n, k, THREADS) ||
        linear_swiglu(x, k, weight, bias, swiglu, n / 2, m, n / 2, k, THREADS))
        fail("a quant_gemm kernel failed");
    output("out", out, m * n * 4);
    output("out_bias", out_bias, m * n * 4);
    output("swiglu", swiglu, m * n / 2 * 4);
}

/* quant_gemm.c's embedding lookup: rows ids [count] of weight [n, k] dequantised. */
static void run_rows(const char *format, int64_t count, int64_t n, int64_t k, int64_t block_bytes) {
    char name[64];
    const void *weight = input("weight", n * k / 32 * block_bytes);
    const int64_t *ids = input("ids", count * 8);
    float *out = hold(count * k * 4);
    function_name(name, sizeof name, "dequant_rows_%s", format);
    if (((rows_fn)symbol("quant_gemm", name))(weight, ids, count, out, k, k, THREADS)) fail("dequant_rows failed");
    output("out", out, count * k * 4);
}

/* elementwise.c: RMSNorm of x [rows, n] alone, and of x + residual (with the sum). */
static void run_norm(const char *dtype, int64_t rows, int64_t n, float eps) {
    const size_t e = elem_bytes(dtype);
    char name[64];
    const void *x = input("x", rows * n * e), *residual = input("residual", rows * n * e);
    const void *weight = input("weight", n * e);
    void *normed = hold(rows * n * e), *out = hold(rows * n * e), *residual_out = hold(rows * n * e);
    function_name(name, sizeof name, "rms_norm_%s", dtype);
    const rms_norm_fn rms_norm = (rms_norm_fn)symbol("elementwise", name);
    rms_norm(x, n, NULL, 0, weight, normed, NULL, rows, n, eps, THREADS);
    rms_norm(x, n, residual, n, weight, out, residual_out, rows, n, eps, THREADS);
    output("normed", normed, rows * n * e);
    output("out", out, rows * n * e);
    output("residual_out", residual_out, rows * n * e);
}

/* elementwise.c: silu(gate) * up of x [rows, 2 inter] laid [gate | up]. */
static void run_silu(const char *dtype, int64_t rows, int64_t inter) {
    const size_t e = elem_bytes(dtype);
    char name[64];
    const void *x = input("x", rows * 2 * inter * e);
    void *out = hold(rows * inter * e);
    function_name(name, sizeof name, "silu_and_mul_%s", dtype);
    ((silu_and_mul_fn)symbol("elementwise", name))(x, 2 * inter, out, rows, inter, THREADS);
    output("out", out, rows * inter * e);
}

/* elementwise.c: the rotation of x [tokens, heads, head_dim] by cos, sin [tokens, rope_dim]. */
static void run_rope(const char *dtype, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rope_dim) {
    const size_t e = elem_bytes(dtype);
    char name[64];
    const void *x = input("x", tokens * heads * head_dim * e);
    const void *cos = input("cos", tokens * rope_dim * e), *sin = input("sin", tokens * rope_dim * e);
    void *out = hold(tokens * heads * head_dim * e);
    function_name(name, sizeof name, "rope_%s", dtype);
    ((rope_fn)symbol("elementwise", name))(x, heads * head_dim, head_dim, cos, sin, out, tokens, heads, head_dim,
                                           rope_dim, THREADS);
    output("out", out, tokens * heads * head_dim * e);
}

/* attention.c: store the new k, v [T, Hkv, D] at out_slots, then attend q [T, Hq, D] over the
   paged caches [slots, Hkv, D] as attention.py calls it (contiguous tensors). */
static void run_attention(const char *dtype, const int64_t *sizes, float scale) {
    const int64_t T = sizes[0], batch = sizes[1], Hq = sizes[2], Hkv = sizes[3], D = sizes[4], slots = sizes[5];
    const int64_t table_rows = sizes[6], table_cols = sizes[7], max_extend = sizes[8], kv_len = sizes[9];
    const int causal = (int)sizes[10];
    const size_t e = elem_bytes(dtype);
    char name[64];
    const void *q = input("q", T * Hq * D * e), *k = input("k", T * Hkv * D * e), *v = input("v", T * Hkv * D * e);
    void *k_cache = input("k_cache", slots * Hkv * D * e), *v_cache = input("v_cache", slots * Hkv * D * e);
    const int64_t *out_slots = input("out_slots", T * 8), *req_rows = input("req_rows", batch * 8);
    const int32_t *req_to_token = input("req_to_token", table_rows * table_cols * 4);
    const int32_t *seq_lens = input("seq_lens", batch * 4), *extend_lens = input("extend_lens", batch * 4);
    const int32_t *q_start = input("q_start", batch * 4);
    void *out = hold(T * Hq * D * e);
    const int64_t per_thread = ((workspace_floats_fn)symbol("attention", "workspace_floats"))(kv_len, Hq / Hkv, D);
    float *workspace = hold(THREADS * per_thread * sizeof(float));
    ((store_kv_fn)symbol("attention", "store_kv"))(k, Hkv * D, v, Hkv * D, k_cache, v_cache, out_slots, T, Hkv * D,
                                                   e);
    function_name(name, sizeof name, "paged_attention_%s", dtype);
    ((attention_fn)symbol("attention", name))(q, Hq * D, D, k_cache, v_cache, Hkv * D, D, req_to_token, table_cols,
                                              req_rows, seq_lens, extend_lens, q_start, batch, Hq, Hkv, D,
                                              max_extend, kv_len, causal, scale, out, Hq * D, D, workspace,
                                              per_thread, THREADS);
    output("out", out, T * Hq * D * e);
    output("k_cache", k_cache, slots * Hkv * D * e);
    output("v_cache", v_cache, slots * Hkv * D * e);
}

static int64_t quant_block_bytes(const char *format) {
    if (strcmp(format, "q8_0") == 0) return 34;
    if (strcmp(format, "q4_1") == 0) return 20;
    fail("unknown block format %s", format);
    return 0;
}

/* How many integer sizes each op takes (run_case's dispatch). */
static int sizes_of(const char *op) {
    if (strcmp(op, "attention") == 0) return 11;
    if (strcmp(op, "rope") == 0) return 4;
    if (strcmp(op, "norm") == 0 || strcmp(op, "silu") == 0) return 2;
    return 3;
}

/* One line of cases.txt: "<op> <dtype> <case> <sizes...> [<hex float>]". */
static void run_case(char *line) {
    char op[32], dtype[16], name[128];
    int used = 0;
    if (sscanf(line, "%31s %15s %127s%n", op, dtype, name, &used) != 3) fail("bad line: %s", line);
    current_case = name;
    int64_t sizes[16];
    int count = 0;
    char *rest = line + used, *end;
    float scalar = 0.0f; /* eps or scale, written as a C99 hex float: exact */
    for (;;) {
        while (*rest == ' ') rest++;
        if (*rest == '\0' || *rest == '\n') break;
        if (rest[0] == '0' && rest[1] == 'x') {
            scalar = strtof(rest, &end);
        } else if (count < 16) {
            sizes[count++] = strtoll(rest, &end, 10);
        } else {
            fail("too many sizes");
        }
        if (end == rest) fail("bad number: %s", rest);
        rest = end;
    }
    if (count != sizes_of(op)) fail("%s takes %d sizes, got %d", op, sizes_of(op), count);
    if (strcmp(op, "linear") == 0)
        run_linear(dtype, sizes[0], sizes[1], sizes[2]);
    else if (strcmp(op, "quant") == 0)
        run_quant(dtype, sizes[0], sizes[1], sizes[2], quant_block_bytes(dtype));
    else if (strcmp(op, "rows") == 0)
        run_rows(dtype, sizes[0], sizes[1], sizes[2], quant_block_bytes(dtype));
    else if (strcmp(op, "norm") == 0)
        run_norm(dtype, sizes[0], sizes[1], scalar);
    else if (strcmp(op, "silu") == 0)
        run_silu(dtype, sizes[0], sizes[1]);
    else if (strcmp(op, "rope") == 0)
        run_rope(dtype, sizes[0], sizes[1], sizes[2], sizes[3]);
    else if (strcmp(op, "attention") == 0)
        run_attention(dtype, sizes, scalar);
    else
        fail("unknown op %s", op);
    release_all();
    printf("done %s\n", name);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s LIBDIR DATADIR\n", argv[0]);
        return 2;
    }
    lib_dir = argv[1], data_dir = argv[2];
    printf("gemv_isa %s\n", ((const char *(*)(void))symbol("gemv", "gemv_isa"))());
    printf("amx_supported %d\n", ((int (*)(void))symbol("gemm", "amx_supported"))());
    printf("attention_amx %d\n", ((int (*)(void))symbol("attention", "attention_amx_init"))());
    symbol("decoder", "decoder_layers"); /* loads, its symbols resolved (RTLD_NOW) */
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/cases.txt", data_dir);
    FILE *cases = fopen(path, "r");
    if (!cases) fail("cannot open %s", path);
    while (fgets(line, sizeof line, cases)) run_case(line);
    fclose(cases);
    return 0;
}
