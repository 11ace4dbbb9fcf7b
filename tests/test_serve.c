/* SPDX-License-Identifier: MIT */
/*
 * Continuous batching end to end on the CPU: stories260K serving several requests at once
 * through the scheduler (src/model/scheduler.c) and fa_model_forward_step (one paged call a
 * layer: append + RoPE + attention), requests arriving at different steps, prompts longer
 * than the token budget (chunked prefill) and a cache small enough to force preemptions.
 * Each request's greedy ids must equal the single-sequence runner's (dense cache, one
 * fa_forward a layer), and its logits agree within float32 rounding at every step.
 * A synthetic GQA model (kv heads < heads) runs the same comparison.
 */
#include "scheduler.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

enum { NREQ = 6, MAX_NEW = 40, MAX_PROMPT = 96 };

static const char *prompts[NREQ] = {
    "Once upon a time",
    "Lily and Tom went to the park. They saw a big dog",
    "The little bird",
    "One day, a girl named Sue found a shiny red ball under the old tree near her house. She "
    "picked it up and ran to show her mom",
    "Ben liked to play",
    "There was a cat",
};

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

typedef struct ref_t {
    int32_t ids[MAX_NEW];
    float *logits; /* [MAX_NEW, vocab] */
} ref_t;

/* The single-sequence runner's greedy continuation of tokens[0..n). */
static void reference(const fa_model *m, fa_context_t ctx, const int32_t *tokens, int32_t n, ref_t *r)
{
    char err[FA_MODEL_ERR_LEN];
    fa_model_state *s;
    assert_int_equal(fa_model_state_create(m, ctx, NULL, &s, err), FA_OK);
    const int32_t V = m->config.vocab_size;
    r->logits = malloc(sizeof(float) * (size_t)MAX_NEW * (size_t)V);
    float *lg;
    assert_int_equal(fa_model_forward(m, s, tokens, n, 0, &lg, err), FA_OK);
    for (int32_t g = 0; g < MAX_NEW; g++) {
        memcpy(r->logits + (size_t)g * V, lg, sizeof(float) * (size_t)V);
        r->ids[g] = argmax(lg, V);
        if (g + 1 < MAX_NEW)
            assert_int_equal(fa_model_forward(m, s, &r->ids[g], 1, n + g, &lg, err), FA_OK);
    }
    fa_model_state_free(s);
}

/* Serve the prompts (tokens[i][0..n[i])) with o; compare with the references. Returns the
 * preemptions. */
static int64_t serve(const fa_model *m, fa_context_t ctx, int32_t (*tokens)[MAX_PROMPT], const int32_t *n,
                     const ref_t *refs, fa_sched_options o)
{
    char err[FA_MODEL_ERR_LEN];
    const int32_t V = m->config.vocab_size;
    fa_sched *sc;
    fa_model_kv *kv;
    fa_model_state *s;
    fa_model_state_options so = { .max_tokens = o.token_budget, .paged = 1 };
    assert_int_equal(fa_sched_create(&o, &sc, err), FA_OK);
    assert_int_equal(fa_model_kv_create(m, o.num_pages, o.page_size, &kv, err), FA_OK);
    assert_int_equal(fa_model_state_create(m, ctx, &so, &s, err), FA_OK);
    float *logits = malloc(sizeof(float) * (size_t)o.max_batch * (size_t)V);
    int32_t *next = malloc(sizeof(int32_t) * (size_t)o.max_batch);
    int64_t ids[NREQ];
    double worst = 0.0;
    int added = 0, finished = 0;
    for (int32_t t = 0; finished < NREQ; t++) {
        assert_true(t < 10000);
        while (added < NREQ && added <= t / 3) { /* a request joins every third step */
            assert_int_equal(fa_sched_add(sc, tokens[added], n[added], MAX_NEW, &ids[added], err), FA_OK);
            added++;
        }
        fa_step st;
        assert_int_equal(fa_sched_step(sc, &st, err), FA_OK);
        if (st.batch == 0)
            continue;
        if (fa_model_forward_step(m, s, kv, &st, logits, err) != FA_OK)
            fail_msg("step %d: %s", t, err);
        for (int32_t b = 0; b < st.batch; b++) {
            if (!st.sample[b])
                continue;
            int32_t r = 0;
            while (ids[r] != st.ids[b])
                r++;
            fa_request_info info;
            assert_int_equal(fa_sched_request(sc, st.ids[b], &info, err), FA_OK);
            const float *want = refs[r].logits + (size_t)info.generated * V, *got = logits + (size_t)b * V;
            for (int32_t i = 0; i < V; i++) {
                const double e = fabs((double)got[i] - want[i]) / fmax(1.0, fabs((double)want[i]));
                worst = e > worst ? e : worst;
            }
            next[b] = argmax(got, V);
        }
        assert_int_equal(fa_sched_commit(sc, next, NULL, err), FA_OK);
        finished = 0;
        for (int r = 0; r < added; r++) {
            fa_request_info info;
            assert_int_equal(fa_sched_request(sc, ids[r], &info, err), FA_OK);
            finished += info.state == FA_REQUEST_FINISHED;
        }
    }
    for (int r = 0; r < NREQ; r++) {
        fa_request_info info;
        assert_int_equal(fa_sched_request(sc, ids[r], &info, err), FA_OK);
        assert_int_equal(info.generated, MAX_NEW);
        for (int32_t g = 0; g < MAX_NEW; g++)
            if (info.tokens[n[r] + g] != refs[r].ids[g])
                fail_msg("request %d token %d: %d, the single-sequence runner %d (pages %d, budget %d)", r, g,
                         info.tokens[n[r] + g], refs[r].ids[g], (int)o.num_pages, (int)o.token_budget);
    }
    const int64_t pre = fa_sched_get_stats(sc).preemptions;
    print_message("served %d requests: %lld preemptions, worst logit difference %.2e (pages %d, budget %d, "
                  "batch %d)\n",
                  NREQ, (long long)pre, worst, (int)o.num_pages, (int)o.token_budget, (int)o.max_batch);
    assert_true(worst < 1e-4);
    free(logits), free(next);
    fa_model_state_free(s);
    fa_model_kv_free(kv);
    fa_sched_free(sc);
    return pre;
}

