/* SPDX-License-Identifier: MIT */
/*
 * `flashattn bench`: flash against standard attention in the same run, timed in turns,
 * medians after warm-up, errors against float64, the sgemm ceiling beside.
 */
#include "cli.h"
#include "plot.h"
#include "ref.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static const char *help =
    "usage: flashattn bench [options]\n"
    "\n"
    "Times flash attention and standard attention (full S and P in memory, mask applied\n"
    "after, softmax, P*V) on the same inputs in one run and reports, per shape: median\n"
    "ms of each, speed-up, GFLOP/s (4*b*h*sq*sk*d, halved when causal), the share of the\n"
    "OpenBLAS sgemm ceiling measured in the same run (CPU), the kernel and its tile (query\n"
    "rows x keys per step), the extra memory each call allocates, and flash's error\n"
    "against float64 (max abs, mean abs, share >= 1e-3, relative L2). Where the backend\n"
    "times its own kernels on the device (GLES with GL_EXT_disjoint_timer_query) a second\n"
    "line gives their median time alone, without its data movement. With no shape\n"
    "options it runs the default suite: seq 512..4096, heads 8 and 32, head_dim 64 and\n"
    "128, causal and not (about two minutes on 2 cores).\n"
    "\n"
    "  --paged               the serving suite instead: decode, speculative and mixed\n"
    "                        decode + prefill calls over a paged KV cache, GB/s and the\n"
    "                        share of the memory bandwidth measured in the same run\n"
    "                        (`flashattn bench --paged --help` lists its options)\n"
    "\n"
    "shape:\n"
    "  --seq N[,N...]        sequence lengths (sq = sk)             [512,1024,2048,4096]\n"
    "  --seq-q N             query length when it differs from --seq (e.g. 1 for decode)\n"
    "  --heads N[,N...]      query heads                            [8,32]\n"
    "  --kv-heads N          key/value heads (GQA/MQA)              [= heads]\n"
    "  --dim N[,N...]        head_dim, 1..256                       [64,128]\n"
    "  --batch N                                                    [1]\n"
    "  --causal yes|no|both                                         [both]\n"
    "  --window L,R          sliding window, -1 = unbounded         [-1,-1]\n"
    "  --softcap X           logit softcap, 0 = off                 [0]\n"
    "  --dropout P           attention dropout probability          [0]\n"
    "  --dtype f32|f16|bf16|e4m3  q, k, v and o dtype (e4m3: fp8 inputs, o bf16; forward only)\n"
    "                        [f32; bf16 on cuda]\n"
    "  --descale-rows N      e4m3: descale factors in [0.5, 2) for q, k and v, one per\n"
    "                        (batch, kv head) and block of N rows; 0: one per (batch,\n"
    "                        kv head)                               [none]\n"
    "  --layout bshd|bhsd                                           [bshd]\n"
    "run:\n"
    "  --backend auto|cpu|cuda|gles                                 [auto]\n"
    "  --threads N           0 = all cores                          [0]\n"
    "  --reps N              timed runs per measurement (median)    [adaptive, >= 3]\n"
    "  --backward            also time the backward pass (flash and standard) and check the\n"
    "                        gradients against float64 on batch 0, kv head 0\n"
    "  --no-standard         skip the standard baseline\n"
    "  --no-sgemm            skip the sgemm ceiling\n"
    "output:\n"
    "  --json FILE|-         one JSON object per row (JSON lines)\n"
    "  --plot FILE.svg       speed-up against sequence length\n";

#define MAXV 16

typedef struct opts {
    long seqs[MAXV], heads[MAXV], dims[MAXV];
    int nseq, nheads, ndims;
    long seq_q, kv_heads, batch, wl, wr, reps, threads;
    long descale_rows; /* -1: no descale factors */
    int causal_lo, causal_hi;
    double softcap, dropout;
    fa_dtype dtype;
    int dtype_given;
    fa_layout layout;
    fa_backend backend;
    int no_standard, no_sgemm, backward;
    const char *json, *plot;
} opts;

typedef struct row {
    const char *backend, *kernel;
    long block_q, block_k; /* the flash call's tiles: query rows x keys per step */
    long b, h, hk, sq, sk, d;
    int causal;
    double ms_flash, ms_std, gflops, pct_sgemm;
    double dev_flash, dev_std, dev_gflops; /* kernel-only ms by the backend's timers (0 = not
                                              measured) and flash's GFLOP/s by them */
    uint64_t bytes_flash, bytes_std;
    double max_err, mean_err, frac_err, rel_l2;
    int64_t sampled_rows, rows;
    int has_std, has_bwd;
    cli_bwd_row bwd;
} row;

double cli_median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int cli_time_turns(int (*fn)(void *), void *const arg[], int n, long reps, double ms[])
{
    return cli_time_turns_evict(fn, arg, n, reps, NULL, NULL, ms);
}

int cli_time_turns_evict(int (*fn)(void *), void *const arg[], int n, long reps, void (*evict)(void *),
                         void *evict_arg, double ms[])
{
    double once = 0.0;
    for (int f = 0; f < n; f++) {
        if (evict)
            evict(evict_arg);
        double t0 = cli_now();
        if (fn(arg[f]) != 0)
            return -1;
        once = fmax(once, cli_now() - t0);
    }
    int count = reps > 0 ? (int)reps : (int)fmin(15.0, fmax(3.0, 0.4 / fmax(once, 1e-6)));
    double ts[CLI_TURNS_MAX][64];
    if (count > 64)
        count = 64;
    for (int i = 0; i < count; i++)
        for (int f = 0; f < n; f++) {
            if (evict)
                evict(evict_arg);
            double t0 = cli_now();
            if (fn(arg[f]) != 0)
                return -1;
            ts[f][i] = (cli_now() - t0) * 1e3;
        }
    for (int f = 0; f < n; f++)
        ms[f] = cli_median(ts[f], count);
    return 0;
}

