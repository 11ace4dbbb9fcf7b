/* SPDX-License-Identifier: MIT */
/*
 * `flashattn bench --paged`: serving calls (decode, speculative rows, a decode batch with a
 * chunked-prefill sequence in it) over a paged KV cache with a shuffled page table. Per
 * row: the median time, the GB/s of the bytes the call must move and their share of the
 * memory bandwidth measured in the same run, the time against the same keys in a
 * contiguous cache, and the error against the float64 paged reference.
 */
#include "cli.h"
#include "paged.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *help =
    "usage: flashattn bench --paged [options]\n"
    "\n"
    "Times fa_paged_run (plan made once) over a paged KV cache, NHD pages ([page, token,\n"
    "head, dim], K and V apart) in a shuffled page table, every sequence holding --seq\n"
    "cached keys and asking --seq-q query rows (causal, nothing appended). Per row: the\n"
    "kernel, median ms after warm-up, GB/s of the bytes the call must move (K and V of\n"
    "every key once per kv head, plus q and o), their share of the memory bandwidth\n"
    "measured in the same run (CPU: threads reading 1 GiB; GPU: a 1 GiB fa_memory_copy,\n"
    "read + write bytes), paged / contiguous time (the same keys in one page per\n"
    "sequence, timed in turns with the paged call), and the error against float64 (max\n"
    "abs, relative L2; a sample of sequences and kv heads where the full check is long).\n"
    "Before each timed call a buffer larger than the caches is read (CPU) or copied (GPU),\n"
    "so keys come from memory as they do between a model's layers.\n"
    "With no shape options it runs the default suite: h32 d128, batch x kv length x kv\n"
    "heads, page 16, plus page sizes 1 and 256, speculative rows and a mixed batch at one\n"
    "shape each (CPU: batch 1,4, kv 4096,16384, MHA and GQA 32/8, under a minute on 2\n"
    "cores; CUDA: batch 8,32, kv 4096,32768). A shape option replaces the suite by the\n"
    "product of the lists, the others at the defaults below.\n"
    "\n"
    "shape:\n"
    "  --page-size N[,N...]  tokens per page                      [16]\n"
    "  --batch N[,N...]      decode sequences                      [1,4; 8,32 on cuda]\n"
    "  --seq N[,N...]        each sequence's kv length (cached keys) [4096,16384;\n"
    "                                                               4096,32768 on cuda]\n"
    "  --seq-q N             query rows per sequence: 1 decode, a few speculative [1]\n"
    "  --mix P               after each row, a mixed row: the same batch plus one\n"
    "                        chunked-prefill sequence of P query rows over --seq keys\n"
    "                        (0 = none)                            [0]\n"
    "  --heads N             query heads                           [32]\n"
    "  --kv-heads N[,N...]   kv heads, each dividing --heads   [heads,8; heads if 8 does not divide it]\n"
    "  --dim N               head_dim, 1..256                      [128]\n"
    "  --dtype f16|bf16|f32  q, cache and o (CUDA paged calls: f16, bf16) [f16; bf16 on cuda]\n"
    "run:\n"
    "  --backend auto|cpu|cuda                                     [auto]\n"
    "  --threads N           0 = all cores                         [0]\n"
    "  --reps N              timed runs per call (median)          [adaptive, >= 3]\n"
    "  --warm                no eviction between calls: keys stay in the caches where they fit\n"
    "output:\n"
    "  --json FILE|-         one JSON object per row (JSON lines)\n";

#define MAXV 16
#define MAX_ROWS 256
#define BW_BYTES ((size_t)1 << 30)     /* the bandwidth probe's buffer */
#define EVICT_CPU (BW_BYTES / 2) /* read between CPU calls: past any last-level cache share */
#define CHECK_WORK 2e8                 /* float64 multiply-adds the error check may spend */

typedef struct popts {
    long pages[MAXV], batches[MAXV], seqs[MAXV], kv_heads[MAXV];
    int npages, nbatches, nseqs, nkv;
    long seq_q, mix, heads, dim, reps, threads;
    fa_dtype dtype;
    int dtype_given, shape_given, warm;
    fa_backend backend;
    const char *json;
} popts;

/* One row: sequences of `seq` keys, `seq_q` query rows each, plus one of `mix` rows. */
typedef struct spec {
    long page, batch, seq, seq_q, mix, hk;
} spec;

typedef struct prow {
    spec s;
    const char *backend, *kernel;
    int threads;
    uint64_t bytes, workspace;
    double ms, ms_contig, gbs, bw_gbs, pct, gflops;
    double max_err, rel_l2;
    int checked, check_total; /* (sequence, kv head) pairs checked against float64, of all */
} prow;

/* The memory bandwidth of this run: CPU threads reading a buffer, or the GPU copy rate. The
 * eviction before each timed call is a probe too: its rates, taken in turns with the row's
 * calls, give the row's bandwidth, so that a shared machine's slow spells fall on both. */
typedef struct bandwidth {
    fa_context_t ctx;
    int gpu, threads;
    void *a, *b; /* probe buffers: host (a) on the CPU; device a -> b on the GPU */
    double gbs;  /* before the first row: median of 9 */
    double samples[2 * 64 + 2];
    int n_samples, turn;
} bandwidth;

/* A read of the buffer loads one word per 64-byte line: the memory system moves whole lines,
 * so this is its delivery rate, which no instruction set's load width caps (full-width SSE2
 * reads of every word reach 60% of it on a 2-core AVX-512 guest). */
