/* SPDX-License-Identifier: MIT */
/* The GLES backend's EGL and GLES entry points, resolved once a process from the system's
 * loaders (glvnd's libEGL.so.1 and libGLESv2.so.2, or a driver's own), so that the library
 * needs neither to load. */
#define _GNU_SOURCE /* dlfcn.h: RTLD_DEFAULT */
#define GLES_LOADER
#include "gles.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

gles_api gles_fn;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_error[512];

static void load(void)
{
    static const char *const libs[2] = { "libEGL.so.1", "libGLESv2.so.2" };
    void *h[2];
    for (int i = 0; i < 2; i++)
        if (!(h[i] = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL))) {
            const char *why = dlerror();
            snprintf(load_error, sizeof(load_error),
                     "%s could not be loaded (%s): the GLES backend needs the EGL and GLES loaders "
                     "(Debian: libegl1 libgles2) and a driver's EGL (Mesa's libegl-mesa0, or a GPU "
                     "driver's)",
                     libs[i], why ? why : "not found");
            return;
        }
    /* each name as the process resolves it first (an EGL the application linked, a tracing
     * wrapper in LD_PRELOAD), else from the library just opened; not through
     * eglGetProcAddress, which glvnd answers for any name */
    const char *missing = NULL;
#define GLES_FN(type, name, lib)                                                                   \
    if (!missing && !(gles_fn.name = (type)dlsym(RTLD_DEFAULT, #name)) &&                          \
        !(gles_fn.name = (type)dlsym(h[lib], #name)))                                              \
        missing = #name;
#define GLES_FN_EGL(type, name) GLES_FN(type, name, 0)
#define GLES_FN_GL(type, name) GLES_FN(type, name, 1)
    GLES_EGL_FUNCS(GLES_FN_EGL)
    GLES_GL_FUNCS(GLES_FN_GL)
#undef GLES_FN_GL
#undef GLES_FN_EGL
#undef GLES_FN
    if (missing)
        snprintf(load_error, sizeof(load_error),
                 "%s has no %s: the GLES backend needs an EGL 1.4 and OpenGL ES 3.1 loader "
                 "(Debian: libegl1 libgles2)",
                 missing[0] == 'e' ? libs[0] : libs[1], missing);
}

fa_status gles_load(fa_context_t ctx)
{
    pthread_once(&once, load);
    if (load_error[0])
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE, "%s", load_error);
    return FA_OK;
}
