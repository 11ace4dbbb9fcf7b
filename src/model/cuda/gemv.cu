// SPDX-License-Identifier: MIT
// The CUDA engine's projections for steps of a few rows (gemv.h): a persistent grid of warps,
// each streaming whole bf16 weight rows past the step's T activation rows held in shared
// memory, with the neighbouring layer kernel fused in: RMSNorm before (the rows normed into
// shared memory by every block), SwiGLU after (a warp takes a gate row and its up row), or the
// residual add into the float32 stream.
//
// Bandwidth: a lane keeps 8 or 16 16-byte loads in flight (L1 bypassed; the weights are read
// once a step). Launched as a programmatic dependent (sm_90), a block sends its warps' first
// weight rows towards L2 before it waits for the previous kernel's results.
#include "gemv.h"
#include "rows.cuh"

#include <cuda_bf16.h>
#include <stdlib.h>

namespace {

constexpr int kThreads = kNormThreads; // the norm's block: 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kDepth = 8;       // 16-byte weight loads in flight a lane at T >= 4; 16 below
constexpr int kPrefetch = 4;    // 128-byte lines of a warp's first row a lane sends towards L2
constexpr int kDefaultRows = 4; // FLASHATTN_GEMV_ROWS unset
constexpr int kStaticSmem = 128; // the norm's block sums (red)

enum Mode { kNorm, kSwiglu, kResidual };

struct Args {
    void *y;      // kNorm: bf16 or float32 [T, ldy]; kSwiglu: bf16 [T, ldy]; kResidual: float32 x [T, ldy]
    int ldy, y_f32;
    const float *x;      // kNorm, kSwiglu: the float32 rows to norm
    const int32_t *rows; // kNorm: x's row of output row t (NULL: t)
    const float *g;      // the norm's weights [K]
    float eps;
    const __nv_bfloat16 *in; // kResidual: the bf16 rows [T, K]
    const __nv_bfloat16 *w;  // [N, K]; kSwiglu [2 N, K]
    int T, N, K;
};

__device__ __forceinline__ void wait_for_previous_grid()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ uint4 load_weights(const uint4 *p)
{
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// acc[t] += the 8 products of a weight chunk and row t's chunk c in s (bf16 [T, K]), in
// element order: a row's sum runs in one order whatever T is.
template <int T>
__device__ __forceinline__ void chunk_dot(float (&acc)[T], uint4 wv, const __nv_bfloat16 *s, int K, int c)
{
    const __nv_bfloat162 *w2 = reinterpret_cast<const __nv_bfloat162 *>(&wv);
    float2 wf[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        wf[k] = __bfloat1622float2(w2[k]);
#pragma unroll
    for (int t = 0; t < T; t++) {
        const uint4 xv = reinterpret_cast<const uint4 *>(s + (size_t)t * K)[c];
        const __nv_bfloat162 *x2 = reinterpret_cast<const __nv_bfloat162 *>(&xv);
        float a = acc[t];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 xf = __bfloat1622float2(x2[k]);
            a = fmaf(wf[k].x, xf.x, a);
            a = fmaf(wf[k].y, xf.y, a);
        }
        acc[t] = a;
    }
}

// acc[r][t] = weight row w[r] . row t of s, summed over the warp (every lane holds it).
template <int T, int R, int D>
__device__ __forceinline__ void dot_rows(float (&acc)[R][T], const uint4 *const (&w)[R], const __nv_bfloat16 *s,
                                         int K, int lane)
{
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++)
            acc[r][t] = 0.0f;
    const int chunks = K / 8;
    for (int c0 = lane; c0 < chunks; c0 += 32 * D) {
        uint4 wv[R][D];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int d = 0; d < D; d++) {
                const int c = c0 + 32 * d;
                wv[r][d] = c < chunks ? load_weights(w[r] + c) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int c = c0 + 32 * d;
            if (c < chunks)
#pragma unroll
                for (int r = 0; r < R; r++)
                    chunk_dot<T>(acc[r], wv[r][d], s, K, c);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++)
            acc[r][t] = warp_sum(acc[r][t]);
}

// One kernel for the three modes; T the rows the accumulators hold (a.T of them real, the
// rest zeros in shared memory and never stored).
template <int T, int M, int D>
__global__ void __launch_bounds__(kThreads) proj_kernel(Args a)
{
    extern __shared__ uint4 smem_rows[];
    __shared__ float red[32];
    __nv_bfloat16 *s = reinterpret_cast<__nv_bfloat16 *>(smem_rows);
    constexpr int R = M == kSwiglu ? 2 : 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int first = blockIdx.x * kWarps + warp, stride = gridDim.x * kWarps;
    const int chunks = a.K / 8;
    const uint4 *w = reinterpret_cast<const uint4 *>(a.w);
    if (first < a.N) // the weights do not depend on the previous kernel
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int i = 0; i < kPrefetch; i++) {
                const int line = lane + 32 * i; // 8 chunks a line
                if (line * 8 < chunks)
                    prefetch_l2(w + ((size_t)first + (size_t)r * a.N) * chunks + (size_t)line * 8);
            }
    wait_for_previous_grid();
    if constexpr (M == kResidual) {
        const uint4 *src = reinterpret_cast<const uint4 *>(a.in);
        for (int i = threadIdx.x; i < T * chunks; i += kThreads)
            smem_rows[i] = i < a.T * chunks ? src[i] : make_uint4(0u, 0u, 0u, 0u);
    } else {
        for (int t = 0; t < T; t++) {
            if (t < a.T) {
                rms_row_quads(s + (size_t)t * a.K, a.x + (size_t)(a.rows ? a.rows[t] : t) * a.K, a.g, a.K / 4, a.eps,
                              red);
            } else {
                for (int i = threadIdx.x; i < chunks; i += kThreads)
                    smem_rows[(size_t)t * chunks + i] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    }
    __syncthreads();
    for (int j = first; j < a.N; j += stride) {
        float acc[R][T];
        const uint4 *wr[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            wr[r] = w + ((size_t)j + (size_t)r * a.N) * chunks;
        dot_rows<T, R, D>(acc, wr, s, a.K, lane);
#pragma unroll
        for (int t = 0; t < T; t++) {
            if (lane != t || t >= a.T)
                continue;
            const size_t at = (size_t)t * a.ldy + j;
            if constexpr (M == kNorm) {
                if (a.y_f32)
                    static_cast<float *>(a.y)[at] = acc[0][t];
                else
                    static_cast<__nv_bfloat16 *>(a.y)[at] = __float2bfloat16_rn(acc[0][t]);
            } else if constexpr (M == kSwiglu) {
                const float gate = __bfloat162float(__float2bfloat16_rn(acc[0][t]));
                const float up = __bfloat162float(__float2bfloat16_rn(acc[R - 1][t]));
                static_cast<__nv_bfloat16 *>(a.y)[at] = __float2bfloat16_rn(swiglu(gate, up));
            } else {
                static_cast<float *>(a.y)[at] += acc[0][t];
            }
        }
    }
}

// The accumulator rows a launch of T rows uses: 1, 2, 4 or 8.
int padded_rows(int T) { return T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8; }

template <int T, int M, int D = kDepth> cudaError_t launch(const fa_gemv_config *cfg, const Args &a, cudaStream_t s)
{
    void (*k)(Args) = proj_kernel<T, M, D>;
    const size_t smem = (size_t)T * (size_t)a.K * 2;
    int per_sm = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem);
    if (e != cudaSuccess)
        return e;
    if (per_sm < 1)
        return cudaErrorInvalidConfiguration;
    const int need = (a.N + kWarps - 1) / kWarps; // a warp an output column
    const int blocks = need < cfg->sms * per_sm ? need : cfg->sms * per_sm;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)blocks);
    lc.blockDim = dim3(kThreads);
    lc.dynamicSmemBytes = smem;
    lc.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = attr;
    lc.numAttrs = cfg->pdl ? 1 : 0;
    return cudaLaunchKernelEx(&lc, k, a);
}

