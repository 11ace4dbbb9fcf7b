/* SPDX-License-Identifier: MIT */
/*
 * Serving calls: the paged grid against float64 (page sizes 1..256, shuffled tables, GQA,
 * ragged decode/speculative/prefill rows, append + RoPE, sinks, batch invariance), merges,
 * the standalone append, plans and their bounds, and bad input.
 * FLASHATTN_TEST_BACKEND picks the backend, FLASHATTN_TEST_QUICK=1 the short grid,
 * FLASHATTN_TEST_SEED=N replays a run.
 */
#include "paged.h"

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

#define MAX_CASES 128

static uint64_t seed;
static int level;

static fa_context_t make_ctx(void)
{
    fa_context_t ctx;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    if (fa_context_create(&opts, &ctx) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    return ctx;
}

/* CUDA computes in f16/bf16 only: it refuses f32 caches, naming the dtype. */
static int refused(fa_context_t ctx, const fa_paged_case *c)
{
    return fa_context_backend(ctx) == FA_BACKEND_CUDA && c->dtype == FA_DTYPE_F32;
}

static void test_grid(void **state)
{
    (void)state;
    fa_context_t ctx = make_ctx();
    static fa_paged_case cases[MAX_CASES];
    const int n = fa_paged_grid_build(level, seed, cases, MAX_CASES), every = fa_test_case_every();
    int ran = 0, failed = 0, n_kernels = 0, runs[8] = { 0 };
    char kernels[8][48];
    for (int i = 0; i < n; i++) {
        if (i % every)
            continue;
        fa_paged_result r;
        r.kernel[0] = 0;
        if (refused(ctx, &cases[i])) { /* the refusal, with the field named, is the result */
            if (fa_paged_case_run(ctx, &cases[i], &r) == 0 || !strstr(r.message, "FA_ERR_UNSUPPORTED") ||
                !strstr(r.message, "cache.dtype")) {
                print_error("case %d: want FA_ERR_UNSUPPORTED naming cache.dtype, got: %s\n", i, r.message);
                failed++;
            }
            continue;
        }
        if (fa_paged_case_run(ctx, &cases[i], &r) != 0) {
            char desc[400];
            fa_paged_case_format(&cases[i], desc, sizeof(desc));
            print_error("case %d could not run: %s (%s)\n", i, r.message, desc);
            failed++;
        } else if (!r.passed) {
            print_error("case %d FAILED: %s\n", i, r.message);
            failed++;
        }
        ran++;
        int k = 0; /* the tally of kernels run, so a route that never runs shows */
        while (k < n_kernels && strcmp(kernels[k], r.kernel))
            k++;
        if (k == n_kernels && n_kernels < 8)
            snprintf(kernels[n_kernels++], sizeof(kernels[0]), "%s", r.kernel);
        if (k < n_kernels)
            runs[k]++;
    }
    fa_context_destroy(ctx);
    print_message("%d paged cases, %d failed (seed %llu); kernels:", ran, failed, (unsigned long long)seed);
    for (int k = 0; k < n_kernels; k++)
        print_message(" %s %d", kernels[k][0] ? kernels[k] : "(none)", runs[k]);
    print_message("\n");
    assert_true(ran > 0);
    assert_int_equal(failed, 0);
}

/* ---- a small host-memory call for the API tests (CPU backend) ---- */

typedef struct small {
    uint16_t q[3 * 4 * 16], o[3 * 4 * 16], kn[3 * 2 * 16], vn[3 * 2 * 16];
    uint16_t k[6 * 4 * 2 * 16], v[6 * 4 * 2 * 16];
    int32_t cu[3], bt[2 * 3], lens[2];
    float lse[4 * 3];
    fa_paged_desc d;
} small;

/* Two sequences (2 rows and 1 row, 5 and 2 cached tokens), page 4, GQA 4/2, d16, f16. */
static void small_make(small *s)
{
    memset(s, 0, sizeof(*s));
    fa_rng r = { 11 };
    fa_ref_fill(&r, FA_DTYPE_F16, s->q, 3 * 4 * 16, 1.0);
    fa_ref_fill(&r, FA_DTYPE_F16, s->k, 6 * 4 * 2 * 16, 1.0);
    fa_ref_fill(&r, FA_DTYPE_F16, s->v, 6 * 4 * 2 * 16, 1.0);
    fa_ref_fill(&r, FA_DTYPE_F16, s->kn, 3 * 2 * 16, 1.0);
    fa_ref_fill(&r, FA_DTYPE_F16, s->vn, 3 * 2 * 16, 1.0);
    const int32_t cu[3] = { 0, 2, 3 }, bt[6] = { 4, 1, -1, 5, -1, -1 }, lens[2] = { 5, 2 };
    memcpy(s->cu, cu, sizeof(cu));
    memcpy(s->bt, bt, sizeof(bt));
    memcpy(s->lens, lens, sizeof(lens));
    fa_paged_desc *d = &s->d;
    fa_paged_desc_init(d);
    d->batch = 2;
    d->total_q = 3;
    d->max_seqlen_q = 2;
    d->max_seqlen_k = 8;
    d->num_heads_q = 4;
    d->head_dim = 16;
    d->q = fa_tensor_contiguous(s->q, FA_DTYPE_F16, FA_LAYOUT_BSHD, 3, 4, 16);
    d->o = fa_tensor_contiguous(s->o, FA_DTYPE_F16, FA_LAYOUT_BSHD, 3, 4, 16);
    d->cu_seqlens_q = s->cu;
    d->cache = fa_kv_cache_contiguous(s->k, s->v, FA_DTYPE_F16, FA_LAYOUT_BSHD, 6, 4, 2, 16);
    d->block_table = s->bt;
    d->max_pages_per_seq = 3;
    d->cache_seqlens = s->lens;
    d->k_new = fa_tensor_contiguous(s->kn, FA_DTYPE_F16, FA_LAYOUT_BSHD, 3, 2, 16);
    d->v_new = fa_tensor_contiguous(s->vn, FA_DTYPE_F16, FA_LAYOUT_BSHD, 3, 2, 16);
    d->lse = s->lse;
}

static fa_context_t cpu_ctx(void)
{
    fa_context_t ctx;
    fa_context_options opts = { sizeof(opts), FA_BACKEND_CPU, 0 };
    assert_int_equal(fa_context_create(&opts, &ctx), FA_OK);
    return ctx;
}

/* A bad call: the status, a message naming `field`, and nothing written (o, lse, cache). */
static void expect_refused(fa_context_t ctx, small *s, fa_status want, const char *field)
{
    small before = *s;
    fa_status st = fa_paged_forward(ctx, &s->d);
    const char *msg = fa_context_last_error(ctx);
    if (st != want || !strstr(msg, field))
        fail_msg("got %s \"%s\", want %s naming %s", fa_status_string(st), msg, fa_status_string(want), field);
    assert_memory_equal(s->o, before.o, sizeof(s->o));
    assert_memory_equal(s->k, before.k, sizeof(s->k));
    assert_memory_equal(s->v, before.v, sizeof(s->v));
    assert_memory_equal(s->lse, before.lse, sizeof(s->lse));
}

static void test_bad_input(void **state)
{
    (void)state;
    fa_context_t ctx = cpu_ctx();
    small s;
    small_make(&s);
    assert_int_equal(fa_paged_forward(ctx, &s.d), FA_OK); /* the baseline call is good */
    small_make(&s);
    s.bt[1] = 6;
    expect_refused(ctx, &s, FA_ERR_INVALID_VALUE, "block_table[0][1] (6)");
    small_make(&s);
    s.bt[3] = -2;
    expect_refused(ctx, &s, FA_ERR_INVALID_VALUE, "block_table[1][0]");
    small_make(&s);
    s.bt[3] = 1; /* both sequences append into page 1 */
    expect_refused(ctx, &s, FA_ERR_INVALID_VALUE, "block_table[1][0] (1) is a page this call appends to");
    small_make(&s);
    s.bt[3] = 4; /* sequence 1 appends into page 4, which sequence 0 reads */
    expect_refused(ctx, &s, FA_ERR_INVALID_VALUE, "block_table[1][0] (4)");
    small_make(&s);
    s.bt[0] = 1; /* sequence 0 reads tokens 0..3 from the page its new rows land in */
    expect_refused(ctx, &s, FA_ERR_INVALID_VALUE, "block_table[0][1] (1)");
    small_make(&s);
    s.lens[1] = 4, s.bt[3] = 4, s.bt[4] = 5; /* a shared prefix page read by both: fine */
    assert_int_equal(fa_paged_forward(ctx, &s.d), FA_OK);
    small_make(&s);
    s.lens[0] = 7; /* 7 + 2 new rows > max_seqlen_k 8 */
    expect_refused(ctx, &s, FA_ERR_INVALID_SHAPE, "cache_seqlens[0] (7)");
    small_make(&s);
    s.lens[1] = -1;
    expect_refused(ctx, &s, FA_ERR_INVALID_SHAPE, "cache_seqlens[1]");
    small_make(&s);
    s.d.cache.page_size = 0;
    expect_refused(ctx, &s, FA_ERR_INVALID_SHAPE, "cache.page_size");
    small_make(&s);
    s.d.max_seqlen_k = 13; /* 3 pages of 4 hold 12 */
    expect_refused(ctx, &s, FA_ERR_INVALID_SHAPE, "max_pages_per_seq");
    small_make(&s);
    s.d.cache.num_pages = 5; /* page 5 is in the table */
    expect_refused(ctx, &s, FA_ERR_INVALID_VALUE, "cache.num_pages 5");
    small_make(&s);
    s.cu[2] = 4;
    expect_refused(ctx, &s, FA_ERR_INVALID_SHAPE, "cu_seqlens_q");
    small_make(&s);
    s.d.max_seqlen_q = 1;
    expect_refused(ctx, &s, FA_ERR_INVALID_SHAPE, "max_seqlen_q");
    small_make(&s);
    s.d.block_table = NULL;
    expect_refused(ctx, &s, FA_ERR_NULL_POINTER, "block_table");
    small_make(&s);
    s.d.v_new.data = NULL;
    expect_refused(ctx, &s, FA_ERR_NULL_POINTER, "v_new");
    small_make(&s);
    s.d.cache.k_scale = s.lse;
    expect_refused(ctx, &s, FA_ERR_UNSUPPORTED, "cache.k_scale");
    small_make(&s);
    s.d.cache.dtype = FA_DTYPE_BF16;
    expect_refused(ctx, &s, FA_ERR_INVALID_DTYPE, "cache.dtype");
    small_make(&s); /* fp8 is fa_forward's only */
    s.d.cache.dtype = s.d.k_new.dtype = s.d.v_new.dtype = FA_DTYPE_E4M3;
    expect_refused(ctx, &s, FA_ERR_INVALID_DTYPE, "cache.dtype");
    small_make(&s);
    s.d.q.dtype = FA_DTYPE_E4M3;
    expect_refused(ctx, &s, FA_ERR_INVALID_DTYPE, "q.dtype");
    small_make(&s);
    s.d.num_heads_q = 3;
    expect_refused(ctx, &s, FA_ERR_INVALID_SHAPE, "num_heads_q");
    small_make(&s); /* all of an odd head_dim rotated: the odd head_dim is what is named */
    s.d.head_dim = 15, s.d.rope = FA_ROPE_NEOX;
    expect_refused(ctx, &s, FA_ERR_INVALID_VALUE, "head_dim (15), which is odd");
    small_make(&s);
    s.d.o.data = s.k + 8; /* the output inside the cache that is written */
    expect_refused(ctx, &s, FA_ERR_INVALID_STRIDE, "overlaps");
    small_make(&s);
    s.d.cache.k_stride_token = 8; /* tokens of a written cache overlap */
    expect_refused(ctx, &s, FA_ERR_INVALID_STRIDE, "cache.k");
    small_make(&s);
    s.d.kv_split = 24;
    expect_refused(ctx, &s, FA_ERR_INVALID_VALUE, "kv_split");
    small_make(&s);
    s.d.rope = FA_ROPE_NEOX; /* no tables */
    s.d.rope_max_pos = 16;
    expect_refused(ctx, &s, FA_ERR_NULL_POINTER, "rope_cos");
    small_make(&s);
    float tab[4 * 8] = { 0 };
    s.d.rope = FA_ROPE_INTERLEAVED;
    s.d.rope_max_pos = 4; /* sequence 0's rows sit at positions 5 and 6 */
    s.d.rope_cos = s.d.rope_sin = tab;
    expect_refused(ctx, &s, FA_ERR_INVALID_VALUE, "rope_max_pos (4)");
    small_make(&s);
    s.d.size = 8;
    expect_refused(ctx, &s, FA_ERR_INVALID_ARGUMENT, "sizeof(fa_paged_desc)");
    fa_context_destroy(ctx);
}

static void test_plan_bounds(void **state)
{
    (void)state;
    fa_context_t ctx = cpu_ctx();
    small s;
    small_make(&s);
    fa_paged_desc bounds = s.d;
    bounds.q.data = bounds.o.data = NULL; /* a plan reads no pointer */
    bounds.cu_seqlens_q = bounds.block_table = bounds.cache_seqlens = NULL;
    bounds.cache.k = bounds.cache.v = NULL;
    fa_paged_plan_t plan;
    assert_int_equal(fa_paged_plan_create(ctx, &bounds, &plan), FA_OK);
    fa_run_info info = { .size = sizeof(info) };
    assert_int_equal(fa_paged_plan_info(plan, &info), FA_OK);
    assert_non_null(strstr(info.kernel, "paged"));
    assert_int_equal(fa_paged_run(plan, &s.d), FA_OK);
    small out = s;
    /* the same call one-shot, on the cache as it was: the same bits */
    small_make(&s);
    assert_int_equal(fa_paged_forward(ctx, &s.d), FA_OK);
    assert_memory_equal(out.o, s.o, sizeof(s.o));
    assert_memory_equal(out.k, s.k, sizeof(s.k));
    small_make(&s);
    s.d.batch = 3;
    int32_t cu[4] = { 0, 2, 3, 3 }, lens[3] = { 5, 2, 0 }, bt[9] = { 4, 1, -1, 5, -1, -1, 0, -1, -1 };
    s.d.cu_seqlens_q = cu;
    s.d.cache_seqlens = lens;
    s.d.block_table = bt;
    assert_int_equal(fa_paged_run(plan, &s.d), FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(fa_context_last_error(ctx), "plan's bound"));
    small_make(&s);
    s.d.lse = NULL;
    assert_int_equal(fa_paged_run(plan, &s.d), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(ctx), "lse"));
    small_make(&s);
    const float sinks[8] = { 0.5f, -1.0f, 0.0f, 2.0f, 0.5f, -1.0f, 0.0f, 2.0f };
    assert_true(s.d.num_heads_q <= 8);
    s.d.sinks = sinks; /* the plan has none: a setting of the plan, like lse */
    assert_int_equal(fa_paged_run(plan, &s.d), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(ctx), "sinks"));
    fa_paged_plan_t plan32; /* an f16 call on an f32 plan: the dtypes by name */
    bounds.q.dtype = bounds.o.dtype = bounds.cache.dtype = bounds.k_new.dtype = bounds.v_new.dtype = FA_DTYPE_F32;
    assert_int_equal(fa_paged_plan_create(ctx, &bounds, &plan32), FA_OK);
    small_make(&s);
    assert_int_equal(fa_paged_run(plan32, &s.d), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(ctx), "cache.dtype (f16) differs from the plan's (f32)"));
    fa_paged_plan_destroy(plan32);
    /* bounds at the ends of their ranges: the planner's products of them in 64 bits, checked
     * (the sanitizer builds turn an overflow into a failure) */
    fa_paged_desc huge;
    fa_paged_desc_init(&huge);
    huge.batch = huge.total_q = 65536;
    huge.max_seqlen_q = 1;
    huge.max_seqlen_k = INT32_MAX;
    huge.num_heads_q = 1024;
    huge.head_dim = 128;
    huge.max_pages_per_seq = INT32_MAX / 16 + 1;
    huge.q.dtype = huge.o.dtype = FA_DTYPE_F16;
    huge.cache = fa_kv_cache_contiguous(NULL, NULL, FA_DTYPE_F16, FA_LAYOUT_BSHD, 1, 16, 1024, 128);
    fa_paged_plan_t big = NULL;
    const fa_status st = fa_paged_plan_create(ctx, &huge, &big);
    assert_true(st == FA_OK || st == FA_ERR_SIZE_OVERFLOW || st == FA_ERR_OUT_OF_MEMORY);
    fa_paged_plan_destroy(st == FA_OK ? big : NULL);
    static uint16_t word[128];
    fa_attention_desc dense; /* one query row a sequence against 2^31 - 1 keys: the decode plan */
    fa_attention_desc_init(&dense);
    dense.batch = 64;
    dense.seqlen_q = dense.num_heads_q = dense.num_heads_kv = dense.head_dim = 1;
    dense.seqlen_k = INT32_MAX;
    dense.q = fa_tensor_contiguous(word, FA_DTYPE_F16, FA_LAYOUT_BSHD, 1, 1, 1); /* [64][1][1][1] */
    dense.o = fa_tensor_contiguous(word + 64, FA_DTYPE_F16, FA_LAYOUT_BSHD, 1, 1, 1);
    dense.k = dense.v = fa_tensor_contiguous((void *)(uintptr_t)4096, FA_DTYPE_F16, FA_LAYOUT_BSHD, INT32_MAX, 1, 1);
    fa_run_info ri = { .size = sizeof(ri) };
    const fa_status ds = fa_forward_plan(ctx, &dense, &ri);
    if (ds != FA_OK && ds != FA_ERR_SIZE_OVERFLOW)
        fail_msg("%s", fa_context_last_error(ctx));
    if (ds == FA_OK)
        assert_true(ri.block_k >= 256);
    fa_paged_plan_destroy(plan);
    fa_paged_plan_destroy(NULL);
    fa_context_destroy(ctx);
}

