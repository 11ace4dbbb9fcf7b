/* SPDX-License-Identifier: MIT */
/*
 * The engine (engine.h): the checks every backend shares, the CPU engine over
 * fa_model_forward_step, and the hand-off of a checked step to the CUDA engine
 * (cuda/engine_cuda.c).
 */
#include "engine.h"
#include "fail.h"
#include "cuda/engine_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct fa_engine {
    const fa_model *m;
    fa_engine_options o;
    fa_engine_info info;
    /* cpu */
    fa_context_t ctx;
    fa_model_state *s;
    fa_model_kv *kv;
    float *logits;  /* [max_batch, vocab]: cpu by sequence, cuda by sampled row */
    float *scratch; /* [2 vocab] the sampler's */
    /* cuda */
    fa_engine_cuda *cuda;
    /* a step's sampled sequences, as the backend gets them */
    int32_t *rows;                /* [max_batch] query row (its last) of each */
    float *temperature, *topp, *u; /* [max_batch] */
    int32_t *next;                 /* [max_batch] */
    double step_s;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static fa_status check_options(const fa_model *m, const fa_engine_options *o, char *err)
{
    const fa_model_config *c = &m->config;
    if (o->backend != FA_BACKEND_CPU && o->backend != FA_BACKEND_CUDA && o->backend != FA_BACKEND_AUTO)
        return fa_model_fail(err, FA_ERR_UNSUPPORTED, "backend %s cannot run the runner (cpu or cuda)",
                             fa_backend_name(o->backend));
    if (o->page_size < 1)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "page_size (%d) must be at least 1", (int)o->page_size);
    if (o->max_batch < 1)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "max_batch (%d) must be at least 1", (int)o->max_batch);
    if (o->token_budget < o->max_batch || o->token_budget > c->seq_len)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "token_budget (%d) must be in max_batch (%d) .. the model's seq_len (%d)",
                             (int)o->token_budget, (int)o->max_batch, (int)c->seq_len);
    if (o->threads < 0)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "threads (%d) must be >= 0", (int)o->threads);
    if (o->device < 0)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "device (%d) must be >= 0", (int)o->device);
    if (o->no_graphs != 0 && o->no_graphs != 1)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "no_graphs (%d) must be 0 or 1", (int)o->no_graphs);
    return FA_OK;
}

/* AUTO becomes CUDA where this build has it and a device answers, else CPU. */
static fa_backend pick_backend(fa_backend b)
{
    if (b != FA_BACKEND_AUTO)
        return b;
    return fa_engine_cuda_available() ? FA_BACKEND_CUDA : FA_BACKEND_CPU;
}

void fa_engine_free(fa_engine *e)
{
    if (!e)
        return;
    fa_engine_cuda_free(e->cuda);
    fa_model_state_free(e->s);
    fa_model_kv_free(e->kv);
    if (e->ctx)
        fa_context_destroy(e->ctx);
    free(e->logits), free(e->scratch), free(e->rows), free(e->temperature), free(e->topp), free(e->u);
    free(e->next);
    free(e);
}

static uint64_t cpu_page_bytes(const fa_model_config *c, int32_t page_size)
{
    return 2ull * (uint64_t)c->n_layers * (uint64_t)page_size * (uint64_t)(c->dim / c->n_heads) *
           (uint64_t)c->n_kv_heads * sizeof(float);
}

