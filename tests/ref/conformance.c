/* SPDX-License-Identifier: MIT */
/*
 * The conformance grid: one case = fresh random tensors in some layout,
 * flash and standard attention through the public API, both compared with
 * the float64 reference. Flash passes when its error is at most twice the
 * standard algorithm's in the same precision plus a small floor.
 */
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dtype_name(fa_dtype t)
{
    return t == FA_DTYPE_F32 ? "f32" : t == FA_DTYPE_F16 ? "f16" : t == FA_DTYPE_E4M3 ? "e4m3" : "bf16";
}

double fa_unit_roundoff(fa_dtype t)
{
    return t == FA_DTYPE_F32 ? 0x1p-24 : t == FA_DTYPE_F16 ? 0x1p-11 : t == FA_DTYPE_E4M3 ? 0x1p-4 : 0x1p-8;
}

double fa_output_tolerance(double err_standard, double ref_max, fa_dtype in, fa_dtype out)
{
    const double unit = fmax(16.0 * fa_unit_roundoff(out), fa_unit_roundoff(in));
    return 2.0 * err_standard + unit * fmax(ref_max, 1e-3);
}

void fa_case_format(const fa_case *c, char *buf, size_t cap)
{
    static const char *layouts[] = { "bshd", "bhsd", "qkv-packed" };
    snprintf(buf, cap,
             "%s%s%s b%d sq%d sk%d hq%d hkv%d d%d causal%d window(%d,%d) softcap%g scale%g %s%s%s "
             "logits%g dropout%g seed=%llu",
             dtype_name(c->dtype), c->o_f32 ? "->f32" : "",
             c->descale == 1   ? " descale/tensor"
             : c->descale == 2 ? " descale/(b,hkv)"
             : c->descale == 3 ? " descale/(b,hkv,block)"
                               : "", (int)c->batch, (int)c->seqlen_q,
             (int)c->seqlen_k, (int)c->heads_q, (int)c->heads_kv, (int)c->head_dim,
             (int)c->causal, (int)c->window_left, (int)c->window_right, (double)c->softcap,
             (double)c->scale, layouts[c->layout], c->varlen ? " varlen" : "",
             c->with_lse ? " lse" : "", (double)c->logit_scale, (double)c->dropout_p,
             (unsigned long long)c->seed);
}

void fa_ref_fill(fa_rng *r, fa_dtype t, void *p, int64_t n, double amp)
{
    for (int64_t i = 0; i < n; i++)
        fa_ref_encode(t, p, i, amp * fa_rng_uniform(r));
}

void fa_ref_v_first_nonneg(fa_dtype t, void *v, int64_t n0, int64_t s0, int64_t n1, int64_t s1, int64_t n2,
                           int64_t s2)
{
    for (int64_t i = 0; i < n0; i++)
        for (int64_t j = 0; j < n1; j++)
            for (int64_t k = 0; k < n2; k++) {
                const int64_t at = i * s0 + j * s1 + k * s2;
                fa_ref_encode(t, v, at, fabs(fa_ref_decode(t, v, at)));
            }
}

/* Read o (in its layout) and lse (through its strides, all 0 = the contiguous default) into
 * the reference's packed-row order. */
static void gather(const fa_attention_desc *d, double *out, double *lse_out)
{
    const int32_t hq = d->num_heads_q, dim = d->head_dim;
    const int dflt = !d->lse_stride_batch && !d->lse_stride_head && !d->lse_stride_seq;
    const int64_t ls = dflt ? 1 : d->lse_stride_seq, lh = dflt ? d->seqlen_q : d->lse_stride_head;
    const int64_t lb = d->cu_seqlens_q ? 0 : dflt ? (int64_t)hq * d->seqlen_q : d->lse_stride_batch;
    for (int32_t b = 0; b < d->batch; b++) {
        int64_t q0 = d->cu_seqlens_q ? d->cu_seqlens_q[b] : (int64_t)b * d->seqlen_q;
        int64_t sq = d->cu_seqlens_q ? d->cu_seqlens_q[b + 1] - q0 : d->seqlen_q;
        for (int64_t i = 0; i < sq; i++)
            for (int32_t h = 0; h < hq; h++) {
                int64_t row = q0 + i, trow = d->cu_seqlens_q ? row : i;
                int64_t base = (d->cu_seqlens_q ? 0 : (int64_t)b * d->o.stride_batch) +
                               trow * d->o.stride_seq + (int64_t)h * d->o.stride_head;
                for (int32_t x = 0; x < dim; x++)
                    out[(row * hq + h) * dim + x] = fa_ref_decode(d->o.dtype, d->o.data, base + x);
                if (d->lse)
                    lse_out[row * hq + h] = d->lse[b * lb + h * lh + trow * ls];
            }
    }
}