typedef struct fwd_call {
    fa_context_t ctx;
    const fa_attention_desc *d;
    double dev[64]; /* the backend's own kernel times (fa_run_info.device_ms) of the timed calls */
    int calls, n_dev;
    double ms, dev_ms; /* medians */
} fwd_call;

static int run_forward(void *arg)
{
    fwd_call *c = arg; /* synchronised: asynchronous backends are timed to completion */
    fa_run_info ri = { .size = sizeof(ri) };
    if (fa_forward(c->ctx, c->d) != FA_OK || fa_context_synchronize(c->ctx) != FA_OK ||
        fa_context_last_run(c->ctx, &ri) != FA_OK)
        return -1;
    if (c->calls++ > 0 && ri.device_ms > 0.0 && c->n_dev < 64) /* the first call warms up */
        c->dev[c->n_dev++] = ri.device_ms;
    return 0;
}

/* n calls (1 or 2) timed in turns: median wall times in c[i].ms; c[i].dev_ms the median of
 * the backend's kernel times where it measures them (GLES timer queries), 0 otherwise. The
 * last call made is c[n - 1]'s: its output is what the caller finds. */
static int time_calls(fwd_call *c, int n, long reps)
{
    void *const arg[2] = { &c[0], &c[1] };
    double ms[2];
    if (cli_time_turns(run_forward, arg, n, reps, ms) != 0)
        return -1;
    for (int i = 0; i < n; i++) {
        c[i].ms = ms[i];
        c[i].dev_ms = c[i].n_dev ? cli_median(c[i].dev, c[i].n_dev) : 0.0;
    }
    return 0;
}

void cli_blas_note(void)
{
#if defined(__x86_64__)
    static int said;
    if (said || !__builtin_cpu_supports("avx2"))
        return;
    const char *core = openblas_get_corename();
    static const char *const fitting[] = { "haswell", "zen", "skylakex", "cooperlake", "sapphirerapids" };
    for (size_t i = 0; core && i < sizeof(fitting) / sizeof(fitting[0]); i++)
        if (strcasecmp(core, fitting[i]) == 0)
            return;
    said = 1;
    const int avx512 = __builtin_cpu_supports("avx512f");
    fprintf(stderr,
            "flashattn: note: OpenBLAS runs its %s kernels on this %s CPU, so its GEMMs (the sgemm "
            "ceiling, the runner's projections) are slower than they can be; set "
            "OPENBLAS_CORETYPE=%s in the environment to have it use the right ones\n",
            core ? core : "generic", avx512 ? "AVX-512" : "AVX2", avx512 ? "SkylakeX" : "Haswell");
#endif
}

static double sgemm_gflops(int threads)
{
    const int n = 2048;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return 0.0;
    }
    fa_rng r = { 7 };
    for (long i = 0; i < (long)n * n; i++) {
        a[i] = (float)fa_rng_uniform(&r);
        b[i] = (float)fa_rng_uniform(&r);
    }
    if (threads > 0)
        openblas_set_num_threads(threads);
    double ts[5];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    for (int i = 0; i < 5; i++) {
        double t0 = cli_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        ts[i] = cli_now() - t0;
    }
    free(a);
    free(b);
    free(c);
    /* OpenBLAS worker threads keep spinning for a while after a call; let them
     * go to sleep before timing anything else on the same cores. */
    usleep(300000);
    return 2.0 * n * (double)n * n / cli_median(ts, 5) / 1e9;
}

/* The buffers of one shape, in bytes. */
typedef struct sizes {
    size_t q, k;  /* q (and d_o, d_q), k (and v, d_k, d_v) */
    size_t o;     /* o: q's size, twice it for fp8 inputs (o bf16) */
    size_t lse;   /* the backward's log-sum-exp */
    size_t ref;   /* flash's output in float64 */
    double host;  /* all of them that live in host memory at once */
} sizes;

/* -1 when a size does not fit in a size_t. host_memory: the backend computes in host memory
 * (CPU, GLES), so its copies of the tensors count too. */
static int shape_sizes(const opts *o, int host_memory, long sq, long sk, long h, long d, sizes *s)
{
    const int64_t b = o->batch, hk = o->kv_heads ? o->kv_heads : h, esz = cli_dtype_bytes(o->dtype),
                  osz = cli_dtype_bytes(cli_out_dtype(o->dtype));
    if (cli_size(&s->q, (const int64_t[]){ b, sq, h, d, esz }, 5) ||
        cli_size(&s->o, (const int64_t[]){ b, sq, h, d, osz }, 5) ||
        cli_size(&s->k, (const int64_t[]){ b, sk, hk, d, esz }, 5) ||
        cli_size(&s->lse, (const int64_t[]){ b, h, sq, 4 }, 4) ||
        cli_size(&s->ref, (const int64_t[]){ b, sq, h, d, 8 }, 5))
        return -1;
    const double tensors = (double)s->q + (double)s->o + 2.0 * (double)s->k; /* q, o, k, v */
    const double copies = (host_memory ? 2.0 : 1.0) * (o->backward ? 2.0 : 1.0);
    s->host = copies * tensors + (double)s->ref + (host_memory && o->backward ? (double)s->lse : 0.0);
    return 0;
}

