/* SPDX-License-Identifier: MIT */
/*
 * Numerics the grid does not pin down alone: rows with no visible key,
 * huge logits, near-ties, identical bits across thread counts and repeated
 * runs, and correctly rounded 16-bit outputs.
 */
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

static fa_context_t make_ctx(int threads)
{
    fa_context_options o = { sizeof(o), FA_BACKEND_CPU, threads };
    fa_context_t ctx = NULL;
    if (fa_context_create(&o, &ctx) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    return ctx;
}

typedef struct problem {
    fa_attention_desc d;
    float *q, *k, *v, *o, *lse;
} problem;

/* Contiguous BSHD f32 problem with inputs uniform in [-amp_q, amp_q) and [-1, 1). */
static void problem_make(problem *p, int32_t b, int32_t sq, int32_t sk, int32_t hq, int32_t hk,
                         int32_t dim, double amp_q, uint64_t s)
{
    fa_rng r = { s };
    size_t nq = (size_t)b * sq * hq * dim, nk = (size_t)b * sk * hk * dim;
    p->q = malloc(nq * 4);
    p->o = malloc(nq * 4);
    p->k = malloc(nk * 4);
    p->v = malloc(nk * 4);
    p->lse = malloc((size_t)b * hq * sq * 4);
    assert_non_null(p->q && p->o && p->k && p->v && p->lse);
    for (size_t i = 0; i < nq; i++)
        p->q[i] = (float)(amp_q * fa_rng_uniform(&r));
    for (size_t i = 0; i < nk; i++) {
        p->k[i] = (float)fa_rng_uniform(&r);
        p->v[i] = (float)fa_rng_uniform(&r);
    }
    fa_attention_desc_init(&p->d);
    p->d.batch = b;
    p->d.seqlen_q = sq;
    p->d.seqlen_k = sk;
    p->d.num_heads_q = hq;
    p->d.num_heads_kv = hk;
    p->d.head_dim = dim;
    p->d.q = fa_tensor_contiguous(p->q, FA_DTYPE_F32, FA_LAYOUT_BSHD, sq, hq, dim);
    p->d.k = fa_tensor_contiguous(p->k, FA_DTYPE_F32, FA_LAYOUT_BSHD, sk, hk, dim);
    p->d.v = fa_tensor_contiguous(p->v, FA_DTYPE_F32, FA_LAYOUT_BSHD, sk, hk, dim);
    p->d.o = fa_tensor_contiguous(p->o, FA_DTYPE_F32, FA_LAYOUT_BSHD, sq, hq, dim);
    p->d.lse = p->lse;
}

static void problem_free(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->o);
    free(p->lse);
}

static void test_fully_masked_rows(void **state)
{
    (void)state;
    fa_context_t ctx = make_ctx(0);
    /* sq 300 > sk 40, causal, bottom-right aligned: rows 0..259 see no key. */
    problem p;
    problem_make(&p, 1, 300, 40, 2, 1, 64, 1.0, seed);
    p.d.causal = 1;
    for (int algo = 0; algo < 2; algo++) {
        p.d.algorithm = (fa_algorithm)algo;
        memset(p.o, 0xff, 300 * 2 * 64 * 4);
        assert_int_equal(fa_forward(ctx, &p.d), FA_OK);
        for (int i = 0; i < 300; i++)
            for (int h = 0; h < 2; h++) {
                const float *row = p.o + ((size_t)i * 2 + h) * 64;
                float lse = p.lse[h * 300 + i];
                if (i < 260) {
                    for (int x = 0; x < 64; x++)
                        assert_true(row[x] == 0.0f && !signbit(row[x]));
                    assert_true(lse == -INFINITY);
                } else {
                    for (int x = 0; x < 64; x++)
                        assert_true(isfinite(row[x]));
                    assert_true(isfinite(lse));
                }
            }
    }
    /* A window that excludes every key of every row. */
    p.d.causal = 0;
    p.d.window_left = 0;
    p.d.window_right = 0;
    p.d.seqlen_k = 40;
    p.d.algorithm = FA_ALGORITHM_FLASH;
    assert_int_equal(fa_forward(ctx, &p.d), FA_OK);
    for (int i = 0; i < 260; i++)
        assert_true(p.lse[i] == -INFINITY);
    problem_free(&p);
    fa_context_destroy(ctx);
}

/* Max abs error of o against float64 over all rows. */
static double max_err(const problem *p)
{
    size_t n = (size_t)p->d.batch * p->d.seqlen_q * p->d.num_heads_q * p->d.head_dim;
    double *ref = malloc(n * sizeof(double)), e = 0;
    assert_non_null(ref);
    assert_int_equal(fa_ref_attention(&p->d, 1, ref, NULL, NULL), 0);
    for (size_t i = 0; i < n; i++)
        e = isnan(p->o[i]) ? INFINITY : fmax(e, fabs(p->o[i] - ref[i]));
    free(ref);
    return e;
}

/* Flash must stay within 2x of standard attention's error (same f32 arithmetic). */
static void expect_as_good_as_standard(fa_context_t ctx, problem *p, const char *what)
{
    p->d.algorithm = FA_ALGORITHM_STANDARD;
    assert_int_equal(fa_forward(ctx, &p->d), FA_OK);
    double es = max_err(p);
    p->d.algorithm = FA_ALGORITHM_FLASH;
    assert_int_equal(fa_forward(ctx, &p->d), FA_OK);
    double ef = max_err(p);
    print_message("%s: max abs err flash %.3g, standard %.3g\n", what, ef, es);
    assert_true(isfinite(ef) && ef <= 2.0 * es + 1e-6);
}

