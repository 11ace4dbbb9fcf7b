/* SPDX-License-Identifier: MIT */
/*
 * A bounded random fuzzer of paged calls. Each case draws a valid fa_paged_desc from what it
 * allows (page sizes 1..300 with shuffled tables and a row stride, head_dim 1..256, MHA/GQA,
 * ragged decode / speculative / prefill / empty rows, cached lengths at page edges, append,
 * NeoX and interleaved RoPE over part or all of head_dim with implied or given positions,
 * the three cache layouts, causal, windows, softcap, sinks, lse, kv_split, plans with bounds)
 * and judges it against the float64 paged reference (tests/ref/paged.c: tolerance from the
 * standard algorithm, the cache's bytes, batch invariance). In a share of the cases one field
 * of the descriptor is then made invalid: the call must fail with a message naming that
 * field and write nothing (o, lse and the pools keep their bytes).
 *
 * FLASHATTN_TEST_SEED=N replays a run: its first case is case N, so N from a failure and
 * FLASHATTN_FUZZ_ITERS=1 replay that case alone. FLASHATTN_FUZZ_ITERS sets the number of cases
 * (default 400, 80 with FLASHATTN_TEST_QUICK=1 as sanitizer builds run). The mutations run on
 * the CPU backend only (they need host tables); FLASHATTN_TEST_BACKEND picks the backend of
 * the judged calls.
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

enum { DEFAULT_ITERS = 400, QUICK_ITERS = 80, SHOWN_FAILURES = 8, MUTATIONS = 22 };
/* multiply-adds of one case's float64 reference: keeps a case a few milliseconds */
#define WORK_CAP 2.0e6

static uint64_t first_seed;
static long iters;

static uint64_t rnd(fa_rng *r, uint64_t n) { return fa_rng_next(r) % n; }
static int chance(fa_rng *r, int percent) { return (int)rnd(r, 100) < percent; }

static int32_t draw_page(fa_rng *r)
{
    uint64_t u = rnd(r, 100);
    return u < 30 ? 16 : u < 45 ? 1 : u < 60 ? 2 + (int32_t)rnd(r, 7) : u < 80 ? 9 + (int32_t)rnd(r, 56)
                                                                                : 65 + (int32_t)rnd(r, 236);
}

static int32_t draw_dim(fa_rng *r)
{
    static const int32_t dims[] = { 1, 2, 3, 8, 15, 16, 17, 32, 33, 64, 65, 80, 96, 127, 128, 129, 200, 256 };
    uint64_t u = rnd(r, 100);
    return u < 40 ? 1 + (int32_t)rnd(r, 24) : u < 75 ? dims[rnd(r, sizeof(dims) / sizeof(dims[0]))]
                                                      : 25 + (int32_t)rnd(r, 232);
}

/* A valid case from seed (its own stream: a case replays from its seed alone). */
static fa_paged_case draw_case(uint64_t seed)
{
    static const int32_t groups[] = { 1, 1, 2, 4, 8 };
    fa_rng r = { seed };
    fa_paged_case c;
    memset(&c, 0, sizeof(c));
    c.seed = fa_rng_next(&r);
    c.dtype = (fa_dtype)rnd(&r, 3);
    c.o_f32 = c.dtype != FA_DTYPE_F32 && chance(&r, 20);
    c.page_size = draw_page(&r);
    c.head_dim = draw_dim(&r);
    c.heads_kv = 1 + (int32_t)rnd(&r, 3);
    c.heads_q = c.heads_kv * groups[rnd(&r, 5)];
    c.batch = 1 + (int32_t)rnd(&r, 6);
    c.append = chance(&r, 65);
    const int32_t ps = c.page_size;
    for (int32_t b = 0; b < c.batch; b++) {
        uint64_t kind = rnd(&r, 10);
        c.q_lens[b] = kind < 4 ? 1 : kind < 6 ? 2 + (int32_t)rnd(&r, 4) : kind < 9 ? 6 + (int32_t)rnd(&r, 40) : 0;
        const int32_t edges[] = { 0, 1, ps - 1, ps, ps + 1, 2 * ps, (int32_t)rnd(&r, 400) };
        c.cache_lens[b] = edges[rnd(&r, 7)];
        if (!c.append && c.cache_lens[b] < c.q_lens[b]) /* queries are the cache's last tokens */
            c.cache_lens[b] = c.q_lens[b];
    }
    c.rope = (fa_rope)rnd(&r, 3);
    if (c.rope != FA_ROPE_NONE) {
        const int32_t even = c.head_dim & ~1;
        if (even < 2)
            c.rope = FA_ROPE_NONE;
        else if (c.head_dim % 2 || chance(&r, 40)) /* part of head_dim (an odd one: the even part) */
            c.rope_dim = 2 + 2 * (int32_t)rnd(&r, (uint64_t)(even / 2));
        c.positions = c.rope != FA_ROPE_NONE && chance(&r, 30);
    }
    c.layout = (fa_paged_layout)rnd(&r, 3);
    c.causal = chance(&r, 50);
    c.window_left = chance(&r, 25) ? (int32_t)rnd(&r, 60) : -1;
    c.window_right = !c.causal && chance(&r, 25) ? (int32_t)rnd(&r, 12) : -1;
    c.softcap = chance(&r, 15) ? 1.0f + (float)rnd(&r, 30) : 0.0f;
    c.sinks = chance(&r, 25);
    c.with_lse = chance(&r, 70);
    c.kv_split = chance(&r, 25) ? 16 * (1 + (int32_t)rnd(&r, 8)) : 0;
    c.use_plan = chance(&r, 30);
    /* keep the float64 reference (and the dense baseline) cheap */
    for (;;) {
        double work = 0.0;
        for (int32_t b = 0; b < c.batch; b++)
            work += (double)c.q_lens[b] * (c.cache_lens[b] + c.q_lens[b]);
        if (work * c.heads_q * c.head_dim <= WORK_CAP)
            break;
        for (int32_t b = 0; b < c.batch; b++) {
            c.cache_lens[b] /= 2;
            c.q_lens[b] = c.q_lens[b] > 1 ? c.q_lens[b] / 2 : c.q_lens[b];
            if (!c.append && c.cache_lens[b] < c.q_lens[b])
                c.cache_lens[b] = c.q_lens[b];
        }
    }
    return c;
}

