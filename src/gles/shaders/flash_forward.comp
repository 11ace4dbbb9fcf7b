// SPDX-License-Identifier: MIT
// The fused forward with query rows in registers: one workgroup per (query tile of BR rows,
// query head, sequence), each invocation one row, or ROWS rows (i, i + BR / ROWS, ...: every
// K and V element loaded feeds them all, which pays on CPU renderers and spills registers on
// GPUs). An invocation keeps its q rows, output accumulators and softmax statistics
// (float32, exp2 units) in registers and walks every key its workgroup's mask range allows,
// KB keys at a time: their scores, one running-maximum update per row for the block, then
// their share of P V. S never reaches memory.
// K and V come either through shared memory, BC keys a tile staged by the whole workgroup
// (KV_TEX 0), or straight from buffer textures (KV_TEX 1): CPU renderers gather texel
// fetches vector-wide where they load shared and storage memory one lane at a time
// (docs/perf/gles.md), and with textures no invocation waits for another.
// Preamble: D4, BR, BC, ROWS (1, 2, 4 or 8), NI (the invocations: BR / ROWS), KV_TEX, STORE_F16.
// Keys a block. On the texture path (CPU renderers) 8: each q and output vec4, spilled there,
// is read and written once per 8 keys (12% faster than 4 on llvmpipe). Through shared memory
// (GPUs) 4 up to head_dim 64, 1 above (H200 kernels, d64 causal / d128: 0.98 / 29.5 ms with
// 4, 1.21 / 21.7 with 1; 8 spilled registers, 85 ms at d128).
#if KV_TEX
#define KB 8
#elif D4 > 16
#define KB 1
#else
#define KB 4
#endif
layout(local_size_x = NI) in;

// o and lse, read back as the running state between key chunks (common.glsl)
layout(std430, binding = 3) buffer OBuf { O_T o_data[]; };
layout(std430, binding = 4) buffer LBuf { float lse_data[]; }; // [heads_q][rows], then the state

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
shared int sh_again; // whether some row of the workgroup walks its keys again
#define K_AT(j, c) sh_k[((j) - c0) * D4 + (c)]
#define V_AT(j, c) sh_v[((j) - c0) * D4 + (c)]
#endif

// Row i's output and lse (acc scaled by 1 / l) after the last key chunk; after another, its
// running state.
#define WRITE_ROW(i, acc, m, l)                                                                 \
    {                                                                                           \
        int orow = h * u_qrows + s.q0 + (i), ob = O_ROW(s, b, i, h);                            \
        if (last) {                                                                             \
            float inv = l != 0.0 ? 1.0 / l : 0.0;                                               \
            for (int c = 0; c < D4; c++)                                                        \
                O_STORE(o_data, ob + c, acc[c] * inv);                                          \
            if (u_write_lse != 0)                                                               \
                lse_data[orow] = l != 0.0 ? (m + log2(l)) * LN2 : NEG_INF;                      \
        } else {                                                                                \
            for (int c = 0; c < D4; c++)                                                        \
                O_STORE(o_data, ob + c, acc[c]);                                                \
            lse_data[u_ml + 2 * orow] = m;                                                      \
            lse_data[u_ml + 2 * orow + 1] = l;                                                  \
        }                                                                                       \
    }

// The invocation's rows, one macro call each: M(q, acc, m, l, x, base, up, r) names row r's
// query (q[D4]), output accumulator (acc[D4]), running maximum (the exponents' base) and sum,
// the logits of the key block (x[KB]) and the block's maximum, then the exponent's base, and
// how far its base is raised (0, or redo_shift in the walk again after its sums overflowed:
// common.glsl). Separate arrays per row, each indexed by the loop that walks it, so that
// compilers unroll those loops and keep them in registers.
#if ROWS == 8
#define EACH_ROW(M) M(q0, acc0, m0, l0, x0, base0, up0, 0) M(q1, acc1, m1, l1, x1, base1, up1, 1) \
                    M(q2, acc2, m2, l2, x2, base2, up2, 2) M(q3, acc3, m3, l3, x3, base3, up3, 3) \
                    M(q4, acc4, m4, l4, x4, base4, up4, 4) M(q5, acc5, m5, l5, x5, base5, up5, 5) \
                    M(q6, acc6, m6, l6, x6, base6, up6, 6) M(q7, acc7, m7, l7, x7, base7, up7, 7)
