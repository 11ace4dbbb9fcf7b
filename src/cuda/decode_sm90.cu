// SPDX-License-Identifier: MIT
// The decode kernel on Hopper: paged.cu's split-KV decode (decode_warp's steps, the same splits
// and merge) fed by a loading warpgroup. The block's ring holds STAGES stages of 64 keys, and
// the four consumer warps take a 16-key quarter of every stage each. Two shapes, the same six
// stages of ring a multiprocessor and the same bits: 3 stages with 2 blocks a multiprocessor,
// and 2 stages with 3 (one query row group, NQ = 1, pages by TMA boxes; the loader gives the
// consumers all but 40 of its registers by setmaxnreg) for grids of at least
// p.decode_wide_min blocks, where the third block keeps the multiprocessor reading while
// another starts or merges (0.88 -> 0.95x cuDNN at b32 kv32k on the H200; grids under two
// waves of 3 lose, docs/perf/h200-decode.md):
//   loaders:   where the pages suit TMA boxes (p.a.pg.tma_rows: a page size of 8-64 dividing 64,
//              or a multiple of 64; fixed-length dense keys), the first warp issues a stage's
//              boxes (whole pages, K and V, 128-byte swizzled as the Hopper forward's tiles) and
//              every thread copies its rows of a last page in part by cp.async. Otherwise
//              thread c (0..127) owns row c % 64 of K (c < 64) or of V: it looks the row's page
//              up and copies the row by the bulk copy engine or, outside the split or on an
//              absent page, writes it as zeros (padded rows; columns from dim to D zeroed once).
//              Either way after waiting for empty[st], the bytes announced on full[st], and
//              each thread arrives there;
//   consumers: wait for full[st], take their quarter's step, arrive on empty[st].
// The row copies need one copying thread a row: a warp's copies issue one lane after another,
// so a single loading warp held the H200 at 0.9 TB/s a block and four reach 4 TB/s with two
// blocks a multiprocessor (docs/perf/h200-decode.md). Rows are whole 16-byte chunks (kv_aligned).
#include "cuda.h"
#include "paged.cuh"
#include "wgmma.cuh"

