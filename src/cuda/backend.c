/* SPDX-License-Identifier: MIT */
/* The CUDA backend's host side: device probe, pointer checks, tile choice, workspace and launches. */
#include "../core/internal.h"
#include "../core/views.h"
#include "state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What the context's workspace pool keeps between calls. With the device's default pool
 * (which keeps nothing) every call mapped its workspace afresh, ~75 us of host time that the
 * GPU waited through on calls queued one at a time (docs/perf/h200.md). */
#define POOL_KEEP_BYTES ((uint64_t)64 << 20)

typedef struct tiles {
    int dim, fwd_m, fwd_n, fwd_warps, kv_q, kv_warps, kv_split, q_k, q_warps;
} tiles;

#define FA_TILE_ROW(D, FM, FN, FW, KQ, KW, KS, QK, QW) { D, FM, FN, FW, KQ, KW, KS, QK, QW },
static const tiles tile_table[] = { FA_CUDA_TILES(FA_TILE_ROW) };
#undef FA_TILE_ROW
#define N_TILES (sizeof(tile_table) / sizeof(tile_table[0]))

typedef struct sm90_tiles {
    int dim, keys, warpgroups, stages, q_buffers;
    int min_q; /* FA_CUDA_SM90_WIDE_TILES: the mean query rows a sequence from which the row runs */
    int wide;  /* a row of FA_CUDA_SM90_WIDE_TILES */
} sm90_tiles;

#define FA_SM90_ROW(D, BN, NWG, ST, NQ) { D, BN, NWG, ST, NQ, 0, 0 },
#define FA_SM90_ROW_VALUE(D, BN, NWG, ST, NQ) { D, BN, NWG, ST, NQ, 0, 0 }
#define FA_SM90_WIDE_ROW(D, BN, NWG, ST, NQ, ROWS) { D, BN, NWG, ST, NQ, ROWS, 1 },
static const sm90_tiles sm90_table[] = { FA_CUDA_SM90_TILES(FA_SM90_ROW) };
static const sm90_tiles sm90_wide_table[] = { FA_CUDA_SM90_WIDE_TILES(FA_SM90_WIDE_ROW) };
#undef FA_SM90_ROW
#undef FA_SM90_WIDE_ROW
#define N_SM90 (sizeof(sm90_table) / sizeof(sm90_table[0]))
#define N_SM90_WIDE (sizeof(sm90_wide_table) / sizeof(sm90_wide_table[0]))
static const sm90_tiles sm90_fp8_tiles = FA_CUDA_SM90_FP8_TILES(FA_SM90_ROW_VALUE);
#undef FA_SM90_ROW_VALUE

typedef struct sm90_bwd_tiles {
    int dim, keys, q_step, stages;
} sm90_bwd_tiles;

#define FA_SM90_BWD_ROW(D, BN, BQ, ST) { D, BN, BQ, ST },
static const sm90_bwd_tiles sm90_bwd_table[] = { FA_CUDA_SM90_BWD_TILES(FA_SM90_BWD_ROW) };
#undef FA_SM90_BWD_ROW
#define N_SM90_BWD (sizeof(sm90_bwd_table) / sizeof(sm90_bwd_table[0]))

/* The smallest instantiated head_dim that holds dim (columns past dim read as zeros). */
static const tiles *tiles_for(int32_t dim)
{
    for (size_t i = 0; i < N_TILES; i++)
        if (dim <= tile_table[i].dim)
            return &tile_table[i];
    return NULL;
}

fa_status fa_cuda_fail(fa_context_t ctx, cudaError_t err, const char *what)
{
    return fa_error(ctx, FA_ERR_BACKEND, "%s: CUDA error %d (%s): %s", what, (int)err,
                    cudaGetErrorName(err), cudaGetErrorString(err));
}

/* A softmax slack from the environment: x in [0, 8] sets it, a negative x (-0 too) gives -1
 * (O rescaled every key tile), anything else (unset, NaN, past 8, not a number) dflt. */
static float env_slack(const char *name, float dflt)
{
    const char *v = getenv(name);
    char *end = NULL;
    const float x = v ? strtof(v, &end) : dflt;
    if (!v || end == v || *end != '\0' || !(x <= 8.0f))
        return dflt;
    return signbit(x) ? -1.0f : x;
}

/* A count from the environment: a whole number n >= 0 gives 1 and *n (at most max), anything
 * else (unset, negative, not a number) 0. */
static int env_count(const char *name, long long max, long long *n)
{
    const char *v = getenv(name);
    char *end = NULL;
    const long long x = v ? strtoll(v, &end, 10) : -1;
    if (!v || end == v || *end != '\0' || x < 0)
        return 0;
    *n = x < max ? x : max;
    return 1;
}

