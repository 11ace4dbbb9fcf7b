/* SPDX-License-Identifier: MIT */
/* The CUDA backend's state and the host helpers its files share. */
#ifndef FA_CUDA_STATE_H
#define FA_CUDA_STATE_H

#include "../core/internal.h"
#include "cuda.h"

typedef struct cuda_state {
    int device;
    struct cudaDeviceProp prop;
    cudaStream_t stream;
    int hopper; /* compute capability 9.0: the sm_90a forward */
    int persistent_blocks; /* the Hopper forward's persistent grid: one block per multiprocessor */
    cudaMemPool_t pool;    /* the calls' workspace, stream-ordered; keeps POOL_KEEP_BYTES bytes */
} cuda_state;

/* FA_ERR_BACKEND naming the runtime's error and what was being done. */
fa_status fa_cuda_fail(fa_context_t ctx, cudaError_t err, const char *what);

/* ptr is device (or managed) memory of the context's device; else a message naming `name`. */
fa_status fa_cuda_check_ptr(fa_context_t ctx, const cuda_state *s, const void *ptr, const char *name);

/* Paged calls (paged_host.c). */
fa_status fa_cuda_paged_plan(fa_context_t ctx, void *state, const fa_problem *p, void **plan,
                             fa_run_info *info);
fa_status fa_cuda_paged_run(fa_context_t ctx, void *state, void *plan, const fa_problem *p,
                            fa_run_info *info);
void fa_cuda_paged_plan_free(void *state, void *plan);
fa_status fa_cuda_append(fa_context_t ctx, void *state, const fa_problem *p);
fa_status fa_cuda_merge(fa_context_t ctx, void *state, const fa_merge_desc *d);

#endif
