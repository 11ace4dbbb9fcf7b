/* SPDX-License-Identifier: MIT */
/*
 * The GLES host decides once: a call's kernel, tiles and workspace come from the call alone
 * (the plan reports what runs; the same call gives the same report and the same bits after
 * calls of other sizes have grown the context's working buffers), and calls with nothing to
 * read or write touch nothing they should not; the shader-binary cache runs only the program
 * a file was kept for. Skipped where no GLES 3.1 driver is reachable.
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
#include <dirent.h>
#include <unistd.h>

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

/* Host tensors of one shape: [batch, seq, heads, dim] f32, values from a fixed pattern. */
typedef struct call {
    int32_t b, sq, sk, h, d;
    float *q, *k, *v, *o, *lse;
    fa_attention_desc desc;
} call;

static void call_make(call *c, int32_t b, int32_t sq, int32_t sk, int32_t h, int32_t d, int causal)
{
    *c = (call){ .b = b, .sq = sq, .sk = sk, .h = h, .d = d };
    const size_t nq = (size_t)b * sq * h * d, nk = (size_t)b * sk * h * d;
    c->q = malloc(sizeof(float) * (nq ? nq : 1));
    c->k = malloc(sizeof(float) * (nk ? nk : 1));
    c->v = malloc(sizeof(float) * (nk ? nk : 1));
    c->o = malloc(sizeof(float) * (nq ? nq : 1));
    c->lse = malloc(sizeof(float) * ((size_t)b * h * sq + 1));
    assert_true(c->q && c->k && c->v && c->o && c->lse);
    for (size_t i = 0; i < nq; i++)
        c->q[i] = (float)((i * 37) % 23) / 23.0f - 0.5f;
    for (size_t i = 0; i < nk; i++) {
        c->k[i] = (float)((i * 13) % 19) / 19.0f - 0.5f;
        c->v[i] = (float)((i * 29) % 17) / 17.0f - 0.5f;
    }
    fa_attention_desc *x = &c->desc;
    fa_attention_desc_init(x);
    x->batch = b;
    x->seqlen_q = sq;
    x->seqlen_k = sk;
    x->num_heads_q = x->num_heads_kv = h;
    x->head_dim = d;
    x->q = fa_tensor_contiguous(c->q, FA_DTYPE_F32, FA_LAYOUT_BSHD, sq, h, d);
    x->k = fa_tensor_contiguous(c->k, FA_DTYPE_F32, FA_LAYOUT_BSHD, sk, h, d);
    x->v = fa_tensor_contiguous(c->v, FA_DTYPE_F32, FA_LAYOUT_BSHD, sk, h, d);
    x->o = fa_tensor_contiguous(c->o, FA_DTYPE_F32, FA_LAYOUT_BSHD, sq, h, d);
    x->lse = c->lse;
    x->causal = causal;
}

static void call_free(call *c)
{
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->o);
    free(c->lse);
}

static void same_report(const fa_run_info *a, const fa_run_info *b)
{
    assert_string_equal(a->kernel, b->kernel);
    assert_int_equal(a->block_q, b->block_q);
    assert_int_equal(a->block_k, b->block_k);
    assert_int_equal(a->threads, b->threads);
    assert_int_equal(a->workspace_bytes, b->workspace_bytes);
}

/* One call, then calls of other sizes (larger and smaller, other head_dims, the standard
 * algorithm and decode), then the first again: the same plan, the same report and the same
 * bits. */