static fa_status cuda_init(fa_context_t ctx, int32_t num_threads, const void *native, void **state)
{
    (void)native;
    (void)num_threads;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE, "no usable CUDA device: %s",
                        err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    cuda_state *s = calloc(1, sizeof(*s));
    if (!s)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the CUDA backend");
    if ((err = cudaGetDevice(&s->device)) != cudaSuccess ||
        (err = cudaGetDeviceProperties(&s->prop, s->device)) != cudaSuccess) {
        free(s);
        return fa_cuda_fail(ctx, err, "reading the device's properties");
    }
    if (s->prop.major < 8) {
        int dev = s->device, major = s->prop.major, minor = s->prop.minor;
        free(s);
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                        "CUDA device %d has compute capability %d.%d; the kernels need 8.0 or newer "
                        "(bf16 tensor cores)",
                        dev, major, minor);
    }
    /* FLASHATTN_CUDA_PORTABLE=1 keeps Hopper on the mma.sync kernels (for comparison). */
    const char *portable = getenv("FLASHATTN_CUDA_PORTABLE");
    s->hopper = s->prop.major == 9 && s->prop.minor == 0 && !(portable && strcmp(portable, "1") == 0);
    /* FLASHATTN_CUDA_TMA=0 keeps the Hopper forward's and decode kernel's loaders on row copies
     * (for comparison) */
    const char *tma = getenv("FLASHATTN_CUDA_TMA");
    s->tma_encode = s->hopper && !(tma && strcmp(tma, "0") == 0) ? fa_cuda_tma_encoder() : NULL;
    /* the calls' workspace: a pool of the context's own, which keeps what it needs */
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = s->device;
    uint64_t keep = POOL_KEEP_BYTES;
    if ((err = cudaMemPoolCreate(&s->pool, &props)) != cudaSuccess ||
        (err = cudaMemPoolSetAttribute(s->pool, cudaMemPoolAttrReleaseThreshold, &keep)) != cudaSuccess) {
        if (s->pool)
            cudaMemPoolDestroy(s->pool);
        free(s);
        return fa_cuda_fail(ctx, err, "creating the workspace pool");
    }
    /* FLASHATTN_CUDA_PERSISTENT_BLOCKS=n: n persistent blocks instead (tests run the hand-over of
     * query tiles on small grids with it) */
    s->persistent_blocks = s->prop.multiProcessorCount;
    const char *pb = getenv("FLASHATTN_CUDA_PERSISTENT_BLOCKS");
    if (pb && atoi(pb) > 0)
        s->persistent_blocks = atoi(pb);
    /* FLASHATTN_CUDA_PDL=0: the decode kernels launched plainly (for comparison) */
    const char *pdl = getenv("FLASHATTN_CUDA_PDL");
    s->pdl = s->hopper && !(pdl && strcmp(pdl, "0") == 0);
    /* the Hopper forward's consumer warpgroups issue their GEMMs in turns;
     * FLASHATTN_CUDA_PINGPONG=0: freely (for comparison) */
    const char *pp = getenv("FLASHATTN_CUDA_PINGPONG");
    s->pingpong = s->hopper && !(pp && strcmp(pp, "0") == 0);
    /* FLASHATTN_CUDA_BWD_ORDER=key: the Hopper backward's blocks key-tile major instead of
     * head major (bwd_block; for comparison) */
    const char *bo = getenv("FLASHATTN_CUDA_BWD_ORDER");
    s->bwd_order = bo && strcmp(bo, "key") == 0;
    /* FLASHATTN_CUDA_BWD_TMA=1: the Hopper backward's loader takes Q and dO tiles by TMA
     * (fixed-length calls; fa_cuda_tma_backward) instead of copying rows; off by default:
     * 0.98-1.06x the row copies (docs/perf) */
    const char *bt = getenv("FLASHATTN_CUDA_BWD_TMA");
    s->bwd_tma = bt && strcmp(bt, "1") == 0;
    /* FLASHATTN_CUDA_BWD_UNORDERED=1: the Hopper backward's dQ adds without their order
     * (measurement only: the bits then vary from run to run) */
    const char *bu = getenv("FLASHATTN_CUDA_BWD_UNORDERED");
    s->bwd_unordered = bu && strcmp(bu, "1") == 0;
    /* The Hopper backward's blocks take their query tiles first first, unmasked ones from
     * staggered starts (params.h: bwd_sched; 1.04-1.27x the last-first order at d64-d256,
     * docs/perf); by default (0) in groups of key tiles at d64 and d128 (sequences longer
     * than half the device: 1.15-1.20x at s16k), in one group at d256 (longer ones first
     * first: groups ran its s16k at 0.64x). FLASHATTN_CUDA_BWD_SCHED=first: no staggered
     * starts (no block then waits for a later one, whatever else runs on the device);
     * =stagger: one group at every head_dim; =groups: groups at every head_dim */
    const char *bs = getenv("FLASHATTN_CUDA_BWD_SCHED");
    s->bwd_sched = !bs                         ? 0
                   : strcmp(bs, "first") == 0   ? 1
                   : strcmp(bs, "stagger") == 0 ? 2
                   : strcmp(bs, "groups") == 0  ? 3
                                                : 0;
    /* FLASHATTN_CUDA_BWD_GROUP=N: staggered groups of at most N key tiles (N >= 1; checks of
     * the groups on short sequences), else half the multiprocessors */
    const char *bg = getenv("FLASHATTN_CUDA_BWD_GROUP");
    const long g = bg ? strtol(bg, NULL, 10) : 0;
    s->bwd_group = g > 0 && g <= 1 << 20 ? (int)g : 0;
    /* The Hopper bf16 / f16 forward (head_dim <= 128) keeps a row's softmax reference until a
     * key tile's largest logit passes it by more than the slack (log2 units; 8 as
     * FlashAttention-4), rescaling O only then (softmax_update); probabilities reach 2^slack, well
     * inside f16's range. 8 measured -0.4% to +4.8% against every tile (docs/perf/h200.md).
     * The fp8 forward, whose P in e4m3 (largest 448) holds 2^8 too, rescales every tile unless
     * FLASHATTN_CUDA_SLACK_E4M3 says otherwise (8: 2-3% faster, its RMSE 2% higher; perf/fp8.md). */
    s->rescale_slack = env_slack("FLASHATTN_CUDA_SLACK", 8.0f);
    s->rescale_slack_e4m3 = env_slack("FLASHATTN_CUDA_SLACK_E4M3", -1.0f);
    /* FLASHATTN_CUDA_WIDE_MIN_Q=n: the wide Hopper tiles (FA_CUDA_SM90_WIDE_TILES) from a mean of
     * n query rows a sequence, whatever the grid (wide_fits; 0: every call, as tests run them on
     * small grids; past INT32_MAX: none); other values leave the table's bound */
    long long n;
    s->wide_min_q = env_count("FLASHATTN_CUDA_WIDE_MIN_Q", INT32_MAX, &n) ? (int32_t)n : -1;
    /* The Hopper decode kernel runs 3 blocks of 2 stages a multiprocessor on grids of two such
     * waves or more, else 2 blocks of 3 stages (decode_sm90.cu; the same bits);
     * FLASHATTN_CUDA_DECODE_WIDE_MIN=n moves that bound to n blocks (0: every grid, as the tests
     * run it; past INT32_MAX: none) */
    s->decode_wide_min = env_count("FLASHATTN_CUDA_DECODE_WIDE_MIN", INT64_MAX, &n)
                             ? (int64_t)n
                             : 6 * (int64_t)s->prop.multiProcessorCount;
    *state = s;
    return FA_OK;
}