static void run_model(const fa_model *m, const fa_tokenizer *tok)
{
    char err[FA_MODEL_ERR_LEN];
    fa_context_t ctx;
    fa_context_options co = { sizeof(co), FA_BACKEND_CPU, 0 };
    assert_int_equal(fa_context_create(&co, &ctx), FA_OK);
    static int32_t tokens[NREQ][MAX_PROMPT];
    int32_t n[NREQ];
    ref_t refs[NREQ];
    for (int r = 0; r < NREQ; r++) {
        if (tok) { /* encode wants strlen + 3 entries of room */
            int32_t buf[512];
            assert_int_equal(fa_tokenizer_encode(tok, prompts[r], 1, 0, buf, 512, &n[r], err), FA_OK);
            assert_true(n[r] <= MAX_PROMPT);
            memcpy(tokens[r], buf, sizeof(int32_t) * (size_t)n[r]);
        } else { /* synthetic model: seeded ids */
            n[r] = 3 + 9 * r;
            for (int32_t i = 0; i < n[r]; i++)
                tokens[r][i] = (int32_t)((7919u * (unsigned)(r * 131 + i) + 17u) % (unsigned)m->config.vocab_size);
        }
        reference(m, ctx, tokens[r], n[r], &refs[r]);
    }
    /* roomy: every request at once; tight: chunked prompts and preemptions */
    fa_sched_options roomy = { .num_pages = 64, .page_size = 16, .max_batch = 6, .token_budget = 64,
                               .max_context = m->config.seq_len, .max_requests = NREQ };
    fa_sched_options tight = { .num_pages = 9, .page_size = 16, .max_batch = 4, .token_budget = 8,
                               .max_context = m->config.seq_len, .max_requests = NREQ };
    fa_sched_options odd = { .num_pages = 40, .page_size = 5, .max_batch = 3, .token_budget = 11,
                             .max_context = m->config.seq_len, .max_requests = NREQ };
    serve(m, ctx, tokens, n, refs, roomy);
    assert_true(serve(m, ctx, tokens, n, refs, tight) > 0);
    serve(m, ctx, tokens, n, refs, odd);
    for (int r = 0; r < NREQ; r++)
        free(refs[r].logits);
    fa_context_destroy(ctx);
}

static void test_stories(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN];
    fa_model *m;
    fa_tokenizer *t;
    assert_int_equal(fa_model_open(FA_MODELS_DIR "/stories260K.bin", &m, err), FA_OK);
    assert_int_equal(fa_tokenizer_open(FA_MODELS_DIR "/tok512.bin", m->config.vocab_size, &t, err), FA_OK);
    run_model(m, t);
    fa_tokenizer_free(t);
    fa_model_free(m);
}

