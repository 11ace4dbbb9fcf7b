/* SPDX-License-Identifier: MIT */
/* The OpenGL ES 3.1 compute backend: a headless EGL context (the EGL device platform, then
 * Mesa's surfaceless one), tiles derived from the context's limits, shaders compiled per
 * (head_dim, tiles, storage) from the embedded .comp sources. Tensors either live in GL
 * buffers (fa_memory_alloc on this backend: a reserved address range stands for a buffer,
 * so views, offsets and strides work as with device pointers; a pack shader lays them out
 * for the attention shaders and an unpack shader writes o and lse back, all on the GPU) or
 * in host memory (repacked on the CPU, uploaded, read back). */
#include "../core/internal.h"
#include "../cpu/kernels/kernels.h"

#include <EGL/egl.h>
#include <EGL/eglext.h>
#include <GLES3/gl31.h>
#include <GLES2/gl2ext.h> /* after gl31.h: GL_EXT_disjoint_timer_query's names */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gles_common.h"
#include "gles_decode_merge.h"
#include "gles_decode_split.h"
#include "gles_flash_forward.h"
#include "gles_flash_tiled.h"
#include "gles_pack.h"
#include "gles_std_pv.h"
#include "gles_std_scores.h"
#include "gles_std_softmax.h"
#include "gles_unpack.h"

enum {
    SH_FLASH,
    SH_FLASH_TILED,
    SH_SCORES,
    SH_SOFTMAX,
    SH_PV,
    SH_DEC_SPLIT,
    SH_DEC_MERGE,
    SH_PACK,
    SH_UNPACK,
    SH_COUNT
};
static const char *const shader_src[SH_COUNT] = { fa_gles_flash_forward, fa_gles_flash_tiled,  fa_gles_std_scores,
                                                  fa_gles_std_softmax,   fa_gles_std_pv,       fa_gles_decode_split,
                                                  fa_gles_decode_merge,  fa_gles_pack,         fa_gles_unpack };
static const char *const shader_name[SH_COUNT] = { "flash_forward", "flash_tiled",  "std_scores",
                                                   "std_softmax",   "std_pv",       "decode_split",
                                                   "decode_merge",  "pack",         "unpack" };

#define MAX_PROGRAMS 64
#define STD_GROUP 64 /* local size of the standard passes and the decode passes */
#define MIN_SSBOS 8  /* storage blocks a shader may use (the flash shader binds 6) */

/* The tiles of one call: head_dim in vec4s, query rows per workgroup, keys per K/V tile,
 * 16-bit storage; for the tiled fused forward also each invocation's block (tm rows x tn
 * keys), the invocation grid (nx x ny), the head_dim chunk of its Q/K staging (dc4 vec4s),
 * its V chunk (kc keys) and its shared-memory regions in vec4s (Q/K
 * chunk or V chunk, probabilities, row partials). */
typedef struct tiles {
    int d4, br, bc, f16;
    int tex;  /* the row variant reads K and V through buffer textures */
    int rows; /* query rows per invocation of the row variant (1 for the tiled one) */
    int softcap; /* the call caps its logits (compiled in) */
    int o_f16;   /* o written in place into the caller's f16 buffer, as packed halves */
    int chunk;   /* keys per dispatch where llvmpipe's loop limit cuts the fused forward into
                  * key chunks (0: one dispatch); not part of the program */
    int tiled, tm, tn, nx, ny, dc4, kc, sh_qk, sh_p, sh_r;
} tiles;

typedef struct program {
    int shader;
    tiles t;
    GLuint id;
} program;

typedef struct gles_state {
    EGLDisplay dpy;
    EGLContext ctx;
    const char *platform;
    char renderer[128], version[128];
    GLint max_shared, max_invocations, max_count[3], max_ssbos;
    int has_16bit_storage; /* GL_EXT_shader_16bit_storage */
    /* GL_EXT_disjoint_timer_query's 64-bit result getter (NULL without the extension) */
    void(GL_APIENTRYP query_u64)(GLuint id, GLenum pname, GLuint64 *params);
    int forward; /* FLASHATTN_GLES_FORWARD: 0 the planner's choice, 1 rows, 2 tiled, 3 rows-tex */
    int key_chunk; /* FLASHATTN_GLES_KEY_CHUNK: keys per fused dispatch on any device (tests) */
    /* buffer textures (GL_EXT_texture_buffer or GL_OES_texture_buffer: the extension's name,
     * NULL without), their texel limit, and the two the row variant reads K and V through */
    const char *texbuf;
    PFNGLTEXBUFFEREXTPROC tex_buffer;
    GLint max_texels;
    GLuint kv_tex[2];
    /* a call's working buffers (repacked q, k, v, o, lse, offsets, scores or partials), kept
     * between calls and grown as needed: allocating them per call cost more than the shaders */
    GLuint scratch[8];
    size_t scratch_bytes[8];
    program programs[MAX_PROGRAMS];
    int n_programs;
    struct gl_mem *mem; /* fa_memory_alloc's buffers and the caller's wrapped ones */
    int n_mem, cap_mem;
    int shared; /* the context shares objects with the caller's (fa_gles_context_create) */
    /* what was current on the calling thread before make_current, put back by release_current */
    EGLDisplay prev_dpy;
    EGLContext prev_ctx;
    EGLSurface prev_draw, prev_read;
} gles_state;

/* A GL buffer handed out by fa_memory_alloc or wrapped by fa_gles_buffer_wrap: [base, base +
 * bytes) is reserved address space (no access, no memory behind it) that stands for buffer
 * `name`. */
typedef struct gl_mem {
    unsigned char *base;
    size_t bytes, reserved, gl_bytes; /* asked for, reserved, the GL buffer's own size */
    GLuint name;
    int owned; /* ours (fa_memory_alloc), or the caller's (fa_gles_buffer_wrap) */
} gl_mem;

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

static fa_status make_current(fa_context_t ctx, gles_state *s)
{
    s->prev_dpy = eglGetCurrentDisplay();
    s->prev_ctx = eglGetCurrentContext();
    s->prev_draw = eglGetCurrentSurface(EGL_DRAW);
    s->prev_read = eglGetCurrentSurface(EGL_READ);
    if (!eglMakeCurrent(s->dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, s->ctx))
        return fa_error(ctx, FA_ERR_BACKEND, "eglMakeCurrent failed (EGL error 0x%x)",
                        (unsigned)eglGetError());
    return FA_OK;
}

/* Put back what was current before make_current (nothing, or the caller's context). */
static void release_current(gles_state *s)
{
    if (s->prev_ctx != EGL_NO_CONTEXT)
        eglMakeCurrent(s->prev_dpy, s->prev_draw, s->prev_read, s->prev_ctx);
    else
        eglMakeCurrent(s->dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
}

static void gles_destroy(void *state)
{
    gles_state *s = state;
    if (!s)
        return;
    if (s->ctx != EGL_NO_CONTEXT) {
        if (make_current(NULL, s) == FA_OK) {
            for (int i = 0; i < s->n_programs; i++)
                glDeleteProgram(s->programs[i].id);
            for (int i = 0; i < s->n_mem; i++)
                if (s->mem[i].owned)
                    glDeleteBuffers(1, &s->mem[i].name);
            glDeleteBuffers(8, s->scratch); /* names 0 are ignored */
            glDeleteTextures(2, s->kv_tex);
        }
        release_current(s);
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

static fa_status gles_init(fa_context_t ctx, int32_t num_threads, void **state)
{
    (void)num_threads;
    gles_state *s = calloc(1, sizeof(*s));
    if (!s)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the GLES backend");
    const char *fwd = getenv("FLASHATTN_GLES_FORWARD");
    if (fwd && *fwd) {
        s->forward = strcmp(fwd, "rows") == 0       ? 1
                     : strcmp(fwd, "tiled") == 0    ? 2
                     : strcmp(fwd, "rows-tex") == 0 ? 3
                                                    : -1;
        if (s->forward < 0) {
            free(s);
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                            "FLASHATTN_GLES_FORWARD=%s: use \"rows\", \"rows-tex\" or \"tiled\" (or "
                            "leave it unset for the planner's choice)",
                            fwd);
        }
    }
    /* FLASHATTN_GLES_KEY_CHUNK=n: fused forwards over more keys run in chunks of about n keys
     * on any device, as llvmpipe's loop limit makes them there (the tests run the hand-over of
     * the running state with it) */
    const char *kc = getenv("FLASHATTN_GLES_KEY_CHUNK");
    s->key_chunk = kc && atoi(kc) > 0 ? atoi(kc) : 0;
    s->ctx = EGL_NO_CONTEXT;
    EGLContext share = EGL_NO_CONTEXT;
    if (ctx->gles_share) { /* the caller's display, objects shared with the caller's context */
        EGLint major, minor;
        s->dpy = (EGLDisplay)ctx->gles_display;
        share = (EGLContext)ctx->gles_share;
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
    if (!eglBindAPI(EGL_OPENGL_ES_API) ||
        (s->ctx = eglCreateContext(s->dpy, EGL_NO_CONFIG_KHR, share, ctx_attr)) ==
            EGL_NO_CONTEXT) {
        EGLint err = eglGetError();
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
    fa_status st = make_current(ctx, s);
    if (st != FA_OK) {
        gles_destroy(s);
        return st;
    }
    GLint major = 0, minor = 0;
    glGetIntegerv(GL_MAJOR_VERSION, &major);
    glGetIntegerv(GL_MINOR_VERSION, &minor);
    if (major < 3 || (major == 3 && minor < 1)) {
        release_current(s);
        gles_destroy(s);
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                        "OpenGL ES %d.%d context: compute shaders need 3.1", (int)major, (int)minor);
    }
    snprintf(s->renderer, sizeof(s->renderer), "%s", (const char *)glGetString(GL_RENDERER));
    snprintf(s->version, sizeof(s->version), "%s", (const char *)glGetString(GL_VERSION));
    glGetIntegerv(GL_MAX_COMPUTE_SHARED_MEMORY_SIZE, &s->max_shared);
    glGetIntegerv(GL_MAX_COMPUTE_WORK_GROUP_INVOCATIONS, &s->max_invocations);
    glGetIntegerv(GL_MAX_COMPUTE_SHADER_STORAGE_BLOCKS, &s->max_ssbos);
    if (s->max_ssbos < MIN_SSBOS || s->max_invocations < STD_GROUP) {
        const int ssbos = (int)s->max_ssbos, inv = (int)s->max_invocations;
        release_current(s);
        gles_destroy(s);
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                        "the GLES device allows %d storage buffers and %d invocations per compute "
                        "workgroup; the shaders need %d and %d",
                        ssbos, inv, MIN_SSBOS, STD_GROUP);
    }
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
        if (strcmp(e, "GL_EXT_disjoint_timer_query") == 0 && !cpu_renderer(s->renderer))
            s->query_u64 = (void(GL_APIENTRYP)(GLuint, GLenum, GLuint64 *))eglGetProcAddress(
                "glGetQueryObjectui64vEXT");
    }
    if (s->texbuf) { /* the OES and EXT extensions share the enums; the entry point follows the name */
        s->tex_buffer = (PFNGLTEXBUFFEREXTPROC)eglGetProcAddress(
            strcmp(s->texbuf, "GL_EXT_texture_buffer") == 0 ? "glTexBufferEXT" : "glTexBufferOES");
        glGetIntegerv(GL_MAX_TEXTURE_BUFFER_SIZE_EXT, &s->max_texels);
        if (!s->tex_buffer || s->max_texels <= 0)
            s->texbuf = NULL;
    }
    release_current(s);
    if (s->forward == 3 && !s->texbuf) {
        gles_destroy(s);
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "FLASHATTN_GLES_FORWARD=rows-tex: the device has no buffer textures "
                        "(GL_EXT_texture_buffer or GL_OES_texture_buffer); use \"rows\" or \"tiled\"");
    }
    *state = s;
    return FA_OK;
}

