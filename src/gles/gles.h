/* SPDX-License-Identifier: MIT */
/* The OpenGL ES 3.1 compute backend's internals, shared by its files:
 *   loader.c    the EGL and GLES entry points, loaded at run time (gl_api.h)
 *   egl.c       the headless EGL context, the device's limits and extensions
 *   memory.c    GL buffers as fa_memory_* memory, views into them, the call's working buffers
 *   programs.c  shader programs compiled per (shader, tiles) from the embedded .comp sources
 *   plan.c      every decision of a call, from its own sizes: variant, tiles, key chunks,
 *               which tensors are read and written in place, the workspace
 *   run.c       one planned call: staging, the dispatches of each algorithm, the results
 *   backend.c   the backend interface: info, plan, forward
 *   api.c       fa_gles_context_create, fa_gles_buffer_wrap */
#ifndef FA_GLES_H
#define FA_GLES_H

#include "../core/internal.h"
#include "gl_api.h"
#include "native.h"

#define GLES_MAX_PROGRAMS 64
#define GLES_STD_GROUP 64 /* local size of the standard passes and the decode passes */
#define GLES_MIN_SSBOS 8  /* storage blocks a shader may use (the flash shader binds 6) */
/* Mesa's llvmpipe ends a shader's loops after 65535 iterations in all (nested ones counted
 * together), silently: a call whose shaders would loop longer gets wrong results there. */
#define GLES_LLVMPIPE_LOOPS 65535

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

/* The tiles of one call, the program's identity: head_dim in vec4s, query rows per
 * workgroup, keys per K/V tile, 16-bit storage; for the tiled fused forward also each
 * invocation's block (tm rows x tn keys), the invocation grid (nx x ny), the head_dim chunk of
 * its Q/K staging (dc4 vec4s), its V chunk (kc keys) and its shared-memory regions in vec4s
 * (Q/K chunk or V chunk, probabilities, row partials). */
typedef struct tiles {
    int d4, br, bc, f16;
    int tex;     /* the row variant reads K and V through buffer textures */
    int rows;    /* query rows per invocation of the row variant (1 for the tiled one) */
    int softcap; /* the call caps its logits (compiled in) */
    int o_f16;   /* o written in place into the caller's f16 buffer, as packed halves */
    int tiled, tm, tn, nx, ny, dc4, kc, sh_qk, sh_p, sh_r;
} tiles;

typedef struct program {
    int shader;
    tiles t;
    GLuint id;
} program;

/* A GL buffer handed out by fa_memory_alloc or wrapped by fa_gles_buffer_wrap: [base, base +
 * bytes) is reserved address space (no access, no memory behind it) that stands for buffer
 * `name`. */
typedef struct gl_mem {
    unsigned char *base;
    size_t bytes, reserved, gl_bytes; /* asked for, reserved, the GL buffer's own size */
    GLuint name;
    int owned; /* ours (fa_memory_alloc), or the caller's (fa_gles_buffer_wrap) */
} gl_mem;

/* The call's working buffers, kept between calls and grown as needed (allocating them per
 * call cost more than the shaders). Only their storage is kept: what a call runs never
 * depends on their sizes. */
enum { BUF_Q, BUF_K, BUF_V, BUF_O, BUF_LSE, BUF_CU, BUF_AUX, BUF_AUX2, BUF_COUNT };

typedef struct gles_state {
    EGLDisplay dpy;
    EGLContext ctx;
    const char *platform;
    char renderer[128], version[128];
    int cpu_renderer; /* llvmpipe, softpipe, SwiftShader: shaders run on the CPU */
    int llvmpipe;     /* its loop limit applies */
    GLint max_shared, max_invocations, max_count[3], max_ssbos;
    int has_16bit_storage; /* GL_EXT_shader_16bit_storage */
    /* GL_EXT_disjoint_timer_query's 64-bit result getter (NULL without the extension) */
    void(GL_APIENTRYP query_u64)(GLuint id, GLenum pname, GLuint64 *params);
    int forward;   /* FLASHATTN_GLES_FORWARD: 0 the planner's choice, 1 rows, 2 tiled, 3 rows-tex */
    int key_chunk; /* FLASHATTN_GLES_KEY_CHUNK: keys per fused dispatch on any device (tests) */
    /* buffer textures (GL_EXT_texture_buffer or GL_OES_texture_buffer: the extension's name,
     * NULL without), their texel limit, and the two the row variant reads K and V through */
    const char *texbuf;
    PFNGLTEXBUFFERRANGEEXTPROC tex_buffer_range;
    GLint max_texels;
    GLuint kv_tex[2];
    GLuint scratch[BUF_COUNT];
    size_t scratch_bytes[BUF_COUNT];
    /* program binaries: glGetProgramBinary's formats exist, and the folder they are kept in
     * between processes ("" where there is none) */
    int binaries;
    char cache_dir[512];
    program programs[GLES_MAX_PROGRAMS];
    int n_programs;
    gl_mem *mem; /* fa_memory_alloc's buffers and the caller's wrapped ones */
    int n_mem, cap_mem;
    int shared; /* the context shares objects with the caller's (fa_gles_context_create) */
    /* what was current on the calling thread before make_current, put back by release_current */
    EGLDisplay prev_dpy;
    EGLContext prev_ctx;
    EGLenum prev_api; /* the thread's bound EGL API before gles_make_current */
    EGLSurface prev_draw, prev_read;
} gles_state;

