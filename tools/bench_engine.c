/* SPDX-License-Identifier: MIT */
/*
 * bench-model's engine rows (--backend cuda, or cpu with --batch): B requests of the same
 * prompt served through the scheduler and fa_engine_step, for each batch size B, in passes
 * over one engine: a warm-up pass at the same shapes (where the CUDA engine captures its decode
 * graph), then timed ones, each row the medians. Prefill tok/s counts the prompts' tokens over
 * the steps that carried prompt rows; decode tok/s the tokens of the steps of decode rows only;
 * `replayed` how many timed decode steps the CUDA engine replayed from a graph.
 */
#include "cli.h"
#include "engine.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_graphs(const char *s, int *no_graphs)
{
    if (strcmp(s, "on") && strcmp(s, "off"))
        return -1;
    *no_graphs = strcmp(s, "off") == 0;
    return 0;
}

/* Pages B requests of n prompt tokens and `decode` more need. */
static int64_t pages_for(int32_t n, int32_t decode, int32_t page, int32_t B)
{
    return ((int64_t)n + decode + 1 + page - 1) / page * B;
}

/* One pass's times: seconds of the steps that carried prompt rows, and of the decode steps
 * with their tokens. */
typedef struct pass_times {
    double pre, dec;
    long dec_tokens, dec_steps;
} pass_times;

/* B requests of the prompt served by a fresh scheduler over engine e: 0 or CLI_EXIT_FAIL. */
static int pass(fa_engine *e, const fa_sched_options *so, const int32_t *ids, int32_t n, int32_t decode, int32_t B,
                int32_t *next, pass_times *t)
{
    char err[FA_MODEL_ERR_LEN];
    fa_sched *sc = NULL;
    fa_status st;
    memset(t, 0, sizeof(*t));
    if ((st = fa_sched_create(so, &sc, err)) != FA_OK)
        goto fail;
    for (int32_t b = 0; b < B; b++) {
        int64_t id;
        if ((st = fa_sched_add(sc, ids, n, decode + 1, &id, err)) != FA_OK)
            goto fail;
    }
    for (;;) {
        fa_step s;
        if ((st = fa_sched_step(sc, &s, err)) != FA_OK)
            goto fail;
        if (s.batch == 0)
            break;
        const double t0 = cli_now();
        if ((st = fa_engine_step(e, &s, NULL, next, NULL, err)) != FA_OK)
            goto fail;
        const double dt = cli_now() - t0;
        if (s.total_q == s.batch) /* decode rows only */
            t->dec += dt, t->dec_tokens += s.batch, t->dec_steps++;
        else
            t->pre += dt;
        if ((st = fa_sched_commit(sc, next, NULL, err)) != FA_OK)
            goto fail;
    }
    fa_sched_free(sc);
    return 0;
fail:
    fprintf(stderr, "\nflashattn bench-model: %s (%s)\n", err, fa_status_string(st));
    fa_sched_free(sc);
    return CLI_EXIT_FAIL;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), by_value);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One batch size (its pages checked to fit an int32 by the caller): a warm-up pass (cuBLAS's
 * choices for these shapes, the kernels' first launches, the decode graph's capture), then
 * `reps` timed passes; medians. 0 or CLI_EXIT_FAIL. */