static fa_status create_cpu(fa_engine *e, char *err)
{
    const fa_model_config *c = &e->m->config;
    const fa_context_options co = { sizeof(co), FA_BACKEND_CPU, e->o.threads };
    if (fa_context_create(&co, &e->ctx) != FA_OK)
        return fa_model_fail(err, FA_ERR_BACKEND, "cpu context: %s", fa_last_create_error());
    fa_model_state_options so = { e->o.token_budget, FA_ALGORITHM_FLASH, FA_MATVEC_AUTO, NULL, NULL, 1, 0 };
    fa_status st = fa_model_state_create(e->m, e->ctx, &so, &e->s, err);
    if (st == FA_OK)
        st = fa_model_kv_create(e->m, e->o.num_pages, e->o.page_size, &e->kv, err);
    if (st != FA_OK)
        return st;
    const fa_model_stats ms = fa_model_state_stats(e->s);
    e->info = (fa_engine_info){ FA_BACKEND_CPU, "cpu", e->m->bytes,
                                cpu_page_bytes(c, e->o.page_size) * (uint64_t)e->o.num_pages, ms.state_bytes,
                                0, 0, 0, 0, NULL, 0 };
    return FA_OK;
}

fa_status fa_engine_create(const fa_model *m, const fa_engine_options *o, fa_engine **out, char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!m || !o)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", !m ? "model" : "options");
    fa_status st = check_options(m, o, err);
    if (st != FA_OK)
        return st;
    if (o->num_pages < 1)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "num_pages (%d) must be at least 1", (int)o->num_pages);
    const fa_model_config *c = &m->config;
    fa_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the engine");
    e->m = m;
    e->o = *o;
    e->o.backend = pick_backend(o->backend);
    const size_t B = (size_t)o->max_batch;
    e->scratch = malloc(sizeof(float) * 2 * (size_t)c->vocab_size);
    e->logits = malloc(sizeof(float) * B * (size_t)c->vocab_size);
    e->rows = malloc(sizeof(int32_t) * B), e->next = malloc(sizeof(int32_t) * B);
    e->temperature = malloc(sizeof(float) * B), e->topp = malloc(sizeof(float) * B), e->u = malloc(sizeof(float) * B);
    if (!e->scratch || !e->logits || !e->rows || !e->next || !e->temperature || !e->topp || !e->u) {
        fa_engine_free(e);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the engine");
    }
    if (e->o.backend == FA_BACKEND_CUDA)
        st = fa_engine_cuda_create(m, &e->o, &e->cuda, &e->info, err);
    else
        st = create_cpu(e, err);
    if (st != FA_OK) {
        fa_engine_free(e);
        return st;
    }
    const int64_t kv = (int64_t)o->num_pages * o->page_size; /* both int32: fits */
    e->info.kv_tokens = kv < INT32_MAX ? (int32_t)kv : INT32_MAX;
    *out = e;
    return FA_OK;
}

fa_engine_info fa_engine_get_info(const fa_engine *e)
{
    fa_engine_info z = { 0 };
    if (!e)
        return z;
    fa_engine_info in = e->info;
    if (e->cuda) {
        int on;
        fa_engine_cuda_graph_counts(e->cuda, &on, &in.graphs_captured, &in.graph_replays, &in.graphs_off);
        in.graphs = on;
    }
    return in;
}

void fa_engine_times(const fa_engine *e, double *step_s, double *attention_s)
{
    if (step_s)
        *step_s = e ? e->step_s : 0.0;
    if (attention_s)
        *attention_s = e && e->s ? fa_model_state_stats(e->s).attention_s : 0.0;
}

fa_status fa_engine_pages_for(const fa_model *m, const fa_engine_options *o, double fraction, int32_t *pages,
                              char *err)
{
    if (!m || !o || !pages)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", !m ? "model" : !o ? "options" : "pages");
    if (!(fraction > 0.0 && fraction <= 1.0))
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "fraction (%g) must be in (0, 1]", fraction);
    fa_status st = check_options(m, o, err);
    if (st != FA_OK)
        return st;
    uint64_t avail = 0, fixed = 0, per_page = 0;
    if (pick_backend(o->backend) == FA_BACKEND_CUDA) {
        st = fa_engine_cuda_memory(m, o, &avail, &fixed, &per_page, err);
        if (st != FA_OK)
            return st;
    } else { /* the weights are mapped already: what is left is the host's free memory */
        avail = (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
        fixed = 0;
        per_page = cpu_page_bytes(&m->config, o->page_size);
    }
    const double room = (double)avail * fraction - (double)fixed;
    const double n = room > 0.0 ? floor(room / (double)per_page) : 0.0;
    if (n < 1.0)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY,
                             "no page of %llu bytes fits in %.0f%% of %llu free bytes beside %llu of weights and "
                             "activations",
                             (unsigned long long)per_page, fraction * 100.0, (unsigned long long)avail,
                             (unsigned long long)fixed);
    *pages = n > (double)INT32_MAX ? INT32_MAX : (int32_t)n;
    return FA_OK;
}

