/* SPDX-License-Identifier: MIT */
/* The CPU backend's internals: machine description, plan, and the two algorithms. */
#ifndef FA_CPU_H
#define FA_CPU_H

#include "../core/internal.h"
#include "../core/views.h"
#include "kernels/kernels.h"

#include <float.h>
#include <math.h>
#include <string.h>

typedef struct fa_cpu_machine {
    fa_cpu_features feat;
    int64_t l1d_bytes, l2_bytes, l3_bytes; /* per core for L1/L2 */
    int max_threads;
} fa_cpu_machine;

typedef struct fa_cpu_state {
    fa_cpu_machine mach;
    const fa_cpu_kernels *kern;
    const fa_cpu_kernel_entry *table; /* kern's entry: its report names */
    const char *kern_reason; /* why this table was chosen */
    int threads;
    /* decode's workspace, kept between calls (one-token calls are microseconds of work:
     * four allocations each were a measurable share); grows as needed */
    void *scratch;
    size_t scratch_bytes;
} fa_cpu_state;

/*
 * How a call is cut up. A task is (sequence, kv head, block of query
 * positions); its columns are every (position, query head of the kv group)
 * pair, so the key/value tiles it loads serve the whole GQA group.
 */
typedef struct fa_cpu_plan {
    int32_t pos_per_task;  /* query positions per task */
    int32_t cols;          /* pos_per_task * group: query rows a task computes */
    int32_t cols_pad;      /* cols rounded up to the kernel's nr */
    int32_t cols_vec;      /* cols rounded up to nr / 2: the columns the softmax touches */
    int32_t block_k;       /* keys per tile (decode: keys per chunk) */
    int32_t dim_pad;       /* head_dim rounded up to nr (the O and V tile width) */
    int use_dot;           /* few columns: dot kernels; flash runs the split-KV decode */
    int32_t decode_heads;  /* decode: kv heads one task walks together */
    int64_t task_count;
    int64_t per_thread_floats;
    int threads;
    uint64_t workspace_bytes;
} fa_cpu_plan;

void fa_cpu_machine_probe(fa_cpu_machine *m);

/* Query columns per task, key tile, task count and threads (the part of a plan
 * every algorithm shares). */
void fa_cpu_plan_columns(const fa_cpu_state *s, const fa_problem *p, fa_cpu_plan *plan);

/* Backward (backward.c): plan and run. */
fa_status fa_cpu_plan_backward(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                               fa_cpu_plan *plan);
fa_status fa_cpu_backward(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                          const fa_cpu_plan *plan);

/* Choose tiles for p on this machine. FA_ERR_SIZE_OVERFLOW if the workspace cannot be sized. */
fa_status fa_cpu_plan_flash(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                            fa_cpu_plan *plan);
fa_status fa_cpu_plan_standard(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                               fa_cpu_plan *plan);

fa_status fa_cpu_flash_forward(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                               const fa_cpu_plan *plan);
/* Split-KV decode for plans with use_dot (decode.c). */
fa_status fa_cpu_decode_forward(fa_context_t ctx, fa_cpu_state *s, const fa_problem *p,
                                const fa_cpu_plan *plan);
fa_status fa_cpu_standard_forward(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                                  const fa_cpu_plan *plan);

/* The kernel's name in reports, e.g. "flash-avx2-decode" (backend.c). */
const char *fa_cpu_kernel_name(const fa_cpu_state *s, int standard, int dot, int paged);

/* Paged calls (paged.c): plan, run, append, merge. */
fa_status fa_cpu_paged_plan(fa_context_t ctx, void *state, const fa_problem *p, void **plan,
                            fa_run_info *info);
fa_status fa_cpu_paged_run(fa_context_t ctx, void *state, void *plan, const fa_problem *p,
                           fa_run_info *info);
void fa_cpu_paged_plan_free(void *state, void *plan);
fa_status fa_cpu_append(fa_context_t ctx, void *state, const fa_problem *p);
/* A paged call's new rows into its pages (RoPE on the keys first); the forwards call it for
 * p->paged->append once their workspace is held, so that nothing is written on error. */
fa_status fa_cpu_append_rows(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p);
fa_status fa_cpu_merge(fa_context_t ctx, void *state, const fa_merge_desc *d);

/* Carve `count` floats from a per-thread block at offset *n (64-byte aligned
 * pieces); with base NULL it only advances *n, to size the block. */
