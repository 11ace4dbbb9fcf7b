/* SPDX-License-Identifier: MIT */
/* Backend-neutral internals: the validated problem, the backend interface, errors. */
#ifndef FA_CORE_INTERNAL_H
#define FA_CORE_INTERNAL_H

#include "flashattn.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define FA_ERROR_CAP 512

/* "Unbounded" window after resolution: larger than any sequence. */
#define FA_WINDOW_INF ((int64_t)1 << 40)

/* One sequence of a (possibly variable-length) batch. */
typedef struct fa_seq {
    int64_t q_start; /* first packed query row (0 for fixed-length) */
    int64_t k_start;
    int32_t q_len;
    int32_t k_len;
} fa_seq;

/*
 * A validated paged call (fa_paged_desc). `dense` restates it as an attention call that
 * backends read like any other: q, o, lse, scale, masks and softcap as given, cu_seqlens_q
 * the desc's, and k and v the cache's pools with stride_seq the token stride, stride_head the
 * head stride and stride_batch the page stride (fa_problem_kv_offset resolves the page).
 */
typedef struct fa_paged_problem {
    const fa_paged_desc *desc;
    fa_attention_desc dense;
    int32_t page_size, num_pages, max_pages;
    int64_t bt_stride; /* resolved block_table_stride */
    int append;        /* k_new and v_new are written into the pages first */
    int32_t rope_dim;  /* resolved; 0 when rope is FA_ROPE_NONE */
    int host_tables;   /* lengths and page ids are host memory, read and checked by the core */
} fa_paged_problem;

/* A validated call with every default resolved. Backends read only this. */
typedef struct fa_problem {
    const fa_attention_desc *desc;
    const fa_paged_problem *paged; /* paged calls only */
    const fa_backward_desc *bwd; /* backward calls only */
    int32_t batch, heads_q, heads_kv, group, dim;
    int32_t max_q, max_k; /* longest sequence */
    int varlen;
    float scale;
    float softcap;       /* 0 = off */
    int64_t win_left;    /* resolved, FA_WINDOW_INF when unbounded */
    int64_t win_right;   /* causal folds into this */
    fa_dtype in_dtype, out_dtype;
    float dropout_p;          /* 0 = no dropout */
    float dropout_scale;      /* 1 / (1 - p) */
    uint32_t dropout_threshold;
    uint64_t dropout_seed, dropout_offset;
    int64_t lse_sb, lse_sh, lse_ss; /* resolved LSE strides */
} fa_problem;

/* Factor (batch b, kv head g) of a descale view, 1 without one (host memory only). */
static inline float fa_descale_at(const fa_descale *s, int32_t b, int32_t g)
{
    return s->data ? s->data[(int64_t)b * s->stride_batch + (int64_t)g * s->stride_head] : 1.0f;
}

/* The factor of row i (of its sequence) there: its block's with block_rows > 0. */
static inline float fa_descale_row(const fa_descale *s, int32_t b, int32_t g, int64_t i)
{
    if (!s->data)
        return 1.0f;
    int64_t at = (int64_t)b * s->stride_batch + (int64_t)g * s->stride_head;
    if (s->block_rows > 0)
        at += i / s->block_rows * s->stride_block;
    return s->data[at];
}

/* Sequence b's extents and offsets (paged: from the host-side lengths, keys from 0). */
fa_seq fa_problem_seq(const fa_problem *p, int32_t b);

/* Element offset in the cache pool t (k or v of a paged problem's dense desc) of key j of
 * sequence b, head h, and in *run the keys from j on that follow at t's token stride (to the
 * end of the page). The one statement of the page lookup in C. */
static inline int64_t fa_problem_kv_offset(const fa_problem *p, const fa_tensor *t, int32_t b,
                                           int64_t j, int32_t h, int32_t *run)
{
    const fa_paged_problem *pg = p->paged;
    const int64_t page = pg->desc->block_table[(int64_t)b * pg->bt_stride + j / pg->page_size];
    *run = pg->page_size - (int32_t)(j % pg->page_size);
    return page * t->stride_batch + (j % pg->page_size) * t->stride_seq + (int64_t)h * t->stride_head;
}

