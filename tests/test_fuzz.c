/* SPDX-License-Identifier: MIT */
/*
 * A bounded random-descriptor fuzzer. Each case draws a valid call from what the descriptor
 * allows (dtypes and o as float32, head_dim 1..256, batch, lengths 0, 1, odd and tile edges
 * with sq != sk, MHA/GQA/MQA, BSHD, BHSD and packed layouts with padded strides and views
 * off their buffer's start, causal and windows, softcap, scale, varlen with empty sequences
 * and rows past the last, lse with its own strides, dropout) and runs it through the public
 * API on FLASHATTN_TEST_BACKEND: flash and standard against the float64 reference by the
 * conformance rule, the bytes around o and lse left as they were, the inputs untouched (the
 * bytes around them are NaN, so a read outside a view shows). In a share of the cases one
 * field is then made invalid: the call must fail with the status and a message naming that
 * field, and write nothing.
 *
 * FLASHATTN_TEST_SEED=N replays a run: its first case is case N, so N from a failure and
 * FLASHATTN_FUZZ_ITERS=1 replay that case alone. FLASHATTN_FUZZ_ITERS sets the number of cases
 * (default 5000, 300 with FLASHATTN_TEST_QUICK=1 as sanitizer builds run).
 */
#include "ref.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

enum {
    DEFAULT_ITERS = 5000,
    QUICK_ITERS = 300,
    SHOWN_FAILURES = 8,
    MAX_BATCH = 5,
    THREADS_OTHER = 3
};
/* multiply-adds of one case's float64 reference: keeps every case a few milliseconds */
#define WORK_CAP 1.5e6

static uint64_t first_seed;
static long iters;

static uint64_t rnd(fa_rng *r, uint64_t n) { return fa_rng_next(r) % n; }
static int chance(fa_rng *r, int percent) { return (int)rnd(r, 100) < percent; }
static int64_t esize(fa_dtype t) { return t == FA_DTYPE_F32 ? 4 : 2; }

static const char *dtype_name(fa_dtype t)
{
    static const char *names[] = { "f32", "f16", "bf16" };
    return (unsigned)t < 3 ? names[t] : "?";
}

static int32_t draw_len(fa_rng *r)
{
    static const int32_t edges[] = { 1,  2,  3,  7,   15,  16,  17,  31,  32, 33,
                                     63, 64, 65, 127, 128, 129, 255, 256, 257 };
    uint64_t u = rnd(r, 100);
    if (u < 30)
        return 1 + (int32_t)rnd(r, 4);
    if (u < 60)
        return 5 + (int32_t)rnd(r, 36);
    if (u < 85)
        return edges[rnd(r, sizeof(edges) / sizeof(edges[0]))];
    return 41 + (int32_t)rnd(r, 260);
}

static int32_t draw_dim(fa_rng *r)
{
    static const int32_t dims[] = { 1,  2,  3,  4,  7,  8,   15,  16,  17,  31,  32,  33,  48,
                                    63, 64, 65, 80, 96, 112, 127, 128, 129, 160, 192, 255, 256 };
    uint64_t u = rnd(r, 100);
    if (u < 40)
        return 1 + (int32_t)rnd(r, 16);
    if (u < 65)
        return dims[rnd(r, sizeof(dims) / sizeof(dims[0]))];
    if (u < 90)
        return 17 + (int32_t)rnd(r, 112);
    return 129 + (int32_t)rnd(r, 128);
}

/* A tensor of its own: BHSD or BSHD, with pads (elements) after each head vector or row and
 * after each batch. */
typedef struct layout {
    int bhsd;
    int64_t pad_head, pad_seq, pad_batch;
} layout;

static layout draw_layout(fa_rng *r, int padded)
{
    layout l = { chance(r, 40), 0, 0, 0 };
    if (padded) {
        l.pad_head = (int64_t)rnd(r, 4);
        l.pad_seq = (int64_t)rnd(r, 4);
        l.pad_batch = (int64_t)rnd(r, 5);
    }
    return l;
}

/* Elements from a [nb, seq, heads, dim] view's first to one past its last; 0 when it has none. */
static int64_t span(const fa_tensor *t, int64_t nb, int64_t seq, int64_t heads, int64_t dim)
{
    if (seq == 0)
        return 0;
    return (nb - 1) * t->stride_batch + (seq - 1) * t->stride_seq + (heads - 1) * t->stride_head +
           dim;
}

/* t's strides for layout l */
static void place(fa_tensor *t, const layout *l, int64_t seq, int64_t heads, int64_t dim)
{
    const int64_t s1 = seq ? seq : 1; /* strides stay positive for an empty view */
    if (l->bhsd) {
        t->stride_seq = dim + l->pad_seq;
        t->stride_head = s1 * t->stride_seq + l->pad_head;
        t->stride_batch = heads * t->stride_head + l->pad_batch;
    } else {
        t->stride_head = dim + l->pad_head;
        t->stride_seq = heads * t->stride_head + l->pad_seq;
        t->stride_batch = s1 * t->stride_seq + l->pad_batch;
    }
}

/* Visit every element of a view's rows [0, rows): its index from base. */
typedef void (*visit_fn)(void *ctx, int64_t index);

static void visit(const fa_tensor *t, int64_t off, int64_t nb, int64_t rows, int64_t heads,
                  int64_t dim, visit_fn fn, void *ctx)
{
    for (int64_t b = 0; b < nb; b++)
        for (int64_t s = 0; s < rows; s++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t x = 0; x < dim; x++)
                    fn(ctx, off + b * t->stride_batch + s * t->stride_seq + h * t->stride_head + x);
}

typedef struct filler {
    fa_rng *r;
    fa_dtype t;
    void *base;
    double amp;
} filler;

static void fill_one(void *ctx, int64_t i)
{
    filler *f = ctx;
    fa_ref_encode(f->t, f->base, i, f->amp * fa_rng_uniform(f->r));
}

static void abs_one(void *ctx, int64_t i)
{
    filler *f = ctx;
    fa_ref_encode(f->t, f->base, i, fabs(fa_ref_decode(f->t, f->base, i)));
}

static void mark_one(void *ctx, int64_t i) { ((uint8_t *)ctx)[i] = 1; }

