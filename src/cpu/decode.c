/* SPDX-License-Identifier: MIT */
/*
 * Split-KV decode: few query rows per sequence (one token, or a GQA group
 * sharing its kv head), many keys. A task is (sequence, chunk of keys,
 * group of kv heads). K and V are read in place, in their own dtype, key
 * after key; with a head-interleaved cache ([seq, heads, dim]) the group is
 * every kv head, so each key's row of all heads is read in one forward sweep
 * (4x the bandwidth of walking one head's strided rows on Zen 4); with a
 * head-major cache ([heads, seq, dim]) a group is one head, already
 * contiguous. The score tile holds the columns of all heads of the group
 * side by side, so one softmax call updates them all. Splitting along the
 * keys keeps every core busy even for one sequence with one kv head (MQA).
 * Each task leaves partial (max, sum, output) statistics per head; a merge
 * in a fixed chunk order combines them, so results never depend on the
 * thread count.
 */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif


/* Score columns of a task: every query row of every head in its group. */
static int32_t group_cols(const fa_cpu_plan *pl) { return pl->decode_heads * pl->cols; }

static int32_t group_cols_vec(const fa_cpu_kernels *kern, const fa_cpu_plan *pl)
{
    int32_t w = kern->nr / 2;
    return (group_cols(pl) + w - 1) / w * w;
}

/* Keys per tile: the score tile stays within 32 KiB (L1). */
static int32_t tile_keys(const fa_cpu_kernels *kern, const fa_cpu_plan *pl)
{
    int32_t t = 8192 / group_cols_vec(kern, pl) / 16 * 16;
    return t < 16 ? 16 : t > 256 ? 256 : t;
}

typedef struct dbufs {
    float *q;             /* heads x cols x dim: packed queries */
    float *o;             /* heads x cols x dim: output accumulators */
    float *m, *l, *alpha; /* group_cols_vec */
    float *scale;         /* group_cols_vec: the probabilities' factor (cpu.h: sums past float32) */
    float *ones;          /* group_cols_vec ones: no rescale for a tile's later pages */
    float *st;            /* tile x group_cols_vec: transposed scores */
    float *tmp;           /* dim */
    int32_t *ids;         /* 2 x group_cols_vec: dropout heads and rows of the columns */
} dbufs;

static int64_t carve(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl,
                     float *base, dbufs *b)
{
    int64_t n = 0, gc = group_cols(pl), gv = group_cols_vec(kern, pl);
    dbufs scratch, *out = b ? b : &scratch;
    out->q = fa_ws_take(base, &n, gc * p->dim);
    out->o = fa_ws_take(base, &n, gc * p->dim);
    out->m = fa_ws_take(base, &n, gv);
    out->l = fa_ws_take(base, &n, gv);
    out->alpha = fa_ws_take(base, &n, gv);
    out->scale = fa_ws_take(base, &n, gv);
    out->ones = fa_ws_take(base, &n, gv);
    out->st = fa_ws_take(base, &n, (int64_t)tile_keys(kern, pl) * gv);
    out->tmp = fa_ws_take(base, &n, p->dim);
    out->ids = (int32_t *)fa_ws_take(base, &n, p->dropout_p > 0.0f ? 2 * gv : 0);
    return n;
}

int64_t fa_cpu_decode_thread_floats(const fa_cpu_kernels *kern, const fa_problem *p,
                                    const fa_cpu_plan *pl)
{
    return carve(kern, p, pl, NULL, NULL);
}

/* Partial results of one (sequence, chunk): per kv head, m and l for each
 * column, then the unnormalised output rows. */
int64_t fa_cpu_decode_slot_floats(const fa_problem *p, const fa_cpu_plan *pl)
{
    return (int64_t)p->heads_kv * pl->cols * (p->dim + 2);
}

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


/* Points h's prefetch hint (kernels.h: fa_cpu_heads.pf) at rows [j, j + n) of t, as far as
 * they lie in one run of its pages. The rows must exist. */
static void hint_rows(fa_cpu_heads *h, const fa_problem *p, const fa_tensor *t, const fa_cpu_cols *cc,
                      int64_t j, int32_t n)
{
    int32_t run;
    const int64_t e = fa_dtype_bytes(t->dtype);
    h->pf = fa_cpu_kv_row(p, t, cc, j, &run);
    h->pf_n = run < n ? run : n;
    h->pf_ld = t->stride_seq * e, h->pf_kv = t->stride_head * e, h->pf_row = p->dim * e;
}

/* A task's walk over the keys [c0, c1) of its chunk into o, m and l of every head's columns
 * from the packed queries, the probabilities of column c times scale[c] when scale is given. */
