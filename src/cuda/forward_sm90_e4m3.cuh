// SPDX-License-Identifier: MIT
// The fp8 (e4m3) mainloop of the Hopper forward (forward_sm90.cuh's kernel around it): both
// products on the tensor cores in fp8, k32 a step, fp32 accumulators. fp8 wgmma takes K-major
// operands only, so V goes in transposed: the loading warpgroup copies each V tile into a
// staging buffer, then writes it into the V^T ring (keys contiguous) with byte permutes. P is
// rounded to e4m3 in registers, where the S accumulator's columns (m16n8) lie in another order
// than an fp8 A fragment's (m16n8k32); the transpose writes V^T's keys in the A fragment's order
// instead, so P needs no shuffle. Descale factors: q's and k's scale the scores before the
// softmax, v's the output. Rows are D bytes (D a multiple of 128), tiles 128-byte swizzled.
#pragma once

#include "forward_sm90.cuh"

namespace fa {

// Byte col of row r in a tile of 1-byte elements, 128-byte swizzled: 128-byte column blocks of
// pitch rows, one after the other; in each, row r's 16-byte chunk c sits at chunk c ^ (r % 8).
__device__ __forceinline__ int sw8_offset(int r, int col, int pitch)
{
    return (col / 128) * pitch * 128 + r * 128 + ((((col % 128) / 16) ^ (r & 7)) << 4) + (col % 16);
}

// The TMA loader transposes V(j) kE4m3Lag tiles after issuing its copy (copies of the tiles
// between in flight meanwhile), from one of kE4m3Lag + 1 staging tiles. The consumers wait for
// V(j - 1) before releasing K(j)'s stage, so the loader may be at most STAGES - 1 tiles ahead.
constexpr int kE4m3Lag = 2;

template <int BM, int BN, int D, int STAGES, int NQ, int STAGING> struct e4m3_smem {
    static constexpr int q = BM * D, kv = BN * D;
    static constexpr int fac = (BM / 16) * 2 * BN * 4; // each consumer warp's factors by column
    // Q buffers, the K ring, the V^T ring, V's staging tiles, the factors (+ alignment slack)
    static constexpr size_t bytes = 1024 + NQ * (size_t)q + (2 * STAGES + STAGING) * (size_t)kv + fac;
};

// ROWS x D bytes of a strided [seq, head_dim] e4m3 slab into the swizzled layout; rows >=
// valid_rows and columns >= dim read as zero. The loading warpgroup's 128 threads take part:
// 16-byte copies where rows are aligned, else byte by byte.
template <int ROWS, int D>
__device__ __forceinline__ void load_tile_e4m3(unsigned char *s, const uint8_t *g, int64_t row_stride,
                                               int valid_rows, int dim, bool aligned, int tid)
{
    constexpr int CHUNKS = D / 16, RP = 128 / CHUNKS;
    static_assert(RP % 8 == 0, "a thread keeps its column and swizzle phase");
    if (aligned) {
        const int col = (tid % CHUNKS) * 16, r0 = tid / CHUNKS;
        const bool col_ok = col < dim;
#pragma unroll 4
        for (int r = r0; r < ROWS; r += RP) {
            const bool ok = col_ok && r < valid_rows;
            cp_async16(s + sw8_offset(r, col, ROWS), ok ? g + r * row_stride + col : g, ok ? 16 : 0);
        }
    } else {
        for (int c = tid; c < ROWS * D; c += 128) {
            const int r = c / D, col = c % D;
            s[sw8_offset(r, col, ROWS)] = r < valid_rows && col < dim ? g[r * row_stride + col] : 0;
        }
    }
}

// A staged V tile (BN keys x D bytes) into V^T (D rows of BN bytes, one a column of V), the
// keys of each 16 in the A fragment's order: slot 4t + i holds the key S's thread t has at
// column 2t + i (i < 2) or 8 + 2t + i - 2. Lane (t, u = lane / 4) takes 4 keys x 4 columns at
// a time: four words (one a key) read, transposed by byte permutes into four (one a column).
// Lanes rotate their words by (u / 2) % 4 bytes first, so that the 8 lanes writing one slot
// word write rows of 8 different swizzle phases (no bank conflicts either way).
template <int BN, int D>
__device__ __forceinline__ void transpose_v(unsigned char *vt, const unsigned char *st, int tid)
{
    const int warp = tid / 32, lane = tid % 32, t = lane % 4, u = lane / 4, rot = (u >> 1) & 3;
#pragma unroll 2
    for (int x = warp; x < (BN / 16) * (D / 32); x += 4) {
        const int kh = x / (D / 32), col = (x % (D / 32)) * 32 + 4 * u, key = kh * 16 + 2 * t;
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[k] = *reinterpret_cast<const uint32_t *>(st + sw8_offset(key + (k & 1) + (k >> 1) * 8, col, BN));
            w[k] = __funnelshift_r(w[k], w[k], 8 * rot); // byte i: column col + (i + rot) % 4
        }
        const uint32_t x0 = __byte_perm(w[0], w[1], 0x5140), x1 = __byte_perm(w[0], w[1], 0x7362);
        const uint32_t y0 = __byte_perm(w[2], w[3], 0x5140), y1 = __byte_perm(w[2], w[3], 0x7362);
        const uint32_t o[4] = { __byte_perm(x0, y0, 0x5410), __byte_perm(x0, y0, 0x7632),
                                __byte_perm(x1, y1, 0x5410), __byte_perm(x1, y1, 0x7632) };
#pragma unroll
        for (int i = 0; i < 4; i++)
            *reinterpret_cast<uint32_t *>(vt + sw8_offset(col + ((i + rot) & 3), kh * 16 + 4 * t, D)) = o[i];
    }
}

