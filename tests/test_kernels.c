/* SPDX-License-Identifier: MIT */
/*
 * The CPU microkernel contract (docs/kernels.md), checked per kernel table
 * against double precision. The end-to-end grid compares flash with standard
 * attention, which share these kernels; this is where a kernel's own error
 * is pinned down.
 */
#include "kernels.h"
#include "ref.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

static uint64_t seed;

static fa_cpu_features features;

/* Every table this build has that this CPU can run (the registry the backend chooses from). */
#define FOR_EACH_TABLE(k)                                                                      \
    for (int ti_ = 0; ti_ < fa_cpu_kernel_table_count; ti_++)                                   \
        for (const fa_cpu_kernels *k = fa_cpu_kernel_tables[ti_].kern;                          \
             k && fa_cpu_kernel_tables[ti_].usable(&features); k = NULL)

/* axpy_f16p's probabilities: rounded to f16 for f16 V and dim a multiple of 8 (kernels.h). */
static double p_f16(fa_dtype t, int dim, double p)
{
    return t == FA_DTYPE_F16 && dim % 8 == 0 ? fa_f16_to_f32(fa_f32_to_f16((float)p)) : p;
}

static void test_gemm(void **state)
{
    (void)state;
    fa_rng r = { seed };
    FOR_EACH_TABLE(k)
    {
        const int mr = k->mr, nr = k->nr;
        for (int m = 1; m <= mr; m++)
            for (int kk = 0; kk <= 37; kk += 9) {
                /* A through both stride patterns the framework uses */
                for (int trans = 0; trans < 2; trans++) {
                    /* sized for mr <= 12, k <= 36, nr <= 32 with the padded strides below */
                    float a[16 * 40], b[40 * 32], c[16 * 40], alpha[16];
                    double want[16 * 32];
                    ptrdiff_t rs = trans ? 1 : 40, cs = trans ? 16 : 1, ldb = nr + 3, ldc = nr + 5;
                    for (int i = 0; i < 16 * 40; i++)
                        a[i] = (float)fa_rng_uniform(&r);
                    for (int i = 0; i < 40 * 32; i++)
                        b[i] = (float)fa_rng_uniform(&r);
                    for (int i = 0; i < 16 * 40; i++)
                        c[i] = (float)fa_rng_uniform(&r);
                    for (int i = 0; i < 16; i++)
                        alpha[i] = (float)fa_rng_uniform(&r);
                    int use_alpha = (m + kk) % 2;
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < nr; j++) {
                            double s = use_alpha ? (double)alpha[i] * c[i * ldc + j] : 0.0;
                            for (int p = 0; p < kk; p++)
                                s += (double)a[i * rs + p * cs] * b[p * ldb + j];
                            want[i * nr + j] = s;
                        }
                    k->gemm(m, kk, a, rs, cs, b, ldb, c, ldc, use_alpha ? alpha : NULL);
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < nr; j++)
                            if (fabs(c[i * ldc + j] - want[i * nr + j]) > 1e-5 * (1 + kk))
                                fail_msg("%s gemm m%d k%d trans%d: C[%d][%d] = %g, want %g", k->name,
                                         m, kk, trans, i, j, c[i * ldc + j], want[i * nr + j]);
                }
            }
    }
}

