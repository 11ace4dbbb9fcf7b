/* SPDX-License-Identifier: MIT */
/* Serving calls: validation of paged descriptors, plans, append, RoPE's definition, merges. */
#include "views.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct fa_paged_plan {
    struct fa_context *ctx;
    void *backend_plan;
    fa_run_info info;
    fa_paged_desc bounds; /* the shapes and settings the plan was made for (pointers unused) */
    int append;
    int32_t rope_dim;
};

void fa_paged_desc_init(fa_paged_desc *desc)
{
    if (!desc)
        return;
    memset(desc, 0, sizeof(*desc));
    desc->size = sizeof(*desc);
    desc->window_left = -1;
    desc->window_right = -1;
}

void fa_merge_desc_init(fa_merge_desc *desc)
{
    if (!desc)
        return;
    memset(desc, 0, sizeof(*desc));
    desc->size = sizeof(*desc);
}

fa_kv_cache fa_kv_cache_contiguous(void *k, void *v, fa_dtype dtype, fa_layout layout,
                                   int32_t num_pages, int32_t page_size, int32_t num_heads,
                                   int32_t head_dim)
{
    fa_kv_cache c;
    memset(&c, 0, sizeof(c));
    c.k = k;
    c.v = v;
    c.dtype = dtype;
    c.num_pages = num_pages;
    c.page_size = page_size;
    c.num_heads = num_heads;
    const int64_t d = head_dim, t = page_size, h = num_heads;
    c.k_stride_page = c.v_stride_page = t * h * d;
    if (layout == FA_LAYOUT_BHSD) {
        c.k_stride_token = c.v_stride_token = d;
        c.k_stride_head = c.v_stride_head = t * d;
    } else {
        c.k_stride_token = c.v_stride_token = h * d;
        c.k_stride_head = c.v_stride_head = d;
    }
    return c;
}

void fa_rope_row(const fa_paged_problem *pg, float *x, int64_t pos)
{
    const fa_paged_desc *d = pg->desc;
    const int32_t half = pg->rope_dim / 2;
    const float *c = d->rope_cos + pos * half, *s = d->rope_sin + pos * half;
    for (int32_t i = 0; i < half; i++) {
        float *a = d->rope == FA_ROPE_NEOX ? x + i : x + 2 * i;
        float *b = d->rope == FA_ROPE_NEOX ? x + i + half : x + 2 * i + 1;
        const float xa = *a, xb = *b;
        *a = xa * c[i] - xb * s[i];
        *b = xa * s[i] + xb * c[i];
    }
}

/* ---- validation ---- */

enum { CHECK_PLAN = 0, CHECK_RUN = 1, CHECK_APPEND = 2 };

static fa_status check_dims(fa_context_t ctx, const fa_paged_desc *d, int mode)
{
    const fa_kv_cache *c = &d->cache;
    const struct {
        const char *name;
        int64_t v, min, max;
    } dims[] = {
        { "batch", d->batch, 1, INT32_MAX },
        { "total_q", d->total_q, 0, INT32_MAX },
        { "max_seqlen_q", d->max_seqlen_q, 0, INT32_MAX },
        { "max_seqlen_k", d->max_seqlen_k, 0, INT32_MAX },
        { "num_heads_q", d->num_heads_q, mode == CHECK_APPEND ? 0 : 1, FA_MAX_HEADS },
        { "head_dim", d->head_dim, 1, FA_MAX_HEAD_DIM },
        { "cache.num_heads", c->num_heads, 1, FA_MAX_HEADS },
        { "cache.num_pages", c->num_pages, 1, INT32_MAX },
        { "cache.page_size", c->page_size, 1, INT32_MAX },
        { "max_pages_per_seq", d->max_pages_per_seq, 1, INT32_MAX },
    };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        if (dims[i].v < dims[i].min || dims[i].v > dims[i].max)
            return fa_error(ctx, FA_ERR_INVALID_SHAPE, "%s (%lld) must be in %lld..%lld", dims[i].name,
                            (long long)dims[i].v, (long long)dims[i].min, (long long)dims[i].max);
    if (mode != CHECK_APPEND && d->num_heads_q % c->num_heads != 0)
        return fa_error(ctx, FA_ERR_INVALID_SHAPE,
                        "num_heads_q (%d) must be a multiple of cache.num_heads (%d)",
                        (int)d->num_heads_q, (int)c->num_heads);
    if ((int64_t)d->max_seqlen_k > (int64_t)d->max_pages_per_seq * c->page_size)
        return fa_error(ctx, FA_ERR_INVALID_SHAPE,
                        "max_seqlen_k (%d) exceeds the %lld tokens a sequence's max_pages_per_seq "
                        "(%d) pages of cache.page_size (%d) hold",
                        (int)d->max_seqlen_k, (long long)d->max_pages_per_seq * c->page_size,
                        (int)d->max_pages_per_seq, (int)c->page_size);
    if (d->block_table_stride != 0 && d->block_table_stride < d->max_pages_per_seq)
        return fa_error(ctx, FA_ERR_INVALID_STRIDE,
                        "block_table_stride (%lld) must be 0 or at least max_pages_per_seq (%d)",
                        (long long)d->block_table_stride, (int)d->max_pages_per_seq);
    if (d->kv_split < 0 || d->kv_split % 16 != 0)
        return fa_error(ctx, FA_ERR_INVALID_VALUE,
                        "kv_split (%d) must be 0 (the default) or a positive multiple of 16",
                        (int)d->kv_split);
    if (d->check_tables != 0 && d->check_tables != 1)
        return fa_error(ctx, FA_ERR_INVALID_VALUE, "check_tables (%d) must be 0 or 1",
                        (int)d->check_tables);
    return FA_OK;
}

