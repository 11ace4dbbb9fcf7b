/* SPDX-License-Identifier: MIT */
/* A tokenizer written as Hugging Face tokenizer.json: a llama2.c tokenizer.bin as the
 * sentencepiece-style BPE HF's converter makes of a Llama tokenizer (merges from every split of
 * a piece, ranked by its score), or a tokenizer.json written back as it was read. */
#include "fail.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define META "\xE2\x96\x81" /* U+2581, sentencepiece's word marker */
#define META_LEN 3

typedef struct split {
    float score;
    int32_t merged, left, right;
} split;

static int cmp_split(const void *a, const void *b)
{
    const split *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->merged != y->merged)
        return x->merged < y->merged ? -1 : 1;
    if (x->left != y->left)
        return x->left < y->left ? -1 : 1;
    return (x->right > y->right) - (x->right < y->right);
}

/* A tokenizer.bin piece as tokenizer.json names it: ids 0..2 by their roles, spaces as "▁". */
static char *json_name(const fa_tokenizer *t, int32_t id)
{
    static const char *const role[3] = { "<unk>", "<s>", "</s>" };
    const char *s = id < 3 ? role[id] : t->text + t->offset[id];
    const size_t n = id < 3 ? strlen(s) : fa_tok_len(t, id);
    char *o = malloc(3 * n + 1);
    size_t m = 0;
    for (size_t i = 0; o && i < n; i++)
        if (s[i] == ' ')
            memcpy(o + m, META, META_LEN), m += META_LEN;
        else
            o[m++] = s[i];
    if (o)
        o[m] = 0;
    return o;
}

static cJSON *meta_replace(const char *from, const char *to)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "pattern"), "String", from);
    cJSON_AddStringToObject(r, "content", to);
    return r;
}