/* fa_kv_append writes what the attention call's own append writes, and nothing else. */
static void test_append_alone(void **state)
{
    (void)state;
    fa_context_t ctx = cpu_ctx();
    small a, b;
    float cs[16 * 8], sn[16 * 8];
    for (int i = 0; i < 16 * 8; i++) {
        cs[i] = cosf(0.1f * (float)i);
        sn[i] = sinf(0.1f * (float)i);
    }
    small_make(&a);
    small_make(&b);
    fa_paged_desc *ds[2] = { &a.d, &b.d };
    for (int i = 0; i < 2; i++) {
        ds[i]->rope = FA_ROPE_NEOX;
        ds[i]->rope_max_pos = 16;
        ds[i]->rope_cos = cs;
        ds[i]->rope_sin = sn;
    }
    assert_int_equal(fa_paged_forward(ctx, &a.d), FA_OK);
    b.d.q.data = b.d.o.data = NULL; /* not looked at */
    assert_int_equal(fa_kv_append(ctx, &b.d), FA_OK);
    assert_memory_equal(a.k, b.k, sizeof(a.k));
    assert_memory_equal(a.v, b.v, sizeof(a.v));
    small c;
    small_make(&c);
    int changed = memcmp(c.k, a.k, sizeof(c.k)) != 0;
    assert_true(changed);
    c.d.k_new.data = NULL;
    assert_int_equal(fa_kv_append(ctx, &c.d), FA_ERR_NULL_POINTER);
    fa_context_destroy(ctx);
}