static fa_status check_types(fa_context_t ctx, const fa_paged_desc *d, int append, int mode)
{
    if (!fa_dtype_valid(d->cache.dtype))
        return fa_error(ctx, FA_ERR_INVALID_DTYPE, "cache.dtype (%d) is not a fa_dtype",
                        (int)d->cache.dtype);
    if (d->cache.dtype == FA_DTYPE_E4M3 || (mode != CHECK_APPEND && d->q.dtype == FA_DTYPE_E4M3))
        return fa_error(ctx, FA_ERR_INVALID_DTYPE,
                        "%s.dtype: paged calls take f32, f16 or bf16, not fp8 (FA_DTYPE_E4M3)",
                        d->cache.dtype == FA_DTYPE_E4M3 ? "cache" : "q");
    if (d->cache.k_scale || d->cache.v_scale)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "cache.%s: quantised caches with scales are not supported yet (set NULL)",
                        d->cache.k_scale ? "k_scale" : "v_scale");
    if (mode != CHECK_APPEND) {
        if (!fa_dtype_valid(d->q.dtype) || !fa_dtype_valid(d->o.dtype))
            return fa_error(ctx, FA_ERR_INVALID_DTYPE, "%s.dtype (%d) is not a fa_dtype",
                            fa_dtype_valid(d->q.dtype) ? "o" : "q",
                            (int)(fa_dtype_valid(d->q.dtype) ? d->o.dtype : d->q.dtype));
        if (d->cache.dtype != d->q.dtype)
            return fa_error(ctx, FA_ERR_INVALID_DTYPE, "cache.dtype (%d) must equal q.dtype (%d)",
                            (int)d->cache.dtype, (int)d->q.dtype);
        if (d->o.dtype != d->q.dtype && d->o.dtype != FA_DTYPE_F32)
            return fa_error(ctx, FA_ERR_INVALID_DTYPE,
                            "o.dtype (%d) must equal q.dtype (%d) or be FA_DTYPE_F32",
                            (int)d->o.dtype, (int)d->q.dtype);
    }
    if (append && (d->k_new.dtype != d->cache.dtype || d->v_new.dtype != d->cache.dtype))
        return fa_error(ctx, FA_ERR_INVALID_DTYPE, "%s.dtype (%d) must equal cache.dtype (%d)",
                        d->k_new.dtype != d->cache.dtype ? "k_new" : "v_new",
                        (int)(d->k_new.dtype != d->cache.dtype ? d->k_new.dtype : d->v_new.dtype),
                        (int)d->cache.dtype);
    if ((int)d->rope < FA_ROPE_NONE || (int)d->rope > FA_ROPE_INTERLEAVED)
        return fa_error(ctx, FA_ERR_INVALID_VALUE, "rope (%d) is not a fa_rope", (int)d->rope);
    if (d->rope != FA_ROPE_NONE) {
        int32_t rd = d->rope_dim ? d->rope_dim : d->head_dim;
        if (!d->rope_dim && rd % 2)
            return fa_error(ctx, FA_ERR_INVALID_VALUE,
                            "rope_dim 0 rotates all of head_dim (%d), which is odd: give an even rope_dim "
                            "below it", (int)d->head_dim);
        if (rd < 2 || rd % 2 || rd > d->head_dim)
            return fa_error(ctx, FA_ERR_INVALID_VALUE,
                            "rope_dim (%d) must be 0 (head_dim) or even and in 2..head_dim (%d)",
                            (int)d->rope_dim, (int)d->head_dim);
        if (d->rope_max_pos < 1)
            return fa_error(ctx, FA_ERR_INVALID_VALUE, "rope_max_pos (%d) must be at least 1",
                            (int)d->rope_max_pos);
    }
    return FA_OK;
}

/* The cache pool of k or v as a view over [page, token, head] rows. */
static fa_status cache_view(fa_context_t ctx, fa_byte_view *v, const char *name, const void *data,
                            int64_t sp, int64_t st, int64_t sh, const fa_paged_desc *d, int output)
{
    const fa_kv_cache *c = &d->cache;
    if (!data)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "%s must not be NULL", name);
    const char *sn[3] = { "stride_page", "stride_token", "stride_head" };
    const int64_t s[3] = { sp, st, sh };
    for (int i = 0; i < 3; i++)
        if (s[i] <= 0)
            return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s's %s (%lld) must be positive", name, sn[i],
                            (long long)s[i]);
    fa_axis ax[4] = { { "head_dim", 1, d->head_dim },
                      { sn[2], sh, c->num_heads },
                      { sn[1], st, c->page_size },
                      { sn[0], sp, c->num_pages } };
    int64_t last = fa_max_offset(ax, 4), bytes;
    if (last < 0 || !fa_add_ok(last, 1, &last) || !fa_mul_ok(last, fa_dtype_bytes(c->dtype), &bytes))
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "%s spans more than 2^63 bytes", name);
    if (output) {
        int i = fa_first_overlap(ax, 4);
        if (i >= 0)
            return fa_error(ctx, FA_ERR_INVALID_STRIDE,
                            "%s's %s (%lld) makes cache elements overlap; a cache that is written "
                            "needs non-overlapping strides",
                            name, ax[i].name, (long long)ax[i].stride);
    }
    const int64_t stride[3] = { sh, st, sp }, count[3] = { c->num_heads, c->page_size, c->num_pages };
    return fa_byte_view_make(ctx, v, name, data, d->head_dim * fa_dtype_bytes(c->dtype), stride, count,
                             fa_dtype_bytes(c->dtype));
}