/* 0 when every shape's buffers fit here; CLI_EXIT_FAIL after naming the first that does not. */
static int check_sizes(const opts *o, int host_memory)
{
    const double avail = (double)cli_mem_available(), gib = 1073741824.0;
    for (int hi = 0; hi < o->nheads; hi++)
        for (int di = 0; di < o->ndims; di++)
            for (int si = 0; si < o->nseq; si++) {
                const long sk = o->seqs[si], sq = o->seq_q ? o->seq_q : sk, h = o->heads[hi],
                           d = o->dims[di];
                char shape[160];
                snprintf(shape, sizeof(shape), "b %ld, sq %ld, sk %ld, h %ld, hkv %ld, d %ld, %s",
                         o->batch, sq, sk, h, o->kv_heads ? o->kv_heads : h, d,
                         cli_dtype_name(o->dtype));
                sizes s;
                if (shape_sizes(o, host_memory, sq, sk, h, d, &s) != 0) {
                    fprintf(stderr, "flashattn bench: the tensors of %s need more bytes than a "
                                    "size_t holds: too large\n", shape);
                    return CLI_EXIT_FAIL;
                }
                if (avail > 0 && s.host > 0.9 * avail) {
                    fprintf(stderr, "flashattn bench: the tensors of %s need %.1f GiB (with their "
                                    "float64 reference) but %.1f GiB is available here: too large\n",
                            shape, s.host / gib, avail / gib);
                    return CLI_EXIT_FAIL;
                }
            }
    return 0;
}

static void errors(const fa_attention_desc *d, size_t ref_bytes, row *r)
{
    /* Sample rows so the float64 reference stays near 3e8 multiply-adds. */
    int64_t rows = (int64_t)d->batch * d->seqlen_q, hq = d->num_heads_q, dim = d->head_dim;
    double work = (double)rows * hq * d->seqlen_k * dim;
    int64_t every = work > 3e8 ? (int64_t)ceil(work / 3e8) : 1;
    double *ref = malloc(ref_bytes);
    r->rows = rows;
    r->sampled_rows = 0;
    if (!ref || fa_ref_attention(d, every, ref, NULL, NULL) != 0) {
        free(ref);
        r->max_err = r->mean_err = r->frac_err = r->rel_l2 = NAN;
        return;
    }
    double mx = 0, sum = 0, n = 0, ge = 0, num = 0, den = 0;
    for (int32_t b = 0; b < d->batch; b++)
        for (int64_t i = 0; i < d->seqlen_q; i++) {
            int64_t rowi = (int64_t)b * d->seqlen_q + i;
            if (rowi % every)
                continue;
            r->sampled_rows++;
            for (int32_t h = 0; h < hq; h++) {
                int64_t base = (int64_t)b * d->o.stride_batch + i * d->o.stride_seq +
                               (int64_t)h * d->o.stride_head;
                for (int64_t x = 0; x < dim; x++) {
                    double want = ref[(rowi * hq + h) * dim + x];
                    double e = fabs(fa_ref_decode(d->o.dtype, d->o.data, base + x) - want);
                    mx = e > mx || isnan(e) ? e : mx;
                    sum += e;
                    ge += e >= 1e-3;
                    n++;
                    num += e * e;
                    den += want * want;
                }
            }
        }
    free(ref);
    r->max_err = mx;
    r->mean_err = sum / n;
    r->frac_err = ge / n;
    r->rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
}

