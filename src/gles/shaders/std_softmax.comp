// SPDX-License-Identifier: MIT
// Standard attention, pass 2 of 3: each row of S, the mask applied, becomes P = softmax in
// place (0 where masked), and its lse.
layout(local_size_x = 64) in;

layout(std430, binding = 3) buffer SBuf { float s_data[]; };
layout(std430, binding = 4) writeonly buffer LBuf { float lse_data[]; };

uniform int u_max_k, u_write_lse;

void main()
{
    int i = int(gl_GlobalInvocationID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
    seq_t s = seq_of(b);
    if (i >= s.sq)
        return;
    int srow = (h * u_qrows + s.q0 + i) * u_max_k;
#define MASKED(j) (visible(i, j, s) ? s_data[srow + (j)] : NEG_INF)
    float mx = NEG_INF;
    for (int j = 0; j < s.sk; j++)
        mx = max_nan(mx, MASKED(j));
    float l = 0.0;
    if (mx != NEG_INF)
        for (int j = 0; j < s.sk; j++)
            l += exp2(MASKED(j) - mx);
    float inv = l != 0.0 ? 1.0 / l : 0.0; // 0: no key seen; NaN propagates
    for (int j = 0; j < s.sk; j++)
        s_data[srow + j] = mx == NEG_INF ? 0.0 : exp2(MASKED(j) - mx) * inv;
    if (u_write_lse != 0)
        lse_data[h * u_qrows + s.q0 + i] = l != 0.0 ? (mx + log2(l)) * LN2 : NEG_INF;
}
