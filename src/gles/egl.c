/* SPDX-License-Identifier: MIT */
/* The GLES backend's context: a headless EGL display (the EGL device platform, then Mesa's
 * surfaceless one) or the caller's, an OpenGL ES 3.1 context, the device's limits and the
 * extensions the planner uses. */
#include "gles.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int has_ext(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return 1;
    return 0;
}

static EGLDisplay open_display(const char **platform)
{
    const char *client = eglQueryString(EGL_NO_DISPLAY, EGL_EXTENSIONS);
    PFNEGLGETPLATFORMDISPLAYEXTPROC get_display =
        (PFNEGLGETPLATFORMDISPLAYEXTPROC)eglGetProcAddress("eglGetPlatformDisplayEXT");
    EGLint major, minor;
    if (get_display && has_ext(client, "EGL_EXT_platform_device")) {
        PFNEGLQUERYDEVICESEXTPROC query =
            (PFNEGLQUERYDEVICESEXTPROC)eglGetProcAddress("eglQueryDevicesEXT");
        EGLDeviceEXT devs[16];
        EGLint n = 0;
        if (query && query(16, devs, &n))
            for (EGLint i = 0; i < n; i++) {
                EGLDisplay d = get_display(EGL_PLATFORM_DEVICE_EXT, devs[i], NULL);
                if (d != EGL_NO_DISPLAY && eglInitialize(d, &major, &minor)) {
                    *platform = "EGL device";
                    return d;
                }
            }
    }
    if (get_display && has_ext(client, "EGL_MESA_platform_surfaceless")) {
        EGLDisplay d = get_display(EGL_PLATFORM_SURFACELESS_MESA, EGL_DEFAULT_DISPLAY, NULL);
        if (d != EGL_NO_DISPLAY && eglInitialize(d, &major, &minor)) {
            *platform = "Mesa surfaceless";
            return d;
        }
    }
    return EGL_NO_DISPLAY;
}

fa_status gles_make_current(fa_context_t ctx, gles_state *s)
{
    /* the thread's bound API is the caller's too: ES while ours is current, then theirs back */
    s->prev_api = eglQueryAPI();
    if (s->prev_api != EGL_OPENGL_ES_API)
        eglBindAPI(EGL_OPENGL_ES_API);
    s->prev_dpy = eglGetCurrentDisplay();
    s->prev_ctx = eglGetCurrentContext();
    s->prev_draw = eglGetCurrentSurface(EGL_DRAW);
    s->prev_read = eglGetCurrentSurface(EGL_READ);
    if (!eglMakeCurrent(s->dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, s->ctx)) {
        const EGLint err = eglGetError();
        if (s->prev_api != EGL_OPENGL_ES_API && s->prev_api != EGL_NONE)
            eglBindAPI(s->prev_api);
        return fa_error(ctx, FA_ERR_BACKEND, "eglMakeCurrent failed (EGL error 0x%x)", (unsigned)err);
    }
    return FA_OK;
}

