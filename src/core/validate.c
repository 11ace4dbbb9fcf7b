/* SPDX-License-Identifier: MIT */
/* Validation of an attention descriptor: every field checked before any work starts. */
#include "views.h"

#include "dropout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int fa_mul_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

int fa_add_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

void *fa_alloc_aligned(size_t bytes)
{
    size_t rounded = (bytes + 63) & ~(size_t)63; /* C11 wants a multiple of the alignment */
    if (rounded < bytes)
        return NULL;
    return aligned_alloc(64, rounded ? rounded : 64);
}

static fa_status lse_view(fa_context_t ctx, fa_byte_view *v, const fa_attention_desc *d,
                          const fa_problem *p)
{
    const int64_t stride[3] = { p->lse_ss, p->lse_sh, p->lse_sb };
    const int64_t count[3] = { d->seqlen_q, d->num_heads_q, p->varlen ? 1 : d->batch };
    return fa_byte_view_make(ctx, v, "lse", d->lse, 4, stride, count, 4);
}

/* q, k, v and o as byte views, in that order. */
static fa_status tensor_views(fa_context_t ctx, fa_byte_view v[4], const fa_attention_desc *d,
                              const fa_problem *p)
{
    const int64_t b = d->batch, hq = d->num_heads_q, hk = d->num_heads_kv, dim = d->head_dim;
    const int vl = p->varlen;
    fa_status st;
    if ((st = fa_tensor_view(ctx, &v[0], "q.data", &d->q, b, d->seqlen_q, hq, dim, vl)) != FA_OK ||
        (st = fa_tensor_view(ctx, &v[1], "k.data", &d->k, b, d->seqlen_k, hk, dim, vl)) != FA_OK ||
        (st = fa_tensor_view(ctx, &v[2], "v.data", &d->v, b, d->seqlen_k, hk, dim, vl)) != FA_OK)
        return st;
    return fa_tensor_view(ctx, &v[3], "o.data", &d->o, b, d->seqlen_q, hq, dim, vl);
}

static fa_status check_shape(fa_context_t ctx, const fa_attention_desc *d)
{
    /* packed varlen tensors may hold no token at all (every sequence empty) */
    const int32_t min_seq = d->cu_seqlens_q && d->cu_seqlens_k ? 0 : 1;
    struct {
        const char *name;
        int32_t v, min;
    } dims[] = { { "batch", d->batch, 1 },
                 { "seqlen_q", d->seqlen_q, min_seq },
                 { "seqlen_k", d->seqlen_k, min_seq },
                 { "num_heads_q", d->num_heads_q, 1 },
                 { "num_heads_kv", d->num_heads_kv, 1 },
                 { "head_dim", d->head_dim, 1 } };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        if (dims[i].v < dims[i].min)
            return fa_error(ctx, FA_ERR_INVALID_SHAPE, "%s (%d) must be at least %d",
                            dims[i].name, (int)dims[i].v, (int)dims[i].min);
    if (d->num_heads_q > FA_MAX_HEADS || d->num_heads_kv > FA_MAX_HEADS)
        return fa_error(ctx, FA_ERR_INVALID_SHAPE, "%s (%d) must be at most %d",
                        d->num_heads_q > FA_MAX_HEADS ? "num_heads_q" : "num_heads_kv",
                        (int)(d->num_heads_q > FA_MAX_HEADS ? d->num_heads_q : d->num_heads_kv),
                        FA_MAX_HEADS);
    if (d->head_dim > FA_MAX_HEAD_DIM)
        return fa_error(ctx, FA_ERR_INVALID_SHAPE, "head_dim (%d) must be at most %d",
                        (int)d->head_dim, FA_MAX_HEAD_DIM);
    if (d->num_heads_q % d->num_heads_kv != 0)
        return fa_error(ctx, FA_ERR_INVALID_SHAPE,
                        "num_heads_q (%d) must be a multiple of num_heads_kv (%d)",
                        (int)d->num_heads_q, (int)d->num_heads_kv);
    return FA_OK;
}

