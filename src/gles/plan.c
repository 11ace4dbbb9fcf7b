/* SPDX-License-Identifier: MIT */
/* The GLES planner: every decision of a call, made once from the call's own sizes and the
 * device's limits (never from state earlier calls left), into one gles_plan that
 * fa_forward_plan reports and fa_forward runs. */
#include "gles.h"

#include <stdio.h>
#include <string.h>

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
    t.br = 64; /* the invocation limit is at least 64 (GLES_STD_GROUP) */
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
    const int(*shapes)[4] = s->cpu_renderer ? cpu : gpu;
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

/* On CPU renderers with buffer textures the row variant reading K and V through them (where
 * shared-memory loads go one SIMD lane at a time, texel fetches are gathered: 3x faster than
 * the tiled variant on llvmpipe, docs/perf/gles.md); elsewhere the tiled one wherever it fits,
 * the row variant through shared memory otherwise. FLASHATTN_GLES_FORWARD forces one. */
tiles gles_forward_tiles(const gles_state *s, int32_t dim, int f16)
{
    tiles t;
    if (s->forward == 3 ||
        (s->forward == 0 && s->texbuf && s->cpu_renderer && dim <= CPU_ROWS_MAX_DIM))
        return rows_tiles(s, dim, f16, 1);
    if (s->forward != 1 && tiled_tiles(s, dim, f16, &t))
        return t;
    return rows_tiles(s, dim, f16, 0);
}

