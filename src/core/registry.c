/* SPDX-License-Identifier: MIT */
/* The backends compiled into this library. */
#include "internal.h"

extern const fa_backend_iface fa_cpu_backend;
#ifdef FA_WITH_CUDA
extern const fa_backend_iface fa_cuda_backend;
#endif
#ifdef FA_WITH_GLES
extern const fa_backend_iface fa_gles_backend;
#endif

const fa_backend_iface *fa_registry_get(fa_backend id)
{
    switch (id) {
    case FA_BACKEND_CPU: return &fa_cpu_backend;
#ifdef FA_WITH_CUDA
    case FA_BACKEND_CUDA: return &fa_cuda_backend;
#endif
#ifdef FA_WITH_GLES
    case FA_BACKEND_GLES: return &fa_gles_backend;
#endif
    default: return NULL;
    }
}
