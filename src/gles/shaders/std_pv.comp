// SPDX-License-Identifier: MIT
// Standard attention, pass 3 of 3: O = P V for one (query row, head); V through a buffer
// texture with KV_TEX, as the fused forward chosen for the device reads it.
layout(local_size_x = 64) in;

layout(std430, binding = 3) readonly buffer SBuf { float s_data[]; };
layout(std430, binding = 4) writeonly buffer OBuf { vec4 o_data[]; };

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
    int orow = (h * u_qrows + s.q0 + i) * D4;
    for (int c = 0; c < D4; c++) {
        vec4 acc = vec4(0.0);
        for (int j = 0; j < s.sk; j++) {
            float p = s_data[srow + j];
            if (p != 0.0)
#if KV_TEX
                acc += p * VTEX(V_ROW(s, b, j, hk) + c);
#else
                acc += p * LOAD4(v_data, V_ROW(s, b, j, hk) + c);
#endif
        }
        o_data[orow + c] = acc;
    }
}