static void test_synthetic_gqa(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN];
    fa_model_config c;
    fa_model *m;
    assert_int_equal(fa_model_config_parse("64x2x8x2x128x300x256", &c, err), FA_OK);
    assert_int_equal(fa_model_synth(&c, 99, &m, err), FA_OK);
    run_model(m, NULL);
    fa_model_free(m);
}

static void test_refusals(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN];
    fa_model *m;
    assert_int_equal(fa_model_open(FA_MODELS_DIR "/stories260K.bin", &m, err), FA_OK);
    fa_context_t ctx;
    fa_context_options co = { sizeof(co), FA_BACKEND_CPU, 0 };
    assert_int_equal(fa_context_create(&co, &ctx), FA_OK);
    fa_model_kv *kv;
    assert_int_equal(fa_model_kv_create(m, 0, 16, &kv, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "num_pages"));
    fa_model_state *s;
    fa_model_state_options so = { .max_tokens = 4, .paged = 1 };
    assert_int_equal(fa_model_state_create(m, ctx, &so, &s, err), FA_OK);
    int32_t tok = 1;
    assert_int_equal(fa_model_forward(m, s, &tok, 1, 0, NULL, err), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "paged"));
    /* hand-made steps: each bad field named, nothing read past the step */
    assert_int_equal(fa_model_kv_create(m, 4, 16, &kv, err), FA_OK);
    int64_t ids[2] = { 0, 1 };
    int32_t cu[3] = { 0, 0, 1 }, lens[2] = { 0, 0 }, bt[2] = { 0, 1 }, toks[1] = { 1 }, pos[1] = { 0 };
    uint8_t smp[2] = { 1, 1 };
    fa_step st = { .batch = 2, .total_q = 1, .max_seqlen_q = 1, .max_seqlen_k = 1, .max_pages_per_seq = 1,
                   .page_size = 16, .ids = ids, .cu_seqlens_q = cu, .cache_seqlens = lens, .block_table = bt,
                   .tokens = toks, .positions = pos, .sample = smp };
    float *logits = calloc(2 * (size_t)m->config.vocab_size, sizeof(float));
    assert_int_equal(fa_model_forward_step(m, s, kv, &st, logits, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "step.sample[0]"));
    smp[0] = 0;
    assert_int_equal(fa_model_forward_step(m, s, kv, &st, logits, err), FA_OK);
    st.tokens = NULL;
    assert_int_equal(fa_model_forward_step(m, s, kv, &st, logits, err), FA_ERR_NULL_POINTER);
    assert_non_null(strstr(err, "step.tokens"));
    st.tokens = toks;
    st.max_pages_per_seq = INT32_MAX; /* rows 2^31 - 1 entries apart: refused before the table is read */
    assert_int_equal(fa_model_forward_step(m, s, kv, &st, logits, err), FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(err, "max_pages_per_seq"));
    st.max_pages_per_seq = 1;
    /* a table wider than the plan's (made at the first step): planned again, not refused */
    int32_t cu1[2] = { 0, 1 }, lens20[1] = { 20 }, bt23[2] = { 2, 3 }, pos20[1] = { 20 };
    uint8_t smp1[1] = { 1 };
    const fa_step wide = { .batch = 1, .total_q = 1, .max_seqlen_q = 1, .max_seqlen_k = 21, .max_pages_per_seq = 2,
                           .page_size = 16, .ids = ids, .cu_seqlens_q = cu1, .cache_seqlens = lens20,
                           .block_table = bt23, .tokens = toks, .positions = pos20, .sample = smp1 };
    if (fa_model_forward_step(m, s, kv, &wide, logits, err) != FA_OK)
        fail_msg("a wider table: %s", err);
    st.page_size = 8;
    assert_int_equal(fa_model_forward_step(m, s, kv, &st, logits, err), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "page_size"));
    st.page_size = 16;
    st.batch = 0;
    assert_int_equal(fa_model_forward_step(m, s, kv, &st, logits, err), FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(err, "step.batch"));
    free(logits);
    fa_model_kv_free(kv);
    fa_model_state_free(s);
    fa_context_destroy(ctx);
    fa_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_stories), cmocka_unit_test(test_synthetic_gqa),
                                        cmocka_unit_test(test_refusals) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