/* One invalid field: applies mutation m to d (h's tables), or returns NULL where it does not
 * apply to this case; otherwise the name the message must carry. */
static const char *mutate(int m, fa_paged_host *h, const fa_paged_case *c, fa_paged_desc *d)
{
    int32_t *bt = (int32_t *)d->block_table, *lens = (int32_t *)d->cache_seqlens;
    int32_t *cu = (int32_t *)d->cu_seqlens_q;
    const int64_t row = d->block_table_stride ? d->block_table_stride : d->max_pages_per_seq;
    int32_t used = -1; /* a sequence with a key: its first table entry is read */
    for (int32_t b = 0; b < d->batch && used < 0; b++)
        if (lens[b] + (d->k_new.data ? cu[b + 1] - cu[b] : 0) > 0)
            used = b;
    switch (m) {
    case 0: d->cache.page_size = 0; return "cache.page_size";
    case 1: d->head_dim = 0; return "head_dim";
    case 2: d->head_dim = FA_MAX_HEAD_DIM + 1; return "head_dim";
    case 3:
        if (c->heads_kv < 2)
            return NULL;
        d->num_heads_q += 1;
        return "num_heads_q";
    case 4: d->batch = 0; return "batch";
    case 5: d->kv_split = 24; return "kv_split";
    case 6:
        if (d->max_pages_per_seq < 2)
            return NULL;
        d->block_table_stride = d->max_pages_per_seq - 1;
        return "block_table_stride";
    case 7:
        if (used < 0)
            return NULL;
        bt[used * row] = d->cache.num_pages;
        return "block_table[";
    case 8: lens[d->batch - 1] = -1; return "cache_seqlens[";
    case 9: lens[0] = d->max_seqlen_k + 1; return "cache_seqlens[0]";
    case 10:
        if (d->batch < 2)
            return NULL;
        cu[1] = d->total_q + 1;
        return "cu_seqlens_q";
    case 11: d->q.data = NULL; return "q.data";
    case 12:
        if (d->rope == FA_ROPE_NONE)
            return NULL;
        d->rope_dim = 3;
        return "rope_dim";
    case 13: d->size = sizeof(*d) - 8; return "sizeof(fa_paged_desc)";
    case 14: d->softcap = -1.0f; return "softcap";
    case 15: d->window_left = -5; return "window_left";
    case 16: d->scale = NAN; return "scale";
    case 17: d->cache.dtype = c->dtype == FA_DTYPE_F32 ? FA_DTYPE_F16 : FA_DTYPE_F32; return "dtype";
    case 18: /* an empty o overlaps nothing: the call is a no-op */
        if (d->total_q == 0)
            return NULL;
        d->o.data = h->pool;
        return "overlaps";
    case 19: d->check_tables = 2; return "check_tables";
    case 20: { /* another sequence's first entry names a page this call appends to */
        if (!d->k_new.data)
            return NULL;
        for (int32_t a = 0; a < d->batch; a++) {
            if (cu[a + 1] == cu[a])
                continue;
            const int32_t written = bt[a * row + lens[a] / d->cache.page_size];
            for (int32_t b = 0; b < d->batch; b++)
                if (b != a && lens[b] + cu[b + 1] - cu[b] > 0) {
                    bt[b * row] = written;
                    return "is a page this call appends to";
                }
        }
        return NULL;
    }
    case 21: /* a pool off its elements' alignment (a device reads elements whole) */
        if (d->cache.dtype == FA_DTYPE_E4M3)
            return NULL;
        d->cache.v = (char *)d->cache.v + 1;
        return "cache.v";
    }
    return NULL;
}