/* The pool goes once its last workspace is freed (each call's is freed on its stream). */
static void cuda_destroy(void *state)
{
    cuda_state *s = state;
    cudaMemPoolDestroy(s->pool);
    free(s);
}

static void cuda_info(void *state, char *buf, size_t cap, size_t *len)
{
    const cuda_state *s = state;
    const struct cudaDeviceProp *p = &s->prop;
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    fa_appendf(buf, cap, len, "cuda.device: %d %s (compute capability %d.%d)\n", s->device, p->name,
               p->major, p->minor);
    fa_appendf(buf, cap, len, "cuda.multiprocessors: %d\n", p->multiProcessorCount);
    fa_appendf(buf, cap, len, "cuda.memory: %.1f GiB, L2 %d KiB\n",
               (double)p->totalGlobalMem / (1024.0 * 1024.0 * 1024.0), p->l2CacheSize / 1024);
    fa_appendf(buf, cap, len, "cuda.shared_memory_per_block: %zu KiB (opt-in)\n",
               p->sharedMemPerBlockOptin / 1024);
    fa_appendf(buf, cap, len, "cuda.runtime: %d.%d, driver %d.%d\n", rt / 1000, (rt % 1000) / 10,
               drv / 1000, (drv % 1000) / 10);
    fa_appendf(buf, cap, len, "cuda.kernels: mma.sync m16n8k16 (f16, bf16; f32 accumulate), built "
                              "for sm_80 and sm_90a\n");
    fa_appendf(buf, cap, len, "cuda.hopper_forward: %s\n",
               s->hopper ? "wgmma m64nNk16 from 128-byte-swizzled shared memory, a loading "
                           "warpgroup (sm_90a)"
               : p->major == 9 ? "off (FLASHATTN_CUDA_PORTABLE=1)"
                               : "no (needs compute capability 9.0)");
    fa_appendf(buf, cap, len,
               "cuda.decode: flash forwards whose sequences' query rows times the group are at most "
               "16, without dropout, run the paged decode kernel over K and V in place (splits of %d "
               "keys, doubled until a sequence has at most %d; where their partials would pass %zu "
               "MiB, the tiles)%s\n",
               FA_CUDA_DECODE_SPLIT, FA_CUDA_SPLITS_GROWN, FA_CUDA_DECODE_PARTS_MAX >> 20,
               s->hopper ? "; head_dim 64 / 128 on 16-byte rows: the Hopper decode kernel (a loading "
                           "warpgroup's bulk copies, a row each)"
                         : "");
    for (size_t i = 0; s->hopper && i < N_SM90_BWD; i++) {
        const sm90_bwd_tiles *t = &sm90_bwd_table[i];
        fa_appendf(buf, cap, len,
                   "cuda.tiles.sm90.d%d: backward %d keys x %d queries a step (%d Q/dO stages; "
                   "2 consumer warpgroups %s + 1 loading), dQ added in key-tile order\n",
                   t->dim, t->keys, t->q_step, t->stages,
                   t->keys == 128 ? "of 64 keys" : "taking half the queries, then half the columns");
    }
    if (s->hopper)
        fa_appendf(buf, cap, len,
                   "cuda.tiles.sm90.fp8: forward of e4m3 inputs up to head_dim %d, %dx%d (%d consumer "
                   "warpgroups + 1 loading and transposing V, %d K/V stages), P in e4m3\n",
                   sm90_fp8_tiles.dim, 64 * sm90_fp8_tiles.warpgroups, sm90_fp8_tiles.keys,
                   sm90_fp8_tiles.warpgroups, sm90_fp8_tiles.stages);
    for (size_t i = 0; s->hopper && i < N_SM90; i++)
        fa_appendf(buf, cap, len,
                   "cuda.tiles.sm90.d%d: forward %dx%d (%d consumer warpgroups + 1 loading, %d "
                   "K/V stages, %s)\n",
                   sm90_table[i].dim, 64 * sm90_table[i].warpgroups, sm90_table[i].keys,
                   sm90_table[i].warpgroups, sm90_table[i].stages,
                   sm90_table[i].q_buffers > 1
                       ? "persistent blocks, one per multiprocessor, taking query tiles in turn"
                       : "a block per query tile");
    for (size_t i = 0; s->hopper && i < N_SM90_WIDE; i++) {
        const sm90_tiles *w = &sm90_wide_table[i];
        fa_appendf(buf, cap, len,
                   "cuda.tiles.sm90.d%d.wide: forward %dx%d (%d consumer warpgroups + 1 loading, %d K/V "
                   "stages, %s) where the query sequences have %d rows on average",
                   w->dim, 64 * w->warpgroups, w->keys, w->warpgroups, w->stages,
                   w->q_buffers > 1 ? "persistent blocks" : "a block per query tile",
                   s->wide_min_q >= 0 ? s->wide_min_q : w->min_q);
        if (s->wide_min_q >= 0)
            fa_appendf(buf, cap, len, " (FLASHATTN_CUDA_WIDE_MIN_Q)\n");
        else
            fa_appendf(buf, cap, len, " and the tiles fill the multiprocessors %d times\n", FA_CUDA_WIDE_WAVES);
    }
    for (size_t i = 0; i < N_TILES; i++) {
        const tiles *t = &tile_table[i];
        fa_appendf(buf, cap, len,
                   "cuda.tiles.d%d: forward %dx%d (%d warps); backward dK/dV %d keys x %d queries "
                   "(%d warps), dQ %d queries x %d keys (%d warps)\n",
                   t->dim, t->fwd_m, t->fwd_n, t->fwd_warps, 16 * t->kv_warps / t->kv_split, t->kv_q,
                   t->kv_warps, 16 * t->q_warps, t->q_k, t->q_warps);
    }
}

