/* SPDX-License-Identifier: MIT */
/*
 * The runner's engine (src/model/engine.c): stories260K served through the scheduler and
 * fa_engine_step.
 * - cpu: each request's greedy ids equal the single-sequence runner's; sampled requests draw
 *   the same tokens alone and in a batch (the uniform depends on seed and position only).
 * - cuda (where a device answers; skipped otherwise): bf16 greedy ids equal the float32 CPU
 *   engine's up to the first divergence, which is printed, and the logits before it agree
 *   within bf16's tolerance; decode steps replayed from CUDA graphs give the ids and logits of
 *   direct launches bit for bit.
 * - a synthetic GQA model (8 query heads over 2 kv heads): one prefill step, chunked prefill
 *   and token-by-token feeding agree, and requests alone match the batch (ids equal; logits
 *   bit for bit on CUDA, within float32 rounding on the CPU, whose BLAS rounds one row and
 *   several differently).
 * - the sampling formula: argmax at temperature 0, the nucleus's frequencies over a grid of
 *   uniforms, refusals of bad options and steps with the field named.
 */
#include "engine.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

enum { NREQ = 4, MAX_NEW = 48, MAX_PROMPT = 64, MAX_STEPS = 4000 };

static const char *prompts[NREQ] = { "Once upon a time", "Lily and Tom went to the park", "The little bird",
                                     "Ben liked to play" };

typedef struct run_t {
    int32_t ids[NREQ][MAX_NEW];
    float *logits; /* [NREQ, MAX_NEW, vocab] */
} run_t;

static fa_model *model;
static int32_t tokens[NREQ][MAX_PROMPT], n_tok[NREQ];

static int setup(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN];
    fa_tokenizer *t;
    if (fa_model_open(FA_MODELS_DIR "/stories260K.bin", &model, err) != FA_OK ||
        fa_tokenizer_open(FA_MODELS_DIR "/tok512.bin", model->config.vocab_size, &t, err) != FA_OK) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    for (int r = 0; r < NREQ; r++) {
        int32_t buf[512];
        if (fa_tokenizer_encode(t, prompts[r], 1, 0, buf, 512, &n_tok[r], err) != FA_OK || n_tok[r] > MAX_PROMPT)
            return -1;
        memcpy(tokens[r], buf, sizeof(int32_t) * (size_t)n_tok[r]);
    }
    fa_tokenizer_free(t);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fa_model_free(model);
    return 0;
}

/* Serve requests `which` (a bit set of prompts) on an engine of eo; params per request (NULL:
 * greedy), max_new tokens each (NULL: MAX_NEW). Fills out's rows of those requests and, where
 * report is not NULL, *report with the engine's at the end. */