#elif ROWS == 4
#define EACH_ROW(M) M(q0, acc0, m0, l0, x0, base0, up0, 0) M(q1, acc1, m1, l1, x1, base1, up1, 1) \
                    M(q2, acc2, m2, l2, x2, base2, up2, 2) M(q3, acc3, m3, l3, x3, base3, up3, 3)
#elif ROWS == 2
#define EACH_ROW(M) M(q0, acc0, m0, l0, x0, base0, up0, 0) M(q1, acc1, m1, l1, x1, base1, up1, 1)
#elif ROWS == 1
#define EACH_ROW(M) M(q0, acc0, m0, l0, x0, base0, up0, 0)
#else
#error ROWS is 1, 2, 4 or 8
#endif
#define ROW_I(r) (ia + (r) * NI)

#define ROW_INIT(Q, A, M, L, X, BASE, UP, R)                                                    \
    vec4 Q[D4], A[D4];                                                                          \
    float M, L, BASE, X[KB], UP = 0.0;                                                          \
    {                                                                                           \
        bool valid = ROW_I(R) < s.sq;                                                           \
        int qr = Q_ROW(s, b, valid ? ROW_I(R) : 0, h);                                          \
        for (int c = 0; c < D4; c++)                                                            \
            Q[c] = valid ? LOAD_Q(q_data, qr + c) : vec4(0.0);                                  \
    }
// the state a walk starts from: nothing, or what the earlier key chunks left, in the units of
// the row's raised base
#define ROW_START(Q, A, M, L, X, BASE, UP, R)                                                   \
    M = NEG_INF;                                                                                \
    L = 0.0;                                                                                    \
    for (int c = 0; c < D4; c++)                                                                \
        A[c] = vec4(0.0);                                                                       \
    if (!first && ROW_I(R) < s.sq) {                                                            \
        int orow = h * u_qrows + s.q0 + ROW_I(R), ob = O_ROW(s, b, ROW_I(R), h);                \
        for (int c = 0; c < D4; c++)                                                            \
            A[c] = O_LOAD(o_data, ob + c);                                                      \
        M = lse_data[u_ml + 2 * orow];                                                          \
        L = lse_data[u_ml + 2 * orow + 1];                                                      \
    }                                                                                           \
    if (UP != 0.0) {                                                                            \
        float f = ldexp(1.0, -int(UP));                                                         \
        M += UP;                                                                                \
        L *= f;                                                                                 \
        for (int c = 0; c < D4; c++)                                                            \
            A[c] *= f;                                                                          \
    }
#define ROW_BLOCK(Q, A, M, L, X, BASE, UP, R) BASE = NEG_INF;
#define ROW_ZERO(Q, A, M, L, X, BASE, UP, R)                                                    \
    for (int kk = 0; kk < KB; kk++)                                                             \
        X[kk] = 0.0;
#define ROW_DOT(Q, A, M, L, X, BASE, UP, R)                                                     \
    for (int kk = 0; kk < KB; kk++)                                                             \
        X[kk] += dot(Q[c], k[kk]);
#define ROW_LOGIT(Q, A, M, L, X, BASE, UP, R)                                                   \
    X[kk] = in_tile && visible(ROW_I(R), j, s) ? logit2(X[kk]) : NEG_INF;                       \
    BASE = max(BASE, X[kk]);
// one rescale a block; rows with nothing visible yet keep m = -inf and subtract 0
#define ROW_RESCALE(Q, A, M, L, X, BASE, UP, R)                                                 \
    {                                                                                           \
        float mx = max(M, BASE + UP);                                                           \
        BASE = mx == NEG_INF ? 0.0 : mx;                                                        \
        float alpha = exp2(M - BASE);                                                           \
        L *= alpha;                                                                             \
        M = mx;                                                                                 \
        for (int c = 0; c < D4; c++)                                                            \
            A[c] *= alpha;                                                                      \
    }
