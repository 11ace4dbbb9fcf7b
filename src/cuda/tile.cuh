// SPDX-License-Identifier: MIT
// The small vocabulary the CUDA kernels are written in: tensor-core mma
// (m16n8k16, fp32 accumulate), ldmatrix fragment loads, cp.async tile copies,
// the score transform and the shared dropout mask (the attention mask: mask.cuh).
#pragma once

#include "mask.cuh"
#include "params.h"
#include "softmax.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

extern "C" {
#include "../core/dropout.h"
}

namespace fa {

// Shared-memory rows are head_dim + 8 elements: the 16-byte pad staggers rows
// across banks so the eight row addresses of an ldmatrix hit eight bank groups.
template <int D> __host__ __device__ constexpr int lds() { return D + 8; }

template <typename T> struct mma16816;
template <> struct mma16816<__half> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct mma16816<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Two floats rounded to T, the lower column in the low half (fragment order).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

// An fp8 (e4m3) input element, and its descale factors (1 where the call gave none): the one
// every row of (b, g) takes (descale_at: 1 with factors per block of rows), and row i's block
// factor (descale_row: 1 without).
struct e4m3_t {
    uint8_t x;
};
template <> __device__ __forceinline__ float to_float<e4m3_t>(e4m3_t v)
{
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.x, __NV_E4M3)));
}
__device__ __forceinline__ float descale_at(const fa_cuda_descale &d, int b, int g)
{
    return d.p && !d.rows ? d.p[b * d.sb + g * d.sh] : 1.0f;
}
__device__ __forceinline__ float descale_row(const fa_cuda_descale &d, int b, int g, int i)
{
    const unsigned blk = d.mul ? __umulhi((unsigned)i, d.mul) >> d.shr : (unsigned)i; // i / d.rows
    return d.p && d.rows ? d.p[b * d.sb + g * d.sh + (int)blk * d.sblk] : 1.0f;
}

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// 16 bytes global -> shared, bypassing L1; src_bytes 0 writes zeros (tails, padding).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(src_bytes));
}
// 4 bytes global -> shared (row statistics); src_bytes 0 writes zero.
__device__ __forceinline__ void cp_async4(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ROWS x D tile of a strided [seq, head_dim] slab into shared memory (row pitch lds<D>()).
// Rows >= valid_rows and columns >= dim read as zero. All NT threads of the block take part.
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile(T *s, const T *g, int64_t row_stride, int valid_rows,
                                          int dim, bool aligned)
{
    constexpr int CHUNKS = D / 8;
    if (aligned) {
#pragma unroll
        for (int c = threadIdx.x; c < ROWS * CHUNKS; c += NT) {
            int r = c / CHUNKS, col = (c % CHUNKS) * 8;
            bool ok = r < valid_rows && col < dim;
            const T *src = ok ? g + r * row_stride + col : g;
            cp_async16(s + r * lds<D>() + col, src, ok ? 16 : 0);
        }
    } else {
        for (int c = threadIdx.x; c < ROWS * CHUNKS; c += NT) {
            int r = c / CHUNKS, col = (c % CHUNKS) * 8;
            T *dst = s + r * lds<D>() + col;
#pragma unroll
            for (int e = 0; e < 8; e++)
                dst[e] = (r < valid_rows && col + e < dim) ? g[r * row_stride + col + e]
                                                           : from_float<T>(0.0f);
        }
    }
}

// acc[MT][NT] += A * B^T with A (16*MT rows) and B (8*NT rows) both [rows][K] in shared
// memory: S = Q K^T, S^T = K Q^T, dP = dO V^T, dP^T = V dO^T.
template <typename T, int MT, int NT, int K, int LDS>
__device__ __forceinline__ void gemm_nt(float (&acc)[MT][NT][4], const T *sA, const T *sB, int lane)
{
    static_assert(NT % 2 == 0, "n tiles come in pairs");
    const int m = lane >> 3, r = lane & 7;
#pragma unroll
    for (int k = 0; k < K; k += 16) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            ldsm_x4(a[mt], sA + (mt * 16 + r + (m & 1) * 8) * LDS + k + (m >> 1) * 8);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            uint32_t b[4];
            ldsm_x4(b, sB + (nt * 8 + r + (m >> 1) * 8) * LDS + k + (m & 1) * 8);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816<T>::run(acc[mt][nt], a[mt], b[0], b[1]);
                mma16816<T>::run(acc[mt][nt + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// acc[MT][NT] += A * B with A in registers (fragments, K = 16*KT deep) and B [K][8*NT] in
// shared memory, read transposed: O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K.
template <typename T, int MT, int NT, int KT, int LDS>
__device__ __forceinline__ void gemm_rn(float (&acc)[MT][NT][4], const uint32_t (&a)[MT][KT][4],
                                        const T *sB, int lane)
{
    static_assert(NT % 2 == 0, "n tiles come in pairs");
    const int m = lane >> 3, r = lane & 7;
#pragma unroll
    for (int kt = 0; kt < KT; kt++) {
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            uint32_t b[4];
            ldsm_x4_t(b, sB + (kt * 16 + r + (m & 1) * 8) * LDS + nt * 8 + (m >> 1) * 8);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816<T>::run(acc[mt][nt], a[mt][kt], b[0], b[1]);
                mma16816<T>::run(acc[mt][nt + 1], a[mt][kt], b[2], b[3]);
            }
        }
    }
}

// Accumulator fragments (rows x 8*NT) rounded to T as A fragments (rows x 16*NT/2 deep).
template <typename T, int MT, int NT>
__device__ __forceinline__ void to_a(uint32_t (&a)[MT][NT / 2][4], const float (&c)[MT][NT][4])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NT / 2; j++) {
            a[mt][j][0] = pack2<T>(c[mt][2 * j][0], c[mt][2 * j][1]);
            a[mt][j][1] = pack2<T>(c[mt][2 * j][2], c[mt][2 * j][3]);
            a[mt][j][2] = pack2<T>(c[mt][2 * j + 1][0], c[mt][2 * j + 1][1]);
            a[mt][j][3] = pack2<T>(c[mt][2 * j + 1][2], c[mt][2 * j + 1][3]);
        }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&c)[MT][NT][4])
{
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                c[i][j][e] = 0.0f;
}

