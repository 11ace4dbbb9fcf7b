// SPDX-License-Identifier: MIT
// Standard attention, pass 3 of 3: O = P V for one (query row, head) over every key; V
// through a buffer texture with KV_TEX, as the fused forward chosen for the device reads it.
// Keys [u_key_lo, u_key_hi) alone: past llvmpipe's loop limit the pass runs as one dispatch per
// key chunk, each after the first adding its part to the o the one before wrote (P is already
// normalised, so the parts simply add; o is then float32: plan.c).
layout(local_size_x = 64) in;

layout(std430, binding = 3) readonly buffer SBuf { float s_data[]; };
layout(std430, binding = 4) buffer OBuf { O_T o_data[]; };

uniform int u_max_k;
#if KV_TEX
uniform highp samplerBuffer u_vtex; // packed halves as RGBA16F texels
#define VTEX(x) texelFetch(u_vtex, x)
#endif

void main()
{
    int i = int(gl_GlobalInvocationID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
    seq_t s = seq_of(b);
    if (i >= s.sq)
        return;
    int hk = h / u_group;
    int srow = (h * u_qrows + s.q0 + i) * u_max_k;
    int orow = O_ROW(s, b, i, h);
    // keys outer, the row's output in registers: one loop over the keys (llvmpipe stops a
    // shader's loops after 65535 iterations in all, which a head_dim loop around the key loop
    // reached at 4096 keys and d64)
    vec4 acc[D4];
    bool first = (u_chunk & 1) != 0;
    for (int c = 0; c < D4; c++)
        acc[c] = first ? vec4(0.0) : O_LOAD(o_data, orow + c);
    for (int j = max(u_key_lo, 0), hi = min(s.sk, u_key_hi); j < hi; j++) { // every key, masked ones (p = 0) too, as a GEMM does
        float p = s_data[srow + j];
        int vrow = V_ROW(s, b, j, hk);
        for (int c = 0; c < D4; c++)
#if KV_TEX
            acc[c] += p * VTEX(vrow + c);
#else
            acc[c] += p * LOAD4(v_data, vrow + c);
#endif
    }
    for (int c = 0; c < D4; c++)
        O_STORE(o_data, orow + c, acc[c]);
}
