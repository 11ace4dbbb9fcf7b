// SPDX-License-Identifier: MIT
// Hopper's warpgroup matrix instructions (sm_90a): wgmma.mma_async m64nNk16 with fp32
// accumulators, shared-memory matrix descriptors over 128-byte-swizzled tiles, and the
// cp.async loader that writes tiles in that layout. Only compiled into the sm_90a image.
#pragma once

#include "tile.cuh"

namespace fa {

// A tile of D-element rows (2 bytes each) in shared memory, 128-byte swizzled: D / 64 column
// blocks of PITCH rows x 128 bytes, one after the other; in each, row r's 16-byte chunk c
// sits at chunk c ^ (r % 8). The tile base is 1024-byte aligned (the swizzle's period).
__device__ __forceinline__ int sw_offset(int r, int col, int pitch)
{
    return (col / 64) * pitch * 128 + r * 128 + ((((col % 64) / 8) ^ (r & 7)) << 4) + (col % 8) * 2;
}
template <int PITCH> __device__ __forceinline__ int sw_offset(int r, int col)
{
    return sw_offset(r, col, PITCH);
}
// The same in the grouped layout of a key tile (fa_cuda_pages.grouped): 8-row groups of CB
// column blocks each, [row group][column block][8 rows][128 bytes].
template <int CB> __device__ __forceinline__ int sw_offset_grouped(int r, int col)
{
    return ((r / 8) * CB + col / 64) * 1024 + (r % 8) * 128 + ((((col % 64) / 8) ^ (r & 7)) << 4) + (col % 8) * 2;
}

// ROWS x D tile of a strided [seq, head_dim] slab into the swizzled layout (column blocks
// pitch rows apart; s may point at a later row of the tile, 8-row aligned). Rows >= valid_rows
// and columns >= dim read as zero. Threads tid = 0 .. NT-1 take part.
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_sw(unsigned char *s, const T *g, int64_t row_stride,
                                             int valid_rows, int dim, bool aligned, int tid,
                                             int pitch = ROWS)
{
    constexpr int CHUNKS = D / 8, RP = NT / CHUNKS; // rows per pass
    static_assert(NT % CHUNKS == 0, "a thread keeps its column");
    if (aligned) {
        // thread tid copies column chunk tid % CHUNKS of rows tid / CHUNKS + k RP (the swizzle
        // phase is the same every pass when RP is a multiple of 8)
        const int col = (tid % CHUNKS) * 8, r0 = tid / CHUNKS;
        unsigned char *d = s + sw_offset(r0, col, pitch);
        const T *src = g + r0 * row_stride + col;
        const bool col_ok = col < dim;
#pragma unroll 4
        for (int r = r0; r < ROWS; r += RP, d += RP * 128, src += RP * row_stride) {
            const bool ok = col_ok && r < valid_rows;
            cp_async16(RP % 8 == 0 ? d : s + sw_offset(r, col, pitch), ok ? src : g, ok ? 16 : 0);
        }
    } else {
        for (int c = tid; c < ROWS * CHUNKS; c += NT) {
            const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
            T *dst = reinterpret_cast<T *>(s + sw_offset(r, col, pitch));
#pragma unroll
            for (int e = 0; e < 8; e++)
                dst[e] = (r < valid_rows && col + e < dim) ? g[r * row_stride + col + e]
                                                           : from_float<T>(0.0f);
        }
    }
}

// The same tile from a paged cache (16-byte aligned rows): row r is key key0 + r, in the page
// the table names in pages[r] (shared memory) at pool + page * sp + slot * st + head; rows >=
// valid_rows, of pages not in the pool or columns >= dim read as zero.
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_paged(unsigned char *s, const fa_cuda_pages &g, const int *pages,
                                                const T *pool, int64_t sp, int64_t st, int64_t head, int key0,
                                                int valid_rows, int dim, int tid)
{
    constexpr int CHUNKS = D / 8, RP = NT / CHUNKS;
    static_assert(NT % CHUNKS == 0, "a thread keeps its column");
    const int col = (tid % CHUNKS) * 8, r0 = tid / CHUNKS;
    const bool col_ok = col < dim;
#pragma unroll 4
    for (int r = r0; r < ROWS; r += RP) {
        const int page = pages[r];
        const bool ok = col_ok && r < valid_rows && page_ok(g, page);
        cp_async16(s + sw_offset(r, col, ROWS), ok ? pool + page * sp + slot_in_page(g, key0 + r) * st + head + col : pool,
                   ok ? 16 : 0);
    }
}

// p advanced to the next 1024-byte boundary of the shared window; an offset from p (not an
// integer round trip through uintptr_t) so that the compiler still knows the result is shared memory (LDS, not
// generic loads).
__device__ __forceinline__ unsigned char *align1024(unsigned char *p)
{
    return p + ((1024 - (smem_addr(p) & 1023)) & 1023);
}

// Matrix descriptor of a 128-byte-swizzled operand at shared address addr: lbo is the byte
// distance between 64-element column blocks (used by MN-major operands only), the 8-row
// groups are 1024 bytes apart. The low word holds the address (bits 0-13, in 16-byte units)
// and lbo; the high word is the same for every operand.
constexpr uint32_t kSwDescHi = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t sw_desc_lo(uint32_t addr, uint32_t lbo)
{
    return ((addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16);
}
// The descriptor of the operand bytes past the one whose low word is lo. A shared address
// stays below 2^18, so the address field takes the sum without carrying into lbo: one add
// per product instead of rebuilding the descriptor.
__device__ __forceinline__ uint64_t sw_desc_at(uint32_t lo, uint32_t bytes)
{
    return ((uint64_t)kSwDescHi << 32) | (lo + (bytes >> 4));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy shared-memory writes made visible to the tensor cores' async proxy.
__device__ __forceinline__ void fence_async_smem()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keep the compiler from moving accesses of registers an in-flight wgmma owns across the
// issue or the wait.
template <int N> __device__ __forceinline__ void reg_fence(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&a)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+r"(a[i][e])::"memory");
}

#define FA_F8(d, i)                                                                             \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define FA_F16(d) FA_F8(d, 0), FA_F8(d, 8)
#define FA_F32(d) FA_F16(d), FA_F8(d, 16), FA_F8(d, 24)
#define FA_F64(d) FA_F32(d), FA_F8(d, 32), FA_F8(d, 40), FA_F8(d, 48), FA_F8(d, 56)
#define FA_F128(d) FA_F64(d), FA_F8(d, 64), FA_F8(d, 72), FA_F8(d, 80), FA_F8(d, 88), FA_F8(d, 96), FA_F8(d, 104), \
    FA_F8(d, 112), FA_F8(d, 120)
#define FA_R16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define FA_R32                                                                                  \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
    "%25,%26,%27,%28,%29,%30,%31}"
#define FA_R64                                                                                  \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
    "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"   \
    "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

#define FA_R128 \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
    "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70," \
    "%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93," \
    "%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112," \
    "%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
// D[64 x N] (+)= A * B for one warpgroup. ss: A and B K-major in shared memory (S = Q K^T);
// ss<1>: B MN-major (transposed) instead; ss<1, 1>: A as well.
// rs: A in registers as mma.sync-style fragments, B MN-major in shared memory (O += P V).
// scale_d 0 overwrites D. The accumulator fragment is mma.sync's m16n8 layout per warp:
// d[4 j + e] is row 16 warp + g + 8 (e / 2), column 8 j + 2 t + (e % 2).
template <typename T, int N> struct wgmma;

#define FA_WGMMA(TYPE, PTX, N, RN, FN, A0, A1, A2, A3, A4, A5)                                       \
    template <> struct wgmma<TYPE, N> {                                                             \
        template <int TB = 0, int TA = 0>                                                           \
        static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t da, uint64_t db, int sc) \
        {                                                                                           \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #A2 ", 0;\n"                          \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " " RN     \
                         ", %" #A0 ", %" #A1 ", p, 1, 1, %" #A4 ", %" #A3 ";\n}\n"                \
                         : FN(d)                                                                    \
                         : "l"(da), "l"(db), "r"(sc), "n"(TB), "n"(TA));                            \
        }                                                                                           \
        static __device__ __forceinline__ void rs(float (&d)[N / 2], const uint32_t (&a)[4],        \
                                                  uint64_t db, int sc)                              \
        {                                                                                           \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #A5 ", 0;\n"                          \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " " RN     \
                         ", {%" #A0 ",%" #A1 ",%" #A2 ",%" #A3 "}, %" #A4 ", p, 1, 1, 1;\n}\n"    \
                         : FN(d)                                                                    \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(sc));           \
        }                                                                                           \
    };
