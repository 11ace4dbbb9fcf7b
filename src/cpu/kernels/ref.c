/* SPDX-License-Identifier: MIT */
/* Portable C kernels: always built, the fallback on every CPU. */
#include "kernels.h"

#include "../../core/dropout.h"

#include <math.h>
#include <string.h>

#define REF_MR 4
#define REF_NR 8

float fa_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
        float f = (float)m * (1.0f / 16777216.0f); /* subnormal: m * 2^-24 */
        return sign ? -f : f;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else
        x = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

uint16_t fa_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or NaN (quiet) */
        return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (ax >= 0x477ff000u) /* rounds past 65504 */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half, m * 2^-24 */
        float a;
        memcpy(&a, &ax, sizeof(a));
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    ax += 0xfffu + ((ax >> 13) & 1u); /* round to nearest, ties to even */
    ax -= 112u << 23;                 /* rebias 127 -> 15 */
    return sign | (uint16_t)(ax >> 13);
}

float fa_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

uint16_t fa_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static void ref_gemm(int m, int k, const float *a, ptrdiff_t rs_a, ptrdiff_t cs_a, const float *b,
                     ptrdiff_t ldb, float *c, ptrdiff_t ldc, const float *alpha)
{
    for (int i = 0; i < m; i++) {
        float acc[REF_NR];
        for (int j = 0; j < REF_NR; j++)
            acc[j] = alpha ? alpha[i] * c[i * ldc + j] : 0.0f;
        for (int p = 0; p < k; p++) {
            float ai = a[i * rs_a + p * cs_a];
            for (int j = 0; j < REF_NR; j++)
                acc[j] += ai * b[p * ldb + j];
        }
        memcpy(c + i * ldc, acc, sizeof(acc));
    }
}

static void ref_softmax_update(int n, int cols, float *st, ptrdiff_t lds, float *m, float *l,
                               float *alpha)
{
    for (int i = 0; i < cols; i++) {
        float mx = m[i];
        for (int j = 0; j < n; j++)
            mx = fmaxf(mx, st[j * lds + i]);
        float base = mx == -INFINITY ? 0.0f : mx;
        float sum = 0.0f;
        for (int j = 0; j < n; j++) {
            float p = exp2f(st[j * lds + i] - base);
            st[j * lds + i] = p;
            sum += p;
        }
        alpha[i] = exp2f(m[i] - base);
        l[i] = l[i] * alpha[i] + sum;
        m[i] = mx;
    }
}

static void ref_exp2_sub(int n, int cols, float *st, ptrdiff_t lds, const float *sub)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < cols; i++)
            st[j * lds + i] = exp2f(st[j * lds + i] - sub[i]);
}

static void ref_dropout_apply(int n, int cols, float *st, ptrdiff_t lds, uint64_t seed,
                              uint64_t offset, int32_t batch, const int32_t *head,
                              const int32_t *row, int64_t col0, uint32_t threshold, float scale)
{
    uint8_t keep[64];
    for (int c = 0; c < cols; c++)
        for (int j0 = 0; j0 < n; j0 += 64) {
            int m = n - j0 < 64 ? n - j0 : 64;
            fa_dropout_row(seed, offset, batch, head[c], row[c], col0 + j0, m, threshold, keep);
            for (int j = 0; j < m; j++)
                st[(j0 + j) * lds + c] *= keep[j] ? scale : 0.0f;
        }
}

static void ref_softcap(int n, int cols, float *st, ptrdiff_t lds, float cap)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < cols; i++)
            st[j * lds + i] = cap * tanhf(st[j * lds + i] / cap) * FA_LOG2E;
}

static float ref_elem(fa_dtype t, const void *base, ptrdiff_t i)
{
    if (t == FA_DTYPE_F32)
        return ((const float *)base)[i];
    uint16_t h = ((const uint16_t *)base)[i];
    return t == FA_DTYPE_F16 ? fa_f16_to_f32(h) : fa_bf16_to_f32(h);
}

static void ref_dot(fa_dtype t, const fa_cpu_heads *hs, int m, int n, int dim, const float *q,
                    ptrdiff_t ldq, const void *k, ptrdiff_t ldk, float *st, ptrdiff_t lds)
{
    for (int j = 0; j < n; j++)
        for (int h = 0; h < hs->count; h++)
            for (int i = 0; i < m; i++) {
                float s = 0.0f;
                for (int p = 0; p < dim; p++)
                    s += q[h * hs->q + i * ldq + p] * ref_elem(t, k, j * ldk + h * hs->kv + p);
                st[h * hs->st + j * lds + i] = s;
            }
}

static void ref_axpy(fa_dtype t, const fa_cpu_heads *hs, int m, int n, int dim, const float *st,
                     ptrdiff_t lds, const void *v, ptrdiff_t ldv, float *o, ptrdiff_t ldo,
                     const float *alpha)
{
    for (int h = 0; h < hs->count; h++)
        for (int i = 0; i < m; i++)
            for (int p = 0; p < dim; p++)
                o[h * hs->o + i * ldo + p] *= alpha[h * hs->alpha + i];
    for (int j = 0; j < n; j++)
        for (int h = 0; h < hs->count; h++)
            for (int i = 0; i < m; i++)
                for (int p = 0; p < dim; p++)
                    o[h * hs->o + i * ldo + p] +=
                        st[h * hs->st + j * lds + i] * ref_elem(t, v, j * ldv + h * hs->kv + p);
}

static void ref_load(fa_dtype t, const void *src, float *dst, int n, float mul)
{
    if (t == FA_DTYPE_E4M3) {
        const uint8_t *s = src;
        for (int i = 0; i < n; i++)
            dst[i] = mul * fa_e4m3_to_f32(s[i]);
    } else if (t == FA_DTYPE_F32) {
        const float *s = src;
        for (int i = 0; i < n; i++)
            dst[i] = mul * s[i];
    } else {
        const uint16_t *s = src;
        for (int i = 0; i < n; i++)
            dst[i] = mul * (t == FA_DTYPE_F16 ? fa_f16_to_f32(s[i]) : fa_bf16_to_f32(s[i]));
    }
}

static void ref_store(fa_dtype t, const float *src, void *dst, int n, float mul)
{
    if (t == FA_DTYPE_F32) {
        float *d = dst;
        for (int i = 0; i < n; i++)
            d[i] = mul * src[i];
    } else {
        uint16_t *d = dst;
        for (int i = 0; i < n; i++)
            d[i] = t == FA_DTYPE_F16 ? fa_f32_to_f16(mul * src[i]) : fa_f32_to_bf16(mul * src[i]);
    }
}

const fa_cpu_kernels fa_cpu_kernels_ref = {
    .name = "ref",
    .mr = REF_MR,
    .nr = REF_NR,
    .gemm = ref_gemm,
    .softmax_update = ref_softmax_update,
    .dot = ref_dot,
    .axpy = ref_axpy,
    .softcap = ref_softcap,
    .exp2_sub = ref_exp2_sub,
    .dropout_apply = ref_dropout_apply,
    .load = ref_load,
    .store = ref_store,
};
