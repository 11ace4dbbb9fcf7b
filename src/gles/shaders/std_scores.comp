// SPDX-License-Identifier: MIT
// Standard attention, pass 1 of 3: every score of one (query row, head) into S
// ([heads_q][rows][max_k] floats, log2-domain logits), masked ones too: as an unfused
// framework's Q K^T, the mask is applied after, by the softmax pass. K comes the way the
// fused forward chosen for the device reads it: through a buffer texture with KV_TEX (the q
// row then held in registers), else from its storage buffer.
layout(local_size_x = 64) in;

layout(std430, binding = 3) buffer SBuf { float s_data[]; };

uniform int u_max_k;
#if KV_TEX
uniform highp samplerBuffer u_ktex; // packed halves as RGBA16F texels
#define KTEX(x) texelFetch(u_ktex, x)
#endif

void main()
{
    int i = int(gl_GlobalInvocationID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
    seq_t s = seq_of(b);
    if (i >= s.sq)
        return;
    int hk = h / u_group;
    int qrow = Q_ROW(s, b, i, h);
    int srow = (h * u_qrows + s.q0 + i) * u_max_k;
#if KV_TEX
    vec4 qv[D4];
    for (int c = 0; c < D4; c++)
        qv[c] = LOAD_Q(q_data, qrow + c);
#endif
    for (int j = max(u_key_lo, 0), hi = min(s.sk, u_key_hi); j < hi; j++) {
        int krow = K_ROW(s, b, j, hk);
        float acc = 0.0;
        for (int c = 0; c < D4; c++)
#if KV_TEX
            acc += dot(qv[c], KTEX(krow + c));
#else
            acc += dot(LOAD_Q(q_data, qrow + c), LOAD4(k_data, krow + c));
#endif
        s_data[srow + j] = logit2(acc);
    }
}
