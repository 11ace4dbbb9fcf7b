// SPDX-License-Identifier: MIT
// Serving kernels over a paged KV cache: the append of new rows (keys rotated), the split-KV
// attention, the merge of its splits in split order, and fa_merge_states. Lengths and page
// ids come from device memory; each is clamped so that no access leaves the pool, and a
// page id outside it reads as an absent key (check_tables finds such entries on the host).
//
// The attention block owns (sequence, kv head, split of the keys, tile of packed rows). A
// packed row is a (query position, query head of the kv group) pair, so one mma tile carries
// a GQA group's heads for a decode step (GQA packing). Two kernels:
//   decode: up to 16 packed rows. The keys are the mma's M dimension and the rows its N
//           (S^T = K Q^T, O^T += V^T P^T): 8 rows fill an n tile where a 16-row m tile would
//           sit mostly empty, so a 16-key step costs half the products and half the output
//           registers. The four warps take alternate 16-key tiles of the split, each through
//           its own two-stage cp.async ring, and are merged in warp order at the end (two
//           stages leave room for three blocks a multiprocessor: 3.5 TB/s against 2.9 with
//           three stages and 1.1 with four on the H200, docs/perf/h200-decode.md);
//   rows:   four warps of 16 rows sharing 64-key tiles (chunked prefill, long speculation).
// Split boundaries are multiples of p.split from key 0, set by the plan from nothing but the
// bounds, so a sequence's bits do not depend on the rest of the batch. Dense calls with few
// query rows (fa_forward's decode route) run the decode kernel too, their K and V read in
// place as a cache without a block table (kv_slot).
#include "cuda.h"
#include "tile.cuh"

