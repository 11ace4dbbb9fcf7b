// SPDX-License-Identifier: MIT
// Decode, pass 2 of 2: the chunks of one (head, sequence) merged by their maxima and sums
// into the normalised output row and its lse.
layout(local_size_x = 64) in;

layout(std430, binding = 3) readonly buffer PartO { vec4 part_o[]; };
layout(std430, binding = 4) readonly buffer PartML { vec2 part_ml[]; };
layout(std430, binding = 6) writeonly buffer OBuf { O_T o_data[]; };
layout(std430, binding = 7) writeonly buffer LBuf { float lse_data[]; };

uniform int u_splits, u_write_lse;

void main()
{
    int h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z), t = int(gl_LocalInvocationID.x);
    seq_t s = seq_of(b);
    if (s.sq == 0)
        return;
    int i = s.sq - 1;
    int base = (h * u_batch + b) * u_splits;
    float mx = NEG_INF;
    for (int k = 0; k < u_splits; k++)
        mx = max_nan(mx, part_ml[base + k].x);
    float l = 0.0;
    if (mx != NEG_INF)
        for (int k = 0; k < u_splits; k++)
            l += part_ml[base + k].y * exp2(part_ml[base + k].x - mx);
    float inv = l != 0.0 ? 1.0 / l : 0.0; // 0: no key seen; NaN propagates
    // the chunks' outputs add up like a chunk's keys: a column whose sum overflowed is summed
    // again with every weight scaled down (common.glsl: sums past float32)
    ivec2 kr = key_range(i, i + 1, s);
    int keys = kr.y - kr.x;
    float f = ldexp(1.0, -int(redo_shift(keys)));
    int orow = O_ROW(s, b, i, h);
    for (int c = t; c < D4; c += 64) {
        vec4 acc = vec4(0.0);
        if (mx != NEG_INF)
            for (int k = 0; k < u_splits; k++)
                acc += part_o[(base + k) * D4 + c] * exp2(part_ml[base + k].x - mx);
        if (nonfinite(acc) && sum_ok(l)) {
            acc = vec4(0.0);
            for (int k = 0; k < u_splits; k++)
                acc += part_o[(base + k) * D4 + c] * (exp2(part_ml[base + k].x - mx) * f);
            acc *= 1.0 / (l * f);
        } else {
            acc *= inv;
        }
        O_STORE(o_data, orow + c, acc);
    }
    if (t == 0 && u_write_lse != 0)
        lse_data[h * u_qrows + s.q0 + i] = l != 0.0 ? (mx + log2(l)) * LN2 : NEG_INF;
}
