// SPDX-License-Identifier: MIT
// What the serving kernels (paged.cu, decode_sm90.cu) share: a sequence's rows and keys, the
// page lookup, RoPE, the query load, the per-warp decode step and the merge of the warps' states.
#pragma once

#include "tile.cuh"

namespace fa {

// Programmatic dependent launch (sm_90; no-ops elsewhere and in plain launches). A kernel
// launched with launch_dependent may start while the one before it on the stream runs, and
// waits in pdl_wait until that kernel has finished and its writes are visible: nothing it reads
// that an earlier kernel writes may be read before. pdl_release lets the next such kernel's
// blocks start (each block of this one having started).
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(p), as a programmatic dependent of the kernel before it
// where pdl is set (p.pdl: Hopper).
template <typename K>
cudaError_t launch_dependent(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                             const fa_cuda_paged &p)
{
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    cfg.attrs = &at, cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, p);
}

// One sequence (b): its query rows [q0, q0 + qn) of the packed rows (which the partials and
// the merge count in), tokens cached before the call and keys now, and `at`, where its rows
// sit in the tensors (q, o and lse through row_off and lse_index; a dense call's keys through
// kv_slot).
struct pseq_t {
    int b, q0, qn, cached, keys;
    seq_t at;
};

// A dense call (no block table) has the dense kernels' sequences, every key cached; its packed
// rows are b * seqlen_q + i for a fixed length.
__device__ __forceinline__ pseq_t pseq_of(const fa_cuda_paged &p, int b)
{
    pseq_t s;
    s.b = b;
    if (!p.a.pg.table) {
        s.at = seq_of(p.a, b);
        s.q0 = p.a.cu_q ? (int)s.at.q0 : b * p.a.seqlen_q;
        s.qn = s.at.sq;
        s.cached = s.keys = s.at.sk;
        return s;
    }
    const paged_seq_t g = paged_seq(p.a.pg, p.a.cu_q, p.a.max_q, p.a.max_k, b);
    s.q0 = g.q0, s.qn = g.qn, s.cached = g.cached, s.keys = g.keys;
    s.at = seq_t{ g.q0, 0, 0, 0, g.qn, g.keys };
    return s;
}

// A split-KV attention block's share: blockIdx.x = (sequence, kv head g, split), blockIdx.y
// the tile of BM packed rows from row0 (valid below vr1), and the keys [k_lo, k_hi) its rows
// see in its split. ok is false where the tile or the split lies past the sequence's.
struct split_block_t {
    pseq_t s;
    mask_t mk;
    int g, split, nsplit, rows, row0, vr1, k_lo, k_hi;
    bool ok;
};
__device__ __forceinline__ split_block_t split_block(const fa_cuda_paged &p, int BM)
{
    split_block_t w;
    w.split = blockIdx.x % p.max_splits;
    const int bh = blockIdx.x / p.max_splits, G = p.a.group;
    w.g = bh % p.a.heads_kv;
    w.s = pseq_of(p, bh / p.a.heads_kv);
    w.rows = w.s.qn * G, w.row0 = blockIdx.y * BM;
    const int32_t sp = fa_cuda_seq_split(p.split, p.split_grow, w.s.keys);
    w.nsplit = max(1, (w.s.keys + sp - 1) / sp);
    w.ok = w.row0 < w.rows && w.split < w.nsplit;
    if (!w.ok)
        return w;
    w.vr1 = min(w.rows, w.row0 + BM);
    w.mk = mask_t{ (int64_t)w.s.keys - w.s.qn, p.a.win_left, p.a.win_right, w.s.qn, w.s.keys };
    const span_t vis = w.mk.key_range(w.row0 / G, (w.vr1 - 1) / G + 1);
    w.k_lo = (int)max(vis.lo, (int64_t)w.split * sp);
    w.k_hi = (int)min(vis.hi, (int64_t)(w.split + 1) * sp);
    return w;
}