/* A required small array of n elements of `elem` bytes as a view. */
static fa_status array_view(fa_context_t ctx, fa_byte_view *v, const char *name, const void *data,
                            int64_t n, int64_t elem)
{
    if (!data)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "%s must not be NULL", name);
    int64_t bytes;
    if (!fa_mul_ok(n, elem, &bytes))
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "%s spans more than 2^63 bytes", name);
    const int64_t stride[3] = { 1, 1, 1 }, count[3] = { 1, 1, 1 }; /* one row: elem aligns only */
    return fa_byte_view_make(ctx, v, name, data, bytes > 0 ? bytes : 1, stride, count, elem);
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* An append's pages (those its new rows land in) each appear once among the entries the call
 * uses: no other sequence, and no other entry of the same sequence, reads or writes them while
 * they are written. The table's ids are already checked. */
static fa_status check_written_pages(fa_context_t ctx, const fa_paged_problem *pg)
{
    const fa_paged_desc *d = pg->desc;
    const int64_t ps = pg->page_size;
    int64_t n = 0;
    for (int32_t b = 0; b < d->batch; b++) {
        const int64_t cached = d->cache_seqlens[b], qn = d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b];
        n += qn ? (cached + qn - 1) / ps - cached / ps + 1 : 0;
    }
    if (n == 0)
        return FA_OK;
    int32_t *w = malloc(sizeof(int32_t) * (size_t)n), *count = calloc((size_t)n, sizeof(int32_t));
    if (!w || !count) {
        free(w), free(count);
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory checking the pages an append writes");
    }
    int64_t m = 0;
    for (int32_t b = 0; b < d->batch; b++) {
        const int64_t cached = d->cache_seqlens[b], qn = d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b];
        for (int64_t i = cached / ps; qn && i <= (cached + qn - 1) / ps; i++)
            w[m++] = d->block_table[(int64_t)b * pg->bt_stride + i];
    }
    qsort(w, (size_t)m, sizeof(int32_t), cmp_i32);
    fa_status st = FA_OK;
    for (int32_t b = 0; b < d->batch && st == FA_OK; b++) {
        const int64_t qn = d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b], keys = d->cache_seqlens[b] + qn;
        for (int64_t i = 0; i < (keys + ps - 1) / ps && st == FA_OK; i++) {
            const int32_t id = d->block_table[(int64_t)b * pg->bt_stride + i];
            const int32_t *at = bsearch(&id, w, (size_t)m, sizeof(int32_t), cmp_i32);
            while (at && at > w && at[-1] == id)
                at--;
            if (at && ++count[at - w] > 1)
                st = fa_error(ctx, FA_ERR_INVALID_VALUE,
                              "block_table[%d][%lld] (%d) is a page this call appends to, and it is "
                              "used by another entry too: a page receiving new rows must belong to "
                              "one sequence, once",
                              (int)b, (long long)i, (int)id);
        }
    }
    free(w), free(count);
    return st;
}

/* Host-side lengths, page ids and positions (backends whose tables are host memory). */
static fa_status check_tables(fa_context_t ctx, const fa_paged_problem *pg)
{
    const fa_paged_desc *d = pg->desc;
    fa_status st = fa_check_cu(ctx, "cu_seqlens_q", d->cu_seqlens_q, d->batch, d->total_q, "total_q");
    if (st != FA_OK)
        return st;
    for (int32_t b = 0; b < d->batch; b++) {
        const int64_t q0 = d->cu_seqlens_q[b], qn = d->cu_seqlens_q[b + 1] - q0;
        const int64_t cached = d->cache_seqlens[b], keys = cached + (pg->append ? qn : 0);
        if (qn > d->max_seqlen_q)
            return fa_error(ctx, FA_ERR_INVALID_SHAPE,
                            "sequence %d has %lld query rows, more than max_seqlen_q (%d)", (int)b,
                            (long long)qn, (int)d->max_seqlen_q);
        if (cached < 0)
            return fa_error(ctx, FA_ERR_INVALID_SHAPE, "cache_seqlens[%d] (%lld) must not be negative",
                            (int)b, (long long)cached);
        if (keys > d->max_seqlen_k)
            return fa_error(ctx, FA_ERR_INVALID_SHAPE,
                            "cache_seqlens[%d] (%lld)%s gives %lld keys, more than max_seqlen_k (%d)",
                            (int)b, (long long)cached, pg->append ? " plus its new rows" : "",
                            (long long)keys, (int)d->max_seqlen_k);
        for (int64_t i = 0; i < (keys + pg->page_size - 1) / pg->page_size; i++) {
            const int32_t id = d->block_table[(int64_t)b * pg->bt_stride + i];
            if (id < 0 || id >= pg->num_pages)
                return fa_error(ctx, FA_ERR_INVALID_VALUE,
                                "block_table[%d][%lld] (%d) is not a page of the cache "
                                "(cache.num_pages %d)",
                                (int)b, (long long)i, (int)id, (int)pg->num_pages);
        }
        for (int64_t i = 0; pg->rope_dim && i < qn; i++) {
            const int64_t pos = fa_rope_position(pg, q0 + i, i, qn, keys);
            if (pos < 0 || pos >= d->rope_max_pos)
                return fa_error(ctx, FA_ERR_INVALID_VALUE,
                                "%s of query row %lld (%lld) is outside the rope tables' "
                                "rope_max_pos (%d) rows",
                                d->positions ? "positions[row]" : "the position", (long long)(q0 + i),
                                (long long)pos, (int)d->rope_max_pos);
        }
    }
    return pg->append ? check_written_pages(ctx, pg) : FA_OK;
}

