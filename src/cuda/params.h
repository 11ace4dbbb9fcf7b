/* SPDX-License-Identifier: MIT */
/* What the CUDA kernels read: one flat struct passed by value (C and CUDA C++ see the same layout). */
#ifndef FA_CUDA_PARAMS_H
#define FA_CUDA_PARAMS_H

#include <stdint.h>

/* A device tensor view: element strides, head_dim contiguous. */
typedef struct fa_cuda_view {
    const void *p;
    int64_t sb, ss, sh;
    int f32; /* stored as float32 rather than the input dtype */
} fa_cuda_view;

#ifdef __CUDACC__
#define FA_CUDA_HD __host__ __device__
#else
#define FA_CUDA_HD
#endif

/* Keys per split of a split-KV decode where the call chose none: 1024, doubled until the
 * sequence has at most FA_CUDA_SPLITS_GROWN splits. A function of the sequence's own length, so
 * its bits do not depend on the batch. 1024 keeps a 4k sequence 4 blocks a kv head; past 64k
 * keys the blocks' fixed costs and the combine grow with their number (b1 at 128k keys: 2048
 * 5-8% faster than 1024 on the H200, docs/perf/h200-decode.md). */
#define FA_CUDA_DECODE_SPLIT 1024
#define FA_CUDA_SPLITS_GROWN 64
/* Keys a stage of the Hopper decode kernel's ring (decode_sm90.cu): its TMA boxes' rows are
 * this or a page size dividing it (fa_cuda_tma_paged). */
#define FA_CUDA_DECODE_SM90_KEYS 64
static inline FA_CUDA_HD int32_t fa_cuda_seq_split(int32_t split, int grow, int32_t keys)
{
    while (grow && (int64_t)split * FA_CUDA_SPLITS_GROWN < keys)
        split *= 2;
    return split;
}

/* The most splits any sequence of at most max_k keys has. */
static inline FA_CUDA_HD int32_t fa_cuda_max_splits(int32_t split, int grow, int32_t max_k)
{
    const int64_t n = ((int64_t)max_k + split - 1) / split;
    return n < 1 ? 1 : grow && n > FA_CUDA_SPLITS_GROWN ? FA_CUDA_SPLITS_GROWN : (int32_t)n;
}

/* A TMA tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte aligned), encoded on
 * the host (tma.c) and read by the kernel from its parameters. */
#ifdef __cplusplus
#define FA_ALIGN64 alignas(64)
#else
#define FA_ALIGN64 _Alignas(64)
#endif
typedef struct fa_cuda_tmap {
    FA_ALIGN64 uint64_t opaque[16];
} fa_cuda_tmap;

/* Keys in a paged cache (fa_paged_desc) rather than k and v's rows: key j of sequence b is
 * slot j % size of page table[b * bt_stride + j / size]. Lengths and page ids come from device
 * memory and are clamped on the device (tile.cuh: paged_seq, page_slot). */
typedef struct fa_cuda_pages {
    const int32_t *table;    /* NULL: dense k and v */
    const int32_t *lens;     /* [batch] tokens cached before the call */
    int64_t bt_stride;
    int64_t k_sp, k_st, v_sp, v_st; /* element strides per page and per token (per head: k.sh, v.sh) */
    int32_t size, shift;     /* tokens a page; log2(size) when a power of two, else -1 */
    int32_t num, max_pages;  /* pages in the pool; a sequence's table row */
    int32_t total_q, append; /* packed query rows; the call's new rows are keys too */
    /* Hopper forward and decode: tma_rows > 0 when tk / tv map the pools as
     * [page][token][head][dim] boxes of tma_rows tokens x 64 columns (a key tile's whole pages
     * copied by TMA) */
    int32_t tma_rows;
    /* flat_rows > 0 (the key tile's rows; pages smaller than the tile) where each page's rows
     * continue into the next page's in memory (page stride = size x token stride): fk / fv map
     * the pools as [page * size + token][head][dim], so a tile whose pages are consecutive ids
     * takes one box a 64-column block instead of one a page */
    int32_t flat_rows;
    /* 1 (the Hopper forward; pages smaller than the tile, dim 128 or 256, heads packed or one
     * kv head): tk / tv copy a page's rows in one box of every column block (fk / fv a run's
     * in one a column block's worth of rows), and a key tile lies in shared memory as [row group][column block][8 rows][128 bytes] (wgmma.cuh:
     * kv_layout) instead of [column block][row][128 bytes] */
    int32_t grouped;
    fa_cuda_tmap tk, tv, fk, fv;
} fa_cuda_pages;

