// SPDX-License-Identifier: MIT
// The standard (unfused) algorithm on the GPU: scores and probabilities go through
// global memory, one block per query row. It is the yardstick the conformance grid
// measures the flash kernels against, in the same precision: fp32 scores and softmax,
// P (and dS) rounded to the input dtype before their products, and P V (and dS K) summed
// by the tensor cores, as the flash kernels take them.
#include "cuda.h"
#include "tile.cuh"

#include <type_traits>

namespace fa {

constexpr int kStdThreads = 128;

// Packed row r (over all sequences) -> sequence b and row i within it.
__device__ __forceinline__ void locate(const int32_t *cu, int batch, int len, int64_t r, int *b,
                                       int64_t *i)
{
    if (!cu) {
        *b = (int)(r / len);
        *i = r % len;
        return;
    }
    int lo = 0, hi = batch; // cu[lo] <= r < cu[hi]
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (cu[mid] <= r)
            lo = mid;
        else
            hi = mid;
    }
    *b = lo;
    *i = r - cu[lo];
}

// The query row a block of the per-row kernels owns: grid (packed row r, head h).
struct row_t {
    int h, hk, b;
    int64_t r, i; // packed row, row within its sequence
    int64_t ws;   // start of the row's [max_k] slice of the score workspaces
    seq_t s;
};
__device__ __forceinline__ row_t query_row(const fa_cuda_params &p)
{
    row_t x;
    x.h = blockIdx.y;
    x.hk = x.h / p.group;
    x.r = blockIdx.x;
    locate(p.cu_q, p.batch, p.seqlen_q, x.r, &x.b, &x.i);
    x.s = seq_of(p, x.b);
    x.ws = ((int64_t)x.h * p.rows + x.r) * p.max_k;
    return x;
}

// out[x] = mult * sum_j w[j] m[j][x] for x < dim, over the sequence's keys j: P V and dS K.
// The sums run through the tensor cores as the flash kernels' do (m16n8k16, 16 keys a step
// into a float accumulator, whose additions the hardware rounds its own way): w is the A
// operand's row 0, eight columns of m the B operand; warp w takes column tiles w, w + 4, ...
// m's elements are M (T, or e4m3 for fp8 inputs: exact in bf16), times their block's factor
// in m_rows (fp8 factors per block of rows; then rounded to T, one rounding more than the
// fused kernel's, well within the fp8 tolerance).
template <typename T, typename M = T>
__device__ void weighted_key_rows(const fa_cuda_params &p, const row_t &row, const T *w,
                                  const fa_cuda_view &m, const fa_cuda_view &out, float mult, float mult2 = 1.0f,
                                  const fa_cuda_descale *m_rows = nullptr)
{
    const int64_t oo = row_off(out, row.s, false, row.h, row.i);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = lane / 4, t = lane % 4;
    const T zero = from_float<T>(0.0f);
    const int64_t sk = row.s.sk;
    auto wt = [&](int64_t j) { return j < sk ? w[j] : zero; };
    for (int n0 = warp * 8; n0 < p.dim; n0 += kStdThreads / 4) {
        const int x = n0 + c; // this lane's column of the B operand
        auto mt = [&](int64_t j) {
            return j < sk && x < p.dim ? to_float<M>(((const M *)m.p)[row_off(m, row.s, true, row.hk, j) + x]) *
                                             (m_rows ? descale_row(*m_rows, row.b, row.hk, (int)j) : 1.0f)
                                       : 0.0f;
        };
        float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        for (int64_t j0 = 0; j0 < sk; j0 += 16) {
            const int64_t j = j0 + 2 * t;
            uint32_t a[4] = { 0u, 0u, 0u, 0u };
            if (c == 0) { // row 0 of A; rows 1-15 stay zero
                a[0] = pack2<T>(to_float<T>(wt(j)), to_float<T>(wt(j + 1)));
                a[2] = pack2<T>(to_float<T>(wt(j + 8)), to_float<T>(wt(j + 9)));
            }
            const uint32_t b0 = pack2<T>(mt(j), mt(j + 1));
            const uint32_t b1 = pack2<T>(mt(j + 8), mt(j + 9));
            mma16816<T>::run(acc, a, b0, b1);
        }
        if (c == 0) // row 0 of the accumulator: columns n0 + 2t, n0 + 2t + 1
            for (int e = 0; e < 2; e++)
                if (n0 + 2 * t + e < p.dim)
                    store<T>(out, oo + n0 + 2 * t + e, acc[e] * mult * mult2);
    }
}