static int64_t packed_rows(const fa_problem *p, int is_k)
{
    const fa_attention_desc *d = p->desc;
    if (p->varlen)
        return is_k ? d->cu_seqlens_k[p->batch] : d->cu_seqlens_q[p->batch];
    return (int64_t)p->batch * (is_k ? d->seqlen_k : d->seqlen_q);
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

/* The loop iterations of one invocation over `keys` keys on llvmpipe, from what was measured on
 * Mesa 22.3 (docs/perf/gles.md): head_dim loops up to 32 vec4s are unrolled, longer ones are
 * not; the tiled forward's loops come to about 37 x D4 per 64-key tile (48 here, for margin)
 * plus a part that does not scale with head_dim (83 a tile measured at D4 1; 96 here).
 * pass: 0 the fused forward, 1-3 the standard's passes (decode: decode_fit). */
static int64_t llvmpipe_loops(const tiles *t, gles_algo algo, int64_t keys, int *pass)
{
    const int64_t tiles_k = (keys + 63) / 64, d4 = t->d4;
    const int64_t dim_loop = d4 > 32 ? d4 : 1; /* iterations a head_dim loop costs */
    int64_t worst = 0;
    *pass = 0;
    if (algo == GLES_STANDARD) {
        const int64_t passes[3] = { keys * dim_loop + d4, 3 * keys, keys * dim_loop + 2 * d4 };
        for (int i = 0; i < 3; i++)
            if (passes[i] > worst) {
                worst = passes[i];
                *pass = 1 + i;
            }
        return worst;
    }
    if (t->tiled)
        return tiles_k * (48 * d4 + 96);
    /* the row variant: a head_dim loop per K and per V row and per row's rescale every 4 keys
     * where they are not unrolled, a block per 4 keys, staging, the rows' set-up (an upper bound
     * on the texture path, whose blocks are 8 keys) */
    return keys * (d4 > 32 ? 2 * d4 + t->rows * d4 / 4 : 0) + keys / 4 + tiles_k * (1 + d4) + 4 * t->rows * d4;
}

/* The decode path under llvmpipe's loop limit: a chunk's invocations turn about 4 loops a key
 * (its score, max and sum loops over 64-key tiles) plus their head_dim loops, so long caches
 * take more chunks than the 64 decode_splits stops at; the merge then turns about 3 + D4 loops
 * a chunk. */
static fa_status decode_fit(fa_context_t ctx, const gles_state *s, const fa_problem *p, gles_plan *pl,
                            int64_t limit)
{
    const int64_t d4 = pl->t.d4, chunk = (p->max_k + pl->splits - 1) / pl->splits;
    if (4 * chunk + 4 * d4 <= limit)
        return FA_OK;
    const int64_t fit = (limit - 4 * d4) / 4, splits = fit > 0 ? (p->max_k + fit - 1) / fit : INT32_MAX;
    if (fit > 0 && splits <= s->max_count[0] && splits * (3 + d4) <= limit) {
        pl->splits = (int)splits;
        return FA_OK;
    }
    return fa_error(ctx, FA_ERR_UNSUPPORTED,
                    "max_k (%d keys) at head_dim %d: a decode call stays inside llvmpipe's loop "
                    "limit (%d turns an invocation, past which it silently stops) only in %lld "
                    "chunks, and their merge would loop about %lld times; use fewer keys per call "
                    "(a window) or the CPU backend",
                    (int)p->max_k, (int)p->dim, GLES_LLVMPIPE_LOOPS, (long long)splits,
                    (long long)(splits * (3 + d4)));
}

/* pl->chunk: the fused forward, or the standard's score and P V passes, in key chunks, one
 * dispatch each, where FLASHATTN_GLES_KEY_CHUNK asks for it or llvmpipe's loop limit needs it
 * (the most whole key tiles a dispatch may walk inside 90% of it, half of that where the fused
 * forward's rows may walk their keys twice). Calls past the limit that cannot be cut (the
 * standard's softmax pass walks a row's every key three times in one invocation) are refused. */
static fa_status key_chunks(fa_context_t ctx, const gles_state *s, const fa_problem *p, gles_plan *pl)
{
    const tiles *t = &pl->t;
    const int standard = pl->algo == GLES_STANDARD;
    /* the fused forward carries each row's (max, sum) after lse: 3 floats a row */
    const int cuttable = standard || (pl->algo == GLES_FUSED && (int64_t)p->heads_q * pl->qrows * 3 <= INT32_MAX / 2);
    pl->chunk = 0;
    if (s->key_chunk && cuttable && p->max_k > s->key_chunk)
        pl->chunk = s->key_chunk > t->bc ? s->key_chunk / t->bc * t->bc : t->bc;
    if (!s->llvmpipe || pl->chunk)
        return FA_OK;
    int pass;
    /* the fused and decode shaders walk a row's keys a second time where its sum overflowed
     * float32 (common.glsl): their budget is half */
    const int64_t limit = GLES_LLVMPIPE_LOOPS * 9 / 10 / (standard ? 1 : 2);
    if (pl->algo == GLES_DECODE)
        return decode_fit(ctx, s, p, pl, limit);
    int64_t loops = llvmpipe_loops(t, pl->algo, p->max_k, &pass);
    if (loops <= limit)
        return FA_OK;
    if (standard && 3 * (int64_t)p->max_k > limit) { /* the softmax pass, which is not cut */
        pass = 2;
        loops = 3 * (int64_t)p->max_k;
    } else if (cuttable) {
        int64_t chunk = 0;
        int unused;
        for (int64_t c = t->bc; c < p->max_k && llvmpipe_loops(t, pl->algo, c, &unused) <= limit; c += t->bc)
            chunk = c;
        if (chunk) {
            pl->chunk = (int)chunk;
            return FA_OK;
        }
    }
    static const char *const what[4] = { "fused forward", "standard score pass", "standard softmax pass",
                                         "standard P V pass" };
    return fa_error(ctx, FA_ERR_UNSUPPORTED,
                    "max_k (%d keys) at head_dim %d: the %s would loop about %lld times in one "
                    "invocation, and Mesa's llvmpipe silently stops a shader's loops after %d; use "
                    "fewer keys per call (a shorter sequence or window) or the CPU backend",
                    (int)p->max_k, (int)p->dim, what[pass], (long long)loops, GLES_LLVMPIPE_LOOPS);
}

/* Where the call's tensors are: all in GL buffers (pl->resident, their views in pl->gv) or all
 * in host memory. */
static fa_status views(fa_context_t ctx, const gles_state *s, const fa_problem *p, gles_plan *pl)
{
    const fa_attention_desc *d = p->desc;
    const int64_t nb = p->varlen ? 1 : p->batch;
    const int64_t sq_rows = p->varlen ? pl->qrows : d->seqlen_q, sk_rows = p->varlen ? pl->krows : d->seqlen_k;
    size_t at;
    fa_status st;
    pl->resident = d->q.data && gles_find_mem(s, d->q.data, 0, &at) != NULL;
    if (!pl->resident) {
        const void *ptrs[4] = { d->k.data, d->v.data, d->o.data, d->lse };
        const char *names[4] = { "k.data", "v.data", "o.data", "lse" };
        for (int i = 0; i < 4; i++)
            if (ptrs[i] && gles_find_mem(s, ptrs[i], 0, &at))
                return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                                "%s is in a GL buffer while q.data is host memory: pass q, k, v, o "
                                "(and lse) all in buffers from fa_memory_alloc, or all in host memory",
                                names[i]);
        return FA_OK;
    }
    const fa_tensor *tv[4] = { &d->q, &d->k, &d->v, &d->o };
    const char *names[4] = { "q.data", "k.data", "v.data", "o.data" };
    for (int i = 0; i < 4; i++) {
        const int is_k = i == 1 || i == 2;
        if ((st = gles_view_of(ctx, s, tv[i]->data, tv[i]->dtype, tv[i]->stride_batch, tv[i]->stride_seq,
                               tv[i]->stride_head, nb, is_k ? sk_rows : sq_rows, is_k ? p->heads_kv : p->heads_q,
                               p->dim, names[i], &pl->gv[i])) != FA_OK)
            return st;
    }
    if (d->lse && (st = gles_view_of(ctx, s, d->lse, FA_DTYPE_F32, p->lse_sb, p->lse_ss, p->lse_sh, nb, sq_rows,
                                     p->heads_q, 1, "lse", &pl->gv[4])) != FA_OK)
        return st;
    return FA_OK;
}

