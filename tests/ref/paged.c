/* SPDX-License-Identifier: MIT */
/*
 * The paged conformance case: random pools, shuffled page tables, ragged queries, append and
 * RoPE, run through the public API and judged against the float64 reference. The tolerance
 * comes from the standard algorithm run densely on the same keys (gathered from the cache the
 * call left) in the same precision, as in the dense grid.
 */
#include "paged.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B_Q, B_POOL, B_KNEW, B_VNEW, B_O, B_LSE, B_CU, B_BT, B_LENS, B_POS, B_COS, B_SIN, B_SINKS, B_COUNT };

typedef struct pbuf {
    void *host, *dev;
    int64_t bytes;
} pbuf;

typedef struct built {
    fa_paged_desc d; /* host pointers */
    pbuf buf[B_COUNT];
    int64_t pool_elems;
    int32_t keys[FA_PAGED_CASE_MAX_BATCH];
} built;

static const char *dtype_name(fa_dtype t) { return t == FA_DTYPE_F32 ? "f32" : t == FA_DTYPE_F16 ? "f16" : "bf16"; }

void fa_paged_case_format(const fa_paged_case *c, char *buf, size_t cap)
{
    static const char *lay[] = { "nhd", "hnd", "combined" }, *rope[] = { "", " rope-neox", " rope-interleaved" };
    size_t n = (size_t)snprintf(buf, cap, "paged %s%s b%d hq%d hkv%d d%d page%d%s %s q/cached", dtype_name(c->dtype),
                                c->o_f32 ? "->f32" : "", (int)c->batch, (int)c->heads_q, (int)c->heads_kv,
                                (int)c->head_dim, (int)c->page_size, c->runs ? " runs" : "", lay[c->layout]);
    for (int32_t b = 0; b < c->batch && n < cap; b++)
        n += (size_t)snprintf(buf + n, cap - n, " %d/%d", (int)c->q_lens[b], (int)c->cache_lens[b]);
    if (n < cap)
        snprintf(buf + n, cap - n, "%s%s(%d)%s causal%d window(%d,%d) softcap%g%s%s split%d%s seed=%llu",
                 c->append ? " append" : "", rope[c->rope], (int)c->rope_dim, c->positions ? " positions" : "",
                 (int)c->causal, (int)c->window_left, (int)c->window_right, (double)c->softcap,
                 c->sinks ? " sinks" : "", c->with_lse ? " lse" : "", (int)c->kv_split,
                 c->use_plan ? " plan" : "", (unsigned long long)c->seed);
}

static void *alloc_buf(built *bl, int i, int64_t bytes)
{
    bl->buf[i].bytes = bytes;
    bl->buf[i].host = calloc(1, (size_t)(bytes > 0 ? bytes : 1));
    return bl->buf[i].host;
}

static void built_free(fa_context_t ctx, built *bl)
{
    for (int i = 0; i < B_COUNT; i++) {
        free(bl->buf[i].host);
        if (bl->buf[i].dev)
            fa_memory_free(ctx, bl->buf[i].dev);
    }
}

/* NaN in every cache slot no sequence's keys hold (the rest of a last page, unused pages): a
 * kernel that lets a slot past a sequence's end reach its output, even times a zero weight,
 * fails. 0, or -1 when out of memory. */
static void put_nan(fa_dtype t, void *base, int64_t i)
{
    if (t == FA_DTYPE_F32)
        ((float *)base)[i] = NAN;
    else
        ((uint16_t *)base)[i] = t == FA_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
}

static int poison_unused(const fa_paged_desc *d, const int32_t *keys, const int32_t *bt, int64_t bt_row)
{
    const fa_kv_cache *c = &d->cache;
    const int32_t ps = c->page_size;
    char *held = calloc((size_t)c->num_pages * (size_t)ps, 1);
    if (!held)
        return -1;
    for (int32_t b = 0; b < d->batch; b++)
        for (int32_t j = 0; j < keys[b]; j++)
            held[(int64_t)bt[b * bt_row + j / ps] * ps + j % ps] = 1;
    for (int64_t page = 0; page < c->num_pages; page++)
        for (int32_t t = 0; t < ps; t++)
            if (!held[page * ps + t])
                for (int32_t h = 0; h < c->num_heads; h++)
                    for (int32_t e = 0; e < d->head_dim; e++) {
                        put_nan(c->dtype, c->k, page * c->k_stride_page + t * c->k_stride_token + h * c->k_stride_head + e);
                        put_nan(c->dtype, c->v, page * c->v_stride_page + t * c->v_stride_token + h * c->v_stride_head + e);
                    }
    free(held);
    return 0;
}

