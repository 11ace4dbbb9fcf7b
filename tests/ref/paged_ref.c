/* SPDX-License-Identifier: MIT */
/* Naive float64 paged attention with append and RoPE, from fa_paged_desc's definition. */
#include "paged.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void fa_ref_rope(const fa_paged_desc *d, double *x, int64_t pos)
{
    const int32_t rd = d->rope_dim ? d->rope_dim : d->head_dim, half = rd / 2;
    for (int32_t i = 0; i < half; i++) {
        const double c = d->rope_cos[pos * half + i], s = d->rope_sin[pos * half + i];
        double *a = d->rope == FA_ROPE_NEOX ? x + i : x + 2 * i;
        double *b = d->rope == FA_ROPE_NEOX ? x + i + half : x + 2 * i + 1;
        const double xa = *a, xb = *b;
        *a = xa * c - xb * s;
        *b = xa * s + xb * c;
    }
}

double fa_ref_round(fa_dtype t, double x)
{
    float f = (float)x;
    if (t == FA_DTYPE_F32)
        return f;
    if (t == FA_DTYPE_F16)
        return (double)(_Float16)f;
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static void read_row(fa_dtype t, const void *base, int64_t at, int32_t dim, double *out)
{
    for (int32_t x = 0; x < dim; x++)
        out[x] = fa_ref_decode(t, base, at + x);
}

int fa_ref_paged(const fa_paged_desc *d, const void *k_before, const void *v_before, double *o,
                 double *lse, double *score_max, double *q_round)
{
    const fa_kv_cache *c = &d->cache;
    const int32_t hq = d->num_heads_q, hk = c->num_heads, dim = d->head_dim, group = hq / hk;
    const int32_t ps = c->page_size;
    const int64_t bts = d->block_table_stride ? d->block_table_stride : d->max_pages_per_seq;
    const double scale = d->scale != 0.0f ? d->scale : 1.0 / sqrt((double)dim);
    const int64_t wl = d->window_left < 0 ? INT64_MAX / 4 : d->window_left;
    const int64_t wr = d->causal ? 0 : d->window_right < 0 ? INT64_MAX / 4 : d->window_right;
    const int append = d->k_new.data != NULL;
    int64_t most = 1;
    for (int32_t b = 0; b < d->batch; b++) {
        int64_t keys = d->cache_seqlens[b] + (append ? d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b] : 0);
        most = keys > most ? keys : most;
    }
    double *kk = malloc(sizeof(double) * (size_t)(most * dim)), *vv = malloc(sizeof(double) * (size_t)(most * dim));
    double *s = malloc(sizeof(double) * (size_t)most), *q = malloc(sizeof(double) * (size_t)dim);
    double *jump = malloc(sizeof(double) * (size_t)dim);
    if (!kk || !vv || !s || !q || !jump) {
        free(kk), free(vv), free(s), free(q), free(jump);
        return -1;
    }
    const int32_t rd = d->rope_dim ? d->rope_dim : dim;
    const int rounds = d->rope != FA_ROPE_NONE && d->q.dtype != FA_DTYPE_F32; /* kernels keep float32 */
    double smax = 0.0;
    for (int32_t b = 0; b < d->batch; b++) {
        const int64_t q0 = d->cu_seqlens_q[b], qn = d->cu_seqlens_q[b + 1] - q0;
        const int64_t cached = d->cache_seqlens[b], keys = cached + (append ? qn : 0);
        for (int32_t g = 0; g < hk; g++) {
            for (int64_t j = 0; j < keys; j++) {
                if (j < cached) {
                    const int64_t page = d->block_table[b * bts + j / ps], t = j % ps;
                    read_row(c->dtype, k_before, page * c->k_stride_page + t * c->k_stride_token + g * c->k_stride_head,
                             dim, kk + j * dim);
                    read_row(c->dtype, v_before, page * c->v_stride_page + t * c->v_stride_token + g * c->v_stride_head,
                             dim, vv + j * dim);
                } else {
                    const int64_t i = j - cached, row = q0 + i;
                    read_row(c->dtype, d->k_new.data, row * d->k_new.stride_seq + g * d->k_new.stride_head, dim,
                             kk + j * dim);
                    read_row(c->dtype, d->v_new.data, row * d->v_new.stride_seq + g * d->v_new.stride_head, dim,
                             vv + j * dim);
                    if (d->rope != FA_ROPE_NONE) { /* rotated, then stored in the cache's dtype */
                        fa_ref_rope(d, kk + j * dim, d->positions ? d->positions[row] : cached + i);
                        for (int32_t x = 0; x < dim; x++)
                            kk[j * dim + x] = fa_ref_round(c->dtype, kk[j * dim + x]);
                    }
                }
            }
            for (int32_t h = g * group; h < (g + 1) * group; h++)
                for (int64_t i = 0; i < qn; i++) {
                    const int64_t row = q0 + i;
                    read_row(d->q.dtype, d->q.data, row * d->q.stride_seq + h * d->q.stride_head, dim, q);
                    int flips = 0;
                    double qmax = 0.0, qr = 0.0;
                    for (int32_t x = 0; rounds && x < dim; x++) /* before the rotation */
                        qmax = fmax(qmax, fabs(q[x]));
                    if (d->rope != FA_ROPE_NONE)
                        fa_ref_rope(d, q, d->positions ? d->positions[row] : keys - qn + i);
                    /* a float32 rotation is within 2^-22 qmax of this one (2 sqrt 2 units of
                     * float32 rounding): where the rotated value rounds differently across that
                     * interval, a kernel that rounds its rotated query to the dtype may hold the
                     * neighbour */
                    for (int32_t x = 0; rounds && x < dim; x++) {
                        const double e = 0x1p-22 * qmax, up = fa_ref_round(d->q.dtype, q[x] + e);
                        jump[x] = x < rd ? fabs(up - fa_ref_round(d->q.dtype, q[x] - e)) : 0.0;
                        flips |= jump[x] > 0.0;
                    }
                    double mx = d->sinks ? d->sinks[h] : -INFINITY;
                    for (int64_t j = 0; j < keys; j++) {
                        const int64_t rel = j - i - (keys - qn);
                        if (rel < -wl || rel > wr) {
                            s[j] = -INFINITY;
                            continue;
                        }
                        double acc = 0.0, mag = 0.0;
                        for (int32_t x = 0; x < dim; x++)
                            acc += q[x] * kk[j * dim + x];
                        acc *= scale;
                        smax = fabs(acc) > smax ? fabs(acc) : smax;
                        for (int32_t x = 0; flips && x < dim; x++)
                            mag += jump[x] * fabs(kk[j * dim + x]);
                        qr = fmax(qr, scale * mag);
                        if (d->softcap > 0.0f)
                            acc = d->softcap * tanh(acc / d->softcap);
                        s[j] = acc;
                        mx = acc > mx ? acc : mx;
                    }
                    if (q_round)
                        q_round[row * hq + h] = qr;
                    double *orow = o + (row * hq + h) * dim;
                    memset(orow, 0, sizeof(double) * (size_t)dim);
                    if (mx == -INFINITY) {
                        lse[row * hq + h] = -INFINITY;
                        continue;
                    }
                    double l = d->sinks ? exp(d->sinks[h] - mx) : 0.0;
                    for (int64_t j = 0; j < keys; j++) {
                        if (s[j] == -INFINITY)
                            continue;
                        const double p = exp(s[j] - mx);
                        l += p;
                        for (int32_t x = 0; x < dim; x++)
                            orow[x] += p * vv[j * dim + x];
                    }
                    for (int32_t x = 0; x < dim; x++)
                        orow[x] /= l;
                    lse[row * hq + h] = mx + log(l);
                }
        }
    }
    free(kk), free(vv), free(s), free(q), free(jump);
    if (score_max)
        *score_max = smax;
    return 0;
}