namespace fa {
namespace {

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
    return v * p.rope_cos[at] + sign * to_float(x[partner]) * p.rope_sin[at];
}

// A block per new row: its keys (rotated) and values into the page slot after the cache.
template <typename T> __global__ void __launch_bounds__(128) append_kernel(const fa_cuda_paged p)
{
    const int row = blockIdx.x, b = seq_of_row(p, row);
    const pseq_t s = pseq_of(p, b);
    const int i = row - s.q0;
    if (i < 0 || i >= s.qn || s.cached + i >= s.keys)
        return;
    const int pos = p.rope_dim ? rope_pos(p, row, i, s) : 0;
    const page_slot_t at = kv_slot(p, s, s.cached + i);
    for (int g = 0; g < p.a.heads_kv; g++) {
        const int64_t ko = slot_off(at, g, p.a.pg.k_sp, p.a.pg.k_st, p.a.k.sh);
        const int64_t vo = slot_off(at, g, p.a.pg.v_sp, p.a.pg.v_st, p.a.v.sh);
        const T *ks = (const T *)p.kn.p + row * p.kn.ss + g * p.kn.sh;
        const T *vs = (const T *)p.vn.p + row * p.vn.ss + g * p.vn.sh;
        for (int e = threadIdx.x; e < p.a.dim; e += blockDim.x) {
            if (ko >= 0)
                ((T *)p.a.k.p)[ko + e] = p.rope_dim ? from_float<T>(rope_elem(p, ks, e, pos)) : ks[e];
            if (vo >= 0)
                ((T *)p.a.v.p)[vo + e] = vs[e];
        }
    }
}

// A block per query row: its heads rotated at its position into out [total_q, heads_q, dim]
// (rounded to T as load_q rounds them), for kernels that copy query rows as they are.
template <typename T> __global__ void __launch_bounds__(128) rotate_q_kernel(const fa_cuda_paged p, T *out)
{
    const int row = blockIdx.x, b = seq_of_row(p, row);
    const pseq_t s = pseq_of(p, b);
    const int i = row - s.q0;
    if (i < 0 || i >= s.qn)
        return;
    const int pos = rope_pos(p, row, i, s), dim = p.a.dim;
    for (int x = threadIdx.x; x < p.a.heads_q * dim; x += blockDim.x) {
        const int h = x / dim, e = x - h * dim;
        const T *q = (const T *)p.a.q.p + (int64_t)row * p.a.q.ss + (int64_t)h * p.a.q.sh;
        out[((int64_t)row * p.a.heads_q + h) * dim + e] = from_float<T>(rope_elem(p, q, e, pos));
    }
}

template <int D, int WM, int KT, int STAGES> struct shape {
    static constexpr int WK = 4 / WM;      // warp groups along the keys
    static constexpr int BM = 16 * WM;     // packed rows per block
    static constexpr int NS = KT / 8;      // score n tiles per key tile
    static constexpr int ND = D / 8;       // output n tiles
    static constexpr int LDS = lds<D>();
    static constexpr int ELEMS = BM * LDS + WK * STAGES * KT * LDS * 2; // Q, then K/V rings
    static constexpr int STATE = WK * BM * (D + 2);                     // floats of the merge
};

template <typename T, int D, int WM, int KT, int STAGES> constexpr int smem_bytes()
{
    using S = shape<D, WM, KT, STAGES>;
    return S::ELEMS * (int)sizeof(T) > S::STATE * 4 ? S::ELEMS * (int)sizeof(T) : S::STATE * 4;
}

// Key tile n (KT tokens from n * KT) of the group's ring stage: rows outside [k_lo, k_hi), of
// absent pages or past dim read as zero. Neighbouring lanes take neighbouring 16-byte chunks
// of a row, so each warp instruction reads whole 32-byte sectors (giving a thread a run of
// chunks instead leaves every sector half read per instruction: twice the L2 requests).
template <typename T, int D, int KT, int NTHREADS>
__device__ __forceinline__ void load_kv_tile(const fa_cuda_paged &p, T *sK, T *sV, const pseq_t &s, int g, int n,
                                             int k_lo, int k_hi, int tid)
{
    constexpr int CH = D / 8, LDS = lds<D>(), RPP = NTHREADS / CH, PASSES = KT / RPP;
    static_assert(NTHREADS % CH == 0 && KT % RPP == 0, "whole rows a pass");
    const int c = tid % CH, col = c * 8;
    const bool in = col < p.a.dim;
    const T *kc = (const T *)p.a.k.p, *vc = (const T *)p.a.v.p;
#pragma unroll
    for (int pass = 0; pass < PASSES; pass++) {
        const int r = tid / CH + pass * RPP, j = n * KT + r;
        int64_t ko = -1, vo = -1;
        if (j >= k_lo && j < k_hi) {
            const page_slot_t at = kv_slot(p, s, j);
            ko = slot_off(at, g, p.a.pg.k_sp, p.a.pg.k_st, p.a.k.sh);
            vo = slot_off(at, g, p.a.pg.v_sp, p.a.pg.v_st, p.a.v.sh);
        }
        T *dk = sK + r * LDS + col, *dv = sV + r * LDS + col;
        if (p.kv_aligned) {
            cp_async16(dk, in && ko >= 0 ? kc + ko + col : kc, in && ko >= 0 ? 16 : 0);
            cp_async16(dv, in && vo >= 0 ? vc + vo + col : vc, in && vo >= 0 ? 16 : 0);
        } else {
            for (int e = 0; e < 8; e++) {
                const bool ok = col + e < p.a.dim;
                dk[e] = ko >= 0 && ok ? kc[ko + col + e] : from_float<T>(0.0f);
                dv[e] = vo >= 0 && ok ? vc[vo + col + e] : from_float<T>(0.0f);
            }
        }
    }
}

// The sink's share and the natural-log lse of a row with statistics (m, l) in log2 units.
struct final_t {
    float inv, lse;
};
__device__ __forceinline__ final_t finish(const fa_cuda_paged &p, int h, float m, float l)
{
    float lse = l > 0.0f ? (m + __log2f(l)) * kLn2 : -INFINITY, sum = l;
    if (p.sinks) {
        const float sk = p.sinks[h];
        if (l > 0.0f) {
            sum += exp2f(sk * kLog2e - m);
            lse = fmaxf(lse, sk) + log1pf(__expf(-fabsf(lse - sk)));
        } else {
            lse = sk;
        }
    }
    return final_t{ l > 0.0f ? 1.0f / sum : 0.0f, lse };
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

template <typename T, int D, int WM, int KT, int STAGES>
__global__ void __launch_bounds__(128) paged_kernel(const fa_cuda_paged p)
{
    using S = shape<D, WM, KT, STAGES>;
    extern __shared__ __align__(16) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wm = warp % WM, kg = warp / WM;
    const int split = blockIdx.x % p.max_splits, bh = blockIdx.x / p.max_splits;
    const int b = bh / p.a.heads_kv, g = bh % p.a.heads_kv, G = p.a.group;
    const pseq_t s = pseq_of(p, b);
    const int rows = s.qn * G, row0 = blockIdx.y * S::BM;
    const int nsplit = max(1, (s.keys + p.split - 1) / p.split);
    if (row0 >= rows || split >= nsplit)
        return;
    const mask_t mk{ (int64_t)s.keys - s.qn, p.a.win_left, p.a.win_right, s.qn, s.keys };
    const span_t vis = mk.key_range(row0 / G, (min(rows, row0 + S::BM) - 1) / G + 1);
    const int k_lo = (int)max(vis.lo, (int64_t)split * p.split);
    const int k_hi = (int)min(vis.hi, (int64_t)(split + 1) * p.split);

    load_q<T, D, S::BM>(p, s, sQ, row0, rows, g);

    T *sK = sQ + S::BM * S::LDS + kg * STAGES * KT * S::LDS * 2, *sV = sK + STAGES * KT * S::LDS;
    const int t_lo = k_lo / KT, t_hi = (k_hi + KT - 1) / KT;
    const int ntiles = k_hi > k_lo && t_hi - t_lo > kg ? (t_hi - t_lo - kg + S::WK - 1) / S::WK : 0;
    const int gtid = wm * 32 + lane;
    auto group_sync = [] {
        if (WM == 1)
            __syncwarp();
        else
            __syncthreads();
    };
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < ntiles)
            load_kv_tile<T, D, KT, 32 * WM>(p, sK + st * KT * S::LDS, sV + st * KT * S::LDS, s, g,
                                            t_lo + kg + st * S::WK, k_lo, k_hi, gtid);
        cp_async_commit();
    }
    __syncthreads(); // Q