/* A tensor argument must live in memory this device can read. */
fa_status fa_cuda_check_ptr(fa_context_t ctx, const cuda_state *s, const void *ptr,
                            const char *name)
{
    struct cudaPointerAttributes a;
    cudaError_t err = cudaPointerGetAttributes(&a, ptr);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* clear it: not a sticky error */
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT, "%s (%p) is not a CUDA pointer: %s", name, ptr,
                        cudaGetErrorString(err));
    }
    if (a.type == cudaMemoryTypeManaged)
        return FA_OK;
    if (a.type != cudaMemoryTypeDevice)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s (%p) is host memory; the CUDA backend takes device pointers "
                        "(cudaMalloc or fa_memory_alloc)",
                        name, ptr);
    if (a.device != s->device)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s lives on CUDA device %d; this context runs on device %d", name, a.device,
                        s->device);
    return FA_OK;
}

/* mul and shr with i / d == umulhi(i, mul) >> shr for every i < 2^31 (1 <= d <= 2^30):
 * mul = ceil(2^(31 + l) / d), l = ceil(log2 d), shr = l - 1 (Granlund and Montgomery's
 * round-up method; its error, below 2^-l, never reaches the next integer); d 1: mul 0. */
static void divisor_of(uint32_t d, uint32_t *mul, int32_t *shr)
{
    int l = 0;
    while (((uint64_t)1 << l) < d)
        l++;
    *mul = d > 1 ? (uint32_t)((((uint64_t)1 << (31 + l)) + d - 1) / d) : 0;
    *shr = d > 1 ? l - 1 : 0;
}

static void descale_of(fa_cuda_descale *d, const fa_descale *s)
{
    d->p = s->data;
    d->sb = s->stride_batch;
    d->sh = s->stride_head;
    d->rows = s->data ? s->block_rows : 0;
    d->sblk = d->rows ? s->stride_block : 0;
    divisor_of((uint32_t)(d->rows ? d->rows : 1), &d->mul, &d->shr);
}

static void view_of(fa_cuda_view *v, const fa_tensor *t, int varlen)
{
    v->p = t->data;
    v->sb = varlen ? 0 : t->stride_batch;
    v->ss = t->stride_seq;
    v->sh = t->stride_head;
    v->f32 = t->dtype == FA_DTYPE_F32;
}

/* 16-byte vector loads need every row start aligned: base pointer and every stride. */
static int view_aligned(const fa_tensor *t, int varlen)
{
    const int64_t n = 16 / fa_dtype_bytes(t->dtype);
    return ((uintptr_t)t->data % 16 == 0) && t->stride_seq % n == 0 && t->stride_head % n == 0 &&
           (varlen || t->stride_batch % n == 0);
}

typedef struct call {
    fa_cuda_params kp;
    const tiles *tl;
    const sm90_tiles *h; /* the Hopper forward's tiles, NULL when the mma.sync kernels run */
    const sm90_bwd_tiles *hb; /* the same for the backward */
    int nq;                /* the decode route: the paged decode kernel with 8 * nq packed rows, or 0 */
    int32_t split, splits; /* its keys per split and the splits of the longest sequence */
    int bf16;
    int64_t krows;
    int decode_sm90; /* the decode route on the Hopper decode kernel */
    int fp8;         /* e4m3 inputs: the Hopper fp8 forward (or the standard algorithm) */
    size_t acc_bytes, sem_bytes, cu_bytes, dsum_bytes, std_bytes, sched_bytes, part_bytes; /* workspace parts */
} call;

/* The Hopper forward; fixed-length keys in 16-byte rows go to its loader as TMA boxes (one
 * tensor map each for K and V over [batch][seqlen_k][heads_kv][dim], the tile's rows past
 * seqlen_k read as zeros), else row copies. */
static cudaError_t forward_sm90(const cuda_state *s, const call *c, fa_cuda_params *k)
{
    k->pingpong = s->pingpong;
    k->rescale_slack = c->fp8 ? s->rescale_slack_e4m3 : s->rescale_slack;
    if (k->aligned)
        fa_cuda_tma_dense(s->tma_encode, k, c->fp8 ? FA_CUDA_TMA_E4M3 : c->bf16, c->h->keys);
    if (c->fp8)
        return fa_cuda_flash_forward_e4m3_sm90(k, s->stream);
    return fa_cuda_flash_forward_sm90(k, c->bf16, c->h->dim, c->h->wide, s->stream);
}

/* fa_forward's decode route: where the query rows of a sequence's kv group fit the decode
 * kernel's 16 packed rows (one token a sequence, or a few for speculative decoding), the 128-row
 * tiles would sit mostly empty; the paged decode kernel reads K and V in place as a cache without
 * a block table, split every FA_CUDA_DECODE_SPLIT keys from key 0 (so a sequence's bits depend on
 * its own length only). Dropout and the standard algorithm keep the tiles. 0, or nq for it. */
static int decode_route(const fa_problem *p, int64_t rows)
{
    if (p->desc->algorithm != FA_ALGORITHM_FLASH || p->dropout_p > 0.0f || p->heads_q > 65535 ||
        rows > INT32_MAX)
        return 0;
    return fa_cuda_decode_nq((int64_t)p->max_q * p->group);
}

/* Whether a Hopper kernel of head_dim hd (its table's rows ascending: the first that takes
 * dim wins) runs head_dim dim, whose tiles are tl: the smallest that holds dim, so 65-96 run
 * the d128 kernels, their columns past dim zeros, rather than the 96-wide tiles, where rows
 * are whole 16-byte chunks (others would take the loaders' element-by-element path). */
static int sm90_takes(int32_t hd, const tiles *tl, int32_t dim)
{
    return hd >= dim && (hd == tl->dim || dim % 8 == 0);
}

/* Whether a call of `rows` query rows in all runs the wide tiles w (FA_CUDA_SM90_WIDE_TILES):
 * its sequences' mean length reaches the row's bound (or FLASHATTN_CUDA_WIDE_MIN_Q's, which
 * drops the waves too, so that tests run them on small grids) and the tiles fill the
 * multiprocessors FA_CUDA_WIDE_WAVES times. */
