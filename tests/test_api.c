/* SPDX-License-Identifier: MIT */
/*
 * API validation: every invalid field gets its own status and a message
 * naming it, and no output is touched (o and lse are poisoned and compared).
 */
#include "flashattn.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifdef FA_TEST_GLES
#include <EGL/egl.h>
#include <EGL/eglext.h>
#include <GLES3/gl31.h>
#endif

enum { B = 2, SQ = 5, SK = 7, HQ = 4, HK = 2, D = 8 };

typedef struct fixture {
    fa_context_t ctx;
    float q[B * SQ * HQ * D], k[B * SK * HK * D], v[B * SK * HK * D];
    float o[B * SQ * HQ * D], lse[B * HQ * SQ];
    int32_t cu_q[B + 1], cu_k[B + 1];
    float go[B * SQ * HQ * D], dq[B * SQ * HQ * D], dk[B * SK * HK * D], dv[B * SK * HK * D];
    fa_attention_desc d;
} fixture;

/* A valid backward descriptor over the fixture's forward and gradient buffers. */
static void backward_desc(fixture *f, fa_backward_desc *bd)
{
    fa_backward_desc_init(bd);
    bd->forward = &f->d;
    bd->d_o = fa_tensor_contiguous(f->go, FA_DTYPE_F32, FA_LAYOUT_BSHD, SQ, HQ, D);
    bd->d_q = fa_tensor_contiguous(f->dq, FA_DTYPE_F32, FA_LAYOUT_BSHD, SQ, HQ, D);
    bd->d_k = fa_tensor_contiguous(f->dk, FA_DTYPE_F32, FA_LAYOUT_BSHD, SK, HK, D);
    bd->d_v = fa_tensor_contiguous(f->dv, FA_DTYPE_F32, FA_LAYOUT_BSHD, SK, HK, D);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    fa_context_options opts = { sizeof(opts), FA_BACKEND_CPU, 1 };
    if (!f || fa_context_create(&opts, &f->ctx) != FA_OK)
        return -1;
    for (size_t i = 0; i < sizeof(f->q) / sizeof(float); i++)
        f->q[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (size_t i = 0; i < sizeof(f->k) / sizeof(float); i++) {
        f->k[i] = (float)((i * 13) % 7) / 7.0f - 0.5f;
        f->v[i] = (float)((i * 29) % 5) / 5.0f - 0.5f;
    }
    fa_attention_desc_init(&f->d);
    f->d.batch = B;
    f->d.seqlen_q = SQ;
    f->d.seqlen_k = SK;
    f->d.num_heads_q = HQ;
    f->d.num_heads_kv = HK;
    f->d.head_dim = D;
    f->d.q = fa_tensor_contiguous(f->q, FA_DTYPE_F32, FA_LAYOUT_BSHD, SQ, HQ, D);
    f->d.k = fa_tensor_contiguous(f->k, FA_DTYPE_F32, FA_LAYOUT_BSHD, SK, HK, D);
    f->d.v = fa_tensor_contiguous(f->v, FA_DTYPE_F32, FA_LAYOUT_BSHD, SK, HK, D);
    f->d.o = fa_tensor_contiguous(f->o, FA_DTYPE_F32, FA_LAYOUT_BSHD, SQ, HQ, D);
    f->d.lse = f->lse;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    fa_context_destroy(f->ctx);
    free(f);
    return 0;
}

/* The fixture's inputs as they were before a call: a refused call writes nothing, not even
 * where an output was pointed at an input. */
typedef struct inputs_copy {
    float q[B * SQ * HQ * D], k[B * SK * HK * D], v[B * SK * HK * D], go[B * SQ * HQ * D];
} inputs_copy;

static void inputs_save(const fixture *f, inputs_copy *c)
{
    memcpy(c->q, f->q, sizeof(c->q)), memcpy(c->k, f->k, sizeof(c->k));
    memcpy(c->v, f->v, sizeof(c->v)), memcpy(c->go, f->go, sizeof(c->go));
}

static void inputs_unchanged(const fixture *f, const inputs_copy *c)
{
    assert_memory_equal(c->q, f->q, sizeof(c->q));
    assert_memory_equal(c->k, f->k, sizeof(c->k));
    assert_memory_equal(c->v, f->v, sizeof(c->v));
    assert_memory_equal(c->go, f->go, sizeof(c->go));
}

/* Run fa_forward on a mutated descriptor; expect status, a message naming
 * `field`, and untouched outputs and inputs. */
static void expect_error(fixture *f, const fa_attention_desc *d, fa_status want, const char *field)
{
    memset(f->o, 0x5a, sizeof(f->o));
    memset(f->lse, 0x5a, sizeof(f->lse));
    unsigned char o_before[sizeof(f->o)], lse_before[sizeof(f->lse)];
    memcpy(o_before, f->o, sizeof(f->o));
    memcpy(lse_before, f->lse, sizeof(f->lse));
    static inputs_copy in;
    inputs_save(f, &in);

    fa_status st = fa_forward(f->ctx, d);
    const char *msg = fa_context_last_error(f->ctx);
    if (st != want || !strstr(msg, field))
        fail_msg("field %s: got %s \"%s\", want %s naming the field", field, fa_status_string(st),
                 msg, fa_status_string(want));
    assert_memory_equal(o_before, f->o, sizeof(f->o));
    assert_memory_equal(lse_before, f->lse, sizeof(f->lse));
    inputs_unchanged(f, &in);
    /* fa_forward_plan validates identically */
    fa_run_info ri = { .size = sizeof(ri) };
    assert_int_equal(fa_forward_plan(f->ctx, d, &ri), want);
}

/* The same for fa_backward: gradients poisoned and left so, inputs untouched. */
static void expect_backward_error(fixture *f, const fa_backward_desc *bd, fa_status want,
                                  const char *field)
{
    memset(f->dq, 0x5a, sizeof(f->dq)), memset(f->dk, 0x5a, sizeof(f->dk));
    memset(f->dv, 0x5a, sizeof(f->dv));
    static inputs_copy in;
    inputs_save(f, &in);
    fa_status st = fa_backward(f->ctx, bd);
    const char *msg = fa_context_last_error(f->ctx);
    if (st != want || !strstr(msg, field))
        fail_msg("backward %s: got %s \"%s\"", field, fa_status_string(st), msg);
    for (size_t j = 0; j < sizeof(f->dq) / 4; j++)
        assert_int_equal(((uint32_t *)f->dq)[j], 0x5a5a5a5au);
    for (size_t j = 0; j < sizeof(f->dk) / 4; j++)
        assert_true(((uint32_t *)f->dk)[j] == 0x5a5a5a5au && ((uint32_t *)f->dv)[j] == 0x5a5a5a5au);
    inputs_unchanged(f, &in);
    fa_run_info ri = { .size = sizeof(ri) };
    assert_int_equal(fa_backward_plan(f->ctx, bd, &ri), want);
}

#define MUTATE(stmt, status, field)                                                            \
    do {                                                                                       \
        fa_attention_desc d = f->d;                                                            \
        stmt;                                                                                  \
        expect_error(f, &d, status, field);                                                    \
    } while (0)

static void test_valid_call_succeeds(void **state)
{
    fixture *f = *state;
    assert_int_equal(fa_forward(f->ctx, &f->d), FA_OK);
    assert_string_equal(fa_context_last_error(f->ctx), "");
    fa_run_info ri = { .size = sizeof(ri) };
    assert_int_equal(fa_context_last_run(f->ctx, &ri), FA_OK);
    assert_int_equal(ri.backend, FA_BACKEND_CPU);
    assert_non_null(ri.kernel);
    for (size_t i = 0; i < sizeof(f->o) / sizeof(float); i++)
        assert_true(isfinite(f->o[i]));
}

static void test_shapes(void **state)
{
    fixture *f = *state;
    expect_error(f, NULL, FA_ERR_NULL_POINTER, "desc");
    MUTATE(d.size = 8, FA_ERR_INVALID_ARGUMENT, "desc->size");
    MUTATE(d.batch = 0, FA_ERR_INVALID_SHAPE, "batch");
    MUTATE(d.batch = -3, FA_ERR_INVALID_SHAPE, "batch");
    MUTATE(d.seqlen_q = 0, FA_ERR_INVALID_SHAPE, "seqlen_q");
    MUTATE(d.seqlen_k = -1, FA_ERR_INVALID_SHAPE, "seqlen_k");
    MUTATE(d.num_heads_q = 0, FA_ERR_INVALID_SHAPE, "num_heads_q");
    MUTATE(d.num_heads_kv = 0, FA_ERR_INVALID_SHAPE, "num_heads_kv");
    MUTATE(d.head_dim = 0, FA_ERR_INVALID_SHAPE, "head_dim");
    MUTATE(d.head_dim = 257, FA_ERR_INVALID_SHAPE, "head_dim");
    MUTATE(d.num_heads_kv = 3, FA_ERR_INVALID_SHAPE, "num_heads_q");
}

static void test_pointers_and_dtypes(void **state)
{
    fixture *f = *state;
    MUTATE(d.q.data = NULL, FA_ERR_NULL_POINTER, "q.data");
    MUTATE(d.k.data = NULL, FA_ERR_NULL_POINTER, "k.data");
    MUTATE(d.v.data = NULL, FA_ERR_NULL_POINTER, "v.data");
    MUTATE(d.o.data = NULL, FA_ERR_NULL_POINTER, "o.data");
    MUTATE(d.q.dtype = (fa_dtype)7, FA_ERR_INVALID_DTYPE, "q.dtype");
    MUTATE(d.o.dtype = (fa_dtype)-1, FA_ERR_INVALID_DTYPE, "o.dtype");
    MUTATE(d.k.dtype = FA_DTYPE_F16, FA_ERR_INVALID_DTYPE, "k.dtype");
    MUTATE(d.v.dtype = FA_DTYPE_BF16, FA_ERR_INVALID_DTYPE, "v.dtype");
    MUTATE(d.o.dtype = FA_DTYPE_F16, FA_ERR_INVALID_DTYPE, "o.dtype");
}

static void test_strides(void **state)
{
    fixture *f = *state;
    MUTATE(d.q.stride_seq = 0, FA_ERR_INVALID_STRIDE, "q.stride_seq");
    MUTATE(d.k.stride_head = -1, FA_ERR_INVALID_STRIDE, "k.stride_head");
    MUTATE(d.v.stride_batch = 0, FA_ERR_INVALID_STRIDE, "v.stride_batch");
    MUTATE(d.o.stride_seq = -8, FA_ERR_INVALID_STRIDE, "o.stride_seq");
    /* heads 4 floats apart with head_dim 8: output rows overlap */
    MUTATE(d.o.stride_head = 4, FA_ERR_INVALID_STRIDE, "o.stride_head");
    /* batch and seq strides equal: two batches write the same rows */
    MUTATE(d.o.stride_batch = d.o.stride_seq, FA_ERR_INVALID_STRIDE, "o.stride");
    MUTATE(d.q.stride_batch = INT64_MAX / 2, FA_ERR_SIZE_OVERFLOW, "q");
    MUTATE(d.v.stride_seq = INT64_MAX / 3, FA_ERR_SIZE_OVERFLOW, "v");
    /* inputs may overlap (broadcast one K row block to both batches) */
    fa_attention_desc d = f->d;
    d.k.stride_batch = d.k.stride_seq;
    assert_int_equal(fa_forward(f->ctx, &d), FA_OK);
}

static void test_scalars(void **state)
{
    fixture *f = *state;
    MUTATE(d.scale = NAN, FA_ERR_INVALID_VALUE, "scale");
    MUTATE(d.scale = INFINITY, FA_ERR_INVALID_VALUE, "scale");
    MUTATE(d.causal = 2, FA_ERR_INVALID_VALUE, "causal");
    MUTATE(d.window_left = -2, FA_ERR_INVALID_VALUE, "window_left");
    MUTATE(d.window_right = -7, FA_ERR_INVALID_VALUE, "window_right");
    MUTATE(d.softcap = -1.0f, FA_ERR_INVALID_VALUE, "softcap");
    MUTATE(d.softcap = NAN, FA_ERR_INVALID_VALUE, "softcap");
    MUTATE(d.dropout_p = 1.0f, FA_ERR_INVALID_VALUE, "dropout_p");
    MUTATE(d.dropout_p = -0.1f, FA_ERR_INVALID_VALUE, "dropout_p");
    MUTATE(d.dropout_p = NAN, FA_ERR_INVALID_VALUE, "dropout_p");
    MUTATE(d.algorithm = (fa_algorithm)9, FA_ERR_INVALID_VALUE, "algorithm");
    /* scaled scores must stay representable: scale * log2(e) and softcap * log2(e) */
    MUTATE(d.scale = 3e38f, FA_ERR_INVALID_VALUE, "scale");
    MUTATE(d.scale = -2e37f, FA_ERR_INVALID_VALUE, "scale");
    MUTATE(d.softcap = 3e38f, FA_ERR_INVALID_VALUE, "softcap");
    MUTATE(d.num_heads_q = FA_MAX_HEADS * 2, FA_ERR_INVALID_SHAPE, "num_heads_q");
    /* strides of an absent LSE are not looked at */
    fa_attention_desc d = f->d;
    d.lse = NULL;
    d.lse_stride_seq = -1;
    assert_int_equal(fa_forward(f->ctx, &d), FA_OK);
}

static void test_varlen(void **state)
{
    fixture *f = *state;
    /* total tokens 5 (q) and 7 (k) split over two sequences */
    int32_t cq[B + 1] = { 0, 2, 5 }, ck[B + 1] = { 0, 4, 7 };
    fa_attention_desc base = f->d;
    base.cu_seqlens_q = cq;
    base.cu_seqlens_k = ck;
    assert_int_equal(fa_forward(f->ctx, &base), FA_OK);

    fa_attention_desc d = base;
    d.cu_seqlens_k = NULL;
    expect_error(f, &d, FA_ERR_NULL_POINTER, "cu_seqlens_k");
    int32_t bad0[B + 1] = { 1, 2, 5 }, dec[B + 1] = { 0, 3, 2 }, big[B + 1] = { 0, 4, 8 };
    d = base;
    d.cu_seqlens_q = bad0;
    expect_error(f, &d, FA_ERR_INVALID_SHAPE, "cu_seqlens_q[0]");
    d = base;
    d.cu_seqlens_q = dec;
    expect_error(f, &d, FA_ERR_INVALID_SHAPE, "cu_seqlens_q[2]");
    d = base;
    d.cu_seqlens_k = big;
    expect_error(f, &d, FA_ERR_INVALID_SHAPE, "seqlen_k");
    /* a batch whose sequences are all empty holds no token: valid, nothing to write */
    int32_t none[B + 1] = { 0, 0, 0 };
    d = base;
    d.cu_seqlens_q = d.cu_seqlens_k = none;
    d.seqlen_q = d.seqlen_k = 0;
    assert_int_equal(fa_forward(f->ctx, &d), FA_OK);
    d.algorithm = FA_ALGORITHM_STANDARD;
    assert_int_equal(fa_forward(f->ctx, &d), FA_OK);
    d.seqlen_q = -1;
    expect_error(f, &d, FA_ERR_INVALID_SHAPE, "seqlen_q");
}

/* Sizes near the int32 limits must plan without overflow (checked under UBSan in CI). */
static void test_huge_shapes_plan(void **state)
{
    fixture *f = *state;
    fa_attention_desc d = f->d;
    d.batch = 1;
    d.seqlen_q = INT32_MAX;
    d.seqlen_k = 1;
    d.num_heads_q = d.num_heads_kv = 1;
    d.head_dim = 1;
    d.lse = NULL;
    /* o in the halves between q's (distinct memory, as outputs need); planning reads neither */
    d.q = (fa_tensor){ f->q, FA_DTYPE_F16, 2 * (int64_t)INT32_MAX, 2, 1 };
    d.o = d.q;
    d.o.data = (uint16_t *)f->q + 1;
    d.k = fa_tensor_contiguous(f->k, FA_DTYPE_F16, FA_LAYOUT_BSHD, 1, 1, 1);
    d.v = d.k;
    fa_run_info ri = { .size = sizeof(ri) };
    assert_int_equal(fa_forward_plan(f->ctx, &d, &ri), FA_OK);
    assert_true(ri.workspace_bytes < ((uint64_t)1 << 40));
    d.num_heads_q = FA_MAX_HEADS;
    d.seqlen_q = 3;
    d.q = (fa_tensor){ f->q, FA_DTYPE_F16, 6 * (int64_t)FA_MAX_HEADS, 2 * (int64_t)FA_MAX_HEADS,
                       2 };
    d.o = d.q;
    d.o.data = (uint16_t *)f->q + 1;
    assert_int_equal(fa_forward_plan(f->ctx, &d, &ri), FA_OK);
}

static void test_lse_strides(void **state)
{
    fixture *f = *state;
    MUTATE((d.lse_stride_seq = 1, d.lse_stride_head = 0, d.lse_stride_batch = SQ * HQ),
           FA_ERR_INVALID_STRIDE, "lse_stride_head");
    MUTATE((d.lse_stride_seq = 1, d.lse_stride_head = 2, d.lse_stride_batch = SQ * HQ),
           FA_ERR_INVALID_STRIDE, "lse");
    /* explicit strides equal to the default layout are fine */
    fa_attention_desc d = f->d;
    d.lse_stride_seq = 1;
    d.lse_stride_head = SQ;
    d.lse_stride_batch = SQ * HQ;
    assert_int_equal(fa_forward(f->ctx, &d), FA_OK);
}

/* Backward: every field checked, gradients poisoned and left untouched on error. */
static void test_backward_validation(void **state)
{
    fixture *f = *state;
    assert_int_equal(fa_forward(f->ctx, &f->d), FA_OK);
    fa_backward_desc bd;
    backward_desc(f, &bd);
    assert_int_equal(fa_backward(f->ctx, &bd), FA_OK);

    fa_attention_desc no_lse = f->d;
    no_lse.lse = NULL;
    fa_attention_desc bad_fwd = f->d;
    bad_fwd.head_dim = 0;
    struct {
        fa_backward_desc bd;
        fa_status want;
        const char *field;
    } cases[] = {
        { bd, FA_ERR_INVALID_ARGUMENT, "desc->size" },
        { bd, FA_ERR_NULL_POINTER, "forward" },
        { bd, FA_ERR_NULL_POINTER, "forward->lse" },
        { bd, FA_ERR_INVALID_SHAPE, "head_dim" },
        { bd, FA_ERR_NULL_POINTER, "d_o.data" },
        { bd, FA_ERR_INVALID_DTYPE, "d_q.dtype" },
        { bd, FA_ERR_INVALID_STRIDE, "d_k.stride_head" },
        { bd, FA_ERR_INVALID_STRIDE, "d_v.stride_seq" },
    };
    cases[0].bd.size = 3;
    cases[1].bd.forward = NULL;
    cases[2].bd.forward = &no_lse;
    cases[3].bd.forward = &bad_fwd;
    cases[4].bd.d_o.data = NULL;
    cases[5].bd.d_q.dtype = FA_DTYPE_F16; /* inputs are f32: f16 gradients are not offered */
    cases[6].bd.d_k.stride_head = 2;      /* overlapping output rows */
    cases[7].bd.d_v.stride_seq = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        expect_backward_error(f, &cases[i].bd, cases[i].want, cases[i].field);
    /* the standard backward holds whole-sequence tiles per thread: never more
     * threads than its batch x kv-head tasks, whatever the context asks for */
    fa_context_options many = { sizeof(many), FA_BACKEND_CPU, 16 };
    fa_context_t wide;
    assert_int_equal(fa_context_create(&many, &wide), FA_OK);
    f->d.algorithm = FA_ALGORITHM_STANDARD;
    fa_run_info ri = { .size = sizeof(ri) };
    assert_int_equal(fa_backward_plan(wide, &bd, &ri), FA_OK);
    assert_true(ri.threads <= B * HK);
    f->d.algorithm = FA_ALGORITHM_FLASH;
    fa_context_destroy(wide);
    assert_int_equal(fa_backward(NULL, &bd), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_backward(f->ctx, NULL), FA_ERR_NULL_POINTER);
}

/* fp8 inputs: o bf16 or float32; descale factors only with them, their strides and extent
 * checked and outputs kept off them; the backward refuses fp8. */
static void test_fp8_validation(void **state)
{
    fixture *f = *state;
    static float ds[3][B][HK];
    for (int i = 0; i < 3 * B * HK; i++)
        (&ds[0][0][0])[i] = 0.5f;
    fa_attention_desc e = f->d; /* the fixture's float buffers hold the bytes */
    e.q.dtype = e.k.dtype = e.v.dtype = FA_DTYPE_E4M3;
    e.o.dtype = FA_DTYPE_BF16;
    e.q_descale = (fa_descale){ .data = ds[0][0], .stride_batch = HK, .stride_head = 1 };
    e.k_descale = (fa_descale){ .data = ds[1][0] };
    e.v_descale = (fa_descale){ .data = ds[2][0], .stride_batch = HK, .stride_head = 1 };
    memset(f->q, 0x38, sizeof(f->q)); /* e4m3 1.0 */
    memset(f->k, 0x38, sizeof(f->k));
    memset(f->v, 0x40, sizeof(f->v)); /* e4m3 2.0: o = 2 * 0.5 everywhere */
    assert_int_equal(fa_forward(f->ctx, &e), FA_OK);
    const uint16_t *o = (const uint16_t *)f->o;
    for (int i = 0; i < B * SQ * HQ * D; i++)
        assert_int_equal(o[i], 0x3f80); /* bf16 1.0 */
    fa_attention_desc d = e;
    d.o.dtype = FA_DTYPE_E4M3;
    expect_error(f, &d, FA_ERR_INVALID_DTYPE, "o.dtype");
    d = e, d.o.dtype = FA_DTYPE_F16;
    expect_error(f, &d, FA_ERR_INVALID_DTYPE, "o.dtype");
    d = e, d.k.dtype = FA_DTYPE_BF16;
    expect_error(f, &d, FA_ERR_INVALID_DTYPE, "k.dtype");
    d = f->d, d.q_descale = e.q_descale; /* float32 inputs */
    expect_error(f, &d, FA_ERR_INVALID_ARGUMENT, "q_descale.data");
    d = e, d.k_descale.stride_batch = -1;
    expect_error(f, &d, FA_ERR_INVALID_STRIDE, "k_descale.stride_batch");
    d = e, d.v_descale.stride_head = INT64_MAX / 2;
    expect_error(f, &d, FA_ERR_SIZE_OVERFLOW, "v_descale");
    d = e, d.v_descale.data = (const float *)f->o + 3; /* o written over v's factors */
    expect_error(f, &d, FA_ERR_INVALID_STRIDE, "v_descale.data");
    d = e, d.q_descale.data = (const float *)((const char *)ds[0][0] + 2);
    expect_error(f, &d, FA_ERR_INVALID_ARGUMENT, "q_descale.data");
    d = e, d.k_descale.block_rows = -1;
    expect_error(f, &d, FA_ERR_INVALID_ARGUMENT, "k_descale.block_rows");
    d = e, d.q_descale.block_rows = (1 << 30) + 1;
    expect_error(f, &d, FA_ERR_INVALID_ARGUMENT, "q_descale.block_rows");
    d = e, d.v_descale.block_rows = 1, d.v_descale.stride_block = -2;
    expect_error(f, &d, FA_ERR_INVALID_STRIDE, "v_descale.stride_block");
    d = e, d.v_descale.block_rows = 1, d.v_descale.stride_block = INT64_MAX / 4; /* SK blocks */
    expect_error(f, &d, FA_ERR_SIZE_OVERFLOW, "v_descale");
    /* factors whose product passes float's range (1e40) while the scores do not (1.3e12 x
     * scale 1e-30): equal scores, o = v's 2 x 2^-10 everywhere */
    static const float big = 1e20f, small = 0x1p-10f;
    d = e, d.scale = 1e-30f, d.o.dtype = FA_DTYPE_F32;
    d.q_descale = d.k_descale = (fa_descale){ .data = &big };
    d.v_descale = (fa_descale){ .data = &small };
    assert_int_equal(fa_forward(f->ctx, &d), FA_OK);
    for (int i = 0; i < B * SQ * HQ * D; i++)
        assert_true(((const float *)f->o)[i] == 0x1p-9f);
    /* v's factor FLT_MIN over 7 keys would be subnormal: o = 2 x FLT_MIN still exact */
    static const float tiny = 0x1p-126f;
    d.v_descale = (fa_descale){ .data = &tiny };
    assert_int_equal(fa_forward(f->ctx, &d), FA_OK);
    for (int i = 0; i < B * SQ * HQ * D; i++)
        assert_true(((const float *)f->o)[i] == 0x1p-125f);
    fa_backward_desc bd;
    backward_desc(f, &bd);
    bd.forward = &e;
    expect_backward_error(f, &bd, FA_ERR_INVALID_DTYPE, "forward->q.dtype");
}

/* Outputs sharing memory with an input or another output are refused, naming both; nothing
 * is written, not even into the input an output was pointed at. */
static void test_overlapping_outputs(void **state)
{
    fixture *f = *state;
    const char *why = ": outputs must not share memory with inputs or other outputs";
    char want[128];
    snprintf(want, sizeof(want), "o.data overlaps q.data%s", why);
    MUTATE(d.o.data = f->q, FA_ERR_INVALID_STRIDE, want);
    MUTATE(d.o.data = f->q + HQ * D, FA_ERR_INVALID_STRIDE, "o.data overlaps q.data"); /* row 1 */
    MUTATE(d.k.data = f->o, FA_ERR_INVALID_STRIDE, "o.data overlaps k.data");
    MUTATE(d.v.data = f->o + 3, FA_ERR_INVALID_STRIDE, "o.data overlaps v.data");
    MUTATE(d.lse = f->o + 16, FA_ERR_INVALID_STRIDE, "lse overlaps o.data");
    MUTATE(d.lse = f->k, FA_ERR_INVALID_STRIDE, "lse overlaps k.data");
    /* f16 o whose last half reaches the first byte of q */
    MUTATE((d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F16,
            d.o.data = (uint16_t *)f->q - (B * SQ * HQ * D - 1)),
           FA_ERR_INVALID_STRIDE, "o.data overlaps q.data");
    /* an output past the end of the address space */
    MUTATE(d.o.data = (void *)(UINTPTR_MAX - 15), FA_ERR_SIZE_OVERFLOW, "o");

    fa_backward_desc base;
    backward_desc(f, &base);
    fa_backward_desc bd = base;
    bd.d_v.data = f->dk;
    expect_backward_error(f, &bd, FA_ERR_INVALID_STRIDE, "d_v.data overlaps d_k.data");
    bd = base;
    bd.d_q.data = f->q;
    expect_backward_error(f, &bd, FA_ERR_INVALID_STRIDE, "d_q.data overlaps q.data");
    bd = base;
    bd.d_k.data = f->go + 5; /* d_o is an input of the backward */
    expect_backward_error(f, &bd, FA_ERR_INVALID_STRIDE, "d_k.data overlaps d_o.data");
    bd = base;
    bd.d_q.data = f->lse; /* so are the forward's o and lse */
    expect_backward_error(f, &bd, FA_ERR_INVALID_STRIDE, "d_q.data overlaps lse");
}

/* Views that interleave without sharing an element are accepted: packed QKV beside a separate
 * o, o written between q's heads in one buffer, packed dQKV; one element too close is not. */
static void test_interleaved_views(void **state)
{
    fixture *f = *state;
    enum { W = (HQ + 2 * HK) * D }; /* a packed row: [q heads | k heads | v heads] */
    static float qkv[B * SQ * W], qo[B * SQ * 2 * HQ * D], grads[B * SQ * W];
    for (size_t i = 0; i < sizeof(qkv) / sizeof(float); i++)
        qkv[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    fa_attention_desc d = f->d;
    d.seqlen_k = SQ;
    d.q = (fa_tensor){ qkv, FA_DTYPE_F32, SQ * W, W, D };
    d.k = (fa_tensor){ qkv + HQ * D, FA_DTYPE_F32, SQ * W, W, D };
    d.v = (fa_tensor){ qkv + (HQ + HK) * D, FA_DTYPE_F32, SQ * W, W, D };
    assert_int_equal(fa_forward(f->ctx, &d), FA_OK);
    static float o_sep[B * SQ * HQ * D];
    memcpy(o_sep, f->o, sizeof(o_sep));

    /* [b, s, 2, hq, d]: q in the first half of each row, o in the second */
    for (int r = 0; r < B * SQ; r++)
        memcpy(qo + r * 2 * HQ * D, qkv + r * W, sizeof(float) * HQ * D);
    fa_attention_desc in_place = d;
    in_place.q = (fa_tensor){ qo, FA_DTYPE_F32, SQ * 2 * HQ * D, 2 * HQ * D, D };
    in_place.o = in_place.q;
    in_place.o.data = qo + HQ * D;
    assert_int_equal(fa_forward(f->ctx, &in_place), FA_OK);
    for (int r = 0; r < B * SQ; r++) {
        assert_memory_equal(qo + r * 2 * HQ * D, qkv + r * W, sizeof(float) * HQ * D);
        assert_memory_equal(qo + (r * 2 + 1) * HQ * D, o_sep + r * HQ * D, sizeof(float) * HQ * D);
    }
    /* one float further, o's last element of a row lands on q's first of the next */
    in_place.o.data = qo + HQ * D + 1;
    assert_int_equal(fa_forward_plan(f->ctx, &in_place, NULL), FA_ERR_INVALID_STRIDE);
    assert_non_null(strstr(fa_context_last_error(f->ctx), "o.data overlaps q.data"));

    fa_backward_desc bd;
    backward_desc(f, &bd);
    bd.forward = &d;
    bd.d_q = (fa_tensor){ grads, FA_DTYPE_F32, SQ * W, W, D };
    bd.d_k = (fa_tensor){ grads + HQ * D, FA_DTYPE_F32, SQ * W, W, D };
    bd.d_v = (fa_tensor){ grads + (HQ + HK) * D, FA_DTYPE_F32, SQ * W, W, D };
    assert_int_equal(fa_backward(f->ctx, &bd), FA_OK);
    /* d_k and d_v interleaved head by head, [b, s, hk, 2, d] */
    bd.d_k = (fa_tensor){ grads, FA_DTYPE_F32, SQ * 2 * HK * D, 2 * HK * D, 2 * D };
    bd.d_v = bd.d_k;
    bd.d_v.data = grads + D;
    bd.d_q = fa_tensor_contiguous(f->dq, FA_DTYPE_F32, FA_LAYOUT_BSHD, SQ, HQ, D);
    assert_int_equal(fa_backward(f->ctx, &bd), FA_OK);
    bd.d_v.data = grads + D / 2;
    expect_backward_error(f, &bd, FA_ERR_INVALID_STRIDE, "d_v.data overlaps d_k.data");
}

static void test_context_calls(void **state)
{
    (void)state;
    fa_context_t ctx = (fa_context_t)0x1;
    fa_context_options bad = { 3, FA_BACKEND_CPU, 0 };
    assert_int_equal(fa_context_create(&bad, &ctx), FA_ERR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(fa_last_create_error(), "opts->size"));
    fa_context_options neg = { sizeof(neg), FA_BACKEND_CPU, -1 };
    assert_int_equal(fa_context_create(&neg, &ctx), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_create_error(), "num_threads"));
    fa_context_options many = { sizeof(many), FA_BACKEND_CPU, FA_MAX_THREADS + 1 };
    assert_int_equal(fa_context_create(&many, &ctx), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_create_error(), "num_threads"));
    fa_context_options weird = { sizeof(weird), (fa_backend)42, 0 };
    assert_int_equal(fa_context_create(&weird, &ctx), FA_ERR_INVALID_ARGUMENT);
    if (!fa_backend_is_built(FA_BACKEND_GLES)) {
        fa_context_options gles = { sizeof(gles), FA_BACKEND_GLES, 0 };
        assert_int_equal(fa_context_create(&gles, &ctx), FA_ERR_BACKEND_UNAVAILABLE);
        assert_non_null(strstr(fa_last_create_error(), "gles"));
    }
    assert_int_equal(fa_context_create(NULL, NULL), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_forward(NULL, NULL), FA_ERR_NULL_POINTER);

    /* host tensors below: the CPU, whatever AUTO would pick on this machine */
    fa_context_options cpu = { sizeof(cpu), FA_BACKEND_CPU, 0 };
    assert_int_equal(fa_context_create(&cpu, &ctx), FA_OK);
    fa_run_info ri = { .size = sizeof(ri) };
    assert_int_equal(fa_context_last_run(ctx, &ri), FA_ERR_INVALID_ARGUMENT);
    ri.size = 1;
    assert_int_equal(fa_context_last_run(ctx, &ri), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(ctx), "info->size"));
    /* a successful call clears the message */
    ri.size = sizeof(ri);
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    float buf[64] = { 0 };
    d.batch = d.seqlen_q = d.seqlen_k = d.num_heads_q = d.num_heads_kv = 1;
    d.head_dim = 4;
    d.q = d.k = d.v = fa_tensor_contiguous(buf, FA_DTYPE_F32, FA_LAYOUT_BSHD, 1, 1, 4);
    d.o = fa_tensor_contiguous(buf + 32, FA_DTYPE_F32, FA_LAYOUT_BSHD, 1, 1, 4);
    assert_int_equal(fa_forward(ctx, &d), FA_OK);
    ri.size = 1;
    assert_int_equal(fa_context_last_run(ctx, &ri), FA_ERR_INVALID_ARGUMENT);
    ri.size = sizeof(ri);
    assert_int_equal(fa_context_last_run(ctx, &ri), FA_OK);
    assert_string_equal(fa_context_last_error(ctx), "");
    size_t need = 0;
    assert_int_equal(fa_context_info(ctx, NULL, 0, &need), FA_OK);
    assert_true(need > 1);
    char small[8];
    assert_int_equal(fa_context_info(ctx, small, sizeof(small), NULL), FA_OK);
    assert_int_equal(small[sizeof(small) - 1], '\0');
    assert_int_equal(fa_context_info(ctx, NULL, 5, NULL), FA_ERR_NULL_POINTER);
    /* the memory and stream calls clear it too when they succeed */
    void *mem = NULL;
    char host[16] = { 0 };
    for (int i = 0; i < 6; i++) {
        ri.size = 1;
        assert_int_equal(fa_context_last_run(ctx, &ri), FA_ERR_INVALID_ARGUMENT);
        assert_true(fa_context_last_error(ctx)[0] != '\0');
        fa_status st = i == 0   ? fa_context_set_stream(ctx, NULL)
                       : i == 1 ? fa_context_synchronize(ctx)
                       : i == 2 ? fa_memory_alloc(ctx, 16, &mem)
                       : i == 3 ? fa_memory_upload(ctx, mem, host, 0)
                       : i == 4 ? fa_memory_free(ctx, mem)
                                : fa_memory_free(ctx, NULL);
        assert_int_equal(st, FA_OK);
        assert_string_equal(fa_context_last_error(ctx), "");
    }
    fa_context_destroy(ctx);
    fa_context_destroy(NULL);

    assert_string_equal(fa_status_string(FA_ERR_INVALID_SHAPE), "FA_ERR_INVALID_SHAPE");
    assert_string_equal(fa_status_string((fa_status)999), "FA_ERR_UNKNOWN_STATUS");
    assert_string_equal(fa_version_string(), FA_VERSION_STRING);
    assert_string_equal(fa_backend_name(FA_BACKEND_CPU), "cpu");
    assert_true(fa_backend_is_built(FA_BACKEND_CPU));
}