    float o[1][S::ND][4], m[1][2], l[1][2];
    zero(o);
    softmax_init(m, l);
    for (int it = 0; it < ntiles; it++) {
        cp_async_wait<STAGES - 2>();
        group_sync();
        const int nxt = it + STAGES - 1;
        if (nxt < ntiles)
            load_kv_tile<T, D, KT, 32 * WM>(p, sK + (nxt % STAGES) * KT * S::LDS,
                                            sV + (nxt % STAGES) * KT * S::LDS, s, g, t_lo + kg + nxt * S::WK,
                                            k_lo, k_hi, gtid);
        cp_async_commit();
        const int stage = it % STAGES;
        const int j0 = (t_lo + kg + it * S::WK) * KT;
        float sc[1][S::NS][4];
        zero(sc);
        gemm_nt<T, 1, S::NS, D, S::LDS>(sc, sQ + wm * 16 * S::LDS, sK + stage * KT * S::LDS, lane);
        to_logits(p.a, sc);
        const int w0 = row0 + wm * 16; // the warp's first packed row
        const bool full = j0 >= k_lo && j0 + KT <= k_hi && w0 + 16 <= rows &&
                          mk.all_visible(w0 / G, (w0 + 15) / G + 1, j0, j0 + KT);
#pragma unroll
        for (int nt = 0; nt < S::NS && !full; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int pr = w0 + lane / 4 + 8 * (e / 2);
                const int j = j0 + nt * 8 + 2 * (lane % 4) + (e % 2);
                if (pr >= rows || j < k_lo || j >= k_hi || !mk.visible(pr / G, j))
                    sc[0][nt][e] = -INFINITY;
            }
        float alpha[1][2];
        softmax_update(sc, m, l, alpha);
        rescale(o, alpha);
        uint32_t pa[1][S::NS / 2][4];
        to_a<T, 1, S::NS>(pa, sc);
        gemm_rn<T, 1, S::ND, S::NS / 2, S::LDS>(o, pa, sV + stage * KT * S::LDS, lane);
    }
    cp_async_wait<0>();
    __syncthreads(); // the rings become the merge's state

