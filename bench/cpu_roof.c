// SPDX-License-Identifier: MIT
/*
 * The arithmetic ceiling of f16 decode on an x86 core with AVX2, FMA and F16C, beside which
 * bench/cpu_decode_peer.sh's GB/s can be read. Per key and kv head of an f16 cache with head
 * dimension d and g query heads per kv head, decode converts 2d halves to float (K and V) and
 * issues 2gd multiply-adds (q.k and p v): at d = 128, 32 conversions and 32g FMAs of 8 lanes
 * for 512 bytes. This times that instruction mix with register operands only (the loads of a
 * real kernel come on top where they do not overlap), on every thread at once, one per CPU,
 * and prints what it allows in GB/s of K+V beside the FMA and conversion rates alone.
 *
 *   cc -O2 -fopenmp -o cpu_roof bench/cpu_roof.c && ./cpu_roof [threads]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <omp.h>

#if !defined(__x86_64__)
int main(void)
{
    fprintf(stderr, "cpu_roof: x86-64 only (AVX2, FMA, F16C)\n");
    return 2;
}
#else

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Eight independent FMA chains (latency 4-5 cycles, so the pipes, not a chain, set the rate)
 * and two conversions into registers nothing reads. */
#define FMA8                                                                                     \
    "vfmadd231ps %%ymm14, %%ymm15, %%ymm0\n\tvfmadd231ps %%ymm14, %%ymm15, %%ymm1\n\t"           \
    "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\tvfmadd231ps %%ymm14, %%ymm15, %%ymm3\n\t"           \
    "vfmadd231ps %%ymm14, %%ymm15, %%ymm4\n\tvfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"           \
    "vfmadd231ps %%ymm14, %%ymm15, %%ymm6\n\tvfmadd231ps %%ymm14, %%ymm15, %%ymm7\n\t"
#define CVT2 "vcvtph2ps %%xmm13, %%ymm10\n\tvcvtph2ps %%xmm13, %%ymm11\n\t"
#define CLOB "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm10", "xmm11"

/* One mix: f blocks of 8 FMAs and c pairs of conversions, repeated n times; seconds. */
static double run_mix(long n, int f, int c)
{
    double t = now();
    for (long i = 0; i < n; i++) {
        for (int k = 0; k < f; k++)
            __asm__ volatile(FMA8 ::: CLOB);
        for (int k = 0; k < c; k++)
            __asm__ volatile(CVT2 ::: CLOB);
    }
    return now() - t;
}

/* Seconds of the slowest thread, best of 5, every thread running the mix at once. */
static double timed(int threads, long n, int f, int c)
{
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double worst = 0.0;
#pragma omp parallel num_threads(threads) reduction(max : worst)
        worst = run_mix(n, f, c);
        best = worst < best ? worst : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    if (argc > 1 && (argv[1][0] == '-' || atoi(argv[1]) < 1)) {
        fprintf(stderr, "usage: cpu_roof [threads]   (default: every CPU; needs AVX2, FMA, F16C)\n");
        return 2;
    }
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        fprintf(stderr, "cpu_roof: this CPU lacks AVX2 or FMA\n");
        return 2;
    }
    const int threads = argc > 1 ? atoi(argv[1]) : omp_get_num_procs();
    const long n = 4000000;
    const double fma = 8.0 * n / timed(threads, n, 1, 0) / 1e9;
    const double cvt = 8.0 * n / timed(threads, n, 0, 4) / 1e9;
    printf("%d threads, each: %.2f FMA/ns, %.2f f16->f32 conversions/ns (8 lanes)\n", threads, fma,
           cvt);
    /* d = 128: 32 conversions and 32 g FMAs a key and kv head, 512 bytes of K and V */
    static const int groups[] = { 1, 4, 8 };
    for (int i = 0; i < 3; i++) {
        const int g = groups[i], reps = n / 8;
        const double t = timed(threads, reps, 4 * g, 16) / reps; /* 32g FMAs, 32 cvts */
        printf("g %d (d128, f16 K/V): %.1f ns a key and kv head on each thread; ceiling %.1f GB/s "
               "on %d threads (FMAs alone %.1f, conversions alone %.1f)\n",
               g, t * 1e9, 512.0 * threads / t / 1e9, threads,
               512.0 * threads / (32.0 * g / fma) , 512.0 * threads / (32.0 / cvt));
    }
    return 0;
}
#endif
