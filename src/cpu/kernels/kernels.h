/* SPDX-License-Identifier: MIT */
/*
 * The CPU microkernel contract (docs/kernels.md explains it with pictures).
 * The framework in src/cpu owns tiling, masks, tails and threads; a kernel
 * table supplies only these few float32 building blocks for one ISA.
 */
#ifndef FA_CPU_KERNELS_H
#define FA_CPU_KERNELS_H

#include "flashattn.h"

#include <stddef.h>

/* Scores live in the base-2 domain: s * log2(e), and lse = (m + log2 l) * ln(2). */
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

/* Strides between consecutive heads for the decode kernels (count = 1: one head). */
typedef struct fa_cpu_heads {
    int count;
    ptrdiff_t q;     /* floats between heads' query rows */
    ptrdiff_t kv;    /* elements between heads' key / value rows */
    ptrdiff_t st;    /* floats between heads' score columns */
    ptrdiff_t o;     /* floats between heads' output rows */
    ptrdiff_t alpha; /* floats between heads' rescale factors */
    /* A hint, NULL for none: another stream's rows to prefetch into L2 while this call runs,
     * row j (< pf_n) of head h at pf + j * pf_ld + h * pf_kv bytes, pf_row bytes long. */
    const char *pf;
    ptrdiff_t pf_ld, pf_kv, pf_row;
    int pf_n;
} fa_cpu_heads;

/* The decode path's P V step (fa_cpu_kernels.axpy). */
typedef void fa_cpu_axpy_fn(fa_dtype t, const fa_cpu_heads *hs, int m, int n, int dim,
                            const float *st, ptrdiff_t lds, const void *v, ptrdiff_t ldv, float *o,
                            ptrdiff_t ldo, const float *alpha);

typedef struct fa_cpu_kernels {
    const char *name; /* the table's name in tables.c, e.g. "avx2" */
    int mr;           /* most rows of C one gemm call computes */
    int nr;           /* columns of C per gemm call; score tiles are padded to a multiple */

    /*
     * C = diag(alpha) C + A B, or C = A B when alpha is NULL.
     *   A is m x k:  A[i][p] = a[i*rs_a + p*cs_a]
     *   B is k x nr: B[p][j] = b[p*ldb + j]
     *   C is m x nr: C[i][j] = c[i*ldc + j]
     * 1 <= m <= mr, k >= 0 (k = 0 only scales or zeroes C). No alignment required.
     */
    void (*gemm)(int m, int k, const float *a, ptrdiff_t rs_a, ptrdiff_t cs_a, const float *b,
                 ptrdiff_t ldb, float *c, ptrdiff_t ldc, const float *alpha);

    /*
     * Score tile, transposed: st[j*lds + i] is the base-2 score of key j for
     * query column i (j < n, i < cols; cols a multiple of nr / 2). For every
     * column: m_new = max(m[i], max_j st), p = 2^(st - m_new) written back
     * in place, l[i] = l[i]*alpha[i] + sum_j p, alpha[i] = 2^(m[i] - m_new),
     * m[i] = m_new. -inf scores give p = 0; a column whose m_new is still
     * -inf keeps p = 0 and l = 0 and never produces NaN.
     */
    void (*softmax_update)(int n, int cols, float *st, ptrdiff_t lds, float *m, float *l,
                           float *alpha);

    /*
     * The decode path: few query rows, keys and values read straight from the
     * caller's memory in dtype t (row pitch in elements), never copied. One
     * call covers hs->count heads and walks the keys in the outer loop, so a
     * [seq, heads, dim] cache is read row after row.
     *   dot:  st_h[j*lds + i] = q_h,i . k_h,j                  i < m, j < n
     *   axpy: o_h,i = alpha_h[i] o_h,i + sum_j st_h[j*lds + i] v_h,j
     * with X_h = X + h * hs->X. q and o are float32 rows of dim (ldq / ldo apart).
     */
    void (*dot)(fa_dtype t, const fa_cpu_heads *hs, int m, int n, int dim, const float *q,
                ptrdiff_t ldq, const void *k, ptrdiff_t ldk, float *st, ptrdiff_t lds);
    fa_cpu_axpy_fn *axpy;

    /*
     * axpy with st (at most 1) rounded to f16 first, scaled into f16's normal range, when t is
     * f16 and dim a multiple of 8 (f16 x f16 products, exact in float32; float32 sums), else
     * axpy; NULL in tables without one. The decode path calls it only for f16 V, no dropout and
     * an output stored f16, whose own rounding (2^-11) bounds the probabilities' (docs/kernels.md).
     */
    fa_cpu_axpy_fn *axpy_f16p;

    /* Backward probabilities: st[j*lds + i] = 2^(st[j*lds + i] - sub[i]) for j < n,
     * i < cols (a multiple of nr / 2); sub = +inf gives 0. */
    void (*exp2_sub)(int n, int cols, float *st, ptrdiff_t lds, const float *sub);

    /* Logit softcap on a score tile, into the base-2 domain:
     * st[j*lds + i] = cap * tanh(st[j*lds + i] / cap) * log2(e) for j < n, i < cols,
     * cols a multiple of nr / 2 (every column takes the same path, so a score's
     * bits never depend on where a task's columns end). */
    void (*softcap)(int n, int cols, float *st, ptrdiff_t lds, float cap);

    /* Dropout on a transposed probability tile, fa_dropout_mask's definition
     * (src/core/dropout.h): st[j*lds + c] *= keep(batch, head[c], row[c],
     * col0 + j) ? scale : 0 for j < n, c < cols (a multiple of nr / 2; head and
     * row must be readable for every c < cols). Philox runs on several query
     * columns at once, so each result lands in a contiguous tile row. */
    void (*dropout_apply)(int n, int cols, float *st, ptrdiff_t lds, uint64_t seed, uint64_t offset,
                          int32_t batch, const int32_t *head, const int32_t *row, int64_t col0,
                          uint32_t threshold, float scale);

    /* dst[i] = mul * float(src[i]) for i < n, src of dtype t. */
    void (*load)(fa_dtype t, const void *src, float *dst, int n, float mul);

    /* dst[i] = dtype t (mul * src[i]) for i < n, rounding to nearest even. */
    void (*store)(fa_dtype t, const float *src, void *dst, int n, float mul);
} fa_cpu_kernels;

