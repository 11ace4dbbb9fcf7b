/* SPDX-License-Identifier: MIT */
/* One planned GLES call: q, k and v staged where the plan says (read in place, repacked on the
 * GPU from the caller's GL buffers, or repacked on the CPU and uploaded from host memory), the
 * algorithm's dispatches, then o and lse written where the caller wants them. */
#include "gles.h"
#include "../cpu/kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

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

static void store_elem(const fa_tensor *v, int64_t off, float x)
{
    switch (v->dtype) {
    case FA_DTYPE_F32: ((float *)v->data)[off] = x; break;
    case FA_DTYPE_F16: ((uint16_t *)v->data)[off] = fa_f32_to_f16(x); break;
    default: ((uint16_t *)v->data)[off] = fa_f32_to_bf16(x); break;
    }
}

/* First packed row of sequence b: its varlen offset, or b * seqlen. */
static int64_t packed_start(const fa_problem *p, const fa_seq *s, int32_t b, int is_k)
{
    if (p->varlen)
        return is_k ? s->k_start : s->q_start;
    return (int64_t)b * (is_k ? p->desc->seqlen_k : p->desc->seqlen_q);
}

/* A host view's rows repacked as [heads][packed rows][d4 * 4] in the storage type (float or
 * half, zero padded) into buf (bytes of it: heads x rows x d4 vec4s). f16 bits are copied. */
static void pack(const fa_problem *p, const fa_tensor *v, int32_t heads, int is_k, const tiles *t, int64_t rows,
                 unsigned char *buf)
{
    const size_t esz = t->f16 ? 2 : 4, row_elems = (size_t)t->d4 * 4;
    for (int32_t b = 0; b < p->batch; b++) {
        const fa_seq sq = fa_problem_seq(p, b);
        const int64_t n = is_k ? sq.k_len : sq.q_len;
        const int64_t r0 = packed_start(p, &sq, b, is_k);
        const int64_t tb = p->varlen ? 0 : b, tr0 = p->varlen ? r0 : 0; /* tensor coordinates */
        for (int32_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < n; i++) {
                unsigned char *dst = buf + (((size_t)h * rows + (size_t)(r0 + i)) * row_elems) * esz;
                for (int32_t x = 0; x < p->dim; x++) {
                    if (t->f16) {
                        const int64_t off = tb * v->stride_batch + (tr0 + i) * v->stride_seq +
                                            h * v->stride_head + x;
                        ((uint16_t *)dst)[x] = ((const uint16_t *)v->data)[off];
                    } else {
                        ((float *)dst)[x] = (float)load_elem(v, tb, tr0 + i, h, x);
                    }
                }
            }
    }
}

/* Every uniform the shaders declare (a shader ignores those it lacks: location -1). */
static void set_uniforms(GLuint prog, const fa_problem *p, const gles_plan *pl)
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
    glUniform1i(glGetUniformLocation(prog, "u_qrows"), (GLint)pl->qrows);
    glUniform1i(glGetUniformLocation(prog, "u_krows"), (GLint)pl->krows);
    glUniform1i(glGetUniformLocation(prog, "u_win_left"), (GLint)(p->win_left < cap ? p->win_left : cap));
    glUniform1i(glGetUniformLocation(prog, "u_win_right"), (GLint)(p->win_right < cap ? p->win_right : cap));
    glUniform1f(glGetUniformLocation(prog, "u_scale_log2"), p->scale * 1.4426950408889634f);
    glUniform1f(glGetUniformLocation(prog, "u_softcap"), p->softcap);
    glUniform1f(glGetUniformLocation(prog, "u_cap_in"), p->softcap > 0.0f ? p->scale / p->softcap : 0.0f);
    glUniform1f(glGetUniformLocation(prog, "u_cap_out"), p->softcap * 1.4426950408889634f);
    glUniform1i(glGetUniformLocation(prog, "u_max_k"), p->max_k);
    glUniform1i(glGetUniformLocation(prog, "u_write_lse"), p->desc->lse != NULL);
    glUniform1i(glGetUniformLocation(prog, "u_splits"), pl->splits);
    glUniform1i(glGetUniformLocation(prog, "u_key_lo"), 0); /* one dispatch for every key */
    glUniform1i(glGetUniformLocation(prog, "u_key_hi"), (GLint)cap);
    glUniform1i(glGetUniformLocation(prog, "u_chunk"), 3);
    glUniform1i(glGetUniformLocation(prog, "u_ml"), 0);
    static const char *const names[4] = { "u_qv", "u_kv", "u_vv", "u_ov" };
    for (int i = 0; i < 4; i++) {
        const GLint *w = pl->at.v[i];
        glUniform4i(glGetUniformLocation(prog, names[i]), w[0], w[1], w[2], w[3]);
    }
}