/* A [batch, seq, heads, dim] view (lse: [batch, heads, seq] floats) inside one GL buffer:
 * its buffer, first element and strides in elements, checked to lie inside the buffer and
 * within the shaders' 32-bit indexing; end: the bytes from the buffer's start to just past
 * the view's last element. */
typedef struct gl_view {
    const gl_mem *mem;
    int32_t off, sb, ss, sh, type; /* type: 0 f32, 1 f16, 2 bf16 */
    size_t end;
} gl_view;

/* Where the attention shaders read q, k and v and write o (u_qv .. u_ov): offset, batch
 * stride, row stride and head stride in the shaders' 4-element units, of the call's own copy
 * or of the caller's buffer in place. */
typedef struct qkv_at {
    GLint v[4][4];
} qkv_at;

typedef enum gles_algo { GLES_FUSED, GLES_DECODE, GLES_STANDARD } gles_algo;

/* Everything a call runs, decided once from the call alone (plan.c): fa_forward_plan reports
 * it and fa_forward runs it. */
typedef struct gles_plan {
    gles_algo algo;
    tiles t;
    int chunk;  /* keys per dispatch where the fused forward runs in key chunks (0: one) */
    int splits; /* decode: key chunks of the split pass */
    int64_t qrows, krows; /* packed rows of q (and o) and of k (and v) */
    int resident;         /* the tensors are in GL buffers (views in gv), else host memory */
    gl_view gv[5];        /* q, k, v, o, lse */
    int in_place[4];      /* q, k, v read and o written in the caller's buffer */
    qkv_at at;
    size_t bytes[BUF_COUNT]; /* each working buffer the call needs (0: none) */
    size_t tex_bytes[2];     /* K and V bytes bound as buffer textures */
} gles_plan;

/* egl.c */
fa_status gles_init(fa_context_t ctx, int32_t num_threads, const void *native, void **state);
void gles_destroy(void *state);
fa_status gles_make_current(fa_context_t ctx, gles_state *s);
void gles_release_current(gles_state *s);
fa_status gles_gl_check(fa_context_t ctx, const char *what);

/* memory.c */
fa_status gles_mem_alloc(fa_context_t ctx, void *state, size_t bytes, void **ptr);
fa_status gles_mem_import(fa_context_t ctx, void *state, uint64_t handle, size_t bytes, void **ptr);
fa_status gles_mem_free(fa_context_t ctx, void *state, void *ptr);
fa_status gles_mem_copy(fa_context_t ctx, void *state, void *dst, const void *src, size_t bytes,
                        fa_copy_kind kind);
/* The buffer that holds [p, p + bytes), and p's byte offset in it; NULL when p is not in one. */
const gl_mem *gles_find_mem(const gles_state *s, const void *p, size_t bytes, size_t *off);
fa_status gles_view_of(fa_context_t ctx, const gles_state *s, const void *data, fa_dtype dt,
                       int64_t sb, int64_t ss, int64_t sh, int64_t nb, int64_t rows, int64_t heads,
                       int64_t dim, const char *name, gl_view *v);
/* Working buffer `slot` holding at least `bytes` (data copied in when given) in *out. */
fa_status gles_scratch(fa_context_t ctx, gles_state *s, int slot, const void *data, size_t bytes,
                       GLuint *out);
/* Read `bytes` of a buffer back into host memory (nothing for 0 bytes). */
fa_status gles_read_back(fa_context_t ctx, GLuint buf, size_t bytes, void *out);

/* programs.c */
extern const char *const gles_shader_name[SH_COUNT];
/* Shader's program for tiles t (compiled on first use, or loaded from the binary cache). */
fa_status gles_program(fa_context_t ctx, gles_state *s, int shader, const tiles *t, GLuint *out);
/* Where program binaries are kept between processes (gles_state.cache_dir), at init. */
void gles_programs_init(gles_state *s);
void gles_programs_free(gles_state *s);

/* plan.c */
fa_status gles_plan_call(fa_context_t ctx, const gles_state *s, const fa_problem *p, gles_plan *pl);
void gles_plan_report(const gles_plan *pl, const fa_problem *p, fa_run_info *info);
/* The fused forward's tiles for a head_dim, as the planner picks them (gles.forward.dN). */
tiles gles_forward_tiles(const gles_state *s, int32_t dim, int f16);

/* run.c */
/* Run the plan; *device_ms: the attention dispatches' GPU time (0 where not measured). */
fa_status gles_run(fa_context_t ctx, gles_state *s, const fa_problem *p, const gles_plan *pl, double *device_ms);

#endif