// One sequence of the batch: where its rows start and how many there are.
struct seq_t {
    int64_t q0, k0;        // first packed row (varlen) or 0
    int64_t q_base, k_base; // element offset of batch b (fixed length) or 0
    int sq, sk;
};

// A paged sequence b: its query rows [q0, q0 + qn) of the packed rows, the tokens cached
// before the call and its keys now (cached plus the call's new rows where they are appended),
// each clamped into the packed rows, the bounds and the sequence's pages.
struct paged_seq_t {
    int q0, qn, cached, keys;
};
__device__ __forceinline__ paged_seq_t paged_seq(const fa_cuda_pages &g, const int32_t *cu_q, int max_q,
                                                 int max_k, int b)
{
    paged_seq_t s;
    s.q0 = min(max(cu_q[b], 0), g.total_q);
    const int q1 = min(max(cu_q[b + 1], s.q0), g.total_q);
    s.qn = min(q1 - s.q0, max_q);
    const int64_t cap = min((int64_t)g.max_pages * g.size, (int64_t)max_k);
    s.cached = (int)min(max((int64_t)g.lens[b], (int64_t)0), cap);
    s.keys = (int)min((int64_t)s.cached + (g.append ? s.qn : 0), cap);
    return s;
}

// Token j (< 2^31) of sequence b: the table's entry for its page (page_ok says whether it
// names one of the pool's) and its slot in the page (shifts where the page size is a power of
// two); page_slot both, the page -1 where the entry names none.
__device__ __forceinline__ int page_entry(const fa_cuda_pages &g, int b, int j)
{
    return g.table[b * g.bt_stride + (g.shift >= 0 ? j >> g.shift : j / g.size)];
}
__device__ __forceinline__ bool page_ok(const fa_cuda_pages &g, int page) { return page >= 0 && page < g.num; }
__device__ __forceinline__ int slot_in_page(const fa_cuda_pages &g, int j)
{
    return g.shift >= 0 ? j & (g.size - 1) : j % g.size;
}
struct page_slot_t {
    int page, slot;
};
__device__ __forceinline__ page_slot_t page_slot(const fa_cuda_pages &g, int b, int j)
{
    const int page = page_entry(g, b, j);
    return page_slot_t{ page_ok(g, page) ? page : -1, slot_in_page(g, j) };
}