static int run_row(fa_context_t ctx, const opts *o, long sq, long sk, long h, long d, int causal,
                   double sgemm, row *r)
{
    long hk = o->kv_heads ? o->kv_heads : h, b = o->batch;
    if (h % hk)
        return cli_usage_error("bench", "--heads %ld is not a multiple of --kv-heads %ld", h, hk);
    sizes sz;
    if (shape_sizes(o, fa_context_backend(ctx) != FA_BACKEND_CUDA, sq, sk, h, d, &sz) != 0) {
        fprintf(stderr, "flashattn bench: the tensors of sq %ld sk %ld h %ld d %ld are too large\n",
                sq, sk, h, d);
        return CLI_EXIT_FAIL;
    }
    const size_t esz = (size_t)cli_dtype_bytes(o->dtype), nq = sz.q / esz, nk = sz.k / esz;
    void *q = malloc(sz.q), *k = malloc(sz.k), *v = malloc(sz.k), *out = malloc(sz.o);
    if (!q || !k || !v || !out) {
        free(q);
        free(k);
        free(v);
        free(out);
        fprintf(stderr, "flashattn bench: out of memory for sq %ld sk %ld h %ld d %ld\n", sq, sk, h, d);
        return CLI_EXIT_FAIL;
    }
    fa_rng rng = { (uint64_t)(sq * 1000003 + sk * 101 + h * 7 + d + causal) };
    for (size_t i = 0; i < nq; i++)
        fa_ref_encode(o->dtype, q, (int64_t)i, fa_rng_uniform(&rng));
    for (size_t i = 0; i < nk; i++) {
        fa_ref_encode(o->dtype, k, (int64_t)i, fa_rng_uniform(&rng));
        fa_ref_encode(o->dtype, v, (int64_t)i, fa_rng_uniform(&rng));
    }
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.batch = (int32_t)b;
    desc.seqlen_q = (int32_t)sq;
    desc.seqlen_k = (int32_t)sk;
    desc.num_heads_q = (int32_t)h;
    desc.num_heads_kv = (int32_t)hk;
    desc.head_dim = (int32_t)d;
    desc.causal = causal;
    desc.window_left = (int32_t)o->wl;
    desc.window_right = (int32_t)o->wr;
    desc.softcap = (float)o->softcap;
    desc.dropout_p = (float)o->dropout;
    desc.dropout_seed = 20261129; /* fixed: runs are comparable */
    desc.q = fa_tensor_contiguous(q, o->dtype, o->layout, (int32_t)sq, (int32_t)h, (int32_t)d);
    desc.k = fa_tensor_contiguous(k, o->dtype, o->layout, (int32_t)sk, (int32_t)hk, (int32_t)d);
    desc.v = fa_tensor_contiguous(v, o->dtype, o->layout, (int32_t)sk, (int32_t)hk, (int32_t)d);
    desc.o = fa_tensor_contiguous(out, cli_out_dtype(o->dtype), o->layout, (int32_t)sq, (int32_t)h, (int32_t)d);
    float *lse = NULL; /* the backward needs the forward's log-sum-exp */
    /* descale factors: q's, k's and v's one after the other, [b, hk, blocks] each */
    float *ds = NULL;
    size_t ds_bytes = 0;
    if (o->descale_rows >= 0) {
        const long nr = o->descale_rows, rows[3] = { sq, sk, sk };
        long nblk[3], total = 0;
        for (int i = 0; i < 3; i++)
            total += b * hk * (nblk[i] = nr ? (rows[i] + nr - 1) / nr : 1);
        ds_bytes = (size_t)total * sizeof(float);
        if (!(ds = malloc(ds_bytes))) {
            free(q);
            free(k);
            free(v);
            free(out);
            fprintf(stderr, "flashattn bench: out of memory for the descale factors\n");
            return CLI_EXIT_FAIL;
        }
        for (long i = 0; i < total; i++)
            ds[i] = (float)exp2(fa_rng_uniform(&rng));
        fa_descale *f[3] = { &desc.q_descale, &desc.k_descale, &desc.v_descale };
        for (long i = 0, at = 0; i < 3; at += b * hk * nblk[i], i++)
            *f[i] = (fa_descale){ .data = ds + at, .stride_batch = hk * nblk[i], .stride_head = nblk[i],
                                  .stride_block = nr ? 1 : 0, .block_rows = (int32_t)nr };
    }
    /* the same tensors in the memory the backend computes on (device memory for CUDA) */
    fa_attention_desc hdesc = desc;
    void *dev[5] = { NULL, NULL, NULL, NULL, NULL };
    const size_t bytes[5] = { sz.q, sz.k, sz.k, sz.o, ds_bytes };
    void *const host[5] = { q, k, v, out, ds };
    memset(r, 0, sizeof(*r));
    int rc = 0;
    for (int i = 0; i < 5; i++)
        if ((i < 4 || ds) && (fa_memory_alloc(ctx, bytes[i], &dev[i]) != FA_OK ||
                              (i != 3 && fa_memory_upload(ctx, dev[i], host[i], bytes[i]) != FA_OK)))
            goto api_error;
    if (o->backward && fa_memory_alloc(ctx, sz.lse, (void **)&lse) != FA_OK)
        goto api_error;
    desc.q.data = dev[0], desc.k.data = dev[1], desc.v.data = dev[2], desc.o.data = dev[3];
    if (ds) { /* the same offsets into the device copy */
        fa_descale *f[3] = { &desc.q_descale, &desc.k_descale, &desc.v_descale };
        for (int i = 0; i < 3; i++)
            f[i]->data = (const float *)dev[4] + (f[i]->data - ds);
    }
    desc.lse = lse;

    r->b = b, r->h = h, r->hk = hk, r->sq = sq, r->sk = sk, r->d = d, r->causal = causal;
    fa_run_info ri = { .size = sizeof(ri) };
    fa_attention_desc std_desc = desc;
    std_desc.algorithm = FA_ALGORITHM_STANDARD;
    if (!o->no_standard) {
        const fa_status sst = fa_forward_plan(ctx, &std_desc, &ri);
        if (sst != FA_OK) /* the row shows "-"; say why */
            fprintf(stderr, "flashattn bench: standard skipped (sq %d, sk %d, d %d): %s\n", (int)sq,
                    (int)sk, (int)d, fa_context_last_error(ctx));
        else if (ri.workspace_bytes < (uint64_t)12 << 30) {
            r->bytes_std = ri.workspace_bytes;
            r->has_std = 1;
        }
    }
    desc.algorithm = FA_ALGORITHM_FLASH;
    /* both algorithms timed in turns, so that a noisy machine's slow spells fall on both
     * alike; the fused call goes last, so o holds its output for the check */
    fwd_call calls[2] = { { .ctx = ctx, .d = &std_desc }, { .ctx = ctx, .d = &desc } };
    fwd_call *timed = r->has_std ? calls : calls + 1;
    if (fa_forward_plan(ctx, &desc, &ri) != FA_OK || time_calls(timed, r->has_std ? 2 : 1, o->reps) != 0)
        goto api_error;
    r->ms_flash = calls[1].ms, r->dev_flash = calls[1].dev_ms;
    if (r->has_std)
        r->ms_std = calls[0].ms, r->dev_std = calls[0].dev_ms;
    r->backend = ri.backend_name;
    r->kernel = ri.kernel;
    r->block_q = ri.block_q;
    r->block_k = ri.block_k;
    r->bytes_flash = ri.workspace_bytes;
    double flops = 4.0 * b * h * (double)sq * sk * d * (causal ? 0.5 : 1.0);
    r->gflops = flops / (r->ms_flash * 1e-3) / 1e9;
    r->dev_gflops = r->dev_flash > 0.0 ? flops / (r->dev_flash * 1e-3) / 1e9 : 0.0;
    r->pct_sgemm = sgemm > 0 && ri.backend == FA_BACKEND_CPU ? 100.0 * r->gflops / sgemm : NAN;
    if (fa_memory_download(ctx, out, dev[3], bytes[3]) != FA_OK)
        goto api_error;
    errors(&hdesc, sz.ref, r);
    if (o->backward) {
        if ((rc = cli_bench_backward(ctx, &desc, &hdesc, o->reps, o->no_standard, flops, &r->bwd)) != 0)
            goto done;
        r->has_bwd = 1;
    }
    goto done;
api_error:
    fprintf(stderr, "flashattn bench: %s\n", fa_context_last_error(ctx));
    rc = CLI_EXIT_FAIL;
done:
    for (int i = 0; i < 5; i++)
        fa_memory_free(ctx, dev[i]);
    fa_memory_free(ctx, lse);
    free(ds);
    free(q);
    free(k);
    free(v);
    free(out);
    return rc;
}

