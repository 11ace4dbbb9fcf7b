// SPDX-License-Identifier: MIT
// The flash backward on Hopper's warpgroup tensor cores (sm_90a), deterministic as the
// mma.sync one (no atomics): dK/dV per key tile over every query tile and query head of its
// group in a fixed order, dQ per query tile; S and P recomputed in both from the forward's
// lse. Each kernel has NWG consumer warpgroups of 64 rows and a loading warpgroup that fills
// a STAGES-deep ring of tiles through full/empty mbarriers. A step's tiles serve two rounds of
// products (the second overlapping the next step's element work), so a stage is let go one
// step late and a ring of STAGES keeps STAGES - 2 loads in flight.
#pragma once

#include "wgmma.cuh"

namespace fa {

template <int STAGES> struct stage_ring {
    uint64_t full[STAGES], empty[STAGES];
};

__device__ __forceinline__ unsigned char *align1024(unsigned char *p)
{
    return reinterpret_cast<unsigned char *>((reinterpret_cast<uintptr_t>(p) + 1023) & ~(uintptr_t)1023);
}

// Set up by one thread before the block barrier: full counts the loading warpgroup's 128
// threads, empty the consumers' warps.
template <int STAGES> __device__ __forceinline__ void ring_init(stage_ring<STAGES> &ring, int warps)
{
    for (int i = 0; i < STAGES; i++) {
        mbar_init(&ring.full[i], 128);
        mbar_init(&ring.empty[i], warps);
    }
}

// The loading warpgroup: step i's tiles into stage i % STAGES (load(i, st) issues the copies
// and any plain stores) once the consumers have let go of what was there. Consumers let a
// stage go one step late, so STAGES - 2 steps can be in flight: step i - (STAGES - 2) is
// handed over once its copies have landed.
template <int STAGES, typename F>
__device__ __forceinline__ void fill_ring(stage_ring<STAGES> &ring, int steps, F load)
{
    constexpr int LAG = STAGES - 2;
    static_assert(LAG >= 1, "stages are let go one step late");
    for (int i = 0; i < steps; i++) {
        const int st = i % STAGES;
        if (i >= STAGES)
            mbar_wait(&ring.empty[st], (i / STAGES - 1) & 1);
        load(i, st);
        cp_async_commit();
        if (i >= LAG) {
            cp_async_wait<LAG>();
            fence_async_smem();
            mbar_arrive(&ring.full[(i - LAG) % STAGES]);
        }
    }
    cp_async_wait<0>();
    fence_async_smem();
    for (int i = max(0, steps - LAG); i < steps; i++)
        mbar_arrive(&ring.full[i % STAGES]);
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

// Scaled accumulator rows (64 of them, rows row0 + 16 warp + g (+8)) out to view v.
template <typename T, int D>
__device__ __forceinline__ void store_acc(const fa_cuda_view &v, const float (&acc)[1][D / 8][4],
                                          const seq_t &s, bool is_k, int h, int64_t row0, int limit,
                                          int dim, float scale, int g, int t)
{
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int64_t r = row0 + g + hf * 8;
        if (r >= limit)
            continue;
        const int64_t off = row_off(v, s, is_k, h, r);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int x = dt * 8 + 2 * t + e;
                if (x < dim)
                    store<T>(v, off + x, acc[0][dt][2 * hf + e] * scale);
            }
    }
}

// ---- dK/dV: one block per (key tile of 64 NWG keys, kv head, sequence) ----
template <int D, int BQ> struct kv_stage {
    static constexpr int tile = BQ * D * 2;                     // Q, then dO
    static constexpr int bytes = (2 * tile + 8 * BQ + 1023) / 1024 * 1024; // + lse2, D
};