/* n elements of NaN: what every byte outside the input views holds */
static void fill_nan(fa_dtype t, void *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (t == FA_DTYPE_F32)
            ((float *)p)[i] = NAN;
        else
            ((uint16_t *)p)[i] = t == FA_DTYPE_F16 ? 0x7e00 : 0x7fc0;
    }
}

/* A drawn call: the inputs (conformance's struct, so its staging and runner apply) and, for
 * the checks after a run, which elements of o and lse the call writes. */
typedef struct fuzz_case {
    fa_case_inputs in;
    uint8_t *o_written, *lse_written; /* per element of in.o / in.lse */
    int64_t o_elems, lse_elems;
    int64_t q_off, o_off, lse_off; /* element offsets of the views into their buffers */
} fuzz_case;

static void fuzz_case_free(fuzz_case *fc)
{
    fa_case_inputs_free(&fc->in);
    free(fc->o_written);
    free(fc->lse_written);
    memset(fc, 0, sizeof(*fc));
}

static int64_t lse_span(const fa_attention_desc *d, int64_t nb)
{
    if (d->seqlen_q == 0)
        return 0;
    return (nb - 1) * d->lse_stride_batch + (int64_t)(d->seqlen_q - 1) * d->lse_stride_seq +
           (int64_t)(d->num_heads_q - 1) * d->lse_stride_head + 1;
}

/* Draw sizes, then shrink until the reference's work fits the cap: the lengths first, but
 * heads, batch and head_dim first for the long shapes (decode over a long cache, which the
 * CPU splits into key chunks of 256 and more; prefill past a few key tiles). */
static void draw_sizes(fa_rng *r, fa_attention_desc *d, int varlen)
{
    int32_t hkv = 1 + (int32_t)rnd(r, 3);
    static const int32_t groups[] = { 1, 1, 2, 3, 4, 8 };
    int32_t g = groups[rnd(r, sizeof(groups) / sizeof(groups[0]))];
    int32_t batch = 1 + (int32_t)rnd(r, varlen ? MAX_BATCH : 3);
    int32_t sq = draw_len(r), sk = chance(r, 30) ? sq : draw_len(r), dim = draw_dim(r);
    const uint64_t shape = rnd(r, 100);
    const int keep_len = shape < 15;
    if (shape < 10) {
        sq = 1 + (int32_t)rnd(r, 4);
        sk = 257 + (int32_t)rnd(r, 3840);
    } else if (shape < 15) {
        sq = 300 + (int32_t)rnd(r, 800);
        sk = chance(r, 50) ? sq : 300 + (int32_t)rnd(r, 800);
    }
    while ((double)batch * sq * sk * hkv * g * dim > WORK_CAP) {
        if (keep_len && (batch > 1 || g > 1 || hkv > 1 || dim > 8)) {
            if (batch > 1)
                batch--;
            else if (g > 1)
                g = 1;
            else if (hkv > 1)
                hkv--;
            else
                dim = (dim + 1) / 2;
        } else if (sq > 1 || sk > 1) {
            if (sq >= sk)
                sq = (sq + 1) / 2;
            else
                sk = (sk + 1) / 2;
        } else if (batch > 1) {
            batch--;
        } else if (g > 1) {
            g = 1;
        } else if (hkv > 1) {
            hkv--;
        } else {
            dim = (dim + 1) / 2;
        }
    }
    d->batch = batch;
    d->seqlen_q = sq;
    d->seqlen_k = sk;
    d->num_heads_kv = hkv;
    d->num_heads_q = hkv * g;
    d->head_dim = dim;
}

/* Varlen offsets: lengths up to the drawn ones, a fifth of them empty; the tensors may hold
 * a few rows past the last sequence. seqlen_q/k become the tensors' extents. */
static int draw_varlen(fa_rng *r, fa_case_inputs *in, int same)
{
    fa_attention_desc *d = &in->d;
    const int32_t B = d->batch, max_q = d->seqlen_q, max_k = d->seqlen_k;
    in->cu_q = malloc(sizeof(int32_t) * (size_t)(B + 1));
    in->cu_k = malloc(sizeof(int32_t) * (size_t)(B + 1));
    if (!in->cu_q || !in->cu_k)
        return -1;
    in->cu_q[0] = in->cu_k[0] = 0;
    for (int32_t b = 0; b < B; b++) {
        int32_t lq = chance(r, 20) ? 0 : 1 + (int32_t)rnd(r, (uint64_t)max_q);
        int32_t lk = chance(r, 20) ? 0 : 1 + (int32_t)rnd(r, (uint64_t)max_k);
        in->cu_q[b + 1] = in->cu_q[b] + lq;
        in->cu_k[b + 1] = in->cu_k[b] + (same ? lq : lk);
    }
    int32_t extra = chance(r, 30) ? 1 + (int32_t)rnd(r, 3) : 0;
    d->seqlen_q = in->cu_q[B] + extra;
    d->seqlen_k = same ? d->seqlen_q : in->cu_k[B] + (chance(r, 30) ? 1 + (int32_t)rnd(r, 3) : 0);
    d->cu_seqlens_q = in->cu_q;
    d->cu_seqlens_k = in->cu_k;
    in->rows = in->cu_q[B];
    in->krows = in->cu_k[B];
    return 0;
}

/*
 * Large logits only where o is 16-bit. The tolerance's floor scales with the output's
 * rounding, not with the scores': a float32 o from scores of s rounds at about 2^-24 * s in
 * the weights, and flash and standard meet that by different paths, so for scores of
 * hundreds the "twice the standard's error" test is a coin toss (flash at 2.8x the
 * standard's error with AVX-512, the same as it with AVX2). With a float32 o, scale is a
 * multiple of 1/sqrt(head_dim) and q stays in [-1, 1]: scores of a few units.
 */
static int large_logits(fa_rng *r, fa_dtype odt) { return odt != FA_DTYPE_F32 && chance(r, 15); }

