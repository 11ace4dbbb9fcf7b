/* SPDX-License-Identifier: MIT */
/* llama2.c checkpoints: header rules, sizes, memory mapping. Trusts nothing in the file. */
#include "fail.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

fa_status fa_model_fail(char *err, fa_status st, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, FA_MODEL_ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return st;
}

fa_status fa_model_open_file(const char *path, const char *what, int *fd, uint64_t *bytes, char *err)
{
    /* O_NONBLOCK: open() of a FIFO would otherwise wait for a writer */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (f < 0)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "cannot open %s '%s': %s", what, path, strerror(errno));
    struct stat sb;
    if (fstat(f, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(f);
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "%s '%s' is not a regular file", what, path);
    }
    *fd = f;
    *bytes = (uint64_t)sb.st_size;
    return FA_OK;
}

fa_status fa_model_write_failed(char *err, const char *path, int e)
{
    e = e ? e : EIO;
    const fa_status st = e == ENOSPC || e == EDQUOT || e == EFBIG || e == EIO ? FA_ERR_IO
                         : e == ENOMEM                                        ? FA_ERR_OUT_OF_MEMORY
                                                                              : FA_ERR_INVALID_ARGUMENT;
    return fa_model_fail(err, st, "cannot write '%s': %s", path, strerror(e));
}

fa_status fa_model_read_file(const char *path, const char *what, uint64_t max, fa_status too_big,
                             unsigned char **buf, size_t *n, char *err)
{
    int fd;
    uint64_t size;
    *buf = NULL;
    fa_status st = fa_model_open_file(path, what, &fd, &size, err);
    if (st != FA_OK)
        return st;
    if (size > max) {
        close(fd);
        return fa_model_fail(err, too_big, "%s '%s' is %llu bytes, more than the %llu it may be", what, path,
                             (unsigned long long)size, (unsigned long long)max);
    }
    unsigned char *b = malloc((size_t)size + 1);
    size_t got = 0;
    while (b && got < size) {
        ssize_t r = read(fd, b + got, (size_t)size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (!b || got != size) {
        free(b);
        return b ? fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "cannot read %s '%s'", what, path)
                 : fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory reading %s '%s'", what, path);
    }
    b[size] = 0;
    *buf = b;
    *n = (size_t)size;
    return FA_OK;
}

/* a*b and a+b on uint64 with overflow reported as 0 / UINT64_MAX sentinel */
static int mul_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}
static int add_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}

/* Float counts of the checkpoint's arrays, in file order. */
typedef struct layout {
    uint64_t embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, rope, classifier;
} layout;

static int layout_of(const fa_model_config *c, layout *l)
{
    uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t hs = dim / (uint64_t)c->n_heads, kv = hs * (uint64_t)c->n_kv_heads, t;
    memset(l, 0, sizeof(*l));
    return mul_ok((uint64_t)c->vocab_size, dim, &l->embedding) && mul_ok(L, dim, &l->rms_att) &&
           mul_ok(dim, dim, &t) && mul_ok(L, t, &l->wq) && mul_ok(kv, dim, &t) &&
           mul_ok(L, t, &l->wk) && (l->wv = l->wk, 1) && (l->wo = l->wq, 1) &&
           (l->rms_ffn = l->rms_att, 1) && mul_ok(hid, dim, &t) && mul_ok(L, t, &l->w1) &&
           (l->w2 = l->w1, l->w3 = l->w1, 1) && (l->rms_final = dim, 1) &&
           mul_ok((uint64_t)c->seq_len, hs, &l->rope) && /* cos and sin, head_size/2 each */
           (l->classifier = c->shared_classifier ? 0 : l->embedding, 1);
}

int fa_model_is_stop(const fa_model_config *c, int32_t token)
{
    int stop = token == c->bos_id;
    for (int32_t i = 0; i < c->n_eos && i < FA_MODEL_MAX_EOS; i++)
        stop |= token == c->eos_ids[i];
    return stop;
}

