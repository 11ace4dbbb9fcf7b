// SPDX-License-Identifier: MIT
// The fused forward in register blocks: one workgroup per (query tile of BR rows, query
// head, sequence) as in flash_forward.comp, but the tile's scores and output are spread over
// NX x NY invocations as register blocks, so no invocation holds a whole head_dim row (at
// d128 that is 256 floats, more than an NVIDIA invocation's registers). Invocation (tx, ty)
// owns the TM query rows TM*ty + i. Per K/V tile it computes their scores against the TN keys
// tx + NX*jj (a TM x TN block, head_dim staged through shared memory DC4 vec4s at a time),
// takes the row maxima across its NX neighbours through shared memory, writes its
// probabilities there, and accumulates output vec4s tx + NX*m of its rows from V staged KC
// keys at a time. Each element loaded from shared memory feeds TM or TN multiply-adds.
// S never reaches global memory; the softmax statistics are float32 in exp2 units. Each
// invocation keeps partial row sums over its own keys, added up once at the end.
// (Seed 000's column-major K tile measured 35-42% slower here: docs/perf/gles.md.)
// Preamble: D4, BR (= TM NY), BC (= TN NX), TM and TN (multiples of 4), NX, NY, DC4, KC,
// SH_P, SH_R, SH_TOTAL.
layout(local_size_x = NX, local_size_y = NY) in;

// o and lse, read back as the running state between key chunks (common.glsl)
layout(std430, binding = 3) buffer OBuf { O_T o_data[]; };
layout(std430, binding = 4) buffer LBuf { float lse_data[]; }; // [heads_q][rows], then the state

uniform int u_write_lse;

#define NT (NX * NY)
#define G (TM / 4)               // vec4 groups of an invocation's rows
#define TN4 (TN / 4)             // vec4 groups of its keys
#define DV4 ((D4 + NX - 1) / NX) // output vec4s per row and invocation
#define QP (DC4 + 1)             // pitch (vec4s) of a staged Q or K chunk row: one vec4 of
                                 // padding puts neighbouring keys in different banks
#define PP (NY * G + 1)          // pitch of the probability rows (one per key), padded alike

