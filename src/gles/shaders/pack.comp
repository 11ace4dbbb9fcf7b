// SPDX-License-Identifier: MIT
// A tensor the caller holds in a GL buffer (fa_memory_alloc on this backend): its
// [batch, seq, heads, dim] view (element strides; varlen rows packed) into the layout the
// attention shaders read, [heads][rows][D4 vec4] in the storage type, on the GPU. One
// invocation per (row, vec4) of one head (workgroup y), a grid-stride loop over x.
layout(local_size_x = 64) in;

layout(std430, binding = 7) readonly buffer SrcBuf { uint src_words[]; };   // the caller's
layout(std430, binding = 6) writeonly buffer DstBuf { VEC4_T dst_data[]; }; // internal

uniform int u_rows, u_dim, u_src_type;   // packed rows per head; elements f32 0, f16 1, bf16 2
uniform int u_off, u_sb, u_ss, u_sh;     // the view's first element and strides, in elements
uniform int u_rows_per_seq;              // seqlen for fixed-length batches, 0: rows are packed

highp uint half_bits(int e)
{
    highp uint w = src_words[e >> 1];
    return (e & 1) != 0 ? w >> 16 : w & 0xffffu;
}

float elem(int e)
{
    if (u_src_type == 0)
        return uintBitsToFloat(src_words[e]);
    highp uint h = half_bits(e);
    if (u_src_type == 1)
        return float(unpackHalf2x16(h).x);
    return uintBitsToFloat(h << 16);
}

void main()
{
    int h = int(gl_WorkGroupID.y), n = u_rows * D4;
    int stride = int(gl_NumWorkGroups.x) * 64;
    for (int idx = int(gl_GlobalInvocationID.x); idx < n; idx += stride) {
        int c4 = idx % D4, r = idx / D4;
        int b = u_rows_per_seq > 0 ? r / u_rows_per_seq : 0;
        int i = u_rows_per_seq > 0 ? r % u_rows_per_seq : r;
        int base = u_off + b * u_sb + i * u_ss + h * u_sh + c4 * 4;
        int valid = min(4, u_dim - c4 * 4);
#if STORE_F16
        // f16 in, packed halves out: the bits travel unchanged
        highp uint hb[4];
        for (int x = 0; x < 4; x++)
            hb[x] = x < valid ? half_bits(base + x) : 0u;
        dst_data[h * n + idx] = uvec2(hb[0] | (hb[1] << 16), hb[2] | (hb[3] << 16));
#else
        vec4 v = vec4(0.0);
        for (int x = 0; x < 4; x++)
            if (x < valid)
                v[x] = elem(base + x);
        dst_data[h * n + idx] = v;
#endif
    }
}