fa_status fa_check_scalars(fa_context_t ctx, const fa_attention_desc *d)
{
    if (!(fabsf(d->scale) <= FA_MAX_SCALE))
        return fa_error(ctx, FA_ERR_INVALID_VALUE,
                        "scale (%g) must be finite with magnitude at most %g (0 = 1/sqrt(head_dim))",
                        (double)d->scale, (double)FA_MAX_SCALE);
    if (d->causal != 0 && d->causal != 1)
        return fa_error(ctx, FA_ERR_INVALID_VALUE, "causal (%d) must be 0 or 1", (int)d->causal);
    if (d->window_left < -1)
        return fa_error(ctx, FA_ERR_INVALID_VALUE,
                        "window_left (%d) must be -1 (unbounded) or >= 0", (int)d->window_left);
    if (d->window_right < -1)
        return fa_error(ctx, FA_ERR_INVALID_VALUE,
                        "window_right (%d) must be -1 (unbounded) or >= 0", (int)d->window_right);
    if (!(d->softcap >= 0.0f && d->softcap <= FA_MAX_SCALE))
        return fa_error(ctx, FA_ERR_INVALID_VALUE, "softcap (%g) must be in [0, %g] (0 = off)",
                        (double)d->softcap, (double)FA_MAX_SCALE);
    if (!(d->dropout_p >= 0.0f && d->dropout_p < 1.0f))
        return fa_error(ctx, FA_ERR_INVALID_VALUE, "dropout_p (%g) must be in [0, 1)",
                        (double)d->dropout_p);
    if (d->algorithm != FA_ALGORITHM_FLASH && d->algorithm != FA_ALGORITHM_STANDARD)
        return fa_error(ctx, FA_ERR_INVALID_VALUE, "algorithm (%d) is not a fa_algorithm",
                        (int)d->algorithm);
    return FA_OK;
}

static fa_status check_dtypes(fa_context_t ctx, const fa_attention_desc *d)
{
    const struct {
        const char *name;
        fa_dtype t;
    } ts[] = { { "q", d->q.dtype }, { "k", d->k.dtype }, { "v", d->v.dtype }, { "o", d->o.dtype } };
    for (size_t i = 0; i < 4; i++)
        if (!fa_dtype_valid(ts[i].t))
            return fa_error(ctx, FA_ERR_INVALID_DTYPE, "%s.dtype (%d) is not a fa_dtype",
                            ts[i].name, (int)ts[i].t);
    if (d->k.dtype != d->q.dtype)
        return fa_error(ctx, FA_ERR_INVALID_DTYPE, "k.dtype (%d) must equal q.dtype (%d)",
                        (int)d->k.dtype, (int)d->q.dtype);
    if (d->v.dtype != d->q.dtype)
        return fa_error(ctx, FA_ERR_INVALID_DTYPE, "v.dtype (%d) must equal q.dtype (%d)",
                        (int)d->v.dtype, (int)d->q.dtype);
    if (d->q.dtype == FA_DTYPE_E4M3 && d->o.dtype != FA_DTYPE_BF16 && d->o.dtype != FA_DTYPE_F32)
        return fa_error(ctx, FA_ERR_INVALID_DTYPE,
                        "o.dtype (%d) must be FA_DTYPE_BF16 or FA_DTYPE_F32 for fp8 (FA_DTYPE_E4M3) inputs",
                        (int)d->o.dtype);
    if (d->q.dtype != FA_DTYPE_E4M3 && d->o.dtype != d->q.dtype && d->o.dtype != FA_DTYPE_F32)
        return fa_error(ctx, FA_ERR_INVALID_DTYPE,
                        "o.dtype (%d) must equal q.dtype (%d) or be FA_DTYPE_F32",
                        (int)d->o.dtype, (int)d->q.dtype);
    return FA_OK;
}

/* The descale factors of fp8 inputs: absent for other dtypes, strides >= 0, block_rows in
 * range, their extent in range (ceil(rows / block_rows) blocks, rows the tensor's seqlen);
 * each present one's bytes as an input view in *v (count in *n). */
