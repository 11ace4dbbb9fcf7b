/* SPDX-License-Identifier: MIT */
/*
 * The continuous-batching scheduler (src/model/scheduler.c) against a model it cannot fool: a
 * simulated KV cache whose slots the steps write (each row's token and position, at the
 * slot the block table gives), and a "model" whose next token hashes every token it reads
 * back from that cache through the step's block table. A request's output is then the hash
 * chain of its own tokens only if every step fed the right rows at the right slots, kept
 * pages apart and recomputed what a preemption dropped. Random workloads (requests joining
 * mid-run, tight caches forcing preemptions, cancels, early stops) plus the refusals.
 * FLASHATTN_TEST_SEED=N replays the random workloads.
 */
#include "scheduler.h"

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

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The simulated model's next token after tokens[0..n): a hash of all of them. */
static int32_t next_token(const int32_t *t, int32_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int32_t i = 0; i < n; i++)
        h = mix(h ^ (uint64_t)(uint32_t)t[i] ^ ((uint64_t)i << 32));
    return (int32_t)(h % 1000);
}

typedef struct slot_t {
    int64_t id; /* the request whose row wrote it */
    int32_t pos, token;
} slot_t;

typedef struct world {
    fa_sched_options o;
    slot_t *cache; /* [num_pages * page_size] */
} world;

/* One step through the simulated model: checks the step's shape, writes its rows into the
 * cache, reads each sampled sequence's whole context back and hashes it. */
static void run_step(world *w, fa_sched *s, const fa_step *st, int32_t *next)
{
    const int32_t ps = w->o.page_size;
    assert_true(st->batch <= w->o.max_batch);
    assert_true(st->total_q <= w->o.token_budget);
    assert_int_equal(st->cu_seqlens_q[0], 0);
    assert_int_equal(st->cu_seqlens_q[st->batch], st->total_q);
    /* no page is held by two sequences of the step */
    char seen[256] = { 0 }; /* the workloads' caches are smaller */
    assert_true(w->o.num_pages <= 256);
    for (int32_t b = 0; b < st->batch; b++) {
        const int32_t keys = st->cache_seqlens[b] + st->cu_seqlens_q[b + 1] - st->cu_seqlens_q[b];
        assert_true(keys <= st->max_seqlen_k);
        for (int32_t i = 0; i < (keys + ps - 1) / ps; i++) {
            const int32_t pg = st->block_table[(int64_t)b * st->max_pages_per_seq + i];
            assert_true(pg >= 0 && pg < w->o.num_pages);
            assert_false(seen[pg & 255]);
            seen[pg & 255] = 1;
        }
    }
    for (int32_t b = 0; b < st->batch; b++) {
        fa_request_info info;
        assert_int_equal(fa_sched_request(s, st->ids[b], &info, NULL), FA_OK);
        const int32_t q0 = st->cu_seqlens_q[b], qn = st->cu_seqlens_q[b + 1] - q0, cached = st->cache_seqlens[b];
        assert_int_equal(cached, info.cached);
        for (int32_t i = 0; i < qn; i++) { /* the append: the rows' tokens at their slots */
            const int32_t pos = cached + i;
            assert_int_equal(st->positions[q0 + i], pos);
            assert_int_equal(st->tokens[q0 + i], info.tokens[pos]);
            const int32_t pg = st->block_table[(int64_t)b * st->max_pages_per_seq + pos / ps];
            w->cache[(int64_t)pg * ps + pos % ps] = (slot_t){ st->ids[b], pos, st->tokens[q0 + i] };
        }
        if (!st->sample[b])
            continue;
        const int32_t keys = cached + qn;
        int32_t *ctx = malloc(sizeof(int32_t) * (size_t)keys);
        for (int32_t j = 0; j < keys; j++) { /* attention reads every key through the table */
            const slot_t *sl = &w->cache[(int64_t)st->block_table[(int64_t)b * st->max_pages_per_seq + j / ps] * ps + j % ps];
            if (sl->id != st->ids[b] || sl->pos != j)
                fail_msg("request %lld reads position %d from a slot holding request %lld position %d",
                         (long long)st->ids[b], j, (long long)sl->id, sl->pos);
            ctx[j] = sl->token;
        }
        next[b] = next_token(ctx, keys);
        free(ctx);
    }
}

typedef struct plan_req {
    int32_t arrive, n, max_new, stop_at, cancel_at; /* stop_at: generated count that stops it (0: none) */
    int64_t id;
    int added, cancelled;
} plan_req;