static int wide_fits(const cuda_state *s, const sm90_tiles *w, const fa_problem *p, int64_t rows)
{
    if (s->wide_min_q >= 0)
        return rows >= (int64_t)s->wide_min_q * p->batch;
    const int64_t per_seq = ((int64_t)p->max_q + 64 * w->warpgroups - 1) / (64 * w->warpgroups);
    int64_t n;
    return rows >= (int64_t)w->min_q * p->batch && fa_mul_ok(per_seq * p->heads_q, p->batch, &n) &&
           n >= (int64_t)FA_CUDA_WIDE_WAVES * s->prop.multiProcessorCount;
}

static fa_status prepare(fa_context_t ctx, const cuda_state *s, const fa_problem *p, int backward,
                         call *c)
{
    const fa_attention_desc *d = p->desc;
    memset(c, 0, sizeof(*c));
    if (p->in_dtype == FA_DTYPE_F32)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "q.dtype is f32: the CUDA backend runs on tensor cores from f16, bf16 or fp8 "
                        "inputs (convert them, or use the CPU backend)");
    if (backward && p->bwd->d_o.dtype == FA_DTYPE_F32)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "d_o.dtype is f32 with %s inputs: the CUDA backward reads d_o in q's dtype "
                        "(convert it, or use the CPU backend)",
                        p->in_dtype == FA_DTYPE_BF16 ? "bf16" : "f16");
    c->fp8 = p->in_dtype == FA_DTYPE_E4M3;
    if (c->fp8 && d->algorithm != FA_ALGORITHM_STANDARD && !s->hopper)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "q.dtype is fp8 (FA_DTYPE_E4M3): the CUDA backend runs it on Hopper (compute "
                        "capability 9.0) only; convert the inputs to bf16, or use the CPU backend");
    if (c->fp8 && d->algorithm != FA_ALGORITHM_STANDARD && p->dim > sm90_fp8_tiles.dim)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "head_dim (%d) with fp8 (FA_DTYPE_E4M3) inputs: the CUDA backend runs them up to "
                        "head_dim %d; use the CPU backend",
                        (int)p->dim, sm90_fp8_tiles.dim);
    c->tl = tiles_for(p->dim);
    if (!c->tl)
        return fa_error(ctx, FA_ERR_UNSUPPORTED, "head_dim (%d) exceeds the largest CUDA tile (%d)",
                        (int)p->dim, tile_table[N_TILES - 1].dim);
    c->bf16 = p->in_dtype == FA_DTYPE_BF16 || c->fp8; /* fp8: o bf16 (or float32) */
    const int64_t rows = p->varlen ? d->cu_seqlens_q[p->batch] : (int64_t)p->batch * d->seqlen_q;
    c->nq = backward || c->fp8 ? 0 : decode_route(p, rows);
    if (c->nq) {
        /* partials for every row times the longest sequence's splits: where that passes
         * FA_CUDA_DECODE_PARTS_MAX (one very long sequence among many short ones), or the grid
         * overflows, the tiles run the call instead (they need no partials) */
        c->split = FA_CUDA_DECODE_SPLIT;
        if (!fa_cuda_split_layout(p, rows, c->split, 1, &c->splits, &c->part_bytes) ||
            c->part_bytes > FA_CUDA_DECODE_PARTS_MAX)
            c->nq = 0, c->split = c->splits = 0, c->part_bytes = 0;
        c->decode_sm90 = c->nq && s->hopper && fa_cuda_decode_sm90_fits(p->dim) &&
                         view_aligned(&d->k, p->varlen) && view_aligned(&d->v, p->varlen);
    }
    if (c->fp8)
        c->h = &sm90_fp8_tiles;
    for (size_t i = 0; s->hopper && !backward && !c->nq && !c->h && i < N_SM90; i++)
        if (sm90_takes(sm90_table[i].dim, c->tl, p->dim))
            c->h = &sm90_table[i];
    /* long queries: the head dim's wide tiles, where it has them */
    for (size_t i = 0; c->h && !c->fp8 && i < N_SM90_WIDE; i++)
        if (sm90_wide_table[i].dim == c->h->dim && wide_fits(s, &sm90_wide_table[i], p, rows))
            c->h = &sm90_wide_table[i];
    for (size_t i = 0; s->hopper && backward && !c->hb && i < N_SM90_BWD; i++)
        if (sm90_takes(sm90_bwd_table[i].dim, c->tl, p->dim))
            c->hb = &sm90_bwd_table[i];

    fa_cuda_params *k = &c->kp;
    view_of(&k->q, &d->q, p->varlen);
    view_of(&k->k, &d->k, p->varlen);
    view_of(&k->v, &d->v, p->varlen);
    view_of(&k->o, &d->o, p->varlen);
    k->aligned = p->dim % (c->fp8 ? 16 : 8) == 0 && view_aligned(&d->q, p->varlen) &&
                 view_aligned(&d->k, p->varlen) && view_aligned(&d->v, p->varlen);
    if (c->fp8) {
        descale_of(&k->q_ds, &d->q_descale);
        descale_of(&k->k_ds, &d->k_descale);
        descale_of(&k->v_ds, &d->v_descale);
    }
    if (backward) {
        view_of(&k->dout, &p->bwd->d_o, p->varlen);
        view_of(&k->dq, &p->bwd->d_q, p->varlen);
        view_of(&k->dk, &p->bwd->d_k, p->varlen);
        view_of(&k->dv, &p->bwd->d_v, p->varlen);
        k->aligned = k->aligned && view_aligned(&p->bwd->d_o, p->varlen);
        k->dq_vec = p->dim % 8 == 0 && !k->dq.f32 && view_aligned(&p->bwd->d_q, p->varlen);
    }
    k->o_vec = p->dim % 8 == 0 && !k->o.f32 && view_aligned(&d->o, p->varlen);
    k->lse = d->lse;
    k->lse_sb = p->lse_sb;
    k->lse_sh = p->lse_sh;
    k->lse_ss = p->lse_ss;
    k->batch = p->batch;
    k->heads_q = p->heads_q;
    k->heads_kv = p->heads_kv;
    k->group = p->group;
    k->dim = p->dim;
    k->seqlen_q = d->seqlen_q;
    k->seqlen_k = d->seqlen_k;
    k->max_q = p->max_q;
    k->max_k = p->max_k;
    k->scale = p->scale;
    k->scale_log2 = p->scale * 1.4426950408889634f;
    k->softcap = p->softcap;
    k->cap_in = p->softcap > 0.0f ? p->scale / p->softcap : 0.0f;
    k->cap_out = p->softcap * 1.4426950408889634f;
    k->win_left = p->win_left;
    k->win_right = p->win_right;
    k->dropout_p = p->dropout_p;
    k->dropout_scale = p->dropout_scale;
    k->dropout_threshold = p->dropout_threshold;
    k->dropout_seed = p->dropout_seed;
    k->dropout_offset = p->dropout_offset;
    k->rows = rows;
    fa_cuda_ordering_test(k);
    if (p->varlen) {
        c->krows = d->cu_seqlens_k[p->batch];
        c->cu_bytes = 2 * sizeof(int32_t) * ((size_t)p->batch + 1);
    } else {
        c->krows = (int64_t)p->batch * d->seqlen_k;
    }

    /* grids: one block per (tile, head, sequence) in a 31-bit x dimension */
    const int64_t fwd_m = c->h ? 64 * c->h->warpgroups : c->tl->fwd_m; /* query rows a block */
    int64_t fwd_blocks = ((int64_t)p->max_q + fwd_m - 1) / fwd_m * p->heads_q * p->batch;
    if (!c->nq && fwd_blocks > INT32_MAX)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "batch * heads * query tiles (%lld) exceeds CUDA's grid limit; split the call",
                        (long long)fwd_blocks);
    /* persistent forward blocks (one per multiprocessor) where there are more query tiles,
     * taking them through a counter in the workspace */
    if (c->h && c->h->q_buffers > 1 && d->algorithm != FA_ALGORITHM_STANDARD &&
        ((int64_t)p->max_q + 64 * c->h->warpgroups - 1) / (64 * c->h->warpgroups) * p->heads_q * p->batch >
            s->persistent_blocks) {
        c->sched_bytes = 256;
        k->sched_blocks = s->persistent_blocks;
    }
    if (backward)
        c->dsum_bytes = 2 * sizeof(float) * (size_t)(k->rows * p->heads_q); /* dsum, lse2 */
    if (c->hb && d->algorithm != FA_ALGORITHM_STANDARD) {
        /* dQ in float32, a block of q_step x dim per (head, query tile) with a tile of room per
         * sequence (varlen sequences start anywhere), and a counter per (sequence, head, query
         * tile) */
        const int64_t step = c->hb->q_step, qtiles = ((int64_t)p->max_q + step - 1) / step;
        const int64_t htiles = (k->rows + step - 1) / step + p->batch;
        int64_t n;
        if (htiles > INT32_MAX || !fa_mul_ok(htiles, p->heads_q, &n) || !fa_mul_ok(n, step * c->hb->dim * 4, &n))
            return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "the backward's dQ accumulator overflows 64 bits");
        c->acc_bytes = (size_t)n;
        c->sem_bytes = (sizeof(int) * (size_t)p->batch * p->heads_q * qtiles + 255) / 256 * 256;
        k->dq_htiles = (int32_t)htiles;
        k->dq_tiles = (int32_t)qtiles;
    }
    if (d->algorithm == FA_ALGORITHM_STANDARD) {
        if (p->heads_q > 65535 || k->rows > INT32_MAX || c->krows > INT32_MAX)
            return fa_error(ctx, FA_ERR_UNSUPPORTED,
                            "the standard CUDA algorithm takes at most 65535 heads and 2^31 rows");
        int64_t n, bytes;
        if (!fa_mul_ok(k->rows, p->heads_q, &n) || !fa_mul_ok(n, p->max_k, &n) ||
            !fa_mul_ok(n, backward ? 4 + 2 + 2 : 4 + 2, &bytes))
            return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "the standard algorithm's score matrix "
                                                       "overflows 64 bits");
        c->std_bytes = (size_t)bytes;
    }
    return FA_OK;
}

