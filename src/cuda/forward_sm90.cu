// SPDX-License-Identifier: MIT
// The Hopper forward's instantiations: one per row of FA_CUDA_SM90_TILES and of
// FA_CUDA_SM90_WIDE_TILES, and the fp8 one of FA_CUDA_SM90_FP8_TILES.
#include "cuda.h"
#include "forward_sm90_e4m3.cuh"

extern "C" cudaError_t fa_cuda_flash_forward_sm90(const fa_cuda_params *p, int bf16, int dpad, int wide,
                                                  cudaStream_t stream)
{
#define FA_SM90_CASE(D, BN, NWG, ST, NQ, ...)                                                  \
    case D:                                                                                    \
        return bf16 ? fa::launch_sm90_ws<__nv_bfloat16, D, BN, NWG, ST, NQ>(*p, stream)        \
                    : fa::launch_sm90_ws<__half, D, BN, NWG, ST, NQ>(*p, stream);
    if (wide)
        switch (dpad) {
            FA_CUDA_SM90_WIDE_TILES(FA_SM90_CASE)
        }
    else
        switch (dpad) {
            FA_CUDA_SM90_TILES(FA_SM90_CASE)
        }
#undef FA_SM90_CASE
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t fa_cuda_flash_forward_e4m3_sm90(const fa_cuda_params *p, cudaStream_t stream)
{
#define FA_SM90_FP8(D, BN, NWG, ST, NQ)                                                             \
    return p->pg.tma_rows ? fa::launch_sm90_mainloop<fa::sm90_e4m3_mainloop<D, BN, NWG, ST, NQ, true>>(*p, stream) \
                          : fa::launch_sm90_mainloop<fa::sm90_e4m3_mainloop<D, BN, NWG, ST, NQ, false>>(*p, stream);
    FA_CUDA_SM90_FP8_TILES(FA_SM90_FP8)
#undef FA_SM90_FP8
}
