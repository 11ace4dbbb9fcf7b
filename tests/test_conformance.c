/* SPDX-License-Identifier: MIT */
/*
 * The conformance grid against float64 on the CPU backend, for the kernel
 * table named by FLASHATTN_CPU_KERNELS (CTest runs one process per table).
 * FLASHATTN_TEST_QUICK=1 selects the short-sequence grid (sanitizer builds).
 * FLASHATTN_TEST_MAX_DIM=N keeps the cases of head_dim <= N (`make test` on GLES, where each
 * head_dim compiles shaders for seconds on CPU renderers).
 * FLASHATTN_TEST_SEED=N replays a run; FLASHATTN_TEST_DTYPE=f32|f16|bf16|e4m3 runs that dtype's grid only.
 * On CUDA every decode-shaped case must run the decode kernel (the plan's kernel name says so).
 */
#include "ref.h"

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
static int level;

/* The CUDA backend's decode route: a sequence's query rows times the GQA group within the decode
 * kernel's 16 packed rows, no dropout (f32 is refused). */
static int cuda_decode_shaped(const fa_case *c)
{
    return c->dtype != FA_DTYPE_F32 && c->dtype != FA_DTYPE_E4M3 && c->dropout_p == 0.0f &&
           (int64_t)c->seqlen_q * (c->heads_q / c->heads_kv) <= 16;
}

/* Whether FLASHATTN_TEST_DTYPE (one dtype's tests, e.g. under a sanitizer) leaves out dt's. */
static int left_out(fa_dtype dt)
{
    const char *only = getenv("FLASHATTN_TEST_DTYPE");
    const char *name = dt == FA_DTYPE_F32 ? "f32" : dt == FA_DTYPE_F16 ? "f16" : dt == FA_DTYPE_BF16 ? "bf16" : "e4m3";
    if (!only || !*only || strcmp(only, name) == 0)
        return 0;
    if (strcmp(only, "f32") && strcmp(only, "f16") && strcmp(only, "bf16") && strcmp(only, "e4m3"))
        fail_msg("FLASHATTN_TEST_DTYPE=%s: not f32, f16, bf16 or e4m3 (a typo would skip every case)", only);
    print_message("%s skipped: FLASHATTN_TEST_DTYPE=%s\n", name, only);
    return 1;
}