/* fp8 inputs: the descale factor of (sequence b, kv head g) at p[b * sb + g * sh], with rows
 * > 0 that of row i's block at p[b * sb + g * sh + (i / rows) * sblk]; p NULL: 1. i / rows
 * is umulhi(i, mul) >> shr (mul 0: i), exact for i < 2^31 (backend.c: divisor_of). */
typedef struct fa_cuda_descale {
    const float *p;
    int64_t sb, sh, sblk;
    int32_t rows;
    uint32_t mul;
    int32_t shr;
} fa_cuda_descale;

/* The stage rings a test build's drop_ordering reaches: the Hopper decode kernel's K/V
 * stages, the Hopper forward's Q buffers (and the query tile passed with them), the Hopper
 * backward's Q/dO stages. */
enum { FA_DROP_DECODE = 1, FA_DROP_FORWARD = 2, FA_DROP_BACKWARD = 4 };

typedef struct fa_cuda_params {
    fa_cuda_view q, k, v, o;
    fa_cuda_descale q_ds, k_ds, v_ds; /* fp8 (e4m3) inputs only */
    fa_cuda_pages pg; /* Hopper forward: pg.table set when the keys are paged */
    fa_cuda_view dout, dq, dk, dv; /* backward only */
    float *lse;                    /* NULL when not asked for (forward) */
    int64_t lse_sb, lse_sh, lse_ss;
    float *dsum;      /* backward: rowsum(dO * O), [heads_q, rows] */
    float *lse2;      /* backward: lse in log2 units (+inf for a row that saw no key), [heads_q, rows] */
    float *dq_acc;    /* Hopper backward: dQ / scale in float32, [heads_q, dq_htiles, 64 x dim] */
    int *dq_sem;      /* its hand-over counters: [batch, heads_q, dq_tiles] */
    int32_t dq_htiles, dq_tiles;
    int *sched;           /* Hopper forward: the query tiles handed out so far (zeroed before the
                           * launch) when persistent blocks take them, else NULL (a block a tile) */
    int32_t sched_blocks; /* the persistent blocks: one per multiprocessor */
    int32_t pingpong;     /* Hopper forward: bit NWG - 2, NWG consumer warpgroups' GEMMs take
                           * turns (forward_sm90.cuh: take_turn; two only, so far) */
    /* Hopper backward: bwd_tma when tq / tdo map q and dout as [batch][head][seq][dim] in boxes
     * of 64 rows x 128 bytes (fa_cuda_tma_backward); else the loader copies rows */
    int32_t bwd_tma;
    fa_cuda_tmap tq, tdo;
    int32_t bwd_unordered; /* Hopper backward: dQ shares added as they come, into an accumulator
                            * zeroed first (FLASHATTN_CUDA_BWD_UNORDERED=1: what the order
                            * costs; not deterministic) */
    int32_t bwd_order;    /* Hopper backward's block order (bwd_block): 1 key-tile major
                           * (FLASHATTN_CUDA_BWD_ORDER=key, for comparison), else head major */
    int32_t bwd_sched;    /* Hopper backward's order of steps and dQ adds (bwd_work): 1 first
                           * first, 2 as 1 but unmasked sequences staggered in groups of key
                           * tiles; the launch passes 2 for one group at most (d256), 3 for
                           * any number (d64, d128), the kernel 1 or 2 */
    int32_t bwd_group;    /* bwd_sched 2's most key tiles a group: the launch passes at most
                           * half the multiprocessors (FLASHATTN_CUDA_BWD_GROUP caps it), the
                           * kernel the groups' even size (bwd_order.h: fa_bwd_schedule) */
    float rescale_slack;  /* Hopper bf16 / f16 (head_dim <= 128) and fp8 forwards: softmax_update's
                           * slack; < 0: O rescaled every key tile, else only where a row of the
                           * warp moved its reference */
    int64_t rows;     /* packed query rows: batch * seqlen_q, or the varlen total */
    const int32_t *cu_q, *cu_k; /* device copies of cu_seqlens, NULL for fixed length */
    int32_t batch, heads_q, heads_kv, group, dim, seqlen_q, seqlen_k;
    int32_t max_q, max_k;
    float scale;      /* softmax scale */
    float scale_log2; /* scale * log2(e): scores go to exp2 */
    float softcap;    /* 0 = off */
    float cap_in;     /* scale / softcap */
    float cap_out;    /* softcap * log2(e) */
    int64_t win_left, win_right; /* resolved; causal folded in */
    int aligned;      /* every row start 16-byte aligned and head_dim % 8 == 0 (fp8: % 16): vector loads */
    int o_vec;        /* the same for o, stored in the input dtype: vector stores */
    int dq_vec;       /* the same for dq (backward) */
    float dropout_p, dropout_scale;
    uint32_t dropout_threshold;
    uint64_t dropout_seed, dropout_offset;
    /* standard algorithm workspace */
    float *s_ws;
    void *p_ws, *ds_ws;
#ifdef FA_CUDA_ORDERING_TEST
    /* a test build's check that the Hopper kernels' mbarrier orderings are needed: in the
     * kernels of drop_in (FA_DROP_*), 1: the loaders skip their empty waits (the consumers
     * slowed 10 us a stage, in the forward a query tile), 2: the consumers skip their full
     * waits, 4: the consumers slowed as for 1 with every wait kept (the control) */
    int drop_ordering, drop_in;
#endif
} fa_cuda_params;