static void walk(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl,
                 const fa_cpu_cols *cc, int64_t c0, int64_t c1, dbufs *bf, const float *scale)
{
    const fa_attention_desc *d = p->desc;
    const int32_t dim = p->dim, cols = pl->cols, heads = pl->decode_heads;
    const int32_t gv = group_cols_vec(kern, pl), tile = tile_keys(kern, pl);
    for (int32_t c = 0; c < gv; c++) {
        bf->m[c] = -INFINITY;
        bf->l[c] = 0.0f;
    }
    memset(bf->o, 0, sizeof(float) * (size_t)heads * (size_t)cols * (size_t)dim);
    /* head h's columns start at h * cols in the score tile and the statistics */
    fa_cpu_heads hk = { heads, (ptrdiff_t)cols * dim, d->k.stride_head, cols, (ptrdiff_t)cols * dim,
                        cols, NULL, 0, 0, 0, 0 };
    fa_cpu_heads hv = hk;
    hv.kv = d->v.stride_head;
    /* Several query columns a kv head (GQA, speculative rows) make a key's arithmetic longer
     * than its trip from memory, and the two ran one after the other: the dot pass prefetches
     * the same keys' V rows into L2 and the axpy pass the next tile's K rows (GQA 32/8 decode
     * 10% faster on a Zen 4 guest, docs/perf/cpu-decode.md); one column a head (MHA decode)
     * streams at the read rate without them. */
    const int hints = cc->ncols > 1;
    /* f16 probabilities only where the output's own f16 rounding is as large, and at most 1
     * (no dropout's 1 / (1 - p)): kernels.h */
    fa_cpu_axpy_fn *const axpy = kern->axpy_f16p && d->v.dtype == FA_DTYPE_F16 && d->o.dtype == FA_DTYPE_F16 &&
                                         p->dropout_p == 0.0f
                                     ? kern->axpy_f16p
                                     : kern->axpy;

    for (int64_t j0 = c0; j0 < c1; j0 += tile) {
        int32_t n = (int32_t)(c1 - j0 < tile ? c1 - j0 : tile);
        int full = fa_cpu_tile_full(p, cc, j0, j0 + n);
        for (int32_t j = 0, run; j < n; j += run) { /* page by page in a paged cache */
            const char *kp = fa_cpu_kv_row(p, &d->k, cc, j0 + j, &run);
            run = run < n - j ? run : n - j;
            if (hints)
                hint_rows(&hk, p, &d->v, cc, j0 + j, run);
            kern->dot(d->k.dtype, &hk, cc->ncols, run, dim, bf->q, dim, kp, d->k.stride_seq,
                      bf->st + (int64_t)j * gv, gv);
        }
        if (p->softcap > 0.0f) /* one call over every head's columns, padding included */
            kern->softcap(n, gv, bf->st, gv, p->softcap);
        for (int32_t h = 0; h < heads; h++)
            fa_cpu_mask(p, cc, j0, n, bf->st + h * cols, gv, full);
        kern->softmax_update(n, gv, bf->st, gv, bf->m, bf->l, bf->alpha);
        if (p->dropout_p > 0.0f) /* every head's columns in one call */
            kern->dropout_apply(n, gv, bf->st, gv, p->dropout_seed, p->dropout_offset, cc->b, bf->ids,
                                bf->ids + gv, j0, p->dropout_threshold, p->dropout_scale);
        if (scale)
            fa_cpu_scale_cols(n, gv, bf->st, gv, scale);
        for (int32_t j = 0, run; j < n; j += run) { /* the rescale once, with the first page */
            const char *vp = fa_cpu_kv_row(p, &d->v, cc, j0 + j, &run);
            run = run < n - j ? run : n - j;
            hv.pf = NULL;
            if (hints && j0 + tile + j < c1) {
                const int64_t left = c1 - (j0 + tile + j);
                hint_rows(&hv, p, &d->k, cc, j0 + tile + j, left < run ? (int32_t)left : run);
            }
            axpy(d->v.dtype, &hv, cc->ncols, run, dim, bf->st + (int64_t)j * gv, gv, vp,
                 d->v.stride_seq, bf->o, dim, j ? bf->ones : bf->alpha);
        }
    }
}