typedef struct errs {
    double o, lse, ref_max, lse_max;
    int bad_masked; /* a fully masked row that is not exactly 0 / -inf */
    int non_finite; /* NaN or inf where a number was expected (unwritten output) */
} errs;

static errs compare(int64_t rows, int32_t hq, int32_t dim, int64_t every, const double *ref,
                    const double *got, const double *lref, const double *lgot)
{
    errs e = { 0 };
    for (int64_t row = 0; row < rows; row++) {
        if (every > 1 && row % every)
            continue;
        for (int32_t h = 0; h < hq; h++) {
            int masked = lref && lref[row * hq + h] == -INFINITY;
            for (int32_t x = 0; x < dim; x++) {
                double r = ref[(row * hq + h) * dim + x], g = got[(row * hq + h) * dim + x];
                if (!isfinite(g))
                    e.non_finite = 1;
                if (masked && g != 0.0)
                    e.bad_masked = 1;
                if (fabs(g - r) > e.o || isnan(g))
                    e.o = isnan(g) ? INFINITY : fabs(g - r);
                if (fabs(r) > e.ref_max)
                    e.ref_max = fabs(r);
            }
            if (lgot) {
                double r = lref[row * hq + h], g = lgot[row * hq + h];
                if (masked) {
                    if (g != -INFINITY)
                        e.bad_masked = 1;
                } else {
                    if (!isfinite(g))
                        e.non_finite = 1;
                    if (fabs(g - r) > e.lse || isnan(g))
                        e.lse = isnan(g) ? INFINITY : fabs(g - r);
                    if (fabs(r) > e.lse_max)
                        e.lse_max = fabs(r);
                }
            }
        }
    }
    return e;
}

void *fa_case_translate(const void *p, const void *host, void *dev, int64_t bytes)
{
    const char *c = p, *h = host;
    if (!p || !host || c < h || c >= h + (bytes ? bytes : 1))
        return NULL;
    return (char *)dev + (c - h);
}

void fa_case_unstage(fa_context_t ctx, fa_case_staged *st)
{
    fa_memory_free(ctx, st->q);
    fa_memory_free(ctx, st->kv);
    fa_memory_free(ctx, st->o);
    fa_memory_free(ctx, st->lse);
    fa_memory_free(ctx, st->ds);
    memset(st, 0, sizeof(*st));
}

static int stage_one(fa_context_t ctx, const void *host, int64_t bytes, int upload, void **dev,
                     char *msg, size_t cap)
{
    if (!host)
        return 0;
    fa_status s = fa_memory_alloc(ctx, (size_t)bytes, dev);
    if (s == FA_OK && upload)
        s = fa_memory_upload(ctx, *dev, host, (size_t)bytes);
    if (s != FA_OK) {
        snprintf(msg, cap, "staging %lld bytes: %s", (long long)bytes, fa_context_last_error(ctx));
        return -1;
    }
    return 0;
}

int fa_case_stage(fa_context_t ctx, const fa_case_inputs *in, fa_case_staged *st, char *msg,
                  size_t cap)
{
    memset(st, 0, sizeof(*st));
    if (stage_one(ctx, in->q, in->q_bytes, 1, &st->q, msg, cap) ||
        stage_one(ctx, in->kv, in->kv_bytes, 1, &st->kv, msg, cap) ||
        stage_one(ctx, in->o, in->o_bytes, 0, &st->o, msg, cap) ||
        stage_one(ctx, in->lse, in->lse_bytes, 0, (void **)&st->lse, msg, cap) ||
        stage_one(ctx, in->ds, in->ds_bytes, 1, (void **)&st->ds, msg, cap)) {
        fa_case_unstage(ctx, st);
        return -1;
    }
    st->d = in->d;
    fa_attention_desc *d = &st->d;
    const fa_tensor *src[3] = { &in->d.q, &in->d.k, &in->d.v };
    fa_tensor *dst[3] = { &d->q, &d->k, &d->v };
    for (int i = 0; i < 3; i++) {
        void *p = fa_case_translate(src[i]->data, in->q, st->q, in->q_bytes);
        dst[i]->data = p ? p : fa_case_translate(src[i]->data, in->kv, st->kv, in->kv_bytes);
    }
    d->o.data = fa_case_translate(in->d.o.data, in->o, st->o, in->o_bytes);
    d->lse = fa_case_translate(in->d.lse, in->lse, st->lse, in->lse_bytes);
    fa_descale *ds[3] = { &d->q_descale, &d->k_descale, &d->v_descale };
    for (int i = 0; i < 3; i++)
        ds[i]->data = fa_case_translate(ds[i]->data, in->ds, st->ds, in->ds_bytes);
    return 0;
}

