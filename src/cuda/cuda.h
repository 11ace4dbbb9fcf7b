/* SPDX-License-Identifier: MIT */
/* The CUDA backend's kernel launchers, callable from its C host code. Each queues work on
 * stream and returns the launch's cudaError_t; nothing is synchronised. */
#ifndef FA_CUDA_H
#define FA_CUDA_H

#include "params.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Flash forward for head_dim padded to dpad (a row of FA_CUDA_TILES). */
cudaError_t fa_cuda_flash_forward(const fa_cuda_params *p, int bf16, int dpad, cudaStream_t stream);

/* The same on Hopper's warpgroup tensor cores (compute capability 9.0, sm_90a image) for the
 * head dims of FA_CUDA_SM90_TILES, or with wide set of FA_CUDA_SM90_WIDE_TILES;
 * cudaErrorInvalidValue for others. */
cudaError_t fa_cuda_flash_forward_sm90(const fa_cuda_params *p, int bf16, int dpad, int wide,
                                       cudaStream_t stream);

/* The fp8 (e4m3) forward on Hopper (sm_90a image) for head_dim up to FA_CUDA_SM90_FP8_TILES'
 * dim: o bf16 or float32 (p->o.f32), descale factors in p->q_ds, k_ds, v_ds. */
cudaError_t fa_cuda_flash_forward_e4m3_sm90(const fa_cuda_params *p, cudaStream_t stream);

/* The backward on Hopper's warpgroup tensor cores, one pass (dK, dV and dQ; dQ through
 * p->dq_acc and p->dq_sem, zeroed here) for the head dims of FA_CUDA_SM90_BWD_TILES;
 * cudaErrorInvalidValue for others. */
cudaError_t fa_cuda_flash_backward_sm90(const fa_cuda_params *p, int bf16, int dpad,
                                        cudaStream_t stream);

/* rowsum(dO * O) of every query row into p->dsum, its lse in log2 units into p->lse2
 * ([heads_q, rows] floats each). */
cudaError_t fa_cuda_rowsum(const fa_cuda_params *p, int bf16, cudaStream_t stream);

/* Flash backward: the row sums, then dK/dV and dQ, each written once. */
cudaError_t fa_cuda_flash_backward(const fa_cuda_params *p, int bf16, int dpad, cudaStream_t stream);

/* The standard algorithm (scores and probabilities through global memory), the
 * unfused baseline: p->s_ws holds [heads_q, rows, max_k] floats, p->p_ws and p->ds_ws
 * as many elements of the input dtype; krows = packed key rows. heads <= 65535. */
cudaError_t fa_cuda_standard_forward(const fa_cuda_params *p, int bf16, cudaStream_t stream);
/* The same for fp8 (e4m3) inputs, o bf16 or float32: P rounded to e4m3 before its normalisation
 * (as the flash kernel rounds it), the products in float32 through the bf16 tensor cores. */
cudaError_t fa_cuda_standard_forward_e4m3(const fa_cuda_params *p, cudaStream_t stream);
cudaError_t fa_cuda_standard_backward(const fa_cuda_params *p, int bf16, int64_t krows,
                                      cudaStream_t stream);

/* Paged calls (paged.cu). append: p's new rows into the pages (keys rotated). attention: the
 * split-KV kernels for head_dim padded to dpad (64, 128, 256): nq 1 or 2 picks the decode
 * kernel, whose 8 * nq packed rows (a KV group's query heads) are the mma's N with four warps
 * splitting the keys; nq 0 the 64-row tiles sharing their keys; then the merge of the splits in
 * split order. merge: fa_merge_states (rows x heads (row, head) pairs). */
cudaError_t fa_cuda_paged_append(const fa_cuda_paged *p, int bf16, cudaStream_t stream);
/* p's query rows rotated (RoPE) into out, [total_q, heads_q, head_dim] of the cache dtype. */
cudaError_t fa_cuda_paged_rotate_q(const fa_cuda_paged *p, int bf16, void *out, cudaStream_t stream);
cudaError_t fa_cuda_paged_attention(const fa_cuda_paged *p, int bf16, int dpad, int nq,
                                    cudaStream_t stream);
/* The decode kernel alone on Hopper (decode_sm90.cu; sm_90a image, kv_aligned, dpad 64 or
 * 128, nq 1 or 2), without the merge of the splits: fa_cuda_paged_attention calls it where
 * p->decode_sm90 is set. */
cudaError_t fa_cuda_decode_sm90(const fa_cuda_paged *p, int bf16, int dpad, int nq, cudaStream_t stream);
cudaError_t fa_cuda_merge_states(const void *o_in, int in_f32, int64_t sb, int64_t ss, int64_t sh,
                                 const float *lse_in, int64_t ls, int64_t lh, int64_t lr, void *o,
                                 int out_f32, int64_t oss, int64_t osh, float *lse, int64_t olh,
                                 int64_t olr, int states, int rows, int heads, int dim, int bf16,
                                 cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