static void serve_with(const fa_engine_options *eo, unsigned which, const fa_sample_params *params,
                       const int32_t *max_new, run_t *out, fa_engine_info *report)
{
    char err[FA_MODEL_ERR_LEN];
    const int32_t V = model->config.vocab_size;
    fa_engine *e;
    if (fa_engine_create(model, eo, &e, err) != FA_OK)
        fail_msg("engine: %s", err);
    const fa_sched_options so = { eo->num_pages, eo->page_size, eo->max_batch, eo->token_budget,
                                  model->config.seq_len, NREQ };
    fa_sched *sc;
    assert_int_equal(fa_sched_create(&so, &sc, err), FA_OK);
    int64_t ids[NREQ];
    int req_of[NREQ], n = 0;
    for (int r = 0; r < NREQ; r++)
        if (which & (1u << r)) {
            assert_int_equal(fa_sched_add(sc, tokens[r], n_tok[r], max_new ? max_new[r] : MAX_NEW, &ids[n], err),
                             FA_OK);
            req_of[n++] = r;
        }
    float *logits = malloc(sizeof(float) * NREQ * (size_t)V);
    int32_t next[NREQ];
    fa_sample_params p[NREQ];
    for (int steps = 0;; steps++) {
        assert_true(steps < MAX_STEPS);
        fa_step st;
        assert_int_equal(fa_sched_step(sc, &st, err), FA_OK);
        if (st.batch == 0)
            break;
        for (int32_t i = 0; i < st.batch; i++)
            p[i] = params ? params[req_of[st.ids[i]]] : (fa_sample_params){ 0.0f, 0.0f, 0 };
        if (fa_engine_step(e, &st, p, next, logits, err) != FA_OK)
            fail_msg("step %d: %s", steps, err);
        for (int32_t i = 0; i < st.batch; i++) {
            if (!st.sample[i])
                continue;
            fa_request_info info;
            assert_int_equal(fa_sched_request(sc, st.ids[i], &info, err), FA_OK);
            const int r = req_of[st.ids[i]];
            out->ids[r][info.generated] = next[i];
            memcpy(out->logits + ((size_t)r * MAX_NEW + (size_t)info.generated) * V, logits + (size_t)i * V,
                   sizeof(float) * (size_t)V);
        }
        assert_int_equal(fa_sched_commit(sc, next, NULL, err), FA_OK);
    }
    if (report)
        *report = fa_engine_get_info(e);
    free(logits);
    fa_sched_free(sc);
    fa_engine_free(e);
}

static void serve(fa_backend b, unsigned which, const fa_sample_params *params, run_t *out)
{
    const fa_engine_options eo = { b, 48, 16, NREQ, 32, 0, 0, 0 };
    serve_with(&eo, which, params, NULL, out, NULL);
}

static run_t *new_run(void)
{
    run_t *r = calloc(1, sizeof(run_t));
    r->logits = calloc((size_t)NREQ * MAX_NEW * (size_t)model->config.vocab_size, sizeof(float));
    return r;
}

static void free_run(run_t *r)
{
    free(r->logits);
    free(r);
}

static void test_cpu_greedy(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN];
    run_t *got = new_run();
    serve(FA_BACKEND_CPU, (1u << NREQ) - 1, NULL, got);
    fa_context_t ctx;
    const fa_context_options co = { sizeof(co), FA_BACKEND_CPU, 0 };
    assert_int_equal(fa_context_create(&co, &ctx), FA_OK);
    const int32_t V = model->config.vocab_size;
    for (int r = 0; r < NREQ; r++) { /* the single-sequence runner, argmax */
        fa_model_state *s;
        assert_int_equal(fa_model_state_create(model, ctx, NULL, &s, err), FA_OK);
        float *lg;
        assert_int_equal(fa_model_forward(model, s, tokens[r], n_tok[r], 0, &lg, err), FA_OK);
        for (int g = 0; g < MAX_NEW; g++) {
            int32_t best = 0;
            for (int32_t i = 1; i < V; i++)
                best = lg[i] > lg[best] ? i : best;
            if (got->ids[r][g] != best)
                fail_msg("request %d token %d: engine %d, runner %d", r, g, got->ids[r][g], best);
            assert_int_equal(fa_model_forward(model, s, &best, 1, n_tok[r] + g, &lg, err), FA_OK);
        }
        fa_model_state_free(s);
    }
    fa_context_destroy(ctx);
    free_run(got);
}

