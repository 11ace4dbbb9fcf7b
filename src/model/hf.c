/* SPDX-License-Identifier: MIT */
/*
 * Hugging Face Llama checkpoints: safetensors (one file or shards named by
 * model.safetensors.index.json) read with cJSON and checked against config.json (parsed in
 * hf_config.c). The loader builds the llama2.c image (header, then the float32 arrays in
 * llama2.c's order) and hands it to fa_model_adopt, so both formats end in one model layout
 * and one forward pass.
 */
#include "fail.h"
#include "hf.h"
#include "json.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_CONFIG_BYTES (16u << 20)
#define MAX_HEADER_BYTES 100000000ull /* safetensors' own limit */

/* ---- tensors: names, shapes and where each goes in the llama2.c image ---- */

static const char *const layer_names[FA_HF_PER_LAYER] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight",
};

static const char *const global_names[3] = { "model.embed_tokens.weight", "model.norm.weight",
                                             "lm_head.weight" };

/* Slots: 0 embedding, 1 final norm, 2 lm_head, then FA_HF_PER_LAYER per layer. */
int fa_hf_slot_count(const fa_model_config *c)
{
    return 3 + FA_HF_PER_LAYER * c->n_layers;
}

void fa_hf_slot_name(const fa_model_config *c, int slot, char *name, size_t cap)
{
    (void)c;
    if (slot < 3)
        snprintf(name, cap, "%s", global_names[slot]);
    else
        snprintf(name, cap, "model.layers.%d.%s", (slot - 3) / FA_HF_PER_LAYER,
                 layer_names[(slot - 3) % FA_HF_PER_LAYER]);
}

/* The slot of a tensor name, -1 if no slot has it. */
static int slot_of(const fa_model_config *c, const char *name)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(name, global_names[i]) == 0)
            return i;
    const char *p = "model.layers.";
    if (strncmp(name, p, strlen(p)) != 0)
        return -1;
    const char *s = name + strlen(p);
    if (*s < '0' || *s > '9' || (*s == '0' && s[1] != '.'))
        return -1; /* no sign, no leading zeros: one spelling per layer */
    long l = 0;
    while (*s >= '0' && *s <= '9' && l < c->n_layers)
        l = l * 10 + (*s++ - '0');
    if (l >= c->n_layers || *s != '.')
        return -1;
    for (int k = 0; k < FA_HF_PER_LAYER; k++)
        if (strcmp(s + 1, layer_names[k]) == 0)
            return 3 + (int)l * FA_HF_PER_LAYER + k;
    return -1;
}

fa_hf_tensor fa_hf_slot(const fa_model_config *c, int slot)
{
    uint64_t D = (uint64_t)c->dim, H = (uint64_t)c->hidden_dim, V = (uint64_t)c->vocab_size;
    uint64_t L = (uint64_t)c->n_layers, hs = D / (uint64_t)c->n_heads;
    uint64_t K = hs * (uint64_t)c->n_kv_heads;
    /* float offsets of llama2.c's arrays after the header (checkpoint.c's order) */
    uint64_t emb = 0, att = emb + V * D, wq = att + L * D, wk = wq + L * D * D, wv = wk + L * K * D;
    uint64_t wo = wv + L * K * D, ffn = wo + L * D * D, w1 = ffn + L * D, w2 = w1 + L * H * D;
    uint64_t w3 = w2 + L * D * H, fin = w3 + L * H * D, cls = fin + D + (uint64_t)c->seq_len * hs;
    fa_hf_tensor t = { 0 };
    if (slot < 3) {
        const uint64_t at[3] = { emb, fin, cls };
        t.offset = at[slot];
        t.rows = slot == 1 ? D : V;
        t.cols = slot == 1 ? 0 : D;
        return t;
    }
    uint64_t l = (uint64_t)(slot - 3) / FA_HF_PER_LAYER;
    switch ((slot - 3) % FA_HF_PER_LAYER) {
    case 0: t = (fa_hf_tensor){ att + l * D, D, 0, 0 }; break;
    case 1: t = (fa_hf_tensor){ wq + l * D * D, D, D, c->n_heads }; break;
    case 2: t = (fa_hf_tensor){ wk + l * K * D, K, D, c->n_kv_heads }; break;
    case 3: t = (fa_hf_tensor){ wv + l * K * D, K, D, 0 }; break;
    case 4: t = (fa_hf_tensor){ wo + l * D * D, D, D, 0 }; break;
    case 5: t = (fa_hf_tensor){ ffn + l * D, D, 0, 0 }; break;
    case 6: t = (fa_hf_tensor){ w1 + l * H * D, H, D, 0 }; break;
    case 7: t = (fa_hf_tensor){ w3 + l * H * D, H, D, 0 }; break;
    default: t = (fa_hf_tensor){ w2 + l * D * H, D, H, 0 }; break;
    }
    return t;
}