/* The memory and stream calls on a host backend: round trip, argument errors, no stream. */
static void test_memory_and_stream(void **state)
{
    (void)state;
    fa_context_t ctx;
    fa_context_options o = { sizeof(o), FA_BACKEND_CPU, 1 };
    assert_int_equal(fa_context_create(&o, &ctx), FA_OK);
    const char src[] = "flashattn";
    char back[sizeof(src)] = { 0 };
    void *buf = NULL;
    assert_int_equal(fa_memory_alloc(ctx, sizeof(src), &buf), FA_OK);
    assert_non_null(buf);
    assert_int_equal(fa_memory_upload(ctx, buf, src, sizeof(src)), FA_OK);
    assert_int_equal(fa_memory_download(ctx, back, buf, sizeof(src)), FA_OK);
    assert_string_equal(back, src);
    assert_int_equal(fa_memory_upload(ctx, NULL, src, 4), FA_ERR_NULL_POINTER);
    assert_non_null(strstr(fa_context_last_error(ctx), "dst"));
    assert_int_equal(fa_memory_download(ctx, back, NULL, 4), FA_ERR_NULL_POINTER);
    assert_non_null(strstr(fa_context_last_error(ctx), "src"));
    assert_int_equal(fa_memory_alloc(ctx, 16, NULL), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_memory_free(ctx, buf), FA_OK);
    assert_int_equal(fa_memory_free(ctx, NULL), FA_OK);
    void *zero = NULL; /* zero bytes still gives a pointer the caller can free */
    assert_int_equal(fa_memory_alloc(ctx, 0, &zero), FA_OK);
    assert_non_null(zero);
    assert_int_equal(fa_memory_free(ctx, zero), FA_OK);
    assert_int_equal(fa_context_set_stream(ctx, NULL), FA_OK);
    assert_int_equal(fa_context_set_stream(ctx, (void *)&o), FA_ERR_UNSUPPORTED);
    assert_non_null(strstr(fa_context_last_error(ctx), "stream"));
    assert_int_equal(fa_context_synchronize(ctx), FA_OK);
    assert_int_equal(fa_memory_alloc(NULL, 16, &buf), FA_ERR_NULL_POINTER);
    assert_int_equal(fa_context_synchronize(NULL), FA_ERR_NULL_POINTER);
    fa_context_destroy(ctx);
}