static int run_algo(fa_context_t ctx, fa_case_inputs *in, fa_case_staged *st, fa_algorithm a,
                    double *o_out, double *lse_out, fa_case_result *res)
{
    fa_attention_desc *d = &in->d;
    memset(in->o, 0xff, (size_t)in->o_bytes); /* NaN poison: every element must be written */
    for (int64_t i = 0; in->lse && i < in->lse_bytes / 4; i++)
        in->lse[i] = NAN;
    st->d.algorithm = a;
    fa_run_info plan = { .size = sizeof(plan) }, ran = { .size = sizeof(ran) };
    fa_status s = fa_forward_plan(ctx, &st->d, &plan);
    if (s == FA_OK)
        s = fa_memory_upload(ctx, st->o, in->o, (size_t)in->o_bytes);
    if (s == FA_OK && in->lse)
        s = fa_memory_upload(ctx, st->lse, in->lse, (size_t)in->lse_bytes);
    if (s == FA_OK)
        s = fa_forward(ctx, &st->d);
    if (s == FA_OK)
        s = fa_context_last_run(ctx, &ran);
    /* the plan is what runs: kernel, tiles, threads and workspace alike */
    if (s == FA_OK && (strcmp(plan.kernel, ran.kernel) != 0 || plan.block_q != ran.block_q ||
                       plan.block_k != ran.block_k || plan.threads != ran.threads ||
                       plan.workspace_bytes != ran.workspace_bytes)) {
        snprintf(res->message, sizeof(res->message),
                 "fa_forward_plan reported %s %dx%d, %d threads, %llu bytes; fa_forward ran %s %dx%d, "
                 "%d threads, %llu bytes",
                 plan.kernel, (int)plan.block_q, (int)plan.block_k, (int)plan.threads,
                 (unsigned long long)plan.workspace_bytes, ran.kernel, (int)ran.block_q, (int)ran.block_k,
                 (int)ran.threads, (unsigned long long)ran.workspace_bytes);
        return -1;
    }
    if (s == FA_OK && a == FA_ALGORITHM_FLASH)
        res->kernel = ran.kernel;
    if (s == FA_OK)
        s = fa_context_synchronize(ctx);
    if (s == FA_OK)
        s = fa_memory_download(ctx, in->o, st->o, (size_t)in->o_bytes);
    if (s == FA_OK && in->lse)
        s = fa_memory_download(ctx, in->lse, st->lse, (size_t)in->lse_bytes);
    if (s != FA_OK) {
        snprintf(res->message, sizeof(res->message), "%s: %s", fa_status_string(s),
                 fa_context_last_error(ctx));
        return -1;
    }
    gather(d, o_out, lse_out);
    return 0;
}

void fa_case_inputs_free(fa_case_inputs *in)
{
    free(in->q);
    free(in->kv);
    free(in->o);
    free(in->lse);
    free(in->cu_q);
    free(in->cu_k);
    free(in->ds);
    memset(in, 0, sizeof(*in));
}