static inline float *fa_ws_take(float *base, int64_t *n, int64_t count)
{
    float *p = base ? base + *n : NULL;
    *n += (count + 15) & ~(int64_t)15;
    return p;
}

/* Floats of per-thread workspace each algorithm carves from one block. */
int64_t fa_cpu_flash_thread_floats(const fa_problem *p, const fa_cpu_plan *plan);
int64_t fa_cpu_decode_thread_floats(const fa_cpu_kernels *kern, const fa_problem *p,
                                    const fa_cpu_plan *plan);
/* Decode: floats of one chunk's partial results, and the chunks of sequence b
 * with the key range [lo, hi) they split. */
int64_t fa_cpu_decode_slot_floats(const fa_problem *p, const fa_cpu_plan *plan);
int64_t fa_cpu_decode_chunks(const fa_problem *p, const fa_cpu_plan *plan, int32_t b, int64_t *lo,
                             int64_t *hi);
int64_t fa_cpu_standard_thread_floats(const fa_problem *p, const fa_cpu_plan *plan);
/* Floats of standard attention's score matrix, or -1 when the count overflows. */
int64_t fa_cpu_standard_scores(const fa_problem *p, const fa_cpu_plan *plan);

/* ---- tile helpers shared by both algorithms (tile.c) ---- */

/* Element offset of row `row` (packed index) of head h in tensor t for sequence b. */
static inline int64_t fa_row_offset(const fa_problem *p, const fa_tensor *t, int32_t b,
                                    int64_t row, int32_t h)
{
    return (p->varlen ? 0 : (int64_t)b * t->stride_batch) + row * t->stride_seq +
           (int64_t)h * t->stride_head;
}

static inline const char *fa_elem_ptr(const fa_tensor *t, int64_t off)
{
    return (const char *)t->data + off * fa_dtype_bytes(t->dtype);
}

/* Query columns of a task: column c is position r0 + c / group of query head hk*group + c % group. */
typedef struct fa_cpu_cols {
    int32_t b, hk;
    fa_seq seq;
    int64_t r0;  /* first position (within the sequence) */
    int32_t npos;
    int32_t ncols;
} fa_cpu_cols;

/* Key or value row j (within the sequence) of kv head cc->hk in t (desc->k or desc->v), and
 * in *run how many rows from j on follow at t->stride_seq: the rest of a page in a paged
 * cache, every row in a dense one. */
static inline const char *fa_cpu_kv_row(const fa_problem *p, const fa_tensor *t,
                                        const fa_cpu_cols *cc, int64_t j, int32_t *run)
{
    if (p->paged)
        return fa_elem_ptr(t, fa_problem_kv_offset(p, t, cc->b, j, cc->hk, run));
    *run = INT32_MAX;
    return fa_elem_ptr(t, fa_row_offset(p, t, cc->b, cc->seq.k_start + j, cc->hk));
}

/* Score elements below which a call runs on one thread whatever its plan says. */
#define FA_CPU_ONE_THREAD_SCORES ((int64_t)1 << 15)

/* A unit of parallel work: a block of query positions of one sequence and kv head. */
typedef struct fa_cpu_task {
    int64_t cost; /* score elements it computes */
    int32_t b, hk, blk;
} fa_cpu_task;

/* Fill tasks (plan->task_count entries), longest first so causal work balances. Returns the count. */
int64_t fa_cpu_build_tasks(const fa_problem *p, const fa_cpu_plan *plan, fa_cpu_task *tasks);

fa_cpu_cols fa_cpu_task_cols(const fa_problem *p, const fa_cpu_plan *plan, const fa_cpu_task *t);

/* Load the columns' rows of a query-shaped tensor t (q, d_o, o) scaled by mul (and by each
 * row's factor in rows, fp8 factors per block of rows, NULL: none): transposed into nr-wide
 * panels [cols_pad/nr][dim][nr], or row-major rows of ld floats (zero-padded, cols_pad rows). */
void fa_cpu_pack_cols(const fa_cpu_kernels *kern, const fa_problem *p, const fa_tensor *t,
                      const fa_cpu_cols *cc, int32_t cols_pad, int transposed, int32_t ld, double mul,
                      const fa_descale *rows, float *dst, float *tmp);

/* Queries: transposed panels (gemm path) or row-major [ncols][dim] (dot path). */
void fa_cpu_pack_q(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_cols *cc,
                   int32_t cols_pad, int transposed, float mul, float *dst, float *tmp);