    // every warp's rows: (m, l summed over the quad, o) as floats, [kg][row][D + 2]
    float *state = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = wm * 16 + lane / 4 + 8 * hf;
        float *at = state + (kg * S::BM + r) * (D + 2);
        const float lsum = quad_sum(l[0][hf]);
        if (lane % 4 == 0) {
            at[0] = m[0][hf];
            at[1] = lsum;
        }
#pragma unroll
        for (int dt = 0; dt < S::ND; dt++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                at[2 + dt * 8 + 2 * (lane % 4) + e] = o[0][dt][2 * hf + e];
    }
    __syncthreads();

    merge_out<T, D, S::BM, S::WK>(p, s, state, row0, rows, g, split, nsplit);
}

// An 8x8 matrix of 16-bit elements transposed across the warp: the pair a lane holds of row
// lane / 4 becomes the pair of column lane / 4 (an accumulator row pair into a B operand).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x)
{
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

template <int D, int NQ, int STAGES> struct dshape {
    static constexpr int BM = 8 * NQ;  // packed rows per block: NQ n tiles
    static constexpr int KS = D / 16;  // k steps of K Q^T, m tiles of O^T
    static constexpr int KT = 16;      // keys a warp step
    static constexpr int LDS = lds<D>();
    static constexpr int ELEMS = BM * LDS + 4 * STAGES * KT * LDS * 2; // Q, then each warp's K/V ring
    static constexpr int STATE = 4 * BM * (D + 2);                      // floats of the merge
    static constexpr int BYTES = ELEMS * 2 > STATE * 4 ? ELEMS * 2 : STATE * 4;
};

// The decode shape. Lane (c, t) = (lane / 4, lane % 4) holds S^T for keys c and c + 8 of the
// warp's tile and rows 2t, 2t + 1 of each n tile, and O^T for dims c, c + 8 of each 16-dim
// tile; a row's statistics reduce over the eight lanes of its t.
template <typename T, int D, int NQ, int STAGES>
__global__ void __launch_bounds__(128) decode_kernel(const fa_cuda_paged p)
{
    using S = dshape<D, NQ, STAGES>;
    extern __shared__ __align__(16) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = lane / 4, t = lane % 4;
    const int split = blockIdx.x % p.max_splits, bh = blockIdx.x / p.max_splits;
    const int b = bh / p.a.heads_kv, g = bh % p.a.heads_kv, G = p.a.group;
    const pseq_t s = pseq_of(p, b);
    const int rows = s.qn * G, row0 = blockIdx.y * S::BM;
    const int nsplit = max(1, (s.keys + p.split - 1) / p.split);
    if (row0 >= rows || split >= nsplit)
        return;
    const int vr1 = min(rows, row0 + S::BM); // valid rows [row0, vr1); the rest have zero Q
    const mask_t mk{ (int64_t)s.keys - s.qn, p.a.win_left, p.a.win_right, s.qn, s.keys };
    const span_t vis = mk.key_range(row0 / G, (vr1 - 1) / G + 1);
    const int k_lo = (int)max(vis.lo, (int64_t)split * p.split);
    const int k_hi = (int)min(vis.hi, (int64_t)(split + 1) * p.split);
    load_q<T, D, S::BM>(p, s, sQ, row0, rows, g);

    T *sK = sQ + S::BM * S::LDS + warp * STAGES * S::KT * S::LDS * 2, *sV = sK + STAGES * S::KT * S::LDS;
    const int t_lo = k_lo / S::KT, t_hi = (k_hi + S::KT - 1) / S::KT;
    const int ntiles = k_hi > k_lo && t_hi - t_lo > warp ? (t_hi - t_lo - warp + 3) / 4 : 0;
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < ntiles)
            load_kv_tile<T, D, S::KT, 32>(p, sK + st * S::KT * S::LDS, sV + st * S::KT * S::LDS, s, g,
                                          t_lo + warp + st * 4, k_lo, k_hi, lane);
        cp_async_commit();
    }
    __syncthreads(); // Q

    // Q^T as the B operand of every k step, kept in registers
    uint32_t qf[S::KS][NQ][2];
#pragma unroll
    for (int k2 = 0; k2 < S::KS / 2; k2++)
#pragma unroll
        for (int nq = 0; nq < NQ; nq++) {
            uint32_t r[4];
            ldsm_x4(r, sQ + (nq * 8 + (lane & 7)) * S::LDS + k2 * 32 + (lane >> 3) * 8);
            qf[2 * k2][nq][0] = r[0], qf[2 * k2][nq][1] = r[1];
            qf[2 * k2 + 1][nq][0] = r[2], qf[2 * k2 + 1][nq][1] = r[3];
        }

    float o[S::KS][NQ][4], m[NQ][2], l[NQ][2];