/* fa_memory_copy on the CPU: a copy between disjoint ranges; overlapping ranges (either
 * order, or the same range), NULL and a range past the address space refused with the
 * argument named and nothing written; zero bytes a no-op. */
static void test_memory_copy(void **state)
{
    (void)state;
    fa_context_t ctx;
    fa_context_options o = { sizeof(o), FA_BACKEND_CPU, 1 };
    assert_int_equal(fa_context_create(&o, &ctx), FA_OK);
    unsigned char *buf = NULL;
    assert_int_equal(fa_memory_alloc(ctx, 64, (void **)&buf), FA_OK);
    for (int i = 0; i < 64; i++)
        buf[i] = (unsigned char)i;
    assert_int_equal(fa_memory_copy(ctx, buf + 32, buf, 32), FA_OK);
    for (int i = 0; i < 32; i++)
        assert_int_equal(buf[32 + i], i);
    assert_string_equal(fa_context_last_error(ctx), "");
    /* adjacent ranges do not overlap */
    assert_int_equal(fa_memory_copy(ctx, buf, buf + 16, 16), FA_OK);
    assert_int_equal(buf[0], 16);
    unsigned char before[64];
    memcpy(before, buf, sizeof(before));
    const struct { void *dst; const void *src; size_t n; } overlap[] = {
        { buf + 8, buf, 16 }, { buf, buf + 8, 16 }, { buf, buf, 1 }, { buf + 1, buf, 63 },
    };
    for (size_t i = 0; i < sizeof(overlap) / sizeof(overlap[0]); i++) {
        assert_int_equal(fa_memory_copy(ctx, overlap[i].dst, overlap[i].src, overlap[i].n),
                         FA_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(fa_context_last_error(ctx), "dst"));
        assert_non_null(strstr(fa_context_last_error(ctx), "overlaps src"));
        assert_memory_equal(buf, before, sizeof(before));
    }
    assert_int_equal(fa_memory_copy(ctx, NULL, buf, 4), FA_ERR_NULL_POINTER);
    assert_non_null(strstr(fa_context_last_error(ctx), "dst"));
    assert_int_equal(fa_memory_copy(ctx, buf, NULL, 4), FA_ERR_NULL_POINTER);
    assert_non_null(strstr(fa_context_last_error(ctx), "src"));
    assert_int_equal(fa_memory_copy(ctx, buf, (void *)(UINTPTR_MAX - 7), 16), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(ctx), "src"));
    assert_memory_equal(buf, before, sizeof(before));
    assert_int_equal(fa_memory_copy(ctx, NULL, NULL, 0), FA_OK);
    assert_int_equal(fa_memory_copy(ctx, buf, buf, 0), FA_OK);
    assert_int_equal(fa_memory_copy(NULL, buf + 32, buf, 4), FA_ERR_NULL_POINTER);
    assert_memory_equal(buf, before, sizeof(before));
    assert_int_equal(fa_memory_free(ctx, buf), FA_OK);
    fa_context_destroy(ctx);
}

