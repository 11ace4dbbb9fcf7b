/* SPDX-License-Identifier: MIT */
/*
 * The backward pass: the grid against the float64 backward, a finite
 * difference check of that float64 backward itself, bit-identical results
 * across thread counts, and bad input.
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

#define MAX_CASES FA_GRID_MAX
static uint64_t seed;

static void run_dtype(fa_dtype dt)
{
    fa_context_t ctx;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    if (fa_context_create(&opts, &ctx) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    static fa_case cases[MAX_CASES];
    int n = fa_grid_build(0, seed, cases, MAX_CASES), ran = 0, failed = 0;
    const int every = fa_test_case_every();
    for (int i = 0; i < n; i++) {
        if (cases[i].dtype != dt || i % every)
            continue;
        fa_bwd_result r;
        if (fa_case_run_backward(ctx, &cases[i], &r) != 0 || !r.passed) {
            print_error("case %d FAILED: %s\n", i, r.message);
            failed++;
        }
        ran++;
    }
    fa_context_destroy(ctx);
    print_message("%d cases, %d failed (seed %llu)\n", ran, failed, (unsigned long long)seed);
    assert_true(ran > 0);
    assert_int_equal(failed, 0);
}

static void test_grid_f32(void **state) { (void)state; run_dtype(FA_DTYPE_F32); }
static void test_grid_f16(void **state) { (void)state; run_dtype(FA_DTYPE_F16); }
static void test_grid_bf16(void **state) { (void)state; run_dtype(FA_DTYPE_BF16); }

/* Head dims between the grid's (the CUDA backward runs 129-255 at 256 with zero columns; 161
 * has rows of no whole 16 bytes), f16 and bf16, causal or not, GQA, dropout once, a second
 * key tile and a ragged end, against float64. */
static void test_between_dims(void **state)
{
    (void)state;
    fa_context_t ctx;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    if (fa_context_create(&opts, &ctx) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    static const int32_t dims[] = { 136, 161, 200, 248 };
    for (int i = 0; i < 8; i++) {
        fa_case c;
        memset(&c, 0, sizeof(c));
        c.dtype = i % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F16;
        c.head_dim = dims[i / 2];
        c.batch = 2, c.seqlen_q = 150, c.seqlen_k = 211, c.heads_q = 4, c.heads_kv = 2;
        c.causal = (i / 2) % 2, c.window_left = c.window_right = -1;
        c.layout = (fa_case_layout)(i % 2), c.with_lse = 1, c.logit_scale = 1.0f;
        c.dropout_p = i == 5 ? 0.17f : 0.0f, c.seed = seed + 100 + (uint64_t)i;
        fa_bwd_result r;
        if (fa_case_run_backward(ctx, &c, &r) != 0 || !r.passed)
            fail_msg("d%d %s causal %d: %s", c.head_dim, c.dtype == FA_DTYPE_BF16 ? "bf16" : "f16", c.causal,
                     r.message);
    }
    fa_context_destroy(ctx);
}

/* L = sum(o * G) in float64 through the reference forward. */
static double loss(const fa_attention_desc *d, const double *g, size_t n)
{
    double *o = malloc(n * sizeof(double)), l = 0.0;
    assert_non_null(o);
    assert_int_equal(fa_ref_attention(d, 1, o, NULL, NULL), 0);
    for (size_t i = 0; i < n; i++)
        l += o[i] * g[i];
    free(o);
    return l;
}

/* The float64 backward against central differences of the float64 forward, on a
 * tiny shape with every feature: causal + window, softcap, GQA, dropout. */
static void test_reference_finite_differences(void **state)
{
    (void)state;
    enum { SQ = 5, SK = 7, HQ = 4, HK = 2, D = 3 };
    float q[SQ * HQ * D], k[SK * HK * D], v[SK * HK * D], go[SQ * HQ * D];
    double g[SQ * HQ * D], dq[SQ * HQ * D], dk[SK * HK * D], dv[SK * HK * D];
    fa_rng r = { seed };
    for (int i = 0; i < SQ * HQ * D; i++)
        q[i] = (float)fa_rng_uniform(&r), go[i] = (float)fa_rng_uniform(&r), g[i] = go[i];
    for (int i = 0; i < SK * HK * D; i++)
        k[i] = (float)fa_rng_uniform(&r), v[i] = (float)fa_rng_uniform(&r);
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1, d.seqlen_q = SQ, d.seqlen_k = SK, d.num_heads_q = HQ, d.num_heads_kv = HK;
    d.head_dim = D;
    d.causal = 1, d.window_left = 3, d.softcap = 1.5f, d.scale = 0.9f;
    d.dropout_p = 0.3f, d.dropout_seed = 1234, d.dropout_offset = 99;
    d.q = fa_tensor_contiguous(q, FA_DTYPE_F32, FA_LAYOUT_BSHD, SQ, HQ, D);
    d.k = fa_tensor_contiguous(k, FA_DTYPE_F32, FA_LAYOUT_BSHD, SK, HK, D);
    d.v = fa_tensor_contiguous(v, FA_DTYPE_F32, FA_LAYOUT_BSHD, SK, HK, D);
    fa_backward_desc bd;
    fa_backward_desc_init(&bd);
    bd.forward = &d;
    bd.d_o = fa_tensor_contiguous(go, FA_DTYPE_F32, FA_LAYOUT_BSHD, SQ, HQ, D);
    assert_int_equal(fa_ref_backward(&bd, dq, dk, dv), 0);
    struct {
        float *x;
        const double *grad;
        int n;
    } in[3] = { { q, dq, SQ * HQ * D }, { k, dk, SK * HK * D }, { v, dv, SK * HK * D } };
    double worst = 0.0;
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < in[t].n; i++) {
            float x0 = in[t].x[i];
            float up = x0 + 1e-3f, dn = x0 - 1e-3f; /* the perturbations f32 can hold */
            in[t].x[i] = up;
            double lu = loss(&d, g, SQ * HQ * D);
            in[t].x[i] = dn;
            double ld = loss(&d, g, SQ * HQ * D);
            in[t].x[i] = x0;
            double num = (lu - ld) / ((double)up - (double)dn);
            double err = fabs(num - in[t].grad[i]) / (1.0 + fabs(in[t].grad[i]));
            worst = fmax(worst, err);
        }
    print_message("finite differences: worst relative error %.3g\n", worst);
    assert_true(worst < 1e-5);
}