/* K and V buffers as the row variant's buffer textures, units 0 and 1 of the current program:
 * the plan's bytes of each from its start (the texel limit the planner checked), or detached
 * (bufs NULL). */
static void bind_kv_textures(gles_state *s, const gles_plan *pl, const GLuint *bufs)
{
    if (!s->kv_tex[0])
        glGenTextures(2, s->kv_tex);
    GLint prog = 0;
    glGetIntegerv(GL_CURRENT_PROGRAM, &prog);
    for (int i = 0; i < 2; i++) {
        glActiveTexture(GL_TEXTURE0 + (GLenum)i);
        glBindTexture(GL_TEXTURE_BUFFER_EXT, s->kv_tex[i]);
        /* packed halves (packHalf2x16 pairs, low half first) are RGBA16F texels byte for byte */
        const GLenum format = pl->t.f16 ? GL_RGBA16F : GL_RGBA32F;
        const size_t texel = pl->t.f16 ? 8 : 16, bytes = (pl->tex_bytes[i] + texel - 1) / texel * texel;
        if (bufs && bytes)
            s->tex_buffer_range(GL_TEXTURE_BUFFER_EXT, format, bufs[1 + i], 0, (GLsizeiptr)bytes);
        else
            s->tex_buffer_range(GL_TEXTURE_BUFFER_EXT, format, 0, 0, 0);
    }
    glUniform1i(glGetUniformLocation((GLuint)prog, "u_ktex"), 0);
    glUniform1i(glGetUniformLocation((GLuint)prog, "u_vtex"), 1);
}

/* Make shader's program (compiled on first use) current with the call's uniforms; *prog_out
 * its name. */
static fa_status use_pass(fa_context_t ctx, gles_state *s, int shader, const fa_problem *p, const gles_plan *pl,
                          GLuint *prog_out)
{
    GLuint prog;
    fa_status st = gles_program(ctx, s, shader, &pl->t, &prog);
    if (st == FA_OK) {
        set_uniforms(prog, p, pl);
        if (prog_out)
            *prog_out = prog;
    }
    return st;
}

/* Dispatch one pack or unpack pass over `rows` rows (x: a grid-stride loop) of every head. */
static void move_pass(const gles_state *s, GLuint prog, const gl_view *v, int64_t rows, int heads, int dim,
                      int rows_per_seq, int d4, int lse)
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

/* Key chunk k of chunks for the next dispatch of prog: keys [u_key_lo, u_key_hi) and whether it
 * is the first and the last (common.glsl). */
static void key_range(GLuint prog, const gles_plan *pl, int64_t k, int64_t chunks)
{
    glUniform1i(glGetUniformLocation(prog, "u_key_lo"), (GLint)(k * pl->chunk));
    glUniform1i(glGetUniformLocation(prog, "u_key_hi"), k + 1 < chunks ? (GLint)((k + 1) * pl->chunk) : (GLint)1 << 30);
    glUniform1i(glGetUniformLocation(prog, "u_chunk"), (k == 0) | (k + 1 == chunks) << 1);
}

/* The attention dispatches of the plan's algorithm, with q, k, v, the offsets, o and lse bound
 * (bufs: the plan's buffers, caller's or working). */
