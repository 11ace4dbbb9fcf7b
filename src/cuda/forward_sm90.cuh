// SPDX-License-Identifier: MIT
// The flash forward on Hopper's warpgroup tensor cores (sm_90a). A block's NWG consumer
// warpgroups own 64 query rows each of one head; each computes S = Q K^T with wgmma from
// 128-byte-swizzled shared memory and O += P V with P straight from registers. The products
// of consecutive key tiles go out together, S(n) and P(n-1) V(n-1), so that the softmax of
// S(n) may run under the second; ptxas waits for both ahead of it where the mask's branch
// joins (bench/gpu/sass_overlap.py; forcing it ahead lost on short causal tiles:
// docs/perf/h200.md), so a softmax overlaps the other warpgroup's products (the turns
// below), not its own. One more warpgroup, its registers handed to the
// consumers (setmaxnreg), loads K/V tiles by cp.async STAGES deep through full/empty
// mbarriers, so the consumer warpgroups run free of each other and one's softmax overlaps
// another's products (measured against all threads loading behind one block barrier per
// step: docs/perf/h200.md). It loads Q as well: with two Q buffers the blocks are persistent,
// one per multiprocessor taking query tiles from a counter, and the next tile's Q and first
// K/V arrive while the last tile finishes, where a block per tile would leave the
// multiprocessor idle through each start (short causal tiles: 1.1-1.2x).
#pragma once

#include "wgmma.cuh"