static void test_softmax_update(void **state)
{
    (void)state;
    fa_rng r = { seed + 1 };
    FOR_EACH_TABLE(k)
    {
        enum { N = 37, LDS = 72 };
        const int cols = k->nr / 2 * 2;
        float st[N * LDS], m[64], l[64], alpha[64];
        double p_want[N * LDS], l_want[64], a_want[64], m_want[64];
        for (int i = 0; i < cols; i++) {
            /* column 0: no visible key at all; column 1: none before, some now */
            m[i] = i < 2 ? -INFINITY : (float)(20 * fa_rng_uniform(&r));
            l[i] = i < 2 ? 0.0f : (float)(1 + fa_rng_uniform(&r));
            for (int j = 0; j < N; j++) {
                float s = (float)(30 * fa_rng_uniform(&r));
                if (i == 0 || (j + i) % 5 == 0)
                    s = -INFINITY;
                if (i == 3 && j == 4)
                    s = -140.0f; /* below 2^-126 after the shift: must give exactly 0 */
                st[j * LDS + i] = s;
            }
            double mx = m[i];
            for (int j = 0; j < N; j++)
                mx = fmax(mx, st[j * LDS + i]);
            double base = mx == -INFINITY ? 0.0 : mx, sum = 0.0;
            for (int j = 0; j < N; j++) {
                /* the contract's input is the float32 difference s - m */
                p_want[j * LDS + i] = exp2((double)(st[j * LDS + i] - (float)base));
                if (p_want[j * LDS + i] < 0x1p-126)
                    p_want[j * LDS + i] = 0.0;
                sum += p_want[j * LDS + i];
            }
            a_want[i] = exp2((double)(m[i] - (float)base));
            l_want[i] = l[i] * a_want[i] + sum;
            m_want[i] = mx;
        }
        k->softmax_update(N, cols, st, LDS, m, l, alpha);
        for (int i = 0; i < cols; i++) {
            assert_true(m[i] == (float)m_want[i]);
            if (!(fabs(alpha[i] - a_want[i]) <= 4e-7 * a_want[i]) ||
                !(fabs(l[i] - l_want[i]) <= 2e-6 * l_want[i] + 1e-30)) /* f32 sum of N terms */
                fail_msg("%s softmax col %d: alpha %g (want %g) l %g (want %g)", k->name, i,
                         alpha[i], a_want[i], l[i], l_want[i]);
            for (int j = 0; j < N; j++) {
                double g = st[j * LDS + i], w = p_want[j * LDS + i];
                if (!(fabs(g - w) <= 3e-7 * w) && !(w == 0.0 && g == 0.0))
                    fail_msg("%s softmax p[%d][%d] = %.9g, want %.9g", k->name, j, i, g, w);
            }
        }
    }
}

static void test_softcap(void **state)
{
    (void)state;
    FOR_EACH_TABLE(k)
    {
        enum { COLS = 64 }; /* a multiple of every table's nr / 2 */
        float st[2 * COLS];
        const float caps[] = { 1.0f, 30.0f };
        for (int c = 0; c < 2; c++) {
            /* |s/cap| over 1e-6 .. 100 both signs, across the series/exp switch at 0.5 */
            double worst = 0;
            for (int step = 0; step < 400; step++) {
                double mag = pow(10.0, -6.0 + 8.0 * step / 399.0);
                for (int i = 0; i < 2 * COLS; i++)
                    st[i] = (float)((i % 2 ? -1 : 1) * mag * caps[c] * (1.0 + 0.001 * i));
                float in[2 * COLS];
                memcpy(in, st, sizeof(in));
                k->softcap(2, COLS, st, COLS, caps[c]);
                for (int i = 0; i < 2 * COLS; i++) {
                    double want = caps[c] * tanh((double)in[i] / caps[c]) * 1.4426950408889634;
                    double rel = fabs(st[i] - want) / fabs(want);
                    worst = fmax(worst, rel);
                }
            }
            print_message("%s softcap %g: worst relative error %.2g\n", k->name, caps[c], worst);
            assert_true(worst < 1e-6);
        }
    }
}