/* check_tables = 1 on a backend whose tables are device memory: download them and check them
 * as the host's are (this synchronises). */
static fa_status check_device_tables(fa_context_t ctx, const fa_paged_problem *pg, int64_t bt_elems)
{
    const fa_paged_desc *d = pg->desc;
    const int64_t n_pos = pg->rope_dim && d->positions ? d->total_q : 0;
    const size_t n = (size_t)(d->batch + 1) + (size_t)d->batch + (size_t)bt_elems + (size_t)n_pos;
    int32_t *h = malloc(sizeof(int32_t) * n);
    if (!h)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory reading the tables back");
    fa_paged_desc copy = *d;
    int32_t *cu = h, *lens = cu + d->batch + 1, *bt = lens + d->batch, *pos = bt + bt_elems;
    const struct {
        int32_t *dst;
        const int32_t *src;
        int64_t count;
    } parts[] = { { cu, d->cu_seqlens_q, d->batch + 1 },
                  { lens, d->cache_seqlens, d->batch },
                  { bt, d->block_table, bt_elems },
                  { pos, d->positions, n_pos } };
    fa_status st = FA_OK;
    for (size_t i = 0; i < 4 && st == FA_OK; i++)
        if (parts[i].count)
            st = ctx->iface->mem_copy(ctx, ctx->state, parts[i].dst, parts[i].src,
                                      sizeof(int32_t) * (size_t)parts[i].count, 0);
    if (st == FA_OK) {
        copy.cu_seqlens_q = cu;
        copy.cache_seqlens = lens;
        copy.block_table = bt;
        copy.positions = n_pos ? pos : NULL;
        fa_paged_problem hp = *pg;
        hp.desc = &copy;
        st = check_tables(ctx, &hp);
    }
    free(h);
    return st;
}

/*
 * Validate d and fill pg and p. CHECK_PLAN reads shapes and settings only; CHECK_RUN every
 * pointer, stride and (host tables) the lengths and page ids; CHECK_APPEND what an append
 * reads and writes.
 */
