/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.json's BPE encoding, as HF's tokenizers library encodes: added tokens split out
 * first, then each segment normalized, pre-tokenized and merged by rank.
 */
#include "fail.h"
#include "tok_heap.h"
#include "tokenizer_bpe.h"

#include <stdlib.h>
#include <string.h>

/* Length of the Unicode White_Space character at s, 0 if none (HF's char::is_whitespace). */
static size_t space_len(const unsigned char *s, size_t n)
{
    if (n >= 1 && (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r')))
        return 1;
    if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0))
        return 2;
    if (n >= 3 && s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80)
        return 3; /* U+1680 */
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x80 && (s[2] <= 0x8A || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF))
        return 3; /* U+2000..200A, 2028, 2029, 202F */
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F)
        return 3; /* U+205F */
    if (n >= 3 && s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80)
        return 3; /* U+3000 */
    return 0;
}

/* A whitespace character ending at s + n (n bytes before it available), 0 if none. */
static size_t space_before(const unsigned char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (space_len(s - k, k) == k)
            return k;
    return 0;
}

uint64_t fa_tok_hash64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return k;
}

int64_t fa_tok_merge_find(const fa_tok_bpe *b, int32_t l, int32_t r)
{
    const uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    for (uint64_t i = fa_tok_hash64(key) & b->mask;; i = (i + 1) & b->mask) {
        if (b->keys[i] == key)
            return (int64_t)i;
        if (b->keys[i] == EMPTY_KEY)
            return -1;
    }
}

int32_t fa_tok_model_lookup(const fa_tokenizer *t, const char *s, size_t n)
{
    int32_t id = n ? fa_tok_lookup(t, s, n) : -1;
    return id >= 0 && t->bpe->in_model[id] ? id : -1;
}

typedef struct sink {
    int32_t *tokens;
    int32_t cap, k;
    int over;
} sink;

static void put(sink *o, int32_t id)
{
    if (o->k < o->cap)
        o->tokens[o->k++] = id;
    else
        o->over = 1;
}

/* One symbol of a word during the merges. */
typedef struct sym {
    int32_t id, prev, next, alive;
} sym;

typedef struct work {
    sym *s;                 /* [bytes of the longest word] */
    fa_tok_cand *heap;      /* [3 x that] */
    fa_tok_matcher *match;  /* byte-level files with a pattern: this call's match state */
} work;

/* HF's BPE takes the lowest rank first, the leftmost among equal ranks. */
static void push_pair(const fa_tok_bpe *b, const sym *s, int32_t pos, fa_tok_cand *h, int64_t *n)
{
    int64_t m = fa_tok_merge_find(b, s[pos].id, s[s[pos].next].id);
    if (m >= 0)
        fa_tok_heap_push(h, n, (fa_tok_cand){ (double)b->rank[m], pos, b->merged[m] });
}

/* HF's BPE of one word (w[0..n), n > 0): its characters as pieces, byte-fallback pieces or
 * unk, then the merges (tokenizers' Word::merge_all). */
