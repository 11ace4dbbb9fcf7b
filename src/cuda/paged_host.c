/* SPDX-License-Identifier: MIT */
/* The CUDA backend's paged calls: the plan (shape, split, workspace), pointer checks, launches. */
#include "state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Hopper forward's tiles (FA_CUDA_SM90_TILES): its loader takes keys from the pages. */
typedef struct sm90_row {
    int dim, keys, warpgroups;
} sm90_row;
#define FA_SM90_ROW(D, BN, NWG, ST, NQ) { D, BN, NWG },
static const sm90_row sm90_rows[] = { FA_CUDA_SM90_TILES(FA_SM90_ROW) };
#undef FA_SM90_ROW

typedef struct cuda_paged_plan {
    int dpad, bf16;
    int nq; /* decode kernel with 8 * nq packed rows (1, 2), or 0: 64-row tiles */
    int decode_sm90; /* nq on Hopper's decode kernel (its cache rows by bulk copies) */
    const sm90_row *sm90; /* not NULL: query tiles on the Hopper forward instead of 64-row tiles */
    int32_t split, max_splits;
    int grow; /* split grown per sequence (fa_cuda_seq_split): the default's */
    /* split partials, or the Hopper forward's rotated queries; from the context's pool on the
     * stream current at plan time */
    void *ws;
    size_t ws_bytes;
    cudaStream_t stream;
} cuda_paged_plan;

int32_t fa_cuda_paged_dpad(int32_t dim) { return dim <= 64 ? 64 : dim <= 128 ? 128 : 256; }

int fa_cuda_decode_nq(int64_t packed) { return packed <= 8 ? 1 : packed <= 16 ? 2 : 0; }

int fa_cuda_decode_sm90_fits(int32_t dim) { return dim % 8 == 0 && fa_cuda_paged_dpad(dim) <= 128; }

int fa_cuda_split_layout(const fa_problem *p, int64_t rows, int32_t split, int grow, int32_t *splits,
                         size_t *bytes)
{
    int64_t blocks, b = 0;
    *splits = fa_cuda_max_splits(split, grow, p->max_k);
    if (!fa_mul_ok((int64_t)p->batch * p->heads_kv, *splits, &blocks) || blocks > INT32_MAX ||
        (*splits > 1 && (!fa_mul_ok((int64_t)*splits * rows, (int64_t)p->heads_q * (p->dim + 2), &b) ||
                         !fa_mul_ok(b, 4, &b))))
        return 0;
    *bytes = (size_t)b;
    return 1;
}

static int aligned16(const void *ptr, int64_t a, int64_t b, int64_t c)
{
    return (uintptr_t)ptr % 16 == 0 && a % 8 == 0 && b % 8 == 0 && c % 8 == 0;
}

/* The pools' rows start on 16 bytes (NULL pools, a plan's bounds without them, count as
 * aligned: the run checks them). */
static int cache_aligned(const fa_kv_cache *c)
{
    return aligned16(c->k, c->k_stride_page, c->k_stride_token, c->k_stride_head) &&
           aligned16(c->v, c->v_stride_page, c->v_stride_token, c->v_stride_head);
}

/* Steps of many query rows go to the Hopper forward where it has the head_dim and the call
 * needs nothing it lacks: sinks, chosen splits, cache rows that are not whole 16-byte chunks
 * (the pools' starts checked here where the bounds give them, else at each run), a grid of
 * more than 2^31 - 1 query tiles. */
static const sm90_row *sm90_for(const cuda_state *s, const fa_problem *p, int nq, int dpad)
{
    const fa_paged_desc *d = p->paged->desc;
    if (!s->hopper || nq || d->sinks || d->kv_split || p->dim % 8 || !cache_aligned(&d->cache))
        return NULL;
    for (size_t i = 0; i < sizeof(sm90_rows) / sizeof(sm90_rows[0]); i++) {
        const int64_t rows = 64 * sm90_rows[i].warpgroups, tiles = ((int64_t)p->max_q + rows - 1) / rows;
        int64_t blocks;
        if (sm90_rows[i].dim == dpad)
            return fa_mul_ok(tiles * p->heads_q, p->batch, &blocks) && blocks <= INT32_MAX ? &sm90_rows[i] : NULL;
    }
    return NULL;
}