fa_status fa_model_config_check(const fa_model_config *c, uint64_t *bytes, char *err)
{
    if (!c)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "config is NULL");
    const struct {
        const char *name;
        int32_t v;
    } pos[] = { { "dim", c->dim },           { "hidden_dim", c->hidden_dim },
                { "n_layers", c->n_layers }, { "n_heads", c->n_heads },
                { "n_kv_heads", c->n_kv_heads }, { "vocab_size", c->vocab_size },
                { "seq_len", c->seq_len } };
    for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++)
        if (pos[i].v <= 0)
            return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "%s (%d) must be positive", pos[i].name,
                        (int)pos[i].v);
    if (c->n_heads > FA_MAX_HEADS)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "n_heads (%d) exceeds %d", (int)c->n_heads,
                    FA_MAX_HEADS);
    if (c->dim % c->n_heads)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "dim (%d) must be a multiple of n_heads (%d)",
                    (int)c->dim, (int)c->n_heads);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "n_heads (%d) must be a multiple of n_kv_heads (%d)",
                    (int)c->n_heads, (int)c->n_kv_heads);
    int32_t hs = c->dim / c->n_heads;
    if (hs % 2)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                    "head_size = dim / n_heads (%d) must be even: RoPE rotates pairs", (int)hs);
    if (hs > FA_MAX_HEAD_DIM)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "head_size = dim / n_heads (%d) exceeds %d",
                    (int)hs, FA_MAX_HEAD_DIM);
    if (!(c->rope_theta == 0.0f || (c->rope_theta > 0.0f && c->rope_theta <= FLT_MAX)))
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "rope_theta (%g) must be positive and finite",
                    (double)c->rope_theta);
    if (!(c->norm_eps == 0.0f || (c->norm_eps > 0.0f && c->norm_eps <= FLT_MAX)))
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "norm_eps (%g) must be positive and finite",
                    (double)c->norm_eps);
    const fa_rope_scaling *rs = &c->rope_scaling;
    if (rs->type < FA_ROPE_SCALING_NONE || rs->type > FA_ROPE_SCALING_LLAMA3)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "rope_scaling.type (%d) must be 0 (none), 1 (linear) or "
                             "2 (llama3)", (int)rs->type);
    if (rs->type != FA_ROPE_SCALING_NONE && !(rs->factor > 0.0f && rs->factor <= FLT_MAX))
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "rope_scaling.factor (%g) must be positive and finite",
                             (double)rs->factor);
    if (rs->type == FA_ROPE_SCALING_LLAMA3 &&
        !(rs->low_freq_factor > 0.0f && rs->high_freq_factor > rs->low_freq_factor &&
          rs->high_freq_factor <= FLT_MAX && rs->original_max_pos > 0))
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "rope_scaling: llama3 needs 0 < low_freq_factor (%g) < high_freq_factor (%g) and "
                             "original_max_position_embeddings (%d) > 0",
                             (double)rs->low_freq_factor, (double)rs->high_freq_factor, (int)rs->original_max_pos);
    if (c->bos_id < -1 || c->bos_id >= c->vocab_size)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "bos_id (%d) must be -1 (none) or an id below vocab_size (%d)",
                             (int)c->bos_id, (int)c->vocab_size);
    if (c->n_eos < 0 || c->n_eos > FA_MODEL_MAX_EOS)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "n_eos (%d) must be 0..%d", (int)c->n_eos, FA_MODEL_MAX_EOS);
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] < 0 || c->eos_ids[i] >= c->vocab_size)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "eos_ids[%d] (%d) must be an id below vocab_size (%d)",
                                 (int)i, (int)c->eos_ids[i], (int)c->vocab_size);
    if (c->shared_classifier != 0 && c->shared_classifier != 1)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "shared_classifier (%d) must be 0 or 1",
                    (int)c->shared_classifier);
    layout l;
    uint64_t per_layer = 0, total = 0;
    int ok = layout_of(c, &l) && add_ok(l.rms_att, l.wq, &per_layer) &&
             add_ok(per_layer, l.wk, &per_layer) && add_ok(per_layer, l.wv, &per_layer) &&
             add_ok(per_layer, l.wo, &per_layer) && add_ok(per_layer, l.rms_ffn, &per_layer) &&
             add_ok(per_layer, l.w1, &per_layer) && add_ok(per_layer, l.w2, &per_layer) &&
             add_ok(per_layer, l.w3, &per_layer) && add_ok(l.embedding, per_layer, &total) &&
             add_ok(total, l.rms_final, &total) && add_ok(total, l.rope, &total) &&
             add_ok(total, l.classifier, &total) && mul_ok(total, 4, &total) &&
             add_ok(total, FA_MODEL_HEADER_BYTES, &total) && total <= (uint64_t)SIZE_MAX;
    if (!ok)
        return fa_model_fail(err, FA_ERR_SIZE_OVERFLOW,
                    "the weights of dim %d, hidden_dim %d, n_layers %d, vocab_size %d, seq_len %d "
                    "do not fit in 64-bit sizes",
                    (int)c->dim, (int)c->hidden_dim, (int)c->n_layers, (int)c->vocab_size,
                    (int)c->seq_len);
    if (bytes)
        *bytes = total;
    return FA_OK;
}