#pragma unroll
    for (int k = 0; k < S::KS; k++)
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[k][nq][e] = 0.0f;
#pragma unroll
    for (int nq = 0; nq < NQ; nq++)
        m[nq][0] = m[nq][1] = -INFINITY, l[nq][0] = l[nq][1] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        cp_async_wait<STAGES - 2>();
        __syncwarp();
        const int nxt = it + STAGES - 1;
        if (nxt < ntiles)
            load_kv_tile<T, D, S::KT, 32>(p, sK + (nxt % STAGES) * S::KT * S::LDS,
                                          sV + (nxt % STAGES) * S::KT * S::LDS, s, g, t_lo + warp + nxt * 4, k_lo,
                                          k_hi, lane);
        cp_async_commit();
        const T *tK = sK + (it % STAGES) * S::KT * S::LDS, *tV = sV + (it % STAGES) * S::KT * S::LDS;
        const int j0 = (t_lo + warp + it * 4) * S::KT;

        // S^T = K Q^T: keys the A operand, straight from the ring
        float sc[1][NQ][4];
#pragma unroll
        for (int nq = 0; nq < NQ; nq++)
            sc[0][nq][0] = sc[0][nq][1] = sc[0][nq][2] = sc[0][nq][3] = 0.0f;
#pragma unroll
        for (int k = 0; k < S::KS; k++) {
            uint32_t a[4];
            ldsm_x4(a, tK + ((lane & 7) + ((lane >> 3) & 1) * 8) * S::LDS + k * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int nq = 0; nq < NQ; nq++)
                mma16816<T>::run(sc[0][nq], a, qf[k][nq][0], qf[k][nq][1]);
        }
        to_logits(p.a, sc);
        const bool full = j0 >= k_lo && j0 + S::KT <= k_hi && mk.all_visible(row0 / G, (vr1 - 1) / G + 1, j0, j0 + S::KT);
        if (!full) // rows past vr1 keep their (finite) scores: their columns are never stored
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
            for (int k = 0; k < S::KS; k++)
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
        for (int k = 0; k < S::KS; k++) {
            uint32_t a[4];
            ldsm_x4_t(a, tV + ((lane >> 4) * 8 + (lane & 7)) * S::LDS + k * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int nq = 0; nq < NQ; nq++)
                mma16816<T>::run(o[k][nq], a, pb[nq][0], pb[nq][1]);
        }
    }
    cp_async_wait<0>();
    __syncthreads(); // the rings become the merge's state

    // every warp's rows: (m, l summed over the column's lanes, o) as floats, [warp][row][D + 2]
    float *state = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int nq = 0; nq < NQ; nq++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float lsum = l[nq][e];
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 4);
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 8);
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 16);
            float *at = state + (warp * S::BM + nq * 8 + 2 * t + e) * (D + 2);
            if (c == 0) {
                at[0] = m[nq][e];
                at[1] = lsum;
            }
#pragma unroll
            for (int k = 0; k < S::KS; k++) {
                at[2 + k * 16 + c] = o[k][nq][e];
                at[2 + k * 16 + c + 8] = o[k][nq][e + 2];
            }
        }
    __syncthreads();
    merge_out<T, D, S::BM, 4>(p, s, state, row0, rows, g, split, nsplit);
}