static fa_status validate(fa_context_t ctx, const fa_paged_desc *d, int mode, fa_paged_problem *pg,
                          fa_problem *p)
{
    if (!d)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "desc must not be NULL");
    if (d->size != sizeof(*d))
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "desc->size (%zu) must be sizeof(fa_paged_desc) (%zu); call "
                        "fa_paged_desc_init first",
                        d->size, sizeof(*d));
    const int append = mode == CHECK_APPEND || (mode == CHECK_RUN ? d->k_new.data != NULL
                                                                   : d->k_new.data != NULL || d->v_new.data);
    if (mode == CHECK_RUN && (d->k_new.data == NULL) != (d->v_new.data == NULL))
        return fa_error(ctx, FA_ERR_NULL_POINTER, "%s.data is NULL but %s.data is set: give both or neither",
                        d->k_new.data ? "v_new" : "k_new", d->k_new.data ? "k_new" : "v_new");
    fa_status st;
    if ((st = check_dims(ctx, d, mode)) != FA_OK || (st = check_types(ctx, d, append, mode)) != FA_OK)
        return st;

    memset(pg, 0, sizeof(*pg));
    pg->desc = d;
    pg->page_size = d->cache.page_size;
    pg->num_pages = d->cache.num_pages;
    pg->max_pages = d->max_pages_per_seq;
    pg->bt_stride = d->block_table_stride ? d->block_table_stride : d->max_pages_per_seq;
    pg->append = append;
    pg->rope_dim = d->rope == FA_ROPE_NONE ? 0 : d->rope_dim ? d->rope_dim : d->head_dim;
    pg->host_tables = !ctx->iface->tables_on_device;

    fa_attention_desc *a = &pg->dense;
    fa_attention_desc_init(a);
    a->batch = d->batch;
    a->seqlen_q = d->total_q;
    a->num_heads_q = mode == CHECK_APPEND ? d->cache.num_heads : d->num_heads_q;
    a->num_heads_kv = d->cache.num_heads;
    a->head_dim = d->head_dim;
    a->q = d->q;
    a->o = d->o;
    a->k = (fa_tensor){ d->cache.k, d->cache.dtype, d->cache.k_stride_page, d->cache.k_stride_token,
                        d->cache.k_stride_head };
    a->v = (fa_tensor){ d->cache.v, d->cache.dtype, d->cache.v_stride_page, d->cache.v_stride_token,
                        d->cache.v_stride_head };
    a->lse = mode == CHECK_APPEND ? NULL : d->lse;
    a->scale = d->scale;
    a->causal = d->causal;
    a->window_left = d->window_left;
    a->window_right = d->window_right;
    a->softcap = d->softcap;
    a->cu_seqlens_q = d->cu_seqlens_q;
    if (mode != CHECK_APPEND && (st = fa_check_scalars(ctx, a)) != FA_OK)
        return st;

    memset(p, 0, sizeof(*p));
    p->desc = a;
    p->paged = pg;
    p->varlen = 1;
    p->batch = d->batch;
    p->heads_q = a->num_heads_q;
    p->heads_kv = d->cache.num_heads;
    p->group = p->heads_q / p->heads_kv;
    p->dim = d->head_dim;
    p->max_q = d->max_seqlen_q;
    p->max_k = d->max_seqlen_k;
    p->scale = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)d->head_dim));
    p->softcap = d->softcap;
    p->win_left = d->window_left < 0 ? FA_WINDOW_INF : d->window_left;
    p->win_right = d->causal ? 0 : d->window_right < 0 ? FA_WINDOW_INF : d->window_right;
    p->dropout_scale = 1.0f;
    p->in_dtype = d->cache.dtype;
    p->out_dtype = mode == CHECK_APPEND ? d->cache.dtype : d->o.dtype;
    if (d->lse_stride_head == 0 && d->lse_stride_seq == 0) {
        p->lse_sh = d->total_q;
        p->lse_ss = 1;
    } else {
        p->lse_sh = d->lse_stride_head;
        p->lse_ss = d->lse_stride_seq;
    }
    if (mode == CHECK_PLAN)
        return FA_OK;

    /* Pointers and strides. Views: inputs first, then the outputs. */
    fa_byte_view in[12], out[4];
    int ni = 0, no = 0;
    const int64_t hq = d->num_heads_q, hk = d->cache.num_heads, dim = d->head_dim, tq = d->total_q;
    if (mode == CHECK_RUN) {
        if ((st = fa_check_tensor(ctx, "q", &d->q, 1, tq, hq, dim, 1, 0)) != FA_OK ||
            (st = fa_check_tensor(ctx, "o", &d->o, 1, tq, hq, dim, 1, 1)) != FA_OK ||
            (st = fa_tensor_view(ctx, &in[ni++], "q.data", &d->q, 1, tq, hq, dim, 1)) != FA_OK ||
            (st = fa_tensor_view(ctx, &out[no++], "o.data", &d->o, 1, tq, hq, dim, 1)) != FA_OK)
            return st;
    }
    if (append) {
        if ((st = fa_check_tensor(ctx, "k_new", &d->k_new, 1, tq, hk, dim, 1, 0)) != FA_OK ||
            (st = fa_check_tensor(ctx, "v_new", &d->v_new, 1, tq, hk, dim, 1, 0)) != FA_OK ||
            (st = fa_tensor_view(ctx, &in[ni++], "k_new.data", &d->k_new, 1, tq, hk, dim, 1)) != FA_OK ||
            (st = fa_tensor_view(ctx, &in[ni++], "v_new.data", &d->v_new, 1, tq, hk, dim, 1)) != FA_OK)
            return st;
    }
    fa_byte_view *kv = append ? out + no : in + ni;
    const fa_kv_cache *c = &d->cache;
    if ((st = cache_view(ctx, &kv[0], "cache.k", c->k, c->k_stride_page, c->k_stride_token,
                         c->k_stride_head, d, append)) != FA_OK ||
        (st = cache_view(ctx, &kv[1], "cache.v", c->v, c->v_stride_page, c->v_stride_token,
                         c->v_stride_head, d, append)) != FA_OK)
        return st;
    if (append)
        no += 2;
    else
        ni += 2;
    if ((st = array_view(ctx, &in[ni++], "cu_seqlens_q", d->cu_seqlens_q, (int64_t)d->batch + 1, 4)) != FA_OK ||
        (st = array_view(ctx, &in[ni++], "cache_seqlens", d->cache_seqlens, d->batch, 4)) != FA_OK)
        return st;
    int64_t bt_elems;
    if (!fa_mul_ok(pg->bt_stride, (int64_t)d->batch - 1, &bt_elems) ||
        !fa_add_ok(bt_elems, d->max_pages_per_seq, &bt_elems) ||
        (st = array_view(ctx, &in[ni++], "block_table", d->block_table, bt_elems, 4)) != FA_OK)
        return st == FA_OK ? fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "block_table spans more than 2^63 bytes")
                           : st;
    if (pg->rope_dim) {
        const int64_t n = (int64_t)d->rope_max_pos * (pg->rope_dim / 2);
        if ((st = array_view(ctx, &in[ni++], "rope_cos", d->rope_cos, n, 4)) != FA_OK ||
            (st = array_view(ctx, &in[ni++], "rope_sin", d->rope_sin, n, 4)) != FA_OK ||
            (d->positions && (st = array_view(ctx, &in[ni++], "positions", d->positions, tq, 4)) != FA_OK))
            return st;
    }
    if (mode == CHECK_RUN) {
        if (d->sinks && (st = array_view(ctx, &in[ni++], "sinks", d->sinks, hq, 4)) != FA_OK)
            return st;
        if (d->lse) {
            if ((d->lse_stride_head || d->lse_stride_seq) && (p->lse_sh <= 0 || p->lse_ss <= 0))
                return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s (%lld) must be positive",
                                p->lse_sh <= 0 ? "lse_stride_head" : "lse_stride_seq",
                                (long long)(p->lse_sh <= 0 ? p->lse_sh : p->lse_ss));
            fa_axis ax[2] = { { "lse_stride_seq", p->lse_ss, tq }, { "lse_stride_head", p->lse_sh, hq } };
            int64_t last = fa_max_offset(ax, 2), bytes;
            if (last < 0 || !fa_add_ok(last, 1, &last) || !fa_mul_ok(last, 4, &bytes))
                return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "lse spans more than 2^63 bytes");
            int i = fa_first_overlap(ax, 2);
            if (i >= 0)
                return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s (%lld) makes lse elements overlap",
                                ax[i].name, (long long)ax[i].stride);
            const int64_t stride[3] = { p->lse_ss, p->lse_sh, 1 }, count[3] = { tq, hq, 1 };
            if ((st = fa_byte_view_make(ctx, &out[no++], "lse", d->lse, 4, stride, count, 4)) != FA_OK)
                return st;
        }
    }
    fa_byte_view all[16];
    memcpy(all, in, sizeof(in[0]) * (size_t)ni);
    memcpy(all + ni, out, sizeof(out[0]) * (size_t)no);
    if ((st = fa_check_disjoint(ctx, all, ni, ni + no)) != FA_OK)
        return st;
    if (pg->host_tables)
        return check_tables(ctx, pg);
    return d->check_tables ? check_device_tables(ctx, pg, bt_elems) : FA_OK;
}