fa_status fa_cuda_paged_plan(fa_context_t ctx, void *state, const fa_problem *p, void **plan,
                             fa_run_info *info)
{
    cuda_state *s = state;
    const fa_paged_desc *d = p->paged->desc;
    if (p->in_dtype == FA_DTYPE_F32)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "cache.dtype: the CUDA backend computes in f16 or bf16 (float32 runs on the CPU "
                        "backend)");
    if (p->heads_q > 65535)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "num_heads_q (%d): the CUDA paged kernels take at most 65535 query heads",
                        (int)p->heads_q);
    cuda_paged_plan *pl = calloc(1, sizeof(*pl));
    if (!pl)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the plan");
    pl->dpad = fa_cuda_paged_dpad(p->dim);
    pl->bf16 = p->in_dtype == FA_DTYPE_BF16;
    pl->nq = fa_cuda_decode_nq((int64_t)p->max_q * p->group); /* a block's rows of one kv head */
    const int32_t whole = p->max_k < 16 ? 16 : (p->max_k + 15) / 16 * 16;
    pl->sm90 = sm90_for(s, p, pl->nq, pl->dpad);
    pl->decode_sm90 = pl->nq && s->hopper && fa_cuda_decode_sm90_fits(p->dim) && cache_aligned(&d->cache);
    pl->split = d->kv_split ? d->kv_split : pl->nq ? FA_CUDA_DECODE_SPLIT : whole;
    pl->grow = !d->kv_split && pl->nq;
    int64_t bytes = 0;
    const int rotated = pl->sm90 && p->paged->rope_dim; /* the queries, rotated, in the workspace */
    if (rotated && !fa_mul_ok((int64_t)d->total_q * p->heads_q, (int64_t)p->dim * 2, &bytes)) {
        free(pl);
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW,
                        "total_q (%d) x num_heads_q (%d) x head_dim (%d): the rotated queries' workspace "
                        "overflows 64 bits",
                        (int)d->total_q, (int)p->heads_q, (int)p->dim);
    }
    if (!fa_cuda_split_layout(p, p->desc->seqlen_q, pl->split, pl->grow, &pl->max_splits, &pl->ws_bytes)) {
        const int32_t splits = pl->max_splits;
        free(pl);
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW,
                        "batch (%d) x cache.num_heads (%d) x splits (%d) is too large a grid or workspace; "
                        "raise kv_split",
                        (int)p->batch, (int)p->heads_kv, (int)splits);
    }
    if (pl->sm90) /* no splits: the workspace holds the rotated queries, if any */
        pl->ws_bytes = (size_t)bytes;
    pl->stream = s->stream;
    if (pl->ws_bytes) {
        cudaError_t err = cudaMallocFromPoolAsync(&pl->ws, pl->ws_bytes, s->pool, s->stream);
        if (err != cudaSuccess) {
            const size_t n = pl->ws_bytes;
            cudaGetLastError();
            free(pl);
            return fa_error(ctx, err == cudaErrorMemoryAllocation ? FA_ERR_OUT_OF_MEMORY : FA_ERR_BACKEND,
                            "allocating %zu bytes of device workspace: %s", n, cudaGetErrorString(err));
        }
    }
    if (pl->sm90) {
        info->kernel = "paged-sm90";
        info->block_q = 64 * pl->sm90->warpgroups;
        info->block_k = pl->sm90->keys;
        info->threads = 128 * (pl->sm90->warpgroups + 1);
    } else {
        info->kernel = pl->decode_sm90 ? "paged-decode-sm90" : pl->nq ? "paged-decode" : "paged-rows";
        info->block_q = pl->nq ? 8 * pl->nq : 64;
        info->block_k = pl->split;
        info->threads = pl->decode_sm90 ? 256 : 128;
    }
    info->workspace_bytes = pl->ws_bytes;
    *plan = pl;
    return FA_OK;
}

void fa_cuda_paged_plan_free(void *state, void *plan)
{
    (void)state;
    cuda_paged_plan *pl = plan;
    if (pl && pl->ws)
        cudaFreeAsync(pl->ws, pl->stream);
    free(pl);
}