static void run_task(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl,
                     int32_t b, int64_t chunk, int32_t h0, float *slot, dbufs *bf)
{
    const int32_t dim = p->dim, cols = pl->cols, heads = pl->decode_heads;
    const int32_t gv = group_cols_vec(kern, pl);
    const float qmul = p->softcap > 0.0f ? p->scale : p->scale * FA_LOG2E;
    fa_cpu_cols cc = seq_cols(p, b, h0);
    if (cc.ncols == 0)
        return;
    int64_t lo, hi;
    fa_cpu_decode_chunks(p, pl, b, &lo, &hi);
    int64_t c0 = lo + chunk * pl->block_k, c1 = c0 + pl->block_k < hi ? c0 + pl->block_k : hi;

    for (int32_t h = 0; h < heads; h++) {
        cc.hk = h0 + h;
        fa_cpu_pack_q(kern, p, &cc, cc.ncols, 0, qmul, bf->q + (int64_t)h * cols * dim, bf->tmp);
    }
    cc.hk = h0;
    for (int32_t c = 0; p->dropout_p > 0.0f && c < gv; c++) { /* column h*cols + i: head, row */
        int32_t h = c / cols < heads ? c / cols : heads - 1, i = c % cols;
        i = i < cc.ncols ? i : cc.ncols - 1;
        bf->ids[c] = (h0 + h) * p->group + i % p->group;
        bf->ids[gv + c] = i / p->group;
    }
    /* a chunk's statistics with a raised base are merged like any other */
    const int e = fa_cpu_redo_shift(p, cc.seq.k_len);
    walk(kern, p, pl, &cc, c0, c1, bf, NULL);
    if (fa_cpu_overflowed(heads * cols, gv, dim, bf->o, dim, bf->l, e, bf->scale)) {
        walk(kern, p, pl, &cc, c0, c1, bf, bf->scale);
        fa_cpu_raise_base(gv, bf->scale, e, bf->m, bf->l);
    }
    for (int32_t h = 0; h < heads; h++) {
        float *dst = slot + (int64_t)(h0 + h) * cols * (dim + 2);
        memcpy(dst, bf->m + h * cols, sizeof(float) * (size_t)cc.ncols);
        memcpy(dst + cols, bf->l + h * cols, sizeof(float) * (size_t)cc.ncols);
        memcpy(dst + 2 * cols, bf->o + (int64_t)h * cols * dim,
               sizeof(float) * (size_t)cc.ncols * (size_t)dim);
    }
}

/* Column c of (b, hk) summed over its chunks into out (dim floats) in units of the base mx,
 * each chunk's weight times scale; returns the sum of the weights times the chunks' sums. */
static float merge_col(const fa_problem *p, const fa_cpu_plan *pl, int32_t hk, const float *slots,
                       int64_t nch, int32_t c, float mx, float scale, float *out)
{
    const int32_t dim = p->dim, cols = pl->cols;
    const int64_t slot_floats = fa_cpu_decode_slot_floats(p, pl);
    float sum = 0.0f;
    memset(out, 0, sizeof(float) * (size_t)dim);
    for (int64_t k = 0; mx > -INFINITY && k < nch; k++) {
        const float *h = slots + k * slot_floats + (int64_t)hk * cols * (dim + 2);
        if (h[c] == -INFINITY)
            continue;
        float w = exp2f(h[c] - mx);
        sum += w * h[cols + c];
        w *= scale;
        const float *oc = h + 2 * cols + (int64_t)c * dim;
        for (int32_t x = 0; x < dim; x++)
            out[x] += w * oc[x];
    }
    return sum;
}

/* Combine the chunks of (b, hk) in chunk order and write o and lse. The chunks' outputs add
 * up like a task's keys, so a column whose sum overflowed is summed again scaled down (cpu.h:
 * sums past float32). */
static void merge(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl, int32_t b,
                  int32_t hk, const float *slots, int64_t nch, dbufs *bf)
{
    const int32_t dim = p->dim, cols = pl->cols;
    const int64_t slot_floats = fa_cpu_decode_slot_floats(p, pl);
    fa_cpu_cols cc = seq_cols(p, b, hk);
    const int e = fa_cpu_redo_shift(p, cc.seq.k_len);
    float *acc = bf->o, *m = bf->m, *l = bf->l;
    for (int32_t c = 0; c < cc.ncols; c++) {
        float mx = -INFINITY, *out = acc + (int64_t)c * dim;
        int bad = 0; /* a chunk's NaN statistics (a NaN score) make the column NaN, as in one pass */
        for (int64_t k = 0; k < nch; k++) {
            const float *h = slots + k * slot_floats + (int64_t)hk * cols * (dim + 2);
            mx = fmaxf(mx, h[c]);
            bad |= isnan(h[c]) || isnan(h[cols + c]);
        }
        l[c] = merge_col(p, pl, hk, slots, nch, c, mx, 1.0f, out);
        l[c] = bad ? NAN : l[c];
        m[c] = mx;
        if (fa_cpu_overflowed(1, 1, dim, out, dim, l + c, e, bf->scale)) {
            merge_col(p, pl, hk, slots, nch, c, mx, bf->scale[0], out);
            fa_cpu_raise_base(1, bf->scale, e, m + c, l + c);
        }
    }
    fa_cpu_store_out(kern, p, &cc, acc, dim, m, l);
}

/* One call's decode: its tasks (sequence, chunk, head group), then the merges. */
typedef struct decode_job {
    const fa_cpu_kernels *kern;
    const fa_problem *p;
    const fa_cpu_plan *pl;
    float *ws;
    size_t per;
    float *slots;
    int64_t slot_floats;
    const int64_t *first;
    const int32_t *slot_b;
    int32_t groups;
    int64_t tasks; /* the call's own (sequence, chunk, head group) count */
} decode_job;

