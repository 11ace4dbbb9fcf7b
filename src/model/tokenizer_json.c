/* SPDX-License-Identifier: MIT */
/*
 * Hugging Face tokenizer.json, read with cJSON and checked field by field: Llama-2-style
 * sentencepiece BPE (the Prepend / Replace normalizers or the Metaspace pre-tokenizer, byte
 * fallback; decoded through the file's Replace / ByteFallback / Strip decoders) and Llama-3-style
 * byte-level BPE (a regex Split then ByteLevel, or ByteLevel alone; the ByteLevel decoder; BOS
 * from the post_processor's template). tokenizer_bpe.c encodes as HF's tokenizers library does.
 */
#include "fail.h"
#include "json.h"
#include "tokenizer_bpe.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fa_tok_bpe_source(const fa_tok_bpe *b, size_t *n)
{
    *n = b->source_len;
    return b->source;
}

void fa_tok_bpe_free(fa_tok_bpe *b)
{
    if (!b)
        return;
    free(b->keys);
    free(b->rank);
    free(b->merged);
    free(b->in_model);
    free(b->added);
    free(b->source);
    fa_tok_split_free(b->split);
    free(b);
}

/* ---- helpers ---- */

size_t fa_tok_utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || len > n)
        return 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t least[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0; /* overlong, past Unicode, or a surrogate */
    return len;
}

int fa_tok_valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = fa_tok_utf8_len((const unsigned char *)s + i, n - i)))
            return 0;
    return 1;
}

/* ---- reading ---- */

typedef struct reader {
    const char *file;
    char *err;
} reader;

static const cJSON *item(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A boolean field (dflt when absent or null) of the object named where. */
static fa_status get_bool(const reader *rd, const cJSON *o, const char *where, const char *key, int dflt, int *out)
{
    const cJSON *v = item(o, key);
    if (!v) {
        *out = dflt;
        return FA_OK;
    }
    if (!cJSON_IsBool(v))
        return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': %s%s must be true or false", rd->file, where, key);
    *out = cJSON_IsTrue(v);
    return FA_OK;
}

/* A string field that must equal want exactly (absent: missing_ok decides). */
static fa_status want_string(const reader *rd, const cJSON *o, const char *where, const char *key, const char *want,
                             int missing_ok)
{
    const cJSON *v = item(o, key);
    if (!v && missing_ok)
        return FA_OK;
    const char *s = cJSON_GetStringValue(v);
    if (!s)
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT, "'%s': %s%s is missing or not a string", rd->file,
                             where, key);
    if (strcmp(s, want) != 0)
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': %s%s '%.40s' is not supported (only '%s')", rd->file,
                             where, key, s, want);
    return FA_OK;
}

/* The type of a normalizer, pre-tokenizer or decoder object. */
static const char *type_of(const reader *rd, const cJSON *o, const char *where, fa_status *st)
{
    const char *t = cJSON_GetStringValue(item(o, "type"));
    *st = t ? FA_OK
            : fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT, "'%s': %s is not an object with a string type",
                            rd->file, where);
    return t;
}

/* Replace's pattern {"String": from} and content to. */
static fa_status replace_of(const reader *rd, const cJSON *o, const char *where, const char *from, const char *to)
{
    const char *p = cJSON_GetStringValue(item(item(o, "pattern"), "String"));
    const char *c = cJSON_GetStringValue(item(o, "content"));
    if (!p || !c || strcmp(p, from) != 0 || strcmp(c, to) != 0)
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED,
                             "'%s': %s Replace must have pattern {\"String\": \"%s\"} and content \"%s\"", rd->file,
                             where, from, to);
    return FA_OK;
}

/* The steps of a normalizer, decoder or post_processor o of type ty: o itself, or the items of a
 * Sequence's array o[key] (where.key names it in messages). Iterate with
 * for (one = *first; one; one = *list == o ? NULL : one->next). */
static fa_status steps_of(const reader *rd, const cJSON *o, const char *ty, const char *where, const char *key,
                          const cJSON **list, const cJSON **first)
{
    *list = *first = o;
    if (strcmp(ty, "Sequence") != 0)
        return FA_OK;
    *list = item(o, key);
    if (!cJSON_IsArray(*list))
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT, "'%s': %s.%s is missing or not an array", rd->file,
                             where, key);
    *first = (*list)->child;
    return FA_OK;
}