static void bpe_word(const fa_tokenizer *t, const char *w, size_t n, work *wk, sink *o)
{
    const fa_tok_bpe *b = t->bpe;
    int32_t id;
    if (b->ignore_merges && (id = fa_tok_model_lookup(t, w, n)) >= 0) {
        put(o, id);
        return;
    }
    sym *s = wk->s;
    int32_t ns = 0, unk_pending = 0;
    for (size_t i = 0; i < n;) {
        size_t len = fa_tok_utf8_len((const unsigned char *)w + i, n - i);
        len = len ? len : 1; /* a byte that starts no UTF-8 character stands alone */
        if ((id = fa_tok_model_lookup(t, w + i, len)) >= 0) {
            if (unk_pending)
                s[ns++].id = b->unk, unk_pending = 0;
            s[ns++].id = id;
        } else {
            int all = b->byte_fallback;
            for (size_t j = 0; j < len && all; j++)
                all = b->byte_id[(unsigned char)w[i + j]] >= 0;
            if (all) {
                /* as HF: a pending unk is not flushed before byte-fallback pieces */
                for (size_t j = 0; j < len; j++)
                    s[ns++].id = b->byte_id[(unsigned char)w[i + j]];
            } else if (b->unk >= 0) {
                if (unk_pending && !b->fuse_unk)
                    s[ns++].id = b->unk;
                unk_pending = 1;
            } /* no unk_token: HF drops the character */
        }
        i += len;
    }
    if (unk_pending)
        s[ns++].id = b->unk;
    for (int32_t i = 0; i < ns; i++)
        s[i].prev = i - 1, s[i].next = i + 1 < ns ? i + 1 : -1, s[i].alive = 1;
    int64_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        push_pair(b, s, i, wk->heap, &nh);
    while (nh > 0) {
        const fa_tok_cand c = fa_tok_heap_pop(wk->heap, &nh);
        if (!s[c.pos].alive || s[c.pos].next < 0)
            continue;
        const int32_t r = s[c.pos].next;
        const int64_t m = fa_tok_merge_find(b, s[c.pos].id, s[r].id);
        if (m < 0 || b->merged[m] != c.id)
            continue; /* stale: a neighbour changed since it was queued */
        s[c.pos].id = c.id;
        s[c.pos].next = s[r].next;
        s[r].alive = 0;
        if (s[r].next >= 0)
            s[s[r].next].prev = c.pos;
        if (s[c.pos].prev >= 0)
            push_pair(b, s, s[c.pos].prev, wk->heap, &nh);
        if (s[c.pos].next >= 0)
            push_pair(b, s, c.pos, wk->heap, &nh);
    }
    for (int32_t i = 0; i < ns; i++)
        if (s[i].alive)
            put(o, s[i].id);
}

/* Byte-level text between added tokens: the pattern's matches and the text between them, each
 * spelled in the byte alphabet and merged (HF's Split "Isolated", then ByteLevel); an empty
 * match splits the text where it stands, and the search goes on a character later (as HF's
 * Oniguruma iteration does). < 0 as fa_tok_split_next. */
static int encode_bytes(const fa_tokenizer *t, const char *s, size_t n, char *buf, work *wk, sink *o)
{
    size_t at = 0, search = 0, from, to;
    while (at < n) {
        const int r = t->bpe->split ? fa_tok_split_next(t->bpe->split, wk->match, s, n, search, &from, &to) : 0;
        if (r < 0)
            return r;
        if (!r)
            from = to = n;
        if (from > at) /* the text before the match is a piece of its own */
            bpe_word(t, buf, fa_tok_bytes_spelled(s + at, from - at, buf), wk, o);
        if (to > from) {
            bpe_word(t, buf, fa_tok_bytes_spelled(s + from, to - from, buf), wk, o);
            at = search = to;
        } else {
            const size_t k = from < n ? fa_tok_utf8_len((const unsigned char *)s + from, n - from) : 1;
            at = from;
            search = from + (k ? k : 1);
        }
    }
    return 0;
}

/* Text between added tokens: normalized (Prepend, Replace), pre-tokenized (Metaspace; byte-level
 * files: encode_bytes), each word through BPE. at_start: the segment begins the text
 * (Metaspace's "first" scheme). < 0 as encode_bytes. */
static int encode_segment(const fa_tokenizer *t, const char *s, size_t n, int at_start, char *buf, work *wk,
                           sink *o)
{
    const fa_tok_bpe *b = t->bpe;
    if (!n)
        return 0;
    if (b->bytelevel)
        return encode_bytes(t, s, n, buf, wk, o);
    size_t m = 0;
    if (b->prepend)
        memcpy(buf, META, META_LEN), m = META_LEN;
    for (size_t i = 0; i < n; i++)
        if (s[i] == ' ' && (b->replace || b->metaspace))
            memcpy(buf + m, META, META_LEN), m += META_LEN;
        else
            buf[m++] = s[i];
    if ((b->metaspace == 3 || (b->metaspace == 2 && at_start)) && (m < META_LEN || memcmp(buf, META, META_LEN) != 0)) {
        memmove(buf + META_LEN, buf, m);
        memcpy(buf, META, META_LEN);
        m += META_LEN;
    }
    if (!b->metaspace || !b->meta_split) {
        bpe_word(t, buf, m, wk, o);
        return 0;
    }
    /* Metaspace's split: each "▁" begins a word (MergedWithNext) */
    size_t w = 0;
    for (size_t i = 1; i + META_LEN <= m; i++)
        if (memcmp(buf + i, META, META_LEN) == 0) {
            bpe_word(t, buf + w, i - w, wk, o);
            w = i;
        }
    bpe_word(t, buf + w, m - w, wk, o);
    return 0;
}

