// SPDX-License-Identifier: MIT
// The CUDA engine's layer kernels: the embedding gather, RMSNorm (float32 residual in, bf16
// out, for the next GEMM), SwiGLU, the float32 -> bf16 weight conversion, and the sampler.
// Each mirrors the CPU runner's formula (forward.c, sampler.c) in float32 arithmetic; the
// row formulas gemv.cu fuses into its projections live in rows.cuh.
#include "layers.h"
#include "rows.cuh"

#include <cuda_bf16.h>
#include <math.h>

namespace {

constexpr int kSampleThreads = 1024;

__global__ void embed_kernel(float *x, const __nv_bfloat16 *emb, const int32_t *tokens, int dim)
{
    const int t = blockIdx.x;
    const __nv_bfloat16 *row = emb + (size_t)tokens[t] * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        x[(size_t)t * dim + j] = __bfloat162float(row[j]);
}

// out[r] = g * (x[row] / sqrt(mean(x[row]^2) + eps)), row = rows ? rows[r] : r. A row a block
// of kNormThreads whatever the number of rows, so a row's sum has one order alone or in any
// batch. V: the row held in registers as up to V float4 a thread (dim % 4 == 0 and dim <=
// 4 V kNormThreads), read once and written as bf16 quads; V = -1: longer rows of quads, read
// twice (rms_row_quads: the same bits); V = 0: any dim, element by element.
template <int V>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(__nv_bfloat16 *out, const float *x,
                                                               const int32_t *rows, const float *g, int dim,
                                                               float eps)
{
    __shared__ float smem[32];
    const int r = blockIdx.x, tid = threadIdx.x;
    const float *xr = x + (size_t)(rows ? rows[r] : r) * dim;
    __nv_bfloat16 *orow = out + (size_t)r * dim;
    float ss = 0.0f;
    if constexpr (V > 0) {
        const int quads = dim / 4;
        float4 v[V];
#pragma unroll
        for (int i = 0; i < V; i++) {
            const int q = tid + i * kNormThreads;
            v[i] = q < quads ? reinterpret_cast<const float4 *>(xr)[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            ss += quad_sumsq(v[i]);
        }
        const float inv = rms_inv(block_sum<kNormThreads>(ss, smem), dim, eps);
#pragma unroll
        for (int i = 0; i < V; i++) {
            const int q = tid + i * kNormThreads;
            if (q >= quads)
                break;
            reinterpret_cast<uint2 *>(orow)[q] = rms_quad_out(v[i], reinterpret_cast<const float4 *>(g)[q], inv);
        }
    } else if constexpr (V < 0) {
        rms_row_quads(orow, xr, g, dim / 4, eps, smem);
    } else {
        for (int j = tid; j < dim; j += kNormThreads)
            ss += xr[j] * xr[j];
        const float inv = rms_inv(block_sum<kNormThreads>(ss, smem), dim, eps);
        for (int j = tid; j < dim; j += kNormThreads)
            orow[j] = __float2bfloat16_rn(g[j] * (inv * xr[j]));
    }
}

// out[t, j] = silu(gate[t, j]) * up[t, j]; gate_up [T, 2 hid] holds gate then up. Row t is
// blockIdx.x, its columns kSwigluThreads a block along y: no index division per element.
// VEC: 8 columns a thread in 16-byte loads and stores (hid % 8 == 0), else one.
constexpr int kSwigluThreads = 256;
template <bool VEC> __global__ void swiglu_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *gate_up, int hid)
{
    const size_t t = blockIdx.x;
    constexpr int W = VEC ? 8 : 1;
    const int j = (blockIdx.y * kSwigluThreads + threadIdx.x) * W;
    if (j >= hid)
        return;
    const __nv_bfloat16 *gr = gate_up + t * 2 * hid + j, *ur = gr + hid;
    if constexpr (VEC) {
        const uint4 gv = *reinterpret_cast<const uint4 *>(gr), uv = *reinterpret_cast<const uint4 *>(ur);
        const __nv_bfloat162 *g2 = reinterpret_cast<const __nv_bfloat162 *>(&gv);
        const __nv_bfloat162 *u2 = reinterpret_cast<const __nv_bfloat162 *>(&uv);
        uint4 ov;
        __nv_bfloat162 *o2 = reinterpret_cast<__nv_bfloat162 *>(&ov);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 g = __bfloat1622float2(g2[k]), u = __bfloat1622float2(u2[k]);
            o2[k] = __floats2bfloat162_rn(swiglu(g.x, u.x), swiglu(g.y, u.y));
        }
        *reinterpret_cast<uint4 *>(out + t * hid + j) = ov;
    } else {
        const float g = __bfloat162float(*gr), u = __bfloat162float(*ur);
        out[t * hid + j] = __float2bfloat16_rn(swiglu(g, u));
    }
}

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

