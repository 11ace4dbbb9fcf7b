/* SPDX-License-Identifier: MIT */
/*
 * Attention backward on the CPU, deterministic for any thread count.
 *
 * With P = softmax probabilities (recomputed from q, k and the forward's
 * LSE), Z = dropout keep mask / (1 - p) and D_i = dO_i . O_i:
 *   dV = (P*Z)^T dO,  dP = dO V^T,  dS = P * (dP*Z - D) [* softcap'],
 *   dQ = scale dS K,  dK = scale dS^T Q.
 * Two passes, each the only writer of its outputs, so no accumulation races:
 *   pass A, one task per (sequence, kv head, block of keys): dK, dV for those
 *           keys, walking every query tile (all heads of the GQA group) that
 *           sees them;
 *   pass B, one task per (sequence, kv head, block of queries): dQ, walking
 *           the key tiles, as the forward does.
 * S, P and dP are computed in both: 7 tile products instead of the 5 of an
 * accumulate-with-atomics backward. The standard backward (the baseline) is
 * pass A with one block holding every key and every query of a sequence:
 * it materialises the whole S, P and dP and produces dQ in the same sweep.
 */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif


/* Per-thread tiles. Rows of K/V-shaped tiles are dim_pad floats; score
 * tiles are keys x cols_pad, transposed as in the forward. */
typedef struct bbufs {
    float *k, *v;        /* kt x dpad: key / value rows of the tile */
    float *dk, *dv;      /* kt x dpad: pass A accumulators */
    float *qt, *dot;     /* cols_pad x dim, nr-wide transposed panels: scaled q, dO */
    float *qr, *dor;     /* cols_pad x dpad rows: scale*q (for dK), dO (for dV) */
    float *dq;           /* cols_pad x dpad: dQ accumulator */
    float *s, *dp, *cap; /* kt x cols_pad: scores then P, dP then dS, capped scores */
    float *z;            /* kt x cols_pad: dropout factors (0 or 1/(1-p)) */
    float *lse2, *dd;    /* cols_pad: base-2 LSE (+inf: no visible key), D */
    float *ones;         /* cols_pad: alpha = 1 for accumulating gemms */
    float *tmp;          /* dim */
    int32_t *ids;        /* 2 x cols_pad: dropout heads and rows of the columns */
} bbufs;

static int64_t carve(const fa_problem *p, const fa_cpu_plan *pl, int32_t kt, int32_t cols_pad,
                     float *base, bbufs *b)
{
    const int64_t dpad = pl->dim_pad, dim = p->dim, tile = (int64_t)kt * cols_pad;
    int64_t n = 0;
    bbufs scratch, *o = b ? b : &scratch;
    o->k = fa_ws_take(base, &n, kt * dpad);
    o->v = fa_ws_take(base, &n, kt * dpad);
    o->dk = fa_ws_take(base, &n, kt * dpad);
    o->dv = fa_ws_take(base, &n, kt * dpad);
    o->qt = fa_ws_take(base, &n, cols_pad * dim);
    o->dot = fa_ws_take(base, &n, cols_pad * dim);
    o->qr = fa_ws_take(base, &n, cols_pad * dpad);
    o->dor = fa_ws_take(base, &n, cols_pad * dpad);
    o->dq = fa_ws_take(base, &n, cols_pad * dpad);
    o->s = fa_ws_take(base, &n, tile);
    o->dp = fa_ws_take(base, &n, tile);
    o->cap = fa_ws_take(base, &n, p->softcap > 0.0f ? tile : 0);
    o->z = fa_ws_take(base, &n, p->dropout_p > 0.0f ? tile : 0);
    o->lse2 = fa_ws_take(base, &n, cols_pad);
    o->dd = fa_ws_take(base, &n, cols_pad);
    o->ones = fa_ws_take(base, &n, cols_pad > kt ? cols_pad : kt);
    o->tmp = fa_ws_take(base, &n, dim);
    o->ids = (int32_t *)fa_ws_take(base, &n, 2 * (int64_t)cols_pad);
    return n;
}