static fa_status read_normalizer(const reader *rd, const cJSON *n, fa_tok_bpe *b)
{
    if (!n)
        return FA_OK;
    fa_status st;
    const char *t = type_of(rd, n, "normalizer", &st);
    if (!t)
        return st;
    const cJSON *list, *one;
    if ((st = steps_of(rd, n, t, "normalizer", "normalizers", &list, &one)) != FA_OK)
        return st;
    for (; one; one = list == n ? NULL : one->next) {
        if (!(t = type_of(rd, one, "a normalizer", &st)))
            return st;
        if (strcmp(t, "Prepend") == 0) {
            if ((st = want_string(rd, one, "normalizer Prepend's ", "prepend", META, 0)) != FA_OK)
                return st;
            if (b->prepend++)
                return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': normalizer: Prepend twice is not supported",
                                     rd->file);
        } else if (strcmp(t, "Replace") == 0) {
            if ((st = replace_of(rd, one, "normalizer", " ", META)) != FA_OK)
                return st;
            b->replace = 1;
        } else {
            return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED,
                                 "'%s': normalizer type '%.40s' is not supported (Prepend \"" META
                                 "\", Replace \" \" by \"" META "\", a Sequence of them)",
                                 rd->file, t);
        }
    }
    return FA_OK;
}

/* Metaspace's prepend scheme: 1 never, 2 first, 3 always (add_prefix_space in older files). */
static fa_status metaspace_scheme(const reader *rd, const cJSON *o, const char *where, int *scheme)
{
    fa_status st = want_string(rd, o, where, "replacement", META, 0);
    if (st != FA_OK)
        return st;
    const cJSON *ps = item(o, "prepend_scheme");
    if (ps) {
        const char *s = cJSON_GetStringValue(ps);
        *scheme = !s ? 0 : strcmp(s, "never") == 0 ? 1 : strcmp(s, "first") == 0 ? 2 : strcmp(s, "always") == 0 ? 3 : 0;
        if (!*scheme)
            return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE,
                                 "'%s': %sprepend_scheme must be \"always\", \"first\" or \"never\"", rd->file, where);
        return FA_OK;
    }
    int add = 1;
    if ((st = get_bool(rd, o, where, "add_prefix_space", 1, &add)) != FA_OK)
        return st;
    *scheme = add ? 3 : 1;
    return FA_OK;
}

/* A ByteLevel pre-tokenizer: pieces spelled in the byte alphabet; its own pattern (GPT-2's)
 * when use_regex, which must be false after a Split. */
static fa_status read_byte_level(const reader *rd, const cJSON *o, const char *where, int after_split, fa_tok_bpe *b)
{
    int prefix = 1, regex = 1;
    fa_status st;
    if ((st = get_bool(rd, o, where, "add_prefix_space", 1, &prefix)) ||
        (st = get_bool(rd, o, where, "use_regex", 1, &regex)))
        return st;
    if (prefix)
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': %sadd_prefix_space true is not supported (Llama 3's "
                             "is false)", rd->file, where);
    if (regex && after_split)
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': %suse_regex true after a Split is not supported",
                             rd->file, where);
    b->bytelevel = 1;
    if (!regex)
        return FA_OK;
    char why[200];
    if ((st = fa_tok_split_compile(NULL, 0, 0, &b->split, why, sizeof(why))) != FA_OK)
        return fa_model_fail(rd->err, st, "'%s': %sGPT-2's pattern: %s", rd->file, where, why);
    return FA_OK;
}

/* A Split pre-tokenizer whose matches and the text between them are the pieces: pattern
 * {"Regex": ...} or {"String": ...}, behavior Isolated, invert false. */
static fa_status read_split(const reader *rd, const cJSON *o, fa_tok_bpe *b)
{
    const cJSON *pat = item(o, "pattern");
    const char *re = cJSON_GetStringValue(item(pat, "Regex")), *lit = cJSON_GetStringValue(item(pat, "String"));
    int invert = 0;
    fa_status st;
    if (!re && !lit)
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT,
                             "'%s': pre_tokenizer Split's pattern must be {\"Regex\": ...} or {\"String\": ...}", rd->file);
    if ((st = want_string(rd, o, "pre_tokenizer Split's ", "behavior", "Isolated", 0)) ||
        (st = get_bool(rd, o, "pre_tokenizer Split's ", "invert", 0, &invert)))
        return st;
    if (invert)
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': pre_tokenizer Split's invert true is not supported",
                             rd->file);
    char why[200];
    const char *text = re ? re : lit;
    if ((st = fa_tok_split_compile(text, strlen(text), !re, &b->split, why, sizeof(why))) != FA_OK)
        return fa_model_fail(rd->err, st, "'%s': pre_tokenizer Split's pattern %s", rd->file, why);
    return FA_OK;
}

