/* SPDX-License-Identifier: MIT */
/*
 * Standard attention, the baseline: what an unfused framework does. Three
 * passes through memory over the full score matrix: S = scale*Q K^T for
 * every key (written out), mask and softmax over each complete row (S read,
 * P written), O = P V (P read). Same kernels as the flash path, so the
 * comparison measures the algorithm, not the code quality.
 */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif


typedef struct sbufs {
    float *q, *k, *v, *o, *m, *l, *alpha, *tmp;
    float *scale; /* cols_pad: the probabilities' factor per column (cpu.h: sums past float32) */
    int32_t *ids; /* 2 * cols_pad: dropout heads and rows of the columns */
} sbufs;

static int64_t carve(const fa_problem *p, const fa_cpu_plan *pl, float *base, sbufs *b)
{
    int64_t n = 0;
    sbufs scratch, *out = b ? b : &scratch;
    out->q = fa_ws_take(base, &n, (int64_t)pl->cols_pad * p->dim);
    out->k = fa_ws_take(base, &n, (int64_t)p->max_k * p->dim);
    out->v = fa_ws_take(base, &n, (int64_t)p->max_k * pl->dim_pad);
    out->o = fa_ws_take(base, &n, (int64_t)pl->cols_pad * pl->dim_pad);
    out->m = fa_ws_take(base, &n, pl->cols_pad);
    out->l = fa_ws_take(base, &n, pl->cols_pad);
    out->alpha = fa_ws_take(base, &n, pl->cols_pad);
    out->scale = fa_ws_take(base, &n, pl->cols_pad);
    out->tmp = fa_ws_take(base, &n, p->dim);
    out->ids = (int32_t *)fa_ws_take(base, &n, p->dropout_p > 0.0f ? 2 * (int64_t)pl->cols_pad : 0);
    return n;
}

int64_t fa_cpu_standard_thread_floats(const fa_problem *p, const fa_cpu_plan *pl)
{
    return carve(p, pl, NULL, NULL);
}

/* O = P V over the task's n keys, P read through the transposed score matrix s. */
static void pv(const fa_cpu_kernels *kern, const fa_cpu_plan *pl, const fa_cpu_cols *cc, int32_t n,
               const float *s, sbufs *bf)
{
    const int32_t mr = kern->mr, nr = kern->nr, dpad = pl->dim_pad;
    for (int32_t i0 = 0; i0 < cc->ncols; i0 += mr)
        for (int32_t c0 = 0; c0 < dpad; c0 += nr)
            kern->gemm(cc->ncols - i0 < mr ? cc->ncols - i0 : mr, n, s + i0, 1, pl->cols_pad,
                       bf->v + c0, dpad, bf->o + (int64_t)i0 * dpad + c0, dpad, NULL);
}

