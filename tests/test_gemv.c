/* SPDX-License-Identifier: MIT */
/*
 * The CUDA engine's few-row projections (src/model/cuda/gemv.h) against float64, for T = 1..8
 * rows, head-room and odd sizes (K = 8 .. 4096, N odd), where a device answers (exit 77, a
 * skip, otherwise):
 * - norm + projection (bf16 and float32 out, rows picked through a table), norm + gate/up +
 *   SwiGLU, projection + residual add: within the bound of their roundings (the normed rows
 *   and the gate and up values rounded to bf16, float32 sums over K);
 * - a row's bits are the same alone (T = 1) and at every place of a batch;
 * - the norm is fa_layers_rmsnorm's bit for bit (a projection picking coordinates returns it);
 * - columns past N of a pitched output are left as they were; T past what fits is refused;
 * - kernels reading what the one before wrote give the same bits back to back, from a graph
 *   and with the host waiting after each.
 * Fresh random inputs; FLASHATTN_TEST_SEED=N replays a run.
 */
#include "gemv.h"
#include "layers.h"

#include <cuda_runtime_api.h>
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

enum { MAXT = FA_GEMV_MAX_ROWS, PAD = 3 /* extra output columns of a pitched y */ };

static uint64_t seed;
static fa_gemv_config cfg;
static const float eps = 1e-5f;

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* nearest even (finite inputs) */
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t rng;
static double uniform(void) /* [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

static void *dev(const void *host, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, bytes ? bytes : 1), cudaSuccess);
    if (host)
        assert_int_equal(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
}

static void get(void *host, const void *d, size_t bytes)
{
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* A problem: x float32 [MAXT, K] (the rows to norm, in a scrambled order through rows[]),
 * g [K], the bf16 rows in [MAXT, K], w bf16 [2 N, K] (the SwiGLU's gate rows then up rows). */
typedef struct prob {
    int K, N;
    float *x, *g;
    uint16_t *in, *w;
    int32_t rows[MAXT];
    double *xn; /* [MAXT, K] float64 normed rows of x */
} prob;

static void prob_make(prob *p, int K, int N)
{
    p->K = K, p->N = N;
    p->x = malloc(sizeof(float) * MAXT * K), p->g = malloc(sizeof(float) * K);
    p->in = malloc(2 * (size_t)MAXT * K), p->w = malloc(2 * (size_t)2 * N * K);
    p->xn = malloc(sizeof(double) * MAXT * K);
    assert_true(p->x && p->g && p->in && p->w && p->xn);
    for (int i = 0; i < MAXT * K; i++) {
        p->x[i] = (float)(3.0 * uniform()) + (i % 7 == 0 ? 2.0f : 0.0f);
        p->in[i] = to_bf16((float)uniform());
    }
    for (int k = 0; k < K; k++)
        p->g[k] = (float)(0.5 + uniform() * 0.4);
    for (size_t i = 0; i < (size_t)2 * N * K; i++)
        p->w[i] = to_bf16((float)(uniform() * 0.1));
    for (int t = 0; t < MAXT; t++)
        p->rows[t] = (t * 5 + 3) % MAXT; /* a permutation: every row once */
    for (int t = 0; t < MAXT; t++) {
        const float *xr = p->x + (size_t)t * K;
        double ss = 0.0;
        for (int k = 0; k < K; k++)
            ss += (double)xr[k] * xr[k];
        const double inv = 1.0 / sqrt(ss / K + eps);
        for (int k = 0; k < K; k++)
            p->xn[(size_t)t * K + k] = p->g[k] * (inv * xr[k]);
    }
}

static void prob_free(prob *p)
{
    free(p->x), free(p->g), free(p->in), free(p->w), free(p->xn);
}

/* w row j . a [K] (float64), and the sum of the products' magnitudes */
static double dot(const prob *p, int j, const double *a, double *mag)
{
    double s = 0.0, m = 0.0;
    for (int k = 0; k < p->K; k++) {
        const double t = from_bf16(p->w[(size_t)j * p->K + k]) * a[k];
        s += t, m += fabs(t);
    }
    *mag = m;
    return s;
}