/* Whether tensor i (q, k, v, o) is read or written in place in the caller's GL buffer: where it
 * holds it in the storage type (o: float32, or f16 as packed halves outside key chunks, whose
 * running state o carries in float32) as rows of whole aligned vec4s. */
static int in_place(const fa_problem *p, const gles_plan *pl, int i)
{
    const gl_view *v = &pl->gv[i];
    const int one_seq = p->varlen || p->batch == 1; /* the batch stride is never used */
    const int type_ok = i < 3 ? v->type == (pl->t.f16 ? 1 : 0) : v->type == 0 || (v->type == 1 && !pl->chunk);
    return pl->resident && type_ok && p->dim % 4 == 0 && v->off % 4 == 0 && (one_seq || v->sb % 4 == 0) &&
           v->ss % 4 == 0 && v->sh % 4 == 0;
}

/* Tensor i's place for the shaders (pl->at): the caller's view in place, else the call's own
 * copy, [heads][packed rows][d4]. */
static void place(const fa_problem *p, gles_plan *pl, int i)
{
    GLint *w = pl->at.v[i];
    if (pl->in_place[i]) {
        const gl_view *v = &pl->gv[i];
        const int one_seq = p->varlen || p->batch == 1;
        w[0] = v->off / 4;
        w[1] = one_seq ? 0 : v->sb / 4;
        w[2] = v->ss / 4;
        w[3] = v->sh / 4;
        return;
    }
    const int is_k = i == 1 || i == 2;
    const int64_t rows = is_k ? pl->krows : pl->qrows, per_seq = is_k ? p->desc->seqlen_k : p->desc->seqlen_q;
    w[0] = 0;
    w[1] = p->varlen ? 0 : (GLint)(per_seq * pl->t.d4);
    w[2] = pl->t.d4;
    w[3] = (GLint)(rows * pl->t.d4);
}

/* The working buffers the call needs: repacked q, k, v (those not read in place), o (float32,
 * unless written in place), lse with each row's running (max, sum) after it where the call
 * runs in key chunks, the offsets table, the standard's [heads, rows, max_k] float scores or
 * the decode chunks' partial outputs and (max, sum). */
static void buffer_bytes(const fa_problem *p, gles_plan *pl)
{
    const tiles *t = &pl->t;
    const size_t esz = t->f16 ? 2 : 4, row = (size_t)t->d4 * 4;
    const size_t q_rows = (size_t)p->heads_q * (size_t)pl->qrows, kv_rows = (size_t)p->heads_kv * (size_t)pl->krows;
    memset(pl->bytes, 0, sizeof(pl->bytes));
    pl->bytes[BUF_Q] = pl->in_place[0] ? 0 : q_rows * row * esz;
    pl->bytes[BUF_K] = pl->in_place[1] ? 0 : kv_rows * row * esz;
    pl->bytes[BUF_V] = pl->in_place[2] ? 0 : kv_rows * row * esz;
    pl->bytes[BUF_O] = pl->in_place[3] ? 0 : q_rows * row * 4;
    pl->bytes[BUF_LSE] = q_rows * 4 * (pl->chunk && pl->algo == GLES_FUSED ? 3 : 1);
    pl->bytes[BUF_CU] = sizeof(int32_t) * (size_t)(2 * p->batch + 2);
    if (pl->algo == GLES_STANDARD) {
        pl->bytes[BUF_AUX] = q_rows * (size_t)p->max_k * 4;
    } else if (pl->algo == GLES_DECODE) {
        const size_t parts = (size_t)p->heads_q * (size_t)p->batch * (size_t)pl->splits;
        pl->bytes[BUF_AUX] = parts * row * 4;
        pl->bytes[BUF_AUX2] = parts * 8;
    }
    for (int i = 0; i < 2; i++) /* K and V as textures: the caller's buffer up to the view's end */
        pl->tex_bytes[i] = pl->in_place[1 + i] ? pl->gv[1 + i].end : pl->bytes[BUF_K + i];
}