// Four floats rounded to e4m3 (nearest, saturating), the first in the low byte.
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d)
{
    uint16_t lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;\n" : "=h"(lo) : "f"(a), "f"(b));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;\n" : "=h"(hi) : "f"(c), "f"(d));
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

// P (the S accumulator's NS column tiles of 8) into fp8 A fragments of 32 keys each, in the
// key order transpose_v gives V^T.
template <int NS>
__device__ __forceinline__ void to_a_e4m3(uint32_t (&a)[NS / 4][4], const float (&c)[1][NS][4])
{
#pragma unroll
    for (int j = 0; j < NS / 4; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) { // keys 32 j + 16 h ..: rows g (e 0, 1) and g + 8 (e 2, 3)
            const float(&l)[4] = c[0][4 * j + 2 * h], (&r)[4] = c[0][4 * j + 2 * h + 1];
            a[j][2 * h] = pack4_e4m3(l[0], l[1], r[0], r[1]);
            a[j][2 * h + 1] = pack4_e4m3(l[2], l[3], r[2], r[3]);
        }
}

// The loading warpgroup: as load_tiles (forward_sm90.cuh) by row copies, with V(n) copied
// into staging tile n % 2 and transposed into the V^T ring once K(n + 1) is on its way.
template <int D, int BN, int NWG, int STAGES, int NQ>
__device__ __forceinline__ void transpose_stage(kv_ring<STAGES, NQ> &ring, unsigned char *sVt,
                                                const unsigned char *sVs, int j, int tid)
{
    constexpr int KV = BN * D;
    named_barrier(NWG + 1, 128); // every loader's copies of V(j) have landed; tile j - 1 is transposed
    if (j >= STAGES)
        mbar_wait(&ring.empty_v[j % STAGES], (j / STAGES - 1) & 1);
    transpose_v<BN, D>(sVt + (j % STAGES) * KV, sVs + (j % 2) * KV, tid);
    fence_async_smem();
    mbar_arrive(&ring.full_v[j % STAGES]);
}