/* ---- entry points ---- */

static fa_status unsupported(fa_context_t ctx, const char *what)
{
    return fa_error(ctx, FA_ERR_UNSUPPORTED,
                    "%s: the %s backend has no paged KV cache; use the CPU or CUDA backend", what,
                    ctx->iface->name);
}

static void info_start(fa_context_t ctx, fa_run_info *ri)
{
    memset(ri, 0, sizeof(*ri));
    ri->size = sizeof(*ri);
    ri->backend = ctx->iface->id;
    ri->backend_name = ctx->iface->name;
}

static void remember(fa_context_t ctx, const fa_run_info *ri)
{
    ctx->last_run = *ri;
    ctx->has_last_run = 1;
    ctx->error[0] = '\0';
}

fa_status fa_paged_plan_create(fa_context_t ctx, const fa_paged_desc *bounds, fa_paged_plan_t *out)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (!out)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "out must not be NULL");
    *out = NULL;
    if (!ctx->iface->paged_plan)
        return unsupported(ctx, "fa_paged_plan_create");
    fa_paged_problem pg;
    fa_problem p;
    fa_status st = validate(ctx, bounds, CHECK_PLAN, &pg, &p);
    if (st != FA_OK)
        return st;
    struct fa_paged_plan *plan = calloc(1, sizeof(*plan));
    if (!plan)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the plan");
    plan->ctx = ctx;
    plan->bounds = *bounds;
    plan->append = pg.append;
    plan->rope_dim = pg.rope_dim;
    info_start(ctx, &plan->info);
    if ((st = ctx->iface->paged_plan(ctx, ctx->state, &p, &plan->backend_plan, &plan->info)) != FA_OK) {
        free(plan);
        return st;
    }
    remember(ctx, &plan->info);
    *out = plan;
    return FA_OK;
}

void fa_paged_plan_destroy(fa_paged_plan_t plan)
{
    if (!plan)
        return;
    plan->ctx->iface->paged_plan_free(plan->ctx->state, plan->backend_plan);
    free(plan);
}

fa_status fa_paged_plan_info(fa_paged_plan_t plan, fa_run_info *info)
{
    if (!plan)
        return FA_ERR_NULL_POINTER;
    if (!info)
        return fa_error(plan->ctx, FA_ERR_NULL_POINTER, "info must not be NULL");
    if (info->size != sizeof(*info))
        return fa_error(plan->ctx, FA_ERR_INVALID_ARGUMENT,
                        "info->size (%zu) must be sizeof(fa_run_info) (%zu)", info->size, sizeof(*info));
    *info = plan->info;
    return FA_OK;
}

/* A dtype of the plan's messages (the call's dtypes are validated: one of the four). */
static const char *dtype_name(fa_dtype t)
{
    return t == FA_DTYPE_F32 ? "f32" : t == FA_DTYPE_F16 ? "f16" : t == FA_DTYPE_BF16 ? "bf16" : "e4m3";
}