/* Query positions per pass-A tile: a constant, so dK/dV sum their tiles in
 * the same order whatever the thread count. */
static int32_t pass_a_positions(const fa_problem *p)
{
    int32_t pos = 128 / p->group;
    return pos < 1 ? 1 : pos;
}

static int32_t round_up(int32_t x, int32_t m) { return (x + m - 1) / m * m; }

/* Columns' base-2 LSE and D = dO . O, gathered for a block of query columns. */
static void load_row_stats(const fa_problem *p, const fa_cpu_cols *cc, const float *dsum, bbufs *bf,
                           int32_t cols_pad)
{
    const fa_attention_desc *d = p->desc;
    for (int32_t c = 0; c < cols_pad; c++) {
        if (c >= cc->ncols) {
            bf->lse2[c] = INFINITY;
            bf->dd[c] = 0.0f;
            continue;
        }
        int64_t row = cc->seq.q_start + cc->r0 + c / p->group;
        int32_t h = cc->hk * p->group + c % p->group;
        float lse = d->lse[(p->varlen ? 0 : (int64_t)cc->b * p->lse_sb) + (int64_t)h * p->lse_sh +
                           row * p->lse_ss];
        bf->lse2[c] = lse == -INFINITY ? INFINITY : lse * FA_LOG2E;
        int64_t packed = p->varlen ? row : (int64_t)cc->b * d->seqlen_q + row;
        bf->dd[c] = dsum[packed * p->heads_q + h];
    }
}

/*
 * One tile: keys [j0, j0+n) (rows of bf->k / bf->v) against the block's
 * query columns (bf->qt, bf->dot, lse2, dd loaded). Leaves dS^T in bf->dp
 * and P*Z^T in bf->s.
 */
static void tile_grads(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl,
                       const fa_cpu_cols *cc, int64_t j0, int32_t n, int32_t cols_pad, bbufs *bf)
{
    const int32_t dim = p->dim, dpad = pl->dim_pad, mr = kern->mr, nr = kern->nr;
    const int32_t cv = round_up(cc->ncols > 0 ? cc->ncols : 1, nr / 2), lds = cols_pad;
    /* S^T = K Q^T and dP^T = V dO^T */
    for (int32_t c0 = 0; c0 < cols_pad; c0 += nr)
        for (int32_t i0 = 0; i0 < n; i0 += mr) {
            int32_t m = n - i0 < mr ? n - i0 : mr;
            kern->gemm(m, dim, bf->k + (int64_t)i0 * dpad, dpad, 1, bf->qt + (int64_t)c0 * dim, nr,
                       bf->s + (int64_t)i0 * lds + c0, lds, NULL);
            kern->gemm(m, dim, bf->v + (int64_t)i0 * dpad, dpad, 1, bf->dot + (int64_t)c0 * dim, nr,
                       bf->dp + (int64_t)i0 * lds + c0, lds, NULL);
        }
    if (p->softcap > 0.0f) {
        kern->softcap(n, cv, bf->s, lds, p->softcap);
        memcpy(bf->cap, bf->s, sizeof(float) * (size_t)n * (size_t)lds);
    }
    fa_cpu_mask(p, cc, j0, n, bf->s, lds, fa_cpu_tile_full(p, cc, j0, j0 + n));
    kern->exp2_sub(n, cv, bf->s, lds, bf->lse2); /* P^T */

    /* dS = P * (dP Z - D) [* (1 - tanh^2)], and P Z for dV */
    if (p->dropout_p > 0.0f) { /* Z: 1/(1-p) where kept, 0 where dropped */
        for (int32_t j = 0; j < n; j++)
            for (int32_t c = 0; c < cv; c++)
                bf->z[(int64_t)j * lds + c] = 1.0f;
        fa_cpu_dropout(kern, p, cc, j0, n, bf->z, lds, cv, bf->ids);
    }
    const float inv_capl = p->softcap > 0.0f ? 1.0f / (p->softcap * FA_LOG2E) : 0.0f;
    for (int32_t j = 0; j < n; j++) {
        float *restrict s = bf->s + (int64_t)j * lds, *restrict dp = bf->dp + (int64_t)j * lds;
        const float *restrict dd = bf->dd;
        if (p->dropout_p > 0.0f) {
            const float *restrict z = bf->z + (int64_t)j * lds;
            for (int32_t c = 0; c < cv; c++)
                dp[c] *= z[c];
        }
        for (int32_t c = 0; c < cv; c++)
            dp[c] = s[c] * (dp[c] - dd[c]);
        if (p->softcap > 0.0f) {
            const float *restrict cap = bf->cap + (int64_t)j * lds;
            for (int32_t c = 0; c < cv; c++) {
                float t = cap[c] * inv_capl;
                dp[c] *= 1.0f - t * t;
            }
        }
        if (p->dropout_p > 0.0f) {
            const float *restrict z = bf->z + (int64_t)j * lds;
            for (int32_t c = 0; c < cv; c++)
                s[c] *= z[c];
        }
        /* padded columns carry no gradient */
        for (int32_t c = cc->ncols; c < cols_pad; c++)
            s[c] = dp[c] = 0.0f;
    }
}