/* A GLES context, or the test skipped where there is none (not built in, or no GLES 3.1
 * driver reachable). */
static fa_context_t gles_context(void)
{
    fa_context_t gl = NULL;
    fa_context_options o = { sizeof(o), FA_BACKEND_GLES, 0 };
    fa_status st = fa_context_create(&o, &gl);
    if (st == FA_ERR_BACKEND_UNAVAILABLE)
        skip();
    assert_int_equal(st, FA_OK);
    return gl;
}

/* The GLES backend (where a GLES 3.1 driver is reachable): host tensors in and out, the
 * same results as the CPU; dropout and the backward refused, naming them, outputs untouched. */
static void test_gles_backend(void **state)
{
    fixture *f = *state;
    fa_context_t gl = gles_context();
    static float o_cpu[B * SQ * HQ * D], lse_cpu[B * HQ * SQ];
    f->d.causal = 1;
    assert_int_equal(fa_forward(f->ctx, &f->d), FA_OK);
    memcpy(o_cpu, f->o, sizeof(o_cpu));
    memcpy(lse_cpu, f->lse, sizeof(lse_cpu));
    memset(f->o, 0x5a, sizeof(f->o));
    memset(f->lse, 0x5a, sizeof(f->lse));
    assert_int_equal(fa_forward(gl, &f->d), FA_OK);
    for (size_t i = 0; i < sizeof(o_cpu) / sizeof(float); i++)
        assert_true(fabsf(f->o[i] - o_cpu[i]) < 1e-5f);
    for (size_t i = 0; i < sizeof(lse_cpu) / sizeof(float); i++)
        assert_true(fabsf(f->lse[i] - lse_cpu[i]) < 1e-5f);
    fa_run_info ri = { .size = sizeof(ri) };
    assert_int_equal(fa_context_last_run(gl, &ri), FA_OK);
    assert_int_equal(ri.backend, FA_BACKEND_GLES);

    fa_context_t saved = f->ctx;
    f->ctx = gl;
    MUTATE(d.dropout_p = 0.1f, FA_ERR_UNSUPPORTED, "dropout_p");
    f->ctx = saved;
    fa_backward_desc bd;
    backward_desc(f, &bd);
    memset(f->dq, 0x5a, sizeof(f->dq));
    assert_int_equal(fa_backward(gl, &bd), FA_ERR_UNSUPPORTED);
    assert_non_null(strstr(fa_context_last_error(gl), "backward"));
    for (size_t i = 0; i < sizeof(f->dq); i++)
        assert_int_equal(((unsigned char *)f->dq)[i], 0x5a);
    fa_context_destroy(gl);
}