/* A call within the plan's bounds and settings, or the first field that is not. */
static fa_status check_against_plan(fa_context_t ctx, const struct fa_paged_plan *pl,
                                    const fa_paged_desc *d, const fa_paged_problem *pg)
{
    const fa_paged_desc *b = &pl->bounds;
    const struct {
        const char *name;
        int64_t got, bound;
    } le[] = { { "batch", d->batch, b->batch },
               { "total_q", d->total_q, b->total_q },
               { "max_seqlen_q", d->max_seqlen_q, b->max_seqlen_q },
               { "max_seqlen_k", d->max_seqlen_k, b->max_seqlen_k } };
    for (size_t i = 0; i < sizeof(le) / sizeof(le[0]); i++)
        if (le[i].got > le[i].bound)
            return fa_error(ctx, FA_ERR_INVALID_SHAPE,
                            "%s (%lld) exceeds the plan's bound (%lld): make a plan for larger bounds",
                            le[i].name, (long long)le[i].got, (long long)le[i].bound);
    const struct {
        const char *name;
        int64_t got, want;
    } eq[] = { { "num_heads_q", d->num_heads_q, b->num_heads_q },
               { "head_dim", d->head_dim, b->head_dim },
               { "cache.num_heads", d->cache.num_heads, b->cache.num_heads },
               { "cache.page_size", d->cache.page_size, b->cache.page_size },
               { "rope", d->rope, b->rope },
               { "rope_dim", pg->rope_dim, pl->rope_dim },
               { "kv_split", d->kv_split, b->kv_split },
               { "k_new.data (set or NULL)", pg->append, pl->append },
               { "lse (set or NULL)", d->lse != NULL, b->lse != NULL },
               { "sinks (set or NULL)", d->sinks != NULL, b->sinks != NULL } };
    for (size_t i = 0; i < sizeof(eq) / sizeof(eq[0]); i++)
        if (eq[i].got != eq[i].want)
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT, "%s (%lld) differs from the plan's (%lld)",
                            eq[i].name, (long long)eq[i].got, (long long)eq[i].want);
    const struct {
        const char *name;
        fa_dtype got, want;
    } dt[] = { { "cache.dtype", d->cache.dtype, b->cache.dtype }, { "o.dtype", d->o.dtype, b->o.dtype } };
    for (size_t i = 0; i < sizeof(dt) / sizeof(dt[0]); i++)
        if (dt[i].got != dt[i].want)
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT, "%s (%s) differs from the plan's (%s)", dt[i].name,
                            dtype_name(dt[i].got), dtype_name(dt[i].want));
    return FA_OK;
}

fa_status fa_paged_run(fa_paged_plan_t plan, const fa_paged_desc *desc)
{
    if (!plan)
        return FA_ERR_NULL_POINTER;
    fa_context_t ctx = plan->ctx;
    fa_paged_problem pg;
    fa_problem p;
    fa_status st = validate(ctx, desc, CHECK_RUN, &pg, &p);
    if (st != FA_OK || (st = check_against_plan(ctx, plan, desc, &pg)) != FA_OK)
        return st;
    /* the plan's bounds, not this call's, are what its kernels were sized for */
    p.max_q = plan->bounds.max_seqlen_q;
    p.max_k = plan->bounds.max_seqlen_k;
    fa_run_info ri = plan->info;
    if ((st = ctx->iface->paged_run(ctx, ctx->state, plan->backend_plan, &p, &ri)) != FA_OK)
        return st;
    remember(ctx, &ri);
    return FA_OK;
}

fa_status fa_paged_forward(fa_context_t ctx, const fa_paged_desc *desc)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (!ctx->iface->paged_plan) /* before validation reads any table: they are the backend's memory */
        return unsupported(ctx, "fa_paged_forward");
    fa_paged_problem pg;
    fa_problem p;
    fa_status st = validate(ctx, desc, CHECK_RUN, &pg, &p);
    if (st != FA_OK)
        return st;
    fa_run_info ri;
    info_start(ctx, &ri);
    void *bp = NULL;
    if ((st = ctx->iface->paged_plan(ctx, ctx->state, &p, &bp, &ri)) != FA_OK)
        return st;
    st = ctx->iface->paged_run(ctx, ctx->state, bp, &p, &ri);
    ctx->iface->paged_plan_free(ctx->state, bp);
    if (st == FA_OK)
        remember(ctx, &ri);
    return st;
}

fa_status fa_kv_append(fa_context_t ctx, const fa_paged_desc *desc)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (!ctx->iface->append)
        return unsupported(ctx, "fa_kv_append");
    if (desc && desc->size == sizeof(*desc) && (!desc->k_new.data || !desc->v_new.data))
        return fa_error(ctx, FA_ERR_NULL_POINTER, "%s.data must not be NULL: it holds the rows to append",
                        desc->k_new.data ? "v_new" : "k_new");
    fa_paged_problem pg;
    fa_problem p;
    fa_status st = validate(ctx, desc, CHECK_APPEND, &pg, &p);
    if (st != FA_OK)
        return st;
    if ((st = ctx->iface->append(ctx, ctx->state, &p)) == FA_OK)
        ctx->error[0] = '\0';
    return st;
}