static fa_status dispatch(fa_context_t ctx, gles_state *s, const fa_problem *p, const gles_plan *pl, GLuint *bufs)
{
    const tiles *t = &pl->t;
    fa_status st;
    GLuint prog;
    if (pl->algo == GLES_DECODE) {
        /* chunks' partial outputs and (max, sum), then the merge into o and lse */
        if ((st = gles_scratch(ctx, s, BUF_AUX, NULL, pl->bytes[BUF_AUX], &bufs[BUF_AUX])) != FA_OK ||
            (st = gles_scratch(ctx, s, BUF_AUX2, NULL, pl->bytes[BUF_AUX2], &bufs[BUF_AUX2])) != FA_OK ||
            (st = use_pass(ctx, s, SH_DEC_SPLIT, p, pl, NULL)) != FA_OK)
            return st;
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 3, bufs[BUF_AUX]);
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 4, bufs[BUF_AUX2]);
        glDispatchCompute((GLuint)pl->splits, (GLuint)p->heads_q, (GLuint)p->batch);
        glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT);
        if ((st = use_pass(ctx, s, SH_DEC_MERGE, p, pl, NULL)) != FA_OK)
            return st;
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 6, bufs[BUF_O]);
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 7, bufs[BUF_LSE]);
        glDispatchCompute(1, (GLuint)p->heads_q, (GLuint)p->batch);
        return FA_OK;
    }
    if (pl->algo == GLES_STANDARD) {
        if ((st = gles_scratch(ctx, s, BUF_AUX, NULL, pl->bytes[BUF_AUX], &bufs[BUF_AUX])) != FA_OK)
            return st;
        const GLuint groups = (GLuint)((p->max_q + GLES_STD_GROUP - 1) / GLES_STD_GROUP);
        for (int pass = SH_SCORES; pass <= SH_PV; pass++) {
            if ((st = use_pass(ctx, s, pass, p, pl, &prog)) != FA_OK)
                return st;
            glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 3, bufs[BUF_AUX]);
            glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 4, pass == SH_PV ? bufs[BUF_O] : bufs[BUF_LSE]);
            const int kv_tex = t->tex && pass != SH_SOFTMAX; /* the softmax reads S alone */
            if (kv_tex)
                bind_kv_textures(s, pl, bufs);
            /* the score and P V passes in key chunks (a P V chunk adds to the o before it) */
            const int64_t chunks = pl->chunk && pass != SH_SOFTMAX ? (p->max_k + pl->chunk - 1) / pl->chunk : 1;
            for (int64_t k = 0; k < chunks; k++) {
                if (chunks > 1)
                    key_range(prog, pl, k, chunks);
                glDispatchCompute(groups, (GLuint)p->heads_q, (GLuint)p->batch);
                glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT);
            }
            if (kv_tex)
                bind_kv_textures(s, pl, NULL);
        }
        return FA_OK;
    }
    if ((st = use_pass(ctx, s, t->tiled ? SH_FLASH_TILED : SH_FLASH, p, pl, &prog)) != FA_OK)
        return st;
    glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 3, bufs[BUF_O]);
    glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 4, bufs[BUF_LSE]);
    if (t->tex)
        bind_kv_textures(s, pl, bufs);
    const GLuint groups = (GLuint)((p->max_q + t->br - 1) / t->br);
    const int64_t chunks = pl->chunk ? (p->max_k + pl->chunk - 1) / pl->chunk : 1;
    glUniform1i(glGetUniformLocation(prog, "u_ml"), (GLint)(p->heads_q * pl->qrows));
    for (int64_t k = 0; k < chunks; k++) { /* key chunks: the state carried in o and lse */
        if (chunks > 1) {
            key_range(prog, pl, k, chunks);
            if (k)
                glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT);
        }
        glDispatchCompute(groups, (GLuint)p->heads_q, (GLuint)p->batch);
    }
    if (t->tex) /* the dispatch has its textures; the buffers are not held past the call */
        bind_kv_textures(s, pl, NULL);
    return FA_OK;
}

/* Host tensors: q, k and v repacked into one staging allocation (their working buffers'
 * bytes, back to back), o and lse read back into another. */
typedef struct host_stage {
    unsigned char *in;  /* q, k, v */
    float *out;         /* o, then lse */
} host_stage;