static fa_status read_pre_tokenizer(const reader *rd, const cJSON *p, fa_tok_bpe *b)
{
    if (!p)
        return FA_OK;
    fa_status st;
    const char *t = type_of(rd, p, "pre_tokenizer", &st);
    if (!t)
        return st;
    if (strcmp(t, "ByteLevel") == 0)
        return read_byte_level(rd, p, "pre_tokenizer ByteLevel's ", 0, b);
    if (strcmp(t, "Sequence") == 0) { /* Llama 3: a regex Split, then ByteLevel */
        const cJSON *list = item(p, "pretokenizers");
        const char *t0 = NULL, *t1 = NULL;
        if (cJSON_GetArraySize(list) == 2) {
            t0 = type_of(rd, list->child, "pre_tokenizer.pretokenizers[0]", &st);
            t1 = t0 ? type_of(rd, list->child->next, "pre_tokenizer.pretokenizers[1]", &st) : NULL;
        }
        if (!cJSON_IsArray(list) || !t0 || !t1 || strcmp(t0, "Split") || strcmp(t1, "ByteLevel"))
            return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED,
                                 "'%s': pre_tokenizer Sequence must be a Split then ByteLevel (Llama 3's)", rd->file);
        if ((st = read_split(rd, list->child, b)) != FA_OK)
            return st;
        return read_byte_level(rd, list->child->next, "pre_tokenizer ByteLevel's ", 1, b);
    }
    if (strcmp(t, "Metaspace") != 0)
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED,
                             "'%s': pre_tokenizer type '%.40s' is not supported: Metaspace (Llama 2's sentencepiece "
                             "BPE), ByteLevel alone or after a Split (Llama 3's byte-level BPE), or none",
                             rd->file, t);
    if ((st = metaspace_scheme(rd, p, "pre_tokenizer.", &b->metaspace)) != FA_OK)
        return st;
    return get_bool(rd, p, "pre_tokenizer.", "split", 1, &b->meta_split);
}

static fa_status read_decoder(const reader *rd, const cJSON *d, fa_tokenizer *t, int *replace, int *bytes,
                              int *bytelevel)
{
    *replace = *bytes = *bytelevel = 0;
    t->strip_after_bos = 0;
    if (!d) /* HF joins the tokens with spaces then: not a sentencepiece tokenizer's text */
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED,
                             "'%s': decoder is missing (Replace \"" META "\" by \" \", ByteFallback, Fuse, Strip, "
                             "Metaspace or ByteLevel are read)",
                             rd->file);
    fa_status st;
    const char *ty = type_of(rd, d, "decoder", &st);
    if (!ty)
        return st;
    const cJSON *list, *one;
    if ((st = steps_of(rd, d, ty, "decoder", "decoders", &list, &one)) != FA_OK)
        return st;
    for (; one; one = list == d ? NULL : one->next) {
        if (!(ty = type_of(rd, one, "a decoder", &st)))
            return st;
        if (strcmp(ty, "Replace") == 0) {
            if ((st = replace_of(rd, one, "decoder", META, " ")) != FA_OK)
                return st;
            *replace = 1;
        } else if (strcmp(ty, "ByteFallback") == 0) {
            *bytes = 1;
        } else if (strcmp(ty, "Fuse") == 0) {
            continue; /* the runner's text is the pieces back to back already */
        } else if (strcmp(ty, "Strip") == 0) {
            const cJSON *start = item(one, "start"), *stop = item(one, "stop");
            const double s = cJSON_IsNumber(start) ? start->valuedouble : -1;
            if ((st = want_string(rd, one, "decoder Strip's ", "content", " ", 0)) != FA_OK)
                return st;
            if (!(s >= 0 && s <= 64 && s == floor(s)) || !cJSON_IsNumber(stop) || stop->valuedouble != 0)
                return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED,
                                     "'%s': decoder Strip must have an integer start in 0..64 and stop 0", rd->file);
            if (!*replace)
                return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED,
                                     "'%s': decoder Strip before Replace (\"" META "\" by \" \") is not supported",
                                     rd->file);
            t->strip_after_bos = (int32_t)s;
        } else if (strcmp(ty, "ByteLevel") == 0) {
            *bytelevel = 1; /* its options shape offsets only */
        } else if (strcmp(ty, "Metaspace") == 0) {
            int scheme;
            if ((st = metaspace_scheme(rd, one, "decoder.", &scheme)) != FA_OK)
                return st;
            *replace = 1;
            t->strip_after_bos = scheme != 1;
        } else {
            return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED,
                                 "'%s': decoder type '%.40s' is not supported (Replace, ByteFallback, Fuse, Strip, "
                                 "Metaspace, ByteLevel)",
                                 rd->file, ty);
        }
    }
    if (*bytelevel != t->bpe->bytelevel || (*bytelevel && (*replace || *bytes || t->strip_after_bos)))
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED,
                             "'%s': decoder: %s", rd->file,
                             *bytelevel != t->bpe->bytelevel
                                 ? "a ByteLevel pre_tokenizer and the ByteLevel decoder go together (one without the "
                                   "other spells bytes as letters)"
                                 : "ByteLevel with Replace, ByteFallback, Strip or Metaspace is not supported");
    return FA_OK;
}