/* Keys/values [j0, j0+n) of kv head hk as float32 rows of ld floats (zero-padded to ld). */
void fa_cpu_load_rows(const fa_cpu_kernels *kern, const fa_problem *p, const fa_tensor *t,
                      const fa_cpu_cols *cc, int64_t j0, int32_t n, int32_t ld, float *dst);

/* Masks on a transposed score tile st[j*lds + c], keys [j0, j0+n): -inf where a
 * column's row may not see the key. full_tile: nothing to do. */
void fa_cpu_mask(const fa_problem *p, const fa_cpu_cols *cc, int64_t j0, int32_t n, float *st,
                 int32_t lds, int full_tile);

/* Dropout on a probability tile st[j*lds + c], keys [j0, j0+n), columns c <
 * cols (a multiple of nr / 2; padding columns get some factor, harmlessly):
 * kept entries scaled by 1/(1-p), dropped ones zeroed. ids: 2 * cols ints. */
void fa_cpu_dropout(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_cols *cc,
                    int64_t j0, int32_t n, float *st, int32_t lds, int32_t cols, int32_t *ids);

/* Divide by l, convert, write o rows and lse for every column. */
void fa_cpu_store_out(const fa_cpu_kernels *kern, const fa_problem *p, const fa_cpu_cols *cc,
                      const float *acc, int32_t ld, const float *m, const float *l);

/* Whether keys [j0, j1) are visible to every position of cc (no per-element mask needed). */
int fa_cpu_tile_full(const fa_problem *p, const fa_cpu_cols *cc, int64_t j0, int64_t j1);

/*
 * Sums past float32. The accumulator adds p v with p up to 1 before the division by the
 * softmax sum l, so it can pass FLT_MAX (v of 1e34 over 1e5 keys) although the output, a
 * weighted mean of v, is representable. A column whose accumulator ends inf or NaN while
 * its l is finite runs again with its probabilities scaled by 2^-e, where 2^e exceeds the
 * largest sum of weights a row of keys k_len long can reach (fa_cpu_redo_shift): no partial
 * sum can then pass max |v|. Its statistics become those of a softmax with the base raised
 * by e (m + e, l 2^-e), which the epilogue divides by as usual. Every other column keeps its
 * bits: the check costs one pass over the accumulator per task, the second run happens only
 * where a sum overflowed (or v holds inf or NaN, which stays so).
 */
static inline int fa_cpu_redo_shift(const fa_problem *p, int64_t k_len)
{
    int e;
    frexpf((float)(k_len > 0 ? k_len : 1) * (p->dropout_p > 0.0f ? p->dropout_scale : 1.0f), &e);
    return e;
}

/* Whether n floats at x hold inf or NaN (exponent bits all set: vectorises, unlike isfinite). */
static inline int fa_cpu_any_nonfinite(const float *x, int32_t n)
{
    uint32_t any = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof(u));
        any |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return any != 0;
}

/* scale[c] for c < cols: 2^-e where column c < ncols overflowed (acc row c of dim floats, ld
 * apart), else 1. Returns whether any did. */
static inline int fa_cpu_overflowed(int32_t ncols, int32_t cols, int32_t dim, const float *acc,
                                    ptrdiff_t ld, const float *l, int e, float *scale)
{
    int any = 0;
    for (int32_t c = 0; c < cols; c++) {
        const int bad =
            c < ncols && l[c] > 0.0f && l[c] <= FLT_MAX && fa_cpu_any_nonfinite(acc + c * ld, dim);
        scale[c] = bad ? ldexpf(1.0f, -e) : 1.0f;
        any |= bad;
    }
    return any;
}

/* Probabilities of a transposed tile st[j*lds + c] (j < n, c < cols) times scale[c]. */
static inline void fa_cpu_scale_cols(int32_t n, int32_t cols, float *st, ptrdiff_t lds,
                                     const float *scale)
{
    for (int32_t j = 0; j < n; j++)
        for (int32_t c = 0; c < cols; c++)
            st[j * lds + c] *= scale[c];
}

/* The statistics of the columns run again with scale 2^-e: base m + e, sum l 2^-e. */
static inline void fa_cpu_raise_base(int32_t cols, const float *scale, int e, float *m, float *l)
{
    for (int32_t c = 0; c < cols; c++)
        if (scale[c] != 1.0f) {
            m[c] += (float)e;
            l[c] *= scale[c];
        }
}

#endif
