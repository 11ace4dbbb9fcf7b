/* SPDX-License-Identifier: MIT */
/* A paged call that runs out of memory writes nothing, the cache included: each of the
 * library's aligned allocations during a call (this file's aligned_alloc stands in for the C
 * library's) is made to fail in turn, on the decode and the prefill kernels, one-shot and
 * planned, and the cache and outputs are compared with their bytes before the call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashattn.h"

static int countdown = -1; /* allocations left before the one that fails; -1: none fails */

void *aligned_alloc(size_t align, size_t bytes)
{
    if (countdown == 0) {
        countdown = -1;
        return NULL;
    }
    if (countdown > 0)
        countdown--;
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1) == 0 ? p : NULL;
}

enum { HQ = 2, HK = 1, D = 16, PAGE = 4, PAGES = 8, MAXP = 4 };

typedef struct call {
    float q[8 * HQ * D], o[8 * HQ * D], kn[8 * HK * D], vn[8 * HK * D], lse[HQ * 8];
    float k[PAGES * PAGE * HK * D], v[PAGES * PAGE * HK * D];
    int32_t cu[3], lens[2], table[2 * MAXP];
} call;

/* rows[b] new query rows (and appended keys) for sequence b over lens[b] cached ones */
static void fill(call *c, fa_paged_desc *d, const int32_t rows[2])
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < sizeof(c->q) / 4; i++)
        c->q[i] = (float)((i * 7919) % 23) / 23.0f - 0.5f;
    for (size_t i = 0; i < sizeof(c->kn) / 4; i++)
        c->kn[i] = (float)((i * 104729) % 19) / 19.0f - 0.5f, c->vn[i] = (float)(i % 11) / 11.0f;
    for (size_t i = 0; i < sizeof(c->k) / 4; i++)
        c->k[i] = (float)((i * 31) % 17) / 17.0f, c->v[i] = (float)((i * 13) % 29) / 29.0f - 0.5f;
    for (size_t i = 0; i < sizeof(c->o) / 4; i++)
        c->o[i] = -7.0f; /* sentinels: a failed call must leave them */
    for (size_t i = 0; i < sizeof(c->lse) / 4; i++)
        c->lse[i] = -9.0f;
    const int32_t lens[2] = { 5, 3 }, table[2 * MAXP] = { 6, 1, 4, 0, 2, 7, 3, 5 };
    memcpy(c->lens, lens, sizeof(lens));
    memcpy(c->table, table, sizeof(table));
    c->cu[0] = 0, c->cu[1] = rows[0], c->cu[2] = rows[0] + rows[1];
    fa_paged_desc_init(d);
    d->batch = 2;
    d->total_q = c->cu[2];
    d->max_seqlen_q = rows[0] > rows[1] ? rows[0] : rows[1];
    d->max_seqlen_k = lens[0] + rows[0] > lens[1] + rows[1] ? lens[0] + rows[0] : lens[1] + rows[1];
    d->num_heads_q = HQ;
    d->head_dim = D;
    d->q = (fa_tensor){ c->q, FA_DTYPE_F32, 0, HQ * D, D };
    d->o = (fa_tensor){ c->o, FA_DTYPE_F32, 0, HQ * D, D };
    d->cu_seqlens_q = c->cu;
    d->cache = fa_kv_cache_contiguous(c->k, c->v, FA_DTYPE_F32, FA_LAYOUT_BSHD, PAGES, PAGE, HK, D);
    d->block_table = c->table;
    d->max_pages_per_seq = MAXP;
    d->cache_seqlens = c->lens;
    d->k_new = (fa_tensor){ c->kn, FA_DTYPE_F32, 0, HK * D, D };
    d->v_new = (fa_tensor){ c->vn, FA_DTYPE_F32, 0, HK * D, D };
    d->lse = c->lse;
    d->causal = 1;
}

/* Fail the first, second, ... allocation of the call until one succeeds with none failed. */
static void every_allocation(const int32_t rows[2], int planned)
{
    int n = 0;
    for (;; n++) {
        assert_true(n < 64);
        fa_context_t ctx;
        const fa_context_options opts = { sizeof(fa_context_options), FA_BACKEND_CPU, 2 };
        assert_int_equal(fa_context_create(&opts, &ctx), FA_OK);
        call *c = malloc(sizeof(call)), *before = malloc(sizeof(call));
        assert_non_null(c);
        assert_non_null(before);
        fa_paged_desc d;
        fill(c, &d, rows);
        fa_paged_plan_t plan = NULL;
        if (planned)
            assert_int_equal(fa_paged_plan_create(ctx, &d, &plan), FA_OK);
        memcpy(before, c, sizeof(call));
        countdown = n;
        const fa_status st = planned ? fa_paged_run(plan, &d) : fa_paged_forward(ctx, &d);
        const int failed = countdown == -1; /* the n-th allocation was reached and refused */
        countdown = -1;
        if (failed) {
            if (st != FA_ERR_OUT_OF_MEMORY)
                fail_msg("allocation %d refused: status %s, want FA_ERR_OUT_OF_MEMORY", n, fa_status_string(st));
            assert_memory_equal(c->k, before->k, sizeof(c->k));
            assert_memory_equal(c->v, before->v, sizeof(c->v));
            assert_memory_equal(c->o, before->o, sizeof(c->o));
            assert_memory_equal(c->lse, before->lse, sizeof(c->lse));
        } else {
            assert_int_equal(st, FA_OK);
            assert_true(memcmp(c->k, before->k, sizeof(c->k)) != 0); /* the append landed */
        }
        fa_paged_plan_destroy(plan);
        fa_context_destroy(ctx);
        free(c), free(before);
        if (!failed)
            break;
    }
    print_message("rows %d+%d, %s: %d allocations refused in turn, nothing written\n", (int)rows[0], (int)rows[1],
                  planned ? "planned" : "one-shot", n);
    assert_true(n >= 1); /* the call allocates, or this test tests nothing */
}

static void test_decode(void **state)
{
    (void)state;
    const int32_t rows[2] = { 1, 1 };
    every_allocation(rows, 0);
    every_allocation(rows, 1);
}

static void test_prefill(void **state)
{
    (void)state;
    const int32_t rows[2] = { 5, 2 };
    every_allocation(rows, 0);
    every_allocation(rows, 1);
}

int main(void)
{
    const char *b = getenv("FLASHATTN_TEST_BACKEND");
    if (b && strcmp(b, "cpu") != 0) {
        printf("the CPU backend's allocations only: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_decode), cmocka_unit_test(test_prefill) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
