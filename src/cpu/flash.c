/* SPDX-License-Identifier: MIT */
/*
 * FlashAttention forward on the CPU: each task owns a block of query rows
 * and walks the key/value tiles its mask lets it see, keeping the running
 * max m, sum l and output accumulator O in float32; S and P never exist
 * beyond one block_k x cols tile. Few-query calls (decode) go to decode.c.
 */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif


/* Per-thread buffers, carved from one block (sizes in floats). */
typedef struct bufs {
    float *q;     /* cols_pad * dim: packed queries */
    float *k;     /* block_k * dim */
    float *v;     /* block_k * dim_pad */
    float *st;    /* block_k * cols_pad: transposed scores, then probabilities */
    float *o;     /* cols_pad * dim_pad: output accumulator */
    float *m, *l, *alpha; /* cols_pad each */
    float *scale; /* cols_pad: the probabilities' factor per column (1, or 2^-e once a sum overflowed) */
    float *tmp;   /* dim */
    int32_t *ids;  /* 2 * cols_pad: dropout heads and rows of the columns */
} bufs;

static int64_t carve(const fa_problem *p, const fa_cpu_plan *pl, float *base, bufs *b)
{
    int64_t n = 0;
    bufs scratch, *out = b ? b : &scratch;
    out->q = fa_ws_take(base, &n, (int64_t)pl->cols_pad * p->dim);
    out->k = fa_ws_take(base, &n, (int64_t)pl->block_k * p->dim);
    out->v = fa_ws_take(base, &n, (int64_t)pl->block_k * pl->dim_pad);
    out->st = fa_ws_take(base, &n, (int64_t)pl->block_k * pl->cols_pad);
    out->o = fa_ws_take(base, &n, (int64_t)pl->cols_pad * pl->dim_pad);
    out->m = fa_ws_take(base, &n, pl->cols_pad);
    out->l = fa_ws_take(base, &n, pl->cols_pad);
    out->alpha = fa_ws_take(base, &n, pl->cols_pad);
    out->scale = fa_ws_take(base, &n, pl->cols_pad);
    out->tmp = fa_ws_take(base, &n, p->dim);
    out->ids = (int32_t *)fa_ws_take(base, &n, p->dropout_p > 0.0f ? 2 * (int64_t)pl->cols_pad : 0);
    return n;
}

int64_t fa_cpu_flash_thread_floats(const fa_problem *p, const fa_cpu_plan *pl)
{
    return carve(p, pl, NULL, NULL);
}

/* The task's walk over its key tiles: O, m and l of its columns from the packed queries, the
 * probabilities of column c times scale[c] when scale is given (cpu.h: sums past float32). */
static void walk(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl,
                 const fa_cpu_cols *cc, bufs *bf, const float *scale)
{
    const fa_attention_desc *d = p->desc;
    const int32_t dim = p->dim, mr = kern->mr, nr = kern->nr;
    const int32_t cols_pad = pl->cols_pad, dpad = pl->dim_pad, lds = cols_pad;

    memset(bf->o, 0, sizeof(float) * (size_t)cols_pad * (size_t)dpad);
    for (int32_t c = 0; c < cols_pad; c++) {
        bf->m[c] = -INFINITY;
        bf->l[c] = 0.0f;
    }

    /* Key tiles sit on a fixed grid (multiples of block_k), not at the block's
     * first visible key: every row then sees the same tiles, and so gets the
     * same bits, however the planner cut the rows into tasks (which depends on
     * the thread count). */
    int64_t lo, hi;
    fa_problem_key_range(p, &cc->seq, cc->r0, cc->r0 + cc->npos, &lo, &hi);
    for (int64_t j0 = lo / pl->block_k * pl->block_k; j0 < hi; j0 += pl->block_k) {
        int32_t n = (int32_t)(hi - j0 < pl->block_k ? hi - j0 : pl->block_k);

        /* K and V tiles are copied into contiguous float32 rows: reading them in
         * place with a head-strided pitch (8 KiB at h32 d64) maps every row to the
         * same L1 set and cost ~10% on causal shapes. */
        fa_cpu_load_rows(kern, p, &d->k, cc, j0, n, dim, bf->k);
        fa_cpu_load_rows(kern, p, &d->v, cc, j0, n, dpad, bf->v);
        /* S^T = K Q^T: keys down, query columns across. */
        for (int32_t c0 = 0; c0 < cols_pad; c0 += nr)
            for (int32_t i0 = 0; i0 < n; i0 += mr)
                kern->gemm(n - i0 < mr ? n - i0 : mr, dim, bf->k + (int64_t)i0 * dim, dim, 1,
                           bf->q + (int64_t)c0 * dim, nr, bf->st + (int64_t)i0 * lds + c0, lds,
                           NULL);
        if (p->softcap > 0.0f)
            kern->softcap(n, pl->cols_vec, bf->st, lds, p->softcap);
        fa_cpu_mask(p, cc, j0, n, bf->st, lds, fa_cpu_tile_full(p, cc, j0, j0 + n));
        kern->softmax_update(n, pl->cols_vec, bf->st, lds, bf->m, bf->l, bf->alpha);
        if (p->dropout_p > 0.0f) /* after l took the undropped sum */
            fa_cpu_dropout(kern, p, cc, j0, n, bf->st, lds, pl->cols_vec, bf->ids);
        if (scale)
            fa_cpu_scale_cols(n, pl->cols_vec, bf->st, lds, scale);

        /* O = diag(alpha) O + P V, P read through the transposed tile. */
        for (int32_t i0 = 0; i0 < cc->ncols; i0 += mr)
            for (int32_t c0 = 0; c0 < dpad; c0 += nr)
                kern->gemm(cc->ncols - i0 < mr ? cc->ncols - i0 : mr, n, bf->st + i0, 1, lds,
                           bf->v + c0, dpad, bf->o + (int64_t)i0 * dpad + c0, dpad, bf->alpha + i0);
    }
}