/* Put back what was current before gles_make_current (nothing, or the caller's context). */
void gles_release_current(gles_state *s)
{
    if (s->prev_ctx != EGL_NO_CONTEXT)
        eglMakeCurrent(s->prev_dpy, s->prev_draw, s->prev_read, s->prev_ctx);
    else
        eglMakeCurrent(s->dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
    if (s->prev_api != EGL_OPENGL_ES_API && s->prev_api != EGL_NONE)
        eglBindAPI(s->prev_api);
}

fa_status gles_gl_check(fa_context_t ctx, const char *what)
{
    GLenum e = glGetError();
    if (e == GL_NO_ERROR)
        return FA_OK;
    return fa_error(ctx, e == GL_OUT_OF_MEMORY ? FA_ERR_OUT_OF_MEMORY : FA_ERR_BACKEND,
                    "OpenGL ES error 0x%x %s", (unsigned)e, what);
}

void gles_destroy(void *state)
{
    gles_state *s = state;
    if (!s)
        return;
    if (s->ctx != EGL_NO_CONTEXT) {
        if (gles_make_current(NULL, s) == FA_OK) {
            gles_programs_free(s);
            for (int i = 0; i < s->n_mem; i++)
                if (s->mem[i].owned)
                    glDeleteBuffers(1, &s->mem[i].name);
            glDeleteBuffers(BUF_COUNT, s->scratch); /* names 0 are ignored */
            glDeleteTextures(2, s->kv_tex);
        }
        gles_release_current(s);
        eglDestroyContext(s->dpy, s->ctx);
    }
    for (int i = 0; i < s->n_mem; i++) /* buffers the caller did not free */
        munmap(s->mem[i].base, s->mem[i].reserved);
    free(s->mem);
    /* The display stays initialised: EGL displays are per process and shared with whatever
     * else in it uses the same device (terminating it would pull the driver from under them) */
    free(s);
}

/* Renderers that run shaders on the CPU (Mesa's llvmpipe and softpipe, SwiftShader). */
static int cpu_renderer(const char *renderer)
{
    return strstr(renderer, "llvmpipe") || strstr(renderer, "softpipe") || strstr(renderer, "SwiftShader");
}

/* The limits and extensions the planner reads, with the context current. */
static void probe(gles_state *s)
{
    snprintf(s->renderer, sizeof(s->renderer), "%s", (const char *)glGetString(GL_RENDERER));
    snprintf(s->version, sizeof(s->version), "%s", (const char *)glGetString(GL_VERSION));
    s->cpu_renderer = cpu_renderer(s->renderer);
    s->llvmpipe = strstr(s->renderer, "llvmpipe") != NULL;
    glGetIntegerv(GL_MAX_COMPUTE_SHARED_MEMORY_SIZE, &s->max_shared);
    glGetIntegerv(GL_MAX_COMPUTE_WORK_GROUP_INVOCATIONS, &s->max_invocations);
    glGetIntegerv(GL_MAX_COMPUTE_SHADER_STORAGE_BLOCKS, &s->max_ssbos);
    for (GLuint i = 0; i < 3; i++)
        glGetIntegeri_v(GL_MAX_COMPUTE_WORK_GROUP_COUNT, i, &s->max_count[i]);
    GLint n = 0;
    glGetIntegerv(GL_NUM_EXTENSIONS, &n);
    for (GLint i = 0; i < n; i++) {
        const char *e = (const char *)glGetStringi(GL_EXTENSIONS, (GLuint)i);
        if (strcmp(e, "GL_EXT_shader_16bit_storage") == 0)
            s->has_16bit_storage = 1;
        if (strcmp(e, "GL_EXT_texture_buffer") == 0)
            s->texbuf = "GL_EXT_texture_buffer";
        else if (strcmp(e, "GL_OES_texture_buffer") == 0 && !s->texbuf)
            s->texbuf = "GL_OES_texture_buffer";
        /* CPU renderers expose the timer but their elapsed times leave the shaders out
         * (llvmpipe reports about a nanosecond for a second's dispatch): wall time is theirs */
        if (strcmp(e, "GL_EXT_disjoint_timer_query") == 0 && !s->cpu_renderer)
            s->query_u64 = (void(GL_APIENTRYP)(GLuint, GLenum, GLuint64 *))eglGetProcAddress(
                "glGetQueryObjectui64vEXT");
    }
    if (s->texbuf) { /* the OES and EXT extensions share the enums; the entry point follows the name */
        s->tex_buffer_range = (PFNGLTEXBUFFERRANGEEXTPROC)eglGetProcAddress(
            strcmp(s->texbuf, "GL_EXT_texture_buffer") == 0 ? "glTexBufferRangeEXT" : "glTexBufferRangeOES");
        glGetIntegerv(GL_MAX_TEXTURE_BUFFER_SIZE_EXT, &s->max_texels);
        if (!s->tex_buffer_range || s->max_texels <= 0)
            s->texbuf = NULL;
    }
}

/* FLASHATTN_GLES_FORWARD and FLASHATTN_GLES_KEY_CHUNK: the tests' way to force a variant or
 * key chunks on any device. */
static fa_status read_env(fa_context_t ctx, gles_state *s)
{
    const char *fwd = getenv("FLASHATTN_GLES_FORWARD");
    if (fwd && *fwd) {
        s->forward = strcmp(fwd, "rows") == 0       ? 1
                     : strcmp(fwd, "tiled") == 0    ? 2
                     : strcmp(fwd, "rows-tex") == 0 ? 3
                                                    : -1;
        if (s->forward < 0)
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                            "FLASHATTN_GLES_FORWARD=%s: use \"rows\", \"rows-tex\" or \"tiled\" (or "
                            "leave it unset for the planner's choice)",
                            fwd);
    }
    const char *kc = getenv("FLASHATTN_GLES_KEY_CHUNK");
    s->key_chunk = kc && atoi(kc) > 0 ? atoi(kc) : 0;
    return FA_OK;
}