static void draw_masks(fa_rng *r, fa_attention_desc *d, fa_dtype odt, fa_backend backend)
{
    const int32_t sk = d->seqlen_k;
    d->causal = chance(r, 25);
    d->window_left = chance(r, 60) ? -1 : (int32_t)rnd(r, (uint64_t)sk + 3);
    d->window_right = chance(r, 60) ? -1 : (int32_t)rnd(r, (uint64_t)sk + 3);
    d->softcap =
        chance(r, 70) ? 0.0f : (float)exp(log(0.5) + log(100.0) * (fa_rng_uniform(r) + 1) / 2);
    const uint64_t u = rnd(r, 100);
    const double unit = odt == FA_DTYPE_F32 ? 1.0 / sqrt((double)d->head_dim) : 1.0;
    if (u >= 60)
        d->scale = (float)(unit * (0.01 + (fa_rng_uniform(r) + 1.0)) * (u < 85 ? 1 : -0.5));
    if (large_logits(r, odt))
        d->scale = (float)(4.0 + 8.0 * (fa_rng_uniform(r) + 1.0));
    /* GLES refuses dropout: that refusal is the conformance grid's to check */
    if (backend != FA_BACKEND_GLES && chance(r, 15)) {
        d->dropout_p = (float)(0.05 + 0.425 * (fa_rng_uniform(r) + 1.0));
        d->dropout_seed = fa_rng_next(r);
        d->dropout_offset = fa_rng_next(r) >> (rnd(r, 64));
    }
}

/* A fresh case from seed: every buffer allocated, inputs filled, o and lse uninitialised. */
static int fuzz_case_make(uint64_t seed, fa_backend backend, fuzz_case *fc)
{
    memset(fc, 0, sizeof(*fc));
    fa_rng rng = { seed }, *r = &rng;
    fa_case_inputs *in = &fc->in;
    fa_attention_desc *d = &in->d;
    fa_attention_desc_init(d);
    const fa_dtype dt =
        backend == FA_BACKEND_CUDA ? (fa_dtype)(1 + rnd(r, 2)) : (fa_dtype)rnd(r, 3);
    const fa_dtype odt = dt != FA_DTYPE_F32 && chance(r, 30) ? FA_DTYPE_F32 : dt;
    const int varlen = chance(r, 30), padded = chance(r, 40);
    draw_sizes(r, d, varlen);
    int packed = (int)rnd(r, 4); /* 0, 1: separate q, k, v; 2: packed KV; 3: packed QKV */
    if (packed == 3 && d->seqlen_q != d->seqlen_k)
        packed = 2;
    if (varlen && draw_varlen(r, in, packed == 3) != 0)
        return -1;
    if (!varlen) {
        in->rows = (int64_t)d->batch * d->seqlen_q;
        in->krows = (int64_t)d->batch * d->seqlen_k;
    }
    draw_masks(r, d, odt, backend);
    const int64_t nb = varlen ? 1 : d->batch, sq = d->seqlen_q, sk = d->seqlen_k;
    const int64_t hq = d->num_heads_q, hk = d->num_heads_kv, dim = d->head_dim, esz = esize(dt);
    d->q.dtype = d->k.dtype = d->v.dtype = dt;
    d->o.dtype = odt;

    /* q, k, v: packed views share strides inside one buffer, else each its own layout */
    layout lq = draw_layout(r, padded), lk = draw_layout(r, padded), lv = draw_layout(r, padded);
    const int64_t kv_start = chance(r, 30) ? (int64_t)rnd(r, 4) : 0;
    int64_t k_off, v_off, q_n = 0, kv_n;
    fc->q_off = chance(r, 30) ? (int64_t)rnd(r, 4) : 0;
    if (packed >= 2) {
        /* a row of [q heads (packed QKV only) | k heads | v heads], one stride_head apart */
        const int64_t sh = dim + lk.pad_head, lead = packed == 3 ? hq : 0, heads = lead + 2 * hk;
        fa_tensor pk = { NULL, dt, 0, heads * sh + lk.pad_seq, sh };
        pk.stride_batch = (sk ? sk : 1) * pk.stride_seq + lk.pad_batch;
        d->k = d->v = pk;
        kv_n = kv_start + span(&pk, nb, sk, heads, dim);
        k_off = kv_start + lead * sh;
        v_off = k_off + hk * sh;
        if (packed == 3) {
            d->q = pk;
            fc->q_off = kv_start;
        }
    } else {
        place(&d->k, &lk, sk, hk, dim);
        place(&d->v, &lv, sk, hk, dim);
        k_off = kv_start;
        v_off = k_off + span(&d->k, nb, sk, hk, dim) + (int64_t)rnd(r, 3);
        kv_n = v_off + span(&d->v, nb, sk, hk, dim);
    }
    if (packed != 3) {
        place(&d->q, &lq, sq, hq, dim);
        q_n = fc->q_off + span(&d->q, nb, sq, hq, dim);
    }
    /* one element more than the views reach: an empty view still points into its buffer,
     * and a write one past the end shows */
    if (kv_n < v_off)
        kv_n = v_off;
    in->kv_bytes = (kv_n + 1) * esz;
    in->kv = malloc((size_t)in->kv_bytes);
    if (packed != 3) {
        in->q_bytes = (q_n + 1) * esz;
        in->q = malloc((size_t)in->q_bytes);
    }
    if (!in->kv || (packed != 3 && !in->q))
        return -1;
    fill_nan(dt, in->kv, in->kv_bytes / esz);
    void *qbuf = packed == 3 ? in->kv : in->q;
    if (in->q)
        fill_nan(dt, in->q, in->q_bytes / esz);
    d->q.data = (char *)qbuf + fc->q_off * esz;
    d->k.data = (char *)in->kv + k_off * esz;
    d->v.data = (char *)in->kv + v_off * esz;
    const double amp = large_logits(r, odt) ? 8.0 + 32.0 * (fa_rng_uniform(r) + 1.0) / 2 : 1.0;
    filler fq = { r, dt, qbuf, amp }, fkv = { r, dt, in->kv, 1.0 };
    visit(&d->q, fc->q_off, nb, sq, hq, dim, fill_one, &fq);
    visit(&d->k, k_off, nb, sk, hk, dim, fill_one, &fkv);
    visit(&d->v, v_off, nb, sk, hk, dim, fill_one, &fkv);
    /* Element 0 of every v vector is non-negative, so that o's largest element is as large as
     * the terms of the sums that make it: the tolerance's floor scales with max |o|, and sums
     * of signed values over long sequences cancel to |o| ~ n^-1/2 of their terms, below the
     * float32 rounding of those terms (1 ulp of them failed the floor at 545 keys). */
    visit(&d->v, v_off, nb, sk, hk, 1, abs_one, &fkv);

    /* o and lse: their own layouts and offsets; which elements the call writes */
    layout lo = draw_layout(r, padded);
    place(&d->o, &lo, sq, hq, dim);
    fc->o_off = chance(r, 30) ? (int64_t)rnd(r, 4) : 0;
    fc->o_elems = fc->o_off + span(&d->o, nb, sq, hq, dim) + 1;
    in->o_bytes = fc->o_elems * esize(odt);
    in->o = malloc((size_t)in->o_bytes);
    fc->o_written = calloc((size_t)fc->o_elems, 1);
    if (!in->o || !fc->o_written)
        return -1;
    d->o.data = (char *)in->o + fc->o_off * esize(odt);
    const int64_t rows = varlen ? in->rows : sq; /* rows the call computes per batch */
    visit(&d->o, fc->o_off, nb, rows, hq, dim, mark_one, fc->o_written);
    if (chance(r, 70)) {
        if (chance(r, 50)) { /* [b, h, s] or [b, s, h], padded like the tensors */
            const int64_t s1 = sq ? sq : 1;
            const int64_t p1 = padded ? (int64_t)rnd(r, 3) : 0,
                          p2 = padded ? (int64_t)rnd(r, 3) : 0;
            if (chance(r, 50)) {
                d->lse_stride_seq = 1;
                d->lse_stride_head = s1 + p1;
                d->lse_stride_batch = hq * d->lse_stride_head + p2;
            } else {
                d->lse_stride_head = 1;
                d->lse_stride_seq = hq + p1;
                d->lse_stride_batch = s1 * d->lse_stride_seq + p2;
            }
            if (varlen) /* unused: any value */
                d->lse_stride_batch = (int64_t)rnd(r, 3);
        }
        const fa_attention_desc *cd = d;
        fa_attention_desc dense = *d;
        if (!d->lse_stride_batch && !d->lse_stride_head && !d->lse_stride_seq) {
            dense.lse_stride_seq = 1;
            dense.lse_stride_head = sq;
            dense.lse_stride_batch = varlen ? 0 : hq * sq;
            cd = &dense;
        }
        fc->lse_off = chance(r, 30) ? (int64_t)rnd(r, 4) : 0;
        fc->lse_elems = fc->lse_off + lse_span(cd, nb) + 1;
        in->lse_bytes = fc->lse_elems * 4;
        in->lse = malloc((size_t)in->lse_bytes);
        fc->lse_written = calloc((size_t)fc->lse_elems, 1);
        if (!in->lse || !fc->lse_written)
            return -1;
        d->lse = in->lse + fc->lse_off;
        const fa_tensor lv_as_tensor = { NULL, FA_DTYPE_F32, cd->lse_stride_batch,
                                         cd->lse_stride_seq, cd->lse_stride_head };
        visit(&lv_as_tensor, fc->lse_off, nb, rows, hq, 1, mark_one, fc->lse_written);
    }
    return 0;
}

