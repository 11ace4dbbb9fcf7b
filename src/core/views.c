/* SPDX-License-Identifier: MIT */
/* Strided views: extents, overflow and the exact overlap test between outputs and the rest. */
#include "views.h"

#include <string.h>

int64_t fa_dtype_bytes(fa_dtype t) { return t == FA_DTYPE_F32 ? 4 : t == FA_DTYPE_E4M3 ? 1 : 2; }

int fa_dtype_valid(fa_dtype t)
{
    return t == FA_DTYPE_F32 || t == FA_DTYPE_F16 || t == FA_DTYPE_BF16 || t == FA_DTYPE_E4M3;
}

/* Largest element offset of a strided view (all strides positive), or -1 on overflow. */
int64_t fa_max_offset(const fa_axis *ax, int n)
{
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t t;
        if (ax[i].extent <= 0)
            continue;
        if (!fa_mul_ok(ax[i].stride, ax[i].extent - 1, &t) || !fa_add_ok(off, t, &off))
            return -1;
    }
    return off;
}

/* An output view must give every index its own element: with axes sorted by
 * stride, each stride must step over everything the smaller axes span. */
int fa_first_overlap(fa_axis *ax, int n)
{
    for (int i = 0; i < n; i++)
        if (ax[i].extent == 0) /* no element at all */
            return -1;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && ax[j].stride < ax[j - 1].stride; j--) {
            fa_axis t = ax[j];
            ax[j] = ax[j - 1];
            ax[j - 1] = t;
        }
    int64_t span = 0; /* max offset reachable by the axes below i */
    for (int i = 0; i < n; i++) {
        if (ax[i].extent <= 1)
            continue;
        if (ax[i].stride <= span)
            return i;
        span += ax[i].stride * (ax[i].extent - 1);
    }
    return -1;
}

fa_status fa_check_tensor(fa_context_t ctx, const char *name, const fa_tensor *t,
                              int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                              int varlen, int is_output)
{
    if (!t->data)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "%s.data must not be NULL", name);
    if (!varlen && batch > 1 && t->stride_batch <= 0)
        return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s.stride_batch (%lld) must be positive",
                        name, (long long)t->stride_batch);
    if (t->stride_seq <= 0)
        return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s.stride_seq (%lld) must be positive", name,
                        (long long)t->stride_seq);
    if (t->stride_head <= 0)
        return fa_error(ctx, FA_ERR_INVALID_STRIDE, "%s.stride_head (%lld) must be positive",
                        name, (long long)t->stride_head);
    fa_axis ax[4] = {
        { "head_dim", 1, dim },
        { "stride_head", t->stride_head, heads },
        { "stride_seq", t->stride_seq, seq },
        { "stride_batch", t->stride_batch, varlen ? 1 : batch },
    };
    int64_t last = fa_max_offset(ax, 4), bytes;
    if (last < 0 || !fa_add_ok(last, 1, &last) || !fa_mul_ok(last, fa_dtype_bytes(t->dtype), &bytes))
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW,
                        "%s spans more than 2^63 bytes with these shapes and strides", name);
    if (is_output) {
        int i = fa_first_overlap(ax, 4);
        if (i >= 0)
            return fa_error(ctx, FA_ERR_INVALID_STRIDE,
                            "%s.%s (%lld) makes output elements overlap; an output needs "
                            "non-overlapping strides",
                            name, ax[i].name, (long long)ax[i].stride);
    }
    return FA_OK;
}

/* Build a view from element strides; the caller has checked that its byte span fits in
 * int64 (fa_check_tensor, check_lse), so no product below overflows. */
fa_status fa_byte_view_make(fa_context_t ctx, fa_byte_view *v, const char *name, const void *data,
                                int64_t row, const int64_t stride[3], const int64_t count[3],
                                int64_t elem)
{
    memset(v, 0, sizeof(*v));
    /* kernels read elements whole (a device faults on a misaligned one) */
    if (elem > 1 && (uintptr_t)data % (uintptr_t)elem)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT, "%s (%p) must be aligned to its elements' %lld bytes",
                        name, data, (long long)elem);
    v->name = name;
    v->base = (uintptr_t)data;
    v->extent[0] = row;
    for (int i = 0; i < 3; i++) {
        if (count[i] <= 0)
            v->empty = 1;
        if (count[i] <= 1)
            continue;
        int j = v->n++;
        for (; j > 0 && v->stride[j - 1] > stride[i] * elem; j--) {
            v->stride[j] = v->stride[j - 1];
            v->count[j] = v->count[j - 1];
        }
        v->stride[j] = stride[i] * elem;
        v->count[j] = count[i];
    }
    for (int i = 0; i < v->n; i++)
        v->extent[i + 1] = v->extent[i] + v->stride[i] * (v->count[i] - 1);
    if (!v->empty && (uint64_t)v->extent[v->n] > (uint64_t)(UINTPTR_MAX - v->base))
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "%s runs past the end of the address space",
                        name);
    return FA_OK;
}