// Whether (v, i) beats (bv, bi): larger, the lower id on ties; NaN never wins.
__device__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// Weights w >= tau (and > 0) are the nucleus.
__device__ bool member(float w, float tau) { return w >= tau && w > 0.0f; }

// One block a sampled row: fa_sample_logits (sampler.c) in parallel. The nucleus threshold is
// found by bisection over the float bits of the weights (S(tau) = the mass of {w >= tau}
// falls as tau grows; the largest tau with S(tau) >= topp * total is a weight's value, the
// one the CPU's sort stops at); the draw walks ids in order, one chunk a thread. A row holding
// NaN or +inf gets -1.
__global__ void sample_kernel(int32_t *next, float *wts, const float *logits, const float *temperature,
                              const float *topp, const float *uniform, int V)
{
    __shared__ float smem[32];
    __shared__ float sval[32];
    __shared__ int sidx[32];
    __shared__ int answer;
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *l = logits + (size_t)row * V;
    float *w = wts + (size_t)row * V;

    float bv = -INFINITY;
    int bi = V, bad = 0;
    for (int i = tid; i < V; i += kSampleThreads) {
        bad |= !(l[i] < INFINITY);
        if (better(l[i], i, bv, bi))
            bv = l[i], bi = i;
    }
    if (__syncthreads_or(bad)) {
        if (tid == 0)
            next[row] = -1;
        return;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi))
            bv = ov, bi = oi;
    }
    if (lane == 0)
        sval[warp] = bv, sidx[warp] = bi;
    __syncthreads();
    if (tid == 0) {
        for (int k = 1; k < kSampleThreads / 32; k++)
            if (better(sval[k], sidx[k], sval[0], sidx[0]))
                sval[0] = sval[k], sidx[0] = sidx[k];
        answer = sidx[0] < V ? sidx[0] : 0;
    }
    __syncthreads();
    const int best = answer;
    const float T = temperature[row];
    if (!(T > 0.0f)) {
        if (tid == 0)
            next[row] = best;
        return;
    }
    const float mx = l[best];
    float part = 0.0f;
    for (int i = tid; i < V; i += kSampleThreads) {
        float x = expf((l[i] - mx) / T);
        x = x == x ? x : 0.0f;
        w[i] = x;
        part += x;
    }
    const float total = block_sum<kSampleThreads>(part, smem);
    float tau = 0.0f, mass = total;
    const float p = topp[row];
    if (p > 0.0f && p < 1.0f) {
        const float want = p * total;
        unsigned lo = 0u, hi = __float_as_uint(1.0f) + 1u; // S(lo) >= want > S(hi)
        while (hi - lo > 1u) {
            const unsigned mid = lo + (hi - lo) / 2u;
            const float t = __uint_as_float(mid);
            float s = 0.0f;
            for (int i = tid; i < V; i += kSampleThreads)
                s += w[i] >= t ? w[i] : 0.0f;
            s = block_sum<kSampleThreads>(s, smem);
            if (s >= want)
                lo = mid;
            else
                hi = mid;
        }
        tau = __uint_as_float(lo);
        float s = 0.0f;
        for (int i = tid; i < V; i += kSampleThreads)
            s += member(w[i], tau) ? w[i] : 0.0f;
        mass = block_sum<kSampleThreads>(s, smem);
    }
    const float r = uniform[row] * mass;
    // this thread's chunk, its nucleus mass, and the mass of the chunks before it
    const int chunk = (V + kSampleThreads - 1) / kSampleThreads;
    const int i0 = tid * chunk, i1 = min(V, i0 + chunk);
    float csum = 0.0f;
    int last = -1;
    for (int i = i0; i < i1; i++)
        if (member(w[i], tau))
            csum += w[i], last = i;
    float incl = csum;
    for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += y;
    }
    __syncthreads();
    if (lane == 31)
        smem[warp] = incl;
    if (tid == 0)
        answer = V;
    __syncthreads();
    float before = 0.0f;
    for (int k = 0; k < warp; k++)
        before += smem[k];
    const float excl = before + incl - csum;
    if (last >= 0 && r >= excl && r < excl + csum) {
        float c = excl;
        int pick = last;
        for (int i = i0; i < i1; i++)
            if (member(w[i], tau)) {
                c += w[i];
                if (r < c) {
                    pick = i;
                    break;
                }
            }
        atomicMin(&answer, pick); // rounding may put r in two neighbouring chunks: the first wins
    }
    __syncthreads();
    if (answer == V) { // rounding left the sum short of r: the nucleus's last id
        int lastall = last;
        for (int o = 16; o > 0; o >>= 1)
            lastall = max(lastall, __shfl_xor_sync(0xffffffffu, lastall, o));
        if (lane == 0)
            sidx[warp] = lastall;
        __syncthreads();
        if (tid == 0) {
            int m = -1;
            for (int k = 0; k < kSampleThreads / 32; k++)
                m = max(m, sidx[k]);
            answer = m >= 0 ? m : best;
        }
        __syncthreads();
    }
    if (tid == 0)
        next[row] = answer;
}