/* A random workload to completion; returns the preemptions it caused. */
static int64_t workload(uint64_t sd, fa_sched_options o, int32_t nreq)
{
    uint64_t r = sd;
    world w = { o, calloc((size_t)o.num_pages * (size_t)o.page_size, sizeof(slot_t)) };
    fa_sched *s;
    char err[FA_MODEL_ERR_LEN];
    assert_int_equal(fa_sched_create(&o, &s, err), FA_OK);
    plan_req *pr = calloc((size_t)nreq, sizeof(plan_req));
    int32_t **prompts = calloc((size_t)nreq, sizeof(int32_t *));
    for (int32_t i = 0; i < nreq; i++) {
        pr[i].arrive = (int32_t)(mix(r += 0x9E37) % 40);
        const int32_t cap = o.max_context < o.num_pages * o.page_size ? o.max_context : o.num_pages * o.page_size;
        pr[i].n = 1 + (int32_t)(mix(r += 0x9E37) % (uint64_t)(cap / 2));
        pr[i].max_new = 1 + (int32_t)(mix(r += 0x9E37) % (uint64_t)(cap - pr[i].n));
        pr[i].stop_at = mix(r += 0x9E37) % 5 == 0 ? 1 + (int32_t)(mix(r) % (uint64_t)pr[i].max_new) : 0;
        pr[i].cancel_at = mix(r += 0x9E37) % 9 == 0 ? pr[i].arrive + 1 + (int32_t)(mix(r) % 20) : -1;
        prompts[i] = malloc(sizeof(int32_t) * (size_t)pr[i].n);
        for (int32_t j = 0; j < pr[i].n; j++)
            prompts[i][j] = (int32_t)(mix(r += 0x9E37) % 1000);
    }
    int32_t *next = calloc((size_t)o.max_batch, sizeof(int32_t));
    uint8_t *stop = calloc((size_t)o.max_batch, 1);
    int32_t done = 0;
    for (int32_t t = 0; done < nreq; t++) {
        assert_true(t < 100000); /* progress */
        for (int32_t i = 0; i < nreq; i++) {
            if (!pr[i].added && pr[i].arrive <= t) {
                assert_int_equal(fa_sched_add(s, prompts[i], pr[i].n, pr[i].max_new, &pr[i].id, err), FA_OK);
                pr[i].added = 1;
            }
            if (pr[i].added && !pr[i].cancelled && pr[i].cancel_at == t) {
                assert_int_equal(fa_sched_finish(s, pr[i].id, err), FA_OK);
                pr[i].cancelled = 1;
            }
        }
        fa_step st;
        assert_int_equal(fa_sched_step(s, &st, err), FA_OK);
        run_step(&w, s, &st, next);
        for (int32_t b = 0; b < st.batch; b++) {
            fa_request_info info;
            fa_sched_request(s, st.ids[b], &info, NULL);
            int32_t i = 0;
            while (pr[i].id != st.ids[b] || !pr[i].added)
                i++;
            stop[b] = st.sample[b] && pr[i].stop_at && info.generated + 1 == pr[i].stop_at;
        }
        if (st.batch)
            assert_int_equal(fa_sched_commit(s, next, stop, err), FA_OK);
        else /* nothing has arrived yet, or everything has finished */
            assert_int_equal(fa_sched_commit(s, next, stop, err), FA_ERR_INVALID_ARGUMENT);
        const fa_sched_stats ss = fa_sched_get_stats(s);
        assert_int_equal(ss.pages_free + ss.pages_used, o.num_pages);
        done = 0;
        for (int32_t i = 0; i < nreq; i++) {
            fa_request_info info;
            if (pr[i].added && fa_sched_request(s, pr[i].id, &info, NULL) == FA_OK &&
                info.state == FA_REQUEST_FINISHED)
                done++;
        }
    }
    /* every output is the hash chain of its own tokens */
    for (int32_t i = 0; i < nreq; i++) {
        fa_request_info info;
        assert_int_equal(fa_sched_request(s, pr[i].id, &info, err), FA_OK);
        assert_int_equal(info.pages, 0);
        if (!pr[i].cancelled)
            assert_int_equal(info.generated, pr[i].stop_at ? pr[i].stop_at : pr[i].max_new);
        assert_memory_equal(info.tokens, prompts[i], sizeof(int32_t) * (size_t)pr[i].n);
        for (int32_t g = 0; g < info.generated; g++)
            if (info.tokens[pr[i].n + g] != next_token(info.tokens, pr[i].n + g))
                fail_msg("seed %llu: request %d token %d is not its own context's", (unsigned long long)sd, i, g);
        assert_int_equal(fa_sched_release(s, pr[i].id, err), FA_OK);
    }
    const int64_t pre = fa_sched_get_stats(s).preemptions;
    for (int32_t i = 0; i < nreq; i++)
        free(prompts[i]);
    free(prompts), free(pr), free(next), free(stop), free(w.cache);
    fa_sched_free(s);
    return pre;
}