template <typename T, int D, int BQ, int NWG, int STAGES>
__device__ __forceinline__ void dk_dv_rows(const fa_cuda_params &p, stage_ring<STAGES> &ring,
                                           const block_t &blk, const seq_t &s, const mask_t &mk,
                                           int c0, int m_lo, int nm, int iters, unsigned char *sK,
                                           unsigned char *sV, unsigned char *ring_mem, int wg)
{
    constexpr int BN = 64 * NWG, NQ = BQ / 8, ND = D / 8;
    // dK and dV take D registers, S^T and dP^T BQ, their fragments BQ / 2: with a second
    // round in flight beyond 176 of them the compiler spills and serialises the wgmma
    constexpr bool OVERLAP = D + 3 * BQ / 2 <= 176;
    using S = kv_stage<D, BQ>;
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
        named_barrier(1 + wg, 128);
    }
    const uint32_t ka = smem_addr(sK) + wg * 64 * 128, va = smem_addr(sV) + wg * 64 * 128;
    const uint32_t ra = smem_addr(ring_mem);

    float dk[1][ND][4], dv[1][ND][4], sc[1][NQ][4], dp[1][NQ][4];
    uint32_t pa[1][NQ / 2][4], da[1][NQ / 2][4];
    float(&dkf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dk);
    float(&dvf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dv);
    float(&sf)[BQ / 2] = reinterpret_cast<float(&)[BQ / 2]>(sc);
    float(&dpf)[BQ / 2] = reinterpret_cast<float(&)[BQ / 2]>(dp);
    zero(dk);
    zero(dv);
    for (int it = 0; it < iters; it++) {
        const int st = it % STAGES, h = hk * p.group + it / nm, i0 = (m_lo + it % nm) * BQ;
        const uint32_t qa = ra + st * S::bytes, oa = qa + S::tile;
        const float *sl = reinterpret_cast<const float *>(ring_mem + st * S::bytes + 2 * S::tile);
        mbar_wait(&ring.full[st], (it / STAGES) & 1);
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
            kv_grads(p, mk, blk.b, h, sc, dp, sl, sl + BQ, i0, j0, g, t);
            wgmma_wait<0>(); // the previous step's products are done with pa, da and its stage
            reg_fence(dkf);
            reg_fence(dvf);
            reg_fence(pa[0]);
            reg_fence(da[0]);
            __syncwarp(); // every lane's reads of the stage's lse2 / D before lane 0 lets it go
            if (it > 0 && lane == 0)
                mbar_arrive(&ring.empty[(it - 1) % STAGES]);
            to_a<T, 1, NQ>(pa, sc);
            to_a<T, 1, NQ>(da, dp);
        } else { // one round after the other: fewer live registers
            wgmma_wait<0>();
            reg_fence(sf);
            reg_fence(dpf);
            kv_grads(p, mk, blk.b, h, sc, dp, sl, sl + BQ, i0, j0, g, t);
            to_a<T, 1, NQ>(pa, sc);
            to_a<T, 1, NQ>(da, dp);
            wgmma_fence();
            wg_gemm_rn<T, D, BQ>(dvf, pa[0], oa); // dV += P^T dO
            wg_gemm_rn<T, D, BQ>(dkf, da[0], qa); // dK += dS^T Q
            wgmma_wait<0>();
            reg_fence(dkf);
            reg_fence(dvf);
            __syncwarp();
            if (lane == 0)
                mbar_arrive(&ring.empty[st]);
        }
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

template <typename T, int D, int BQ, int NWG, int STAGES>
__global__ void __launch_bounds__((NWG + 1) * 128, 1) dk_dv_sm90(const fa_cuda_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BN = 64 * NWG;
    using S = kv_stage<D, BQ>;
    extern __shared__ unsigned char smem_raw[];
    __shared__ stage_ring<STAGES> ring;
    unsigned char *sK = align1024(smem_raw), *sV = sK + BN * D * 2, *ring_mem = sV + BN * D * 2;

    const int tiles = (p.max_k + BN - 1) / BN;
    const block_t blk = block_of(tiles, p.heads_kv, false);
    const seq_t s = seq_of(p, blk.b);
    const int c0 = blk.tile * BN;
    if (c0 >= s.sk)
        return;
    const mask_t mk = mask_of(p, s);
    const int c1 = min(c0 + BN, s.sk);
    const int64_t ilo = max((int64_t)0, c0 - mk.diag - mk.wr);
    const int64_t ihi = min((int64_t)s.sq, (c1 - 1) - mk.diag + mk.wl + 1);
    const int m_lo = (int)(ilo / BQ), nm = ihi > ilo ? (int)((ihi + BQ - 1) / BQ) - m_lo : 0;
    const int iters = nm * p.group;
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); // uniform to the compiler
    if (threadIdx.x == 0)
        ring_init(ring, 4 * NWG);
    __syncthreads();
    if (wg == NWG) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        const int tid = threadIdx.x % 128;
        fill_ring(ring, iters, [&](int it, int st) {
            const int h = blk.h * p.group + it / nm, i0 = (m_lo + it % nm) * BQ;
            unsigned char *base = ring_mem + st * S::bytes;
            load_tile_sw<T, BQ, D, 128>(base, (const T *)p.q.p + row_off(p.q, s, false, h, i0),
                                        p.q.ss, s.sq - i0, p.dim, p.aligned, tid);
            load_tile_sw<T, BQ, D, 128>(base + S::tile,
                                        (const T *)p.dout.p + row_off(p.dout, s, false, h, i0),
                                        p.dout.ss, s.sq - i0, p.dim, p.aligned, tid);
            float *sl = reinterpret_cast<float *>(base + 2 * S::tile);
            for (int x = tid; x < BQ; x += 128) {
                sl[x] = lse2_of(p, s, h, i0 + x);
                sl[BQ + x] = dsum_of(p, s, h, i0 + x);
            }
        });
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_regs<NWG>::value));
        dk_dv_rows<T, D, BQ, NWG, STAGES>(p, ring, blk, s, mk, c0, m_lo, nm, iters, sK, sV, ring_mem,
                                          wg);
    }