static fa_status check_descales(fa_context_t ctx, const fa_attention_desc *d, fa_byte_view *v, int *n)
{
    const struct {
        const char *name, *data_name;
        const fa_descale *s;
    } ds[] = { { "q_descale", "q_descale.data", &d->q_descale },
               { "k_descale", "k_descale.data", &d->k_descale },
               { "v_descale", "v_descale.data", &d->v_descale } };
    *n = 0;
    for (size_t i = 0; i < 3; i++) {
        const fa_descale *s = ds[i].s;
        if (!s->data)
            continue;
        if (d->q.dtype != FA_DTYPE_E4M3)
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                            "%s.data must be NULL: descale factors are for fp8 (FA_DTYPE_E4M3) inputs, "
                            "q.dtype is %d",
                            ds[i].name, (int)d->q.dtype);
        if ((uintptr_t)s->data % sizeof(float))
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT, "%s (%p) must be 4-byte aligned (float32 factors)",
                            ds[i].data_name, (const void *)s->data);
        if (s->stride_batch < 0 || s->stride_head < 0)
            return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s.%s (%lld) must be >= 0", ds[i].name,
                            s->stride_batch < 0 ? "stride_batch" : "stride_head",
                            (long long)(s->stride_batch < 0 ? s->stride_batch : s->stride_head));
        if (s->block_rows < 0 || s->block_rows > (1 << 30))
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                            "%s.block_rows (%d) must be 0 (one factor for every row) or 1 .. 2^30", ds[i].name,
                            (int)s->block_rows);
        if (s->block_rows && s->stride_block < 0)
            return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s.stride_block (%lld) must be >= 0", ds[i].name,
                            (long long)s->stride_block);
        /* a stride of 0 reads one factor for the whole axis */
        const int64_t rows = i == 0 ? d->seqlen_q : d->seqlen_k;
        const int64_t blocks = s->block_rows ? (rows + s->block_rows - 1) / s->block_rows : 1;
        const int64_t sblk = s->block_rows ? s->stride_block : 0;
        const int64_t stride[3] = { s->stride_head, s->stride_batch, sblk };
        const int64_t count[3] = { s->stride_head ? d->num_heads_kv : 1, s->stride_batch ? d->batch : 1,
                                   sblk && blocks > 0 ? blocks : 1 };
        fa_axis ax[3] = { { "stride_head", stride[0], count[0] },
                          { "stride_batch", stride[1], count[1] },
                          { "stride_block", stride[2], count[2] } };
        int64_t last = fa_max_offset(ax, 3), bytes;
        if (last < 0 || !fa_add_ok(last, 1, &last) || !fa_mul_ok(last, 4, &bytes))
            return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "%s spans more than 2^63 bytes", ds[i].name);
        fa_status st = fa_byte_view_make(ctx, &v[*n], ds[i].data_name, s->data, 4, stride, count, 4);
        if (st != FA_OK)
            return st;
        (*n)++;
    }
    return FA_OK;
}

static fa_status check_lse(fa_context_t ctx, const fa_attention_desc *d, fa_problem *p)
{
    int64_t rows = d->seqlen_q, nb = p->varlen ? 1 : d->batch;
    if (d->lse_stride_batch == 0 && d->lse_stride_head == 0 && d->lse_stride_seq == 0) {
        p->lse_ss = 1;
        p->lse_sh = rows;
        p->lse_sb = p->varlen ? 0 : rows * d->num_heads_q;
    } else if (d->lse) { /* strides of an absent output are not looked at */
        p->lse_sb = d->lse_stride_batch;
        p->lse_sh = d->lse_stride_head;
        p->lse_ss = d->lse_stride_seq;
        if (!p->varlen && d->batch > 1 && p->lse_sb <= 0)
            return fa_error(ctx, FA_ERR_INVALID_STRIDE, "lse_stride_batch (%lld) must be positive",
                            (long long)p->lse_sb);
        if (p->lse_sh <= 0)
            return fa_error(ctx, FA_ERR_INVALID_STRIDE, "lse_stride_head (%lld) must be positive",
                            (long long)p->lse_sh);
        if (p->lse_ss <= 0)
            return fa_error(ctx, FA_ERR_INVALID_STRIDE, "lse_stride_seq (%lld) must be positive",
                            (long long)p->lse_ss);
    }
    if (!d->lse)
        return FA_OK;
    fa_axis ax[3] = { { "lse_stride_seq", p->lse_ss, rows },
                   { "lse_stride_head", p->lse_sh, d->num_heads_q },
                   { "lse_stride_batch", p->lse_sb, nb } };
    int64_t last = fa_max_offset(ax, 3), bytes;
    if (last < 0 || !fa_add_ok(last, 1, &last) || !fa_mul_ok(last, 4, &bytes))
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "lse spans more than 2^63 bytes");
    int i = fa_first_overlap(ax, 3);
    if (i >= 0)
        return fa_error(ctx, FA_ERR_INVALID_STRIDE,
                        "%s (%lld) makes lse elements overlap", ax[i].name,
                        (long long)ax[i].stride);
    return FA_OK;
}