uint64_t fa_hf_permuted_row(uint64_t r, uint64_t rows, int32_t heads, int hf_row)
{
    if (!heads)
        return r;
    uint64_t hs = rows / (uint64_t)heads, half = hs / 2, h = r / hs, w = r % hs;
    if (hf_row) /* w = p*half + i */
        return h * hs + 2 * (w % half) + w / half;
    return h * hs + (w % 2) * half + w / 2; /* w = 2i + p */
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 31)
        u = sign | 0x7F800000u | m << 13;
    else if (e)
        u = sign | (e + 112) << 23 | m << 13;
    else if (!m)
        u = sign;
    else { /* subnormal: normalise */
        e = 113;
        while (!(m & 1024))
            m <<= 1, e--;
        u = sign | e << 23 | (m & 1023) << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The llama2.c rows of one tensor from its safetensors bytes (rows x max(cols, 1) elements). */
static void convert(float *dst, const unsigned char *src, int dtype, const fa_hf_tensor *t)
{
    uint64_t cols = t->cols ? t->cols : 1, esize = dtype == FA_HF_F32 ? 4 : 2;
    for (uint64_t r = 0; r < t->rows; r++) {
        const unsigned char *s = src + fa_hf_permuted_row(r, t->rows, t->heads, 0) * cols * esize;
        float *d = dst + r * cols;
        if (dtype == FA_HF_F32) {
            memcpy(d, s, cols * 4); /* little-endian host */
        } else if (dtype == FA_HF_BF16) {
            for (uint64_t j = 0; j < cols; j++) {
                uint32_t u = (uint32_t)(s[2 * j] | s[2 * j + 1] << 8) << 16;
                memcpy(d + j, &u, 4);
            }
        } else {
            for (uint64_t j = 0; j < cols; j++)
                d[j] = f16_to_f32((uint16_t)(s[2 * j] | s[2 * j + 1] << 8));
        }
    }
}

/* ---- safetensors ---- */

/* One weight_map entry: a tensor's name and its shard's file name. */
typedef struct map_entry {
    const char *name, *shard;
} map_entry;

typedef struct loader {
    const fa_model_config *c;
    float *image;          /* the llama2.c image's floats */
    int32_t *from;         /* [slots] 1 + the file index a tensor came from, 0 = not yet */
    const map_entry *map;  /* sharded: the weight_map sorted by name (map_n entries), else NULL */
    int map_n;
} loader;

static uint64_t least_bytes(const fa_model_config *c);

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const map_entry *)a)->name, ((const map_entry *)b)->name);
}

static int cmp_shard(const void *a, const void *b)
{
    return strcmp(((const map_entry *)a)->shard, ((const map_entry *)b)->shard);
}

/* Tensors tolerated and skipped, though checked like the rest (dtype, shape, data_offsets):
 * a layer's rotary table older exports stored (model.layers.N.self_attn.rotary_emb.inv_freq,
 * [head_dim / 2]; recomputed here), and lm_head where the config ties it to the embedding (HF
 * ties the two on load). 1 and *t the tensor's shape when name is one, else 0. */