int fa_case_inputs_make(const fa_case *c, int with_lse, fa_case_inputs *in)
{
    memset(in, 0, sizeof(*in));
    fa_rng rng = { c->seed };
    const int64_t dim = c->head_dim, hq = c->heads_q, hk = c->heads_kv, B = c->batch;
    const int64_t esz = fa_ref_dtype_bytes(c->dtype);
    const fa_dtype odt = c->o_f32 ? FA_DTYPE_F32 : c->dtype == FA_DTYPE_E4M3 ? FA_DTYPE_BF16 : c->dtype;

    /* Sequence extents: per-batch (fixed) or packed totals (varlen). */
    int64_t tq = c->seqlen_q, tk = c->seqlen_k, nb = B;
    if (c->varlen) {
        in->cu_q = malloc(sizeof(int32_t) * (size_t)(B + 1));
        in->cu_k = malloc(sizeof(int32_t) * (size_t)(B + 1));
        if (!in->cu_q || !in->cu_k)
            goto oom;
        in->cu_q[0] = in->cu_k[0] = 0;
        for (int64_t b = 0; b < B; b++) {
            /* lengths in [0, max]: empty sequences are legal and must be handled */
            int32_t lq = (int32_t)(fa_rng_next(&rng) % (uint64_t)(c->seqlen_q + 1));
            int32_t lk = (int32_t)(fa_rng_next(&rng) % (uint64_t)(c->seqlen_k + 1));
            if (b == 0) {
                lq = c->seqlen_q;
                lk = c->seqlen_k;
            }
            in->cu_q[b + 1] = in->cu_q[b] + lq;
            in->cu_k[b + 1] = in->cu_k[b] + lk;
        }
        tq = in->cu_q[B];
        tk = in->cu_k[B];
        nb = 1;
    }
    in->rows = nb * tq;
    in->krows = nb * tk;
    int64_t q_n = nb * tq * hq * dim, kv_n;

    fa_attention_desc *d = &in->d;
    fa_attention_desc_init(d);
    d->batch = (int32_t)B;
    d->seqlen_q = (int32_t)tq;
    d->seqlen_k = (int32_t)tk;
    d->num_heads_q = (int32_t)hq;
    d->num_heads_kv = (int32_t)hk;
    d->head_dim = (int32_t)dim;
    d->scale = c->scale;
    d->causal = c->causal;
    d->window_left = c->window_left;
    d->window_right = c->window_right;
    d->softcap = c->softcap;
    d->cu_seqlens_q = in->cu_q;
    d->cu_seqlens_k = in->cu_k;
    d->dropout_p = c->dropout_p;
    d->dropout_seed = c->seed * 31 + 7;
    d->dropout_offset = c->seed >> 7;

    int one_buffer = c->layout == FA_CASE_QKV_PACKED && c->seqlen_q == c->seqlen_k && !c->varlen;
    if (one_buffer) {
        /* [b, s, hq + 2*hk, d]: q, k, v heads side by side in one row */
        int64_t w = (hq + 2 * hk) * dim;
        kv_n = nb * tq * w;
        in->kv_bytes = kv_n * esz;
        in->kv = malloc((size_t)(kv_n * esz));
        if (!in->kv)
            goto oom;
        fa_ref_fill(&rng, c->dtype, in->kv, kv_n, 1.0);
        char *base = in->kv;
        d->q = (fa_tensor){ base, c->dtype, tq * w, w, dim };
        d->k = (fa_tensor){ base + hq * dim * esz, c->dtype, tq * w, w, dim };
        d->v = (fa_tensor){ base + (hq + hk) * dim * esz, c->dtype, tq * w, w, dim };
        for (int64_t i = 0; i < nb * tq; i++) /* scale the q part for large-logit cases */
            for (int64_t x = 0; x < hq * dim; x++)
                fa_ref_encode(c->dtype, in->kv, i * w + x, c->logit_scale * fa_rng_uniform(&rng));
    } else {
        in->q = malloc((size_t)((q_n ? q_n : 1) * esz));
        kv_n = 2 * nb * tk * hk * dim;
        in->q_bytes = q_n * esz;
        in->kv_bytes = kv_n * esz;
        in->kv = malloc((size_t)((kv_n ? kv_n : 1) * esz));
        if (!in->q || !in->kv)
            goto oom;
        fa_ref_fill(&rng, c->dtype, in->q, q_n, c->logit_scale);
        fa_ref_fill(&rng, c->dtype, in->kv, kv_n, 1.0);
        fa_layout lay = c->layout == FA_CASE_BHSD ? FA_LAYOUT_BHSD : FA_LAYOUT_BSHD;
        d->q = fa_tensor_contiguous(in->q, c->dtype, lay, (int32_t)tq, (int32_t)hq, (int32_t)dim);
        if (c->layout == FA_CASE_QKV_PACKED) {
            /* packed KV: [b, sk, 2, hk, d] */
            int64_t w = 2 * hk * dim;
            char *base = in->kv;
            d->k = (fa_tensor){ base, c->dtype, tk * w, w, dim };
            d->v = (fa_tensor){ base + hk * dim * esz, c->dtype, tk * w, w, dim };
        } else {
            d->k = fa_tensor_contiguous(in->kv, c->dtype, lay, (int32_t)tk, (int32_t)hk, (int32_t)dim);
            d->v = fa_tensor_contiguous((char *)in->kv + kv_n / 2 * esz, c->dtype, lay, (int32_t)tk,
                                        (int32_t)hk, (int32_t)dim);
        }
    }
    fa_ref_v_first_nonneg(c->dtype, d->v.data, nb, d->v.stride_batch, tk, d->v.stride_seq, hk, d->v.stride_head);
    in->o_bytes = q_n * fa_ref_dtype_bytes(odt);
    if (c->descale) { /* factors in [0.5, 2): one a tensor (strides 0), per (batch, kv head), or
                       * per (batch, kv head, block of 16, 1 or 48 query rows and of 32, 5 or
                       * 128 key rows for k and for v, each by the case's seed) */
        static const int32_t qblk[3] = { 16, 1, 48 }, kblk[3] = { 32, 5, 128 };
        const int b3 = c->descale == 3;
        const int32_t blk[3] = { b3 ? qblk[c->seed % 3] : 0, b3 ? kblk[c->seed / 3 % 3] : 0,
                                 b3 ? kblk[c->seed / 9 % 3] : 0 };
        const int64_t rows[3] = { tq, tk, tk };
        int64_t nblk[3], per[3], total = 0;
        for (int i = 0; i < 3; i++) {
            nblk[i] = blk[i] && rows[i] > blk[i] ? (rows[i] + blk[i] - 1) / blk[i] : 1;
            per[i] = c->descale >= 2 ? B * hk * nblk[i] : 1;
            total += per[i];
        }
        in->ds_bytes = total * (int64_t)sizeof(float);
        in->ds = malloc((size_t)in->ds_bytes);
        if (!in->ds)
            goto oom;
        for (int64_t i = 0; i < total; i++)
            in->ds[i] = (float)exp2(fa_rng_uniform(&rng));
        fa_descale *ds[3] = { &d->q_descale, &d->k_descale, &d->v_descale };
        for (int i = 0, at = 0; i < 3; at += (int)per[i], i++)
            *ds[i] = (fa_descale){ .data = in->ds + at,
                                   .stride_batch = c->descale >= 2 ? hk * nblk[i] : 0,
                                   .stride_head = c->descale >= 2 ? nblk[i] : 0,
                                   .stride_block = blk[i] ? 1 : 0,
                                   .block_rows = blk[i] };
    }
    in->o = malloc((size_t)(in->o_bytes ? in->o_bytes : 1));
    if (with_lse) {
        in->lse_bytes = (int64_t)sizeof(float) * in->rows * hq;
        in->lse = malloc((size_t)(in->lse_bytes ? in->lse_bytes : 1));
    }
    if (!in->o || (with_lse && !in->lse))
        goto oom;
    d->o = fa_tensor_contiguous(in->o, odt, c->layout == FA_CASE_BHSD ? FA_LAYOUT_BHSD : FA_LAYOUT_BSHD,
                                (int32_t)tq, (int32_t)hq, (int32_t)dim);
    d->lse = in->lse;
    return 0;
oom:
    fa_case_inputs_free(in);
    return -1;
}