typedef struct reader {
    const uint64_t *p;
    size_t n; /* words */
    uint64_t sum;
} reader;

static void *read_part(void *arg)
{
    reader *r = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 32 <= r->n; i += 32) {
        a += r->p[i];
        b += r->p[i + 8];
        c += r->p[i + 16];
        d += r->p[i + 24];
    }
    r->sum = a + b + c + d;
    return NULL;
}

static volatile uint64_t read_sink;

/* buf read by `threads` threads, one contiguous part each. */
static void read_buffer(const void *buf, size_t bytes, int threads)
{
    reader r[FA_MAX_THREADS];
    pthread_t t[FA_MAX_THREADS];
    int started[FA_MAX_THREADS] = { 0 };
    const size_t n = bytes / 8, part = (n / (size_t)threads + 31) / 32 * 32;
    for (int i = 0; i < threads; i++) {
        const size_t lo = (size_t)i * part < n ? (size_t)i * part : n;
        r[i] = (reader){ (const uint64_t *)buf + lo, lo + part < n ? part : n - lo, 0 };
        started[i] = i > 0 && pthread_create(&t[i], NULL, read_part, &r[i]) == 0;
    }
    uint64_t sum = 0;
    for (int i = 0; i < threads; i++) {
        if (started[i])
            pthread_join(t[i], NULL);
        else
            read_part(&r[i]); /* the calling thread's part, or one no thread could take */
        sum += r[i].sum;
    }
    read_sink = sum;
}

/* Read (CPU) or copy (GPU) more than any cache holds: the next call finds nothing of its own
 * data there. */
static void evict(void *arg)
{
    bandwidth *bw = arg;
    const double t0 = cli_now();
    if (bw->gpu) {
        fa_memory_copy(bw->ctx, bw->b, bw->a, BW_BYTES);
    } else { /* the halves of the buffer in turn */
        read_buffer((char *)bw->a + (bw->turn++ % 2) * EVICT_CPU, EVICT_CPU, bw->threads);
    }
    const double gbs = (bw->gpu ? 2.0 * BW_BYTES : (double)EVICT_CPU) / (cli_now() - t0) / 1e9;
    if (bw->n_samples < (int)(sizeof(bw->samples) / sizeof(bw->samples[0])))
        bw->samples[bw->n_samples++] = gbs;
}

/* The CPU threads of ctx ("cpu.threads: N" in its description), 1 when it does not say. */
static int context_threads(fa_context_t ctx)
{
    char info[16384];
    if (fa_context_info(ctx, info, sizeof(info), NULL) != FA_OK)
        return 1;
    const char *at = strstr(info, "cpu.threads: ");
    const int n = at ? atoi(at + strlen("cpu.threads: ")) : 1;
    return n < 1 ? 1 : n > FA_MAX_THREADS ? FA_MAX_THREADS : n;
}

/* The probe, with every thread of the context: median GB/s of 9 after one warm-up. 0, or
 * CLI_EXIT_FAIL after saying why. */
static int bw_measure(bandwidth *bw)
{
    bw->threads = bw->gpu ? 1 : context_threads(bw->ctx);
    if (bw->gpu) {
        if (fa_memory_alloc(bw->ctx, BW_BYTES, &bw->a) != FA_OK ||
            fa_memory_alloc(bw->ctx, BW_BYTES, &bw->b) != FA_OK) {
            fprintf(stderr, "flashattn bench: the copy-rate probe: %s\n", fa_context_last_error(bw->ctx));
            return CLI_EXIT_FAIL;
        }
    } else {
        if (!(bw->a = malloc(BW_BYTES))) {
            fprintf(stderr, "flashattn bench: out of memory for the 1 GiB read-bandwidth probe\n");
            return CLI_EXIT_FAIL;
        }
        /* written words, not zeros: the compiler may turn malloc + memset(0) into calloc,
         * whose untouched pages are all the one zero page (read at 86 GB/s here, against
         * 28 GB/s for memory), which measures nothing and evicts nothing */
        uint64_t *w = bw->a;
        for (size_t i = 0; i < BW_BYTES / 8; i++)
            w[i] = i * 0x9e3779b97f4a7c15ull;
    }
    double gbs[10];
    for (int i = 0; i < 10; i++) {
        const double t0 = cli_now();
        if (bw->gpu) {
            if (fa_memory_copy(bw->ctx, bw->b, bw->a, BW_BYTES) != FA_OK) {
                fprintf(stderr, "flashattn bench: the copy-rate probe: %s\n", fa_context_last_error(bw->ctx));
                return CLI_EXIT_FAIL;
            }
        } else {
            read_buffer(bw->a, BW_BYTES, bw->threads);
        }
        gbs[i] = (bw->gpu ? 2.0 : 1.0) * (double)BW_BYTES / (cli_now() - t0) / 1e9;
    }
    bw->gbs = cli_median(gbs + 1, 9);
    return 0;
}

static void bw_free(bandwidth *bw)
{
    if (bw->gpu) {
        fa_memory_free(bw->ctx, bw->a);
        fa_memory_free(bw->ctx, bw->b);
    } else {
        free(bw->a);
    }
}

/* n random values of dtype t, uniform on a grid of 65536 in [-1, 1): a table of their
 * encodings indexed by 16 random bits, fast enough for caches of billions of elements. */