/* ---- the full descriptor, for a replay ---- */

/* A pointer as "buffer+offset" when it lies in one of the case's host or staged buffers. */
static void where(const fa_case_inputs *in, const fa_case_staged *st, const void *p, char *buf,
                  size_t cap)
{
    static const char *names[] = { "q", "kv", "o", "lse" };
    const void *host[4] = { in->q, in->kv, in->o, in->lse };
    const void *dev[4] = { st ? st->q : NULL, st ? st->kv : NULL, st ? st->o : NULL,
                           st ? (void *)st->lse : NULL };
    const int64_t bytes[4] = { in->q_bytes, in->kv_bytes, in->o_bytes, in->lse_bytes };
    const uintptr_t at = (uintptr_t)p;
    for (int i = 0; i < 8; i++) {
        const uintptr_t base = (uintptr_t)(i < 4 ? host[i] : dev[i - 4]);
        if (p && base && at >= base && at - base < (uintptr_t)(bytes[i % 4] ? bytes[i % 4] : 1)) {
            snprintf(buf, cap, "%s+%lluB", names[i % 4], (unsigned long long)(at - base));
            return;
        }
    }
    snprintf(buf, cap, "%p", p);
}

static void describe(const fa_case_inputs *in, const fa_case_staged *st, const fa_attention_desc *d)
{
    const struct {
        const char *name;
        const fa_tensor *t;
    } ts[] = { { "q", &d->q }, { "k", &d->k }, { "v", &d->v }, { "o", &d->o } };
    char at[64];
    print_error("  size=%zu batch=%d seqlen_q=%d seqlen_k=%d num_heads_q=%d num_heads_kv=%d "
                "head_dim=%d\n",
                d->size, (int)d->batch, (int)d->seqlen_q, (int)d->seqlen_k, (int)d->num_heads_q,
                (int)d->num_heads_kv, (int)d->head_dim);
    for (size_t i = 0; i < 4; i++) {
        where(in, st, ts[i].t->data, at, sizeof(at));
        print_error(
            "  %s: data=%s dtype=%d(%s) stride_batch=%lld stride_seq=%lld stride_head=%lld\n",
            ts[i].name, at, (int)ts[i].t->dtype, dtype_name(ts[i].t->dtype),
            (long long)ts[i].t->stride_batch, (long long)ts[i].t->stride_seq,
            (long long)ts[i].t->stride_head);
    }
    where(in, st, d->lse, at, sizeof(at));
    print_error("  lse=%s lse_stride_batch=%lld lse_stride_head=%lld lse_stride_seq=%lld\n",
                d->lse ? at : "NULL", (long long)d->lse_stride_batch, (long long)d->lse_stride_head,
                (long long)d->lse_stride_seq);
    print_error("  scale=%.9g causal=%d window_left=%d window_right=%d softcap=%.9g algorithm=%d\n",
                (double)d->scale, (int)d->causal, (int)d->window_left, (int)d->window_right,
                (double)d->softcap, (int)d->algorithm);
    print_error("  dropout_p=%.9g dropout_seed=%llu dropout_offset=%llu\n", (double)d->dropout_p,
                (unsigned long long)d->dropout_seed, (unsigned long long)d->dropout_offset);
    const int32_t *cus[2] = { d->cu_seqlens_q, d->cu_seqlens_k };
    for (int c = 0; c < 2; c++) {
        char line[256] = "";
        size_t n = 0;
        for (int32_t b = 0; cus[c] && b <= d->batch && b <= MAX_BATCH && n < sizeof(line) - 16; b++)
            n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%d", b ? "," : "", (int)cus[c][b]);
        if (cus[c])
            print_error("  cu_seqlens_%s=[%s]\n", c ? "k" : "q", line);
        else
            print_error("  cu_seqlens_%s=NULL\n", c ? "k" : "q");
    }
}