fa_status gles_init(fa_context_t ctx, int32_t num_threads, const void *native, void **state)
{
    (void)num_threads;
    const gles_native *caller = native;
    fa_status st = gles_load(ctx);
    if (st != FA_OK)
        return st;
    gles_state *s = calloc(1, sizeof(*s));
    if (!s)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the GLES backend");
    st = read_env(ctx, s);
    if (st != FA_OK) {
        free(s);
        return st;
    }
    s->ctx = EGL_NO_CONTEXT;
    s->prev_api = EGL_OPENGL_ES_API;
    EGLContext share = EGL_NO_CONTEXT;
    if (caller) { /* the caller's display, objects shared with the caller's context */
        EGLint major, minor;
        s->dpy = (EGLDisplay)caller->display;
        share = (EGLContext)caller->context;
        s->platform = "caller's";
        s->shared = 1;
        if (!eglInitialize(s->dpy, &major, &minor)) {
            const EGLint err = eglGetError();
            free(s);
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                            "egl_display is not an EGL display that initialises (EGL error 0x%x)",
                            (unsigned)err);
        }
    } else {
        s->dpy = open_display(&s->platform);
    }
    if (s->dpy == EGL_NO_DISPLAY) {
        gles_destroy(s);
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                        "no headless EGL display: neither the EGL device platform nor Mesa's "
                        "surfaceless platform initialised (install Mesa's EGL, libegl-mesa0, or "
                        "a GPU driver's EGL)");
    }
    const EGLint ctx_attr[] = { EGL_CONTEXT_MAJOR_VERSION, 3, EGL_CONTEXT_MINOR_VERSION, 1, EGL_NONE };
    /* the bound API is the calling thread's EGL state: put the caller's back */
    const EGLenum api = eglQueryAPI();
    const int bound = eglBindAPI(EGL_OPENGL_ES_API);
    if (bound)
        s->ctx = eglCreateContext(s->dpy, EGL_NO_CONFIG_KHR, share, ctx_attr);
    const EGLint create_err = eglGetError();
    if (api != EGL_NONE && api != EGL_OPENGL_ES_API)
        eglBindAPI(api);
    if (!bound || s->ctx == EGL_NO_CONTEXT) {
        EGLint err = create_err;
        const char *platform = s->platform;
        const int shared = s->shared;
        gles_destroy(s);
        if (shared)
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                            "egl_context: no OpenGL ES 3.1 context sharing it could be made on the "
                            "display (EGL error 0x%x; it must be an ES context of that display, "
                            "created without a config or with EGL_KHR_no_config_context)",
                            (unsigned)err);
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                        "no OpenGL ES 3.1 context on the %s display (EGL error 0x%x): compute "
                        "shaders need ES 3.1",
                        platform, (unsigned)err);
    }
    if ((st = gles_make_current(ctx, s)) != FA_OK) {
        gles_destroy(s);
        return st;
    }
    GLint major = 0, minor = 0;
    glGetIntegerv(GL_MAJOR_VERSION, &major);
    glGetIntegerv(GL_MINOR_VERSION, &minor);
    if (major < 3 || (major == 3 && minor < 1)) {
        gles_release_current(s);
        gles_destroy(s);
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                        "OpenGL ES %d.%d context: compute shaders need 3.1", (int)major, (int)minor);
    }
    probe(s);
    gles_programs_init(s);
    gles_release_current(s);
    if (s->max_ssbos < GLES_MIN_SSBOS || s->max_invocations < GLES_STD_GROUP) {
        const int ssbos = (int)s->max_ssbos, inv = (int)s->max_invocations;
        gles_destroy(s);
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                        "the GLES device allows %d storage buffers and %d invocations per compute "
                        "workgroup; the shaders need %d and %d",
                        ssbos, inv, GLES_MIN_SSBOS, GLES_STD_GROUP);
    }
    if (s->forward == 3 && !s->texbuf) {
        gles_destroy(s);
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "FLASHATTN_GLES_FORWARD=rows-tex: the device has no buffer textures "
                        "(GL_EXT_texture_buffer or GL_OES_texture_buffer); use \"rows\" or \"tiled\"");
    }
    *state = s;
    return FA_OK;
}
