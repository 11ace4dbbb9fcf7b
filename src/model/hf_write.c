/* SPDX-License-Identifier: MIT */
/* A model written as a Hugging Face Llama directory: config.json, safetensors (f32, f16 or bf16,
 * rounded to nearest even), q/k rows in HF's rotate-half order, optionally sharded. */
#include "fail.h"
#include "hf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)(u >> 16 | 0x40); /* NaN stays NaN (quiet) */
    return (uint16_t)((u + 0x7FFFu + (u >> 16 & 1)) >> 16);
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = u >> 16 & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return (uint16_t)(sign | 0x7E00u);
    if (a >= 0x477FF000u) /* rounds to 65520 or more: infinity */
        return (uint16_t)(sign | 0x7C00u);
    if (a < 0x38800000u) { /* below 2^-14: a subnormal (or zero) of f16 */
        if (a < 0x33000000u) /* at most half the smallest subnormal: zero */
            return (uint16_t)sign;
        uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        q += rest > halfway || (rest == halfway && (q & 1));
        return (uint16_t)(sign | q);
    }
    /* normal: rebias the exponent, round the 13 dropped bits to nearest even */
    uint32_t v = a - 0x38000000u;
    v += 0xFFFu + (v >> 13 & 1);
    return (uint16_t)(sign | v >> 13);
}

static const char *dtype_name(fa_hf_dtype d)
{
    return d == FA_HF_F32 ? "F32" : d == FA_HF_F16 ? "F16" : "BF16";
}

/* One tensor's rows in HF order, converted, into buf (rows x max(cols, 1) elements). */
static void emit(unsigned char *buf, const float *image, const fa_hf_tensor *t, fa_hf_dtype d)
{
    uint64_t cols = t->cols ? t->cols : 1, esize = d == FA_HF_F32 ? 4 : 2;
    for (uint64_t r = 0; r < t->rows; r++) {
        const float *s = image + t->offset + fa_hf_permuted_row(r, t->rows, t->heads, 1) * cols;
        unsigned char *o = buf + r * cols * esize;
        if (d == FA_HF_F32) {
            memcpy(o, s, cols * 4);
            continue;
        }
        for (uint64_t j = 0; j < cols; j++) {
            uint16_t h = d == FA_HF_F16 ? f32_to_f16(s[j]) : f32_to_bf16(s[j]);
            o[2 * j] = (unsigned char)h, o[2 * j + 1] = (unsigned char)(h >> 8);
        }
    }
}

static uint64_t tensor_bytes(const fa_hf_tensor *t, fa_hf_dtype d)
{
    return t->rows * (t->cols ? t->cols : 1) * (d == FA_HF_F32 ? 4 : 2);
}

/* Each file of an export is written as NAME.partial beside its place and renamed there once
 * every file is written: an export that fails leaves the directory's earlier export whole. */
#define PARTIAL ".partial"

/* path's NAME.partial, opened for writing, or NULL with the error in *st. */
static FILE *open_partial(const char *path, fa_status *st, char *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s" PARTIAL, path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        *st = fa_model_write_failed(err, path, errno);
    return f;
}

/* Close f after its writes (ok: all went through): FA_OK, or the error naming path. */
static fa_status close_partial(FILE *f, int ok, const char *path, char *err)
{
    int e = ok ? 0 : errno;
    if (fclose(f) != 0 && ok)
        ok = 0, e = errno;
    return ok ? FA_OK : fa_model_write_failed(err, path, e);
}

static fa_status write_json(const char *path, cJSON *j, char *err)
{
    char *s = j ? cJSON_Print(j) : NULL;
    if (!s)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for '%s'", path);
    fa_status st = FA_OK;
    FILE *f = open_partial(path, &st, err);
    if (f)
        st = close_partial(f, fputs(s, f) >= 0 && fputc('\n', f) != EOF, path, err);
    free(s);
    return st;
}

/* The shortest decimal that reads back as f (1e-05 rather than 9.99999974737875e-06). */
static double shortest(float f)
{
    char b[32];
    for (int p = 1; p < 9; p++) {
        snprintf(b, sizeof(b), "%.*g", p, (double)f);
        if ((float)strtod(b, NULL) == f)
            return strtod(b, NULL);
    }
    return (double)f;
}

