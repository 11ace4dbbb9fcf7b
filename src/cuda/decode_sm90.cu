// SPDX-License-Identifier: MIT
// The decode kernel on Hopper: paged.cu's split-KV decode (decode_warp's steps, the same splits
// and merge) fed by a loading warpgroup. The block's ring holds STAGES stages of 64 keys, whose
// K and V rows arrive by the bulk copy engine, one copy a row wherever its page is, and the four
// consumer warps take a 16-key quarter of every stage each:
//   loaders:   thread c (0..127) owns row c % 64 of K (c < 64) or of V: it looks the row's page
//              up, waits for empty[st], and copies the row (its bytes announced on full[st]) or,
//              outside the split or on an absent page, writes it as zeros; then it arrives;
//   consumers: wait for full[st], take their quarter's step, arrive on empty[st].
// One copying thread a row matters: a warp's copies issue one lane after another, so a single
// loading warp held the H200 at 0.9 TB/s a block and four reach 4 TB/s with two blocks a
// multiprocessor (docs/perf/h200-decode.md). Rows are whole 16-byte chunks (kv_aligned);
// columns from dim to D are zeroed once.
#include "cuda.h"
#include "paged.cuh"
#include "wgmma.cuh"

namespace fa {
namespace {

template <int D, int NQ, int STAGES> struct d90shape {
    static constexpr int BM = 8 * NQ;                    // packed rows per block
    static constexpr int SK = 64;                        // keys a stage: 16 per consumer warp
    static constexpr int LDS = lds<D>();                 // elements a shared row
    static constexpr int BARS = 128;                     // full[STAGES], empty[STAGES]
    static constexpr int Q = BM * LDS * 2;               // bytes of Q
    static constexpr int STAGE = SK * LDS * 2;           // elements of a stage: K rows, then V rows
    static constexpr int BYTES = BARS + Q + STAGES * STAGE * 2;
    static_assert(4 * BM * (D + 2) * 4 <= Q + STAGES * STAGE * 2, "the merge's state fits in Q and the ring");
    static_assert(STAGES * 16 <= BARS, "barriers");
};

template <typename T, int D, int NQ, int STAGES>
__global__ void __launch_bounds__(256, 2) decode_sm90_kernel(const fa_cuda_paged p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = d90shape<D, NQ, STAGES>;
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + STAGES;
    T *sQ = reinterpret_cast<T *>(smem + S::BARS), *ring = reinterpret_cast<T *>(smem + S::BARS + S::Q);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const split_block_t blk = split_block(p, S::BM);
    if (!blk.ok)
        return;
    const pseq_t &s = blk.s;
    const mask_t &mk = blk.mk;
    const int g = blk.g, split = blk.split, nsplit = blk.nsplit, rows = blk.rows, row0 = blk.row0;
    const int vr1 = blk.vr1, k_lo = blk.k_lo, k_hi = blk.k_hi; // valid rows [row0, vr1): the rest have zero Q
    const int t_lo = k_lo / S::SK, ntiles = k_hi > k_lo ? (k_hi + S::SK - 1) / S::SK - t_lo : 0;
#ifdef FA_CUDA_ORDERING_TEST
    const int drop = p.drop_ordering; // a test build's check that both waits below are needed
#else
    constexpr int drop = 0;
#endif

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; i++) {
            mbar_init(&full[i], 128);
            mbar_init(&empty[i], 4);
        }
        fence_mbar_init();
    }
    if (p.a.dim < D) // columns no copy writes: zero, so that K's meet Q's zeros as zeros
        for (int x = threadIdx.x; x < STAGES * 2 * S::SK * (D - p.a.dim); x += blockDim.x) {
            const int r = x / (D - p.a.dim), e = p.a.dim + x % (D - p.a.dim);
            ring[r * S::LDS + e] = from_float<T>(0.0f);
        }
    __syncthreads();

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
        if (drop & 1) // slow consumers, as a busy multiprocessor may have: loaders without their
            __nanosleep(10000); // empty waits then run a ring's length ahead of the reads
        if (j0 + 16 > k_lo && j0 < k_hi) {
            const T *tK = ring + st * S::STAGE + warp * 16 * S::LDS;
            w.step(p.a, mk, tK, tK + S::SK * S::LDS, j0, k_lo, k_hi, row0, vr1, lane);
        }
        __syncwarp();
        if (lane == 0)
            mbar_arrive(&empty[st]);
    }
    named_barrier(1, 128); // Q and the ring become the merge's state
    float *state = reinterpret_cast<float *>(smem + S::BARS);
    w.store(state, warp, lane);
    named_barrier(1, 128);
    merge_out<T, D, S::BM, 4>(p, s, state, row0, rows, g, split, nsplit);
#endif
}

template <typename T, int D, int NQ, int STAGES> cudaError_t launch(const fa_cuda_paged &p, cudaStream_t stream)
{
    using S = d90shape<D, NQ, STAGES>;
    auto kernel = decode_sm90_kernel<T, D, NQ, STAGES>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::BYTES);
    if (err != cudaSuccess)
        return err;
    const int qblocks = (p.a.max_q * p.a.group + S::BM - 1) / S::BM;
    const dim3 grid((unsigned)(p.a.batch * p.a.heads_kv * p.max_splits), (unsigned)(qblocks > 0 ? qblocks : 1));
    kernel<<<grid, 256, S::BYTES, stream>>>(p);
    return cudaGetLastError();
}

template <typename T> cudaError_t decode_for(const fa_cuda_paged &p, int dpad, int nq, cudaStream_t stream)
{
    switch (dpad * 4 + nq) {
    case 64 * 4 + 1: return launch<T, 64, 1, 3>(p, stream);
    case 64 * 4 + 2: return launch<T, 64, 2, 3>(p, stream);
    case 128 * 4 + 1: return launch<T, 128, 1, 3>(p, stream);
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