static cJSON *typed(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

/* One element of a TemplateProcessing template: {kind: {"id": id, "type_id": type_id}}. */
static void template_item(cJSON *list, const char *kind, const char *id, int type_id)
{
    cJSON *e = cJSON_CreateObject(), *in = cJSON_AddObjectToObject(e, kind);
    cJSON_AddStringToObject(in, "id", id);
    cJSON_AddNumberToObject(in, "type_id", type_id);
    cJSON_AddItemToArray(list, e);
}

/* A tokenizer.bin's pieces (tokenizer.c's table) as a tokenizer.json tree; *err set on refusal. */
static cJSON *bin_to_json(const fa_tokenizer *t, char *err, fa_status *st)
{
    const int32_t V = t->vocab_size;
    char **name = calloc((size_t)V, sizeof(char *));
    size_t n_splits = 0, cap = 0;
    split *sp = NULL;
    cJSON *j = NULL;
    *st = FA_OK;
    if (!name)
        goto oom;
    for (int32_t id = 0; id < V; id++) {
        if (!(name[id] = json_name(t, id)))
            goto oom;
        if (!*name[id] || !fa_tok_valid_utf8(name[id], strlen(name[id]))) {
            *st = fa_model_fail(err, FA_ERR_UNSUPPORTED, "token %d is %s: tokenizer.json cannot hold it", (int)id,
                                *name[id] ? "not valid UTF-8" : "empty");
            goto out;
        }
        const int32_t same = fa_tok_lookup(t, t->text + t->offset[id], fa_tok_len(t, id));
        if (id >= 3 && same != id) {
            *st = fa_model_fail(err, FA_ERR_UNSUPPORTED, "tokens %d and %d are both '%.40s': tokenizer.json's vocab "
                                "holds a piece once", (int)same, (int)id, name[id]);
            goto out;
        }
    }
    for (int32_t id = 0; id < 3; id++)
        for (int32_t k = 3; k < V; k++)
            if (strcmp(name[id], name[k]) == 0) {
                *st = fa_model_fail(err, FA_ERR_UNSUPPORTED, "token %d is '%s', the name of id %d", (int)k, name[id],
                                    (int)id);
                goto out;
            }
    /* every split of a piece into two pieces (at character boundaries), as HF's sentencepiece
     * converter makes merges; ids 0..2 are named differently here and take no part */
    for (int32_t id = 3; id < V; id++) {
        const char *s = t->text + t->offset[id];
        const size_t n = fa_tok_len(t, id);
        if (t->byte_of[id] >= 0)
            continue;
        for (size_t i = fa_tok_utf8_len((const unsigned char *)s, n); i > 0 && i < n;) {
            const int32_t l = fa_tok_lookup(t, s, i), r = fa_tok_lookup(t, s + i, n - i);
            if (l >= 3 && r >= 3) {
                if (n_splits == cap) {
                    split *g = realloc(sp, sizeof(split) * (cap = cap ? 2 * cap : 1024));
                    if (!g)
                        goto oom;
                    sp = g;
                }
                sp[n_splits++] = (split){ t->scores[id], id, l, r };
            }
            const size_t k = fa_tok_utf8_len((const unsigned char *)s + i, n - i);
            i = k ? i + k : n;
        }
    }
    if (n_splits) /* sp may be NULL when there are none */
        qsort(sp, n_splits, sizeof(split), cmp_split);
    j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "version", "1.0");
    cJSON_AddNullToObject(j, "truncation");
    cJSON_AddNullToObject(j, "padding");
    cJSON *added = cJSON_AddArrayToObject(j, "added_tokens");
    for (int32_t id = 0; id < 3; id++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", id);
        cJSON_AddStringToObject(a, "content", name[id]);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
    }
    cJSON *norm = typed("Sequence"), *nl = cJSON_AddArrayToObject(norm, "normalizers"), *pre = typed("Prepend");
    cJSON_AddStringToObject(pre, "prepend", META);
    cJSON_AddItemToArray(nl, pre);
    cJSON_AddItemToArray(nl, meta_replace(" ", META));
    cJSON_AddItemToObject(j, "normalizer", norm);
    cJSON_AddNullToObject(j, "pre_tokenizer");
    /* BOS before each sequence, as Llama-2's files have it (the runner adds BOS itself) */
    cJSON *post = typed("TemplateProcessing"), *single = cJSON_AddArrayToObject(post, "single");
    cJSON *two = cJSON_AddArrayToObject(post, "pair");
    template_item(single, "SpecialToken", name[FA_TOKEN_BOS], 0);
    template_item(single, "Sequence", "A", 0);
    template_item(two, "SpecialToken", name[FA_TOKEN_BOS], 0);
    template_item(two, "Sequence", "A", 0);
    template_item(two, "SpecialToken", name[FA_TOKEN_BOS], 1);
    template_item(two, "Sequence", "B", 1);
    cJSON *specials = cJSON_AddObjectToObject(post, "special_tokens");
    cJSON *bt = cJSON_AddObjectToObject(specials, name[FA_TOKEN_BOS]);
    cJSON_AddStringToObject(bt, "id", name[FA_TOKEN_BOS]);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(bt, "ids"), cJSON_CreateNumber(FA_TOKEN_BOS));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(bt, "tokens"), cJSON_CreateString(name[FA_TOKEN_BOS]));
    cJSON_AddItemToObject(j, "post_processor", post);
    cJSON *dec = typed("Sequence"), *dl = cJSON_AddArrayToObject(dec, "decoders"), *strip = typed("Strip");
    cJSON_AddItemToArray(dl, meta_replace(META, " "));
    cJSON_AddItemToArray(dl, typed("ByteFallback"));
    cJSON_AddItemToArray(dl, typed("Fuse"));
    cJSON_AddStringToObject(strip, "content", " ");
    cJSON_AddNumberToObject(strip, "start", 1);
    cJSON_AddNumberToObject(strip, "stop", 0);
    cJSON_AddItemToArray(dl, strip);
    cJSON_AddItemToObject(j, "decoder", dec);
    cJSON *model = typed("BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddStringToObject(model, "unk_token", name[FA_TOKEN_UNK]);
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 1);
    cJSON_AddBoolToObject(model, "byte_fallback", 1);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab"), *merges = cJSON_AddArrayToObject(model, "merges");
    for (int32_t id = 0; id < V; id++)
        cJSON_AddItemToObject(vocab, name[id], cJSON_CreateNumber(id));
    for (size_t k = 0; k < n_splits; k++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(name[sp[k].left]));
        cJSON_AddItemToArray(pair, cJSON_CreateString(name[sp[k].right]));
        cJSON_AddItemToArray(merges, pair);
    }
    cJSON_AddItemToObject(j, "model", model);
    goto out;
oom:
    *st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory writing tokenizer.json");
out:
    for (int32_t id = 0; name && id < V; id++)
        free(name[id]);
    free(name);
    free(sp);
    if (*st != FA_OK) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

fa_status fa_tokenizer_write_json(const fa_tokenizer *t, const char *path, char *err)
{
    if (!t || !path)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", !t ? "tokenizer" : "path");
    fa_status st = FA_OK;
    char *text = NULL;
    size_t n;
    const char *src = NULL;
    if (t->bpe) {
        src = fa_tok_bpe_source(t->bpe, &n);
    } else {
        cJSON *j = bin_to_json(t, err, &st);
        if (!j)
            return st;
        text = cJSON_Print(j);
        cJSON_Delete(j);
        if (!text)
            return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", path);
        n = strlen(text);
    }
    errno = 0;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(text ? text : src, 1, n, f) == n && (t->bpe || fputc('\n', f) != EOF);
    int e = errno;
    if (f && fclose(f) != 0 && ok)
        ok = 0, e = errno;
    free(text);
    return ok ? FA_OK : fa_model_write_failed(err, path, e);
}
