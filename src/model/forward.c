/* SPDX-License-Identifier: MIT */
/*
 * The Llama forward pass (llama2.c's conventions), float32. Projections are
 * OpenBLAS sgemm over every token of a chunk (one token: our matvec or
 * sgemv); attention is one fa_forward per layer over the state's KV cache,
 * or, for a scheduler's step over many sequences, one fa_paged_forward per
 * layer over a paged cache (the call appends the step's keys and values and
 * applies RoPE itself).
 */
#include "fail.h"
#include "scheduler.h"

#include <cblas.h>
#include <omp.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fa_model_state {
    fa_context_t ctx;
    fa_model_state_options opts;
    fa_model_config cfg; /* the model it was made for */
    int32_t seq_len;     /* the cache's positions: options.context, or cfg.seq_len */
    int32_t dim, hidden, kv_dim, head_size;
    float eps;     /* RMSNorm epsilon */
    float *x;      /* [max_tokens, dim] residual stream */
    float *xb;     /* [max_tokens, dim] normed input of a sublayer */
    float *q;      /* [max_tokens, n_heads, head_size] queries, RoPE applied */
    float *att;    /* [max_tokens, n_heads, head_size] attention output */
    float *hb;     /* [max_tokens, hidden] gate, then silu(gate) * up */
    float *hb2;    /* [max_tokens, hidden] up */
    float *logits; /* [vocab] of the chunk's last token */
    float *kc;     /* [layers, seq_len, n_kv_heads, head_size] keys, RoPE applied */
    float *vc;     /* [layers, seq_len, n_kv_heads, head_size] values */
    float *rope;   /* [seq_len, head_size / 2, 2] cos, sin of pos * theta^(-2i/head_size) */
    float *kn, *vn; /* [max_tokens, kv_dim] a step's new keys and values (paged steps) */
    fa_paged_plan_t plan;       /* the paged calls' plan, for steps over plan_kv */
    const struct fa_model_kv *plan_kv;
    int32_t plan_pages;         /* the plan's table width (max_pages_per_seq) */
    fa_model_stats stats;
};