static void report(const call *c, const fa_problem *p, int backward, fa_run_info *info)
{
#define FA_FWD_NAME(D, ...) "cuda-flash-mma-d" #D,
#define FA_BWD_NAME(D, ...) "cuda-flash-bwd-mma-d" #D,
#define FA_SM90_NAME(D, ...) "cuda-flash-wgmma-d" #D,
#define FA_SM90_WIDE_NAME(D, ...) "cuda-flash-wgmma-d" #D "-wide",
#define FA_SM90_BWD_NAME(D, ...) "cuda-flash-bwd-wgmma-d" #D,
    static const char *const fwd_names[] = { FA_CUDA_TILES(FA_FWD_NAME) };
    static const char *const bwd_names[] = { FA_CUDA_TILES(FA_BWD_NAME) };
    static const char *const sm90_names[] = { FA_CUDA_SM90_TILES(FA_SM90_NAME) };
    static const char *const sm90_wide_names[] = { FA_CUDA_SM90_WIDE_TILES(FA_SM90_WIDE_NAME) };
    static const char *const sm90_bwd_names[] = { FA_CUDA_SM90_BWD_TILES(FA_SM90_BWD_NAME) };
    static const char *const decode_names[] = { "cuda-decode-d64", "cuda-decode-d128", "cuda-decode-d256" };
    static const char *const decode_sm90_names[] = { "cuda-decode-sm90-d64", "cuda-decode-sm90-d128" };
#undef FA_FWD_NAME
#undef FA_BWD_NAME
#undef FA_SM90_NAME
#undef FA_SM90_WIDE_NAME
#undef FA_SM90_BWD_NAME
    const size_t row = (size_t)(c->tl - tile_table);
    const int standard = p->desc->algorithm == FA_ALGORITHM_STANDARD;
    if (standard) {
        info->kernel = backward ? "cuda-standard-bwd" : "cuda-standard";
        info->block_q = 1;
        info->block_k = p->max_k;
        info->threads = 128;
    } else if (c->nq) {
        const int32_t dpad = fa_cuda_paged_dpad(p->dim);
        info->kernel = c->decode_sm90 ? decode_sm90_names[dpad == 64 ? 0 : 1]
                                      : decode_names[dpad == 64 ? 0 : dpad == 128 ? 1 : 2];
        info->block_q = 8 * c->nq; /* packed (query row, head) pairs of one kv head */
        info->block_k = c->split;
        info->threads = c->decode_sm90 ? 256 : 128;
    } else if (c->hb) {
        info->kernel = sm90_bwd_names[c->hb - sm90_bwd_table];
        info->block_q = c->hb->q_step;
        info->block_k = 128;
        info->threads = 384;
    } else if (backward) {
        info->kernel = bwd_names[row];
        info->block_q = c->tl->kv_q;
        info->block_k = 16 * c->tl->kv_warps / c->tl->kv_split;
        info->threads = 32 * c->tl->kv_warps;
    } else if (c->h) {
        info->kernel = c->fp8    ? "cuda-flash-wgmma-fp8-d128"
                       : c->h->wide ? sm90_wide_names[c->h - sm90_wide_table]
                                    : sm90_names[c->h - sm90_table];
        info->block_q = 64 * c->h->warpgroups;
        info->block_k = c->h->keys;
        info->threads = 128 * (c->h->warpgroups + 1);
    } else {
        info->kernel = fwd_names[row];
        info->block_q = c->tl->fwd_m;
        info->block_k = c->tl->fwd_n;
        info->threads = 32 * c->tl->fwd_warps;
    }
    info->workspace_bytes = c->acc_bytes + c->sem_bytes + c->cu_bytes + c->dsum_bytes + c->std_bytes +
                            c->sched_bytes + c->part_bytes;
}