template <int D, int BN, int NWG, int STAGES, int NQ>
__device__ __forceinline__ void load_tiles_e4m3(const fa_cuda_params &p, int items, kv_ring<STAGES, NQ> &ring,
                                                unsigned char *sQ, unsigned char *sK, unsigned char *sVt,
                                                unsigned char *sVs, int tid)
{
    constexpr int BM = 64 * NWG, QB = BM * D, KV = BN * D;
    int it = 0;
    for (int k = 0;; k++) {
        const int qb = k % NQ;
        query_tile_t qt;
        const int got = loader_next_tile<BM, BN, NWG>(p, items, ring, k, tid, qt);
        if (got < 0)
            return;
        if (got == 0)
            continue;
        const seq_t &s = qt.s;
        load_tile_e4m3<BM, D>(sQ + qb * QB, (const uint8_t *)p.q.p + row_off(p.q, s, false, qt.blk.h, qt.r0),
                              p.q.ss, s.sq - qt.r0, p.dim, p.aligned, tid);
        cp_async_commit();
        const uint8_t *gK = (const uint8_t *)p.k.p + row_off(p.k, s, true, qt.hk, 0);
        const uint8_t *gV = (const uint8_t *)p.v.p + row_off(p.v, s, true, qt.hk, 0);
        for (int n = qt.n_lo; n < qt.n_hi; n++, it++) {
            const int st = it % STAGES, c = n * BN;
            if (it >= STAGES)
                mbar_wait(&ring.empty_k[st], (it / STAGES - 1) & 1);
            load_tile_e4m3<BN, D>(sK + st * KV, gK + c * p.k.ss, p.k.ss, s.sk - c, p.dim, p.aligned, tid);
            cp_async_commit();
            cp_async_wait<1>(); // Q, or V(n-1), has landed
            fence_async_smem();
            if (n == qt.n_lo)
                mbar_arrive(&ring.q_full[qb]);
            else
                transpose_stage<D, BN, NWG, STAGES, NQ>(ring, sVt, sVs, it - 1, tid);
            load_tile_e4m3<BN, D>(sVs + (it % 2) * KV, gV + c * p.v.ss, p.v.ss, s.sk - c, p.dim, p.aligned, tid);
            cp_async_commit();
            cp_async_wait<1>(); // K(n) has landed
            fence_async_smem();
            mbar_arrive(&ring.full_k[st]);
        }
        cp_async_wait<0>();
        transpose_stage<D, BN, NWG, STAGES, NQ>(ring, sVt, sVs, it - 1, tid);
    }
}

// The loading warpgroup for fixed-length keys by TMA (p.pg.tk / tv: [batch][key][head][dim]
// bytes, boxes of BN keys x 128 columns, keys past seqlen_k zeros): K(n) straight into the
// ring, V(n) into staging tile n % (kE4m3Lag + 1) on its own barrier, both issued by thread 0
// without waiting; V(n - kE4m3Lag) is transposed meanwhile, and the last ones at the end of a
// query tile. Q by cp.async, landed before its hand-over.
template <int D, int BN, int NWG, int STAGES, int NQ>
__device__ __forceinline__ void load_tiles_e4m3_tma(const fa_cuda_params &p, int items, kv_ring<STAGES, NQ> &ring,
                                                    unsigned char *sQ, unsigned char *sK, unsigned char *sVt,
                                                    unsigned char *sVs, int tid)
{
    constexpr int BM = 64 * NWG, QB = BM * D, KV = BN * D, CB = D / 128, NS = kE4m3Lag + 1;
    static_assert(kE4m3Lag < STAGES, "the loader's lead stays within the ring");
    __shared__ uint64_t staged[NS]; // V(j) landed in staging tile j % NS
    if (tid == 0) {
        for (int i = 0; i < NS; i++)
            mbar_init(&staged[i], 1);
        fence_mbar_init();
    }
    named_barrier(NWG + 1, 128);
    // V(j) from its staging tile into the V^T ring; every loader thread done with the staging
    // tile before thread 0 copies V(j + NS) into it
    auto transpose = [&](int j) {
        mbar_wait(&staged[j % NS], (j / NS) & 1);
        if (j >= STAGES)
            mbar_wait(&ring.empty_v[j % STAGES], (j / STAGES - 1) & 1);
        transpose_v<BN, D>(sVt + (j % STAGES) * KV, sVs + (j % NS) * KV, tid);
        fence_async_smem();
        mbar_arrive(&ring.full_v[j % STAGES]);
        named_barrier(NWG + 1, 128);
    };
    int it = 0;
    for (int k = 0;; k++) {
        const int qb = k % NQ;
        query_tile_t qt;
        const int got = loader_next_tile<BM, BN, NWG>(p, items, ring, k, tid, qt);
        if (got < 0)
            return;
        if (got == 0)
            continue;
        const seq_t &s = qt.s;
        load_tile_e4m3<BM, D>(sQ + qb * QB, (const uint8_t *)p.q.p + row_off(p.q, s, false, qt.blk.h, qt.r0),
                              p.q.ss, s.sq - qt.r0, p.dim, p.aligned, tid);
        cp_async_commit();
        int pending = it; // the query tile's first V not yet transposed
        for (int n = qt.n_lo; n < qt.n_hi; n++, it++) {
            const int st = it % STAGES, c = n * BN;
            if (it >= STAGES)
                mbar_wait(&ring.empty_k[st], (it / STAGES - 1) & 1);
            if (tid == 0) {
                mbar_expect_tx(&ring.full_k[st], KV);
                for (int cb = 0; cb < CB; cb++)
                    tma_load_4d(sK + st * KV + cb * BN * 128, &p.pg.tk, cb * 128, c, qt.hk, qt.blk.b,
                                &ring.full_k[st]);
                uint64_t *bar = &staged[it % NS];
                mbar_expect_tx(bar, KV);
                for (int cb = 0; cb < CB; cb++)
                    tma_load_4d(sVs + (it % NS) * KV + cb * BN * 128, &p.pg.tv, cb * 128, c, qt.hk, qt.blk.b, bar);
                mbar_arrive(bar);
            }
            if (n == qt.n_lo) {
                cp_async_wait<0>();
                fence_async_smem();
                mbar_arrive(&ring.q_full[qb]);
            }
            mbar_arrive(&ring.full_k[st]);
            if (it - pending == kE4m3Lag)
                transpose(pending++);
        }
        while (pending < it)
            transpose(pending++);
    }
}

