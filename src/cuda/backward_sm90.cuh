// SPDX-License-Identifier: MIT
// The flash backward on Hopper's warpgroup tensor cores (sm_90a), one pass, deterministic.
// One block per key tile of 128 keys: two consumer warpgroups of 64 keys each recompute S^T
// and dP^T for every query tile (and query head of the group) the mask lets them see,
// accumulate dK and dV in registers, and stage their share dS K of dQ in shared memory (a
// step's dQ is taken one step later, so that neither warpgroup waits for the other's). A
// loading warpgroup holds two warps that fill a STAGES-deep ring of Q / dO tiles through
// full/empty mbarriers, and one or two writer threads that add the staged shares into a
// float32 dQ accumulator with bulk adds, in a fixed order of key tiles. A short kernel then
// writes dQ in the output's dtype.
#pragma once

#include "backward_sm90_sched.cuh"
#include "wgmma.cuh"

namespace fa {

template <int STAGES> struct stage_ring {
    uint64_t full[STAGES], empty[STAGES];
};

// Set up by one thread before the block barrier: full counts two arrivals per loading thread
// (see fill_ring), empty the consumers' warps.
template <int STAGES>
__device__ __forceinline__ void ring_init(stage_ring<STAGES> &ring, int loaders, int warps)
{
    for (int i = 0; i < STAGES; i++) {
        mbar_init(&ring.full[i], 2 * loaders);
        mbar_init(&ring.empty[i], warps);
    }
}

// The loading warps: step i's tiles into stage i % STAGES (load(i, st) issues the copies and
// any plain stores) once the consumers have let go of what was there. Each thread arrives on
// the stage's full barrier twice: at once for its plain stores, and by cp.async's own arrival
// when its copies land, so that no loader waits for its copies and a stage is handed over the
// moment it is complete (the consumers fence it for the tensor cores after their wait).
template <int STAGES, typename F>
__device__ __forceinline__ void fill_ring(stage_ring<STAGES> &ring, int steps, int drop, F load)
{
    for (int i = 0; i < steps; i++) {
        const int st = i % STAGES;
        if (i >= STAGES && !(drop & 1))
            mbar_wait(&ring.empty[st], (i / STAGES - 1) & 1);
        load(i, st);
        cp_async_mbar_arrive(&ring.full[st]);
        mbar_arrive(&ring.full[st]);
    }
    cp_async_wait<0>();
}

// 64 rows of a [seq, head_dim] slab into rows wg * 64 .. of a swizzled tile of PITCH rows,
// by the warpgroup's own 128 threads, waited for and visible to its wgmma.
template <typename T, int D, int PITCH>
__device__ __forceinline__ void load_own_rows(unsigned char *tile, const T *g, int64_t row_stride,
                                              int valid_rows, const fa_cuda_params &p, int wg)
{
    load_tile_sw<T, 64, D, 128>(tile + wg * 64 * 128, g, row_stride, valid_rows, p.dim, p.aligned,
                                threadIdx.x % 128, PITCH);
}

// Scaled accumulator rows (64 of them, rows row0 + 16 warp + g (+8); N columns from col0)
// out to view v.
template <typename T, int N>
__device__ __forceinline__ void store_acc(const fa_cuda_view &v, const float (&acc)[1][N / 8][4],
                                          const seq_t &s, bool is_k, int h, int64_t row0, int limit,
                                          int dim, float scale, int g, int t, int col0 = 0)
{
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int64_t r = row0 + g + hf * 8;
        if (r >= limit)
            continue;
        const int64_t off = row_off(v, s, is_k, h, r);
#pragma unroll
        for (int dt = 0; dt < N / 8; dt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int x = col0 + dt * 8 + 2 * t + e;
                if (x < dim)
                    store<T>(v, off + x, acc[0][dt][2 * hf + e] * scale);
            }
    }
}

// One ring stage: BQ query rows of Q and dO (their lse and D sit in a separate array of stages,
// so that the tiles stay 1024-byte aligned without padding).
template <int D, int BQ> struct kv_stage {
    static constexpr int tile = BQ * D * 2; // Q, then dO
    static constexpr int bytes = 2 * tile;
    static constexpr int stats = 2 * BQ;    // floats: lse, then D
};

// dQ's columns: at d128 each warpgroup takes half of them every step (the whole would not fit
// in registers beside dK and dV); below, each warpgroup takes all of them in alternate steps
// (at d64 the two measure within 1% of each other).
template <int D> __host__ __device__ constexpr bool bwd_split() { return D >= 128; }