/* A paged KV cache of the model's layers (fa_model_forward_step). */
struct fa_model_kv {
    int32_t num_pages, page_size, n_layers, kv_dim, seq_len, half;
    int32_t positions;  /* RoPE rows (fa_model_rope_rows) */
    float *k, *v;       /* [layers, num_pages, page_size, n_kv_heads, head_size] */
    float *cos, *sin;   /* [positions, head_size / 2]: the paged call's RoPE tables */
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* rows x cols floats, 64-byte aligned; NULL on overflow or no memory. */
static float *alloc_floats(uint64_t rows, uint64_t cols, uint64_t *total)
{
    uint64_t n, bytes;
    if (__builtin_mul_overflow(rows, cols, &n) || __builtin_mul_overflow(n, 4, &bytes) ||
        bytes > SIZE_MAX - 64)
        return NULL;
    bytes = (bytes + 63) & ~(uint64_t)63;
    *total += bytes;
    return aligned_alloc(64, bytes ? (size_t)bytes : 64);
}

/* Whether s was made for a model of configuration c: every shape, the RoPE and the norm. */
static int made_for(const fa_model_state *s, const fa_model_config *c)
{
    const fa_model_config *a = &s->cfg;
    return a->dim == c->dim && a->hidden_dim == c->hidden_dim && a->n_layers == c->n_layers &&
           a->n_heads == c->n_heads && a->n_kv_heads == c->n_kv_heads && a->vocab_size == c->vocab_size &&
           a->seq_len == c->seq_len && a->rope_theta == c->rope_theta && a->norm_eps == c->norm_eps &&
           memcmp(&a->rope_scaling, &c->rope_scaling, sizeof(a->rope_scaling)) == 0;
}

int32_t fa_model_state_context(const fa_model_state *s)
{
    return s ? s->seq_len : 0;
}

void fa_model_state_free(fa_model_state *s)
{
    if (!s)
        return;
    fa_paged_plan_destroy(s->plan);
    float *bufs[] = { s->x, s->xb, s->q, s->att, s->hb, s->hb2, s->logits, s->kc, s->vc, s->rope, s->kn, s->vn };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    free(s);
}

fa_status fa_model_state_create(const fa_model *m, fa_context_t ctx,
                                const fa_model_state_options *opts, fa_model_state **out,
                                char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!m || !ctx)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", !m ? "model" : "ctx");
    if (fa_context_backend(ctx) != FA_BACKEND_CPU)
        return fa_model_fail(err, FA_ERR_UNSUPPORTED,
                    "the runner keeps its KV cache in host memory: ctx must be a cpu context, not %s",
                    fa_backend_name(fa_context_backend(ctx)));
    fa_model_state_options o = { 0, FA_ALGORITHM_FLASH, FA_MATVEC_AUTO, NULL, NULL, 0, 0 };
    if (opts)
        o = *opts;
    const fa_model_config *c = &m->config;
    if (o.context < 0 || o.context > c->seq_len)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "context (%d) must be in 0..seq_len (%d)", (int)o.context,
                             (int)c->seq_len);
    if (o.context && o.paged)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "context (%d) sizes the state's own cache, and a paged state has none", (int)o.context);
    const int32_t positions = o.context ? o.context : c->seq_len;
    if (o.max_tokens < 0 || o.max_tokens > positions)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "max_tokens (%d) must be in 0..%d (%s)", (int)o.max_tokens,
                             (int)positions, o.context ? "context" : "seq_len");
    if (o.max_tokens == 0)
        o.max_tokens = positions;
    /* the runner's threads are OpenMP's: OpenBLAS computes single-threaded inside them */
    openblas_set_num_threads(1);
    if (o.algorithm != FA_ALGORITHM_FLASH && o.algorithm != FA_ALGORITHM_STANDARD)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "algorithm (%d) is neither flash nor standard",
                    (int)o.algorithm);
    if (o.matvec != FA_MATVEC_AUTO && o.matvec != FA_MATVEC_OWN && o.matvec != FA_MATVEC_BLAS)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "matvec (%d) is not auto, own or blas", (int)o.matvec);
    fa_model_state *s = calloc(1, sizeof(*s));
    if (!s)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the state");
    s->ctx = ctx;
    s->opts = o;
    s->cfg = *c;
    s->seq_len = positions;
    s->dim = c->dim;
    s->hidden = c->hidden_dim;
    s->head_size = c->dim / c->n_heads;
    s->kv_dim = s->head_size * c->n_kv_heads;
    s->eps = c->norm_eps > 0.0f ? c->norm_eps : FA_MODEL_NORM_EPS;
    uint64_t T = (uint64_t)o.max_tokens, total = 0, kv_rows, kv_bytes = 0;
    s->x = alloc_floats(T, (uint64_t)c->dim, &total);
    s->xb = alloc_floats(T, (uint64_t)c->dim, &total);
    s->q = alloc_floats(T, (uint64_t)c->dim, &total);
    s->att = alloc_floats(T, (uint64_t)c->dim, &total);
    s->hb = alloc_floats(T, (uint64_t)c->hidden_dim, &total);
    s->hb2 = alloc_floats(T, (uint64_t)c->hidden_dim, &total);
    s->logits = alloc_floats(1, (uint64_t)c->vocab_size, &total);
    if (!o.paged) /* a paged state's rotations are the paged call's, from the kv's tables */
        s->rope = alloc_floats((uint64_t)s->seq_len, (uint64_t)s->head_size, &total);
    s->kn = alloc_floats(T, (uint64_t)s->kv_dim, &total);
    s->vn = alloc_floats(T, (uint64_t)s->kv_dim, &total);
    int ok = !__builtin_mul_overflow((uint64_t)c->n_layers, (uint64_t)s->seq_len, &kv_rows);
    if (ok && o.paged) { /* steps only: the pages are the cache */
        s->kc = s->vc = NULL;
    } else if (ok) {
        s->kc = alloc_floats(kv_rows, (uint64_t)s->kv_dim, &kv_bytes);
        s->vc = alloc_floats(kv_rows, (uint64_t)s->kv_dim, &kv_bytes);
    }
    if (!ok || !s->x || !s->xb || !s->q || !s->att || !s->hb || !s->hb2 || !s->logits ||
        !s->kn || !s->vn || (!o.paged && (!s->rope || !s->kc || !s->vc))) {
        int32_t kvd = s->kv_dim;
        fa_model_state_free(s);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY,
                    "out of memory for the state (KV cache of %d layers x %d positions x %d, "
                    "activations of %d tokens)%s",
                    (int)c->n_layers, (int)positions, (int)kvd, (int)o.max_tokens,
                    o.context ? "" : ": the cache covers the model's whole context (seq_len, "
                                     "max_position_embeddings), which options.context may lower");
    }
    s->stats.kv_cache_bytes = kv_bytes;
    s->stats.state_bytes = total + kv_bytes;
    int32_t half = s->head_size / 2;
    for (int32_t p = 0; s->rope && p < s->seq_len; p++)
        for (int32_t i = 0; i < half; i++) {
            const float a = fa_model_rope_angle(c, p, i);
            s->rope[((size_t)p * half + i) * 2] = cosf(a);
            s->rope[((size_t)p * half + i) * 2 + 1] = sinf(a);
        }
    *out = s;
    return FA_OK;
}