/* The rotation of one row x (float32, head_dim values) at position pos, as fa_paged_desc
 * defines it: the one statement in C. */
void fa_rope_row(const fa_paged_problem *pg, float *x, int64_t pos);

/* The position of row i (0-based in its sequence, packed row `row`) of a sequence with
 * q_len rows and k_len keys. */
static inline int64_t fa_rope_position(const fa_paged_problem *pg, int64_t row, int64_t i,
                                       int64_t q_len, int64_t k_len)
{
    return pg->desc->positions ? pg->desc->positions[row] : k_len - q_len + i;
}

/* The mask's geometry, the one definition every C backend calls: query row i of a sequence
 * sees key j when i + off - win_left <= j <= i + off + win_right, off = k_len - q_len (the
 * diagonal aligned bottom-right), 0 <= j < k_len. */

/* Key range [lo, hi) that query rows [r0, r1) of a sequence may see. Empty when hi <= lo. */
static inline void fa_problem_key_range(const fa_problem *p, const fa_seq *s, int64_t r0, int64_t r1,
                                        int64_t *lo, int64_t *hi)
{
    const int64_t off = (int64_t)s->k_len - s->q_len;
    const int64_t a = r0 + off - p->win_left, b = (r1 - 1) + off + p->win_right + 1;
    *lo = a < 0 ? 0 : a;
    *hi = b > s->k_len ? s->k_len : b;
}

/* Query range [lo, hi) of the rows that see any of keys [k0, k1). Empty when hi <= lo. */
static inline void fa_problem_query_range(const fa_problem *p, const fa_seq *s, int64_t k0, int64_t k1,
                                          int64_t *lo, int64_t *hi)
{
    const int64_t off = (int64_t)s->k_len - s->q_len;
    const int64_t a = k0 - off - p->win_right, b = (k1 - 1) - off + p->win_left + 1;
    *lo = a < 0 ? 0 : a;
    *hi = b > s->q_len ? s->q_len : b;
}

/* Whether every query row of [r0, r1) sees every key of [k0, k1): no mask to apply. */
static inline int fa_problem_tile_full(const fa_problem *p, const fa_seq *s, int64_t r0, int64_t r1,
                                       int64_t k0, int64_t k1)
{
    const int64_t off = (int64_t)s->k_len - s->q_len;
    return k1 <= s->k_len && k0 >= (r1 - 1) + off - p->win_left && k1 - 1 <= r0 + off + p->win_right;
}

struct fa_context;

/* The direction of a memory copy (fa_memory_upload, _download, _copy). */
typedef enum fa_copy_kind {
    FA_COPY_DOWNLOAD, /* backend src -> host dst */
    FA_COPY_UPLOAD,   /* host src -> backend dst */
    FA_COPY_WITHIN    /* backend src -> backend dst, one context's memory */
} fa_copy_kind;