/* An id field: an integer in 0..vocab_size-1. */
static fa_status get_id(const reader *rd, const cJSON *v, int32_t vocab_size, const char *what, int32_t *id)
{
    const double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(d >= 0 && d < vocab_size && d == floor(d)))
        return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE,
                             "'%s': %s: the id must be an integer in 0..%d (the model's vocab_size is %d)", rd->file,
                             what, (int)vocab_size - 1, (int)vocab_size);
    *id = (int32_t)d;
    return FA_OK;
}

typedef struct parsed {
    const char **piece;  /* [vocab] each id's string inside the cJSON tree, NULL where unassigned */
    int32_t n;           /* 1 + the largest id */
} parsed;

/* Assign id its piece s (where names it in messages), refusing a second string for one id. */
static fa_status assign(const reader *rd, parsed *p, int32_t id, const char *s, const char *where)
{
    if (p->piece[id] && strcmp(p->piece[id], s) != 0)
        return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': %s gives id %d to '%.40s', which is '%.40s'",
                             rd->file, where, (int)id, s, p->piece[id]);
    p->piece[id] = s;
    if (id >= p->n)
        p->n = id + 1;
    return FA_OK;
}

static fa_status read_vocab(const reader *rd, const cJSON *vocab, int32_t vocab_size, parsed *p, uint8_t *in_model)
{
    if (!cJSON_IsObject(vocab))
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT, "'%s': model.vocab is missing or not an object", rd->file);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = 0;
        char what[96];
        snprintf(what, sizeof(what), "model.vocab['%.40s']", e->string);
        fa_status st = get_id(rd, e, vocab_size, what, &id);
        if (st != FA_OK)
            return st;
        if (!*e->string || !fa_tok_valid_utf8(e->string, strlen(e->string)))
            return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': model.vocab's token of id %d is %s", rd->file,
                                 (int)id, *e->string ? "not valid UTF-8" : "empty");
        if (p->piece[id])
            return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': model.vocab gives id %d to both '%.40s' and '%.40s'",
                                 rd->file, (int)id, p->piece[id], e->string);
        if ((st = assign(rd, p, id, e->string, "model.vocab")) != FA_OK)
            return st;
        in_model[id] = 1;
    }
    return FA_OK;
}

/* added_tokens[k] (e) into p and b; seen marks the ids taken so far. */
static fa_status read_added_one(const reader *rd, const cJSON *e, int k, int32_t vocab_size, parsed *p,
                                fa_tok_bpe *b, uint8_t *special, uint8_t *seen)
{
    char what[48];
    snprintf(what, sizeof(what), "added_tokens[%d]", k);
    const char *content = cJSON_GetStringValue(item(e, "content"));
    int32_t id = 0;
    int sw = 0, ls = 0, rs = 0, sp = 0, norm = 0;
    fa_status st;
    if (!content || !*content || !fa_tok_valid_utf8(content, strlen(content)))
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT,
                             "'%s': %s.content is missing, empty or not a valid UTF-8 string", rd->file, what);
    if (!item(e, "id"))
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT, "'%s': %s.id is missing", rd->file, what);
    char field[56];
    snprintf(field, sizeof(field), "%s.", what);
    if ((st = get_id(rd, item(e, "id"), vocab_size, what, &id)) ||
        (st = get_bool(rd, e, field, "special", 0, &sp)) || (st = get_bool(rd, e, field, "single_word", 0, &sw)) ||
        (st = get_bool(rd, e, field, "lstrip", 0, &ls)) || (st = get_bool(rd, e, field, "rstrip", 0, &rs)) ||
        (st = get_bool(rd, e, field, "normalized", !sp, &norm)))
        return st;
    if (sw || norm)
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': %s ('%.40s'): %s true is not supported", rd->file,
                             what, content, sw ? "single_word" : "normalized");
    if (seen[id])
        return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': %s repeats id %d", rd->file, what, (int)id);
    seen[id] = 1;
    if ((st = assign(rd, p, id, content, what)) != FA_OK)
        return st;
    special[id] = (uint8_t)sp;
    b->added[b->n_added++] = (added_token){ id, (uint8_t)ls, (uint8_t)rs };
    b->added_first[(unsigned char)content[0] >> 3] |= (uint8_t)(1u << ((unsigned char)content[0] & 7));
    return FA_OK;
}