float fa_model_rope_angle(const fa_model_config *c, int32_t pos, int32_t i)
{
    /* float arithmetic as llama2.c's run.c computes the angles (HF's inv_freq is the same
     * float32 formula), so the rotations agree */
    const float theta = c->rope_theta > 0.0f ? c->rope_theta : FA_MODEL_ROPE_THETA;
    const int32_t hs = c->dim / c->n_heads;
    float f = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
    const fa_rope_scaling *rs = &c->rope_scaling;
    if (rs->type == FA_ROPE_SCALING_LINEAR) {
        f /= rs->factor;
    } else if (rs->type == FA_ROPE_SCALING_LLAMA3) {
        /* HF's _compute_llama3_parameters: wavelengths above original / low_freq_factor are
         * divided by factor, those below original / high_freq_factor kept, and between the two
         * the frequency blends linearly in original / wavelength */
        const float old = (float)rs->original_max_pos, wavelen = (float)6.283185307179586 / f; /* 2 pi */
        if (wavelen > old / rs->low_freq_factor) {
            f /= rs->factor;
        } else if (!(wavelen < old / rs->high_freq_factor)) {
            const float smooth = (old / wavelen - rs->low_freq_factor) / (rs->high_freq_factor - rs->low_freq_factor);
            f = (1.0f - smooth) * f / rs->factor + smooth * f;
        }
    }
    return (float)pos * f;
}

fa_model_stats fa_model_state_stats(const fa_model_state *s)
{
    fa_model_stats z = { 0 };
    return s ? s->stats : z;
}

void fa_model_state_reset_stats(fa_model_state *s)
{
    if (!s)
        return;
    s->stats.forward_s = s->stats.attention_s = 0.0;
    s->stats.attention_workspace = 0;
}

/* r . x, vectorised per ISA (on x86 the clone is picked once, at load time; AArch64's
 * baseline has NEON) */
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#endif
static float dot(const float *r, const float *x, int n)
{
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int j = 0; j < n; j++)
        acc += r[j] * x[j];
    return acc;
}

/* Whether T rows of n elements are worth OpenMP threads. Below that the loops run without a
 * parallel region at all: entering even a one-thread region costs libgomp a futex call, and
 * a small model's decode step runs dozens of such loops. */
static int threaded(long T, long n) { return T * n >= (1l << 15); }

/* y[i] (+)= w[i, :] . x for one row */
static void matvec_row(float *y, const float *x, const float *w, int i, int in, int accumulate)
{
    float acc = dot(w + (size_t)i * (size_t)in, x, in);
    y[i] = accumulate ? y[i] + acc : acc;
}

