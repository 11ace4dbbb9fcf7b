// SPDX-License-Identifier: MIT
// The Hopper backwards' scheduler (backward_sm90.cuh, backward_sm90_wide.cuh): which key tile,
// kv head and sequence a block takes, the query tiles it sees and the order it takes them in,
// and each query tile's order of dQ adds, which makes the backward deterministic.
#pragma once

#include "bwd_order.h"
#include "tile.cuh"

namespace fa {

// One block per (key tile of BN keys, kv head, sequence) computes dK and dV of its keys and
// adds its share dS K of every query tile's dQ into a float32 accumulator. Determinism without
// a second pass: the key tiles that see a query tile add in a fixed order (bwd_turn), each
// waiting until a counter per (sequence, head, query tile) shows that every earlier one has
// added (blocks start in index order, and a block waits for lower ones only, already running
// or finished, but in bwd_sched 2 for those of its group, which are on the device at once).

// The query tiles (BQ rows) key tile j (BN keys) sees: [m_lo, m_lo + nm).
template <int BN, int BQ>
__device__ __forceinline__ void kv_span(const mask_t &mk, int j, int &m_lo, int &nm)
{
    const tiles_t q = tiles_of<BQ>(mk.query_range((int64_t)j * BN, (int64_t)j * BN + BN));
    m_lo = q.lo;
    nm = q.n;
}

// How many key tiles after j (of nk) also see query tile i: j + 1 .. j + n, by bisection.
template <int BN, int BQ>
__device__ __forceinline__ int tiles_after(const mask_t &mk, int j, int i, int nk)
{
    int lo = j, hi = nk - 1; // the last tile that sees i lies in [lo, hi]
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        int m_lo, nm;
        kv_span<BN, BQ>(mk, mid, m_lo, nm);
        if (nm > 0 && m_lo <= i && i < m_lo + nm)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo - j;
}

// Block index -> (key tile, kv head, sequence), head-major: the blocks of a head run together,
// share its Q and dO in L2 and add into one dQ accumulator, each a little later than the tile
// before. Key-tile-major order (every head's first tile, then every head's second: a tile's
// predecessor long finished; order 1, params.h's bwd_order) spreads the blocks running at once
// over as many accumulators as heads, which outgrow L2 (at d256 s1k its adds kept DRAM 75%
// busy under ncu): 1.22-1.55x slower backwards at d64-d256 and s1k-s2k (docs/perf). Head-major
// blocks come in groups of gs key tiles (bwd_work): every head's first group, then every
// head's second (gs = tiles: one group). Either way the key tiles run last first, so that the
// key tile a block waits for (bwd_work) has the lower index.
__device__ __forceinline__ block_t bwd_block(int tiles, int heads, int batch, int order, int gs)
{
    block_t r;
    fa_bwd_block(blockIdx.x, tiles, heads, batch, order, gs, &r.tile, &r.h, &r.b);
    return r;
}

// A block's work: key tile blk.tile (BN keys from c0; nk tiles in the sequence) of kv head
// blk.h and sequence blk.b, the query tiles it sees [m_lo, m_lo + nm), its steps (every query
// head of the group for each of those tiles), and the order of the steps and of each query
// tile's dQ adds (params.h: bwd_sched). Taken last first in key-tile order (docs/perf), the
// blocks of a head reached a tile at the same step, so the k-th waited for k adds.
//  1 (a mask): first first, the last key tile that sees a tile adding first. Under a causal
//     mask key tile j + 1, one ahead in the order, reached the tile a step or two earlier.
//  2 (no mask; every key tile sees every query tile): the key tiles, last first, in groups of
//     gs (p.bwd_group; the last group of a shorter sequence holds fewer), group g's n tiles
//     from gl = 0 at the bottom: the tile at gl starts at query tile gl nm / n and wraps around;
//     a tile's adds go group by group, within a group in the order the blocks reach it
//     (bwd_turn), so the blocks of a group start on different tiles and wait for no one, and
//     no query tile has all of a head's blocks reading and adding at once. The order wraps
//     too: every tile has one adder that waits for a higher block of its group, so a group's
//     blocks must be on the device at once: the host keeps groups to half the multiprocessors
//     (two such kernels on two streams still leave a multiprocessor free for the block one
//     waits for), and bwd_block launches a group's blocks together, after every earlier
//     group's (the only other blocks a block waits for). Kernels on other streams that hold
//     multiprocessors while they wait on each other could still stall it:
//     FLASHATTN_CUDA_BWD_SCHED=first (1 only). By default a call whose key tiles take more
//     than one group runs 1 (FLASHATTN_CUDA_BWD_SCHED=groups: groups, not yet measured).
struct bwd_work {
    block_t blk;
    seq_t s;
    mask_t mk;
    int c0, m_lo, nm, iters, nk, sched;
    int gl, gn, before; // bwd_sched 2: place in its group, the group's size, tiles of earlier groups
};
template <int BN, int BQ> __device__ __forceinline__ bool bwd_work_of(const fa_cuda_params &p, bwd_work &w)
{
    const int tiles = (p.max_k + BN - 1) / BN;
    const int gs = p.bwd_sched == 2 ? p.bwd_group : tiles;
    w.blk = bwd_block(tiles, p.heads_kv, p.batch, p.bwd_order, gs);
    w.s = seq_of(p, w.blk.b);
    w.c0 = w.blk.tile * BN;
    if (w.c0 >= w.s.sk)
        return false;
    w.mk = mask_of(p, w.s.sq, w.s.sk);
    kv_span<BN, BQ>(w.mk, w.blk.tile, w.m_lo, w.nm);
    w.iters = w.nm * p.group;
    w.nk = (w.s.sk + BN - 1) / BN;
    w.sched = p.bwd_sched; // 2 only where no mask cuts a span (fa_bwd_schedule): m_lo 0, nm every tile
    if (w.sched == 2)
        fa_bwd_group(w.blk.tile, tiles, w.nk, gs, &w.gl, &w.gn, &w.before);
    return true;
}

// Key tile w.blk.tile's place among the key tiles that add into query tile i (0: it stores).
template <int BN, int BQ> __device__ __forceinline__ int bwd_turn(const bwd_work &w, int i)
{
    if (w.sched == 2)
        return fa_bwd_turn(w.gl, w.gn, w.before, i, w.nm);
    return tiles_after<BN, BQ>(w.mk, w.blk.tile, i, w.nk);
}

// A block's steps in bwd_work's order: query tile mi of query head h (the group's heads taken
// in turn for each tile), counted one step at a time (no division per step).
struct bwd_steps {
    int h0, group, hh, mi, lo, hi;
    __device__ __forceinline__ bwd_steps(const fa_cuda_params &p, const bwd_work &w)
        : h0(w.blk.h * p.group), group(p.group), hh(0),
          mi(w.m_lo + (w.sched == 2 ? fa_bwd_start(w.gl, w.gn, w.nm) : 0)), lo(w.m_lo),
          hi(w.m_lo + w.nm)
    {
    }
    __device__ __forceinline__ int h() const { return h0 + hh; }
    __device__ __forceinline__ void next()
    {
        if (++hh == group) {
            hh = 0;
            if (++mi == hi)
                mi = lo;
        }
    }
};

} // namespace fa