static fa_status read_added(const reader *rd, const cJSON *list, int32_t vocab_size, parsed *p, fa_tok_bpe *b,
                            uint8_t *special)
{
    if (!list)
        return FA_OK;
    if (!cJSON_IsArray(list))
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT, "'%s': added_tokens is not an array", rd->file);
    int count = cJSON_GetArraySize(list);
    if (count > vocab_size)
        return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': added_tokens has %d entries, more than vocab_size (%d)",
                             rd->file, count, (int)vocab_size);
    b->added = malloc(sizeof(added_token) * (size_t)(count > 0 ? count : 1));
    uint8_t *seen = calloc((size_t)vocab_size, 1); /* the ids so far: a repeat found in O(1) */
    if (!b->added || !seen) {
        free(seen);
        return fa_model_fail(rd->err, FA_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", rd->file);
    }
    fa_status st = FA_OK;
    int k = 0;
    for (const cJSON *e = list->child; e && st == FA_OK; e = e->next, k++)
        st = read_added_one(rd, e, k, vocab_size, p, b, special, seen);
    free(seen);
    return st;
}

/* The pieces into t's table (text bytes in all, checked to fit 32-bit offsets) and their
 * decoded forms ("▁" as a space when replace, bytes when bytelevel); 0 when out of memory. */
static int build_table(fa_tokenizer *t, const parsed *p, size_t text, int replace, int bytelevel)
{
    uint32_t o = 0, so = 0;
    t->shown = malloc(text);
    t->shown_offset = malloc(sizeof(uint32_t) * ((size_t)t->vocab_size + 1));
    if (!t->shown || !t->shown_offset)
        return 0;
    for (int32_t id = 0; id < t->vocab_size; id++) {
        const char *s = id < p->n ? p->piece[id] : "";
        const size_t len = strlen(s);
        if (len > (size_t)t->max_token_length)
            t->max_token_length = (int32_t)len;
        t->offset[id] = o;
        memcpy(t->text + o, s, len + 1);
        o += (uint32_t)len + 1;
        t->shown_offset[id] = so;
        if (bytelevel)
            so += (uint32_t)fa_tok_bytes_read(s, len, t->shown + so);
        for (size_t i = 0; i < len && !bytelevel;) {
            if (replace && strncmp(s + i, META, META_LEN) == 0) {
                t->shown[so++] = ' ';
                i += META_LEN;
            } else {
                t->shown[so++] = s[i++];
            }
        }
        t->shown[so++] = 0;
    }
    t->offset[t->vocab_size] = o;
    t->shown_offset[t->vocab_size] = so;
    return 1;
}

/* One merges entry: "a b" (one space) or ["a", "b"]. */
static int merge_pair(const cJSON *e, const char **a, size_t *la, const char **b, size_t *lb)
{
    if (cJSON_IsString(e)) {
        const char *s = e->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return 0;
        *a = s, *la = (size_t)(sp - s), *b = sp + 1, *lb = strlen(sp + 1);
        return 1;
    }
    if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
        *a = e->child->valuestring, *la = strlen(*a), *b = e->child->next->valuestring, *lb = strlen(*b);
        return 1;
    }
    return 0;
}