static void test_dot_axpy(void **state)
{
    (void)state;
    fa_rng r = { seed + 2 };
    const fa_dtype types[] = { FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16 };
    FOR_EACH_TABLE(k)
    for (int ti = 0; ti < 3; ti++)
        for (int di = 0; di < 5; di++) {
            /* 8 and 12: rows shorter than a 16-lane vector (8-lane and gathered paths);
             * N spans two blocks of 16 keys and a tail */
            const int dim = (const int[]){ 1, 8, 12, 38, 75 }[di];
            enum { H = 3, M = 2, N = 37, LDS = 8 };
            const fa_dtype t = types[ti];
            const ptrdiff_t ldkv = H * 80; /* [seq, heads, dim] */
            uint16_t kv16[2][N * H * 80];
            float kv32[2][N * H * 80], q[H * M * 80], o[H * M * 80], o0[H * M * 80];
            float st[H * M + N * LDS * 2], alpha[8];
            for (int w = 0; w < 2; w++)
                for (int i = 0; i < N * H * 80; i++) {
                    double x = fa_rng_uniform(&r);
                    fa_ref_encode(t, t == FA_DTYPE_F32 ? (void *)kv32[w] : (void *)kv16[w], i, x);
                }
            for (int i = 0; i < H * M * 80; i++) {
                q[i] = (float)fa_rng_uniform(&r);
                o[i] = o0[i] = (float)fa_rng_uniform(&r);
            }
            for (int i = 0; i < 8; i++)
                alpha[i] = (float)(0.5 + 0.5 * fa_rng_uniform(&r));
            const void *kp = t == FA_DTYPE_F32 ? (void *)kv32[0] : (void *)kv16[0];
            const void *vp = t == FA_DTYPE_F32 ? (void *)kv32[1] : (void *)kv16[1];
            /* heads' columns side by side in one score tile, as decode.c lays them */
            fa_cpu_heads hs = { H, (ptrdiff_t)M * 80, 80, M, (ptrdiff_t)M * 80, M, NULL, 0, 0, 0, 0 };
            memset(st, 0, sizeof(st));
            k->dot(t, &hs, M, N, dim, q, 80, kp, ldkv, st, LDS);
            for (int h = 0; h < H; h++)
                for (int j = 0; j < N; j++)
                    for (int i = 0; i < M; i++) {
                        double s = 0;
                        for (int x = 0; x < dim; x++)
                            s += (double)q[h * M * 80 + i * 80 + x] *
                                 fa_ref_decode(t, kp, j * ldkv + h * 80 + x);
                        double g = st[h * M + j * LDS + i];
                        if (fabs(g - s) > 1e-5 * (1 + dim))
                            fail_msg("%s dot %d: got %g want %g", k->name, (int)t, g, s);
                    }
            for (int f16p = 0; f16p < 2; f16p++) {
                fa_cpu_axpy_fn *axpy = f16p ? k->axpy_f16p : k->axpy;
                if (!axpy)
                    continue;
                memcpy(o, o0, sizeof(o));
                axpy(t, &hs, M, N, dim, st, LDS, vp, ldkv, o, 80, alpha);
                for (int h = 0; h < H; h++)
                    for (int i = 0; i < M; i++)
                        for (int x = 0; x < dim; x++) {
                            double w = (double)alpha[h * M + i] * o0[h * M * 80 + i * 80 + x];
                            for (int j = 0; j < N; j++) {
                                const double p = st[h * M + j * LDS + i];
                                w += (f16p ? p_f16(t, dim, p) : p) *
                                     fa_ref_decode(t, vp, j * ldkv + h * 80 + x);
                            }
                            double g = o[h * M * 80 + i * 80 + x];
                            if (fabs(g - w) > 1e-4 * (1 + dim))
                                fail_msg("%s axpy%s %d: got %g want %g", k->name, f16p ? "_f16p" : "",
                                         (int)t, g, w);
                        }
            }
        }
}

/* The decode kernels at head dims that are whole vectors (the paths that fold many columns'
 * sums together): head counts and rows per head from one column to more than a vector's
 * worth, columns side by side in the score tile and spread out (a sequence with fewer rows
 * than the task's columns), keys past a block of 8 and 16. */
