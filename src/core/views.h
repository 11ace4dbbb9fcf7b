/* SPDX-License-Identifier: MIT */
/* Strided views: extents, overflow, and whether outputs share bytes with anything else. */
#ifndef FA_CORE_VIEWS_H
#define FA_CORE_VIEWS_H

#include "internal.h"

int64_t fa_dtype_bytes(fa_dtype t);
int fa_dtype_valid(fa_dtype t);

typedef struct fa_axis {
    const char *name;
    int64_t stride, extent;
} fa_axis;

/* The bytes a view covers: rows of `row` contiguous bytes at base + sum stride[i] * idx[i],
 * over the axes with more than one index, sorted by stride. extent[i] is the span of the
 * rows and the axes below i, [0, extent[i]) from base; extent[n] is the whole view's. */
typedef struct fa_byte_view {
    const char *name;
    uintptr_t base;
    int n, empty;
    int64_t stride[3], count[3], extent[4];
} fa_byte_view;

/* Largest element offset of a strided view (all strides positive), or -1 on overflow. */
int64_t fa_max_offset(const fa_axis *ax, int n);

/* An output view must give every index its own element: the index of the first axis (after
 * sorting ax by stride) whose stride does not step over the smaller axes, or -1. */
int fa_first_overlap(fa_axis *ax, int n);

/* A [batch, seq, heads, dim] tensor: pointer, positive strides, its byte span within int64,
 * and (outputs) no two indices on one element. varlen: stride_batch unused. */
fa_status fa_check_tensor(fa_context_t ctx, const char *name, const fa_tensor *t, int64_t batch,
                          int64_t seq, int64_t heads, int64_t dim, int varlen, int is_output);

/* A view from element strides (the caller has checked its byte span fits in int64); data
 * must be aligned to elem bytes (FA_ERR_INVALID_ARGUMENT naming it otherwise). */
fa_status fa_byte_view_make(fa_context_t ctx, fa_byte_view *v, const char *name, const void *data,
                            int64_t row, const int64_t stride[3], const int64_t count[3],
                            int64_t elem);
fa_status fa_tensor_view(fa_context_t ctx, fa_byte_view *v, const char *name, const fa_tensor *t,
                         int64_t batch, int64_t seq, int64_t heads, int64_t dim, int varlen);

/* Whether two views share a byte (exact for nested layouts; see views.c). */
int fa_views_overlap(const fa_byte_view *a, const fa_byte_view *b);

/* v[0 .. n_in) are inputs, which may share memory; each output v[n_in ..] must share no byte
 * with anything before it: FA_ERR_INVALID_STRIDE naming both otherwise. */
fa_status fa_check_disjoint(fa_context_t ctx, const fa_byte_view *v, int n_in, int n);

/* batch + 1 offsets from 0, non-decreasing, the last at most total. */
fa_status fa_check_cu(fa_context_t ctx, const char *name, const int32_t *cu, int32_t batch,
                      int32_t total, const char *total_name);

/* scale, causal, windows, softcap, dropout and algorithm of an attention call (validate.c). */
fa_status fa_check_scalars(fa_context_t ctx, const fa_attention_desc *d);

#endif
