/* SPDX-License-Identifier: MIT */
/*
 * Split-KV decode: few query rows per sequence (one token, or a GQA group
 * sharing its kv head), many keys. A task is (sequence, chunk of keys, kv
 * head): it streams that head's K and V rows once, in their own dtype,
 * through the dot/axpy kernels. Splitting along the keys keeps every core
 * busy even for one sequence with one kv head (MQA). Each task leaves
 * partial (max, sum, output) statistics; a merge in a fixed chunk order
 * combines them, so results do not depend on the thread count. (Walking all
 * heads per key block, to read a [seq, heads, dim] cache contiguously, was
 * measured slower: docs/perf/cpu.md.)
 */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define LOG2E 1.4426950408889634f

typedef struct dbufs {
    float *q;     /* cols * dim: packed queries of one kv head */
    float *o;     /* cols * dim: output accumulator */
    float *m, *l; /* cols_vec */
    float *st;    /* FA_DECODE_TILE * cols_pad: transposed scores */
    float *alpha; /* cols_vec */
    float *tmp;   /* dim */
} dbufs;

static int64_t carve(const fa_problem *p, const fa_cpu_plan *pl, float *base, dbufs *b)
{
    int64_t n = 0;
#define TAKE(field, count)                                                                     \
    do {                                                                                       \
        if (b)                                                                                 \
            b->field = base + n;                                                               \
        n += ((int64_t)(count) + 15) & ~(int64_t)15;                                           \
    } while (0)
    TAKE(q, (int64_t)pl->cols * p->dim);
    TAKE(o, (int64_t)pl->cols * p->dim);
    TAKE(m, pl->cols_vec);
    TAKE(l, pl->cols_vec);
    TAKE(st, (int64_t)FA_DECODE_TILE * pl->cols_pad);
    TAKE(alpha, pl->cols_vec);
    TAKE(tmp, p->dim);
#undef TAKE
    return n;
}

int64_t fa_cpu_decode_thread_floats(const fa_problem *p, const fa_cpu_plan *pl)
{
    return carve(p, pl, NULL, NULL);
}

/* Partial results of one (sequence, chunk): per kv head, m and l for each
 * column, then the unnormalised output rows. */
int64_t fa_cpu_decode_slot_floats(const fa_problem *p, const fa_cpu_plan *pl)
{
    return (int64_t)p->heads_kv * pl->cols * (p->dim + 2);
}

/* Chunks of keys sequence b is split into (at least 1, even with no visible key). */
int64_t fa_cpu_decode_chunks(const fa_problem *p, const fa_cpu_plan *pl, int32_t b, int64_t *lo,
                             int64_t *hi)
{
    fa_seq s = fa_problem_seq(p, b);
    fa_problem_key_range(p, &s, 0, s.q_len, lo, hi);
    int64_t keys = *hi > *lo ? *hi - *lo : 0;
    int64_t n = (keys + pl->block_k - 1) / pl->block_k;
    return n > 0 ? n : 1;
}

static fa_cpu_cols seq_cols(const fa_problem *p, int32_t b, int32_t hk)
{
    fa_cpu_cols cc;
    cc.b = b;
    cc.hk = hk;
    cc.seq = fa_problem_seq(p, b);
    cc.r0 = 0;
    cc.npos = cc.seq.q_len;
    cc.ncols = cc.npos * p->group;
    return cc;
}

static const char *row_ptr(const fa_problem *p, const fa_tensor *t, const fa_cpu_cols *cc, int64_t j,
                           int32_t hk)
{
    return fa_elem_ptr(t, fa_row_offset(p, t, cc->b, cc->seq.k_start + j, hk));
}

static void run_chunk(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl,
                      int32_t b, int64_t chunk, int32_t hk, float *slot, dbufs *bf)
{
    const fa_attention_desc *d = p->desc;
    const int32_t dim = p->dim, cols = pl->cols, cv = pl->cols_vec, lds = pl->cols_pad;
    const float qmul = p->softcap > 0.0f ? p->scale : p->scale * LOG2E;
    fa_cpu_cols cc = seq_cols(p, b, hk);
    if (cc.ncols == 0)
        return;
    int64_t lo, hi;
    fa_cpu_decode_chunks(p, pl, b, &lo, &hi);
    int64_t c0 = lo + chunk * pl->block_k, c1 = c0 + pl->block_k < hi ? c0 + pl->block_k : hi;

    fa_cpu_pack_q(kern, p, &cc, cc.ncols, 0, qmul, bf->q, bf->tmp);
    for (int32_t c = 0; c < cv; c++) {
        bf->m[c] = -INFINITY;
        bf->l[c] = 0.0f;
    }
    memset(bf->o, 0, sizeof(float) * (size_t)cols * (size_t)dim);
    for (int64_t j0 = c0; j0 < c1; j0 += FA_DECODE_TILE) {
        int32_t n = (int32_t)(c1 - j0 < FA_DECODE_TILE ? c1 - j0 : FA_DECODE_TILE);
        kern->dot(d->k.dtype, cc.ncols, n, dim, bf->q, dim, row_ptr(p, &d->k, &cc, j0, hk),
                  d->k.stride_seq, bf->st, lds);
        fa_cpu_cap_and_mask(p, &cc, j0, n, bf->st, lds, fa_cpu_tile_full(p, &cc, j0, j0 + n));
        kern->softmax_update(n, cv, bf->st, lds, bf->m, bf->l, bf->alpha);
        kern->axpy(d->v.dtype, cc.ncols, n, dim, bf->st, lds, row_ptr(p, &d->v, &cc, j0, hk),
                   d->v.stride_seq, bf->o, dim, bf->alpha);
    }
    float *h = slot + (int64_t)hk * cols * (dim + 2);
    memcpy(h, bf->m, sizeof(float) * (size_t)cc.ncols);
    memcpy(h + cols, bf->l, sizeof(float) * (size_t)cc.ncols);
    memcpy(h + 2 * cols, bf->o, sizeof(float) * (size_t)cc.ncols * (size_t)dim);
}

