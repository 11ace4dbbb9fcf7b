// SPDX-License-Identifier: MIT
// Shared by every attention shader (after the #define preamble the backend writes: D4, BR,
// BC, STORE_F16, SOFTCAP, ...). q, k and v are read where u_qv / u_kv / u_vv say (row_at):
// either a copy the call repacked as [heads][rows][D4 vec4] (rows in packed order: sequence
// b's rows start at cu[b], or b * seqlen when every sequence has the same length), or the
// caller's own GL buffer in place when its layout allows vec4 reads. o, lse and the standard
// algorithm's scores are [heads_q][rows][...] in the call's buffers.
precision highp float;
precision highp int;

// four halves per uvec2 (packHalf2x16 layout): half the bytes, no 16-bit storage extension.
// unpackHalf2x16 returns mediump, and products of mediump operands may run in 16 bits (Mesa
// does: scores of q scaled by 300 were off by 5%): the halves go to highp first.
highp vec4 unpack4(highp uvec2 u)
{
    highp vec2 lo = unpackHalf2x16(u.x), hi = unpackHalf2x16(u.y);
    return vec4(lo, hi);
}
#if STORE_F16
#define VEC4_T uvec2
#define LOAD4(a, i) unpack4(a[i])
#else
#define VEC4_T vec4
#define LOAD4(a, i) a[i]
#endif

// o: float32 vec4s, or with O_F16 the caller's f16 buffer written in place as packed halves
// (packHalf2x16 pairs, the conversion the unpack pass makes; never with key chunks, whose
// running state o carries unnormalised)
#if O_F16
#define O_T uvec2
#define O_STORE(a, i, x) a[i] = uvec2(packHalf2x16((x).xy), packHalf2x16((x).zw))
#define O_LOAD(a, i) unpack4(a[i])
#else
#define O_T vec4
#define O_STORE(a, i, x) a[i] = (x)
#define O_LOAD(a, i) a[i]
#endif

layout(std430, binding = 0) readonly buffer QBuf { VEC4_T q_data[]; };
layout(std430, binding = 1) readonly buffer KBuf { VEC4_T k_data[]; };
layout(std430, binding = 2) readonly buffer VBuf { VEC4_T v_data[]; };
layout(std430, binding = 5) readonly buffer CuBuf { int cu[]; }; // cu_q[0..batch], cu_k[0..batch]

uniform int u_batch, u_heads_q, u_group, u_seqlen_q, u_seqlen_k, u_varlen;
uniform int u_qrows, u_krows; // packed rows of q (and o) and of k (and v) per head
// (offset, batch stride, row stride, head stride) of q, k and v in LOAD4 units, and of o in
// vec4s (the call's o buffer, [heads_q][rows][D4], or the caller's own in place)
uniform ivec4 u_qv, u_kv, u_vv, u_ov;
uniform int u_win_left, u_win_right; // clamped to 2^30 when unbounded
uniform float u_scale_log2;          // softmax scale * log2(e)
uniform float u_softcap, u_cap_in, u_cap_out; // cap, scale / cap, cap * log2(e); cap 0 = off

// Key chunks (llvmpipe's loop limit): a fused forward may run as several dispatches over
// consecutive key ranges [u_key_lo, u_key_hi) (multiples of the key tile), the running
// output (unnormalised, in o) and each row's maximum and sum (in lse from float u_ml on, a
// pair per row) carried from one to the next; the standard's score and P V passes too (std_*).
// u_chunk: bit 0 the first chunk, bit 1 the last (3: the whole call in one dispatch).
uniform int u_key_lo, u_key_hi, u_chunk, u_ml;

#define NEG_INF uintBitsToFloat(0xff800000u)
#define LN2 0.6931471805599453

struct seq_t {
    int q0, k0, sq, sk;
};

seq_t seq_of(int b)
{
    seq_t s;
    if (u_varlen != 0) {
        s.q0 = cu[b];
        s.sq = cu[b + 1] - cu[b];
        s.k0 = cu[u_batch + 1 + b];
        s.sk = cu[u_batch + 2 + b] - s.k0;
    } else {
        s.q0 = b * u_seqlen_q;
        s.k0 = b * u_seqlen_k;
        s.sq = u_seqlen_q;
        s.sk = u_seqlen_k;
    }
    return s;
}