// A block per (row, query head) of a sequence with several splits: their partials combined in
// split order into o and lse.
template <typename T> __global__ void __launch_bounds__(128) combine_kernel(const fa_cuda_paged p)
{
    const int row = blockIdx.x, h = blockIdx.y, b = seq_of_row(p, row);
    const pseq_t s = pseq_of(p, b);
    const int nsplit = max(1, (s.keys + p.split - 1) / p.split), i = row - s.q0;
    if (i < 0 || i >= s.qn || nsplit == 1)
        return;
    const int64_t step = (int64_t)p.a.pg.total_q * p.a.heads_q * (p.a.dim + 2);
    const float *part = p.part + ((int64_t)row * p.a.heads_q + h) * (p.a.dim + 2);
    float mx = -INFINITY;
    for (int k = 0; k < nsplit; k++)
        mx = fmaxf(mx, part[k * step]);
    float lsum = 0.0f;
    for (int k = 0; k < nsplit; k++)
        lsum += part[k * step] == -INFINITY ? 0.0f : exp2f(part[k * step] - mx) * part[k * step + 1];
    const final_t f = finish(p, h, mx, lsum);
    for (int e = threadIdx.x; e < p.a.dim; e += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < nsplit; k++)
            if (part[k * step] != -INFINITY)
                acc += exp2f(part[k * step] - mx) * part[k * step + 2 + e];
        const int64_t oo = row_off(p.a.o, s.at, false, h, i) + e;
        if (p.a.o.f32)
            ((float *)p.a.o.p)[oo] = acc * f.inv;
        else
            ((T *)p.a.o.p)[oo] = from_float<T>(acc * f.inv);
    }
    if (p.a.lse && threadIdx.x == 0)
        p.a.lse[lse_index(p.a, s.at, h, i)] = f.lse;
}

struct merge_args {
    const void *o_in;
    int in_f32;
    int64_t sb, ss, sh;
    const float *lse_in;
    int64_t ls, lh, lr;
    void *o;
    int out_f32;
    int64_t oss, osh;
    float *lse;
    int64_t olh, olr;
    int states, dim;
};

template <typename T> __device__ __forceinline__ float load_any(const void *p, int f32, int64_t at)
{
    return f32 ? ((const float *)p)[at] : to_float(((const T *)p)[at]);
}

template <typename T> __global__ void __launch_bounds__(128) merge_kernel(const merge_args a)
{
    const int r = blockIdx.x, h = blockIdx.y;
    float mx = -INFINITY, sum = 0.0f;
    for (int k = 0; k < a.states; k++)
        mx = fmaxf(mx, a.lse_in[k * a.ls + h * a.lh + r * a.lr]);
    for (int k = 0; mx > -INFINITY && k < a.states; k++) {
        const float x = a.lse_in[k * a.ls + h * a.lh + r * a.lr];
        sum += x == -INFINITY ? 0.0f : __expf(x - mx);
    }
    for (int e = threadIdx.x; e < a.dim; e += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; mx > -INFINITY && k < a.states; k++) {
            const float x = a.lse_in[k * a.ls + h * a.lh + r * a.lr];
            if (x != -INFINITY)
                acc += __expf(x - mx) * load_any<T>(a.o_in, a.in_f32, k * a.sb + r * a.ss + h * a.sh + e);
        }
        const float v = sum > 0.0f ? acc / sum : 0.0f;
        const int64_t oo = r * a.oss + h * a.osh + e;
        if (a.out_f32)
            ((float *)a.o)[oo] = v;
        else
            ((T *)a.o)[oo] = from_float<T>(v);
    }
    if (a.lse && threadIdx.x == 0)
        a.lse[h * a.olh + r * a.olr] = sum > 0.0f ? mx + __logf(sum) : -INFINITY;
}

// After the attention kernel: the splits' merge where the grid has several.
template <typename T> cudaError_t finish_launch(const fa_cuda_paged &p, cudaStream_t stream)
{
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || p.max_splits == 1 || p.a.pg.total_q == 0)
        return err;
    combine_kernel<T><<<dim3((unsigned)p.a.pg.total_q, (unsigned)p.a.heads_q), 128, 0, stream>>>(p);
    return cudaGetLastError();
}

template <typename T, int D, int WM, int KT, int STAGES>
cudaError_t launch_attention(const fa_cuda_paged &p, cudaStream_t stream)
{
    using S = shape<D, WM, KT, STAGES>;
    constexpr int bytes = smem_bytes<T, D, WM, KT, STAGES>();
    auto kernel = paged_kernel<T, D, WM, KT, STAGES>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess)
        return err;
    const int qblocks = (p.a.max_q * p.a.group + S::BM - 1) / S::BM;
    const dim3 grid((unsigned)(p.a.batch * p.a.heads_kv * p.max_splits), (unsigned)(qblocks > 0 ? qblocks : 1));
    kernel<<<grid, 128, bytes, stream>>>(p);
    return finish_launch<T>(p, stream);
}

