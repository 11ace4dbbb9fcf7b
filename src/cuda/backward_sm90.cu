// SPDX-License-Identifier: MIT
// The Hopper backward's instantiations: one per row of FA_CUDA_SM90_BWD_TILES.
#include "cuda.h"
#include "backward_sm90.cuh"

extern "C" cudaError_t fa_cuda_flash_backward_sm90(const fa_cuda_params *p, int bf16, int dpad,
                                                    cudaStream_t stream)
{
#define FA_SM90_BWD_CASE(D, BQ, ST)                                                                \
    case D:                                                                                     \
        return bf16 ? fa::launch_backward_sm90<__nv_bfloat16, D, BQ, ST>(*p, true, stream)    \
                    : fa::launch_backward_sm90<__half, D, BQ, ST>(*p, false, stream);
    switch (dpad) {
        FA_CUDA_SM90_BWD_TILES(FA_SM90_BWD_CASE)
    }
#undef FA_SM90_BWD_CASE
    return cudaErrorInvalidValue;
}
