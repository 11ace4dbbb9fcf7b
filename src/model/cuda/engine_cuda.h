/* SPDX-License-Identifier: MIT */
/*
 * The CUDA engine behind engine.h: called by engine.c with a step already checked on the
 * host. Without a CUDA build (FA_MODEL_CUDA undefined) these report the backend missing.
 */
#ifndef FA_MODEL_ENGINE_CUDA_H
#define FA_MODEL_ENGINE_CUDA_H

#include "engine.h"

typedef struct fa_engine_cuda fa_engine_cuda;

#ifdef FA_MODEL_CUDA
/* 1 when a device answers. */
int fa_engine_cuda_available(void);
/* Weights uploaded (bf16), the cache, activations and the attention plan; *info filled
 * (kv_tokens aside). */
fa_status fa_engine_cuda_create(const fa_model *m, const fa_engine_options *o, fa_engine_cuda **out,
                                fa_engine_info *info, char *err);
void fa_engine_cuda_free(fa_engine_cuda *g);
/* The device's free bytes, what an engine of o holds beside its pages, and a page's bytes. */
fa_status fa_engine_cuda_memory(const fa_model *m, const fa_engine_options *o, uint64_t *free_bytes,
                                uint64_t *fixed_bytes, uint64_t *page_bytes, char *err);
/* One step; ns sampled rows (query row rows[i], temperature, topp and uniform u[i]): next[i]
 * their tokens, logits (may be NULL) [ns, vocab] their float32 logits. */
fa_status fa_engine_cuda_step(fa_engine_cuda *g, const fa_step *st, int32_t ns, const int32_t *rows,
                              const float *temperature, const float *topp, const float *u, int32_t *next,
                              float *logits, char *err);
/* Whether decode steps replay graphs, the graphs captured and the steps replayed so far, and why
 * graphs were turned off (a capture that failed; the step itself had run), else NULL. */
void fa_engine_cuda_graph_counts(const fa_engine_cuda *g, int *on, int32_t *captured, int64_t *replays,
                                 const char **off);
#else
#include "fail.h"
static inline int fa_engine_cuda_available(void) { return 0; }
static inline fa_status fa_engine_cuda_create(const fa_model *m, const fa_engine_options *o, fa_engine_cuda **out,
                                              fa_engine_info *info, char *err)
{
    (void)m, (void)o, (void)info;
    *out = NULL;
    return fa_model_fail(err, FA_ERR_BACKEND_UNAVAILABLE, "backend cuda: this build has no CUDA (nvcc was not found "
                                                          "when it was configured)");
}
static inline void fa_engine_cuda_free(fa_engine_cuda *g) { (void)g; }
static inline fa_status fa_engine_cuda_memory(const fa_model *m, const fa_engine_options *o, uint64_t *free_bytes,
                                              uint64_t *fixed_bytes, uint64_t *page_bytes, char *err)
{
    (void)m, (void)o, (void)free_bytes, (void)fixed_bytes, (void)page_bytes;
    return fa_model_fail(err, FA_ERR_BACKEND_UNAVAILABLE, "backend cuda: this build has no CUDA");
}
static inline fa_status fa_engine_cuda_step(fa_engine_cuda *g, const fa_step *st, int32_t ns, const int32_t *rows,
                                            const float *temperature, const float *topp, const float *u,
                                            int32_t *next, float *logits, char *err)
{
    (void)g, (void)st, (void)ns, (void)rows, (void)temperature, (void)topp, (void)u, (void)next, (void)logits;
    return fa_model_fail(err, FA_ERR_BACKEND_UNAVAILABLE, "backend cuda: this build has no CUDA");
}
static inline void fa_engine_cuda_graph_counts(const fa_engine_cuda *g, int *on, int32_t *captured, int64_t *replays,
                                               const char **off)
{
    (void)g;
    *on = 0, *captured = 0, *replays = 0, *off = NULL;
}
#endif

#endif
