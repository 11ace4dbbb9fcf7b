/* SPDX-License-Identifier: MIT */
/*
 * CPU decode beside ggml's flash attention, in one process. One query per sequence over a
 * [batch, seq, kv heads, dim] f16 KV cache (llama.cpp's own cache layout, which ggml reads as
 * a permuted view), f32 queries and outputs. Per shape, on identical data:
 *   ggml   ggml_flash_attn_ext, GGML_PREC_F32, no mask, graph built once, a persistent
 *          thread pool
 *   dense  fa_forward (seqlen_q 1, BSHD K/V read in place)
 *   paged  fa_paged_run over the same keys copied into pages of 16 tokens in a shuffled
 *          page table (plan made once)
 * ggml takes f32 queries and rounds them to f16 itself before its f16 dot products;
 * flashattn takes one dtype for q, k and v, so it gets those f16 queries. Repetitions
 * alternate the three (the order rotates), each call after a read of a buffer larger than
 * the last-level cache, so every call streams its K/V from memory as a model's layers do.
 * The read bandwidth is measured first (a probe: threads streaming a buffer far larger than
 * the LLC) and again in turns with the calls: each eviction read is timed, and a row's share of
 * the bandwidth is of those reads' median (the probe's when --flush-mib 0). Times are medians. The max abs difference of the outputs is a sanity print (same
 * scale, same layout), not a test.
 *
 * --flush-mib 0 leaves the caches warm (to time the arithmetic alone).
 *
 * usage: ggml_decode [--json] [--reps N] [--threads T] [--seed S] [--flush-mib M]
 *                    [--shape B,HQ,HKV,KV,D]...
 */
#include "flashattn.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SHAPES 32
#define BW_BYTES ((size_t)1 << 30)

typedef struct shape {
    int b, hq, hkv, kv, d;
} shape;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* 32-byte vectors: registers on AVX2 and AVX-512 alike (a 64-byte vector type in an AVX2 build
 * keeps its accumulators on the stack, and the probe read 25% below the memory's rate). */
typedef float v8 __attribute__((vector_size(32)));

/* Sum of a buffer read by `threads` threads, one contiguous part each. */
static float stream_read(const float *buf, size_t bytes, int threads)
{
    float total = 0.0f;
    const size_t n = bytes / sizeof(v8);
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        v8 a = { 0 }, b = { 0 }, c = { 0 }, d = { 0 };
        const v8 *x = (const v8 *)buf;
#pragma omp for schedule(static)
        for (size_t i = 0; i < n; i += 4) {
            a += x[i];
            b += x[i + 1];
            c += x[i + 2];
            d += x[i + 3];
        }
        a += b + c + d;
        for (int i = 0; i < 8; i++)
            total += a[i];
    }
    return total;
}

static volatile float sink;
static size_t flush_bytes = (size_t)512 << 20;

/* Median GB/s of threads streaming BW_BYTES. */
static double read_bandwidth(int threads, int reps)
{
    float *buf = xalloc(BW_BYTES);
    memset(buf, 0, BW_BYTES);
    double gbs[64];
    sink = stream_read(buf, BW_BYTES, threads);
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        sink = stream_read(buf, BW_BYTES, threads);
        gbs[r] = (double)BW_BYTES / ((now_ms() - t0) * 1e6);
    }
    free(buf);
    return median(gbs, reps);
}

static uint64_t rng_state;

static float rnd(void) /* xorshift64*, uniform in [-1, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 2685821657736338717ull) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* n random halves, through a float row (ggml's own rounding). */
static void fill_f16(ggml_fp16_t *dst, size_t n)
{
    float row[4096];
    for (size_t i = 0; i < n; i += 4096) {
        size_t m = n - i < 4096 ? n - i : 4096;
        for (size_t j = 0; j < m; j++)
            row[j] = rnd();
        ggml_fp32_to_fp16_row(row, dst + i, (int64_t)m);
    }
}

static void check(fa_context_t ctx, fa_status st, const char *what)
{
    if (st != FA_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, fa_status_string(st), fa_context_last_error(ctx));
        exit(1);
    }
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        m = e > m ? e : m;
    }
    return m;
}

enum { RUN_GGML, RUN_DENSE, RUN_PAGED, RUNS };
static const char *run_names[RUNS] = { "ggml", "dense", "paged" };

typedef struct bench_case {
    struct ggml_cgraph *graph;
    struct ggml_cplan cplan;
    fa_context_t ctx;
    fa_attention_desc dense;
    fa_paged_plan_t plan;
    fa_paged_desc paged;
} bench_case;

