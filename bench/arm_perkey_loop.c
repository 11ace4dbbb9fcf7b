/* SPDX-License-Identifier: MIT */
/*
 * A key-at-a-time decode step for one query row and an f16 cache, shaped like ggml's CPU
 * flash-attention loop for f16 K and V (docs/perf/arm.md): one dot product per key, a scalar
 * online-softmax update per key, then one scaled add of the key's V row into an accumulator
 * kept in f16 between keys. Written here only to be compiled and read with objdump, never
 * linked into the library:
 *   aarch64-linux-gnu-gcc -O3 -march=armv8.2-a+fp16 -c bench/arm_perkey_loop.c   (f16 math)
 *   aarch64-linux-gnu-gcc -O3 -march=armv8-a -c bench/arm_perkey_loop.c          (f32 math)
 *   aarch64-linux-gnu-objdump -d arm_perkey_loop.o
 * With FP16 vector arithmetic the products and sums are f16 (4 accumulators of 8 lanes, 32
 * elements per step); without it, halves are widened 4 at a time and the arithmetic is f32.
 * dim must be a multiple of 32.
 */
#include <arm_neon.h>
#include <math.h>

#ifdef __ARM_FEATURE_FP16_VECTOR_ARITHMETIC
static float dot_f16(int dim, const float16_t *x, const float16_t *y)
{
    float16x8_t s0 = vdupq_n_f16(0), s1 = s0, s2 = s0, s3 = s0;
    for (int i = 0; i < dim; i += 32) {
        s0 = vfmaq_f16(s0, vld1q_f16(x + i), vld1q_f16(y + i));
        s1 = vfmaq_f16(s1, vld1q_f16(x + i + 8), vld1q_f16(y + i + 8));
        s2 = vfmaq_f16(s2, vld1q_f16(x + i + 16), vld1q_f16(y + i + 16));
        s3 = vfmaq_f16(s3, vld1q_f16(x + i + 24), vld1q_f16(y + i + 24));
    }
    const float16x8_t s = vaddq_f16(vaddq_f16(s0, s1), vaddq_f16(s2, s3));
    return vaddvq_f32(vaddq_f32(vcvt_f32_f16(vget_low_f16(s)), vcvt_high_f32_f16(s)));
}

static void mad_f16(int dim, float16_t *acc, const float16_t *x, float w)
{
    const float16x8_t vw = vdupq_n_f16((float16_t)w);
    for (int i = 0; i < dim; i += 32)
        for (int u = 0; u < 32; u += 8)
            vst1q_f16(acc + i + u, vfmaq_f16(vld1q_f16(acc + i + u), vld1q_f16(x + i + u), vw));
}

static void scale_f16(int dim, float16_t *acc, float w)
{
    const float16x8_t vw = vdupq_n_f16((float16_t)w);
    for (int i = 0; i < dim; i += 8)
        vst1q_f16(acc + i, vmulq_f16(vld1q_f16(acc + i), vw));
}
#else
static float dot_f16(int dim, const float16_t *x, const float16_t *y)
{
    float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
    for (int i = 0; i < dim; i += 16) {
        s0 = vfmaq_f32(s0, vcvt_f32_f16(vld1_f16(x + i)), vcvt_f32_f16(vld1_f16(y + i)));
        s1 = vfmaq_f32(s1, vcvt_f32_f16(vld1_f16(x + i + 4)), vcvt_f32_f16(vld1_f16(y + i + 4)));
        s2 = vfmaq_f32(s2, vcvt_f32_f16(vld1_f16(x + i + 8)), vcvt_f32_f16(vld1_f16(y + i + 8)));
        s3 = vfmaq_f32(s3, vcvt_f32_f16(vld1_f16(x + i + 12)), vcvt_f32_f16(vld1_f16(y + i + 12)));
    }
    return vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
}

static void mad_f16(int dim, float16_t *acc, const float16_t *x, float w)
{
    const float32x4_t vw = vdupq_n_f32(w);
    for (int i = 0; i < dim; i += 16)
        for (int u = 0; u < 16; u += 4)
            vst1_f16(acc + i + u, vcvt_f16_f32(vfmaq_f32(vcvt_f32_f16(vld1_f16(acc + i + u)),
                                                         vcvt_f32_f16(vld1_f16(x + i + u)), vw)));
}

static void scale_f16(int dim, float16_t *acc, float w)
{
    const float32x4_t vw = vdupq_n_f32(w);
    for (int i = 0; i < dim; i += 4)
        vst1_f16(acc + i, vcvt_f16_f32(vmulq_f32(vcvt_f32_f16(vld1_f16(acc + i)), vw)));
}
#endif

/* One query row q (already f16) over n keys; returns the softmax sum, acc holds sum p v. */
float perkey_decode(int dim, int n, const float16_t *q, const float16_t *k, const float16_t *v,
                    float scale, float16_t *acc)
{
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < n; j++) {
        const float s = dot_f16(dim, k + (long)j * dim, q) * scale;
        float ms = 1.0f, vs = 1.0f;
        if (s > m) {
            ms = expf(m - s);
            m = s;
            scale_f16(dim, acc, ms);
        } else {
            vs = expf(s - m);
        }
        mad_f16(dim, acc, v + (long)j * dim, vs);
        l = l * ms + vs;
    }
    return l;
}