/* Mutation m of case c on ctx: 0 passed (or did not apply), 1 failed (message printed). */
static int mutation_fails(fa_context_t ctx, const fa_paged_case *c, int m, uint64_t id)
{
    fa_paged_host h;
    if (fa_paged_case_host(c, &h) != 0)
        return 0; /* out of memory: nothing to judge */
    fa_paged_desc d = h.d;
    const char *field = mutate(m, &h, c, &d);
    int failed = 0;
    void *o0 = malloc((size_t)h.o_bytes + 1), *l0 = malloc((size_t)h.lse_bytes + 1),
         *p0 = malloc((size_t)h.pool_bytes + 1);
    if (field && o0 && l0 && p0) {
        memcpy(o0, h.o, (size_t)h.o_bytes);
        if (h.lse)
            memcpy(l0, h.lse, (size_t)h.lse_bytes);
        memcpy(p0, h.pool, (size_t)h.pool_bytes);
        const fa_status st = fa_paged_forward(ctx, &d);
        const char *msg = fa_context_last_error(ctx);
        const int wrote = memcmp(o0, h.o, (size_t)h.o_bytes) != 0 ||
                          (h.lse && memcmp(l0, h.lse, (size_t)h.lse_bytes) != 0) ||
                          memcmp(p0, h.pool, (size_t)h.pool_bytes) != 0;
        if (st == FA_OK || !strstr(msg, field) || wrote) {
            print_error("case %llu mutation %d: %s \"%s\"%s; want a refusal naming %s\n", (unsigned long long)id, m,
                        fa_status_string(st), st == FA_OK ? "" : msg, wrote ? ", and it wrote" : "", field);
            failed = 1;
        }
    }
    free(o0), free(l0), free(p0);
    fa_paged_host_free(&h);
    return failed;
}

static void test_fuzz_paged(void **state)
{
    (void)state;
    fa_context_t ctx, cpu;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 }, copts = { sizeof(copts), FA_BACKEND_CPU, 0 };
    if (fa_context_create(&opts, &ctx) != FA_OK || fa_context_create(&copts, &cpu) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    const int cuda = fa_context_backend(ctx) == FA_BACKEND_CUDA;
    long failed = 0, judged = 0, mutated = 0;
    for (long i = 0; i < iters; i++) {
        const uint64_t id = first_seed + (uint64_t)i;
        fa_paged_case c = draw_case(id);
        char label[400];
        fa_paged_case_format(&c, label, sizeof(label));
        if (!(cuda && c.dtype == FA_DTYPE_F32)) { /* CUDA refuses float32 caches (test_paged) */
            fa_paged_result res;
            judged++;
            if (fa_paged_case_run(ctx, &c, &res) != 0 || !res.passed) {
                if (failed < SHOWN_FAILURES)
                    print_error("case %llu (replay: FLASHATTN_TEST_SEED=%llu FLASHATTN_FUZZ_ITERS=1): %s\n",
                                (unsigned long long)id, (unsigned long long)id, res.message);
                failed++;
            }
        }
        fa_rng r = { id ^ 0x9e3779b97f4a7c15ull };
        if (chance(&r, 40)) {
            const int m = (int)rnd(&r, MUTATIONS);
            mutated++;
            if (mutation_fails(cpu, &c, m, id)) {
                print_error("  the case: %s\n", label);
                failed++;
            }
        }
    }
    printf("%ld cases judged, %ld mutated, %ld failed (first seed %llu)\n", judged, mutated, failed,
           (unsigned long long)first_seed);
    fa_context_destroy(ctx);
    fa_context_destroy(cpu);
    if (failed)
        fail_msg("%ld of %ld cases failed", failed, iters);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED"), *n = getenv("FLASHATTN_FUZZ_ITERS");
    const char *q = getenv("FLASHATTN_TEST_QUICK");
    first_seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    iters = n && *n ? strtol(n, NULL, 10) : (q && *q == '1') ? QUICK_ITERS : DEFAULT_ITERS;
    printf("paged fuzz: backend=%s cases=%ld first seed=%llu (replay: FLASHATTN_TEST_SEED=%llu)\n",
           fa_backend_name(fa_test_backend()), iters, (unsigned long long)first_seed,
           (unsigned long long)first_seed);
    fa_context_t probe;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    if (fa_context_create(&opts, &probe) == FA_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped: %s\n", fa_last_create_error());
        return 77;
    }
    fa_context_destroy(probe);
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_fuzz_paged) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