/* Query rows per invocation of the row variant on the texture path (CPU renderers): every K
 * and V texel fetched feeds them all, and on llvmpipe the fetches are most of the time (70%
 * at d64 with four rows: docs/perf/gles.md). Eight up to head_dim 64 (25% faster than four
 * there; the first compile takes 16 s instead of 5, once: Mesa caches it), four above (eight
 * compile for 95 s at d128). Through shared memory (GPUs) one: more spill registers there. */
static int tex_rows(int d4)
{
    return d4 <= 16 ? 8 : 4;
}

/* The row variant (flash_forward.comp): 64 query rows a workgroup, Q and O rows in registers.
 * K and V through buffer textures (tex: one invocation per tex_rows() rows, so that each fetch
 * feeds them all; CPU renderers), or staged in shared memory with one invocation per row (two
 * spill registers on GPUs: docs/perf/gles.md): keys per K/V tile from K and V rows (vec4 float32
 * each), at most 3/4 of the limit (the rest is the driver's and headroom), a power of two
 * between 1 and 64. */
static tiles rows_tiles(const gles_state *s, int32_t dim, int f16, int tex)
{
    tiles t = { 0 };
    t.d4 = (dim + 3) / 4;
    t.f16 = f16;
    t.tex = tex;
    const int per_key = 2 * t.d4 * 16;
    int bc = 64;
    while (!tex && bc > 1 && bc * per_key > s->max_shared * 3 / 4)
        bc /= 2;
    t.bc = bc;
    t.br = 64; /* the invocation limit is at least 64 (STD_GROUP) */
    t.rows = tex ? tex_rows(t.d4) : 1;
    return t;
}

/* The tiled variant (flash_tiled.comp): the first block shape (tm rows x tn keys per
 * invocation, br x bc per workgroup) whose invocation grid fits the invocation limit and
 * whose regions fit the shared-memory limit, with the widest head_dim chunk (dc4 vec4s, 8
 * down to 2) and then the longest V chunk (kc keys) that fit. Returns 0 where nothing fits
 * (tiny limits). */
static int tiled_tiles(const gles_state *s, int32_t dim, int f16, tiles *out)
{
    /* tm, tn, br, bc. GPUs: 4x4 blocks over 256 invocations, the fastest on the H200 (docs/perf/
     * gles.md). CPU renderers run invocations as SIMD lanes and load shared memory one lane at
     * a time, so what counts there is multiply-adds per load: 16x8 blocks (564 ms against 876
     * for 4x4 on llvmpipe; 32-row blocks miscompile there). */
    static const int gpu[][4] = { { 4, 4, 64, 64 }, { 4, 4, 32, 64 }, { 4, 4, 32, 32 }, { 4, 4, 16, 16 } };
    static const int cpu[][4] = { { 16, 8, 64, 64 }, { 8, 8, 64, 64 }, { 4, 4, 32, 32 }, { 4, 4, 16, 16 } };
    const int(*shapes)[4] = cpu_renderer(s->renderer) ? cpu : gpu;
    const size_t n_shapes = sizeof(gpu) / sizeof(gpu[0]);
    const int d4 = (dim + 3) / 4;
    int dc_max = 8;
    while (dc_max > 2 && dc_max / 2 >= d4)
        dc_max /= 2;
    for (size_t i = 0; i < n_shapes; i++) {
        const int tm = shapes[i][0], tn = shapes[i][1], br = shapes[i][2], bc = shapes[i][3];
        const int nx = bc / tn, ny = br / tm;
        if (nx * ny > s->max_invocations)
            continue;
        const int sh_p = bc * (ny * tm / 4 + 1), sh_r = nx * ny * tm / 4;
        for (int dc4 = dc_max; dc4 >= 2; dc4 /= 2) {
            const int qk = (br + bc) * (dc4 + 1);
            for (int kc = bc; kc >= 4; kc /= 2) {
                const int sh_qk = qk > kc * d4 ? qk : kc * d4;
                if ((int64_t)(sh_qk + sh_p + sh_r) * 16 > s->max_shared)
                    continue;
                *out = (tiles){ .d4 = d4, .br = br, .bc = bc, .f16 = f16, .rows = 1, .tiled = 1, .tm = tm, .tn = tn,
                                .nx = nx, .ny = ny, .dc4 = dc4, .kc = kc, .sh_qk = sh_qk,
                                .sh_p = sh_p, .sh_r = sh_r };
                return 1;
            }
        }
    }
    return 0;
}

/* The largest head_dim the row variant runs on a CPU renderer by the planner's choice: above
 * it llvmpipe does not unroll the row's head_dim loops, each key then costs 2 x D4 loop
 * iterations, and its loop limit (llvmpipe_loops) stops the shader within a few hundred keys. */
#define CPU_ROWS_MAX_DIM 128

/* The fused forward's variant and tiles, unless FLASHATTN_GLES_FORWARD asks for one: on CPU
 * renderers with buffer textures the row variant reading K and V through them (where
 * shared-memory loads go one SIMD lane at a time, texel fetches are gathered: 3x faster than
 * the tiled variant on llvmpipe, docs/perf/gles.md); elsewhere the tiled one wherever it fits,
 * the row variant through shared memory otherwise. */
static tiles tiles_for(const gles_state *s, int32_t dim, int f16)
{
    tiles t;
    if (s->forward == 3 ||
        (s->forward == 0 && s->texbuf && cpu_renderer(s->renderer) && dim <= CPU_ROWS_MAX_DIM))
        return rows_tiles(s, dim, f16, 1);
    if (s->forward != 1 && tiled_tiles(s, dim, f16, &t))
        return t;
    return rows_tiles(s, dim, f16, 0);
}

static fa_status gl_check(fa_context_t ctx, const char *what)
{
    GLenum e = glGetError();
    if (e == GL_NO_ERROR)
        return FA_OK;
    return fa_error(ctx, e == GL_OUT_OF_MEMORY ? FA_ERR_OUT_OF_MEMORY : FA_ERR_BACKEND,
                    "OpenGL ES error 0x%x %s", (unsigned)e, what);
}