namespace fa {

template <int BM, int BN, int D, int STAGES, int NQ> struct sm90_smem {
    static constexpr int q = BM * D * 2, kv = BN * D * 2;
    static constexpr size_t bytes = 1024 + NQ * (size_t)q + 2 * STAGES * (size_t)kv; // + alignment slack
};

// One warpgroup's running state: 64 rows (this thread: rows g and g + 8 of its warp's 16).
template <int D, int BN> struct sm90_rows {
    static constexpr int NS = BN / 8, ND = D / 8;
    float o[1][ND][4], sc[1][NS][4], m[1][2], l[1][2];
    uint32_t pa[1][NS / 2][4];
};

// The key tiles of BN that every one of the warp's 16 rows from wr0 sees whole: a step tests
// its tile against two integers, where all_visible took a dozen 64-bit operations a step.
template <int BN> __device__ __forceinline__ tiles_t warp_full_tiles(const mask_t &mk, int64_t wr0)
{
    return tiles_within<BN>(mk.full_key_range(wr0, wr0 + 16));
}

// S(n) (raw scores in r.sc) -> P(n) and the rescale of the running statistics (cap_in and
// scale_log2: to_logits'; slack: softmax_update's); alpha gets the factor O must be scaled by
// once P(n-1) V(n-1) is done. full: warp_full_tiles (tile n needs no mask inside it).
template <int D, int BN>
__device__ __forceinline__ void softmax_step(const fa_cuda_params &p, const mask_t &mk, const tiles_t &full,
                                             sm90_rows<D, BN> &r, int64_t wr0, int n, int g, int t,
                                             float (&alpha)[1][2], const float (&cap_in)[2],
                                             const float (&scale_log2)[2], float slack)
{
    to_logits(p, r.sc, cap_in, scale_log2);
    if (n < full.lo || n >= full.hi)
        apply_mask(mk, r.sc, wr0 + g, (int64_t)n * BN + 2 * t);
    softmax_update(r.sc, r.m, r.l, alpha, slack);
}

// The softmax slack a head dim takes: p.rescale_slack up to 128; d256, not measured with it,
// none (-1, known at compile time, so that it compiles as before).
template <int D> __device__ __forceinline__ float sm90_slack(const fa_cuda_params &p)
{
    return D <= 128 ? p.rescale_slack : -1.0f;
}

// O rescaled once P(n-1) V(n-1) is done: with slack >= 0 (softmax_update's) only where a row
// of the warp moved its reference.
template <int ND>
__device__ __forceinline__ void rescale_moved(float (&o)[1][ND][4], const float (&alpha)[1][2], float slack)
{
    if (slack < 0.0f || __any_sync(0xffffffffu, alpha[0][0] != 1.0f || alpha[0][1] != 1.0f))
        rescale(o, alpha);
}

// Normalise and write this warpgroup's 64 rows (and their lse). With 16-byte-aligned rows the
// tile goes out through the warpgroup's own rows of the Q tile (its last S has been read) as
// whole 16-byte row pieces.
template <typename T, int D, int BM, int BN>
__device__ __forceinline__ void store_rows(const fa_cuda_params &p, const sm90_rows<D, BN> &r,
                                           const seq_t &s, int h, int r0, int wg, int warp, int g,
                                           int t, unsigned char *sQ)
{
    constexpr int ND = D / 8;
    const int wr0 = r0 + wg * 64 + warp * 16;
    float inv[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const row_out_t out = softmax_out(r.m[0][hf], r.l[0][hf], p.dropout_scale);
        inv[hf] = out.inv;
        const int i = wr0 + g + hf * 8;
        if (p.lse && t == 0 && i < s.sq)
            p.lse[lse_index(p, s, h, i)] = out.lse;
    }
    if (p.o_vec) {
#pragma unroll
        for (int dt = 0; dt < ND; dt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                *reinterpret_cast<uint32_t *>(sQ + sw_offset<BM>(wg * 64 + warp * 16 + g + hf * 8,
                                                                 dt * 8 + 2 * t)) =
                    pack2<T>(r.o[0][dt][2 * hf] * inv[hf], r.o[0][dt][2 * hf + 1] * inv[hf]);
        named_barrier(1 + wg, 128);
        for (int c = threadIdx.x % 128; c < 64 * ND; c += 128) {
            const int rr = c / ND, col = (c % ND) * 8, i = r0 + wg * 64 + rr;
            if (i < s.sq && col < p.dim)
                *reinterpret_cast<uint4 *>((T *)p.o.p + row_off(p.o, s, false, h, i) + col) =
                    *reinterpret_cast<const uint4 *>(sQ + sw_offset<BM>(wg * 64 + rr, col));
        }
    } else {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int i = wr0 + g + hf * 8;
            if (i >= s.sq)
                continue;
            const int64_t off = row_off(p.o, s, false, h, i);
#pragma unroll
            for (int dt = 0; dt < ND; dt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int x = dt * 8 + 2 * t + e;
                    if (x < p.dim)
                        store<T>(p.o, off + x, r.o[0][dt][2 * hf + e] * inv[hf]);
                }
        }
    }
}

template <int D, int BN> __device__ __forceinline__ void init_rows(sm90_rows<D, BN> &r)
{
    zero(r.o);
    softmax_init(r.m, r.l);
}

// The K/V ring's barriers, and the hand-over of query tiles. full: the producer's 128 threads
// arrive once their copies of a stage have landed; empty: each consumer warp arrives once its
// products have read the stage. The producer takes each query tile (item: block_of's index)
// and passes it on with its Q through q_full; the consumer warps hand the Q buffer back
// through q_empty once their rows are out (the buffer stages them).
template <int STAGES, int NQ> struct kv_ring {
    uint64_t full_k[STAGES], full_v[STAGES], empty_k[STAGES], empty_v[STAGES];
    uint64_t q_full[NQ], q_empty[NQ];
    int item[NQ];
};

// A block's next query tile, -1 when none is left. Persistent blocks (p.sched: a counter zeroed
// before the launch) take the next one no block has taken, so blocks that finish early take
// more, in block_of's order (the heaviest causal tiles first); the loader's thread 0 takes it
// and passes it on in ring.item. Otherwise (own_item) a block's k-th tile is its own for k = 0
// and none after, known to every thread.
__device__ __forceinline__ int next_item(const fa_cuda_params &p, int items)
{
    const int x = atomicAdd(p.sched, 1);
    return x < items ? x : -1;
}
__device__ __forceinline__ int own_item(int k) { return k == 0 ? (int)blockIdx.x : -1; }

// The loading warpgroup's k-th query tile: once the consumers have given its Q buffer back,
// the tile (p.sched: taken by thread 0 and passed on in ring.item) into qt. Returns 1 where it
// has keys to load; 0 where it has none and -1 where no tile is left, the buffer then handed
// over empty (the consumers see why themselves). The fp8 loaders call it; load_tiles has it
// written out.
template <int BM, int BN, int NWG, int STAGES, int NQ>
__device__ __forceinline__ int loader_next_tile(const fa_cuda_params &p, int items, kv_ring<STAGES, NQ> &ring,
                                                int k, int tid, query_tile_t &qt)
{
    const int qb = k % NQ;
    if (k >= NQ && !(drop_ordering(p, FA_DROP_FORWARD) & 1))
        mbar_wait(&ring.q_empty[qb], (k / NQ - 1) & 1);
    int x = own_item(k);
    if (p.sched) {
        if (tid == 0)
            ring.item[qb] = next_item(p, items);
        named_barrier(NWG + 1, 128);
        x = ring.item[qb];
    }
    if (x < 0 || !query_tile<BM, BN, true>(p, qt, x) || qt.n_lo == qt.n_hi) {
        mbar_arrive(&ring.q_full[qb]);
        return x < 0 ? -1 : 0;
    }
    return 1;
}

// The producer's key tiles of query tile qt from whole pages by TMA (p.pg.tma_rows; dense
// fixed-length keys are pages of one sequence each, p.pg.table NULL), each
// stage handed over as soon as its copies are issued (the boxes count themselves off the
// barrier); Q, and a last page's rows, by cp.async, landed before their hand-over. Returns
// the ring position after them.
template <typename T, int D, int BN, int NWG, int STAGES, int NQ, bool GROUPED>
__device__ __forceinline__ int load_keys_tma(const fa_cuda_params &p, const query_tile_t &qt, int qb, int it,
                                          kv_ring<STAGES, NQ> &ring, unsigned char *sK, unsigned char *sV, int tid)
{
    constexpr int KV = BN * D * 2;
    const int b = qt.blk.b, hk = qt.hk, sk = qt.s.sk;
    const bool paged = p.pg.table != nullptr;
    for (int n = qt.n_lo; n < qt.n_hi; n++, it++) {
        const int st = it % STAGES, c = n * BN;
        // dense keys (fixed length): sequence b is page b of seqlen_k rows, its tail past the
        // map's bounds (zeros) counted as whole
        const int page = paged ? tma_piece_page<BN, D>(p.pg, b, c, sk, tid) : b, valid = paged ? sk - c : BN;
        if (it >= STAGES)
            mbar_wait(&ring.empty_k[st], (it / STAGES - 1) & 1);
        bool rest = load_tile_tma<T, BN, D, GROUPED>(sK + st * KV, &p.pg.tk, p.pg, page, b, hk, (const T *)p.k.p,
                                                  p.pg.k_sp, p.pg.k_st, hk * p.k.sh, c, valid, p.dim,
                                                  &ring.full_k[st], tid);
        if (rest || n == qt.n_lo) {
            cp_async_commit();
            cp_async_wait<0>();
            fence_async_smem();
        }
        if (n == qt.n_lo)
            mbar_arrive(&ring.q_full[qb]);
        mbar_arrive(&ring.full_k[st]);
        if (it >= STAGES)
            mbar_wait(&ring.empty_v[st], (it / STAGES - 1) & 1);
        rest = load_tile_tma<T, BN, D, GROUPED>(sV + st * KV, &p.pg.tv, p.pg, page, b, hk, (const T *)p.v.p,
                                             p.pg.v_sp, p.pg.v_st, hk * p.v.sh, c, valid, p.dim, &ring.full_v[st],
                                             tid);
        if (rest) {
            cp_async_commit();
            cp_async_wait<0>();
            fence_async_smem();
        }
        mbar_arrive(&ring.full_v[st]);
    }
    return it;
}

// The producer warpgroup: for each query tile it takes, Q into buffer k % NQ once the consumers
// have given it back, then K(n) and V(n) into ring stage it % STAGES (it: tiles loaded so far,
// across query tiles) once the consumers have let go of what was there, each handed over when
// its copies have landed (V one step later, as the consumers use it one step later). With two
// Q buffers the next tile's Q and first K/V load while the consumers finish the last one.
template <typename T, int D, int BN, int NWG, int STAGES, int NQ, bool TMA, bool GROUPED>
__device__ __forceinline__ void load_tiles(const fa_cuda_params &p, int items, kv_ring<STAGES, NQ> &ring,
                                           unsigned char *sQ, unsigned char *sK, unsigned char *sV,
                                           int tid)
{
    constexpr int BM = 64 * NWG, QB = BM * D * 2, KV = BN * D * 2;
    __shared__ int pages[2][BN]; // paged keys: the pages of the last two key tiles' rows
    static_assert(sm90_smem<BM, BN, D, STAGES, NQ>::bytes + sizeof(kv_ring<STAGES, NQ>) + sizeof(pages) <= 232448,
                  "dynamic and static shared memory within Hopper's 227 KiB a block");
    int it = 0;
    for (int k = 0;; k++) {
        // loader_next_tile written out: through the helper this loader spilled its registers
        const int qb = k % NQ;
        if (k >= NQ && !(drop_ordering(p, FA_DROP_FORWARD) & 1))
            mbar_wait(&ring.q_empty[qb], (k / NQ - 1) & 1);
        int x = own_item(k);
        if (p.sched) {
            if (tid == 0)
                ring.item[qb] = next_item(p, items);
            named_barrier(NWG + 1, 128);
            x = ring.item[qb];
        }
        query_tile_t qt;
        if (x < 0 || !query_tile<BM, BN, true>(p, qt, x) || qt.n_lo == qt.n_hi) {
            mbar_arrive(&ring.q_full[qb]); // nothing to load: the consumers see why themselves
            if (x < 0)
                return;
            continue;
        }
        const seq_t &s = qt.s;
        load_tile_sw<T, BM, D, 128>(sQ + qb * QB, (const T *)p.q.p + row_off(p.q, s, false, qt.blk.h, qt.r0),
                                    p.q.ss, s.sq - qt.r0, p.dim, p.aligned, tid);
        cp_async_commit();
        if constexpr (TMA) {
            it = load_keys_tma<T, D, BN, NWG, STAGES, NQ, GROUPED>(p, qt, qb, it, ring, sK, sV, tid);
            continue;
        }
        const T *gK = (const T *)p.k.p + row_off(p.k, s, true, qt.hk, 0);
        const T *gV = (const T *)p.v.p + row_off(p.v, s, true, qt.hk, 0);
        for (int n = qt.n_lo; n < qt.n_hi; n++, it++) {
            const int st = it % STAGES, c = n * BN;
            int *ids = pages[it & 1]; // paged keys: each row's page looked up once a tile
            if (p.pg.table) {
                for (int r = tid; r < BN; r += 128)
                    ids[r] = c + r < s.sk ? page_slot(p.pg, qt.blk.b, c + r).page : -1;
                named_barrier(NWG + 1, 128); // also: every thread is done with tile it - 2's ids
            }
            if (it >= STAGES)
                mbar_wait(&ring.empty_k[st], (it / STAGES - 1) & 1);
            if (p.pg.table)
                load_tile_paged<T, BN, D, 128>(sK + st * KV, p.pg, ids, (const T *)p.k.p, p.pg.k_sp, p.pg.k_st,
                                               qt.hk * p.k.sh, c, s.sk - c, p.dim, tid);
            else
                load_tile_sw<T, BN, D, 128>(sK + st * KV, gK + c * p.k.ss, p.k.ss, s.sk - c, p.dim,
                                            p.aligned, tid);
            cp_async_commit();
            cp_async_wait<1>(); // Q, or V(n-1), has landed
            fence_async_smem();
            mbar_arrive(n == qt.n_lo ? &ring.q_full[qb] : &ring.full_v[(it - 1) % STAGES]);
            if (it >= STAGES)
                mbar_wait(&ring.empty_v[st], (it / STAGES - 1) & 1);
            if (p.pg.table)
                load_tile_paged<T, BN, D, 128>(sV + st * KV, p.pg, ids, (const T *)p.v.p, p.pg.v_sp, p.pg.v_st,
                                               qt.hk * p.v.sh, c, s.sk - c, p.dim, tid);
            else
                load_tile_sw<T, BN, D, 128>(sV + st * KV, gV + c * p.v.ss, p.v.ss, s.sk - c, p.dim,
                                            p.aligned, tid);
            cp_async_commit();
            cp_async_wait<1>(); // K(n) has landed
            fence_async_smem();
            mbar_arrive(&ring.full_k[st]);
        }
        cp_async_wait<0>();
        fence_async_smem();
        mbar_arrive(&ring.full_v[(it - 1) % STAGES]);
    }
}

// Ping-pong (TURNS: a mainloop of two consumer warpgroups at head_dim <= 128, the shapes
// measured faster with it; at run time bit NWG - 2 of p.pingpong): a warpgroup issues a key
// tile's GEMMs only in its turn and then passes the turn to the next, so that one's softmax
// runs under the others' GEMMs. The last warpgroup passes the first turn once, warpgroup 0
// takes the last one as the block ends. Named barriers: 0 the block's, 1..NWG the consumers'
// row stores, NWG + 1 the loader's, NWG + 2 + wg warpgroup wg's turn. Three warpgroups (the
// wide tiles) take none: compiled in, the turns cost their consumers a spilled pair a tile.
template <int D, int NWG> constexpr bool sm90_turns = NWG == 2 && D <= 128;
template <bool TURNS, int NWG> __device__ __forceinline__ void take_turn(const fa_cuda_params &p, int wg)
{
    if (TURNS && (p.pingpong >> (NWG - 2) & 1))
        named_barrier(NWG + 2 + wg, 256);
}
template <bool TURNS, int NWG> __device__ __forceinline__ void pass_turn(const fa_cuda_params &p, int wg)
{
    if (TURNS && (p.pingpong >> (NWG - 2) & 1))
        named_barrier_arrive(NWG + 2 + (wg + 1 == NWG ? 0 : wg + 1), 256);
}

// The lane that makes its warp's arrival on the ring: elect.sync up to head_dim 128 (lane == 0
// re-read the thread index ahead of each softmax and held it up); lane 0 at 256, whose
// consumers spilled with elect.sync.
template <int D> __device__ __forceinline__ bool ring_lead(int lane) { return D <= 128 ? elect_one() : lane == 0; }

// A consumer's place in the K/V ring, stepped along a key tile at a time (no division a step):
// stage st and phase ph of position it, sp and pp those of the position before (whose V the
// step multiplies).
template <int STAGES> struct ring_pos {
    int st, ph, sp = 0, pp = 0;
    __device__ __forceinline__ explicit ring_pos(int it) : st(it % STAGES), ph((it / STAGES) & 1) {}
    __device__ __forceinline__ void next()
    {
        sp = st, pp = ph;
        if (++st == STAGES)
            st = 0, ph ^= 1;
    }
};

// The key-tile loop of a consumer warpgroup, both Hopper forwards' (attend_rows; fp8's
// attend_rows_e4m3): from ring position it, S(n) = Q K(n)^T and P(n-1) V(n-1) issued
// together, the softmax turning S(n) into P(n), and the last P V after the loop. G holds what
// the two differ in, the products and P's operand: G::s(sf, stage) and G::pv(of, stage) issue
// them (the descriptors built once: stage s is s * KV / 16 further), G::fence_p() fences P's
// fragments and G::to_p(r) makes them from r.sc. G::scores(r.sc, n, rs) sees tile n's raw
// scores before the softmax and gives the factors of its rows' scale, G::weights(alpha, n) its
// alpha after (fp8 factors per block of rows; nothing, and factors of 1, for f16 / bf16).
template <int D, int BN, int NWG, int STAGES, int NQ, typename G>
__device__ __forceinline__ void key_tiles(const fa_cuda_params &p, const query_tile_t &qt, kv_ring<STAGES, NQ> &ring,
                                          sm90_rows<D, BN> &r, G &gm, int it, int wg, int wr0, int lane, int g,
                                          int t, float cap_in, float scale_log2)
{
    const int n_lo = qt.n_lo, n_hi = qt.n_hi;
    float(&of)[D / 2] = reinterpret_cast<float(&)[D / 2]>(r.o);
    float(&sf)[BN / 2] = reinterpret_cast<float(&)[BN / 2]>(r.sc);
    constexpr bool TURNS = sm90_turns<D, NWG>;
    ring_pos<STAGES> rp(it);
    const tiles_t full = warp_full_tiles<BN>(qt.mk, wr0);
    for (int n = n_lo; n < n_hi; n++) {
        mbar_wait(&ring.full_k[rp.st], rp.ph);
        wgmma_fence();
        take_turn<TURNS, NWG>(p, wg);
        gm.s(sf, rp.st);
        if (n > n_lo) {
            mbar_wait(&ring.full_v[rp.sp], rp.pp);
            gm.pv(of, rp.sp);
            pass_turn<TURNS, NWG>(p, wg);
            wgmma_wait<1>();
        } else {
            pass_turn<TURNS, NWG>(p, wg);
            wgmma_wait<0>();
        }
        reg_fence(sf);
        if (ring_lead<D>(lane))
            mbar_arrive(&ring.empty_k[rp.st]);
        float rs[2]; // the rows' factors of the tile's scale
        gm.scores(r.sc, n, rs);
        const float ci[2] = { cap_in * rs[0], cap_in * rs[1] }, sl[2] = { scale_log2 * rs[0], scale_log2 * rs[1] };
        float alpha[1][2];
        softmax_step(p, qt.mk, full, r, wr0, n, g, t, alpha, ci, sl, sm90_slack<D>(p));
        gm.weights(alpha, n);
        wgmma_wait<0>(); // P(n-1) V(n-1) done: o and P are ours again
        reg_fence(of);
        gm.fence_p();
        if (n > n_lo && ring_lead<D>(lane))
            mbar_arrive(&ring.empty_v[rp.sp]);
        rescale_moved(r.o, alpha, sm90_slack<D>(p));
        if (p.dropout_p > 0.0f) // dropped to 0 here; the 1/(1-p) comes in float32 at the end
            apply_dropout(p, r.sc, qt.blk.b, qt.blk.h, wr0 + g, (int64_t)n * BN + 2 * t);
        gm.to_p(r);
        rp.next();
    }
    if (n_lo < n_hi) { // the last P V
        mbar_wait(&ring.full_v[rp.sp], rp.pp);
        wgmma_fence();
        gm.pv(of, rp.sp);
        wgmma_wait<0>();
        reg_fence(of);
        if (ring_lead<D>(lane))
            mbar_arrive(&ring.empty_v[rp.sp]);
    }
}

// The f16 / bf16 products of key_tiles: P in r.pa, V (MN-major) read straight from its tile,
// K and V tiles in layout l (kv_layout_of: the loader's).
template <typename T, int D, int BN, int BM, bool GROUPED> struct sm90_products {
    static constexpr int KV = BN * D * 2;
    sm90_rows<D, BN> &r;
    kv_layout l;
    uint32_t dq, dk, dv;
    __device__ __forceinline__ sm90_products(sm90_rows<D, BN> &r_, uint32_t qa, uint32_t ka, uint32_t va)
        : r(r_), l(kv_layout_of<BN, D>(GROUPED)), dq(sw_desc_lo(qa, 16)), dk(sw_desc_lo(ka, 16)),
          dv(sw_desc_lo(va, l.cb16 << 4))
    {
        asm("" : "+r"(dq), "+r"(dk), "+r"(dv)); // opaque: kept, not rebuilt from the shared window each step
    }
    __device__ __forceinline__ void s(float (&sf)[BN / 2], int st)
    {
        wg_gemm_nt_kv<T, D, BM, BN>(sf, dq, dk + st * (KV >> 4), l);
    }
    __device__ __forceinline__ void pv(float (&of)[D / 2], int st)
    {
        wg_gemm_rn_kv<T, D, BN>(of, r.pa[0], dv + st * (KV >> 4), l);
    }
    __device__ __forceinline__ void scores(float (&)[1][BN / 8][4], int, float (&rs)[2]) { rs[0] = rs[1] = 1.0f; }
    __device__ __forceinline__ void weights(float (&)[1][2], int) {}
    __device__ __forceinline__ void fence_p() { reg_fence(r.pa[0]); }
    __device__ __forceinline__ void to_p(sm90_rows<D, BN> &rr) { to_a<T, 1, BN / 8>(rr.pa, rr.sc); }
};

// One consumer warpgroup on one query tile: its 64 rows of Q (in sQ), every key tile of the
// ring from position it, then the rows out (staged in sQ).
template <typename T, int D, int BN, int NWG, int STAGES, int NQ, bool GROUPED>
__device__ __forceinline__ void attend_rows(const fa_cuda_params &p, const query_tile_t &qt,
                                            kv_ring<STAGES, NQ> &ring, unsigned char *sQ,
                                            unsigned char *sK, unsigned char *sV, int wg, int it)
{
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wr0 = qt.r0 + wg * 64 + warp * 16; // this warp's first row
    sm90_rows<D, BN> r;
    init_rows(r);
    sm90_products<T, D, BN, 64 * NWG, GROUPED> gm(r, smem_addr(sQ) + wg * 64 * 128, smem_addr(sK), smem_addr(sV));
    key_tiles<D, BN, NWG, STAGES, NQ>(p, qt, ring, r, gm, it, wg, wr0, lane, g, t, p.cap_in, p.scale_log2);
    store_rows<T, D, 64 * NWG, BN>(p, r, qt.s, qt.blk.h, qt.r0, wg, warp, g, t, sQ);
}

// The f16 / bf16 mainloop the kernel below runs: its shared memory (Q buffers, then the K and
// V rings), the loading warpgroup's part and a consumer warpgroup's.
template <typename T, int D, int BN_, int NWG_, int STAGES_, int NQ_, bool TMA, bool GROUPED = false>
struct sm90_mainloop {
    static constexpr int BN = BN_, NWG = NWG_, STAGES = STAGES_, NQ = NQ_, BM = 64 * NWG;
    static constexpr bool TURNS = sm90_turns<D, NWG>;
    using L = sm90_smem<BM, BN, D, STAGES, NQ>;
    static constexpr size_t smem = L::bytes;
    static_assert(D % 64 == 0 && BN % 64 == 0, "tiles are whole 64-element swizzle blocks");
    static __device__ __forceinline__ void load(const fa_cuda_params &p, int items, kv_ring<STAGES, NQ> &ring,
                                                unsigned char *sQ, int tid)
    {
        unsigned char *sK = sQ + NQ * L::q;
        load_tiles<T, D, BN, NWG, STAGES, NQ, TMA, GROUPED>(p, items, ring, sQ, sK, sK + STAGES * L::kv, tid);
    }
    static __device__ __forceinline__ void attend(const fa_cuda_params &p, const query_tile_t &qt,
                                                  kv_ring<STAGES, NQ> &ring, unsigned char *sQ, int qb, int wg,
                                                  int it)
    {
        unsigned char *sK = sQ + NQ * L::q;
        attend_rows<T, D, BN, NWG, STAGES, NQ, GROUPED>(p, qt, ring, sQ + qb * L::q, sK, sK + STAGES * L::kv, wg, it);
    }
};

// The warp-specialised forward around a mainloop M: M::NWG consumer warpgroups and one loading
// warpgroup, K/V M::STAGES deep, M::NQ Q buffers. One query tile per block, or (p.sched)
// persistent blocks taking tiles until none is left.
template <typename M>
__global__ void __launch_bounds__((M::NWG + 1) * 128, 1) flash_forward_sm90_ws(const __grid_constant__ fa_cuda_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int NWG = M::NWG, STAGES = M::STAGES, NQ = M::NQ, BM = M::BM, BN = M::BN;
    extern __shared__ unsigned char smem_raw[];
    __shared__ kv_ring<STAGES, NQ> ring;
    unsigned char *sQ = align1024(smem_raw);
    const int items = (int)((int64_t)((p.max_q + BM - 1) / BM) * p.heads_q * p.batch);

    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); // uniform to the compiler
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; i++) {
            mbar_init(&ring.full_k[i], 128);
            mbar_init(&ring.full_v[i], 128);
            mbar_init(&ring.empty_k[i], 4 * NWG);
            mbar_init(&ring.empty_v[i], 4 * NWG);
        }
        for (int i = 0; i < NQ; i++) {
            mbar_init(&ring.q_full[i], 128);
            mbar_init(&ring.q_empty[i], 4 * NWG);
        }
        fence_mbar_init(); // the TMA boxes complete on these barriers
    }
    __syncthreads();
    if (wg == NWG) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(producer_regs<NWG>::value));
        M::load(p, items, ring, sQ, threadIdx.x % 128);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_regs<NWG>::value));
    if (wg == NWG - 1)
        pass_turn<M::TURNS, NWG>(p, NWG - 1); // warpgroup 0 goes first
    int it = 0; // the K/V ring's position
    for (int k = 0;; k++) {
        const int qb = k % NQ;
        if (!(drop_ordering(p, FA_DROP_FORWARD) & 2))
            mbar_wait(&ring.q_full[qb], (k / NQ) & 1);
        if (drop_ordering(p, FA_DROP_FORWARD) & 5) // slow consumers: a loader without its empty waits runs ahead
            __nanosleep(10000);
        const int x = p.sched ? ring.item[qb] : own_item(k);
        if (x < 0) {
            if (wg == 0)
                take_turn<M::TURNS, NWG>(p, 0); // the last warpgroup's last pass: none left outstanding
            return;
        }
        query_tile_t qt;
        if (query_tile<BM, BN, true>(p, qt, x)) {
            M::attend(p, qt, ring, sQ, qb, wg, it);
            it += qt.n_hi - qt.n_lo;
        }
        __syncwarp();
        if (threadIdx.x % 32 == 0)
            mbar_arrive(&ring.q_empty[qb]);
    }