// The fp8 products of key_tiles (forward_sm90.cuh): P in e4m3 fragments of its own, V^T
// (K-major, transposed by the loader) read from its tile. Descale factors per block of rows
// (fa_cuda_descale.rows): q's of the thread's rows and k's of a tile that shares one (a block
// of a multiple of BN rows) go into the rows' scale; k's that differ within the tile multiply
// the raw scores by column. v's go into P before its rounding, over the tile's largest (vref,
// which O is kept in units of: weights() moves alpha by the ratio of the last tile's to this
// one's), so that P keeps e4m3's range. A tile's factors are fetched while the tile before it
// is worked on: its own, or (by column) PER keys a lane, which the warp then shares through
// shared memory (fac: this warp's BN of k's, then BN of v's).
template <int D, int BN, int BM> struct sm90_products_e4m3 {
    static constexpr int KV = BN * D, NS = BN / 8, PER = BN / 32;
    static_assert(PER == 4, "a lane's keys are one 16-byte store");
    uint32_t pa[BN / 32][4];
    uint32_t dq, dk, dv;
    const fa_cuda_params &p;
    const int b, hk, last, lane; // last: the sequence's last key (0 without keys: block 0 is in range)
    float *const fac;
    const bool kcol, vcol;  // factors by column
    float qf[2];            // q's of rows g and g + 8
    float kn[PER], vn[PER]; // the next tile's: keys c + PER * lane + i by column, else [0] the tile's
    float vt = 1.0f, vref = 0.0f; // v's factor of the tile (by column: its largest), O's unit
    __device__ __forceinline__ sm90_products_e4m3(uint32_t qa, uint32_t ka, uint32_t va, const fa_cuda_params &p_,
                                                  const query_tile_t &qt, int wr0, int g, float *fac_)
        : dq(sw_desc_lo(qa, 16)), dk(sw_desc_lo(ka, 16)), dv(sw_desc_lo(va, 16)), p(p_), b(qt.blk.b), hk(qt.hk),
          last(max(qt.s.sk - 1, 0)), lane(threadIdx.x % 32), fac(fac_), kcol(p_.k_ds.rows % BN != 0),
          vcol(p_.v_ds.rows % BN != 0)
    {
        asm("" : "+r"(dq), "+r"(dk), "+r"(dv));
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            qf[hf] = descale_row(p.q_ds, b, hk, min(wr0 + g + 8 * hf, qt.s.sq - 1));
        fetch(qt.n_lo);
    }
    __device__ __forceinline__ void fetch_one(const fa_cuda_descale &d, bool col, float (&x)[PER], int c)
    {
        if (col) {
#pragma unroll
            for (int i = 0; i < PER; i++)
                x[i] = descale_row(d, b, hk, min(c + PER * lane + i, last));
        } else {
            x[0] = descale_row(d, b, hk, min(c, last)); // 1 without blocks
        }
    }
    __device__ __forceinline__ void fetch(int n)
    {
        fetch_one(p.k_ds, kcol, kn, n * BN);
        fetch_one(p.v_ds, vcol, vn, n * BN);
    }
    __device__ __forceinline__ void s(float (&sf)[BN / 2], int st)
    {
        wg_gemm_e4m3_ss<BN, D, BM, BN>(sf, dq, dk + st * (KV >> 4));
    }
    __device__ __forceinline__ void pv(float (&of)[D / 2], int st)
    {
        wg_gemm_e4m3_rs<D, BN, D>(of, pa, dv + st * (KV >> 4));
    }
    // factors of this thread's columns 8 nt + 2 t, + 1 (by column)
    __device__ __forceinline__ float2 col_pair(const float *f, int nt) const
    {
        return *reinterpret_cast<const float2 *>(f + nt * 8 + 2 * (lane % 4));
    }
    __device__ __forceinline__ void scores(float (&sc)[1][NS][4], int n, float (&rs)[2])
    {
        if (kcol || vcol) { // the warp's lanes are done with the last tile's
            __syncwarp();
            if (kcol)
                *reinterpret_cast<float4 *>(fac + PER * lane) = make_float4(kn[0], kn[1], kn[2], kn[3]);
            if (vcol) {
                *reinterpret_cast<float4 *>(fac + BN + PER * lane) = make_float4(vn[0], vn[1], vn[2], vn[3]);
                vt = fmaxf(fmaxf(vn[0], vn[1]), fmaxf(vn[2], vn[3]));
#pragma unroll
                for (int w = 16; w > 0; w /= 2)
                    vt = fmaxf(vt, __shfl_xor_sync(0xffffffffu, vt, w));
            }
            __syncwarp();
        }
        const float kt = kcol ? 1.0f : kn[0];
        if (!vcol)
            vt = vn[0];
        fetch(n + 1); // past the last tile: clamped to the last key
        if (kcol) {
#pragma unroll
            for (int nt = 0; nt < NS; nt++) {
                const float2 kf = col_pair(fac, nt);
                sc[0][nt][0] *= kf.x, sc[0][nt][1] *= kf.y, sc[0][nt][2] *= kf.x, sc[0][nt][3] *= kf.y;
            }
        }
        rs[0] = qf[0] * kt;
        rs[1] = qf[1] * kt;
    }
    __device__ __forceinline__ void weights(float (&alpha)[1][2], int)
    {
        if (!p.v_ds.rows)
            return;
        const float ratio = vref > 0.0f ? vref / vt : 1.0f;
        alpha[0][0] *= ratio;
        alpha[0][1] *= ratio;
        vref = vt;
    }
    __device__ __forceinline__ void fence_p() { reg_fence(pa); }
    __device__ __forceinline__ void to_p(sm90_rows<D, BN> &r)
    {
        if (vcol) {
            const float inv = 1.0f / vref;
#pragma unroll
            for (int nt = 0; nt < NS; nt++) {
                const float2 vf = col_pair(fac + BN, nt);
                const float w0 = vf.x * inv, w1 = vf.y * inv;
                r.sc[0][nt][0] *= w0, r.sc[0][nt][1] *= w1, r.sc[0][nt][2] *= w0, r.sc[0][nt][3] *= w1;
            }
        }
        to_a_e4m3<BN / 8>(pa, r.sc);
    }
};