static fa_status get_program(fa_context_t ctx, gles_state *s, int shader, const tiles *tl, GLuint *out)
{
    tiles key = *tl; /* the program's identity: the chunk is a uniform */
    key.chunk = 0;
    const tiles *t = &key;
    for (int i = 0; i < s->n_programs; i++) {
        const program *p = &s->programs[i];
        if (p->shader == shader && memcmp(&p->t, t, sizeof(*t)) == 0) {
            *out = p->id;
            return FA_OK;
        }
    }
    char preamble[640], ext[64] = "";
    if (t->tex) /* only chosen where s->texbuf names the extension */
        snprintf(ext, sizeof(ext), "#extension %s : require\n", s->texbuf);
    snprintf(preamble, sizeof(preamble),
             "#version 310 es\n%s#define D4 %d\n#define BR %d\n#define BC %d\n#define NI %d\n"
             "#define ROWS %d\n#define STORE_F16 %d\n#define KV_TEX %d\n#define TM %d\n"
             "#define TN %d\n#define NX %d\n#define NY %d\n#define DC4 %d\n#define KC %d\n"
             "#define SH_P %d\n#define SH_R %d\n#define SH_TOTAL %d\n#define SOFTCAP %d\n#define O_F16 %d\n",
             ext, t->d4, t->br, t->bc, t->br / t->rows, t->rows, t->f16, t->tex, t->tm, t->tn, t->nx, t->ny,
             t->dc4, t->kc, t->sh_qk, t->sh_qk + t->sh_p, t->sh_qk + t->sh_p + t->sh_r, t->softcap, t->o_f16);
    const char *parts[3] = { preamble, fa_gles_common, shader_src[shader] };
    GLuint sh = glCreateShader(GL_COMPUTE_SHADER);
    glShaderSource(sh, 3, parts, NULL);
    glCompileShader(sh);
    GLint ok = 0;
    glGetShaderiv(sh, GL_COMPILE_STATUS, &ok);
    if (!ok) {
        char log[512] = "";
        glGetShaderInfoLog(sh, sizeof(log), NULL, log);
        glDeleteShader(sh);
        return fa_error(ctx, FA_ERR_BACKEND, "compiling shader %s (D4 %d, BR %d, BC %d, f16 %d): %s",
                        shader_name[shader], t->d4, t->br, t->bc, t->f16, log);
    }
    GLuint prog = glCreateProgram();
    glAttachShader(prog, sh);
    glLinkProgram(prog);
    glDeleteShader(sh);
    glGetProgramiv(prog, GL_LINK_STATUS, &ok);
    if (!ok) {
        char log[512] = "";
        glGetProgramInfoLog(prog, sizeof(log), NULL, log);
        glDeleteProgram(prog);
        return fa_error(ctx, FA_ERR_BACKEND, "linking shader %s: %s", shader_name[shader], log);
    }
    if (s->n_programs == MAX_PROGRAMS) { /* full: start over (rare: many head dims) */
        for (int i = 0; i < s->n_programs; i++)
            glDeleteProgram(s->programs[i].id);
        s->n_programs = 0;
    }
    s->programs[s->n_programs++] = (program){ shader, *t, prog };
    *out = prog;
    return FA_OK;
}

/* Mesa's llvmpipe ends a shader's loops after 65535 iterations in all (nested ones counted
 * together), silently: a call whose shaders would loop longer gets wrong results there. */
#define LLVMPIPE_LOOPS 65535

static void gles_info(void *state, char *buf, size_t cap, size_t *len)
{
    const gles_state *s = state;
    fa_appendf(buf, cap, len, "gles.device: %s\n", s->renderer);
    fa_appendf(buf, cap, len, "gles.version: %s (EGL platform: %s)\n", s->version, s->platform);
    fa_appendf(buf, cap, len,
               "gles.limits: shared memory %d bytes, %d invocations per workgroup, workgroups "
               "%d x %d x %d, %d storage buffers\n",
               (int)s->max_shared, (int)s->max_invocations, (int)s->max_count[0],
               (int)s->max_count[1], (int)s->max_count[2], (int)s->max_ssbos);
    fa_appendf(buf, cap, len, "gles.GL_EXT_shader_16bit_storage: %s\n", s->has_16bit_storage ? "yes" : "no");
    fa_appendf(buf, cap, len, "gles.timer: %s\n",
               s->query_u64 ? "GL_EXT_disjoint_timer_query: the attention dispatches are timed on the GPU "
                              "(fa_run_info.device_ms)"
                            : "none (no GL_EXT_disjoint_timer_query, or a CPU renderer): wall time only");
    fa_appendf(buf, cap, len,
               "gles.storage: f32 inputs as float32, f16 as packed halves (packHalf2x16, core "
               "GLSL ES 3.10: half the bytes without the 16-bit storage extension), bf16 as "
               "float32 (GLES has no bf16)\n");
    static const int dims[] = { 64, 128, 256 };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        tiles t = tiles_for(s, dims[i], 0);
        if (t.tiled)
            fa_appendf(buf, cap, len,
                       "gles.forward.d%d: tiled (flash_tiled.comp), %d query rows x %d keys per step, "
                       "%d x %d invocations of %dx%d score blocks, head_dim staged %d floats at a time, "
                       "V %d keys at a time, %d bytes of shared memory\n",
                       dims[i], t.br, t.bc, t.nx, t.ny, t.tm, t.tn, 4 * t.dc4, t.kc,
                       16 * (t.sh_qk + t.sh_p + t.sh_r));
        else if (t.tex)
            fa_appendf(buf, cap, len,
                       "gles.forward.d%d: rows-tex (flash_forward.comp), one invocation per %d "
                       "query rows, %d rows per workgroup, K and V through buffer textures (%s), no "
                       "shared memory\n",
                       dims[i], t.rows, t.br, s->texbuf);
        else
            fa_appendf(buf, cap, len,
                       "gles.forward.d%d: rows (flash_forward.comp), one invocation per query row, %d "
                       "rows x %d keys per step (K/V tiles %d bytes of shared memory)\n",
                       dims[i], t.br, t.bc, 2 * t.bc * t.d4 * 16);
    }
    fa_appendf(buf, cap, len, "gles.buffer_textures: %s\n", s->texbuf ? s->texbuf : "no");
    if (strstr(s->renderer, "llvmpipe"))
        fa_appendf(buf, cap, len,
                   "gles.loop_limit: llvmpipe stops a shader's loops after %d iterations; fused "
                   "forwards past it run in key chunks (a dispatch each), the standard algorithm "
                   "past it is refused\n",
                   LLVMPIPE_LOOPS);
    fa_appendf(buf, cap, len, "gles.forward.why: %s\n",
               s->forward == 1   ? "rows, forced by FLASHATTN_GLES_FORWARD"
               : s->forward == 2 ? "tiled where it fits, forced by FLASHATTN_GLES_FORWARD"
               : s->forward == 3 ? "rows-tex, forced by FLASHATTN_GLES_FORWARD"
               : s->texbuf && cpu_renderer(s->renderer)
                   ? "a CPU renderer with buffer textures: rows-tex up to head_dim 128 (texel "
                     "fetches are gathered across SIMD lanes, shared-memory loads go one lane at a "
                     "time), tiled above"
                   : "tiled wherever its invocation grid and shared memory fit the limits (no "
                     "invocation holds a whole row), rows otherwise");
}

static int decode_splits(const fa_problem *p);
static int64_t packed_rows(const fa_problem *p, int is_k);

/* The loop iterations of one invocation over `keys` keys on llvmpipe, from what was measured on
 * Mesa 22.3 (docs/perf/gles.md): head_dim loops up to 32 vec4s are unrolled, longer ones are
 * not; the tiled forward's loops come to about 37 x D4 per 64-key tile (48 here, for margin).
 * pass: 0 the fused forward, 1-3 the standard's passes. */
static int64_t llvmpipe_loops(const tiles *t, const fa_problem *p, int64_t keys, int *pass)
{
    const int64_t tiles_k = (keys + 63) / 64, d4 = t->d4;
    const int64_t dim_loop = d4 > 32 ? d4 : 1; /* iterations a head_dim loop costs */
    int64_t worst = 0, n;
    *pass = 0;
    if (p->desc->algorithm == FA_ALGORITHM_STANDARD) {
        const int64_t passes[3] = { keys * dim_loop + d4, 3 * keys, keys * dim_loop + 2 * d4 };
        for (int i = 0; i < 3; i++)
            if (passes[i] > worst) {
                worst = passes[i];
                *pass = 1 + i;
            }
        return worst;
    }
    if (decode_splits(p)) /* chunks of about max_k / 64 keys: each key a few loop turns */
        return 4 * ((keys + 63) / 64) + 4 * d4;
    if (t->tiled)
        n = tiles_k * 48 * d4;
    else /* the row variant: a head_dim loop per K and per V row and per row's rescale every 4
          * keys where they are not unrolled, a block per 4 keys, staging, the rows' set-up (an
          * upper bound on the texture path, whose blocks are 8 keys) */
        n = keys * (d4 > 32 ? 2 * d4 + t->rows * d4 / 4 : 0) + keys / 4 + tiles_k * (1 + d4) +
            4 * t->rows * d4;
    return n;
}

/* t->chunk: the fused forward in key chunks, one dispatch each, where FLASHATTN_GLES_KEY_CHUNK
 * asks for it or llvmpipe's loop limit needs it (the most whole key tiles a dispatch may walk
 * inside 90% of it); calls past the limit that cannot be cut are refused there. */
