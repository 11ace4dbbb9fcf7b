// SPDX-License-Identifier: MIT
// The fused forward for GPUs: one workgroup per (query tile of BR rows, query head,
// sequence) as in flash_forward.comp, but the tile's scores and output are spread over
// NX x NY invocations as register blocks, so no invocation holds a whole head_dim row (at
// d128 that is 256 floats, more than an NVIDIA invocation's registers). Invocation (tx, ty)
// owns the 4 query rows 4ty..4ty+3. Per K/V tile it computes their scores against the 4 keys
// tx + NX*jj (a 4x4 block, head_dim staged through shared memory DC4 vec4s at a time), takes
// the row maxima across its NX neighbours through shared memory, writes its probabilities
// there, and accumulates output vec4s tx + NX*m of its rows from V staged KC keys at a time.
// S never reaches global memory; the softmax statistics are float32 in exp2 units. Each
// invocation keeps partial row sums over its own keys, added up once at the end.
// Preamble: D4, BR, BC (= 4 NX), NX, NY (= BR / 4), DC4, KC, SH_P, SH_R, SH_TOTAL.
layout(local_size_x = NX, local_size_y = NY) in;

layout(std430, binding = 3) writeonly buffer OBuf { vec4 o_data[]; };
layout(std430, binding = 4) writeonly buffer LBuf { float lse_data[]; }; // [heads_q][rows]

uniform int u_write_lse;

#define NT (NX * NY)
#define DV4 ((D4 + NX - 1) / NX) // output vec4s per row and invocation
#define QP (DC4 + 1)             // pitch (vec4s) of a staged Q or K chunk row: one vec4 of
                                 // padding puts neighbouring keys in different banks
#define PP (NY + 1)              // pitch of the probability rows (one per key), padded alike

// one array, regions by offset: [Q chunk | K chunk], overlaid by the V chunk once the scores
// are done (SH_QK vec4s); the probabilities (SH_P, BC rows of PP); per-invocation row
// partials (SH_R, NT vec4s: maxima, then the final sums)
shared vec4 sh[SH_TOTAL];
#define SQ 0
#define SK (BR * QP)
#define SV 0

