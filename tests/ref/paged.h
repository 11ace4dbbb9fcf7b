/* SPDX-License-Identifier: MIT */
/*
 * Paged calls against the float64 reference: a case (lengths, pages, layout, append, RoPE,
 * masks, sinks) built from a seed, run through fa_paged_forward or a plan, and judged.
 */
#ifndef FA_TEST_PAGED_H
#define FA_TEST_PAGED_H

#include "ref.h"

#define FA_PAGED_CASE_MAX_BATCH 8

typedef enum fa_paged_layout {
    FA_PAGED_NHD = 0,     /* [page, token, head, dim], K and V apart */
    FA_PAGED_HND = 1,     /* [page, head, token, dim], K and V apart */
    FA_PAGED_COMBINED = 2 /* one tensor [page, 2, token, head, dim] (vLLM's combined cache) */
} fa_paged_layout;

typedef struct fa_paged_case {
    fa_dtype dtype;
    int o_f32;
    int32_t batch, heads_q, heads_kv, head_dim, page_size;
    int32_t q_lens[FA_PAGED_CASE_MAX_BATCH];     /* new (query) rows per sequence */
    int32_t cache_lens[FA_PAGED_CASE_MAX_BATCH]; /* tokens cached before the call */
    int append;
    fa_rope rope;
    int32_t rope_dim;
    int positions; /* give explicit positions (shuffled) instead of the implied ones */
    fa_paged_layout layout;
    int runs; /* pages handed out in runs of consecutive ids (an allocator's), not shuffled one by one */
    int32_t causal, window_left, window_right;
    float softcap;
    int sinks, with_lse;
    int32_t kv_split;
    int use_plan; /* plan + run (with bounds larger than the call) instead of the one-shot call */
    uint64_t seed;
} fa_paged_case;

typedef struct fa_paged_result {
    int passed;
    double err, err_standard, tolerance, lse_err, lse_tol;
    double cache_err; /* appended keys against the float64 rotation, in units of their rounding */
    char message[640];
    char kernel[48]; /* what the call ran (fa_context_last_run) */
} fa_paged_result;

/* One line that replays the case. */
void fa_paged_case_format(const fa_paged_case *c, char *buf, size_t cap);

/*
 * Run c on ctx and judge it: o and lse against the float64 reference (which rotates and
 * appends in float64), with the tolerance of the standard algorithm run densely on the same
 * keys in the same precision; the cache holds exactly the old tokens plus the rotated new
 * ones; a sequence's output has the same bits when it runs alone (batch invariance). 0 when
 * the case could run (see res->passed), -1 on an API or memory error (message filled).
 */
int fa_paged_case_run(fa_context_t ctx, const fa_paged_case *c, fa_paged_result *res);

/* A case's call in host memory (for the CPU backend): the descriptor, and every byte the call
 * may write (o, lse, the pools) so that a refused call can be checked to have written none. */
typedef struct fa_paged_host {
    fa_paged_desc d;
    void *o, *lse, *pool;
    int64_t o_bytes, lse_bytes, pool_bytes;
    void *priv;
} fa_paged_host;

/* 0, or -1 when out of memory (nothing to free then). */
int fa_paged_case_host(const fa_paged_case *c, fa_paged_host *h);
void fa_paged_host_free(fa_paged_host *h);

/* The paged grid: level 0 quick, 1 full. Returns the cases written (at most cap). */
int fa_paged_grid_build(int level, uint64_t seed, fa_paged_case *out, int cap);

/*
 * Float64 paged attention straight from fa_paged_desc's definition, host memory: the cache
 * as it was before the call (k_before / v_before: the pools' bytes, at the desc's strides),
 * the new rows rotated in float64 and appended (rounded to the cache's dtype, as the cache
 * holds them). o[(row*hq + h)*dim + x], lse[row*hq + h];
 * score_max (optional) gets the largest |scale * q.k| of a visible pair; q_round (optional,
 * [row*hq + h] as lse) each row's largest change of a visible score that its query rotated in
 * float32, then rounded to an f16 / bf16 q's dtype, can show against this float64 rotation
 * rounded (0 without RoPE or for f32). 0, or -1 when out of memory.
 */
int fa_ref_paged(const fa_paged_desc *d, const void *k_before, const void *v_before, double *o,
                 double *lse, double *score_max, double *q_round);

/* x rounded to the nearest value of dtype t (ties to even, through float32): what a cache of
 * that dtype holds, and a kernel's rotated query. */
double fa_ref_round(fa_dtype t, double x);

/* The float64 rotation of row x (head_dim values) at position pos, as fa_paged_desc says. */
void fa_ref_rope(const fa_paged_desc *d, double *x, int64_t pos);

#endif