/* A backend: a const table of functions plus its own state (ggml-backend's shape). */
typedef struct fa_backend_iface {
    fa_backend id;
    const char *name;
    /* Probe the machine; FA_OK when usable. Sets *state (owned by the backend). native: NULL,
     * or what the backend's own context constructor passed (fa_context_create_native). */
    fa_status (*init)(struct fa_context *ctx, int32_t num_threads, const void *native, void **state);
    void (*destroy)(void *state);
    /* Append "key: value" lines about the backend. */
    void (*info)(void *state, char *buf, size_t cap, size_t *len);
    /* Decide kernel, tiles and workspace for p; fills info. FA_ERR_UNSUPPORTED with a message if not. */
    fa_status (*plan)(struct fa_context *ctx, void *state, const fa_problem *p, fa_run_info *info);
    fa_status (*forward)(struct fa_context *ctx, void *state, const fa_problem *p, fa_run_info *info);
    /* Backward (p->bwd set): plan and run, as plan / forward. */
    fa_status (*plan_backward)(struct fa_context *ctx, void *state, const fa_problem *p,
                               fa_run_info *info);
    fa_status (*backward)(struct fa_context *ctx, void *state, const fa_problem *p, fa_run_info *info);
    /* Memory and ordering; NULL for backends that compute on host memory and block. */
    fa_status (*mem_alloc)(struct fa_context *ctx, void *state, size_t bytes, void **ptr);
    fa_status (*mem_free)(struct fa_context *ctx, void *state, void *ptr);
    /* A copy of bytes > 0 between ranges the core has checked (not NULL, not overlapping). */
    fa_status (*mem_copy)(struct fa_context *ctx, void *state, void *dst, const void *src,
                          size_t bytes, fa_copy_kind kind);
    /* A memory object of the caller's, named by a native handle, as memory like mem_alloc's
     * (fa_context_import); NULL where the backend imports nothing. */
    fa_status (*mem_import)(struct fa_context *ctx, void *state, uint64_t handle, size_t bytes,
                            void **ptr);
    fa_status (*set_stream)(struct fa_context *ctx, void *state, void *stream);
    /* Paged calls (p->paged set); NULL where the backend has none. paged_plan decides for the
     * bounds in p and sets *plan (the backend's, with its workspace); paged_run runs a call
     * within them, allocating nothing. append writes p's new rows into the pages. */
    fa_status (*paged_plan)(struct fa_context *ctx, void *state, const fa_problem *p, void **plan,
                            fa_run_info *info);
    fa_status (*paged_run)(struct fa_context *ctx, void *state, void *plan, const fa_problem *p,
                           fa_run_info *info);
    void (*paged_plan_free)(void *state, void *plan);
    fa_status (*append)(struct fa_context *ctx, void *state, const fa_problem *p);
    fa_status (*merge)(struct fa_context *ctx, void *state, const fa_merge_desc *d);
    int tables_on_device; /* paged lengths and page ids live in device memory */
    fa_status (*synchronize)(struct fa_context *ctx, void *state);
} fa_backend_iface;

struct fa_context {
    const fa_backend_iface *iface;
    void *state;
    fa_run_info last_run;
    int has_last_run;
    char error[FA_ERROR_CAP];
};

/* Record an error on ctx (printf-style message) and return status. */
fa_status fa_error(struct fa_context *ctx, fa_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Validate desc and fill p. On error ctx's message names the field. */
fa_status fa_validate_forward(struct fa_context *ctx, const fa_attention_desc *desc,
                              fa_problem *p);

/* Validate a backward call: its forward descriptor, the LSE, d_o and the gradients. */
fa_status fa_validate_backward(struct fa_context *ctx, const fa_backward_desc *desc, fa_problem *p);

/* A context on backend id whose init gets `native` (a backend's own constructor, such as
 * fa_gles_context_create, passes what it was given); the creation errors of fa_context_create. */
fa_status fa_context_create_native(fa_backend id, const void *native, fa_context_t *out);

/* The backend's mem_import of a caller's memory object (fa_gles_buffer_wrap): *ptr as memory
 * of this context. ptr is checked and cleared first. */
fa_status fa_context_import(struct fa_context *ctx, uint64_t handle, size_t bytes, void **ptr);

/* Built-in backends, NULL when not compiled in. */
const fa_backend_iface *fa_registry_get(fa_backend id);

/* Append formatted text to buf at *len (keeps counting past cap). */
void fa_appendf(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* 64-byte aligned allocation of at least `bytes` (free with free()); NULL on failure or overflow. */
void *fa_alloc_aligned(size_t bytes);

/* a*b and a+b on non-negative int64 with overflow detection: 0 on overflow. */
int fa_mul_ok(int64_t a, int64_t b, int64_t *out);
int fa_add_ok(int64_t a, int64_t b, int64_t *out);

#endif