static fa_status read_merges(const reader *rd, const cJSON *merges, fa_tokenizer *t)
{
    fa_tok_bpe *b = t->bpe;
    if (!cJSON_IsArray(merges))
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT, "'%s': model.merges is missing or not an array", rd->file);
    const int n = cJSON_GetArraySize(merges);
    if ((int64_t)n > 4 * (int64_t)t->vocab_size + 64)
        return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': model.merges has %d entries for %d tokens", rd->file,
                             n, (int)t->vocab_size);
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)n)
        cap *= 2;
    b->mask = (uint32_t)(cap - 1);
    b->keys = malloc(sizeof(uint64_t) * cap);
    b->rank = malloc(sizeof(int32_t) * cap);
    b->merged = malloc(sizeof(int32_t) * cap);
    char *both = malloc(2 * (size_t)t->max_token_length + 1);
    if (!b->keys || !b->rank || !b->merged || !both) {
        free(both);
        return fa_model_fail(rd->err, FA_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", rd->file);
    }
    memset(b->keys, 0xFF, sizeof(uint64_t) * cap);
    fa_status st = FA_OK;
    int r = 0;
    for (const cJSON *e = merges->child; e && st == FA_OK; e = e->next, r++) {
        const char *x, *y;
        size_t lx, ly;
        if (!merge_pair(e, &x, &lx, &y, &ly)) {
            st = fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT,
                               "'%s': model.merges[%d] must be \"a b\" (one space) or [\"a\", \"b\"]", rd->file, r);
            break;
        }
        if (cJSON_IsString(e) != cJSON_IsString(merges->child)) { /* as HF: one form a file */
            st = fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT,
                               "'%s': model.merges[%d] is %s where merges[0] is %s: one form a file", rd->file, r,
                               cJSON_IsString(e) ? "a string" : "an array", cJSON_IsString(e) ? "an array" : "a string");
            break;
        }
        const int32_t a = fa_tok_model_lookup(t, x, lx), c = fa_tok_model_lookup(t, y, ly);
        int32_t m = -1;
        if (a >= 0 && c >= 0 && lx + ly <= 2 * (size_t)t->max_token_length) {
            memcpy(both, x, lx);
            memcpy(both + lx, y, ly);
            m = fa_tok_model_lookup(t, both, lx + ly);
        }
        if (m < 0) {
            st = fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': model.merges[%d] ('%.*s' '%.*s'): %s is not in model.vocab",
                               rd->file, r, (int)(lx < 40 ? lx : 40), x, (int)(ly < 40 ? ly : 40), y,
                               a < 0 ? "the left part" : c < 0 ? "the right part" : "their concatenation");
            break;
        }
        if (fa_tok_merge_find(b, a, c) >= 0) {
            st = fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': model.merges[%d] ('%.40s' '%.40s') is there twice",
                               rd->file, r, t->text + t->offset[a], t->text + t->offset[c]);
            break;
        }
        const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)c;
        uint64_t i = fa_tok_hash64(key) & b->mask;
        while (b->keys[i] != EMPTY_KEY)
            i = (i + 1) & b->mask;
        b->keys[i] = key, b->rank[i] = r, b->merged[i] = m;
    }
    free(both);
    return st;
}

static fa_status read_model(const reader *rd, const cJSON *model, fa_tok_bpe *b)
{
    if (!cJSON_IsObject(model))
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT, "'%s': model is missing or not an object", rd->file);
    const char *type = cJSON_GetStringValue(item(model, "type"));
    if (!type)
        return fa_model_fail(rd->err, FA_ERR_INVALID_ARGUMENT, "'%s': model.type is missing or not a string", rd->file);
    if (strcmp(type, "BPE") != 0)
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': model.type '%.40s' is not supported (BPE)", rd->file, type);
    const cJSON *drop = item(model, "dropout");
    if (drop && !(cJSON_IsNumber(drop) && drop->valuedouble == 0))
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': model.dropout is not supported (it makes encoding random)",
                             rd->file);
    const char *affix[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (int k = 0; k < 2; k++) {
        const cJSON *v = item(model, affix[k]);
        if (v && !(cJSON_IsString(v) && !*v->valuestring))
            return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': model.%s is not supported (null only)", rd->file,
                                 affix[k]);
    }
    fa_status st;
    if ((st = get_bool(rd, model, "model.", "byte_fallback", 0, &b->byte_fallback)) ||
        (st = get_bool(rd, model, "model.", "fuse_unk", 0, &b->fuse_unk)) ||
        (st = get_bool(rd, model, "model.", "ignore_merges", 0, &b->ignore_merges)))
        return st;
    return FA_OK;
}

/* Byte-level files: the BOS that HF's post_processor puts first (TemplateProcessing, alone or
 * in a Sequence beside ByteLevel's, whose options shape offsets only): its single template
 * must be [$A] (no BOS: -1) or [special token, $A]. */
