/* SPDX-License-Identifier: MIT */
/* The OpenGL ES 3.1 compute backend's interface: what `flashattn info` says of it, and plan
 * and forward, which share one plan (plan.c) so that a plan reports exactly what runs. The
 * pieces: gles.h. */
#include "gles.h"

#include <string.h>

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
    fa_appendf(buf, cap, len, "gles.program_binaries: %s%s\n",
               !s->binaries      ? "no (the driver offers no binary format): compiled in every process"
               : s->cache_dir[0] ? "kept between processes in "
                                 : "not kept (FLASHATTN_CACHE_DIR is empty, or no cache folder)",
               s->binaries && s->cache_dir[0] ? s->cache_dir : "");
    static const int dims[] = { 64, 128, 256 };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        tiles t = gles_forward_tiles(s, dims[i], 0);
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
    if (s->llvmpipe)
        fa_appendf(buf, cap, len,
                   "gles.loop_limit: llvmpipe stops a shader's loops after %d iterations; fused "
                   "forwards and the standard's score and P V passes past it run in key chunks (a "
                   "dispatch each); a standard call whose softmax pass is past it is refused\n",
                   GLES_LLVMPIPE_LOOPS);
    fa_appendf(buf, cap, len, "gles.forward.why: %s\n",
               s->forward == 1   ? "rows, forced by FLASHATTN_GLES_FORWARD"
               : s->forward == 2 ? "tiled where it fits, forced by FLASHATTN_GLES_FORWARD"
               : s->forward == 3 ? "rows-tex, forced by FLASHATTN_GLES_FORWARD"
               : s->texbuf && s->cpu_renderer
                   ? "a CPU renderer with buffer textures: rows-tex up to head_dim 128 (texel "
                     "fetches are gathered across SIMD lanes, shared-memory loads go one lane at a "
                     "time), tiled above; rows where K or V exceeds the buffer-texture limit"
                   : "tiled wherever its invocation grid and shared memory fit the limits (no "
                     "invocation holds a whole row), rows otherwise");
}

static fa_status gles_plan_entry(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    gles_plan pl;
    fa_status st = gles_plan_call(ctx, state, p, &pl);
    if (st == FA_OK)
        gles_plan_report(&pl, p, info);
    return st;
}

static fa_status gles_forward(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    gles_plan pl;
    fa_status st = gles_plan_call(ctx, state, p, &pl);
    double device_ms = 0.0;
    if (st == FA_OK && (st = gles_run(ctx, state, p, &pl, &device_ms)) == FA_OK) {
        gles_plan_report(&pl, p, info);
        info->device_ms = device_ms;
    }
    return st;
}

static fa_status unsupported_backward(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
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
    .plan = gles_plan_entry,
    .forward = gles_forward,
    .plan_backward = unsupported_backward,
    .backward = unsupported_backward,
    .mem_alloc = gles_mem_alloc,
    .mem_free = gles_mem_free,
    .mem_copy = gles_mem_copy,
    .mem_import = gles_mem_import,
};