static void store_rows(const fa_cpu_kernels *kern, const fa_problem *p, const fa_tensor *t, int32_t b,
                       int64_t row0, int32_t n, int32_t h, const float *src, int32_t ld, float mul)
{
    for (int32_t j = 0; j < n; j++)
        kern->store(t->dtype, src + (int64_t)j * ld,
                    (char *)fa_elem_ptr(t, fa_row_offset(p, t, b, row0 + j, h)), p->dim, mul);
}

/* Pass A: dK, dV of keys [k0, k1) of (b, hk); with_dq: this task owns every key, so it may
 * also accumulate dQ (the standard backward). */
static void pass_a(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl, int32_t b,
                   int32_t hk, int64_t k0, int32_t kn, int32_t qpos, int with_dq, const float *dsum,
                   bbufs *bf)
{
    const fa_attention_desc *d = p->desc;
    const fa_backward_desc *bd = p->bwd;
    const int32_t dim = p->dim, dpad = pl->dim_pad, mr = kern->mr, nr = kern->nr;
    const int32_t cols_pad = round_up(qpos * p->group, nr), lds = cols_pad;
    const float qmul = p->softcap > 0.0f ? p->scale : p->scale * FA_LOG2E;
    fa_cpu_cols cc = { b, hk, fa_problem_seq(p, b), 0, 0, 0 };

    fa_cpu_load_rows(kern, p, &d->k, &cc, k0, kn, dpad, bf->k);
    fa_cpu_load_rows(kern, p, &d->v, &cc, k0, kn, dpad, bf->v);
    memset(bf->dk, 0, sizeof(float) * (size_t)kn * (size_t)dpad);
    memset(bf->dv, 0, sizeof(float) * (size_t)kn * (size_t)dpad);
    for (int32_t i = 0; i < (cols_pad > kn ? cols_pad : kn); i++)
        bf->ones[i] = 1.0f;

    /* query rows that see any of these keys, on a fixed grid of qpos */
    int64_t lo, hi;
    fa_problem_query_range(p, &cc.seq, k0, k0 + kn, &lo, &hi);
    lo = lo / qpos * qpos;
    if (with_dq) { /* every dQ row is written, seen keys or not */
        lo = 0;
        hi = cc.seq.q_len;
    }
    for (int64_t r0 = lo; r0 < hi; r0 += qpos) {
        cc.r0 = r0;
        cc.npos = (int32_t)(cc.seq.q_len - r0 < qpos ? cc.seq.q_len - r0 : qpos);
        cc.ncols = cc.npos * p->group;
        fa_cpu_pack_cols(kern, p, &d->q, &cc, cols_pad, 1, dim, qmul, NULL, bf->qt, bf->tmp);
        fa_cpu_pack_cols(kern, p, &bd->d_o, &cc, cols_pad, 1, dim, 1.0f, NULL, bf->dot, bf->tmp);
        fa_cpu_pack_cols(kern, p, &d->q, &cc, cols_pad, 0, dpad, p->scale, NULL, bf->qr, bf->tmp);
        fa_cpu_pack_cols(kern, p, &bd->d_o, &cc, cols_pad, 0, dpad, 1.0f, NULL, bf->dor, bf->tmp);
        load_row_stats(p, &cc, dsum, bf, cols_pad);
        tile_grads(kern, p, pl, &cc, k0, kn, cols_pad, bf);
        /* dV += (P Z)^T dO and dK += dS^T (scale Q): keys down, over the tile's columns */
        for (int32_t i0 = 0; i0 < kn; i0 += mr) {
            int32_t m = kn - i0 < mr ? kn - i0 : mr;
            for (int32_t c0 = 0; c0 < dpad; c0 += nr) {
                kern->gemm(m, cc.ncols, bf->s + (int64_t)i0 * lds, lds, 1, bf->dor + c0, dpad,
                           bf->dv + (int64_t)i0 * dpad + c0, dpad, bf->ones);
                kern->gemm(m, cc.ncols, bf->dp + (int64_t)i0 * lds, lds, 1, bf->qr + c0, dpad,
                           bf->dk + (int64_t)i0 * dpad + c0, dpad, bf->ones);
            }
        }
        if (with_dq) { /* dQ = dS K: this task owns all keys of the sequence */
            memset(bf->dq, 0, sizeof(float) * (size_t)cols_pad * (size_t)dpad);
            for (int32_t i0 = 0; i0 < cc.ncols; i0 += mr)
                for (int32_t c0 = 0; c0 < dpad; c0 += nr)
                    kern->gemm(cc.ncols - i0 < mr ? cc.ncols - i0 : mr, kn, bf->dp + i0, 1, lds,
                               bf->k + c0, dpad, bf->dq + (int64_t)i0 * dpad + c0, dpad, NULL);
            for (int32_t c = 0; c < cc.ncols; c++)
                store_rows(kern, p, &bd->d_q, b, cc.seq.q_start + cc.r0 + c / p->group, 1,
                           hk * p->group + c % p->group, bf->dq + (int64_t)c * dpad, dpad, p->scale);
        }
    }
    store_rows(kern, p, &bd->d_k, b, cc.seq.k_start + k0, kn, hk, bf->dk, dpad, 1.0f);
    store_rows(kern, p, &bd->d_v, b, cc.seq.k_start + k0, kn, hk, bf->dv, dpad, 1.0f);
}

