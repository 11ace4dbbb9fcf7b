/* SPDX-License-Identifier: MIT */
/*
 * The conformance grid against float64 on the CPU backend, for the kernel
 * table named by FLASHATTN_CPU_KERNELS (CTest runs one process per table).
 * FLASHATTN_TEST_QUICK=1 selects the short-sequence grid (sanitizer builds).
 * FLASHATTN_TEST_MAX_DIM=N keeps the cases of head_dim <= N (`make test` on GLES, where each
 * head_dim compiles shaders for seconds on CPU renderers).
 * FLASHATTN_TEST_SEED=N replays a run.
 */
#include "ref.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#define MAX_CASES 256

static uint64_t seed;
static int level;

static void run_dtype(fa_dtype dt)
{
    fa_context_t ctx;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    fa_status st = fa_context_create(&opts, &ctx);
    if (st != FA_OK)
        fail_msg("context: %s", fa_last_create_error());
    static fa_case cases[MAX_CASES];
    int n = fa_grid_build(level, seed, cases, MAX_CASES), ran = 0, failed = 0;
    const int every = fa_test_case_every();
    const char *md = getenv("FLASHATTN_TEST_MAX_DIM");
    const int max_dim = md && atoi(md) > 0 ? atoi(md) : 256;
    for (int i = 0; i < n; i++) {
        if (cases[i].dtype != dt || i % every || cases[i].head_dim > max_dim)
            continue;
        fa_case_result r;
        if (fa_case_run(ctx, &cases[i], &r) != 0) {
            char desc[256];
            fa_case_format(&cases[i], desc, sizeof(desc));
            print_error("case %d could not run: %s (%s)\n", i, r.message, desc);
            failed++;
        } else if (!r.passed) {
            print_error("case %d FAILED: %s\n", i, r.message);
            failed++;
        }
        ran++;
    }
    fa_context_destroy(ctx);
    print_message("%d cases, %d failed (seed %llu)\n", ran, failed, (unsigned long long)seed);
    assert_true(ran > 0);
    assert_int_equal(failed, 0);
}

static void test_f32(void **state) { (void)state; run_dtype(FA_DTYPE_F32); }
static void test_f16(void **state) { (void)state; run_dtype(FA_DTYPE_F16); }
static void test_bf16(void **state) { (void)state; run_dtype(FA_DTYPE_BF16); }

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    const char *q = getenv("FLASHATTN_TEST_QUICK");
    level = (q && *q == '1') ? 0 : 1;
    const char *k = getenv("FLASHATTN_CPU_KERNELS");
    printf("conformance: kernels=%s grid=%s seed=%llu (replay: FLASHATTN_TEST_SEED=%llu)\n",
           k && *k ? k : "auto", level ? "full" : "quick", (unsigned long long)seed,
           (unsigned long long)seed);

    /* A kernel table this CPU cannot run is a skip, not a failure. */
    fa_context_t probe;
    fa_context_options opts = { sizeof(opts), fa_test_backend(), 0 };
    printf("backend: %s\n", fa_backend_name(opts.backend));
    if (fa_context_create(&opts, &probe) == FA_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped: %s\n", fa_last_create_error());
        return 77;
    }
    fa_context_destroy(probe);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
