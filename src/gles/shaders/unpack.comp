// SPDX-License-Identifier: MIT
// The attention's output in the internal layout ([heads][rows][D4 vec4] float o, [heads][rows]
// lse) into the caller's GL buffers: o at its view's strides and dtype (16-bit elements go in
// with atomics on their 32-bit word, so neighbours written by other invocations are kept),
// lse at its strides. One invocation per (row, vec4) or per row of one head (workgroup y).
layout(local_size_x = 64) in;

layout(std430, binding = 6) readonly buffer PackedO { vec4 po[]; };
layout(std430, binding = 3) readonly buffer PackedL { float pl[]; };
layout(std430, binding = 7) buffer DstBuf { uint dst_words[]; };

uniform int u_rows, u_dim, u_dst_type; // elements f32 0, f16 1, bf16 2
uniform int u_off, u_sb, u_ss, u_sh;   // destination view, in elements
uniform int u_rows_per_seq;            // seqlen for fixed-length batches, 0: rows are packed
uniform int u_lse;                     // 1: write lse (float32) instead of o

void put_half(int e, highp uint bits)
{
    highp uint shift = (e & 1) != 0 ? 16u : 0u;
    atomicAnd(dst_words[e >> 1], ~(0xffffu << shift));
    atomicOr(dst_words[e >> 1], bits << shift);
}

// float -> bf16 bits, round to nearest even (NaN stays NaN)
highp uint bf16_bits(float x)
{
    highp uint u = floatBitsToUint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

void main()
{
    int h = int(gl_WorkGroupID.y), n = u_lse != 0 ? u_rows : u_rows * D4;
    int stride = int(gl_NumWorkGroups.x) * 64;
    for (int idx = int(gl_GlobalInvocationID.x); idx < n; idx += stride) {
        int r = u_lse != 0 ? idx : idx / D4, c4 = u_lse != 0 ? 0 : idx % D4;
        int b = u_rows_per_seq > 0 ? r / u_rows_per_seq : 0;
        int i = u_rows_per_seq > 0 ? r % u_rows_per_seq : r;
        int base = u_off + b * u_sb + i * u_ss + h * u_sh;
        if (u_lse != 0) {
            dst_words[base] = floatBitsToUint(pl[h * u_rows + r]);
            continue;
        }
        vec4 v = po[h * n + idx];
        for (int x = 0; x < 4 && c4 * 4 + x < u_dim; x++) {
            int e = base + c4 * 4 + x;
            if (u_dst_type == 0)
                dst_words[e] = floatBitsToUint(v[x]);
            else if (u_dst_type == 1)
                put_half(e, packHalf2x16(vec2(v[x], 0.0)) & 0xffffu);
            else
                put_half(e, bf16_bits(v[x]));
        }
    }
}
