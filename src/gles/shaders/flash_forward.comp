// SPDX-License-Identifier: MIT
// The fused forward with query rows in registers: one workgroup per (query tile of BR rows,
// query head, sequence), each invocation one row, or two with TWO_ROWS (i and i + BR / 2:
// every K and V element loaded feeds both, which pays on CPU renderers and spills registers
// on GPUs). An invocation keeps its q rows, output accumulators and softmax statistics
// (float32, exp2 units) in registers and walks every key its workgroup's mask range allows,
// KB keys at a time: their scores, one running-maximum update per row for the block, then
// their share of P V. S never reaches memory.
// K and V come either through shared memory, BC keys a tile staged by the whole workgroup
// (KV_TEX 0), or straight from buffer textures (KV_TEX 1): CPU renderers gather texel
// fetches vector-wide where they load shared and storage memory one lane at a time
// (docs/perf/gles.md), and with textures no invocation waits for another.
// Preamble: D4, BR, BC, NI (the invocations: BR, or BR / 2 with TWO_ROWS), TWO_ROWS, KV_TEX,
// STORE_F16.
#define KB 4
layout(local_size_x = NI) in;

layout(std430, binding = 3) writeonly buffer OBuf { vec4 o_data[]; };
layout(std430, binding = 4) writeonly buffer LBuf { float lse_data[]; }; // [heads_q][rows]

uniform int u_write_lse;

#if KV_TEX
// packed halves are read as RGBA16F texels (the same 8 bytes), converted by the fetch
uniform highp samplerBuffer u_ktex, u_vtex;
#define KV_LOAD(tex, row, c) texelFetch(tex, (row) + (c))
#define K_AT(j, c) KV_LOAD(u_ktex, K_ROW(s, b, j, hk), c)
#define V_AT(j, c) KV_LOAD(u_vtex, V_ROW(s, b, j, hk), c)
#else
shared vec4 sh_k[BC * D4];
shared vec4 sh_v[BC * D4];
#define K_AT(j, c) sh_k[((j) - c0) * D4 + (c)]
#define V_AT(j, c) sh_v[((j) - c0) * D4 + (c)]
#endif

// Row i's output and lse (acc scaled by 1 / l).
#define WRITE_ROW(i, acc, m, l)                                                                 \
    {                                                                                           \
        float inv = l > 0.0 ? 1.0 / l : 0.0;                                                    \
        int orow = (h * u_qrows + s.q0 + (i)) * D4;                                             \
        for (int c = 0; c < D4; c++)                                                            \
            o_data[orow + c] = acc[c] * inv;                                                    \
        if (u_write_lse != 0)                                                                   \
            lse_data[h * u_qrows + s.q0 + (i)] = l > 0.0 ? (m + log2(l)) * LN2 : NEG_INF;       \
    }

void main()
{
    int tile = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
    int lid = int(gl_LocalInvocationID.x);
    seq_t s = seq_of(b);
    int r0 = tile * BR;
    if (r0 >= s.sq)
        return; // the whole workgroup: no barrier is left waiting
    int hk = h / u_group;
    int ia = r0 + lid, ib = ia + NI; // this invocation's rows
    bool va = ia < s.sq, vb = ib < s.sq;
    int d = s.sk - s.sq;
    int r1 = min(r0 + BR, s.sq);
    int lo = max(0, r0 + d - u_win_left);
    int hi = min(s.sk, (r1 - 1) + d + u_win_right + 1);

    vec4 qa[D4], acca[D4];
    int qra = Q_ROW(s, b, va ? ia : 0, h);
    for (int c = 0; c < D4; c++) {
        qa[c] = va ? LOAD4(q_data, qra + c) : vec4(0.0);
        acca[c] = vec4(0.0);
    }
    float ma = NEG_INF, la = 0.0;
#if TWO_ROWS
    vec4 qb[D4], accb[D4];
    int qrb = Q_ROW(s, b, vb ? ib : 0, h);
    for (int c = 0; c < D4; c++) {
        qb[c] = vb ? LOAD4(q_data, qrb + c) : vec4(0.0);
        accb[c] = vec4(0.0);
    }
    float mb = NEG_INF, lb = 0.0;
#endif

    for (int c0 = (lo / BC) * BC; c0 < hi; c0 += BC) {
        int c1 = min(c0 + BC, hi);
#if !KV_TEX
        barrier(); // the previous tile is read
        for (int e = lid; e < BC * D4; e += NI) {
            int j = c0 + e / D4, c = e % D4;
            bool in_seq = j < s.sk;
            sh_k[e] = in_seq ? LOAD4(k_data, K_ROW(s, b, j, hk) + c) : vec4(0.0);
            sh_v[e] = in_seq ? LOAD4(v_data, V_ROW(s, b, j, hk) + c) : vec4(0.0);
        }
        barrier();
#endif
        if (!va)
            continue; // (b's row lies after a's)
        for (int j0 = c0; j0 < c1; j0 += KB) {
            // the block's logits (-inf where masked or past the tile), keys past it read as
            // the tile's last so that every load stays inside the sequence
            float xa[KB];
            float mxa = ma;
#if TWO_ROWS
            float xb[KB];
            float mxb = mb;
#endif
            for (int kk = 0; kk < KB; kk++) {
                int j = min(j0 + kk, c1 - 1);
                bool in_tile = j0 + kk < c1;
                float sa = 0.0;
#if TWO_ROWS
                float sb = 0.0;
                for (int c = 0; c < D4; c++) {
                    vec4 k = K_AT(j, c);
                    sa += dot(qa[c], k);
                    sb += dot(qb[c], k);
                }
                xb[kk] = in_tile && visible(ib, j, s) ? logit2(sb) : NEG_INF;
                mxb = max(mxb, xb[kk]);
#else
                for (int c = 0; c < D4; c++)
                    sa += dot(qa[c], K_AT(j, c));
#endif
                xa[kk] = in_tile && visible(ia, j, s) ? logit2(sa) : NEG_INF;
                mxa = max(mxa, xa[kk]);
            }
            // one rescale a block; rows with nothing visible yet keep m = -inf and subtract 0
            float basea = mxa == NEG_INF ? 0.0 : mxa;
            float alphaa = exp2(ma - basea);
            la *= alphaa;
            ma = mxa;
#if TWO_ROWS
            float baseb = mxb == NEG_INF ? 0.0 : mxb;
            float alphab = exp2(mb - baseb);
            lb *= alphab;
            mb = mxb;
#endif
            for (int c = 0; c < D4; c++) {
                acca[c] *= alphaa;
#if TWO_ROWS
                accb[c] *= alphab;
#endif
            }
            for (int kk = 0; kk < KB; kk++) {
                int j = min(j0 + kk, c1 - 1);
                float pa = exp2(xa[kk] - basea);
                la += pa;
#if TWO_ROWS
                float pb = exp2(xb[kk] - baseb);
                lb += pb;
                for (int c = 0; c < D4; c++) {
                    vec4 v = V_AT(j, c);
                    acca[c] += pa * v;
                    accb[c] += pb * v;
                }
#else
                for (int c = 0; c < D4; c++)
                    acca[c] += pa * V_AT(j, c);
#endif
            }
        }
    }
    if (va)
        WRITE_ROW(ia, acca, ma, la)
#if TWO_ROWS
    if (vb)
        WRITE_ROW(ib, accb, mb, lb)
#endif
}