static void fill(fa_dtype t, void *p, int64_t n, uint64_t seed)
{
    static float f32[65536];
    static uint16_t f16[65536], bf16[65536];
    static int made;
    if (!made) {
        for (int i = 0; i < 65536; i++) {
            const double x = (i - 32768) / 32768.0;
            f32[i] = (float)x;
            fa_ref_encode(FA_DTYPE_F16, f16, i, x);
            fa_ref_encode(FA_DTYPE_BF16, bf16, i, x);
        }
        made = 1;
    }
    fa_rng r = { seed };
    const uint16_t *h = t == FA_DTYPE_F16 ? f16 : bf16;
    for (int64_t i = 0; i < n; i += 4) {
        uint64_t bits = fa_rng_next(&r);
        for (int64_t j = i; j < i + 4 && j < n; j++, bits >>= 16) {
            if (t == FA_DTYPE_F32)
                ((float *)p)[j] = f32[bits & 0xffff];
            else
                ((uint16_t *)p)[j] = h[bits & 0xffff];
        }
    }
}

/* The buffers of one row: q, o (the paged call's), oc (the contiguous call's), the contiguous
 * cache, the paged pools, the small arrays; the pools and oc only in backend memory. */
enum { Q, O, OC, CK, CV, PK, PV, CU, BT, BTC, LENS, N_BUF };

typedef struct bufs {
    void *host[N_BUF], *dev[N_BUF];
    size_t bytes[N_BUF];
} bufs;

typedef struct paged_call {
    fa_context_t ctx;
    fa_paged_plan_t plan;
    const fa_paged_desc *d;
} paged_call;

static int run_paged(void *arg)
{
    paged_call *c = arg; /* synchronised: the CUDA queue is timed to completion */
    return fa_paged_run(c->plan, c->d) == FA_OK && fa_context_synchronize(c->ctx) == FA_OK ? 0 : -1;
}

static size_t esize(fa_dtype t) { return t == FA_DTYPE_F32 ? 4 : 2; }

/* Sequences of a row (the prefill one last), pages of each, query rows. */
static long row_seqs(const spec *s) { return s->batch + (s->mix > 0); }
static long row_pages(const spec *s) { return (s->seq + s->page - 1) / s->page; }
static long row_q(const spec *s) { return s->batch * s->seq_q + s->mix; }

/* The bytes of a row's buffers (host and backend copies of the cache, the contiguous copy):
 * -1 when they do not fit in a size_t. */
static int row_sizes(const popts *o, const spec *s, size_t *cache, size_t *pool, double *host)
{
    const int64_t seqs = row_seqs(s), es = (int64_t)esize(o->dtype);
    size_t q;
    if (cli_size(cache, (const int64_t[]){ seqs, s->seq, s->hk, o->dim, es }, 5) ||
        cli_size(pool, (const int64_t[]){ seqs, row_pages(s), s->page, s->hk, o->dim, es }, 6) ||
        cli_size(&q, (const int64_t[]){ row_q(s), o->heads, o->dim, es }, 4) ||
        (uint64_t)seqs * (uint64_t)row_pages(s) > INT32_MAX || (uint64_t)row_q(s) > INT32_MAX)
        return -1;
    /* on the host: the contiguous cache, q and o; on a host backend (where they are the
     * backend's) also the pools, the second o and the probe's buffer */
    *host = 2.0 * (double)*cache + 2.0 * (double)q;
    if (o->backend != FA_BACKEND_CUDA)
        *host += 2.0 * (double)*pool + (double)q + (double)BW_BYTES;
    return 0;
}

static void desc_common(const popts *o, const spec *s, fa_paged_desc *d)
{
    fa_paged_desc_init(d);
    d->batch = (int32_t)row_seqs(s);
    d->total_q = (int32_t)row_q(s);
    d->max_seqlen_q = (int32_t)(s->mix > s->seq_q ? s->mix : s->seq_q);
    d->max_seqlen_k = (int32_t)s->seq;
    d->num_heads_q = (int32_t)o->heads;
    d->head_dim = (int32_t)o->dim;
    d->q = fa_tensor_contiguous(NULL, o->dtype, FA_LAYOUT_BSHD, d->total_q, d->num_heads_q, d->head_dim);
    d->o = d->q;
    d->causal = 1;
}

/* Errors of o (host, the paged call's) against float64 on (sequence, kv head) pairs, the
 * prefill sequence and sequence 0 first, while their multiply-adds stay within CHECK_WORK.
 * host_d: the contiguous call on host memory. */