int fa_case_run_staged(fa_context_t ctx, fa_case_inputs *in, fa_case_staged *st,
                       const char *label, fa_case_result *res)
{
    memset(res, 0, sizeof(*res));
    double *o_ref = NULL, *o_got = NULL, *lse_ref = NULL, *lse_got = NULL;
    const fa_attention_desc *d = &in->d;
    const int with_lse = in->lse != NULL;
    const int64_t hq = d->num_heads_q, dim = d->head_dim, rows = in->rows, lse_n = rows * hq;
    const int64_t o_n = rows * hq * dim;
    const fa_dtype odt = d->o.dtype;
    o_ref = malloc(sizeof(double) * (size_t)(o_n ? o_n : 1));
    o_got = malloc(sizeof(double) * (size_t)(o_n ? o_n : 1));
    lse_ref = malloc(sizeof(double) * (size_t)(lse_n ? lse_n : 1));
    lse_got = malloc(sizeof(double) * (size_t)(lse_n ? lse_n : 1));
    if (!o_ref || !o_got || !lse_ref || !lse_got)
        goto oom;

    /* Sample rows of very large shapes: the float64 reference is O(n^2 d). */
    double work = (double)rows * (double)hq * (double)(d->cu_seqlens_q ? in->krows : d->seqlen_k) *
                  (double)dim;
    int64_t every = work > 4e9 ? (int64_t)ceil(work / 4e9) : 1;
    double score_max = 0.0;
    if (fa_ref_attention(d, every, o_ref, lse_ref, &score_max) != 0)
        goto oom;

    double *lg = with_lse ? lse_got : NULL;
    if (run_algo(ctx, in, st, FA_ALGORITHM_STANDARD, o_got, lg, res) != 0)
        goto fail;
    errs es = compare(rows, (int32_t)hq, (int32_t)dim, every, o_ref, o_got, lse_ref, lg);
    if (run_algo(ctx, in, st, FA_ALGORITHM_FLASH, o_got, lg, res) != 0)
        goto fail;
    errs ef = compare(rows, (int32_t)hq, (int32_t)dim, every, o_ref, o_got, lse_ref, lg);

    res->err_flash = ef.o;
    res->err_standard = es.o;
    res->lse_err_flash = ef.lse;
    res->lse_err_standard = es.lse;
    /* fp8 inputs are exact values: the floor follows what P is multiplied in (float32 on the
     * CPU, the input type on GPU tensor cores) */
    const fa_dtype p_in =
        d->q.dtype == FA_DTYPE_E4M3 && fa_context_backend(ctx) == FA_BACKEND_CPU ? FA_DTYPE_F32 : d->q.dtype;
    res->tolerance = fa_output_tolerance(es.o, ef.ref_max, p_in, odt);
    /* lse = max + log(sum) in float32: its rounding follows the larger of |lse| and the
     * scores it was taken over (raw scores in the thousands round at ~1e-4 before any cap
     * brings the logits down) */
    double lse_tol = 2.0 * es.lse + 16.0 * 0x1p-24 * fmax(fmax(ef.lse_max, score_max), 1.0);
    /* fp8 on tensor cores: Hopper sums fp8 products into S keeping about 14 bits (not float32's
     * 24), scores off by ~2^-12 of their size (2^-10 measured against the largest, with margin) */
    if (p_in == FA_DTYPE_E4M3)
        lse_tol += 0x1p-10 * score_max;
    /* flash and standard share kernels and tile code: the standard's own error
     * must stay a rounding error, or a shared mistake would pass unseen */
    double gross = 1e-2 * fmax(ef.ref_max, 1e-3) + 4.0 * fmax(fa_unit_roundoff(odt), fa_unit_roundoff(p_in)) * ef.ref_max;
    res->passed = !ef.non_finite && !ef.bad_masked && ef.o <= res->tolerance && es.o <= gross &&
                  (!with_lse || ef.lse <= lse_tol);
    if (!res->passed)
        snprintf(res->message, sizeof(res->message),
                 "%s%serr %.3g (standard %.3g, tol %.3g) lse err %.3g (tol %.3g): %s",
                 ef.non_finite ? "non-finite output; " : "",
                 ef.bad_masked ? "masked row not 0/-inf; " : "", ef.o, es.o, res->tolerance, ef.lse,
                 lse_tol, label);
    int rc = 0;
    goto done;
oom:
    snprintf(res->message, sizeof(res->message), "out of memory setting up the case");
fail:
    rc = -1;
done:
    free(o_ref);
    free(o_got);
    free(lse_ref);
    free(lse_got);
    return rc;
}