/* The bound of a dot product over normed rows rounded to bf16 and summed in float32 */
static double norm_dot_tol(int K, double mag) { return (ldexp(1.0, -8) + K * ldexp(1.0, -23)) * mag * 1.01 + 1e-30; }

static const int sizes[][2] = { { 8, 1 }, { 64, 37 }, { 1000, 77 }, { 4096, 301 } }; /* K, N */
enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]) };

/* norm + projection, bf16 (table rows) and float32 (rows in order) out, T = 1..8 */
static void test_norm_proj(void **state)
{
    (void)state;
    for (int z = 0; z < NSIZES; z++) {
        prob p;
        prob_make(&p, sizes[z][0], sizes[z][1]);
        const int K = p.K, N = p.N, ldy = N + PAD;
        float *dx = dev(p.x, sizeof(float) * MAXT * K), *dg = dev(p.g, sizeof(float) * K);
        uint16_t *dw = dev(p.w, 2 * (size_t)N * K);
        int32_t *drows = dev(p.rows, sizeof(p.rows));
        for (int f32 = 0; f32 < 2; f32++) {
            const size_t es = f32 ? 4 : 2, ybytes = es * (size_t)MAXT * ldy;
            unsigned char *y = malloc(ybytes), *alone = malloc(ybytes), *sentinel = malloc(ybytes);
            assert_true(y && alone && sentinel);
            memset(sentinel, 0x5a, ybytes);
            void *dy = dev(sentinel, ybytes);
            /* each row alone, then every T */
            const int32_t *rt = f32 ? NULL : drows;
            for (int t = 0; t < MAXT; t++)
                assert_int_equal(fa_gemv_norm_proj(&cfg, (char *)dy + es * (size_t)t * ldy, f32, ldy,
                                                   f32 ? dx + (size_t)t * K : dx, f32 ? NULL : drows + t, dg, eps, dw,
                                                   1, N, K, NULL),
                                 cudaSuccess);
            get(alone, dy, ybytes);
            for (int T = 1; T <= MAXT; T++) {
                assert_int_equal(cudaMemcpy(dy, sentinel, ybytes, cudaMemcpyHostToDevice), cudaSuccess);
                assert_int_equal(fa_gemv_norm_proj(&cfg, dy, f32, ldy, dx, rt, dg, eps, dw, T, N, K, NULL),
                                 cudaSuccess);
                get(y, dy, ybytes);
                for (int t = 0; t < MAXT; t++)
                    for (int j = 0; j < ldy; j++) {
                        const size_t at = es * ((size_t)t * ldy + j);
                        if (t >= T || j >= N) { /* untouched */
                            assert_memory_equal(y + at, sentinel + at, es);
                            continue;
                        }
                        if (memcmp(y + at, alone + at, es) != 0)
                            fail_msg("K %d N %d f32 %d T %d: row %d column %d differs from the row alone", K, N, f32,
                                     T, t, j);
                        double mag;
                        const int xr = f32 ? t : p.rows[t]; /* the x row that output row t norms */
                        const double want = dot(&p, j, p.xn + (size_t)xr * K, &mag);
                        float got;
                        if (f32)
                            memcpy(&got, y + at, 4);
                        else {
                            uint16_t h;
                            memcpy(&h, y + at, 2);
                            got = from_bf16(h);
                        }
                        const double tol = norm_dot_tol(K, mag) + (f32 ? 0.0 : ldexp(fabs(want), -8));
                        if (!(fabs(got - want) <= tol))
                            fail_msg("K %d N %d f32 %d T %d: y[%d][%d] = %.8g, float64 %.8g (tolerance %.3g)", K, N,
                                     f32, T, t, j, got, want, tol);
                    }
            }
            cudaFree(dy);
            free(y), free(alone), free(sentinel);
        }
        cudaFree(dx), cudaFree(dg), cudaFree(dw), cudaFree(drows);
        prob_free(&p);
    }
}