static fa_status key_chunks(fa_context_t ctx, const gles_state *s, const fa_problem *p, tiles *t)
{
    const int fused = p->desc->algorithm != FA_ALGORITHM_STANDARD && !decode_splits(p);
    const int state_fits = (int64_t)p->heads_q * packed_rows(p, 0) * 3 <= INT32_MAX / 2;
    t->chunk = 0;
    if (s->key_chunk && fused && state_fits && p->max_k > s->key_chunk)
        t->chunk = s->key_chunk > t->bc ? s->key_chunk / t->bc * t->bc : t->bc;
    if (strstr(s->renderer, "llvmpipe") && !t->chunk) {
        int pass;
        const int64_t limit = LLVMPIPE_LOOPS * 9 / 10;
        int64_t loops = llvmpipe_loops(t, p, p->max_k, &pass);
        if (loops > limit && fused && state_fits) {
            int64_t chunk = 0;
            for (int64_t c = t->bc; c < p->max_k && llvmpipe_loops(t, p, c, &pass) <= limit; c += t->bc)
                chunk = c;
            if (chunk) {
                t->chunk = (int)chunk;
                loops = 0;
            }
        }
        if (loops > limit) {
            static const char *const what[4] = { "fused forward", "standard score pass",
                                                 "standard softmax pass", "standard P V pass" };
            return fa_error(ctx, FA_ERR_UNSUPPORTED,
                            "max_k (%d keys) at head_dim %d: the %s would loop about %lld times in "
                            "one invocation, and Mesa's llvmpipe silently stops a shader's loops "
                            "after %d; use fewer keys per call (a shorter sequence or window) or "
                            "the CPU backend",
                            (int)p->max_k, (int)p->dim, what[pass], (long long)loops, LLVMPIPE_LOOPS);
        }
    }
    return FA_OK;
}

static fa_status check(fa_context_t ctx, const gles_state *s, const fa_problem *p, tiles *t)
{
    if (p->dropout_p > 0.0f)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "dropout_p (%g) > 0: the GLES backend has no dropout (use the CPU or CUDA "
                        "backend for training)",
                        (double)p->dropout_p);
    *t = tiles_for(s, p->dim, p->in_dtype == FA_DTYPE_F16);
    t->softcap = p->softcap > 0.0f;
    const int64_t tiles_q = ((int64_t)p->max_q + t->br - 1) / t->br;
    if (tiles_q > s->max_count[0] || p->heads_q > s->max_count[1] || p->batch > s->max_count[2])
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "the grid (%lld query tiles x %d heads x %d sequences) exceeds the "
                        "device's workgroup counts (%d x %d x %d)",
                        (long long)tiles_q, (int)p->heads_q, (int)p->batch, (int)s->max_count[0],
                        (int)s->max_count[1], (int)s->max_count[2]);
    return key_chunks(ctx, s, p, t);
}

/* One query row per sequence: the split-KV decode path, KV cut into this many chunks (about
 * 256 keys each, at most 64) so that a single query still spreads over the device. */
static int decode_splits(const fa_problem *p)
{
    if (p->desc->algorithm == FA_ALGORITHM_STANDARD || p->max_q != 1)
        return 0;
    int n = (p->max_k + 255) / 256;
    return n < 1 ? 1 : n > 64 ? 64 : n;
}

static int64_t packed_rows(const fa_problem *p, int is_k)
{
    const fa_attention_desc *d = p->desc;
    if (p->varlen)
        return is_k ? d->cu_seqlens_k[p->batch] : d->cu_seqlens_q[p->batch];
    return (int64_t)p->batch * (is_k ? d->seqlen_k : d->seqlen_q);
}

/* The buffers a call creates: repacked q, k, v (those not read in place), o (float32) and
 * lse; the standard algorithm adds its [heads, rows, max_k] float scores. */
static size_t call_bytes(const tiles *t, const fa_problem *p, int standard, const int in_place[4])
{
    const size_t esz = t->f16 ? 2 : 4, row = (size_t)t->d4 * 4;
    const size_t qrows = (size_t)packed_rows(p, 0), krows = (size_t)packed_rows(p, 1);
    const size_t n_kv = (size_t)!in_place[1] + (size_t)!in_place[2];
    size_t bytes = (size_t)p->heads_q * qrows * row * ((in_place[0] ? 0 : esz) + (in_place[3] ? 0 : 4)) +
                   n_kv * (size_t)p->heads_kv * krows * row * esz + (size_t)p->heads_q * qrows * 4;
    if (standard)
        bytes += (size_t)p->heads_q * qrows * (size_t)p->max_k * 4;
    if (t->chunk) /* each row's running maximum and sum between key chunks */
        bytes += (size_t)p->heads_q * qrows * 8;
    const int splits = decode_splits(p);
    if (splits)
        bytes += (size_t)p->heads_q * (size_t)p->batch * (size_t)splits * (row * 4 + 8);
    return bytes;
}

static void report(const tiles *t, const fa_problem *p, const int in_place[4], fa_run_info *info)
{
    const int standard = p->desc->algorithm == FA_ALGORITHM_STANDARD, splits = decode_splits(p);
    if (splits) {
        info->kernel = t->f16 ? "gles-decode-f16pk" : "gles-decode-f32";
        info->block_q = 1;
        info->block_k = (p->max_k + splits - 1) / splits;
        info->threads = STD_GROUP;
    } else {
        info->kernel = standard ? (t->f16 ? "gles-standard-f16" : "gles-standard-f32")
                       : t->tiled ? (t->f16 ? "gles-flash-tiled-f16pk" : "gles-flash-tiled-f32")
                       : t->tex   ? (t->f16 ? "gles-flash-tex-f16pk" : "gles-flash-tex-f32")
                                  : (t->f16 ? "gles-flash-f16pk" : "gles-flash-f32");
        info->block_q = standard ? 1 : t->br;
        info->block_k = standard ? p->max_k : t->bc;
        info->threads = standard ? STD_GROUP : t->tiled ? t->nx * t->ny : t->br / t->rows;
    }
    info->workspace_bytes = call_bytes(t, p, standard, in_place);
}

/* Element e of a tensor view at (batch b, sequence row r, head h), as a double. */
static double load_elem(const fa_tensor *v, int64_t b, int64_t r, int64_t h, int64_t x)
{
    const int64_t off = b * v->stride_batch + r * v->stride_seq + h * v->stride_head + x;
    switch (v->dtype) {
    case FA_DTYPE_F32: return ((const float *)v->data)[off];
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)v->data)[off]);
    default: return fa_bf16_to_f32(((const uint16_t *)v->data)[off]);
    }
}

/* First packed row of sequence b: its varlen offset, or b * seqlen. */
static int64_t packed_start(const fa_problem *p, const fa_seq *s, int32_t b, int is_k)
{
    if (p->varlen)
        return is_k ? s->k_start : s->q_start;
    return (int64_t)b * (is_k ? p->desc->seqlen_k : p->desc->seqlen_q);
}

/* A view's rows repacked as [heads][packed rows][d4 * 4] in the storage type (float or
 * half, zero padded). For f16 inputs the bits are copied. */
static void *pack(const fa_problem *p, const fa_tensor *v, int32_t heads, int is_k, int d4, int f16,
                  int64_t rows, size_t *bytes)
{
    const size_t esz = f16 ? 2 : 4, row_elems = (size_t)d4 * 4;
    *bytes = (size_t)heads * (size_t)rows * row_elems * esz;
    unsigned char *buf = calloc(*bytes ? *bytes : 1, 1);
    if (!buf)
        return NULL;
    for (int32_t b = 0; b < p->batch; b++) {
        const fa_seq sq = fa_problem_seq(p, b);
        const int64_t n = is_k ? sq.k_len : sq.q_len;
        const int64_t r0 = packed_start(p, &sq, b, is_k);
        const int64_t tb = p->varlen ? 0 : b, tr0 = p->varlen ? r0 : 0; /* tensor coordinates */
        for (int32_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < n; i++) {
                unsigned char *dst = buf + (((size_t)h * rows + (size_t)(r0 + i)) * row_elems) * esz;
                for (int32_t x = 0; x < p->dim; x++) {
                    if (f16) {
                        const int64_t off = tb * v->stride_batch + (tr0 + i) * v->stride_seq +
                                            h * v->stride_head + x;
                        ((uint16_t *)dst)[x] = ((const uint16_t *)v->data)[off];
                    } else {
                        ((float *)dst)[x] = (float)load_elem(v, tb, tr0 + i, h, x);
                    }
                }
            }
    }
    return buf;
}

/* Bytes of a repacked [heads][rows][d4 vec4] tensor in the storage type. */
static size_t packed_bytes(const tiles *t, int32_t heads, int64_t rows)
{
    return (size_t)heads * (size_t)rows * (size_t)t->d4 * 4 * (t->f16 ? 2 : 4);
}

/* Working buffer `slot` holding at least `bytes` (data copied in when given) in *out: the
 * kept one when it is large enough, else a new one. */