static fa_status read_bos(const reader *rd, const cJSON *pp, int32_t vocab_size, const uint8_t *special, int32_t *bos)
{
    *bos = -1;
    if (!pp)
        return FA_OK;
    fa_status st;
    const char *ty = type_of(rd, pp, "post_processor", &st);
    if (!ty)
        return st;
    const cJSON *list, *one, *tp = NULL;
    if ((st = steps_of(rd, pp, ty, "post_processor", "processors", &list, &one)) != FA_OK)
        return st;
    for (; one; one = list == pp ? NULL : one->next) {
        if (!(ty = type_of(rd, one, "a post_processor", &st)))
            return st;
        if (strcmp(ty, "TemplateProcessing") == 0 && tp)
            return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': post_processor: a second TemplateProcessing is "
                                 "not supported", rd->file);
        if (strcmp(ty, "TemplateProcessing") == 0)
            tp = one;
        else if (strcmp(ty, "ByteLevel") != 0)
            return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': post_processor '%.40s' is not supported "
                                 "(one TemplateProcessing, ByteLevel)", rd->file, ty);
    }
    if (!tp)
        return FA_OK;
    const cJSON *single = item(tp, "single");
    const int n = cJSON_IsArray(single) ? cJSON_GetArraySize(single) : 0;
    const cJSON *first = n ? single->child : NULL, *last = n == 2 ? first->next : first;
    const char *a = cJSON_GetStringValue(item(item(last, "Sequence"), "id"));
    const char *name = n == 2 ? cJSON_GetStringValue(item(item(first, "SpecialToken"), "id")) : NULL;
    if ((n != 1 && n != 2) || !a || strcmp(a, "A") != 0 || (n == 2 && !name))
        return fa_model_fail(rd->err, FA_ERR_UNSUPPORTED, "'%s': post_processor's single template must be [$A] or "
                             "[a special token, $A]", rd->file);
    if (n == 1)
        return FA_OK;
    const cJSON *ids = item(item(item(tp, "special_tokens"), name), "ids");
    char what[96];
    snprintf(what, sizeof(what), "post_processor.special_tokens['%.40s'].ids[0]", name);
    if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) != 1)
        return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': post_processor.special_tokens['%.40s'].ids must "
                             "hold one id", rd->file, name);
    if ((st = get_id(rd, ids->child, vocab_size, what, bos)) != FA_OK)
        return st;
    if (!special[*bos])
        return fa_model_fail(rd->err, FA_ERR_INVALID_VALUE, "'%s': %s (%d) is not a special token of added_tokens",
                             rd->file, what, (int)*bos);
    return FA_OK;
}