static void test_large_logits(void **state)
{
    (void)state;
    fa_context_t ctx = make_ctx(0);
    /* q in [-2000, 2000): scaled logits of order 1e4, both signs. The f32
     * rounding of such logits alone moves p by ~1e-3 relative; exp must
     * neither overflow nor lose the row. */
    problem p;
    problem_make(&p, 1, 257, 300, 4, 2, 64, 2000.0, seed + 1);
    p.d.causal = 1;
    expect_as_good_as_standard(ctx, &p, "logits ~1e4");
    /* Near-ties: every key nearly identical, score differences ~1e-6. */
    for (size_t i = 0; i < (size_t)300 * 2 * 64; i++)
        p.k[i] = 0.25f + 1e-7f * (float)(i % 17);
    expect_as_good_as_standard(ctx, &p, "near ties");
    problem_free(&p);
    fa_context_destroy(ctx);
}

static void test_deterministic_across_threads(void **state)
{
    (void)state;
    fa_context_t one = make_ctx(1), two = make_ctx(2), many = make_ctx(7);
    /* The second shape has few tasks, so the planner cuts it into smaller query
     * blocks for more threads; a left window makes each block's first visible
     * key differ. Neither may change a bit. */
    /* The third has softcap, and blocks whose column counts end mid-vector
     * differently for 1 and 2 threads. */
    const int32_t shapes[3][5] = { { 2, 333, 517, 8, 2 }, { 1, 700, 900, 1, 1 }, { 1, 200, 200, 3, 1 } };
    for (int s = 0; s < 3; s++) {
        const int32_t b = shapes[s][0], sq = shapes[s][1], sk = shapes[s][2], hq = shapes[s][3];
        problem p;
        problem_make(&p, b, sq, sk, hq, shapes[s][4], 96, 1.0, seed + 2 + (uint64_t)s);
        p.d.causal = s < 2;
        p.d.window_left = s < 2 ? 200 : -1;
        p.d.softcap = s == 2 ? 5.0f : 0.0f;
        size_t n = (size_t)b * sq * hq * 96, nl = (size_t)b * hq * sq;
        float *first = malloc(n * 4), *lse = malloc(nl * 4);
        assert_non_null(first && lse);
        assert_int_equal(fa_forward(one, &p.d), FA_OK);
        memcpy(first, p.o, n * 4);
        memcpy(lse, p.lse, nl * 4);
        fa_context_t ctxs[] = { two, many, two, one };
        for (size_t c = 0; c < 4; c++) {
            memset(p.o, 0, n * 4);
            assert_int_equal(fa_forward(ctxs[c], &p.d), FA_OK);
            assert_memory_equal(first, p.o, n * 4);
            assert_memory_equal(lse, p.lse, nl * 4);
        }
        free(first);
        free(lse);
        problem_free(&p);
    }
    fa_context_destroy(one);
    fa_context_destroy(two);
    fa_context_destroy(many);
}

/* Decode splits the keys into chunks merged by their statistics: the bits must
 * not depend on the thread count, and the merge must match float64, also when
 * a window leaves whole chunks without a visible key. */
static void test_decode_split(void **state)
{
    (void)state;
    fa_context_t one = make_ctx(1), two = make_ctx(2), many = make_ctx(7);
    problem p;
    problem_make(&p, 2, 1, 5000, 4, 1, 64, 1.0, seed + 4); /* MQA: one stream per sequence */
    fa_run_info ri = { .size = sizeof(ri) };
    assert_int_equal(fa_forward_plan(one, &p.d, &ri), FA_OK);
    assert_non_null(strstr(ri.kernel, "decode"));
    size_t n = (size_t)2 * 4 * 64;
    float first[2 * 4 * 64];
    for (int variant = 0; variant < 2; variant++) {
        p.d.window_left = variant ? 700 : -1; /* most chunks see nothing */
        assert_int_equal(fa_forward(one, &p.d), FA_OK);
        memcpy(first, p.o, n * 4);
        double e = max_err(&p);
        print_message("decode split (window %d): max abs err %.3g\n", (int)p.d.window_left, e);
        assert_true(e < 1e-5);
        fa_context_t ctxs[] = { two, many };
        for (int c = 0; c < 2; c++) {
            memset(p.o, 0, n * 4);
            assert_int_equal(fa_forward(ctxs[c], &p.d), FA_OK);
            assert_memory_equal(first, p.o, n * 4);
        }
    }
    problem_free(&p);
    fa_context_destroy(one);
    fa_context_destroy(two);
    fa_context_destroy(many);
}

/* A query block smaller than the sequence forced through the tuning knob, on a
 * decode-sized shape: the split-KV path must not be taken for partial blocks. */
static void test_block_override(void **state)
{
    (void)state;
    setenv("FLASHATTN_CPU_BLOCK_Q", "1", 1);
    fa_context_t ctx = make_ctx(2);
    problem p;
    problem_make(&p, 1, 4, 64, 1, 1, 16, 1.0, seed + 5);
    assert_int_equal(fa_forward(ctx, &p.d), FA_OK);
    assert_true(max_err(&p) < 1e-5);
    unsetenv("FLASHATTN_CPU_BLOCK_Q");
    problem_free(&p);
    fa_context_destroy(ctx);
}

/* Rows with no visible key are exact zeros even when a key they cannot see
 * holds NaN (the accumulator of their tile may be poisoned by 0 * NaN). */
static void test_masked_rows_ignore_nan(void **state)
{
    (void)state;
    fa_context_t ctx = make_ctx(0);
    problem p;
    problem_make(&p, 1, 64, 48, 1, 1, 64, 1.0, seed + 6);
    p.d.causal = 1; /* rows 0..15 see nothing */
    for (int x = 0; x < 64; x++)
        p.v[10 * 64 + x] = NAN; /* seen by rows 26.. only, but in the tiles of rows 0..15 */
    for (int algo = 0; algo < 2; algo++) {
        p.d.algorithm = (fa_algorithm)algo;
        assert_int_equal(fa_forward(ctx, &p.d), FA_OK);
        for (int i = 0; i < 16; i++) {
            for (int x = 0; x < 64; x++)
                assert_true(p.o[i * 64 + x] == 0.0f);
            assert_true(p.lse[i] == -INFINITY);
        }
    }
    problem_free(&p);
    fa_context_destroy(ctx);
}