/* The case's host tensors and descriptor. 0, or -1 when out of memory. */
static int build(const fa_paged_case *c, built *bl)
{
    memset(bl, 0, sizeof(*bl));
    fa_rng rng = { c->seed };
    const int64_t esz = c->dtype == FA_DTYPE_F32 ? 4 : 2, hq = c->heads_q, hk = c->heads_kv, dim = c->head_dim;
    const int32_t ps = c->page_size;
    const fa_dtype odt = c->o_f32 ? FA_DTYPE_F32 : c->dtype;
    int64_t total_q = 0, used = 0;
    int32_t max_q = 0, max_keys = 0, max_pages = 1;
    for (int32_t b = 0; b < c->batch; b++) {
        bl->keys[b] = c->cache_lens[b] + (c->append ? c->q_lens[b] : 0);
        int32_t pages = (bl->keys[b] + ps - 1) / ps;
        total_q += c->q_lens[b];
        used += pages;
        max_q = c->q_lens[b] > max_q ? c->q_lens[b] : max_q;
        max_keys = bl->keys[b] > max_keys ? bl->keys[b] : max_keys;
        max_pages = pages > max_pages ? pages : max_pages;
    }
    max_pages += 1; /* an unused entry per row: it holds -1, which nothing may read */
    const int32_t num_pages = (int32_t)used + 3;
    const int64_t page_elems = (int64_t)ps * hk * dim;
    bl->pool_elems = 2 * num_pages * page_elems;
    char *pool = alloc_buf(bl, B_POOL, bl->pool_elems * esz);
    void *q = alloc_buf(bl, B_Q, total_q * hq * dim * esz);
    void *kn = c->append ? alloc_buf(bl, B_KNEW, total_q * hk * dim * esz) : NULL;
    void *vn = c->append ? alloc_buf(bl, B_VNEW, total_q * hk * dim * esz) : NULL;
    void *o = alloc_buf(bl, B_O, total_q * hq * dim * (odt == FA_DTYPE_F32 ? 4 : 2));
    float *lse = c->with_lse ? alloc_buf(bl, B_LSE, total_q * hq * 4) : NULL;
    int32_t *cu = alloc_buf(bl, B_CU, 4 * (c->batch + 1));
    const int64_t bts = (c->seed & 1) ? max_pages + 2 : 0, bt_row = bts ? bts : max_pages;
    int32_t *bt = alloc_buf(bl, B_BT, 4 * bt_row * c->batch);
    int32_t *lens = alloc_buf(bl, B_LENS, 4 * c->batch);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)num_pages);
    if (!pool || !q || (c->append && (!kn || !vn)) || !o || (c->with_lse && !lse) || !cu || !bt || !lens || !perm) {
        free(perm);
        return -1;
    }
    /* pages in shuffled order: no sequence's pages are contiguous or ascending; or (runs) the
     * ids cut into runs of 1-24 consecutive ones, the runs shuffled, so that a sequence's key
     * tiles lie in one run, across two, or on single pages */
    int32_t nruns = 0;
    for (int32_t i = 0; i < num_pages; nruns++) { /* perm[r]: run r's first id */
        const int32_t len = c->runs ? 1 + (int32_t)(fa_rng_next(&rng) % 24) : 1;
        perm[nruns] = i;
        i += len < num_pages - i ? len : num_pages - i;
    }
    for (int32_t i = nruns - 1; i > 0; i--) {
        int32_t j = (int32_t)(fa_rng_next(&rng) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    if (c->runs) { /* the runs' ids in their shuffled order (a run ends where an id starts one) */
        char *starts = calloc((size_t)num_pages + 1, 1);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)num_pages);
        if (!starts || !ids) {
            free(starts), free(ids), free(perm);
            return -1;
        }
        for (int32_t r = 0; r < nruns; r++)
            starts[perm[r]] = 1;
        starts[num_pages] = 1;
        for (int32_t r = 0, at = 0; r < nruns; r++)
            for (int32_t id = perm[r]; id == perm[r] || !starts[id]; id++)
                ids[at++] = id;
        free(starts);
        free(perm);
        perm = ids;
    }
    for (int64_t i = 0; i < bt_row * c->batch; i++)
        bt[i] = -1;
    int32_t next = 0;
    cu[0] = 0;
    for (int32_t b = 0; b < c->batch; b++) {
        cu[b + 1] = cu[b] + c->q_lens[b];
        lens[b] = c->cache_lens[b];
        for (int32_t i = 0; i < (bl->keys[b] + ps - 1) / ps; i++)
            bt[b * bt_row + i] = perm[next++];
    }
    free(perm);
    fa_ref_fill(&rng, c->dtype, pool, bl->pool_elems, 1.0);
    fa_ref_fill(&rng, c->dtype, q, total_q * hq * dim, 1.0);
    if (c->append) {
        fa_ref_fill(&rng, c->dtype, kn, total_q * hk * dim, 1.0);
        fa_ref_fill(&rng, c->dtype, vn, total_q * hk * dim, 1.0);
    }

    fa_paged_desc *d = &bl->d;
    fa_paged_desc_init(d);
    d->batch = c->batch;
    d->total_q = (int32_t)total_q;
    d->max_seqlen_q = max_q;
    d->max_seqlen_k = max_keys;
    d->num_heads_q = c->heads_q;
    d->head_dim = c->head_dim;
    d->q = fa_tensor_contiguous(q, c->dtype, FA_LAYOUT_BSHD, (int32_t)total_q, c->heads_q, c->head_dim);
    d->o = fa_tensor_contiguous(o, odt, FA_LAYOUT_BSHD, (int32_t)total_q, c->heads_q, c->head_dim);
    d->cu_seqlens_q = cu;
    if (c->layout == FA_PAGED_COMBINED) {
        d->cache = fa_kv_cache_contiguous(pool, pool + page_elems * esz, c->dtype, FA_LAYOUT_BSHD, num_pages, ps,
                                          c->heads_kv, c->head_dim);
        d->cache.k_stride_page = d->cache.v_stride_page = 2 * page_elems;
    } else {
        d->cache = fa_kv_cache_contiguous(pool, pool + num_pages * page_elems * esz, c->dtype,
                                          c->layout == FA_PAGED_HND ? FA_LAYOUT_BHSD : FA_LAYOUT_BSHD, num_pages,
                                          ps, c->heads_kv, c->head_dim);
    }
    const fa_kv_cache *kc = &d->cache;
    fa_ref_v_first_nonneg(c->dtype, kc->v, num_pages, kc->v_stride_page, ps, kc->v_stride_token, c->heads_kv,
                          kc->v_stride_head);
    if (c->append)
        fa_ref_v_first_nonneg(c->dtype, vn, total_q, (int64_t)c->heads_kv * c->head_dim, c->heads_kv, c->head_dim, 1, 0);
    if (poison_unused(d, bl->keys, bt, bt_row) != 0)
        return -1;
    d->block_table = bt;
    d->block_table_stride = bts;
    d->max_pages_per_seq = max_pages;
    d->cache_seqlens = lens;
    if (c->append) {
        d->k_new = fa_tensor_contiguous(kn, c->dtype, FA_LAYOUT_BSHD, (int32_t)total_q, c->heads_kv, c->head_dim);
        d->v_new = fa_tensor_contiguous(vn, c->dtype, FA_LAYOUT_BSHD, (int32_t)total_q, c->heads_kv, c->head_dim);
    }
    if (c->rope != FA_ROPE_NONE) {
        const int32_t rd = c->rope_dim ? c->rope_dim : c->head_dim, half = rd / 2, max_pos = max_keys + 4;
        float *cs = alloc_buf(bl, B_COS, 4 * (int64_t)max_pos * half), *sn = alloc_buf(bl, B_SIN, 4 * (int64_t)max_pos * half);
        int32_t *pos = c->positions ? alloc_buf(bl, B_POS, 4 * total_q) : NULL;
        if (!cs || !sn || (c->positions && !pos))
            return -1;
        for (int32_t p = 0; p < max_pos; p++)
            for (int32_t i = 0; i < half; i++) {
                double ang = p * pow(10000.0, -2.0 * i / rd);
                cs[p * half + i] = (float)cos(ang);
                sn[p * half + i] = (float)sin(ang);
            }
        for (int64_t r = 0; pos && r < total_q; r++)
            pos[r] = (int32_t)(fa_rng_next(&rng) % (uint64_t)max_pos);
        d->rope = c->rope;
        d->rope_dim = c->rope_dim;
        d->rope_max_pos = max_pos;
        d->rope_cos = cs;
        d->rope_sin = sn;
        d->positions = pos;
    }
    if (c->sinks) {
        float *sk = alloc_buf(bl, B_SINKS, 4 * hq);
        if (!sk)
            return -1;
        for (int64_t h = 0; h < hq; h++)
            sk[h] = (float)(2.0 * fa_rng_uniform(&rng));
        d->sinks = sk;
    }
    d->lse = lse;
    d->causal = c->causal;
    d->window_left = c->window_left;
    d->window_right = c->window_right;
    d->softcap = c->softcap;
    d->kv_split = c->kv_split;
    return 0;
}