__device__ float block_reduce(float v, bool is_max)
{
    __shared__ float part[kStdThreads / 32];
#pragma unroll
    for (int w = 16; w > 0; w /= 2) {
        float o = __shfl_xor_sync(0xffffffffu, v, w);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    v = part[0];
    for (int w = 1; w < kStdThreads / 32; w++)
        v = is_max ? fmaxf(v, part[w]) : v + part[w];
    return v;
}

template <typename T>
__device__ float dot_rows(const T *a, const T *b, int dim)
{
    float acc = 0.0f;
    for (int x = 0; x < dim; x++)
        acc += to_float<T>(a[x]) * to_float<T>(b[x]);
    return acc;
}

// Scores of row (r, h) into s_ws, the softmax into p_ws (rounded to T), lse out. fp8 inputs
// (IN e4m3, T bf16): the scores times the descale factors, P rounded to e4m3 before its
// normalisation (max 1, as the flash kernel has it), 1 / sum into the row's s_ws[0] for std_pv.
template <typename T, typename IN = T>
__global__ void __launch_bounds__(kStdThreads) std_softmax(const fa_cuda_params p)
{
    constexpr bool F8 = std::is_same<IN, e4m3_t>::value;
    const row_t row = query_row(p);
    const seq_t &s = row.s;
    const int h = row.h, hk = row.hk, b = row.b;
    const int64_t i = row.i;
    const mask_t mk = mask_of(p, s.sq, s.sk);
    const IN *q = (const IN *)p.q.p + row_off(p.q, s, false, h, i);
    const double qk = F8 ? (double)descale_at(p.q_ds, b, hk) * descale_at(p.k_ds, b, hk) *
                               descale_row(p.q_ds, b, hk, (int)i)
                         : 1.0;
    float *srow = p.s_ws + row.ws;
    T *prow = (T *)p.p_ws + row.ws;
    // every score, masked ones too; the mask is applied after, as an unfused framework's
    // Q K^T, masked softmax, P V (each thread reads back only the scores it wrote)
    for (int j = threadIdx.x; j < s.sk; j += kStdThreads) {
        const IN *k = (const IN *)p.k.p + row_off(p.k, s, true, hk, j);
        srow[j] = logit2(p, F8 ? (float)(dot_rows(q, k, p.dim) * qk * descale_row(p.k_ds, b, hk, (int)j))
                               : dot_rows(q, k, p.dim));
    }
#define MASKED(j) (mk.visible(i, j) ? srow[j] : -INFINITY)
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < s.sk; j += kStdThreads)
        mx = fmaxf(mx, MASKED(j));
    mx = block_reduce(mx, true);
    const float base = mx == -INFINITY ? 0.0f : mx;
    float sum = 0.0f;
    for (int j = threadIdx.x; j < s.sk; j += kStdThreads)
        sum += exp2f(MASKED(j) - base);
    sum = block_reduce(sum, false);
    const float inv = sum != 0.0f ? 1.0f / sum : 0.0f; // NaN propagates (softmax.cuh: softmax_out)
    for (int j = threadIdx.x; j < s.sk; j += kStdThreads) {
        float pr = exp2f(MASKED(j) - base);
        if (F8)
            pr = to_float(e4m3_t{ __nv_cvt_float_to_fp8(pr, __NV_SATFINITE, __NV_E4M3) });
        else
            pr *= inv;
        if (p.dropout_p > 0.0f) {
            uint32_t w[4];
            dropout_words(p, b, h, i, j, w);
            pr = dropout_keep(p, w, j) ? pr : 0.0f; // 1/(1-p) in float32 after P V
        }
        prow[j] = from_float<T>(pr);
    }
#undef MASKED
    if (F8 && threadIdx.x == 0 && s.sk > 0) // its own score slot, read back above
        srow[0] = inv;
    if (p.lse && threadIdx.x == 0)
        p.lse[lse_index(p, s, h, i)] =
            sum != 0.0f ? (mx + log2f(sum)) * kLn2 : -INFINITY;
}