static void test_dot_axpy_vectors(void **state)
{
    (void)state;
    fa_rng r = { seed + 6 };
    enum { N = 37, DMAX = 128, CMAX = 64 };
    static const int shapes[][2] = { { 1, 1 }, { 3, 1 }, { 32, 1 }, { 1, 4 }, { 8, 4 }, { 3, 2 },
                                     { 5, 3 }, { 2, 8 }, { 2, 16 }, { 17, 1 } };
    const fa_dtype types[] = { FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16 };
    float *q = malloc(sizeof(float) * CMAX * 2 * DMAX), *o = malloc(sizeof(float) * CMAX * 2 * DMAX);
    float *o0 = malloc(sizeof(float) * CMAX * 2 * DMAX), *st = malloc(sizeof(float) * N * CMAX * 2);
    float *kv32 = malloc(sizeof(float) * 2 * N * 32 * DMAX), alpha[CMAX * 2];
    uint16_t *kv16 = malloc(sizeof(uint16_t) * 2 * N * 32 * DMAX);
    FOR_EACH_TABLE(k)
    for (int ti = 0; ti < 3; ti++)
        for (int di = 0; di < 3; di++)
            for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
                for (int spread = 0; spread < 2; spread++) {
                    const int dim = (const int[]){ 16, 64, 128 }[di], H = shapes[si][0], M = shapes[si][1];
                    const int cols = M + spread; /* a head's columns in st */
                    const ptrdiff_t lds = (ptrdiff_t)H * cols + 3, ld = (ptrdiff_t)H * dim; /* [seq, heads, dim] */
                    const fa_dtype t = types[ti];
                    void *kp = t == FA_DTYPE_F32 ? (void *)kv32 : (void *)kv16;
                    void *vp = t == FA_DTYPE_F32 ? (void *)(kv32 + N * ld) : (void *)(kv16 + N * ld);
                    for (ptrdiff_t i = 0; i < 2 * N * ld; i++)
                        fa_ref_encode(t, kp, i, fa_rng_uniform(&r));
                    for (int i = 0; i < H * cols * dim; i++) {
                        q[i] = (float)fa_rng_uniform(&r);
                        o[i] = o0[i] = (float)fa_rng_uniform(&r);
                    }
                    for (int i = 0; i < H * cols; i++)
                        alpha[i] = (float)(0.5 + 0.5 * fa_rng_uniform(&r));
                    for (ptrdiff_t i = 0; i < N * lds; i++)
                        st[i] = -7.0f; /* entries the kernel must not touch */
                    const ptrdiff_t esz = t == FA_DTYPE_F32 ? 4 : 2;
                    /* every other shape with the prefetch hint: V's rows while dot runs */
                    fa_cpu_heads hs = { H, (ptrdiff_t)cols * dim, dim, cols, (ptrdiff_t)cols * dim, cols,
                                        si % 2 ? (const char *)vp : NULL, ld * esz, dim * esz, dim * esz, N };
                    k->dot(t, &hs, M, N, dim, q, dim, kp, ld, st, lds);
                    for (int j = 0; j < N; j++)
                        for (int c = 0; c < H * cols; c++) {
                            const int h = c / cols, i = c % cols;
                            const double g = st[j * lds + c];
                            if (i >= M) {
                                if (g != -7.0f)
                                    fail_msg("%s dot wrote column %d of head %d (dim %d, %dx%d)", k->name, i, h,
                                             dim, H, M);
                                continue;
                            }
                            double want = 0;
                            for (int x = 0; x < dim; x++)
                                want += (double)q[h * cols * dim + i * dim + x] *
                                        fa_ref_decode(t, kp, j * ld + h * dim + x);
                            if (fabs(g - want) > 1e-5 * (1 + dim))
                                fail_msg("%s dot dtype %d dim %d %dx%d key %d col %d: got %g want %g", k->name,
                                         (int)t, dim, H, M, j, c, g, want);
                        }
                    for (int j = 0; j < N; j++) /* small weights, as probabilities are */
                        for (int c = 0; c < H * cols; c++)
                            st[j * lds + c] = (float)(0.5 + 0.5 * fa_rng_uniform(&r));
                    if (hs.pf) /* and K's while axpy runs */
                        hs.pf = (const char *)kp;
                    for (int f16p = 0; f16p < 2; f16p++) {
                        fa_cpu_axpy_fn *axpy = f16p ? k->axpy_f16p : k->axpy;
                        if (!axpy)
                            continue;
                        memcpy(o, o0, sizeof(float) * H * cols * dim);
                        axpy(t, &hs, M, N, dim, st, lds, vp, ld, o, dim, alpha);
                        for (int h = 0; h < H; h++)
                            for (int i = 0; i < cols; i++)
                                for (int x = 0; x < dim; x++) {
                                    const int e = h * cols * dim + i * dim + x;
                                    double want = o0[e];
                                    if (i < M) {
                                        want *= alpha[h * cols + i];
                                        for (int j = 0; j < N; j++) {
                                            const double p = st[j * lds + h * cols + i];
                                            want += (f16p ? p_f16(t, dim, p) : p) *
                                                    fa_ref_decode(t, vp, j * ld + h * dim + x);
                                        }
                                    }
                                    if (fabs(o[e] - want) > 1e-4 * (1 + dim))
                                        fail_msg("%s axpy%s dtype %d dim %d %dx%d row %d x %d: got %g want %g",
                                                 k->name, f16p ? "_f16p" : "", (int)t, dim, H, M, i, x,
                                                 o[e], want);
                                }
                    }
                }
    free(q);
    free(o);
    free(o0);
    free(st);
    free(kv32);
    free(kv16);
}