namespace fa {
namespace {

template <int D, int NQ, int STAGES, bool TMA> struct d90shape {
    static constexpr int BM = 8 * NQ;                    // packed rows per block
    static constexpr int SK = FA_CUDA_DECODE_SM90_KEYS;  // keys a stage: 16 per consumer warp
    static constexpr int LDS = TMA ? D : lds<D>();       // elements a ring row (TMA: swizzled, unpadded)
    static constexpr int STAGE = SK * LDS * 2;           // elements of a stage: K rows, then V rows
    static constexpr int RING = STAGES * STAGE * 2;      // bytes of the ring (1024-byte aligned)
    static constexpr int Q = BM * lds<D>() * 2;          // bytes of Q
    static constexpr int BARS = 128;                     // full[STAGES], empty[STAGES]
    static constexpr int BLOCKS = STAGES == 2 ? 3 : 2;   // blocks a multiprocessor
    static constexpr int LAUNCHED = 65536 / (256 * BLOCKS) / 8 * 8; // registers a thread at launch
    static constexpr int LOADER_REGS = 40;               // 3 blocks: the loader's after setmaxnreg
    static constexpr int CONSUMER_REGS = (2 * LAUNCHED - LOADER_REGS) / 8 * 8;
    static_assert(STAGES == 2 || STAGES == 3, "the two shapes");
    static_assert(LOADER_REGS + CONSUMER_REGS <= 2 * LAUNCHED && CONSUMER_REGS <= 256,
                  "the warpgroups' registers within what the block was launched with");
    static constexpr int BYTES = 1024 + RING + Q + BARS; // + alignment slack
    static_assert(BLOCKS * (BYTES + 1024) <= 233472, "the blocks' shared memory fits a multiprocessor");
    static_assert(4 * BM * (D + 2) * 4 <= RING + Q, "the merge's state fits in the ring and Q");
    static_assert(STAGES * 16 <= BARS, "barriers");
    static_assert(!TMA || (SK * D * 2) % 1024 == 0, "every swizzled K and V tile 1024-byte aligned");
};

// A warp's 16 keys of a swizzled stage tile (sw_offset, SK rows a column block) from row r0.
template <typename T, int PITCH> struct swizzled_rows {
    using elem = T;
    const unsigned char *tile;
    int r0;
    __device__ __forceinline__ const T *at(int r, int col) const
    {
        return reinterpret_cast<const T *>(tile + sw_offset(r0 + r, col, PITCH));
    }
};

template <typename T, int D, int NQ, int STAGES, bool TMA>
__global__ void __launch_bounds__(256, STAGES == 2 ? 3 : 2) decode_sm90_kernel(const __grid_constant__ fa_cuda_paged p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = d90shape<D, NQ, STAGES, TMA>;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char *smem = align1024(smem_raw);
    T *ring = reinterpret_cast<T *>(smem), *sQ = reinterpret_cast<T *>(smem + S::RING);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + S::RING + S::Q), *empty = full + STAGES;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    pdl_wait(); // everything read here (lengths, tables, q, pages) written by earlier kernels
    pdl_release();
    const split_block_t blk = split_block(p, S::BM);
    if (!blk.ok)
        return;
    const pseq_t &s = blk.s;
    const mask_t &mk = blk.mk;
    const int g = blk.g, split = blk.split, nsplit = blk.nsplit, rows = blk.rows, row0 = blk.row0;
    const int vr1 = blk.vr1, k_lo = blk.k_lo, k_hi = blk.k_hi; // valid rows [row0, vr1): the rest have zero Q
    const int t_lo = k_lo / S::SK, ntiles = k_hi > k_lo ? (k_hi + S::SK - 1) / S::SK - t_lo : 0;
    const int drop = drop_ordering(p.a, FA_DROP_DECODE); // a test build's check that both waits below are needed

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; i++) {
            mbar_init(&full[i], 128);
            mbar_init(&empty[i], 4);
        }
        fence_mbar_init();
    }
    if (!TMA && p.a.dim < D) // columns no copy writes: zero, so that K's meet Q's zeros as zeros
        for (int x = threadIdx.x; x < STAGES * 2 * S::SK * (D - p.a.dim); x += blockDim.x) {
            const int r = x / (D - p.a.dim), e = p.a.dim + x % (D - p.a.dim);
            ring[r * S::LDS + e] = from_float<T>(0.0f);
        }
    __syncthreads();

    if constexpr (S::BLOCKS == 3) { // launched with 80 registers a thread: the consumers take 120
        if (warp >= 4)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::LOADER_REGS));
        else
            asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::CONSUMER_REGS));
    }
    if (warp >= 4 && TMA) { // the loading warpgroup: whole pages by TMA boxes
        const int c = threadIdx.x - 128;
        const fa_cuda_pages &pg = p.a.pg;
        const bool paged = pg.table != nullptr; // else sequence b is page b, its tail past the map zeros
        int first[STAGES]; // the first stages' table entries, read at once (later ones wait with the ring)
#pragma unroll
        for (int i = 0; i < STAGES; i++)
            first[i] = paged && i < ntiles ? tma_piece_entry<S::SK, D>(pg, s.b, (t_lo + i) * S::SK, s.keys, c) : -1;
        for (int it = 0; it < ntiles; it++) {
            const int st = it % STAGES, key = (t_lo + it) * S::SK, valid = paged ? s.keys - key : S::SK;
            int entry = first[0];
#pragma unroll
            for (int i = 1; i < STAGES; i++)
                entry = it == i ? first[i] : entry;
            if (it >= STAGES)
                entry = paged ? tma_piece_entry<S::SK, D>(pg, s.b, key, s.keys, c) : 0;
            const int page = paged ? tma_piece_run<S::SK, D>(pg, key, s.keys, c, entry) : (int)s.at.k_base;
            if (it >= STAGES && !(drop & 1))
                mbar_wait(&empty[st], (it / STAGES - 1) & 1);
            fence_async_smem(); // the consumers' reads before the copies' writes
            unsigned char *tile = reinterpret_cast<unsigned char *>(ring + st * S::STAGE);
            bool rest = load_tile_tma<T, S::SK, D>(tile, &pg.tk, pg, page, s.b, g, (const T *)p.a.k.p, pg.k_sp,
                                                   pg.k_st, g * p.a.k.sh, key, valid, p.a.dim, &full[st], c);
            rest |= load_tile_tma<T, S::SK, D>(tile + S::SK * D * 2, &pg.tv, pg, page, s.b, g, (const T *)p.a.v.p,
                                               pg.v_sp, pg.v_st, g * p.a.v.sh, key, valid, p.a.dim, &full[st], c);
            if (rest) { // a last page in part: its rows by cp.async, landed before the arrival
                cp_async_commit();
                cp_async_wait<0>();
                fence_async_smem();
            }
            mbar_arrive(&full[st]);
        }
        return;
    }
    if (warp >= 4) { // the loading warpgroup: thread c copies row c % 64 of K (c < 64) or V
        const int c = threadIdx.x - 128, r = c % S::SK, bytes = p.a.dim * (int)sizeof(T);
        const bool is_k = c < S::SK;
        const T *pool = is_k ? (const T *)p.a.k.p : (const T *)p.a.v.p;
        const int64_t sp = is_k ? p.a.pg.k_sp : p.a.pg.v_sp, stt = is_k ? p.a.pg.k_st : p.a.pg.v_st;
        const int64_t sh = is_k ? p.a.k.sh : p.a.v.sh;
        for (int it = 0; it < ntiles; it++) {
            const int st = it % STAGES, j = (t_lo + it) * S::SK + r;
            const int64_t off = j >= k_lo && j < k_hi ? slot_off(kv_slot(p, s, j), g, sp, stt, sh) : -1;
            if (it >= STAGES && !(drop & 1))
                mbar_wait(&empty[st], (it / STAGES - 1) & 1);
            fence_async_smem(); // the consumers' reads and earlier zeros before the copy's write
            T *dst = ring + st * S::STAGE + (is_k ? 0 : S::SK * S::LDS) + r * S::LDS;
            if (off >= 0) {
                mbar_expect_tx(&full[st], bytes);
                bulk_load(dst, pool + off, bytes, &full[st]);
            } else {
                for (int e = 0; e < D; e += 8)
                    *reinterpret_cast<uint4 *>(dst + e) = make_uint4(0, 0, 0, 0);
            }
            mbar_arrive(&full[st]);
        }
        return;
    }

    load_q<T, D, S::BM>(p, s, sQ, row0, rows, g);
    named_barrier(1, 128);
    decode_warp<D, NQ> w;
    w.init(sQ, lane);
    for (int it = 0; it < ntiles; it++) {
        const int st = it % STAGES, j0 = (t_lo + it) * S::SK + warp * 16;
        if (!(drop & 2))
            mbar_wait(&full[st], (it / STAGES) & 1);
        if (drop & 5) // slow consumers, as a busy multiprocessor may have: loaders without their
            __nanosleep(10000); // empty waits then run a ring's length ahead of the reads
        if (j0 + 16 > k_lo && j0 < k_hi) {
            const T *tK = ring + st * S::STAGE;
            if constexpr (TMA) {
                using rows_t = swizzled_rows<T, S::SK>;
                const unsigned char *k8 = reinterpret_cast<const unsigned char *>(tK);
                w.step(p.a, mk, rows_t{ k8, warp * 16 }, rows_t{ k8 + S::SK * D * 2, warp * 16 }, j0, k_lo, k_hi,
                       row0, vr1, lane);
            } else {
                using rows_t = padded_rows<T, S::LDS>;
                tK += warp * 16 * S::LDS;
                w.step(p.a, mk, rows_t{ tK }, rows_t{ tK + S::SK * S::LDS }, j0, k_lo, k_hi, row0, vr1, lane);
            }
        }
        __syncwarp();
        if (lane == 0)
            mbar_arrive(&empty[st]);
    }
    named_barrier(1, 128); // the ring and Q become the merge's state
    float *state = reinterpret_cast<float *>(smem);
    w.store(state, warp, lane);
    named_barrier(1, 128);
    merge_out<T, D, S::BM, 4>(p, s, state, row0, rows, g, split, nsplit);