FA_WGMMA(__half, "f16", 32, FA_R16, FA_F16, 16, 17, 18, 19, 20, 21)
FA_WGMMA(__nv_bfloat16, "bf16", 32, FA_R16, FA_F16, 16, 17, 18, 19, 20, 21)
FA_WGMMA(__half, "f16", 64, FA_R32, FA_F32, 32, 33, 34, 35, 36, 37)
FA_WGMMA(__half, "f16", 128, FA_R64, FA_F64, 64, 65, 66, 67, 68, 69)
FA_WGMMA(__nv_bfloat16, "bf16", 64, FA_R32, FA_F32, 32, 33, 34, 35, 36, 37)
FA_WGMMA(__nv_bfloat16, "bf16", 128, FA_R64, FA_F64, 64, 65, 66, 67, 68, 69)
FA_WGMMA(__half, "f16", 256, FA_R128, FA_F128, 128, 129, 130, 131, 132, 133)
FA_WGMMA(__nv_bfloat16, "bf16", 256, FA_R128, FA_F128, 128, 129, 130, 131, 132, 133)
#undef FA_WGMMA

// The same for fp8 (e4m3) operands, k32 a step: both K-major (fp8 takes no transposed
// operand), A from shared memory (ss) or registers (rs: 16 elements a thread, mma.sync's
// m16n8k32 layout per warp: a[0] row g columns 4t..4t+3, a[1] row g + 8, a[2] and a[3] the
// same 16 columns on).
template <int N> struct wgmma_e4m3;
#define FA_WGMMA_E4M3(N, RN, FN, A0, A1, A2, A3, A4, A5)                                              \
    template <> struct wgmma_e4m3<N> {                                                               \
        static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t da, uint64_t db, int sc) \
        {                                                                                            \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #A2 ", 0;\n"                           \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " RN               \
                         ", %" #A0 ", %" #A1 ", p, 1, 1;\n}\n"                                        \
                         : FN(d)                                                                     \
                         : "l"(da), "l"(db), "r"(sc));                                               \
        }                                                                                            \
        static __device__ __forceinline__ void rs(float (&d)[N / 2], const uint32_t (&a)[4],         \
                                                  uint64_t db, int sc)                               \
        {                                                                                            \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #A5 ", 0;\n"                           \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " RN               \
                         ", {%" #A0 ",%" #A1 ",%" #A2 ",%" #A3 "}, %" #A4 ", p, 1, 1;\n}\n"          \
                         : FN(d)                                                                     \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(sc));            \
        }                                                                                            \
    };
