/* SPDX-License-Identifier: MIT */
/*
 * The CUDA engine's projections for steps of a few rows (gemv.cu): decode at small batches,
 * where a GEMM is a stream of the weights and cuBLAS's split-K and the separate norm and
 * SwiGLU launches cost more than the arithmetic. Each call is one kernel with its neighbour
 * fused in. bf16 weights [N, K] (row-major, 16-byte aligned rows: K % 8 == 0) and activations
 * as uint16_t; T rows, 1 <= T <= fa_gemv_rows(cfg, K).
 *
 * A row's result does not depend on T (its dot products run in one order whatever the rows
 * beside it), so a sequence gets the same bits alone or batched; the norm is
 * fa_layers_rmsnorm's, bit for bit (rows.cuh).
 */
#ifndef FA_MODEL_CUDA_GEMV_H
#define FA_MODEL_CUDA_GEMV_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest T the kernels take (their accumulators live in registers). */
#define FA_GEMV_MAX_ROWS 8

/* What the launches need to know about the device, read once (fa_gemv_config_init). */
typedef struct fa_gemv_config {
    int sms;       /* multiprocessors: the persistent grid is a few blocks each */
    int smem_max;  /* the most dynamic shared memory a block may ask for (opt-in) */
    int pdl;       /* 1: launched as programmatic dependents (sm_90 and later) */
    int max_rows;  /* the rows the engine sends here at most: FLASHATTN_GEMV_ROWS, else the default */
} fa_gemv_config;

/* cfg for device dev, the calling thread's current one (its kernels are allowed the shared
 * memory they may take there): pdl on sm_90 and later unless FLASHATTN_GEMV_PDL=0; max_rows
 * from FLASHATTN_GEMV_ROWS (0 turns the path off; at most FA_GEMV_MAX_ROWS). */
cudaError_t fa_gemv_config_init(fa_gemv_config *cfg, int dev);

/* The most rows (0 to cfg->max_rows) whose activations of K elements a launch can hold in
 * shared memory; 0 when K is not a multiple of 8. */
int fa_gemv_rows(const fa_gemv_config *cfg, int K);

/* y [T, ldy] = (g * RMSNorm(x row rows[t], or t when rows is NULL)) W^T, W [N, K], x float32
 * [.., K]; y bf16, or float32 when y_f32. */
cudaError_t fa_gemv_norm_proj(const fa_gemv_config *cfg, void *y, int y_f32, int ldy, const float *x,
                              const int32_t *rows, const float *g, float eps, const uint16_t *w, int T, int N, int K,
                              cudaStream_t s);
/* out [T, N] = silu(a) b with a, b the rows of (g * RMSNorm(x)) W^T rounded to bf16, W [2 N,
 * K] the gate's rows then the up's: fa_layers_rmsnorm, the GEMM into bf16 and
 * fa_layers_swiglu in one. */
cudaError_t fa_gemv_norm_swiglu(const fa_gemv_config *cfg, uint16_t *out, const float *x, const float *g, float eps,
                                const uint16_t *w, int T, int N, int K, cudaStream_t s);
/* x [T, ldx] += in [T, K] W^T, W [N, K]; x float32. */
cudaError_t fa_gemv_residual(const fa_gemv_config *cfg, float *x, int ldx, const uint16_t *in, const uint16_t *w,
                             int T, int N, int K, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