// The float32 dQ accumulator: one block of 64 x D floats per (head, query tile), query tile
// i of sequence b at dq_tile_base + i, where the base leaves a tile of room per sequence so
// that varlen sequences need not start on a tile boundary. Inside a block the values lie in
// the order the consumers hold them, so that they stage them in shared memory with 16-byte
// stores free of bank conflicts and hand them to one bulk add: the float4 at
// ((c / 8) * 4 + r / 16) * 32 + lane holds rows r, r + 8 (r = 16 w + lane / 4) and columns
// c, c + 1 (c = 8 k + 2 (lane % 4)).
constexpr int kDqRows = 64;
__device__ __forceinline__ int64_t dq_tile_base(const fa_cuda_params &p, const seq_t &s, int b)
{
    return (s.q_base * p.seqlen_q + s.q0) / kDqRows + b;
}

// The dQ hand-over inside a block: each consumer warpgroup stages its share of a step's dQ in
// one of NB buffers of its own (full: its 4 warps have written it; empty: the writer's bulk
// add has read it); the loading warpgroup's last warp adds the step's shares in order.
template <int NB> struct dq_bars {
    uint64_t full[2][NB], empty[2][NB];
};
// dQ staging buffers per consumer warpgroup: two, but one at d128 with three ring stages
// (shared memory is full).
template <int D, int STAGES> __host__ __device__ constexpr int dq_buffers() { return D >= 128 && STAGES > 2 ? 1 : 2; }

// The loading warps' part (NT threads, tid 0 .. NT - 1): every step's Q and dO tiles and
// their rows' lse and D into the ring, in the consumers' order of steps.
template <typename T, int D, int BQ, int STAGES, int NT>
__device__ __forceinline__ void load_steps(const fa_cuda_params &p, stage_ring<STAGES> &ring, const bwd_work &w,
                                           unsigned char *ring_mem, float *stats, int tid)
{
    using S = kv_stage<D, BQ>;
    const seq_t &s = w.s;
    bwd_steps fs(p, w);
    fill_ring(ring, w.iters, drop_ordering(p, FA_DROP_BACKWARD), [&](int, int st) {
        const int h = fs.h(), i0 = fs.mi * BQ;
        fs.next();
        unsigned char *base = ring_mem + st * S::bytes;
        if (p.bwd_tma && tid == 0) { // a box a 64-column block of each tile, counted off full
            static_assert(BQ == 64, "the maps' boxes are 64 rows (fa_cuda_tma_backward)");
            mbar_expect_tx(&ring.full[st], S::bytes);
#pragma unroll
            for (int cb = 0; cb < D / 64; cb++) {
                tma_load_4d(base + cb * BQ * 128, &p.tq, cb * 64, i0, h, (int)s.q_base, &ring.full[st]);
                tma_load_4d(base + S::tile + cb * BQ * 128, &p.tdo, cb * 64, i0, h, (int)s.q_base, &ring.full[st]);
            }
        } else if (!p.bwd_tma) {
            load_tile_sw<T, BQ, D, NT>(base, (const T *)p.q.p + row_off(p.q, s, false, h, i0), p.q.ss,
                                       s.sq - i0, p.dim, p.aligned, tid);
            load_tile_sw<T, BQ, D, NT>(base + S::tile, (const T *)p.dout.p + row_off(p.dout, s, false, h, i0),
                                       p.dout.ss, s.sq - i0, p.dim, p.aligned, tid);
        }
        float *sl = stats + st * S::stats;
        const int64_t row = (int64_t)h * p.rows + s.q_base * p.seqlen_q + s.q0 + i0;
        for (int x = tid; x < BQ; x += NT) {
            const bool ok = i0 + x < s.sq;
            cp_async4(sl + x, ok ? p.lse2 + row + x : p.lse2, ok ? 4 : 0);
            cp_async4(sl + BQ + x, ok ? p.dsum + row + x : p.dsum, ok ? 4 : 0);
        }
    });
}