/* y[i] (+)= w[i, :] . x for one token, rows split over threads when there is enough work */
static void matvec_own(float *y, const float *x, const float *w, int out, int in, int accumulate)
{
    if (!threaded(2l * out, in)) {
        for (int i = 0; i < out; i++)
            matvec_row(y, x, w, i, in, accumulate);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < out; i++)
        matvec_row(y, x, w, i, in, accumulate);
}

/* y[T, out] (row pitch ldy) (+)= x[T, in] w[out, in]^T with the output columns split over
 * our OpenMP threads, each running a single-threaded sgemm (fa_model_state_create sets
 * OpenBLAS to one thread): one thread pool in the process.
 * (OpenBLAS's own pthreads beside libgomp's spin against each other on few cores: a 64-token
 * prefill of a small model took 32 ms instead of 2.3.) */
static void gemm_split(float *y, int ldy, const float *x, const float *w, int T, int out, int in,
                       int accumulate)
{
    const int chunks = (long)T * out * in >= (1l << 20) ? omp_get_max_threads() : 1;
    if (chunks == 1) { /* no parallel region for a single piece (see threaded()) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, in, 1.0f, x, in, w, in,
                    accumulate ? 1.0f : 0.0f, y, ldy);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < chunks; c++) {
        const int o0 = (int)((long)out * c / chunks / 16 * 16);
        const int o1 = c + 1 == chunks ? out : (int)((long)out * (c + 1) / chunks / 16 * 16);
        if (o1 > o0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, o1 - o0, in, 1.0f, x, in,
                        w + (size_t)o0 * (size_t)in, in, accumulate ? 1.0f : 0.0f, y + o0, ldy);
    }
}

/* y[T, out] (row pitch ldy) (+)= x[T, in] w[out, in]^T */
static void project(const fa_model_state *s, float *y, int ldy, const float *x, const float *w,
                    int T, int out, int in, int accumulate)
{
    int own = s->opts.matvec == FA_MATVEC_OWN ||
              (s->opts.matvec == FA_MATVEC_AUTO && (long)out * in >= (1l << 16));
    if (T == 1 && own)
        matvec_own(y, x, w, out, in, accumulate);
    else if (T == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1,
                    accumulate ? 1.0f : 0.0f, y, 1);
    else
        gemm_split(y, ldy, x, w, T, out, in, accumulate);
}

/* o = x * g / sqrt(mean(x^2) + eps) for one row of n */
static void rmsnorm_row(float *o, const float *x, const float *g, int n, float eps)
{
    float ss = 0.0f;
    for (int j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss = 1.0f / sqrtf(ss / (float)n + eps);
    for (int j = 0; j < n; j++)
        o[j] = g[j] * (ss * x[j]);
}

/* o[T, n] = x * g / sqrt(mean(x^2) + eps), row by row */
static void rmsnorm(const fa_model_state *s, float *o, const float *x, const float *g, int T, int n)
{
    if (!threaded(T, n)) {
        for (int t = 0; t < T; t++)
            rmsnorm_row(o + (size_t)t * n, x + (size_t)t * n, g, n, s->eps);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        rmsnorm_row(o + (size_t)t * n, x + (size_t)t * n, g, n, s->eps);
}

/* Rotate adjacent pairs of each head of row r (width n) by the angles cs of its position. */
static void rope_row(const fa_model_state *s, float *r, const float *cs, int n)
{
    for (int j = 0; j < n; j += 2) {
        int i = (j % s->head_size) / 2;
        float c = cs[2 * i], sn = cs[2 * i + 1], a = r[j], b = r[j + 1];
        r[j] = a * c - b * sn;
        r[j + 1] = a * sn + b * c;
    }
}

/* Rotate adjacent pairs of each head of T rows (row pitch ld, width n) at positions pos.. */
static void rope(const fa_model_state *s, float *v, int64_t ld, int T, int n, int pos)
{
    const size_t step = (size_t)(s->head_size / 2) * 2;
    if (!threaded(T, n)) {
        for (int t = 0; t < T; t++)
            rope_row(s, v + (size_t)t * (size_t)ld, s->rope + (size_t)(pos + t) * step, n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        rope_row(s, v + (size_t)t * (size_t)ld, s->rope + (size_t)(pos + t) * step, n);
}

/* hb = silu(hb) * hb2 over n elements */
static void swiglu(float *hb, const float *hb2, size_t n)
{
    if (!threaded(1, (long)n)) {
        for (size_t i = 0; i < n; i++)
            hb[i] = hb[i] / (1.0f + expf(-hb[i])) * hb2[i];
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        hb[i] = hb[i] / (1.0f + expf(-hb[i])) * hb2[i];
}

static fa_status attention(const fa_model *m, fa_model_state *s, int l, int T, int pos, char *err)
{
    const fa_model_config *c = &m->config;
    size_t layer = (size_t)l * (size_t)s->seq_len * (size_t)s->kv_dim;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = T;
    d.seqlen_k = pos + T; /* bottom-right causal: query t sees keys 0 .. pos + t */
    d.num_heads_q = c->n_heads;
    d.num_heads_kv = c->n_kv_heads;
    d.head_dim = s->head_size;
    d.causal = 1;
    d.algorithm = s->opts.algorithm;
    d.q = fa_tensor_contiguous(s->q, FA_DTYPE_F32, FA_LAYOUT_BSHD, T, c->n_heads, s->head_size);
    d.o = fa_tensor_contiguous(s->att, FA_DTYPE_F32, FA_LAYOUT_BSHD, T, c->n_heads, s->head_size);
    d.k = fa_tensor_contiguous(s->kc + layer, FA_DTYPE_F32, FA_LAYOUT_BSHD, s->seq_len,
                               c->n_kv_heads, s->head_size);
    d.v = fa_tensor_contiguous(s->vc + layer, FA_DTYPE_F32, FA_LAYOUT_BSHD, s->seq_len,
                               c->n_kv_heads, s->head_size);
    double t0 = now();
    fa_status st = fa_forward(s->ctx, &d);
    s->stats.attention_s += now() - t0;
    if (st != FA_OK)
        return fa_model_fail(err, st, "layer %d attention: %s", l, fa_context_last_error(s->ctx));
    fa_run_info ri = { .size = sizeof(ri) };
    if (fa_context_last_run(s->ctx, &ri) == FA_OK && ri.workspace_bytes > s->stats.attention_workspace)
        s->stats.attention_workspace = ri.workspace_bytes;
    return FA_OK;
}

/* Layer l of a step: the paged call appends the rows' keys and values (rotated) at their
 * sequences' cached lengths and attends, q rotated by the same call. */
static fa_status attention_paged(const fa_model *m, fa_model_state *s, const fa_model_kv *kv,
                                 const fa_step *st, int l, char *err)
{
    const fa_model_config *c = &m->config;
    const size_t layer = (size_t)l * (size_t)kv->num_pages * (size_t)kv->page_size * (size_t)kv->kv_dim;
    fa_paged_desc d;
    fa_paged_desc_init(&d);
    d.batch = st->batch;
    d.total_q = st->total_q;
    d.max_seqlen_q = st->max_seqlen_q;
    d.max_seqlen_k = st->max_seqlen_k;
    d.num_heads_q = c->n_heads;
    d.head_dim = s->head_size;
    d.q = fa_tensor_contiguous(s->q, FA_DTYPE_F32, FA_LAYOUT_BSHD, st->total_q, c->n_heads, s->head_size);
    d.o = fa_tensor_contiguous(s->att, FA_DTYPE_F32, FA_LAYOUT_BSHD, st->total_q, c->n_heads, s->head_size);
    d.cu_seqlens_q = st->cu_seqlens_q;
    d.cache = fa_kv_cache_contiguous(kv->k + layer, kv->v + layer, FA_DTYPE_F32, FA_LAYOUT_BSHD, kv->num_pages,
                                     kv->page_size, c->n_kv_heads, s->head_size);
    d.block_table = st->block_table;
    d.max_pages_per_seq = st->max_pages_per_seq;
    d.cache_seqlens = st->cache_seqlens;
    d.k_new = fa_tensor_contiguous(s->kn, FA_DTYPE_F32, FA_LAYOUT_BSHD, st->total_q, c->n_kv_heads, s->head_size);
    d.v_new = fa_tensor_contiguous(s->vn, FA_DTYPE_F32, FA_LAYOUT_BSHD, st->total_q, c->n_kv_heads, s->head_size);
    d.rope = FA_ROPE_INTERLEAVED; /* llama2.c's adjacent pairs, at the step's positions */
    d.positions = st->positions;
    d.rope_max_pos = kv->positions;
    d.rope_cos = kv->cos;
    d.rope_sin = kv->sin;
    d.causal = 1;
    double t0 = now();
    /* one plan for every step over kv: bounds of max_tokens rows and the widest table so far
     * (planned again for a wider one: a plan at the model's whole context would size its
     * splits for seq_len keys) */
    if (s->plan_kv != kv || st->max_pages_per_seq > s->plan_pages) {
        fa_paged_plan_destroy(s->plan);
        s->plan = NULL, s->plan_kv = NULL;
        fa_paged_desc b = d;
        b.batch = b.total_q = b.max_seqlen_q = s->opts.max_tokens;
        const int64_t room = (int64_t)st->max_pages_per_seq * kv->page_size;
        b.max_seqlen_k = room < kv->seq_len ? (int32_t)room : kv->seq_len;
        fa_status pc = fa_paged_plan_create(s->ctx, &b, &s->plan);
        if (pc != FA_OK)
            return fa_model_fail(err, pc, "planning the paged attention: %s", fa_context_last_error(s->ctx));
        s->plan_kv = kv;
        s->plan_pages = st->max_pages_per_seq;
    }
    fa_status rc = fa_paged_run(s->plan, &d);
    s->stats.attention_s += now() - t0;
    if (rc != FA_OK)
        return fa_model_fail(err, rc, "layer %d paged attention: %s", l, fa_context_last_error(s->ctx));
    return FA_OK;
}

/* The layers over T rows of s->x: the dense cache at positions pos.. (kv NULL), or a step
 * of a paged cache. */
static fa_status layers(const fa_model *m, fa_model_state *s, int T, int pos, const fa_model_kv *kv,
                        const fa_step *step, char *err)
{
    const fa_model_config *c = &m->config;
    const fa_model_weights *w = &m->w;
    int dim = c->dim, hid = c->hidden_dim, kvd = s->kv_dim;
    for (int l = 0; l < c->n_layers; l++) {
        size_t dd = (size_t)dim * dim, kd = (size_t)kvd * dim, hd = (size_t)hid * dim;
        /* K and V go straight into the cache rows of these positions (paged: into the rows the
         * call appends); RoPE is applied to them before attention, so the cache only ever
         * holds rotated keys */
        float *kc = kv ? s->kn : s->kc + ((size_t)l * s->seq_len + (size_t)pos) * kvd;
        float *vc = kv ? s->vn : s->vc + ((size_t)l * s->seq_len + (size_t)pos) * kvd;
        rmsnorm(s, s->xb, s->x, w->rms_att + (size_t)l * dim, T, dim);
        project(s, s->q, dim, s->xb, w->wq + l * dd, T, dim, dim, 0);
        project(s, kc, kvd, s->xb, w->wk + l * kd, T, kvd, dim, 0);
        project(s, vc, kvd, s->xb, w->wv + l * kd, T, kvd, dim, 0);
        if (!kv) {
            rope(s, s->q, dim, T, dim, pos);
            rope(s, kc, kvd, T, kvd, pos);
        }
        fa_status st = kv ? attention_paged(m, s, kv, step, l, err) : attention(m, s, l, T, pos, err);
        if (st != FA_OK)
            return st;
        /* the residual add is the GEMM's beta = 1 */
        project(s, s->x, dim, s->att, w->wo + l * dd, T, dim, dim, 1);
        rmsnorm(s, s->xb, s->x, w->rms_ffn + (size_t)l * dim, T, dim);
        project(s, s->hb, hid, s->xb, w->w1 + l * hd, T, hid, dim, 0);
        project(s, s->hb2, hid, s->xb, w->w3 + l * hd, T, hid, dim, 0);
        swiglu(s->hb, s->hb2, (size_t)T * hid);
        project(s, s->x, dim, s->hb, w->w2 + l * hd, T, dim, hid, 1);
        if (s->opts.progress)
            s->opts.progress(s->opts.progress_user, l + 1, c->n_layers);
    }
    return FA_OK;
}

static fa_status forward_chunk(const fa_model *m, fa_model_state *s, const int32_t *tokens, int T,
                               int pos, char *err)
{
    const fa_model_config *c = &m->config;
    const fa_model_weights *w = &m->w;
    int dim = c->dim;
    for (int t = 0; t < T; t++)
        memcpy(s->x + (size_t)t * dim, w->token_embedding + (size_t)tokens[t] * dim,
               sizeof(float) * (size_t)dim);
    fa_status st = layers(m, s, T, pos, NULL, NULL, err);
    if (st != FA_OK)
        return st;
    /* logits of the last token only: nothing reads the others */
    rmsnorm(s, s->xb, s->x + (size_t)(T - 1) * dim, w->rms_final, 1, dim);
    project(s, s->logits, c->vocab_size, s->xb, w->classifier, 1, c->vocab_size, dim, 0);
    return FA_OK;
}

fa_status fa_model_forward(const fa_model *m, fa_model_state *s, const int32_t *tokens, int32_t n,
                           int32_t pos, float **logits, char *err)
{
    if (!m || !s || !tokens)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", !m ? "model" : !s ? "state" : "tokens");
    const fa_model_config *c = &m->config;
    if (!made_for(s, c))
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "state was made for another model");
    if (!s->kc)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                             "state was made for paged steps (options.paged): it has no cache of its own");
    if (n < 1 || pos < 0 || pos > s->seq_len - n)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                    "positions pos (%d) .. pos + n (%d) must lie in 0..%d, the state's context (%s)", (int)pos,
                    (int)n, (int)s->seq_len, s->seq_len < c->seq_len ? "options.context" : "seq_len");
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "tokens[%d] (%d) is outside 0..vocab_size-1 (%d)",
                        (int)i, (int)tokens[i], (int)c->vocab_size - 1);
    double t0 = now();
    for (int32_t done = 0; done < n;) {
        int32_t T = n - done < s->opts.max_tokens ? n - done : s->opts.max_tokens;
        fa_status st = forward_chunk(m, s, tokens + done, T, pos + done, err);
        if (st != FA_OK)
            return st;
        done += T;
    }
    s->stats.forward_s += now() - t0;
    if (logits)
        *logits = s->logits;
    return FA_OK;
}

void fa_model_kv_free(fa_model_kv *kv)
{
    if (!kv)
        return;
    free(kv->k), free(kv->v), free(kv->cos), free(kv->sin);
    free(kv);
}

fa_status fa_model_kv_create(const fa_model *m, int32_t num_pages, int32_t page_size, fa_model_kv **out,
                             char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!m)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "model is NULL");
    if (num_pages < 1 || page_size < 1)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "%s (%d) must be at least 1",
                             num_pages < 1 ? "num_pages" : "page_size", (int)(num_pages < 1 ? num_pages : page_size));
    const fa_model_config *c = &m->config;
    fa_model_kv *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the paged cache");
    const int32_t hs = c->dim / c->n_heads;
    *kv = (fa_model_kv){ num_pages, page_size, c->n_layers, hs * c->n_kv_heads, c->seq_len, hs / 2,
                         fa_model_rope_rows(c, num_pages, page_size), NULL, NULL, NULL, NULL };
    uint64_t rows, total = 0;
    int ok = !__builtin_mul_overflow((uint64_t)c->n_layers * (uint64_t)num_pages, (uint64_t)page_size, &rows);
    if (ok) {
        kv->k = alloc_floats(rows, (uint64_t)kv->kv_dim, &total);
        kv->v = alloc_floats(rows, (uint64_t)kv->kv_dim, &total);
    }
    kv->cos = alloc_floats((uint64_t)kv->positions, (uint64_t)kv->half, &total);
    kv->sin = alloc_floats((uint64_t)kv->positions, (uint64_t)kv->half, &total);
    if (!ok || !kv->k || !kv->v || !kv->cos || !kv->sin) {
        fa_model_kv_free(kv);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY,
                             "out of memory for a paged cache of %d layers x %d pages x %d tokens x %d", (int)c->n_layers,
                             (int)num_pages, (int)page_size, (int)(hs * c->n_kv_heads));
    }
    for (int32_t p = 0; p < kv->positions; p++)
        for (int32_t i = 0; i < kv->half; i++) {
            const float a = fa_model_rope_angle(c, p, i);
            kv->cos[(size_t)p * kv->half + i] = cosf(a);
            kv->sin[(size_t)p * kv->half + i] = sinf(a);
        }
    *out = kv;
    return FA_OK;
}

