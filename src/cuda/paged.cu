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
//           registers (decode_warp, paged.cuh). Here the four warps take alternate 16-key
//           tiles of the split, each through its own two-stage cp.async ring, and are merged
//           in warp order at the end; on Hopper, decode_sm90.cu feeds the same steps from a
//           loading warpgroup's bulk copies (p.decode_sm90), 1.2-1.4x faster on the H200
//           (docs/perf/h200-decode.md);
//   rows:   four warps of 16 rows sharing 64-key tiles (chunked prefill, long speculation).
// Split boundaries are multiples of a sequence's split from key 0, p.split or, by default, that
// grown with the sequence's own length (fa_cuda_seq_split), so a sequence's bits do not depend
// on the rest of the batch. Dense calls with few query rows (fa_forward's decode route) run the
// decode kernel too, their K and V read in place as a cache without a block table (kv_slot).
#include "cuda.h"
#include "paged.cuh"

#include <type_traits>

namespace fa {
namespace {

// The row kernels below: a block per (row, kElemsPerBlock elements of its heads x dim), each
// thread kRowElems of them: side by side as one 16-byte load and store where every row allows
// it (p.append_vec, p.rotate_vec), else a warp's width apart (coalesced, independent loads).
// A decode step's few rows still spread over a block per 8 heads of 128, and a prefill's
// thousands of rows take a few blocks each, the row's lookups made once a block.
constexpr int kRowThreads = 128, kRowElems = 8, kElemsPerBlock = kRowThreads * kRowElems;
static_assert(kRowElems == 8, "append_vec, rotate_vec: a thread's elements are 16 bytes of f16 / bf16");

// Kv head g of new row `row`: its k and v in the call's new rows, and the element offsets of
// its page slot `at` in the K and V pools (-1 where the table names no page).
template <typename T> struct new_row {
    const T *ks, *vs;
    int64_t ko, vo;
};
template <typename T>
__device__ __forceinline__ new_row<T> new_row_of(const fa_cuda_paged &p, page_slot_t at, int row, int g)
{
    return new_row<T>{ (const T *)p.kn.p + row * p.kn.ss + g * p.kn.sh,
                       (const T *)p.vn.p + row * p.vn.ss + g * p.vn.sh,
                       slot_off(at, g, p.a.pg.k_sp, p.a.pg.k_st, p.a.k.sh),
                       slot_off(at, g, p.a.pg.v_sp, p.a.pg.v_st, p.a.v.sh) };
}

// Each new row's keys (rotated) and values into the page slot after the cache, every kv head.
template <typename T> __global__ void __launch_bounds__(kRowThreads) append_kernel(const fa_cuda_paged p)
{
    const int row = blockIdx.x, b = seq_of_row(p, row), dim = p.a.dim;
    const pseq_t s = pseq_of(p, b);
    const int i = row - s.q0;
    if (i < 0 || i >= s.qn || s.cached + i >= s.keys)
        return;
    const int pos = p.rope_dim ? rope_pos(p, row, i, s) : 0;
    const page_slot_t at = kv_slot(p, s, s.cached + i);
    const int n = p.a.heads_kv * dim;
    if (p.append_vec) {
        const int f = blockIdx.y * kElemsPerBlock + threadIdx.x * kRowElems, g = f / dim, e = f % dim;
        if (f >= n)
            return;
        const new_row<T> r = new_row_of<T>(p, at, row, g);
        if (r.ko >= 0) {
            uint4 u = *reinterpret_cast<const uint4 *>(r.ks + e);
            if (p.rope_dim) {
                float v[8];
                rope8(p, r.ks, e, pos, v);
                u = pack8<T>(v);
            }
            *reinterpret_cast<uint4 *>((T *)p.a.k.p + r.ko + e) = u;
        }
        if (r.vo >= 0)
            *reinterpret_cast<uint4 *>((T *)p.a.v.p + r.vo + e) = *reinterpret_cast<const uint4 *>(r.vs + e);
        return;
    }
#pragma unroll
    for (int x = 0; x < kRowElems; x++) {
        const int f = blockIdx.y * kElemsPerBlock + x * kRowThreads + threadIdx.x, g = f / dim, e = f % dim;
        if (f >= n)
            break;
        const new_row<T> r = new_row_of<T>(p, at, row, g);
        if (r.ko >= 0)
            ((T *)p.a.k.p)[r.ko + e] = p.rope_dim ? from_float<T>(rope_elem(p, r.ks, e, pos)) : r.ks[e];
        if (r.vo >= 0)
            ((T *)p.a.v.p)[r.vo + e] = r.vs[e];
    }
}

// Each query row's heads rotated at the row's position into out [total_q, heads_q, dim]
// (rounded to T as load_q rounds them), for kernels that copy query rows as they are.
template <typename T> __global__ void __launch_bounds__(kRowThreads) rotate_q_kernel(const fa_cuda_paged p, T *out)
{
    const int row = blockIdx.x, b = seq_of_row(p, row), dim = p.a.dim;
    const pseq_t s = pseq_of(p, b);
    const int i = row - s.q0;
    if (i < 0 || i >= s.qn)
        return;
    const int pos = rope_pos(p, row, i, s), n = p.a.heads_q * dim;
    if (p.rotate_vec) {
        const int f = blockIdx.y * kElemsPerBlock + threadIdx.x * kRowElems, h = f / dim, e = f % dim;
        if (f >= n)
            return;
        float v[8];
        rope8(p, (const T *)p.a.q.p + (int64_t)row * p.a.q.ss + (int64_t)h * p.a.q.sh, e, pos, v);
        *reinterpret_cast<uint4 *>(out + (int64_t)row * n + f) = pack8<T>(v);
        return;
    }
#pragma unroll
    for (int x = 0; x < kRowElems; x++) {
        const int f = blockIdx.y * kElemsPerBlock + x * kRowThreads + threadIdx.x, h = f / dim, e = f % dim;
        if (f >= n)
            break;
        const T *q = (const T *)p.a.q.p + (int64_t)row * p.a.q.ss + (int64_t)h * p.a.q.sh;
        out[(int64_t)row * n + f] = from_float<T>(rope_elem(p, q, e, pos));
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


template <typename T, int D, int WM, int KT, int STAGES>
__global__ void __launch_bounds__(128) paged_kernel(const fa_cuda_paged p)
{
    using S = shape<D, WM, KT, STAGES>;
    extern __shared__ __align__(16) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wm = warp % WM, kg = warp / WM;
    const split_block_t blk = split_block(p, S::BM);
    if (!blk.ok)
        return;
    const pseq_t &s = blk.s;
    const mask_t &mk = blk.mk;
    const int g = blk.g, G = p.a.group, split = blk.split, nsplit = blk.nsplit, rows = blk.rows;
    const int row0 = blk.row0, k_lo = blk.k_lo, k_hi = blk.k_hi;

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

template <int D, int NQ, int STAGES> struct dshape {
    static constexpr int BM = 8 * NQ;  // packed rows per block: NQ n tiles
    static constexpr int KT = 16;      // keys a warp step
    static constexpr int LDS = lds<D>();
    static constexpr int ELEMS = BM * LDS + 4 * STAGES * KT * LDS * 2; // Q, then each warp's K/V ring
    static constexpr int STATE = 4 * BM * (D + 2);                      // floats of the merge
    static constexpr int BYTES = ELEMS * 2 > STATE * 4 ? ELEMS * 2 : STATE * 4;
};

// The decode kernel on any sm_80+ device (decode_warp's steps): the four warps take alternate
// 16-key steps of the split, each through its own cp.async ring.
template <typename T, int D, int NQ, int STAGES>
__global__ void __launch_bounds__(128) decode_kernel(const fa_cuda_paged p)
{
    using S = dshape<D, NQ, STAGES>;
    extern __shared__ __align__(16) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const split_block_t blk = split_block(p, S::BM);
    if (!blk.ok)
        return;
    const pseq_t &s = blk.s;
    const mask_t &mk = blk.mk;
    const int g = blk.g, split = blk.split, nsplit = blk.nsplit, rows = blk.rows, row0 = blk.row0;
    const int vr1 = blk.vr1, k_lo = blk.k_lo, k_hi = blk.k_hi; // valid rows [row0, vr1): the rest have zero Q
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

    decode_warp<D, NQ> w;
    w.init(sQ, lane);
    for (int it = 0; it < ntiles; it++) {
        cp_async_wait<STAGES - 2>();
        __syncwarp();
        const int nxt = it + STAGES - 1;
        if (nxt < ntiles)
            load_kv_tile<T, D, S::KT, 32>(p, sK + (nxt % STAGES) * S::KT * S::LDS,
                                          sV + (nxt % STAGES) * S::KT * S::LDS, s, g, t_lo + warp + nxt * 4, k_lo,
                                          k_hi, lane);
        cp_async_commit();
        using rows_t = padded_rows<T, S::LDS>;
        w.step(p.a, mk, rows_t{ sK + (it % STAGES) * S::KT * S::LDS }, rows_t{ sV + (it % STAGES) * S::KT * S::LDS },
               (t_lo + warp + it * 4) * S::KT, k_lo, k_hi, row0, vr1, lane);
    }
    cp_async_wait<0>();
    __syncthreads(); // the rings become the merge's state
    float *state = reinterpret_cast<float *>(smem);
    w.store(state, warp, lane);
    __syncthreads();
    merge_out<T, D, S::BM, 4>(p, s, state, row0, rows, g, split, nsplit);
}

// A block per (row, query head) of a sequence with several splits: their partials combined into
// o and lse. The largest split max first (a max, so any order gives the same bits); each
// split's weight 2^(m_k - M) then needs nothing from the others, so a warp's loads of
// successive splits are all in flight together instead of waiting on a running rescale (one
// L2 round trip a split: 35 us for 128 splits under ncu). Warp w sums splits w, w + NW, ... in
// order, its lanes on neighbouring dims (eight at most each: dim <= 256); the warps' sums are
// added in warp order. The order depends on the split count alone, so a sequence's bits do
// not depend on the batch.
constexpr int kCombineWarps = 8;
template <typename T> __global__ void __launch_bounds__(32 * kCombineWarps) combine_kernel(const fa_cuda_paged p)
{
    pdl_wait(); // the partials, and anything earlier kernels wrote
    constexpr int NW = kCombineWarps;
    __shared__ float st[NW][2 + 256];
    __shared__ float wmax[NW];
    const int row = blockIdx.x, h = blockIdx.y, b = seq_of_row(p, row);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, dim = p.a.dim;
    const pseq_t s = pseq_of(p, b);
    const int32_t sp = fa_cuda_seq_split(p.split, p.split_grow, s.keys);
    const int nsplit = max(1, (s.keys + sp - 1) / sp), i = row - s.q0;
    if (i < 0 || i >= s.qn || nsplit == 1)
        return;
    const int64_t step = (int64_t)p.a.pg.total_q * p.a.heads_q * (dim + 2);
    const float *part = p.part + ((int64_t)row * p.a.heads_q + h) * (dim + 2);
    float mx = -INFINITY;
    for (int k = threadIdx.x; k < nsplit; k += blockDim.x)
        mx = fmaxf(mx, part[k * step]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0)
        wmax[warp] = mx;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < NW; w++)
        mx = fmaxf(mx, wmax[w]);
    float l = 0.0f, acc[8];
#pragma unroll
    for (int x = 0; x < 8; x++)
        acc[x] = 0.0f;
    if (mx > -INFINITY) {
        const float *at = part + warp * step;
#pragma unroll 4
        for (int k = warp; k < nsplit; k += NW, at += NW * step) {
            const float mk = at[0];
            const bool on = mk != -INFINITY; // a split with no visible keys: read, but not added
            const float w = on ? exp2f(mk - mx) : 0.0f;
            l = on ? fmaf(w, at[1], l) : l;
#pragma unroll
            for (int x = 0; x < 8; x++)
                if (lane + 32 * x < dim)
                    acc[x] = on ? fmaf(w, at[2 + lane + 32 * x], acc[x]) : acc[x];
        }
    }
    if (lane == 0)
        st[warp][1] = l;
#pragma unroll
    for (int x = 0; x < 8; x++)
        if (lane + 32 * x < dim)
            st[warp][2 + lane + 32 * x] = acc[x];
    __syncthreads();
    float lsum = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++)
        lsum += st[w][1];
    const final_t f = finish(p, h, mx, lsum);
    for (int e = threadIdx.x; e < dim; e += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++)
            o += st[w][2 + e];
        const int64_t oo = row_off(p.a.o, s.at, false, h, i) + e;
        if (p.a.o.f32)
            ((float *)p.a.o.p)[oo] = o * f.inv;
        else
            ((T *)p.a.o.p)[oo] = from_float<T>(o * f.inv);
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
    bool bad = false; // a NaN or +inf lse: o and lse NaN
    for (int k = 0; k < a.states; k++) {
        const float x = a.lse_in[k * a.ls + h * a.lh + r * a.lr];
        mx = fmaxf(mx, x);
        bad |= !(x < INFINITY);
    }
    if (bad)
        mx = -INFINITY; // the loops below skip every state
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
        const float v = bad ? NAN : sum > 0.0f ? acc / sum : 0.0f;
        const int64_t oo = r * a.oss + h * a.osh + e;
        if (a.out_f32)
            ((float *)a.o)[oo] = v;
        else
            ((T *)a.o)[oo] = from_float<T>(v);
    }
    if (a.lse && threadIdx.x == 0)
        a.lse[h * a.olh + r * a.olr] = bad ? NAN : sum > 0.0f ? mx + __logf(sum) : -INFINITY;
}

// After the attention kernel: the splits' merge where the grid has several.
template <typename T> cudaError_t finish_launch(const fa_cuda_paged &p, cudaStream_t stream)
{
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || p.max_splits == 1 || p.a.pg.total_q == 0)
        return err;
    return launch_dependent(combine_kernel<T>, dim3((unsigned)p.a.pg.total_q, (unsigned)p.a.heads_q),
                            dim3(32 * kCombineWarps), 0, stream, p.pdl && p.decode_sm90, p);
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
    if (p.decode_sm90 && nq) {
        const cudaError_t err = fa_cuda_decode_sm90(&p, std::is_same<T, __nv_bfloat16>::value, dpad, nq, stream);
        return err != cudaSuccess ? err : finish_launch<T>(p, stream);
    }
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
    const int n = p->a.heads_kv * p->a.dim;
    const dim3 rows((unsigned)p->a.pg.total_q, (unsigned)((n + fa::kElemsPerBlock - 1) / fa::kElemsPerBlock));
    if (bf16)
        fa::append_kernel<__nv_bfloat16><<<rows, fa::kRowThreads, 0, stream>>>(*p);
    else
        fa::append_kernel<__half><<<rows, fa::kRowThreads, 0, stream>>>(*p);
    return cudaGetLastError();
}

extern "C" cudaError_t fa_cuda_paged_rotate_q(const fa_cuda_paged *p, int bf16, void *out, cudaStream_t stream)
{
    if (p->a.pg.total_q == 0)
        return cudaSuccess;
    const int n = p->a.heads_q * p->a.dim;
    const dim3 rows((unsigned)p->a.pg.total_q, (unsigned)((n + fa::kElemsPerBlock - 1) / fa::kElemsPerBlock));
    if (bf16)
        fa::rotate_q_kernel<<<rows, fa::kRowThreads, 0, stream>>>(*p, (__nv_bfloat16 *)out);
    else
        fa::rotate_q_kernel<<<rows, fa::kRowThreads, 0, stream>>>(*p, (__half *)out);
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
