// SPDX-License-Identifier: MIT
// The flash backward on tensor cores, deterministic: no atomics. Three launches:
//   rowsum   D = rowsum(dO * O) per query row, and the row's lse in log2 units
//   dk_dv    one block per key tile (all query heads of its group, every query tile the
//            mask allows, in a fixed order): dV += P^T dO, dK += dS^T Q
//   dq       one block per query tile: dQ += dS K
// P and dS are recomputed in both passes from the forward's log-sum-exp.
#include "cuda.h"
#include "tile.cuh"

namespace fa {

// Where row x of the packed (head, row) order finds its O, dO and lse.
struct rowsum_row {
    int h;
    int64_t r, off_o, off_d, off_l;
};
__device__ __forceinline__ rowsum_row rowsum_row_of(const fa_cuda_params &p, int64_t x)
{
    rowsum_row w;
    w.h = (int)(x / p.rows);
    w.r = x % p.rows;
    if (p.cu_q) {
        w.off_o = w.r * p.o.ss + (int64_t)w.h * p.o.sh;
        w.off_d = w.r * p.dout.ss + (int64_t)w.h * p.dout.sh;
        w.off_l = w.r * p.lse_ss + (int64_t)w.h * p.lse_sh;
    } else {
        const int64_t b = w.r / p.seqlen_q, i = w.r % p.seqlen_q;
        w.off_o = b * p.o.sb + i * p.o.ss + (int64_t)w.h * p.o.sh;
        w.off_d = b * p.dout.sb + i * p.dout.ss + (int64_t)w.h * p.dout.sh;
        w.off_l = b * p.lse_sb + i * p.lse_ss + (int64_t)w.h * p.lse_sh;
    }
    return w;
}
__device__ __forceinline__ void rowsum_out(const fa_cuda_params &p, const rowsum_row &w, float acc)
{
    const float l = p.lse[w.off_l];
    p.dsum[(int64_t)w.h * p.rows + w.r] = acc;
    p.lse2[(int64_t)w.h * p.rows + w.r] = l == -INFINITY ? INFINITY : l * kLog2e;
}

// Any layout: one warp a row, element by element.
__global__ void __launch_bounds__(256) rowsum_kernel(const fa_cuda_params p, bool bf16)
{
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (wid >= p.rows * p.heads_q)
        return;
    const rowsum_row w = rowsum_row_of(p, wid);
    float acc = 0.0f;
    for (int x = lane; x < p.dim; x += 32)
        acc += bf16 ? load<__nv_bfloat16>(p.o, w.off_o + x) * load<__nv_bfloat16>(p.dout, w.off_d + x)
                    : load<__half>(p.o, w.off_o + x) * load<__half>(p.dout, w.off_d + x);
#pragma unroll
    for (int m = 16; m > 0; m /= 2)
        acc += __shfl_xor_sync(0xffffffffu, acc, m);
    if (lane == 0)
        rowsum_out(p, w, acc);
}

// O and dO in the input dtype with 16-byte-aligned rows (head_dim % 8 == 0): eight lanes a
// row, 16-byte loads.
template <typename T> __global__ void __launch_bounds__(256) rowsum_vec_kernel(const fa_cuda_params p)
{
    const int64_t x = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 8;
    const int sub = threadIdx.x % 8;
    if (x >= p.rows * p.heads_q) // the row's eight lanes leave together
        return;
    const rowsum_row w = rowsum_row_of(p, x);
    const T *o = (const T *)p.o.p + w.off_o, *d = (const T *)p.dout.p + w.off_d;
    float acc = 0.0f;
    for (int c = sub * 8; c < p.dim; c += 64) {
        const uint4 a = *reinterpret_cast<const uint4 *>(o + c), b = *reinterpret_cast<const uint4 *>(d + c);
        const T *ae = reinterpret_cast<const T *>(&a), *be = reinterpret_cast<const T *>(&b);
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc += to_float<T>(ae[e]) * to_float<T>(be[e]);
    }
    const unsigned group = 0xffu << (threadIdx.x % 32 / 8 * 8);
#pragma unroll
    for (int m = 4; m > 0; m /= 2)
        acc += __shfl_xor_sync(group, acc, m, 8);
    if (sub == 0)
        rowsum_out(p, w, acc);
}

template <typename T, int D, int BQ, int W, int DS>
__global__ void __launch_bounds__(W * 32) dk_dv_kernel(const fa_cuda_params p)
{
    constexpr int KW = W / DS, BN = 16 * KW, NQ = BQ / 8, DN = D / DS / 8, LDS = lds<D>();
    constexpr int NTH = W * 32;
    extern __shared__ __align__(16) unsigned char smem[];
    T *sK = reinterpret_cast<T *>(smem);
    T *sV = sK + BN * LDS;
    T *sQ = sV + BN * LDS;  // two stages
    T *sO = sQ + 2 * BQ * LDS; // dO, two stages
    float *sL = reinterpret_cast<float *>(sO + 2 * BQ * LDS); // lse2, two stages
    float *sD = sL + 2 * BQ;                                 // D, two stages

    const int tiles = (p.max_k + BN - 1) / BN;
    const block_t blk = block_of(tiles, p.heads_kv, false);
    const seq_t s = seq_of(p, blk.b);
    const int c0 = blk.tile * BN;
    if (c0 >= s.sk)
        return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kw = warp % KW, dw = warp / KW;
    const int hk = blk.h;
    const mask_t mk = mask_of(p, s.sq, s.sk);
    const tiles_t qtiles = tiles_of<BQ>(mk.query_range(c0, c0 + BN));
    const int m_lo = qtiles.lo, nm = qtiles.n;
    const int iters = nm * p.group;
    const bool al = p.aligned;

    auto stage_in = [&](int it, int st) {
        const int h = hk * p.group + it / nm, i0 = (m_lo + it % nm) * BQ;
        load_tile<T, BQ, D, NTH>(sQ + st * BQ * LDS, (const T *)p.q.p + row_off(p.q, s, false, h, i0),
                                 p.q.ss, s.sq - i0, p.dim, al);
        load_tile<T, BQ, D, NTH>(sO + st * BQ * LDS, (const T *)p.dout.p + row_off(p.dout, s, false, h, i0),
                                 p.dout.ss, s.sq - i0, p.dim, al);
        for (int x = threadIdx.x; x < BQ; x += NTH) {
            sL[st * BQ + x] = lse2_of(p, s, h, i0 + x);
            sD[st * BQ + x] = dsum_of(p, s, h, i0 + x);
        }
        cp_async_commit();
    };

    float dk[1][DN][4], dv[1][DN][4];
    zero(dk);
    zero(dv);
    if (iters > 0) {
        load_tile<T, BN, D, NTH>(sK, (const T *)p.k.p + row_off(p.k, s, true, hk, c0), p.k.ss, s.sk - c0, p.dim, al);
        load_tile<T, BN, D, NTH>(sV, (const T *)p.v.p + row_off(p.v, s, true, hk, c0), p.v.ss, s.sk - c0, p.dim, al);
        stage_in(0, 0);
    }
    const int j0 = c0 + kw * 16; // this warp's first key
    for (int it = 0; it < iters; it++) {
        const int st = it & 1;
        if (it + 1 < iters) {
            stage_in(it + 1, st ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int h = hk * p.group + it / nm, i0 = (m_lo + it % nm) * BQ;
        const T *q = sQ + st * BQ * LDS, *dO = sO + st * BQ * LDS;

        float sc[1][NQ][4], dp[1][NQ][4];
        zero(sc);
        zero(dp);
        gemm_nt<T, 1, NQ, D, LDS>(sc, sK + kw * 16 * LDS, q, lane);
        gemm_nt<T, 1, NQ, D, LDS>(dp, sV + kw * 16 * LDS, dO, lane);

        kv_grads(p, mk, mk.all_visible(i0, i0 + BQ, j0, j0 + 16), blk.b, h, sc, dp, sL + st * BQ,
                 sD + st * BQ, i0, j0, g, t);
        uint32_t a[1][NQ / 2][4];
        to_a<T, 1, NQ>(a, sc);
        gemm_rn<T, 1, DN, NQ / 2, LDS>(dv, a, dO + dw * (D / DS), lane);
        to_a<T, 1, NQ>(a, dp);
        gemm_rn<T, 1, DN, NQ / 2, LDS>(dk, a, q + dw * (D / DS), lane);
        __syncthreads();
    }

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int j = j0 + g + hf * 8;
        if (j >= s.sk)
            continue;
        const int64_t ok = row_off(p.dk, s, true, hk, j), ov = row_off(p.dv, s, true, hk, j);
#pragma unroll
        for (int dt = 0; dt < DN; dt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int x = dw * (D / DS) + dt * 8 + 2 * t + e;
                if (x < p.dim) {
                    store<T>(p.dk, ok + x, dk[0][dt][2 * hf + e] * p.scale);
                    store<T>(p.dv, ov + x, dv[0][dt][2 * hf + e] * p.dropout_scale);
                }
            }
    }
}

template <typename T, int D, int BK, int W>
__global__ void __launch_bounds__(W * 32) dq_kernel(const fa_cuda_params p)
{
    constexpr int BM = 16 * W, NS = BK / 8, ND = D / 8, LDS = lds<D>(), NTH = W * 32;
    extern __shared__ __align__(16) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem);
    T *sO = sQ + BM * LDS;
    T *sK = sO + BM * LDS; // two stages
    T *sV = sK + 2 * BK * LDS;

    query_tile_t qt;
    if (!query_tile<BM, BK>(p, qt))
        return;
    const block_t &blk = qt.blk;
    const seq_t &s = qt.s;
    const mask_t &mk = qt.mk;
    const int r0 = qt.r0, n_lo = qt.n_lo, n_hi = qt.n_hi;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const T *gK = (const T *)p.k.p + row_off(p.k, s, true, qt.hk, 0);
    const T *gV = (const T *)p.v.p + row_off(p.v, s, true, qt.hk, 0);
    const bool al = p.aligned;
    const int wr0 = r0 + warp * 16;
    float lse2[2], dsum[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        lse2[hf] = lse2_of(p, s, blk.h, wr0 + g + hf * 8);
        dsum[hf] = dsum_of(p, s, blk.h, wr0 + g + hf * 8);
    }

    float dq[1][ND][4];
    zero(dq);
    if (n_lo < n_hi) {
        load_tile<T, BM, D, NTH>(sQ, (const T *)p.q.p + row_off(p.q, s, false, blk.h, r0), p.q.ss, s.sq - r0, p.dim, al);
        load_tile<T, BM, D, NTH>(sO, (const T *)p.dout.p + row_off(p.dout, s, false, blk.h, r0), p.dout.ss, s.sq - r0, p.dim, al);
        load_kv<T, BK, D, NTH>(sK, sV, gK, gV, p, s, n_lo);
        cp_async_commit();
    }
    for (int n = n_lo; n < n_hi; n++) {
        const int st = (n - n_lo) & 1;
        if (n + 1 < n_hi) {
            load_kv<T, BK, D, NTH>(sK + (st ^ 1) * BK * LDS, sV + (st ^ 1) * BK * LDS, gK, gV, p, s, n + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const T *k = sK + st * BK * LDS;
        float sc[1][NS][4], dp[1][NS][4];
        zero(sc);
        zero(dp);
        gemm_nt<T, 1, NS, D, LDS>(sc, sQ + warp * 16 * LDS, k, lane);
        gemm_nt<T, 1, NS, D, LDS>(dp, sO + warp * 16 * LDS, sV + st * BK * LDS, lane);

        dq_grads(p, mk, blk.b, blk.h, sc, dp, lse2, dsum, wr0, (int64_t)n * BK, g, t);
        uint32_t a[1][NS / 2][4];
        to_a<T, 1, NS>(a, sc);
        gemm_rn<T, 1, ND, NS / 2, LDS>(dq, a, k, lane);
        __syncthreads();
    }

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int i = wr0 + g + hf * 8;
        if (i >= s.sq)
            continue;
        const int64_t off = row_off(p.dq, s, false, blk.h, i);
#pragma unroll
        for (int dt = 0; dt < ND; dt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int x = dt * 8 + 2 * t + e;
                if (x < p.dim)
                    store<T>(p.dq, off + x, dq[0][dt][2 * hf + e] * p.scale);
            }
    }
}

template <typename T, int D, int KQ, int KW, int KS, int QK, int QW>
static cudaError_t launch(const fa_cuda_params &p, bool bf16, cudaStream_t stream)
{
    constexpr int LDS = lds<D>();
    cudaError_t err = fa_cuda_rowsum(&p, bf16, stream);
    if (err != cudaSuccess)
        return err;

    constexpr int BN = 16 * (KW / KS);
    const size_t smem_kv = sizeof(T) * (size_t)(2 * BN + 4 * KQ) * LDS + sizeof(float) * 4 * KQ;
    auto kv = dk_dv_kernel<T, D, KQ, KW, KS>;
    if ((err = cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv)) != cudaSuccess)
        return err;
    const int64_t kv_blocks = (int64_t)((p.max_k + BN - 1) / BN) * p.heads_kv * p.batch;
    if (kv_blocks > 0) {
        kv<<<(unsigned)kv_blocks, KW * 32, smem_kv, stream>>>(p);
        if ((err = cudaGetLastError()) != cudaSuccess)
            return err;
    }

    constexpr int BM = 16 * QW;
    const size_t smem_q = sizeof(T) * (size_t)(2 * BM + 4 * QK) * LDS;
    auto qk = dq_kernel<T, D, QK, QW>;
    if ((err = cudaFuncSetAttribute(qk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q)) != cudaSuccess)
        return err;
    const int64_t q_blocks = (int64_t)((p.max_q + BM - 1) / BM) * p.heads_q * p.batch;
    if (q_blocks > 0)
        qk<<<(unsigned)q_blocks, QW * 32, smem_q, stream>>>(p);
    return cudaGetLastError();
}

} // namespace fa