// One consumer warpgroup on one query tile, as attend_rows (forward_sm90.cuh) in fp8: the
// factors of q and k folded into the softmax's scale (those per block of rows through gm);
// the rows go out straight from the accumulators, times v's factor.
template <int D, int BN, int NWG, int STAGES, int NQ>
__device__ __forceinline__ void attend_rows_e4m3(const fa_cuda_params &p, const query_tile_t &qt,
                                                 kv_ring<STAGES, NQ> &ring, unsigned char *sQ, unsigned char *sK,
                                                 unsigned char *sVt, float *fac, int wg, int it)
{
    const seq_t &s = qt.s;
    const int b = qt.blk.b, h = qt.blk.h;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wr0 = qt.r0 + wg * 64 + warp * 16; // this warp's first row
    // the factors of q and k folded into the scale in double (their product alone may pass float's range)
    const double qk = (double)descale_at(p.q_ds, b, qt.hk) * descale_at(p.k_ds, b, qt.hk);
    const float cap_in = (float)(p.cap_in * qk), scale_log2 = (float)(p.scale_log2 * qk);
    sm90_rows<D, BN> r;
    init_rows(r);
    sm90_products_e4m3<D, BN, 64 * NWG> gm(smem_addr(sQ) + wg * 64 * 128, smem_addr(sK), smem_addr(sVt), p, qt,
                                           wr0, g, fac + (threadIdx.x / 32) * 2 * BN);
    key_tiles<D, BN, NWG, STAGES, NQ>(p, qt, ring, r, gm, it, wg, wr0, lane, g, t, cap_in, scale_log2);
    // after 1 / sum: their quotient may be subnormal
    const float vd = descale_at(p.v_ds, b, qt.hk) * (p.v_ds.rows ? gm.vref : 1.0f);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const row_out_t out = softmax_out(r.m[0][hf], r.l[0][hf], p.dropout_scale);
        const int i = wr0 + g + hf * 8;
        if (p.lse && t == 0 && i < s.sq)
            p.lse[lse_index(p, s, h, i)] = out.lse;
        if (i >= s.sq)
            continue;
        const int64_t off = row_off(p.o, s, false, h, i);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            const int x = dt * 8 + 2 * t;
            const float lo = r.o[0][dt][2 * hf] * out.inv * vd, hi = r.o[0][dt][2 * hf + 1] * out.inv * vd;
            if (p.o_vec && x < p.dim) { // bf16 rows 16-byte aligned, dim % 8 == 0
                *reinterpret_cast<uint32_t *>((__nv_bfloat16 *)p.o.p + off + x) = pack2<__nv_bfloat16>(lo, hi);
            } else {
                if (x < p.dim)
                    store<__nv_bfloat16>(p.o, off + x, lo);
                if (x + 1 < p.dim)
                    store<__nv_bfloat16>(p.o, off + x + 1, hi);
            }
        }
    }
}