static int ignorable_as(const loader *ld, const char *name, fa_hf_tensor *t)
{
    const fa_model_config *c = ld->c;
    if (c->shared_classifier && strcmp(name, "lm_head.weight") == 0) {
        *t = fa_hf_slot(c, 2);
        return 1;
    }
    const char *pre = "model.layers.", *suf = ".self_attn.rotary_emb.inv_freq";
    if (strncmp(name, pre, strlen(pre)) != 0)
        return 0;
    const char *d = name + strlen(pre), *e = d;
    long layer = 0;
    while (*e >= '0' && *e <= '9' && e - d < 9)
        layer = layer * 10 + (*e++ - '0');
    if (e == d || (*d == '0' && e - d > 1) || layer >= c->n_layers || strcmp(e, suf) != 0)
        return 0;
    memset(t, 0, sizeof(*t));
    t->rows = (uint64_t)(c->dim / c->n_heads / 2);
    return 1;
}

static int ignorable(const loader *ld, const char *name)
{
    fa_hf_tensor t;
    return ignorable_as(ld, name, &t);
}

/* A non-negative integer JSON value below 2^53 (exact in a double). */
static int json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0.0 && v->valuedouble < 9007199254740992.0) ||
        v->valuedouble != floor(v->valuedouble))
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

static fa_status read_tensor(loader *ld, const cJSON *e, const char *file, int file_index,
                             const char *shard, const unsigned char *data, uint64_t data_len,
                             char *err)
{
    const char *name = e->string;
    if (ld->map) {
        const map_entry key = { name, NULL };
        const map_entry *hit = bsearch(&key, ld->map, (size_t)ld->map_n, sizeof(map_entry), cmp_name);
        const char *mapped = hit ? hit->shard : NULL;
        if (!mapped || strcmp(mapped, shard) != 0)
            return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                                 "tensor '%.80s' is in '%s' but the index's weight_map %s", name, file,
                                 mapped ? "puts it in another shard" : "does not name it");
    }
    int slot = slot_of(ld->c, name);
    fa_hf_tensor t;
    const int skip = slot < 0 || (slot == 2 && ld->c->shared_classifier);
    if (skip && !ignorable_as(ld, name, &t))
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': unexpected tensor '%.80s'", file, name);
    if (!skip && ld->from[slot])
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': tensor '%.80s' appears twice", file, name);
    if (!cJSON_IsObject(e))
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': tensor '%.80s' is not an object", file, name);
    const char *dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "dtype"));
    int dtype = !dt ? -1 : strcmp(dt, "F32") == 0 ? FA_HF_F32 : strcmp(dt, "F16") == 0 ? FA_HF_F16
                         : strcmp(dt, "BF16") == 0 ? FA_HF_BF16 : -1;
    if (dtype < 0)
        return fa_model_fail(err, FA_ERR_INVALID_DTYPE,
                             "'%s': tensor '%.80s' has dtype '%.16s'; F32, F16 and BF16 are read", file,
                             name, dt ? dt : "(none)");
    if (!skip)
        t = fa_hf_slot(ld->c, slot);
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    uint64_t want[2] = { t.rows, t.cols }, got[2] = { 0, 0 };
    int rank = t.cols ? 2 : 1, n = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1, ok = n == rank;
    for (int i = 0; ok && i < rank; i++)
        ok = json_u64(cJSON_GetArrayItem(shape, i), &got[i]) && got[i] == want[i];
    if (!ok) {
        if (rank == 2)
            return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                                 "'%s': tensor '%.80s' must have shape [%llu, %llu] (config.json)", file,
                                 name, (unsigned long long)want[0], (unsigned long long)want[1]);
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "'%s': tensor '%.80s' must have shape [%llu] (config.json)",
                             file, name, (unsigned long long)want[0]);
    }
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    uint64_t b = 0, end = 0, esize = dtype == FA_HF_F32 ? 4 : 2;
    uint64_t bytes = t.rows * (t.cols ? t.cols : 1) * esize; /* the image's size was checked */
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_u64(cJSON_GetArrayItem(off, 0), &b) ||
        !json_u64(cJSON_GetArrayItem(off, 1), &end) || b > end)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                             "'%s': tensor '%.80s' data_offsets must be two integers [begin, end]", file, name);
    if (end > data_len)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                             "'%s': tensor '%.80s' data_offsets end %llu past the data (%llu bytes)", file,
                             name, (unsigned long long)end, (unsigned long long)data_len);
    if (end - b != bytes)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                             "'%s': tensor '%.80s' data_offsets span %llu bytes; its shape and dtype need %llu",
                             file, name, (unsigned long long)(end - b), (unsigned long long)bytes);
    if (skip)
        return FA_OK;
    convert(ld->image + t.offset, data + b, dtype, &t);
    ld->from[slot] = 1 + file_index;
    return FA_OK;
}