// PAGES: the kernel takes keys from pages too (p.pg.table set; the Hopper forward), a branch
// the others are spared.
template <bool PAGES = false> __device__ __forceinline__ seq_t seq_of(const fa_cuda_params &p, int b)
{
    seq_t s;
    if (PAGES && p.pg.table) { // keys in pages: the loader finds their rows (load_tile_paged)
        const paged_seq_t g = paged_seq(p.pg, p.cu_q, p.max_q, p.max_k, b);
        s.q0 = g.q0;
        s.sq = g.qn;
        s.sk = g.keys;
        s.k0 = s.q_base = s.k_base = 0;
    } else if (p.cu_q) {
        s.q0 = p.cu_q[b];
        s.k0 = p.cu_k[b];
        s.sq = p.cu_q[b + 1] - p.cu_q[b];
        s.sk = p.cu_k[b + 1] - p.cu_k[b];
        s.q_base = s.k_base = 0;
    } else {
        s.q0 = s.k0 = 0;
        s.sq = p.seqlen_q;
        s.sk = p.seqlen_k;
        s.q_base = s.k_base = b;
    }
    return s;
}

// Element offset of row `row` (within the sequence) of head h in view t.
__device__ __forceinline__ int64_t row_off(const fa_cuda_view &t, const seq_t &s, bool is_k, int h,
                                           int64_t row)
{
    int64_t b = is_k ? s.k_base : s.q_base, r0 = is_k ? s.k0 : s.q0;
    return b * t.sb + (r0 + row) * t.ss + (int64_t)h * t.sh;
}

// Element of the lse output for query row i (within sequence s) of head h.
__device__ __forceinline__ int64_t lse_index(const fa_cuda_params &p, const seq_t &s, int h, int64_t i)
{
    return s.q_base * p.lse_sb + (int64_t)h * p.lse_sh + (s.q0 + i) * p.lse_ss;
}

// Block index -> (tile, head, batch); tile-major so neighbours share K/V in L2. With
// reverse, the heaviest causal tiles (the last rows) start first.
struct block_t {
    int tile, h, b;
};
__device__ __forceinline__ block_t block_of(int tiles, int heads, bool reverse,
                                            int64_t x = blockIdx.x)
{
    block_t r;
    r.tile = (int)(x % tiles);
    if (reverse)
        r.tile = tiles - 1 - r.tile;
    x /= tiles;
    r.h = (int)(x % heads);
    r.b = (int)(x / heads);
    return r;
}

// The query tile a block owns (one per tile, query head and sequence; item x of them, the
// block's index unless a persistent kernel hands them out) and the key tiles of width BN its
// mask lets it see: [n_lo, n_hi). False when the tile lies past its sequence.
struct query_tile_t {
    block_t blk;
    seq_t s;
    mask_t mk;
    int r0, hk, n_lo, n_hi;
};
template <int BM, int BN, bool PAGES = false>
__device__ __forceinline__ bool query_tile(const fa_cuda_params &p, query_tile_t &q,
                                           int64_t x = blockIdx.x)
{
    q.blk = block_of((p.max_q + BM - 1) / BM, p.heads_q, p.win_right < p.max_k, x);
    q.s = seq_of<PAGES>(p, q.blk.b);
    q.r0 = q.blk.tile * BM;
    if (q.r0 >= q.s.sq)
        return false;
    q.hk = q.blk.h / p.group;
    q.mk = mask_of(p, q.s.sq, q.s.sk);
    const tiles_t n = tiles_of<BN>(q.mk.key_range(q.r0, q.r0 + BM));
    q.n_lo = n.lo;
    q.n_hi = n.hi;
    return true;
}