// Four 8x8 blocks of 16-bit values stored transposed (row addresses from lanes 8m .. 8m + 7).
__device__ __forceinline__ void stsm_x4_t(uint32_t addr, const uint32_t (&r)[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// Shared memory: K, V, two dS tiles, the ring's Q / dO tiles, their statistics, and the dQ
// staging buffers ([warpgroup][buffer]).
template <int D, int BQ> struct bwd_smem {
    static constexpr int BN = 128;
    static constexpr int kv = BN * D * 2;  // K, then V
    static constexpr int ds = BQ * BN * 2; // one dS tile; two alternate
    static constexpr int dq = BQ * (bwd_split<D>() ? D / 2 : D) * 4;
    template <int STAGES> static constexpr size_t bytes()
    {
        using S = kv_stage<D, BQ>;
        return 1024 + 2 * (size_t)kv + 2 * (size_t)ds + STAGES * (size_t)(S::bytes + 4 * S::stats) +
               2 * dq_buffers<D, STAGES>() * (size_t)dq;
    }
};

template <typename T, int D, int BQ, int STAGES, bool DROPOUT, bool SPLIT>
__device__ __forceinline__ void bwd_rows(const fa_cuda_params &p, stage_ring<STAGES> &ring,
                                           dq_bars<dq_buffers<D, STAGES>()> &bars, const bwd_work &w,
                                           unsigned char *sK, unsigned char *sV, unsigned char *sDS,
                                           unsigned char *ring_mem, const float *stats,
                                           unsigned char *sDQ, int wg)
{
    const block_t &blk = w.blk;
    const seq_t &s = w.s;
    const mask_t &mk = w.mk;
    const int c0 = w.c0, iters = w.iters;
    constexpr int BN = 128, NQ = BQ / 8, ND = D / 8;
    static_assert(BQ == 64, "dQ's product takes the step's 64 query rows as its M");
    constexpr bool OVERLAP = D + 3 * BQ / 2 <= 176;
    constexpr int DQN = SPLIT ? D / 2 : D; // dQ columns per warpgroup and step
    constexpr int NB = dq_buffers<D, STAGES>();
    using S = kv_stage<D, BQ>;
    using F = bwd_smem<D, BQ>;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int hk = blk.h;
    const int j0 = c0 + wg * 64 + warp * 16; // this warp's first key
    if (iters > 0) {
        load_own_rows<T, D, BN>(sK, (const T *)p.k.p + row_off(p.k, s, true, hk, c0 + wg * 64),
                                p.k.ss, s.sk - c0 - wg * 64, p, wg);
        load_own_rows<T, D, BN>(sV, (const T *)p.v.p + row_off(p.v, s, true, hk, c0 + wg * 64),
                                p.v.ss, s.sk - c0 - wg * 64, p, wg);
        cp_async_commit();
        cp_async_wait<0>();
        fence_async_smem();
        // both halves of K feed every dQ product
        named_barrier(3, 256);
    }
    const uint32_t ka = smem_addr(sK) + wg * 64 * 128, va = smem_addr(sV) + wg * 64 * 128;
    const uint32_t ra = smem_addr(ring_mem), dsa = smem_addr(sDS);
    // this lane's row address in a dS tile for stmatrix: block m = lane / 8 of the four holds
    // queries + 8 (m / 2), keys + 8 (m % 2)
    const int sm_q = lane % 8 + 8 * ((lane / 8) / 2), sm_k = wg * 64 + warp * 16 + 8 * ((lane / 8) % 2);

    float dk[1][ND][4], dv[1][ND][4], sc[1][NQ][4], dp[1][NQ][4];
    uint32_t pa[1][NQ / 2][4], da[1][NQ / 2][4];
    float dq[DQN / 2];
    float(&dkf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dk);
    float(&dvf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dv);
    float(&sf)[BQ / 2] = reinterpret_cast<float(&)[BQ / 2]>(sc);
    float(&dpf)[BQ / 2] = reinterpret_cast<float(&)[BQ / 2]>(dp);
    zero(dk);
    zero(dv);
    // This warpgroup's share of step q's dQ, dS K from dS tile q & 1, staged for the writer in
    // the accumulator's order once its last add has read the buffer. d128: every step, half
    // the columns each; below: every other step, all columns.
    auto dq_share = [&](int q) {
        if (!SPLIT && (q & 1) != wg)
            return;
        wgmma_fence();
        // the half's first column c sits c / 64 column blocks and c % 64 elements in
        const int c = SPLIT ? wg * DQN : 0;
        wg_gemm_sn<T, DQN, BN, BQ, BN>(dq, dsa + (q & 1) * F::ds,
                                       smem_addr(sK) + (c / 64) * BN * 128 + (c % 64) * 2);
        wgmma_wait<0>();
        reg_fence(dq);
        const int kq = SPLIT ? q : q / 2, nb = kq % NB;
        if (kq >= NB)
            mbar_wait(&bars.empty[wg][nb], (kq / NB - 1) & 1);
        float4 *buf = reinterpret_cast<float4 *>(sDQ + nb * F::dq);
#pragma unroll
        for (int dt = 0; dt < DQN / 8; dt++)
            buf[(dt * 4 + warp) * 32 + lane] = make_float4(dq[4 * dt], dq[4 * dt + 1], dq[4 * dt + 2], dq[4 * dt + 3]);
        fence_async_smem();
        __syncwarp();
        if (lane == 0)
            mbar_arrive(&bars.full[wg][nb]);
    };
    // End of step q of warpgroup w (its dS of q stored, its share of q - 1's dQ read from dS
    // tile (q - 1) & 1): named barrier 4 + 2 w + q % 2, arrived at by w and waited for by the
    // other warpgroup before it stores dS of q + 1 (into the tile q - 1 used) and takes its
    // share of q's dQ. Two ids per warpgroup, so that w never arrives twice before the wait.
    auto end_of_step = [&](int w, int q) { return 4 + 2 * w + (q & 1); };
    // the query tiles every row of which sees all 16 of this warp's keys: a step tests its
    // tile against two integers instead of applying the mask
    const tiles_t full = tiles_within<BQ>(mk.full_query_range(j0, j0 + 16));
    bwd_steps fs(p, w);
    for (int it = 0; it < iters; it++, fs.next()) {
        const int st = it % STAGES, h = fs.h(), i0 = fs.mi * BQ;
        const bool all_seen = fs.mi >= full.lo && fs.mi < full.hi;
        const uint32_t qa = ra + st * S::bytes, oa = qa + S::tile;
        const float *sl = stats + st * S::stats;
        if (!(drop_ordering(p, FA_DROP_BACKWARD) & 2))
            mbar_wait(&ring.full[st], (it / STAGES) & 1);
        if (drop_ordering(p, FA_DROP_BACKWARD) & 5) // slow consumers: loaders without their empty waits run ahead
            __nanosleep(10000);
        fence_async_smem(); // the loaders' writes, seen through the barrier, for the tensor cores
        wgmma_fence();
        wg_gemm_nt<T, D, BN, BQ>(sf, ka, qa);  // S^T = K Q^T
        wg_gemm_nt<T, D, BN, BQ>(dpf, va, oa); // dP^T = V dO^T
        if constexpr (OVERLAP) {
            if (it > 0) { // the previous step's dV += P^T dO, dK += dS^T Q under this step's work
                const uint32_t pq = ra + ((it - 1) % STAGES) * S::bytes;
                wg_gemm_rn<T, D, BQ>(dvf, pa[0], pq + S::tile);
                wg_gemm_rn<T, D, BQ>(dkf, da[0], pq);
                wgmma_wait<2>();
            } else {
                wgmma_wait<0>();
            }
            reg_fence(sf);
            reg_fence(dpf);
            kv_grads<NQ, DROPOUT>(p, mk, all_seen, blk.b, h, sc, dp, sl, sl + BQ, i0, j0, g, t);
            wgmma_wait<0>(); // the previous step's products are done with pa, da and its stage
            reg_fence(dkf);
            reg_fence(dvf);
            reg_fence(pa[0]);
            reg_fence(da[0]);
            __syncwarp(); // every lane's reads of the stage's statistics before lane 0 lets it go
            if (it > 0 && lane == 0)
                mbar_arrive(&ring.empty[(it - 1) % STAGES]);
            to_a<T, 1, NQ>(pa, sc);
            to_a<T, 1, NQ>(da, dp);
        } else {
            wgmma_wait<0>();
            reg_fence(sf);
            reg_fence(dpf);
            kv_grads<NQ, DROPOUT>(p, mk, all_seen, blk.b, h, sc, dp, sl, sl + BQ, i0, j0, g, t);
            to_a<T, 1, NQ>(pa, sc);
            to_a<T, 1, NQ>(da, dp);
            wgmma_fence();
            wg_gemm_rn<T, D, BQ>(dvf, pa[0], oa); // dV += P^T dO
            wg_gemm_rn<T, D, BQ>(dkf, da[0], qa); // dK += dS^T Q
        }
        // dS (queries x keys) into this step's dS tile, both warpgroups' 64 keys side by side,
        // once the other warpgroup is done with the step before (and so with this tile's dS of
        // two steps ago); then this warpgroup's share of the previous step's dQ, whose dS is
        // complete by the same wait. One step of slack: neither waits for the other's dQ.
        if (it > 0)
            named_barrier(end_of_step(1 - wg, it - 1), 256);
        const uint32_t dst = dsa + (it & 1) * F::ds;
#pragma unroll
        for (int kt = 0; kt < NQ / 2; kt++)
            stsm_x4_t(dst + sw_offset(kt * 16 + sm_q, sm_k, BQ), da[0][kt]);
        fence_async_smem();
        if constexpr (!OVERLAP) {
            wgmma_wait<0>();
            reg_fence(dkf);
            reg_fence(dvf);
            __syncwarp();
            if (lane == 0)
                mbar_arrive(&ring.empty[st]);
        }
        if (it > 0)
            dq_share(it - 1);
        named_barrier_arrive(end_of_step(wg, it), 256);
    }
    if (iters > 0) { // the last step's dQ
        named_barrier(end_of_step(1 - wg, iters - 1), 256);
        dq_share(iters - 1);
    }
    if (OVERLAP && iters > 0) {
        const uint32_t pq = ra + ((iters - 1) % STAGES) * S::bytes;
        wgmma_fence();
        wg_gemm_rn<T, D, BQ>(dvf, pa[0], pq + S::tile);
        wg_gemm_rn<T, D, BQ>(dkf, da[0], pq);
        wgmma_wait<0>();
        reg_fence(dkf);
        reg_fence(dvf);
    }
    store_acc<T, D>(p.dk, dk, s, true, hk, j0, s.sk, p.dim, p.scale, g, t);
    store_acc<T, D>(p.dv, dv, s, true, hk, j0, s.sk, p.dim, p.dropout_scale, g, t);
}

// One step of a dQ writer (one thread): once the key tiles before this one have added their
// shares of the query tile (turn of them, counted at sem), n shares of `bytes` from shared
// memory at src + i * src_step added into the float32 accumulator at dst + i * dst_step (the
// first key tile stores instead: the accumulator is not zeroed beforehand); release() once
// the adds have read their sources, and the step counted once they have been performed.
// unordered (params.h: bwd_unordered): no turn, every share added into a zeroed accumulator.
template <typename R>
__device__ __forceinline__ void dq_add_step(int *sem, int turn, bool unordered, float *dst, int64_t dst_step,
                                            uint32_t src, uint32_t src_step, int n, int bytes, R release)
{
    while (!unordered && ld_acquire(sem) < turn) {
    }
    fence_async_all();
    for (int i = 0; i < n; i++) {
        if (turn == 0 && !unordered)
            bulk_store_f32(dst + i * dst_step, src + i * src_step, bytes);
        else
            bulk_reduce_add_f32(dst + i * dst_step, src + i * src_step, bytes);
    }
    bulk_commit();
    bulk_wait_read_all();
    release();
    bulk_wait_all();
    fence_async_all();
    red_release_add(sem, 1);
}

// The dQ writers (one thread each): the staged dQ shares of every step, added into the
// accumulator in their order (bwd_turn), the buffers handed back as soon as the adds have read them.
// d128 has one writer for both warpgroups' halves; below, writer w takes the steps whose dQ
// warpgroup w computes, so that the two add and wait for the adds to land side by side.
template <bool SPLIT> __host__ __device__ constexpr int dq_writers() { return SPLIT ? 1 : 2; }
template <int D, int BQ, int STAGES, bool SPLIT>
__device__ __forceinline__ void dq_writer(const fa_cuda_params &p, dq_bars<dq_buffers<D, STAGES>()> &bars,
                                          const bwd_work &w, const unsigned char *sDQ, int writer)
{
    constexpr int BN = 128, DQN = SPLIT ? D / 2 : D, NB = dq_buffers<D, STAGES>(), NW = dq_writers<SPLIT>();
    using F = bwd_smem<D, BQ>;
    const int64_t base = dq_tile_base(p, w.s, w.blk.b);
    bwd_steps fs(p, w);
    for (int it = 0; it < w.iters; it++, fs.next()) {
        if (it % NW != writer)
            continue;
        const int w0 = SPLIT ? 0 : it % 2, w1 = SPLIT ? 2 : w0 + 1, kq = SPLIT ? it : it / 2, nb = kq % NB;
        for (int x = w0; x < w1; x++)
            mbar_wait(&bars.full[x][nb], (kq / NB) & 1);
        float *acc = p.dq_acc + ((int64_t)fs.h() * p.dq_htiles + base + fs.mi) * kDqRows * D;
        dq_add_step(p.dq_sem + ((int64_t)w.blk.b * p.heads_q + fs.h()) * p.dq_tiles + fs.mi,
                    bwd_turn<BN, BQ>(w, fs.mi), p.bwd_unordered, acc, (int64_t)BQ * DQN,
                    smem_addr(sDQ + (w0 * NB + nb) * F::dq), NB * F::dq, w1 - w0, BQ * DQN * 4, [&] {
                        for (int x = w0; x < w1; x++)
                            mbar_arrive(&bars.empty[x][nb]);
                    });
    }
}

template <typename T, int D, int BQ, int STAGES, bool DROPOUT, bool SPLIT>
__global__ void __launch_bounds__(384, 1) backward_sm90(const __grid_constant__ fa_cuda_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BN = 128;
    using S = kv_stage<D, BQ>;
    using F = bwd_smem<D, BQ>;
    extern __shared__ unsigned char smem_raw[];
    __shared__ stage_ring<STAGES> ring;
    constexpr int NB = dq_buffers<D, STAGES>();
    __shared__ dq_bars<NB> bars;
    unsigned char *sK = align1024(smem_raw), *sV = sK + F::kv, *sDS = sV + F::kv;
    unsigned char *ring_mem = sDS + 2 * F::ds;
    float *stats = reinterpret_cast<float *>(ring_mem + STAGES * S::bytes);
    unsigned char *sDQ = reinterpret_cast<unsigned char *>(stats + STAGES * S::stats);

    bwd_work work;
    if (!bwd_work_of<BN, BQ>(p, work))
        return;
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); // uniform to the compiler
    // the loading warpgroup's first two warps; the others add dQ
    constexpr int LOADERS = 64, WRITERS = dq_writers<SPLIT>();
    if (threadIdx.x == 0) {
        ring_init(ring, LOADERS, 8);
        for (int w = 0; w < 2; w++)
            for (int i = 0; i < NB; i++) {
                mbar_init(&bars.full[w][i], 4);
                mbar_init(&bars.empty[w][i], 1);
            }
        fence_mbar_init(); // the TMA boxes (bwd_tma) complete on the ring's full barriers
    }
    __syncthreads();
    if (wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(producer_regs<2>::value));
        const int tid = threadIdx.x % 128;
        if (tid >= LOADERS) {
            const int w = (tid - LOADERS) / 32;
            if (tid % 32 == 0 && w < WRITERS)
                dq_writer<D, BQ, STAGES, SPLIT>(p, bars, work, sDQ, w);
            return;
        }
        load_steps<T, D, BQ, STAGES, LOADERS>(p, ring, work, ring_mem, stats, tid);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_regs<2>::value));
        bwd_rows<T, D, BQ, STAGES, DROPOUT, SPLIT>(p, ring, bars, work, sK, sV, sDS, ring_mem, stats,
                                                   sDQ + wg * NB * F::dq, wg);
    }