void main()
{
    int tile = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
    int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
    int lid = ty * NX + tx;
    seq_t s = seq_of(b);
    int r0 = tile * BR;
    if (r0 >= s.sq)
        return; // the whole workgroup: no barrier is left waiting
    int hk = h / u_group;
    int d = s.sk - s.sq;
    int r1 = min(r0 + BR, s.sq);
    int lo = max(0, r0 + d - u_win_left);
    int hi = min(s.sk, (r1 - 1) + d + u_win_right + 1);
    int qbase = h * u_qrows + s.q0, kbase = hk * u_krows + s.k0;

    vec4 acc[4 * DV4]; // acc[i * DV4 + m]: row 4ty+i, output vec4 tx + NX*m
    for (int e = 0; e < 4 * DV4; e++)
        acc[e] = vec4(0.0);
    vec4 mrow = vec4(NEG_INF), lrow = vec4(0.0); // component i: row 4ty+i

    for (int c0 = (lo / BC) * BC; c0 < hi; c0 += BC) {
        // scores: sc[i][jj] = q(row 4ty+i) . k(key c0 + tx + NX*jj)
        vec4 sc[4];
        for (int i = 0; i < 4; i++)
            sc[i] = vec4(0.0);
        for (int dc = 0; dc < D4; dc += DC4) {
            barrier(); // the previous chunk (or the previous tile's V and P) is read
            for (int e = lid; e < BR * DC4; e += NT) {
                int r = e / DC4, c = e % DC4, i = r0 + r;
                bool ok = i < s.sq && dc + c < D4;
                sh[SQ + r * QP + c] = ok ? LOAD4(q_data, (qbase + i) * D4 + dc + c) : vec4(0.0);
            }
            for (int e = lid; e < BC * DC4; e += NT) {
                int r = e / DC4, c = e % DC4, j = c0 + r;
                bool ok = j < s.sk && dc + c < D4;
                sh[SK + r * QP + c] = ok ? LOAD4(k_data, (kbase + j) * D4 + dc + c) : vec4(0.0);
            }
            barrier();
            for (int c = 0; c < DC4; c++) {
                vec4 k0v = sh[SK + tx * QP + c], k1v = sh[SK + (tx + NX) * QP + c];
                vec4 k2v = sh[SK + (tx + 2 * NX) * QP + c], k3v = sh[SK + (tx + 3 * NX) * QP + c];
                for (int i = 0; i < 4; i++) {
                    vec4 qv = sh[SQ + (4 * ty + i) * QP + c];
                    sc[i] += vec4(dot(qv, k0v), dot(qv, k1v), dot(qv, k2v), dot(qv, k3v));
                }
            }
        }
        // logits in exp2 units, masked; the tile's row maxima across the row's NX invocations
        bool full = c0 + BC <= s.sk && c0 >= (r1 - 1) + d - u_win_left && c0 + BC - 1 <= r0 + d + u_win_right;
        vec4 tmax = vec4(NEG_INF);
        for (int i = 0; i < 4; i++) {
            for (int jj = 0; jj < 4; jj++) {
                float x = logit2(sc[i][jj]);
                if (!full && !visible(r0 + 4 * ty + i, c0 + tx + NX * jj, s))
                    x = NEG_INF;
                sc[i][jj] = x;
            }
            tmax[i] = max(max(sc[i].x, sc[i].y), max(sc[i].z, sc[i].w));
        }
        sh[SH_R + tx * NY + ty] = tmax;
        barrier();
        for (int t = 0; t < NX; t++)
            tmax = max(tmax, sh[SH_R + t * NY + ty]);
        vec4 mnew = max(mrow, tmax);
        // rows with nothing visible yet keep m = -inf; subtract 0 there (no -inf - -inf)
        vec4 muse = mix(mnew, vec4(0.0), equal(mnew, vec4(NEG_INF)));
        vec4 alpha = exp2(mrow - muse);
        mrow = mnew;
        lrow *= alpha;
        for (int i = 0; i < 4; i++)
            for (int m = 0; m < DV4; m++)
                acc[i * DV4 + m] *= alpha[i];
        for (int jj = 0; jj < 4; jj++) {
            vec4 p = exp2(vec4(sc[0][jj], sc[1][jj], sc[2][jj], sc[3][jj]) - muse);
            lrow += p;
            sh[SH_P + (tx + NX * jj) * PP + ty] = p;
        }
        // output: acc += P V over the tile, V staged KC keys at a time over the Q/K region
        for (int k0 = 0; k0 < BC; k0 += KC) {
            barrier(); // P written, Q/K (or the previous V chunk) read
            for (int e = lid; e < KC * D4; e += NT) {
                int j = c0 + k0 + e / D4;
                sh[SV + e] = j < s.sk ? LOAD4(v_data, (kbase + j) * D4 + e % D4) : vec4(0.0);
            }
            barrier();
            for (int j = 0; j < KC; j++) {
                vec4 p = sh[SH_P + (k0 + j) * PP + ty];
                for (int m = 0; m < DV4; m++) {
                    int c = tx + NX * m;
                    if (DV4 * NX == D4 || c < D4) {
                        vec4 v = sh[SV + j * D4 + c];
                        for (int i = 0; i < 4; i++)
                            acc[i * DV4 + m] += p[i] * v;
                    }
                }
            }
        }
    }
    // row sums: each invocation's partial over its own keys, added across the row
    sh[SH_R + tx * NY + ty] = lrow;
    barrier();
    vec4 l = vec4(0.0);
    for (int t = 0; t < NX; t++)
        l += sh[SH_R + t * NY + ty];
    for (int i = 0; i < 4; i++) {
        int row = r0 + 4 * ty + i;
        if (row >= s.sq)
            break;
        float inv = l[i] > 0.0 ? 1.0 / l[i] : 0.0;
        for (int m = 0; m < DV4; m++) {
            int c = tx + NX * m;
            if (DV4 * NX == D4 || c < D4)
                o_data[(qbase + row) * D4 + c] = acc[i * DV4 + m] * inv;
        }
        if (u_write_lse != 0 && tx == 0)
            lse_data[qbase + row] = l[i] > 0.0 ? (mrow[i] + log2(l[i])) * LN2 : NEG_INF;
    }
}