/* Non-finite scores propagate as standard attention's do: a NaN in q's row r, or a key of
 * +inf that a row's score meets with a positive weight (a score past float32), gives that
 * row NaN in o and lse, never the zeros and -inf of a row that sees no key; every other row
 * keeps the bits of the run without them. Flash and standard, prefill and decode shapes. */
static void test_nonfinite_scores(void **state)
{
    (void)state;
    fa_context_t ctx = make_ctx(0);
    const int32_t shapes[2][2] = { { 24, 40 }, { 1, 300 } }; /* seqlen_q, seqlen_k */
    for (int sh = 0; sh < 2; sh++)
        for (int algo = 0; algo < 2; algo++) {
            const int32_t sq = shapes[sh][0], sk = shapes[sh][1], dim = 32;
            problem p;
            problem_make(&p, 1, sq, sk, 2, 2, dim, 1.0, seed + 40 + (uint64_t)sh);
            p.d.algorithm = (fa_algorithm)algo;
            const size_t no = (size_t)sq * 2 * dim, nl = (size_t)2 * sq;
            assert_int_equal(fa_forward(ctx, &p.d), FA_OK);
            float *o0 = malloc(no * 4), *l0 = malloc(nl * 4);
            assert_non_null(o0 && l0);
            memcpy(o0, p.o, no * 4), memcpy(l0, p.lse, nl * 4);
            /* a NaN in head 1 of the last query row; +inf in element 3 of key 7, head 0 */
            const int32_t rq = sq - 1;
            p.q[((size_t)rq * 2 + 1) * dim + 5] = NAN;
            p.k[((size_t)7 * 2 + 0) * dim + 3] = INFINITY;
            assert_int_equal(fa_forward(ctx, &p.d), FA_OK);
            for (int32_t r = 0; r < sq; r++)
                for (int32_t h = 0; h < 2; h++) {
                    const float w = p.q[((size_t)r * 2 + h) * dim + 3];
                    const int nan_row = (h == 1 && r == rq) || (h == 0 && w > 0.0f);
                    const float *o = p.o + ((size_t)r * 2 + h) * dim, lse = p.lse[(size_t)h * sq + r];
                    if (nan_row) {
                        for (int32_t x = 0; x < dim; x++)
                            if (!isnan(o[x]))
                                fail_msg("algorithm %d sq %d: row %d head %d o[%d] = %g, not NaN", algo, sq, r, h,
                                         x, o[x]);
                        assert_true(isnan(lse));
                    } else if (h == 1) { /* untouched by either: the same bits */
                        assert_memory_equal(o, o0 + ((size_t)r * 2 + h) * dim, (size_t)dim * 4);
                        assert_memory_equal(&lse, l0 + (size_t)h * sq + r, 4);
                    } else { /* the key's score is -inf (or 0 times inf: NaN when w is 0) */
                        for (int32_t x = 0; x < dim; x++)
                            assert_true(w < 0.0f ? isfinite(o[x]) : isnan(o[x]));
                    }
                }
            free(o0), free(l0);
            problem_free(&p);
        }
    fa_context_destroy(ctx);
}

/* The f16/bf16 output must be the f32 result rounded to nearest (even on ties). */
static void test_output_rounding(void **state)
{
    (void)state;
    fa_context_t ctx = make_ctx(1);
    problem p;
    problem_make(&p, 1, 64, 64, 2, 2, 40, 3.0, seed + 3);
    size_t n = (size_t)64 * 2 * 40;
    /* each 16-bit problem runs twice, o written as f32 and as the 16-bit type:
     * the second must be the first rounded to nearest */
    fa_dtype types[] = { FA_DTYPE_F16, FA_DTYPE_BF16 };
    for (int t = 0; t < 2; t++) {
        uint16_t *q16 = malloc(n * 2), *k16 = malloc(n * 2), *v16 = malloc(n * 2), *o16 = malloc(n * 2);
        float *o32 = malloc(n * 4);
        assert_non_null(q16 && k16 && v16 && o16 && o32);
        for (size_t i = 0; i < n; i++) {
            fa_ref_encode(types[t], q16, (int64_t)i, p.q[i]);
            fa_ref_encode(types[t], k16, (int64_t)i, p.k[i]);
            fa_ref_encode(types[t], v16, (int64_t)i, p.v[i]);
        }
        fa_attention_desc d = p.d;
        d.lse = NULL;
        d.q.data = q16, d.k.data = k16, d.v.data = v16;
        d.q.dtype = d.k.dtype = d.v.dtype = types[t];
        d.o.data = o32;
        d.o.dtype = FA_DTYPE_F32;
        assert_int_equal(fa_forward(ctx, &d), FA_OK);
        d.o.data = o16;
        d.o.dtype = types[t];
        assert_int_equal(fa_forward(ctx, &d), FA_OK);
        for (size_t i = 0; i < n; i++) {
            double got = fa_ref_decode(types[t], o16, (int64_t)i), x = o32[i];
            /* neighbours one unit in the last place away must not be closer */
            uint16_t up = (uint16_t)(o16[i] + 1), dn = (uint16_t)(o16[i] - 1);
            double da = fabs(fa_ref_decode(types[t], &up, 0) - x);
            double db = fabs(fa_ref_decode(types[t], &dn, 0) - x);
            assert_true(fabs(got - x) <= (isnan(da) ? INFINITY : da) &&
                        fabs(got - x) <= (isnan(db) ? INFINITY : db));
        }
        free(q16);
        free(k16);
        free(v16);
        free(o16);
        free(o32);
    }
    problem_free(&p);
    fa_context_destroy(ctx);
}