/* A tensor's bytes in the data section, for the layout check. */
typedef struct {
    uint64_t begin, end;
    const char *name;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* The header's layout, as the safetensors format has it: __metadata__ (if any) an object of
 * strings, and the tensors' data_offsets tiling the data section from 0 to its end, with no
 * byte shared and none left over. Every tensor counts, those the runner does not read too. */
static fa_status check_layout(const cJSON *h, const char *file, uint64_t data_len, char *err)
{
    int n = 0;
    for (const cJSON *e = h->child; e; e = e->next)
        n++;
    span *v = malloc(sizeof(span) * (size_t)(n ? n : 1));
    if (!v)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for '%s''s header", file);
    int k = 0;
    fa_status st = FA_OK;
    for (const cJSON *e = h->child; e && st == FA_OK; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            int strings = cJSON_IsObject(e);
            for (const cJSON *m = e->child; strings && m; m = m->next)
                strings = cJSON_IsString(m);
            if (!strings)
                st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': __metadata__ must be an object of strings",
                                   file);
            continue;
        }
        const cJSON *off = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "data_offsets") : NULL;
        span *x = &v[k++];
        x->name = e->string;
        if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_u64(cJSON_GetArrayItem(off, 0), &x->begin) ||
            !json_u64(cJSON_GetArrayItem(off, 1), &x->end) || x->begin > x->end)
            st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                               "'%s': tensor '%.80s' data_offsets must be two integers [begin, end]", file, e->string);
    }
    if (st == FA_OK) {
        qsort(v, (size_t)k, sizeof(span), cmp_span);
        uint64_t at = 0;
        for (int i = 0; i < k && st == FA_OK; i++) {
            if (v[i].begin < at)
                st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                                   "'%s': tensor '%.80s' data_offsets begin at %llu, inside the bytes of tensor "
                                   "'%.80s' (up to %llu): tensors must not overlap",
                                   file, v[i].name, (unsigned long long)v[i].begin, v[i - 1].name,
                                   (unsigned long long)at);
            else if (v[i].begin > at)
                st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                                   "'%s': data bytes %llu..%llu, before tensor '%.80s', belong to no tensor (one "
                                   "missing from the header?)",
                                   file, (unsigned long long)at, (unsigned long long)v[i].begin, v[i].name);
            at = v[i].end;
        }
        if (st == FA_OK && at != data_len)
            st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                               "'%s': data bytes %llu..%llu, after the last tensor, belong to no tensor", file,
                               (unsigned long long)at, (unsigned long long)data_len);
    }
    free(v);
    return st;
}