#endif
}

// The grid: a block per (sequence, kv head, split) and group of 8 * nq packed query rows.
dim3 decode_grid(const fa_cuda_paged &p, int nq)
{
    const int qblocks = (p.a.max_q * p.a.group + 8 * nq - 1) / (8 * nq);
    return dim3((unsigned)(p.a.batch * p.a.heads_kv * p.max_splits), (unsigned)(qblocks > 0 ? qblocks : 1));
}

template <typename T, int D, int NQ, int STAGES> cudaError_t launch(const fa_cuda_paged &p, cudaStream_t stream)
{
    const dim3 grid = decode_grid(p, NQ);
    auto go = [&](auto kernel, int bytes) {
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (err != cudaSuccess)
            return err;
        return launch_dependent(kernel, grid, dim3(256), bytes, stream, p.pdl, p);
    };
    if (p.a.pg.tma_rows)
        return go(decode_sm90_kernel<T, D, NQ, STAGES, true>, d90shape<D, NQ, STAGES, true>::BYTES);
    return go(decode_sm90_kernel<T, D, NQ, STAGES, false>, d90shape<D, NQ, STAGES, false>::BYTES);
}

template <typename T> cudaError_t decode_for(const fa_cuda_paged &p, int dpad, int nq, cudaStream_t stream)
{
    const dim3 grid = decode_grid(p, 1);
    // 3 blocks of 2 stages a multiprocessor: pages by TMA boxes (the loader the trial measured)
    const bool wide = nq == 1 && p.a.pg.tma_rows && (int64_t)grid.x * grid.y >= p.decode_wide_min;
    switch (dpad * 4 + nq) {
    case 64 * 4 + 1: return wide ? launch<T, 64, 1, 2>(p, stream) : launch<T, 64, 1, 3>(p, stream);
    case 64 * 4 + 2: return launch<T, 64, 2, 3>(p, stream);
    case 128 * 4 + 1: return wide ? launch<T, 128, 1, 2>(p, stream) : launch<T, 128, 1, 3>(p, stream);
    case 128 * 4 + 2: return launch<T, 128, 2, 3>(p, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace
} // namespace fa

extern "C" cudaError_t fa_cuda_decode_sm90(const fa_cuda_paged *p, int bf16, int dpad, int nq, cudaStream_t stream)
{
    return bf16 ? fa::decode_for<__nv_bfloat16>(*p, dpad, nq, stream) : fa::decode_for<__half>(*p, dpad, nq, stream);
}
