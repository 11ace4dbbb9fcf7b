// SPDX-License-Identifier: MIT
// The Hopper backward's instantiations: one per row of FA_CUDA_SM90_BWD_TILES.
#include "cuda.h"
#include "backward_sm90_wide.cuh"

namespace {
// A row's kernel: 128 keys a block (backward_sm90.cuh) or 64 (backward_sm90_wide.cuh).
template <typename T, int D, int BN, int BQ, int ST>
cudaError_t launch(const fa_cuda_params &p, bool bf16, cudaStream_t stream)
{
    static_assert(BN == 128 || BN == 64, "a block takes 128 or 64 keys");
    if constexpr (BN == 128)
        return fa::launch_backward_sm90<T, D, BQ, ST>(p, bf16, stream);
    else
        return fa::launch_backward_sm90_wide<T, D, BQ, ST>(p, bf16, stream);
}
} // namespace

extern "C" cudaError_t fa_cuda_flash_backward_sm90(const fa_cuda_params *p, int bf16, int dpad,
                                                    cudaStream_t stream)
{
#define FA_SM90_BWD_CASE(D, BN, BQ, ST)                                                         \
    case D:                                                                                     \
        return bf16 ? launch<__nv_bfloat16, D, BN, BQ, ST>(*p, true, stream)                    \
                    : launch<__half, D, BN, BQ, ST>(*p, false, stream);
    switch (dpad) {
        FA_CUDA_SM90_BWD_TILES(FA_SM90_BWD_CASE)
    }
#undef FA_SM90_BWD_CASE
    return cudaErrorInvalidValue;
}