fa_status gles_plan_call(fa_context_t ctx, const gles_state *s, const fa_problem *p, gles_plan *pl)
{
    memset(pl, 0, sizeof(*pl));
    if (p->in_dtype == FA_DTYPE_E4M3)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "q.dtype is fp8 (FA_DTYPE_E4M3): the GLES backend takes f32, f16 and bf16 "
                        "inputs (use the CPU backend for fp8)");
    if (p->dropout_p > 0.0f)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "dropout_p (%g) > 0: the GLES backend has no dropout (use the CPU or CUDA "
                        "backend for training)",
                        (double)p->dropout_p);
    pl->splits = decode_splits(p);
    pl->algo = p->desc->algorithm == FA_ALGORITHM_STANDARD ? GLES_STANDARD : pl->splits ? GLES_DECODE : GLES_FUSED;
    pl->t = gles_forward_tiles(s, p->dim, p->in_dtype == FA_DTYPE_F16);
    pl->t.softcap = p->softcap > 0.0f;
    pl->qrows = packed_rows(p, 0);
    pl->krows = packed_rows(p, 1);
    const int64_t tiles_q = ((int64_t)p->max_q + pl->t.br - 1) / pl->t.br;
    if (tiles_q > s->max_count[0] || p->heads_q > s->max_count[1] || p->batch > s->max_count[2])
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "the grid (%lld query tiles x %d heads x %d sequences) exceeds the "
                        "device's workgroup counts (%d x %d x %d)",
                        (long long)tiles_q, (int)p->heads_q, (int)p->batch, (int)s->max_count[0],
                        (int)s->max_count[1], (int)s->max_count[2]);
    const int64_t d4 = pl->t.d4;
    if ((pl->qrows + 1) * p->heads_q * d4 > INT32_MAX / 2 || (pl->krows + 1) * p->heads_kv * d4 > INT32_MAX / 2 ||
        (pl->algo == GLES_STANDARD && (pl->qrows + 1) * p->heads_q * (int64_t)(p->max_k + 1) > INT32_MAX / 2))
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "the tensors (%lld query rows, %lld key rows, %d heads) exceed the 32-bit "
                        "indexing of GLES shaders",
                        (long long)pl->qrows, (long long)pl->krows, (int)p->heads_q);
    fa_status st = views(ctx, s, p, pl);
    if (st != FA_OK)
        return st;
    for (int i = 0; i < 3; i++)
        pl->in_place[i] = in_place(p, pl, i);
    buffer_bytes(p, pl);
    /* K and V past the buffer-texture limit: the row variant through shared memory instead (the
     * report's kernel name says so: gles-flash-* rather than gles-flash-tex-*) */
    const size_t texel = pl->t.f16 ? 8 : 16;
    if (pl->t.tex && (pl->tex_bytes[0] / texel > (size_t)s->max_texels || pl->tex_bytes[1] / texel > (size_t)s->max_texels)) {
        const int cap = pl->t.softcap;
        pl->t = rows_tiles(s, p->dim, pl->t.f16, 0);
        pl->t.softcap = cap;
    }
    if ((st = key_chunks(ctx, s, p, pl)) != FA_OK)
        return st;
    pl->in_place[3] = in_place(p, pl, 3);
    pl->t.o_f16 = pl->in_place[3] && pl->gv[3].type == 1;
    for (int i = 0; i < 4; i++)
        place(p, pl, i);
    buffer_bytes(p, pl);
    return FA_OK;
}

void gles_plan_report(const gles_plan *pl, const fa_problem *p, fa_run_info *info)
{
    const tiles *t = &pl->t;
    if (pl->algo == GLES_DECODE) {
        info->kernel = t->f16 ? "gles-decode-f16pk" : "gles-decode-f32";
        info->block_q = 1;
        info->block_k = (p->max_k + pl->splits - 1) / pl->splits;
        info->threads = GLES_STD_GROUP;
    } else if (pl->algo == GLES_STANDARD) {
        info->kernel = t->f16 ? "gles-standard-f16" : "gles-standard-f32";
        info->block_q = 1;
        info->block_k = p->max_k;
        info->threads = GLES_STD_GROUP;
    } else {
        info->kernel = t->tiled ? (t->f16 ? "gles-flash-tiled-f16pk" : "gles-flash-tiled-f32")
                       : t->tex ? (t->f16 ? "gles-flash-tex-f16pk" : "gles-flash-tex-f32")
                                : (t->f16 ? "gles-flash-f16pk" : "gles-flash-f32");
        info->block_q = t->br;
        info->block_k = t->bc;
        info->threads = t->tiled ? t->nx * t->ny : t->br / t->rows;
    }
    /* the offsets table is left out: a few bytes per sequence */
    uint64_t bytes = 0;
    for (int i = 0; i < BUF_COUNT; i++)
        if (i != BUF_CU)
            bytes += pl->bytes[i];
    info->workspace_bytes = bytes;
}