static void run_task(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl,
                     const fa_cpu_task *t, float *s, sbufs *bf)
{
    const fa_cpu_cols cc = fa_cpu_task_cols(p, pl, t);
    const int32_t dim = p->dim, mr = kern->mr, nr = kern->nr, n = cc.seq.k_len;
    const int32_t cols_pad = pl->cols_pad, dpad = pl->dim_pad, lds = cols_pad;
    const float qmul = p->softcap > 0.0f ? p->scale : p->scale * FA_LOG2E;

    fa_cpu_pack_q(kern, p, &cc, cols_pad, !pl->use_dot, qmul, bf->q, bf->tmp);
    fa_cpu_load_rows(kern, p, &p->desc->k, &cc, 0, n, dim, bf->k);
    fa_cpu_load_rows(kern, p, &p->desc->v, &cc, 0, n, dpad, bf->v);
    for (int32_t c = 0; c < cols_pad; c++) {
        bf->m[c] = -INFINITY;
        bf->l[c] = 0.0f;
    }

    /* Pass 1: the whole S for these rows. */
    static const fa_cpu_heads one_head = { 1, 0, 0, 0, 0, 0, NULL, 0, 0, 0, 0 };
    if (pl->use_dot)
        kern->dot(FA_DTYPE_F32, &one_head, cc.ncols, n, dim, bf->q, dim, bf->k, dim, s, lds);
    else
        for (int32_t c0 = 0; c0 < cols_pad; c0 += nr)
            for (int32_t i0 = 0; i0 < n; i0 += mr)
                kern->gemm(n - i0 < mr ? n - i0 : mr, dim, bf->k + (int64_t)i0 * dim, dim, 1,
                           bf->q + (int64_t)c0 * dim, nr, s + (int64_t)i0 * lds + c0, lds, NULL);
    /* Pass 2: mask after the fact, then softmax over complete rows. */
    if (p->softcap > 0.0f)
        kern->softcap(n, pl->cols_vec, s, lds, p->softcap);
    fa_cpu_mask(p, &cc, 0, n, s, lds, fa_cpu_tile_full(p, &cc, 0, n));
    kern->softmax_update(n, pl->cols_vec, s, lds, bf->m, bf->l, bf->alpha);
    if (p->dropout_p > 0.0f)
        fa_cpu_dropout(kern, p, &cc, 0, n, s, lds, pl->cols_vec, bf->ids);
    /* Pass 3: O = P V; again for the columns whose sums overflowed, their P scaled down. */
    const int e = fa_cpu_redo_shift(p, n);
    pv(kern, pl, &cc, n, s, bf);
    if (fa_cpu_overflowed(cc.ncols, pl->cols_vec, dim, bf->o, dpad, bf->l, e, bf->scale)) {
        fa_cpu_scale_cols(n, pl->cols_vec, s, lds, bf->scale);
        fa_cpu_raise_base(cc.ncols, bf->scale, e, bf->m, bf->l);
        pv(kern, pl, &cc, n, s, bf);
    }
    fa_cpu_store_out(kern, p, &cc, bf->o, dpad, bf->m, bf->l);
}

int64_t fa_cpu_standard_scores(const fa_problem *p, const fa_cpu_plan *pl)
{
    int64_t total = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        fa_seq sq = fa_problem_seq(p, b);
        int64_t blocks = (sq.q_len + pl->pos_per_task - 1) / pl->pos_per_task, t;
        if (!fa_mul_ok(blocks * p->heads_kv, (int64_t)sq.k_len * pl->cols_pad, &t) ||
            !fa_add_ok(total, t, &total))
            return -1;
    }
    return total;
}

fa_status fa_cpu_standard_forward(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                                  const fa_cpu_plan *pl)
{
    size_t per = (size_t)pl->per_thread_floats;
    size_t scores = (size_t)fa_cpu_standard_scores(p, pl);
    float *ws = fa_alloc_aligned((size_t)pl->threads * per * sizeof(float));
    float *sbuf = fa_alloc_aligned(scores * sizeof(float));
    size_t ntask = (size_t)(pl->task_count ? pl->task_count : 1);
    fa_cpu_task *tasks = malloc(ntask * sizeof(*tasks));
    int64_t *at = malloc(ntask * sizeof(*at));
    if (!ws || !sbuf || !tasks || !at) {
        free(ws);
        free(sbuf);
        free(tasks);
        free(at);
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY,
                        "out of memory allocating %llu bytes for standard attention's score matrix",
                        (unsigned long long)pl->workspace_bytes);
    }
    memset(ws, 0, (size_t)pl->threads * per * sizeof(float));
    if (pl->use_dot) /* the dot kernel leaves padded columns unwritten: keep them finite */
        memset(sbuf, 0, scores * sizeof(float));

    int64_t nt = fa_cpu_build_tasks(p, pl, tasks), off = 0;
    for (int64_t i = 0; i < nt; i++) {
        at[i] = off;
        off += (int64_t)fa_problem_seq(p, tasks[i].b).k_len * pl->cols_pad;
    }

    const fa_cpu_kernels *kern = s->kern;
#pragma omp parallel num_threads(pl->threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        sbufs bf;
        carve(p, pl, ws + (size_t)tid * per, &bf);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < nt; i++)
            run_task(kern, p, pl, &tasks[i], sbuf + at[i], &bf);
    }
    free(ws);
    free(sbuf);
    free(tasks);
    free(at);
    return FA_OK;
}