/* ---- one invalid field ---- */

typedef struct injection {
    fa_status want;
    char field[96]; /* what the message must contain */
    int32_t cu[MAX_BATCH + 1];
} injection;

static fa_tensor *pick_tensor(fa_rng *r, fa_attention_desc *d, const char **name)
{
    static const char *names[] = { "q", "k", "v", "o" };
    fa_tensor *ts[] = { &d->q, &d->k, &d->v, &d->o };
    int i = (int)rnd(r, 4);
    *name = names[i];
    return ts[i];
}

/* Axis 0, 1, 2 of a tensor: heads, seq, batch; of lse: seq, heads, batch. */
static const char *const stride_names[3] = { "stride_head", "stride_seq", "stride_batch" };
static const char *const lse_stride_names[3] = { "lse_stride_seq", "lse_stride_head",
                                                 "lse_stride_batch" };

static int64_t *stride_of(fa_tensor *t, int axis)
{
    int64_t *s[3] = { &t->stride_head, &t->stride_seq, &t->stride_batch };
    return s[axis];
}

static int64_t *lse_stride_of(fa_attention_desc *d, int axis)
{
    int64_t *s[3] = { &d->lse_stride_seq, &d->lse_stride_head, &d->lse_stride_batch };
    return s[axis];
}

/* The number of indices along a tensor's axis (batch: 1 for varlen, whose batch stride is
 * unused). */
static int64_t extent_of(const fa_attention_desc *d, const fa_tensor *t, int axis)
{
    const int kv = t == &d->k || t == &d->v;
    if (axis == 0)
        return kv ? d->num_heads_kv : d->num_heads_q;
    if (axis == 1)
        return kv ? d->seqlen_k : d->seqlen_q;
    return d->cu_seqlens_q ? 1 : d->batch;
}

#define SET(st, ...) (inj->want = (st), snprintf(inj->field, sizeof(inj->field), __VA_ARGS__), 1)