/* A paged call (fa_paged_desc on the device). `a` holds what the dense kernels' helpers read:
 * q and o (ss, sh), the pools as k and v (base and sh; page and token strides in a.pg), the
 * page table, lengths and cu_q (a.pg, a.cu_q), lse (lse_sh, lse_ss), the scale, cap and window,
 * heads, dim and bounds. Every length and page id is read on the device and clamped there: no
 * access leaves the pool. a.pg.table NULL: a dense call (fa_forward) on the decode kernel, `a`
 * filled as for the dense kernels (views with batch strides, a.cu_q and a.cu_k for varlen); the
 * pools are k and v with their batch and row strides as the page and token strides (a.pg),
 * a.pg.num = batch, and every key of a sequence is cached (no append, rope or sinks). */
typedef struct fa_cuda_paged {
    fa_cuda_params a;
    fa_cuda_view kn, vn; /* appended rows [total_q, heads_kv, dim] */
    const int32_t *positions;
    const float *rope_cos, *rope_sin, *sinks;
    int32_t rope_dim, rope_max_pos, rope_neox;
    int32_t split;      /* keys per split (grown per sequence: fa_cuda_seq_split) */
    int32_t split_grow; /* split is the default's base, grown with a sequence's length */
    int32_t max_splits; /* splits of the longest sequence the grid covers */
    int kv_aligned;     /* 16-byte cp.async of cache rows */
    /* 8 elements (16 bytes) a thread: dim and each rotated half (NeoX) or run of pairs in
     * whole 16-byte chunks (rope_dim % 16), the cos / sin tables on 16 bytes, and the rows
     * each kernel touches on 16 bytes: new k / v and the pools (append_vec), q (rotate_vec) */
    int append_vec, rotate_vec;
    int decode_sm90;    /* decode on the Hopper kernel (rows by bulk copies; needs kv_aligned) */
    int pdl;            /* Hopper: that kernel and the split combine after it launched as
                         * programmatic dependents (paged.cuh: pdl_wait) */
    int64_t decode_wide_min; /* Hopper decode grids of this many blocks or more: 3 a multiprocessor */
    float *part;        /* split partials: [max_splits][total_q][heads_q] (m, l, o[dim]) */
} fa_cuda_paged;