static int one(const fa_model *m, fa_backend backend, int no_graphs, int32_t page, const int32_t *ids, int32_t n,
               int32_t decode, int32_t B, int reps, int32_t *fused_rows)
{
    const fa_model_config *c = &m->config;
    char err[FA_MODEL_ERR_LEN];
    const int32_t pages = (int32_t)pages_for(n, decode, page, B);
    /* prompts packed into steps of up to 8192 rows (or seq_len), then decode steps of B rows */
    int64_t want = (int64_t)n * B;
    want = want < 8192 ? want : 8192;
    want = want < c->seq_len ? want : c->seq_len;
    const int32_t budget = want > B ? (int32_t)want : B;
    const fa_engine_options eo = { backend, pages, page, B, budget, 0, 0, no_graphs };
    const fa_sched_options so = { eo.num_pages, page, B, budget, c->seq_len, B };
    fa_engine *e = NULL;
    int32_t *next = malloc(sizeof(int32_t) * (size_t)B);
    double *pre = malloc(sizeof(double) * (size_t)reps), *dec = malloc(sizeof(double) * (size_t)reps);
    int rc = CLI_EXIT_FAIL;
    fa_status st;
    if (!next || !pre || !dec) {
        fprintf(stderr, "flashattn bench-model: out of memory\n");
        goto done;
    }
    if ((st = fa_engine_create(m, &eo, &e, err)) != FA_OK) {
        rc = cli_lib_error("bench-model", err, st);
        goto done;
    }
    pass_times t;
    if (pass(e, &so, ids, n, decode, B, next, &t) != 0)
        goto done;
    const int64_t replays0 = fa_engine_get_info(e).graph_replays;
    long dec_steps = 0;
    for (int r = 0; r < reps; r++) {
        fprintf(stderr, "\r  batch %d: pass %d/%d", (int)B, r + 1, reps);
        fflush(stderr);
        if (pass(e, &so, ids, n, decode, B, next, &t) != 0)
            goto done;
        pre[r] = t.pre;
        dec[r] = t.dec_tokens ? t.dec_tokens / t.dec : 0.0;
        dec_steps += t.dec_steps;
    }
    fprintf(stderr, "\r%40s\r", "");
    const fa_engine_info in = fa_engine_get_info(e);
    *fused_rows = in.fused_rows;
    const double p = median(pre, reps), d = median(dec, reps);
    printf("%-5d %11.1f %13.1f %12.1f %14.2f %5lld/%-5ld %10.1f   %s\n", (int)B, p * 1e3, (double)n * B / p, d,
           d > 0 ? 1e3 * B / d : 0.0, (long long)(in.graph_replays - replays0), dec_steps,
           (double)in.weight_bytes / 1073741824.0, in.device);
    rc = 0;
done:
    fa_engine_free(e);
    free(next), free(pre), free(dec);
    return rc;
}

int cli_bench_engine(const fa_model *m, fa_backend backend, int no_graphs, int32_t page, const int32_t *ids,
                     int32_t n, int32_t decode, const long *batches, int n_batches, int reps)
{
    char err[FA_MODEL_ERR_LEN];
    for (int i = 0; i < n_batches; i++) {
        const int64_t pages = pages_for(n, decode, page, (int32_t)batches[i]);
        if (pages > INT32_MAX) {
            fprintf(stderr, "flashattn bench-model: %ld requests of %d tokens need %lld pages of %d, more than %d: "
                    "use a larger --page-size or a smaller --batch\n", batches[i], (int)(n + decode + 1),
                    (long long)pages, (int)page, INT32_MAX);
            return CLI_EXIT_USAGE;
        }
    }
    int rc;
    printf("engine %s: page %d, prompt %d tokens, %d decode steps a request, decode graphs %s; "
           "medians of %d passes after a warm-up\n",
           fa_backend_name(backend), (int)page, (int)n, (int)decode,
           backend == FA_BACKEND_CUDA ? (no_graphs ? "off" : "on") : "off (cpu)", reps);
    printf("%-5s %11s %13s %12s %14s %11s %10s   %s\n", "batch", "prefill_ms", "prefill_tok/s", "decode_tok/s",
           "decode_step_ms", "replayed", "weight_GiB", "device");
    int32_t fused = 0;
    for (int i = 0; i < n_batches; i++)
        if ((rc = one(m, backend, no_graphs, page, ids, n, decode, (int32_t)batches[i], reps, &fused)) != 0)
            return rc;
    if (backend == FA_BACKEND_CUDA && fused)
        printf("projections: the fused few-row kernels at steps of up to %d rows, cuBLAS above "
               "(FLASHATTN_GEMV_ROWS)\n",
               (int)fused);
    else if (backend == FA_BACKEND_CUDA)
        printf("projections: cuBLAS at every step (FLASHATTN_GEMV_ROWS=0, or dims the fused kernels do not take)\n");
    const fa_engine_options eo = { backend, 1, page, 1, 1, 0, 0, no_graphs };
    int32_t pages;
    if (fa_engine_pages_for(m, &eo, 0.9, &pages, err) == FA_OK)
        printf("KV capacity at 90%% of free memory: %d pages of %d = %lld tokens\n", (int)pages, (int)page,
               (long long)pages * page);
    return 0;
}