/* The loops of thread tid; inside a parallel region the iterations are shared out, outside
 * one (a single thread) they all run here. */
static void decode_tasks(const decode_job *j, int tid)
{
    const fa_problem *p = j->p;
    const int64_t nt = j->tasks, pairs = (int64_t)p->batch * p->heads_kv;
    dbufs bf;
    carve(j->kern, p, j->pl, j->ws + (size_t)tid * j->per, &bf);
    for (int32_t c = 0; c < group_cols_vec(j->kern, j->pl); c++)
        bf.ones[c] = 1.0f;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < nt; t++) {
        int64_t sl = t / j->groups;
        int32_t b = j->slot_b[sl];
        run_task(j->kern, p, j->pl, b, sl - j->first[b], (int32_t)(t % j->groups) * j->pl->decode_heads,
                 j->slots + sl * j->slot_floats, &bf);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < pairs; i++) {
        int32_t b = (int32_t)(i / p->heads_kv), hk = (int32_t)(i % p->heads_kv);
        merge(j->kern, p, j->pl, b, hk, j->slots + j->first[b] * j->slot_floats,
              j->first[b + 1] - j->first[b], &bf);
    }
}

/* bytes rounded up to whole 64-byte lines */
static size_t lines(size_t bytes) { return (bytes + 63) / 64 * 64; }

fa_status fa_cpu_decode_forward(fa_context_t ctx, fa_cpu_state *s, const fa_problem *p,
                                const fa_cpu_plan *pl)
{
    const fa_cpu_kernels *kern = s->kern;
    const int32_t groups = p->heads_kv / pl->decode_heads;
    int64_t nslots = 0; /* one per (sequence, chunk): the call's own (a paged plan's is a bound) */
    int64_t work = 0;   /* score elements, for the thread count (flash.c's rule) */
    for (int32_t b = 0; b < p->batch; b++) {
        int64_t lo, hi;
        nslots += fa_cpu_decode_chunks(p, pl, b, &lo, &hi);
        work += (hi > lo ? hi - lo : 0) * fa_problem_seq(p, b).q_len * p->heads_q;
    }
    const int64_t slot_floats = fa_cpu_decode_slot_floats(p, pl);
    size_t per = (size_t)pl->per_thread_floats;
    /* the thread buffers, the chunks' partial results and two index arrays, in the context's
     * scratch (sizes checked against overflow by the planner's workspace count) */
    const size_t b_ws = lines((size_t)pl->threads * per * sizeof(float));
    const size_t b_slots = lines((size_t)nslots * (size_t)slot_floats * sizeof(float));
    const size_t b_first = lines(sizeof(int64_t) * ((size_t)p->batch + 1));
    const size_t need = b_ws + b_slots + b_first + lines(sizeof(int32_t) * (size_t)(nslots ? nslots : 1));
    if (need > s->scratch_bytes) {
        void *grown = fa_alloc_aligned(need);
        if (!grown)
            return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating %llu bytes of workspace",
                            (unsigned long long)pl->workspace_bytes);
        free(s->scratch);
        s->scratch = grown;
        s->scratch_bytes = need;
    }
    fa_status st;
    if (p->paged && p->paged->append && (st = fa_cpu_append_rows(ctx, s, p)) != FA_OK)
        return st;
    char *at = s->scratch;
    float *ws = (float *)at, *slots = (float *)(at + b_ws);
    int64_t *first = (int64_t *)(at + b_ws + b_slots);
    int32_t *slot_b = (int32_t *)(at + b_ws + b_slots + b_first);
    /* Padded score columns are read by the softmax: keep them finite. */
    memset(ws, 0, (size_t)pl->threads * per * sizeof(float));
    first[0] = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        int64_t lo, hi, n = fa_cpu_decode_chunks(p, pl, b, &lo, &hi);
        first[b + 1] = first[b] + n;
        for (int64_t k = first[b]; k < first[b + 1]; k++)
            slot_b[k] = b;
    }
    const decode_job job = { kern, p, pl, ws, per, slots, slot_floats, first, slot_b, groups,
                             first[p->batch] * groups };
    if (pl->threads == 1 || work < FA_CPU_ONE_THREAD_SCORES || job.tasks < 2) {
        /* one thread: no parallel region (entering even a one-thread region costs a futex
         * call per region in libgomp, a measurable share of a small model's decode step;
         * thread 0's buffers serve: the same bits for any thread count) */
        decode_tasks(&job, 0);
        return FA_OK;
    }
#pragma omp parallel num_threads(pl->threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        decode_tasks(&job, tid);
    }
    return FA_OK;
}