// The sequence of packed query row `row`: the last b with cu_q[b] <= row (seqlen_q rows each
// in a dense call of fixed length).
__device__ __forceinline__ int seq_of_row(const fa_cuda_paged &p, int row)
{
    if (!p.a.cu_q)
        return row / p.a.seqlen_q;
    int lo = 0, hi = p.a.batch - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p.a.cu_q[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// Key j of s: its page and slot. A dense call's K and V are a cache without a table: page
// k_base (the sequence, or 0 when varlen) from row k0, the host having set the batch, row and
// head strides as the page, token and head strides.
__device__ __forceinline__ page_slot_t kv_slot(const fa_cuda_paged &p, const pseq_t &s, int j)
{
    if (!p.a.pg.table)
        return page_slot_t{ (int)s.at.k_base, (int)s.at.k0 + j };
    return page_slot(p.a.pg, s.b, j);
}

// Element offset of a slot's row of kv head g in a pool, or -1 where the table names no page.
__device__ __forceinline__ int64_t slot_off(page_slot_t s, int g, int64_t sp, int64_t st, int64_t sh)
{
    return s.page < 0 ? -1 : s.page * sp + s.slot * st + g * sh;
}

// RoPE position of row i (packed row `row`) of s, clamped into the tables.
__device__ __forceinline__ int rope_pos(const fa_cuda_paged &p, int row, int i, const pseq_t &s)
{
    const int pos = p.positions ? p.positions[row] : s.keys - s.qn + i;
    return min(max(pos, 0), p.rope_max_pos - 1);
}

// One rotated element: v with its pair partner, the angle's cosine and sine, the partner's sign;
// rounded in one way wherever a kernel rotates (one product, then one fused multiply-add).
__device__ __forceinline__ float rope_mix(float v, float partner, float c, float s, float sign)
{
    return __fmaf_rn(v, c, __fmul_rn(sign * partner, s));
}

// Element e of row x after the rotation at pos (fa_paged_desc's definition; its pair partner
// read from x too).
template <typename T>
__device__ __forceinline__ float rope_elem(const fa_cuda_paged &p, const T *x, int e, int pos)
{
    const float v = to_float(x[e]);
    if (e >= p.rope_dim)
        return v;
    const int half = p.rope_dim / 2;
    int i, partner;
    float sign;
    if (p.rope_neox) {
        i = e < half ? e : e - half;
        partner = e < half ? e + half : e - half;
        sign = e < half ? -1.0f : 1.0f;
    } else {
        i = e / 2;
        partner = e ^ 1;
        sign = (e & 1) ? 1.0f : -1.0f;
    }
    const int64_t at = (int64_t)pos * half + i;
    return rope_mix(v, to_float(x[partner]), p.rope_cos[at], p.rope_sin[at], sign);
}

// 16 bytes of T at x (16-byte aligned) as 8 floats, and 8 floats rounded to T as 16 bytes.
template <typename T> __device__ __forceinline__ void load8(const T *x, float (&v)[8])
{
    const uint4 u = *reinterpret_cast<const uint4 *>(x);
    const T *h = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int j = 0; j < 8; j++)
        v[j] = to_float(h[j]);
}
template <typename T> __device__ __forceinline__ uint4 pack8(const float (&v)[8])
{
    uint4 u;
    T *h = reinterpret_cast<T *>(&u);
#pragma unroll
    for (int j = 0; j < 8; j++)
        h[j] = from_float<T>(v[j]);
    return u;
}

// Elements e..e+7 of row x (e a multiple of 8) rotated at pos, each as rope_elem gives it
// (p.append_vec, p.rotate_vec: rope_dim a multiple of 16, so the 8 lie on one side of
// rope_dim and of the NeoX half, and their angles' cosines and sines are whole 16-byte groups
// of the tables).
template <typename T>
__device__ __forceinline__ void rope8(const fa_cuda_paged &p, const T *x, int e, int pos, float (&v)[8])
{
    load8(x + e, v);
    if (e >= p.rope_dim)
        return;
    const int half = p.rope_dim / 2;
    float w[8], c[8], s[8];
    if (p.rope_neox) {
        const bool lo = e < half;
        load8(x + (lo ? e + half : e - half), w);
        const int64_t at = (int64_t)pos * half + (lo ? e : e - half);
#pragma unroll
        for (int j = 0; j < 8; j += 4) {
            *reinterpret_cast<float4 *>(c + j) = *reinterpret_cast<const float4 *>(p.rope_cos + at + j);
            *reinterpret_cast<float4 *>(s + j) = *reinterpret_cast<const float4 *>(p.rope_sin + at + j);
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = rope_mix(v[j], w[j], c[j], s[j], lo ? -1.0f : 1.0f);
    } else { // pairs (e + 2i, e + 2i + 1) share angle e / 2 + i
        const int64_t at = (int64_t)pos * half + e / 2;
        *reinterpret_cast<float4 *>(c) = *reinterpret_cast<const float4 *>(p.rope_cos + at);
        *reinterpret_cast<float4 *>(s) = *reinterpret_cast<const float4 *>(p.rope_sin + at);
#pragma unroll
        for (int j = 0; j < 8; j++)
            w[j] = v[j ^ 1];
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = rope_mix(v[j], w[j], c[j / 2], s[j / 2], (j & 1) ? 1.0f : -1.0f);
    }
}

// The sink's share and the natural-log lse of a row with statistics (m, l) in log2 units (l 0:
// no key seen; NaN: propagated, softmax_out's rule).
struct final_t {
    float inv, lse;
};
__device__ __forceinline__ final_t finish(const fa_cuda_paged &p, int h, float m, float l)
{
    float lse = l != 0.0f ? (m + __log2f(l)) * kLn2 : -INFINITY, sum = l;
    if (p.sinks) {
        const float sk = p.sinks[h];
        if (l != 0.0f) {
            sum += exp2f(sk * kLog2e - m);
            lse = fmaxf(lse, sk) + log1pf(__expf(-fabsf(lse - sk)));
        } else {
            lse = sk;
        }
    }
    return final_t{ l != 0.0f ? 1.0f / sum : 0.0f, lse };
}

// Q: the block's BM packed rows from row0 into sQ (pitch lds<D>()), rotated, zero past the
// rows and dim.
template <typename T, int D, int BM>
__device__ __forceinline__ void load_q(const fa_cuda_paged &p, const pseq_t &s, T *sQ, int row0, int rows, int g)
{
    const int G = p.a.group;
#pragma unroll
    for (int pass = 0; pass < BM * D / 128; pass++) {
        const int idx = threadIdx.x + pass * 128, r = idx / D, e = idx % D, pr = row0 + r;
        float v = 0.0f;
        if (pr < rows && e < p.a.dim) {
            const int i = pr / G, row = s.q0 + i;
            const T *x = (const T *)p.a.q.p + row_off(p.a.q, s.at, false, g * G + pr % G, i);
            v = p.rope_dim ? rope_elem(p, x, e, rope_pos(p, row, i, s)) : to_float(x[e]);
        }
        sQ[r * lds<D>() + e] = from_float<T>(v);
    }
}

// The WK warp groups' states of the block's rows ([WK][BM][D + 2] floats: m, l, o) merged in
// warp order; the sequence's only split writes o and lse, others a partial.
template <typename T, int D, int BM, int WK>
__device__ __forceinline__ void merge_out(const fa_cuda_paged &p, const pseq_t &s, const float *state, int row0,
                                          int rows, int g, int split, int nsplit)
{
    const int G = p.a.group;
#pragma unroll 4
    for (int pass = 0; pass < BM * D / 128; pass++) {
        const int idx = threadIdx.x + pass * 128, r = idx / D, e = idx % D, pr = row0 + r;
        if (pr >= rows || e >= p.a.dim)
            continue;
        float mx = -INFINITY;
#pragma unroll
        for (int k = 0; k < WK; k++)
            mx = fmaxf(mx, state[(k * BM + r) * (D + 2)]);
        float lsum = 0.0f, acc = 0.0f;
#pragma unroll
        for (int k = 0; k < WK; k++) {
            const float *at = state + (k * BM + r) * (D + 2);
            const float w = at[0] == -INFINITY ? 0.0f : exp2_fast(at[0] - mx);
            lsum += w * at[1];
            acc += w * at[2 + e];
        }
        const int i = pr / G, h = g * G + pr % G, row = s.q0 + i;
        if (nsplit == 1) {
            const final_t f = finish(p, h, mx, lsum);
            const int64_t oo = row_off(p.a.o, s.at, false, h, i) + e;
            if (p.a.o.f32)
                ((float *)p.a.o.p)[oo] = acc * f.inv;
            else
                ((T *)p.a.o.p)[oo] = from_float<T>(acc * f.inv);
            if (p.a.lse && e == 0)
                p.a.lse[lse_index(p.a, s.at, h, i)] = f.lse;
        } else {
            float *part = p.part + (((int64_t)split * p.a.pg.total_q + row) * p.a.heads_q + h) * (p.a.dim + 2);
            if (e == 0) {
                part[0] = mx;
                part[1] = lsum;
            }
            part[2 + e] = acc;
        }
    }
}

// A warp step's 16 keys in shared memory, rows of pitch LDS elements from p: where column col
// (a multiple of 8) of key row r starts. decode_sm90.cu has a swizzled counterpart.
template <typename T, int LDS> struct padded_rows {
    using elem = T;
    const T *p;
    __device__ __forceinline__ const T *at(int r, int col) const { return p + r * LDS + col; }
};

// An 8x8 matrix of 16-bit elements transposed across the warp: the pair a lane holds of row
// lane / 4 becomes the pair of column lane / 4 (an accumulator row pair into a B operand).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x)
{
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// The decode shape: 8 * NQ packed rows, keys as the mma's M dimension, rows its N (S^T = K Q^T,
// O^T += V^T P^T), 16 keys a warp step. Lane (c, t) = (lane / 4, lane % 4) holds S^T for keys c
// and c + 8 of the step and rows 2t, 2t + 1 of each n tile, and O^T for dims c, c + 8 of each
// 16-dim tile; a row's statistics reduce over the eight lanes of its t.
template <int D, int NQ> struct decode_warp {
    static constexpr int KS = D / 16; // k steps of K Q^T, m tiles of O^T
    static constexpr int LDS = lds<D>();
    uint32_t qf[KS][NQ][2];           // Q^T as the B operand of every k step
    float o[KS][NQ][4], m[NQ][2], l[NQ][2];

    // Q^T from sQ (8 * NQ rows, pitch LDS) into registers; the state empty.
    template <typename T> __device__ __forceinline__ void init(const T *sQ, int lane)
    {
#pragma unroll
        for (int k2 = 0; k2 < KS / 2; k2++)
#pragma unroll
            for (int nq = 0; nq < NQ; nq++) {
                uint32_t r[4];
                ldsm_x4(r, sQ + (nq * 8 + (lane & 7)) * LDS + k2 * 32 + (lane >> 3) * 8);
                qf[2 * k2][nq][0] = r[0], qf[2 * k2][nq][1] = r[1];
                qf[2 * k2 + 1][nq][0] = r[2], qf[2 * k2 + 1][nq][1] = r[3];
            }
#pragma unroll
        for (int k = 0; k < KS; k++)
#pragma unroll
            for (int nq = 0; nq < NQ; nq++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    o[k][nq][e] = 0.0f;
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
            m[nq][0] = m[nq][1] = -INFINITY, l[nq][0] = l[nq][1] = 0.0f;
    }

    // Keys [j0, j0 + 16) from tK / tV (row accessors: padded_rows or a swizzled one): only those
    // in [k_lo, k_hi) and visible to a row count; rows at vr1 and past keep their finite scores
    // (their columns are never stored).
    template <typename L>
    __device__ __forceinline__ void step(const fa_cuda_params &a, const mask_t &mk, const L &tK, const L &tV,
                                         int j0, int k_lo, int k_hi, int row0, int vr1, int lane)
    {
        using T = typename L::elem;
        const int c = lane / 4, t = lane % 4, G = a.group;
        // S^T = K Q^T: keys the A operand, straight from shared memory
        float sc[1][NQ][4];
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
            sc[0][nq][0] = sc[0][nq][1] = sc[0][nq][2] = sc[0][nq][3] = 0.0f;
#pragma unroll
        for (int k = 0; k < KS; k++) {
            uint32_t x[4];
            ldsm_x4(x, tK.at((lane & 7) + ((lane >> 3) & 1) * 8, k * 16 + (lane >> 4) * 8));
#pragma unroll
            for (int nq = 0; nq < NQ; nq++)
                mma16816<T>::run(sc[0][nq], x, qf[k][nq][0], qf[k][nq][1]);
        }
        to_logits(a, sc);
        const bool full = j0 >= k_lo && j0 + 16 <= k_hi && mk.all_visible(row0 / G, (vr1 - 1) / G + 1, j0, j0 + 16);
        if (!full)
#pragma unroll
            for (int nq = 0; nq < NQ; nq++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int pr = row0 + nq * 8 + 2 * t + (e & 1), j = j0 + c + 8 * (e >> 1);
                    if (pr < vr1 && (j < k_lo || j >= k_hi || !mk.visible(pr / G, j)))
                        sc[0][nq][e] = -INFINITY;
                }

        // the online softmax down each column (a row of S), over the eight lanes of its t
        float alpha[NQ][2];
        bool moved = false;
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float mx = fmaxf(m[nq][e], fmaxf(sc[0][nq][e], sc[0][nq][e + 2]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                const float base = mx == -INFINITY ? 0.0f : mx; // nothing seen yet: keep zeros
                alpha[nq][e] = exp2_fast(m[nq][e] - base);
                moved |= alpha[nq][e] != 1.0f;
                m[nq][e] = mx;
                const float p0 = prob(sc[0][nq][e], base), p1 = prob(sc[0][nq][e + 2], base);
                sc[0][nq][e] = p0, sc[0][nq][e + 2] = p1;
                l[nq][e] = l[nq][e] * alpha[nq][e] + p0 + p1;
            }
        if (__any_sync(0xffffffffu, moved)) // a factor of exactly 1 leaves o as it is
#pragma unroll
            for (int k = 0; k < KS; k++)
#pragma unroll
                for (int nq = 0; nq < NQ; nq++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        o[k][nq][e] *= alpha[nq][e & 1];

        // O^T += V^T P^T: P^T the B operand (the accumulator's 8x8 halves transposed)
        uint32_t pb[NQ][2];
#pragma unroll
        for (int nq = 0; nq < NQ; nq++) {
            pb[nq][0] = transpose8x8(pack2<T>(sc[0][nq][0], sc[0][nq][1]));
            pb[nq][1] = transpose8x8(pack2<T>(sc[0][nq][2], sc[0][nq][3]));
        }
#pragma unroll
        for (int k = 0; k < KS; k++) {
            uint32_t x[4];
            ldsm_x4_t(x, tV.at((lane >> 4) * 8 + (lane & 7), k * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
            for (int nq = 0; nq < NQ; nq++)
                mma16816<T>::run(o[k][nq], x, pb[nq][0], pb[nq][1]);
        }
    }

    // The warp's rows as floats, (m, l summed over the column's lanes, o), into state
    // [warp][8 * NQ][D + 2] for merge_out.
    __device__ __forceinline__ void store(float *state, int warp, int lane) const
    {
        const int c = lane / 4, t = lane % 4;
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float lsum = l[nq][e];
                lsum += __shfl_xor_sync(0xffffffffu, lsum, 4);
                lsum += __shfl_xor_sync(0xffffffffu, lsum, 8);
                lsum += __shfl_xor_sync(0xffffffffu, lsum, 16);
                float *at = state + (warp * 8 * NQ + nq * 8 + 2 * t + e) * (D + 2);
                if (c == 0) {
                    at[0] = m[nq][e];
                    at[1] = lsum;
                }
#pragma unroll
                for (int k = 0; k < KS; k++) {
                    at[2 + k * 16 + c] = o[k][nq][e];
                    at[2 + k * 16 + c + 8] = o[k][nq][e + 2];
                }
            }
    }
};

} // namespace fa
