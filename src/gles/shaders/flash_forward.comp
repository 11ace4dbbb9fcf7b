// SPDX-License-Identifier: MIT
// The fused forward: one workgroup per (query tile of BR rows, query head, sequence), one
// invocation per query row. The workgroup walks every K/V tile of BC keys its mask allows,
// staging each through shared memory; each score, the online softmax (float32 statistics in
// exp2 units) and the output accumulator stay in registers, so S never reaches memory.
layout(local_size_x = BR) in;

layout(std430, binding = 3) writeonly buffer OBuf { vec4 o_data[]; };
layout(std430, binding = 4) writeonly buffer LBuf { float lse_data[]; }; // [heads_q][rows]

uniform int u_write_lse;

shared vec4 sh_k[BC * D4];
shared vec4 sh_v[BC * D4];

void main()
{
    int tile = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
    int lid = int(gl_LocalInvocationID.x);
    seq_t s = seq_of(b);
    int r0 = tile * BR;
    if (r0 >= s.sq)
        return; // the whole workgroup: no barrier is left waiting
    int hk = h / u_group;
    int i = r0 + lid;
    bool valid = i < s.sq;
    int d = s.sk - s.sq;
    int r1 = min(r0 + BR, s.sq);
    int lo = max(0, r0 + d - u_win_left);
    int hi = min(s.sk, (r1 - 1) + d + u_win_right + 1);

    vec4 qv[D4];
    vec4 acc[D4];
    int qrow = Q_ROW(s, b, valid ? i : 0, h);
    for (int c = 0; c < D4; c++) {
        qv[c] = valid ? LOAD4(q_data, qrow + c) : vec4(0.0);
        acc[c] = vec4(0.0);
    }
    float m = NEG_INF, l = 0.0;

    for (int c0 = (lo / BC) * BC; c0 < hi; c0 += BC) {
        barrier(); // the previous tile is read
        for (int e = lid; e < BC * D4; e += BR) {
            int j = c0 + e / D4, c = e % D4;
            bool in_seq = j < s.sk;
            sh_k[e] = in_seq ? LOAD4(k_data, K_ROW(s, b, j, hk) + c) : vec4(0.0);
            sh_v[e] = in_seq ? LOAD4(v_data, V_ROW(s, b, j, hk) + c) : vec4(0.0);
        }
        barrier();
        if (!valid)
            continue;
        // keys one at a time, the running maximum moving only upward: a dynamic loop over
        // the tile (no score array, no unrolled BC x D4 body for the compiler to chew on)
        int nk = min(BC, hi - c0);
        for (int j = 0; j < nk; j++) {
            if (!visible(i, c0 + j, s))
                continue;
            float dot4 = 0.0;
            for (int c = 0; c < D4; c++)
                dot4 += dot(qv[c], sh_k[j * D4 + c]);
            float x = logit2(dot4);
            if (x > m) {
                float alpha = exp2(m - x); // m = -inf gives 0
                l *= alpha;
                for (int c = 0; c < D4; c++)
                    acc[c] *= alpha;
                m = x;
            }
            float p = exp2(x - m);
            l += p;
            for (int c = 0; c < D4; c++)
                acc[c] += p * sh_v[j * D4 + c];
        }
    }
    if (!valid)
        return;
    float inv = l > 0.0 ? 1.0 / l : 0.0;
    int orow = (h * u_qrows + s.q0 + i) * D4;
    for (int c = 0; c < D4; c++)
        o_data[orow + c] = acc[c] * inv;
    if (u_write_lse != 0)
        lse_data[h * u_qrows + s.q0 + i] = l > 0.0 ? (m + log2(l)) * LN2 : NEG_INF;
}