/* Combine the chunks of (b, hk) in chunk order and write o and lse. */
static void merge(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl, int32_t b,
                  int32_t hk, const float *slots, int64_t nch, dbufs *bf)
{
    const int32_t dim = p->dim, cols = pl->cols;
    const int64_t slot_floats = fa_cpu_decode_slot_floats(p, pl);
    fa_cpu_cols cc = seq_cols(p, b, hk);
    float *acc = bf->o, *m = bf->m, *l = bf->l;
    for (int32_t c = 0; c < cc.ncols; c++) {
        float mx = -INFINITY;
        for (int64_t k = 0; k < nch; k++)
            mx = fmaxf(mx, slots[k * slot_floats + (int64_t)hk * cols * (dim + 2) + c]);
        float sum = 0.0f, *out = acc + (int64_t)c * dim;
        memset(out, 0, sizeof(float) * (size_t)dim);
        for (int64_t k = 0; mx > -INFINITY && k < nch; k++) {
            const float *h = slots + k * slot_floats + (int64_t)hk * cols * (dim + 2);
            if (h[c] == -INFINITY)
                continue;
            float w = exp2f(h[c] - mx);
            sum += w * h[cols + c];
            const float *oc = h + 2 * cols + (int64_t)c * dim;
            for (int32_t x = 0; x < dim; x++)
                out[x] += w * oc[x];
        }
        m[c] = mx;
        l[c] = sum;
    }
    fa_cpu_store_out(kern, p, &cc, acc, dim, m, l);
}

fa_status fa_cpu_decode_forward(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                                const fa_cpu_plan *pl)
{
    size_t per = (size_t)pl->per_thread_floats;
    int64_t slot_floats = fa_cpu_decode_slot_floats(p, pl);
    const int64_t nslots = pl->task_count / p->heads_kv; /* one per (sequence, chunk) */
    float *ws = fa_alloc_aligned((size_t)pl->threads * per * sizeof(float));
    float *slots = fa_alloc_aligned((size_t)nslots * (size_t)slot_floats * sizeof(float));
    int64_t *first = malloc(sizeof(int64_t) * ((size_t)p->batch + 1));
    int32_t *task_b = malloc(sizeof(int32_t) * (size_t)nslots);
    if (!ws || !slots || !first || !task_b) {
        free(ws);
        free(slots);
        free(first);
        free(task_b);
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating %llu bytes of workspace",
                        (unsigned long long)pl->workspace_bytes);
    }
    memset(ws, 0, (size_t)pl->threads * per * sizeof(float));
    first[0] = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        int64_t lo, hi, n = fa_cpu_decode_chunks(p, pl, b, &lo, &hi);
        first[b + 1] = first[b] + n;
        for (int64_t k = first[b]; k < first[b + 1]; k++)
            task_b[k] = b;
    }
    const fa_cpu_kernels *kern = s->kern;
    const int64_t nt = pl->task_count, pairs = (int64_t)p->batch * p->heads_kv;
#pragma omp parallel num_threads(pl->threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        dbufs bf;
        carve(p, pl, ws + (size_t)tid * per, &bf);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < nt; t++) {
            int64_t sl = t / p->heads_kv;
            int32_t b = task_b[sl];
            run_chunk(kern, p, pl, b, sl - first[b], (int32_t)(t % p->heads_kv),
                      slots + sl * slot_floats, &bf);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < pairs; i++) {
            int32_t b = (int32_t)(i / p->heads_kv), hk = (int32_t)(i % p->heads_kv);
            merge(kern, p, pl, b, hk, slots + first[b] * slot_floats, first[b + 1] - first[b], &bf);
        }
    }
    free(ws);
    free(slots);
    free(first);
    free(task_b);
    return FA_OK;
}