static void test_cpu_sampling_batch_invariant(void **state)
{
    (void)state;
    const fa_sample_params p[NREQ] = { { 0.8f, 0.9f, 11 }, { 1.0f, 0.0f, 12 }, { 0.5f, 0.5f, 13 }, { 1.2f, 0.95f, 14 } };
    run_t *all = new_run(), *one = new_run();
    serve(FA_BACKEND_CPU, (1u << NREQ) - 1, p, all);
    int differs_from_greedy = 0;
    for (int r = 0; r < NREQ; r++) {
        serve(FA_BACKEND_CPU, 1u << r, p, one);
        for (int g = 0; g < MAX_NEW; g++) {
            if (all->ids[r][g] != one->ids[r][g])
                fail_msg("request %d token %d: %d in a batch, %d alone", r, g, all->ids[r][g], one->ids[r][g]);
            const float *l = all->logits + ((size_t)r * MAX_NEW + g) * (size_t)model->config.vocab_size;
            int32_t best = 0;
            for (int32_t i = 1; i < model->config.vocab_size; i++)
                best = l[i] > l[best] ? i : best;
            differs_from_greedy += best != all->ids[r][g];
        }
    }
    print_message("sampled %d tokens, %d of them not the argmax\n", NREQ * MAX_NEW, differs_from_greedy);
    assert_true(differs_from_greedy > 0); /* the temperatures do something */
    free_run(all), free_run(one);
}

/* Skips the test where no CUDA engine can be made (no device, or a build without CUDA). */
static void cuda_or_skip(void)
{
    char err[FA_MODEL_ERR_LEN];
    const fa_engine_options eo = { FA_BACKEND_CUDA, 48, 16, NREQ, 32, 0, 0, 0 };
    fa_engine *e;
    if (fa_engine_create(model, &eo, &e, err) != FA_OK) {
        print_message("skipped: %s\n", err);
        skip();
    }
    print_message("cuda engine on %s\n", fa_engine_get_info(e).device);
    fa_engine_free(e);
}

static void test_cuda_against_cpu(void **state)
{
    (void)state;
    cuda_or_skip();
    run_t *cpu = new_run(), *gpu = new_run();
    serve(FA_BACKEND_CPU, (1u << NREQ) - 1, NULL, cpu);
    serve(FA_BACKEND_CUDA, (1u << NREQ) - 1, NULL, gpu);
    const int32_t V = model->config.vocab_size;
    for (int r = 0; r < NREQ; r++) {
        int g = 0;
        double worst = 0.0;
        for (; g < MAX_NEW; g++) {
            const float *a = cpu->logits + ((size_t)r * MAX_NEW + g) * V, *b = gpu->logits + ((size_t)r * MAX_NEW + g) * V;
            double scale = 0.0;
            for (int32_t i = 0; i < V; i++)
                scale = fmax(scale, fabs((double)a[i]));
            for (int32_t i = 0; i < V; i++)
                worst = fmax(worst, fabs((double)a[i] - b[i]) / fmax(scale, 1.0));
            if (cpu->ids[r][g] != gpu->ids[r][g])
                break;
        }
        print_message("request %d: cuda greedy ids equal the cpu's for %d of %d tokens; worst logit difference "
                      "up to there %.3e of the row's largest\n",
                      r, g, MAX_NEW, worst);
        /* bf16 weights and activations: about 2^-8 relative each, a few layers deep */
        assert_true(worst < 0.05);
        assert_true(g >= 8);
    }
    free_run(cpu), free_run(gpu);
}

/* Graph replays against direct launches, bit for bit: requests that finish at different steps
 * (decode batches 4, 3 padded to 4, 2, 1), greedy and sampled, and with max_batch 3 a request
 * that waits and joins with a prefill step between graph replays. */