fa_status fa_validate_forward(fa_context_t ctx, const fa_attention_desc *d, fa_problem *p)
{
    if (!d)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "desc must not be NULL");
    if (d->size != sizeof(*d))
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "desc->size (%zu) must be sizeof(fa_attention_desc) (%zu); call "
                        "fa_attention_desc_init first",
                        d->size, sizeof(*d));
    fa_status st;
    if ((st = check_shape(ctx, d)) != FA_OK || (st = check_dtypes(ctx, d)) != FA_OK ||
        (st = fa_check_scalars(ctx, d)) != FA_OK)
        return st;

    memset(p, 0, sizeof(*p));
    if ((d->cu_seqlens_q == NULL) != (d->cu_seqlens_k == NULL))
        return fa_error(ctx, FA_ERR_NULL_POINTER, "%s is NULL but %s is set: give both or neither",
                        d->cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q",
                        d->cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k");
    p->varlen = d->cu_seqlens_q != NULL;
    int64_t b = d->batch, hq = d->num_heads_q, hk = d->num_heads_kv, dim = d->head_dim;
    if ((st = fa_check_tensor(ctx, "q", &d->q, b, d->seqlen_q, hq, dim, p->varlen, 0)) != FA_OK ||
        (st = fa_check_tensor(ctx, "k", &d->k, b, d->seqlen_k, hk, dim, p->varlen, 0)) != FA_OK ||
        (st = fa_check_tensor(ctx, "v", &d->v, b, d->seqlen_k, hk, dim, p->varlen, 0)) != FA_OK ||
        (st = fa_check_tensor(ctx, "o", &d->o, b, d->seqlen_q, hq, dim, p->varlen, 1)) != FA_OK)
        return st;
    if (p->varlen &&
        ((st = fa_check_cu(ctx, "cu_seqlens_q", d->cu_seqlens_q, d->batch, d->seqlen_q, "seqlen_q")) !=
             FA_OK ||
         (st = fa_check_cu(ctx, "cu_seqlens_k", d->cu_seqlens_k, d->batch, d->seqlen_k, "seqlen_k")) !=
             FA_OK))
        return st;
    if ((st = check_lse(ctx, d, p)) != FA_OK)
        return st;
    /* inputs q, k, v and the descales, then the outputs o and lse */
    fa_byte_view views[8], o_view;
    int nds;
    if ((st = tensor_views(ctx, views, d, p)) != FA_OK)
        return st;
    o_view = views[3];
    if ((st = check_descales(ctx, d, &views[3], &nds)) != FA_OK)
        return st;
    views[3 + nds] = o_view;
    const int nv = 4 + nds + (d->lse ? 1 : 0);
    if ((d->lse && (st = lse_view(ctx, &views[4 + nds], d, p)) != FA_OK) ||
        (st = fa_check_disjoint(ctx, views, 3 + nds, nv)) != FA_OK)
        return st;

    p->desc = d;
    p->batch = d->batch;
    p->heads_q = d->num_heads_q;
    p->heads_kv = d->num_heads_kv;
    p->group = d->num_heads_q / d->num_heads_kv;
    p->dim = d->head_dim;
    p->scale = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)d->head_dim));
    p->softcap = d->softcap;
    p->win_left = d->window_left < 0 ? FA_WINDOW_INF : d->window_left;
    p->win_right = d->window_right < 0 ? FA_WINDOW_INF : d->window_right;
    if (d->causal)
        p->win_right = 0;
    p->dropout_p = d->dropout_p;
    p->dropout_scale = 1.0f / (1.0f - d->dropout_p);
    p->dropout_threshold = fa_dropout_threshold(d->dropout_p);
    p->dropout_seed = d->dropout_seed;
    p->dropout_offset = d->dropout_offset;
    p->in_dtype = d->q.dtype;
    p->out_dtype = d->o.dtype;
    p->max_q = p->max_k = 0;
    for (int32_t i = 0; i < p->batch; i++) {
        fa_seq s = fa_problem_seq(p, i);
        if (s.q_len > p->max_q)
            p->max_q = s.q_len;
        if (s.k_len > p->max_k)
            p->max_k = s.k_len;
    }
    return FA_OK;
}

