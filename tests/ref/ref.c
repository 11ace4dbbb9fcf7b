/* SPDX-License-Identifier: MIT */
/* Naive float64 attention: obviously correct, deliberately slow. */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t fa_ref_dtype_bytes(fa_dtype t) { return t == FA_DTYPE_F32 ? 4 : t == FA_DTYPE_E4M3 ? 1 : 2; }

double fa_ref_decode(fa_dtype t, const void *base, int64_t index)
{
    if (t == FA_DTYPE_F32)
        return ((const float *)base)[index];
    if (t == FA_DTYPE_E4M3) { /* s eeee mmm, bias 7: (8 + m) 2^(e-10), e = 0: m 2^-9 */
        const uint8_t x = ((const uint8_t *)base)[index];
        const int e = (x >> 3) & 15, m = x & 7;
        const double v = e == 15 && m == 7 ? NAN : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
        return x & 0x80 ? -v : v;
    }
    uint16_t h = ((const uint16_t *)base)[index];
    if (t == FA_DTYPE_BF16) {
        uint32_t x = (uint32_t)h << 16;
        float f;
        memcpy(&f, &x, sizeof(f));
        return f;
    }
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp(m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

void fa_ref_encode(fa_dtype t, void *base, int64_t index, double x)
{
    if (t == FA_DTYPE_F32) {
        ((float *)base)[index] = (float)x;
        return;
    }
    if (t == FA_DTYPE_E4M3) { /* toward zero, to at most 448 */
        const double a = fmin(fabs(x), 448.0);
        int e;
        const double fr = frexp(a, &e); /* a = fr 2^e: exponent e - 1, mantissa (2 fr - 1) */
        uint8_t out = a < 0x1p-6 ? (uint8_t)floor(a * 512.0)
                                 : (uint8_t)(((e - 1 + 7) << 3) | (int)floor((fr * 2.0 - 1.0) * 8.0));
        ((uint8_t *)base)[index] = (uint8_t)(out | (x < 0 ? 0x80 : 0));
        return;
    }
    uint16_t out;
    if (t == FA_DTYPE_BF16) {
        float f = (float)x;
        uint32_t u;
        memcpy(&u, &f, sizeof(u));
        out = (uint16_t)(u >> 16); /* truncation: still a bf16 value */
    } else {
        /* |x| < 65504 here; truncate the mantissa to 10 bits (or a subnormal step). */
        int sign = x < 0;
        double a = fabs(x);
        int e;
        double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
        if (a == 0.0) {
            out = 0;
        } else if (e - 1 < -14) {
            out = (uint16_t)floor(a / ldexp(1.0, -24));
        } else {
            int mant = (int)floor((fr * 2.0 - 1.0) * 1024.0);
            out = (uint16_t)(((e - 1 + 15) << 10) | mant);
        }
        out |= (uint16_t)(sign << 15);
    }
    ((uint16_t *)base)[index] = out;
}

uint64_t fa_rng_next(fa_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double fa_rng_uniform(fa_rng *r) { return (double)(fa_rng_next(r) >> 11) * 0x1.0p-52 - 1.0; }

/* fp8 inputs: the factor of row i (of its sequence) of (sequence b, kv head g), 1 without one */
static double descale(const fa_descale *s, int32_t b, int32_t g, int64_t i)
{
    if (!s->data)
        return 1.0;
    return s->data[(int64_t)b * s->stride_batch + (int64_t)g * s->stride_head +
                   (s->block_rows > 0 ? i / s->block_rows * s->stride_block : 0)];
}

static int64_t elem(const fa_attention_desc *d, const fa_tensor *t, int32_t b, int64_t row, int32_t h)
{
    return (d->cu_seqlens_q ? 0 : (int64_t)b * t->stride_batch) + row * t->stride_seq +
           (int64_t)h * t->stride_head;
}

int fa_ref_attention(const fa_attention_desc *d, int64_t rows_every, double *o, double *lse,
                     double *score_max)
{
    const int32_t hq = d->num_heads_q, dim = d->head_dim, group = d->num_heads_q / d->num_heads_kv;
    const double scale = d->scale != 0.0f ? d->scale : 1.0 / sqrt((double)dim);
    const int64_t wl = d->window_left < 0 ? INT64_MAX / 4 : d->window_left;
    const int64_t wr = d->causal ? 0 : d->window_right < 0 ? INT64_MAX / 4 : d->window_right;
    double *s = malloc(sizeof(double) * (size_t)(d->seqlen_k > 0 ? d->seqlen_k : 1));
    uint8_t *keep = malloc((size_t)(d->seqlen_k > 0 ? d->seqlen_k : 1));
    if (!s || !keep) {
        free(s);
        free(keep);
        return -1;
    }
    double smax = 0.0;
    for (int32_t b = 0; b < d->batch; b++) {
        int64_t q0 = d->cu_seqlens_q ? d->cu_seqlens_q[b] : (int64_t)b * d->seqlen_q;
        int64_t k0 = d->cu_seqlens_k ? d->cu_seqlens_k[b] : 0;
        int64_t qrow0 = d->cu_seqlens_q ? q0 : 0; /* row index inside the tensor */
        int64_t sq = d->cu_seqlens_q ? d->cu_seqlens_q[b + 1] - q0 : d->seqlen_q;
        int64_t sk = d->cu_seqlens_k ? d->cu_seqlens_k[b + 1] - k0 : d->seqlen_k;
        for (int32_t h = 0; h < hq; h++) {
            int32_t hk = h / group;
            for (int64_t i = 0; i < sq; i++) {
                const double q_ds = descale(&d->q_descale, b, hk, i);
                int64_t row = q0 + i;
                if (rows_every > 1 && row % rows_every != 0)
                    continue;
                double mx = -INFINITY;
                for (int64_t j = 0; j < sk; j++) {
                    int64_t rel = j - i - (sk - sq);
                    if (rel < -wl || rel > wr) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    double acc = 0.0;
                    int64_t qa = elem(d, &d->q, b, qrow0 + i, h), ka = elem(d, &d->k, b, k0 + j, hk);
                    for (int32_t x = 0; x < dim; x++)
                        acc += fa_ref_decode(d->q.dtype, d->q.data, qa + x) *
                               fa_ref_decode(d->k.dtype, d->k.data, ka + x);
                    acc *= scale * q_ds * descale(&d->k_descale, b, hk, j);
                    if (fabs(acc) > smax)
                        smax = fabs(acc);
                    if (d->softcap > 0.0f)
                        acc = d->softcap * tanh(acc / d->softcap);
                    s[j] = acc;
                    if (acc > mx)
                        mx = acc;
                }
                double *orow = o + (row * hq + h) * dim;
                for (int32_t x = 0; x < dim; x++)
                    orow[x] = 0.0;
                if (mx == -INFINITY) {
                    if (lse)
                        lse[row * hq + h] = -INFINITY;
                    continue;
                }
                /* dropout keeps p_j with probability 1 - p and rescales it; the
                 * mask is the documented one, fa_dropout_mask (checked on its own
                 * against Philox test vectors in test_dropout) */
                double l = 0.0, kept = 1.0 / (1.0 - (double)d->dropout_p);
                memset(keep, 1, (size_t)(sk > 0 ? sk : 1));
                if (d->dropout_p > 0.0f &&
                    fa_dropout_mask(d->dropout_p, d->dropout_seed, d->dropout_offset, b, h,
                                    (int32_t)i, 1, 0, (int32_t)sk, keep, sk) != FA_OK) {
                    free(s);
                    free(keep);
                    return -1;
                }
                for (int64_t j = 0; j < sk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    double pj = exp(s[j] - mx);
                    l += pj;
                    if (!keep[j])
                        continue;
                    int64_t va = elem(d, &d->v, b, k0 + j, hk);
                    const double v_ds = descale(&d->v_descale, b, hk, j);
                    for (int32_t x = 0; x < dim; x++)
                        orow[x] += pj * kept * v_ds * fa_ref_decode(d->v.dtype, d->v.data, va + x);
                }
                for (int32_t x = 0; x < dim; x++)
                    orow[x] /= l;
                if (lse)
                    lse[row * hq + h] = mx + log(l);
            }
        }
    }
    free(s);
    free(keep);
    if (score_max)
        *score_max = smax;
    return 0;
}

int fa_ref_backward(const fa_backward_desc *bd, double *dq, double *dk, double *dv)
{
    const fa_attention_desc *d = bd->forward;
    const int32_t hq = d->num_heads_q, hkv = d->num_heads_kv, dim = d->head_dim, group = hq / hkv;
    const double scale = d->scale != 0.0f ? d->scale : 1.0 / sqrt((double)dim);
    const int64_t wl = d->window_left < 0 ? INT64_MAX / 4 : d->window_left;
    const int64_t wr = d->causal ? 0 : d->window_right < 0 ? INT64_MAX / 4 : d->window_right;
    const int varlen = d->cu_seqlens_q != NULL;
    const int64_t qrows = varlen ? d->seqlen_q : (int64_t)d->batch * d->seqlen_q;
    const int64_t krows = varlen ? d->seqlen_k : (int64_t)d->batch * d->seqlen_k;
    memset(dq, 0, sizeof(double) * (size_t)(qrows * hq * dim));
    memset(dk, 0, sizeof(double) * (size_t)(krows * hkv * dim));
    memset(dv, 0, sizeof(double) * (size_t)(krows * hkv * dim));
    size_t n = (size_t)(d->seqlen_k > 0 ? d->seqlen_k : 1);
    double *s = malloc(sizeof(double) * n), *t = malloc(sizeof(double) * n);
    double *o = malloc(sizeof(double) * (size_t)dim), *go = malloc(sizeof(double) * (size_t)dim);
    uint8_t *keep = malloc(n);
    if (!s || !t || !o || !go || !keep) {
        free(s), free(t), free(o), free(go), free(keep);
        return -1;
    }
    const double kept = 1.0 / (1.0 - (double)d->dropout_p);
    for (int32_t b = 0; b < d->batch; b++) {
        int64_t q0 = varlen ? d->cu_seqlens_q[b] : (int64_t)b * d->seqlen_q;
        int64_t k0 = varlen ? d->cu_seqlens_k[b] : (int64_t)b * d->seqlen_k;
        int64_t qt = varlen ? q0 : 0, kt = varlen ? k0 : 0; /* first row inside the tensors */
        int64_t sq = varlen ? d->cu_seqlens_q[b + 1] - q0 : d->seqlen_q;
        int64_t sk = varlen ? d->cu_seqlens_k[b + 1] - k0 : d->seqlen_k;
        for (int32_t h = 0; h < hq; h++) {
            int32_t hk = h / group;
            for (int64_t i = 0; i < sq; i++) {
                /* forward of row i: scores, capped scores, probabilities, output */
                double mx = -INFINITY;
                int64_t qa = elem(d, &d->q, b, qt + i, h);
                for (int64_t j = 0; j < sk; j++) {
                    int64_t rel = j - i - (sk - sq);
                    if (rel < -wl || rel > wr) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    int64_t ka = elem(d, &d->k, b, kt + j, hk);
                    double acc = 0.0;
                    for (int32_t x = 0; x < dim; x++)
                        acc += fa_ref_decode(d->q.dtype, d->q.data, qa + x) *
                               fa_ref_decode(d->k.dtype, d->k.data, ka + x);
                    acc *= scale;
                    t[j] = d->softcap > 0.0f ? tanh(acc / d->softcap) : 0.0;
                    s[j] = d->softcap > 0.0f ? d->softcap * t[j] : acc;
                    mx = s[j] > mx ? s[j] : mx;
                }
                if (mx == -INFINITY)
                    continue; /* no visible key: no gradient */
                memset(keep, 1, n);
                if (d->dropout_p > 0.0f &&
                    fa_dropout_mask(d->dropout_p, d->dropout_seed, d->dropout_offset, b, h,
                                    (int32_t)i, 1, 0, (int32_t)sk, keep, sk) != FA_OK) {
                    free(s), free(t), free(o), free(go), free(keep);
                    return -1;
                }
                double l = 0.0;
                for (int64_t j = 0; j < sk; j++)
                    l += s[j] == -INFINITY ? 0.0 : exp(s[j] - mx);
                int64_t goa = elem(d, &bd->d_o, b, qt + i, h);
                for (int32_t x = 0; x < dim; x++) {
                    o[x] = 0.0;
                    go[x] = fa_ref_decode(bd->d_o.dtype, bd->d_o.data, goa + x);
                }
                for (int64_t j = 0; j < sk; j++) {
                    if (s[j] == -INFINITY || !keep[j])
                        continue;
                    double pz = exp(s[j] - mx) / l * kept;
                    int64_t va = elem(d, &d->v, b, kt + j, hk);
                    for (int32_t x = 0; x < dim; x++)
                        o[x] += pz * fa_ref_decode(d->v.dtype, d->v.data, va + x);
                }
                double dsum = 0.0; /* dO . o, with o exact */
                for (int32_t x = 0; x < dim; x++)
                    dsum += go[x] * o[x];
                /* dS_j = P_j (dO . v_j Z_j - dO . o), through the cap: * (1 - tanh^2) */
                for (int64_t j = 0; j < sk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    double pj = exp(s[j] - mx) / l, z = keep[j] ? kept : 0.0;
                    int64_t va = elem(d, &d->v, b, kt + j, hk), ka = elem(d, &d->k, b, kt + j, hk);
                    double dp = 0.0;
                    for (int32_t x = 0; x < dim; x++)
                        dp += go[x] * fa_ref_decode(d->v.dtype, d->v.data, va + x);
                    double ds = pj * (dp * z - dsum);
                    if (d->softcap > 0.0f)
                        ds *= 1.0 - t[j] * t[j];
                    double *dqr = dq + ((q0 + i) * hq + h) * dim;
                    double *dkr = dk + ((k0 + j) * hkv + hk) * dim;
                    double *dvr = dv + ((k0 + j) * hkv + hk) * dim;
                    for (int32_t x = 0; x < dim; x++) {
                        dqr[x] += scale * ds * fa_ref_decode(d->k.dtype, d->k.data, ka + x);
                        dkr[x] += scale * ds * fa_ref_decode(d->q.dtype, d->q.data, qa + x);
                        dvr[x] += pj * z * go[x];
                    }
                }
            }
        }
    }
    free(s), free(t), free(o), free(go), free(keep);
    return 0;
}