/* p (a host pointer into one of bl's buffers, or NULL) as the same place in its device copy. */
static void *dev_of(const built *bl, const void *p)
{
    for (int i = 0; p && i < B_COUNT; i++) {
        void *t = fa_case_translate(p, bl->buf[i].host, bl->buf[i].dev, bl->buf[i].bytes);
        if (t)
            return t;
    }
    return NULL;
}

/* Allocate and upload every buffer; *out is bl->d with device pointers. */
static int stage(fa_context_t ctx, built *bl, fa_paged_desc *out, char *msg, size_t cap)
{
    for (int i = 0; i < B_COUNT; i++) {
        if (!bl->buf[i].host)
            continue;
        fa_status s = fa_memory_alloc(ctx, (size_t)bl->buf[i].bytes, &bl->buf[i].dev);
        if (s == FA_OK)
            s = fa_memory_upload(ctx, bl->buf[i].dev, bl->buf[i].host, (size_t)bl->buf[i].bytes);
        if (s != FA_OK) {
            snprintf(msg, cap, "staging %lld bytes: %s", (long long)bl->buf[i].bytes, fa_context_last_error(ctx));
            return -1;
        }
    }
    const fa_paged_desc *h = &bl->d;
    *out = *h;
    out->q.data = dev_of(bl, h->q.data);
    out->o.data = dev_of(bl, h->o.data);
    out->cu_seqlens_q = dev_of(bl, h->cu_seqlens_q);
    out->cache.k = dev_of(bl, h->cache.k);
    out->cache.v = dev_of(bl, h->cache.v);
    out->block_table = dev_of(bl, h->block_table);
    out->cache_seqlens = dev_of(bl, h->cache_seqlens);
    out->k_new.data = dev_of(bl, h->k_new.data);
    out->v_new.data = dev_of(bl, h->v_new.data);
    out->rope_cos = dev_of(bl, h->rope_cos);
    out->rope_sin = dev_of(bl, h->rope_sin);
    out->positions = dev_of(bl, h->positions);
    out->lse = dev_of(bl, h->lse);
    out->sinks = dev_of(bl, h->sinks);
    return 0;
}

static int api_fail(fa_context_t ctx, fa_status s, const char *what, fa_paged_result *res)
{
    snprintf(res->message, sizeof(res->message), "%s: %s: %s", what, fa_status_string(s), fa_context_last_error(ctx));
    return -1;
}

/* The bounds a call runs under: its own, or (use_plan) larger ones for a plan. */
static fa_paged_desc bounds_of(const fa_paged_case *c, const fa_paged_desc *d)
{
    fa_paged_desc bounds = *d;
    if (c->use_plan) {
        bounds.batch += 2;
        bounds.total_q += 7;
        bounds.max_seqlen_q += 3;
        bounds.max_seqlen_k = d->max_pages_per_seq * d->cache.page_size;
    }
    return bounds;
}

/* Run the staged call (one-shot, or through a plan made for larger bounds). */
static fa_status run_call(fa_context_t ctx, const fa_paged_case *c, const fa_paged_desc *d)
{
    if (!c->use_plan)
        return fa_paged_forward(ctx, d);
    fa_paged_desc bounds = bounds_of(c, d);
    fa_paged_plan_t plan;
    fa_status s = fa_paged_plan_create(ctx, &bounds, &plan);
    if (s != FA_OK)
        return s;
    s = fa_paged_run(plan, d);
    fa_paged_plan_destroy(plan);
    return s;
}

/* Download n bytes from dev into a fresh host buffer. */
static void *fetch(fa_context_t ctx, const void *dev, int64_t n)
{
    void *h = malloc((size_t)(n > 0 ? n : 1));
    if (h && n > 0 && fa_memory_download(ctx, h, dev, (size_t)n) != FA_OK) {
        free(h);
        return NULL;
    }
    return h;
}

