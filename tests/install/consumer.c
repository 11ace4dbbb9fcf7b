/* SPDX-License-Identifier: MIT */
/* A program outside the tree using an installed flashattn: one causal attention call on the
 * CPU against a naive double-precision loop. Exit 0 when they agree. */
#include <flashattn.h>

#include <math.h>
#include <stdio.h>

enum { S = 37, H = 2, D = 16 };

int main(void)
{
    static float q[S * H * D], k[S * H * D], v[S * H * D], o[S * H * D];
    unsigned x = 12345;
    for (int i = 0; i < S * H * D; i++) {
        x = x * 1664525u + 1013904223u, q[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
        x = x * 1664525u + 1013904223u, k[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
        x = x * 1664525u + 1013904223u, v[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
    }
    fa_context_options opts = { sizeof(opts), FA_BACKEND_CPU, 0 };
    fa_context_t ctx;
    if (fa_context_create(&opts, &ctx) != FA_OK) {
        fprintf(stderr, "context: %s\n", fa_last_create_error());
        return 1;
    }
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1, d.seqlen_q = d.seqlen_k = S, d.num_heads_q = d.num_heads_kv = H, d.head_dim = D, d.causal = 1;
    d.q = fa_tensor_contiguous(q, FA_DTYPE_F32, FA_LAYOUT_BSHD, S, H, D);
    d.k = fa_tensor_contiguous(k, FA_DTYPE_F32, FA_LAYOUT_BSHD, S, H, D);
    d.v = fa_tensor_contiguous(v, FA_DTYPE_F32, FA_LAYOUT_BSHD, S, H, D);
    d.o = fa_tensor_contiguous(o, FA_DTYPE_F32, FA_LAYOUT_BSHD, S, H, D);
    if (fa_forward(ctx, &d) != FA_OK) {
        fprintf(stderr, "fa_forward: %s\n", fa_context_last_error(ctx));
        return 1;
    }
    double worst = 0.0;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < S; i++) {
            double s[S], mx = -INFINITY, sum = 0.0;
            for (int j = 0; j <= i; j++) {
                s[j] = 0.0;
                for (int e = 0; e < D; e++)
                    s[j] += (double)q[(i * H + h) * D + e] * k[(j * H + h) * D + e] / sqrt((double)D);
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j <= i; j++)
                sum += exp(s[j] - mx);
            for (int e = 0; e < D; e++) {
                double acc = 0.0;
                for (int j = 0; j <= i; j++)
                    acc += exp(s[j] - mx) / sum * v[(j * H + h) * D + e];
                worst = fmax(worst, fabs(acc - o[(i * H + h) * D + e]));
            }
        }
    fa_context_destroy(ctx);
    printf("flashattn %s: max error %.2e\n", fa_version_string(), worst);
    return worst < 1e-5 ? 0 : 1;
}