// o = P V for row (r, h).
template <typename T> __global__ void __launch_bounds__(kStdThreads) std_pv(const fa_cuda_params p)
{
    const row_t row = query_row(p);
    weighted_key_rows<T>(p, row, (const T *)p.p_ws + row.ws, p.v, p.o, p.dropout_scale);
}
__global__ void __launch_bounds__(kStdThreads) std_pv_e4m3(const fa_cuda_params p)
{
    const row_t row = query_row(p);
    const float inv = row.s.sk > 0 ? p.s_ws[row.ws] : 0.0f;
    weighted_key_rows<__nv_bfloat16, e4m3_t>(p, row, (const __nv_bfloat16 *)p.p_ws + row.ws, p.v, p.o,
                                             p.dropout_scale * inv, descale_at(p.v_ds, row.b, row.hk), &p.v_ds);
}

// Backward, per row: the dropped P and dS (both rounded to T) from the forward's lse.
template <typename T> __global__ void __launch_bounds__(kStdThreads) std_grad_scores(const fa_cuda_params p)
{
    const row_t row = query_row(p);
    const seq_t &s = row.s;
    const int h = row.h, hk = row.hk, b = row.b;
    const int64_t i = row.i;
    const mask_t mk = mask_of(p, s.sq, s.sk);
    const T *q = (const T *)p.q.p + row_off(p.q, s, false, h, i);
    const T *dO = (const T *)p.dout.p + row_off(p.dout, s, false, h, i);
    const float lse = p.lse[lse_index(p, s, h, i)];
    const float dsum = p.dsum[(int64_t)h * p.rows + row.r];
    T *prow = (T *)p.p_ws + row.ws;
    T *dsrow = (T *)p.ds_ws + row.ws;
    for (int j = threadIdx.x; j < s.sk; j += kStdThreads) {
        float pd = 0.0f, ds = 0.0f;
        if (mk.visible(i, j) && lse != -INFINITY) {
            const T *k = (const T *)p.k.p + row_off(p.k, s, true, hk, j);
            const T *v = (const T *)p.v.p + row_off(p.v, s, true, hk, j);
            const float x = logit2(p, dot_rows(q, k, p.dim));
            const float pr = exp2f(x - lse * kLog2e);
            bool keep = true;
            if (p.dropout_p > 0.0f) {
                uint32_t w[4];
                dropout_words(p, b, h, i, j, w);
                keep = dropout_keep(p, w, j);
            }
            const float dp = keep ? dot_rows(dO, v, p.dim) * p.dropout_scale : 0.0f;
            pd = keep ? pr : 0.0f;
            ds = pr * (dp - dsum) * cap_grad(p, x);
        }
        prow[j] = from_float<T>(pd);
        dsrow[j] = from_float<T>(ds);
    }
}

// dQ = scale * dS K for row (r, h).
template <typename T> __global__ void __launch_bounds__(kStdThreads) std_dq(const fa_cuda_params p)
{
    const row_t row = query_row(p);
    weighted_key_rows<T>(p, row, (const T *)p.ds_ws + row.ws, p.k, p.dq, p.scale);
}