fa_status fa_tokenizer_from_json(const char *file, const char *json, size_t bytes, int32_t vocab_size,
                                 fa_tokenizer **out, char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!json)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "tokenizer.json text is NULL");
    if (!file)
        file = "tokenizer.json";
    if (vocab_size < 3)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                             "vocab_size (%d) must be at least 3: ids 0..2 are <unk>, BOS and EOS", (int)vocab_size);
    reader rd = { file, err };
    fa_status st;
    /* merges (up to 4 a token, 3 values each as pairs), the vocabulary and added tokens (8
     * values each), the pipeline's few hundred */
    cJSON *j = fa_json_object(json, bytes, 24 * (size_t)vocab_size + 65536, file, "", &st, err);
    if (!j)
        return st;
    fa_tokenizer *t = NULL;
    parsed p = { calloc((size_t)vocab_size, sizeof(char *)), 0 };
    uint8_t *special = calloc((size_t)vocab_size, 1);
    fa_tok_bpe *b = calloc(1, sizeof(*b));
    int replace = 0, dec_bytes = 0, dec_bytelevel = 0;
    int32_t bos = FA_TOKEN_BOS;
    if (!p.piece || !special || !b || !(b->in_model = calloc((size_t)vocab_size, 1))) {
        st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", file);
        goto done;
    }
    const cJSON *model = item(j, "model");
    if ((st = read_model(&rd, model, b)) || (st = read_normalizer(&rd, item(j, "normalizer"), b)) ||
        (st = read_pre_tokenizer(&rd, item(j, "pre_tokenizer"), b)) ||
        (st = read_vocab(&rd, item(model, "vocab"), vocab_size, &p, b->in_model)) ||
        (st = read_added(&rd, item(j, "added_tokens"), vocab_size, &p, b, special)))
        goto done;
    if (b->bytelevel && (b->prepend || b->replace || b->byte_fallback)) {
        st = fa_model_fail(err, FA_ERR_UNSUPPORTED, "'%s': %s with a ByteLevel pre_tokenizer is not supported", file,
                           b->byte_fallback ? "model.byte_fallback true (every byte has its piece already)"
                                            : "normalizer: Prepend or Replace");
        goto done;
    }
    if (b->bytelevel && (st = read_bos(&rd, item(j, "post_processor"), vocab_size, special, &bos)) != FA_OK)
        goto done;
    if (!b->bytelevel && (!special[FA_TOKEN_BOS] || !special[FA_TOKEN_EOS])) {
        st = fa_model_fail(err, FA_ERR_INVALID_VALUE,
                           "'%s': the runner starts sequences with id 1 and stops at id 2: added_tokens must hold "
                           "both as special tokens",
                           file);
        goto done;
    }
    for (int32_t id = 0; id < p.n; id++)
        if (!p.piece[id]) {
            st = fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': id %d is in neither model.vocab nor added_tokens (ids "
                               "must run 0..%d without gaps)", file, (int)id, (int)p.n - 1);
            goto done;
        }
    size_t text = 0;
    for (int32_t id = 0; id < vocab_size; id++)
        text += (id < p.n ? strlen(p.piece[id]) : 0) + 1;
    if (text > UINT32_MAX) {
        st = fa_model_fail(err, FA_ERR_SIZE_OVERFLOW, "'%s': the tokens exceed 4 GiB", file);
        goto done;
    }
    if (!(t = fa_tok_alloc(vocab_size, text))) {
        st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", file);
        goto done;
    }
    t->bpe = b;
    if (b->bytelevel) /* the ids of the template's BOS; EOS is the model's (config.json) */
        t->bos_id = bos, t->eos_id = -1;
    if ((st = read_decoder(&rd, item(j, "decoder"), t, &replace, &dec_bytes, &dec_bytelevel)) != FA_OK)
        goto done;
    if (!build_table(t, &p, text, replace, dec_bytelevel)) {
        st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", file);
        goto done;
    }
    if ((st = fa_tok_index(t, dec_bytes, err)) != FA_OK)
        goto done;
    for (int32_t i = 1; i < vocab_size; i++) {
        const int32_t x = t->sorted[i - 1], y = t->sorted[i];
        if (x < p.n && y < p.n && strcmp(t->text + t->offset[x], t->text + t->offset[y]) == 0) {
            st = fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': token '%.40s' is there twice (ids %d and %d)", file,
                               t->text + t->offset[x], (int)x, (int)y);
            goto done;
        }
    }
    /* HF numbers the added tokens outside model.vocab itself, in the file's order, from the
     * size of model.vocab on (the ids written beside them only draw a warning): ids that
     * differ would make its encoding and this one disagree */
    int32_t next_id = 0;
    for (int32_t id = 0; id < vocab_size; id++)
        next_id += b->in_model[id];
    for (int32_t k = 0; k < b->n_added; k++) {
        const int32_t id = b->added[k].id;
        if (b->in_model[id])
            continue;
        if (id != next_id) {
            st = fa_model_fail(err, FA_ERR_INVALID_VALUE,
                               "'%s': added_tokens[%d] ('%.40s') has id %d, but HF numbers the added tokens outside "
                               "model.vocab from its size on: %d",
                               file, (int)k, t->text + t->offset[id], (int)id, (int)next_id);
            goto done;
        }
        next_id++;
    }
    if ((st = read_merges(&rd, item(model, "merges"), t)) != FA_OK)
        goto done;
    const char *unk = cJSON_GetStringValue(item(model, "unk_token"));
    b->unk = unk ? fa_tok_model_lookup(t, unk, strlen(unk)) : -1;
    if (item(model, "unk_token") && b->unk < 0) {
        st = fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': model.unk_token %s%.40s%s is not in model.vocab", file,
                           unk ? "'" : "", unk ? unk : "(not a string)", unk ? "'" : "");
        goto done;
    }
    for (int v = 0; v < 256; v++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", v);
        b->byte_id[v] = fa_tok_model_lookup(t, name, 6);
    }
    if (!(b->source = malloc(bytes + 1))) {
        st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", file);
        goto done;
    }
    memcpy(b->source, json, bytes);
    b->source_len = bytes;
done:
    cJSON_Delete(j);
    free(p.piece);
    free(special);
    if (st != FA_OK) {
        if (t)
            fa_tokenizer_free(t);
        else
            fa_tok_bpe_free(b);
        return st;
    }
    *out = t;
    return FA_OK;
}