static void run_dtype(fa_dtype dt)
{
    if (left_out(dt))
        return;
    fa_context_t ctx;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    fa_status st = fa_context_create(&opts, &ctx);
    if (st != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    static fa_case cases[MAX_CASES];
    int n = fa_grid_build(level, seed, cases, MAX_CASES), ran = 0, failed = 0, decode = 0, fp8 = 0;
    const int cuda = fa_context_backend(ctx) == FA_BACKEND_CUDA;
    const int every = fa_test_case_every();
    const char *md = getenv("FLASHATTN_TEST_MAX_DIM");
    const int max_dim = md && atoi(md) > 0 ? atoi(md) : 256;
    for (int i = 0; i < n; i++) {
        if (cases[i].dtype != dt || i % every || cases[i].head_dim > max_dim)
            continue;
        fa_case_result r;
        if (fa_case_run(ctx, &cases[i], &r) != 0) {
            char desc[256];
            fa_case_format(&cases[i], desc, sizeof(desc));
            print_error("case %d could not run: %s (%s)\n", i, r.message, desc);
            failed++;
        } else if (!r.passed) {
            print_error("case %d FAILED: %s\n", i, r.message);
            failed++;
        } else if (cuda && dt == FA_DTYPE_E4M3 && r.kernel && fp8++ == 0) {
            print_message("case %d ran %s\n", i, r.kernel);
        } else if (cuda && cuda_decode_shaped(&cases[i])) {
            char desc[256];
            fa_case_format(&cases[i], desc, sizeof(desc));
            if (!r.kernel || strncmp(r.kernel, "cuda-decode-", 12) != 0) {
                print_error("case %d ran %s, not the decode kernel (%s)\n", i, r.kernel ? r.kernel : "nothing",
                            desc);
                failed++;
            } else if (decode++ == 0) {
                print_message("case %d ran %s (%s)\n", i, r.kernel, desc);
            }
        }
        ran++;
    }
    fa_context_destroy(ctx);
    if (cuda)
        print_message("%d decode-shaped cases ran the decode kernel\n", decode);
    print_message("%d cases, %d failed (seed %llu)\n", ran, failed, (unsigned long long)seed);
    assert_true(ran > 0);
    assert_true(!cuda || dt == FA_DTYPE_F32 || dt == FA_DTYPE_E4M3 || decode > 0);
    assert_int_equal(failed, 0);
}

/* The decode route's kernel at head_dim 128: the portable one or, on Hopper, its own. */
static int is_decode_d128(const char *kernel)
{
    return kernel && (strcmp(kernel, "cuda-decode-d128") == 0 || strcmp(kernel, "cuda-decode-sm90-d128") == 0);
}

/* CUDA's decode route splits each sequence's keys at multiples of 1024 from key 0, whatever the
 * rest of the batch: a short sequence of a varlen batch whose longest has 5000 keys gets the same
 * bits run alone. */
static void test_decode_batch_invariance(void **state)
{
    (void)state;
    if (fa_test_backend() != FA_BACKEND_CUDA) {
        print_message("CUDA only\n");
        return;
    }
    if (left_out(FA_DTYPE_BF16))
        return;
    fa_context_t ctx;
    fa_context_options opts = { sizeof(opts), FA_BACKEND_CUDA, 0 };
    if (fa_context_create(&opts, &ctx) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    const fa_case c = { .dtype = FA_DTYPE_BF16, .batch = 6, .seqlen_q = 2, .seqlen_k = 5000, .heads_q = 16,
                        .heads_kv = 4, .head_dim = 128, .causal = 1, .window_left = -1, .window_right = -1,
                        .layout = FA_CASE_BSHD, .varlen = 1, .with_lse = 1, .logit_scale = 1.0f, .seed = seed };
    fa_case_inputs in;
    fa_case_staged st;
    char msg[256];
    assert_int_equal(fa_case_inputs_make(&c, 1, &in), 0);
    if (fa_case_stage(ctx, &in, &st, msg, sizeof(msg)) != 0)
        fail_msg("%s", msg);
    int b = c.batch - 1; /* the last sequence with rows and keys, else the first */
    while (b > 0 && (in.cu_q[b + 1] == in.cu_q[b] || in.cu_k[b + 1] == in.cu_k[b]))
        b--;
    const int32_t q0 = in.cu_q[b], nq = in.cu_q[b + 1] - q0, k0 = in.cu_k[b], nk = in.cu_k[b + 1] - k0;
    const int32_t total = st.d.seqlen_q, hq = c.heads_q, row = hq * c.head_dim;
    fa_run_info info = { .size = sizeof(info) };
    assert_int_equal(fa_forward_plan(ctx, &st.d, &info), FA_OK);
    print_message("batch of %d (%d keys at most): %s, %d keys a split; sequence %d alone: %d rows, %d keys\n",
                  c.batch, c.seqlen_k, info.kernel, (int)info.block_k, b, nq, nk);
    assert_true(is_decode_d128(info.kernel));
    assert_int_equal(info.block_k, 1024);
    assert_int_equal(fa_forward(ctx, &st.d), FA_OK);
    assert_int_equal(fa_memory_download(ctx, in.o, st.o, (size_t)in.o_bytes), FA_OK);
    assert_int_equal(fa_memory_download(ctx, in.lse, st.lse, (size_t)in.lse_bytes), FA_OK);

    const int32_t cu_q[2] = { 0, nq }, cu_k[2] = { 0, nk };
    fa_attention_desc a = st.d;
    a.batch = 1;
    a.seqlen_q = nq;
    a.seqlen_k = nk;
    a.cu_seqlens_q = cu_q;
    a.cu_seqlens_k = cu_k;
    a.q.data = (uint16_t *)st.d.q.data + (int64_t)q0 * st.d.q.stride_seq;
    a.k.data = (uint16_t *)st.d.k.data + (int64_t)k0 * st.d.k.stride_seq;
    a.v.data = (uint16_t *)st.d.v.data + (int64_t)k0 * st.d.v.stride_seq;
    a.o.data = (uint16_t *)st.d.o.data + (int64_t)q0 * st.d.o.stride_seq;
    a.lse = st.d.lse + q0; /* [heads, total] as the batch's */
    a.lse_stride_head = total;
    a.lse_stride_seq = 1;
    uint16_t *o = malloc((size_t)in.o_bytes);
    float *lse = malloc((size_t)in.lse_bytes);
    assert_non_null(o);
    assert_non_null(lse);
    memset(o, 0xff, (size_t)in.o_bytes);
    memset(lse, 0xff, (size_t)in.lse_bytes);
    assert_int_equal(fa_memory_upload(ctx, st.o, o, (size_t)in.o_bytes), FA_OK);
    assert_int_equal(fa_memory_upload(ctx, st.lse, lse, (size_t)in.lse_bytes), FA_OK);
    assert_int_equal(fa_forward_plan(ctx, &a, &info), FA_OK);
    assert_true(is_decode_d128(info.kernel));
    assert_int_equal(fa_forward(ctx, &a), FA_OK);
    assert_int_equal(fa_memory_download(ctx, o, st.o, (size_t)in.o_bytes), FA_OK);
    assert_int_equal(fa_memory_download(ctx, lse, st.lse, (size_t)in.lse_bytes), FA_OK);
    const uint16_t *o_all = in.o;
    assert_memory_equal(o + (int64_t)q0 * row, o_all + (int64_t)q0 * row, (size_t)nq * row * sizeof(uint16_t));
    for (int32_t h = 0; h < hq; h++)
        assert_memory_equal(lse + (int64_t)h * total + q0, in.lse + (int64_t)h * total + q0,
                            (size_t)nq * sizeof(float));
    free(o);
    free(lse);
    fa_case_unstage(ctx, &st);
    fa_case_inputs_free(&in);
    fa_context_destroy(ctx);
}

static void test_f32(void **state) { (void)state; run_dtype(FA_DTYPE_F32); }
static void test_f16(void **state) { (void)state; run_dtype(FA_DTYPE_F16); }
static void test_bf16(void **state) { (void)state; run_dtype(FA_DTYPE_BF16); }
static void test_e4m3(void **state) { (void)state; run_dtype(FA_DTYPE_E4M3); }

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    const char *q = getenv("FLASHATTN_TEST_QUICK");
    level = (q && *q == '1') ? 0 : 1;
    const char *k = getenv("FLASHATTN_CPU_KERNELS");
    printf("conformance: kernels=%s grid=%s seed=%llu (replay: FLASHATTN_TEST_SEED=%llu)\n",
           k && *k ? k : "auto", level ? "full" : "quick", (unsigned long long)seed,
           (unsigned long long)seed);

    /* A kernel table this CPU cannot run is a skip, not a failure. */
    fa_context_t probe;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    printf("backend: %s\n", fa_backend_name(opts.backend));
    if (fa_context_create(&opts, &probe) == FA_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped: %s\n", fa_last_create_error());
        return 77;
    }
    fa_context_destroy(probe);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_e4m3),
        cmocka_unit_test(test_decode_batch_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