/* Pass B: dQ of a block of query columns, walking the key tiles. */
static void pass_b(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_plan *pl,
                   const fa_cpu_task *t, const float *dsum, bbufs *bf)
{
    const fa_attention_desc *d = p->desc;
    const fa_backward_desc *bd = p->bwd;
    const int32_t dim = p->dim, dpad = pl->dim_pad, mr = kern->mr, nr = kern->nr;
    const int32_t cols_pad = pl->cols_pad, lds = cols_pad;
    const float qmul = p->softcap > 0.0f ? p->scale : p->scale * FA_LOG2E;
    fa_cpu_cols cc = fa_cpu_task_cols(p, pl, t);

    fa_cpu_pack_cols(kern, p, &d->q, &cc, cols_pad, 1, dim, qmul, NULL, bf->qt, bf->tmp);
    fa_cpu_pack_cols(kern, p, &bd->d_o, &cc, cols_pad, 1, dim, 1.0f, NULL, bf->dot, bf->tmp);
    load_row_stats(p, &cc, dsum, bf, cols_pad);
    memset(bf->dq, 0, sizeof(float) * (size_t)cols_pad * (size_t)dpad);
    for (int32_t i = 0; i < cols_pad; i++)
        bf->ones[i] = 1.0f;

    int64_t lo, hi;
    fa_problem_key_range(p, &cc.seq, cc.r0, cc.r0 + cc.npos, &lo, &hi);
    for (int64_t j0 = lo / pl->block_k * pl->block_k; j0 < hi; j0 += pl->block_k) {
        int32_t n = (int32_t)(hi - j0 < pl->block_k ? hi - j0 : pl->block_k);
        fa_cpu_load_rows(kern, p, &d->k, &cc, j0, n, dpad, bf->k);
        fa_cpu_load_rows(kern, p, &d->v, &cc, j0, n, dpad, bf->v);
        tile_grads(kern, p, pl, &cc, j0, n, cols_pad, bf);
        for (int32_t i0 = 0; i0 < cc.ncols; i0 += mr)
            for (int32_t c0 = 0; c0 < dpad; c0 += nr)
                kern->gemm(cc.ncols - i0 < mr ? cc.ncols - i0 : mr, n, bf->dp + i0, 1, lds,
                           bf->k + c0, dpad, bf->dq + (int64_t)i0 * dpad + c0, dpad, bf->ones);
    }
    for (int32_t c = 0; c < cc.ncols; c++)
        store_rows(kern, p, &bd->d_q, cc.b, cc.seq.q_start + cc.r0 + c / p->group, 1,
                   cc.hk * p->group + c % p->group, bf->dq + (int64_t)c * dpad, dpad, p->scale);
}