fa_status fa_tensor_view(fa_context_t ctx, fa_byte_view *v, const char *name, const fa_tensor *t,
                             int64_t batch, int64_t seq, int64_t heads, int64_t dim, int varlen)
{
    const int64_t stride[3] = { t->stride_head, t->stride_seq, t->stride_batch };
    const int64_t count[3] = { heads, seq, varlen ? 1 : batch };
    return fa_byte_view_make(ctx, v, name, t->data, dim * fa_dtype_bytes(t->dtype), stride, count,
                          fa_dtype_bytes(t->dtype));
}

/*
 * Whether a's axes below na and b's below nb share a byte, b starting delta bytes after a.
 * Both are cut along the larger of their outermost strides, P: a view whose outermost
 * stride is P splits into count copies of its inner axes P apart, one whose outermost
 * stride is smaller is one copy. Where every copy spans at most P (the layouts nest, as
 * every output's do), only two offsets between copies can meet, so the answer is exact in
 * at most two branches per level. Where a copy spans more (an input whose strides overlap,
 * or views with different strides interleaved), the byte ranges meeting counts as sharing.
 */
static int views_meet(const fa_byte_view *a, int na, const fa_byte_view *b, int nb, int64_t delta)
{
    if (delta >= a->extent[na] || -delta >= b->extent[nb])
        return 0;
    if (na == 0 && nb == 0)
        return 1; /* two rows whose bytes meet */
    int64_t pa = na ? a->stride[na - 1] : 0, pb = nb ? b->stride[nb - 1] : 0;
    int64_t step = pa > pb ? pa : pb, ca = 1, cb = 1;
    int ia = na, ib = nb;
    if (pa == step)
        ca = a->count[--ia];
    if (pb == step)
        cb = b->count[--ib];
    if (a->extent[ia] > step || b->extent[ib] > step)
        return 1;
    /* copy i of a and copy j of b meet only if their inner axes do at delta + step*(j-i);
     * with delta = q*step + r, 0 <= r < step, that shift lies in (-step, step) only for
     * j - i = -q - 1 and -q */
    int64_t q = delta / step, r = delta % step;
    if (r < 0) {
        r += step;
        q--;
    }
    for (int64_t m = -1; m <= 0; m++) {
        int64_t k = m - q; /* j - i */
        if (k > -ca && k < cb && views_meet(a, ia, b, ib, r + m * step))
            return 1;
    }
    return 0;
}

int fa_views_overlap(const fa_byte_view *a, const fa_byte_view *b)
{
    if (a->empty || b->empty)
        return 0;
    int64_t delta;
    if (b->base >= a->base) {
        uintptr_t gap = b->base - a->base;
        if (gap >= (uint64_t)a->extent[a->n])
            return 0;
        delta = (int64_t)gap;
    } else {
        uintptr_t gap = a->base - b->base;
        if (gap >= (uint64_t)b->extent[b->n])
            return 0;
        delta = -(int64_t)gap;
    }
    return views_meet(a, a->n, b, b->n, delta);
}

/* v[0 .. n_in) are inputs, which may share memory; each output v[n_in ..] must share no
 * byte with anything before it. */
fa_status fa_check_disjoint(fa_context_t ctx, const fa_byte_view *v, int n_in, int n)
{
    for (int i = n_in; i < n; i++)
        for (int j = 0; j < i; j++)
            if (fa_views_overlap(&v[i], &v[j]))
                return fa_error(ctx, FA_ERR_INVALID_STRIDE,
                                "%s overlaps %s: outputs must not share memory with inputs or "
                                "other outputs",
                                v[i].name, v[j].name);
    return FA_OK;
}

fa_status fa_check_cu(fa_context_t ctx, const char *name, const int32_t *cu, int32_t batch,
                          int32_t total, const char *total_name)
{
    if (cu[0] != 0)
        return fa_error(ctx, FA_ERR_INVALID_SHAPE, "%s[0] (%d) must be 0", name, (int)cu[0]);
    for (int32_t b = 0; b < batch; b++)
        if (cu[b + 1] < cu[b])
            return fa_error(ctx, FA_ERR_INVALID_SHAPE,
                            "%s[%d] (%d) is less than %s[%d] (%d): offsets must not decrease",
                            name, (int)b + 1, (int)cu[b + 1], name, (int)b, (int)cu[b]);
    if (cu[batch] > total)
        return fa_error(ctx, FA_ERR_INVALID_SHAPE, "%s[%d] (%d) exceeds %s (%d)", name,
                        (int)batch, (int)cu[batch], total_name, (int)total);
    return FA_OK;
}