/* A GL buffer holding n bytes from host (fa_memory_alloc + upload). */
static void *gles_copy(fa_context_t gl, const void *host, size_t n)
{
    void *b = NULL;
    assert_int_equal(fa_memory_alloc(gl, n, &b), FA_OK);
    assert_int_equal(fa_memory_upload(gl, b, host, n), FA_OK);
    return b;
}

/* f16 tensors in GL buffers: o written in place as packed halves (the call's only buffer
 * is its lse), the same bits as the host-memory call, whose o goes through the unpack pass. */
static void gles_f16_in_place(fixture *f, fa_context_t gl)
{
    static _Float16 q[B * SQ * HQ * D], k[B * SK * HK * D], v[B * SK * HK * D];
    static _Float16 o_host[B * SQ * HQ * D], o_gl[B * SQ * HQ * D];
    static float lse[B * HQ * SQ];
    for (size_t i = 0; i < sizeof(f->q) / sizeof(float); i++)
        q[i] = (_Float16)f->q[i];
    for (size_t i = 0; i < sizeof(f->k) / sizeof(float); i++) {
        k[i] = (_Float16)f->k[i];
        v[i] = (_Float16)f->v[i];
    }
    fa_attention_desc h = f->d;
    h.q = fa_tensor_contiguous(q, FA_DTYPE_F16, FA_LAYOUT_BSHD, SQ, HQ, D);
    h.k = fa_tensor_contiguous(k, FA_DTYPE_F16, FA_LAYOUT_BSHD, SK, HK, D);
    h.v = fa_tensor_contiguous(v, FA_DTYPE_F16, FA_LAYOUT_BSHD, SK, HK, D);
    h.o = fa_tensor_contiguous(o_host, FA_DTYPE_F16, FA_LAYOUT_BSHD, SQ, HQ, D);
    h.lse = lse;
    assert_int_equal(fa_forward(gl, &h), FA_OK);

    memset(o_gl, 0x5a, sizeof(o_gl));
    fa_attention_desc d = h;
    d.q.data = gles_copy(gl, q, sizeof(q));
    d.k.data = gles_copy(gl, k, sizeof(k));
    d.v.data = gles_copy(gl, v, sizeof(v));
    d.o.data = gles_copy(gl, o_gl, sizeof(o_gl));
    d.lse = gles_copy(gl, lse, sizeof(lse));
    assert_int_equal(fa_forward(gl, &d), FA_OK);
    assert_int_equal(fa_memory_download(gl, o_gl, d.o.data, sizeof(o_gl)), FA_OK);
    assert_memory_equal(o_gl, o_host, sizeof(o_gl));
    fa_run_info ri = { .size = sizeof(ri) };
    assert_int_equal(fa_context_last_run(gl, &ri), FA_OK);
    assert_int_equal(ri.workspace_bytes, sizeof(lse));
    void *bufs[5] = { d.q.data, d.k.data, d.v.data, d.o.data, d.lse };
    for (int i = 0; i < 5; i++)
        assert_int_equal(fa_memory_free(gl, bufs[i]), FA_OK);
}