int fa_case_run(fa_context_t ctx, const fa_case *c, fa_case_result *res)
{
    memset(res, 0, sizeof(*res));
    const char *refused = fa_backend_refuses(ctx, c);
    if (refused) {
        res->passed = fa_case_check_refused(ctx, c, refused, res->message, sizeof(res->message)) == 0;
        return 0;
    }
    fa_case_inputs in;
    if (fa_case_inputs_make(c, c->with_lse, &in) != 0) {
        snprintf(res->message, sizeof(res->message), "out of memory setting up the case");
        return -1;
    }
    char label[256];
    fa_case_format(c, label, sizeof(label));
    fa_case_staged st;
    int rc = fa_case_stage(ctx, &in, &st, res->message, sizeof(res->message));
    if (rc == 0) {
        rc = fa_case_run_staged(ctx, &in, &st, label, res);
        fa_case_unstage(ctx, &st);
    }
    fa_case_inputs_free(&in);
    return rc;
}

fa_backend fa_test_backend(void)
{
    const char *b = getenv("FLASHATTN_TEST_BACKEND");
    if (b && strcmp(b, "cuda") == 0)
        return FA_BACKEND_CUDA;
    if (b && strcmp(b, "gles") == 0)
        return FA_BACKEND_GLES;
    return FA_BACKEND_CPU;
}

int fa_test_case_every(void)
{
    const char *e = getenv("FLASHATTN_TEST_EVERY");
    int n = e && *e ? atoi(e) : 1;
    return n > 1 ? n : 1;
}

/* Whether a CUDA context runs fp8 inputs (on Hopper: its info names the fp8 kernel). */
static int cuda_runs_fp8(fa_context_t ctx)
{
    char info[8192];
    return fa_context_info(ctx, info, sizeof(info), NULL) == FA_OK && strstr(info, "cuda.tiles.sm90.fp8:") != NULL;
}

