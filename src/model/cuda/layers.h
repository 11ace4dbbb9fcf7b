/* SPDX-License-Identifier: MIT */
/* Launchers of the CUDA engine's layer kernels (layers.cu); bf16 buffers as uint16_t. Each
 * queues its kernel on s and returns the launch's error. */
#ifndef FA_MODEL_CUDA_LAYERS_H
#define FA_MODEL_CUDA_LAYERS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* x [T, dim] float32 = emb [vocab, dim] rows tokens [T] */
cudaError_t fa_layers_embed(float *x, const uint16_t *emb, const int32_t *tokens, int T, int dim, cudaStream_t s);
/* out [T, dim] = g [dim] * RMSNorm(x row rows[r], or r when rows is NULL) */
cudaError_t fa_layers_rmsnorm(uint16_t *out, const float *x, const int32_t *rows, const float *g, int T, int dim,
                              float eps, cudaStream_t s);
/* out [T, hid] = silu(gate) * up; gate_up [T, 2 hid] */
cudaError_t fa_layers_swiglu(uint16_t *out, const uint16_t *gate_up, int T, int hid, cudaStream_t s);
/* dst [n] = src rounded to nearest even */
cudaError_t fa_layers_to_bf16(uint16_t *dst, const float *src, size_t n, cudaStream_t s);
/* next [ns] from logits [ns, V] as fa_sample_logits does; scratch [ns, V] */
cudaError_t fa_layers_sample(int32_t *next, float *scratch, const float *logits, const float *temperature,
                             const float *topp, const float *uniform, int ns, int V, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