#endif
}

// ---- dQ: one block per (query tile of 64 NWG rows, query head, sequence) ----
template <typename T, int D, int BN, int NWG, int STAGES>
__device__ __forceinline__ void dq_rows(const fa_cuda_params &p, stage_ring<STAGES> &ring,
                                        const query_tile_t &qt, unsigned char *sQ, unsigned char *sO,
                                        unsigned char *sK, unsigned char *sV, int wg)
{
    constexpr int BM = 64 * NWG, NS = BN / 8, ND = D / 8, TILE = BN * D * 2;
    const seq_t &s = qt.s;
    const int r0 = qt.r0, n_lo = qt.n_lo, n_hi = qt.n_hi, h = qt.blk.h;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wr0 = r0 + wg * 64 + warp * 16; // this warp's first row
    float lse2[2], dsum[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        lse2[hf] = lse2_of(p, s, h, wr0 + g + hf * 8);
        dsum[hf] = dsum_of(p, s, h, wr0 + g + hf * 8);
    }
    if (n_lo < n_hi) {
        load_own_rows<T, D, BM>(sQ, (const T *)p.q.p + row_off(p.q, s, false, h, r0 + wg * 64), p.q.ss,
                                s.sq - r0 - wg * 64, p, wg);
        load_own_rows<T, D, BM>(sO, (const T *)p.dout.p + row_off(p.dout, s, false, h, r0 + wg * 64),
                                p.dout.ss, s.sq - r0 - wg * 64, p, wg);
        cp_async_commit();
        cp_async_wait<0>();
        fence_async_smem();
        named_barrier(1 + wg, 128);
    }
    const uint32_t qa = smem_addr(sQ) + wg * 64 * 128, oa = smem_addr(sO) + wg * 64 * 128;
    const uint32_t ka = smem_addr(sK), va = smem_addr(sV);

    float dq[1][ND][4], sc[1][NS][4], dp[1][NS][4];
    uint32_t da[1][NS / 2][4];
    float(&dqf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dq);
    float(&sf)[BN / 2] = reinterpret_cast<float(&)[BN / 2]>(sc);
    float(&dpf)[BN / 2] = reinterpret_cast<float(&)[BN / 2]>(dp);
    zero(dq);
    for (int n = n_lo; n < n_hi; n++) {
        const int i = n - n_lo, st = i % STAGES;
        mbar_wait(&ring.full[st], (i / STAGES) & 1);
        wgmma_fence();
        wg_gemm_nt<T, D, BM, BN>(sf, qa, ka + st * TILE);  // S = Q K^T
        wg_gemm_nt<T, D, BM, BN>(dpf, oa, va + st * TILE); // dP = dO V^T
        if (i > 0) {
            wg_gemm_rn<T, D, BN>(dqf, da[0], ka + ((i - 1) % STAGES) * TILE); // dQ += dS K
            wgmma_wait<1>();
        } else {
            wgmma_wait<0>();
        }
        reg_fence(sf);
        reg_fence(dpf);
        dq_grads(p, qt.mk, qt.blk.b, h, sc, dp, lse2, dsum, wr0, (int64_t)n * BN, g, t);
        wgmma_wait<0>(); // the previous step's product is done with da and its stage
        reg_fence(dqf);
        reg_fence(da[0]);
        if (i > 0 && lane == 0)
            mbar_arrive(&ring.empty[(i - 1) % STAGES]);
        to_a<T, 1, NS>(da, sc);
    }
    if (n_lo < n_hi) {
        wgmma_fence();
        wg_gemm_rn<T, D, BN>(dqf, da[0], ka + ((n_hi - 1 - n_lo) % STAGES) * TILE);
        wgmma_wait<0>();
        reg_fence(dqf);
    }
    store_acc<T, D>(p.dq, dq, s, false, h, wr0, s.sq, p.dim, p.scale, g, t);
}