/* f16 decode, dense and paged: 4,088 keys e^-17.5 below the row's maximum (v = 1) beside 8
 * keys at it (v = 0). Each probability (2.5e-8) is under f16's smallest value, and o
 * (1.28e-5) is what they add up to: a kernel that rounds probabilities to f16 must keep them
 * (neon_fhm's axpy_f16p did not: o = 0). Against float64, within the standard's tolerance. */
static void test_f16_small_probabilities(void **state)
{
    (void)state;
    enum { N = 4096, D = 8, PAGE = 16 };
    fa_context_t ctx = make_ctx(0);
    uint16_t *q = calloc(D, 2), *o = calloc(D, 2), *k = calloc((size_t)N * D, 2), *v = calloc((size_t)N * D, 2);
    assert_true(q && o && k && v);
    fa_ref_encode(FA_DTYPE_F16, q, 0, 1.0);
    double num = 0.0, den = 0.0;
    for (int64_t j = 0; j < N; j++) {
        const int big = j % 512 == 0;
        fa_ref_encode(FA_DTYPE_F16, k, j * D, big ? 17.5 : 0.0);
        for (int32_t x = 0; x < D; x++)
            fa_ref_encode(FA_DTYPE_F16, v, j * D + x, big ? 0.0 : 1.0);
        const double w = exp(fa_ref_decode(FA_DTYPE_F16, k, j * D) - 17.5);
        den += w;
        num += big ? 0.0 : w;
    }
    const double want = num / den;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = d.seqlen_q = d.num_heads_q = d.num_heads_kv = 1;
    d.seqlen_k = N;
    d.head_dim = D;
    d.scale = 1.0f;
    d.q = fa_tensor_contiguous(q, FA_DTYPE_F16, FA_LAYOUT_BSHD, 1, 1, D);
    d.k = fa_tensor_contiguous(k, FA_DTYPE_F16, FA_LAYOUT_BSHD, N, 1, D);
    d.v = fa_tensor_contiguous(v, FA_DTYPE_F16, FA_LAYOUT_BSHD, N, 1, D);
    d.o = fa_tensor_contiguous(o, FA_DTYPE_F16, FA_LAYOUT_BSHD, 1, 1, D);
    double worst[3] = { 0.0, 0.0, 0.0 };
    for (int run = 0; run < 3; run++) { /* standard, flash dense, flash paged */
        d.algorithm = run ? FA_ALGORITHM_FLASH : FA_ALGORITHM_STANDARD;
        memset(o, 0xff, (size_t)D * 2);
        if (run < 2) {
            assert_int_equal(fa_forward(ctx, &d), FA_OK);
        } else {
            int32_t cu[2] = { 0, 1 }, len[1] = { N }, table[N / PAGE];
            for (int32_t i = 0; i < N / PAGE; i++)
                table[i] = i;
            fa_paged_desc pd;
            fa_paged_desc_init(&pd);
            pd.batch = pd.total_q = pd.max_seqlen_q = pd.num_heads_q = 1;
            pd.max_seqlen_k = N;
            pd.head_dim = D;
            pd.scale = 1.0f;
            pd.kv_split = N; /* one split: all 4,096 keys in one walk */
            pd.q = d.q;
            pd.o = d.o;
            pd.cu_seqlens_q = cu;
            pd.cache_seqlens = len;
            pd.block_table = table;
            pd.max_pages_per_seq = N / PAGE;
            pd.cache = fa_kv_cache_contiguous(k, v, FA_DTYPE_F16, FA_LAYOUT_BSHD, N / PAGE, PAGE, 1, D);
            assert_int_equal(fa_paged_forward(ctx, &pd), FA_OK);
        }
        for (int32_t x = 0; x < D; x++)
            worst[run] = fmax(worst[run], fabs(fa_ref_decode(FA_DTYPE_F16, o, x) - want));
    }
    const double tol = fa_output_tolerance(worst[0], want, FA_DTYPE_F16, FA_DTYPE_F16);
    print_message("f16 decode, o %.4g: error standard %.3g, dense %.3g, paged %.3g (allowed %.3g)\n", want, worst[0],
                  worst[1], worst[2], tol);
    assert_true(worst[1] <= tol && worst[2] <= tol);
    free(q);
    free(o);
    free(k);
    free(v);
    fa_context_destroy(ctx);
}

/* ---- sums past float32, and scores scaled before their products ---- */

/* The contexts the cases below run on: the CPU, and where a GLES driver is reachable each of
 * its fused forwards (the planner's choice, the tiled one, the rows one through shared
 * memory) and the default and tiled ones in key chunks, whose running state is carried from
 * one dispatch to the next (on llvmpipe the planner budgets a dispatch's loops for the second
 * walk of rows whose sums overflowed, so every one of them runs 100k keys). */
typedef struct backend_ctx {
    const char *name;
    fa_context_t ctx;
} backend_ctx;

static int make_backends(backend_ctx *out)
{
    static const struct {
        const char *name, *forward, *chunk;
    } gl[] = { { "gles", NULL, NULL },
               { "gles tiled", "tiled", NULL },
               { "gles rows", "rows", NULL },
               { "gles chunks", NULL, "4096" },
               { "gles tiled chunks", "tiled", "4096" } };
    int n = 0;
    out[n++] = (backend_ctx){ "cpu", make_ctx(0) };
    for (size_t i = 0; i < sizeof(gl) / sizeof(gl[0]); i++) {
        if (gl[i].forward)
            setenv("FLASHATTN_GLES_FORWARD", gl[i].forward, 1);
        if (gl[i].chunk)
            setenv("FLASHATTN_GLES_KEY_CHUNK", gl[i].chunk, 1);
        fa_context_options o = { sizeof(o), FA_BACKEND_GLES, 0 };
        fa_context_t ctx = NULL;
        fa_status st = fa_context_create(&o, &ctx);
        unsetenv("FLASHATTN_GLES_FORWARD");
        unsetenv("FLASHATTN_GLES_KEY_CHUNK");
        if (st == FA_ERR_BACKEND_UNAVAILABLE)
            break;
        assert_int_equal(st, FA_OK);
        out[n++] = (backend_ctx){ gl[i].name, ctx };
    }
    return n;
}