template <typename T, int D, int NQ, int STAGES>
cudaError_t launch_decode(const fa_cuda_paged &p, cudaStream_t stream)
{
    using S = dshape<D, NQ, STAGES>;
    auto kernel = decode_kernel<T, D, NQ, STAGES>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::BYTES);
    if (err != cudaSuccess)
        return err;
    const int qblocks = (p.a.max_q * p.a.group + S::BM - 1) / S::BM;
    const dim3 grid((unsigned)(p.a.batch * p.a.heads_kv * p.max_splits), (unsigned)(qblocks > 0 ? qblocks : 1));
    kernel<<<grid, 128, S::BYTES, stream>>>(p);
    return finish_launch<T>(p, stream);
}

template <typename T> cudaError_t attention_for(const fa_cuda_paged &p, int dpad, int nq, cudaStream_t stream)
{
    switch (dpad * 4 + nq) {
    case 64 * 4 + 1: return launch_decode<T, 64, 1, 2>(p, stream);
    case 64 * 4 + 2: return launch_decode<T, 64, 2, 2>(p, stream);
    case 64 * 4: return launch_attention<T, 64, 4, 64, 2>(p, stream);
    case 128 * 4 + 1: return launch_decode<T, 128, 1, 2>(p, stream);
    case 128 * 4 + 2: return launch_decode<T, 128, 2, 2>(p, stream);
    case 128 * 4: return launch_attention<T, 128, 4, 64, 2>(p, stream);
    case 256 * 4 + 1: return launch_decode<T, 256, 1, 2>(p, stream);
    case 256 * 4 + 2: return launch_decode<T, 256, 2, 2>(p, stream);
    case 256 * 4: return launch_attention<T, 256, 4, 32, 2>(p, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace
} // namespace fa

extern "C" cudaError_t fa_cuda_paged_append(const fa_cuda_paged *p, int bf16, cudaStream_t stream)
{
    if (p->a.pg.total_q == 0)
        return cudaSuccess;
    if (bf16)
        fa::append_kernel<__nv_bfloat16><<<(unsigned)p->a.pg.total_q, 128, 0, stream>>>(*p);
    else
        fa::append_kernel<__half><<<(unsigned)p->a.pg.total_q, 128, 0, stream>>>(*p);
    return cudaGetLastError();
}

extern "C" cudaError_t fa_cuda_paged_rotate_q(const fa_cuda_paged *p, int bf16, void *out, cudaStream_t stream)
{
    if (p->a.pg.total_q == 0)
        return cudaSuccess;
    if (bf16)
        fa::rotate_q_kernel<<<(unsigned)p->a.pg.total_q, 128, 0, stream>>>(*p, (__nv_bfloat16 *)out);
    else
        fa::rotate_q_kernel<<<(unsigned)p->a.pg.total_q, 128, 0, stream>>>(*p, (__half *)out);
    return cudaGetLastError();
}

extern "C" cudaError_t fa_cuda_paged_attention(const fa_cuda_paged *p, int bf16, int dpad, int nq,
                                               cudaStream_t stream)
{
    return bf16 ? fa::attention_for<__nv_bfloat16>(*p, dpad, nq, stream)
                : fa::attention_for<__half>(*p, dpad, nq, stream);
}

extern "C" cudaError_t fa_cuda_merge_states(const void *o_in, int in_f32, int64_t sb, int64_t ss, int64_t sh,
                                            const float *lse_in, int64_t ls, int64_t lh, int64_t lr, void *o,
                                            int out_f32, int64_t oss, int64_t osh, float *lse, int64_t olh,
                                            int64_t olr, int states, int rows, int heads, int dim, int bf16,
                                            cudaStream_t stream)
{
    if (rows == 0)
        return cudaSuccess;
    const fa::merge_args a{ o_in, in_f32, sb, ss, sh, lse_in, ls, lh, lr, o, out_f32, oss, osh, lse, olh, olr,
                            states, dim };
    const dim3 grid((unsigned)rows, (unsigned)heads);
    if (bf16)
        fa::merge_kernel<__nv_bfloat16><<<grid, 128, 0, stream>>>(a);
    else
        fa::merge_kernel<__half><<<grid, 128, 0, stream>>>(a);
    return cudaGetLastError();
}