template <typename T, int D, int BN, int NWG, int STAGES>
__global__ void __launch_bounds__((NWG + 1) * 128, 1) dq_sm90(const fa_cuda_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 64 * NWG, TILE = BN * D * 2;
    extern __shared__ unsigned char smem_raw[];
    __shared__ stage_ring<STAGES> ring;
    unsigned char *sQ = align1024(smem_raw), *sO = sQ + BM * D * 2, *sK = sO + BM * D * 2;
    unsigned char *sV = sK + STAGES * TILE;

    query_tile_t qt;
    if (!query_tile<BM, BN>(p, qt))
        return;
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); // uniform to the compiler
    if (threadIdx.x == 0)
        ring_init(ring, 4 * NWG);
    __syncthreads();
    if (wg == NWG) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        const int tid = threadIdx.x % 128;
        const seq_t &s = qt.s;
        const T *gK = (const T *)p.k.p + row_off(p.k, s, true, qt.hk, 0);
        const T *gV = (const T *)p.v.p + row_off(p.v, s, true, qt.hk, 0);
        fill_ring(ring, qt.n_hi - qt.n_lo, [&](int i, int st) {
            const int c = (qt.n_lo + i) * BN;
            load_tile_sw<T, BN, D, 128>(sK + st * TILE, gK + c * p.k.ss, p.k.ss, s.sk - c, p.dim,
                                        p.aligned, tid);
            load_tile_sw<T, BN, D, 128>(sV + st * TILE, gV + c * p.v.ss, p.v.ss, s.sk - c, p.dim,
                                        p.aligned, tid);
        });
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_regs<NWG>::value));
        dq_rows<T, D, BN, NWG, STAGES>(p, ring, qt, sQ, sO, sK, sV, wg);
    }
#endif
}

// rowsum, then dK/dV (query step BQ, ring KST deep, NWG key warpgroups), then dQ (key step
// QN, ring QST deep, NWG query warpgroups).
template <typename T, int D, int BQ, int KST, int QN, int QST, int NWG>
cudaError_t launch_backward_sm90(const fa_cuda_params &p, bool bf16, cudaStream_t stream)
{
    cudaError_t err = fa_cuda_rowsum(&p, bf16, stream);
    if (err != cudaSuccess)
        return err;
    constexpr int BN = 64 * NWG;
    const size_t smem_kv = 1024 + 2 * (size_t)BN * D * 2 + KST * (size_t)kv_stage<D, BQ>::bytes;
    auto kv = dk_dv_sm90<T, D, BQ, NWG, KST>;
    if ((err = cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv)) != cudaSuccess)
        return err;
    const int64_t kv_blocks = (int64_t)((p.max_k + BN - 1) / BN) * p.heads_kv * p.batch;
    if (kv_blocks > 0) {
        kv<<<(unsigned)kv_blocks, (NWG + 1) * 128, smem_kv, stream>>>(p);
        if ((err = cudaGetLastError()) != cudaSuccess)
            return err;
    }
    constexpr int BM = 64 * NWG;
    const size_t smem_q = 1024 + 2 * (size_t)BM * D * 2 + 2 * QST * (size_t)QN * D * 2;
    auto qk = dq_sm90<T, D, QN, NWG, QST>;
    if ((err = cudaFuncSetAttribute(qk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q)) != cudaSuccess)
        return err;
    const int64_t q_blocks = (int64_t)((p.max_q + BM - 1) / BM) * p.heads_q * p.batch;
    if (q_blocks > 0)
        qk<<<(unsigned)q_blocks, (NWG + 1) * 128, smem_q, stream>>>(p);
    return cudaGetLastError();
}

} // namespace fa
