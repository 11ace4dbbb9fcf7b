/* SPDX-License-Identifier: MIT */
/* llama2.c's tokenizer: byte-level BPE with byte fallback, encoded as run.c does; the
 * vocabulary table and decoding that tokenizer.json's reader (tokenizer_json.c) shares. */
#include "fail.h"
#include "tok_heap.h"
#include "tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Longest piece we accept: llama2.c's vocabularies stay under 32 bytes. */
#define MAX_PIECE 65536

static int32_t rd_i32(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, 4);
    return v;
}

static int cmp_piece(const fa_tokenizer *t, const char *s, size_t n, int32_t id)
{
    size_t m = fa_tok_len(t, id);
    int c = memcmp(s, t->text + t->offset[id], n < m ? n : m);
    return c ? c : (n > m) - (n < m);
}

static const fa_tokenizer *sort_ctx; /* qsort has no user pointer in C11 */
static int cmp_ids(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const fa_tokenizer *t = sort_ctx;
    int c = cmp_piece(t, t->text + t->offset[x], fa_tok_len(t, x), y);
    return c ? c : (x > y) - (x < y);
}

int32_t fa_tok_lookup(const fa_tokenizer *t, const char *s, size_t n)
{
    int32_t lo = 0, hi = t->vocab_size;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (cmp_piece(t, s, n, t->sorted[mid]) > 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < t->vocab_size && cmp_piece(t, s, n, t->sorted[lo]) == 0 ? t->sorted[lo] : -1;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                        : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

void fa_tokenizer_free(fa_tokenizer *t)
{
    if (!t)
        return;
    if (t->shown != t->text)
        free(t->shown);
    if (t->shown_offset != t->offset)
        free(t->shown_offset);
    free(t->scores);
    free(t->offset);
    free(t->text);
    free(t->sorted);
    free(t->byte_of);
    fa_tok_bpe_free(t->bpe);
    free(t);
}

int32_t fa_tokenizer_vocab_size(const fa_tokenizer *t)
{
    return t ? t->vocab_size : 0;
}

fa_tokenizer *fa_tok_alloc(int32_t vocab_size, size_t text_bytes)
{
    fa_tokenizer *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->vocab_size = vocab_size;
    t->bos_id = FA_TOKEN_BOS;
    t->eos_id = FA_TOKEN_EOS;
    t->offset = malloc(((size_t)vocab_size + 1) * sizeof(uint32_t));
    t->text = malloc(text_bytes ? text_bytes : 1);
    if (!t->offset || !t->text) {
        fa_tokenizer_free(t);
        return NULL;
    }
    return t;
}

fa_status fa_tok_index(fa_tokenizer *t, int byte_pieces, char *err)
{
    size_t nv = (size_t)t->vocab_size;
    t->sorted = malloc(nv * sizeof(int32_t));
    t->byte_of = malloc(nv * sizeof(int16_t));
    if (!t->sorted || !t->byte_of)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the tokenizer");
    for (int32_t id = 0; id < t->vocab_size; id++) {
        const char *s = t->text + t->offset[id];
        int hi, lo;
        t->byte_of[id] = byte_pieces && fa_tok_len(t, id) == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
                                 (hi = hexval(s[3])) >= 0 && (lo = hexval(s[4])) >= 0
                             ? (int16_t)(hi * 16 + lo)
                             : -1;
        t->sorted[id] = id;
    }
    for (int b = 0; b < 256; b++) {
        t->bytes[2 * b] = (char)b;
        t->bytes[2 * b + 1] = 0;
    }
    if (!t->shown) {
        t->shown = t->text;
        t->shown_offset = t->offset;
    }
    sort_ctx = t;
    qsort(t->sorted, nv, sizeof(int32_t), cmp_ids);
    sort_ctx = NULL;
    return FA_OK;
}

fa_status fa_tokenizer_from_memory(const void *data, size_t bytes, int32_t vocab_size,
                                   fa_tokenizer **out, char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!data)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "tokenizer data is NULL");
    if (vocab_size < 3)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                    "vocab_size (%d) must be at least 3: ids 0..2 are <unk>, BOS and EOS",
                    (int)vocab_size);
    const unsigned char *p = data;
    if (bytes < 4)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                    "tokenizer is %zu bytes, shorter than its 4-byte max_token_length", bytes);
    int32_t maxlen = rd_i32(p);
    if (maxlen < 1 || maxlen > MAX_PIECE)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "tokenizer max_token_length (%d) must be in 1..%d",
                    (int)maxlen, MAX_PIECE);
    /* First pass: check every record and size the text. */
    size_t at = 4, text = 0;
    for (int32_t id = 0; id < vocab_size; id++) {
        if (bytes - at < 8)
            return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                        "tokenizer ends inside record %d: it has fewer pieces than the model's "
                        "vocab_size (%d)",
                        (int)id, (int)vocab_size);
        float score;
        memcpy(&score, p + at, 4);
        int32_t len = rd_i32(p + at + 4);
        if (!isfinite(score))
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "tokenizer score of token %d is not finite",
                        (int)id);
        if (len < 0 || len > maxlen)
            return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                        "tokenizer len of token %d (%d) is outside 0..max_token_length (%d)",
                        (int)id, (int)len, (int)maxlen);
        at += 8;
        if (bytes - at < (size_t)len)
            return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                        "tokenizer ends inside the piece of token %d (len %d)", (int)id, (int)len);
        at += (size_t)len;
        text += (size_t)len + 1;
        if (text > UINT32_MAX)
            return fa_model_fail(err, FA_ERR_SIZE_OVERFLOW, "tokenizer pieces exceed 4 GiB");
    }
    if (at != bytes)
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                    "tokenizer has %zu bytes after its last record: it does not match the model's "
                    "vocab_size (%d)",
                    bytes - at, (int)vocab_size);
    fa_tokenizer *t = fa_tok_alloc(vocab_size, text);
    if (!t || !(t->scores = malloc((size_t)vocab_size * sizeof(float)))) {
        fa_tokenizer_free(t);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the tokenizer");
    }
    t->max_token_length = maxlen;
    t->strip_after_bos = 1;
    at = 4;
    uint32_t o = 0;
    for (int32_t id = 0; id < vocab_size; id++) {
        memcpy(&t->scores[id], p + at, 4);
        size_t len = (size_t)rd_i32(p + at + 4);
        at += 8;
        t->offset[id] = o;
        memcpy(t->text + o, p + at, len);
        t->text[o + len] = 0;
        o += (uint32_t)(len + 1);
        at += len;
    }
    t->offset[vocab_size] = o;
    fa_status st = fa_tok_index(t, 1, err);
    if (st != FA_OK) {
        fa_tokenizer_free(t);
        return st;
    }
    *out = t;
    return FA_OK;
}