static void check_errors(const fa_paged_desc *host_d, const void *ck, const void *cv, const void *o,
                         long hk, prow *r)
{
    const int32_t seqs = host_d->batch, hq = host_d->num_heads_q, dim = host_d->head_dim, group = hq / (int32_t)hk;
    const fa_dtype dt = host_d->q.dtype;
    const int64_t es = (int64_t)esize(dt);
    double mx = 0.0, num = 0.0, den = 0.0, work = 0.0;
    r->checked = 0;
    r->check_total = seqs * (int32_t)hk;
    for (int32_t i = 0; i < seqs; i++) {
        const int32_t b = i == 0 ? seqs - 1 : i - 1; /* the last (prefill, if any) first */
        const int64_t q0 = host_d->cu_seqlens_q[b], qn = host_d->cu_seqlens_q[b + 1] - q0;
        const int64_t keys = host_d->cache_seqlens[b];
        for (int32_t j = 0; j < hk; j++) {
            const int32_t g = j % 2 ? (int32_t)hk - 1 - j / 2 : j / 2; /* 0, last, 1, ... */
            const double w = 2.0 * (double)keys * dim * group * (double)qn;
            if (r->checked >= 2 && work + w > CHECK_WORK)
                goto done;
            /* one sequence and one kv head with its query heads, as a call of its own */
            fa_paged_desc d = *host_d;
            d.batch = 1;
            d.total_q = (int32_t)qn;
            d.num_heads_q = group;
            d.cu_seqlens_q = (const int32_t[]){ 0, (int32_t)qn };
            d.q.data = (char *)host_d->q.data + (q0 * host_d->q.stride_seq + (int64_t)g * group * dim) * es;
            d.cache.num_heads = 1;
            d.block_table = host_d->block_table + b;
            d.cache_seqlens = host_d->cache_seqlens + b;
            const int64_t koff = (int64_t)g * host_d->cache.k_stride_head * es;
            double *ref = malloc(sizeof(double) * (size_t)(qn * group * dim));
            double *lse = malloc(sizeof(double) * (size_t)(qn * group));
            if (!ref || !lse ||
                fa_ref_paged(&d, (const char *)ck + koff, (const char *)cv + koff, ref, lse, NULL, NULL)) {
                free(ref);
                free(lse);
                goto done;
            }
            for (int64_t row = 0; row < qn; row++)
                for (int32_t h = 0; h < group; h++)
                    for (int32_t x = 0; x < dim; x++) {
                        const double want = ref[(row * group + h) * dim + x];
                        const int64_t at = (q0 + row) * host_d->o.stride_seq + ((int64_t)g * group + h) * dim + x;
                        const double e = fabs(fa_ref_decode(dt, o, at) - want);
                        mx = e > mx || isnan(e) ? e : mx;
                        num += e * e;
                        den += want * want;
                    }
            free(ref);
            free(lse);
            work += w;
            r->checked++;
        }
    }
done:
    r->max_err = r->checked ? mx : NAN;
    r->rel_l2 = r->checked ? (den > 0 ? sqrt(num / den) : sqrt(num)) : NAN;
}

static int api_fail(fa_context_t ctx, const spec *s)
{
    fprintf(stderr, "flashattn bench: page %ld, b %ld, kv %ld, hkv %ld: %s\n", s->page, s->batch, s->seq,
            s->hk, fa_context_last_error(ctx));
    return CLI_EXIT_FAIL;
}