/* A projection onto N of the K coordinates (weights of 1 at column n K / N of row n) returns
 * those elements of the normed rows: fa_layers_rmsnorm's bits, over its register paths (K <=
 * 8192) and its long rows (16384). */
static void test_norm_is_rmsnorm(void **state)
{
    (void)state;
    const int Ks[] = { 64, 2048, 4096, 16384 };
    for (size_t z = 0; z < sizeof(Ks) / sizeof(Ks[0]); z++) {
        const int K = Ks[z], N = K < 256 ? K : 256, step = K / N;
        const int T = fa_gemv_rows(&cfg, K);
        assert_true(T >= 1);
        prob p;
        prob_make(&p, K, 1);
        uint16_t *pick = calloc((size_t)N * K, 2), *a = malloc(2 * (size_t)MAXT * K), *b = malloc(2 * (size_t)MAXT * N);
        assert_true(pick && a && b);
        for (int n = 0; n < N; n++)
            pick[(size_t)n * K + (size_t)n * step] = 0x3f80; /* 1.0 */
        float *dx = dev(p.x, sizeof(float) * MAXT * K), *dg = dev(p.g, sizeof(float) * K);
        uint16_t *dpick = dev(pick, 2 * (size_t)N * K), *dy = dev(NULL, 2 * (size_t)MAXT * N);
        uint16_t *dn = dev(NULL, 2 * (size_t)MAXT * K);
        int32_t *drows = dev(p.rows, sizeof(p.rows));
        assert_int_equal(fa_layers_rmsnorm(dn, dx, drows, dg, T, K, eps, NULL), cudaSuccess);
        assert_int_equal(fa_gemv_norm_proj(&cfg, dy, 0, N, dx, drows, dg, eps, dpick, T, N, K, NULL), cudaSuccess);
        get(a, dn, 2 * (size_t)T * K);
        get(b, dy, 2 * (size_t)T * N);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++)
                if (a[(size_t)t * K + (size_t)n * step] != b[(size_t)t * N + n])
                    fail_msg("K %d row %d: element %d is %#x, fa_layers_rmsnorm's %#x", K, t, n * step,
                             b[(size_t)t * N + n], a[(size_t)t * K + (size_t)n * step]);
        cudaFree(dx), cudaFree(dg), cudaFree(dpick), cudaFree(dy), cudaFree(dn), cudaFree(drows);
        free(pick), free(a), free(b);
        prob_free(&p);
    }
}

/* norm + gate/up + SwiGLU, T = 1..8 */
static void test_norm_swiglu(void **state)
{
    (void)state;
    for (int z = 0; z < NSIZES; z++) {
        prob p;
        prob_make(&p, sizes[z][0], sizes[z][1]);
        const int K = p.K, N = p.N;
        float *dx = dev(p.x, sizeof(float) * MAXT * K), *dg = dev(p.g, sizeof(float) * K);
        uint16_t *dw = dev(p.w, 2 * (size_t)2 * N * K), *dy = dev(NULL, 2 * (size_t)MAXT * N);
        uint16_t *y = malloc(2 * (size_t)MAXT * N), *alone = malloc(2 * (size_t)MAXT * N);
        assert_true(y && alone);
        for (int t = 0; t < MAXT; t++)
            assert_int_equal(fa_gemv_norm_swiglu(&cfg, dy + (size_t)t * N, dx + (size_t)t * K, dg, eps, dw, 1, N, K,
                                                 NULL),
                             cudaSuccess);
        get(alone, dy, 2 * (size_t)MAXT * N);
        for (int T = 1; T <= MAXT; T++) {
            assert_int_equal(fa_gemv_norm_swiglu(&cfg, dy, dx, dg, eps, dw, T, N, K, NULL), cudaSuccess);
            get(y, dy, 2 * (size_t)T * N);
            for (int t = 0; t < T; t++) {
                const double *xn = p.xn + (size_t)t * K;
                for (int j = 0; j < N; j++) {
                    const size_t at = (size_t)t * N + j;
                    if (y[at] != alone[at])
                        fail_msg("K %d N %d T %d: row %d column %d differs from the row alone", K, N, T, t, j);
                    double mg, mu;
                    const double gt = dot(&p, j, xn, &mg), up = dot(&p, N + j, xn, &mu);
                    const double dgt = norm_dot_tol(K, mg) + ldexp(fabs(gt), -8);
                    const double dup = norm_dot_tol(K, mu) + ldexp(fabs(up), -8);
                    const double sg = gt / (1.0 + exp(-gt)), want = sg * up;
                    const double tol = 1.1 * dgt * (fabs(up) + dup) + fabs(sg) * dup + ldexp(fabs(want), -7) + 1e-30;
                    const double got = from_bf16(y[at]);
                    if (!(fabs(got - want) <= tol))
                        fail_msg("K %d N %d T %d: out[%d][%d] = %.8g, float64 %.8g (tolerance %.3g)", K, N, T, t, j,
                                 got, want, tol);
                }
            }
        }
        cudaFree(dx), cudaFree(dg), cudaFree(dw), cudaFree(dy);
        free(y), free(alone);
        prob_free(&p);
    }
}