/* The GLES backend on tensors in GL buffers (fa_memory_alloc there): the same bits as the
 * host-memory call, and clear errors for mixed memory, views past a buffer's end and
 * pointers it did not hand out. */
static void test_gles_buffers(void **state)
{
    fixture *f = *state;
    fa_context_t gl = gles_context();
    static float o_host[B * SQ * HQ * D], lse_host[B * HQ * SQ], o_gl[B * SQ * HQ * D], lse_gl[B * HQ * SQ];
    f->d.causal = 1;
    assert_int_equal(fa_forward(gl, &f->d), FA_OK);
    memcpy(o_host, f->o, sizeof(o_host));
    memcpy(lse_host, f->lse, sizeof(lse_host));
    fa_run_info ri_host = { .size = sizeof(ri_host) }, ri_gl = { .size = sizeof(ri_gl) };
    assert_int_equal(fa_context_last_run(gl, &ri_host), FA_OK);

    void *bq = gles_copy(gl, f->q, sizeof(f->q)), *bk = gles_copy(gl, f->k, sizeof(f->k)),
         *bv = gles_copy(gl, f->v, sizeof(f->v)), *bl;
    assert_int_equal(fa_memory_alloc(gl, sizeof(f->lse), &bl), FA_OK);
    memset(o_gl, 0x5a, sizeof(o_gl));
    void *bo = gles_copy(gl, o_gl, sizeof(o_gl));
    fa_attention_desc d = f->d;
    d.q.data = bq, d.k.data = bk, d.v.data = bv, d.o.data = bo, d.lse = bl;
    assert_int_equal(fa_forward(gl, &d), FA_OK);
    assert_int_equal(fa_memory_download(gl, o_gl, bo, sizeof(o_gl)), FA_OK);
    assert_int_equal(fa_memory_download(gl, lse_gl, bl, sizeof(lse_gl)), FA_OK);
    /* a buffer's address where host memory goes: refused, not read or written (it faults) */
    assert_int_equal(fa_memory_download(gl, bo, bl, 64), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(gl), "dst"));
    assert_int_equal(fa_memory_upload(gl, bo, (char *)bl + 8, 64), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(gl), "src"));
    assert_memory_equal(o_gl, o_host, sizeof(o_gl));
    assert_memory_equal(lse_gl, lse_host, sizeof(lse_gl));
    /* f32 rows of whole vec4s: q, k and v read and o written in place, no copies of them
     * made (the call's only buffer is its lse) */
    assert_int_equal(fa_context_last_run(gl, &ri_gl), FA_OK);
    assert_true(ri_gl.workspace_bytes < ri_host.workspace_bytes);
    assert_int_equal(ri_gl.workspace_bytes, sizeof(lse_gl));
    gles_f16_in_place(f, gl);
    /* k two floats into its buffer: not vec4-aligned, so repacked first; the same bits */
    void *bk2;
    assert_int_equal(fa_memory_alloc(gl, sizeof(f->k) + 2 * sizeof(float), &bk2), FA_OK);
    assert_int_equal(fa_memory_upload(gl, (float *)bk2 + 2, f->k, sizeof(f->k)), FA_OK);
    fa_attention_desc shifted = d;
    shifted.k.data = (float *)bk2 + 2;
    memset(o_gl, 0x5a, sizeof(o_gl));
    assert_int_equal(fa_memory_upload(gl, bo, o_gl, sizeof(o_gl)), FA_OK);
    assert_int_equal(fa_forward(gl, &shifted), FA_OK);
    assert_int_equal(fa_memory_download(gl, o_gl, bo, sizeof(o_gl)), FA_OK);
    assert_memory_equal(o_gl, o_host, sizeof(o_gl));
    fa_run_info ri_shifted = { .size = sizeof(ri_shifted) };
    assert_int_equal(fa_context_last_run(gl, &ri_shifted), FA_OK);
    assert_true(ri_shifted.workspace_bytes > ri_gl.workspace_bytes);
    assert_int_equal(fa_memory_free(gl, bk2), FA_OK);

    /* k in host memory beside q in a buffer */
    fa_attention_desc m = d;
    m.k.data = f->k;
    assert_int_equal(fa_forward(gl, &m), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(gl), "k.data"));
    /* o's view one row past the end of its buffer; nothing written */
    m = d;
    m.o.data = (float *)bo + HQ * D;
    memset(o_gl, 0x5a, sizeof(o_gl));
    assert_int_equal(fa_memory_upload(gl, bo, o_gl, sizeof(o_gl)), FA_OK);
    assert_int_equal(fa_forward(gl, &m), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(gl), "o.data"));
    static float o_after[B * SQ * HQ * D];
    assert_int_equal(fa_memory_download(gl, o_after, bo, sizeof(o_after)), FA_OK);
    assert_memory_equal(o_after, o_gl, sizeof(o_gl));
    /* a copy on the GPU between buffers and inside one; host memory and ranges past a
     * buffer refused by name */
    void *bq2;
    static float q_back[sizeof(f->q) / sizeof(float)];
    assert_int_equal(fa_memory_alloc(gl, 2 * sizeof(f->q), &bq2), FA_OK);
    assert_int_equal(fa_memory_copy(gl, bq2, bq, sizeof(f->q)), FA_OK);
    assert_int_equal(fa_memory_copy(gl, (char *)bq2 + sizeof(f->q), bq2, sizeof(f->q)), FA_OK);
    assert_int_equal(fa_memory_download(gl, q_back, (char *)bq2 + sizeof(f->q), sizeof(q_back)), FA_OK);
    assert_memory_equal(q_back, f->q, sizeof(q_back));
    assert_int_equal(fa_memory_copy(gl, bq2, f->q, sizeof(f->q)), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(gl), "src"));
    assert_int_equal(fa_memory_copy(gl, (char *)bq2 + 4, bq, 2 * sizeof(f->q)), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(gl), "dst"));
    assert_int_equal(fa_memory_free(gl, bq2), FA_OK);
    /* copies past a buffer and frees of pointers it did not hand out */
    assert_int_equal(fa_memory_upload(gl, (char *)bq + 4, f->q, sizeof(f->q)), FA_ERR_INVALID_ARGUMENT);
    assert_int_equal(fa_memory_free(gl, (char *)bq + 4), FA_ERR_INVALID_ARGUMENT);
    assert_int_equal(fa_memory_free(gl, f->q), FA_ERR_INVALID_ARGUMENT);

    void *bufs[5] = { bq, bk, bv, bo, bl };
    for (int i = 0; i < 5; i++)
        assert_int_equal(fa_memory_free(gl, bufs[i]), FA_OK);
    fa_context_destroy(gl);
}