static int run_row(fa_context_t ctx, const popts *o, const spec *s, bandwidth *bw, prow *r)
{
    memset(r, 0, sizeof(*r));
    r->s = *s;
    size_t cache_bytes, pool_bytes;
    double host_bytes;
    if (row_sizes(o, s, &cache_bytes, &pool_bytes, &host_bytes) != 0)
        return CLI_EXIT_FAIL; /* checked before the first row */
    const int32_t seqs = (int32_t)row_seqs(s), pages = (int32_t)row_pages(s), ps = (int32_t)s->page;
    const int32_t total_q = (int32_t)row_q(s), num_pages = seqs * pages, hk = (int32_t)s->hk;
    const int32_t dim = (int32_t)o->dim, seq = (int32_t)s->seq;
    const size_t es = esize(o->dtype), q_bytes = (size_t)total_q * (size_t)o->heads * (size_t)dim * es;
    const size_t token_bytes = (size_t)hk * (size_t)dim * es;
    bufs B = { 0 };
    const size_t bytes[N_BUF] = { q_bytes, q_bytes, q_bytes, cache_bytes, cache_bytes, pool_bytes, pool_bytes,
                                  4 * (size_t)(seqs + 1), 4 * (size_t)num_pages, 4 * (size_t)seqs,
                                  4 * (size_t)seqs };
    memcpy(B.bytes, bytes, sizeof(bytes));
    int rc = CLI_EXIT_FAIL;
    fa_paged_plan_t plan = NULL, plan_c = NULL;
    void *stage = NULL;
    /* a host backend's memory is the host image itself; elsewhere the pools and oc have none */
    const int host_backend = fa_context_backend(ctx) == FA_BACKEND_CPU;
    for (int i = 0; i < N_BUF; i++) {
        if (fa_memory_alloc(ctx, bytes[i], &B.dev[i]) != FA_OK) {
            rc = api_fail(ctx, s);
            goto done;
        }
        if (host_backend)
            B.host[i] = B.dev[i];
        else if (i != OC && i != PK && i != PV && !(B.host[i] = malloc(bytes[i] ? bytes[i] : 1))) {
            fprintf(stderr, "flashattn bench: out of memory for page %ld, b %ld, kv %ld\n", s->page,
                    s->batch, s->seq);
            goto done;
        }
    }
    const uint64_t seed = (uint64_t)(s->page * 1000003 + s->batch * 7919 + s->seq * 31 + s->hk + s->mix);
    fill(o->dtype, B.host[Q], (int64_t)(q_bytes / es), seed);
    fill(o->dtype, B.host[CK], (int64_t)(cache_bytes / es), seed + 1);
    fill(o->dtype, B.host[CV], (int64_t)(cache_bytes / es), seed + 2);
    int32_t *cu = B.host[CU], *bt = B.host[BT], *btc = B.host[BTC], *lens = B.host[LENS];
    cu[0] = 0;
    for (int32_t b = 0; b < seqs; b++) {
        cu[b + 1] = cu[b] + (int32_t)(b < s->batch ? s->seq_q : s->mix);
        lens[b] = seq;
        btc[b] = b; /* the contiguous cache: one page of `seq` tokens per sequence */
    }
    /* pages in shuffled order: no sequence's pages are contiguous or ascending */
    fa_rng rng = { seed + 3 };
    for (int32_t i = 0; i < num_pages; i++)
        bt[i] = i;
    for (int32_t i = num_pages - 1; i > 0; i--) {
        const int32_t j = (int32_t)(fa_rng_next(&rng) % (uint64_t)(i + 1)), t = bt[i];
        bt[i] = bt[j];
        bt[j] = t;
    }
    for (int i = 0; i < N_BUF; i++)
        if (B.host[i] && B.host[i] != B.dev[i] && i != O &&
            fa_memory_upload(ctx, B.dev[i], B.host[i], bytes[i]) != FA_OK) {
            rc = api_fail(ctx, s);
            goto done;
        }
    /* the paged pools from the contiguous cache, through a host stage of whole pages: page p
     * holds tokens (i % pages) * ps .. of sequence i / pages where bt[i] = p */
    int32_t *owner = malloc(sizeof(int32_t) * (size_t)num_pages);
    const int32_t stage_pages = (int32_t)fmax(1.0, fmin((double)num_pages, (double)(64 << 20) / ((double)ps * (double)token_bytes)));
    const size_t page_bytes = (size_t)ps * token_bytes;
    stage = malloc(page_bytes * (size_t)stage_pages);
    if (!owner || !stage) {
        free(owner);
        fprintf(stderr, "flashattn bench: out of memory building the page pool\n");
        goto done;
    }
    for (int32_t i = 0; i < num_pages; i++)
        owner[bt[i]] = i;
    for (int kv = 0; kv < 2; kv++) {
        const char *src = B.host[kv ? CV : CK];
        for (int32_t p0 = 0; p0 < num_pages; p0 += stage_pages) {
            const int32_t n = num_pages - p0 < stage_pages ? num_pages - p0 : stage_pages;
            memset(stage, 0, page_bytes * (size_t)n);
            for (int32_t p = p0; p < p0 + n; p++) {
                const int32_t b = owner[p] / pages, t0 = (owner[p] % pages) * ps;
                const int32_t tokens = seq - t0 < ps ? seq - t0 : ps;
                memcpy((char *)stage + (size_t)(p - p0) * page_bytes,
                       src + ((size_t)b * (size_t)seq + (size_t)t0) * token_bytes, (size_t)tokens * token_bytes);
            }
            if (fa_memory_upload(ctx, (char *)B.dev[kv ? PV : PK] + (size_t)p0 * page_bytes, stage,
                                 page_bytes * (size_t)n) != FA_OK) {
                free(owner);
                rc = api_fail(ctx, s);
                goto done;
            }
        }
    }
    free(owner);

    fa_paged_desc d, dc, host_dc;
    desc_common(o, s, &d);
    d.q.data = B.dev[Q];
    d.o.data = B.dev[O];
    d.cu_seqlens_q = B.dev[CU];
    d.cache_seqlens = B.dev[LENS];
    dc = d;
    d.cache = fa_kv_cache_contiguous(B.dev[PK], B.dev[PV], o->dtype, FA_LAYOUT_BSHD, num_pages, ps, hk, dim);
    d.block_table = B.dev[BT];
    d.max_pages_per_seq = pages;
    dc.cache = fa_kv_cache_contiguous(B.dev[CK], B.dev[CV], o->dtype, FA_LAYOUT_BSHD, seqs, seq, hk, dim);
    dc.block_table = B.dev[BTC];
    dc.max_pages_per_seq = 1;
    dc.o.data = B.dev[OC];
    fa_run_info ri = { .size = sizeof(ri) };
    if (fa_paged_plan_create(ctx, &d, &plan) != FA_OK || fa_paged_plan_info(plan, &ri) != FA_OK ||
        fa_paged_plan_create(ctx, &dc, &plan_c) != FA_OK) {
        rc = api_fail(ctx, s);
        goto done;
    }
    r->backend = ri.backend_name;
    r->kernel = ri.kernel;
    r->threads = ri.threads;
    r->workspace = ri.workspace_bytes;
    paged_call calls[2] = { { ctx, plan, &d }, { ctx, plan_c, &dc } };
    void *const arg[2] = { &calls[0], &calls[1] };
    double ms[2];
    bw->n_samples = 0;
    if (cli_time_turns_evict(run_paged, arg, 2, o->reps, o->warm ? NULL : evict, bw, ms) != 0 ||
        (B.host[O] != B.dev[O] && fa_memory_download(ctx, B.host[O], B.dev[O], q_bytes) != FA_OK)) {
        rc = api_fail(ctx, s);
        goto done;
    }
    r->ms = ms[0];
    r->ms_contig = ms[1];
    /* K and V of every key once per kv head, q read, o written */
    r->bytes = 2 * (uint64_t)cache_bytes + 2 * (uint64_t)q_bytes;
    r->gbs = (double)r->bytes / (r->ms * 1e-3) / 1e9;
    r->bw_gbs = bw->n_samples ? cli_median(bw->samples, bw->n_samples) : bw->gbs;
    r->pct = 100.0 * r->gbs / r->bw_gbs;
    double flops = 0.0; /* causal, bottom-right: row i of n sees keys - n + i + 1 keys */
    for (int32_t b = 0; b < seqs; b++) {
        const double n = cu[b + 1] - cu[b];
        flops += 4.0 * (double)o->heads * (double)dim * (n * seq - n * (n - 1) / 2);
    }
    r->gflops = flops / (r->ms * 1e-3) / 1e9;
    host_dc = dc;
    host_dc.q.data = B.host[Q];
    host_dc.cu_seqlens_q = cu;
    host_dc.cache_seqlens = lens;
    host_dc.block_table = btc;
    check_errors(&host_dc, B.host[CK], B.host[CV], B.host[O], s->hk, r);
    rc = 0;
done:
    fa_paged_plan_destroy(plan);
    fa_paged_plan_destroy(plan_c);
    free(stage);
    for (int i = 0; i < N_BUF; i++) {
        if (B.host[i] != B.dev[i])
            free(B.host[i]);
        fa_memory_free(ctx, B.dev[i]);
    }
    return rc;
}