/* One safetensors image: 8-byte little-endian header length, the JSON header, the data. */
static fa_status read_safetensors(loader *ld, const unsigned char *p, uint64_t size, const char *file,
                                  int file_index, const char *shard, char *err)
{
    if (size < 8)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "'%s' is %llu bytes, shorter than its 8-byte header length",
                             file, (unsigned long long)size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | p[i];
    if (n > size - 8)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                             "'%s': header length %llu runs past the end of the file (%llu bytes)", file,
                             (unsigned long long)n, (unsigned long long)size);
    /* a header describes at most the model's tensors (and a layer's rotary table each), about
     * 110 bytes apiece in practice: anything far longer is refused before cJSON builds it */
    const uint64_t cap = 65536 + 512 * (uint64_t)(fa_hf_slot_count(ld->c) + ld->c->n_layers);
    if (n > MAX_HEADER_BYTES || n > cap)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                             "'%s': header length %llu exceeds the %llu bytes a header of this model's tensors "
                             "can need",
                             file, (unsigned long long)n, (unsigned long long)(cap < MAX_HEADER_BYTES ? cap : MAX_HEADER_BYTES));
    fa_status st;
    /* a tensor's entry is 8 values (object, dtype, shape and data_offsets with theirs) */
    const size_t values = 4096 + 12 * (size_t)(fa_hf_slot_count(ld->c) + ld->c->n_layers);
    cJSON *h = fa_json_object((const char *)p + 8, (size_t)n, values, file, " header", &st, err);
    if (!h)
        return st;
    for (const cJSON *e = h->child; e && st == FA_OK; e = e->next)
        if (strcmp(e->string, "__metadata__") != 0)
            st = read_tensor(ld, e, file, file_index, shard, p + 8 + n, size - 8 - n, err);
    if (st == FA_OK) /* after each tensor's own checks, which name what is wrong more closely */
        st = check_layout(h, file, size - 8 - n, err);
    cJSON_Delete(h);
    return st;
}

/* Every tensor the config needs was found in `where` (a file or an index). */
static fa_status check_complete(const loader *ld, const char *where, char *err)
{
    int slots = fa_hf_slot_count(ld->c);
    for (int s = 0; s < slots; s++)
        if (!ld->from[s] && !(s == 2 && ld->c->shared_classifier)) {
            char name[96];
            fa_hf_slot_name(ld->c, s, name, sizeof(name));
            return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "tensor '%s' is missing from '%s'%s", name,
                                 where, s == 2 ? " (tie_word_embeddings is false)" : "");
        }
    return FA_OK;
}

/* The llama2.c image of config c: the header written; every float is a tensor's, written by
 * read_tensor, but the legacy RoPE tables' (max_position_embeddings x head_dim), which
 * nothing reads or writes out and which are left untouched, so that a long context costs
 * them no memory. */
static fa_status new_image(const fa_model_config *c, unsigned char **img, uint64_t *bytes, char *err)
{
    fa_status st = fa_model_config_check(c, bytes, err);
    if (st != FA_OK)
        return st;
    /* llama2.c's RoPE tables, [seq_len, head_dim / 2] cos and sin, are part of the image:
     * max_position_embeddings alone may not make it larger than the weights (past 1 GiB) */
    const uint64_t rope = (uint64_t)c->seq_len * (uint64_t)(c->dim / c->n_heads) * 4, gib = (uint64_t)1 << 30;
    if (rope > gib && rope > *bytes - rope)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "max_position_embeddings (%d) x head_dim (%d) needs %.2f GiB of RoPE tables, more "
                             "than the weights' %.2f GiB",
                             (int)c->seq_len, (int)(c->dim / c->n_heads), (double)rope / gib,
                             (double)(*bytes - rope) / gib);
    *img = aligned_alloc(64, (size_t)((*bytes + 63) & ~(uint64_t)63));
    if (!*img)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY,
                             "out of memory for the %.2f GiB float32 image of the weights (with llama2.c's RoPE "
                             "tables of max_position_embeddings %d x head_dim %d)",
                             (double)*bytes / (1u << 30), (int)c->seq_len, (int)(c->dim / c->n_heads));
    int32_t h[7] = { c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                     c->shared_classifier ? c->vocab_size : -c->vocab_size, c->seq_len };
    memcpy(*img, h, sizeof(h));
    return FA_OK;
}

/* Hand the finished image to fa_model_adopt with the config's fields the format lacks. */
static fa_status finish(const fa_model_config *c, unsigned char *img, uint64_t bytes, fa_model **out,
                        char *err)
{
    fa_status st = fa_model_adopt(img, (size_t)bytes, 2, out, err);
    if (st == FA_OK) {
        (*out)->config.rope_theta = c->rope_theta;
        (*out)->config.norm_eps = c->norm_eps;
        (*out)->config.rope_scaling = c->rope_scaling;
        (*out)->config.bos_id = c->bos_id;
        (*out)->config.n_eos = c->n_eos;
        memcpy((*out)->config.eos_ids, c->eos_ids, sizeof(c->eos_ids));
    }
    return st;
}