fa_status fa_model_forward_step(const fa_model *m, fa_model_state *s, fa_model_kv *kv, const fa_step *st,
                                float *logits, char *err)
{
    if (!m || !s || !kv || !st || !logits)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL",
                             !m ? "model" : !s ? "state" : !kv ? "kv" : !st ? "step" : "logits");
    const fa_model_config *c = &m->config;
    if (!made_for(s, c) || kv->n_layers != c->n_layers || kv->kv_dim != s->kv_dim || kv->seq_len != c->seq_len)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "state or kv was made for another model");
    if (st->batch < 1)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "step.batch (%d) must be at least 1", (int)st->batch);
    if (st->total_q < 1 || st->total_q > s->opts.max_tokens)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "step.total_q (%d) must be in 1..max_tokens (%d)",
                             (int)st->total_q, (int)s->opts.max_tokens);
    if (st->page_size != kv->page_size)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                             "step.page_size (%d) differs from the kv cache's (%d): make the scheduler with the "
                             "cache's pages",
                             (int)st->page_size, (int)kv->page_size);
    fa_status ck = fa_step_check_arrays(st, c->vocab_size, err);
    if (ck != FA_OK)
        return ck;
    /* a table row wider than the model's context claims memory no step can use (and the paged
     * call would read rows that far apart) */
    const int64_t pages_cap = ((int64_t)c->seq_len + kv->page_size - 1) / kv->page_size;
    if (st->max_pages_per_seq < 1 || st->max_pages_per_seq > pages_cap)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "step.max_pages_per_seq (%d) must be in 1..%lld",
                             (int)st->max_pages_per_seq, (long long)pages_cap);
    /* the paged call checks the tables against the cache; the logits read each sampled
     * sequence's last row, so it must have one */
    for (int32_t b = 0; b < st->batch; b++)
        if (st->sample[b] && (st->cu_seqlens_q[b + 1] <= st->cu_seqlens_q[b] ||
                              st->cu_seqlens_q[b + 1] > st->total_q || st->cu_seqlens_q[b] < 0))
            return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                                 "step.sample[%d] is set but sequence %d has no query row in "
                                 "cu_seqlens_q[%d..%d] (%d..%d) within total_q (%d)",
                                 (int)b, (int)b, (int)b, (int)b + 1, (int)st->cu_seqlens_q[b],
                                 (int)st->cu_seqlens_q[b + 1], (int)st->total_q);
    double t0 = now();
    const int dim = c->dim;
    for (int32_t t = 0; t < st->total_q; t++)
        memcpy(s->x + (size_t)t * dim, m->w.token_embedding + (size_t)st->tokens[t] * dim,
               sizeof(float) * (size_t)dim);
    fa_status rc = layers(m, s, st->total_q, 0, kv, st, err);
    if (rc != FA_OK)
        return rc;
    for (int32_t b = 0; b < st->batch; b++) /* the sampled sequences' last rows only */
        if (st->sample[b]) {
            rmsnorm(s, s->xb, s->x + (size_t)(st->cu_seqlens_q[b + 1] - 1) * dim, m->w.rms_final, 1, dim);
            project(s, logits + (size_t)b * c->vocab_size, c->vocab_size, s->xb, m->w.classifier, 1, c->vocab_size,
                    dim, 0);
        }
    s->stats.forward_s += now() - t0;
    return FA_OK;
}
