/* SPDX-License-Identifier: MIT */
/*
 * Paged calls on the CPU. The attention itself is the framework's (decode.c for few query
 * rows per sequence, flash.c otherwise), reading keys and values page by page through
 * fa_cpu_kv_row; here are the plan, the append that runs first, and the merge of states.
 */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct paged_plan {
    fa_cpu_plan pl;
} paged_plan;

fa_status fa_cpu_paged_plan(fa_context_t ctx, void *state, const fa_problem *p, void **plan,
                            fa_run_info *info)
{
    fa_cpu_state *s = state;
    paged_plan *pp = calloc(1, sizeof(*pp));
    if (!pp)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the plan");
    fa_status st = fa_cpu_plan_flash(ctx, s, p, &pp->pl);
    if (st == FA_OK && (pp->pl.task_count > ((int64_t)1 << 40) || /* bounds no machine holds */
                        pp->pl.workspace_bytes > ((uint64_t)1 << 48)))
        st = fa_error(ctx, FA_ERR_SIZE_OVERFLOW,
                      "these bounds (batch %d, total_q %d, max_seqlen_q %d, max_seqlen_k %d) need %llu "
                      "bytes of workspace; plan for the bounds the calls will have",
                      (int)p->batch, (int)p->desc->seqlen_q, (int)p->max_q, (int)p->max_k,
                      (unsigned long long)pp->pl.workspace_bytes);
    if (st != FA_OK) {
        free(pp);
        return st;
    }
    info->kernel = fa_cpu_kernel_name(s, 0, pp->pl.use_dot, 1);
    info->block_q = pp->pl.cols;
    info->block_k = pp->pl.block_k;
    info->threads = pp->pl.threads;
    info->workspace_bytes = pp->pl.workspace_bytes;
    *plan = pp;
    return FA_OK;
}

void fa_cpu_paged_plan_free(void *state, void *plan)
{
    (void)state;
    free(plan);
}

/* Row i of sequence b's new rows into its pages: keys rotated (in float32, then rounded to the
 * cache's dtype), values copied. */
static void append_row(const fa_cpu_kernels *kern, const fa_problem *p, int32_t b, const fa_seq *s,
                       int64_t i, float *tmp)
{
    const fa_paged_problem *pg = p->paged;
    const fa_paged_desc *d = pg->desc;
    const fa_attention_desc *a = p->desc;
    const int64_t row = s->q_start + i, cached = s->k_len - s->q_len, esize = p->in_dtype == FA_DTYPE_F32 ? 4 : 2;
    fa_cpu_cols cc = { b, 0, *s, 0, 0, 0 };
    for (int32_t h = 0; h < p->heads_kv; h++) {
        int32_t run;
        cc.hk = h;
        char *kd = (char *)fa_cpu_kv_row(p, &a->k, &cc, cached + i, &run);
        char *vd = (char *)fa_cpu_kv_row(p, &a->v, &cc, cached + i, &run);
        const char *ks = fa_elem_ptr(&d->k_new, row * d->k_new.stride_seq + h * d->k_new.stride_head);
        const char *vs = fa_elem_ptr(&d->v_new, row * d->v_new.stride_seq + h * d->v_new.stride_head);
        if (pg->rope_dim) {
            kern->load(p->in_dtype, ks, tmp, p->dim, 1.0f);
            fa_rope_row(pg, tmp, fa_rope_position(pg, row, i, s->q_len, s->k_len));
            kern->store(p->in_dtype, tmp, kd, p->dim, 1.0f);
        } else {
            memcpy(kd, ks, (size_t)(p->dim * esize));
        }
        memcpy(vd, vs, (size_t)(p->dim * esize));
    }
}

fa_status fa_cpu_append_rows(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p)
{
    float *tmp = fa_alloc_aligned(sizeof(float) * (size_t)p->dim);
    if (!tmp)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the append's row");
    for (int32_t b = 0; b < p->batch; b++) {
        const fa_seq sq = fa_problem_seq(p, b);
        for (int64_t i = 0; i < sq.q_len; i++)
            append_row(s->kern, p, b, &sq, i, tmp);
    }
    free(tmp);
    return FA_OK;
}

fa_status fa_cpu_append(fa_context_t ctx, void *state, const fa_problem *p)
{
    return fa_cpu_append_rows(ctx, state, p);
}

/* The call's append (p->paged->append) runs inside the forward, once its workspace is held:
 * a call refused for memory leaves the cache as it was. */
fa_status fa_cpu_paged_run(fa_context_t ctx, void *state, void *plan, const fa_problem *p,
                           fa_run_info *info)
{
    (void)info;
    const paged_plan *pp = plan;
    return pp->pl.use_dot ? fa_cpu_decode_forward(ctx, state, p, &pp->pl)
                          : fa_cpu_flash_forward(ctx, state, p, &pp->pl);
}

fa_status fa_cpu_merge(fa_context_t ctx, void *state, const fa_merge_desc *d)
{
    const fa_cpu_state *s = state;
    const int32_t dim = d->head_dim, ns = d->num_states;
    float *buf = fa_alloc_aligned(sizeof(float) * (size_t)(2 * dim + ns));
    if (!buf)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the merge's rows");
    float *acc = buf, *row = buf + dim, *w = buf + 2 * dim;
    for (int64_t r = 0; r < d->rows; r++)
        for (int32_t h = 0; h < d->num_heads; h++) {
            float mx = -INFINITY, sum = 0.0f;
            int bad = 0; /* a NaN or +inf lse: o and lse NaN */
            for (int32_t k = 0; k < ns; k++) {
                w[k] = d->lse_in[k * d->lse_in_stride_state + h * d->lse_in_stride_head +
                                 r * d->lse_in_stride_row];
                mx = fmaxf(mx, w[k]);
                bad |= !(w[k] < INFINITY);
            }
            for (int32_t x = 0; x < dim; x++)
                acc[x] = bad ? NAN : 0.0f;
            for (int32_t k = 0; !bad && mx > -INFINITY && k < ns; k++) {
                if (w[k] == -INFINITY)
                    continue;
                const float e = expf(w[k] - mx);
                sum += e;
                s->kern->load(d->o_in.dtype,
                              fa_elem_ptr(&d->o_in, k * d->o_in.stride_batch + r * d->o_in.stride_seq +
                                                        h * d->o_in.stride_head),
                              row, dim, 1.0f);
                for (int32_t x = 0; x < dim; x++)
                    acc[x] += e * row[x];
            }
            char *dst = (char *)fa_elem_ptr(&d->o, r * d->o.stride_seq + h * d->o.stride_head);
            s->kern->store(d->o.dtype, acc, dst, dim, bad ? 1.0f : sum > 0.0f ? 1.0f / sum : 0.0f);
            if (d->lse)
                d->lse[h * d->lse_stride_head + r * d->lse_stride_row] =
                    bad ? NAN : sum > 0.0f ? mx + logf(sum) : -INFINITY;
        }
    free(buf);
    return FA_OK;
}