// Every instantiation may take the shared memory fa_gemv_rows allows: set once a device, so
// that launches (and graphs captured from them) never change a function's attributes.
template <int M> cudaError_t allow_smem(int bytes)
{
    void (*const ks[])(Args) = { proj_kernel<1, M, 2 * kDepth>, proj_kernel<2, M, 2 * kDepth>, proj_kernel<4, M, kDepth>,
                                 proj_kernel<8, M, kDepth> };
    for (auto k : ks) {
        const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

template <int M> cudaError_t dispatch(const fa_gemv_config *cfg, const Args &a, cudaStream_t s)
{
    if (a.T < 1 || a.T > fa_gemv_rows(cfg, a.K) || a.N < 1)
        return cudaErrorInvalidValue;
    switch (padded_rows(a.T)) {
    case 1:
        return launch<1, M, 2 * kDepth>(cfg, a, s);
    case 2:
        return launch<2, M, 2 * kDepth>(cfg, a, s);
    case 4:
        return launch<4, M>(cfg, a, s);
    default:
        return launch<8, M>(cfg, a, s);
    }
}

} // namespace

extern "C" {

cudaError_t fa_gemv_config_init(fa_gemv_config *cfg, int dev)
{
    int major = 0;
    cudaError_t e = cudaDeviceGetAttribute(&cfg->sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&cfg->smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    const int dyn = cfg->smem_max - kStaticSmem;
    if (e == cudaSuccess && (e = allow_smem<kNorm>(dyn)) == cudaSuccess &&
        (e = allow_smem<kSwiglu>(dyn)) == cudaSuccess)
        e = allow_smem<kResidual>(dyn);
    if (e != cudaSuccess)
        return e;
    const char *p = getenv("FLASHATTN_GEMV_PDL");
    cfg->pdl = major >= 9 && !(p && p[0] == '0' && p[1] == '\0');
    const char *r = getenv("FLASHATTN_GEMV_ROWS");
    char *end = NULL;
    const long v = r && *r ? strtol(r, &end, 10) : kDefaultRows;
    cfg->max_rows = r && *r && (*end || v < 0) ? kDefaultRows : v > FA_GEMV_MAX_ROWS ? FA_GEMV_MAX_ROWS : (int)v;
    return cudaSuccess;
}

int fa_gemv_rows(const fa_gemv_config *cfg, int K)
{
    if (K < 8 || K % 8 != 0)
        return 0;
    // the padded rows' activations beside the norm's static shared memory
    for (int T = cfg->max_rows; T >= 1; T--)
        if ((size_t)padded_rows(T) * (size_t)K * 2 + kStaticSmem <= (size_t)cfg->smem_max)
            return T;
    return 0;
}

cudaError_t fa_gemv_norm_proj(const fa_gemv_config *cfg, void *y, int y_f32, int ldy, const float *x,
                              const int32_t *rows, const float *g, float eps, const uint16_t *w, int T, int N, int K,
                              cudaStream_t s)
{
    Args a = {};
    a.y = y, a.ldy = ldy, a.y_f32 = y_f32, a.x = x, a.rows = rows, a.g = g, a.eps = eps;
    a.w = reinterpret_cast<const __nv_bfloat16 *>(w), a.T = T, a.N = N, a.K = K;
    return dispatch<kNorm>(cfg, a, s);
}

cudaError_t fa_gemv_norm_swiglu(const fa_gemv_config *cfg, uint16_t *out, const float *x, const float *g, float eps,
                                const uint16_t *w, int T, int N, int K, cudaStream_t s)
{
    Args a = {};
    a.y = out, a.ldy = N, a.x = x, a.g = g, a.eps = eps;
    a.w = reinterpret_cast<const __nv_bfloat16 *>(w), a.T = T, a.N = N, a.K = K;
    return dispatch<kSwiglu>(cfg, a, s);
}

cudaError_t fa_gemv_residual(const fa_gemv_config *cfg, float *x, int ldx, const uint16_t *in, const uint16_t *w,
                             int T, int N, int K, cudaStream_t s)
{
    Args a = {};
    a.y = x, a.ldy = ldx, a.in = reinterpret_cast<const __nv_bfloat16 *>(in);
    a.w = reinterpret_cast<const __nv_bfloat16 *>(w), a.T = T, a.N = N, a.K = K;
    return dispatch<kResidual>(cfg, a, s);
}

} // extern "C"