extern "C" cudaError_t fa_cuda_rowsum(const fa_cuda_params *p, int bf16, cudaStream_t stream)
{
    const int64_t rows = p->rows * p->heads_q;
    if (rows <= 0)
        return cudaSuccess;
    if (p->o_vec && p->aligned && !p->dout.f32) {
        if (bf16)
            fa::rowsum_vec_kernel<__nv_bfloat16><<<(unsigned)((rows + 31) / 32), 256, 0, stream>>>(*p);
        else
            fa::rowsum_vec_kernel<__half><<<(unsigned)((rows + 31) / 32), 256, 0, stream>>>(*p);
    } else {
        fa::rowsum_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(*p, bf16 != 0);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t fa_cuda_flash_backward(const fa_cuda_params *p, int bf16, int dpad,
                                              cudaStream_t stream)
{
#define FA_BWD_CASE(D, FM, FN, FW, KQ, KW, KS, QK, QW)                                       \
    case D:                                                                                  \
        return bf16 ? fa::launch<__nv_bfloat16, D, KQ, KW, KS, QK, QW>(*p, true, stream)     \
                    : fa::launch<__half, D, KQ, KW, KS, QK, QW>(*p, false, stream);
    switch (dpad) {
        FA_CUDA_TILES(FA_BWD_CASE)
    }
#undef FA_BWD_CASE
    return cudaErrorInvalidValue;
}
