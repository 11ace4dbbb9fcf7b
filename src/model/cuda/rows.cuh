// SPDX-License-Identifier: MIT
// The row formulas the CUDA engine's kernels share (layers.cu, gemv.cu), each written once so
// that a row gets the same bits from every kernel that computes it: the block sums, RMSNorm's
// sum of squares and scaling over float4 quads, and SwiGLU.
#ifndef FA_MODEL_CUDA_ROWS_CUH
#define FA_MODEL_CUDA_ROWS_CUH

#include <cuda_bf16.h>
#include <stdint.h>

constexpr int kNormThreads = 256; // the threads a normed row is summed over

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The sum over the block, the same bits on every thread (a fixed order: lanes, then warps).
template <int Threads>
__device__ float block_sum(float v, float *smem)
{
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); // smem may still be read by a previous call
    if (lane == 0)
        smem[warp] = v;
    __syncthreads();
    float t = lane < Threads / 32 ? smem[lane] : 0.0f;
    return warp_sum(t);
}

// A quad's share of a row's sum of squares. Thread tid adds the quads tid, tid + kNormThreads,
// ... in that order (a quad of zeros past the row adds +0 and changes nothing), then
// block_sum<kNormThreads>: one order whatever holds the row.
__device__ __forceinline__ float quad_sumsq(float4 v)
{
    return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, v.x * v.x)));
}

// 1 / RMS of a row of dim elements whose squares sum to ss.
__device__ __forceinline__ float rms_inv(float ss, int dim, float eps) { return 1.0f / sqrtf(ss / (float)dim + eps); }

// A quad of the normed row, g * (inv * v), as four bf16 (nearest even) in a uint2.
__device__ __forceinline__ uint2 rms_quad_out(float4 v, float4 g, float inv)
{
    const __nv_bfloat162 lo = __floats2bfloat162_rn(g.x * (inv * v.x), g.y * (inv * v.y));
    const __nv_bfloat162 hi = __floats2bfloat162_rn(g.z * (inv * v.z), g.w * (inv * v.w));
    uint2 w;
    w.x = *reinterpret_cast<const uint32_t *>(&lo);
    w.y = *reinterpret_cast<const uint32_t *>(&hi);
    return w;
}

// A row of dim = 4 quads elements normed into out (bf16), the block's kNormThreads threads in
// the order above, x read twice: rows too long for registers, and the few-row projections'.
__device__ __forceinline__ void rms_row_quads(__nv_bfloat16 *out, const float *xr, const float *g, int quads,
                                              float eps, float *red)
{
    const float4 *x4 = reinterpret_cast<const float4 *>(xr);
    float ss = 0.0f;
    for (int q = threadIdx.x; q < quads; q += kNormThreads)
        ss += quad_sumsq(x4[q]);
    const float inv = rms_inv(block_sum<kNormThreads>(ss, red), 4 * quads, eps);
    for (int q = threadIdx.x; q < quads; q += kNormThreads)
        reinterpret_cast<uint2 *>(out)[q] = rms_quad_out(x4[q], reinterpret_cast<const float4 *>(g)[q], inv);
}

// SwiGLU of a gate and an up value (both as bf16 already): silu(g) u.
__device__ __forceinline__ float swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

#endif