#ifdef FA_TEST_GLES
/* An application's own EGL display and ES 3.1 context (Mesa's surfaceless platform, else
 * the EGL device platform), current on this thread. 0 when there is none. */
static int caller_gl(EGLDisplay *dpy, EGLContext *gl)
{
    PFNEGLGETPLATFORMDISPLAYEXTPROC get =
        (PFNEGLGETPLATFORMDISPLAYEXTPROC)eglGetProcAddress("eglGetPlatformDisplayEXT");
    EGLint major, minor;
    if (!get)
        return 0;
    *dpy = get(EGL_PLATFORM_SURFACELESS_MESA, EGL_DEFAULT_DISPLAY, NULL);
    if (*dpy == EGL_NO_DISPLAY || !eglInitialize(*dpy, &major, &minor)) {
        PFNEGLQUERYDEVICESEXTPROC query = (PFNEGLQUERYDEVICESEXTPROC)eglGetProcAddress("eglQueryDevicesEXT");
        EGLDeviceEXT devs[4];
        EGLint n = 0;
        if (!query || !query(4, devs, &n) || n < 1)
            return 0;
        *dpy = get(EGL_PLATFORM_DEVICE_EXT, devs[0], NULL);
        if (*dpy == EGL_NO_DISPLAY || !eglInitialize(*dpy, &major, &minor))
            return 0;
    }
    const EGLint attr[] = { EGL_CONTEXT_MAJOR_VERSION, 3, EGL_CONTEXT_MINOR_VERSION, 1, EGL_NONE };
    if (!eglBindAPI(EGL_OPENGL_ES_API) ||
        (*gl = eglCreateContext(*dpy, EGL_NO_CONFIG_KHR, EGL_NO_CONTEXT, attr)) == EGL_NO_CONTEXT)
        return 0;
    return eglMakeCurrent(*dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, *gl) == EGL_TRUE;
}