/* projection + residual add into a pitched float32 stream, T = 1..8 */
static void test_residual(void **state)
{
    (void)state;
    for (int z = 0; z < NSIZES; z++) {
        prob p;
        prob_make(&p, sizes[z][0], sizes[z][1]);
        const int K = p.K, N = p.N, ldx = N + PAD;
        const size_t xbytes = sizeof(float) * MAXT * ldx;
        float *x0 = malloc(xbytes), *x = malloc(xbytes), *alone = malloc(xbytes);
        double *a = malloc(sizeof(double) * K);
        assert_true(x0 && x && alone && a);
        for (int i = 0; i < MAXT * ldx; i++)
            x0[i] = (float)uniform();
        float *dx = dev(x0, xbytes);
        uint16_t *din = dev(p.in, 2 * (size_t)MAXT * K), *dw = dev(p.w, 2 * (size_t)N * K);
        for (int t = 0; t < MAXT; t++)
            assert_int_equal(fa_gemv_residual(&cfg, dx + (size_t)t * ldx, ldx, din + (size_t)t * K, dw, 1, N, K, NULL),
                             cudaSuccess);
        get(alone, dx, xbytes);
        for (int T = 1; T <= MAXT; T++) {
            assert_int_equal(cudaMemcpy(dx, x0, xbytes, cudaMemcpyHostToDevice), cudaSuccess);
            assert_int_equal(fa_gemv_residual(&cfg, dx, ldx, din, dw, T, N, K, NULL), cudaSuccess);
            get(x, dx, xbytes);
            for (int t = 0; t < MAXT; t++) {
                for (int k = 0; k < K; k++)
                    a[k] = from_bf16(p.in[(size_t)t * K + k]);
                for (int j = 0; j < ldx; j++) {
                    const size_t at = (size_t)t * ldx + j;
                    if (t >= T || j >= N) {
                        assert_memory_equal(&x[at], &x0[at], 4);
                        continue;
                    }
                    if (memcmp(&x[at], &alone[at], 4) != 0)
                        fail_msg("K %d N %d T %d: row %d column %d differs from the row alone", K, N, T, t, j);
                    double mag;
                    const double want = x0[at] + dot(&p, j, a, &mag);
                    const double tol = K * ldexp(1.0, -23) * mag * 1.01 + ldexp(fabs(want) + fabs(x0[at]), -23);
                    if (!(fabs(x[at] - want) <= tol))
                        fail_msg("K %d N %d T %d: x[%d][%d] = %.8g, float64 %.8g (tolerance %.3g)", K, N, T, t, j,
                                 x[at], want, tol);
                }
            }
        }
        cudaFree(dx), cudaFree(din), cudaFree(dw);
        free(x0), free(x), free(alone), free(a);
        prob_free(&p);
    }
}

/* Kernels that read what the one before wrote (norm + projection of x into y, then x += y W^T,
 * eight times), queued back to back on a stream, and replayed from a captured graph: the bits
 * of the same launches with the host waiting after each. Launched as programmatic dependents,
 * a kernel that read before its wait would see the previous x or y. */