// Where row r of sequence b (s = seq_of(b)), head h of a q, k or v view starts, in LOAD4
// units; varlen rows count from the sequence's offset in the packed rows.
int row_at(ivec4 v, int seq_row0, int b, int r, int h)
{
    return v.x + (u_varlen != 0 ? seq_row0 * v.z : b * v.y) + r * v.z + h * v.w;
}
#define Q_ROW(s, b, r, h) row_at(u_qv, (s).q0, b, r, h)
#define K_ROW(s, b, r, h) row_at(u_kv, (s).k0, b, r, h)
#define V_ROW(s, b, r, h) row_at(u_vv, (s).k0, b, r, h)
#define O_ROW(s, b, r, h) row_at(u_ov, (s).q0, b, r, h)

// tanh without exp overflow: drivers that build it from exp(2x) give NaN for large x
float safe_tanh(float x)
{
    float t = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - t) / (1.0 + t);
}

// q is read pre-scaled, as the CPU framework packs it: scale log2(e), or scale / cap under a
// cap, reaches each product of q.k, so scaled scores the header allows stay finite where q.k
// alone passes FLT_MAX (q = k = 1e20, scale 1e-36: products 1e40 of both signs gave NaN)
#if SOFTCAP
#define Q_MUL u_cap_in
#else
#define Q_MUL u_scale_log2
#endif
#define LOAD_Q(a, i) (LOAD4(a, i) * Q_MUL)

// a pre-scaled q's dot product -> log2-domain logit; the cap is compiled in only where the call
// has one (a run-time select evaluated tanh for every score on CPU renderers: 6% of the forward)
float logit2(float s)
{
#if SOFTCAP
    return u_cap_out * safe_tanh(s);
#else
    return s;
#endif
}

// Sums past float32 (the CPU backend's cpu.h does the same): o sums p v with p up to 1 before
// the division by the softmax sum, so it can pass FLT_MAX (v of 1e34 over 1e5 keys) although o,
// a weighted mean of v, is representable. A row whose sums end inf or NaN while its softmax sum
// is finite walks its keys again with the base of its exponents raised by redo_shift(keys),
// 2^shift above the most keys it sums: every p is then below 2^-shift and no partial sum passes
// max |v|; o divides by the sum in the same units, lse adds the shift back through the base.
// Other rows keep their bits, and the normal path pays one add a key block and a check at the end.
float redo_shift(int keys)
{
    return float(findMSB(max(keys, 1)) + 1);
}

bool nonfinite(vec4 x)
{
    return any(isinf(x)) || any(isnan(x));
}

// The larger of a and b, NaN where either is: GLSL leaves max() undefined for a NaN operand and
// drivers return the other one, which would let a row or chunk of NaN scores pass for one that
// saw no key (max -inf, output 0) instead of turning NaN as the float64 reference does
float max_nan(float a, float b)
{
    return isnan(a) ? a : isnan(b) ? b : max(a, b);
}

// a softmax sum a redo can rescue: positive and finite (NaN scores give NaN sums; no redo)
bool sum_ok(float l)
{
    return l > 0.0 && !isinf(l);
}

// The mask's geometry, the one definition every shader calls (the C core's fa_problem_*): query
// row i may see key j when i + d - u_win_left <= j <= i + d + u_win_right and 0 <= j < sk, with
// d = sk - sq (the diagonal aligned bottom-right).
bool visible(int i, int j, seq_t s)
{
    int d = s.sk - s.sq;
    return j < s.sk && j >= i + d - u_win_left && j <= i + d + u_win_right;
}

// Keys [x, y) that query rows [r0, r1) may see; empty when y <= x.
ivec2 key_range(int r0, int r1, seq_t s)
{
    int d = s.sk - s.sq;
    return ivec2(max(0, r0 + d - u_win_left), min(s.sk, (r1 - 1) + d + u_win_right + 1));
}

// Whether every row of [r0, r1) sees every key of [c0, c1): no mask to apply.
bool tile_full(int r0, int r1, int c0, int c1, seq_t s)
{
    int d = s.sk - s.sq;
    return c1 <= s.sk && c0 >= (r1 - 1) + d - u_win_left && c1 - 1 <= r0 + d + u_win_right;
}
