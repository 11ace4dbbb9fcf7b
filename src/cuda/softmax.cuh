// SPDX-License-Identifier: MIT
// The online softmax and its epilogue, the one place both flash forwards (mma.sync and
// Hopper's wgmma, whose per-warp accumulator fragments are the same) take them from, and the
// probability the backwards recompute. Logits are in log2 units (exp2, float32 statistics).
// Fragment layout: element e of fragment (mt, nt) belongs to the lane's row 16 mt + 8 (e / 2)
// (rows g and g + 8 of each m tile); a row's values are spread over the four lanes of a quad,
// which tile_max's shuffles and quad_sum combine.
#pragma once

namespace fa {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float exp2_fast(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The probability of a logit x (log2 units) against its row's statistic m: the running
// maximum (or reference, softmax_update) in the forward (unnormalised), the row's lse in the
// backward.
__device__ __forceinline__ float prob(float x, float m) { return exp2_fast(x - m); }

// Per row: m the running maximum of its logits, or the reference softmax_update keeps (the
// same in every lane of the quad), l this lane's share of the running sum of exp2(logit - m).
// Nothing seen: -inf and 0.
template <int MT> __device__ __forceinline__ void softmax_init(float (&m)[MT][2], float (&l)[MT][2])
{
#pragma unroll
    for (int i = 0; i < MT; i++)
        m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
}

// Each row's largest logit in a tile (and m), every row of the fragment at once: kMaxChains
// running maxima a row, then the quads' shuffles side by side. One chain a row left each of its
// 16 steps waiting on the one before (the Hopper d64 forward's SASS under Nsight Compute). fmaxf
// is exact, so any order gives the same maximum (a zero's sign aside).
constexpr int kMaxChains = 4;
static_assert((kMaxChains & (kMaxChains - 1)) == 0, "the chains combine in halves");
template <int MT, int NS>
__device__ __forceinline__ void tile_max(const float (&sc)[MT][NS][4], const float (&m)[MT][2], float (&mx)[MT][2])
{
    constexpr int K = NS >= kMaxChains ? kMaxChains : NS >= 2 ? 2 : 1; // a power of two
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float part[K];
#pragma unroll
            for (int nt = 0; nt < NS; nt++) {
                const float x = fmaxf(sc[mt][nt][2 * hf], sc[mt][nt][2 * hf + 1]);
                part[nt % K] = nt < K ? x : fmaxf(part[nt % K], x);
            }
            part[0] = fmaxf(part[0], m[mt][hf]);
#pragma unroll
            for (int w = K / 2; w > 0; w /= 2)
#pragma unroll
                for (int j = 0; j < w; j++)
                    part[j] = fmaxf(part[j], part[j + w]);
            mx[mt][hf] = part[0];
        }
#pragma unroll
    for (int lane_mask = 1; lane_mask <= 2; lane_mask *= 2)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                mx[mt][hf] = fmaxf(mx[mt][hf], __shfl_xor_sync(0xffffffffu, mx[mt][hf], lane_mask));
}

// One key tile: the logits in sc (-inf where masked) become unnormalised probabilities, m and
// l move on, and alpha gets the factor the row's O accumulator must be scaled by (rescale).
// The row's largest logit gives exactly 1, so a one-hot row is exact (folding the scale into
// the exponent's FMA saved one instruction a score, 1-2%, and lost that: docs/perf/h200.md).
// With slack >= 0 m is a row's reference rather than its maximum: a tile whose largest logit
// passes m by no more than slack keeps it, so that alpha is exactly 1 and O needs no rescale
// (FlashAttention-4's conditional rescale; probabilities reach 2^slack at most, the lse is
// unchanged as it is m + log2 l; the first visible logit still sets m, so a one-hot row stays
// exact). A negative slack (the argument's default; the Hopper forward passes 8 up to head_dim
// 128) keeps m the row's maximum.
template <int MT, int NS>
__device__ __forceinline__ void softmax_update(float (&sc)[MT][NS][4], float (&m)[MT][2],
                                               float (&l)[MT][2], float (&alpha)[MT][2], float slack = -1.0f)
{
    float mxs[MT][2];
    tile_max(sc, m, mxs);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float mx = mxs[mt][hf];
            // false while nothing was seen (NaN or inf), and for a negative slack known at compile time
            const bool keep = slack >= 0.0f && mx - m[mt][hf] <= slack;
            const float base = keep ? m[mt][hf] : mx == -INFINITY ? 0.0f : mx; // nothing seen yet: keep zeros
            alpha[mt][hf] = keep ? 1.0f : exp2_fast(m[mt][hf] - base);
            m[mt][hf] = keep ? m[mt][hf] : mx;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float pe = prob(sc[mt][nt][2 * hf + e], base);
                    sc[mt][nt][2 * hf + e] = pe;
                    sum += pe;
                }
            l[mt][hf] = l[mt][hf] * alpha[mt][hf] + sum;
        }
}

template <int MT, int ND>
__device__ __forceinline__ void rescale(float (&o)[MT][ND][4], const float (&alpha)[MT][2])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < ND; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[mt][dt][e] *= alpha[mt][e / 2];
}

// The epilogue of one row from its statistics (every lane of the quad takes part): inv scales
// its O accumulator (out_scale: dropout's 1 / (1 - p)), lse is its log-sum-exp in natural
// units. A row that saw no key (sum 0) gives 0 and -inf; a NaN sum (a NaN input, or scores
// past float32) gives NaN, as standard attention does.
struct row_out_t {
    float inv, lse;
};
__device__ __forceinline__ row_out_t softmax_out(float m, float l, float out_scale)
{
    const float sum = quad_sum(l);
    return row_out_t{ sum != 0.0f ? out_scale / sum : 0.0f,
                      sum != 0.0f ? (m + __log2f(sum)) * kLn2 : -INFINITY };
}

} // namespace fa