fa_seq fa_problem_seq(const fa_problem *p, int32_t b)
{
    const fa_attention_desc *d = p->desc;
    fa_seq s;
    if (p->paged) {
        const fa_paged_desc *pd = p->paged->desc;
        s.q_start = pd->cu_seqlens_q[b];
        s.q_len = pd->cu_seqlens_q[b + 1] - pd->cu_seqlens_q[b];
        s.k_start = 0;
        s.k_len = pd->cache_seqlens[b] + (p->paged->append ? s.q_len : 0);
    } else if (p->varlen) {
        s.q_start = d->cu_seqlens_q[b];
        s.k_start = d->cu_seqlens_k[b];
        s.q_len = d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b];
        s.k_len = d->cu_seqlens_k[b + 1] - d->cu_seqlens_k[b];
    } else {
        s.q_start = s.k_start = 0;
        s.q_len = d->seqlen_q;
        s.k_len = d->seqlen_k;
    }
    return s;
}

fa_status fa_validate_backward(fa_context_t ctx, const fa_backward_desc *bd, fa_problem *p)
{
    if (!bd)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "desc must not be NULL");
    if (bd->size != sizeof(*bd))
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "desc->size (%zu) must be sizeof(fa_backward_desc) (%zu); call "
                        "fa_backward_desc_init first",
                        bd->size, sizeof(*bd));
    if (!bd->forward)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "forward must point to the forward call's descriptor");
    fa_status st = fa_validate_forward(ctx, bd->forward, p);
    if (st != FA_OK)
        return st;
    const fa_attention_desc *d = bd->forward;
    if (d->q.dtype == FA_DTYPE_E4M3)
        return fa_error(ctx, FA_ERR_INVALID_DTYPE,
                        "forward->q.dtype: the backward takes f32, f16 or bf16 inputs, not fp8 (FA_DTYPE_E4M3)");
    if (!d->lse)
        return fa_error(ctx, FA_ERR_NULL_POINTER,
                        "forward->lse must be set: the backward needs the forward's log-sum-exp");
    const struct {
        const char *name, *data_name;
        const fa_tensor *t;
        int64_t seq, heads;
        int out;
    } grads[] = { { "d_o", "d_o.data", &bd->d_o, d->seqlen_q, d->num_heads_q, 0 },
                  { "d_q", "d_q.data", &bd->d_q, d->seqlen_q, d->num_heads_q, 1 },
                  { "d_k", "d_k.data", &bd->d_k, d->seqlen_k, d->num_heads_kv, 1 },
                  { "d_v", "d_v.data", &bd->d_v, d->seqlen_k, d->num_heads_kv, 1 } };
    /* the forward's tensors, o and lse included, are the backward's inputs beside d_o */
    fa_byte_view views[9];
    if ((st = tensor_views(ctx, views, d, p)) != FA_OK ||
        (st = lse_view(ctx, &views[4], d, p)) != FA_OK)
        return st;
    for (size_t i = 0; i < 4; i++) {
        fa_dtype t = grads[i].t->dtype;
        if (!fa_dtype_valid(t))
            return fa_error(ctx, FA_ERR_INVALID_DTYPE, "%s.dtype (%d) is not a fa_dtype", grads[i].name,
                            (int)t);
        if (t != d->q.dtype && t != FA_DTYPE_F32)
            return fa_error(ctx, FA_ERR_INVALID_DTYPE,
                            "%s.dtype (%d) must equal q.dtype (%d) or be FA_DTYPE_F32",
                            grads[i].name, (int)t, (int)d->q.dtype);
        if ((st = fa_check_tensor(ctx, grads[i].name, grads[i].t, d->batch, grads[i].seq,
                               grads[i].heads, d->head_dim, p->varlen, grads[i].out)) != FA_OK ||
            (st = fa_tensor_view(ctx, &views[5 + i], grads[i].data_name, grads[i].t, d->batch,
                              grads[i].seq, grads[i].heads, d->head_dim, p->varlen)) != FA_OK)
            return st;
    }
    if ((st = fa_check_disjoint(ctx, views, 6, 9)) != FA_OK)
        return st;
    p->bwd = bd;
    return FA_OK;
}