/* The appended tokens in the downloaded pool against the float64 rotation (in units of
 * their rounding), the rest of the pool against its old bytes. */
static double check_cache(const built *bl, const void *pool, int *changed)
{
    const fa_paged_desc *d = &bl->d;
    const fa_kv_cache *c = &d->cache;
    const int32_t dim = d->head_dim, hk = c->num_heads, ps = c->page_size;
    const int64_t bts = d->block_table_stride ? d->block_table_stride : d->max_pages_per_seq;
    const double u = fa_unit_roundoff(c->dtype);
    const char *base = bl->buf[B_POOL].host;
    const int64_t esz = c->dtype == FA_DTYPE_F32 ? 4 : 2;
    int64_t *owner = malloc(sizeof(int64_t) * (size_t)(c->num_pages * (int64_t)ps)); /* page slot -> row */
    double worst = 0.0, x[FA_MAX_HEAD_DIM];
    *changed = 0;
    if (!owner)
        return INFINITY;
    for (int64_t i = 0; i < (int64_t)c->num_pages * ps; i++)
        owner[i] = -1;
    for (int32_t b = 0; d->k_new.data && b < d->batch; b++)
        for (int64_t i = 0; i < d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b]; i++) {
            int64_t j = d->cache_seqlens[b] + i, page = d->block_table[b * bts + j / ps];
            owner[page * ps + j % ps] = d->cu_seqlens_q[b] + i;
        }
    const int64_t kofs = ((const char *)c->k - base) / esz, vofs = ((const char *)c->v - base) / esz;
    for (int64_t page = 0; page < c->num_pages; page++)
        for (int64_t t = 0; t < ps; t++)
            for (int32_t h = 0; h < hk; h++) {
                const int64_t ka = kofs + page * c->k_stride_page + t * c->k_stride_token + h * c->k_stride_head;
                const int64_t va = vofs + page * c->v_stride_page + t * c->v_stride_token + h * c->v_stride_head;
                const int64_t row = owner[page * ps + t];
                if (row < 0) {
                    *changed |= memcmp((const char *)pool + ka * esz, base + ka * esz, (size_t)(dim * esz)) != 0 ||
                                memcmp((const char *)pool + va * esz, base + va * esz, (size_t)(dim * esz)) != 0;
                    continue;
                }
                double in_max = 0.0; /* the float32 rotation's own error is relative to its inputs */
                for (int32_t e = 0; e < dim; e++) {
                    x[e] = fa_ref_decode(c->dtype, d->k_new.data, row * d->k_new.stride_seq + h * d->k_new.stride_head + e);
                    in_max = fmax(in_max, fabs(x[e]));
                }
                if (d->rope != FA_ROPE_NONE) {
                    int32_t b = 0;
                    while (d->cu_seqlens_q[b + 1] <= row)
                        b++;
                    fa_ref_rope(d, x, d->positions ? d->positions[row] : d->cache_seqlens[b] + row - d->cu_seqlens_q[b]);
                }
                for (int32_t e = 0; e < dim; e++) {
                    double got = fa_ref_decode(c->dtype, pool, ka + e), err = fabs(got - x[e]) / (u * fabs(x[e]) + 4.0 * 0x1p-24 * in_max + 1e-30);
                    worst = err > worst ? err : worst;
                    *changed |= fa_ref_decode(c->dtype, pool, va + e) !=
                                fa_ref_decode(c->dtype, d->v_new.data, row * d->v_new.stride_seq + h * d->v_new.stride_head + e);
                }
            }
    free(owner);
    return worst;
}

/* The standard algorithm on the same problem made dense: the keys the call left in the cache
 * gathered per sequence, q rotated in float64 and rounded to the dtype, sinks applied to its
 * (o, lse) in float64. o_std and lse_std in the reference's order. */
