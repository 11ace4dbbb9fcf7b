/* SPDX-License-Identifier: MIT */
/*
 * The runner's engine: a model's layers over a paged KV cache on one backend, run one
 * scheduler step (scheduler.h) at a time, each sampled sequence's next token drawn on that
 * backend.
 *
 *   cpu   float32 weights and cache in host memory: fa_model_forward_step (OpenBLAS GEMMs,
 *         one fa_paged_run a layer).
 *   cuda  bf16 weights (converted on upload where the file holds float32) and a bf16 cache in
 *         device memory; GEMMs through cuBLAS (bf16 in, float32 accumulation; the residual
 *         stream stays float32), RMSNorm, SwiGLU and sampling kernels of the runner's own
 *         (src/model/cuda), attention one fa_paged_run a layer (append + RoPE + attention).
 *         One host synchronisation a step: the next tokens coming back. Decode steps (one
 *         query row a sequence) run at the smallest batch of 1, 2, 4, .. max_batch that holds
 *         them (padding rows that no output reads) and replay a CUDA graph captured at the
 *         first step of that batch; no_graphs launches the same kernels one by one, with the
 *         same bits.
 *
 * Sampling is the same formula on both (fa_sample_logits): argmax at temperature 0; else
 * p ~ exp((logit - max) / T) over the nucleus (the fewest most likely tokens whose mass
 * reaches topp; all when topp is 0 or >= 1), drawn with a uniform that depends on the seed
 * and the row's position only, so a request samples the same tokens alone or in any batch.
 *
 * Errors as model.h: a status and a message naming the field in err. An engine belongs to one
 * thread at a time.
 */
#ifndef FA_MODEL_ENGINE_H
#define FA_MODEL_ENGINE_H

#include "model.h"
#include "scheduler.h"

typedef struct fa_engine_options {
    fa_backend backend;   /* FA_BACKEND_CPU or FA_BACKEND_CUDA (FA_BACKEND_AUTO: CUDA when present) */
    int32_t num_pages;    /* cache pages (>= 1) */
    int32_t page_size;    /* tokens a page (>= 1) */
    int32_t max_batch;    /* sequences a step (>= 1) */
    int32_t token_budget; /* query rows a step (>= max_batch) */
    int32_t threads;      /* cpu: threads, 0 = all cores */
    int32_t device;       /* cuda: the device ordinal */
    int32_t no_graphs;    /* cuda: 1 launches decode steps' kernels directly instead of replaying graphs */
} fa_engine_options;

/* How one sequence samples. */
typedef struct fa_sample_params {
    float temperature; /* 0 = argmax */
    float topp;        /* (0, 1): the nucleus; 0 or >= 1: every token */
    uint64_t seed;
} fa_sample_params;

typedef struct fa_engine_info {
    fa_backend backend;
    const char *device;       /* "cpu" or the GPU's name */
    uint64_t weight_bytes;    /* as the backend holds them */
    uint64_t kv_bytes;        /* the cache: every layer's pages */
    uint64_t activation_bytes;
    int32_t kv_tokens;        /* num_pages * page_size (INT32_MAX past it) */
    int32_t graphs;           /* cuda: decode steps replay CUDA graphs (0: direct launches, and cpu) */
    int32_t graphs_captured;  /* batches whose decode step has been captured so far */
    int64_t graph_replays;    /* decode steps replayed from a graph so far */
    const char *graphs_off;   /* why graphs were turned off after a capture failed, else NULL */
    int32_t fused_rows;       /* cuda: steps of at most this many rows run the fused few-row
                               * projections (FLASHATTN_GEMV_ROWS; the down projection where
                               * its hidden-long rows fit too), larger ones cuBLAS; 0 none */
} fa_engine_info;

typedef struct fa_engine fa_engine;

fa_status fa_engine_create(const fa_model *m, const fa_engine_options *o, fa_engine **out, char *err);
void fa_engine_free(fa_engine *e);
fa_engine_info fa_engine_get_info(const fa_engine *e);

/* The pages that fit in `fraction` of the backend's free memory after the weights and the
 * activations of opts (its num_pages ignored): the KV capacity, for sizing a serving cache. */
fa_status fa_engine_pages_for(const fa_model *m, const fa_engine_options *o, double fraction, int32_t *pages,
                              char *err);

/* Run one step (made by a scheduler with the engine's num_pages and page_size, batch <=
 * max_batch, total_q <= token_budget). params [step->batch] (NULL: every sequence argmax).
 * next [step->batch] gets the next token of each sequence with step->sample[b] set (others
 * untouched). logits (may be NULL) [step->batch, vocab] gets those sequences' float32 logits.
 * FA_ERR_INVALID_VALUE, next and logits untouched, where a sampled sequence's logits hold NaN or +inf
 * (a model with such weights, or activations that overflow); the step's keys and values are
 * in the cache all the same. */
fa_status fa_engine_step(fa_engine *e, const fa_step *step, const fa_sample_params *params, int32_t *next,
                         float *logits, char *err);

/* Wall seconds spent inside fa_engine_step so far, and in its attention calls where the
 * backend can tell without synchronising (cpu; 0 on cuda). */
void fa_engine_times(const fa_engine *e, double *step_s, double *attention_s);

/* ---- the sampling formula (both backends) ---- */
/* The uniform in [0, 1) a sequence with `seed` draws for its row at `position`. */
float fa_sample_uniform(uint64_t seed, int32_t position);
/* The token fa_engine_step picks from logits [n] with params p and uniform u, or -1 where a
 * logit is NaN or +inf; scratch [2n]. */
int32_t fa_sample_logits(const float *logits, int32_t n, const fa_sample_params *p, float u, float *scratch);

#endif