/* D_i = dO_i . O_i for every packed row and query head. */
static void row_dots(const fa_cpu_kernels *kern, const fa_problem *p, float *dsum, float *tmp)
{
    const fa_attention_desc *d = p->desc;
    const fa_backward_desc *bd = p->bwd;
    /* varlen: rows past the last sequence belong to no one and are never read */
    const int64_t rows = p->varlen ? d->cu_seqlens_q[p->batch] : (int64_t)p->batch * d->seqlen_q;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int32_t b = p->varlen ? 0 : (int32_t)(r / d->seqlen_q);
        int64_t row = p->varlen ? r : r % d->seqlen_q;
        for (int32_t h = 0; h < p->heads_q; h++) {
            kern->load(d->o.dtype, fa_elem_ptr(&d->o, fa_row_offset(p, &d->o, b, row, h)), tmp,
                       p->dim, 1.0f);
            kern->load(bd->d_o.dtype, fa_elem_ptr(&bd->d_o, fa_row_offset(p, &bd->d_o, b, row, h)),
                       tmp + p->dim, p->dim, 1.0f);
            float s = 0.0f;
            for (int32_t x = 0; x < p->dim; x++)
                s += tmp[x] * tmp[p->dim + x];
            dsum[r * p->heads_q + h] = s;
        }
    }
}

/* Workspace and task counts of a backward plan (flash or standard). */
typedef struct bplan {
    int32_t kt, cols_pad, qpos;
    int64_t a_tasks, per_thread;
} bplan;

/* 0, or -1 when the standard backward's whole-sequence tiles cannot be sized. */
static int plan_backward(const fa_problem *p, const fa_cpu_plan *pl, int standard, int32_t nr,
                         bplan *bp)
{
    bp->qpos = standard ? (p->max_q > 0 ? p->max_q : 1) : pass_a_positions(p);
    bp->kt = standard ? (p->max_k > 0 ? p->max_k : 1) : pl->block_k;
    if ((int64_t)bp->qpos * p->group > (1 << 28))
        return -1;
    int32_t a_cols = round_up(bp->qpos * p->group, nr);
    bp->cols_pad = a_cols > pl->cols_pad ? a_cols : pl->cols_pad;
    bp->a_tasks = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        int64_t k = fa_problem_seq(p, b).k_len;
        bp->a_tasks += standard ? 1 : (k + bp->kt - 1) / bp->kt;
    }
    bp->a_tasks *= p->heads_kv;
    bp->per_thread = carve(p, pl, bp->kt, bp->cols_pad, NULL, NULL) + 2 * (int64_t)p->dim;
    return 0;
}