/* Every pointer of the call on the context's device. */
static fa_status check_pointers(fa_context_t ctx, const cuda_state *s, const fa_problem *p, int attention)
{
    const fa_paged_desc *d = p->paged->desc;
    const struct {
        const void *ptr;
        const char *name;
        int needed;
    } ps[] = { { d->q.data, "q.data", attention },
               { d->o.data, "o.data", attention },
               { d->lse, "lse", attention && d->lse },
               { d->sinks, "sinks", attention && d->sinks },
               { d->cache.k, "cache.k", 1 },
               { d->cache.v, "cache.v", 1 },
               { d->cu_seqlens_q, "cu_seqlens_q", 1 },
               { d->block_table, "block_table", 1 },
               { d->cache_seqlens, "cache_seqlens", 1 },
               { d->k_new.data, "k_new.data", p->paged->append },
               { d->v_new.data, "v_new.data", p->paged->append },
               { d->rope_cos, "rope_cos", p->paged->rope_dim != 0 },
               { d->rope_sin, "rope_sin", p->paged->rope_dim != 0 },
               { d->positions, "positions", p->paged->rope_dim != 0 && d->positions } };
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
        fa_status st;
        if (ps[i].needed && (st = fa_cuda_check_ptr(ctx, s, ps[i].ptr, ps[i].name)) != FA_OK)
            return st;
    }
    return FA_OK;
}

/* The kernels' parameters for p. */
static void fill(const fa_problem *p, fa_cuda_paged *k)
{
    const fa_paged_problem *pg = p->paged;
    const fa_paged_desc *d = pg->desc;
    memset(k, 0, sizeof(*k));
    fa_cuda_params *a = &k->a;
    a->q = (fa_cuda_view){ d->q.data, 0, d->q.stride_seq, d->q.stride_head, 0 };
    a->o = (fa_cuda_view){ d->o.data, 0, d->o.stride_seq, d->o.stride_head, d->o.dtype == FA_DTYPE_F32 };
    a->lse = d->lse;
    a->lse_sh = p->lse_sh;
    a->lse_ss = p->lse_ss;
    a->batch = p->batch;
    a->heads_q = p->heads_q;
    a->heads_kv = p->heads_kv;
    a->group = p->group;
    a->dim = p->dim;
    a->max_q = p->max_q;
    a->max_k = p->max_k;
    a->scale = p->scale;
    a->scale_log2 = p->scale * 1.4426950408889634f;
    a->softcap = p->softcap;
    a->cap_in = p->softcap > 0.0f ? p->scale / p->softcap : 0.0f;
    a->cap_out = p->softcap * 1.4426950408889634f;
    a->win_left = p->win_left;
    a->win_right = p->win_right;
    a->dropout_scale = 1.0f; /* no dropout in paged calls */
    const fa_kv_cache *c = &d->cache;
    a->k = (fa_cuda_view){ c->k, 0, 0, c->k_stride_head, 0 };
    a->v = (fa_cuda_view){ c->v, 0, 0, c->v_stride_head, 0 };
    a->cu_q = d->cu_seqlens_q;
    fa_cuda_pages *g = &a->pg;
    g->table = d->block_table;
    g->lens = d->cache_seqlens;
    g->bt_stride = pg->bt_stride;
    g->k_sp = c->k_stride_page, g->k_st = c->k_stride_token;
    g->v_sp = c->v_stride_page, g->v_st = c->v_stride_token;
    g->size = pg->page_size;
    g->shift = -1;
    for (int sh = 0; sh < 31 && g->shift < 0; sh++)
        if (pg->page_size == 1 << sh)
            g->shift = sh;
    g->num = pg->num_pages;
    g->max_pages = pg->max_pages;
    g->total_q = d->total_q;
    g->append = pg->append;
    k->kn = (fa_cuda_view){ d->k_new.data, 0, d->k_new.stride_seq, d->k_new.stride_head, 0 };
    k->vn = (fa_cuda_view){ d->v_new.data, 0, d->v_new.stride_seq, d->v_new.stride_head, 0 };
    k->positions = d->positions;
    k->rope_cos = d->rope_cos;
    k->rope_sin = d->rope_sin;
    k->sinks = d->sinks;
    k->rope_dim = pg->rope_dim;
    k->rope_max_pos = d->rope_max_pos;
    k->rope_neox = d->rope == FA_ROPE_NEOX;
    k->kv_aligned = p->dim % 8 == 0 && cache_aligned(c);
    const int rope_vec = p->dim % 8 == 0 && (!pg->rope_dim || (pg->rope_dim % 16 == 0 &&
                                                               (uintptr_t)d->rope_cos % 16 == 0 &&
                                                               (uintptr_t)d->rope_sin % 16 == 0));
    k->append_vec = rope_vec && k->kv_aligned &&
                    aligned16(d->k_new.data, d->k_new.stride_seq, d->k_new.stride_head, 0) &&
                    aligned16(d->v_new.data, d->v_new.stride_seq, d->v_new.stride_head, 0);
    k->rotate_vec = rope_vec && aligned16(d->q.data, d->q.stride_seq, d->q.stride_head, 0);
}