static fa_status cuda_plan(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    call c;
    fa_status st = prepare(ctx, state, p, 0, &c);
    if (st == FA_OK)
        report(&c, p, 0, info);
    return st;
}

static fa_status cuda_plan_backward(fa_context_t ctx, void *state, const fa_problem *p,
                                    fa_run_info *info)
{
    call c;
    fa_status st = prepare(ctx, state, p, 1, &c);
    if (st == FA_OK)
        report(&c, p, 1, info);
    return st;
}

static fa_status check_pointers(fa_context_t ctx, const cuda_state *s, const fa_problem *p,
                                int backward)
{
    const fa_attention_desc *d = p->desc;
    struct {
        const void *ptr;
        const char *name;
    } list[12] = { { d->q.data, "q.data" },
                  { d->k.data, "k.data" },
                  { d->v.data, "v.data" },
                  { d->o.data, "o.data" },
                  { d->lse, "lse" },
                  { d->q_descale.data, "q_descale.data" },
                  { d->k_descale.data, "k_descale.data" },
                  { d->v_descale.data, "v_descale.data" } };
    int n = 8;
    if (backward) {
        list[n++] = (typeof(list[0])){ p->bwd->d_o.data, "d_o.data" };
        list[n++] = (typeof(list[0])){ p->bwd->d_q.data, "d_q.data" };
        list[n++] = (typeof(list[0])){ p->bwd->d_k.data, "d_k.data" };
        list[n++] = (typeof(list[0])){ p->bwd->d_v.data, "d_v.data" };
    }
    for (int i = 0; i < n; i++) {
        if (!list[i].ptr)
            continue; /* optional and absent (lse), or an empty tensor the validator allowed */
        fa_status st = fa_cuda_check_ptr(ctx, s, list[i].ptr, list[i].name);
        if (st != FA_OK)
            return st;
    }
    return FA_OK;
}