static int dense_standard(fa_context_t ctx, const built *bl, const void *pool, double *o_std, double *lse_std,
                          fa_paged_result *res)
{
    const fa_paged_desc *d = &bl->d;
    const fa_kv_cache *c = &d->cache;
    const int32_t hq = d->num_heads_q, hk = c->num_heads, dim = d->head_dim, ps = c->page_size;
    const int64_t esz = c->dtype == FA_DTYPE_F32 ? 4 : 2, bts = d->block_table_stride ? d->block_table_stride : d->max_pages_per_seq;
    const char *base = bl->buf[B_POOL].host;
    int64_t total_k = 0;
    for (int32_t b = 0; b < d->batch; b++)
        total_k += bl->keys[b];
    int32_t cu_k[FA_PAGED_CASE_MAX_BATCH + 1] = { 0 };
    const int64_t kv_n = total_k * hk * dim, q_n = (int64_t)d->total_q * hq * dim;
    char *kv = malloc((size_t)(2 * kv_n * esz + 1)), *qr = malloc((size_t)(q_n * esz + 1));
    float *o = malloc(sizeof(float) * (size_t)(q_n + 1)), *lse = malloc(sizeof(float) * (size_t)((int64_t)d->total_q * hq + 1));
    double x[FA_MAX_HEAD_DIM];
    void *dkv = NULL, *dq = NULL, *dout = NULL, *dlse = NULL;
    int rc = -1;
    if (!kv || !qr || !o || !lse) {
        snprintf(res->message, sizeof(res->message), "out of memory building the dense baseline");
        goto done;
    }
    for (int32_t b = 0; b < d->batch; b++) {
        cu_k[b + 1] = cu_k[b] + bl->keys[b];
        for (int64_t j = 0; j < bl->keys[b]; j++)
            for (int32_t h = 0; h < hk; h++) {
                const int64_t page = d->block_table[b * bts + j / ps], t = j % ps;
                const int64_t ka = ((const char *)c->k - base) / esz + page * c->k_stride_page + t * c->k_stride_token + h * c->k_stride_head;
                const int64_t va = ((const char *)c->v - base) / esz + page * c->v_stride_page + t * c->v_stride_token + h * c->v_stride_head;
                const int64_t at = ((cu_k[b] + j) * hk + h) * dim;
                memcpy(kv + at * esz, (const char *)pool + ka * esz, (size_t)(dim * esz));
                memcpy(kv + (kv_n + at) * esz, (const char *)pool + va * esz, (size_t)(dim * esz));
            }
        for (int64_t i = 0; i < d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b]; i++)
            for (int32_t h = 0; h < hq; h++) {
                const int64_t row = d->cu_seqlens_q[b] + i, qn = d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b];
                for (int32_t e = 0; e < dim; e++)
                    x[e] = fa_ref_decode(c->dtype, d->q.data, row * d->q.stride_seq + h * d->q.stride_head + e);
                if (d->rope != FA_ROPE_NONE)
                    fa_ref_rope(d, x, d->positions ? d->positions[row] : bl->keys[b] - qn + i);
                for (int32_t e = 0; e < dim; e++)
                    fa_ref_encode(c->dtype, qr, (row * hq + h) * dim + e, fa_ref_round(c->dtype, x[e]));
            }
    }
    fa_status s;
    if ((s = fa_memory_alloc(ctx, (size_t)(2 * kv_n * esz + 1), &dkv)) != FA_OK ||
        (s = fa_memory_alloc(ctx, (size_t)(q_n * esz + 1), &dq)) != FA_OK ||
        (s = fa_memory_alloc(ctx, (size_t)(q_n * 4 + 1), &dout)) != FA_OK ||
        (s = fa_memory_alloc(ctx, (size_t)((int64_t)d->total_q * hq * 4 + 1), &dlse)) != FA_OK ||
        (s = fa_memory_upload(ctx, dkv, kv, (size_t)(2 * kv_n * esz))) != FA_OK ||
        (s = fa_memory_upload(ctx, dq, qr, (size_t)(q_n * esz))) != FA_OK) {
        api_fail(ctx, s, "dense baseline", res);
        goto done;
    }
    fa_attention_desc a;
    fa_attention_desc_init(&a);
    a.batch = d->batch;
    a.seqlen_q = d->total_q;
    a.seqlen_k = (int32_t)total_k;
    a.num_heads_q = hq;
    a.num_heads_kv = hk;
    a.head_dim = dim;
    a.q = fa_tensor_contiguous(dq, c->dtype, FA_LAYOUT_BSHD, d->total_q, hq, dim);
    a.k = fa_tensor_contiguous(dkv, c->dtype, FA_LAYOUT_BSHD, (int32_t)total_k, hk, dim);
    a.v = fa_tensor_contiguous((char *)dkv + kv_n * esz, c->dtype, FA_LAYOUT_BSHD, (int32_t)total_k, hk, dim);
    a.o = fa_tensor_contiguous(dout, d->o.dtype, FA_LAYOUT_BSHD, d->total_q, hq, dim);
    a.lse = dlse;
    a.lse_stride_seq = hq; /* [row, head]: the reference's order */
    a.lse_stride_head = 1;
    a.lse_stride_batch = 1;
    a.scale = d->scale;
    a.causal = d->causal;
    a.window_left = d->window_left;
    a.window_right = d->window_right;
    a.softcap = d->softcap;
    a.cu_seqlens_q = d->cu_seqlens_q;
    a.cu_seqlens_k = cu_k;
    a.algorithm = FA_ALGORITHM_STANDARD;
    const int64_t ob = d->o.dtype == FA_DTYPE_F32 ? 4 : 2;
    if ((s = fa_forward(ctx, &a)) != FA_OK || (s = fa_memory_download(ctx, o, dout, (size_t)(q_n * ob))) != FA_OK ||
        (s = fa_memory_download(ctx, lse, dlse, (size_t)((int64_t)d->total_q * hq * 4))) != FA_OK) {
        api_fail(ctx, s, "dense baseline", res);
        goto done;
    }
    for (int64_t r = 0; r < d->total_q; r++)
        for (int32_t h = 0; h < hq; h++) {
            double l = lse[r * hq + h], f = 1.0;
            if (d->sinks) {
                const double sk = d->sinks[h];
                f = l == -INFINITY ? 0.0 : 1.0 / (1.0 + exp(sk - l));
                l = l == -INFINITY ? sk : fmax(l, sk) + log1p(exp(-fabs(l - sk)));
            }
            lse_std[r * hq + h] = l;
            for (int32_t e = 0; e < dim; e++)
                o_std[(r * hq + h) * dim + e] = f * fa_ref_decode(d->o.dtype, o, (r * hq + h) * dim + e);
        }
    rc = 0;
done:
    fa_memory_free(ctx, dkv);
    fa_memory_free(ctx, dq);
    fa_memory_free(ctx, dout);
    fa_memory_free(ctx, dlse);
    free(kv), free(qr), free(o), free(lse);
    return rc;
}

/* Sequence b alone (no append: its keys are in the cache now) through the same bounds:
 * its o and lse must have the bits it got in the batch. 1 when they do. */