static fa_status scratch_buffer(fa_context_t ctx, gles_state *s, int slot, const void *data, size_t bytes,
                                GLuint *out)
{
    if (bytes == 0)
        bytes = 16;
    if (!s->scratch[slot])
        glGenBuffers(1, &s->scratch[slot]);
    glBindBuffer(GL_SHADER_STORAGE_BUFFER, s->scratch[slot]);
    if (s->scratch_bytes[slot] < bytes) {
        s->scratch_bytes[slot] = 0; /* until the allocation is known to have worked */
        glBufferData(GL_SHADER_STORAGE_BUFFER, (GLsizeiptr)bytes, data, GL_DYNAMIC_COPY);
        const GLenum e = glGetError();
        if (e != GL_NO_ERROR)
            return fa_error(ctx, e == GL_OUT_OF_MEMORY ? FA_ERR_OUT_OF_MEMORY : FA_ERR_BACKEND,
                            "allocating a %zu-byte GL buffer for the call failed (OpenGL ES error 0x%x)",
                            bytes, (unsigned)e);
        s->scratch_bytes[slot] = bytes;
    } else if (data) {
        glBufferSubData(GL_SHADER_STORAGE_BUFFER, 0, (GLsizeiptr)bytes, data);
    }
    *out = s->scratch[slot];
    return FA_OK;
}

/* Where the attention shaders read q, k and v (u_qv, u_kv, u_vv): offset, batch stride, row
 * stride and head stride in the shaders' 4-element units, of the call's repacked copy or of
 * the caller's buffer read in place. */
typedef struct qkv_at {
    GLint v[4][4]; /* q, k, v, o */
} qkv_at;

/* Every uniform the shaders declare (a shader ignores those it lacks: location -1). */
static void set_uniforms(GLuint prog, const fa_problem *p, int64_t qrows, int64_t krows, int splits,
                         const qkv_at *at)
{
    const fa_attention_desc *d = p->desc;
    const int64_t cap = (int64_t)1 << 30;
    glUseProgram(prog);
    glUniform1i(glGetUniformLocation(prog, "u_batch"), p->batch);
    glUniform1i(glGetUniformLocation(prog, "u_heads_q"), p->heads_q);
    glUniform1i(glGetUniformLocation(prog, "u_group"), p->group);
    glUniform1i(glGetUniformLocation(prog, "u_seqlen_q"), d->seqlen_q);
    glUniform1i(glGetUniformLocation(prog, "u_seqlen_k"), d->seqlen_k);
    glUniform1i(glGetUniformLocation(prog, "u_varlen"), p->varlen);
    glUniform1i(glGetUniformLocation(prog, "u_qrows"), (GLint)qrows);
    glUniform1i(glGetUniformLocation(prog, "u_krows"), (GLint)krows);
    glUniform1i(glGetUniformLocation(prog, "u_win_left"), (GLint)(p->win_left < cap ? p->win_left : cap));
    glUniform1i(glGetUniformLocation(prog, "u_win_right"), (GLint)(p->win_right < cap ? p->win_right : cap));
    glUniform1f(glGetUniformLocation(prog, "u_scale_log2"), p->scale * 1.4426950408889634f);
    glUniform1f(glGetUniformLocation(prog, "u_softcap"), p->softcap);
    glUniform1f(glGetUniformLocation(prog, "u_cap_in"), p->softcap > 0.0f ? p->scale / p->softcap : 0.0f);
    glUniform1f(glGetUniformLocation(prog, "u_cap_out"), p->softcap * 1.4426950408889634f);
    glUniform1i(glGetUniformLocation(prog, "u_max_k"), p->max_k);
    glUniform1i(glGetUniformLocation(prog, "u_write_lse"), p->desc->lse != NULL);
    glUniform1i(glGetUniformLocation(prog, "u_splits"), splits);
    glUniform1i(glGetUniformLocation(prog, "u_key_lo"), 0); /* one dispatch for every key */
    glUniform1i(glGetUniformLocation(prog, "u_key_hi"), (GLint)cap);
    glUniform1i(glGetUniformLocation(prog, "u_chunk"), 3);
    glUniform1i(glGetUniformLocation(prog, "u_ml"), 0);
    static const char *const names[4] = { "u_qv", "u_kv", "u_vv", "u_ov" };
    for (int i = 0; i < 4; i++)
        glUniform4i(glGetUniformLocation(prog, names[i]), at->v[i][0], at->v[i][1], at->v[i][2], at->v[i][3]);
}

/* K and V buffers as the row variant's buffer textures, units 0 and 1 of the current program
 * (buffer 0 detaches). */
static void bind_kv_textures(gles_state *s, const tiles *t, GLuint k, GLuint v)
{
    if (!s->kv_tex[0])
        glGenTextures(2, s->kv_tex);
    const GLuint bufs[2] = { k, v };
    GLint prog = 0;
    glGetIntegerv(GL_CURRENT_PROGRAM, &prog);
    for (int i = 0; i < 2; i++) {
        glActiveTexture(GL_TEXTURE0 + (GLenum)i);
        glBindTexture(GL_TEXTURE_BUFFER_EXT, s->kv_tex[i]);
        /* packed halves (packHalf2x16 pairs, low half first) are RGBA16F texels byte for byte */
        s->tex_buffer(GL_TEXTURE_BUFFER_EXT, t->f16 ? GL_RGBA16F : GL_RGBA32F, bufs[i]);
    }
    glUniform1i(glGetUniformLocation((GLuint)prog, "u_ktex"), 0);
    glUniform1i(glGetUniformLocation((GLuint)prog, "u_vtex"), 1);
}

/* Make shader's program (compiled on first use) current with the call's uniforms. */
static fa_status use_pass(fa_context_t ctx, gles_state *s, int shader, const tiles *t,
                          const fa_problem *p, int64_t qrows, int64_t krows, int splits, const qkv_at *at)
{
    GLuint prog;
    fa_status st = get_program(ctx, s, shader, t, &prog);
    if (st == FA_OK)
        set_uniforms(prog, p, qrows, krows, splits, at);
    return st;
}

/* Read a float buffer back (whole; nothing to read for an empty output). */
static fa_status read_back(fa_context_t ctx, GLuint buf, size_t bytes, float *out)
{
    if (bytes == 0)
        return FA_OK;
    glBindBuffer(GL_SHADER_STORAGE_BUFFER, buf);
    const void *m = glMapBufferRange(GL_SHADER_STORAGE_BUFFER, 0, (GLsizeiptr)bytes, GL_MAP_READ_BIT);
    if (!m) {
        const fa_status st = gl_check(ctx, "mapping a result buffer");
        return st != FA_OK ? st : fa_error(ctx, FA_ERR_BACKEND, "mapping a result buffer failed");
    }
    memcpy(out, m, bytes);
    glUnmapBuffer(GL_SHADER_STORAGE_BUFFER);
    return FA_OK;
}

static void store_elem(const fa_tensor *v, int64_t off, float x)
{
    switch (v->dtype) {
    case FA_DTYPE_F32: ((float *)v->data)[off] = x; break;
    case FA_DTYPE_F16: ((uint16_t *)v->data)[off] = fa_f32_to_f16(x); break;
    default: ((uint16_t *)v->data)[off] = fa_f32_to_bf16(x); break;
    }
}

/* ---- fa_memory_* on this backend: GL buffers named by reserved address ranges ---- */

/* Room for one more record (fa_memory_alloc, fa_gles_buffer_wrap). */
static fa_status mem_room(fa_context_t ctx, gles_state *s)
{
    if (s->n_mem < s->cap_mem)
        return FA_OK;
    const int cap = s->cap_mem ? 2 * s->cap_mem : 16;
    gl_mem *m = realloc(s->mem, sizeof(*m) * (size_t)cap);
    if (!m)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory recording a GL buffer");
    s->mem = m;
    s->cap_mem = cap;
    return FA_OK;
}

static fa_status gles_mem_alloc(fa_context_t ctx, void *state, size_t bytes, void **ptr)
{
    gles_state *s = state;
    if (bytes > (size_t)INT32_MAX * 4)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "bytes (%zu): GLES shaders index buffers with 32-bit integers (at most %zu "
                        "bytes a buffer)", bytes, (size_t)INT32_MAX * 4);
    fa_status st = mem_room(ctx, s);
    if (st != FA_OK)
        return st;
    const size_t reserved = bytes ? bytes : 1;
    void *base = mmap(NULL, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "reserving %zu bytes of address space for a GL "
                                                   "buffer failed", reserved);
    if ((st = make_current(ctx, s)) != FA_OK) {
        munmap(base, reserved);
        return st;
    }
    /* whole 16-byte words: the shaders reach 16-bit elements through the 32-bit word holding them */
    const size_t gl_bytes = bytes ? (bytes + 15) / 16 * 16 : 16;
    GLuint name = 0;
    glGenBuffers(1, &name);
    glBindBuffer(GL_SHADER_STORAGE_BUFFER, name);
    glBufferData(GL_SHADER_STORAGE_BUFFER, (GLsizeiptr)gl_bytes, NULL, GL_DYNAMIC_COPY);
    if (glGetError() != GL_NO_ERROR) {
        glDeleteBuffers(1, &name);
        release_current(s);
        munmap(base, reserved);
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "creating a GL buffer of %zu bytes failed", bytes);
    }
    release_current(s);
    s->mem[s->n_mem++] = (gl_mem){ base, bytes, reserved, gl_bytes, name, 1 };
    *ptr = base;
    return FA_OK;
}