const char *fa_backend_refuses(fa_context_t ctx, const fa_case *c)
{
    const fa_backend b = fa_context_backend(ctx);
    if (b == FA_BACKEND_CUDA && c->dtype == FA_DTYPE_E4M3)
        return !cuda_runs_fp8(ctx) ? "dtype" : c->head_dim > 128 ? "head_dim" : NULL;
    if ((b == FA_BACKEND_CUDA && c->dtype == FA_DTYPE_F32) || (b != FA_BACKEND_CPU && c->dtype == FA_DTYPE_E4M3))
        return "dtype";
    if (b == FA_BACKEND_GLES && c->dropout_p > 0.0f)
        return "dropout_p";
    return NULL;
}

int fa_case_check_refused(fa_context_t ctx, const fa_case *c, const char *field, char *msg,
                          size_t cap)
{
    fa_case_inputs in;
    if (fa_case_inputs_make(c, c->with_lse, &in) != 0) {
        snprintf(msg, cap, "out of memory setting up the case");
        return -1;
    }
    fa_status s = fa_forward_plan(ctx, &in.d, NULL);
    fa_case_inputs_free(&in);
    if (s != FA_ERR_UNSUPPORTED || !strstr(fa_context_last_error(ctx), field)) {
        snprintf(msg, cap, "expected FA_ERR_UNSUPPORTED naming %s, got %s (%s)", field,
                 fa_status_string(s), fa_context_last_error(ctx));
        return -1;
    }
    return 0;
}

/* ---- the grid ---- */

typedef struct feature {
    int causal, wl, wr;
    float softcap;
} feature;

/* Keep a case's float64 reference under ~1e9 multiply-adds: one sequence, then one kv head. */
static void bound_work(fa_case *c)
{
    const int32_t g = c->heads_q / c->heads_kv;
    double work = (double)c->batch * c->heads_q * c->seqlen_q * c->seqlen_k * c->head_dim;
    while (work > 1e9 && (c->batch > 1 || c->heads_kv > 1)) {
        if (c->batch > 1)
            c->batch = 1;
        else
            c->heads_kv = 1;
        c->heads_q = c->heads_kv * g;
        work = (double)c->batch * c->heads_q * c->seqlen_q * c->seqlen_k * c->head_dim;
    }
}