static int alone_same_bits(fa_context_t ctx, const fa_paged_case *c, const built *bl, const fa_paged_desc *sd,
                           int32_t b, const void *o_all,
                           const float *lse_all, fa_paged_result *res)
{
    const fa_paged_desc *d = &bl->d;
    const int32_t q0 = d->cu_seqlens_q[b], qn = d->cu_seqlens_q[b + 1] - q0, hq = d->num_heads_q, dim = d->head_dim;
    const int64_t ob = d->o.dtype == FA_DTYPE_F32 ? 4 : 2, qb = d->q.dtype == FA_DTYPE_F32 ? 4 : 2;
    const int64_t bts = d->block_table_stride ? d->block_table_stride : d->max_pages_per_seq;
    int32_t meta[3] = { 0, qn, bl->keys[b] };
    void *dmeta = NULL, *dout = NULL, *dlse = NULL, *o = NULL;
    float *lse = NULL;
    int same = 0;
    fa_status s;
    if ((s = fa_memory_alloc(ctx, sizeof(meta), &dmeta)) != FA_OK ||
        (s = fa_memory_upload(ctx, dmeta, meta, sizeof(meta))) != FA_OK ||
        (s = fa_memory_alloc(ctx, (size_t)qn * hq * dim * ob, &dout)) != FA_OK ||
        (s = fa_memory_alloc(ctx, (size_t)qn * hq * 4 + 4, &dlse)) != FA_OK) {
        api_fail(ctx, s, "alone", res);
        goto done;
    }
    fa_paged_desc a = *sd;
    a.batch = 1;
    a.total_q = qn;
    a.q.data = (char *)sd->q.data + (int64_t)q0 * d->q.stride_seq * qb;
    a.o = fa_tensor_contiguous(dout, d->o.dtype, FA_LAYOUT_BSHD, qn, hq, dim);
    a.cu_seqlens_q = dmeta;
    a.cache_seqlens = (int32_t *)dmeta + 2;
    a.block_table = sd->block_table + b * bts;
    a.k_new.data = a.v_new.data = NULL;
    a.positions = sd->positions ? sd->positions + q0 : NULL;
    a.lse = sd->lse ? dlse : NULL;
    const fa_paged_desc bounds = bounds_of(c, sd); /* the same bounds: the same plan */
    a.max_seqlen_q = bounds.max_seqlen_q;
    a.max_seqlen_k = bounds.max_seqlen_k;
    if ((s = fa_paged_forward(ctx, &a)) != FA_OK) {
        api_fail(ctx, s, "alone", res);
        goto done;
    }
    o = fetch(ctx, dout, (int64_t)qn * hq * dim * ob);
    lse = fetch(ctx, dlse, (int64_t)qn * hq * 4);
    if (!o || !lse) {
        snprintf(res->message, sizeof(res->message), "alone: download failed");
        goto done;
    }
    same = memcmp(o, (const char *)o_all + (int64_t)q0 * hq * dim * ob, (size_t)qn * hq * dim * ob) == 0;
    for (int32_t h = 0; sd->lse && h < hq; h++) /* default strides: [head, row] */
        same &= memcmp(lse + (int64_t)h * qn, lse_all + (int64_t)h * d->total_q + q0, (size_t)qn * 4) == 0;
done:
    fa_memory_free(ctx, dmeta);
    fa_memory_free(ctx, dout);
    fa_memory_free(ctx, dlse);
    free(o);
    free(lse);
    return same;
}

typedef struct errs {
    double o, lse, ref_max, lse_max;
    int bad;
} errs;

/* got against ref; an LSE's error counts beyond its row's slack (NULL: none). */
static errs compare(const built *bl, const double *ref, const double *lref, const double *got, const double *lgot,
                    const double *slack)
{
    const fa_paged_desc *d = &bl->d;
    errs e = { 0 };
    const int64_t hq = d->num_heads_q, dim = d->head_dim;
    for (int64_t r = 0; r < (int64_t)d->total_q * hq; r++) {
        const int empty = lref[r] == -INFINITY;
        for (int64_t x = 0; x < dim; x++) {
            double g = got[r * dim + x], f = ref[r * dim + x];
            if (!isfinite(g) || (empty && g != 0.0))
                e.bad = 1;
            e.o = fmax(e.o, isnan(g) ? INFINITY : fabs(g - f));
            e.ref_max = fmax(e.ref_max, fabs(f));
        }
        if (!lgot)
            continue;
        if (lref[r] == -INFINITY) {
            e.bad |= lgot[r] != -INFINITY;
        } else {
            e.bad |= !isfinite(lgot[r]);
            e.lse = fmax(e.lse, isnan(lgot[r]) ? INFINITY : fabs(lgot[r] - lref[r]) - (slack ? slack[r] : 0.0));
            e.lse_max = fmax(e.lse_max, fabs(lref[r]));
        }
    }
    return e;
}