// Key/value tile n (BN rows from key n * BN) into one stage of sK and sV.
template <typename T, int BN, int D, int NT>
__device__ __forceinline__ void load_kv(T *sK, T *sV, const T *gK, const T *gV, const fa_cuda_params &p,
                                        const seq_t &s, int n)
{
    const int c = n * BN;
    load_tile<T, BN, D, NT>(sK, gK + c * p.k.ss, p.k.ss, s.sk - c, p.dim, p.aligned);
    load_tile<T, BN, D, NT>(sV, gV + c * p.v.ss, p.v.ss, s.sk - c, p.dim, p.aligned);
}

// Raw score -> log2-domain logit (scale, then the optional cap).
__device__ __forceinline__ float logit2(const fa_cuda_params &p, float s)
{
    return p.softcap > 0.0f ? p.cap_out * tanhf(s * p.cap_in) : s * p.scale_log2;
}

// Raw scores -> log2-domain logits, the cap's branch taken once for the whole tile; cap_in and
// scale_log2 are p's, or (fp8) p's times the descale factors of q and k, given per row of the
// fragment (rows g and g + 8 of each m tile: element e's is [e / 2]) or for all.
template <int MT, int NT>
__device__ __forceinline__ void to_logits(const fa_cuda_params &p, float (&c)[MT][NT][4], const float (&cap_in)[2],
                                          const float (&scale_log2)[2])
{
    if (p.softcap > 0.0f) {
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    c[i][j][e] = p.cap_out * tanhf(c[i][j][e] * cap_in[e / 2]);
    } else {
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    c[i][j][e] *= scale_log2[e / 2];
    }
}
template <int MT, int NT>
__device__ __forceinline__ void to_logits(const fa_cuda_params &p, float (&c)[MT][NT][4], float cap_in,
                                          float scale_log2)
{
    const float ci[2] = { cap_in, cap_in }, sl[2] = { scale_log2, scale_log2 };
    to_logits(p, c, ci, sl);
}
template <int MT, int NT>
__device__ __forceinline__ void to_logits(const fa_cuda_params &p, float (&c)[MT][NT][4])
{
    to_logits(p, c, p.cap_in, p.scale_log2);
}

// Zero the dropped probabilities (same element placement as apply_mask; col0 even, so each
// pair of columns shares one Philox block).
template <int MT, int NT>
__device__ __forceinline__ void apply_dropout(const fa_cuda_params &p, float (&c)[MT][NT][4], int b,
                                              int h, int64_t row0, int64_t col0);

// d(capped logit)/d(scaled score) from the log2-domain logit: 1 - tanh^2.
__device__ __forceinline__ float cap_grad(const fa_cuda_params &p, float x2)
{
    if (p.softcap <= 0.0f)
        return 1.0f;
    float t = x2 / p.cap_out;
    return 1.0f - t * t;
}

// The dropout words of (row, col .. col+3 rounded down to 4): fa_dropout_mask's definition.
__device__ __forceinline__ void dropout_words(const fa_cuda_params &p, int b, int h, int64_t row,
                                              int64_t col, uint32_t (&r)[4])
{
    const uint32_t key[2] = { (uint32_t)p.dropout_seed ^ ((uint32_t)h * 0x9E3779B9u),
                              (uint32_t)(p.dropout_seed >> 32) ^ ((uint32_t)b * 0xBB67AE85u) };
    const uint32_t ctr[4] = { (uint32_t)(col >> 2), (uint32_t)row, (uint32_t)p.dropout_offset,
                              (uint32_t)(p.dropout_offset >> 32) };
    uint32_t out[4];
    fa_philox4x32_10(ctr, key, out);
    r[0] = out[0], r[1] = out[1], r[2] = out[2], r[3] = out[3];
}