fa_status fa_model_from_hf_memory(const char *config_json, size_t config_bytes,
                                  const void *safetensors, size_t safetensors_bytes,
                                  fa_model **out, char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!config_json || !safetensors)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", !config_json ? "config_json" : "safetensors");
    fa_model_config c;
    unsigned char *img;
    uint64_t bytes;
    fa_status st = fa_hf_parse_config(config_json, config_bytes, "config.json", &c, err);
    if (st == FA_OK && (st = fa_model_config_check(&c, NULL, err)) == FA_OK && safetensors_bytes < least_bytes(&c))
        st = fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                           "model.safetensors is %zu bytes; config.json's tensors need at least %llu",
                           safetensors_bytes, (unsigned long long)least_bytes(&c));
    if (st != FA_OK || (st = new_image(&c, &img, &bytes, err)) != FA_OK)
        return st;
    loader ld = { &c, (float *)(img + FA_MODEL_HEADER_BYTES), calloc((size_t)fa_hf_slot_count(&c), sizeof(int32_t)), NULL, 0 };
    if (!ld.from)
        st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == FA_OK)
        st = read_safetensors(&ld, safetensors, safetensors_bytes, "model.safetensors", 0, NULL, err);
    if (st == FA_OK)
        st = check_complete(&ld, "model.safetensors", err);
    free(ld.from);
    if (st != FA_OK) {
        free(img);
        return st;
    }
    return finish(&c, img, bytes, out, err);
}

/* ---- files ---- */

/* path = dir/name, refused when it does not fit. */
static fa_status join(char *path, size_t cap, const char *dir, const char *name, char *err)
{
    if ((size_t)snprintf(path, cap, "%s/%s", dir, name) >= cap)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "path '%s/%s' is too long", dir, name);
    return FA_OK;
}

/* A whole small file (config.json, the shard index) into a NUL-terminated buffer. */
static fa_status slurp(const char *path, char **text, size_t *n, char *err)
{
    return fa_model_read_file(path, "file", MAX_CONFIG_BYTES, FA_ERR_INVALID_ARGUMENT, (unsigned char **)text, n,
                              err);
}

static fa_status map_safetensors(loader *ld, const char *path, int file_index, const char *shard,
                                 char *err)
{
    int fd;
    uint64_t size;
    fa_status st = fa_model_open_file(path, "safetensors file", &fd, &size, err);
    if (st != FA_OK)
        return st;
    if (size > (uint64_t)SIZE_MAX) {
        close(fd);
        return fa_model_fail(err, FA_ERR_SIZE_OVERFLOW, "'%s' is too large to map", path);
    }
    void *map = size ? mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "cannot map '%s' (%llu bytes)", path,
                             (unsigned long long)size);
    static const unsigned char none[1];
    st = read_safetensors(ld, map ? map : none, size, path, file_index, shard, err);
    if (map)
        munmap(map, (size_t)size);
    return st;
}

/* A shard's name from the index: a plain file name inside the directory. */
static int plain_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* The values an index of c's tensors may hold: a weight_map entry each (and a layer's rotary
 * table), and metadata. */
static size_t index_values(const fa_model_config *c)
{
    return 4096 + 2 * (size_t)(fa_hf_slot_count(c) + c->n_layers);
}

/* model.safetensors.index.json at path, parsed: *j its tree (the caller deletes it), *map
 * its weight_map, an object of at most the entries a Llama of c's layers has. */
static fa_status load_index(const char *path, const fa_model_config *c, cJSON **j, const cJSON **map, char *err)
{
    char *text;
    size_t n;
    fa_status st = slurp(path, &text, &n, err);
    if (st != FA_OK)
        return st;
    *j = fa_json_object(text, n, index_values(c), path, "", &st, err);
    free(text);
    if (!*j)
        return st;
    *map = cJSON_GetObjectItemCaseSensitive(*j, "weight_map");
    /* every name is a slot, or a layer's rotary table */
    const int most = fa_hf_slot_count(c) + c->n_layers;
    if (!cJSON_IsObject(*map))
        st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': weight_map is missing or not an object", path);
    else if (cJSON_GetArraySize(*map) > most)
        st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                           "'%s': weight_map has %d entries; a Llama of %d layers has at most %d tensors", path,
                           cJSON_GetArraySize(*map), (int)c->n_layers, most);
    if (st != FA_OK) {
        cJSON_Delete(*j);
        *j = NULL;
    }
    return st;
}