static void print_header(void)
{
    printf("%-4s %-20s %-9s %2s %3s %3s %5s %5s %4s %-4s %-3s %9s %9s %7s %7s %6s %9s %9s %8s %8s "
           "%7s %8s\n",
           "be", "kernel", "tile", "b", "h", "hkv", "sq", "sk", "d", "type", "cau", "flash_ms", "std_ms",
           "speedup", "GFLOP/s", "%sgemm", "flash_MiB", "std_MiB", "max_err", "mean_err", ">=1e-3",
           "rel_l2");
}

static void print_row(const opts *o, const row *r)
{
    char std_ms[16] = "-", speed[16] = "-", std_mib[16] = "-";
    if (r->has_std) {
        snprintf(std_ms, sizeof(std_ms), "%.3f", r->ms_std);
        snprintf(speed, sizeof(speed), "%.2fx", r->ms_std / r->ms_flash);
        snprintf(std_mib, sizeof(std_mib), "%.2f", (double)r->bytes_std / 1048576.0);
    }
    char pct[16] = "-"; /* the ceiling is a CPU's */
    if (!isnan(r->pct_sgemm))
        snprintf(pct, sizeof(pct), "%.0f%%", r->pct_sgemm);
    char tile[24];
    snprintf(tile, sizeof(tile), "%ldx%ld", r->block_q, r->block_k);
    printf("%-4s %-20s %-9s %2ld %3ld %3ld %5ld %5ld %4ld %-4s %-3s %9.3f %9s %7s %7.1f %6s %9.3f "
           "%9s %8.1e %8.1e %6.2f%% %8.1e%s\n",
           r->backend, r->kernel, tile, r->b, r->h, r->hk, r->sq, r->sk, r->d, cli_dtype_name(o->dtype),
           r->causal ? "yes" : "no", r->ms_flash, std_ms, speed, r->gflops, pct,
           (double)r->bytes_flash / 1048576.0, std_mib, r->max_err, r->mean_err,
           100.0 * r->frac_err, r->rel_l2, r->sampled_rows < r->rows ? " *" : "");
    if (r->dev_flash > 0.0) {
        printf("     attention kernels alone (GPU timer): flash %.3f ms, %.1f GFLOP/s", r->dev_flash,
               r->dev_gflops);
        if (r->has_std && r->dev_std > 0.0)
            printf("; standard %.3f ms (%.2fx)", r->dev_std, r->dev_std / r->dev_flash);
        printf("\n");
    }
    if (r->has_bwd) {
        const cli_bwd_row *w = &r->bwd;
        printf("     backward: flash %.3f ms", w->ms);
        if (w->has_std)
            printf(", standard %.3f ms (%.2fx)", w->ms_std, w->ms_std / w->ms);
        printf(", %.1f GFLOP/s (%.0f%% of the forward's), %.2f MiB", w->gflops,
               100.0 * w->gflops / r->gflops, (double)w->bytes / 1048576.0);
        if (w->has_std)
            printf(" vs %.2f MiB", (double)w->bytes_std / 1048576.0);
        if (w->checked)
            printf("; rel L2 dq %.1e dk %.1e dv %.1e (batch 0, kv head 0)", w->rel_l2[0], w->rel_l2[1],
                   w->rel_l2[2]);
        printf("\n");
    }
}