/* The Hopper forward over the pages: queries (rotated into the workspace where RoPE is on)
 * in query tiles of one head, keys gathered from the pages by its loader. */
static cudaError_t run_sm90(const cuda_state *s, fa_cuda_paged *k, const cuda_paged_plan *pl, cudaStream_t stream)
{
    fa_cuda_params a = k->a;
    a.pingpong = s->pingpong;
    a.rescale_slack = s->rescale_slack;
    fa_cuda_tma_paged(s->tma_encode, &a, pl->bf16, pl->sm90->keys, pl->dpad);
    if (k->rope_dim) {
        cudaError_t err = fa_cuda_paged_rotate_q(k, pl->bf16, pl->ws, stream);
        if (err != cudaSuccess)
            return err;
        a.q = (fa_cuda_view){ pl->ws, 0, (int64_t)a.heads_q * a.dim, a.dim, 0 };
    }
    a.aligned = aligned16(a.q.p, a.q.ss, a.q.sh, a.dim);
    a.o_vec = !a.o.f32 && aligned16(a.o.p, a.o.ss, a.o.sh, a.dim);
    return fa_cuda_flash_forward_sm90(&a, pl->bf16, pl->dpad, 0, stream);
}

#ifdef FA_CUDA_ORDERING_TEST
void fa_cuda_ordering_test(fa_cuda_params *k)
{
    static const struct {
        const char *name;
        int in;
    } kernels[] = { { "", FA_DROP_DECODE | FA_DROP_FORWARD | FA_DROP_BACKWARD }, { ":decode", FA_DROP_DECODE },
                    { ":forward", FA_DROP_FORWARD }, { ":backward", FA_DROP_BACKWARD } };
    const char *e = getenv("FLASHATTN_CUDA_DROP_ORDERING");
    k->drop_ordering = k->drop_in = 0;
    if (!e || !*e)
        return;
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++)
        if ((e[0] == '1' || e[0] == '2' || e[0] == '4') && strcmp(e + 1, kernels[i].name) == 0) {
            k->drop_ordering = e[0] - '0';
            k->drop_in = kernels[i].in;
            return;
        }
    /* a test build only: a value it cannot take would otherwise pass for a check */
    fprintf(stderr, "FLASHATTN_CUDA_DROP_ORDERING=%s: takes 1, 2 or 4, optionally :decode, :forward or "
                    ":backward; nothing dropped\n", e);
}
#endif

cudaError_t fa_cuda_dense_decode(const cuda_state *s, const fa_cuda_params *a, int nq, int sm90, int32_t split,
                                 int32_t splits, float *part, int bf16, cudaStream_t stream)
{
    fa_cuda_paged k;
    memset(&k, 0, sizeof(k));
    k.a = *a;
    fa_cuda_pages *g = &k.a.pg; /* no table: page b (0 when varlen) from row k0 */
    g->table = NULL;
    g->k_sp = a->k.sb, g->k_st = a->k.ss;
    g->v_sp = a->v.sb, g->v_st = a->v.ss;
    g->num = a->batch;
    g->shift = -1;
    g->total_q = (int32_t)a->rows;
    k.split = split;
    k.split_grow = 1;
    k.max_splits = splits;
    k.part = part;
    k.kv_aligned = a->dim % 8 == 0 && aligned16(a->k.p, a->k.sb, a->k.ss, a->k.sh) &&
                   aligned16(a->v.p, a->v.sb, a->v.ss, a->v.sh);
    k.decode_sm90 = sm90 && k.kv_aligned;
    k.pdl = s->pdl;
    k.decode_wide_min = s->decode_wide_min;
    if (k.decode_sm90)
        fa_cuda_tma_dense(s->tma_encode, &k.a, bf16, FA_CUDA_DECODE_SM90_KEYS);
    fa_cuda_ordering_test(&k.a);
    return fa_cuda_paged_attention(&k, bf16, fa_cuda_paged_dpad(a->dim), nq, stream);
}