fa_status fa_merge_states(fa_context_t ctx, const fa_merge_desc *d)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (!d)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "desc must not be NULL");
    if (d->size != sizeof(*d))
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "desc->size (%zu) must be sizeof(fa_merge_desc) (%zu); call "
                        "fa_merge_desc_init first",
                        d->size, sizeof(*d));
    const struct {
        const char *name;
        int64_t v, min, max;
    } dims[] = { { "num_states", d->num_states, 1, FA_MAX_MERGE_STATES },
                 { "rows", d->rows, 0, INT32_MAX },
                 { "num_heads", d->num_heads, 1, FA_MAX_HEADS },
                 { "head_dim", d->head_dim, 1, FA_MAX_HEAD_DIM } };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        if (dims[i].v < dims[i].min || dims[i].v > dims[i].max)
            return fa_error(ctx, FA_ERR_INVALID_SHAPE, "%s (%lld) must be in %lld..%lld", dims[i].name,
                            (long long)dims[i].v, (long long)dims[i].min, (long long)dims[i].max);
    if (!fa_dtype_valid(d->o_in.dtype) || !fa_dtype_valid(d->o.dtype))
        return fa_error(ctx, FA_ERR_INVALID_DTYPE, "%s.dtype is not a fa_dtype",
                        fa_dtype_valid(d->o_in.dtype) ? "o" : "o_in");
    if (d->o_in.dtype == FA_DTYPE_E4M3 || d->o.dtype == FA_DTYPE_E4M3)
        return fa_error(ctx, FA_ERR_INVALID_DTYPE, "%s.dtype: states are f32, f16 or bf16, not fp8",
                        d->o_in.dtype == FA_DTYPE_E4M3 ? "o_in" : "o");
    if (d->o.dtype != d->o_in.dtype && d->o.dtype != FA_DTYPE_F32)
        return fa_error(ctx, FA_ERR_INVALID_DTYPE,
                        "o.dtype (%d) must equal o_in.dtype (%d) or be FA_DTYPE_F32", (int)d->o.dtype,
                        (int)d->o_in.dtype);
    const int64_t ns = d->num_states, r = d->rows, h = d->num_heads, dim = d->head_dim;
    fa_byte_view v[4];
    fa_status st;
    if ((st = fa_check_tensor(ctx, "o_in", &d->o_in, ns, r, h, dim, 0, 0)) != FA_OK ||
        (st = fa_check_tensor(ctx, "o", &d->o, 1, r, h, dim, 1, 1)) != FA_OK ||
        (st = fa_tensor_view(ctx, &v[0], "o_in.data", &d->o_in, ns, r, h, dim, 0)) != FA_OK ||
        (st = fa_tensor_view(ctx, &v[2], "o.data", &d->o, 1, r, h, dim, 1)) != FA_OK)
        return st;
    if (!d->lse_in)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "lse_in must not be NULL");
    /* all zero: packed; an axis of one entry (or none) reads no stride, so any value stands */
    const int dflt_in = !d->lse_in_stride_state && !d->lse_in_stride_head && !d->lse_in_stride_row;
    const int64_t r1 = r > 0 ? r : 1, ci[3] = { r, h, ns }, co[3] = { r, h, 1 };
    int64_t in_s[3] = { dflt_in ? 1 : d->lse_in_stride_row, dflt_in ? r1 : d->lse_in_stride_head,
                        dflt_in ? r1 * h : d->lse_in_stride_state };
    const int dflt = !d->lse_stride_head && !d->lse_stride_row;
    int64_t out_s[3] = { dflt ? 1 : d->lse_stride_row, dflt ? r1 : d->lse_stride_head, 1 };
    for (int i = 0; i < 3; i++) {
        if (ci[i] <= 1)
            in_s[i] = 1;
        if (co[i] <= 1)
            out_s[i] = 1;
    }
    const char *in_names[3] = { "lse_in_stride_row", "lse_in_stride_head", "lse_in_stride_state" };
    const char *out_names[2] = { "lse_stride_row", "lse_stride_head" };
    for (int i = 0; i < 3; i++)
        if (in_s[i] <= 0 || (d->lse && i < 2 && out_s[i] <= 0))
            return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s (%lld) must be positive",
                            in_s[i] <= 0 ? in_names[i] : out_names[i],
                            (long long)(in_s[i] <= 0 ? in_s[i] : out_s[i]));
    fa_axis ai[3] = { { in_names[0], in_s[0], r }, { in_names[1], in_s[1], h }, { in_names[2], in_s[2], ns } };
    fa_axis ao[2] = { { out_names[0], out_s[0], r }, { out_names[1], out_s[1], h } };
    const int64_t last_in = fa_max_offset(ai, 3), last_out = d->lse ? fa_max_offset(ao, 2) : 0;
    if (last_in < 0 || last_in > INT64_MAX / 8 || last_out < 0 || last_out > INT64_MAX / 8)
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "%s spans more than 2^63 bytes (its strides)",
                        last_in < 0 || last_in > INT64_MAX / 8 ? "lse_in" : "lse");
    if ((st = fa_byte_view_make(ctx, &v[1], "lse_in", d->lse_in, 4, in_s, ci, 4)) != FA_OK)
        return st;
    int n = 3;
    if (d->lse) {
        int i = fa_first_overlap(ao, 2);
        if (i >= 0)
            return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s (%lld) makes lse elements overlap",
                            ao[i].name, (long long)ao[i].stride);
        if ((st = fa_byte_view_make(ctx, &v[n++], "lse", d->lse, 4, out_s, co, 4)) != FA_OK)
            return st;
    }
    if ((st = fa_check_disjoint(ctx, v, 2, n)) != FA_OK)
        return st;
    if (!ctx->iface->merge)
        return unsupported(ctx, "fa_merge_states");
    if (r == 0) { /* nothing to merge: no launch (a grid of no blocks is an error on CUDA) */
        ctx->error[0] = '\0';
        return FA_OK;
    }
    fa_merge_desc res = *d; /* strides resolved: the backend reads no defaults */
    res.lse_in_stride_row = in_s[0];
    res.lse_in_stride_head = in_s[1];
    res.lse_in_stride_state = in_s[2];
    res.lse_stride_row = out_s[0];
    res.lse_stride_head = out_s[1];
    if ((st = ctx->iface->merge(ctx, ctx->state, &res)) == FA_OK)
        ctx->error[0] = '\0';
    return st;
}