/* Make one field of d invalid, kind `kind`; 0 when that kind does not apply to d. */
static int inject(fa_rng *r, int kind, fa_attention_desc *d, injection *inj)
{
    const int varlen = d->cu_seqlens_q != NULL;
    const char *tn;
    fa_tensor *t;
    switch (kind) {
    case 0:
        d->size = chance(r, 50) ? sizeof(*d) - 8 : rnd(r, 2) ? sizeof(*d) + 8 : 0;
        return SET(FA_ERR_INVALID_ARGUMENT, "desc->size");
    case 1:
        d->batch = -(int32_t)rnd(r, 4);
        return SET(FA_ERR_INVALID_SHAPE, "batch");
    case 2:
        d->seqlen_q = varlen ? -1 - (int32_t)rnd(r, 5) : -(int32_t)rnd(r, 5);
        return SET(FA_ERR_INVALID_SHAPE, "seqlen_q");
    case 3:
        d->seqlen_k = varlen ? -1 - (int32_t)rnd(r, 5) : -(int32_t)rnd(r, 5);
        return SET(FA_ERR_INVALID_SHAPE, "seqlen_k");
    case 4:
        if (chance(r, 50)) {
            d->num_heads_q = -(int32_t)rnd(r, 3);
            return SET(FA_ERR_INVALID_SHAPE, "num_heads_q");
        }
        d->num_heads_kv = -(int32_t)rnd(r, 3);
        return SET(FA_ERR_INVALID_SHAPE, "num_heads_kv");
    case 5: {
        static const int32_t bad[] = { 0, -1, -64, 257, 258, 512, INT32_MAX };
        d->head_dim = bad[rnd(r, sizeof(bad) / sizeof(bad[0]))];
        return SET(FA_ERR_INVALID_SHAPE, "head_dim");
    }
    case 6:
        if (d->num_heads_kv >= 2)
            d->num_heads_q += 1;
        else
            d->num_heads_kv = d->num_heads_q + 1;
        return SET(FA_ERR_INVALID_SHAPE, "must be a multiple of num_heads_kv");
    case 7:
        d->num_heads_q = (FA_MAX_HEADS / d->num_heads_kv + 1) * d->num_heads_kv;
        return SET(FA_ERR_INVALID_SHAPE, "num_heads_q");
    case 8:
        t = pick_tensor(r, d, &tn);
        t->data = NULL;
        return SET(FA_ERR_NULL_POINTER, "%s.data", tn);
    case 9:
        t = pick_tensor(r, d, &tn);
        t->dtype = chance(r, 50) ? (fa_dtype)-1 : (fa_dtype)(3 + rnd(r, 100));
        return SET(FA_ERR_INVALID_DTYPE, "%s.dtype", tn);
    case 10:
        t = pick_tensor(r, d, &tn);
        if (t == &d->o) /* a 16-bit dtype other than q's */
            t->dtype = d->q.dtype == FA_DTYPE_F16 ? FA_DTYPE_BF16 : FA_DTYPE_F16;
        else if (t == &d->q)
            return 0;
        else
            t->dtype = (fa_dtype)((d->q.dtype + 1 + rnd(r, 2)) % 3);
        return SET(FA_ERR_INVALID_DTYPE, "%s.dtype", tn);
    case 11: { /* a stride that is not positive */
        t = pick_tensor(r, d, &tn);
        int axis = (int)rnd(r, 3);
        if (axis == 2 && extent_of(d, t, 2) < 2) /* a single batch's stride is not looked at */
            return 0;
        *stride_of(t, axis) = -(int64_t)rnd(r, 100);
        return SET(FA_ERR_INVALID_STRIDE, "%s.%s", tn, stride_names[axis]);
    }
    case 12: { /* a stride whose span overflows */
        t = pick_tensor(r, d, &tn);
        int axis = (int)rnd(r, 3);
        if (extent_of(d, t, axis) < 2)
            return 0;
        *stride_of(t, axis) = INT64_MAX / 2 + 1 + (int64_t)rnd(r, 1000);
        return SET(FA_ERR_SIZE_OVERFLOW, "%s spans", tn);
    }
    case 13: /* o's heads over each other */
        if (d->num_heads_q < 2 || d->head_dim < 2 || d->seqlen_q < 1)
            return 0;
        d->o.stride_head = 1 + (int64_t)rnd(r, (uint64_t)d->head_dim - 1);
        return SET(FA_ERR_INVALID_STRIDE, "o.stride_head");
    case 14: { /* o over an input */
        t = pick_tensor(r, d, &tn);
        if (t == &d->o || d->seqlen_q < 1 || extent_of(d, t, 1) < 1)
            return 0;
        /* on an element of t, aligned down for o's own (by less than it: still over t) */
        const int64_t el = (int64_t)rnd(r, (uint64_t)d->head_dim);
        uintptr_t at = (uintptr_t)t->data + (uintptr_t)(esize(t->dtype) * el);
        d->o.data = (void *)(at - at % (uintptr_t)esize(d->o.dtype));
        return SET(FA_ERR_INVALID_STRIDE, "o.data overlaps");
    }
    case 15: /* lse over o or an input */
        t = pick_tensor(r, d, &tn);
        if (d->seqlen_q < 1 || extent_of(d, t, 1) < 1)
            return 0;
        d->lse = (float *)((uintptr_t)t->data - (uintptr_t)t->data % 4);
        return SET(FA_ERR_INVALID_STRIDE, "lse overlaps");
    case 16: {
        static const float bad[] = { NAN, INFINITY, -INFINITY, 2e37f, -3e38f };
        d->scale = bad[rnd(r, 5)];
        return SET(FA_ERR_INVALID_VALUE, "scale");
    }
    case 17:
        d->causal = chance(r, 50) ? -1 : 2 + (int32_t)rnd(r, 10);
        return SET(FA_ERR_INVALID_VALUE, "causal");
    case 18:
        if (chance(r, 50)) {
            d->window_left = -2 - (int32_t)rnd(r, 100);
            return SET(FA_ERR_INVALID_VALUE, "window_left");
        }
        d->window_right = -2 - (int32_t)rnd(r, 100);
        return SET(FA_ERR_INVALID_VALUE, "window_right");
    case 19: {
        static const float bad[] = { -0.5f, NAN, INFINITY, 2e37f };
        d->softcap = bad[rnd(r, 4)];
        return SET(FA_ERR_INVALID_VALUE, "softcap");
    }
    case 20: {
        static const float bad[] = { 1.0f, 1.5f, -0.1f, NAN, INFINITY };
        d->dropout_p = bad[rnd(r, 5)];
        return SET(FA_ERR_INVALID_VALUE, "dropout_p");
    }
    case 21:
        d->algorithm = chance(r, 50) ? (fa_algorithm)-1 : (fa_algorithm)(2 + rnd(r, 10));
        return SET(FA_ERR_INVALID_VALUE, "algorithm");
    case 22: /* one of the two offset arrays */
        if (!varlen) {
            memset(inj->cu, 0, sizeof(inj->cu));
            d->cu_seqlens_q = inj->cu;
            return SET(FA_ERR_NULL_POINTER, "cu_seqlens_k is NULL");
        }
        if (d->seqlen_q < 1 || d->seqlen_k < 1) /* empty tensors are for varlen calls only */
            return 0;
        d->cu_seqlens_q = NULL;
        return SET(FA_ERR_NULL_POINTER, "cu_seqlens_q is NULL");
    case 23: { /* offsets that do not start at 0, decrease, or pass the tensor's rows */
        if (!varlen)
            return 0;
        const int on_k = chance(r, 50);
        const int32_t *cu = on_k ? d->cu_seqlens_k : d->cu_seqlens_q;
        const char *name = on_k ? "cu_seqlens_k" : "cu_seqlens_q";
        memcpy(inj->cu, cu, sizeof(int32_t) * (size_t)(d->batch + 1));
        *(on_k ? &d->cu_seqlens_k : &d->cu_seqlens_q) = inj->cu;
        int how = (int)rnd(r, 3);
        if (how == 0) {
            inj->cu[0] = 1 + (int32_t)rnd(r, 3);
            return SET(FA_ERR_INVALID_SHAPE, "%s[0]", name);
        }
        if (how == 1) {
            int32_t b = (int32_t)rnd(r, (uint64_t)d->batch);
            inj->cu[b + 1] = inj->cu[b] - 1 - (int32_t)rnd(r, 3);
            return SET(FA_ERR_INVALID_SHAPE, "%s[%d]", name, (int)b + 1);
        }
        int32_t *total = on_k ? &d->seqlen_k : &d->seqlen_q;
        if (cu[d->batch] < 1)
            return 0;
        *total = cu[d->batch] - 1 - (int32_t)rnd(r, (uint64_t)cu[d->batch]);
        return SET(FA_ERR_INVALID_SHAPE, "exceeds %s", on_k ? "seqlen_k" : "seqlen_q");
    }
    case 24: { /* explicit lse strides, one not positive */
        if (!d->lse)
            return 0;
        const int64_t s1 = d->seqlen_q ? d->seqlen_q : 1;
        d->lse_stride_seq = 1;
        d->lse_stride_head = s1;
        d->lse_stride_batch = (int64_t)d->num_heads_q * s1;
        int axis = (int)rnd(r, 3);
        if (axis == 2 && (varlen || d->batch < 2))
            return 0;
        *lse_stride_of(d, axis) = -(int64_t)rnd(r, 5);
        return SET(FA_ERR_INVALID_STRIDE, "%s", lse_stride_names[axis]);
    }
    case 25: /* lse rows over each other, or past 2^63 bytes */
        if (!d->lse || d->num_heads_q < 2 || d->seqlen_q < 2)
            return 0;
        d->lse_stride_seq = 1;
        d->lse_stride_batch = (int64_t)d->num_heads_q * d->seqlen_q;
        if (chance(r, 50)) {
            d->lse_stride_head = 1 + (int64_t)rnd(r, (uint64_t)d->seqlen_q - 1);
            return SET(FA_ERR_INVALID_STRIDE, "makes lse elements overlap");
        }
        d->lse_stride_head = INT64_MAX / 4 + 1;
        return SET(FA_ERR_SIZE_OVERFLOW, "lse spans");
    case 26: /* o running past the end of the address space */
        if (d->seqlen_q < 1)
            return 0;
        d->o.data = (void *)(UINTPTR_MAX - (uintptr_t)(esize(d->o.dtype) - 1)); /* its last element */
        return SET(FA_ERR_SIZE_OVERFLOW, "o.data runs past the end");
    case 27: /* a pointer off its elements' alignment */
        t = pick_tensor(r, d, &tn);
        if (esize(t->dtype) < 2)
            return 0;
        t->data = (char *)t->data + 1 + rnd(r, (uint64_t)esize(t->dtype) - 1);
        return SET(FA_ERR_INVALID_ARGUMENT, "%s.data", tn);
    }
    return 0;
}