static void test_same_call_same_result(void **state)
{
    (void)state;
    fa_context_t gl = gles_context();
    call a, others[4];
    /* small head dims: each compiles in a second or two on CPU renderers */
    call_make(&a, 2, 70, 90, 2, 32, 1);
    call_make(&others[0], 1, 300, 400, 4, 32, 0);
    call_make(&others[1], 3, 33, 17, 1, 8, 1);
    call_make(&others[2], 1, 1, 700, 3, 16, 0);
    call_make(&others[3], 1, 129, 129, 2, 32, 1);
    others[3].desc.algorithm = FA_ALGORITHM_STANDARD;
    const size_t no = sizeof(float) * 2 * 70 * 2 * 32, nl = sizeof(float) * 2 * 2 * 70;
    float *o1 = malloc(no), *l1 = malloc(nl);
    assert_true(o1 && l1);

    fa_run_info plan1 = { .size = sizeof(plan1) }, ran1 = { .size = sizeof(ran1) };
    assert_int_equal(fa_forward_plan(gl, &a.desc, &plan1), FA_OK);
    assert_int_equal(fa_forward(gl, &a.desc), FA_OK);
    assert_int_equal(fa_context_last_run(gl, &ran1), FA_OK);
    same_report(&plan1, &ran1);
    memcpy(o1, a.o, no);
    memcpy(l1, a.lse, nl);

    for (int i = 0; i < 4; i++)
        assert_int_equal(fa_forward(gl, &others[i].desc), FA_OK);

    fa_run_info plan2 = { .size = sizeof(plan2) }, ran2 = { .size = sizeof(ran2) };
    memset(a.o, 0x5a, no);
    memset(a.lse, 0x5a, nl);
    assert_int_equal(fa_forward_plan(gl, &a.desc, &plan2), FA_OK);
    assert_int_equal(fa_forward(gl, &a.desc), FA_OK);
    assert_int_equal(fa_context_last_run(gl, &ran2), FA_OK);
    same_report(&plan1, &plan2);
    same_report(&ran1, &ran2);
    assert_memory_equal(o1, a.o, no);
    assert_memory_equal(l1, a.lse, nl);

    free(o1);
    free(l1);
    call_free(&a);
    for (int i = 0; i < 4; i++)
        call_free(&others[i]);
    fa_context_destroy(gl);
}

/* Varlen batches whose sequences are all empty, from host memory: nothing to read, nothing
 * written (the bytes past the tensors' ends are guarded under AddressSanitizer); then empty
 * key sets under non-empty queries: zero rows and an LSE of -inf. */
static void test_empty_sequences(void **state)
{
    (void)state;
    fa_context_t gl = gles_context();
    enum { H = 2, D = 16 };
    int32_t cu_zero[4] = { 0, 0, 0, 0 };
    float *q = malloc(1), *k = malloc(1), *v = malloc(1), *o = malloc(1), *lse = malloc(1);
    assert_true(q && k && v && o && lse);
    memset(o, 0x5a, 1);
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 3;
    d.seqlen_q = d.seqlen_k = 0;
    d.num_heads_q = d.num_heads_kv = H;
    d.head_dim = D;
    d.cu_seqlens_q = cu_zero;
    d.cu_seqlens_k = cu_zero;
    d.q = (fa_tensor){ q, FA_DTYPE_F32, 0, H * D, D };
    d.k = (fa_tensor){ k, FA_DTYPE_F32, 0, H * D, D };
    d.v = (fa_tensor){ v, FA_DTYPE_F32, 0, H * D, D };
    d.o = (fa_tensor){ o, FA_DTYPE_F32, 0, H * D, D };
    d.lse = lse; /* strides 0: [heads, total_q] */
    assert_int_equal(fa_forward(gl, &d), FA_OK);
    assert_int_equal(((unsigned char *)o)[0], 0x5a);

    /* queries, no keys: o = 0, lse = -inf */
    int32_t cu_q[4] = { 0, 2, 2, 5 };
    float q5[5 * H * D], o5[5 * H * D], lse5[H * 5];
    for (size_t i = 0; i < sizeof(q5) / sizeof(float); i++)
        q5[i] = (float)i / 100.0f;
    memset(o5, 0x5a, sizeof(o5));
    memset(lse5, 0x5a, sizeof(lse5));
    d.cu_seqlens_q = cu_q;
    d.seqlen_q = 5;
    d.q.data = q5;
    d.o.data = o5;
    d.lse = lse5;
    assert_int_equal(fa_forward(gl, &d), FA_OK);
    for (size_t i = 0; i < sizeof(o5) / sizeof(float); i++)
        assert_true(o5[i] == 0.0f);
    for (size_t i = 0; i < sizeof(lse5) / sizeof(float); i++)
        assert_true(isinf(lse5[i]) && lse5[i] < 0);
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    fa_context_destroy(gl);
}

