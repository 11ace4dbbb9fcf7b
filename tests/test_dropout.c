/* SPDX-License-Identifier: MIT */
/*
 * The dropout mask: Philox4x32-10 against the published test vectors, the
 * library's fa_dropout_mask against an independent implementation of its
 * documented definition, kept-fraction statistics, and p = 0 being exactly
 * no dropout.
 */
#include "ref.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

static uint64_t seed;

/* Philox4x32-10 written from the paper, independently of src/core/dropout.c. */
static void philox(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < 10; r++) {
        uint64_t a = (uint64_t)0xD2511F53u * c[0], b = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n0 = (uint32_t)(b >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(a >> 32) ^ c[3] ^ k1;
        c[0] = n0, c[1] = (uint32_t)b, c[2] = n2, c[3] = (uint32_t)a;
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
}

static void test_philox_vectors(void **state)
{
    (void)state;
    /* Random123's known-answer vectors for philox4x32-10 */
    uint32_t a[4] = { 0, 0, 0, 0 };
    philox(a, 0, 0);
    uint32_t want_a[4] = { 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 };
    assert_memory_equal(a, want_a, sizeof(a));
    uint32_t b[4] = { ~0u, ~0u, ~0u, ~0u };
    philox(b, ~0u, ~0u);
    uint32_t want_b[4] = { 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd };
    assert_memory_equal(b, want_b, sizeof(b));
    uint32_t c[4] = { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 };
    philox(c, 0xa4093822, 0x299f31d0);
    uint32_t want_c[4] = { 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 };
    assert_memory_equal(c, want_c, sizeof(c));
}

static int keep_bit(float p, uint64_t s, uint64_t off, int32_t b, int32_t h, int64_t row, int64_t col)
{
    uint32_t c[4] = { (uint32_t)(col / 4), (uint32_t)row, (uint32_t)off, (uint32_t)(off >> 32) };
    philox(c, (uint32_t)s ^ ((uint32_t)h * 0x9E3779B9u), (uint32_t)(s >> 32) ^ ((uint32_t)b * 0xBB67AE85u));
    uint32_t t = (uint32_t)ceil((double)p * 16777216.0);
    return (c[col % 4] >> 8) >= t;
}

static void test_mask_matches_definition(void **state)
{
    (void)state;
    fa_rng r = { seed };
    enum { R = 7, C = 45 };
    uint8_t m[R * 50];
    for (int t = 0; t < 40; t++) {
        float p = (float)(0.5 + 0.49 * fa_rng_uniform(&r));
        uint64_t s = fa_rng_next(&r), off = fa_rng_next(&r);
        int32_t b = (int32_t)(fa_rng_next(&r) % 1000), h = (int32_t)(fa_rng_next(&r) % 64);
        int32_t row0 = (int32_t)(fa_rng_next(&r) % 100000), col0 = (int32_t)(fa_rng_next(&r) % 100003);
        assert_int_equal(fa_dropout_mask(p, s, off, b, h, row0, R, col0, C, m, 50), FA_OK);
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++)
                assert_int_equal(m[i * 50 + j], keep_bit(p, s, off, b, h, row0 + i, col0 + j));
    }
}

static void test_kept_fraction(void **state)
{
    (void)state;
    enum { R = 256, C = 4096 };
    uint8_t *m = malloc((size_t)R * C);
    assert_non_null(m);
    const float ps[] = { 0.1f, 0.5f, 0.9f, 0.0f };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(fa_dropout_mask(ps[i], seed + (uint64_t)i, 12345, 3, 5, 0, R, 0, C, m, C), FA_OK);
        double kept = 0;
        for (size_t j = 0; j < (size_t)R * C; j++)
            kept += m[j];
        double n = (double)R * C, frac = kept / n, q = 1.0 - ps[i];
        double sigma = sqrt(ps[i] * q / n);
        print_message("p %.1f: kept %.5f (want %.5f, 5 sigma %.5f)\n", (double)ps[i], frac, q, 5 * sigma);
        if (ps[i] == 0.0f)
            assert_true(frac == 1.0);
        else
            assert_true(fabs(frac - q) <= 5 * sigma);
    }
    /* another offset or head is another mask */
    uint8_t a[256], b[256];
    fa_dropout_mask(0.5f, 9, 1, 0, 0, 0, 1, 0, 256, a, 256);
    fa_dropout_mask(0.5f, 9, 2, 0, 0, 0, 1, 0, 256, b, 256);
    assert_memory_not_equal(a, b, 256);
    fa_dropout_mask(0.5f, 9, 1, 0, 1, 0, 1, 0, 256, b, 256);
    assert_memory_not_equal(a, b, 256);
    free(m);
}