FA_WGMMA_E4M3(128, FA_R64, FA_F64, 64, 65, 66, 67, 68, 69)
#undef FA_WGMMA_E4M3
#undef FA_F8
#undef FA_F16
#undef FA_F32
#undef FA_R16
#undef FA_F64
#undef FA_R32
#undef FA_R64
#undef FA_F128
#undef FA_R128

// Warpgroup products, each committed as one wgmma group. nt: acc[64 x N] = A B^T with A
// (64 rows from address a, in a tile of AP rows) and B (N rows from b, in a tile of BP rows,
// N unless given) both K-major, K = D deep. rn: acc[64 x N] += A B with A in registers (K = KP deep) and B
// an MN-major tile of KP rows x N columns from b (column blocks KP * 128 bytes apart).
// The _d forms take the operands' descriptor low words (sw_desc_lo: lbo 16 for K-major
// operands, KP * 128 for rn's B), for loops that build them once.
template <typename T, int D, int AP, int N, int BP = N>
__device__ __forceinline__ void wg_gemm_nt_d(float (&acc)[N / 2], uint32_t da, uint32_t db)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma<T, N>::ss(acc, sw_desc_at(da, (kk / 4) * AP * 128 + (kk % 4) * 32),
                        sw_desc_at(db, (kk / 4) * BP * 128 + (kk % 4) * 32), kk > 0);
    wgmma_commit();
}
template <typename T, int D, int AP, int N, int BP = N>
__device__ __forceinline__ void wg_gemm_nt(float (&acc)[N / 2], uint32_t a, uint32_t b)
{
    wg_gemm_nt_d<T, D, AP, N, BP>(acc, sw_desc_lo(a, 16), sw_desc_lo(b, 16));
}
template <typename T, int N, int KP>
__device__ __forceinline__ void wg_gemm_rn_d(float (&acc)[N / 2], const uint32_t (&a)[KP / 16][4], uint32_t db)
{
#pragma unroll
    for (int kk = 0; kk < KP / 16; kk++)
        wgmma<T, N>::rs(acc, a[kk], sw_desc_at(db, kk * 2048), 1);
    wgmma_commit();
}
template <typename T, int N, int KP>
__device__ __forceinline__ void wg_gemm_rn(float (&acc)[N / 2], const uint32_t (&a)[KP / 16][4], uint32_t b)
{
    wg_gemm_rn_d<T, N, KP>(acc, a, sw_desc_lo(b, KP * 128));
}