enum { INJECTION_KINDS = 28 };

/* ---- checks ---- */

static int bytes_are(const void *p, int64_t n, uint8_t v)
{
    for (int64_t i = 0; i < n; i++)
        if (((const uint8_t *)p)[i] != v)
            return 0;
    return 1;
}

/* Download n bytes of backend memory and compare them with want (NULL: all `fill`). */
static int backend_bytes_equal(fa_context_t ctx, const void *dev, const void *want, uint8_t fill,
                               int64_t n, uint8_t *scratch)
{
    if (!dev || n == 0)
        return 1;
    if (fa_memory_download(ctx, scratch, dev, (size_t)n) != FA_OK)
        return 0;
    return want ? memcmp(scratch, want, (size_t)n) == 0 : bytes_are(scratch, n, fill);
}

/* After a valid run: o's and lse's bytes outside what the call writes still hold the poison;
 * the inputs are as uploaded. NULL when so, else what is wrong. */
static const char *check_untouched(fa_context_t ctx, const fuzz_case *fc, const fa_case_staged *st,
                                   uint8_t *scratch)
{
    const fa_case_inputs *in = &fc->in;
    const int64_t oe = esize(in->d.o.dtype);
    for (int64_t i = 0; i < fc->o_elems; i++)
        if (!fc->o_written[i] && !bytes_are((const char *)in->o + i * oe, oe, 0xff))
            return "o written outside the rows the call computes";
    for (int64_t i = 0; i < fc->lse_elems; i++)
        if (!fc->lse_written[i] && !isnan(in->lse[i]))
            return "lse written outside the rows the call computes";
    if (!backend_bytes_equal(ctx, st->q, in->q, 0, in->q_bytes, scratch) ||
        !backend_bytes_equal(ctx, st->kv, in->kv, 0, in->kv_bytes, scratch))
        return "an input was written";
    return NULL;
}

/* One invalid field on the staged call: an error of the expected status naming the field,
 * the same from fa_forward_plan, and no byte of any buffer changed. 0 when so. */
static int check_invalid(fa_context_t ctx, fa_rng *r, const fuzz_case *fc, const fa_case_staged *st,
                         uint8_t *scratch, uint8_t *poison)
{
    const fa_case_inputs *in = &fc->in;
    fa_attention_desc bad = st->d;
    bad.algorithm = chance(r, 50) ? FA_ALGORITHM_STANDARD : FA_ALGORITHM_FLASH;
    static injection inj;
    memset(&inj, 0, sizeof(inj));
    for (int k = (int)rnd(r, INJECTION_KINDS);; k = (k + 1) % INJECTION_KINDS) {
        fa_attention_desc d = bad;
        if (inject(r, k, &d, &inj)) {
            bad = d;
            break;
        }
    }
    if ((in->o_bytes && fa_memory_upload(ctx, st->o, poison, (size_t)in->o_bytes) != FA_OK) ||
        (st->lse && in->lse_bytes &&
         fa_memory_upload(ctx, st->lse, poison, (size_t)in->lse_bytes) != FA_OK)) {
        print_error("  staging the poison: %s\n", fa_context_last_error(ctx));
        return -1;
    }
    fa_status s = fa_forward(ctx, &bad);
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", fa_context_last_error(ctx));
    fa_status planned = fa_forward_plan(ctx, &bad, NULL);
    const char *wrong = NULL;
    if (s == FA_OK)
        wrong = "accepted";
    else if (s != inj.want || !strstr(msg, inj.field))
        wrong = "refused with the wrong status or a message not naming the field";
    else if (planned != s)
        wrong = "fa_forward_plan disagrees";
    else if (!backend_bytes_equal(ctx, st->o, NULL, 0x5a, in->o_bytes, scratch) ||
             !backend_bytes_equal(ctx, st->lse, NULL, 0x5a, st->lse ? in->lse_bytes : 0, scratch))
        wrong = "an output was written";
    else if (!backend_bytes_equal(ctx, st->q, in->q, 0, in->q_bytes, scratch) ||
             !backend_bytes_equal(ctx, st->kv, in->kv, 0, in->kv_bytes, scratch))
        wrong = "an input was written";
    if (!wrong)
        return 0;
    print_error("  invalid field (want %s naming \"%s\"): %s; got %s \"%s\", plan %s\n",
                fa_status_string(inj.want), inj.field, wrong, fa_status_string(s), msg,
                fa_status_string(planned));
    print_error("  the invalid descriptor:\n");
    describe(in, st, &bad);
    return -1;
}

/* The flash run again on a context with another thread count: the same bits in o and lse
 * (fa_forward's promise), poison included. 0 when so. */