int fa_paged_case_run(fa_context_t ctx, const fa_paged_case *c, fa_paged_result *res)
{
    memset(res, 0, sizeof(*res));
    char label[400];
    fa_paged_case_format(c, label, sizeof(label));
    built bl;
    fa_paged_desc sd;
    double *ref = NULL, *lref = NULL, *got = NULL, *lgot = NULL, *ostd = NULL, *lstd = NULL, *q_round = NULL;
    void *o = NULL, *pool = NULL;
    float *lse = NULL;
    int rc = -1;
    if (build(c, &bl) != 0) {
        snprintf(res->message, sizeof(res->message), "out of memory building the case: %s", label);
        goto done;
    }
    if (stage(ctx, &bl, &sd, res->message, sizeof(res->message)) != 0)
        goto done;
    const fa_paged_desc *d = &bl.d;
    const int64_t rows = (int64_t)d->total_q * d->num_heads_q, n = rows * d->head_dim;
    const int64_t ob = d->o.dtype == FA_DTYPE_F32 ? 4 : 2;
    /* poison: every element of o and lse must be written */
    memset(bl.buf[B_O].host, 0xff, (size_t)bl.buf[B_O].bytes);
    fa_status s = fa_memory_upload(ctx, sd.o.data, bl.buf[B_O].host, (size_t)bl.buf[B_O].bytes);
    if (s == FA_OK && d->lse) {
        for (int64_t i = 0; i < rows; i++)
            ((float *)bl.buf[B_LSE].host)[i] = NAN;
        s = fa_memory_upload(ctx, sd.lse, bl.buf[B_LSE].host, (size_t)bl.buf[B_LSE].bytes);
    }
    if (s != FA_OK || (s = run_call(ctx, c, &sd)) != FA_OK) {
        api_fail(ctx, s, label, res);
        goto done;
    }
    fa_run_info ran = { .size = sizeof(ran) };
    if (fa_context_last_run(ctx, &ran) == FA_OK && ran.kernel)
        snprintf(res->kernel, sizeof(res->kernel), "%s", ran.kernel);
    ref = malloc(sizeof(double) * (size_t)(n + 1));
    got = malloc(sizeof(double) * (size_t)(n + 1));
    ostd = malloc(sizeof(double) * (size_t)(n + 1));
    lref = malloc(sizeof(double) * (size_t)(rows + 1));
    lgot = malloc(sizeof(double) * (size_t)(rows + 1));
    lstd = malloc(sizeof(double) * (size_t)(rows + 1));
    o = fetch(ctx, sd.o.data, n * ob);
    lse = d->lse ? fetch(ctx, sd.lse, rows * 4) : NULL;
    pool = fetch(ctx, bl.buf[B_POOL].dev, bl.buf[B_POOL].bytes);
    q_round = malloc(sizeof(double) * (size_t)(rows + 1));
    double smax = 0.0;
    if (!ref || !got || !ostd || !lref || !lgot || !lstd || !q_round || !o || (d->lse && !lse) || !pool ||
        fa_ref_paged(d, d->cache.k, d->cache.v, ref, lref, &smax, q_round) != 0) {
        snprintf(res->message, sizeof(res->message), "out of memory or download failure: %s", label);
        goto done;
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = r / d->num_heads_q, h = r % d->num_heads_q;
        for (int32_t x = 0; x < d->head_dim; x++)
            got[r * d->head_dim + x] = fa_ref_decode(d->o.dtype, o, r * d->head_dim + x);
        if (lse)
            lgot[r] = lse[h * d->total_q + row];
    }
    int changed = 0;
    res->cache_err = check_cache(&bl, pool, &changed);
    if (dense_standard(ctx, &bl, pool, ostd, lstd, res) != 0)
        goto done;
    /* the kernel's LSE beyond what its rotated queries' rounding may move it by (q_round) */
    errs ef = compare(&bl, ref, lref, got, lse ? lgot : NULL, q_round), es = compare(&bl, ref, lref, ostd, lstd, NULL);
    const fa_dtype odt = d->o.dtype;
    res->err = ef.o;
    res->err_standard = es.o;
    res->tolerance = fa_output_tolerance(es.o, ef.ref_max, d->q.dtype, odt);
    res->lse_err = ef.lse;
    res->lse_tol = 2.0 * es.lse + 16.0 * 0x1p-24 * fmax(fmax(ef.lse_max, smax), 1.0);
    const double gross = 1e-2 * fmax(ef.ref_max, 1e-3) + 4.0 * fa_unit_roundoff(odt) * ef.ref_max;
    const int32_t alone = (int32_t)(c->seed % (uint64_t)c->batch);
    const int invariant = d->cu_seqlens_q[alone + 1] == d->cu_seqlens_q[alone] ||
                          alone_same_bits(ctx, c, &bl, &sd, alone, o, lse, res);
    if (res->message[0])
        goto done;
    /* a rotated key rounds once to the cache's dtype: within one unit of that rounding
     * (two with the float32 rotation's own error) */
    res->passed = !ef.bad && ef.o <= res->tolerance && es.o <= gross && (!lse || ef.lse <= res->lse_tol) &&
                  res->cache_err <= 2.0 && !changed && invariant;
    if (!res->passed)
        snprintf(res->message, sizeof(res->message),
                 "%s%s%serr %.3g (standard %.3g, tol %.3g) lse err %.3g (tol %.3g) cache %.2f ulp: %s",
                 ef.bad ? "non-finite or unmasked output; " : "", changed ? "cache bytes changed; " : "",
                 invariant ? "" : "not batch-invariant; ", ef.o, es.o, res->tolerance, ef.lse, res->lse_tol,
                 res->cache_err, label);
    rc = 0;
done:
    built_free(ctx, &bl);
    free(ref), free(lref), free(got), free(lgot), free(ostd), free(lstd), free(q_round), free(o), free(pool), free(lse);
    return rc;
}

int fa_paged_case_host(const fa_paged_case *c, fa_paged_host *h)
{
    memset(h, 0, sizeof(*h));
    built *bl = malloc(sizeof(*bl));
    if (!bl)
        return -1;
    if (build(c, bl) != 0) {
        built_free(NULL, bl);
        free(bl);
        return -1;
    }
    h->d = bl->d;
    h->o = bl->buf[B_O].host, h->o_bytes = bl->buf[B_O].bytes;
    h->lse = bl->buf[B_LSE].host, h->lse_bytes = bl->buf[B_LSE].bytes;
    h->pool = bl->buf[B_POOL].host, h->pool_bytes = bl->buf[B_POOL].bytes;
    h->priv = bl;
    return 0;
}

void fa_paged_host_free(fa_paged_host *h)
{
    if (h->priv) {
        built_free(NULL, h->priv);
        free(h->priv);
    }
    memset(h, 0, sizeof(*h));
}

/* ---- the grid ---- */

static int32_t pick(fa_rng *r, const int32_t *v, int n) { return v[fa_rng_next(r) % (uint64_t)n]; }