static int32_t read_i32(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, 4);
    return v;
}

static void release(const void *image, size_t bytes, int owner)
{
    if (owner == 1)
        munmap((void *)image, bytes);
    else if (owner == 2)
        free((void *)image);
}

fa_status fa_model_from_memory(const void *data, size_t bytes, int take_ownership, fa_model **out,
                               char *err)
{
    return fa_model_adopt(data, bytes, take_ownership ? 2 : 0, out, err);
}

fa_status fa_model_adopt(const void *data, size_t bytes, int owner, fa_model **out, char *err)
{
    if (!out) {
        release(data, bytes, owner);
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    }
    *out = NULL;
    fa_status st = FA_OK;
    fa_model_config c = { 0 };
    uint64_t need = 0;
    if (!data) {
        st = fa_model_fail(err, FA_ERR_NULL_POINTER, "checkpoint data is NULL");
        goto bad;
    }
    if ((uintptr_t)data % 4) {
        st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "checkpoint data must be 4-byte aligned");
        goto bad;
    }
    if (bytes < FA_MODEL_HEADER_BYTES) {
        st = fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                  "checkpoint is %zu bytes, shorter than its %d-byte header", bytes,
                  FA_MODEL_HEADER_BYTES);
        goto bad;
    }
    const unsigned char *p = data;
    c.dim = read_i32(p);
    c.hidden_dim = read_i32(p + 4);
    c.n_layers = read_i32(p + 8);
    c.n_heads = read_i32(p + 12);
    c.n_kv_heads = read_i32(p + 16);
    int32_t vocab = read_i32(p + 20);
    c.seq_len = read_i32(p + 24);
    /* a negative vocab_size marks a separate classifier; INT32_MIN has no magnitude */
    if (vocab == INT32_MIN) {
        st = fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                           "vocab_size (-2147483648) has no magnitude: the header's sign marks a separate "
                           "classifier");
        goto bad;
    }
    c.shared_classifier = vocab > 0;
    c.vocab_size = vocab < 0 ? -vocab : vocab;
    c.rope_theta = FA_MODEL_ROPE_THETA; /* the format has no field for them */
    c.norm_eps = FA_MODEL_NORM_EPS;
    c.bos_id = c.vocab_size > FA_TOKEN_BOS ? FA_TOKEN_BOS : -1; /* llama2.c's ids */
    c.n_eos = c.vocab_size > FA_TOKEN_EOS;
    c.eos_ids[0] = FA_TOKEN_EOS;
    if ((st = fa_model_config_check(&c, &need, err)) != FA_OK)
        goto bad;
    if (need != bytes) {
        st = fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                  need > bytes ? "checkpoint is %zu bytes but its header needs %llu: truncated"
                               : "checkpoint is %zu bytes but its header needs %llu: trailing data",
                  bytes, (unsigned long long)need);
        goto bad;
    }
    fa_model *m = calloc(1, sizeof(*m));
    if (!m) {
        st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the model");
        goto bad;
    }
    m->config = c;
    m->image = data;
    m->bytes = bytes;
    m->owner = owner;
    layout l;
    layout_of(&c, &l);
    const float *f = (const float *)(p + FA_MODEL_HEADER_BYTES);
    m->w.token_embedding = f, f += l.embedding;
    m->w.rms_att = f, f += l.rms_att;
    m->w.wq = f, f += l.wq;
    m->w.wk = f, f += l.wk;
    m->w.wv = f, f += l.wv;
    m->w.wo = f, f += l.wo;
    m->w.rms_ffn = f, f += l.rms_ffn;
    m->w.w1 = f, f += l.w1;
    m->w.w2 = f, f += l.w2;
    m->w.w3 = f, f += l.w3;
    m->w.rms_final = f, f += l.rms_final;
    f += l.rope; /* legacy RoPE tables: recomputed instead */
    m->w.classifier = c.shared_classifier ? m->w.token_embedding : f;
    *out = m;
    return FA_OK;