static fa_status gles_mem_import(fa_context_t ctx, void *state, uint32_t buffer, size_t bytes,
                                 void **ptr)
{
    gles_state *s = state;
    fa_status st = mem_room(ctx, s);
    if (st != FA_OK || (st = make_current(ctx, s)) != FA_OK)
        return st;
    GLint64 size = -1;
    const int is_buffer = glIsBuffer(buffer) == GL_TRUE;
    if (is_buffer) {
        glBindBuffer(GL_SHADER_STORAGE_BUFFER, buffer);
        glGetBufferParameteri64v(GL_SHADER_STORAGE_BUFFER, GL_BUFFER_SIZE, &size);
        glBindBuffer(GL_SHADER_STORAGE_BUFFER, 0);
    }
    release_current(s);
    if (!is_buffer)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "buffer (%u) is not a buffer object of the shared context (made with "
                        "glGenBuffers and given storage with glBufferData?)", (unsigned)buffer);
    if (size < 0 || (uint64_t)size < bytes)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT, "bytes (%zu) exceeds buffer %u's size (%lld bytes)",
                        bytes, (unsigned)buffer, (long long)size);
    const size_t reserved = bytes ? bytes : 1;
    void *base = mmap(NULL, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "reserving %zu bytes of address space for a GL "
                                                   "buffer failed", reserved);
    s->mem[s->n_mem++] = (gl_mem){ base, bytes, reserved, (size_t)size, buffer, 0 };
    *ptr = base;
    return FA_OK;
}

static fa_status gles_mem_free(fa_context_t ctx, void *state, void *ptr)
{
    gles_state *s = state;
    for (int i = 0; i < s->n_mem; i++) {
        if (s->mem[i].base != ptr)
            continue;
        if (s->mem[i].owned && make_current(ctx, s) == FA_OK) {
            glDeleteBuffers(1, &s->mem[i].name);
            release_current(s);
        }
        munmap(s->mem[i].base, s->mem[i].reserved);
        s->mem[i] = s->mem[--s->n_mem];
        return FA_OK;
    }
    return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                    "ptr (%p) is not a buffer fa_memory_alloc or fa_gles_buffer_wrap returned on "
                    "this GLES context", ptr);
}

/* The buffer that holds [p, p + bytes), and p's byte offset in it; NULL when p is not in one. */
static const gl_mem *find_mem(const gles_state *s, const void *p, size_t bytes, size_t *off)
{
    const unsigned char *c = p;
    for (int i = 0; i < s->n_mem; i++) {
        const gl_mem *m = &s->mem[i];
        if (c >= m->base && c < m->base + m->reserved) {
            *off = (size_t)(c - m->base);
            return *off + bytes <= m->bytes || (bytes == 0 && *off <= m->bytes) ? m : NULL;
        }
    }
    return NULL;
}

static fa_status gles_mem_copy(fa_context_t ctx, void *state, void *dst, const void *src,
                               size_t bytes, int to_backend)
{
    gles_state *s = state;
    size_t off = 0;
    const gl_mem *m = find_mem(s, to_backend ? dst : src, bytes, &off);
    if (!m)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s: [%p, +%zu bytes) is not inside one buffer from fa_memory_alloc on "
                        "this GLES context", to_backend ? "dst" : "src", to_backend ? dst : src, bytes);
    fa_status st = make_current(ctx, s);
    if (st != FA_OK)
        return st;
    glBindBuffer(GL_SHADER_STORAGE_BUFFER, m->name);
    if (to_backend) {
        glBufferSubData(GL_SHADER_STORAGE_BUFFER, (GLintptr)off, (GLsizeiptr)bytes, src);
        st = gl_check(ctx, "uploading into a GL buffer");
    } else {
        glMemoryBarrier(GL_BUFFER_UPDATE_BARRIER_BIT);
        const void *map = glMapBufferRange(GL_SHADER_STORAGE_BUFFER, (GLintptr)off, (GLsizeiptr)bytes,
                                           GL_MAP_READ_BIT);
        if (map) {
            memcpy(dst, map, bytes);
            glUnmapBuffer(GL_SHADER_STORAGE_BUFFER);
        } else if ((st = gl_check(ctx, "mapping a GL buffer")) == FA_OK) {
            st = fa_error(ctx, FA_ERR_BACKEND, "mapping a GL buffer for reading failed");
        }
    }
    release_current(s);
    return st;
}

/* A [batch, seq, heads, dim] view (lse: [batch, heads, seq] floats) inside one GL buffer:
 * its buffer, first element and strides in elements, checked to lie inside the buffer and
 * within the shaders' 32-bit indexing. */
typedef struct gl_view {
    const gl_mem *mem;
    int32_t off, sb, ss, sh, type; /* type: 0 f32, 1 f16, 2 bf16 */
} gl_view;

static fa_status gl_view_of(fa_context_t ctx, const gles_state *s, const void *data, fa_dtype dt,
                            int64_t sb, int64_t ss, int64_t sh, int64_t nb, int64_t rows,
                            int64_t heads, int64_t dim, const char *name, gl_view *v)
{
    const int64_t esz = dt == FA_DTYPE_F32 ? 4 : 2;
    size_t off = 0;
    const gl_mem *m = find_mem(s, data, 0, &off);
    if (!m)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s is not in a GL buffer while q.data is: pass q, k, v, o (and lse) all in "
                        "buffers from fa_memory_alloc, or all in host memory", name);
    if (off % (size_t)esz)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s: its byte offset in the GL buffer (%zu) is not a multiple of the element "
                        "size (%d)", name, off, (int)esz);
    /* the last element the view reaches (strides are positive after validation) */
    const int64_t first = (int64_t)off / esz;
    const int64_t last = first + (nb - 1) * sb + (rows - 1) * ss + (heads - 1) * sh + (dim - 1);
    if (nb > 0 && rows > 0 && heads > 0 && dim > 0 && (size_t)((last + 1) * esz) > m->bytes)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s: the view reaches byte %lld of its GL buffer of %zu bytes", name,
                        (long long)((last + 1) * esz), m->bytes);
    /* 16-bit elements are reached through the 32-bit word that holds them */
    if (esz == 2 && nb > 0 && rows > 0 && heads > 0 && dim > 0 && (size_t)(last / 2 + 1) * 4 > m->gl_bytes)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "%s: its last 16-bit element shares a 32-bit word with the byte past its GL "
                        "buffer's end (%zu bytes): give the buffer a size that is a multiple of 4",
                        name, m->gl_bytes);
    if (last > INT32_MAX / 2 || sb > INT32_MAX || ss > INT32_MAX || sh > INT32_MAX)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "%s: element offsets past 2^30 exceed the GLES shaders' 32-bit indexing", name);
    *v = (gl_view){ m, (int32_t)first, (int32_t)sb, (int32_t)ss, (int32_t)sh,
                    dt == FA_DTYPE_F32 ? 0 : dt == FA_DTYPE_F16 ? 1 : 2 };
    return FA_OK;
}

/* Dispatch one pack or unpack pass over `rows` rows (x: a grid-stride loop) of every head. */
static void move_pass(const gles_state *s, GLuint prog, const gl_view *v, int64_t rows, int heads,
                      int dim, int rows_per_seq, int d4, int lse)
{
    glUniform1i(glGetUniformLocation(prog, "u_rows"), (GLint)rows);
    glUniform1i(glGetUniformLocation(prog, "u_dim"), dim);
    glUniform1i(glGetUniformLocation(prog, "u_src_type"), v->type);
    glUniform1i(glGetUniformLocation(prog, "u_dst_type"), v->type);
    glUniform1i(glGetUniformLocation(prog, "u_off"), v->off);
    glUniform1i(glGetUniformLocation(prog, "u_sb"), v->sb);
    glUniform1i(glGetUniformLocation(prog, "u_ss"), v->ss);
    glUniform1i(glGetUniformLocation(prog, "u_sh"), v->sh);
    glUniform1i(glGetUniformLocation(prog, "u_rows_per_seq"), rows_per_seq);
    glUniform1i(glGetUniformLocation(prog, "u_lse"), lse);
    glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 7, v->mem->name);
    const int64_t n = lse ? rows : rows * d4;
    int64_t groups = (n + 63) / 64;
    if (groups > s->max_count[0])
        groups = s->max_count[0];
    if (groups > 0 && heads > 0)
        glDispatchCompute((GLuint)groups, (GLuint)heads, 1);
}

/* Tensor i (q, k, v, o) in the call's own layout, [heads][packed rows][d4], as u_qv .. u_ov. */
static void own_layout(const fa_problem *p, const tiles *t, int i, GLint w[4])
{
    const int is_k = i == 1 || i == 2;
    const int64_t rows = packed_rows(p, is_k), per_seq = is_k ? p->desc->seqlen_k : p->desc->seqlen_q;
    w[0] = 0;
    w[1] = p->varlen ? 0 : (GLint)(per_seq * t->d4);
    w[2] = t->d4;
    w[3] = (GLint)(rows * t->d4);
}

