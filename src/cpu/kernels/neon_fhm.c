/* SPDX-License-Identifier: MIT */
/*
 * The neon table plus axpy_f16p for f16 V (kernels.h). Compiled with -march=armv8.2-a+fp16fml;
 * usable when HWCAP reports ASIMDHP and ASIMDFHM. Every other kernel is the neon table's code
 * (neon.c). axpy_f16p multiplies f16 V rows by f16 probabilities with FMLAL / FMLAL2: the
 * products are exact in f32 and are added to f32 accumulators with one rounding each, so its
 * one new error is the probabilities' rounding to f16, which the decode path accepts only for
 * an output stored f16. Rounding the queries to f16 for dot as well moves the LSE (and f32
 * outputs) far past the conformance tolerance, so dot stays float32 (docs/perf/arm.md).
 */
#include <stddef.h>

#include "kernels.h"

static void fhm_axpy(fa_dtype t, const fa_cpu_heads *hs, int m, int n, int dim, const float *st,
                     ptrdiff_t lds, const void *v, ptrdiff_t ldv, float *o, ptrdiff_t ldo,
                     const float *alpha);

#define KNAME "neon_fhm"
#define KTABLE fa_cpu_kernels_neon_fhm
#define KAXPY_F16P fhm_axpy
#include "neon.c"

/* The probabilities (at most 1) go to f16 times 2^14, the outputs' registers held in the same
 * units: rounded as they were, a long row's many small probabilities fell below f16's normal
 * range (2^-14) and its smallest subnormal (2^-24), and what they add up to was lost (4,088
 * keys e^-17.5 below the row's maximum came out 0). At 2^14, 1 is 16384 < 65504, f16's
 * normal range reaches down to 2^-28 and only terms under 2^-39 vanish; powers of 2 scale
 * the f32 outputs exactly. */
#define FHM_UP 0x1p14f
#define FHM_DOWN 0x1p-14f

/* o rows 0 .. MI - 1 (MI <= 4), elements p .. p + 8 PV - 1 (PV 1 or 2), over keys 0 .. nb - 1:
 * the outputs stay in f32 registers over the keys (scaled by alpha first when given); each
 * key's MI probabilities are rounded to f16 once and FMLAL / FMLAL2 take them by lane. */
static inline __attribute__((always_inline)) void
fhm_block(const int MI, const int PV, const float *sh, ptrdiff_t lds, const float16_t *vrow,
          ptrdiff_t ldv, int nb, float *oh, ptrdiff_t ldo, const float *alpha, int p)
{
    float32x4_t acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < MI; i++)
#pragma GCC unroll 4
        for (int b = 0; b < 2 * PV; b++) {
            acc[i][b] = vmulq_n_f32(vld1q_f32(oh + i * ldo + p + 4 * b), alpha ? alpha[i] * FHM_UP : FHM_UP);
        }
    for (int j = 0; j < nb; j++) {
        float16x8_t x[2];
#pragma GCC unroll 2
        for (int u = 0; u < PV; u++)
            x[u] = vld1q_f16(vrow + j * ldv + p + 8 * u);
        const float *sj = sh + j * lds;
        float32x4_t s = MI == 4 ? vld1q_f32(sj) : vdupq_n_f32(0.0f);
        if (MI < 4) /* not past the row's MI probabilities */
#pragma GCC unroll 4
            for (int i = 0; i < MI; i++)
                s[i] = sj[i];
        const float16x4_t ps = vcvt_f16_f32(vmulq_n_f32(s, FHM_UP));
#define FHM_ROW(i)                                                                             \
    if (MI > i)                                                                                \
        for (int u = 0; u < PV; u++) {                                                         \
            acc[i][2 * u] = vfmlalq_lane_low_f16(acc[i][2 * u], x[u], ps, i);                  \
            acc[i][2 * u + 1] = vfmlalq_lane_high_f16(acc[i][2 * u + 1], x[u], ps, i);         \
        }
        FHM_ROW(0)
        FHM_ROW(1)
        FHM_ROW(2)
        FHM_ROW(3)
#undef FHM_ROW
    }
#pragma GCC unroll 4
    for (int i = 0; i < MI; i++)
#pragma GCC unroll 4
        for (int b = 0; b < 2 * PV; b++)
            vst1q_f32(oh + i * ldo + p + 4 * b, vmulq_n_f32(acc[i][b], FHM_DOWN));
}

static inline __attribute__((always_inline)) void
fhm_rows(const int MI, const float *sh, ptrdiff_t lds, const float16_t *vrow, ptrdiff_t ldv,
         int nb, int dim, float *oh, ptrdiff_t ldo, const float *alpha)
{
    int p = 0;
    for (; p + 16 <= dim; p += 16)
        fhm_block(MI, 2, sh, lds, vrow, ldv, nb, oh, ldo, alpha, p);
    if (p < dim)
        fhm_block(MI, 1, sh, lds, vrow, ldv, nb, oh, ldo, alpha, p);
}

/* The neon axpy's walk (blocks of AXPY_KEYS keys, head by head inside a block, rows four at a
 * time), each output element summing alpha o first and then the keys in order. Other dtypes
 * and head dims that are no multiple of 8 take the neon axpy. */
static void fhm_axpy(fa_dtype t, const fa_cpu_heads *hs, int m, int n, int dim, const float *st,
                     ptrdiff_t lds, const void *v, ptrdiff_t ldv, float *o, ptrdiff_t ldo,
                     const float *alpha)
{
    if (t != FA_DTYPE_F16 || dim % 8) {
        k_axpy(t, hs, m, n, dim, st, lds, v, ldv, o, ldo, alpha);
        return;
    }
    for (int j0 = 0; j0 < n || (n == 0 && j0 == 0); j0 += AXPY_KEYS) {
        const int nb = n - j0 < AXPY_KEYS ? n - j0 : AXPY_KEYS;
        for (int h = 0; h < hs->count; h++) {
            const float16_t *vrow = (const float16_t *)v + j0 * ldv + h * hs->kv;
            const float *sh = st + h * hs->st + j0 * lds;
            const float *ah = j0 ? NULL : alpha + h * hs->alpha;
            float *oh = o + h * hs->o;
            int i = 0;
            for (; i + 4 <= m; i += 4)
                fhm_rows(4, sh + i, lds, vrow, ldv, nb, dim, oh + i * ldo, ldo, ah ? ah + i : NULL);
            switch (m - i) {
            case 3:
                fhm_rows(3, sh + i, lds, vrow, ldv, nb, dim, oh + i * ldo, ldo, ah ? ah + i : NULL);
                break;
            case 2:
                fhm_rows(2, sh + i, lds, vrow, ldv, nb, dim, oh + i * ldo, ldo, ah ? ah + i : NULL);
                break;
            case 1:
                fhm_rows(1, sh + i, lds, vrow, ldv, nb, dim, oh + i * ldo, ldo, ah ? ah + i : NULL);
                break;
            default:
                break;
            }
        }
    }
}