static void test_cuda_graphs_bit_identical(void **state)
{
    (void)state;
    cuda_or_skip();
    fa_engine_options eo = { FA_BACKEND_CUDA, 48, 16, NREQ, 32, 0, 0, 0 };
    const int32_t max_new[NREQ] = { MAX_NEW, MAX_NEW - 8, MAX_NEW - 19, MAX_NEW - 31 };
    const fa_sample_params p[NREQ] = { { 0.0f, 0.0f, 0 }, { 0.8f, 0.9f, 21 }, { 0.0f, 0.0f, 0 }, { 1.0f, 0.0f, 23 } };
    const size_t bytes = sizeof(float) * NREQ * MAX_NEW * (size_t)model->config.vocab_size;
    for (int32_t max_batch = NREQ; max_batch >= NREQ - 1; max_batch--) {
        run_t *with = new_run(), *without = new_run();
        fa_engine_info on, off;
        eo.max_batch = max_batch;
        eo.no_graphs = 0;
        serve_with(&eo, (1u << NREQ) - 1, p, max_new, with, &on);
        eo.no_graphs = 1;
        serve_with(&eo, (1u << NREQ) - 1, p, max_new, without, &off);
        print_message("max_batch %d: %d decode batches captured, %lld steps replayed\n", (int)max_batch,
                      (int)on.graphs_captured, (long long)on.graph_replays);
        assert_int_equal(on.graphs, 1);
        assert_true(on.graphs_captured >= 2 && on.graph_replays > 0);
        assert_int_equal(off.graphs, 0);
        assert_int_equal(off.graphs_captured, 0);
        assert_int_equal(off.graph_replays, 0);
        for (int r = 0; r < NREQ; r++)
            for (int g = 0; g < MAX_NEW; g++)
                if (with->ids[r][g] != without->ids[r][g])
                    fail_msg("max_batch %d request %d token %d: %d replayed, %d launched", (int)max_batch, r, g,
                             with->ids[r][g], without->ids[r][g]);
        assert_memory_equal(with->logits, without->logits, bytes);
        free_run(with), free_run(without);
    }
}

/* The first token at which runs a and b of request r pick different ids (MAX_NEW: none), and
 * the largest logit difference before it relative to the row's largest magnitude. */
static int agree(const run_t *a, const run_t *b, int r, int32_t V, double *worst)
{
    int g = 0;
    *worst = 0.0;
    for (; g < MAX_NEW; g++) {
        const float *x = a->logits + ((size_t)r * MAX_NEW + g) * V, *y = b->logits + ((size_t)r * MAX_NEW + g) * V;
        double scale = 1.0;
        for (int32_t i = 0; i < V; i++)
            scale = fmax(scale, fabs((double)x[i]));
        for (int32_t i = 0; i < V; i++)
            *worst = fmax(*worst, fabs((double)x[i] - y[i]) / scale);
        if (a->ids[r][g] != b->ids[r][g])
            break;
    }
    return g;
}

/*
 * A synthetic GQA model (8 query heads over 2 kv heads, head_dim 32, two layers) with seeded
 * random prompts of 40, 23, 57 and 9 tokens on `backend`: the prompts fed in one prefill
 * step, in chunks of a 16-token budget and one token a step (the decode path) give the same
 * greedy ids up to a divergence, and logits before it within tol of the row's largest; each
 * request served alone gives the batch's ids, and its logits bit for bit where bitwise (else
 * within tol).
 */