/* make_backends' contexts, and CUDA's where it answers (the tests staging their data in each
 * backend's memory). */
static int make_backends_cuda(backend_ctx *out)
{
    int n = make_backends(out);
    fa_context_options o = { sizeof(o), FA_BACKEND_CUDA, 0 };
    fa_context_t ctx = NULL;
    const fa_status st = fa_context_create(&o, &ctx);
    if (st != FA_ERR_BACKEND_UNAVAILABLE) {
        assert_int_equal(st, FA_OK);
        out[n++] = (backend_ctx){ "cuda", ctx };
    }
    return n;
}

static void free_backends(backend_ctx *b, int n)
{
    for (int i = 0; i < n; i++)
        fa_context_destroy(b[i].ctx);
}

static int f16_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
static int f16_finite(uint16_t h) { return (h & 0x7c00) != 0x7c00; }

/* test_nonfinite_scores' rule with f16 inputs and output on every backend present: the CPU,
 * the GLES variants and CUDA (each where it answers), the data staged in the backend's memory. */
static void test_nonfinite_scores_f16(void **state)
{
    (void)state;
    backend_ctx b[9];
    int nb = make_backends_cuda(b);
    const int32_t shapes[2][2] = { { 24, 40 }, { 1, 300 } }; /* seqlen_q, seqlen_k */
    for (int bi = 0; bi < nb; bi++)
        for (int sh = 0; sh < 2; sh++)
            for (int algo = 0; algo < 2; algo++) {
                const int32_t sq = shapes[sh][0], dim = 32;
                fa_case c;
                memset(&c, 0, sizeof(c));
                c.dtype = FA_DTYPE_F16;
                c.batch = 1, c.seqlen_q = sq, c.seqlen_k = shapes[sh][1], c.heads_q = 2, c.heads_kv = 2;
                c.head_dim = dim, c.layout = FA_CASE_BSHD, c.with_lse = 1, c.seed = seed + 50 + (uint64_t)sh;
                c.window_left = c.window_right = -1, c.logit_scale = 1.0f;
                fa_case_inputs in;
                assert_int_equal(fa_case_inputs_make(&c, 1, &in), 0);
                in.d.algorithm = (fa_algorithm)algo;
                const size_t no = (size_t)in.o_bytes / 2, nl = (size_t)2 * sq;
                uint16_t *o0 = malloc(no * 2), *o1 = malloc(no * 2);
                float *l0 = malloc(nl * 4), *l1 = malloc(nl * 4);
                assert_true(o0 && o1 && l0 && l1);
                for (int run = 0; run < 2; run++) {
                    if (run == 1) { /* a NaN in head 1 of the last query row; +inf in element 3 of key 7, head 0 */
                        uint16_t *q = in.d.q.data, *k = in.d.k.data;
                        q[(sq - 1) * in.d.q.stride_seq + in.d.q.stride_head + 5] = 0x7e00;
                        k[7 * in.d.k.stride_seq + 3] = 0x7c00;
                    }
                    fa_case_staged st;
                    char msg[256];
                    if (fa_case_stage(b[bi].ctx, &in, &st, msg, sizeof(msg)) != 0)
                        fail_msg("%s: %s", b[bi].name, msg);
                    if (fa_forward(b[bi].ctx, &st.d) != FA_OK)
                        fail_msg("%s algorithm %d: %s", b[bi].name, algo, fa_context_last_error(b[bi].ctx));
                    assert_int_equal(fa_memory_download(b[bi].ctx, run ? o1 : o0, st.o, no * 2), FA_OK);
                    assert_int_equal(fa_memory_download(b[bi].ctx, run ? l1 : l0, st.lse, nl * 4), FA_OK);
                    fa_case_unstage(b[bi].ctx, &st);
                }
                const uint16_t *q = in.d.q.data;
                for (int32_t r = 0; r < sq; r++)
                    for (int32_t h = 0; h < 2; h++) {
                        const uint16_t w = q[r * in.d.q.stride_seq + h * in.d.q.stride_head + 3];
                        const int w_neg = (w & 0x8000) && (w & 0x7fff);
                        const int nan_row = (h == 1 && r == sq - 1) || (h == 0 && !w_neg);
                        const size_t at = (size_t)r * in.d.o.stride_seq + (size_t)h * in.d.o.stride_head;
                        const float lse = l1[(size_t)h * sq + r];
                        for (int32_t x = 0; x < dim; x++) {
                            const uint16_t v = o1[at + x];
                            if (nan_row ? !f16_nan(v) : !f16_finite(v))
                                fail_msg("%s algorithm %d sq %d: row %d head %d o[%d] = %#x, %s", b[bi].name, algo, sq,
                                         r, h, x, v, nan_row ? "not NaN" : "not finite");
                        }
                        if (nan_row != !!isnan(lse))
                            fail_msg("%s algorithm %d sq %d: row %d head %d lse %g", b[bi].name, algo, sq, r, h, lse);
                        if (h == 1 && !nan_row) { /* untouched by either: the same bits */
                            assert_memory_equal(o1 + at, o0 + at, (size_t)dim * 2);
                            assert_memory_equal(&lse, &l0[(size_t)h * sq + r], 4);
                        }
                    }
                free(o0), free(o1), free(l0), free(l1);
                fa_case_inputs_free(&in);
            }
    free_backends(b, nb);
}

/* One head of uniform scores: every row's o must be the mean of v's rows (want[x], float64),
 * within rel relative, and its lse that of the scores within 1e-6 relative (absolute below 1). */
