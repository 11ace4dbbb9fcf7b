/* SPDX-License-Identifier: MIT */
/* What fa_gles_context_create hands the GLES backend's init (fa_context_create_native): the
 * caller's EGL display and the context whose objects the backend's context shares. */
#ifndef FA_GLES_NATIVE_H
#define FA_GLES_NATIVE_H

typedef struct gles_native {
    void *display, *context;
} gles_native;

#endif
