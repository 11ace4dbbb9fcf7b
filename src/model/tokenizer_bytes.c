/* SPDX-License-Identifier: MIT */
/*
 * Byte-level BPE's two pieces besides the merges (Llama 3's tokenizer.json, GPT-2's): the
 * pre-tokenizer's regular expression, run by PCRE2 with Unicode properties (\p{L}, \p{N},
 * Unicode \s), and the byte alphabet, which spells every byte as one printable character
 * (HF's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the other 68 take
 * the code points from U+0100 on, in byte order).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer_bpe.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's pattern: what a ByteLevel pre-tokenizer with use_regex splits by. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Backtracking steps a match may take: LIGHT_LIMIT each, and MATCH_LIMIT for HEAVY_MATCHES of
 * an encoding's matches plus one for every HEAVY_BYTES of text that such matches took (the
 * pre-tokenizer patterns of real tokenizers take a few steps a match, or a few a character
 * over a long word, as a repeated group does without the JIT; a pattern from a file that
 * backtracks heavily at every character fails the text's encoding within a bounded time
 * instead of stalling it: a text of n characters takes at most n matches), the JIT's stack
 * and the interpreter's heap: repeated groups over long texts need more than PCRE2's 32 KiB
 * default JIT stack. */
#define LIGHT_LIMIT 10000u
#define MATCH_LIMIT 1000000u
#define HEAVY_MATCHES 16u
#define HEAVY_BYTES 256u
#define JIT_STACK_MAX (16u << 20)
#define HEAP_LIMIT_KIB (64u << 10)

struct fa_tok_split {
    pcre2_code *code;
    int jit; /* compiled for PCRE2's JIT */
};

/* What one encoding call matches with: PCRE2's match data, context and JIT stack are written
 * by every match, so callers sharing a tokenizer each hold their own. */
struct fa_tok_matcher {
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
    pcre2_match_data *md;
    size_t heavy, heavy_bytes; /* matches past LIGHT_LIMIT so far, and the text they took */
};

void fa_tok_split_free(fa_tok_split *s)
{
    if (!s)
        return;
    pcre2_code_free(s->code);
    free(s);
}

void fa_tok_matcher_free(fa_tok_matcher *m)
{
    if (!m)
        return;
    pcre2_match_data_free(m->md);
    pcre2_match_context_free(m->mctx);
    pcre2_jit_stack_free(m->stack);
    free(m);
}

fa_tok_matcher *fa_tok_matcher_new(const fa_tok_split *s)
{
    fa_tok_matcher *m = calloc(1, sizeof(*m));
    if (!m || !(m->mctx = pcre2_match_context_create(NULL)) ||
        !(m->md = pcre2_match_data_create_from_pattern(s->code, NULL))) {
        fa_tok_matcher_free(m);
        return NULL;
    }
    if (s->jit && (m->stack = pcre2_jit_stack_create(32u << 10, JIT_STACK_MAX, NULL)))
        pcre2_jit_stack_assign(m->mctx, NULL, m->stack);
    pcre2_set_match_limit(m->mctx, LIGHT_LIMIT);
    pcre2_set_heap_limit(m->mctx, HEAP_LIMIT_KIB);
    return m;
}

fa_status fa_tok_split_compile(const char *pattern, size_t len, int literal, fa_tok_split **out, char *msg,
                               size_t cap)
{
    *out = NULL;
    if (!pattern)
        pattern = gpt2_pattern, len = sizeof(gpt2_pattern) - 1, literal = 0;
    fa_tok_split *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(msg, cap, "out of memory");
        return FA_ERR_OUT_OF_MEMORY;
    }
    int code = 0;
    PCRE2_SIZE at = 0;
    /* \C (one byte) would split characters: HF's Oniguruma refuses it too */
    const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C);
    s->code = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &code, &at, NULL);
    if (!s->code) {
        PCRE2_UCHAR why[160];
        pcre2_get_error_message(code, why, sizeof(why));
        snprintf(msg, cap, "does not compile at offset %zu: %s", (size_t)at, (const char *)why);
        fa_tok_split_free(s);
        return FA_ERR_INVALID_VALUE;
    }
    s->jit = pcre2_jit_compile(s->code, PCRE2_JIT_COMPLETE) == 0; /* where PCRE2 has one */
    *out = s;
    return FA_OK;
}

static int match_at(const fa_tok_split *s, fa_tok_matcher *m, const char *text, size_t n, size_t at)
{
    int rc = pcre2_match(s->code, (PCRE2_SPTR)text, n, at, PCRE2_NO_UTF_CHECK, m->md, m->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* past even the large stack: the interpreter's heap */
        rc = pcre2_match(s->code, (PCRE2_SPTR)text, n, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, m->md, m->mctx);
    return rc;
}

int fa_tok_split_next(const fa_tok_split *s, fa_tok_matcher *m, const char *text, size_t n, size_t at, size_t *from,
                      size_t *to)
{
    if (at > n)
        return 0;
    int rc = match_at(s, m, text, n, at), heavy = 0;
    if (rc == PCRE2_ERROR_MATCHLIMIT && m->heavy < HEAVY_MATCHES + m->heavy_bytes / HEAVY_BYTES) {
        m->heavy++, heavy = 1;
        pcre2_set_match_limit(m->mctx, MATCH_LIMIT);
        rc = match_at(s, m, text, n, at);
        pcre2_set_match_limit(m->mctx, LIGHT_LIMIT);
    }
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0)
        return rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ? -1 : -2;
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    if (ov[1] < ov[0]) /* \K in a lookahead: a match that ends before it starts */
        return -2;
    *from = ov[0], *to = ov[1];
    if (heavy)
        m->heavy_bytes += ov[1] > at ? ov[1] - at : 0;
    return 1;
}

/* The code point byte b is spelled with: the 68 bytes that are not printable (0x00-0x20,
 * 0x7F-0xA0, 0xAD) take U+0100.. in byte order. */
static unsigned byte_char(unsigned b)
{
    return b <= 0x20 ? 0x100 + b : b >= 0x7F && b <= 0xA0 ? 0x121 + (b - 0x7F) : b == 0xAD ? 0x143 : b;
}

/* The byte code point c spells, -1 if none. */
static int char_byte(unsigned c)
{
    if (c < 0x100)
        return c <= 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD ? -1 : (int)c;
    return c <= 0x120 ? (int)(c - 0x100) : c <= 0x142 ? (int)(0x7F + c - 0x121) : c == 0x143 ? 0xAD : -1;
}

size_t fa_tok_bytes_spelled(const char *s, size_t n, char *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned c = byte_char((unsigned char)s[i]);
        if (c < 0x80) {
            out[m++] = (char)c;
        } else { /* every spelling is below U+0800: two bytes */
            out[m++] = (char)(0xC0 | c >> 6);
            out[m++] = (char)(0x80 | (c & 0x3F));
        }
    }
    return m;
}

size_t fa_tok_bytes_read(const char *s, size_t n, char *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)s + i;
        const size_t k = fa_tok_utf8_len(u, n - i);
        const int b = k == 1 ? char_byte(u[0]) : k == 2 ? char_byte((unsigned)(u[0] & 0x1F) << 6 | (u[1] & 0x3F)) : -1;
        if (b < 0) { /* as HF's decoder: a piece with any other character stays as it is */
            memcpy(out, s, n);
            return n;
        }
        out[m++] = (char)b;
        i += k;
    }
    return m;
}