static void print_header(FILE *f)
{
    fprintf(f, "%-4s %-22s %4s %3s %-7s %6s %3s %3s %4s %-4s %8s %7s %7s %5s %8s %7s %8s %8s %8s\n", "be",
            "kernel", "page", "b", "q", "kv", "h", "hkv", "d", "type", "ms", "GB/s", "bw", "%bw", "GFLOP/s",
            "paged/c", "MB", "max_err", "rel_l2");
}

static void print_row(FILE *f, const popts *o, const prow *r)
{
    char q[24];
    if (r->s.mix)
        snprintf(q, sizeof(q), "%ld+%ld", r->s.seq_q, r->s.mix);
    else
        snprintf(q, sizeof(q), "%ld", r->s.seq_q);
    fprintf(f, "%-4s %-22s %4ld %3ld %-7s %6ld %3ld %3ld %4ld %-4s %8.3f %7.1f %7.1f %4.0f%% %8.1f %6.2fx %8.1f "
               "%8.1e %8.1e%s\n",
            r->backend, r->kernel, r->s.page, r->s.batch, q, r->s.seq, o->heads, r->s.hk, o->dim,
            cli_dtype_name(o->dtype), r->ms, r->gbs, r->bw_gbs, r->pct, r->gflops, r->ms / r->ms_contig,
            (double)r->bytes / 1e6, r->max_err, r->rel_l2, r->checked < r->check_total ? " *" : "");
    fflush(f);
}

static void json_row(FILE *f, const popts *o, const prow *r, const bandwidth *bw)
{
    fprintf(f,
            "{\"backend\":\"%s\",\"kernel\":\"%s\",\"page_size\":%ld,\"batch\":%ld,\"seq_q\":%ld,"
            "\"mix\":%ld,\"seq_k\":%ld,\"heads\":%ld,\"kv_heads\":%ld,\"head_dim\":%ld,\"dtype\":\"%s\","
            "\"threads\":%d,\"warm\":%s,\"ms\":%.6f,\"ms_contiguous\":%.6f,\"paged_over_contiguous\":%.4f,"
            "\"bytes\":%llu,\"gbs\":%.3f,\"bandwidth_gbs\":%.3f,\"bandwidth_kind\":\"%s\","
            "\"pct_bandwidth\":%.2f,\"gflops\":%.3f,\"workspace_bytes\":%llu,",
            r->backend, r->kernel, r->s.page, r->s.batch, r->s.seq_q, r->s.mix, r->s.seq, o->heads, r->s.hk,
            o->dim, cli_dtype_name(o->dtype), r->threads, o->warm ? "true" : "false", r->ms, r->ms_contig,
            r->ms / r->ms_contig, (unsigned long long)r->bytes, r->gbs, r->bw_gbs,
            bw->gpu ? "copy" : "read", r->pct, r->gflops, (unsigned long long)r->workspace);
    if (r->checked)
        fprintf(f, "\"max_abs_err\":%.6g,\"rel_l2_err\":%.6g,", r->max_err, r->rel_l2);
    else
        fprintf(f, "\"max_abs_err\":null,\"rel_l2_err\":null,");
    fprintf(f, "\"err_pairs_checked\":%d,\"err_pairs\":%d}\n", r->checked, r->check_total);
    fflush(f);
}