/* What the CPU offers, read at run time: cpuid on x86, HWCAP (getauxval) on Arm Linux. */
typedef struct fa_cpu_features {
    int avx2, fma, f16c, avx512f;        /* x86 */
    int asimd, fphp, asimdhp, asimddp, asimdfhm; /* AArch64: HWCAP_ASIMD, _FPHP, _ASIMDHP,
                                                  * _ASIMDDP, _ASIMDFHM */
} fa_cpu_features;

void fa_cpu_features_probe(fa_cpu_features *f);

/* Kernel names in reports (fa_run_info.kernel), indexed by fa_cpu_report_name. */
enum {
    FA_CPU_REPORT_FLASH, FA_CPU_REPORT_FLASH_DECODE, FA_CPU_REPORT_STANDARD,
    FA_CPU_REPORT_STANDARD_DECODE, FA_CPU_REPORT_PAGED, FA_CPU_REPORT_PAGED_DECODE,
    FA_CPU_REPORT_BACKWARD, FA_CPU_REPORT_BACKWARD_STANDARD, FA_CPU_REPORT_COUNT
};

/* One compiled kernel table: whether this CPU can run it and what reports call it. */
typedef struct fa_cpu_kernel_entry {
    const fa_cpu_kernels *kern;
    int (*usable)(const fa_cpu_features *f);
    const char *report[FA_CPU_REPORT_COUNT]; /* "flash-avx2", "flash-avx2-decode", ... */
} fa_cpu_kernel_entry;

/* Every table this build has (tables.c), preferred first; the last is "ref". */
extern const fa_cpu_kernel_entry fa_cpu_kernel_tables[];
extern const int fa_cpu_kernel_table_count;

/* Portable scalar conversions, shared by every kernel table for tails. */
float fa_f16_to_f32(uint16_t h);
uint16_t fa_f32_to_f16(float f);
float fa_bf16_to_f32(uint16_t h);
uint16_t fa_f32_to_bf16(float f);

/* An FA_DTYPE_E4M3 byte's value (exact in float32): exponent field e biased by 7, e = 0
 * subnormal (m / 8 * 2^-6), S.1111.111 NaN. */
static inline float fa_e4m3_to_f32(uint8_t x)
{
    const uint32_t e = (x >> 3) & 15u, m = x & 7u;
    union {
        uint32_t u;
        float f;
    } v;
    if (e == 0)
        v.f = (float)m * 0x1p-9f;
    else if (e == 15 && m == 7)
        v.u = 0x7fc00000u;
    else
        v.u = ((e + 120u) << 23) | (m << 20);
    return x & 0x80 ? -v.f : v.f;
}

#endif