/* Two halves of a sequence's keys merged equal the whole, within rounding; empty states; a NaN
 * or +inf lse makes its row NaN. */
static void test_merge(void **state)
{
    (void)state;
    fa_context_t ctx = cpu_ctx();
    enum { S = 3, R = 5, H = 2, D = 24 };
    float o_in[S * R * H * D], lse_in[S * H * R], o[R * H * D], lse[H * R];
    fa_rng rng = { seed };
    for (int i = 0; i < S * R * H * D; i++)
        o_in[i] = (float)fa_rng_uniform(&rng);
    for (int i = 0; i < S * H * R; i++)
        lse_in[i] = (float)(30.0 * fa_rng_uniform(&rng));
    for (int s = 0; s < S; s++) /* row 2 of head 1: every state empty */
        lse_in[s * H * R + 1 * R + 2] = -INFINITY;
    lse_in[0 * H * R + 0 * R + 4] = -INFINITY; /* one empty state among full ones */
    lse_in[1 * H * R + 1 * R + 0] = NAN;       /* row 0 of head 1 */
    lse_in[2 * H * R + 0 * R + 1] = INFINITY;  /* row 1 of head 0 */
    fa_merge_desc m;
    fa_merge_desc_init(&m);
    m.num_states = S;
    m.rows = R;
    m.num_heads = H;
    m.head_dim = D;
    m.o_in = (fa_tensor){ o_in, FA_DTYPE_F32, R * H * D, H * D, D };
    m.lse_in = lse_in;
    m.o = fa_tensor_contiguous(o, FA_DTYPE_F32, FA_LAYOUT_BSHD, R, H, D);
    m.lse = lse;
    assert_int_equal(fa_merge_states(ctx, &m), FA_OK);
    for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++) {
            double mx = -INFINITY, sum = 0.0, acc[D] = { 0 };
            if ((r == 0 && h == 1) || (r == 1 && h == 0)) {
                assert_true(isnan(lse[h * R + r]));
                for (int x = 0; x < D; x++)
                    assert_true(isnan(o[(r * H + h) * D + x]));
                continue;
            }
            for (int s = 0; s < S; s++)
                mx = fmax(mx, lse_in[s * H * R + h * R + r]);
            for (int s = 0; s < S && mx > -INFINITY; s++) {
                double w = exp(lse_in[s * H * R + h * R + r] - mx);
                sum += w;
                for (int x = 0; x < D; x++)
                    acc[x] += w * o_in[((s * R + r) * H + h) * D + x];
            }
            double want_lse = mx > -INFINITY ? mx + log(sum) : -INFINITY;
            if (mx == -INFINITY)
                assert_true(lse[h * R + r] == -INFINITY);
            else
                assert_true(fabs(lse[h * R + r] - want_lse) < 1e-5 * fmax(1.0, fabs(want_lse)));
            for (int x = 0; x < D; x++) {
                double want = mx > -INFINITY ? acc[x] / sum : 0.0;
                assert_true(fabs(o[(r * H + h) * D + x] - want) < 1e-5);
            }
        }
    /* one head: its lse stride is never read, so 0 stands (a broadcast axis) */
    float o1[R * D], lse1[R];
    fa_merge_desc one = m;
    one.num_heads = 1;
    one.o_in = (fa_tensor){ o_in, FA_DTYPE_F32, R * H * D, H * D, D };
    one.o = fa_tensor_contiguous(o1, FA_DTYPE_F32, FA_LAYOUT_BSHD, R, 1, D);
    one.lse = lse1;
    one.lse_in_stride_row = 1, one.lse_in_stride_head = 0, one.lse_in_stride_state = H * R;
    assert_int_equal(fa_merge_states(ctx, &one), FA_OK);
    for (int r = 2; r < R; r++) /* rows 0 and 1 of head 0 hold the NaN and +inf cases */
        assert_true(fabsf(lse1[r] - lse[r]) <= 1e-6f * fmaxf(1.0f, fabsf(lse[r])) ||
                    (isinf(lse1[r]) && isinf(lse[r])));
    /* no rows: nothing to merge, nothing written, whatever the strides of the empty axis */
    fa_merge_desc none = m;
    none.rows = 0;
    none.lse_in_stride_row = 0, none.lse_in_stride_head = 0, none.lse_in_stride_state = 0;
    const float before = o[0];
    assert_int_equal(fa_merge_states(ctx, &none), FA_OK);
    assert_true(o[0] == before);
    m.num_states = 0;
    assert_int_equal(fa_merge_states(ctx, &m), FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(fa_context_last_error(ctx), "num_states"));
    m.num_states = S;
    /* strides past 2^63 bytes: the message names the input's lse, not the absent output's */
    fa_merge_desc huge = m;
    huge.lse = NULL;
    huge.lse_in_stride_row = 1, huge.lse_in_stride_head = INT64_MAX / 2, huge.lse_in_stride_state = 8;
    assert_int_equal(fa_merge_states(ctx, &huge), FA_ERR_SIZE_OVERFLOW);
    assert_non_null(strstr(fa_context_last_error(ctx), "lse_in spans"));
    m.o.data = o_in + 8;
    assert_int_equal(fa_merge_states(ctx, &m), FA_ERR_INVALID_STRIDE);
    fa_context_destroy(ctx);
}