// dK = scale * dS^T Q and dV = P^T dO for key row (kr, hk), summed over the group's heads.
template <typename T> __global__ void __launch_bounds__(kStdThreads) std_dkdv(const fa_cuda_params p)
{
    const int hk = blockIdx.y;
    const int64_t kr = blockIdx.x;
    int b;
    int64_t j;
    locate(p.cu_k, p.batch, p.seqlen_k, kr, &b, &j);
    const seq_t s = seq_of(p, b);
    const int64_t ok = row_off(p.dk, s, true, hk, j), ov = row_off(p.dv, s, true, hk, j);
    const int64_t row0 = s.q_base * p.seqlen_q + s.q0; // packed row of query 0
    for (int x = threadIdx.x; x < p.dim; x += kStdThreads) {
        float dk = 0.0f, dv = 0.0f;
        for (int hh = 0; hh < p.group; hh++) {
            const int h = hk * p.group + hh;
            const int64_t ws = ((int64_t)h * p.rows + row0) * p.max_k + j;
            for (int64_t i = 0; i < s.sq; i++) {
                const float ds = to_float<T>(((const T *)p.ds_ws)[ws + i * p.max_k]);
                const float pd = to_float<T>(((const T *)p.p_ws)[ws + i * p.max_k]);
                dk += ds * to_float<T>(((const T *)p.q.p)[row_off(p.q, s, false, h, i) + x]);
                dv += pd * to_float<T>(((const T *)p.dout.p)[row_off(p.dout, s, false, h, i) + x]);
            }
        }
        store<T>(p.dk, ok + x, dk * p.scale);
        store<T>(p.dv, ov + x, dv * p.dropout_scale);
    }
}

template <typename T> static cudaError_t forward(const fa_cuda_params &p, cudaStream_t stream)
{
    if (p.rows == 0 || p.heads_q == 0)
        return cudaSuccess;
    const dim3 grid((unsigned)p.rows, (unsigned)p.heads_q);
    std_softmax<T><<<grid, kStdThreads, 0, stream>>>(p);
    std_pv<T><<<grid, kStdThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

template <typename T> static cudaError_t backward(const fa_cuda_params &p, int64_t krows, cudaStream_t stream)
{
    if (p.rows > 0) {
        const dim3 grid((unsigned)p.rows, (unsigned)p.heads_q);
        std_grad_scores<T><<<grid, kStdThreads, 0, stream>>>(p);
        std_dq<T><<<grid, kStdThreads, 0, stream>>>(p);
    }
    if (krows > 0)
        std_dkdv<T><<<dim3((unsigned)krows, (unsigned)p.heads_kv), kStdThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

} // namespace fa

extern "C" cudaError_t fa_cuda_standard_forward(const fa_cuda_params *p, int bf16, cudaStream_t stream)
{
    return bf16 ? fa::forward<__nv_bfloat16>(*p, stream) : fa::forward<__half>(*p, stream);
}

extern "C" cudaError_t fa_cuda_standard_forward_e4m3(const fa_cuda_params *p, cudaStream_t stream)
{
    if (p->rows == 0 || p->heads_q == 0)
        return cudaSuccess;
    const dim3 grid((unsigned)p->rows, (unsigned)p->heads_q);
    fa::std_softmax<__nv_bfloat16, fa::e4m3_t><<<grid, fa::kStdThreads, 0, stream>>>(*p);
    fa::std_pv_e4m3<<<grid, fa::kStdThreads, 0, stream>>>(*p);
    return cudaGetLastError();
}

extern "C" cudaError_t fa_cuda_standard_backward(const fa_cuda_params *p, int bf16, int64_t krows,
                                                 cudaStream_t stream)
{
    cudaError_t err = fa_cuda_rowsum(p, bf16, stream);
    if (err != cudaSuccess)
        return err;
    return bf16 ? fa::backward<__nv_bfloat16>(*p, krows, stream) : fa::backward<__half>(*p, krows, stream);
}