fa_status fa_cuda_paged_run(fa_context_t ctx, void *state, void *plan, const fa_problem *p,
                            fa_run_info *info)
{
    (void)info;
    cuda_state *s = state;
    const cuda_paged_plan *pl = plan;
    fa_status st = check_pointers(ctx, s, p, 1);
    if (st != FA_OK)
        return st;
    fa_cuda_paged k;
    fill(p, &k);
    if ((pl->sm90 || pl->decode_sm90) && !k.kv_aligned) /* a plan made from bounds without the pools */
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "cache.k and cache.v must start on 16 bytes for this plan's kernel (%s), "
                        "which copies their rows in 16-byte chunks; give the pools in the plan's bounds "
                        "to have it choose a kernel for them",
                        pl->sm90 ? "paged-sm90" : "paged-decode-sm90");
    k.decode_sm90 = pl->decode_sm90;
    k.pdl = s->pdl;
    k.decode_wide_min = s->decode_wide_min;
    k.split = pl->split;
    k.split_grow = pl->grow;
    k.max_splits = pl->max_splits;
    k.part = pl->sm90 ? NULL : pl->ws;
    if (pl->decode_sm90 && !pl->sm90)
        fa_cuda_tma_paged(s->tma_encode, &k.a, pl->bf16, FA_CUDA_DECODE_SM90_KEYS, 0);
    fa_cuda_ordering_test(&k.a);
    cudaError_t err = cudaSuccess;
    if (k.a.pg.append)
        err = fa_cuda_paged_append(&k, pl->bf16, s->stream);
    if (err == cudaSuccess && pl->sm90)
        err = run_sm90(s, &k, pl, s->stream);
    else if (err == cudaSuccess)
        err = fa_cuda_paged_attention(&k, pl->bf16, pl->dpad, pl->nq, s->stream);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return fa_cuda_fail(ctx, err, "launching the paged attention");
    }
    return FA_OK;
}

fa_status fa_cuda_append(fa_context_t ctx, void *state, const fa_problem *p)
{
    cuda_state *s = state;
    if (p->in_dtype == FA_DTYPE_F32)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "cache.dtype: the CUDA backend's caches are f16 or bf16 (float32 runs on the CPU "
                        "backend)");
    if (p->heads_kv > 65535)
        return fa_error(ctx, FA_ERR_UNSUPPORTED, "cache.num_heads (%d): the CUDA append takes at most 65535",
                        (int)p->heads_kv);
    fa_status st = check_pointers(ctx, s, p, 0);
    if (st != FA_OK)
        return st;
    fa_cuda_paged k;
    fill(p, &k);
    cudaError_t err = fa_cuda_paged_append(&k, p->in_dtype == FA_DTYPE_BF16, s->stream);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return fa_cuda_fail(ctx, err, "launching the append");
    }
    return FA_OK;
}

fa_status fa_cuda_merge(fa_context_t ctx, void *state, const fa_merge_desc *d)
{
    cuda_state *s = state;
    if (d->num_heads > 65535)
        return fa_error(ctx, FA_ERR_UNSUPPORTED, "num_heads (%d): the CUDA merge takes at most 65535",
                        (int)d->num_heads);
    fa_status st;
    if ((st = fa_cuda_check_ptr(ctx, s, d->o_in.data, "o_in.data")) != FA_OK ||
        (st = fa_cuda_check_ptr(ctx, s, d->lse_in, "lse_in")) != FA_OK ||
        (st = fa_cuda_check_ptr(ctx, s, d->o.data, "o.data")) != FA_OK ||
        (d->lse && (st = fa_cuda_check_ptr(ctx, s, d->lse, "lse")) != FA_OK))
        return st;
    cudaError_t err = fa_cuda_merge_states(
        d->o_in.data, d->o_in.dtype == FA_DTYPE_F32, d->o_in.stride_batch, d->o_in.stride_seq, d->o_in.stride_head,
        d->lse_in, d->lse_in_stride_state, d->lse_in_stride_head, d->lse_in_stride_row, d->o.data,
        d->o.dtype == FA_DTYPE_F32, d->o.stride_seq, d->o.stride_head, d->lse, d->lse_stride_head,
        d->lse_stride_row, d->num_states, d->rows, d->num_heads, d->head_dim, d->o_in.dtype == FA_DTYPE_BF16,
        s->stream);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return fa_cuda_fail(ctx, err, "launching the merge");
    }
    return FA_OK;
}
