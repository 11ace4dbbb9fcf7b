/* SPDX-License-Identifier: MIT */
/* Moving tiles between the caller's tensors and the kernels' float32 buffers. */
#include "cpu.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FA_PREFETCH_ROWS 8

void fa_cpu_pack_cols(const fa_cpu_kernels *kern, const fa_problem *p, const fa_tensor *t,
                      const fa_cpu_cols *cc, int32_t cols_pad, int transposed, int32_t ld, double mul,
                      const fa_descale *rows, float *dst, float *tmp)
{
    const int32_t dim = p->dim, nr = kern->nr;
    for (int32_t c = 0; c < cols_pad; c++) {
        float *row = transposed ? tmp : dst + (int64_t)c * ld;
        if (c < cc->ncols) {
            int64_t pos = cc->r0 + c / p->group;
            int32_t h = cc->hk * p->group + c % p->group;
            const char *src = fa_elem_ptr(t, fa_row_offset(p, t, cc->b, cc->seq.q_start + pos, h));
            kern->load(t->dtype, src, row, dim, (float)(rows ? mul * fa_descale_row(rows, cc->b, cc->hk, pos) : mul));
            if (p->paged && p->paged->rope_dim && t == &p->desc->q) /* rotation is linear: after mul */
                fa_rope_row(p->paged, row,
                            fa_rope_position(p->paged, cc->seq.q_start + pos, pos, cc->seq.q_len,
                                             cc->seq.k_len));
            if (!transposed && ld > dim)
                memset(row + dim, 0, sizeof(float) * (size_t)(ld - dim));
        } else if (transposed) {
            memset(tmp, 0, sizeof(float) * (size_t)dim);
        } else {
            memset(row, 0, sizeof(float) * (size_t)ld);
        }
        if (transposed) {
            float *panel = dst + (int64_t)(c / nr) * dim * nr + c % nr;
            for (int32_t i = 0; i < dim; i++)
                panel[(int64_t)i * nr] = tmp[i];
        }
    }
}

void fa_cpu_pack_q(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_cols *cc,
                   int32_t cols_pad, int transposed, float mul, float *dst, float *tmp)
{
    const fa_attention_desc *d = p->desc; /* fp8: the factors of q and k scale the scores (in
                                           * double: their product alone may pass float's range);
                                           * factors per block of rows scale their rows instead
                                           * (q's here, k's as they load) */
    const fa_descale *qd = &d->q_descale, *kd = &d->k_descale;
    const fa_descale *q_rows = qd->data && qd->block_rows ? qd : NULL;
    const double m = (double)mul * (qd->block_rows ? 1.0f : fa_descale_at(qd, cc->b, cc->hk)) *
                     (kd->block_rows ? 1.0f : fa_descale_at(kd, cc->b, cc->hk));
    /* one multiplier for every row: rounded to float once, as the rows' loads take it */
    fa_cpu_pack_cols(kern, p, &d->q, cc, transposed ? cols_pad : cc->ncols, transposed, p->dim,
                     q_rows ? m : (double)(float)m, q_rows, dst, tmp);
}

void fa_cpu_load_rows(const fa_cpu_kernels *kern, const fa_problem *p, const fa_tensor *t,
                      const fa_cpu_cols *cc, int64_t j0, int32_t n, int32_t ld, float *dst)
{
    const int32_t dim = p->dim;
    const int64_t row_bytes = (int64_t)dim * fa_dtype_bytes(t->dtype);
    const int64_t step = t->stride_seq * fa_dtype_bytes(t->dtype);
    /* fp8 factors per block of rows scale k's and v's rows as they load */
    const fa_descale *ds = t == &p->desc->k ? &p->desc->k_descale : t == &p->desc->v ? &p->desc->v_descale : NULL;
    if (ds && (!ds->data || !ds->block_rows))
        ds = NULL;
    for (int32_t j = 0; j < n;) {
        int32_t run;
        const char *src = fa_cpu_kv_row(p, t, cc, j0 + j, &run);
        run = run < n - j ? run : n - j;
        for (int32_t r = 0; r < run; r++, j++, src += step) {
            /* Rows of one head are strided (BSHD): hardware prefetchers stop at page
             * boundaries, so fetch a few rows ahead by hand. */
            if (r + FA_PREFETCH_ROWS < run)
                for (int64_t at = 0; at < row_bytes; at += 64)
                    __builtin_prefetch(src + FA_PREFETCH_ROWS * step + at);
            float *row = dst + (int64_t)j * ld;
            kern->load(t->dtype, src, row, dim, ds ? fa_descale_row(ds, cc->b, cc->hk, j0 + j) : 1.0f);
            if (ld > dim)
                memset(row + dim, 0, sizeof(float) * (size_t)(ld - dim));
        }
    }
}

int fa_cpu_tile_full(const fa_problem *p, const fa_cpu_cols *cc, int64_t j0, int64_t j1)
{
    return fa_problem_tile_full(p, &cc->seq, cc->r0, cc->r0 + cc->npos, j0, j1);
}

void fa_cpu_mask(const fa_problem *p, const fa_cpu_cols *cc, int64_t j0, int32_t n, float *st,
                 int32_t lds, int full_tile)
{
    if (full_tile)
        return;
    for (int32_t c = 0; c < cc->ncols; c++) {
        const int64_t pos = cc->r0 + c / p->group;
        int64_t lo, hi; /* the tile's keys lie inside the sequence: the clamps change nothing */
        fa_problem_key_range(p, &cc->seq, pos, pos + 1, &lo, &hi);
        lo -= j0;
        hi -= j0;
        for (int32_t j = 0; j < n; j++)
            if (j < lo || j >= hi)
                st[(int64_t)j * lds + c] = -INFINITY;
    }
}