#define ROW_P(Q, A, M, L, X, BASE, UP, R)                                                       \
    for (int kk = 0; kk < KB; kk++) {                                                           \
        X[kk] = exp2(X[kk] - BASE);                                                             \
        L += X[kk];                                                                             \
    }
#define ROW_PV(Q, A, M, L, X, BASE, UP, R)                                                      \
    for (int kk = 0; kk < KB; kk++)                                                             \
        A[c] += X[kk] * v[kk];
// after the first walk: a row whose sums overflowed walks again with its base raised
#define ROW_CHECK(Q, A, M, L, X, BASE, UP, R)                                                   \
    if (ROW_I(R) < s.sq && sum_ok(L)) {                                                         \
        bool bad = false;                                                                       \
        for (int c = 0; c < D4; c++)                                                            \
            bad = bad || nonfinite(A[c]);                                                       \
        if (bad) {                                                                              \
            UP = redo_shift(hi - lo);                                                           \
            again = true;                                                                       \
        }                                                                                       \
    }
#define ROW_WRITE(Q, A, M, L, X, BASE, UP, R)                                                   \
    if (ROW_I(R) < s.sq)                                                                        \
        WRITE_ROW(ROW_I(R), A, M, L)

void main()
{
    int tile = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
    int lid = int(gl_LocalInvocationID.x);
    seq_t s = seq_of(b);
    int r0 = tile * BR;
    if (r0 >= s.sq)
        return; // the whole workgroup: no barrier is left waiting
    int hk = h / u_group;
    int ia = r0 + lid; // this invocation's first row
    int r1 = min(r0 + BR, s.sq);
    ivec2 kr = key_range(r0, r1, s);
    int lo = kr.x, hi = kr.y;
    // this dispatch's key tiles: the tile's range within the key chunk
    bool first = (u_chunk & 1) != 0, last = (u_chunk & 2) != 0;
    int k_lo = max((lo / BC) * BC, u_key_lo), k_hi = min(hi, u_key_hi);
    if (k_lo >= k_hi && !first && !last)
        return; // the whole workgroup: its state stays as the chunk before left it

    EACH_ROW(ROW_INIT)
#if !KV_TEX
    if (lid == 0)
        sh_again = 0;
#endif
    for (int walk = 0; walk < 2; walk++) {
        EACH_ROW(ROW_START)
        for (int c0 = k_lo; c0 < k_hi; c0 += BC) {
            int c1 = min(c0 + BC, k_hi);
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
            if (ia >= s.sq)
                continue; // (its other rows lie after it)
            for (int j0 = c0; j0 < c1; j0 += KB) {
                // the block's keys, head_dim outside: each row's q and output vec4 are read and
                // written once a block, not once a key (spilled registers on CPU renderers);
                // keys past the tile read as its last, so that every load stays inside the
                // sequence
                EACH_ROW(ROW_ZERO)
                for (int c = 0; c < D4; c++) {
                    vec4 k[KB];
                    for (int kk = 0; kk < KB; kk++)
                        k[kk] = K_AT(min(j0 + kk, c1 - 1), c);
                    EACH_ROW(ROW_DOT)
                }
                EACH_ROW(ROW_BLOCK)
                for (int kk = 0; kk < KB; kk++) {
                    int j = j0 + kk;
                    bool in_tile = j < c1;
                    EACH_ROW(ROW_LOGIT)
                }
                EACH_ROW(ROW_RESCALE)
                EACH_ROW(ROW_P)
                for (int c = 0; c < D4; c++) {
                    vec4 v[KB];
                    for (int kk = 0; kk < KB; kk++)
                        v[kk] = V_AT(min(j0 + kk, c1 - 1), c);
                    EACH_ROW(ROW_PV)
                }
            }
        }
        bool again = false;
        if (walk == 0) {
            EACH_ROW(ROW_CHECK)
        }
#if !KV_TEX
        // the walk stages tiles for the whole workgroup: it walks again together or not at all
        barrier();
        if (again)
            atomicOr(sh_again, 1);
        barrier();
        again = walk == 0 && sh_again != 0;
#endif
        if (!again)
            break;
    }
    EACH_ROW(ROW_WRITE)
}