/* Everything in a step the backends rely on, checked on the host (the CUDA engine's tables
 * are copied to the device as they are, where nothing could name a bad entry). */
static fa_status check_step(const fa_engine *e, const fa_step *st, const fa_sample_params *params, char *err)
{
    const fa_model_config *c = &e->m->config;
    if (st->batch < 1 || st->batch > e->o.max_batch)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "step.batch (%d) must be in 1..max_batch (%d)",
                             (int)st->batch, (int)e->o.max_batch);
    if (st->total_q < 1 || st->total_q > e->o.token_budget)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "step.total_q (%d) must be in 1..token_budget (%d)",
                             (int)st->total_q, (int)e->o.token_budget);
    if (st->page_size != e->o.page_size)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                             "step.page_size (%d) differs from the engine's (%d): make the scheduler with the "
                             "engine's pages",
                             (int)st->page_size, (int)e->o.page_size);
    fa_status ck = fa_step_check_arrays(st, c->vocab_size, err);
    if (ck != FA_OK)
        return ck;
    const int64_t pages_cap = ((int64_t)c->seq_len + e->o.page_size - 1) / e->o.page_size;
    if (st->max_pages_per_seq < 1 || st->max_pages_per_seq > pages_cap)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "step.max_pages_per_seq (%d) must be in 1..%lld",
                             (int)st->max_pages_per_seq, (long long)pages_cap);
    if (st->cu_seqlens_q[0] != 0 || st->cu_seqlens_q[st->batch] != st->total_q)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "step.cu_seqlens_q must run from 0 to total_q (%d), not %d .. %d", (int)st->total_q,
                             (int)st->cu_seqlens_q[0], (int)st->cu_seqlens_q[st->batch]);
    for (int32_t b = 0; b < st->batch; b++) {
        /* in 64 bits: a hostile table's differences need not fit in 32 */
        const int64_t n = (int64_t)st->cu_seqlens_q[b + 1] - st->cu_seqlens_q[b];
        const int32_t cached = st->cache_seqlens[b];
        if (n < 0 || st->cu_seqlens_q[b + 1] > st->total_q)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "step.cu_seqlens_q[%d..%d] (%d..%d) is not ordered",
                                 (int)b, (int)b + 1, (int)st->cu_seqlens_q[b], (int)st->cu_seqlens_q[b + 1]);
        if (cached < 0 || cached + n > c->seq_len || cached + n > st->max_seqlen_k || n > st->max_seqlen_q)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                                 "step.cache_seqlens[%d] (%d) + its %d rows exceed seq_len (%d) or the step's "
                                 "max_seqlen_k (%d)",
                                 (int)b, (int)cached, (int)n, (int)c->seq_len, (int)st->max_seqlen_k);
        const int32_t used = (int32_t)((cached + n + e->o.page_size - 1) / e->o.page_size);
        if (used > st->max_pages_per_seq)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "sequence %d needs %d pages, more than max_pages_per_seq (%d)",
                                 (int)b, (int)used, (int)st->max_pages_per_seq);
        for (int32_t j = 0; j < used; j++) {
            const int32_t page = st->block_table[(size_t)b * (size_t)st->max_pages_per_seq + (size_t)j];
            if (page < 0 || page >= e->o.num_pages)
                return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                                     "step.block_table[%d][%d] (%d) is outside the engine's 0..%d pages", (int)b,
                                     (int)j, (int)page, (int)e->o.num_pages - 1);
        }
        for (int32_t r = st->cu_seqlens_q[b]; r < st->cu_seqlens_q[b + 1]; r++)
            if (st->positions[r] != cached + (r - st->cu_seqlens_q[b]))
                return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                                     "step.positions[%d] (%d) is not its row's place in sequence %d (%d)", (int)r,
                                     (int)st->positions[r], (int)b, (int)(cached + (r - st->cu_seqlens_q[b])));
        if (st->sample[b] && n < 1)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "step.sample[%d] is set but sequence %d has no query row",
                                 (int)b, (int)b);
        if (st->sample[b] && params) {
            const fa_sample_params *p = &params[b];
            if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
                return fa_model_fail(err, FA_ERR_INVALID_VALUE, "params[%d].temperature (%g) must be finite and >= 0",
                                     (int)b, (double)p->temperature);
            if (!(p->topp >= 0.0f) || !isfinite(p->topp))
                return fa_model_fail(err, FA_ERR_INVALID_VALUE, "params[%d].topp (%g) must be finite and >= 0",
                                     (int)b, (double)p->topp);
        }
    }
    return FA_OK;
}