void fa_cpu_dropout(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_cols *cc,
                    int64_t j0, int32_t n, float *st, int32_t lds, int32_t cols, int32_t *ids)
{
    int32_t *head = ids, *row = ids + cols;
    for (int32_t c = 0; c < cols; c++) { /* padding columns repeat the last real one */
        int32_t cr = c < cc->ncols ? c : (cc->ncols > 0 ? cc->ncols - 1 : 0);
        head[c] = cc->hk * p->group + cr % p->group;
        row[c] = (int32_t)(cc->r0 + cr / p->group);
    }
    kern->dropout_apply(n, cols, st, lds, p->dropout_seed, p->dropout_offset, cc->b, head, row, j0,
                        p->dropout_threshold, p->dropout_scale);
}

/* o = acc * vmul / sum into dst; where vmul / sum would be subnormal (a tiny fp8 factor over many
 * keys), acc * vmul first, so the output keeps float's precision while it is a normal number. */
static void store_row(const fa_cpu_kernels *kern, const fa_problem *p, const float *acc, void *dst, float vmul,
                      float sum)
{
    const float f = vmul / sum;
    if (f >= FLT_MIN || vmul == 0.0f) {
        kern->store(p->desc->o.dtype, acc, dst, p->dim, f);
        return;
    }
    float row[FA_MAX_HEAD_DIM];
    for (int32_t i = 0; i < p->dim; i++)
        row[i] = acc[i] * vmul;
    kern->store(p->desc->o.dtype, row, dst, p->dim, 1.0f / sum);
}

void fa_cpu_store_out(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_cols *cc,
                      const float *acc, int32_t ld, const float *m, const float *l)
{
    const fa_attention_desc *d = p->desc;
    const float *sinks = p->paged ? p->paged->desc->sinks : NULL;
    /* fp8: v's factor (its rows' own, per block, scaled them as they loaded) */
    const float vmul = d->v_descale.block_rows ? 1.0f : fa_descale_at(&d->v_descale, cc->b, cc->hk);
    for (int32_t c = 0; c < cc->ncols; c++) {
        int64_t row = cc->seq.q_start + cc->r0 + c / p->group;
        int32_t h = cc->hk * p->group + c % p->group;
        char *dst = (char *)fa_elem_ptr(&d->o, fa_row_offset(p, &d->o, cc->b, row, h));
        /* natural-log normaliser of the keys (-inf: none visible, l 0), then the sink's share;
         * a NaN l (a NaN input, or scores past float32) gives NaN o and lse, as standard
         * attention does, never the zeros of a row that sees no key */
        const int seen = l[c] != 0.0f;
        float lse = seen ? (m[c] + log2f(l[c])) * FA_LN2 : -INFINITY, sum = l[c];
        if (sinks && seen) {
            sum += exp2f(sinks[h] * FA_LOG2E - m[c]); /* inf when the sink dominates: o = 0 */
            lse = fmaxf(lse, sinks[h]) + log1pf(expf(-fabsf(lse - sinks[h])));
        } else if (sinks) {
            lse = sinks[h];
        }
        if (seen) /* else no visible key: exact zeros, whatever the accumulator holds */
            store_row(kern, p, acc + (int64_t)c * ld, dst, vmul, sum);
        else
            memset(dst, 0, (size_t)p->dim * (size_t)fa_dtype_bytes(d->o.dtype));
        if (d->lse) {
            int64_t at = (p->varlen ? 0 : (int64_t)cc->b * p->lse_sb) + (int64_t)h * p->lse_sh +
                         row * p->lse_ss;
            d->lse[at] = lse;
        }
    }
}

static int task_cmp(const void *x, const void *y)
{
    const fa_cpu_task *a = x, *b = y;
    if (a->cost != b->cost)
        return a->cost < b->cost ? 1 : -1;
    if (a->b != b->b)
        return a->b - b->b;
    if (a->hk != b->hk)
        return a->hk - b->hk;
    return a->blk - b->blk;
}

int64_t fa_cpu_build_tasks(const fa_problem *p, const fa_cpu_plan *pl, fa_cpu_task *tasks)
{
    int64_t nt = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        fa_seq sq = fa_problem_seq(p, b);
        int64_t blocks = ((int64_t)sq.q_len + pl->pos_per_task - 1) / pl->pos_per_task;
        for (int32_t blk = 0; blk < blocks; blk++) {
            int64_t r0 = (int64_t)blk * pl->pos_per_task, r1 = r0 + pl->pos_per_task, lo, hi;
            if (r1 > sq.q_len)
                r1 = sq.q_len;
            fa_problem_key_range(p, &sq, r0, r1, &lo, &hi);
            int64_t cost = (hi > lo ? hi - lo : 0) * (r1 - r0) + (r1 - r0);
            for (int32_t hk = 0; hk < p->heads_kv; hk++)
                tasks[nt++] = (fa_cpu_task){ cost, b, hk, blk };
        }
    }
    qsort(tasks, (size_t)nt, sizeof(*tasks), task_cmp);
    return nt;
}

fa_cpu_cols fa_cpu_task_cols(const fa_problem *p, const fa_cpu_plan *pl, const fa_cpu_task *t)
{
    fa_cpu_cols cc;
    cc.b = t->b;
    cc.hk = t->hk;
    cc.seq = fa_problem_seq(p, t->b);
    cc.r0 = (int64_t)t->blk * pl->pos_per_task;
    int64_t left = cc.seq.q_len - cc.r0;
    cc.npos = (int32_t)(left < pl->pos_per_task ? left : pl->pos_per_task);
    cc.ncols = cc.npos * p->group;
    return cc;
}