int fa_grid_build(int level, uint64_t seed, fa_case *out, int cap)
{
    static const fa_dtype dtypes[] = { FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16 };
    static const int32_t dims[] = { 1, 8, 32, 64, 80, 96, 128, 256 };
    static const int32_t seqs_full[] = { 1, 2, 17, 127, 128, 129, 1000, 2048 };
    static const int32_t seqs_quick[] = { 1, 2, 17, 63, 64, 65, 127, 200 };
    static const int32_t groups[] = { 1, 2, 8 };
    static const feature feats[] = {
        { 0, -1, -1, 0.0f }, { 1, -1, -1, 0.0f }, { 0, 16, 8, 0.0f }, { 1, -1, -1, 30.0f },
        { 0, -1, -1, 5.0f }, { 1, 40, -1, 0.0f }, { 0, 0, 0, 0.0f }, { 0, 7, -1, 20.0f },
    };
    const int32_t *seqs = level ? seqs_full : seqs_quick;
    fa_rng rng = { seed };
    int n = 0, k = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int di = 0; di < 8; di++)
            for (int si = 0; si < 8; si++, k++) {
                if (n >= cap)
                    return n;
                fa_case c;
                memset(&c, 0, sizeof(c));
                c.dtype = dtypes[ti];
                c.head_dim = dims[di];
                c.seqlen_q = seqs[si];
                /* sk walks the list at another pace: sq > sk, sq < sk and sq == sk all occur */
                c.seqlen_k = seqs[(si * 3 + di + ti) % 8];
                const feature *f = &feats[(k + di) % 8];
                c.causal = f->causal;
                c.window_left = f->wl;
                c.window_right = f->wr;
                c.softcap = f->softcap;
                int32_t g = groups[(k + si) % 3];
                c.heads_kv = 1 + (int32_t)(fa_rng_next(&rng) % 2);
                c.heads_q = c.heads_kv * g;
                c.batch = 1 + (int32_t)(fa_rng_next(&rng) % 3);
                c.layout = (fa_case_layout)((k + ti) % 3);
                c.varlen = k % 5 == 2;
                c.with_lse = k % 4 != 3;
                c.o_f32 = c.dtype != FA_DTYPE_F32 && k % 7 == 1;
                c.scale = k % 11 == 5 ? 0.5f : 0.0f;
                c.logit_scale = k % 13 == 4 ? 300.0f : 1.0f; /* logits of several thousand */
                c.dropout_p = k % 6 == 1 ? 0.17f : k % 17 == 3 ? 0.6f : 0.0f;
                bound_work(&c);
                c.seed = fa_rng_next(&rng);
                out[n++] = c;
            }

    /* Decode: 1 to 4 query rows a sequence (speculative decoding verifies a few) with GQA groups
     * of 1, 4 and 8, so that a kv head's packed rows fill 8, 16 or more than 16 (CUDA's decode
     * kernel holds 16), against keys from one to several of CUDA's 1024-key splits. */
    static const int32_t dec_dims[] = { 64, 128, 256, 80, 1, 96 };
    static const int32_t dec_groups[] = { 1, 4, 8 };
    static const int32_t dec_keys_full[] = { 1, 17, 1025, 2048, 4100 };
    static const int32_t dec_keys_quick[] = { 1, 17, 200, 1025, 1100 };
    const int32_t *dec_keys = level ? dec_keys_full : dec_keys_quick;
    for (int ti = 0; ti < 3; ti++)
        for (int i = 0; i < 16; i++) {
            if (n >= cap)
                return n;
            fa_case c;
            memset(&c, 0, sizeof(c));
            c.dtype = dtypes[ti];
            c.head_dim = dec_dims[(i + ti) % 6];
            c.seqlen_q = 1 + i % 4;
            c.seqlen_k = dec_keys[(i + 2 * ti) % 5];
            const feature *f = &feats[(i + 3 * ti) % 8];
            c.causal = f->causal;
            c.window_left = f->wl;
            c.window_right = f->wr;
            c.softcap = f->softcap;
            const int32_t g = dec_groups[(i / 4) % 3];
            c.heads_kv = 1 + (int32_t)(fa_rng_next(&rng) % 3);
            c.heads_q = c.heads_kv * g;
            c.batch = 1 + (int32_t)(fa_rng_next(&rng) % 3);
            c.layout = (fa_case_layout)((i + ti) % 3);
            c.varlen = i % 3 == 1;
            c.with_lse = i % 4 != 3;
            c.o_f32 = c.dtype != FA_DTYPE_F32 && i % 5 == 2;
            c.scale = i % 7 == 5 ? 0.5f : 0.0f;
            c.logit_scale = i % 9 == 4 ? 300.0f : 1.0f;
            c.dropout_p = i == 6 ? 0.17f : 0.0f;
            bound_work(&c);
            c.seed = fa_rng_next(&rng);
            out[n++] = c;
        }

    /* fp8 (e4m3) inputs, o bf16 or float32, without descale factors, with one a tensor, one
     * per (batch, kv head) or one per block of rows: prefill shapes, then decode rows (a few
     * query rows, many keys) */
    static const int32_t f8_dims[] = { 8, 64, 80, 128 };
    for (int i = 0; i < 24; i++) {
        if (n >= cap)
            return n;
        fa_case c;
        memset(&c, 0, sizeof(c));
        c.dtype = FA_DTYPE_E4M3;
        c.head_dim = f8_dims[i % 4];
        c.seqlen_q = i < 16 ? seqs[(i * 5 + 1) % 8] : 1 + i % 4;
        c.seqlen_k = i < 16 ? seqs[(i * 3 + 2) % 8] : dec_keys[i % 5];
        const feature *f = &feats[(i + i / 8) % 8];
        c.causal = f->causal;
        c.window_left = f->wl;
        c.window_right = f->wr;
        c.softcap = f->softcap;
        const int32_t g = groups[(i / 2) % 3];
        c.heads_kv = 1 + (int32_t)(fa_rng_next(&rng) % 2);
        c.heads_q = c.heads_kv * g;
        c.batch = 1 + (int32_t)(fa_rng_next(&rng) % 3);
        c.layout = (fa_case_layout)(i % 3);
        c.varlen = i % 5 == 2;
        c.with_lse = i % 4 != 3;
        c.o_f32 = i % 4 == 1;
        c.scale = i % 7 == 5 ? 0.5f : 0.0f;
        c.logit_scale = i % 9 == 4 ? 300.0f : 1.0f;
        c.dropout_p = i == 7 ? 0.17f : 0.0f;
        c.descale = (i + i / 8) % 4;
        bound_work(&c);
        c.seed = fa_rng_next(&rng);
        out[n++] = c;
    }
    return n;
}