#endif
}

// dq = scale * the float32 accumulator, one block per (query tile, head, sequence); zero
// for a query tile no key tile saw (its counter still 0, its accumulator never written).
// With dq in the input dtype and 16-byte-aligned rows the tile is rounded into shared memory
// first and goes out in 16-byte row stores; otherwise element by element.
template <typename T, int D> __global__ void __launch_bounds__(256) dq_store(const fa_cuda_params p)
{
    constexpr int PITCH = D + 8; // elements; rows stay 16-byte aligned
    __shared__ __align__(16) T tile[kDqRows * PITCH];
    const block_t blk = block_of((p.max_q + kDqRows - 1) / kDqRows, p.heads_q, false);
    const seq_t s = seq_of(p, blk.b);
    const int r0 = blk.tile * kDqRows;
    if (r0 >= s.sq)
        return;
    const float4 *acc = reinterpret_cast<const float4 *>(
        p.dq_acc + ((int64_t)blk.h * p.dq_htiles + dq_tile_base(p, s, blk.b) + blk.tile) * kDqRows * D);
    const bool seen = p.dq_sem[((int64_t)blk.b * p.heads_q + blk.h) * p.dq_tiles + blk.tile] > 0;
    for (int x = threadIdx.x; x < kDqRows * D / 4; x += 256) {
        const int lane = x % 32, c = (x / 128) * 8 + 2 * (lane % 4);
        const int r = ((x / 32) % 4) * 16 + lane / 4;
        const float4 v = seen ? acc[x] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float w[4] = { v.x * p.scale, v.y * p.scale, v.z * p.scale, v.w * p.scale };
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int rr = r + 8 * (e / 2), cc = c + e % 2;
            if (p.dq_vec)
                tile[rr * PITCH + cc] = from_float<T>(w[e]);
            else if (r0 + rr < s.sq && cc < p.dim)
                store<T>(p.dq, row_off(p.dq, s, false, blk.h, r0 + rr) + cc, w[e]);
        }
    }
    if (!p.dq_vec)
        return;
    __syncthreads();
    const int rows = min(kDqRows, s.sq - r0);
    for (int x = threadIdx.x; x < rows * (D / 8); x += 256) {
        const int r = x / (D / 8), c = (x % (D / 8)) * 8;
        if (c < p.dim)
            *reinterpret_cast<uint4 *>((T *)p.dq.p + row_off(p.dq, s, false, blk.h, r0 + r) + c) =
                *reinterpret_cast<const uint4 *>(&tile[r * PITCH + c]);
    }
}