// Whether word (col & 3) of a dropout block keeps its element; selects, not an indexed
// load, so the words stay in registers.
__device__ __forceinline__ bool dropout_keep(const fa_cuda_params &p, const uint32_t (&w)[4], int64_t col)
{
    const int c = (int)(col & 3);
    const uint32_t word = c == 0 ? w[0] : c == 1 ? w[1] : c == 2 ? w[2] : w[3];
    return (word >> 8) >= p.dropout_threshold;
}

template <int MT, int NT>
__device__ __forceinline__ void apply_dropout(const fa_cuda_params &p, float (&c)[MT][NT][4], int b,
                                              int h, int64_t row0, int64_t col0)
{
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int64_t row = row0 + i * 16 + hf * 8, col = col0 + j * 8;
                uint32_t w[4];
                dropout_words(p, b, h, row, col, w);
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (!dropout_keep(p, w, col + e))
                        c[i][j][2 * hf + e] = 0.0f;
            }
}

// One element of a view stored as T or float32.
template <typename T> __device__ __forceinline__ void store(const fa_cuda_view &t, int64_t off, float v)
{
    if (t.f32)
        ((float *)t.p)[off] = v;
    else
        ((T *)t.p)[off] = from_float<T>(v);
}
template <typename T> __device__ __forceinline__ float load(const fa_cuda_view &t, int64_t off)
{
    return t.f32 ? ((const float *)t.p)[off] : to_float<T>(((const T *)t.p)[off]);
}

// Row statistics of query row i (within sequence s) of head h for the backward, as the
// rowsum pass left them: lse in log2 units (+inf for a row that saw no key, so its P is 0)
// and D = rowsum(dO * O).
__device__ __forceinline__ float lse2_of(const fa_cuda_params &p, const seq_t &s, int h, int64_t i)
{
    return i < s.sq ? p.lse2[(int64_t)h * p.rows + s.q_base * p.seqlen_q + s.q0 + i] : INFINITY;
}
__device__ __forceinline__ float dsum_of(const fa_cuda_params &p, const seq_t &s, int h, int64_t i)
{
    return i < s.sq ? p.dsum[(int64_t)h * p.rows + s.q_base * p.seqlen_q + s.q0 + i] : 0.0f;
}

// dS and the kept P (dropout's 1/(1-p) left for the end) of one element from its
// log2-domain logit (-inf where masked), dP and its row's statistics.
struct grad_elem {
    float pd, ds;
};
// CAP false: a call without softcap, where a masked element (x = -inf) gives pr = 0 and so
// ds = 0 by itself (dP and D are finite), and the guards below are not needed. DROP false: a
// call without dropout (keep is true and the scale 1).
template <bool CAP = true, bool DROP = true>
__device__ __forceinline__ grad_elem grad_of(const fa_cuda_params &p, float x, float dp, float lse2,
                                             float dsum, bool keep)
{
    const float pr = prob(x, lse2);
    if constexpr (!CAP && !DROP)
        return grad_elem{ pr, pr * (dp - dsum) };
    if constexpr (!CAP)
        return grad_elem{ keep ? pr : 0.0f, pr * ((keep ? dp * p.dropout_scale : 0.0f) - dsum) };
    // selects, no branches: a masked element (x = -inf, pr = 0) must not reach cap_grad's
    // infinities, and per-element branches would keep the tile's registers from the allocator
    const bool live = pr > 0.0f;
    const float ds = pr * ((keep ? dp * p.dropout_scale : 0.0f) - dsum) * cap_grad(p, live ? x : 0.0f);
    return grad_elem{ keep && live ? pr : 0.0f, live ? ds : 0.0f };
}

