/* SPDX-License-Identifier: MIT */
/*
 * The one float64 reference every backend is checked against, and the
 * conformance grid built on it (used by the test suite and `flashattn check`).
 */
#ifndef FA_TEST_REF_H
#define FA_TEST_REF_H

#include "flashattn.h"

#include <stdint.h>

/* ---- values ---- */

/* Bytes of an element of dtype t. */
int64_t fa_ref_dtype_bytes(fa_dtype t);

/* Exact decode of one element of dtype t. */
double fa_ref_decode(fa_dtype t, const void *base, int64_t index);

/* Store x as dtype t, rounding toward zero (inputs only need to be representable). */
void fa_ref_encode(fa_dtype t, void *base, int64_t index, double x);

/* splitmix64: small, seedable, good enough for test data. */
typedef struct fa_rng {
    uint64_t s;
} fa_rng;
uint64_t fa_rng_next(fa_rng *r);
double fa_rng_uniform(fa_rng *r); /* [-1, 1) */

/* ---- reference ---- */

/*
 * Naive attention in float64 straight from the definition in flashattn.h,
 * reading q/k/v through the descriptor's strides. Rows are indexed by packed
 * row (b*seqlen_q + i, or the varlen row): o[(row*hq + h)*dim + x] and
 * lse[row*hq + h]. When rows_every > 1 only rows with (row % rows_every) == 0
 * are computed (sampling for very large shapes). score_max (optional) gets the
 * largest |scale * q.k| of a visible pair, before any cap: a float32 kernel's
 * rounding of scores, and so of lse, grows with it. Returns 0, or -1 when out of
 * memory.
 */
int fa_ref_attention(const fa_attention_desc *d, int64_t rows_every, double *o, double *lse,
                     double *score_max);

/*
 * Naive float64 backward of the call bd->forward describes, with d_o read
 * through its strides. Rows in packed order as fa_ref_attention:
 * dq[(row*hq + h)*dim + x], dk and dv [(krow*hkv + hk)*dim + x]. Returns 0,
 * or -1 when out of memory.
 */
int fa_ref_backward(const fa_backward_desc *bd, double *dq, double *dk, double *dv);

/* ---- conformance ---- */

typedef enum fa_case_layout { FA_CASE_BSHD = 0, FA_CASE_BHSD = 1, FA_CASE_QKV_PACKED = 2 } fa_case_layout;

typedef struct fa_case {
    fa_dtype dtype;
    int o_f32; /* write o as float32 instead of the input dtype */
    int32_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int32_t causal, window_left, window_right;
    float softcap;
    float scale; /* 0 = default */
    fa_case_layout layout;
    int varlen; /* per-sequence lengths drawn at random up to seqlen_q/k */
    int with_lse;
    float logit_scale; /* inputs drawn in [-logit_scale, logit_scale) for q (large logits) */
    float dropout_p;   /* 0 = off */
    int descale;       /* fp8 inputs: 0 no factors, 1 one a tensor, 2 one per (batch, kv head),
                        * 3 one per (batch, kv head, block of rows: sizes by the seed) */
    uint64_t seed;
} fa_case;

typedef struct fa_case_result {
    int passed;
    double err_flash;    /* max abs error of o against float64 */
    double err_standard; /* same for the standard algorithm in the same precision */
    double tolerance;
    double lse_err_flash, lse_err_standard;
    const char *kernel; /* what the flash run ran (fa_run_info.kernel), NULL when it did not run */
    char message[512];
} fa_case_result;

/* A case's tensors and descriptor (o and lse allocated, not computed). */
typedef struct fa_case_inputs {
    fa_attention_desc d;
    void *q, *kv, *o;
    float *lse;
    float *ds; /* fp8: the descale factors of q, k and v, [3][batch][heads_kv] */
    int32_t *cu_q, *cu_k;
    int64_t rows, krows; /* packed query / key rows */
    int64_t q_bytes, kv_bytes, o_bytes, lse_bytes, ds_bytes;
} fa_case_inputs;

/* A case's buffers mirrored in the memory ctx's backend computes on (device memory for
 * CUDA), with a descriptor pointing there; cu_seqlens stay on the host. */
typedef struct fa_case_staged {
    fa_attention_desc d;
    void *q, *kv, *o;
    float *lse, *ds;
} fa_case_staged;

/* Allocate and upload in's tensors (o and lse uninitialised). 0, or -1 with msg filled. */
int fa_case_stage(fa_context_t ctx, const fa_case_inputs *in, fa_case_staged *st, char *msg,
                  size_t cap);
void fa_case_unstage(fa_context_t ctx, fa_case_staged *st);

/* A host buffer of bytes (any pointer into [host, host+bytes) of a staged pair) mapped to
 * the backend copy: dev + (p - host). */