// A K/V tile's shared layout as the attention products read it (the Hopper forward's): the
// B descriptors' high word (its 8-row groups' distance), a 64-column block's distance and a
// 16-row step's, both in 16-byte units. Column blocks of BN rows (the default), or grouped
// (fa_cuda_pages.grouped: an 8-row group's column blocks side by side).
struct kv_layout {
    uint32_t hi, cb16, step16;
};
template <int BN, int D> __device__ __forceinline__ kv_layout kv_layout_of(bool grouped)
{
    constexpr uint32_t CB = D / 64, sbo = 1024 * CB;
    return grouped ? kv_layout{ (sbo >> 4) | (1u << 30), 1024 >> 4, (2 * sbo) >> 4 }
                   : kv_layout{ kSwDescHi, (BN * 128) >> 4, 2048 >> 4 };
}
__device__ __forceinline__ uint64_t kv_desc(const kv_layout &l, uint32_t lo)
{
    return ((uint64_t)l.hi << 32) | lo;
}
// wg_gemm_nt_d with B a K tile of layout l (db: its K-major descriptor word, sw_desc_lo(k, 16)).
template <typename T, int D, int AP, int N>
__device__ __forceinline__ void wg_gemm_nt_kv(float (&acc)[N / 2], uint32_t da, uint32_t db, const kv_layout &l)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma<T, N>::ss(acc, sw_desc_at(da, (kk / 4) * AP * 128 + (kk % 4) * 32),
                        kv_desc(l, db + (kk / 4) * l.cb16 + (kk % 4) * 2), kk > 0);
    wgmma_commit();
}
// wg_gemm_rn_d with B a V tile of layout l (db: its MN-major descriptor word, sw_desc_lo(v,
// l.cb16 << 4)).
template <typename T, int N, int KP>
__device__ __forceinline__ void wg_gemm_rn_kv(float (&acc)[N / 2], const uint32_t (&a)[KP / 16][4], uint32_t db,
                                              const kv_layout &l)
{
#pragma unroll
    for (int kk = 0; kk < KP / 16; kk++)
        wgmma<T, N>::rs(acc, a[kk], kv_desc(l, db + kk * l.step16), 1);
    wgmma_commit();
}

// acc[64 x N] = A B with A K-major (64 rows from address a, in a tile of AP rows, K = KP
// deep) and B an MN-major tile of KP rows x N columns from b (column blocks BP * 128 bytes
// apart): dQ = dS K with dS and K both in shared memory.
template <typename T, int N, int KP, int AP, int BP>
__device__ __forceinline__ void wg_gemm_sn(float (&acc)[N / 2], uint32_t a, uint32_t b)
{
    const uint32_t da = sw_desc_lo(a, 16), db = sw_desc_lo(b, BP * 128);
#pragma unroll
    for (int kk = 0; kk < KP / 16; kk++)
        wgmma<T, N>::template ss<1>(acc, sw_desc_at(da, (kk / 4) * AP * 128 + (kk % 4) * 32),
                                    sw_desc_at(db, kk * 2048), kk > 0);
    wgmma_commit();
}