static void run_task(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl,
                     const fa_cpu_task *t, bufs *bf)
{
    const fa_cpu_cols cc = fa_cpu_task_cols(p, pl, t);
    const float qmul = p->softcap > 0.0f ? p->scale : p->scale * FA_LOG2E;
    const int e = fa_cpu_redo_shift(p, cc.seq.k_len);

    fa_cpu_pack_q(kern, p, &cc, pl->cols_pad, 1, qmul, bf->q, bf->tmp);
    walk(kern, p, pl, &cc, bf, NULL);
    if (fa_cpu_overflowed(cc.ncols, pl->cols_vec, p->dim, bf->o, pl->dim_pad, bf->l, e, bf->scale)) {
        walk(kern, p, pl, &cc, bf, bf->scale);
        fa_cpu_raise_base(cc.ncols, bf->scale, e, bf->m, bf->l);
    }
    fa_cpu_store_out(kern, p, &cc, bf->o, pl->dim_pad, bf->m, bf->l);
}

fa_status fa_cpu_flash_forward(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                               const fa_cpu_plan *pl)
{
    size_t per = (size_t)pl->per_thread_floats;
    float *ws = fa_alloc_aligned((size_t)pl->threads * per * sizeof(float));
    fa_cpu_task *tasks = malloc((size_t)(pl->task_count ? pl->task_count : 1) * sizeof(*tasks));
    if (!ws || !tasks) {
        free(ws);
        free(tasks);
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating %llu bytes of workspace",
                        (unsigned long long)pl->workspace_bytes);
    }
    fa_status st;
    if (p->paged && p->paged->append && (st = fa_cpu_append_rows(ctx, s, p)) != FA_OK) {
        free(ws);
        free(tasks);
        return st;
    }
    /* Unused padded score columns are read by the softmax: keep them finite. */
    memset(ws, 0, (size_t)pl->threads * per * sizeof(float));

    int64_t nt = fa_cpu_build_tasks(p, pl, tasks);

    const fa_cpu_kernels *kern = s->kern;
    /* A call much smaller than its plan (a paged plan is made for bounds) runs on the threads
     * its own work can use: one, without a parallel region, below FA_CPU_ONE_THREAD_SCORES
     * (waking threads costs more than such a call, and on a loaded machine a spinning one
     * takes the core the caller needs). Each output row comes from one task either way:
     * the same bits for any thread count. */
    int64_t work = 0;
    for (int64_t i = 0; i < nt; i++)
        work += tasks[i].cost;
    const int threads = work < FA_CPU_ONE_THREAD_SCORES || nt < 2 ? 1 : nt < pl->threads ? (int)nt : pl->threads;
    if (threads == 1) {
        bufs bf;
        carve(p, pl, ws, &bf);
        for (int64_t i = 0; i < nt; i++)
            run_task(kern, p, pl, &tasks[i], &bf);
        free(ws);
        free(tasks);
        return FA_OK;
    }
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        bufs bf;
        carve(p, pl, ws + (size_t)tid * per, &bf);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < nt; i++)
            run_task(kern, p, pl, &tasks[i], &bf);
    }
    free(ws);
    free(tasks);
    return FA_OK;
}