int fa_paged_grid_build(int level, uint64_t seed, fa_paged_case *out, int cap)
{
    fa_rng rng = { seed };
    static const int32_t pages[] = { 1, 16, 64, 256, 16, 16, 32 };
    static const int32_t dims_quick[] = { 64, 128, 80, 32, 8 }, dims_full[] = { 64, 128, 256, 80, 96, 40, 8, 100 };
    static const int32_t groups[] = { 1, 4, 8 };
    static const fa_dtype dts[] = { FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16 };
    const int total = level ? 96 : 40;
    int n = 0;
    for (int i = 0; i < total && n < cap; i++) {
        fa_paged_case c;
        memset(&c, 0, sizeof(c));
        c.seed = fa_rng_next(&rng);
        c.dtype = dts[i % 3];
        c.o_f32 = c.dtype != FA_DTYPE_F32 && (i % 7) == 3;
        c.page_size = pages[i % 7];
        c.head_dim = level ? pick(&rng, dims_full, 8) : pick(&rng, dims_quick, 5);
        c.heads_kv = 1 + (int32_t)(fa_rng_next(&rng) % 2);
        c.heads_q = c.heads_kv * groups[(i / 3) % 3];
        c.batch = 1 + (int32_t)(fa_rng_next(&rng) % (level ? 6 : 4));
        const int32_t ps = c.page_size, longk = level ? 2000 : 600;
        const int32_t cached[] = { 0, 1, ps - 1, ps, ps + 1, 2 * ps + 3, longk, 37 };
        for (int32_t b = 0; b < c.batch; b++) {
            int kind = (int)(fa_rng_next(&rng) % 4); /* decode, speculative, chunked prefill, empty */
            c.q_lens[b] = kind == 0 ? 1 : kind == 1 ? 2 + (int32_t)(fa_rng_next(&rng) % 3)
                          : kind == 2 ? 5 + (int32_t)(fa_rng_next(&rng) % (level ? 70 : 30)) : (i % 5 == 0 ? 0 : 1);
            c.cache_lens[b] = cached[fa_rng_next(&rng) % 8];
            if (c.cache_lens[b] < 0)
                c.cache_lens[b] = 0;
        }
        if (i % 4 == 0) /* every sequence a one-token decode: the decode path */
            for (int32_t b = 0; b < c.batch; b++)
                c.q_lens[b] = 1;
        c.append = i % 3 != 2;
        for (int32_t b = 0; !c.append && b < c.batch; b++) /* queries follow their cache */
            c.cache_lens[b] = c.cache_lens[b] > c.q_lens[b] ? c.cache_lens[b] : c.q_lens[b];
        c.rope = (fa_rope)(i % 3 == 1 ? FA_ROPE_NEOX : i % 5 == 2 ? FA_ROPE_INTERLEAVED : FA_ROPE_NONE);
        c.rope_dim = c.rope != FA_ROPE_NONE && (i % 2) && c.head_dim >= 16 ? c.head_dim / 2 : 0;
        c.positions = c.rope != FA_ROPE_NONE && i % 6 == 1;
        c.layout = (fa_paged_layout)((i / 3) % 3); /* every dtype with every layout */
        c.runs = (i / 9) % 2;
        c.causal = i % 2 == 0;
        c.window_left = i % 9 == 4 ? 20 : -1;
        c.window_right = c.causal ? -1 : (i % 9 == 5 ? 3 : -1);
        c.softcap = i % 8 == 3 ? 2.0f : 0.0f;
        c.sinks = i % 5 == 3;
        c.with_lse = i % 4 != 1;
        c.kv_split = i % 6 == 5 ? 64 : 0;
        c.use_plan = i % 4 == 2;
        out[n++] = c;
    }
    if (n < cap) { /* decode past 64k keys, where the CUDA default splits grow with the length */
        fa_paged_case c;
        memset(&c, 0, sizeof(c));
        c.seed = fa_rng_next(&rng);
        c.dtype = FA_DTYPE_BF16;
        c.page_size = 16;
        c.head_dim = 64;
        c.heads_kv = 1;
        c.heads_q = 4;
        c.batch = 2;
        c.q_lens[0] = c.q_lens[1] = 1;
        c.cache_lens[0] = 70000; /* splits of 2048 keys */
        c.cache_lens[1] = 140000; /* 4096 */
        c.append = 1;
        c.causal = 1;
        c.window_left = c.window_right = -1;
        c.with_lse = 1;
        out[n++] = c;
    }
    /* runs of pages in [page, token, head, dim] pools: key tiles on consecutive pages (one TMA
     * box a column block on CUDA) and not; chunked prefill at d128, d64 and d256, then decode */
    static const int32_t run_dims[] = { 128, 64, 256, 128 };
    for (int v = 0; v < 4 && n < cap; v++) {
        fa_paged_case c;
        memset(&c, 0, sizeof(c));
        c.seed = fa_rng_next(&rng);
        c.dtype = v == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
        c.page_size = 16;
        c.head_dim = run_dims[v];
        c.heads_kv = 2;
        c.heads_q = 8;
        c.batch = 3;
        c.q_lens[0] = v == 3 ? 1 : 40, c.q_lens[1] = 1, c.q_lens[2] = v == 3 ? 1 : 130;
        c.cache_lens[0] = 1000, c.cache_lens[1] = 700, c.cache_lens[2] = 300;
        c.append = 1;
        c.runs = 1;
        c.causal = 1;
        c.window_left = c.window_right = -1;
        c.with_lse = 1;
        out[n++] = c;
    }
    /* chunked prefill over pages smaller than the key tile at d128 and d256 in other pools
     * (grouped tiles on CUDA): one kv head with its rows head-major, whose head stride the tiles
     * never use, and vLLM's combined cache of pages of 32 with a window; last pages in part */
    for (int v = 0; v < 2 && n < cap; v++) {
        fa_paged_case c;
        memset(&c, 0, sizeof(c));
        c.seed = fa_rng_next(&rng);
        c.dtype = v ? FA_DTYPE_F16 : FA_DTYPE_BF16;
        c.page_size = v ? 32 : 16;
        c.head_dim = v ? 256 : 128;
        c.heads_kv = v ? 2 : 1;
        c.heads_q = 4;
        c.batch = 2;
        c.q_lens[0] = 150, c.q_lens[1] = v ? 70 : 33;
        c.cache_lens[0] = 517, c.cache_lens[1] = 90;
        c.append = 1;
        c.layout = v ? FA_PAGED_COMBINED : FA_PAGED_HND;
        c.runs = v;
        c.causal = 1;
        c.window_left = v ? 200 : -1, c.window_right = -1;
        c.with_lse = 1;
        out[n++] = c;
    }
    return n;
}
