/* SPDX-License-Identifier: MIT */
/* The GLES backend's own entry points (include/flashattn.h). Compiled into every build, so
 * that a library without the backend answers them with FA_ERR_BACKEND_UNAVAILABLE. */
#include "../core/internal.h"
#include "native.h"

fa_status fa_gles_context_create(void *egl_display, void *egl_context, fa_context_t *out)
{
    if (out && (!egl_display || !egl_context)) {
        *out = NULL;
        return fa_error(NULL, FA_ERR_NULL_POINTER, "%s must not be NULL",
                        !egl_display ? "egl_display" : "egl_context");
    }
    const gles_native native = { egl_display, egl_context };
    return fa_context_create_native(FA_BACKEND_GLES, &native, out);
}

fa_status fa_gles_buffer_wrap(fa_context_t ctx, uint32_t buffer, size_t bytes, void **ptr)
{
    if (ctx && ptr && ctx->iface->id != FA_BACKEND_GLES) {
        *ptr = NULL;
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "fa_gles_buffer_wrap needs a context from fa_gles_context_create (this "
                        "one is a '%s' context)", ctx->iface->name);
    }
    return fa_context_import(ctx, buffer, bytes, ptr);
}