fa_status fa_cpu_plan_backward(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                               fa_cpu_plan *pl)
{
    /* dQ tasks cut query rows as the forward does; decode shapes too walk key tiles */
    fa_cpu_plan_columns(s, p, pl);
    pl->use_dot = 0;
    int standard = p->desc->algorithm == FA_ALGORITHM_STANDARD;
    bplan bp;
    if (plan_backward(p, pl, standard, s->kern->nr, &bp) != 0)
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW,
                        "standard backward tiles for this shape overflow; use the flash algorithm");
    /* threads: no more than the passes have tasks (the standard one has few, and
     * each thread holds whole-sequence tiles) */
    int64_t most = standard ? bp.a_tasks : bp.a_tasks > pl->task_count ? bp.a_tasks : pl->task_count;
    pl->threads = s->threads < most ? s->threads : (int)(most > 0 ? most : 1);
    int64_t rows = p->varlen ? p->desc->seqlen_q : (int64_t)p->batch * p->desc->seqlen_q, bytes;
    if (!fa_mul_ok(bp.per_thread, (int64_t)pl->threads * 4, &bytes) ||
        !fa_add_ok(bytes, rows * p->heads_q * 4, &bytes))
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "backward workspace for this shape overflows");
    pl->per_thread_floats = bp.per_thread;
    pl->workspace_bytes = (uint64_t)bytes + (uint64_t)pl->task_count * sizeof(fa_cpu_task);
    return FA_OK;
}

fa_status fa_cpu_backward(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                          const fa_cpu_plan *pl)
{
    const fa_cpu_kernels *kern = s->kern;
    const int standard = p->desc->algorithm == FA_ALGORITHM_STANDARD;
    bplan bp;
    plan_backward(p, pl, standard, kern->nr, &bp); /* sized and checked by the plan */
    const int64_t rows = p->varlen ? p->desc->seqlen_q : (int64_t)p->batch * p->desc->seqlen_q;
    size_t per = (size_t)bp.per_thread;
    float *ws = fa_alloc_aligned((size_t)pl->threads * per * sizeof(float));
    float *dsum = fa_alloc_aligned((size_t)(rows * p->heads_q) * sizeof(float));
    fa_cpu_task *tasks = malloc((size_t)(pl->task_count ? pl->task_count : 1) * sizeof(*tasks));
    if (!ws || !dsum || !tasks) {
        free(ws);
        free(dsum);
        free(tasks);
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating %llu bytes of workspace",
                        (unsigned long long)pl->workspace_bytes);
    }
    memset(ws, 0, (size_t)pl->threads * per * sizeof(float));
    int64_t nb = standard ? 0 : fa_cpu_build_tasks(p, pl, tasks);
    /* pass A task i -> (b, hk, key block): blocks of each sequence, kv heads inside */
    int64_t *a_first = malloc(sizeof(int64_t) * ((size_t)p->batch + 1));
    int32_t *a_seq = malloc(sizeof(int32_t) * (size_t)(bp.a_tasks ? bp.a_tasks : 1));
    if (!a_first || !a_seq) {
        free(ws);
        free(dsum);
        free(tasks);
        free(a_first);
        free(a_seq);
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the task list");
    }
    a_first[0] = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        int64_t k = fa_problem_seq(p, b).k_len;
        a_first[b + 1] = a_first[b] + (standard ? 1 : (k + bp.kt - 1) / bp.kt) * p->heads_kv;
        for (int64_t t = a_first[b]; t < a_first[b + 1]; t++)
            a_seq[t] = b;
    }
#pragma omp parallel num_threads(pl->threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        bbufs bf;
        float *mine = ws + (size_t)tid * per;
        carve(p, pl, bp.kt, bp.cols_pad, mine, &bf);
        row_dots(kern, p, dsum, mine + per - 2 * (size_t)p->dim);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < bp.a_tasks; t++) {
            int32_t b = a_seq[t];
            int64_t local = t - a_first[b];
            int32_t hk = (int32_t)(local % p->heads_kv);
            int64_t k0 = standard ? 0 : (local / p->heads_kv) * bp.kt;
            int64_t klen = fa_problem_seq(p, b).k_len;
            int32_t kn = (int32_t)(klen - k0 < bp.kt ? klen - k0 : bp.kt);
            pass_a(kern, p, pl, b, hk, k0, kn, bp.qpos, standard, dsum, &bf);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < nb; t++)
            pass_b(kern, p, pl, &tasks[t], dsum, &bf);
    }
    free(ws);
    free(dsum);
    free(tasks);
    free(a_first);
    free(a_seq);
    return FA_OK;
}