/* Run: workspace from the context's stream-ordered pool, cu_seqlens copied in, kernels queued. */
static fa_status run(fa_context_t ctx, cuda_state *s, const fa_problem *p, int backward,
                     fa_run_info *info)
{
    call c;
    fa_status st = prepare(ctx, s, p, backward, &c);
    if (st != FA_OK || (st = check_pointers(ctx, s, p, backward)) != FA_OK)
        return st;
    report(&c, p, backward, info);
    const size_t total =
        c.acc_bytes + c.sem_bytes + c.cu_bytes + c.dsum_bytes + c.std_bytes + c.sched_bytes + c.part_bytes;
    char *ws = NULL;
    cudaError_t err;
    if (total && (err = cudaMallocFromPoolAsync((void **)&ws, total, s->pool, s->stream)) != cudaSuccess) {
        cudaGetLastError();
        return fa_error(ctx, err == cudaErrorMemoryAllocation ? FA_ERR_OUT_OF_MEMORY : FA_ERR_BACKEND,
                        "allocating %zu bytes of device workspace: %s", total, cudaGetErrorString(err));
    }
    fa_cuda_params *k = &c.kp;
    char *at = ws;
    if (c.acc_bytes) { /* first: the bulk adds want 16-byte alignment */
        k->dq_acc = (float *)at;
        k->dq_sem = (int *)(at + c.acc_bytes);
        at += c.acc_bytes + c.sem_bytes;
    }
    float *part = NULL;
    if (c.part_bytes) {
        part = (float *)at;
        at += c.part_bytes;
    }
    if (c.sched_bytes) {
        k->sched = (int *)at;
        at += c.sched_bytes;
        if ((err = cudaMemsetAsync(k->sched, 0, sizeof(int), s->stream)) != cudaSuccess)
            goto fail;
    }
    if (c.cu_bytes) {
        const size_t half = c.cu_bytes / 2;
        k->cu_q = (const int32_t *)at;
        k->cu_k = (const int32_t *)(at + half);
        err = cudaMemcpyAsync(at, p->desc->cu_seqlens_q, half, cudaMemcpyHostToDevice, s->stream);
        if (err == cudaSuccess)
            err = cudaMemcpyAsync(at + half, p->desc->cu_seqlens_k, half, cudaMemcpyHostToDevice,
                                  s->stream);
        at += c.cu_bytes;
        if (err != cudaSuccess)
            goto fail;
    }
    if (c.dsum_bytes) {
        k->dsum = (float *)at;
        k->lse2 = k->dsum + k->rows * p->heads_q;
        at += c.dsum_bytes;
    }
    if (c.std_bytes) {
        size_t n = c.std_bytes / (backward ? 8 : 6);
        k->s_ws = (float *)at;
        k->p_ws = at + 4 * n;
        k->ds_ws = backward ? at + 6 * n : NULL;
    }
    if (c.nq)
        err = fa_cuda_dense_decode(s, k, c.nq, c.decode_sm90, c.split, c.splits, part, c.bf16, s->stream);
    else if (p->desc->algorithm == FA_ALGORITHM_STANDARD)
        err = backward ? fa_cuda_standard_backward(k, c.bf16, c.krows, s->stream)
                  : c.fp8 ? fa_cuda_standard_forward_e4m3(k, s->stream)
                          : fa_cuda_standard_forward(k, c.bf16, s->stream);
    else if (backward && c.hb) {
        k->bwd_order = s->bwd_order;
        k->bwd_unordered = s->bwd_unordered;
        k->bwd_sched = s->bwd_sched ? s->bwd_sched : c.hb->dim <= 128 ? 3 : 2;
        /* bwd_sched 2's groups fit on half the device (backward_sm90_sched.cuh: bwd_work) */
        k->bwd_group = s->prop.multiProcessorCount / 2;
        if (s->bwd_group > 0 && s->bwd_group < k->bwd_group)
            k->bwd_group = s->bwd_group;
        if (s->bwd_tma)
            fa_cuda_tma_backward(s->tma_encode, k, c.bf16);
        err = fa_cuda_flash_backward_sm90(k, c.bf16, c.hb->dim, s->stream);
    } else
        err = backward ? fa_cuda_flash_backward(k, c.bf16, c.tl->dim, s->stream)
              : c.h    ? forward_sm90(s, &c, k)
                       : fa_cuda_flash_forward(k, c.bf16, c.tl->dim, s->stream);
    if (err != cudaSuccess)
        goto fail;
    if (ws && (err = cudaFreeAsync(ws, s->stream)) != cudaSuccess)
        return fa_cuda_fail(ctx, err, "releasing the workspace");
    return FA_OK;
fail:
    cudaGetLastError();
    if (ws)
        cudaFreeAsync(ws, s->stream);
    return fa_cuda_fail(ctx, err, backward ? "launching the backward" : "launching the forward");
}

static fa_status cuda_forward(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    return run(ctx, state, p, 0, info);
}

static fa_status cuda_backward(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    return run(ctx, state, p, 1, info);
}

static fa_status cuda_mem_alloc(fa_context_t ctx, void *state, size_t bytes, void **ptr)
{
    (void)state;
    cudaError_t err = cudaMalloc(ptr, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        cudaGetLastError();
        *ptr = NULL;
        return fa_error(ctx, err == cudaErrorMemoryAllocation ? FA_ERR_OUT_OF_MEMORY : FA_ERR_BACKEND,
                        "cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(err));
    }
    return FA_OK;
}

static fa_status cuda_mem_free(fa_context_t ctx, void *state, void *ptr)
{
    (void)state;
    cudaError_t err = cudaFree(ptr);
    return err == cudaSuccess ? FA_OK : fa_cuda_fail(ctx, err, "cudaFree");
}

static fa_status cuda_mem_copy(fa_context_t ctx, void *state, void *dst, const void *src, size_t bytes,
                               fa_copy_kind kind)
{
    cuda_state *s = state;
    fa_status st;
    if (kind == FA_COPY_WITHIN && ((st = fa_cuda_check_ptr(ctx, s, dst, "dst")) != FA_OK ||
                                   (st = fa_cuda_check_ptr(ctx, s, src, "src")) != FA_OK))
        return st;
    static const enum cudaMemcpyKind dir[] = {
        [FA_COPY_DOWNLOAD] = cudaMemcpyDeviceToHost,
        [FA_COPY_UPLOAD] = cudaMemcpyHostToDevice,
        [FA_COPY_WITHIN] = cudaMemcpyDeviceToDevice,
    };
    static const char *what[] = { [FA_COPY_DOWNLOAD] = "download", [FA_COPY_UPLOAD] = "upload",
                                  [FA_COPY_WITHIN] = "copy" };
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, dir[kind], s->stream);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(s->stream);
    return err == cudaSuccess ? FA_OK : fa_cuda_fail(ctx, err, what[kind]);
}

static fa_status cuda_set_stream(fa_context_t ctx, void *state, void *stream)
{
    (void)ctx;
    ((cuda_state *)state)->stream = (cudaStream_t)stream;
    return FA_OK;
}

static fa_status cuda_synchronize(fa_context_t ctx, void *state)
{
    cudaError_t err = cudaStreamSynchronize(((cuda_state *)state)->stream);
    return err == cudaSuccess ? FA_OK : fa_cuda_fail(ctx, err, "synchronize");
}

const fa_backend_iface fa_cuda_backend = {
    .id = FA_BACKEND_CUDA,
    .name = "cuda",
    .init = cuda_init,
    .destroy = cuda_destroy,
    .info = cuda_info,
    .plan = cuda_plan,
    .forward = cuda_forward,
    .plan_backward = cuda_plan_backward,
    .backward = cuda_backward,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_copy = cuda_mem_copy,
    .set_stream = cuda_set_stream,
    .synchronize = cuda_synchronize,
    .paged_plan = fa_cuda_paged_plan,
    .paged_run = fa_cuda_paged_run,
    .paged_plan_free = fa_cuda_paged_plan_free,
    .append = fa_cuda_append,
    .merge = fa_cuda_merge,
    .tables_on_device = 1,
};
