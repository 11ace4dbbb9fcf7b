/* SPDX-License-Identifier: MIT */
/* The backends compiled into this library. */
#include "internal.h"

extern const fa_backend_iface fa_cpu_backend;

const fa_backend_iface *fa_registry_get(fa_backend id)
{
    switch (id) {
    case FA_BACKEND_CPU: return &fa_cpu_backend;
    default: return NULL;
    }
}