// acc[64 x N] += A B with A MN-major (A^T stored: a tile of KP rows x 64 columns from a) and
// B an MN-major tile of KP rows x N columns from b (column blocks BP * 128 bytes apart):
// dV += P^T dO with P stored query-major.
template <typename T, int N, int KP, int BP>
__device__ __forceinline__ void wg_gemm_mn(float (&acc)[N / 2], uint32_t a, uint32_t b)
{
    const uint32_t da = sw_desc_lo(a, KP * 128), db = sw_desc_lo(b, BP * 128);
#pragma unroll
    for (int kk = 0; kk < KP / 16; kk++)
        wgmma<T, N>::template ss<1, 1>(acc, sw_desc_at(da, kk * 2048), sw_desc_at(db, kk * 2048), 1);
    wgmma_commit();
}

// fp8: acc[64 x N] (+)= A B^T with B K-major (N rows of KB bytes at descriptor word db,
// sw_desc_lo(b, 16); 128-byte column blocks NP * 128 bytes apart) and A K-major in shared
// memory (64 rows at da, column blocks AP * 128 bytes apart; acc overwritten) or in registers
// (a[KB / 32], added to acc).
template <int N, int KB, int AP, int NP>
__device__ __forceinline__ void wg_gemm_e4m3_ss(float (&acc)[N / 2], uint32_t da, uint32_t db)
{
#pragma unroll
    for (int kk = 0; kk < KB / 32; kk++)
        wgmma_e4m3<N>::ss(acc, sw_desc_at(da, (kk / 4) * AP * 128 + (kk % 4) * 32),
                          sw_desc_at(db, (kk / 4) * NP * 128 + (kk % 4) * 32), kk > 0);
    wgmma_commit();
}
template <int N, int KB, int NP>
__device__ __forceinline__ void wg_gemm_e4m3_rs(float (&acc)[N / 2], const uint32_t (&a)[KB / 32][4], uint32_t db)
{
#pragma unroll
    for (int kk = 0; kk < KB / 32; kk++)
        wgmma_e4m3<N>::rs(acc, a[kk], sw_desc_at(db, (kk / 4) * NP * 128 + (kk % 4) * 32), 1);
    wgmma_commit();
}

__device__ __forceinline__ void named_barrier(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrive at a named barrier without waiting for it (the producer side of a hand-over).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Device-scope flag handshakes.
__device__ __forceinline__ int ld_acquire(const int *f)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(f) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(int *f, int v)
{
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(f), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_add(int *f, int v)
{
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(f), "r"(v) : "memory");
}

// The tensor memory accelerator's bulk add: bytes (a multiple of 16) of float32 from shared
// memory added into global memory, asynchronously, as one bulk group of the issuing thread.
// bulk_wait_all returns once every group that thread committed has been performed ...
__device__ __forceinline__ void bulk_reduce_add_f32(float *g, uint32_t src, int bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(g),
                 "r"(src), "r"(bytes)
                 : "memory");
}
// The same bytes copied rather than added (the first share of a tile).
__device__ __forceinline__ void bulk_store_f32(float *g, uint32_t src, int bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(g), "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// ... once every such group has finished reading its shared-memory source.
__device__ __forceinline__ void bulk_wait_read_all()
{
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Orders the async proxy's global accesses (bulk copies) with this thread's generic ones.
__device__ __forceinline__ void fence_async_all() { asm volatile("fence.proxy.async;\n" ::: "memory"); }

// bytes (a multiple of 16; both addresses 16-byte aligned) from global to shared memory by the
// bulk copy engine, each landing byte counted off b's transaction count.
__device__ __forceinline__ void bulk_load(void *dst, const void *src, int bytes, uint64_t *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(b))
                 : "memory");
}
// A box of the tensor map at map (a kernel parameter) from coordinates c0..c3 (innermost
// first) into shared memory at dst (1024-byte aligned for the 128-byte swizzle), its bytes
// counted off b's transaction count; coordinates past the tensor's bounds read as zero.
__device__ __forceinline__ void tma_load_4d(void *dst, const fa_cuda_tmap *map, int c0, int c1, int c2, int c3,
                                            uint64_t *b)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(b))
                 : "memory");
}
// tma_load_4d for a map of 5 dimensions.
__device__ __forceinline__ void tma_load_5d(void *dst, const fa_cuda_tmap *map, int c0, int c1, int c2, int c3,
                                            int c4, uint64_t *b)
{
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_addr(b))
                 : "memory");
}
// Makes barriers just initialised visible to the async proxy (the bulk copies' completions).
__device__ __forceinline__ void fence_mbar_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// b's current phase waits for bytes more to land (no arrival).
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, int bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t *b, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
// True in one lane of the warp, every lane taking part (elect.sync): a warp's single arrival
// without reading the thread index, whose latency held up the instructions after it.
__device__ __forceinline__ bool elect_one()
{
    uint32_t one;
    asm volatile("{\n.reg .pred e;\nelect.sync _|e, 0xffffffff;\nselp.u32 %0, 1, 0, e;\n}\n" : "=r"(one));
    return one != 0;
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(b))
                 : "memory");
}
// An arrival on b once every cp.async this thread issued before has landed (not counted in
// advance: b's count includes it).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *b)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity)
{
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(b)),
                 "r"(parity)
                 : "memory");
}