static int check_threads(fa_context_t other, const fuzz_case *fc, const fa_case_staged *st,
                         uint8_t *scratch)
{
    const fa_case_inputs *in = &fc->in;
    memset(scratch, 0xff, (size_t)in->o_bytes);
    if (fa_memory_upload(other, st->o, scratch, (size_t)in->o_bytes) != FA_OK)
        return -1;
    if (st->lse) {
        for (int64_t i = 0; i < fc->lse_elems; i++)
            ((float *)scratch)[i] = NAN;
        if (fa_memory_upload(other, st->lse, scratch, (size_t)in->lse_bytes) != FA_OK)
            return -1;
    }
    if (fa_forward(other, &st->d) != FA_OK) {
        print_error("  on %d threads: %s\n", THREADS_OTHER, fa_context_last_error(other));
        return -1;
    }
    return backend_bytes_equal(other, st->o, in->o, 0, in->o_bytes, scratch) &&
                   backend_bytes_equal(other, st->lse, in->lse, 0, st->lse ? in->lse_bytes : 0,
                                       scratch)
               ? 0
               : -1;
}

typedef struct tally {
    long cases, invalid, threads, failed;
} tally;

/* One case; a failure is counted in t and reported (the first few in full). other: a context
 * of the same backend with another thread count, or NULL. */
static void run_case(fa_context_t ctx, fa_context_t other, uint64_t seed, tally *t)
{
    fuzz_case fc;
    fa_case_staged st;
    memset(&st, 0, sizeof(st));
    uint8_t *scratch = NULL, *poison = NULL;
    char why[640] = "";
    const fa_backend backend = fa_context_backend(ctx);
    if (fuzz_case_make(seed, backend, &fc) != 0) {
        snprintf(why, sizeof(why), "out of memory building the case");
        goto report;
    }
    fa_case_inputs *in = &fc.in;
    int64_t most = in->q_bytes > in->kv_bytes ? in->q_bytes : in->kv_bytes;
    most = most > in->o_bytes ? most : in->o_bytes;
    most = most > in->lse_bytes ? most : in->lse_bytes;
    scratch = malloc((size_t)most + 1);
    poison = malloc((size_t)most + 1);
    if (!scratch || !poison) {
        snprintf(why, sizeof(why), "out of memory building the case");
        goto report;
    }
    memset(poison, 0x5a, (size_t)most + 1);
    if (fa_case_stage(ctx, in, &st, why, sizeof(why)) != 0)
        goto report;
    char label[64];
    snprintf(label, sizeof(label), "case %llu", (unsigned long long)seed);
    fa_case_result res;
    if (fa_case_run_staged(ctx, in, &st, label, &res) != 0 || !res.passed) {
        snprintf(why, sizeof(why), "%s", res.message);
        goto report;
    }
    const char *bad = check_untouched(ctx, &fc, &st, scratch);
    if (bad) {
        snprintf(why, sizeof(why), "%s", bad);
        goto report;
    }
    fa_rng r = { seed ^ 0x5bd1e995u }; /* the checks' own stream */
    if (other && chance(&r, 25)) {
        t->threads++;
        if (check_threads(other, &fc, &st, scratch) != 0) {
            snprintf(why, sizeof(why), "flash on %d threads gave other bits", THREADS_OTHER);
            goto report;
        }
    }
    if (chance(&r, 40)) {
        t->invalid++;
        if (check_invalid(ctx, &r, &fc, &st, scratch, poison) != 0) {
            snprintf(why, sizeof(why), "the invalid call above");
            goto report;
        }
    }
    goto done;
report:
    if (t->failed < SHOWN_FAILURES) {
        print_error(
            "case %llu FAILED: %s\n  replay: FLASHATTN_TEST_SEED=%llu FLASHATTN_FUZZ_ITERS=1\n",
            (unsigned long long)seed, why, (unsigned long long)seed);
        describe(&fc.in, NULL, &fc.in.d);
    }
    t->failed++;
done:
    fa_case_unstage(ctx, &st);
    fuzz_case_free(&fc);
    free(scratch);
    free(poison);
}

static void test_fuzz(void **state)
{
    (void)state;
    fa_context_t ctx, other = NULL;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    if (fa_context_create(&opts, &ctx) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    /* the CPU's thread count is the one that may change how work is split (host memory is
     * shared between contexts, as GLES buffers are not) */
    fa_context_options more = { sizeof(more), FA_BACKEND_CPU, THREADS_OTHER };
    if (opts.backend == FA_BACKEND_CPU && fa_context_create(&more, &other) != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    tally t = { 0, 0, 0, 0 };
    uint64_t seed = first_seed;
    for (long i = 0; i < iters; i++) {
        run_case(ctx, other, seed, &t);
        t.cases++;
        fa_rng next = { seed };
        seed = fa_rng_next(&next);
    }
    fa_context_destroy(ctx);
    fa_context_destroy(other);
    print_message("%ld cases, %ld with an invalid field, %ld rerun on %d threads, %ld failed "
                  "(seed %llu)\n",
                  t.cases, t.invalid, t.threads, THREADS_OTHER, t.failed,
                  (unsigned long long)first_seed);
    assert_int_equal(t.failed, 0);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED"), *n = getenv("FLASHATTN_FUZZ_ITERS");
    const char *q = getenv("FLASHATTN_TEST_QUICK");
    const long dflt = q && *q == '1' ? QUICK_ITERS : DEFAULT_ITERS;
    first_seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    iters = n && *n ? strtol(n, NULL, 10) : dflt;
    if (iters < 1)
        iters = dflt;
    fa_backend b = fa_test_backend();
    printf("fuzz_desc: backend=%s cases=%ld seed=%llu (replay: FLASHATTN_TEST_SEED=%llu)\n",
           fa_backend_name(b), iters, (unsigned long long)first_seed,
           (unsigned long long)first_seed);
    fa_context_t probe;
    fa_context_options opts = { sizeof(opts), b, 0 };
    if (fa_context_create(&opts, &probe) == FA_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped: %s\n", fa_last_create_error());
        return 77;
    }
    fa_context_destroy(probe);
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_fuzz) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