bad:
    release(data, bytes, owner);
    return st;
}

fa_status fa_model_open(const char *path, fa_model **out, char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!path)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "path is NULL");
    int fd;
    uint64_t size;
    fa_status st = fa_model_open_file(path, "checkpoint", &fd, &size, err);
    if (st != FA_OK)
        return st;
    if (size < FA_MODEL_HEADER_BYTES) {
        close(fd);
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                    "checkpoint '%s' is %llu bytes, shorter than its %d-byte header", path,
                    (unsigned long long)size, FA_MODEL_HEADER_BYTES);
    }
    if (size > (uint64_t)SIZE_MAX) {
        close(fd);
        return fa_model_fail(err, FA_ERR_SIZE_OVERFLOW, "checkpoint '%s' is too large to map", path);
    }
    size_t bytes = (size_t)size;
    void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "cannot map checkpoint '%s' (%zu bytes)", path, bytes);
    const int json = ((const char *)map)[0] == '{';
    st = fa_model_adopt(map, bytes, 1, out, err);
    if (st != FA_OK && json) /* the header read as numbers would be named instead */
        st = fa_model_fail(err, st, "checkpoint '%s' begins like JSON, not a llama2.c header: a Hugging Face model "
                                    "is read from its directory (config.json and model.safetensors)", path);
    return st;
}

void fa_model_free(fa_model *m)
{
    if (!m)
        return;
    release(m->image, m->bytes, m->owner);
    free(m);
}

fa_status fa_model_config_parse(const char *spec, fa_model_config *c, char *err)
{
    if (!spec || !c)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "config spec is NULL");
    /* dim, layers, heads, kv heads, hidden, vocab (negative: separate classifier), seq */
    static const struct {
        const char *name;
        int32_t v[7];
        float rope_theta;
    } named[] = {
        { "110m", { 768, 12, 12, 12, 2048, 32000, 1024 }, 0.0f },       /* llama2.c stories110M */
        { "1b", { 2048, 22, 32, 4, 5632, -32000, 2048 }, 0.0f },        /* TinyLlama-1.1B */
        { "7b", { 4096, 32, 32, 32, 11008, -32000, 4096 }, 0.0f },      /* Llama-2-7B */
        { "llama3-8b", { 4096, 32, 32, 8, 14336, -128256, 8192 }, 5e5f }, /* Llama-3-8B */
    };
    int32_t v[7];
    float theta = 0.0f;
    int found = 0;
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
        if (strcmp(spec, named[i].name) == 0) {
            memcpy(v, named[i].v, sizeof(v));
            theta = named[i].rope_theta;
            found = 1;
        }
    if (!found) {
        const char *s = spec;
        for (int i = 0; i < 7; i++) {
            char *end;
            long x = strtol(s, &end, 10);
            /* digits only (a '-' before the vocab): strtol alone takes spaces and '+' */
            const int digits = isdigit((unsigned char)*s) || (i == 5 && *s == '-' && isdigit((unsigned char)s[1]));
            if (!digits || end == s || x < INT32_MIN + 1 || x > INT32_MAX || (i < 6 ? *end != 'x' : *end != 0))
                return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                            "config '%s' is not 110m, 1b, 7b, llama3-8b or "
                            "DIMxLAYERSxHEADSxKVHEADSxHIDDENxVOCABxSEQ",
                            spec);
            v[i] = (int32_t)x;
            s = end + 1;
        }
    }
    fa_model_config r = { .dim = v[0], .n_layers = v[1], .n_heads = v[2], .n_kv_heads = v[3],
                          .hidden_dim = v[4], .vocab_size = v[5] < 0 ? -v[5] : v[5],
                          .seq_len = v[6], .shared_classifier = v[5] > 0, .rope_theta = theta };
    fa_status st = fa_model_config_check(&r, NULL, err);
    if (st == FA_OK)
        *c = r;
    return st;
}
