/* SPDX-License-Identifier: MIT */
/* Synthetic checkpoints in llama2.c's format: seeded weights for benchmarks of any shape. */
#include "fail.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One stretch of the float section: count floats drawn uniformly in [-scale, scale],
 * or a constant (norm gains), or the legacy RoPE table (cos or sin). */
typedef enum { SEG_UNIFORM, SEG_ONE, SEG_COS, SEG_SIN } seg_kind;
typedef struct seg {
    uint64_t count;
    seg_kind kind;
    float scale;
} seg;

static int segments(const fa_model_config *c, seg *s)
{
    uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t hs = dim / (uint64_t)c->n_heads, kv = hs * (uint64_t)c->n_kv_heads;
    /* uniform [-a, a] has variance a^2/3: a = sqrt(3 / fan_in) keeps unit variance */
    float in_dim = sqrtf(3.0f / (float)dim), in_hid = sqrtf(3.0f / (float)hid);
    int n = 0;
    s[n++] = (seg){ (uint64_t)c->vocab_size * dim, SEG_UNIFORM, 1.0f };
    s[n++] = (seg){ L * dim, SEG_ONE, 1.0f };
    s[n++] = (seg){ L * dim * dim, SEG_UNIFORM, in_dim };
    s[n++] = (seg){ L * kv * dim, SEG_UNIFORM, in_dim };
    s[n++] = (seg){ L * kv * dim, SEG_UNIFORM, in_dim };
    s[n++] = (seg){ L * dim * dim, SEG_UNIFORM, in_dim };
    s[n++] = (seg){ L * dim, SEG_ONE, 1.0f };
    s[n++] = (seg){ L * hid * dim, SEG_UNIFORM, in_dim };
    s[n++] = (seg){ L * dim * hid, SEG_UNIFORM, in_hid };
    s[n++] = (seg){ L * hid * dim, SEG_UNIFORM, in_dim };
    s[n++] = (seg){ dim, SEG_ONE, 1.0f };
    s[n++] = (seg){ (uint64_t)c->seq_len * hs / 2, SEG_COS, 1.0f };
    s[n++] = (seg){ (uint64_t)c->seq_len * hs / 2, SEG_SIN, 1.0f };
    if (!c->shared_classifier)
        s[n++] = (seg){ (uint64_t)c->vocab_size * dim, SEG_UNIFORM, in_dim };
    return n;
}

/* splitmix64 of (seed, index): counter-based, so any stretch can be made alone */
static float uniform_at(uint64_t seed, uint64_t i)
{
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* Floats [from, from + n) of the float section into dst; with skip_rope the legacy RoPE
 * tables' places left unwritten (nothing in memory reads them: the runner computes its own,
 * and untouched pages of a long context's tables cost no memory). */
static void fill(const fa_model_config *c, const seg *s, int nseg, uint64_t seed, uint64_t from,
                 float *dst, uint64_t n, int skip_rope)
{
    uint64_t start = 0, half = (uint64_t)(c->dim / c->n_heads) / 2;
    for (int k = 0; k < nseg && n; k++) {
        uint64_t end = start + s[k].count;
        if (from < end) {
            uint64_t take = end - from < n ? end - from : n;
            seg g = s[k];
            const int skip = skip_rope && (g.kind == SEG_COS || g.kind == SEG_SIN);
#pragma omp parallel for schedule(static) if (take > (1u << 16) && !skip)
            for (uint64_t j = 0; j < (skip ? 0 : take); j++) {
                uint64_t i = from + j, local = i - start;
                float v;
                if (g.kind == SEG_UNIFORM) {
                    v = g.scale * uniform_at(seed, i);
                } else if (g.kind == SEG_ONE) {
                    v = 1.0f;
                } else {
                    float freq = 1.0f / powf(10000.0f, (float)(2 * (local % half)) / (float)(2 * half));
                    float a = (float)(local / half) * freq;
                    v = g.kind == SEG_COS ? cosf(a) : sinf(a);
                }
                dst[j] = v;
            }
            dst += take;
            from += take;
            n -= take;
        }
        start = end;
    }
}

static void header(const fa_model_config *c, int32_t h[7])
{
    h[0] = c->dim, h[1] = c->hidden_dim, h[2] = c->n_layers, h[3] = c->n_heads;
    h[4] = c->n_kv_heads, h[5] = c->shared_classifier ? c->vocab_size : -c->vocab_size;
    h[6] = c->seq_len;
}

fa_status fa_model_synth_write(const fa_model_config *c, uint64_t seed, FILE *f, fa_progress_fn progress, void *user,
                               char *err)
{
    uint64_t bytes;
    fa_status st = fa_model_config_check(c, &bytes, err);
    if (st != FA_OK)
        return st;
    if (!f)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "file is NULL");
    seg s[14];
    int nseg = segments(c, s);
    int32_t h[7];
    header(c, h);
    const uint64_t chunk = 1u << 20;
    float *buf = malloc(chunk * sizeof(float));
    if (!buf)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the write buffer");
    uint64_t total = (bytes - FA_MODEL_HEADER_BYTES) / 4;
    int ok = fwrite(h, 4, 7, f) == 7;
    for (uint64_t at = 0; ok && at < total; at += chunk) {
        uint64_t n = total - at < chunk ? total - at : chunk;
        fill(c, s, nseg, seed, at, buf, n, 0);
        ok = fwrite(buf, sizeof(float), n, f) == n;
        if (ok && progress)
            progress(user, FA_MODEL_HEADER_BYTES + 4 * (at + n), bytes);
    }
    const int e = errno;
    free(buf);
    if (!ok)
        return fa_model_fail(err, FA_ERR_IO, "writing the checkpoint failed: %s", strerror(e ? e : EIO));
    return FA_OK;
}

fa_status fa_model_synth(const fa_model_config *c, uint64_t seed, fa_model **out, char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    uint64_t bytes;
    fa_status st = fa_model_config_check(c, &bytes, err);
    if (st != FA_OK)
        return st;
    unsigned char *image = malloc((size_t)bytes);
    if (!image)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for a %.2f GiB synthetic checkpoint",
                    (double)bytes / (1u << 30));
    seg s[14];
    int nseg = segments(c, s);
    int32_t h[7];
    header(c, h);
    memcpy(image, h, sizeof(h));
    fill(c, s, nseg, seed, 0, (float *)(image + FA_MODEL_HEADER_BYTES),
         (bytes - FA_MODEL_HEADER_BYTES) / 4, 1);
    if ((st = fa_model_adopt(image, (size_t)bytes, 2, out, err)) != FA_OK)
        return st;
    /* the file format cannot hold them; the in-memory model can */
    if (c->rope_theta > 0.0f)
        (*out)->config.rope_theta = c->rope_theta;
    if (c->norm_eps > 0.0f)
        (*out)->config.norm_eps = c->norm_eps;
    (*out)->config.rope_scaling = c->rope_scaling;
    if (c->n_eos > 0) { /* a config that names its special ids; else llama2.c's */
        (*out)->config.bos_id = c->bos_id;
        (*out)->config.n_eos = c->n_eos;
        memcpy((*out)->config.eos_ids, c->eos_ids, sizeof(c->eos_ids));
    }
    return FA_OK;
}