static int parse(int argc, char **argv, popts *o)
{
    memset(o, 0, sizeof(*o));
    o->pages[0] = 16;
    o->npages = 1;
    o->seq_q = 1;
    o->heads = 32;
    o->dim = 128;
    o->dtype = FA_DTYPE_F16;
    o->backend = FA_BACKEND_AUTO;
    enum { PAGED, PAGE, BATCH, SEQ, SEQ_Q, MIX, HEADS, KV_HEADS, DIM, DTYPE, REPS, WARM, JSON, N_OPTIONS };
    static const cli_option options[N_OPTIONS] = {
        [PAGED] = { "--paged", 0 },      [PAGE] = { "--page-size", 1 }, [BATCH] = { "--batch", 1 },
        [SEQ] = { "--seq", 1 },          [SEQ_Q] = { "--seq-q", 1 },    [MIX] = { "--mix", 1 },
        [HEADS] = { "--heads", 1 },      [KV_HEADS] = { "--kv-heads", 1 }, [DIM] = { "--dim", 1 },
        [DTYPE] = { "--dtype", 1 },      [REPS] = { "--reps", 1 },      [WARM] = { "--warm", 0 },
        [JSON] = { "--json", 1 },
    };
    cli_args args = { "bench", help, argc, argv, options, N_OPTIONS, &o->backend, &o->threads, 0 };
    int opt, rc;
    const char *v;
    while ((rc = cli_next_option(&args, &opt, &v)) == 1) {
        switch (opt) {
        case PAGED:
            break;
        case PAGE:
            if ((o->npages = cli_parse_int_list(v, 1, 1 << 20, o->pages, MAXV)) < 0)
                return cli_usage_error("bench", "--page-size needs up to %d sizes in 1..1048576, "
                                                "comma-separated", MAXV);
            o->shape_given = 1;
            break;
        case BATCH:
            if ((o->nbatches = cli_parse_int_list(v, 1, 65536, o->batches, MAXV)) < 0)
                return cli_usage_error("bench", "--batch needs up to %d counts in 1..65536, "
                                                "comma-separated", MAXV);
            o->shape_given = 1;
            break;
        case SEQ:
            if ((o->nseqs = cli_parse_int_list(v, 1, 1 << 24, o->seqs, MAXV)) < 0)
                return cli_usage_error("bench", "--seq needs up to %d kv lengths in 1..16777216, "
                                                "comma-separated", MAXV);
            o->shape_given = 1;
            break;
        case SEQ_Q:
            if (cli_parse_int(v, 1, 65536, &o->seq_q))
                return cli_usage_error("bench", "--seq-q needs a count of query rows in 1..65536");
            o->shape_given = 1;
            break;
        case MIX:
            if (cli_parse_int(v, 0, 1 << 20, &o->mix))
                return cli_usage_error("bench", "--mix needs a count of prefill rows in 0..1048576 "
                                                "(0 = no mixed row)");
            o->shape_given = 1;
            break;
        case HEADS:
            if (cli_parse_int(v, 1, 4096, &o->heads))
                return cli_usage_error("bench", "--heads needs a count in 1..4096");
            o->shape_given = 1;
            break;
        case KV_HEADS:
            if ((o->nkv = cli_parse_int_list(v, 1, 4096, o->kv_heads, MAXV)) < 0)
                return cli_usage_error("bench", "--kv-heads needs up to %d counts in 1..4096, "
                                                "comma-separated", MAXV);
            o->shape_given = 1;
            break;
        case DIM:
            if (cli_parse_int(v, 1, FA_MAX_HEAD_DIM, &o->dim))
                return cli_usage_error("bench", "--dim needs a head_dim in 1..%d", FA_MAX_HEAD_DIM);
            o->shape_given = 1;
            break;
        case DTYPE:
            if (cli_parse_dtype(v, &o->dtype) || o->dtype == FA_DTYPE_E4M3)
                return cli_usage_error("bench", "--dtype needs f16, bf16 or f32 (paged calls take no fp8)");
            o->dtype_given = 1;
            break;
        case REPS:
            if (cli_parse_int(v, 1, 64, &o->reps))
                return cli_usage_error("bench", "--reps needs an integer in 1..64");
            break;
        case WARM:
            o->warm = 1;
            break;
        case JSON:
            o->json = v;
            break;
        }
    }
    if (rc != 0)
        return rc;
    if (o->backend == FA_BACKEND_GLES)
        return cli_usage_error("bench", "--paged: the gles backend has no paged calls (use cpu or cuda)");
    for (int i = 0; i < o->nkv; i++)
        if (o->heads % o->kv_heads[i])
            return cli_usage_error("bench", "--heads %ld is not a multiple of --kv-heads %ld", o->heads,
                                   o->kv_heads[i]);
    return 0;
}

/* The rows to run: the product of the lists, or the default suite of the backend; -1 after
 * naming what the lists ask that a run cannot hold. */
static int build_specs(popts *o, int cuda, spec *out)
{
    static const long cpu_batch[] = { 1, 4 }, cpu_seq[] = { 4096, 16384 }, cuda_batch[] = { 8, 32 },
                      cuda_seq[] = { 4096, 32768 };
    const int suite = !o->shape_given;
    if (!o->nbatches) {
        memcpy(o->batches, cuda ? cuda_batch : cpu_batch, sizeof(cpu_batch));
        o->nbatches = 2;
    }
    if (!o->nseqs) {
        memcpy(o->seqs, cuda ? cuda_seq : cpu_seq, sizeof(cpu_seq));
        o->nseqs = 2;
    }
    if (!o->nkv) {
        o->kv_heads[0] = o->heads; /* MHA, and GQA with 8 kv heads where 8 divides the heads */
        o->kv_heads[1] = 8;
        o->nkv = o->heads % 8 == 0 && o->heads > 8 ? 2 : 1;
    }
    /* the query rows are the last of a sequence's cached keys (causal, bottom-right) */
    for (int q = 0; q < o->nseqs; q++)
        if (o->seq_q > o->seqs[q] || o->mix > o->seqs[q]) {
            const int sq = o->seq_q > o->seqs[q];
            cli_usage_error("bench", "--%s (%ld) asks for more query rows than --seq %ld has keys: they are the "
                                     "last of the cached keys", sq ? "seq-q" : "mix", sq ? o->seq_q : o->mix,
                            o->seqs[q]);
            return -1;
        }
    const long rows = (long)o->npages * o->nkv * o->nbatches * o->nseqs * (o->mix ? 2 : 1) + (suite ? 4 : 0);
    if (rows > MAX_ROWS) {
        cli_usage_error("bench", "the lists of --page-size, --kv-heads, --batch and --seq (and --mix) make %ld rows, "
                                 "more than %d a run: split them over runs", rows, MAX_ROWS);
        return -1;
    }
    int n = 0;
    for (int p = 0; p < o->npages; p++)
        for (int k = 0; k < o->nkv; k++)
            for (int b = 0; b < o->nbatches; b++)
                for (int q = 0; q < o->nseqs; q++) {
                    spec s = { o->pages[p], o->batches[b], o->seqs[q], o->seq_q, 0, o->kv_heads[k] };
                    out[n++] = s;
                    if (o->mix) {
                        s.mix = o->mix;
                        out[n++] = s;
                    }
                }
    if (suite) { /* one shape, varied one way at a time */
        const long b = cuda ? 32 : 4, kv = 4096;
        out[n++] = (spec){ 1, b, kv, 1, 0, 8 };
        out[n++] = (spec){ 256, b, kv, 1, 0, 8 };
        out[n++] = (spec){ 16, b, kv, 4, 0, 8 };
        out[n++] = (spec){ 16, b, kv, 1, cuda ? 512 : 64, 8 };
    }
    return n;
}

