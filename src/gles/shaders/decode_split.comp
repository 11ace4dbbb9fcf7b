// SPDX-License-Identifier: MIT
// Decode (one query row per sequence), pass 1 of 2: the visible keys of each (head,
// sequence) are cut into u_splits chunks, one workgroup each, so a single query still fills
// the device. Per tile of 64 keys the invocations first take one key each (score), then one
// vec4 column of head_dim each (P V), with the tile's running max and sum shared. The chunk's
// unnormalised output, max and sum go out for the merge.
layout(local_size_x = 64) in;

layout(std430, binding = 3) writeonly buffer PartO { vec4 part_o[]; };  // [heads][batch][splits][D4]
layout(std430, binding = 4) writeonly buffer PartML { vec2 part_ml[]; }; // [heads][batch][splits]: max, sum

uniform int u_splits;

shared float sh_p[64];
shared vec4 sh_q[D4];
shared int sh_again; // whether the chunk walks its keys again

// The chunk's keys [c_lo, c_hi) of sequence s, head hk, against the query in sh_q: the running
// max m, sum l and column t of the unnormalised output, exponents' base raised by up (0, or
// redo_shift in the walk again after the chunk's sums overflowed: common.glsl).
void walk(seq_t s, int b, int hk, int t, int c_lo, int c_hi, float up, out float m, out float l, out vec4 acc)
{
    m = NEG_INF;
    l = 0.0;
    acc = vec4(0.0);
    for (int j0 = c_lo; j0 < c_hi; j0 += 64) {
        int j = j0 + t;
        float x = NEG_INF;
        if (j < c_hi) {
            int krow = K_ROW(s, b, j, hk);
            float dot4 = 0.0;
            for (int c = 0; c < D4; c++)
                dot4 += dot(sh_q[c], LOAD4(k_data, krow + c));
            x = logit2(dot4);
        }
        sh_p[t] = x;
        barrier();
        float mx = NEG_INF;
        for (int k = 0; k < 64; k++)
            mx = max_nan(mx, sh_p[k]);
        mx = max_nan(m, mx + up);
        // the exponents' base: -inf where every score so far is (logits past float32's range),
        // which would make exp2(-inf - -inf) NaN; 0 then gives those keys weight 0
        float base = mx == NEG_INF ? 0.0 : mx;
        float alpha = exp2(m - base); // m = -inf gives 0
        l *= alpha;
        acc *= alpha;
        int nk = min(64, c_hi - j0);
        for (int k = 0; k < nk; k++) {
            float p = exp2(sh_p[k] - base);
            l += p;
            if (t < D4)
                acc += p * LOAD4(v_data, V_ROW(s, b, j0 + k, hk) + t);
        }
        m = mx;
        barrier(); // sh_p is rewritten next tile
    }
}

void main()
{
    int split = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
    int t = int(gl_LocalInvocationID.x);
    seq_t s = seq_of(b);
    int slot = (h * u_batch + b) * u_splits + split;
    if (s.sq == 0)
        return;
    int i = s.sq - 1; // the one query row (sq is 1 on this path)
    ivec2 kr = key_range(i, i + 1, s);
    int lo = kr.x, hi = kr.y;
    int n = max(hi - lo, 0);
    int chunk = (n + u_splits - 1) / u_splits;
    int c_lo = lo + split * chunk, c_hi = min(hi, c_lo + chunk);
    int hk = h / u_group;
    if (t == 0)
        sh_again = 0;
    for (int c = t; c < D4; c += 64)
        sh_q[c] = LOAD_Q(q_data, Q_ROW(s, b, i, h) + c);
    barrier();

    float m, l;
    vec4 acc;
    walk(s, b, hk, t, c_lo, c_hi, 0.0, m, l, acc);
    // the chunk's invocations share its tiles: they walk again together or not at all
    if (t < D4 && sum_ok(l) && nonfinite(acc))
        atomicOr(sh_again, 1);
    barrier();
    if (sh_again != 0)
        walk(s, b, hk, t, c_lo, c_hi, redo_shift(c_hi - c_lo), m, l, acc);
    if (t < D4)
        part_o[slot * D4 + t] = acc;
    if (t == 0)
        part_ml[slot] = vec2(m, l);
}