static void gqa_paths(fa_backend backend, double tol, int bitwise)
{
    char err[FA_MODEL_ERR_LEN];
    fa_model_config c;
    fa_model *gqa;
    assert_int_equal(fa_model_config_parse("256x2x8x2x512x512x256", &c, err), FA_OK);
    assert_int_equal(fa_model_synth(&c, 20261203, &gqa, err), FA_OK);
    fa_model *const stories = model;
    int32_t keep_tok[NREQ][MAX_PROMPT], keep_n[NREQ];
    memcpy(keep_tok, tokens, sizeof(tokens));
    memcpy(keep_n, n_tok, sizeof(n_tok));
    model = gqa;
    const int32_t lens[NREQ] = { 40, 23, 57, 9 };
    uint64_t x = 20261203;
    for (int r = 0; r < NREQ; r++) {
        n_tok[r] = lens[r];
        for (int32_t i = 0; i < lens[r]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            tokens[r][i] = (int32_t)((x >> 33) % (uint64_t)c.vocab_size);
        }
    }
    const unsigned all = (1u << NREQ) - 1;
    fa_engine_options one = { backend, 48, 16, NREQ, 256, 0, 0, 0 }, chunked = one, by_token = one;
    chunked.token_budget = 16;
    by_token.max_batch = 1, by_token.token_budget = 1;
    run_t *a = new_run(), *b = new_run(), *t = new_run(), *alone = new_run();
    serve_with(&one, all, NULL, NULL, a, NULL);
    serve_with(&chunked, all, NULL, NULL, b, NULL);
    serve_with(&by_token, all, NULL, NULL, t, NULL);
    const int32_t V = c.vocab_size;
    for (int r = 0; r < NREQ; r++) {
        double w1, w2;
        const int g1 = agree(a, b, r, V, &w1), g2 = agree(a, t, r, V, &w2);
        print_message("%s request %d (%d prompt tokens): chunked %d/%d ids (worst %.2e), token by token %d/%d "
                      "(worst %.2e)\n",
                      backend == FA_BACKEND_CUDA ? "cuda" : "cpu", r, (int)lens[r], g1, MAX_NEW, w1, g2, MAX_NEW, w2);
        assert_true(w1 < tol && w2 < tol);
        assert_true(g1 >= 8 && g2 >= 8);
        serve_with(&one, 1u << r, NULL, NULL, alone, NULL);
        const size_t row = (size_t)MAX_NEW * (size_t)V;
        assert_memory_equal(alone->ids[r], a->ids[r], sizeof(a->ids[r]));
        if (bitwise) {
            assert_memory_equal(alone->logits + r * row, a->logits + r * row, sizeof(float) * row);
        } else {
            double w;
            assert_int_equal(agree(alone, a, r, V, &w), MAX_NEW);
            assert_true(w < tol);
        }
    }
    free_run(a), free_run(b), free_run(t), free_run(alone);
    model = stories;
    memcpy(tokens, keep_tok, sizeof(tokens));
    memcpy(n_tok, keep_n, sizeof(n_tok));
    fa_model_free(gqa);
}

static void test_cpu_gqa_paths(void **state)
{
    (void)state;
    /* float32 throughout: different summation orders only. Not bitwise alone and batched:
     * OpenBLAS's products for one row and for several round differently. */
    gqa_paths(FA_BACKEND_CPU, 1e-4, 0);
}

static void test_cuda_gqa_paths(void **state)
{
    (void)state;
    cuda_or_skip();
    gqa_paths(FA_BACKEND_CUDA, 0.05, 1); /* bf16 weights, activations and pages */
}

static void test_sample_formula(void **state)
{
    (void)state;
    const float logits[5] = { 1.0f, 3.0f, 2.0f, 3.0f, -1.0f };
    float scratch[10];
    const fa_sample_params greedy = { 0.0f, 0.0f, 0 };
    assert_int_equal(fa_sample_logits(logits, 5, &greedy, 0.7f, scratch), 1); /* the first maximum */
    const fa_sample_params tiny = { 1.0f, 0.01f, 0 };
    for (int k = 0; k < 100; k++) { /* the nucleus of 1% is the two tied maxima */
        const int32_t t = fa_sample_logits(logits, 5, &tiny, (float)k / 100.0f, scratch);
        assert_true(t == 1 || t == 3);
    }
    /* the whole distribution: frequencies over a grid of uniforms are the probabilities */
    const fa_sample_params all = { 1.0f, 1.0f, 0 };
    int hits[5] = { 0 };
    const int N = 100000;
    for (int k = 0; k < N; k++)
        hits[fa_sample_logits(logits, 5, &all, ((float)k + 0.5f) / (float)N, scratch)]++;
    double z = 0.0;
    for (int i = 0; i < 5; i++)
        z += exp(logits[i] - 3.0);
    for (int i = 0; i < 5; i++)
        assert_true(fabs((double)hits[i] / N - exp(logits[i] - 3.0) / z) < 1e-3);
    /* uniforms: in [0, 1), spread */
    double mean = 0.0;
    for (int pos = 0; pos < 10000; pos++) {
        const float u = fa_sample_uniform(42, pos);
        assert_true(u >= 0.0f && u < 1.0f);
        mean += u;
    }
    assert_true(fabs(mean / 10000.0 - 0.5) < 0.02);
    assert_true(fa_sample_uniform(1, 5) != fa_sample_uniform(2, 5));
    /* NaN or +inf anywhere in a row, at any temperature: -1 (-inf is a token never drawn) */
    for (int k = 0; k < 4; k++) {
        float bad[5] = { 1.0f, 3.0f, 2.0f, 3.0f, -INFINITY };
        bad[k] = k % 2 ? INFINITY : NAN;
        assert_int_equal(fa_sample_logits(bad, 5, &greedy, 0.5f, scratch), -1);
        assert_int_equal(fa_sample_logits(bad, 5, &all, 0.5f, scratch), -1);
    }
    const float minus_inf[5] = { 1.0f, 3.0f, 2.0f, 3.0f, -INFINITY };
    assert_int_equal(fa_sample_logits(minus_inf, 5, &greedy, 0.5f, scratch), 1);
}

