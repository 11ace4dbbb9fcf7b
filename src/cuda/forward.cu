// SPDX-License-Identifier: MIT
// The flash forward on tensor cores: one block owns BM query rows of one head and
// walks the key/value tiles its mask allows, S = Q K^T and P never leave registers,
// K/V tiles double-buffered through cp.async.
#include "cuda.h"
#include "tile.cuh"

namespace fa {

template <typename T, int D, int BM, int BN, int W>
__global__ void __launch_bounds__(W * 32, W == 8 ? 2 : 1) flash_forward(const fa_cuda_params p)
{
    constexpr int MT = BM / (16 * W), NS = BN / 8, ND = D / 8, LDS = lds<D>(), NTH = W * 32;
    static_assert(MT >= 1 && BM == MT * 16 * W, "BM must be a multiple of 16 * warps");
    extern __shared__ __align__(16) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem);
    T *sK = sQ + BM * LDS; // two stages
    T *sV = sK + 2 * BN * LDS;

    query_tile_t qt;
    if (!query_tile<BM, BN>(p, qt))
        return;
    const block_t &blk = qt.blk;
    const seq_t &s = qt.s;
    const mask_t &mk = qt.mk;
    const int r0 = qt.r0, n_lo = qt.n_lo, n_hi = qt.n_hi;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const T *gK = (const T *)p.k.p + row_off(p.k, s, true, qt.hk, 0);
    const T *gV = (const T *)p.v.p + row_off(p.v, s, true, qt.hk, 0);

    float o[MT][ND][4], m[MT][2], l[MT][2];
    zero(o);
    softmax_init(m, l);

    if (n_lo < n_hi) {
        load_tile<T, BM, D, NTH>(sQ, (const T *)p.q.p + row_off(p.q, s, false, blk.h, r0), p.q.ss,
                                 s.sq - r0, p.dim, p.aligned);
        load_kv<T, BN, D, NTH>(sK, sV, gK, gV, p, s, n_lo);
        cp_async_commit();
    }
    const int wr0 = r0 + warp * MT * 16; // this warp's first row
    for (int n = n_lo; n < n_hi; n++) {
        const int st = (n - n_lo) & 1;
        if (n + 1 < n_hi) {
            load_kv<T, BN, D, NTH>(sK + (st ^ 1) * BN * LDS, sV + (st ^ 1) * BN * LDS, gK, gV, p, s, n + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        float sc[MT][NS][4];
        zero(sc);
        gemm_nt<T, MT, NS, D, LDS>(sc, sQ + warp * MT * 16 * LDS, sK + st * BN * LDS, lane);

        const int c0 = n * BN;
        to_logits(p, sc);
        if (!mk.all_visible(wr0, wr0 + MT * 16, c0, c0 + BN))
            apply_mask(mk, sc, wr0 + g, c0 + 2 * t);

        float alpha[MT][2];
        softmax_update(sc, m, l, alpha);
        rescale(o, alpha);

        if (p.dropout_p > 0.0f) // dropped to 0 here; the 1/(1-p) comes in float32 at the end
            apply_dropout(p, sc, blk.b, blk.h, wr0 + g, c0 + 2 * t);

        uint32_t pa[MT][NS / 2][4];
        to_a<T, MT, NS>(pa, sc);
        gemm_rn<T, MT, ND, NS / 2, LDS>(o, pa, sV + st * BN * LDS, lane);
        __syncthreads();
    }

    // epilogue: normalise, write o (and lse)
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const row_out_t out = softmax_out(m[mt][hf], l[mt][hf], p.dropout_scale);
            const int i = wr0 + mt * 16 + g + hf * 8;
            if (i >= s.sq)
                continue;
            const int64_t off = row_off(p.o, s, false, blk.h, i);
#pragma unroll
            for (int dt = 0; dt < ND; dt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int x = dt * 8 + 2 * t + e;
                    if (x < p.dim)
                        store<T>(p.o, off + x, o[mt][dt][2 * hf + e] * out.inv);
                }
            if (p.lse && t == 0)
                p.lse[lse_index(p, s, blk.h, i)] = out.lse;
        }
}

template <typename T, int D, int BM, int BN, int W>
static cudaError_t launch(const fa_cuda_params &p, cudaStream_t stream)
{
    constexpr int LDS = lds<D>();
    const size_t smem = sizeof(T) * (size_t)(BM + 4 * BN) * LDS;
    auto kern = flash_forward<T, D, BM, BN, W>;
    cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    const int64_t blocks = (int64_t)((p.max_q + BM - 1) / BM) * p.heads_q * p.batch;
    if (blocks == 0)
        return cudaSuccess;
    kern<<<(unsigned)blocks, W * 32, smem, stream>>>(p);
    return cudaGetLastError();
}

} // namespace fa

extern "C" cudaError_t fa_cuda_flash_forward(const fa_cuda_params *p, int bf16, int dpad,
                                             cudaStream_t stream)
{
#define FA_FWD_CASE(D, FM, FN, FW, KQ, KW, KS, QK, QW)                                        \
    case D:                                                                                  \
        return bf16 ? fa::launch<__nv_bfloat16, D, FM, FN, FW>(*p, stream)                   \
                    : fa::launch<__half, D, FM, FN, FW>(*p, stream);
    switch (dpad) {
        FA_CUDA_TILES(FA_FWD_CASE)
    }
#undef FA_FWD_CASE
    return cudaErrorInvalidValue;
}