/* The added token matched at s[0..n) (leftmost-longest is the caller's scan), -1 if none. */
static int32_t added_at(const fa_tokenizer *t, const char *s, size_t n, size_t *len)
{
    int32_t best = -1;
    *len = 0;
    const unsigned char c = (unsigned char)s[0];
    if (!(t->bpe->added_first[c >> 3] & (1u << (c & 7)))) /* no added token starts here */
        return -1;
    for (int32_t k = 0; k < t->bpe->n_added; k++) {
        const int32_t id = t->bpe->added[k].id;
        const size_t l = fa_tok_len(t, id);
        if (l <= n && l > *len && memcmp(s, t->text + t->offset[id], l) == 0)
            best = k, *len = l;
    }
    return best;
}

fa_status fa_tok_bpe_encode(const fa_tokenizer *t, const char *text, int bos, int eos, int32_t *tokens,
                            int32_t cap, int32_t *n, char *err)
{
    const size_t tl = strlen(text);
    if (t->bpe->bytelevel && !fa_tok_valid_utf8(text, tl)) /* the pattern runs on characters */
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "text is not valid UTF-8 (a byte-level tokenizer's "
                                                           "pattern matches characters)");
    /* a segment grows by at most "▁" for each space and two prefixes */
    char *buf = malloc(3 * tl + 2 * META_LEN + 1);
    work wk = { malloc(sizeof(sym) * (3 * tl + 2 * META_LEN + 1)), malloc(sizeof(fa_tok_cand) * 3 * (3 * tl + 2 * META_LEN + 1)),
                t->bpe->split ? fa_tok_matcher_new(t->bpe->split) : NULL };
    if (!buf || !wk.s || !wk.heap || (t->bpe->split && !wk.match)) {
        free(buf), free(wk.s), free(wk.heap), fa_tok_matcher_free(wk.match);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for encoding");
    }
    sink o = { tokens, cap, 0, 0 };
    if (bos && t->bos_id >= 0)
        put(&o, t->bos_id);
    size_t seg = 0;
    int bad = 0; /* the pattern failed on the text: encode_bytes's code */
    for (size_t i = 0; i < tl && !bad;) {
        size_t len;
        const int32_t k = added_at(t, text + i, tl - i, &len);
        if (k < 0) {
            i++;
            continue;
        }
        size_t from = i, to = i + len, w;
        if (t->bpe->added[k].lstrip)
            while (from > seg && (w = space_before((const unsigned char *)text + from, from - seg)))
                from -= w;
        if (t->bpe->added[k].rstrip)
            while ((w = space_len((const unsigned char *)text + to, tl - to)))
                to += w;
        bad = encode_segment(t, text + seg, from - seg, seg == 0, buf, &wk, &o);
        put(&o, t->bpe->added[k].id);
        i = seg = to;
    }
    if (!bad)
        bad = encode_segment(t, text + seg, tl - seg, seg == 0, buf, &wk, &o);
    if (eos && t->eos_id >= 0)
        put(&o, t->eos_id);
    free(buf), free(wk.s), free(wk.heap), fa_tok_matcher_free(wk.match);
    if (bad)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "%s",
                             bad == -1 ? "the pre-tokenizer's pattern took more steps or memory than its limits on "
                                         "this text"
                                       : "the pre-tokenizer's pattern failed on this text (a PCRE2 error)");
    if (o.over)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "the text encodes to more than cap (%d) tokens", (int)cap);
    *n = o.k;
    return FA_OK;
}