static void test_conversions(void **state)
{
    (void)state;
    fa_rng r = { seed + 3 };
    FOR_EACH_TABLE(k)
    {
        enum { N = 1000 };
        uint16_t h[N], out[N];
        float f[N], back[N];
        /* every class of half: random bits, plus zeros, subnormals, inf, NaN */
        for (int i = 0; i < N; i++)
            h[i] = (uint16_t)fa_rng_next(&r);
        h[0] = 0x0000, h[1] = 0x8000, h[2] = 0x0001, h[3] = 0x03ff, h[4] = 0x7c00, h[5] = 0xfc00;
        for (int t = 1; t <= 2; t++) {
            k->load((fa_dtype)t, h, f, N, 1.0f);
            for (int i = 0; i < N; i++) {
                double want = fa_ref_decode((fa_dtype)t, h, i);
                assert_true((isnan(want) && isnan(f[i])) || f[i] == (float)want);
            }
        }
        /* store: rounding to nearest even, checked against the scalar converters
         * on values between representable halves, ties included */
        for (int i = 0; i < N; i++) {
            uint32_t bits = (uint32_t)fa_rng_next(&r);
            if (i % 3 == 0)
                bits = (bits & 0xffffe000u) | 0x1000u; /* f16 tie */
            if (i % 3 == 1)
                bits = (bits & 0xffff0000u) | 0x8000u; /* bf16 tie */
            memcpy(&f[i], &bits, 4);
            if (!isfinite(f[i]) || fabsf(f[i]) > 6e4f)
                f[i] = (float)fa_rng_uniform(&r) * 100.0f;
        }
        k->store(FA_DTYPE_F16, f, out, N, 1.0f);
        for (int i = 0; i < N; i++)
            if (out[i] != fa_f32_to_f16(f[i]))
                fail_msg("%s store f16 %.9g: %04x, want %04x", k->name, f[i], out[i],
                         fa_f32_to_f16(f[i]));
        k->store(FA_DTYPE_BF16, f, out, N, 1.0f);
        for (int i = 0; i < N; i++)
            assert_int_equal(out[i], fa_f32_to_bf16(f[i]));
        /* and the scalar converter itself is nearest-even against double */
        for (int i = 0; i < N; i++) {
            uint16_t got = fa_f32_to_f16(f[i]), up = (uint16_t)(got + 1), dn = (uint16_t)(got - 1);
            double x = f[i], g = fa_ref_decode(FA_DTYPE_F16, &got, 0);
            /* neighbours one unit in the last place away (NaN patterns are no neighbours) */
            double da = fabs(fa_ref_decode(FA_DTYPE_F16, &up, 0) - x);
            double db = fabs(fa_ref_decode(FA_DTYPE_F16, &dn, 0) - x);
            da = isnan(da) ? INFINITY : da;
            db = isnan(db) ? INFINITY : db;
            assert_true(fabs(g - x) <= da && fabs(g - x) <= db);
            if ((fabs(g - x) == da || fabs(g - x) == db) && (got & 0x7fff) != 0)
                assert_int_equal(got & 1, 0);
        }
        k->load(FA_DTYPE_F32, f, back, N, 2.0f);
        for (int i = 0; i < N; i++)
            assert_true(back[i] == 2.0f * f[i]);
        /* e4m3: every byte (0x7f and 0xff NaN), from every offset of a row, times factors that
         * round, one past float32's range at 256x (the scalar route) */
        uint8_t e8[2 * 256];
        for (int c = 0; c < 256; c++)
            e8[c] = e8[c + 256] = (uint8_t)c;
        static const float muls[] = { 1.0f, 0.3f, -1.7e-3f, 3e36f };
        for (size_t m = 0; m < sizeof(muls) / sizeof(muls[0]); m++)
            for (int off = 0; off < 20; off++) {
                k->load(FA_DTYPE_E4M3, e8 + off, f, 256, muls[m]);
                for (int i = 0; i < 256; i++) {
                    const float want = muls[m] * (float)fa_ref_decode(FA_DTYPE_E4M3, e8, off + i);
                    if (f[i] != want && !(isnan(want) && isnan(f[i])))
                        fail_msg("%s load e4m3 %02x * %g: %.9g, want %.9g", k->name, e8[off + i],
                                 (double)muls[m], (double)f[i], (double)want);
                }
            }
    }
}