static fa_status stage_host(fa_context_t ctx, const fa_problem *p, const gles_plan *pl, host_stage *h)
{
    const fa_attention_desc *d = p->desc;
    const size_t in = pl->bytes[BUF_Q] + pl->bytes[BUF_K] + pl->bytes[BUF_V];
    const size_t out = pl->bytes[BUF_O] + (size_t)p->heads_q * (size_t)pl->qrows * 4;
    h->in = calloc(in ? in : 1, 1);
    h->out = malloc(out ? out : 1);
    if (!h->in || !h->out)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory staging the GLES tensors (%zu bytes)", in + out);
    pack(p, &d->q, p->heads_q, 0, &pl->t, pl->qrows, h->in);
    pack(p, &d->k, p->heads_kv, 1, &pl->t, pl->krows, h->in + pl->bytes[BUF_Q]);
    pack(p, &d->v, p->heads_kv, 1, &pl->t, pl->krows, h->in + pl->bytes[BUF_Q] + pl->bytes[BUF_K]);
    return FA_OK;
}

/* o and lse from the read-back copy into the caller's host tensors. */
static void unstage_host(const fa_problem *p, const gles_plan *pl, const host_stage *hs)
{
    const fa_attention_desc *d = p->desc;
    const float *ho = hs->out, *hl = hs->out + pl->bytes[BUF_O] / 4;
    for (int32_t b = 0; b < p->batch; b++) {
        const fa_seq sq = fa_problem_seq(p, b);
        const int64_t r0 = packed_start(p, &sq, b, 0);
        const int64_t tb = p->varlen ? 0 : b, tr0 = p->varlen ? r0 : 0;
        for (int32_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < sq.q_len; i++) {
                const float *src = ho + ((size_t)h * pl->qrows + (size_t)(r0 + i)) * (size_t)pl->t.d4 * 4;
                const int64_t off = tb * d->o.stride_batch + (tr0 + i) * d->o.stride_seq + h * d->o.stride_head;
                for (int32_t x = 0; x < p->dim; x++)
                    store_elem(&d->o, off + x, src[x]);
                if (d->lse)
                    d->lse[tb * p->lse_sb + h * p->lse_sh + (tr0 + i) * p->lse_ss] =
                        hl[(size_t)h * pl->qrows + (size_t)(r0 + i)];
            }
    }
}