fa_status fa_tokenizer_open(const char *path, int32_t vocab_size, fa_tokenizer **out, char *err)
{
    if (!out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!path)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "path is NULL");
    unsigned char *buf;
    size_t n;
    /* 128 MiB: four times the largest tokenizers published (Gemma's tokenizer.json, about 33
     * MB); reading a tokenizer.json takes about 40 times its size */
    fa_status st = fa_model_read_file(path, "tokenizer", 128u << 20, FA_ERR_SIZE_OVERFLOW, &buf, &n, err);
    if (st != FA_OK)
        return st;
    size_t pl = strlen(path);
    if (pl >= 5 && strcmp(path + pl - 5, ".json") == 0) {
        st = fa_tokenizer_from_json(path, (const char *)buf, n, vocab_size, out, err);
    } else {
        st = fa_tokenizer_from_memory(buf, n, vocab_size, out, err);
        if (st != FA_OK && st != FA_ERR_OUT_OF_MEMORY && err) { /* the file the record is in */
            char what[FA_MODEL_ERR_LEN];
            snprintf(what, sizeof(what), "'%s': %s", path, err);
            memcpy(err, what, sizeof(what));
        }
        size_t i = 0;
        while (i < n && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t'))
            i++;
        if (st != FA_OK && st != FA_ERR_OUT_OF_MEMORY && i < n && buf[i] == '{' && err) {
            /* read as llama2.c's format by its name: say what else it may be */
            const size_t len = strlen(err);
            snprintf(err + len, FA_MODEL_ERR_LEN > len ? FA_MODEL_ERR_LEN - len : 0,
                     "; '%s' begins like JSON: a Hugging Face tokenizer.json is read from a name ending in .json",
                     path);
        }
    }
    free(buf);
    return st;
}

int32_t fa_tokenizer_bos(const fa_tokenizer *t) { return t ? t->bos_id : -1; }

const char *fa_tokenizer_decode(const fa_tokenizer *t, int32_t prev, int32_t token, size_t *len)
{
    size_t dummy;
    if (!len)
        len = &dummy;
    *len = 0;
    if (!t || token < 0 || token >= t->vocab_size)
        return "";
    if (t->byte_of[token] >= 0) {
        *len = 1;
        return &t->bytes[2 * t->byte_of[token]];
    }
    const char *s = t->shown + t->shown_offset[token];
    size_t n = t->shown_offset[token + 1] - t->shown_offset[token] - 1;
    for (int32_t k = 0; prev == t->bos_id && k < t->strip_after_bos && n > 0 && s[0] == ' '; k++)
        s++, n--;
    *len = n;
    return s;
}

/* The piece the pair at symbols a, b (b follows a) merges into, or -1. */
static int32_t pair_id(const fa_tokenizer *t, const int32_t *tok, int32_t a, int32_t b, char *buf)
{
    const size_t la = t->offset[tok[a] + 1] - t->offset[tok[a]] - 1, lb = t->offset[tok[b] + 1] - t->offset[tok[b]] - 1;
    memcpy(buf, t->text + t->offset[tok[a]], la);
    memcpy(buf + la, t->text + t->offset[tok[b]], lb);
    const int32_t id = fa_tok_lookup(t, buf, la + lb);
    return id >= 0 && t->scores[id] > -INFINITY ? id : -1;
}