void *fa_case_translate(const void *p, const void *host, void *dev, int64_t bytes);

/* Build the inputs of c (fresh random values from c->seed). 0, or -1 when out of memory. */
int fa_case_inputs_make(const fa_case *c, int with_lse, fa_case_inputs *in);
void fa_case_inputs_free(fa_case_inputs *in);

/* Fill n elements of dtype t with uniform values in [-amp, amp). */
void fa_ref_fill(fa_rng *r, fa_dtype t, void *p, int64_t n, double amp);

/* Element 0 of every v vector (at v + i s0 + j s1 + k s2, elements) made non-negative, so that
 * o's largest element is as large as the terms of the sums that make it: the tolerances'
 * floors and the standard's gross bound scale with max |o|, and signed values over a few keys
 * cancel far below their terms' rounding (d1 over 17 bf16 keys: max |o| 0.0037 against the
 * standard's error of 3.3e-4). The descriptor fuzzer does the same through its own layouts. */
void fa_ref_v_first_nonneg(fa_dtype t, void *v, int64_t n0, int64_t s0, int64_t n1, int64_t s1, int64_t n2,
                           int64_t s2);

/* Unit roundoff of a dtype: tolerance floors scale with it. */
double fa_unit_roundoff(fa_dtype t);

/* The largest error a fused output may have: twice the standard algorithm's in the same
 * precision, plus a floor of max(|o|, 1e-3) times 16 units of the output's roundoff or one of
 * the inputs', the larger. The second binds for a float32 o of 16-bit inputs: P is rounded to
 * the inputs' type before P V (the GPU kernels' tensor-core operands), and over a few keys
 * which of two such roundings lands nearer is a coin toss (0.03-0.2 units of it, flash at
 * 3-8x the standard's error, on 3 of 5000 fuzzed CUDA descriptors). */
double fa_output_tolerance(double err_standard, double ref_max, fa_dtype in, fa_dtype out);

/* Describe a case in one line (for replays): "f16 b2 sq17 sk129 hq8 hkv1 d80 causal ...". */
void fa_case_format(const fa_case *c, char *buf, size_t cap);

/* Run one case on ctx: flash and standard against float64. Returns 0 when it
 * could run (see result.passed), -1 on an API error (message filled). */
int fa_case_run(fa_context_t ctx, const fa_case *c, fa_case_result *res);

/* fa_case_run's check of a call already built and staged (st from fa_case_stage of in; any
 * strides, o and lse anywhere in their buffers): the standard algorithm, then flash, against
 * float64 over in->rows packed query rows. Before each run o's buffer is filled with 0xff
 * bytes and lse's with NaN; after, in->o and in->lse hold what the flash run left there.
 * label ends a failure message. 0 when it could run (see res->passed), -1 on an API error. */
int fa_case_run_staged(fa_context_t ctx, fa_case_inputs *in, fa_case_staged *st,
                       const char *label, fa_case_result *res);

typedef struct fa_bwd_result {
    int passed;
    double err_flash[3], err_standard[3], tolerance[3]; /* dq, dk, dv */
    char message[640];
} fa_bwd_result;

/* Run one case's backward on ctx (after its flash forward): flash and standard
 * backward against float64. 0 when it could run, -1 on an API error. */
int fa_case_run_backward(fa_context_t ctx, const fa_case *c, fa_bwd_result *res);

/* The backend a test runs on: FLASHATTN_TEST_BACKEND = cpu (default), cuda or gles. */
fa_backend fa_test_backend(void);

/* The field ctx's backend refuses case c for, NULL when it runs it: CUDA refuses f32
 * ("dtype") and fp8 where it is not Hopper ("dtype"), GLES fp8 ("dtype") and dropout
 * ("dropout_p"). fa_case_run and fa_case_run_backward then check instead that the case is
 * refused with FA_ERR_UNSUPPORTED naming that field (fa_case_check_refused: 0 when that
 * refusal is right, -1 with msg filled when not). */
const char *fa_backend_refuses(fa_context_t ctx, const fa_case *c);
int fa_case_check_refused(fa_context_t ctx, const fa_case *c, const char *field, char *msg,
                          size_t cap);

/* FLASHATTN_TEST_EVERY=N runs every Nth grid case only (slow tools: sanitizers). */
int fa_test_case_every(void);

/* The conformance grid. level 0 = quick (short sequences), 1 = full: every dtype x head_dim x
 * sequence length with the features in turn, then decode shapes (1 to 4 query rows, GQA groups
 * 1, 4 and 8, short and long keys). Returns the number of cases written (at most cap, 240 in
 * all), derived from seed. */
int fa_grid_build(int level, uint64_t seed, fa_case *out, int cap);

/* Room for every case fa_grid_build makes. */
#define FA_GRID_MAX 320

#endif