#endif
}

template <typename M> cudaError_t launch_sm90_mainloop(const fa_cuda_params &p, cudaStream_t stream)
{
    cudaError_t err =
        cudaFuncSetAttribute(flash_forward_sm90_ws<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)M::smem);
    if (err != cudaSuccess)
        return err;
    const int64_t blocks = (int64_t)((p.max_q + M::BM - 1) / M::BM) * p.heads_q * p.batch;
    if (blocks == 0)
        return cudaSuccess;
    const int64_t grid = p.sched && p.sched_blocks < blocks ? p.sched_blocks : blocks;
    flash_forward_sm90_ws<M><<<(unsigned)grid, (M::NWG + 1) * 128, M::smem, stream>>>(p);
    return cudaGetLastError();
}

template <typename T, int D, int BN, int NWG, int STAGES, int NQ>
cudaError_t launch_sm90_ws(const fa_cuda_params &p, cudaStream_t stream)
{
    // K/V by TMA (p.pg.tma_rows) or by row copies: two kernels (one holding both loaders spilled
    // the producer's registers and ran the dense d128 forward 3-12% slower either way), and a
    // third for the grouped tiles of small pages (p.pg.grouped: taking either layout at run
    // time ran the dense d128 forward 4% slower on an H100)
    if constexpr (D >= 128)
        if (p.pg.tma_rows && p.pg.grouped)
            return launch_sm90_mainloop<sm90_mainloop<T, D, BN, NWG, STAGES, NQ, true, true>>(p, stream);
    return p.pg.tma_rows ? launch_sm90_mainloop<sm90_mainloop<T, D, BN, NWG, STAGES, NQ, true>>(p, stream)
                         : launch_sm90_mainloop<sm90_mainloop<T, D, BN, NWG, STAGES, NQ, false>>(p, stream);
}

} // namespace fa