// dQ's element step on a [queries x keys] tile (rows row0 + g (+8), columns col0 + 2t ...):
// raw scores in sc -> dS in sc, from dP in dp and the rows' statistics.
template <int NS>
__device__ __forceinline__ void dq_grads(const fa_cuda_params &p, const mask_t &mk, int b, int h,
                                         float (&sc)[1][NS][4], const float (&dp)[1][NS][4],
                                         const float (&lse2)[2], const float (&dsum)[2], int64_t row0,
                                         int64_t col0, int g, int t)
{
    to_logits(p, sc);
    if (!mk.all_visible(row0, row0 + 16, col0, col0 + 8 * NS))
        apply_mask(mk, sc, row0 + g, col0 + 2 * t);
#pragma unroll
    for (int nt = 0; nt < NS; nt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int64_t i = row0 + g + hf * 8, j = col0 + nt * 8 + 2 * t;
            uint32_t w[4] = { 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu };
            if (p.dropout_p > 0.0f)
                dropout_words(p, b, h, i, j, w);
#pragma unroll
            for (int e = 0; e < 2; e++)
                sc[0][nt][2 * hf + e] = grad_of(p, sc[0][nt][2 * hf + e], dp[0][nt][2 * hf + e],
                                                lse2[hf], dsum[hf], dropout_keep(p, w, j + e)).ds;
        }
}

// dK/dV's element step on a transposed [keys x queries] tile (rows key0 + g (+8), columns
// query0 + 2t ...): the scores' exponents in sc -> the kept P in sc, dP in dp -> dS in dp;
// the queries' lse2 and D from sl / sd (indexed from query0). CAP: sc holds log2-domain
// logits and sl is still to be subtracted; without softcap the caller has folded the scale
// and lse2 into sc. DROPOUT false: a kernel built for calls without dropout (the mask's
// registers and the 1 / (1 - p) scale left out).
template <int NQ, bool DROPOUT, bool CAP>
__device__ __forceinline__ void kv_elems(const fa_cuda_params &p, int b, int h, float (&sc)[1][NQ][4],
                                         float (&dp)[1][NQ][4], const float *sl, const float *sd,
                                         int64_t query0, int64_t key0, int g, int t)
{
#pragma unroll
    for (int nt = 0; nt < NQ; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int il = nt * 8 + 2 * t + (e & 1);
            bool keep = true;
            if (DROPOUT && p.dropout_p > 0.0f) {
                const int64_t i = query0 + il, j = key0 + g + (e >> 1) * 8;
                uint32_t w[4];
                dropout_words(p, b, h, i, j, w);
                keep = dropout_keep(p, w, j);
            }
            const grad_elem ge = grad_of<CAP, DROPOUT>(p, sc[0][nt][e], dp[0][nt][e], CAP ? sl[il] : 0.0f,
                                                       sd[il], keep);
            sc[0][nt][e] = ge.pd;
            dp[0][nt][e] = ge.ds;
        }
}
// full: every element of the tile is visible (the mask is not applied).
template <int NQ, bool DROPOUT = true>
__device__ __forceinline__ void kv_grads(const fa_cuda_params &p, const mask_t &mk, bool full, int b,
                                         int h, float (&sc)[1][NQ][4], float (&dp)[1][NQ][4],
                                         const float *sl, const float *sd, int64_t query0,
                                         int64_t key0, int g, int t)
{
    if (p.softcap > 0.0f) {
        to_logits(p, sc);
        if (!full)
            apply_mask<true>(mk, sc, key0 + g, query0 + 2 * t);
        kv_elems<NQ, DROPOUT, true>(p, b, h, sc, dp, sl, sd, query0, key0, g, t);
        return;
    }
    // the exponent score * scale_log2 - lse2 in one step, masked after it (the scale may be
    // negative, so a masked raw score could not stand in for -inf)
#pragma unroll
    for (int nt = 0; nt < NQ; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            sc[0][nt][e] = fmaf(sc[0][nt][e], p.scale_log2, -sl[nt * 8 + 2 * t + (e & 1)]);
    if (!full)
        apply_mask<true>(mk, sc, key0 + g, query0 + 2 * t);
    kv_elems<NQ, DROPOUT, false>(p, b, h, sc, dp, sl, sd, query0, key0, g, t);
}

} // namespace fa