static cJSON *config_json(const fa_model_config *c, fa_hf_dtype d)
{
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", "llama");
    cJSON_AddNumberToObject(j, "hidden_size", c->dim);
    cJSON_AddNumberToObject(j, "intermediate_size", c->hidden_dim);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->dim / c->n_heads);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->seq_len);
    cJSON_AddNumberToObject(j, "rms_norm_eps", shortest(c->norm_eps > 0.0f ? c->norm_eps : FA_MODEL_NORM_EPS));
    cJSON_AddNumberToObject(j, "rope_theta", shortest(c->rope_theta > 0.0f ? c->rope_theta : FA_MODEL_ROPE_THETA));
    const fa_rope_scaling *rs = &c->rope_scaling;
    if (rs->type == FA_ROPE_SCALING_NONE) {
        cJSON_AddNullToObject(j, "rope_scaling");
    } else {
        cJSON *o = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(o, "rope_type", rs->type == FA_ROPE_SCALING_LINEAR ? "linear" : "llama3");
        cJSON_AddNumberToObject(o, "factor", shortest(rs->factor));
        if (rs->type == FA_ROPE_SCALING_LLAMA3) {
            cJSON_AddNumberToObject(o, "low_freq_factor", shortest(rs->low_freq_factor));
            cJSON_AddNumberToObject(o, "high_freq_factor", shortest(rs->high_freq_factor));
            cJSON_AddNumberToObject(o, "original_max_position_embeddings", rs->original_max_pos);
        }
    }
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->shared_classifier);
    cJSON_AddBoolToObject(j, "attention_bias", 0);
    cJSON_AddBoolToObject(j, "mlp_bias", 0);
    if (c->bos_id >= 0)
        cJSON_AddNumberToObject(j, "bos_token_id", c->bos_id);
    if (c->n_eos == 1)
        cJSON_AddNumberToObject(j, "eos_token_id", c->eos_ids[0]);
    else if (c->n_eos > 1)
        cJSON_AddItemToObject(j, "eos_token_id", cJSON_CreateIntArray(c->eos_ids, c->n_eos));
    cJSON_AddStringToObject(j, "torch_dtype", d == FA_HF_F32 ? "float32" : d == FA_HF_F16 ? "float16" : "bfloat16");
    return j;
}

/* Tensors slot[0..n) of the model into one safetensors file, in that order. */
static fa_status write_shard(const fa_model *m, const char *path, const int *slot, int n_slots,
                             fa_hf_dtype d, char *err)
{
    const fa_model_config *c = &m->config;
    const float *image = (const float *)((const unsigned char *)m->image + FA_MODEL_HEADER_BYTES);
    cJSON *h = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t at = 0, largest = 0;
    for (int k = 0; k < n_slots; k++) {
        fa_hf_tensor t = fa_hf_slot(c, slot[k]);
        char name[96];
        fa_hf_slot_name(c, slot[k], name, sizeof(name));
        cJSON *e = cJSON_AddObjectToObject(h, name), *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddStringToObject(e, "dtype", dtype_name(d));
        cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t.rows));
        if (t.cols)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t.cols));
        uint64_t b = tensor_bytes(&t, d);
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + b)));
        at += b;
        largest = b > largest ? b : largest;
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    unsigned char *buf = largest <= SIZE_MAX ? malloc(largest ? (size_t)largest : 1) : NULL;
    if (!js || !buf) {
        free(js);
        free(buf);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", path);
    }
    /* the data starts 8-byte aligned, as safetensors writes it: the header padded with spaces */
    size_t n = strlen(js), padded = (n + 7) / 8 * 8;
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fa_status st = FA_OK;
    FILE *f = open_partial(path, &st, err);
    int ok = f && fwrite(len, 1, 8, f) == 8 && fwrite(js, 1, n, f) == n;
    for (size_t i = n; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;
    for (int k = 0; ok && k < n_slots; k++) {
        fa_hf_tensor t = fa_hf_slot(c, slot[k]);
        uint64_t b = tensor_bytes(&t, d);
        emit(buf, image, &t, d);
        ok = fwrite(buf, 1, (size_t)b, f) == b;
    }
    if (f)
        st = close_partial(f, ok, path, err);
    free(js);
    free(buf);
    return st;
}

int fa_model_hf_file(int32_t shards, int i, char *name, size_t n)
{
    static const char *const fixed[] = { "config.json", "model.safetensors", "model.safetensors.index.json" };
    if (i >= 0 && i < 3)
        return snprintf(name, n, "%s", fixed[i]), 1;
    const int k = i - 2; /* shard k of shards */
    if (shards < 2 || shards > 99999 || k < 1 || k > shards)
        return 0;
    snprintf(name, n, "model-%05d-of-%05d.safetensors", k, (int)shards);
    return 1;
}

/* Remove the NAME.partial files an export of shards into dir may have written. */
static void remove_partials(const char *dir, int32_t shards)
{
    char path[4200], name[64];
    for (int i = 0; fa_model_hf_file(shards, i, name, sizeof(name)); i++)
        if ((size_t)snprintf(path, sizeof(path), "%s/%s" PARTIAL, dir, name) < sizeof(path))
            unlink(path);
}

/* The entry file of the other layout (the index for one file, model.safetensors for shards):
 * it goes once this export is in place, as a loader would read it before this one's. */
static const char *other_entry(int32_t shards)
{
    return shards == 1 ? "model.safetensors.index.json" : "model.safetensors";
}

/* dir/NAME.partial renamed to dir/NAME. */
static fa_status place(const char *dir, const char *name, char *err)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s" PARTIAL, path);
    return rename(tmp, path) == 0 ? FA_OK : fa_model_write_failed(err, path, errno);
}

/* Every file this export wrote put in place, config.json last (a loader that finds it finds
 * the weights), then the other layout's entry file removed. */