/* Where a call's tensors are: all in GL buffers (*resident: their views in gv, q k v o lse)
 * or all in host memory. And where the attention shaders read q, k and v and write o (qkv):
 * in place, in the caller's buffer, where it holds them in the storage type (o: float32, or
 * f16 as packed halves outside key chunks) as rows of whole aligned vec4s (no repacking or
 * unpacking pass; in_place[i] set), else in the call's own copy. */
static fa_status call_views(fa_context_t ctx, const gles_state *s, const fa_problem *p, const tiles *t,
                            int *resident, gl_view gv[5], int in_place[4], qkv_at *qkv)
{
    const fa_attention_desc *d = p->desc;
    const int64_t qrows = packed_rows(p, 0), krows = packed_rows(p, 1);
    const int64_t nb = p->varlen ? 1 : p->batch;
    const int64_t sq_rows = p->varlen ? qrows : d->seqlen_q, sk_rows = p->varlen ? krows : d->seqlen_k;
    size_t at;
    fa_status st;
    *resident = d->q.data && find_mem(s, d->q.data, 0, &at) != NULL;
    if (*resident) {
        const fa_tensor *tv[4] = { &d->q, &d->k, &d->v, &d->o };
        const char *names[4] = { "q.data", "k.data", "v.data", "o.data" };
        for (int i = 0; i < 4; i++) {
            const int is_k = i == 1 || i == 2;
            if ((st = gl_view_of(ctx, s, tv[i]->data, tv[i]->dtype, tv[i]->stride_batch, tv[i]->stride_seq,
                                 tv[i]->stride_head, nb, is_k ? sk_rows : sq_rows,
                                 is_k ? p->heads_kv : p->heads_q, p->dim, names[i], &gv[i])) != FA_OK)
                return st;
        }
        if (d->lse && (st = gl_view_of(ctx, s, d->lse, FA_DTYPE_F32, p->lse_sb, p->lse_ss, p->lse_sh, nb,
                                       sq_rows, p->heads_q, 1, "lse", &gv[4])) != FA_OK)
            return st;
    } else {
        const void *ptrs[4] = { d->k.data, d->v.data, d->o.data, d->lse };
        const char *names[4] = { "k.data", "v.data", "o.data", "lse" };
        for (int i = 0; i < 4; i++)
            if (ptrs[i] && find_mem(s, ptrs[i], 0, &at))
                return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                                "%s is in a GL buffer while q.data is host memory: pass q, k, v, o "
                                "(and lse) all in buffers from fa_memory_alloc, or all in host memory",
                                names[i]);
    }
    for (int i = 0; i < 4; i++) {
        const gl_view *v = &gv[i];
        const int one_seq = p->varlen || p->batch == 1; /* the batch stride is never used */
        const int type_ok = i < 3 ? v->type == (t->f16 ? 1 : 0) : v->type == 0 || (v->type == 1 && !t->chunk);
        in_place[i] = *resident && type_ok && p->dim % 4 == 0 && v->off % 4 == 0 &&
                      (one_seq || v->sb % 4 == 0) && v->ss % 4 == 0 && v->sh % 4 == 0;
        if (in_place[i]) {
            const GLint w[4] = { v->off / 4, one_seq ? 0 : v->sb / 4, v->ss / 4, v->sh / 4 };
            memcpy(qkv->v[i], w, sizeof(w));
        } else {
            own_layout(p, t, i, qkv->v[i]);
        }
    }
    return FA_OK;
}

static fa_status gles_plan(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    tiles t = { 0 };
    int resident, in_place[4];
    gl_view gv[5] = { { 0 } };
    qkv_at qkv;
    fa_status st = check(ctx, state, p, &t);
    if (st == FA_OK && (st = call_views(ctx, state, p, &t, &resident, gv, in_place, &qkv)) == FA_OK)
        report(&t, p, in_place, info);
    return st;
}

/* A finished call's timer query in ms; 0 where the GPU reported a disjoint event (clock
 * change, reset) since it began, which makes the result meaningless. */
static double timer_ms(const gles_state *s, GLuint timer)
{
    if (!timer)
        return 0.0;
    GLint disjoint = 0;
    glGetIntegerv(GL_GPU_DISJOINT_EXT, &disjoint);
    GLuint64 ns = 0;
    s->query_u64(timer, GL_QUERY_RESULT, &ns);
    return disjoint ? 0.0 : (double)ns * 1e-6;
}