// rowsum, zeroed counters, the fused pass (kern: blocks of 384 threads, one a key tile of bn
// keys, head and sequence), then dQ out.
template <typename T, int D, typename K>
cudaError_t run_backward_sm90(const fa_cuda_params &params, bool bf16, K kern, size_t smem, int bn, cudaStream_t stream)
{
    fa_cuda_params p = params;
    const int tiles = (p.max_k + bn - 1) / bn;
    fa_bwd_schedule(&p, tiles);
    cudaError_t err = fa_cuda_rowsum(&p, bf16, stream);
    if (err != cudaSuccess)
        return err;
    const size_t sem_bytes = sizeof(int) * (size_t)p.batch * p.heads_q * p.dq_tiles;
    if (sem_bytes && (err = cudaMemsetAsync(p.dq_sem, 0, sem_bytes, stream)) != cudaSuccess)
        return err;
    const size_t acc_bytes = sizeof(float) * (size_t)p.heads_q * p.dq_htiles * kDqRows * D;
    if (p.bwd_unordered && acc_bytes && (err = cudaMemsetAsync(p.dq_acc, 0, acc_bytes, stream)) != cudaSuccess)
        return err;
    if ((err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
        return err;
    const int64_t blocks = (int64_t)tiles * p.heads_kv * p.batch;
    if (blocks > 0) {
        kern<<<(unsigned)blocks, 384, smem, stream>>>(p);
        if ((err = cudaGetLastError()) != cudaSuccess)
            return err;
    }
    const int64_t q_blocks = (int64_t)((p.max_q + kDqRows - 1) / kDqRows) * p.heads_q * p.batch;
    if (q_blocks > 0)
        dq_store<T, D><<<(unsigned)q_blocks, 256, 0, stream>>>(p);
    return cudaGetLastError();
}

template <typename T, int D, int BQ, int STAGES>
cudaError_t launch_backward_sm90(const fa_cuda_params &p, bool bf16, cudaStream_t stream)
{
    static_assert(BQ == kDqRows, "the accumulator's tiles are the steps' query tiles");
    // without dropout, a build whose element step holds no mask words (fewer live registers)
    constexpr bool SPLIT = bwd_split<D>();
    static_assert(bwd_smem<D, BQ>::template bytes<STAGES>() + sizeof(stage_ring<STAGES>) +
                          sizeof(dq_bars<dq_buffers<D, STAGES>()>) <= 232448,
                  "dynamic and static shared memory within Hopper's 227 KiB a block");
    auto kern = p.dropout_p > 0.0f ? backward_sm90<T, D, BQ, STAGES, true, SPLIT>
                                   : backward_sm90<T, D, BQ, STAGES, false, SPLIT>;
    return run_backward_sm90<T, D>(p, bf16, kern, bwd_smem<D, BQ>::template bytes<STAGES>(), 128, stream);
}

} // namespace fa