static void test_workloads(void **state)
{
    (void)state;
    int64_t pre = 0;
    for (int k = 0; k < 12; k++) {
        const uint64_t sd = seed + (uint64_t)k;
        fa_sched_options o = { .num_pages = 6 + (int32_t)(mix(sd) % 30), .page_size = 1 + (int32_t)(mix(sd + 1) % 16),
                               .token_budget = 1 + (int32_t)(mix(sd + 2) % 48), .max_context = 64,
                               .max_requests = 64 };
        o.max_batch = 1 + (int32_t)(mix(sd + 3) % (uint64_t)(o.token_budget < 8 ? o.token_budget : 8));
        if (o.num_pages * o.page_size < 4)
            o.num_pages = 4;
        pre += workload(sd, o, 30);
    }
    /* a tight cache: preemption must have happened */
    fa_sched_options tight = { .num_pages = 8, .page_size = 4, .max_batch = 6, .token_budget = 16,
                               .max_context = 32, .max_requests = 64 };
    const int64_t t = workload(seed ^ 0xabcdef, tight, 40);
    print_message("workloads: %lld preemptions (tight cache: %lld), seed %llu\n", (long long)(pre + t),
                  (long long)t, (unsigned long long)seed);
    assert_true(t > 0);
}

static void test_refusals(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN];
    fa_sched *s;
    fa_sched_options o = { .num_pages = 4, .page_size = 16, .max_batch = 4, .token_budget = 32,
                           .max_context = 128, .max_requests = 2 };
    fa_sched_options bad = o;
    bad.max_batch = 33;
    assert_int_equal(fa_sched_create(&bad, &s, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "max_batch (33)"));
    bad = o;
    bad.page_size = 0;
    assert_int_equal(fa_sched_create(&bad, &s, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "page_size"));
    assert_int_equal(fa_sched_create(NULL, &s, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_create(&o, NULL, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_create(&o, &s, err), FA_OK);
    int32_t toks[100] = { 1 };
    int64_t id;
    fa_step none;
    fa_request_info no;
    assert_int_equal(fa_sched_add(s, toks, 4, 4, NULL, err), FA_ERR_NULL_POINTER); /* nothing queued */
    assert_int_equal(fa_sched_get_stats(s).waiting, 0);
    assert_int_equal(fa_sched_add(NULL, toks, 4, 4, &id, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_step(s, NULL, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_step(NULL, &none, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_request(s, 0, NULL, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_request(NULL, 0, &no, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_commit(NULL, NULL, NULL, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_abort(NULL, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_finish(NULL, 0, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_release(NULL, 0, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_step_check_arrays(NULL, 8, err), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_sched_get_stats(NULL).waiting, 0);
    assert_int_equal(fa_sched_add(s, toks, 0, 4, &id, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "0 tokens"));
    assert_int_equal(fa_sched_add(s, toks, 100, 30, &id, err), FA_ERR_INVALID_VALUE); /* 129 held */
    assert_non_null(strstr(err, "context of 128"));
    assert_int_equal(fa_sched_add(s, toks, 60, 10, &id, err), FA_ERR_INVALID_VALUE); /* 5 pages */
    assert_non_null(strstr(err, "the cache has 4"));
    assert_int_equal(fa_sched_add(s, toks, 4, 0, &id, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "max_new"));
    int64_t a, b;
    assert_int_equal(fa_sched_add(s, toks, 10, 4, &a, err), FA_OK);
    assert_int_equal(fa_sched_add(s, toks, 10, 4, &b, err), FA_OK);
    assert_int_equal(fa_sched_add(s, toks, 10, 4, &id, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "max_requests"));
    assert_int_equal(fa_sched_commit(s, NULL, NULL, err), FA_ERR_INVALID_ARGUMENT);
    fa_step st;
    assert_int_equal(fa_sched_step(s, &st, err), FA_OK);
    assert_int_equal(st.batch, 2);
    assert_int_equal(fa_sched_step(s, &st, err), FA_ERR_INVALID_ARGUMENT); /* not committed */
    assert_non_null(strstr(err, "commit"));
    assert_int_equal(fa_sched_finish(s, a, err), FA_ERR_INVALID_ARGUMENT); /* in the pending step */
    /* a failed forward: the step is dropped and the same rows come again */
    const int64_t steps = fa_sched_get_stats(s).steps;
    assert_int_equal(fa_sched_abort(s, err), FA_OK);
    assert_int_equal(fa_sched_get_stats(s).steps, steps - 1); /* a step that did not run */
    assert_int_equal(fa_sched_abort(s, err), FA_ERR_INVALID_ARGUMENT);
    fa_request_info ai;
    assert_int_equal(fa_sched_request(s, a, &ai, err), FA_OK);
    assert_int_equal(ai.cached, 0);
    assert_int_equal(fa_sched_step(s, &st, err), FA_OK);
    assert_int_equal(st.batch, 2);
    assert_int_equal(st.total_q, 20);
    assert_int_equal(st.cache_seqlens[0], 0);
    assert_int_equal(fa_sched_commit(s, NULL, NULL, err), FA_ERR_NULL_POINTER);
    int32_t next[2] = { 5, 6 };
    assert_int_equal(fa_sched_commit(s, next, NULL, err), FA_OK);
    assert_int_equal(fa_sched_release(s, a, err), FA_ERR_INVALID_ARGUMENT); /* running */
    assert_int_equal(fa_sched_finish(s, a, err), FA_OK);
    fa_request_info info;
    assert_int_equal(fa_sched_request(s, a, &info, err), FA_OK);
    assert_int_equal(info.state, FA_REQUEST_FINISHED);
    assert_int_equal(info.generated, 1);
    assert_int_equal(fa_sched_get_stats(s).pages_used, 1); /* b's page only */
    assert_int_equal(fa_sched_release(s, a, err), FA_OK);
    assert_int_equal(fa_sched_request(s, a, &info, err), FA_ERR_INVALID_VALUE);
    fa_sched_free(s);
    /* the last sampled token needs no room: 1 + 4 tokens in one page of 4 */
    fa_sched_options one = { .num_pages = 1, .page_size = 4, .max_batch = 1, .token_budget = 1,
                             .max_context = 4, .max_requests = 1 };
    assert_int_equal(fa_sched_create(&one, &s, err), FA_OK);
    assert_int_equal(fa_sched_add(s, toks, 1, 4, &id, err), FA_OK);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(fa_sched_step(s, &st, err), FA_OK);
        assert_int_equal(st.batch, 1);
        int32_t nx = 7;
        assert_int_equal(fa_sched_commit(s, &nx, NULL, err), FA_OK);
    }
    assert_int_equal(fa_sched_request(s, id, &info, err), FA_OK);
    assert_int_equal(info.state, FA_REQUEST_FINISHED);
    assert_int_equal(info.generated, 4);
    fa_sched_free(s);
    one.page_size = 1, one.max_context = 1 << 30, one.max_batch = 1;
    one.token_budget = 1;
    assert_int_equal(fa_sched_create(&one, &s, err), FA_ERR_INVALID_VALUE); /* a 2^30-entry table */
    assert_non_null(strstr(err, "block table"));
}

/* Handles: held requests are found by id and released ones are not, over many times more
 * requests than slots (slots and table entries reused in random order); stats count the
 * finished ones. */
static void test_handles(void **state)
{
    (void)state;
    enum { SLOTS = 37, OPS = 20000 };
    char err[256];
    fa_sched *s;
    const fa_sched_options o = { .num_pages = 4 * SLOTS, .page_size = 4, .max_batch = 8, .token_budget = 64,
                                 .max_context = 16, .max_requests = SLOTS };
    assert_int_equal(fa_sched_create(&o, &s, err), FA_OK);
    int64_t held[SLOTS], gone = -1;
    int done[SLOTS];
    int32_t n = 0, finished = 0, toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    uint64_t r = seed ^ 0x5EED;
    for (int op = 0; op < OPS; op++) {
        r = mix(r + (uint64_t)op);
        fa_request_info info;
        if (n < SLOTS && (n == 0 || r % 3)) {
            const int32_t len = 1 + (int32_t)((r >> 8) % 8);
            if (fa_sched_add(s, toks, len, 2, &held[n], err) != FA_OK)
                fail_msg("add at op %d, %d held: %s", op, (int)n, err);
            done[n] = 0;
            assert_int_equal(fa_sched_request(s, held[n], &info, err), FA_OK);
            assert_int_equal(info.prompt_len, len);
            n++;
        } else { /* finish and release a random held one */
            const int32_t i = (int32_t)((r >> 16) % (uint64_t)n);
            assert_int_equal(fa_sched_finish(s, held[i], err), FA_OK); /* again: no change */
            finished += !done[i];
            done[i] = 1;
            assert_int_equal(fa_sched_get_stats(s).finished, finished);
            if ((r >> 40) % 4) {
                assert_int_equal(fa_sched_release(s, held[i], err), FA_OK);
                finished--;
                gone = held[i];
                n--;
                held[i] = held[n], done[i] = done[n];
                assert_int_equal(fa_sched_request(s, gone, &info, err), FA_ERR_INVALID_VALUE);
            }
        }
        for (int32_t i = 0; op % 97 == 0 && i < n; i++)
            assert_int_equal(fa_sched_request(s, held[i], &info, err), FA_OK);
    }
    const fa_sched_stats st = fa_sched_get_stats(s);
    assert_int_equal(st.waiting + st.finished, n);
    fa_sched_free(s);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("sched: seed %llu (replay: FLASHATTN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_workloads), cmocka_unit_test(test_refusals),
                                        cmocka_unit_test(test_handles) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