/* The shards the index's map names, read into ld's image; path the index, for messages. */
static fa_status read_index(loader *ld, const char *dir, const char *path, const cJSON *map, char *err)
{
    fa_status st = FA_OK;
    const int entries = cJSON_GetArraySize(map);
    map_entry *ents = malloc(sizeof(map_entry) * (size_t)(entries > 0 ? entries : 1));
    map_entry *byshard = malloc(sizeof(map_entry) * (size_t)(entries > 0 ? entries : 1));
    map_entry *order = malloc(sizeof(map_entry) * (size_t)(entries > 0 ? entries : 1));
    char *done = calloc((size_t)(entries > 0 ? entries : 1), 1);
    if (!ents || !byshard || !order || !done) {
        free(ents), free(byshard), free(order), free(done);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", path);
    }
    int m = 0;
    for (const cJSON *e = map->child; e && st == FA_OK; e = e->next) {
        const char *shard = cJSON_GetStringValue(e);
        if (!shard || !plain_name(shard))
            st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                               "'%s': weight_map entry '%.80s' must name a file in the directory", path,
                               e->string);
        else
            ents[m++] = (map_entry){ e->string, shard };
    }
    /* sorted by name for the lookups (a name twice is refused), by shard to read each once, in
     * the order the map first mentions them */
    memcpy(order, ents, sizeof(map_entry) * (size_t)m);
    qsort(ents, (size_t)m, sizeof(map_entry), cmp_name);
    for (int i = 1; i < m && st == FA_OK; i++)
        if (strcmp(ents[i].name, ents[i - 1].name) == 0)
            st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': weight_map names tensor '%.80s' twice", path,
                               ents[i].name);
    memcpy(byshard, ents, sizeof(map_entry) * (size_t)m);
    qsort(byshard, (size_t)m, sizeof(map_entry), cmp_shard);
    ld->map = ents;
    ld->map_n = m;
    int files = 0;
    for (int i = 0; i < m && st == FA_OK; i++) {
        const map_entry *at = bsearch(&order[i], byshard, (size_t)m, sizeof(map_entry), cmp_shard);
        while (at > byshard && strcmp(at[-1].shard, at->shard) == 0)
            at--; /* the first of its shard's run holds the flag */
        if (done[at - byshard])
            continue;
        done[at - byshard] = 1;
        char spath[4096];
        if ((st = join(spath, sizeof(spath), dir, order[i].shard, err)) == FA_OK)
            st = map_safetensors(ld, spath, files++, order[i].shard, err);
    }
    /* every tensor the map names was found in its shard (or is one we skip) */
    for (int i = 0; i < m && st == FA_OK; i++) {
        int slot = slot_of(ld->c, ents[i].name);
        if ((slot < 0 || (slot == 2 && ld->c->shared_classifier)) && ignorable(ld, ents[i].name))
            continue;
        if (slot < 0 || !ld->from[slot])
            st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                               "'%s': weight_map names tensor '%.80s' in '%.80s', which does not hold it",
                               path, ents[i].name, ents[i].shard);
    }
    ld->map = NULL;
    ld->map_n = 0;
    free(ents), free(byshard), free(order), free(done);
    return st;
}

/* The safetensors files the load reads hold at least the config's tensors at 2 bytes an element:
 * checked before the float32 image of a config (which may claim any size) is allocated. */
static uint64_t least_bytes(const fa_model_config *c) /* c passed fa_model_config_check */
{
    uint64_t need = 0;
    for (int s = 0; s < fa_hf_slot_count(c); s++) {
        const fa_hf_tensor t = fa_hf_slot(c, s);
        if (!(s == 2 && c->shared_classifier))
            need += 2 * t.rows * (t.cols ? t.cols : 1);
    }
    return need;
}