static void json_row(FILE *f, const opts *o, const row *r, double sgemm)
{
    fprintf(f,
            "{\"backend\":\"%s\",\"kernel\":\"%s\",\"block_q\":%ld,\"block_k\":%ld,\"batch\":%ld,"
            "\"heads\":%ld,\"kv_heads\":%ld,"
            "\"seq_q\":%ld,\"seq_k\":%ld,\"head_dim\":%ld,\"dtype\":\"%s\",\"causal\":%s,"
            "\"ms_flash\":%.6f,",
            r->backend, r->kernel, r->block_q, r->block_k, r->b, r->h, r->hk, r->sq, r->sk, r->d, cli_dtype_name(o->dtype),
            r->causal ? "true" : "false", r->ms_flash);
    if (r->has_std)
        fprintf(f, "\"ms_standard\":%.6f,\"speedup\":%.4f,", r->ms_std, r->ms_std / r->ms_flash);
    else
        fprintf(f, "\"ms_standard\":null,\"speedup\":null,");
    fprintf(f, "\"gflops\":%.3f,\"bytes_flash\":%llu,", r->gflops, (unsigned long long)r->bytes_flash);
    if (r->dev_flash > 0.0)
        fprintf(f, "\"device_ms_flash\":%.6f,\"device_gflops\":%.3f,", r->dev_flash, r->dev_gflops);
    if (r->dev_std > 0.0)
        fprintf(f, "\"device_ms_standard\":%.6f,", r->dev_std);
    if (r->has_std)
        fprintf(f, "\"bytes_standard\":%llu,", (unsigned long long)r->bytes_std);
    else
        fprintf(f, "\"bytes_standard\":null,");
    fprintf(f,
            "\"max_abs_err\":%.6g,\"mean_abs_err\":%.6g,\"frac_err_ge_1e3\":%.6g,\"rel_l2_err\":%.6g,"
            "\"sgemm_gflops\":%.3f,\"window_left\":%ld,\"window_right\":%ld,\"softcap\":%g,\"dropout_p\":%g,"
            "\"err_rows_sampled\":%lld,\"rows\":%lld",
            r->max_err, r->mean_err, r->frac_err, r->rel_l2, sgemm, o->wl, o->wr, o->softcap,
            o->dropout, (long long)r->sampled_rows, (long long)r->rows);
    if (o->descale_rows >= 0)
        fprintf(f, ",\"descale_rows\":%ld", o->descale_rows);
    if (r->has_bwd) {
        const cli_bwd_row *w = &r->bwd;
        fprintf(f, ",\"ms_backward\":%.6f,\"gflops_backward\":%.3f,\"bytes_backward\":%llu", w->ms,
                w->gflops, (unsigned long long)w->bytes);
        if (w->has_std)
            fprintf(f, ",\"ms_backward_standard\":%.6f,\"bytes_backward_standard\":%llu", w->ms_std,
                    (unsigned long long)w->bytes_std);
        else
            fprintf(f, ",\"ms_backward_standard\":null,\"bytes_backward_standard\":null");
        static const char *g[3] = { "dq", "dk", "dv" };
        for (int i = 0; i < 3; i++) {
            if (w->checked)
                fprintf(f, ",\"%s_rel_l2_err\":%.6g,\"%s_max_abs_err\":%.6g", g[i], w->rel_l2[i], g[i],
                        w->max_err[i]);
            else
                fprintf(f, ",\"%s_rel_l2_err\":null,\"%s_max_abs_err\":null", g[i], g[i]);
        }
    }
    fprintf(f, "}\n"); /* flushed by the caller, which checks the write */
}

