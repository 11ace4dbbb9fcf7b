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

/* Backtracking steps one match may take: a pattern from a file cannot hang the encoder. */
#define MATCH_LIMIT 10000000u
#define DEPTH_LIMIT 100000u

struct fa_tok_split {
    pcre2_code *code;
    pcre2_match_context *mctx;
    pcre2_match_data *md;
};

void fa_tok_split_free(fa_tok_split *s)
{
    if (!s)
        return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_code_free(s->code);
    free(s);
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
    s->code = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &code,
                            &at, NULL);
    if (!s->code) {
        PCRE2_UCHAR why[160];
        pcre2_get_error_message(code, why, sizeof(why));
        snprintf(msg, cap, "does not compile at offset %zu: %s", (size_t)at, (const char *)why);
        fa_tok_split_free(s);
        return FA_ERR_INVALID_VALUE;
    }
    pcre2_jit_compile(s->code, PCRE2_JIT_COMPLETE); /* faster where PCRE2 has a JIT; optional */
    s->mctx = pcre2_match_context_create(NULL);
    s->md = pcre2_match_data_create_from_pattern(s->code, NULL);
    if (!s->mctx || !s->md) {
        snprintf(msg, cap, "out of memory");
        fa_tok_split_free(s);
        return FA_ERR_OUT_OF_MEMORY;
    }
    pcre2_set_match_limit(s->mctx, MATCH_LIMIT);
    pcre2_set_depth_limit(s->mctx, DEPTH_LIMIT);
    *out = s;
    return FA_OK;
}

int fa_tok_split_next(const fa_tok_split *s, const char *text, size_t n, size_t at, size_t *from, size_t *to)
{
    while (at < n) {
        const int rc = pcre2_match(s->code, (PCRE2_SPTR)text, n, at, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            return 0;
        if (rc < 0)
            return -1;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        if (ov[1] > ov[0]) {
            *from = ov[0], *to = ov[1];
            return 1;
        }
        /* an empty match splits nothing: look again from the next character */
        size_t k = fa_tok_utf8_len((const unsigned char *)text + ov[0], n - ov[0]);
        at = ov[0] + (k ? k : 1);
    }
    return 0;
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