static void run_one(bench_case *c, int which)
{
    if (which == RUN_GGML) {
        if (ggml_graph_compute(c->graph, &c->cplan) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "ggml_graph_compute failed\n");
            exit(1);
        }
    } else if (which == RUN_DENSE) {
        check(c->ctx, fa_forward(c->ctx, &c->dense), "fa_forward");
    } else {
        check(c->ctx, fa_paged_run(c->plan, &c->paged), "fa_paged_run");
    }
}

static void bench_shape(const shape *s, fa_context_t ctx, struct ggml_threadpool *tp, int threads,
                        int reps, uint64_t seed, double bw, const float *flush, int json)
{
    const int B = s->b, HQ = s->hq, HKV = s->hkv, KV = s->kv, D = s->d;
    const size_t nq = (size_t)B * HQ * D, nkv = (size_t)B * KV * HKV * D;
    const float scale = 1.0f / sqrtf((float)D);
    float *q32 = xalloc(nq * 4), *o[RUNS];
    ggml_fp16_t *q16 = xalloc(nq * 2), *k = xalloc(nkv * 2), *v = xalloc(nkv * 2);
    for (int r = 0; r < RUNS; r++) {
        o[r] = xalloc(nq * 4);
        memset(o[r], 0, nq * 4);
    }
    rng_state = seed;
    for (size_t i = 0; i < nq; i++)
        q32[i] = rnd();
    ggml_fp32_to_fp16_row(q32, q16, (int64_t)nq);
    fill_f16(k, nkv);
    fill_f16(v, nkv);

    /* The same keys in pages of 16 tokens, pages in shuffled order. */
    const int PAGE = 16, per_seq = (KV + PAGE - 1) / PAGE, pages = B * per_seq;
    const size_t page_elems = (size_t)PAGE * HKV * D;
    int32_t *table = xalloc(sizeof(int32_t) * (size_t)pages), *cu = xalloc(sizeof(int32_t) * (B + 1)),
            *lens = xalloc(sizeof(int32_t) * B);
    for (int i = 0; i < pages; i++)
        table[i] = i;
    for (int i = pages - 1; i > 0; i--) {
        int j = (int)(((rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull) >> 33) %
                      (uint64_t)(i + 1));
        int t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    ggml_fp16_t *pk = xalloc((size_t)pages * page_elems * 2), *pv = xalloc((size_t)pages * page_elems * 2);
    for (int b = 0; b < B; b++) {
        cu[b] = b;
        lens[b] = KV;
        for (int i = 0; i < per_seq; i++) {
            const size_t src = ((size_t)b * KV + (size_t)i * PAGE) * HKV * D;
            const size_t dst = (size_t)table[b * per_seq + i] * page_elems;
            const int tok = KV - i * PAGE < PAGE ? KV - i * PAGE : PAGE;
            memcpy(pk + dst, k + src, (size_t)tok * HKV * D * 2);
            memcpy(pv + dst, v + src, (size_t)tok * HKV * D * 2);
        }
    }
    cu[B] = B;

    bench_case c;
    memset(&c, 0, sizeof(c));
    c.ctx = ctx;
    /* ggml: q [D, HQ, 1, B] and k, v [D, HKV, KV, B] in memory, permuted to [D, rows, heads, B] */
    struct ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true };
    struct ggml_context *gctx = ggml_init(ip);
    struct ggml_tensor *gq = ggml_new_tensor_4d(gctx, GGML_TYPE_F32, D, HQ, 1, B);
    struct ggml_tensor *gk = ggml_new_tensor_4d(gctx, GGML_TYPE_F16, D, HKV, KV, B);
    struct ggml_tensor *gv = ggml_new_tensor_4d(gctx, GGML_TYPE_F16, D, HKV, KV, B);
    gq->data = q32;
    gk->data = k;
    gv->data = v;
    struct ggml_tensor *out =
        ggml_flash_attn_ext(gctx, ggml_permute(gctx, gq, 0, 2, 1, 3), ggml_permute(gctx, gk, 0, 2, 1, 3),
                            ggml_permute(gctx, gv, 0, 2, 1, 3), NULL, scale, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
    out->data = o[RUN_GGML]; /* [D, HQ, 1, B]: o[b][h][x], flashattn's BSHD with one row */
    c.graph = ggml_new_graph(gctx);
    ggml_build_forward_expand(c.graph, out);
    c.cplan = ggml_graph_plan(c.graph, threads, tp);
    void *work = xalloc(c.cplan.work_size + 64);
    c.cplan.work_data = work;

    fa_attention_desc *d = &c.dense;
    fa_attention_desc_init(d);
    d->batch = B;
    d->seqlen_q = 1;
    d->seqlen_k = KV;
    d->num_heads_q = HQ;
    d->num_heads_kv = HKV;
    d->head_dim = D;
    d->q = fa_tensor_contiguous(q16, FA_DTYPE_F16, FA_LAYOUT_BSHD, 1, HQ, D);
    d->k = fa_tensor_contiguous(k, FA_DTYPE_F16, FA_LAYOUT_BSHD, KV, HKV, D);
    d->v = fa_tensor_contiguous(v, FA_DTYPE_F16, FA_LAYOUT_BSHD, KV, HKV, D);
    d->o = fa_tensor_contiguous(o[RUN_DENSE], FA_DTYPE_F32, FA_LAYOUT_BSHD, 1, HQ, D);
    d->scale = scale;

    fa_paged_desc *pd = &c.paged;
    fa_paged_desc_init(pd);
    pd->batch = B;
    pd->total_q = B;
    pd->max_seqlen_q = 1;
    pd->max_seqlen_k = KV;
    pd->num_heads_q = HQ;
    pd->head_dim = D;
    pd->q = fa_tensor_contiguous(q16, FA_DTYPE_F16, FA_LAYOUT_BSHD, B, HQ, D);
    pd->o = fa_tensor_contiguous(o[RUN_PAGED], FA_DTYPE_F32, FA_LAYOUT_BSHD, B, HQ, D);
    pd->cu_seqlens_q = cu;
    pd->cache = fa_kv_cache_contiguous(pk, pv, FA_DTYPE_F16, FA_LAYOUT_BSHD, pages, PAGE, HKV, D);
    pd->block_table = table;
    pd->max_pages_per_seq = per_seq;
    pd->cache_seqlens = lens;
    pd->scale = scale;
    check(ctx, fa_paged_plan_create(ctx, pd, &c.plan), "fa_paged_plan_create");

    double ms[RUNS][64], turns[RUNS * 64];
    for (int w = 0; w < 2; w++) /* warm-up: page faults, thread pools, workspaces */
        for (int r = 0; r < RUNS; r++)
            run_one(&c, r);
    for (int rep = 0; rep < reps; rep++)
        for (int i = 0; i < RUNS; i++) {
            const int r = (rep + i) % RUNS;
            double t0 = now_ms();
            if (flush_bytes) { /* the eviction read, timed: the read rate in turns with the calls */
                sink = stream_read(flush, flush_bytes, threads);
                turns[rep * RUNS + i] = (double)flush_bytes / ((now_ms() - t0) * 1e6);
                t0 = now_ms();
            }
            run_one(&c, r);
            ms[r][rep] = now_ms() - t0;
        }
    /* the row's bandwidth: the eviction reads' median, else the probe before the shapes */
    const double probe = bw;
    if (flush_bytes)
        bw = median(turns, reps * RUNS);
    double med[RUNS], gbs[RUNS];
    const double kv_bytes = 2.0 * (double)nkv * 2.0;
    for (int r = 0; r < RUNS; r++) {
        med[r] = median(ms[r], reps);
        gbs[r] = kv_bytes / (med[r] * 1e6);
    }
    const double diff_dense = max_abs_diff(o[RUN_DENSE], o[RUN_GGML], nq);
    const double diff_paged = max_abs_diff(o[RUN_PAGED], o[RUN_GGML], nq);

    if (json) {
        printf("{\"shape\":{\"batch\":%d,\"heads_q\":%d,\"heads_kv\":%d,\"kv\":%d,\"head_dim\":%d},"
               "\"kv_bytes\":%.0f,\"seed\":%llu,\"reps\":%d,\"threads\":%d,\"flush_mib\":%zu,"
               "\"read_gbs\":%.2f,\"probe_gbs\":%.2f",
               B, HQ, HKV, KV, D, kv_bytes, (unsigned long long)seed, reps, threads, flush_bytes >> 20, bw,
               probe);
        for (int r = 0; r < RUNS; r++)
            printf(",\"%s_ms\":%.4f,\"%s_gbs\":%.2f", run_names[r], med[r], run_names[r], gbs[r]);
        printf(",\"dense_vs_ggml\":%.4f,\"paged_vs_ggml\":%.4f,\"max_abs_diff_dense\":%.3e,"
               "\"max_abs_diff_paged\":%.3e}\n",
               med[RUN_GGML] / med[RUN_DENSE], med[RUN_GGML] / med[RUN_PAGED], diff_dense, diff_paged);
    } else {
        printf("b%d h%d/%d kv%-6d d%d %7.1f MB | bw %5.1f GB/s | ggml %8.3f ms %5.1f GB/s %3.0f%% | dense %8.3f ms "
               "%5.1f GB/s %3.0f%% %5.2fx | paged %8.3f ms %5.1f GB/s %3.0f%% %5.2fx | diff %.1e %.1e "
               "seed %llu\n",
               B, HQ, HKV, KV, D, kv_bytes / 1e6, bw, med[RUN_GGML], gbs[RUN_GGML], 100 * gbs[RUN_GGML] / bw,
               med[RUN_DENSE], gbs[RUN_DENSE], 100 * gbs[RUN_DENSE] / bw, med[RUN_GGML] / med[RUN_DENSE],
               med[RUN_PAGED], gbs[RUN_PAGED], 100 * gbs[RUN_PAGED] / bw, med[RUN_GGML] / med[RUN_PAGED],
               diff_dense, diff_paged, (unsigned long long)seed);
    }
    fflush(stdout);

    fa_paged_plan_destroy(c.plan);
    ggml_free(gctx);
    free(work);
    free(pk);
    free(pv);
    free(table);
    free(cu);
    free(lens);
    for (int r = 0; r < RUNS; r++)
        free(o[r]);
    free(q32);
    free(q16);
    free(k);
    free(v);
}

int main(int argc, char **argv)
{
    int json = 0, reps = 11, threads = 2, nshapes = 0;
    uint64_t seed = 20261202;
    shape shapes[MAX_SHAPES];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--flush-mib") && i + 1 < argc)
            flush_bytes = (size_t)atoi(argv[++i]) << 20;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && nshapes < MAX_SHAPES) {
            shape *s = &shapes[nshapes++];
            if (sscanf(argv[++i], "%d,%d,%d,%d,%d", &s->b, &s->hq, &s->hkv, &s->kv, &s->d) != 5 ||
                s->b < 1 || s->hkv < 1 || s->hq % s->hkv || s->kv < 1 || s->d < 1 || s->d > 256) {
                fprintf(stderr, "--shape B,HQ,HKV,KV,D (HQ a multiple of HKV)\n");
                return 2;
            }
        } else {
            fprintf(stderr,
                    "usage: %s [--json] [--reps N] [--threads T] [--seed S] [--flush-mib M] "
                    "[--shape B,HQ,HKV,KV,D]...\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 64 || threads < 1) {
        fprintf(stderr, "--reps 1..64, --threads >= 1\n");
        return 2;
    }
    if (!nshapes) /* h32 d128, MHA and GQA 32/8, 4k and 16k keys, batch 1 and 4 */
        for (int kv = 4096; kv <= 16384; kv *= 4)
            for (int b = 1; b <= 4; b *= 4)
                for (int hkv = 32; hkv >= 8; hkv /= 4)
                    shapes[nshapes++] = (shape){ b, 32, hkv, kv, 128 };

    ggml_cpu_init();
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *tp = ggml_threadpool_new(&tpp);
    fa_context_options opts = { sizeof(opts), FA_BACKEND_CPU, threads };
    fa_context_t ctx;
    if (fa_context_create(&opts, &ctx) != FA_OK) {
        fprintf(stderr, "fa_context_create: %s\n", fa_last_create_error());
        return 1;
    }
    float *flush = xalloc(flush_bytes ? flush_bytes : 64);
    memset(flush, 0, flush_bytes);
    const double bw = read_bandwidth(threads, 9);
    if (json)
        printf("{\"read_gbs\":%.2f,\"read_bytes\":%zu,\"threads\":%d,\"seed\":%llu,\"reps\":%d}\n", bw,
               BW_BYTES, threads, (unsigned long long)seed, reps);
    else
        printf("read bandwidth: %.1f GB/s (%d threads, %zu MiB, median of 9); seed %llu, %d reps, "
               "flush %zu MiB before each call\n",
               bw, threads, BW_BYTES >> 20, (unsigned long long)seed, reps, flush_bytes >> 20);
    for (int i = 0; i < nshapes; i++)
        bench_shape(&shapes[i], ctx, tp, threads, reps, seed + (uint64_t)i, bw, flush, json);
    free(flush);
    fa_context_destroy(ctx);
    ggml_threadpool_free(tp);
    return 0;
}