typedef struct mean_case {
    const char *what;
    fa_dtype dtype, o_dtype;
    int32_t sq, sk, dim;
    float scale, softcap;
    double qk; /* every element of q; k's rows are (qk, qk, qk, -qk, 0, ...) */
    double (*v)(int64_t j, int32_t x);  /* v[j][x] */
    double rel;
} mean_case;

static int mean_ok(const backend_ctx *b, const mean_case *mc, fa_algorithm algo)
{
    const int32_t sq = mc->sq, sk = mc->sk, dim = mc->dim;
    const size_t esz = mc->dtype == FA_DTYPE_F32 ? 4 : 2, osz = mc->o_dtype == FA_DTYPE_F32 ? 4 : 2;
    char *q = malloc((size_t)sq * dim * esz), *k = malloc((size_t)sk * dim * esz);
    char *v = malloc((size_t)sk * dim * esz), *o = malloc((size_t)sq * dim * osz);
    float *lse = malloc((size_t)sq * 4);
    double *want = calloc((size_t)dim, sizeof(double));
    assert_true(q && k && v && o && lse && want);
    for (int64_t i = 0; i < (int64_t)sq * dim; i++)
        fa_ref_encode(mc->dtype, q, i, mc->qk);
    for (int64_t j = 0; j < sk; j++)
        for (int32_t x = 0; x < dim; x++) {
            fa_ref_encode(mc->dtype, k, j * dim + x, x < 3 ? mc->qk : x == 3 ? -mc->qk : 0.0);
            fa_ref_encode(mc->dtype, v, j * dim + x, mc->v(j, x));
            want[x] += fa_ref_decode(mc->dtype, v, j * dim + x) / sk;
        }
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = sq;
    d.seqlen_k = sk;
    d.num_heads_q = d.num_heads_kv = 1;
    d.head_dim = dim;
    d.scale = mc->scale;
    d.softcap = mc->softcap;
    d.algorithm = algo;
    d.q = fa_tensor_contiguous(q, mc->dtype, FA_LAYOUT_BSHD, sq, 1, dim);
    d.k = fa_tensor_contiguous(k, mc->dtype, FA_LAYOUT_BSHD, sk, 1, dim);
    d.v = fa_tensor_contiguous(v, mc->dtype, FA_LAYOUT_BSHD, sk, 1, dim);
    d.o = fa_tensor_contiguous(o, mc->o_dtype, FA_LAYOUT_BSHD, sq, 1, dim);
    d.lse = lse;
    assert_int_equal(fa_forward(b->ctx, &d), FA_OK);
    /* the score every key gets: cap(scale q.k) */
    double s = mc->scale * fa_ref_decode(mc->dtype, q, 0) * fa_ref_decode(mc->dtype, k, 0) * 2;
    double lse_want = (mc->softcap > 0.0f ? mc->softcap * tanh(s / mc->softcap) : s) + log((double)sk);
    double worst = 0.0, worst_lse = 0.0;
    for (int32_t i = 0; i < sq; i++) {
        for (int32_t x = 0; x < dim; x++) {
            double got = fa_ref_decode(mc->o_dtype, o, (int64_t)i * dim + x);
            worst = isnan(got) ? INFINITY : fmax(worst, fabs(got - want[x]) / fabs(want[x]));
        }
        double e = fabs(lse[i] - lse_want) / fmax(1.0, fabs(lse_want));
        worst_lse = isnan(e) ? INFINITY : fmax(worst_lse, e);
    }
    const int ok = worst <= mc->rel && worst_lse <= 1e-6;
    print_message("%s, %s, %s: o within %.3g of the mean of v (allowed %.3g), lse within %.3g%s\n",
                  mc->what, b->name, algo == FA_ALGORITHM_FLASH ? "flash" : "standard", worst, mc->rel,
                  worst_lse, ok ? "" : "  FAILED");
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    free(want);
    return ok;
}

/* About 1e34, powers of two, so that every partial sum of p v is exact. */
static double v_huge(int64_t j, int32_t x) { return ldexp(1.0 + (double)((j + x) % 3), 113); }
/* About 3e38 in bf16, near its largest finite value. */
static double v_bf16_max(int64_t j, int32_t x) { return 3.0e38 - 1e37 * (double)((j + 2 * x) % 4); }
static double v_small(int64_t j, int32_t x) { return 0.25 + 0.5 * (double)((j * 7 + x) % 5); }

/* The accumulator sums p v with p up to 1 before the division by the softmax sum: v of 1e34
 * over 100k keys, or bf16 values near 3e38 over 64, pass FLT_MAX although the output, the
 * mean of v here (every score the same), is representable. Prefill (a task's rows, key
 * tiles), decode (one row: key chunks and their merge) and the standard baseline. */
static void test_sums_past_float32(void **state)
{
    (void)state;
    backend_ctx b[8];
    int nb = make_backends(b);
    const mean_case cases[] = {
        { "f32 v 1e34 x 100k keys", FA_DTYPE_F32, FA_DTYPE_F32, 8, 100000, 8, 0.0f, 0.0f, 0.0, v_huge, 1e-6 },
        { "f32 v 1e34 x 100k keys, decode", FA_DTYPE_F32, FA_DTYPE_F32, 1, 100000, 8, 0.0f, 0.0f, 0.0, v_huge,
          1e-6 },
        { "bf16 v 3e38 x 64 keys", FA_DTYPE_BF16, FA_DTYPE_F32, 4, 64, 8, 0.0f, 0.0f, 0.0, v_bf16_max, 1e-6 },
        { "bf16 v 3e38 x 64 keys, bf16 o", FA_DTYPE_BF16, FA_DTYPE_BF16, 4, 64, 8, 0.0f, 0.0f, 0.0,
          v_bf16_max, 4e-3 },
        { "bf16 v 3e38 x 64 keys, decode", FA_DTYPE_BF16, FA_DTYPE_F32, 1, 64, 8, 0.0f, 0.0f, 0.0, v_bf16_max,
          1e-6 },
    };
    int failed = 0;
    for (int i = 0; i < nb; i++)
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            failed += !mean_ok(&b[i], &cases[c], FA_ALGORITHM_FLASH);
            /* GLES refuses the standard algorithm past llvmpipe's loop limit (100k keys) */
            if (i == 0 || cases[c].sk <= 64)
                failed += !mean_ok(&b[i], &cases[c], FA_ALGORITHM_STANDARD);
        }
    free_backends(b, nb);
    assert_int_equal(failed, 0);
}