/* A model whose final norm holds a NaN: the step fails naming the sequence and its position,
 * next and logits untouched, on each backend. */
static void nan_logits(fa_backend b)
{
    char err[FA_MODEL_ERR_LEN];
    fa_model *m;
    const fa_model_config c = { 64, 96, 2, 8, 4, 512, 64, 0, 0.0f, 0.0f, { 0 }, 0, 0, { 0 } };
    assert_int_equal(fa_model_synth(&c, 11, &m, err), FA_OK);
    ((float *)m->w.rms_final)[3] = NAN;
    const fa_engine_options eo = { b, 8, 16, 2, 16, 0, 0, 0 };
    fa_engine *e;
    assert_int_equal(fa_engine_create(m, &eo, &e, err), FA_OK);
    int32_t cu[3] = { 0, 3, 4 }, len[2] = { 0, 0 }, bt[2] = { 0, 1 }, tok[4] = { 1, 7, 9, 5 };
    int32_t pos[4] = { 0, 1, 2, 0 }, next[2] = { -7, -7 };
    uint8_t smp[2] = { 0, 1 }; /* the first sequence's prompt goes on; the second is sampled */
    int64_t id[2] = { 0, 1 };
    fa_step st = { 2, 4, 3, 3, 1, 16, id, cu, len, bt, tok, pos, smp, 0 };
    float *lg = malloc(sizeof(float) * 2 * 512);
    assert_non_null(lg);
    for (int i = 0; i < 2 * 512; i++)
        lg[i] = 7.0f;
    assert_int_equal(fa_engine_step(e, &st, NULL, next, lg, err), FA_ERR_INVALID_VALUE);
    if (!strstr(err, "sequence 1") || !strstr(err, "position 0") || !strstr(err, "NaN"))
        fail_msg("message '%s'", err);
    assert_int_equal(next[0], -7);
    assert_int_equal(next[1], -7);
    for (int i = 0; i < 2 * 512; i++)
        assert_true(lg[i] == 7.0f);
    free(lg);
    fa_engine_free(e);
    fa_model_free(m);
}

static void test_cpu_nan_logits(void **state)
{
    (void)state;
    nan_logits(FA_BACKEND_CPU);
}

static void test_cuda_nan_logits(void **state)
{
    (void)state;
    cuda_or_skip();
    nan_logits(FA_BACKEND_CUDA);
}