/* 0 when every row's buffers fit here; CLI_EXIT_FAIL after naming the first that does not. */
static int check_specs(const popts *o, const spec *s, int n)
{
    const double avail = (double)cli_mem_available(), gib = 1073741824.0;
    for (int i = 0; i < n; i++) {
        size_t cache, pool;
        double host;
        if (row_sizes(o, &s[i], &cache, &pool, &host) != 0) {
            fprintf(stderr, "flashattn bench: page %ld, b %ld, kv %ld, hkv %ld: more pages or bytes than "
                            "a call holds: too large\n", s[i].page, s[i].batch, s[i].seq, s[i].hk);
            return CLI_EXIT_FAIL;
        }
        if (avail > 0 && host > 0.9 * avail) {
            fprintf(stderr, "flashattn bench: page %ld, b %ld, kv %ld, hkv %ld needs %.1f GiB of host "
                            "memory but %.1f GiB is available here: too large\n",
                    s[i].page, s[i].batch, s[i].seq, s[i].hk, host / gib, avail / gib);
            return CLI_EXIT_FAIL;
        }
    }
    return 0;
}

int cmd_bench_paged(int argc, char **argv)
{
    popts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0)
        return rc == CLI_HELP ? 0 : rc;
    if (o.json && (rc = cli_output_ok("bench --paged", "--json", o.json, 1)) != 0)
        return rc;
    fa_context_t ctx = cli_context(o.backend, (int)o.threads);
    if (!ctx)
        return CLI_EXIT_FAIL;
    const int cuda = fa_context_backend(ctx) == FA_BACKEND_CUDA;
    o.backend = fa_context_backend(ctx);
    if (!o.dtype_given && cuda)
        o.dtype = FA_DTYPE_BF16;
    static spec specs[MAX_ROWS];
    const int n = build_specs(&o, cuda, specs);
    cli_out json = { .f = NULL };
    if (n < 0) {
        rc = CLI_EXIT_USAGE;
        goto out;
    }
    if ((rc = check_specs(&o, specs, n)) != 0)
        goto out;
    if (o.json && (rc = cli_out_open(&json, "bench --paged", "--json", o.json, 1)) != 0)
        goto out;
    FILE *out = json.f == stdout ? stderr : stdout; /* keep stdout pure JSON with --json - */
    fprintf(out, "flashattn %s bench --paged: backend %s, %s, h%ld d%ld, shuffled page tables, medians "
                 "after warm-up, paged and contiguous in turns%s\n",
            fa_version_string(), fa_backend_name(o.backend), cli_dtype_name(o.dtype), o.heads, o.dim,
            o.warm ? ", caches warm" : ", caches evicted before each call");
    bandwidth bw = { .ctx = ctx, .gpu = cuda };
    if ((rc = bw_measure(&bw)) != 0)
        goto out_bw;
    if (bw.gpu)
        fprintf(out, "HBM copy rate (same run): %.1f GB/s (a 1 GiB fa_memory_copy, read + write bytes, "
                     "median of 9)\n", bw.gbs);
    else
        fprintf(out, "read bandwidth (same run): %.1f GB/s (%d threads reading 1 GiB, median of 9)\n",
                bw.gbs, bw.threads);
    if (out == stdout)
        print_header(out);
    fflush(out);
    const int tty = isatty(fileno(stderr));
    int sampled = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (tty)
            fprintf(stderr, "\r[%d/%d] page %ld b %ld kv %ld hkv %ld ...", i + 1, n, specs[i].page,
                    specs[i].batch, specs[i].seq, specs[i].hk);
        prow r;
        rc = run_row(ctx, &o, &specs[i], &bw, &r);
        if (tty)
            fprintf(stderr, "\r%60s\r", "");
        if (rc)
            break;
        sampled |= r.checked < r.check_total;
        if (out == stdout)
            print_row(out, &o, &r);
        if (json.f) {
            json_row(json.f, &o, &r, &bw);
            rc = cli_out_check(&json); /* the first write that fails stops the run */
        }
    }
    if (rc == 0 && out == stdout) {
        printf("q: query rows per sequence (+ the prefill sequence's); GB/s: K and V of every key once per "
               "kv head, plus q and o; bw: the %s measured in turns with the row's calls (median); "
               "paged/c: paged over contiguous time\n", bw.gpu ? "copy rate" : "read bandwidth");
        if (sampled)
            printf("* errors over a sample of (sequence, kv head) pairs to keep the float64 check short\n");
    }
out_bw:
    bw_free(&bw);
    if (json.f && rc == 0)
        rc = cli_out_commit(&json);
    else if (json.f)
        cli_out_abort(&json);
out:
    fa_context_destroy(ctx);
    return rc;
}