/* Same bits for 1, 2 and 7 threads, flash and standard. */
static void test_backward_deterministic(void **state)
{
    (void)state;
    fa_context_t ctx[3];
    const int threads[3] = { 1, 2, 7 };
    for (int i = 0; i < 3; i++) {
        fa_context_options o = { sizeof(o), FA_BACKEND_CPU, threads[i] };
        assert_int_equal(fa_context_create(&o, &ctx[i]), FA_OK);
    }
    fa_case c;
    memset(&c, 0, sizeof(c));
    c.dtype = FA_DTYPE_BF16, c.batch = 2, c.seqlen_q = 300, c.seqlen_k = 333;
    c.heads_q = 4, c.heads_kv = 2, c.head_dim = 72, c.causal = 1, c.window_left = 150;
    c.window_right = -1, c.softcap = 10.0f, c.dropout_p = 0.2f, c.logit_scale = 1.0f;
    c.seed = seed;
    fa_case_inputs in;
    assert_int_equal(fa_case_inputs_make(&c, 1, &in), 0);
    assert_int_equal(fa_forward(ctx[0], &in.d), FA_OK);
    size_t nq = (size_t)in.rows * 4 * 72, nk = (size_t)in.krows * 2 * 72;
    uint16_t *go = malloc(nq * 2);
    float *g = malloc((nq + 2 * nk) * 4), *first = malloc((nq + 2 * nk) * 4);
    assert_non_null(go && g && first);
    fa_rng r = { seed + 9 };
    fa_ref_fill(&r, FA_DTYPE_BF16, go, (int64_t)nq, 1.0);
    fa_backward_desc bd;
    fa_backward_desc_init(&bd);
    bd.forward = &in.d;
    bd.d_o = fa_tensor_contiguous(go, FA_DTYPE_BF16, FA_LAYOUT_BSHD, 300, 4, 72);
    bd.d_q = fa_tensor_contiguous(g, FA_DTYPE_F32, FA_LAYOUT_BSHD, 300, 4, 72);
    bd.d_k = fa_tensor_contiguous(g + nq, FA_DTYPE_F32, FA_LAYOUT_BSHD, 333, 2, 72);
    bd.d_v = fa_tensor_contiguous(g + nq + nk, FA_DTYPE_F32, FA_LAYOUT_BSHD, 333, 2, 72);
    for (int a = 0; a < 2; a++) {
        in.d.algorithm = (fa_algorithm)a;
        for (int i = 0; i < 3; i++) {
            memset(g, 0, (nq + 2 * nk) * 4);
            assert_int_equal(fa_backward(ctx[i], &bd), FA_OK);
            if (i == 0)
                memcpy(first, g, (nq + 2 * nk) * 4);
            else
                assert_memory_equal(first, g, (nq + 2 * nk) * 4);
        }
    }
    free(go), free(g), free(first);
    fa_case_inputs_free(&in);
    for (int i = 0; i < 3; i++)
        fa_context_destroy(ctx[i]);
}