static fa_status gles_forward(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    gles_state *s = state;
    const fa_attention_desc *d = p->desc;
    tiles t = { 0 };
    fa_status st = check(ctx, s, p, &t);
    if (st != FA_OK)
        return st;
    const int standard = d->algorithm == FA_ALGORITHM_STANDARD;
    const int64_t qrows = packed_rows(p, 0), krows = packed_rows(p, 1);
    if ((qrows + 1) * p->heads_q * t.d4 > INT32_MAX / 2 || (krows + 1) * p->heads_kv * t.d4 > INT32_MAX / 2 ||
        (standard && (qrows + 1) * p->heads_q * (int64_t)(p->max_k + 1) > INT32_MAX / 2))
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "the tensors (%lld query rows, %lld key rows, %d heads) exceed the 32-bit "
                        "indexing of GLES shaders",
                        (long long)qrows, (long long)krows, (int)p->heads_q);
    int resident, in_place[4];
    gl_view gv[5] = { { 0 } };
    qkv_at qkv;
    if ((st = call_views(ctx, s, p, &t, &resident, gv, in_place, &qkv)) != FA_OK)
        return st;
    const int rps_q = p->varlen ? 0 : d->seqlen_q, rps_k = p->varlen ? 0 : d->seqlen_k;
    size_t qb = packed_bytes(&t, p->heads_q, qrows), kb = packed_bytes(&t, p->heads_kv, krows), vb = kb;
    void *hq = NULL, *hk = NULL, *hv = NULL;
    if (!resident) {
        hq = pack(p, &d->q, p->heads_q, 0, t.d4, t.f16, qrows, &qb);
        hk = pack(p, &d->k, p->heads_kv, 1, t.d4, t.f16, krows, &kb);
        hv = pack(p, &d->v, p->heads_kv, 1, t.d4, t.f16, krows, &vb);
    }
    const size_t ob = (size_t)p->heads_q * (size_t)qrows * (size_t)t.d4 * 16;
    const size_t lb = (size_t)p->heads_q * (size_t)qrows * 4;
    float *ho = resident ? NULL : malloc(ob ? ob : 1), *hl = resident ? NULL : malloc(lb ? lb : 1);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(2 * p->batch + 2));
    if ((!resident && (!hq || !hk || !hv || !ho || !hl)) || !cu) {
        st = fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory staging the GLES tensors");
        goto out;
    }
    for (int32_t b = 0; b <= p->batch; b++) {
        cu[b] = p->varlen ? d->cu_seqlens_q[b] : 0;
        cu[p->batch + 1 + b] = p->varlen ? d->cu_seqlens_k[b] : 0;
    }
    if ((st = make_current(ctx, s)) != FA_OK)
        goto out;
    GLuint bufs[8] = { 0 }, timer = 0;
    int timing = 0; /* the timer query is active */
    /* q, k and v: the caller's buffer where it is read in place, else a repacked copy */
    const void *host[3] = { hq, hk, hv };
    const size_t bytes[3] = { qb, kb, vb };
    for (int i = 0; i < 3; i++) {
        if (in_place[i])
            bufs[i] = gv[i].mem->name;
        else if ((st = scratch_buffer(ctx, s, i, host[i], bytes[i], &bufs[i])) != FA_OK)
            goto release;
    }
    if (t.tex) { /* K and V as buffer textures, where their buffers fit the texel limit */
        for (int i = 1; i < 3; i++) {
            const size_t gl_bytes = in_place[i] ? gv[i].mem->gl_bytes : s->scratch_bytes[i];
            if (t.tex && gl_bytes / (t.f16 ? 8 : 16) > (size_t)s->max_texels) {
                const int cap = t.softcap;
                t = rows_tiles(s, p->dim, t.f16, 0);
                t.softcap = cap;
                if ((st = key_chunks(ctx, s, p, &t)) != FA_OK) /* its own loop counts */
                    goto release;
            }
        }
    }
    if (in_place[3] && gv[3].type == 1 && t.chunk) { /* key chunks carry float32 state in o */
        in_place[3] = 0;
        own_layout(p, &t, 3, qkv.v[3]);
    }
    t.o_f16 = in_place[3] && gv[3].type == 1;
    /* lse, and after it each row's running (max, sum) where the call runs in key chunks */
    if (in_place[3]) /* o written straight into the caller's buffer */
        bufs[3] = gv[3].mem->name;
    if ((!in_place[3] && (st = scratch_buffer(ctx, s, 3, NULL, ob, &bufs[3])) != FA_OK) ||
        (st = scratch_buffer(ctx, s, 4, NULL, t.chunk ? 3 * lb : lb, &bufs[4])) != FA_OK ||
        (st = scratch_buffer(ctx, s, 5, cu, sizeof(int32_t) * (size_t)(2 * p->batch + 2), &bufs[5])) != FA_OK)
        goto release;
    for (int i = 0; i < 3; i++)
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, (GLuint)i, bufs[i]);
    glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 5, bufs[5]);
    if ((st = gl_check(ctx, "uploading the tensors")) != FA_OK)
        goto release;
    if (resident) { /* the caller's views into the layout the attention shaders read */
        if ((st = use_pass(ctx, s, SH_PACK, &t, p, qrows, krows, 0, &qkv)) != FA_OK)
            goto release;
        GLint prog = 0;
        glGetIntegerv(GL_CURRENT_PROGRAM, &prog);
        for (int i = 0; i < 3; i++) {
            if (in_place[i])
                continue;
            glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 6, bufs[i]);
            move_pass(s, (GLuint)prog, &gv[i], i ? krows : qrows, i ? p->heads_kv : p->heads_q, p->dim,
                      i ? rps_k : rps_q, t.d4, 0);
        }
        glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT | (t.tex ? GL_TEXTURE_FETCH_BARRIER_BIT : 0));
    }
    /* the attention dispatches alone on the GPU clock, where the driver has the timer */
    if (s->query_u64) {
        GLint disjoint;
        glGetIntegerv(GL_GPU_DISJOINT_EXT, &disjoint); /* reads and clears the flag */
        glGenQueries(1, &timer);
        glBeginQuery(GL_TIME_ELAPSED_EXT, timer);
        timing = 1;
    }
    const int splits = decode_splits(p);
    if (splits) {
        /* chunks' partial outputs and (max, sum), then the merge into o and lse */
        const size_t parts = (size_t)p->heads_q * (size_t)p->batch * (size_t)splits;
        if ((st = scratch_buffer(ctx, s, 6, NULL, parts * (size_t)t.d4 * 16, &bufs[6])) != FA_OK ||
            (st = scratch_buffer(ctx, s, 7, NULL, parts * 8, &bufs[7])) != FA_OK ||
            (st = use_pass(ctx, s, SH_DEC_SPLIT, &t, p, qrows, krows, splits, &qkv)) != FA_OK)
            goto release;
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 3, bufs[6]);
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 4, bufs[7]);
        glDispatchCompute((GLuint)splits, (GLuint)p->heads_q, (GLuint)p->batch);
        glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT);
        if ((st = use_pass(ctx, s, SH_DEC_MERGE, &t, p, qrows, krows, splits, &qkv)) != FA_OK)
            goto release;
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 6, bufs[3]);
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 7, bufs[4]);
        glDispatchCompute(1, (GLuint)p->heads_q, (GLuint)p->batch);
    } else if (!standard) {
        if ((st = use_pass(ctx, s, t.tiled ? SH_FLASH_TILED : SH_FLASH, &t, p, qrows, krows, 0, &qkv)) != FA_OK)
            goto release;
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 3, bufs[3]);
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 4, bufs[4]);
        if (t.tex)
            bind_kv_textures(s, &t, bufs[1], bufs[2]);
        const GLuint groups = (GLuint)((p->max_q + t.br - 1) / t.br);
        const int64_t chunks = t.chunk ? (p->max_k + t.chunk - 1) / t.chunk : 1;
        GLint prog = 0;
        glGetIntegerv(GL_CURRENT_PROGRAM, &prog);
        glUniform1i(glGetUniformLocation((GLuint)prog, "u_ml"), (GLint)(p->heads_q * qrows));
        for (int64_t k = 0; k < chunks; k++) { /* key chunks: the state carried in o and lse */
            if (chunks > 1) {
                glUniform1i(glGetUniformLocation((GLuint)prog, "u_key_lo"), (GLint)(k * t.chunk));
                glUniform1i(glGetUniformLocation((GLuint)prog, "u_key_hi"),
                            k + 1 < chunks ? (GLint)((k + 1) * t.chunk) : (GLint)1 << 30);
                glUniform1i(glGetUniformLocation((GLuint)prog, "u_chunk"), (k == 0) | (k + 1 == chunks) << 1);
                if (k)
                    glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT);
            }
            glDispatchCompute(groups, (GLuint)p->heads_q, (GLuint)p->batch);
        }
        if (t.tex) /* the dispatch has its textures; the buffers are not held past the call */
            bind_kv_textures(s, &t, 0, 0);
    } else {
        const size_t sb = (size_t)p->heads_q * (size_t)qrows * (size_t)p->max_k * 4;
        if ((st = scratch_buffer(ctx, s, 6, NULL, sb, &bufs[6])) != FA_OK)
            goto release;
        const GLuint groups = (GLuint)((p->max_q + STD_GROUP - 1) / STD_GROUP);
        for (int pass = SH_SCORES; pass <= SH_PV; pass++) {
            if ((st = use_pass(ctx, s, pass, &t, p, qrows, krows, 0, &qkv)) != FA_OK)
                goto release;
            glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 3, bufs[6]);
            glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 4, pass == SH_PV ? bufs[3] : bufs[4]);
            const int kv_tex = t.tex && pass != SH_SOFTMAX; /* the softmax reads S alone */
            if (kv_tex)
                bind_kv_textures(s, &t, bufs[1], bufs[2]);
            glDispatchCompute(groups, (GLuint)p->heads_q, (GLuint)p->batch);
            if (kv_tex)
                bind_kv_textures(s, &t, 0, 0);
            glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT);
        }
    }
    if (timing)
        glEndQuery(GL_TIME_ELAPSED_EXT);
    timing = 0;
    glMemoryBarrier(GL_BUFFER_UPDATE_BARRIER_BIT | GL_SHADER_STORAGE_BARRIER_BIT);
    if (resident) { /* o and lse into the caller's buffers, on the GPU */
        if ((st = gl_check(ctx, "running the attention shaders")) != FA_OK ||
            (st = use_pass(ctx, s, SH_UNPACK, &t, p, qrows, krows, 0, &qkv)) != FA_OK)
            goto release;
        GLint prog = 0;
        glGetIntegerv(GL_CURRENT_PROGRAM, &prog);
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 6, bufs[3]);
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 3, bufs[4]);
        if (!in_place[3])
            move_pass(s, (GLuint)prog, &gv[3], qrows, p->heads_q, p->dim, rps_q, t.d4, 0);
        if (d->lse)
            move_pass(s, (GLuint)prog, &gv[4], qrows, p->heads_q, 1, rps_q, t.d4, 1);
        glMemoryBarrier(GL_BUFFER_UPDATE_BARRIER_BIT | GL_SHADER_STORAGE_BARRIER_BIT);
        /* done before we return, as the API promises for synchronous backends (and the caller's
         * context, when shared, reads the results next) */
        glFinish();
        if ((st = gl_check(ctx, "writing o and lse into their GL buffers")) == FA_OK) {
            report(&t, p, in_place, info);
            info->device_ms = timer_ms(s, timer);
        }
        goto release;
    }
    if ((st = gl_check(ctx, "running the attention shaders")) != FA_OK ||
        (st = read_back(ctx, bufs[3], ob, ho)) != FA_OK ||
        (d->lse && (st = read_back(ctx, bufs[4], lb, hl)) != FA_OK))
        goto release;

    for (int32_t b = 0; b < p->batch; b++) {
        const fa_seq sq = fa_problem_seq(p, b);
        const int64_t r0 = packed_start(p, &sq, b, 0);
        const int64_t tb = p->varlen ? 0 : b, tr0 = p->varlen ? r0 : 0;
        for (int32_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < sq.q_len; i++) {
                const float *src = ho + ((size_t)h * qrows + (size_t)(r0 + i)) * (size_t)t.d4 * 4;
                const int64_t off = tb * d->o.stride_batch + (tr0 + i) * d->o.stride_seq +
                                    h * d->o.stride_head;
                for (int32_t x = 0; x < p->dim; x++)
                    store_elem(&d->o, off + x, src[x]);
                if (d->lse)
                    d->lse[tb * p->lse_sb + h * p->lse_sh + (tr0 + i) * p->lse_ss] =
                        hl[(size_t)h * qrows + (size_t)(r0 + i)];
            }
    }
    report(&t, p, in_place, info);
    info->device_ms = timer_ms(s, timer);
release:
    if (timing) /* left by an error between the dispatches */
        glEndQuery(GL_TIME_ELAPSED_EXT);
    if (timer)
        glDeleteQueries(1, &timer);
    release_current(s);
out:
    free(hq);
    free(hk);
    free(hv);
    free(ho);
    free(hl);
    free(cu);
    return st;
}

static fa_status unsupported_backward(fa_context_t ctx, void *state, const fa_problem *p,
                                      fa_run_info *info)
{
    (void)state;
    (void)p;
    (void)info;
    return fa_error(ctx, FA_ERR_UNSUPPORTED,
                    "the GLES backend has no backward (inference only): use the CPU or CUDA backend");
}

const fa_backend_iface fa_gles_backend = {
    .id = FA_BACKEND_GLES,
    .name = "gles",
    .init = gles_init,
    .destroy = gles_destroy,
    .info = gles_info,
    .plan = gles_plan,
    .forward = gles_forward,
    .plan_backward = unsupported_backward,
    .backward = unsupported_backward,
    .mem_alloc = gles_mem_alloc,
    .mem_free = gles_mem_free,
    .mem_copy = gles_mem_copy,
    .mem_import = gles_mem_import,
};