/* CUDA reads lengths and page ids on the device, where nothing checks them: entries that name
 * no page (-2, INT32_MIN, past the pool) inside whole key tiles, beside a tile of consecutive
 * pages (one TMA box a column block), read as zeros on the prefill and decode kernels; the call
 * completes with finite outputs, and check_tables names the first bad entry. */
static void test_cuda_bad_tables(void **state)
{
    (void)state;
    if (fa_test_backend() != FA_BACKEND_CUDA) {
        print_message("CUDA only\n");
        return;
    }
    fa_context_t ctx = make_ctx();
    enum { PAGES = 24, PS = 16, D = 128, HQ = 2, KEYS = 256, ROWS = 48 };
    const int64_t pool_n = (int64_t)PAGES * PS * D, q_n = (int64_t)ROWS * HQ * D;
    uint16_t *hk = malloc(2 * pool_n), *hv = malloc(2 * pool_n), *hq = malloc(2 * q_n), *ho = malloc(2 * q_n);
    assert_non_null(hk), assert_non_null(hv), assert_non_null(hq), assert_non_null(ho);
    fa_rng r = { seed };
    fa_ref_fill(&r, FA_DTYPE_BF16, hk, pool_n, 1.0);
    fa_ref_fill(&r, FA_DTYPE_BF16, hv, pool_n, 1.0);
    fa_ref_fill(&r, FA_DTYPE_BF16, hq, q_n, 1.0);
    const int32_t bt[16] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -2, INT32_MIN, PAGES + 3, 13, 14, 15 };
    void *k, *v, *q, *o, *dbt, *dlen, *dcu;
    assert_int_equal(fa_memory_alloc(ctx, 2 * pool_n, &k), FA_OK);
    assert_int_equal(fa_memory_alloc(ctx, 2 * pool_n, &v), FA_OK);
    assert_int_equal(fa_memory_alloc(ctx, 2 * q_n, &q), FA_OK);
    assert_int_equal(fa_memory_alloc(ctx, 2 * q_n, &o), FA_OK);
    assert_int_equal(fa_memory_alloc(ctx, sizeof(bt), &dbt), FA_OK);
    assert_int_equal(fa_memory_alloc(ctx, 4, &dlen), FA_OK);
    assert_int_equal(fa_memory_alloc(ctx, 8, &dcu), FA_OK);
    assert_int_equal(fa_memory_upload(ctx, k, hk, 2 * pool_n), FA_OK);
    assert_int_equal(fa_memory_upload(ctx, v, hv, 2 * pool_n), FA_OK);
    assert_int_equal(fa_memory_upload(ctx, q, hq, 2 * q_n), FA_OK);
    assert_int_equal(fa_memory_upload(ctx, dbt, bt, sizeof(bt)), FA_OK);
    const int32_t len = KEYS;
    assert_int_equal(fa_memory_upload(ctx, dlen, &len, 4), FA_OK);
    for (int rows = ROWS; rows >= 1; rows = rows == 1 ? 0 : 1) { /* the Hopper forward, then decode */
        const int32_t cu[2] = { 0, rows };
        assert_int_equal(fa_memory_upload(ctx, dcu, cu, sizeof(cu)), FA_OK);
        fa_paged_desc d;
        fa_paged_desc_init(&d);
        d.batch = 1;
        d.total_q = rows;
        d.max_seqlen_q = rows;
        d.max_seqlen_k = KEYS;
        d.num_heads_q = HQ;
        d.head_dim = D;
        d.causal = 1;
        d.q = fa_tensor_contiguous(q, FA_DTYPE_BF16, FA_LAYOUT_BSHD, rows, HQ, D);
        d.o = fa_tensor_contiguous(o, FA_DTYPE_BF16, FA_LAYOUT_BSHD, rows, HQ, D);
        d.cu_seqlens_q = dcu;
        d.cache = fa_kv_cache_contiguous(k, v, FA_DTYPE_BF16, FA_LAYOUT_BSHD, PAGES, PS, 1, D);
        d.block_table = dbt;
        d.max_pages_per_seq = 16;
        d.cache_seqlens = dlen;
        fa_status st = fa_paged_forward(ctx, &d);
        if (st != FA_OK)
            fail_msg("%d rows: %s", rows, fa_context_last_error(ctx));
        fa_run_info ran = { .size = sizeof(ran) };
        assert_int_equal(fa_context_last_run(ctx, &ran), FA_OK);
        assert_int_equal(fa_memory_download(ctx, ho, o, 2 * (size_t)rows * HQ * D), FA_OK);
        for (int64_t i = 0; i < (int64_t)rows * HQ * D; i++)
            if (!isfinite(fa_ref_decode(FA_DTYPE_BF16, ho, i)))
                fail_msg("%d rows (%s): o[%lld] is not finite", rows, ran.kernel, (long long)i);
        print_message("%d rows on %s: finite\n", rows, ran.kernel);
        d.check_tables = 1;
        st = fa_paged_forward(ctx, &d);
        const char *msg = fa_context_last_error(ctx);
        if (st != FA_ERR_INVALID_VALUE || !strstr(msg, "block_table[0][10]"))
            fail_msg("check_tables: got %s \"%s\", want FA_ERR_INVALID_VALUE naming block_table[0][10]",
                     fa_status_string(st), msg);
    }
    void *bufs[] = { k, v, q, o, dbt, dlen, dcu };
    for (int i = 0; i < 7; i++)
        fa_memory_free(ctx, bufs[i]);
    free(hk), free(hv), free(hq), free(ho);
    fa_context_destroy(ctx);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    const char *q = getenv("FLASHATTN_TEST_QUICK");
    level = (q && *q == '1') ? 0 : 1;
    printf("paged: backend=%s grid=%s seed=%llu (replay: FLASHATTN_TEST_SEED=%llu)\n",
           fa_backend_name(fa_test_backend()), level ? "full" : "quick", (unsigned long long)seed,
           (unsigned long long)seed);
    fa_context_t probe;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    if (fa_context_create(&opts, &probe) == FA_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped: %s\n", fa_last_create_error());
        return 77;
    }
    fa_context_destroy(probe);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid),         cmocka_unit_test(test_bad_input), cmocka_unit_test(test_plan_bounds),
        cmocka_unit_test(test_append_alone), cmocka_unit_test(test_merge), cmocka_unit_test(test_cuda_bad_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