/* That pair into the queue where it merges: its score negated, the highest first. */
static void push_pair(const fa_tokenizer *t, const int32_t *tok, int32_t a, int32_t b, char *buf, fa_tok_cand *h,
                      int64_t *len)
{
    const int32_t id = pair_id(t, tok, a, b, buf);
    if (id >= 0)
        fa_tok_heap_push(h, len, (fa_tok_cand){ -(double)t->scores[id], a, id });
}

/* run.c's merges: while some adjacent pair is a token, the one of the highest score (the
 * leftmost of equals) becomes it. Each merge is taken from a heap of the adjacent pairs
 * (entries made stale by a merge beside them are skipped) instead of a scan of all pairs:
 * the same merges in the same order, in O(n log n) rather than O(n^2). Returns the count
 * left in tokens, or -1 out of memory. */
static int32_t merge_pairs(const fa_tokenizer *t, int32_t *tokens, int32_t k, char *buf)
{
    if (k < 2)
        return k;
    /* k - 1 pairs to start; each merge takes one off and pushes at most two: 2 (k - 1) at most */
    int32_t *next = malloc(sizeof(int32_t) * (size_t)k), *prev = malloc(sizeof(int32_t) * (size_t)k);
    fa_tok_cand *h = malloc(sizeof(fa_tok_cand) * 2 * (size_t)k);
    if (!next || !prev || !h) {
        free(next), free(prev), free(h);
        return -1;
    }
    int64_t len = 0;
    for (int32_t i = 0; i < k; i++) {
        next[i] = i + 1 < k ? i + 1 : -1;
        prev[i] = i - 1;
    }
    for (int32_t i = 0; i + 1 < k; i++)
        push_pair(t, tokens, i, i + 1, buf, h, &len);
    while (len > 0) {
        const fa_tok_cand p = fa_tok_heap_pop(h, &len);
        const int32_t at = p.pos, right = next[at];
        if (right < 0 || pair_id(t, tokens, at, right, buf) != p.id)
            continue; /* merged away, or a merge beside it changed the pair */
        tokens[at] = p.id;
        next[at] = next[right];
        if (next[at] >= 0)
            prev[next[at]] = at;
        next[right] = -2; /* merged away: no pair starts or ends here any more */
        if (prev[at] >= 0)
            push_pair(t, tokens, prev[at], at, buf, h, &len);
        if (next[at] >= 0)
            push_pair(t, tokens, at, next[at], buf, h, &len);
    }
    int32_t n = 0;
    for (int32_t i = 0; i >= 0; i = next[i])
        tokens[n++] = tokens[i];
    free(next), free(prev), free(h);
    return n;
}

fa_status fa_tokenizer_encode(const fa_tokenizer *t, const char *text, int bos, int eos,
                              int32_t *tokens, int32_t cap, int32_t *n, char *err)
{
    if (!t || !text || !tokens || !n)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL",
                    !t ? "tokenizer" : !text ? "text" : !tokens ? "tokens" : "n");
    size_t tl = strlen(text);
    if (tl > (size_t)INT32_MAX - 3 || cap < (int32_t)tl + 3)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                    "cap (%d) must be at least strlen(text) + 3 (%zu)", (int)cap, tl + 3);
    if (t->bpe)
        return fa_tok_bpe_encode(t, text, bos, eos, tokens, cap, n, err);
    size_t pair_cap = 2 * (size_t)t->max_token_length;
    char *buf = malloc(pair_cap > 4 ? pair_cap : 4);
    if (!buf)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for encoding");
    int32_t k = 0;
    if (bos)
        tokens[k++] = FA_TOKEN_BOS;
    /* SentencePiece's dummy prefix: the text is encoded as if it began with a space */
    if (tl > 0) {
        int32_t sp = fa_tok_lookup(t, " ", 1);
        tokens[k++] = sp >= 0 ? sp : (' ' + 3 < t->vocab_size ? ' ' + 3 : FA_TOKEN_UNK);
    }
    /* one UTF-8 character (a lead byte and at most three continuation bytes) at a time */
    for (size_t i = 0; i < tl;) {
        size_t len = 1;
        while (i + len < tl && len < 4 && ((unsigned char)text[i + len] & 0xC0) == 0x80)
            len++;
        int32_t id = fa_tok_lookup(t, text + i, len);
        if (id >= 0) {
            tokens[k++] = id;
        } else {
            for (size_t j = 0; j < len; j++) {
                int32_t b = (unsigned char)text[i + j] + 3;
                tokens[k++] = b < t->vocab_size ? b : FA_TOKEN_UNK;
            }
        }
        i += len;
    }
    k = merge_pairs(t, tokens, k, buf);
    if (k < 0) {
        free(buf);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for encoding");
    }
    if (eos)
        tokens[k++] = FA_TOKEN_EOS;
    free(buf);
    *n = k;
    return FA_OK;
}