// A test build's drop_ordering (params.h) in a kernel of ring `in` (FA_DROP_*): the barrier
// waits it removes; 0, every wait as written, in other builds.
__device__ __forceinline__ int drop_ordering(const fa_cuda_params &p, int in)
{
#ifdef FA_CUDA_ORDERING_TEST
    return p.drop_in & in ? p.drop_ordering : 0;
#else
    (void)p, (void)in;
    return 0;
#endif
}

// Registers the loading warpgroup keeps (producer_regs) and a consumer thread gets
// (consumer_regs) through setmaxnreg, in a block of NWG consumer warpgroups and one loading
// warpgroup. The block keeps the registers it was launched with (__launch_bounds__(threads,
// 1): the register file over its threads, in steps of 8); a consumer asking for more than the
// loader gave back would wait for them forever. Three consumers take 160 each, their loader 32
// (at 40 the consumers' 152 spilled the P fragments around every P V product; at 32 the
// loader spills 40-56 bytes instead, measured with it).
template <int NWG> struct producer_regs {
    static constexpr int value = NWG >= 3 ? 32 : 40;
};
template <int NWG> struct consumer_regs {
    static constexpr int launched = 65536 / (128 * (NWG + 1)) / 8 * 8, loader = producer_regs<NWG>::value;
    static constexpr int free = (launched * (NWG + 1) - loader) / NWG / 8 * 8;
    static constexpr int value = free > 240 ? 240 : free;
    static_assert(loader <= launched && 128 * (loader + NWG * value) <= 128 * (NWG + 1) * launched,
                  "the warpgroups' registers fit in what the block was launched with");
};

// Paged keys by TMA (g.tma_rows = R, R | BN or BN | page size; the Hopper forward and decode
// kernels): the key tile from key c is BN / R pieces of R rows of one page each. Lane j of the
// loader's first warp reads the page of piece j / (D / 64) (-1 for other threads and pieces
// past the sequence, and for entries that name no page of the pool: their boxes read zeros),
// before the ring slot is free, so the table read overlaps the wait. Where the pool's pages
// follow one another in memory (g.flat_rows == BN) and the tile is whole pages of consecutive
// ids, every lane of the warp gets -2 - the first id instead: load_tile_tma then copies the
// tile as one box a column block from the flat map. Every thread of the warp calls it.
// tma_piece_page in two steps: the table read (tma_piece_entry: independent loads, so that a
// loader can issue several tiles' reads at once) and the run test on its result.
template <int BN, int D>
__device__ __forceinline__ int tma_piece_entry(const fa_cuda_pages &g, int b, int c, int sk, int tid)
{
    constexpr int CB = D / 64;
    const int pieces = (BN / g.tma_rows) * CB, j = tid / CB;
    return tid < pieces && c + j * g.tma_rows < sk ? page_entry(g, b, c + j * g.tma_rows) : -1;
}
template <int BN, int D>
__device__ __forceinline__ int tma_piece_run(const fa_cuda_pages &g, int c, int sk, int tid, int entry)
{
    constexpr int CB = D / 64;
    const int pieces = (BN / g.tma_rows) * CB, j = tid / CB;
    const int page = page_ok(g, entry) ? entry : -1; // below -1 means a run
    if (g.flat_rows != BN || c + BN > sk)
        return page;
    const int first = __shfl_sync(0xffffffffu, page, 0);
    const bool run = first >= 0 && __all_sync(0xffffffffu, tid >= pieces || page == first + j);
    return run ? -2 - first : page;
}
template <int BN, int D>
__device__ __forceinline__ int tma_piece_page(const fa_cuda_pages &g, int b, int c, int sk, int tid)
{
    return tma_piece_run<BN, D>(g, c, sk, tid, tma_piece_entry<BN, D>(g, b, c, sk, tid));
}