// TMA: K and V by TMA boxes (fixed-length keys, p.pg.tma_rows set), else by row copies.
template <int D, int BN_, int NWG_, int STAGES_, int NQ_, bool TMA> struct sm90_e4m3_mainloop {
    static constexpr int BN = BN_, NWG = NWG_, STAGES = STAGES_, NQ = NQ_, BM = 64 * NWG;
    static constexpr bool TURNS = sm90_turns<D, NWG>;
    static constexpr int STAGING = TMA ? kE4m3Lag + 1 : 2;
    using L = e4m3_smem<BM, BN, D, STAGES, NQ, STAGING>;
    static constexpr size_t smem = L::bytes;
    static_assert(D % 128 == 0 && BN % 32 == 0 && (BN * D) % 1024 == 0, "tiles of whole 128-byte swizzle blocks");
    static_assert(L::bytes + sizeof(kv_ring<STAGES, NQ>) + 64 <= 232448, "within Hopper's 227 KiB a block");
    static __device__ __forceinline__ void load(const fa_cuda_params &p, int items, kv_ring<STAGES, NQ> &ring,
                                                unsigned char *sQ, int tid)
    {
        unsigned char *sK = sQ + NQ * L::q, *sVt = sK + STAGES * L::kv;
        if constexpr (TMA)
            load_tiles_e4m3_tma<D, BN, NWG, STAGES, NQ>(p, items, ring, sQ, sK, sVt, sVt + STAGES * L::kv, tid);
        else
            load_tiles_e4m3<D, BN, NWG, STAGES, NQ>(p, items, ring, sQ, sK, sVt, sVt + STAGES * L::kv, tid);
    }
    static __device__ __forceinline__ void attend(const fa_cuda_params &p, const query_tile_t &qt,
                                                  kv_ring<STAGES, NQ> &ring, unsigned char *sQ, int qb, int wg,
                                                  int it)
    {
        unsigned char *sK = sQ + NQ * L::q;
        float *fac = reinterpret_cast<float *>(sK + (2 * STAGES + STAGING) * L::kv);
        attend_rows_e4m3<D, BN, NWG, STAGES, NQ>(p, qt, ring, sQ + qb * L::q, sK, sK + STAGES * L::kv, fac, wg, it);
    }
};

} // namespace fa