static int parse(int argc, char **argv, opts *o)
{
    static const long def_seq[] = { 512, 1024, 2048, 4096 }, def_heads[] = { 8, 32 },
                      def_dims[] = { 64, 128 };
    memset(o, 0, sizeof(*o));
    memcpy(o->seqs, def_seq, sizeof(def_seq));
    o->nseq = 4;
    memcpy(o->heads, def_heads, sizeof(def_heads));
    o->nheads = 2;
    memcpy(o->dims, def_dims, sizeof(def_dims));
    o->ndims = 2;
    o->batch = 1;
    o->descale_rows = -1;
    o->wl = o->wr = -1;
    o->causal_lo = 0;
    o->causal_hi = 1;
    o->dtype = FA_DTYPE_F32;
    o->layout = FA_LAYOUT_BSHD;
    o->backend = FA_BACKEND_AUTO;
    enum { SEQ, SEQ_Q, HEADS, KV_HEADS, DIM, BATCH, CAUSAL, WINDOW, SOFTCAP, DROPOUT, DTYPE,
           DESCALE_ROWS, LAYOUT, REPS, JSON, PLOT, BACKWARD, NO_STANDARD, NO_SGEMM, N_OPTIONS };
    static const cli_option options[N_OPTIONS] = {
        [SEQ] = { "--seq", 1 },         [SEQ_Q] = { "--seq-q", 1 },
        [HEADS] = { "--heads", 1 },     [KV_HEADS] = { "--kv-heads", 1 },
        [DIM] = { "--dim", 1 },         [BATCH] = { "--batch", 1 },
        [CAUSAL] = { "--causal", 1 },   [WINDOW] = { "--window", 1 },
        [SOFTCAP] = { "--softcap", 1 }, [DROPOUT] = { "--dropout", 1 },
        [DTYPE] = { "--dtype", 1 },     [DESCALE_ROWS] = { "--descale-rows", 1 },
        [LAYOUT] = { "--layout", 1 },
        [REPS] = { "--reps", 1 },       [JSON] = { "--json", 1 },
        [PLOT] = { "--plot", 1 },       [BACKWARD] = { "--backward", 0 },
        [NO_STANDARD] = { "--no-standard", 0 }, [NO_SGEMM] = { "--no-sgemm", 0 },
    };
    cli_args args = { "bench", help, argc, argv, options, N_OPTIONS, &o->backend, &o->threads, 0 };
    int opt, rc;
    const char *v;
    while ((rc = cli_next_option(&args, &opt, &v)) == 1) {
        switch (opt) {
        case SEQ:
            if ((o->nseq = cli_parse_int_list(v, 1, 1 << 24, o->seqs, MAXV)) < 0)
                return cli_usage_error("bench", "--seq needs up to %d lengths in 1..16777216, "
                                                "comma-separated", MAXV);
            break;
        case SEQ_Q:
            if (cli_parse_int(v, 1, 1 << 24, &o->seq_q))
                return cli_usage_error("bench", "--seq-q needs a length in 1..16777216");
            break;
        case HEADS:
            if ((o->nheads = cli_parse_int_list(v, 1, 4096, o->heads, MAXV)) < 0)
                return cli_usage_error("bench", "--heads needs up to %d counts in 1..4096, "
                                                "comma-separated", MAXV);
            break;
        case KV_HEADS:
            if (cli_parse_int(v, 1, 4096, &o->kv_heads))
                return cli_usage_error("bench", "--kv-heads needs a count in 1..4096");
            break;
        case DIM:
            if ((o->ndims = cli_parse_int_list(v, 1, FA_MAX_HEAD_DIM, o->dims, MAXV)) < 0)
                return cli_usage_error("bench", "--dim needs up to %d head dims in 1..%d, "
                                                "comma-separated", MAXV, FA_MAX_HEAD_DIM);
            break;
        case BATCH:
            if (cli_parse_int(v, 1, 1 << 20, &o->batch))
                return cli_usage_error("bench", "--batch needs a count in 1..1048576");
            break;
        case CAUSAL:
            if (strcmp(v, "yes") == 0)
                o->causal_lo = o->causal_hi = 1;
            else if (strcmp(v, "no") == 0)
                o->causal_lo = o->causal_hi = 0;
            else if (strcmp(v, "both") == 0)
                o->causal_lo = 0, o->causal_hi = 1;
            else
                return cli_usage_error("bench", "--causal needs yes, no or both");
            break;
        case WINDOW: {
            long w[2];
            if (cli_parse_int_list(v, -1, 1 << 30, w, 2) != 2)
                return cli_usage_error("bench", "--window needs L,R with -1 for unbounded");
            o->wl = w[0], o->wr = w[1];
            break;
        }
        case SOFTCAP:
            if (cli_parse_float(v, &o->softcap) || !(o->softcap >= 0 && o->softcap <= FA_MAX_SCALE))
                return cli_usage_error("bench", "--softcap needs a number in 0..%g", (double)FA_MAX_SCALE);
            if (o->softcap > 0 && (float)o->softcap == 0.0f)
                return cli_usage_error("bench", "--softcap %s is 0 as a float32, which turns the softcap off", v);
            break;
        case DROPOUT:
            if (cli_parse_float(v, &o->dropout) || !(o->dropout >= 0 && (float)o->dropout < 1.0f))
                return cli_usage_error("bench", "--dropout needs a probability in [0, 1) (below 1 as a float32: "
                                                "at most 0.99999994)");
            break;
        case DTYPE:
            if (cli_parse_dtype(v, &o->dtype))
                return cli_usage_error("bench", "--dtype needs f32, f16, bf16 or e4m3");
            o->dtype_given = 1;
            break;
        case DESCALE_ROWS:
            if (cli_parse_int(v, 0, 1 << 30, &o->descale_rows))
                return cli_usage_error("bench", "--descale-rows needs a row count in 0..1073741824");
            break;
        case LAYOUT:
            if (strcmp(v, "bshd") == 0)
                o->layout = FA_LAYOUT_BSHD;
            else if (strcmp(v, "bhsd") == 0)
                o->layout = FA_LAYOUT_BHSD;
            else
                return cli_usage_error("bench", "--layout needs bshd or bhsd");
            break;
        case REPS:
            if (cli_parse_int(v, 1, 64, &o->reps))
                return cli_usage_error("bench", "--reps needs an integer in 1..64");
            break;
        case JSON:
            o->json = v;
            break;
        case PLOT:
            o->plot = v;
            break;
        case BACKWARD:
            o->backward = 1;
            break;
        case NO_STANDARD:
            o->no_standard = 1;
            break;
        case NO_SGEMM:
            o->no_sgemm = 1;
            break;
        }
    }
    if (rc != 0)
        return rc;
    if (o->backward && o->dtype == FA_DTYPE_E4M3)
        return cli_usage_error("bench", "--dtype e4m3 is forward only: drop --backward");
    if (o->descale_rows >= 0 && o->dtype != FA_DTYPE_E4M3)
        return cli_usage_error("bench", "--descale-rows is for fp8 inputs: add --dtype e4m3");
    for (int i = 0; i < o->nheads; i++)
        if (o->kv_heads && o->heads[i] % o->kv_heads)
            return cli_usage_error("bench", "--heads %ld is not a multiple of --kv-heads %ld",
                                   o->heads[i], o->kv_heads);
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--paged") == 0)
            return cmd_bench_paged(argc, argv);
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0)
        return rc == CLI_HELP ? 0 : rc;
    if ((o.plot && (rc = cli_output_ok("bench", "--plot", o.plot, 0)) != 0) ||
        (o.json && (rc = cli_output_ok("bench", "--json", o.json, 1)) != 0))
        return rc;
    if (o.plot && o.json && strcmp(o.json, "-") != 0 && cli_same_output(o.json, o.plot))
        return cli_usage_error("bench", "--json and --plot name the same file '%s'; give each its own", o.plot);
    fa_context_t ctx = cli_context(o.backend, (int)o.threads);
    if (!ctx)
        return CLI_EXIT_FAIL;
    if (!o.dtype_given && fa_context_backend(ctx) == FA_BACKEND_CUDA)
        o.dtype = FA_DTYPE_BF16; /* tensor cores take 16-bit inputs */
    if ((rc = check_sizes(&o, fa_context_backend(ctx) != FA_BACKEND_CUDA)) != 0) {
        fa_context_destroy(ctx);
        return rc;
    }
    if (fa_context_backend(ctx) == FA_BACKEND_GLES && (o.dropout > 0 || o.backward || o.dtype == FA_DTYPE_E4M3)) {
        fa_context_destroy(ctx); /* refused for every shape: said once, before any table */
        return cli_usage_error("bench", "%s: the gles backend has no %s (use cpu or cuda)",
                               o.dropout > 0 ? "--dropout" : o.backward ? "--backward" : "--dtype e4m3",
                               o.dropout > 0 ? "dropout" : o.backward ? "backward pass" : "fp8 forward");
    }
    cli_out json = { 0 };
    if (o.json && (rc = cli_out_open(&json, "bench", "--json", o.json, 1)) != 0) {
        fa_context_destroy(ctx);
        return rc;
    }
    FILE *jf = json.f, *out = jf == stdout ? stderr : stdout; /* keep stdout pure JSON with --json - */
    int threads = (int)o.threads;
    double sgemm = o.no_sgemm || fa_context_backend(ctx) != FA_BACKEND_CPU ? 0.0 : sgemm_gflops(threads);
    if (sgemm > 0)
        cli_blas_note();
    fprintf(out, "flashattn %s bench: backend %s, %s, medians after warm-up, the two algorithms in turns\n",
            fa_version_string(),
            fa_backend_name(fa_context_backend(ctx)), cli_dtype_name(o.dtype));
    if (sgemm > 0)
        fprintf(out, "sgemm ceiling (OpenBLAS, 2048^3, same run): %.1f GFLOP/s\n", sgemm);
    if (out == stdout)
        print_header();

    int total = o.nseq * o.nheads * o.ndims * (o.causal_hi - o.causal_lo + 1), done = 0;
    int tty = isatty(fileno(stderr));
    fa_plot plot;
    fa_plot_init(&plot);
    int any_sampled = 0;
    for (int hi = 0; hi < o.nheads && rc == 0; hi++)
        for (int di = 0; di < o.ndims && rc == 0; di++)
            for (int c = o.causal_lo; c <= o.causal_hi && rc == 0; c++)
                for (int si = 0; si < o.nseq && rc == 0; si++) {
                    long sk = o.seqs[si], sq = o.seq_q ? o.seq_q : sk;
                    if (tty)
                        fprintf(stderr, "\r[%d/%d] sq %ld sk %ld h %ld d %ld %s ...", done + 1, total,
                                sq, sk, o.heads[hi], o.dims[di], c ? "causal" : "");
                    row r;
                    rc = run_row(ctx, &o, sq, sk, o.heads[hi], o.dims[di], c, sgemm, &r);
                    if (tty)
                        fprintf(stderr, "\r%60s\r", "");
                    if (rc)
                        break;
                    done++;
                    any_sampled |= r.sampled_rows < r.rows;
                    if (out == stdout) { /* a write that fails ends the run, said once by main */
                        print_row(&o, &r);
                        if (cli_stdout_ok() != 0) {
                            rc = CLI_EXIT_FAIL;
                            break;
                        }
                    }
                    if (jf) {
                        json_row(jf, &o, &r, sgemm);
                        if ((rc = cli_out_check(&json)) != 0)
                            break;
                    }
                    if (r.has_std) {
                        char series[64];
                        snprintf(series, sizeof(series), "h%ld d%ld%s", r.h, r.d, c ? " causal" : "");
                        fa_plot_add(&plot, series, (double)sk, r.ms_std / r.ms_flash);
                    }
                }
    if (any_sampled && out == stdout)
        printf("* errors over sampled query rows (every k-th row) to keep the float64 check short\n");
    if (o.plot && rc == 0) {
        char title[128];
        snprintf(title, sizeof(title), "flashattn %s: flash vs standard attention (%s, %s)",
                 fa_version_string(), fa_backend_name(fa_context_backend(ctx)),
                 cli_dtype_name(o.dtype));
        cli_out svg;
        if ((rc = cli_out_open(&svg, "bench", "--plot", o.plot, 0)) == 0) {
            fa_plot_write_svg(&plot, svg.f, title, "sequence length", "speed-up (x)");
            if ((rc = cli_out_commit(&svg)) == 0)
                fprintf(out, "plot written to %s\n", o.plot);
        }
    }
    /* the rows replace an earlier --json file only when the whole run went through */
    if (jf && rc == 0)
        rc = cli_out_commit(&json);
    else if (jf)
        cli_out_abort(&json);
    fa_context_destroy(ctx);
    return rc;
}