static fa_status commit(const char *dir, int32_t shards, char *err)
{
    char name[64], path[4096];
    fa_status st = FA_OK;
    for (int i = 1; st == FA_OK && fa_model_hf_file(shards, i, name, sizeof(name)); i++)
        if (strcmp(name, other_entry(shards)) != 0)
            st = place(dir, name, err);
    if (st != FA_OK || (st = place(dir, "config.json", err)) != FA_OK)
        return st;
    snprintf(path, sizeof(path), "%s/%s", dir, other_entry(shards));
    if (unlink(path) != 0 && errno != ENOENT)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "cannot remove '%s', left from another export: %s", path,
                             strerror(errno));
    return FA_OK;
}

/* A directory (or a FIFO) where a file of the export goes would stop its renames half way:
 * refused before anything is written. */
static fa_status nothing_in_the_way(const char *dir, int32_t shards, char *err)
{
    char path[4096], name[64];
    struct stat sb;
    for (int i = 0; fa_model_hf_file(shards, i, name, sizeof(name)); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
            return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s' is in the way: it is not a regular file", path);
    }
    return FA_OK;
}

fa_status fa_model_write_hf(const fa_model *m, const char *dir, fa_hf_dtype dtype, int32_t shards,
                            char *err)
{
    if (!m || !dir)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", !m ? "model" : "dir");
    const fa_model_config *c = &m->config;
    if (dtype != FA_HF_F32 && dtype != FA_HF_F16 && dtype != FA_HF_BF16)
        return fa_model_fail(err, FA_ERR_INVALID_DTYPE, "dtype (%d) is not f32, f16 or bf16", (int)dtype);
    if (c->n_layers > FA_HF_MAX_LAYERS)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "n_layers (%d) exceeds %d", (int)c->n_layers,
                             FA_HF_MAX_LAYERS);
    int slots = fa_hf_slot_count(c), tensors = slots - (c->shared_classifier ? 1 : 0);
    if (shards < 1 || shards > tensors || shards > 99999)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "shards (%d) must be in 1..%d (a tensor at least each)",
                             (int)shards, tensors < 99999 ? tensors : 99999);
    /* file order: the embedding, the layers, the final norm, lm_head when not tied */
    int *order = malloc(sizeof(int) * (size_t)tensors), n = 0;
    if (!order)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory");
    order[n++] = 0;
    for (int s = 3; s < slots; s++)
        order[n++] = s;
    order[n++] = 1;
    if (!c->shared_classifier)
        order[n++] = 2;
    fa_status st = FA_OK;
    char path[4096];
    cJSON *cfg = NULL, *index = NULL;
    int made = mkdir(dir, 0777) == 0, wrote = 0;
    struct stat sb;
    if (!made && (errno != EEXIST || stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, errno == EEXIST ? "'%s' exists and is not a directory"
                                                                         : "cannot create directory '%s'", dir);
        goto done;
    }
    /* the longest name written there fits (the index's and a shard's are the longest) */
    if ((size_t)snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir) >= sizeof(path) ||
        (size_t)snprintf(path, sizeof(path), "%s/model-%05d-of-%05d.safetensors", dir, (int)shards, (int)shards) >=
            sizeof(path)) {
        st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "directory name '%.200s' is too long", dir);
        goto done;
    }
    if ((st = nothing_in_the_way(dir, shards, err)) != FA_OK)
        goto done;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    cfg = config_json(c, dtype);
    wrote = 1; /* from here on an error removes what this call wrote */
    if ((st = write_json(path, cfg, err)) != FA_OK)
        goto done;
    if (shards == 1) {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        if ((st = write_shard(m, path, order, n, dtype, err)) == FA_OK)
            st = commit(dir, shards, err);
        goto done;
    }
    /* shard k holds tensors [k n / shards, (k + 1) n / shards) of the file order */
    index = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
    cJSON *map = cJSON_AddObjectToObject(index, "weight_map");
    uint64_t total = 0;
    for (int k = 0; k < shards && st == FA_OK; k++) {
        int lo = (int)((int64_t)n * k / shards), hi = (int)((int64_t)n * (k + 1) / shards);
        char file[64];
        fa_model_hf_file(shards, 3 + k, file, sizeof(file)); /* shard k + 1 */
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        for (int i = lo; i < hi; i++) {
            char name[96];
            fa_hf_tensor t = fa_hf_slot(c, order[i]);
            fa_hf_slot_name(c, order[i], name, sizeof(name));
            cJSON_AddStringToObject(map, name, file);
            total += tensor_bytes(&t, dtype);
        }
        st = write_shard(m, path, order + lo, hi - lo, dtype, err);
    }
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    if (st == FA_OK) {
        snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
        if ((st = write_json(path, index, err)) == FA_OK)
            st = commit(dir, shards, err);
    }
done:
    if (st != FA_OK && wrote)
        remove_partials(dir, shards);
    if (st != FA_OK && made) /* a directory this call made holds nothing else */
        rmdir(dir);
    cJSON_Delete(cfg);
    cJSON_Delete(index);
    free(order);
    return st;
}
