/* Scalar helpers shared by the CPU kernels: bf16 <-> fp32 conversion and a vectorisable e^x.
   All static inline, so loops that call them vectorise (compiled with -O3 -march=native). */

#ifndef DSPARK_CPU_BF16_H
#define DSPARK_CPU_BF16_H

#include <math.h>
#include <stdint.h>

typedef uint16_t bf16;

static inline float bf16_to_float(bf16 x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}

static inline bf16 float_to_bf16(float f) { /* round to nearest even, NaN stays NaN */
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (bf16)((v.u >> 16) | 0x40u);
    return (bf16)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* Element i of an array of bf16 (is_bf16) or fp32 values, as fp32, and the store back. Kernels
   take `is_bf16` as a literal from their exported wrappers, inside any OpenMP region (whose
   body the compiler outlines before it propagates constants), so that after inlining each
   wrapper holds straight-line, vectorised code for its own dtype. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE float load_elem(const void *base, int64_t i, const int is_bf16) {
    return is_bf16 ? bf16_to_float(((const bf16 *)base)[i]) : ((const float *)base)[i];
}

ALWAYS_INLINE void store_elem(void *base, int64_t i, float value, const int is_bf16) {
    if (is_bf16)
        ((bf16 *)base)[i] = float_to_bf16(value);
    else
        ((float *)base)[i] = value;
}

/* `value` rounded to the element dtype and back: what a torch op of that dtype returns. */
ALWAYS_INLINE float round_elem(float value, const int is_bf16) {
    return is_bf16 ? bf16_to_float(float_to_bf16(value)) : value;
}

/* e^x as 2^n * e^r with n = round(x / ln2), |r| <= ln2 / 2, and a degree-6 Taylor polynomial
   (relative error < 2e-7); x is clamped to [-87, 88], where 2^n stays a normal float. Plain
   arithmetic, rintf and an int conversion, so loops over it vectorise. (The float "add
   1.5 * 2^23" rounding trick would not survive -fassociative-math.) */
static inline float exp_approx(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float n = rintf(x * 1.44269504088896341f);
    const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
    const float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    union { int32_t i; float f; } two_to_n;
    two_to_n.i = ((int32_t)n + 127) << 23;
    return p * two_to_n.f;
}

#endif