static void test_mask_bad_input(void **state)
{
    (void)state;
    uint8_t m[16];
    assert_int_equal(fa_dropout_mask(1.0f, 0, 0, 0, 0, 0, 1, 0, 4, m, 4), FA_ERR_INVALID_VALUE);
    assert_int_equal(fa_dropout_mask(NAN, 0, 0, 0, 0, 0, 1, 0, 4, m, 4), FA_ERR_INVALID_VALUE);
    assert_int_equal(fa_dropout_mask(0.5f, 0, 0, -1, 0, 0, 1, 0, 4, m, 4), FA_ERR_INVALID_SHAPE);
    assert_int_equal(fa_dropout_mask(0.5f, 0, 0, 0, 0, 0, 1, 0, 4, m, 3), FA_ERR_INVALID_STRIDE);
    assert_int_equal(fa_dropout_mask(0.5f, 0, 0, 0, 0, 0, 1, 0, 4, NULL, 4), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_dropout_mask(0.5f, 0, 0, 0, 0, 0, 0, 0, 4, NULL, 4), FA_OK);
    /* rows and columns past INT32_MAX (the row counter would wrap): refused by name, nothing
     * written; the last row and column there are fine */
    memset(m, 0xAB, sizeof(m));
    assert_int_equal(fa_dropout_mask(0.5f, 0, 0, 0, 0, INT32_MAX - 1, 2, 0, 4, m, 4), FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(fa_last_create_error(), "row0"));
    assert_int_equal(fa_dropout_mask(0.5f, 0, 0, 0, 0, INT32_MAX, 1, 0, 4, m, 4), FA_ERR_INVALID_SHAPE);
    assert_int_equal(fa_dropout_mask(0.5f, 0, 0, 0, 0, 0, 1, INT32_MAX - 2, 4, m, 4), FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(fa_last_create_error(), "col0"));
    for (size_t i = 0; i < sizeof(m); i++)
        assert_int_equal(m[i], 0xAB);
    assert_int_equal(fa_dropout_mask(0.5f, 0, 0, 0, 0, INT32_MAX - 2, 2, INT32_MAX - 4, 4, m, 4), FA_OK);
}

/* p = 0 with a seed set is bit for bit the call without dropout. */
static void test_p_zero_is_exact(void **state)
{
    (void)state;
    fa_context_t ctx; /* host f32 tensors: the CPU backend */
    fa_context_options cpu = { sizeof(cpu), FA_BACKEND_CPU, 0 };
    assert_int_equal(fa_context_create(&cpu, &ctx), FA_OK);
    fa_case c;
    memset(&c, 0, sizeof(c));
    enum { S = 150, H = 4, D = 40 };
    float *q = malloc(S * H * D * 4), *k = malloc(S * H * D * 4), *v = malloc(S * H * D * 4);
    float *o1 = malloc(S * H * D * 4), *o2 = malloc(S * H * D * 4);
    assert_non_null(q && k && v && o1 && o2);
    fa_rng r = { seed };
    for (int i = 0; i < S * H * D; i++)
        q[i] = (float)fa_rng_uniform(&r), k[i] = (float)fa_rng_uniform(&r), v[i] = (float)fa_rng_uniform(&r);
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1, d.seqlen_q = d.seqlen_k = S, d.num_heads_q = d.num_heads_kv = H, d.head_dim = D;
    d.causal = 1;
    d.q = fa_tensor_contiguous(q, FA_DTYPE_F32, FA_LAYOUT_BSHD, S, H, D);
    d.k = fa_tensor_contiguous(k, FA_DTYPE_F32, FA_LAYOUT_BSHD, S, H, D);
    d.v = fa_tensor_contiguous(v, FA_DTYPE_F32, FA_LAYOUT_BSHD, S, H, D);
    d.o = fa_tensor_contiguous(o1, FA_DTYPE_F32, FA_LAYOUT_BSHD, S, H, D);
    assert_int_equal(fa_forward(ctx, &d), FA_OK);
    d.o.data = o2;
    d.dropout_seed = 77, d.dropout_offset = 5, d.dropout_p = 0.0f;
    assert_int_equal(fa_forward(ctx, &d), FA_OK);
    assert_memory_equal(o1, o2, S * H * D * 4);
    /* and p > 0 does change it */
    d.dropout_p = 0.3f;
    assert_int_equal(fa_forward(ctx, &d), FA_OK);
    assert_memory_not_equal(o1, o2, S * H * D * 4);
    free(q), free(k), free(v), free(o1), free(o2);
    fa_context_destroy(ctx);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("dropout: seed %llu (replay: FLASHATTN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_vectors),
        cmocka_unit_test(test_mask_matches_definition),
        cmocka_unit_test(test_kept_fraction),
        cmocka_unit_test(test_mask_bad_input),
        cmocka_unit_test(test_p_zero_is_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