// one array, regions by offset: [Q chunk | K chunk], overlaid by the V chunk once the scores
// are done; the probabilities (SH_P: BC rows of PP); per-invocation row partials (SH_R: NT x
// G vec4s: maxima, then the final sums)
shared vec4 sh[SH_TOTAL];
#define SQ 0
#define SK (BR * QP)
#define SV 0
#define KEY(jj) (tx + NX * (jj)) // the invocation's jj-th key in the tile

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
    int r1 = min(r0 + BR, s.sq);
    ivec2 kr = key_range(r0, r1, s);
    int lo = kr.x, hi = kr.y;
    int qbase = h * u_qrows + s.q0; // lse rows
    int rme = r0 + TM * ty; // the invocation's first row

    // this dispatch's key tiles: the tile's range within the key chunk
    bool first = (u_chunk & 1) != 0, last = (u_chunk & 2) != 0;
    int k_lo = max((lo / BC) * BC, u_key_lo), k_hi = min(hi, u_key_hi);
    if (k_lo >= k_hi && !first && !last)
        return; // the whole workgroup: its state stays as the chunk before left it

    vec4 acc[TM * DV4]; // acc[i * DV4 + m]: row rme + i, output vec4 tx + NX*m
    vec4 mrow[G], lrow[G]; // component i % 4 of group i / 4: row rme + i
    vec4 up[G];            // how far each row's base is raised (0, or redo_shift: common.glsl)
    vec4 l[G];
    for (int g = 0; g < G; g++)
        up[g] = vec4(0.0);
    for (int walk = 0; walk < 2; walk++) {
        for (int e = 0; e < TM * DV4; e++)
            acc[e] = vec4(0.0);
        for (int g = 0; g < G; g++) {
            mrow[g] = vec4(NEG_INF);
            lrow[g] = vec4(0.0);
        }
        if (!first) // the state the earlier key chunks left (a row's sum counted once, at tx 0)
            for (int i = 0; i < TM; i++) {
                int row = min(rme + i, s.sq - 1); // rows past the sequence: any valid state
                for (int m = 0; m < DV4; m++) {
                    int c = tx + NX * m;
                    if (DV4 * NX == D4 || c < D4)
                        acc[i * DV4 + m] = O_LOAD(o_data, O_ROW(s, b, row, h) + c);
                }
                mrow[i / 4][i % 4] = lse_data[u_ml + 2 * (qbase + row)];
                lrow[i / 4][i % 4] = tx == 0 ? lse_data[u_ml + 2 * (qbase + row) + 1] : 0.0;
            }
        if (walk != 0) // in the units of the raised bases
            for (int i = 0; i < TM; i++) {
                float u = up[i / 4][i % 4], f = ldexp(1.0, -int(u));
                mrow[i / 4][i % 4] += u;
                lrow[i / 4][i % 4] *= f;
                for (int m = 0; m < DV4; m++)
                    acc[i * DV4 + m] *= f;
            }

        for (int c0 = k_lo; c0 < k_hi; c0 += BC) {
            // scores: component jj % 4 of sc[i * TN4 + jj / 4] = q(row rme + i) . k(key c0 + KEY(jj))
            vec4 sc[TM * TN4];
            for (int e = 0; e < TM * TN4; e++)
                sc[e] = vec4(0.0);
            for (int dc = 0; dc < D4; dc += DC4) {
                barrier(); // the previous chunk (or the previous tile's V and P) is read
                for (int e = lid; e < BR * DC4; e += NT) {
                    int r = e / DC4, c = e % DC4, i = r0 + r;
                    bool ok = i < s.sq && dc + c < D4;
                    sh[SQ + r * QP + c] = ok ? LOAD_Q(q_data, Q_ROW(s, b, i, h) + dc + c) : vec4(0.0);
                }
                for (int e = lid; e < BC * DC4; e += NT) {
                    int r = e / DC4, c = e % DC4, j = c0 + r;
                    bool ok = j < s.sk && dc + c < D4;
                    sh[SK + r * QP + c] = ok ? LOAD4(k_data, K_ROW(s, b, j, hk) + dc + c) : vec4(0.0);
                }
                barrier();
                for (int c = 0; c < DC4; c++) {
                    vec4 kv[TN];
                    for (int jj = 0; jj < TN; jj++)
                        kv[jj] = sh[SK + KEY(jj) * QP + c];
                    for (int i = 0; i < TM; i++) {
                        vec4 qv = sh[SQ + (TM * ty + i) * QP + c];
                        for (int j4 = 0; j4 < TN4; j4++)
                            sc[i * TN4 + j4] += vec4(dot(qv, kv[4 * j4]), dot(qv, kv[4 * j4 + 1]),
                                                     dot(qv, kv[4 * j4 + 2]), dot(qv, kv[4 * j4 + 3]));
                    }
                }
            }
            // logits in exp2 units, masked; the tile's row maxima across the row's NX invocations
            bool full = tile_full(r0, r1, c0, c0 + BC, s);
            vec4 tmax[G];
            for (int i = 0; i < TM; i++) {
                float mx = NEG_INF;
                for (int jj = 0; jj < TN; jj++) {
                    float x = logit2(sc[i * TN4 + jj / 4][jj % 4]);
                    if (!full && !visible(rme + i, c0 + KEY(jj), s))
                        x = NEG_INF;
                    sc[i * TN4 + jj / 4][jj % 4] = x;
                    mx = max(mx, x);
                }
                tmax[i / 4][i % 4] = mx;
            }
            for (int g = 0; g < G; g++)
                sh[SH_R + lid * G + g] = tmax[g];
            barrier();
            for (int t = 0; t < NX; t++)
                for (int g = 0; g < G; g++)
                    tmax[g] = max(tmax[g], sh[SH_R + (ty * NX + t) * G + g]);
            vec4 muse[G];
            for (int g = 0; g < G; g++) {
                vec4 mnew = max(mrow[g], tmax[g] + up[g]);
                // rows with nothing visible yet keep m = -inf; subtract 0 there (no -inf - -inf)
                muse[g] = mix(mnew, vec4(0.0), equal(mnew, vec4(NEG_INF)));
                vec4 alpha = exp2(mrow[g] - muse[g]);
                mrow[g] = mnew;
                lrow[g] *= alpha;
                for (int i = 0; i < 4; i++)
                    for (int m = 0; m < DV4; m++)
                        acc[(4 * g + i) * DV4 + m] *= alpha[i];
            }
            for (int jj = 0; jj < TN; jj++)
                for (int g = 0; g < G; g++) {
                    vec4 x = vec4(sc[(4 * g) * TN4 + jj / 4][jj % 4],
                                  sc[(4 * g + 1) * TN4 + jj / 4][jj % 4],
                                  sc[(4 * g + 2) * TN4 + jj / 4][jj % 4],
                                  sc[(4 * g + 3) * TN4 + jj / 4][jj % 4]);
                    vec4 p = exp2(x - muse[g]);
                    lrow[g] += p;
                    sh[SH_P + KEY(jj) * PP + ty * G + g] = p;
                }
            // output: acc += P V over the tile, V staged KC keys at a time over the Q/K region
            for (int k0 = 0; k0 < BC; k0 += KC) {
                barrier(); // P written, Q/K (or the previous V chunk) read
                for (int e = lid; e < KC * D4; e += NT) {
                    int j = c0 + k0 + e / D4;
                    sh[SV + e] = j < s.sk ? LOAD4(v_data, V_ROW(s, b, j, hk) + e % D4) : vec4(0.0);
                }
                barrier();
                for (int j = 0; j < KC; j++) {
                    vec4 p[G];
                    for (int g = 0; g < G; g++)
                        p[g] = sh[SH_P + (k0 + j) * PP + ty * G + g];
                    for (int m = 0; m < DV4; m++) {
                        int c = tx + NX * m;
                        if (DV4 * NX == D4 || c < D4) {
                            vec4 v = sh[SV + j * D4 + c];
                            for (int i = 0; i < TM; i++)
                                acc[i * DV4 + m] += p[i / 4][i % 4] * v;
                        }
                    }
                }
            }
        }
        // row sums: each invocation's partial over its own keys, added across the row; after
        // the first walk a partial is written as -1 - partial where the invocation's share of
        // the row's output overflowed, so that the row's invocations all see it
        for (int g = 0; g < G; g++) {
            vec4 bad = vec4(0.0);
            for (int i = 0; walk == 0 && i < 4; i++)
                for (int m = 0; m < DV4; m++)
                    bad[i] = nonfinite(acc[(4 * g + i) * DV4 + m]) ? 1.0 : bad[i];
            sh[SH_R + lid * G + g] = mix(lrow[g], -1.0 - lrow[g], greaterThan(bad, vec4(0.0)));
        }
        barrier();
        vec4 bad[G];
        for (int g = 0; g < G; g++) {
            l[g] = vec4(0.0);
            bad[g] = vec4(0.0);
            for (int t = 0; t < NX; t++) {
                vec4 x = sh[SH_R + (ty * NX + t) * G + g];
                bvec4 flag = lessThan(x, vec4(0.0));
                l[g] += mix(x, -1.0 - x, flag);
                bad[g] = max(bad[g], vec4(flag));
            }
        }
        if (walk != 0)
            break;
        // the walk stages tiles for the whole workgroup: it walks again together or not at all
        // (the flags go through the probability region, read for the last time before the
        // barrier above)
        bool again = false;
        for (int i = 0; i < TM; i++)
            if (rme + i < s.sq && bad[i / 4][i % 4] > 0.0 && sum_ok(l[i / 4][i % 4])) {
                up[i / 4][i % 4] = redo_shift(hi - lo);
                again = true;
            }
        if (tx == 0)
            sh[SH_P + ty] = vec4(again ? 1.0 : 0.0);
        barrier();
        again = false;
        for (int t = 0; t < NY; t++)
            again = again || sh[SH_P + t].x > 0.0;
        if (!again)
            break;
    }
    for (int i = 0; i < TM; i++) {
        int row = rme + i;
        if (row >= s.sq)
            break;
        float li = l[i / 4][i % 4];
        float inv = !last ? 1.0 : li != 0.0 ? 1.0 / li : 0.0; // unnormalised between chunks
        for (int m = 0; m < DV4; m++) {
            int c = tx + NX * m;
            if (DV4 * NX == D4 || c < D4)
                O_STORE(o_data, O_ROW(s, b, row, h) + c, acc[i * DV4 + m] * inv);
        }
        if (!last && tx == 0) {
            lse_data[u_ml + 2 * (qbase + row)] = mrow[i / 4][i % 4];
            lse_data[u_ml + 2 * (qbase + row) + 1] = li;
        } else if (u_write_lse != 0 && tx == 0)
            lse_data[qbase + row] = li != 0.0 ? (mrow[i / 4][i % 4] + log2(li)) * LN2 : NEG_INF;
    }
}