/* The vector Philox must give fa_dropout_mask's bits, for any alignment of the keys. */
static void test_dropout_apply(void **state)
{
    (void)state;
    fa_rng r = { seed + 4 };
    FOR_EACH_TABLE(k)
    for (int t = 0; t < 60; t++) {
        enum { N = 70, COLS = 64, LDS = 72 };
        float st[N * LDS];
        int32_t head[COLS], row[COLS];
        uint8_t want[N];
        float p = (float)(0.5 + 0.499 * fa_rng_uniform(&r)), scale = 1.0f / (1.0f - p);
        uint64_t s = fa_rng_next(&r), off = fa_rng_next(&r);
        int32_t b = (int32_t)(fa_rng_next(&r) % 50), n = 1 + (int32_t)(fa_rng_next(&r) % N);
        int64_t col0 = (int64_t)(fa_rng_next(&r) % 5000);
        for (int c = 0; c < COLS; c++) {
            head[c] = (int32_t)(fa_rng_next(&r) % 40);
            row[c] = (int32_t)(fa_rng_next(&r) % 5000);
        }
        for (int i = 0; i < N * LDS; i++)
            st[i] = 1.0f;
        k->dropout_apply(n, COLS, st, LDS, s, off, b, head, row, col0,
                         (uint32_t)ceil((double)p * 16777216.0), scale);
        for (int c = 0; c < COLS; c++) {
            assert_int_equal(fa_dropout_mask(p, s, off, b, head[c], row[c], 1, (int32_t)col0, n, want, n),
                             FA_OK);
            for (int j = 0; j < N; j++) {
                float w = j < n ? (want[j] ? scale : 0.0f) : 1.0f; /* nothing past n */
                if (st[j * LDS + c] != w)
                    fail_msg("%s dropout col %d key %d: %g, want %g", k->name, c, j, st[j * LDS + c], w);
            }
        }
    }
}

/* The registry: report names follow each table's own name, "ref" is last and always usable. */
static void test_tables(void **state)
{
    (void)state;
    assert_true(fa_cpu_kernel_table_count >= 1);
    for (int i = 0; i < fa_cpu_kernel_table_count; i++) {
        const fa_cpu_kernel_entry *e = &fa_cpu_kernel_tables[i];
        char want[64];
        snprintf(want, sizeof(want), "flash-%s", e->kern->name);
        assert_string_equal(e->report[FA_CPU_REPORT_FLASH], want);
        snprintf(want, sizeof(want), "backward-standard-%s", e->kern->name);
        assert_string_equal(e->report[FA_CPU_REPORT_BACKWARD_STANDARD], want);
        assert_true(e->kern->mr >= 1 && e->kern->nr % 2 == 0);
        printf("table %s: %s\n", e->kern->name, e->usable(&features) ? "runs here" : "unsupported here");
    }
    const fa_cpu_kernel_entry *last = &fa_cpu_kernel_tables[fa_cpu_kernel_table_count - 1];
    assert_string_equal(last->kern->name, "ref");
    assert_true(last->usable(&features));
}

int main(void)
{
    fa_cpu_features_probe(&features);
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("kernels: seed %llu (replay: FLASHATTN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_softmax_update),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_dot_axpy),
        cmocka_unit_test(test_dot_axpy_vectors),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_dropout_apply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
