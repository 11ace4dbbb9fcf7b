/* SPDX-License-Identifier: MIT */
/*
 * bench-model's engine rows (--backend cuda, or cpu with --batch): B requests of the same
 * prompt served through the scheduler and fa_engine_step, for each batch size B. Prefill
 * tok/s counts the prompts' tokens over the steps that carried prompt rows; decode tok/s the
 * tokens of the steps of decode rows only, after the first (where the CUDA engine captures its
 * graph, in both modes so that they compare); `replayed` how many decode steps the CUDA engine
 * replayed from a graph, of those timed.
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

/* One batch size (its pages checked to fit an int32 by the caller): 0 or CLI_EXIT_FAIL. */
static int one(const fa_model *m, fa_backend backend, int no_graphs, int32_t page, const int32_t *ids, int32_t n,
               int32_t decode, int32_t B, int print)
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
    fa_sched *sc = NULL;
    int32_t *next = malloc(sizeof(int32_t) * (size_t)B);
    int rc = CLI_EXIT_FAIL;
    fa_status st;
    if (!next || (st = fa_engine_create(m, &eo, &e, err)) != FA_OK || (st = fa_sched_create(&so, &sc, err)) != FA_OK) {
        fprintf(stderr, "flashattn bench-model: %s\n", next ? err : "out of memory");
        goto done;
    }
    for (int32_t b = 0; b < B; b++) {
        int64_t id;
        if ((st = fa_sched_add(sc, ids, n, decode + 1, &id, err)) != FA_OK) {
            fprintf(stderr, "flashattn bench-model: %s\n", err);
            goto done;
        }
    }
    double t_pre = 0.0, t_dec = 0.0;
    long dec_tokens = 0, dec_steps = 0;
    int first_decode = 1;
    for (;;) {
        fa_step s;
        if ((st = fa_sched_step(sc, &s, err)) != FA_OK) {
            fprintf(stderr, "flashattn bench-model: %s\n", err);
            goto done;
        }
        if (s.batch == 0)
            break;
        const double t0 = cli_now();
        if ((st = fa_engine_step(e, &s, NULL, next, NULL, err)) != FA_OK) {
            fprintf(stderr, "\nflashattn bench-model: %s (%s)\n", err, fa_status_string(st));
            goto done;
        }
        const double dt = cli_now() - t0;
        if (s.total_q == s.batch && first_decode) /* decode rows only */
            first_decode = 0;
        else if (s.total_q == s.batch)
            t_dec += dt, dec_tokens += s.batch, dec_steps++;
        else
            t_pre += dt;
        if ((st = fa_sched_commit(sc, next, NULL, err)) != FA_OK) {
            fprintf(stderr, "flashattn bench-model: %s\n", err);
            goto done;
        }
    }
    if (print) {
        const fa_engine_info in = fa_engine_get_info(e);
        printf("%-5d %11.1f %13.1f %12.1f %14.1f %5lld/%-5ld %10.1f   %s\n", (int)B, t_pre * 1e3,
               (double)n * B / t_pre, dec_tokens ? dec_tokens / t_dec : 0.0,
               dec_tokens ? t_dec * 1e3 * B / (double)dec_tokens : 0.0, (long long)in.graph_replays, dec_steps,
               (double)in.weight_bytes / 1073741824.0, in.device);
    }
    rc = 0;
done:
    fa_sched_free(sc);
    fa_engine_free(e);
    free(next);
    return rc;
}

int cli_bench_engine(const fa_model *m, fa_backend backend, int no_graphs, int32_t page, const int32_t *ids,
                     int32_t n, int32_t decode, const long *batches, int n_batches)
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
    /* a first small run: cuBLAS's heuristics, the kernels' first launches */
    int rc = one(m, backend, no_graphs, page, ids, n < 64 ? n : 64, 2, 1, 0);
    if (rc != 0)
        return rc;
    /* each batch's engine captures its decode graph at its first decode step, which is timed */
    printf("engine %s: page %d, prompt %d tokens, %d decode steps a request, decode graphs %s\n",
           fa_backend_name(backend), (int)page, (int)n, (int)decode,
           backend == FA_BACKEND_CUDA ? (no_graphs ? "off" : "on") : "off (cpu)");
    printf("%-5s %11s %13s %12s %14s %11s %10s   %s\n", "batch", "prefill_ms", "prefill_tok/s", "decode_tok/s",
           "decode_step_ms", "replayed", "weight_GiB", "device");
    for (int i = 0; i < n_batches; i++)
        if ((rc = one(m, backend, no_graphs, page, ids, n, decode, (int32_t)batches[i], 1)) != 0)
            return rc;
    const fa_engine_options eo = { backend, 1, page, 1, 1, 0, 0, no_graphs };
    int32_t pages;
    if (fa_engine_pages_for(m, &eo, 0.9, &pages, err) == FA_OK)
        printf("KV capacity at 90%% of free memory: %d pages of %d = %lld tokens\n", (int)pages, (int)page,
               (long long)pages * page);
    return 0;
}
