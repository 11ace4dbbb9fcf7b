/* SPDX-License-Identifier: MIT */
/* The C call alone: fa_forward on the smallest problem (b1 s1 h1 d8, float32, CPU), the
 * median of 9 runs of 20000 calls, in microseconds a call (bench/call_overhead.sh). */
#include <flashattn.h>

#include <stdio.h>
#include <time.h>

int main(void)
{
    static float q[8], o[8];
    fa_context_options op = { sizeof(op), FA_BACKEND_CPU, 0 };
    fa_context_t c;
    if (fa_context_create(&op, &c) != FA_OK)
        return 1;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = d.seqlen_q = d.seqlen_k = d.num_heads_q = d.num_heads_kv = 1;
    d.head_dim = 8;
    d.q = d.k = d.v = fa_tensor_contiguous(q, FA_DTYPE_F32, FA_LAYOUT_BSHD, 1, 1, 8);
    d.o = fa_tensor_contiguous(o, FA_DTYPE_F32, FA_LAYOUT_BSHD, 1, 1, 8);
    double t[9];
    for (int r = 0; r < 9; r++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < 20000; i++)
            if (fa_forward(c, &d) != FA_OK)
                return 1;
        clock_gettime(CLOCK_MONOTONIC, &b);
        t[r] = ((double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec)) / 20000 * 1e6;
    }
    for (int i = 1; i < 9; i++) /* median */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    printf("C fa_forward: %.2f us per call\n", t[4]);
    fa_context_destroy(c);
    return 0;
}