/* Case c's inputs made, staged on ctx's backend and run forward there (o and lse for a
 * backward). */
static void forward_on(fa_context_t ctx, const fa_case *c, fa_case_inputs *in, fa_case_staged *st)
{
    char msg[256];
    assert_int_equal(fa_case_inputs_make(c, 1, in), 0);
    if (fa_case_stage(ctx, in, st, msg, sizeof(msg)) != 0)
        fail_msg("%s", msg);
    assert_int_equal(fa_forward(ctx, &st->d), FA_OK);
}

/* The backend under test, when it is not the CPU (covered above): several runs of one call
 * give the same bits. Long enough that many key tiles add into each query tile's dQ. */
static void test_backward_deterministic_backend(void **state)
{
    (void)state;
    fa_context_options o = { sizeof(o), fa_test_backend(), 0 };
    if (o.backend == FA_BACKEND_CPU) {
        skip();
        return;
    }
    fa_context_t ctx;
    if (fa_context_create(&o, &ctx) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    const int dims[3] = { 64, 128, 256 };
    for (int v = 0; v < 6; v++) {
        fa_case c;
        memset(&c, 0, sizeof(c));
        c.dtype = FA_DTYPE_BF16, c.batch = 2, c.seqlen_q = 1000, c.seqlen_k = 1100;
        c.heads_q = 4, c.heads_kv = 2, c.head_dim = dims[v / 2], c.causal = v % 2;
        c.window_left = c.window_right = -1, c.logit_scale = 1.0f, c.seed = seed + (uint64_t)v;
        fa_case_inputs in;
        fa_case_staged st;
        forward_on(ctx, &c, &in, &st);
        const size_t nq = (size_t)in.rows * 4 * c.head_dim, nk = (size_t)in.krows * 2 * c.head_dim;
        const size_t gbytes = (nq + 2 * nk) * 4;
        uint16_t *go = malloc(nq * 2);
        float *g = malloc(gbytes), *first = malloc(gbytes);
        assert_non_null(go && g && first);
        fa_rng r = { seed + 17 };
        fa_ref_fill(&r, FA_DTYPE_BF16, go, (int64_t)nq, 1.0);
        void *dgo, *dg;
        assert_int_equal(fa_memory_alloc(ctx, nq * 2, &dgo), FA_OK);
        assert_int_equal(fa_memory_alloc(ctx, gbytes, &dg), FA_OK);
        assert_int_equal(fa_memory_upload(ctx, dgo, go, nq * 2), FA_OK);
        fa_backward_desc bd;
        fa_backward_desc_init(&bd);
        bd.forward = &st.d;
        bd.d_o = fa_tensor_contiguous(dgo, FA_DTYPE_BF16, FA_LAYOUT_BSHD, 1000, 4, c.head_dim);
        bd.d_q = fa_tensor_contiguous(dg, FA_DTYPE_F32, FA_LAYOUT_BSHD, 1000, 4, c.head_dim);
        bd.d_k = fa_tensor_contiguous((float *)dg + nq, FA_DTYPE_F32, FA_LAYOUT_BSHD, 1100, 2, c.head_dim);
        bd.d_v = fa_tensor_contiguous((float *)dg + nq + nk, FA_DTYPE_F32, FA_LAYOUT_BSHD, 1100, 2,
                                      c.head_dim);
        fa_status s = fa_backward(ctx, &bd);
        if (s == FA_ERR_UNSUPPORTED) { /* an inference-only backend */
            print_message("backward refused: %s\n", fa_context_last_error(ctx));
        } else {
            for (int run = 0; run < 4; run++) {
                if (run > 0)
                    assert_int_equal(fa_backward(ctx, &bd), FA_OK);
                assert_int_equal(fa_context_synchronize(ctx), FA_OK);
                assert_int_equal(fa_memory_download(ctx, run ? g : first, dg, gbytes), FA_OK);
                if (run > 0 && memcmp(first, g, gbytes) != 0)
                    fail_msg("d%d causal %d: run %d differs from the first", c.head_dim, c.causal, run);
            }
        }
        fa_memory_free(ctx, dgo);
        fa_memory_free(ctx, dg);
        free(go), free(g), free(first);
        fa_case_unstage(ctx, &st);
        fa_case_inputs_free(&in);
        if (s == FA_ERR_UNSUPPORTED)
            break;
    }
    fa_context_destroy(ctx);
}

/* On CUDA a d_o in float32 beside 16-bit inputs is refused, naming d_o.dtype (its kernels read
 * d_o in q's dtype); the CPU takes it (the finite-difference test above). */
static void test_backend_f32_d_o(void **state)
{
    (void)state;
    fa_context_options o = { sizeof(o), fa_test_backend(), 0 };
    if (o.backend != FA_BACKEND_CUDA) {
        skip();
        return;
    }
    fa_context_t ctx;
    if (fa_context_create(&o, &ctx) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    fa_case c;
    memset(&c, 0, sizeof(c));
    c.dtype = FA_DTYPE_BF16, c.batch = 1, c.seqlen_q = 70, c.seqlen_k = 90, c.heads_q = 2, c.heads_kv = 2;
    c.head_dim = 64, c.window_left = c.window_right = -1, c.logit_scale = 1.0f, c.seed = seed;
    fa_case_inputs in;
    fa_case_staged st;
    forward_on(ctx, &c, &in, &st);
    const size_t nq = 70 * 2 * 64, nk = 90 * 2 * 64;
    void *dg;
    assert_int_equal(fa_memory_alloc(ctx, (2 * nq + 2 * nk) * 4, &dg), FA_OK);
    fa_backward_desc bd;
    fa_backward_desc_init(&bd);
    bd.forward = &st.d;
    bd.d_o = fa_tensor_contiguous(dg, FA_DTYPE_F32, FA_LAYOUT_BSHD, 70, 2, 64);
    bd.d_q = fa_tensor_contiguous((float *)dg + nq, FA_DTYPE_F32, FA_LAYOUT_BSHD, 70, 2, 64);
    bd.d_k = fa_tensor_contiguous((float *)dg + 2 * nq, FA_DTYPE_F32, FA_LAYOUT_BSHD, 90, 2, 64);
    bd.d_v = fa_tensor_contiguous((float *)dg + 2 * nq + nk, FA_DTYPE_F32, FA_LAYOUT_BSHD, 90, 2, 64);
    assert_int_equal(fa_backward(ctx, &bd), FA_ERR_UNSUPPORTED);
    assert_non_null(strstr(fa_context_last_error(ctx), "d_o.dtype"));
    fa_memory_free(ctx, dg);
    fa_case_unstage(ctx, &st);
    fa_case_inputs_free(&in);
    fa_context_destroy(ctx);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    const char *k = getenv("FLASHATTN_CPU_KERNELS");
    printf("backward: kernels=%s seed=%llu (replay: FLASHATTN_TEST_SEED=%llu)\n", k && *k ? k : "auto",
           (unsigned long long)seed, (unsigned long long)seed);
    fa_context_t probe;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    printf("backend: %s\n", fa_backend_name(opts.backend));
    if (fa_context_create(&opts, &probe) == FA_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped: %s\n", fa_last_create_error());
        return 77;
    }
    fa_context_destroy(probe);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_finite_differences),
        cmocka_unit_test(test_backward_deterministic),
        cmocka_unit_test(test_backward_deterministic_backend),
        cmocka_unit_test(test_backend_f32_d_o),
        cmocka_unit_test(test_between_dims),
        cmocka_unit_test(test_grid_f32),
        cmocka_unit_test(test_grid_f16),
        cmocka_unit_test(test_grid_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