static GLuint gl_buffer(const void *data, size_t bytes)
{
    GLuint b = 0;
    glGenBuffers(1, &b);
    glBindBuffer(GL_SHADER_STORAGE_BUFFER, b);
    glBufferData(GL_SHADER_STORAGE_BUFFER, (GLsizeiptr)bytes, data, GL_DYNAMIC_COPY);
    return b;
}

/* The application's own buffer objects as tensors (fa_gles_context_create +
 * fa_gles_buffer_wrap): results visible in its context right after the call, its context
 * current again after every flashattn call, its buffers left alive. */
static void test_gles_caller_buffers(void **state)
{
    fixture *f = *state;
    EGLDisplay dpy = EGL_NO_DISPLAY;
    EGLContext gl = EGL_NO_CONTEXT;
    if (!caller_gl(&dpy, &gl))
        skip();
    const GLuint bufs[5] = { gl_buffer(f->q, sizeof(f->q)), gl_buffer(f->k, sizeof(f->k)),
                             gl_buffer(f->v, sizeof(f->v)), gl_buffer(NULL, sizeof(f->o)),
                             gl_buffer(NULL, sizeof(f->lse)) };
    const size_t sizes[5] = { sizeof(f->q), sizeof(f->k), sizeof(f->v), sizeof(f->o), sizeof(f->lse) };
    fa_context_t ctx;
    assert_int_equal(fa_gles_context_create(dpy, gl, &ctx), FA_OK);
    assert_true(eglGetCurrentContext() == gl);
    void *ptr[5];
    for (int i = 0; i < 5; i++)
        assert_int_equal(fa_gles_buffer_wrap(ctx, bufs[i], sizes[i], &ptr[i]), FA_OK);
    f->d.causal = 1;
    fa_attention_desc d = f->d;
    d.q.data = ptr[0], d.k.data = ptr[1], d.v.data = ptr[2], d.o.data = ptr[3], d.lse = ptr[4];
    assert_int_equal(fa_forward(ctx, &d), FA_OK);
    assert_true(eglGetCurrentContext() == gl);
    assert_int_equal(fa_forward(f->ctx, &f->d), FA_OK); /* the CPU backend's answer */
    const float *want[2] = { f->o, f->lse };
    for (int i = 0; i < 2; i++) { /* read in the application's context */
        glBindBuffer(GL_SHADER_STORAGE_BUFFER, bufs[3 + i]);
        const float *got = glMapBufferRange(GL_SHADER_STORAGE_BUFFER, 0, (GLsizeiptr)sizes[3 + i],
                                            GL_MAP_READ_BIT);
        assert_non_null(got);
        for (size_t x = 0; x < sizes[3 + i] / sizeof(float); x++)
            assert_true(fabsf(got[x] - want[i][x]) < 1e-5f);
        glUnmapBuffer(GL_SHADER_STORAGE_BUFFER);
    }
    /* refusals: a name that is no buffer, more bytes than the buffer has, a context of its own */
    void *bad;
    assert_int_equal(fa_gles_buffer_wrap(ctx, 999999u, 16, &bad), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(ctx), "buffer"));
    assert_int_equal(fa_gles_buffer_wrap(ctx, bufs[0], sizes[0] + 4, &bad), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(ctx), "bytes"));
    assert_int_equal(fa_gles_buffer_wrap(f->ctx, bufs[0], 16, &bad), FA_ERR_UNSUPPORTED);
    /* a second view of a wrapped buffer (an output could then alias an input unseen) */
    assert_int_equal(fa_gles_buffer_wrap(ctx, bufs[3], sizes[3], &bad), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fa_context_last_error(ctx), "already wrapped"));
    /* the thread's bound EGL API is the application's after each call */
    if (eglBindAPI(EGL_OPENGL_API)) {
        assert_int_equal(fa_forward(ctx, &d), FA_OK);
        assert_true(eglQueryAPI() == EGL_OPENGL_API);
        fa_context_t own;
        fa_context_options o = { sizeof(o), FA_BACKEND_GLES, 0 };
        assert_int_equal(fa_context_create(&o, &own), FA_OK);
        assert_true(eglQueryAPI() == EGL_OPENGL_API);
        fa_context_destroy(own);
        assert_true(eglQueryAPI() == EGL_OPENGL_API);
        assert_true(eglBindAPI(EGL_OPENGL_ES_API));
    }
    fa_context_t none;
    assert_int_equal(fa_gles_context_create(dpy, NULL, &none), FA_ERR_NULL_POINTER);
    for (int i = 0; i < 5; i++)
        assert_int_equal(fa_memory_free(ctx, ptr[i]), FA_OK);
    fa_context_destroy(ctx);
    assert_true(eglGetCurrentContext() == gl);
    for (int i = 0; i < 5; i++) { /* still the application's */
        assert_true(glIsBuffer(bufs[i]));
        glDeleteBuffers(1, &bufs[i]);
    }
    eglMakeCurrent(dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
    eglDestroyContext(dpy, gl);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_valid_call_succeeds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pointers_and_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strides, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scalars, setup, teardown),
        cmocka_unit_test_setup_teardown(test_varlen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lse_strides, setup, teardown),
        cmocka_unit_test_setup_teardown(test_huge_shapes_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backward_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fp8_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlapping_outputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interleaved_views, setup, teardown),
        cmocka_unit_test(test_context_calls),
        cmocka_unit_test(test_memory_and_stream),
        cmocka_unit_test(test_memory_copy),
        cmocka_unit_test_setup_teardown(test_gles_backend, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gles_buffers, setup, teardown),
#ifdef FA_TEST_GLES
        cmocka_unit_test_setup_teardown(test_gles_caller_buffers, setup, teardown),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