/* One case of test_overflowed_scores on b in dtype dt, staged in b's memory: 0 when o and lse
 * match float64. */
static int overflowed_ok(const backend_ctx *b, fa_dtype dt, int32_t sq)
{
    const int32_t sk = 2000, dim = 8;
    const size_t es = (size_t)fa_ref_dtype_bytes(dt), nq = (size_t)sq * dim, nk = (size_t)sk * dim;
    unsigned char *q = malloc(nq * es), *k = malloc(nk * es), *v = malloc(nk * es), *o = malloc(nq * es);
    float lse[4];
    double o_ref[4 * 8], lse_ref[4];
    assert_true(q && k && v && o && sq <= 4);
    fa_rng r = { seed + 60 };
    for (size_t i = 0; i < nq; i++)
        fa_ref_encode(dt, q, (int64_t)i, 1.0);
    for (int32_t j = 0; j < sk; j++)
        for (int32_t x = 0; x < dim; x++) {
            const int low = j < 64 || (j >= 250 && j < 314); /* q.k = -8e38: -inf in float32 */
            fa_ref_encode(dt, k, (int64_t)j * dim + x, low ? -1e38 : fa_rng_uniform(&r));
            fa_ref_encode(dt, v, (int64_t)j * dim + x, fa_rng_uniform(&r));
        }
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1, d.seqlen_q = sq, d.seqlen_k = sk, d.num_heads_q = d.num_heads_kv = 1, d.head_dim = dim;
    d.q = fa_tensor_contiguous(q, dt, FA_LAYOUT_BSHD, sq, 1, dim);
    d.k = fa_tensor_contiguous(k, dt, FA_LAYOUT_BSHD, sk, 1, dim);
    d.v = fa_tensor_contiguous(v, dt, FA_LAYOUT_BSHD, sk, 1, dim);
    d.o = fa_tensor_contiguous(o, dt, FA_LAYOUT_BSHD, sq, 1, dim);
    d.lse = lse;
    assert_int_equal(fa_ref_attention(&d, 1, o_ref, lse_ref, NULL), 0);
    void *dq, *dk, *dv, *dout, *dlse;
    assert_int_equal(fa_memory_alloc(b->ctx, nq * es, &dq), FA_OK);
    assert_int_equal(fa_memory_alloc(b->ctx, nk * es, &dk), FA_OK);
    assert_int_equal(fa_memory_alloc(b->ctx, nk * es, &dv), FA_OK);
    assert_int_equal(fa_memory_alloc(b->ctx, nq * es, &dout), FA_OK);
    assert_int_equal(fa_memory_alloc(b->ctx, 4 * (size_t)sq, &dlse), FA_OK);
    assert_int_equal(fa_memory_upload(b->ctx, dq, q, nq * es), FA_OK);
    assert_int_equal(fa_memory_upload(b->ctx, dk, k, nk * es), FA_OK);
    assert_int_equal(fa_memory_upload(b->ctx, dv, v, nk * es), FA_OK);
    fa_attention_desc dd = d;
    dd.q.data = dq, dd.k.data = dk, dd.v.data = dv, dd.o.data = dout, dd.lse = dlse;
    if (fa_forward(b->ctx, &dd) != FA_OK)
        fail_msg("%s: %s", b->name, fa_context_last_error(b->ctx));
    assert_int_equal(fa_memory_download(b->ctx, o, dout, nq * es), FA_OK);
    assert_int_equal(fa_memory_download(b->ctx, lse, dlse, 4 * (size_t)sq), FA_OK);
    void *dev[] = { dq, dk, dv, dout, dlse };
    for (int i = 0; i < 5; i++)
        fa_memory_free(b->ctx, dev[i]);
    /* o is a mean of v over 1,872 keys, about 0.02 here: f32 within float32 sums; bf16 within
     * its rounding of o and of P before P V (GPU), well below the values themselves */
    const double tol = dt == FA_DTYPE_F32 ? 1e-6 : 1e-3;
    int ok = 1;
    for (size_t i = 0; i < nq; i++) {
        const double got = fa_ref_decode(dt, o, (int64_t)i);
        if (!(fabs(got - o_ref[i]) <= tol)) {
            print_error("%s %s sq %d: o[%zu] = %g, float64 %g\n", b->name, dt == FA_DTYPE_F32 ? "f32" : "bf16", sq, i,
                        got, o_ref[i]);
            ok = 0;
        }
    }
    for (int32_t i = 0; i < sq; i++)
        if (!(fabs(lse[i] - lse_ref[i]) <= 1e-5 * fmax(1.0, fabs(lse_ref[i])))) {
            print_error("%s sq %d: lse[%d] = %g, float64 %g\n", b->name, sq, i, lse[i], lse_ref[i]);
            ok = 0;
        }
    free(q), free(k), free(v), free(o);
    return ok;
}

/* Scores past float32's range below (keys of -1e38: q.k is -inf in float32) weigh nothing,
 * and a row stays finite where some tile or chunk holds only such keys: decode (split chunks
 * whose first tile is all -inf) and prefill, f32 and bf16, on every backend present (CUDA:
 * bf16), against float64. */