fa_status fa_engine_step(fa_engine *e, const fa_step *st, const fa_sample_params *params, int32_t *next,
                         float *logits, char *err)
{
    if (!e || !st || !next)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", !e ? "engine" : !st ? "step" : "next");
    fa_status rc = check_step(e, st, params, err);
    if (rc != FA_OK)
        return rc;
    const double t0 = now();
    const fa_sample_params greedy = { 0.0f, 0.0f, 0 };
    int32_t ns = 0; /* the sampled sequences, in order */
    for (int32_t b = 0; b < st->batch; b++)
        if (st->sample[b]) {
            const fa_sample_params *p = params ? &params[b] : &greedy;
            e->rows[ns] = st->cu_seqlens_q[b + 1] - 1;
            e->temperature[ns] = p->temperature;
            e->topp[ns] = p->topp;
            e->u[ns] = fa_sample_uniform(p->seed, st->positions[e->rows[ns]]);
            ns++;
        }
    const size_t V = (size_t)e->m->config.vocab_size;
    if (e->cuda) {
        rc = fa_engine_cuda_step(e->cuda, st, ns, e->rows, e->temperature, e->topp, e->u, e->next,
                                 logits ? e->logits : NULL, err);
    } else {
        rc = fa_model_forward_step(e->m, e->s, e->kv, st, e->logits, err);
        for (int32_t i = 0, b = 0; rc == FA_OK && b < st->batch; b++) {
            if (!st->sample[b])
                continue;
            const fa_sample_params p = { e->temperature[i], e->topp[i], 0 };
            e->next[i] = fa_sample_logits(e->logits + (size_t)b * V, (int32_t)V, &p, e->u[i], e->scratch);
            i++;
        }
    }
    if (rc != FA_OK)
        return rc;
    for (int32_t i = 0, b = 0; b < st->batch; b++)
        if (st->sample[b] && e->next[i++] < 0)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                                 "sequence %d: its logits at position %d are NaN or +inf: the model's weights "
                                 "hold NaN or inf values, or its activations overflow",
                                 (int)b, (int)st->positions[st->cu_seqlens_q[b + 1] - 1]);
    for (int32_t i = 0, b = 0; b < st->batch; b++) {
        if (!st->sample[b])
            continue;
        next[b] = e->next[i];
        if (logits) /* cuda: the sampled rows in order; cpu: every sequence's row */
            memcpy(logits + (size_t)b * V, e->logits + (size_t)(e->cuda ? i : b) * V, sizeof(float) * V);
        i++;
    }
    e->step_s += now() - t0;
    return FA_OK;
}
