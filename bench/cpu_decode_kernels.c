// SPDX-License-Identifier: MIT
/*
 * Decode's three kernels alone, on rows that stay in the caches: the CPU kernel table the
 * library would choose here (or --table NAME) computes scores (dot), the online softmax over
 * them (softmax_update) and the output (axpy) for one key tile of a [seq, kv heads, dim] f16
 * cache, d128, 8 kv heads, g = 1, 4 and 8 query rows a kv head (MHA, GQA 32/8, GQA 64/8),
 * as the split-KV decode calls them. Prints the best of 7 timings of each in ns a key and kv
 * head, to read beside bench/cpu_roof.c's arithmetic ceiling and the end-to-end rows of
 * bench/cpu_decode_peer.sh: what the kernels cost apart from bringing the rows from memory.
 *
 *   cc -O2 -Iinclude -Isrc -o cpu_decode_kernels bench/cpu_decode_kernels.c build/libflashattn.a -lm -fopenmp
 *   ./cpu_decode_kernels [--table NAME] [--keys N]
 */
#define _POSIX_C_SOURCE 200809L
#include "cpu/kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *alloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "cpu_decode_kernels: out of memory\n");
        exit(1);
    }
    memset(p, 0, bytes);
    return p;
}

int main(int argc, char **argv)
{
    const char *want = NULL;
    int n = 64; /* keys: K and V rows of 8 heads, 2 x 256 KiB at 64, within a core's L2 */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--table") && i + 1 < argc)
            want = argv[++i];
        else if (!strcmp(argv[i], "--keys") && i + 1 < argc)
            n = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--table NAME] [--keys N (1..4096)]\n", argv[0]);
            return 2;
        }
    }
    if (n < 1 || n > 4096) {
        fprintf(stderr, "cpu_decode_kernels: --keys takes 1..4096\n");
        return 2;
    }
    fa_cpu_features f;
    fa_cpu_features_probe(&f);
    const fa_cpu_kernels *k = NULL;
    for (int t = 0; t < fa_cpu_kernel_table_count && !k; t++)
        if (fa_cpu_kernel_tables[t].usable(&f) &&
            (!want || !strcmp(fa_cpu_kernel_tables[t].kern->name, want)))
            k = fa_cpu_kernel_tables[t].kern;
    if (!k) {
        fprintf(stderr, "cpu_decode_kernels: no usable table named %s on this CPU\n", want);
        return 2;
    }
    const int heads = 8, dim = 128, gs[3] = { 1, 4, 8 };
    const int w = k->nr / 2; /* the decode pads its score columns to this (decode.c) */
    printf("table %s, f16 K/V, d%d, %d kv heads, %d keys in cache; ns a key and kv head, best of 7\n",
           k->name, dim, heads, n);
    for (int gi = 0; gi < 3; gi++) {
        const int g = gs[gi], gv = (heads * g + w - 1) / w * w;
        const int reps = (int)(2e6 / ((double)n * heads * g)) + 1;
        float *q = alloc(sizeof(float) * heads * g * dim), *o = alloc(sizeof(float) * heads * g * dim);
        float *st = alloc(sizeof(float) * n * gv), *m = alloc(sizeof(float) * gv), *l = alloc(sizeof(float) * gv);
        float *alpha = alloc(sizeof(float) * gv);
        uint16_t *kc = alloc(2 * (size_t)n * heads * dim), *vc = alloc(2 * (size_t)n * heads * dim);
        for (int i = 0; i < heads * g * dim; i++)
            q[i] = 0.01f * (float)(i % 13 - 6);
        for (size_t i = 0; i < (size_t)n * heads * dim; i++) {
            kc[i] = (uint16_t)(0x3800 + i % 97); /* f16 values near 0.5 */
            vc[i] = (uint16_t)(0x3400 + i % 89);
        }
        const fa_cpu_heads hs = { heads, (ptrdiff_t)g * dim, dim, g, (ptrdiff_t)g * dim, g };
        double best[3] = { 1e30, 1e30, 1e30 };
        for (int t = 0; t < 7; t++) {
            double t0 = now();
            for (int r = 0; r < reps; r++)
                k->dot(FA_DTYPE_F16, &hs, g, n, dim, q, dim, kc, (ptrdiff_t)heads * dim, st, gv);
            double t1 = now();
            for (int r = 0; r < reps; r++) {
                for (int c = 0; c < gv; c++)
                    m[c] = 0.0f, l[c] = 0.0f; /* the scores stay finite below 0: a steady row */
                k->softmax_update(n, gv, st, gv, m, l, alpha);
            }
            double t2 = now();
            for (int r = 0; r < reps; r++)
                k->axpy(FA_DTYPE_F16, &hs, g, n, dim, st, gv, vc, (ptrdiff_t)heads * dim, o, dim, alpha);
            double t3 = now();
            const double per = 1e9 / ((double)reps * n * heads);
            best[0] = (t1 - t0) * per < best[0] ? (t1 - t0) * per : best[0];
            best[1] = (t2 - t1) * per < best[1] ? (t2 - t1) * per : best[1];
            best[2] = (t3 - t2) * per < best[2] ? (t3 - t2) * per : best[2];
        }
        printf("g %d: dot %6.1f  softmax %5.1f  axpy %6.1f  sum %6.1f  (%.1f GB/s of K+V a core)\n", g, best[0],
               best[1], best[2], best[0] + best[1] + best[2], 2.0 * 2 * dim / (best[0] + best[1] + best[2]));
        free(q), free(o), free(st), free(m), free(l), free(alpha), free(kc), free(vc);
    }
    return 0;
}