/* Tile shapes per padded head_dim: X(dim, fwd_m, fwd_n, fwd_warps, bwd_kv_q, bwd_kv_warps,
 * bwd_kv_dsplit, bwd_q_k, bwd_q_warps). Forward: fwd_m query rows x fwd_n keys per step.
 * Backward dK/dV: 16 keys a warp, bwd_kv_q queries per step, the head_dim split over
 * bwd_kv_dsplit warp groups. Backward dQ: 16 queries a warp, bwd_q_k keys per step. */
#define FA_CUDA_TILES(X)                    \
    X(64, 128, 64, 8, 64, 4, 1, 64, 4)      \
    X(96, 128, 64, 8, 64, 4, 1, 64, 4)      \
    X(128, 128, 64, 8, 64, 4, 1, 64, 4)     \
    X(256, 64, 32, 4, 32, 8, 2, 32, 4)

/* The Hopper (sm_90a) forward's tiles: X(dim, keys per step, consumer warpgroups, K/V stages,
 * Q buffers). Each warpgroup owns 64 query rows; head dims without a row here run the tiles
 * above. Two Q buffers: persistent blocks, the next query tile's Q and first K/V loading while
 * the last one finishes (where the grid has more tiles than multiprocessors); one: a block
 * per query tile (d128's 3 stages leave no room for a second). */
#define FA_CUDA_SM90_TILES(X) \
    X(64, 128, 2, 3, 2)       \
    X(128, 128, 2, 3, 1)      \
    X(256, 64, 2, 2, 1)

/* The Hopper forward's tiles for long queries: X(dim, keys per step, consumer warpgroups, K/V
 * stages, Q buffers, rows). A call whose query sequences have `rows` rows on average
 * (FLASHATTN_CUDA_WIDE_MIN_Q=n sets n instead) and whose grid of these tiles fills the
 * multiprocessors FA_CUDA_WIDE_WAVES times runs this row instead of its head dim's above: at
 * d64 three consumer warpgroups, two softmax warps a sub-partition where the turns of two leave
 * one, 1.00-1.12x from 2k queries and 0.89-1.00x below on an H100 (192-row tiles fit short
 * sequences worse; docs/perf/h200.md). The waves keep small grids, not measured with them, on
 * the 128-row tiles, whose 1.5x more blocks spread better over the multiprocessors. */
#define FA_CUDA_SM90_WIDE_TILES(X) X(64, 128, 3, 2, 2, 2048)
#define FA_CUDA_WIDE_WAVES 4

/* The Hopper fp8 (e4m3) forward's tiles, one row: X(dim, keys per step, consumer warpgroups,
 * K/V stages, Q buffers). Head dims up to dim run it, their columns past head_dim zeros. */
#define FA_CUDA_SM90_FP8_TILES(X) X(128, 128, 2, 3, 2)

/* The Hopper backward's tiles: X(dim, keys a block, query rows per step, Q/dO ring stages);
 * dQ added in key-tile order through p.dq_acc. 128 keys: two consumer warpgroups of 64 keys
 * each (backward_sm90.cuh); 64 keys: the two split each step's query rows, then dK's, dV's and
 * dQ's columns (backward_sm90_wide.cuh: dK and dV of 256 columns fit no other way). */
#define FA_CUDA_SM90_BWD_TILES(X) \
    X(64, 128, 64, 4)             \
    X(128, 128, 64, 3)            \
    X(256, 64, 64, 2)

#endif