int grid_for(size_t n, int threads)
{
    const size_t blocks = (n + threads - 1) / threads;
    return (int)(blocks < 65536 ? (blocks ? blocks : 1) : 65536);
}

} // namespace

extern "C" {

cudaError_t fa_layers_embed(float *x, const uint16_t *emb, const int32_t *tokens, int T, int dim, cudaStream_t s)
{
    embed_kernel<<<T, 256, 0, s>>>(x, reinterpret_cast<const __nv_bfloat16 *>(emb), tokens, dim);
    return cudaGetLastError();
}

cudaError_t fa_layers_rmsnorm(uint16_t *out, const float *x, const int32_t *rows, const float *g, int T, int dim,
                              float eps, cudaStream_t s)
{
    if (T == 0)
        return cudaSuccess;
    __nv_bfloat16 *o = reinterpret_cast<__nv_bfloat16 *>(out);
    const int quads = dim % 4 == 0 ? dim / 4 : 0; // rows of whole float4s (buffers from cudaMalloc)
    if (quads && quads <= 2 * kNormThreads)
        rmsnorm_kernel<2><<<T, kNormThreads, 0, s>>>(o, x, rows, g, dim, eps);
    else if (quads && quads <= 8 * kNormThreads)
        rmsnorm_kernel<8><<<T, kNormThreads, 0, s>>>(o, x, rows, g, dim, eps);
    else if (quads)
        rmsnorm_kernel<-1><<<T, kNormThreads, 0, s>>>(o, x, rows, g, dim, eps);
    else
        rmsnorm_kernel<0><<<T, kNormThreads, 0, s>>>(o, x, rows, g, dim, eps);
    return cudaGetLastError();
}

cudaError_t fa_layers_swiglu(uint16_t *out, const uint16_t *gate_up, int T, int hid, cudaStream_t s)
{
    if (T == 0)
        return cudaSuccess;
    const bool vec = hid % 8 == 0; // 16-byte rows from cudaMalloc'd buffers
    const int cols = vec ? hid / 8 : hid;
    const dim3 grid((unsigned)T, (unsigned)((cols + kSwigluThreads - 1) / kSwigluThreads));
    __nv_bfloat16 *o = reinterpret_cast<__nv_bfloat16 *>(out);
    const __nv_bfloat16 *gu = reinterpret_cast<const __nv_bfloat16 *>(gate_up);
    if (vec)
        swiglu_kernel<true><<<grid, kSwigluThreads, 0, s>>>(o, gu, hid);
    else
        swiglu_kernel<false><<<grid, kSwigluThreads, 0, s>>>(o, gu, hid);
    return cudaGetLastError();
}

cudaError_t fa_layers_to_bf16(uint16_t *dst, const float *src, size_t n, cudaStream_t s)
{
    to_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(reinterpret_cast<__nv_bfloat16 *>(dst), src, n);
    return cudaGetLastError();
}

cudaError_t fa_layers_sample(int32_t *next, float *scratch, const float *logits, const float *temperature,
                             const float *topp, const float *uniform, int ns, int V, cudaStream_t s)
{
    if (ns == 0)
        return cudaSuccess;
    sample_kernel<<<ns, kSampleThreads, 0, s>>>(next, scratch, logits, temperature, topp, uniform, V);
    return cudaGetLastError();
}

} // extern "C"
