// SPDX-License-Identifier: MIT
// The Hopper backward at head dims 129-256 (run at 256, the columns past head_dim zeros), one
// pass, deterministic. backward_sm90.cuh's blocks, two warpgroups of 64 keys each, would hold
// 256 registers a thread of dK and dV alone here, so the work is cut the other way: one block
// per key tile of 64 keys, whose two consumer warpgroups each compute S^T and dP^T of all 64
// keys for their half of a step's query rows, and so P and dS there, which they store (query-
// major) in shared memory; after a barrier each takes half of the columns of dV += P^T dO,
// dK += dS^T Q and dQ = dS K over the whole step. Once both warpgroups' products have read the
// step's Q / dO stage, the stage holds their dQ shares for the writer, whose bulk adds (in
// a fixed order, as there) hand it back to the loading warps.
#pragma once

#include "backward_sm90.cuh"

namespace fa {

// Shared memory: K, V, two P and two dS tiles (steps alternate), the ring's stages (Q, then
// dO) and their statistics.
template <int D, int BN, int BQ> struct bwd_wide_smem {
    static constexpr int kv = BN * D * 2; // K, then V
    static constexpr int pt = BQ * BN * 2; // one P or dS tile
    static_assert(BQ * D * 4 <= kv_stage<D, BQ>::bytes, "both warpgroups' dQ shares fit in a stage");
    static constexpr size_t bytes(int stages)
    {
        using S = kv_stage<D, BQ>;
        return 1024 + 2 * (size_t)kv + 4 * (size_t)pt + stages * (size_t)(S::bytes + 4 * S::stats);
    }
};

// A stage's dQ shares: full[w][stage] once warpgroup w's 4 warps have written theirs.
template <int STAGES> struct dq_stage_bars {
    uint64_t full[2][STAGES];
};

template <typename T, int D, int BQ, int STAGES, bool DROPOUT>
__device__ __forceinline__ void bwd_rows_wide(const fa_cuda_params &p, stage_ring<STAGES> &ring,
                                              dq_stage_bars<STAGES> &bars, const bwd_work &w, unsigned char *sK,
                                              unsigned char *sV, unsigned char *sP, unsigned char *sDS,
                                              unsigned char *ring_mem, const float *stats, int wg)
{
    const block_t &blk = w.blk;
    const seq_t &s = w.s;
    const mask_t &mk = w.mk;
    const int c0 = w.c0, iters = w.iters;
    // QH query rows and DH columns a warpgroup; dQ in chunks of DC columns (fewer live registers)
    constexpr int BN = 64, QH = BQ / 2, NQ = QH / 8, DH = D / 2, DC = 64;
    static_assert(DH % DC == 0 && DC % 64 == 0 && QH % 16 == 0,
                  "a warpgroup's columns are whole dQ chunks of whole column blocks, its rows whole k16 steps");
    using S = kv_stage<D, BQ>;
    using F = bwd_wide_smem<D, BN, BQ>;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int hk = blk.h;
    const int j0 = c0 + warp * 16; // this warp's first key (the same in both warpgroups)
    if (iters > 0) {
        load_tile_sw<T, BN, D, 256>(sK, (const T *)p.k.p + row_off(p.k, s, true, hk, c0), p.k.ss, s.sk - c0,
                                    p.dim, p.aligned, threadIdx.x);
        load_tile_sw<T, BN, D, 256>(sV, (const T *)p.v.p + row_off(p.v, s, true, hk, c0), p.v.ss, s.sk - c0,
                                    p.dim, p.aligned, threadIdx.x);
        cp_async_commit();
        cp_async_wait<0>();
        fence_async_smem();
        named_barrier(3, 256);
    }
    const uint32_t ka = smem_addr(sK), va = smem_addr(sV), ra = smem_addr(ring_mem);
    // this lane's row address in a P or dS tile for stmatrix: block m = lane / 8 of the four
    // holds queries + 8 (m / 2), keys + 8 (m % 2)
    const int sm_q = wg * QH + lane % 8 + 8 * ((lane / 8) / 2), sm_k = warp * 16 + 8 * ((lane / 8) % 2);

    float dk[1][DH / 8][4], dv[1][DH / 8][4], sc[1][NQ][4], dp[1][NQ][4], dq[DC / 2];
    uint32_t pa[1][NQ / 2][4], da[1][NQ / 2][4];
    float(&dkf)[DH / 2] = reinterpret_cast<float(&)[DH / 2]>(dk);
    float(&dvf)[DH / 2] = reinterpret_cast<float(&)[DH / 2]>(dv);
    float(&sf)[QH / 2] = reinterpret_cast<float(&)[QH / 2]>(sc);
    float(&dpf)[QH / 2] = reinterpret_cast<float(&)[QH / 2]>(dp);
    zero(dk);
    zero(dv);
    // the query tiles every row of which sees all 16 of this warp's keys
    const tiles_t full = tiles_within<BQ>(mk.full_query_range(j0, j0 + 16));
    bwd_steps fs(p, w);
    for (int it = 0; it < iters; it++, fs.next()) {
        const int st = it % STAGES, h = fs.h(), i0 = fs.mi * BQ;
        const bool all_seen = fs.mi >= full.lo && fs.mi < full.hi;
        const uint32_t qa = ra + st * S::bytes, oa = qa + S::tile;
        const uint32_t pt = smem_addr(sP) + (it & 1) * F::pt, dt = smem_addr(sDS) + (it & 1) * F::pt;
        const float *sl = stats + st * S::stats + wg * QH;
        if (!(drop_ordering(p, FA_DROP_BACKWARD) & 2))
            mbar_wait(&ring.full[st], (it / STAGES) & 1);
        if (drop_ordering(p, FA_DROP_BACKWARD) & 5) // slow consumers: loaders without their empty waits run ahead
            __nanosleep(10000);
        fence_async_smem(); // the loaders' writes, seen through the barrier, for the tensor cores
        wgmma_fence();
        wg_gemm_nt<T, D, BN, QH, BQ>(sf, ka, qa + wg * QH * 128);  // S^T = K Q^T, this half's queries
        wg_gemm_nt<T, D, BN, QH, BQ>(dpf, va, oa + wg * QH * 128); // dP^T = V dO^T
        wgmma_wait<0>();
        reg_fence(sf);
        reg_fence(dpf);
        kv_grads<NQ, DROPOUT>(p, mk, all_seen, blk.b, h, sc, dp, sl, sl + BQ, i0 + wg * QH, j0, g, t);
        to_a<T, 1, NQ>(pa, sc);
        to_a<T, 1, NQ>(da, dp);
        // P and dS (queries x keys) of this half into the step's tiles, which the other
        // warpgroup's products of two steps ago finished reading before it arrived at barrier 4
        // of the step before
#pragma unroll
        for (int kt = 0; kt < NQ / 2; kt++) {
            stsm_x4_t(pt + sw_offset(kt * 16 + sm_q, sm_k, BQ), pa[0][kt]);
            stsm_x4_t(dt + sw_offset(kt * 16 + sm_q, sm_k, BQ), da[0][kt]);
        }
        fence_async_smem();
        named_barrier(4, 256); // both halves stored
        wgmma_fence();
        const int cb = wg * DH / 64; // this warpgroup's first column block
        wg_gemm_mn<T, DH, BQ, BQ>(dvf, pt, oa + cb * BQ * 128); // dV += P^T dO
        wg_gemm_mn<T, DH, BQ, BQ>(dkf, dt, qa + cb * BQ * 128); // dK += dS^T Q
        float4 *buf = reinterpret_cast<float4 *>(ring_mem + st * S::bytes + wg * BQ * DH * 4);
#pragma unroll 1
        for (int c = 0; c < DH / DC; c++) {
            if (c > 0)
                wgmma_fence();
            wg_gemm_sn<T, DC, BN, BQ, BN>(dq, dt, ka + (cb + c * DC / 64) * BN * 128); // dQ = dS K
            wgmma_wait<0>();
            reg_fence(dq);
            if (c == 0) {
                reg_fence(dkf);
                reg_fence(dvf);
                // both warpgroups' products are done with the stage's Q and dO: it takes the
                // dQ shares, in the accumulator's order (dq_tile_base)
                named_barrier(5, 256);
            }
#pragma unroll
            for (int x = 0; x < DC / 8; x++)
                buf[((c * DC / 8 + x) * 4 + warp) * 32 + lane] =
                    make_float4(dq[4 * x], dq[4 * x + 1], dq[4 * x + 2], dq[4 * x + 3]);
        }
        fence_async_smem();
        __syncwarp();
        if (lane == 0)
            mbar_arrive(&bars.full[wg][st]);
    }
    store_acc<T, DH>(p.dk, dk, s, true, hk, j0, s.sk, p.dim, p.scale, g, t, wg * DH);
    store_acc<T, DH>(p.dv, dv, s, true, hk, j0, s.sk, p.dim, p.dropout_scale, g, t, wg * DH);
}

// The dQ writer (one thread): each step's two shares added from its stage in their order (bwd_turn),
// the stage handed back to the loading warps once the adds have read it.
template <int D, int BQ, int STAGES>
__device__ __forceinline__ void dq_writer_wide(const fa_cuda_params &p, stage_ring<STAGES> &ring,
                                               dq_stage_bars<STAGES> &bars, const bwd_work &w,
                                               const unsigned char *ring_mem)
{
    constexpr int BN = 64, DH = D / 2;
    using S = kv_stage<D, BQ>;
    const int64_t base = dq_tile_base(p, w.s, w.blk.b);
    bwd_steps fs(p, w);
    for (int it = 0; it < w.iters; it++, fs.next()) {
        const int st = it % STAGES;
        for (int x = 0; x < 2; x++)
            mbar_wait(&bars.full[x][st], (it / STAGES) & 1);
        float *acc = p.dq_acc + ((int64_t)fs.h() * p.dq_htiles + base + fs.mi) * kDqRows * D;
        dq_add_step(p.dq_sem + ((int64_t)w.blk.b * p.heads_q + fs.h()) * p.dq_tiles + fs.mi,
                    bwd_turn<BN, BQ>(w, fs.mi), p.bwd_unordered, acc, (int64_t)BQ * DH,
                    smem_addr(ring_mem + st * S::bytes), BQ * DH * 4, 2, BQ * DH * 4,
                    [&] { mbar_arrive(&ring.empty[st]); });
    }
}

template <typename T, int D, int BQ, int STAGES, bool DROPOUT>
__global__ void __launch_bounds__(384, 1) backward_sm90_wide(const __grid_constant__ fa_cuda_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BN = 64;
    using S = kv_stage<D, BQ>;
    using F = bwd_wide_smem<D, BN, BQ>;
    extern __shared__ unsigned char smem_raw[];
    __shared__ stage_ring<STAGES> ring;
    __shared__ dq_stage_bars<STAGES> bars;
    unsigned char *sK = align1024(smem_raw), *sV = sK + F::kv, *sP = sV + F::kv, *sDS = sP + 2 * F::pt;
    unsigned char *ring_mem = sDS + 2 * F::pt;
    float *stats = reinterpret_cast<float *>(ring_mem + STAGES * S::bytes);

    bwd_work work;
    if (!bwd_work_of<BN, BQ>(p, work))
        return;
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); // uniform to the compiler
    constexpr int LOADERS = 64; // the loading warpgroup's first two warps; the third's lane 0 adds dQ
    if (threadIdx.x == 0) {
        ring_init(ring, LOADERS, 1); // a stage is empty once the writer's adds have read it
        for (int w = 0; w < 2; w++)
            for (int i = 0; i < STAGES; i++)
                mbar_init(&bars.full[w][i], 4);
        fence_mbar_init(); // the TMA boxes (bwd_tma) complete on the ring's full barriers
    }
    __syncthreads();
    if (wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(producer_regs<2>::value));
        const int tid = threadIdx.x % 128;
        if (tid == LOADERS)
            dq_writer_wide<D, BQ, STAGES>(p, ring, bars, work, ring_mem);
        if (tid < LOADERS)
            load_steps<T, D, BQ, STAGES, LOADERS>(p, ring, work, ring_mem, stats, tid);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_regs<2>::value));
        bwd_rows_wide<T, D, BQ, STAGES, DROPOUT>(p, ring, bars, work, sK, sV, sP, sDS, ring_mem, stats, wg);
    }
#endif
}

template <typename T, int D, int BQ, int STAGES>
cudaError_t launch_backward_sm90_wide(const fa_cuda_params &p, bool bf16, cudaStream_t stream)
{
    static_assert(BQ == kDqRows && BQ == 64, "the accumulator's tiles are the steps' query tiles");
    auto kern = p.dropout_p > 0.0f ? backward_sm90_wide<T, D, BQ, STAGES, true>
                                   : backward_sm90_wide<T, D, BQ, STAGES, false>;
    return run_backward_sm90<T, D>(p, bf16, kern, bwd_wide_smem<D, 64, BQ>::bytes(STAGES), 64, stream);
}

} // namespace fa