/* The bytes of the files the load will read: model.safetensors (map NULL), or the distinct
 * shards the index's map names (regular files in dir; read_index refuses the rest). */
static uint64_t data_bytes(const char *dir, const cJSON *map)
{
    char path[4096], err[FA_MODEL_ERR_LEN];
    struct stat sb;
    if (!map)
        return join(path, sizeof(path), dir, "model.safetensors", err) == FA_OK && stat(path, &sb) == 0 &&
                       S_ISREG(sb.st_mode)
                   ? (uint64_t)sb.st_size
                   : 0;
    uint64_t have = 0;
    for (const cJSON *e = map->child; e; e = e->next) { /* quadratic, over load_index's bound */
        const char *shard = cJSON_GetStringValue(e);
        int first = shard && plain_name(shard);
        for (const cJSON *f = map->child; first && f != e; f = f->next)
            first = !cJSON_IsString(f) || strcmp(f->valuestring, shard) != 0;
        if (first && join(path, sizeof(path), dir, shard, err) == FA_OK && stat(path, &sb) == 0 &&
            S_ISREG(sb.st_mode))
            have += (uint64_t)sb.st_size;
    }
    return have;
}

static fa_status enough_data(const char *dir, const fa_model_config *c, const cJSON *map, char *err)
{
    fa_status st = fa_model_config_check(c, NULL, err);
    if (st != FA_OK)
        return st;
    const uint64_t need = least_bytes(c), have = data_bytes(dir, map);
    if (have < need)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                             "'%s' holds %llu bytes of safetensors to read; config.json's tensors need at least %llu",
                             dir, (unsigned long long)have, (unsigned long long)need);
    return FA_OK;
}

fa_status fa_model_open_hf(const char *dir, fa_model **out, char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!dir)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "dir is NULL");
    char path[4096];
    char *text;
    size_t n;
    fa_status st = join(path, sizeof(path), dir, "config.json", err);
    if (st != FA_OK)
        return st;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s' has no config.json", dir);
    if ((st = slurp(path, &text, &n, err)) != FA_OK)
        return st;
    fa_model_config c;
    st = fa_hf_parse_config(text, n, path, &c, err);
    free(text);
    /* one file, or an index of shards: parsed once, before the image is sized */
    cJSON *index = NULL;
    const cJSON *map = NULL;
    int sharded = 0;
    if (st == FA_OK && (st = join(path, sizeof(path), dir, "model.safetensors", err)) == FA_OK &&
        stat(path, &sb) != 0 && (st = join(path, sizeof(path), dir, "model.safetensors.index.json", err)) == FA_OK) {
        sharded = 1;
        st = stat(path, &sb) == 0 ? fa_model_config_check(&c, NULL, err)
                                  : fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                                                  "'%s' holds neither model.safetensors nor "
                                                  "model.safetensors.index.json",
                                                  dir);
        if (st == FA_OK)
            st = load_index(path, &c, &index, &map, err);
    }
    unsigned char *img = NULL;
    uint64_t bytes;
    if (st == FA_OK && (st = enough_data(dir, &c, map, err)) == FA_OK)
        st = new_image(&c, &img, &bytes, err);
    loader ld = { &c, NULL, NULL, NULL, 0 };
    if (st == FA_OK) {
        ld.image = (float *)(img + FA_MODEL_HEADER_BYTES);
        if (!(ld.from = calloc((size_t)fa_hf_slot_count(&c), sizeof(int32_t))))
            st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (st == FA_OK)
        st = sharded ? read_index(&ld, dir, path, map, err) : map_safetensors(&ld, path, 0, NULL, err);
    cJSON_Delete(index);
    if (st == FA_OK)
        st = check_complete(&ld, path, err);
    free(ld.from);
    if (st != FA_OK) {
        free(img);
        return st;
    }
    return finish(&c, img, bytes, out, err);
}

fa_status fa_model_load(const char *path, fa_model **out, char *err)
{
    struct stat sb;
    if (path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return fa_model_open_hf(path, out, err);
    return fa_model_open(path, out, err);
}