static void test_refusals(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN];
    fa_engine *e;
    fa_engine_options eo = { FA_BACKEND_CPU, 8, 16, 2, 16, 0, 0, 0 };
    eo.token_budget = 1; /* below max_batch */
    assert_int_equal(fa_engine_create(model, &eo, &e, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "token_budget"));
    assert_null(e);
    eo.token_budget = 16, eo.num_pages = 0;
    assert_int_equal(fa_engine_create(model, &eo, &e, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "num_pages"));
    eo.num_pages = 8, eo.backend = FA_BACKEND_GLES;
    assert_int_equal(fa_engine_create(model, &eo, &e, err), FA_ERR_UNSUPPORTED);
    eo.backend = FA_BACKEND_CPU;
    assert_int_equal(fa_engine_create(model, &eo, &e, err), FA_OK);
    int32_t cu[2] = { 0, 1 }, len[1] = { 0 }, bt[1] = { 0 }, tok[1] = { 5 }, pos[1] = { 0 }, next[1] = { -7 };
    uint8_t smp[1] = { 1 };
    int64_t id = 0;
    fa_step st = { 1, 1, 1, 1, 1, 16, &id, cu, len, bt, tok, pos, smp, 0 };
    fa_sample_params p = { 0.0f, 0.0f, 0 };
    assert_int_equal(fa_engine_step(e, &st, &p, next, NULL, err), FA_OK);
    assert_true(next[0] >= 0 && next[0] < model->config.vocab_size);
    const struct {
        int32_t *field;
        int32_t bad;
        const char *name;
    } cases[] = { { &bt[0], 8, "block_table" }, { &tok[0], 512, "tokens" }, { &pos[0], 3, "positions" },
                  { &len[0], 512, "cache_seqlens" }, { &cu[1], 2, "cu_seqlens_q" } };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const int32_t keep = *cases[i].field;
        *cases[i].field = cases[i].bad;
        next[0] = -7;
        assert_int_not_equal(fa_engine_step(e, &st, &p, next, NULL, err), FA_OK);
        if (!strstr(err, cases[i].name))
            fail_msg("case %s: message '%s'", cases[i].name, err);
        assert_int_equal(next[0], -7); /* nothing written */
        *cases[i].field = keep;
    }
    /* an interior offset whose difference overflows 32 bits is refused, not computed with */
    int32_t cu3[4] = { 0, 1, INT32_MIN, 1 }, len3[3] = { 0, 0, 0 }, bt3[3] = { 0, 1, 2 }, next3[3] = { -7, -7, -7 };
    uint8_t smp3[3] = { 1, 0, 0 };
    int64_t ids3[3] = { 0, 1, 2 };
    fa_step three = { 3, 1, 1, 1, 1, 16, ids3, cu3, len3, bt3, tok, pos, smp3, 0 };
    fa_engine *e3;
    eo.max_batch = 3;
    assert_int_equal(fa_engine_create(model, &eo, &e3, err), FA_OK);
    if (fa_engine_step(e3, &three, &p, next3, NULL, err) != FA_ERR_INVALID_VALUE)
        fail_msg("%s", err);
    assert_non_null(strstr(err, "cu_seqlens_q[1..2]"));
    assert_int_equal(next3[0], -7);
    fa_engine_free(e3);
    p.temperature = NAN;
    assert_int_equal(fa_engine_step(e, &st, &p, next, NULL, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "temperature"));
    st.page_size = 8;
    assert_int_equal(fa_engine_step(e, &st, NULL, next, NULL, err), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "page_size"));
    fa_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_sample_formula), cmocka_unit_test(test_refusals),
                                        cmocka_unit_test(test_cpu_nan_logits),
                                        cmocka_unit_test(test_cuda_nan_logits),
                                        cmocka_unit_test(test_cpu_greedy),
                                        cmocka_unit_test(test_cpu_sampling_batch_invariant),
                                        cmocka_unit_test(test_cpu_gqa_paths), cmocka_unit_test(test_cuda_gqa_paths),
                                        cmocka_unit_test(test_cuda_against_cpu),
                                        cmocka_unit_test(test_cuda_graphs_bit_identical) };
    return cmocka_run_group_tests(tests, setup, teardown);
}