static void test_chained(void **state)
{
    (void)state;
    enum { K = 1024, T = 2, STEPS = 8 };
    prob p;
    prob_make(&p, K, K);
    const size_t xbytes = sizeof(float) * T * K;
    float *want = malloc(xbytes), *got = malloc(xbytes);
    assert_true(want && got);
    float *dx = dev(p.x, xbytes), *dg = dev(p.g, sizeof(float) * K);
    uint16_t *dw = dev(p.w, 2 * (size_t)K * K), *dy = dev(NULL, 2 * (size_t)T * K);
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    for (int mode = 0; mode < 3; mode++) { /* host waits after each, back to back, a graph */
        assert_int_equal(cudaMemcpy(dx, p.x, xbytes, cudaMemcpyHostToDevice), cudaSuccess);
        cudaGraph_t graph = NULL;
        if (mode == 2)
            assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed), cudaSuccess);
        for (int i = 0; i < STEPS; i++) {
            assert_int_equal(fa_gemv_norm_proj(&cfg, dy, 0, K, dx, NULL, dg, eps, dw, T, K, K, st), cudaSuccess);
            if (mode == 0)
                assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
            assert_int_equal(fa_gemv_residual(&cfg, dx, K, dy, dw, T, K, K, st), cudaSuccess);
            if (mode == 0)
                assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
        }
        if (mode == 2) {
            cudaGraphExec_t exec;
            assert_int_equal(cudaStreamEndCapture(st, &graph), cudaSuccess);
            assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
            assert_int_equal(cudaGraphLaunch(exec, st), cudaSuccess);
            assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }
        assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
        get(mode ? got : want, dx, xbytes);
        if (mode && memcmp(got, want, xbytes) != 0)
            fail_msg("%s: x differs from the launches waited for one by one", mode == 1 ? "back to back" : "graph");
    }
    cudaStreamDestroy(st);
    cudaFree(dx), cudaFree(dg), cudaFree(dw), cudaFree(dy);
    free(want), free(got);
    prob_free(&p);
}

/* What does not fit is refused, nothing launched: K not a multiple of 8, T past the rows. */
static void test_limits(void **state)
{
    (void)state;
    assert_int_equal(fa_gemv_rows(&cfg, 12), 0);
    assert_int_equal(fa_gemv_rows(&cfg, 0), 0);
    assert_int_equal(fa_gemv_rows(&cfg, 64), cfg.max_rows);
    const int big = (cfg.smem_max / 2 / 8) & ~7; /* a row of 4 big elements fills half of it */
    const int r = fa_gemv_rows(&cfg, big * 4);
    assert_true(r >= 1 && r < cfg.max_rows);
    float *dx = dev(NULL, 4 * 64 * MAXT);
    assert_int_equal(fa_gemv_residual(&cfg, dx, 64, NULL, NULL, 0, 8, 64, NULL), cudaErrorInvalidValue);
    assert_int_equal(fa_gemv_residual(&cfg, dx, 64, NULL, NULL, MAXT + 1, 8, 64, NULL), cudaErrorInvalidValue);
    assert_int_equal(fa_gemv_residual(&cfg, dx, 64, NULL, NULL, 1, 8, 12, NULL), cudaErrorInvalidValue);
    cudaFree(dx);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("gemv: skipped, no CUDA device\n");
        return 77;
    }
    if (fa_gemv_config_init(&cfg, 0) != cudaSuccess)
        return 1;
    cfg.max_rows = MAXT; /* every T, whatever FLASHATTN_GEMV_ROWS says */
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    rng = seed;
    printf("gemv: seed %llu (replay: FLASHATTN_TEST_SEED=%llu); %d multiprocessors, %d bytes of shared memory a "
           "block, pdl %d\n",
           (unsigned long long)seed, (unsigned long long)seed, cfg.sms, cfg.smem_max, cfg.pdl);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norm_proj), cmocka_unit_test(test_norm_is_rmsnorm),
        cmocka_unit_test(test_norm_swiglu), cmocka_unit_test(test_residual),
        cmocka_unit_test(test_chained),       cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
