// SPDX-License-Identifier: MIT
// The attention mask's geometry, the one place the CUDA kernels learn it from: query row i
// (of sq) sees keys [i + diag - wl, i + diag + wr] within [0, sk), where diag = sk - sq puts
// the causal diagonal's end on the last key and causal is wr = 0 (the C core's
// fa_problem_key_range and the CPU's tile tests say the same). A band feature changes the
// edges below and nothing else.
#pragma once

#include "params.h"

#include <limits.h>
#include <stdint.h>

namespace fa {

// Rows or columns [lo, hi); empty when hi <= lo.
struct span_t {
    int64_t lo, hi;
};
// Tile indices [lo, hi), n = hi - lo of them.
struct tiles_t {
    int lo, hi, n;
};

struct mask_t {
    int64_t diag, wl, wr;
    int sq, sk;

    // The band's edges: row i's first and last key, key j's first and last row.
    __device__ __forceinline__ int64_t first_key(int64_t i) const { return i + diag - wl; }
    __device__ __forceinline__ int64_t last_key(int64_t i) const { return i + diag + wr; }
    __device__ __forceinline__ int64_t first_row(int64_t j) const { return j - diag - wr; }
    __device__ __forceinline__ int64_t last_row(int64_t j) const { return j - diag + wl; }

    __device__ __forceinline__ bool visible(int64_t i, int64_t j) const
    {
        return j < sk && j >= first_key(i) && j <= last_key(i);
    }
    // Every (row, col) of rows [r0, r1) x cols [c0, c1) visible: the tile needs no mask.
    __device__ __forceinline__ bool all_visible(int64_t r0, int64_t r1, int64_t c0, int64_t c1) const
    {
        return c1 <= sk && first_key(r1 - 1) <= c0 && c1 - 1 <= last_key(r0);
    }
    // The keys any of rows [r0, r1) (those below sq) sees.
    __device__ __forceinline__ span_t key_range(int64_t r0, int64_t r1) const
    {
        const int64_t last = min(r1, (int64_t)sq) - 1;
        return span_t{ max((int64_t)0, first_key(r0)), min((int64_t)sk, last_key(last) + 1) };
    }
    // The rows that see any of keys [c0, c1) (those below sk).
    __device__ __forceinline__ span_t query_range(int64_t c0, int64_t c1) const
    {
        const int64_t last = min(c1, (int64_t)sk) - 1;
        return span_t{ max((int64_t)0, first_row(c0)), min((int64_t)sq, last_row(last) + 1) };
    }
    // The keys every one of rows [r0, r1) sees: all_visible solved for the columns, so that a
    // loop over key tiles tests two integers instead (not cut at 0: tiles_within is).
    __device__ __forceinline__ span_t full_key_range(int64_t r0, int64_t r1) const
    {
        return span_t{ first_key(r1 - 1), min(last_key(r0) + 1, (int64_t)sk) };
    }
    // The rows that see every one of keys [c0, c1): all_visible solved for the rows, so that a
    // loop over row tiles tests two integers instead. Not cut at sq, as all_visible is not.
    __device__ __forceinline__ span_t full_query_range(int64_t c0, int64_t c1) const
    {
        if (c1 > sk)
            return span_t{ 0, 0 };
        return span_t{ first_row(c1 - 1), last_row(c0) + 1 };
    }
};

__device__ __forceinline__ mask_t mask_of(const fa_cuda_params &p, int sq, int sk)
{
    return mask_t{ (int64_t)sk - sq, p.win_left, p.win_right, sq, sk };
}

__device__ __forceinline__ int64_t floor_div(int64_t a, int64_t b)
{
    return a >= 0 ? a / b : -((b - 1 - a) / b);
}

// The tiles of B rows that hold any row of r (r within [0, 2^31)). hi and n are each their own
// select, neither derived from the other: at dk_dv's register limit n = hi - lo cost registers
// and spills, and in dq hi = lo + n did.
template <int B> __device__ __forceinline__ tiles_t tiles_of(const span_t &r)
{
    const int lo = (int)(r.lo / B);
    const bool any = r.hi > r.lo;
    return tiles_t{ lo, any ? (int)((r.hi + B - 1) / B) : lo,
                    any ? (int)((r.hi + B - 1) / B) - lo : 0 };
}
// The tiles of B rows wholly inside r, cut to int (r may reach far past the rows that exist:
// an unbounded window).
template <int B> __device__ __forceinline__ tiles_t tiles_within(const span_t &r)
{
    const int64_t lo = -floor_div(-r.lo, B), hi = floor_div(r.hi, B);
    const int a = (int)max(lo, (int64_t)0), b = (int)min(hi, (int64_t)INT_MAX);
    return tiles_t{ a, b, max(b - a, 0) };
}

// -inf where (row, col) may not attend. Element e of fragment (mt, nt) sits at row
// row0 + 16 mt + 8 (e / 2), column col0 + 8 nt + (e % 2).
// KEYS_ROWS: the tile is transposed (rows are keys, columns queries), as in dK/dV.
template <bool KEYS_ROWS = false, int MT, int NT>
__device__ __forceinline__ void apply_mask(const mask_t &mk, float (&c)[MT][NT][4], int64_t row0,
                                           int64_t col0)
{
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t r = row0 + i * 16 + (e >> 1) * 8, col = col0 + j * 8 + (e & 1);
                if (!(KEYS_ROWS ? mk.visible(col, r) : mk.visible(r, col)))
                    c[i][j][e] = -INFINITY;
            }
}

} // namespace fa