static void test_overflowed_scores(void **state)
{
    (void)state;
    backend_ctx b[9];
    int nb = make_backends_cuda(b);
    int failed = 0;
    for (int i = 0; i < nb; i++)
        for (int32_t sq = 1; sq <= 4; sq += 3) {
            if (strcmp(b[i].name, "cuda") != 0)
                failed += !overflowed_ok(&b[i], FA_DTYPE_F32, sq);
            failed += !overflowed_ok(&b[i], FA_DTYPE_BF16, sq);
        }
    free_backends(b, nb);
    assert_int_equal(failed, 0);
}

/* A decode over more keys than 64 chunks fit in llvmpipe's loop limit: GLES cuts it into
 * more chunks instead of refusing it (past about 470k keys at head_dim 8, as planned) or
 * losing keys silently (past about 2.1M, where 64 chunks run past the limit). */
static void test_long_decode(void **state)
{
    (void)state;
    backend_ctx b[8];
    int nb = make_backends(b);
    const mean_case mc[2] = {
        { "f32 decode over 600k keys", FA_DTYPE_F32, FA_DTYPE_F32, 1, 600000, 8, 0.0f, 0.0f, 0.0, v_small, 1e-5 },
        { "f16 decode over 2.5M keys", FA_DTYPE_F16, FA_DTYPE_F32, 1, 2500000, 4, 0.0f, 0.0f, 0.0, v_small, 1e-5 },
    };
    int failed = 0;
    for (int i = 0; i < nb; i++)
        for (int c = 0; c < 2; c++)
            failed += !mean_ok(&b[i], &mc[c], FA_ALGORITHM_FLASH);
    free_backends(b, nb);
    assert_int_equal(failed, 0);
}

/* Only the rows whose sums overflowed change. Even rows weigh every key alike, and v of 2^120
 * on the even keys overflows their sums; odd rows give the even keys scores 500 units below the
 * rest (p = 0), so they must come out bit for bit as with those values zeroed. */
static void test_overflow_leaves_other_rows(void **state)
{
    (void)state;
    backend_ctx b[8];
    int nb = make_backends(b);
    problem p;
    problem_make(&p, 1, 8, 4096, 1, 1, 8, 1.0, seed + 7);
    for (int i = 0; i < 8 * 8; i++)
        p.q[i] = i / 8 % 2 && i % 8 == 0 ? -1000.0f : 0.0f;
    for (int j = 0; j < 4096; j++)
        p.k[j * 8] = j % 2 ? 0.0f : 1.0f;
    float *alone = malloc(8 * 8 * 4);
    assert_non_null(alone);
    for (int i = 0; i < nb; i++) {
        for (int j = 0; j < 4096; j += 2)
            for (int x = 0; x < 8; x++)
                p.v[j * 8 + x] = 0.0f;
        assert_int_equal(fa_forward(b[i].ctx, &p.d), FA_OK);
        memcpy(alone, p.o, 8 * 8 * 4);
        for (int j = 0; j < 4096; j += 2)
            for (int x = 0; x < 8; x++)
                p.v[j * 8 + x] = 0x1p120f;
        assert_int_equal(fa_forward(b[i].ctx, &p.d), FA_OK);
        for (int r = 0; r < 8; r++)
            for (int x = 0; x < 8; x++) {
                const float got = p.o[r * 8 + x];
                if (r % 2)
                    assert_memory_equal(&got, &alone[r * 8 + x], 4);
                else /* the mean of the even keys' 2^120 and the odd keys' v */
                    assert_true(isfinite(got) && fabs(got - 0x1p119) <= 1e-6 * 0x1p119);
            }
    }
    free(alone);
    problem_free(&p);
    free_backends(b, nb);
}

/* q = k = 1e20 (k's fourth element -1e20, the rest 0) and scale 1e-36: the scaled scores are
 * 2e4 (the header allows them), q.k alone is 2e40 and its products 1e40 of both signs. The
 * scale must reach the scores before the products overflow, as it does on the CPU (q is loaded
 * pre-scaled). The f32 rounding of logits of 2.9e4 (2^-9 a unit in the last place) alone moves
 * p by a few 1e-3 from the uniform weights. */
static void test_scale_before_product(void **state)
{
    (void)state;
    backend_ctx b[8];
    int nb = make_backends(b);
    const mean_case cases[] = {
        { "q.k 2e40, scale 1e-36", FA_DTYPE_F32, FA_DTYPE_F32, 5, 50, 8, 1e-36f, 0.0f, 1e20, v_small, 4e-3 },
        { "q.k 2e40, scale 1e-36, decode", FA_DTYPE_F32, FA_DTYPE_F32, 1, 50, 8, 1e-36f, 0.0f, 1e20, v_small,
          4e-3 },
        { "q.k 2e40, scale 1e-36, softcap 30", FA_DTYPE_F32, FA_DTYPE_F32, 5, 50, 8, 1e-36f, 30.0f, 1e20,
          v_small, 4e-3 },
    };
    int failed = 0;
    for (int i = 0; i < nb; i++)
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
            for (int algo = 0; algo < 2; algo++)
                failed += !mean_ok(&b[i], &cases[c], (fa_algorithm)algo);
    free_backends(b, nb);
    assert_int_equal(failed, 0);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("numerics: seed %llu (replay: FLASHATTN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fully_masked_rows),
        cmocka_unit_test(test_large_logits),
        cmocka_unit_test(test_deterministic_across_threads),
        cmocka_unit_test(test_output_rounding),
        cmocka_unit_test(test_f16_small_probabilities),
        cmocka_unit_test(test_decode_split),
        cmocka_unit_test(test_block_override),
        cmocka_unit_test(test_masked_rows_ignore_nan),
        cmocka_unit_test(test_nonfinite_scores),
        cmocka_unit_test(test_nonfinite_scores_f16),
        cmocka_unit_test(test_overflowed_scores),
        cmocka_unit_test(test_long_decode),
        cmocka_unit_test(test_sums_past_float32),
        cmocka_unit_test(test_overflow_leaves_other_rows),
        cmocka_unit_test(test_scale_before_product),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