// The tile's pieces that lie wholly below the sequence's valid keys as TMA boxes counted on
// bar (lane j issues box j: piece j / (D / 64), column block j % (D / 64); a page id past the
// pool reads as zeros), the rest (a last page the sequence fills in part, then zeros) by
// cp.async from the rows' own pages; returns whether there was such a rest. A tile of
// consecutive pages (page < -1 from tma_piece_page) is one box a column block from the flat
// map of the same pool (g.fk for map g.tk, else g.fv). Swizzled tile layout as load_tile_sw's,
// or with GROUPED (g.grouped's maps) sw_offset_grouped's: then lane j * (D / 64) issues piece
// j's one box, and lanes 0 .. D / 64 - 1 a run's boxes of BN / (D / 64) rows each.
template <typename T, int BN, int D, bool GROUPED = false>
__device__ __forceinline__ bool load_tile_tma(unsigned char *s, const fa_cuda_tmap *map, const fa_cuda_pages &g,
                                              int page, int b, int hk, const T *pool, int64_t sp, int64_t st,
                                              int64_t head, int c, int valid, int dim, uint64_t *bar, int tid)
{
    constexpr int CB = D / 64, CHUNKS = D / 8, RP = 128 / CHUNKS;
    static_assert(BN / 8 * CB <= 32, "a lane of the first warp for every box of 8 rows or more");
    static_assert(!GROUPED || (CB >= 2 && (BN / 8) % CB == 0), "grouped tiles of two column blocks or more");
    const int R = g.tma_rows, whole = (valid < BN ? valid : BN) / R; // pieces by TMA
    if (tid < 32) {
        if (tid == 0 && whole)
            mbar_expect_tx(bar, whole * CB * R * 128);
        __syncwarp();
        const bool run = page < -1; // piece 0's boxes, from the flat map
        if (GROUPED) { // lane piece * CB: the piece's rows, every column block in one box
            if (run && tid < CB) // lane j: the run's row groups j * BN / (8 CB) onwards, as many
                tma_load_5d(s + tid * BN * 128, map == &g.tk ? &g.fk : &g.fv, 0, 0, hk * CB,
                            (-2 - page) * (g.size / 8) + tid * (BN / 8 / CB), 0, bar);
            else if (!run && tid % CB == 0 && tid < whole * CB)
                tma_load_5d(s + tid * R * 128, map, 0, 0, hk * CB, slot_in_page(g, c + tid / CB * R) / 8, page, bar);
        } else if (tid < (run ? CB : whole * CB)) { // lane j: piece j / CB's column block j % CB
            const int piece = tid / CB, cb = tid % CB, key = c + piece * R;
            tma_load_4d(s + (cb * BN + piece * R) * 128, run ? (map == &g.tk ? &g.fk : &g.fv) : map, cb * 64,
                        run ? (-2 - page) * g.size : slot_in_page(g, key), hk, run ? 0 : page, bar);
        }
    }
    if (whole * R == BN)
        return false;
    const int col = (tid % CHUNKS) * 8;
    for (int r = whole * R + tid / CHUNKS; r < BN; r += RP) {
        const int pg = r < valid ? page_slot(g, b, c + r).page : -1;
        const bool ok = col < dim && pg >= 0;
        cp_async16(s + (GROUPED ? sw_offset_grouped<CB>(r, col) : sw_offset(r, col, BN)),
                   ok ? pool + pg * sp + slot_in_page(g, c + r) * st + head + col : pool, ok ? 16 : 0);
    }
    return true;
}

} // namespace fa