/* Paged calls are refused with the feature named, before any table is read. */
static void test_paged_refused(void **state)
{
    (void)state;
    fa_context_t gl = gles_context();
    fa_paged_desc d;
    fa_paged_desc_init(&d);
    assert_int_equal(fa_paged_forward(gl, &d), FA_ERR_UNSUPPORTED);
    assert_non_null(strstr(fa_context_last_error(gl), "paged KV cache"));
    fa_paged_plan_t plan = NULL;
    assert_int_equal(fa_paged_plan_create(gl, &d, &plan), FA_ERR_UNSUPPORTED);
    assert_null(plan);
    assert_int_equal(fa_kv_append(gl, &d), FA_ERR_UNSUPPORTED);
    fa_context_destroy(gl);
}

/* The shader-binary cache holds each program under its own key: cached files swapped among
 * themselves (or damaged) are recompiled, never run as another program. */
static void test_binary_cache_keyed(void **state)
{
    (void)state;
    char dir[] = "/tmp/fa-gles-cache-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *keep = getenv("FLASHATTN_CACHE_DIR");
    char *saved = keep ? strdup(keep) : NULL;
    setenv("FLASHATTN_CACHE_DIR", dir, 1);
    call c[2];
    call_make(&c[0], 1, 40, 50, 2, 16, 1);
    call_make(&c[1], 1, 1, 300, 2, 8, 0); /* another head_dim and a decode: other programs */
    const size_t no[2] = { sizeof(float) * 40 * 2 * 16, sizeof(float) * 1 * 2 * 8 };
    float *want[2] = { malloc(no[0]), malloc(no[1]) };
    assert_true(want[0] && want[1]);
    fa_context_t gl = gles_context();
    for (int i = 0; i < 2; i++) { /* compiles and keeps its programs */
        assert_int_equal(fa_forward(gl, &c[i].desc), FA_OK);
        memcpy(want[i], c[i].o, no[i]);
    }
    fa_context_destroy(gl);
    enum { MAXF = 32 };
    char names[MAXF][512];
    void *data[MAXF];
    long sizes[MAXF];
    int n = 0;
    DIR *dd = opendir(dir);
    assert_non_null(dd);
    for (struct dirent *e; (e = readdir(dd)) && n < MAXF;) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(names[n], sizeof(names[n]), "%s/%s", dir, e->d_name);
        FILE *f = fopen(names[n], "rb");
        assert_non_null(f);
        fseek(f, 0, SEEK_END);
        sizes[n] = ftell(f);
        rewind(f);
        data[n] = malloc((size_t)sizes[n]);
        assert_true(data[n] && fread(data[n], 1, (size_t)sizes[n], f) == (size_t)sizes[n]);
        fclose(f);
        n++;
    }
    closedir(dd);
    assert_true(n >= 2);
    for (int i = 0; i < n; i++) { /* file i gets file i + 1's program */
        FILE *f = fopen(names[i], "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(data[(i + 1) % n], 1, (size_t)sizes[(i + 1) % n], f), (size_t)sizes[(i + 1) % n]);
        fclose(f);
    }
    print_message("%d cached programs, each file replaced by another's\n", n);
    gl = gles_context();
    for (int i = 0; i < 2; i++) {
        memset(c[i].o, 0x5a, no[i]);
        assert_int_equal(fa_forward(gl, &c[i].desc), FA_OK);
        assert_memory_equal(want[i], c[i].o, no[i]);
    }
    fa_context_destroy(gl);
    for (int i = 0; i < n; i++)
        remove(names[i]), free(data[i]);
    rmdir(dir);
    if (saved)
        setenv("FLASHATTN_CACHE_DIR", saved, 1), free(saved);
    else
        unsetenv("FLASHATTN_CACHE_DIR");
    for (int i = 0; i < 2; i++)
        free(want[i]), call_free(&c[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_call_same_result),
        cmocka_unit_test(test_empty_sequences),
        cmocka_unit_test(test_paged_refused),
        cmocka_unit_test(test_binary_cache_keyed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