fa_status gles_run(fa_context_t ctx, gles_state *s, const fa_problem *p, const gles_plan *pl, double *device_ms)
{
    const fa_attention_desc *d = p->desc;
    const tiles *t = &pl->t;
    *device_ms = 0.0;
    if (pl->qrows == 0) /* no query rows: nothing to write */
        return FA_OK;
    host_stage h = { NULL, NULL };
    int32_t *cu = malloc(pl->bytes[BUF_CU]);
    fa_status st = cu ? FA_OK : fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory staging the GLES tensors");
    if (st == FA_OK && !pl->resident)
        st = stage_host(ctx, p, pl, &h);
    if (st != FA_OK)
        goto out;
    for (int32_t b = 0; b <= p->batch; b++) {
        cu[b] = p->varlen ? d->cu_seqlens_q[b] : 0;
        cu[p->batch + 1 + b] = p->varlen ? d->cu_seqlens_k[b] : 0;
    }
    if ((st = gles_make_current(ctx, s)) != FA_OK)
        goto out;
    GLuint bufs[BUF_COUNT] = { 0 }, timer = 0, prog;
    int timing = 0; /* the timer query is active */
    /* q, k and v: the caller's buffer where it is read in place, else a repacked copy */
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        if (pl->in_place[i])
            bufs[i] = pl->gv[i].mem->name;
        else if ((st = gles_scratch(ctx, s, i, h.in ? h.in + at : NULL, pl->bytes[i], &bufs[i])) != FA_OK)
            goto release;
        at += pl->bytes[i];
    }
    if (pl->in_place[3]) /* o written straight into the caller's buffer */
        bufs[BUF_O] = pl->gv[3].mem->name;
    if ((!pl->in_place[3] && (st = gles_scratch(ctx, s, BUF_O, NULL, pl->bytes[BUF_O], &bufs[BUF_O])) != FA_OK) ||
        (st = gles_scratch(ctx, s, BUF_LSE, NULL, pl->bytes[BUF_LSE], &bufs[BUF_LSE])) != FA_OK ||
        (st = gles_scratch(ctx, s, BUF_CU, cu, pl->bytes[BUF_CU], &bufs[BUF_CU])) != FA_OK)
        goto release;
    for (int i = 0; i < 3; i++)
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, (GLuint)i, bufs[i]);
    glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 5, bufs[BUF_CU]);
    if ((st = gles_gl_check(ctx, "uploading the tensors")) != FA_OK)
        goto release;
    const int rps_q = p->varlen ? 0 : d->seqlen_q, rps_k = p->varlen ? 0 : d->seqlen_k;
    if (pl->resident) { /* the caller's views into the layout the attention shaders read */
        if ((st = use_pass(ctx, s, SH_PACK, p, pl, &prog)) != FA_OK)
            goto release;
        for (int i = 0; i < 3; i++) {
            if (pl->in_place[i])
                continue;
            glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 6, bufs[i]);
            move_pass(s, prog, &pl->gv[i], i ? pl->krows : pl->qrows, i ? p->heads_kv : p->heads_q, p->dim,
                      i ? rps_k : rps_q, t->d4, 0);
        }
        glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT | (t->tex ? GL_TEXTURE_FETCH_BARRIER_BIT : 0));
    }
    /* the attention dispatches alone on the GPU clock, where the driver has the timer */
    if (s->query_u64) {
        GLint disjoint;
        glGetIntegerv(GL_GPU_DISJOINT_EXT, &disjoint); /* reads and clears the flag */
        glGenQueries(1, &timer);
        glBeginQuery(GL_TIME_ELAPSED_EXT, timer);
        timing = 1;
    }
    if ((st = dispatch(ctx, s, p, pl, bufs)) != FA_OK)
        goto release;
    if (timing)
        glEndQuery(GL_TIME_ELAPSED_EXT);
    timing = 0;
    glMemoryBarrier(GL_BUFFER_UPDATE_BARRIER_BIT | GL_SHADER_STORAGE_BARRIER_BIT);
    if ((st = gles_gl_check(ctx, "running the attention shaders")) != FA_OK)
        goto release;
    if (pl->resident) { /* o and lse into the caller's buffers, on the GPU */
        if ((st = use_pass(ctx, s, SH_UNPACK, p, pl, &prog)) != FA_OK)
            goto release;
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 6, bufs[BUF_O]);
        glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 3, bufs[BUF_LSE]);
        if (!pl->in_place[3])
            move_pass(s, prog, &pl->gv[3], pl->qrows, p->heads_q, p->dim, rps_q, t->d4, 0);
        if (d->lse)
            move_pass(s, prog, &pl->gv[4], pl->qrows, p->heads_q, 1, rps_q, t->d4, 1);
        glMemoryBarrier(GL_BUFFER_UPDATE_BARRIER_BIT | GL_SHADER_STORAGE_BARRIER_BIT);
        /* done before we return, as the API promises for synchronous backends (and the caller's
         * context, when shared, reads the results next) */
        glFinish();
        st = gles_gl_check(ctx, "writing o and lse into their GL buffers");
    } else {
        const size_t lse_bytes = (size_t)p->heads_q * (size_t)pl->qrows * 4;
        if ((st = gles_read_back(ctx, bufs[BUF_O], pl->bytes[BUF_O], h.out)) == FA_OK &&
            (!d->lse || (st = gles_read_back(ctx, bufs[BUF_LSE], lse_bytes, h.out + pl->bytes[BUF_O] / 4)) == FA_OK))
            unstage_host(p, pl, &h);
    }
    if (st == FA_OK)
        *device_ms = timer_ms(s, timer);
release:
    if (timing) /* left by an error between the dispatches */
        glEndQuery(GL_TIME_ELAPSED_EXT);
    if (timer)
        glDeleteQueries(1, &timer);
    gles_release_current(s);
out:
    free(h.in);
    free(h.out);
    free(cu);
    return st;
}
