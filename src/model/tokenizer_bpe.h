/* SPDX-License-Identifier: MIT */
/* tokenizer.json's BPE as its reader (tokenizer_json.c) leaves it for the encoder
 * (tokenizer_bpe.c): the merge table, the rules read from the file, the added tokens. */
#ifndef FA_MODEL_TOKENIZER_BPE_H
#define FA_MODEL_TOKENIZER_BPE_H

#include "tokenizer.h"

typedef struct fa_tok_split fa_tok_split;
typedef struct fa_tok_matcher fa_tok_matcher;

#define META "\xE2\x96\x81" /* U+2581, sentencepiece's word marker */
#define META_LEN 3
#define EMPTY_KEY UINT64_MAX

typedef struct added_token {
    int32_t id;
    uint8_t lstrip, rstrip;
} added_token;

struct fa_tok_bpe {
    uint64_t *keys;          /* [mask + 1] merge table: left << 32 | right, EMPTY_KEY when free */
    int32_t *rank, *merged;  /* [mask + 1] the merge's rank and the id it makes */
    uint32_t mask;
    uint8_t *in_model;       /* [vocab] 1: the id is model.vocab's (BPE sees only those) */
    int32_t byte_id[256];    /* the <0xNN> piece of each byte, -1 if none */
    int32_t unk;             /* model.unk_token's id, -1 if none */
    int fuse_unk, byte_fallback, ignore_merges;
    int prepend, replace;    /* normalizers Prepend("▁") and Replace(" " -> "▁") */
    int metaspace;           /* 0 none, else the pre-tokenizer's prepend scheme: 1 never, 2 first, 3 always */
    int meta_split;
    int bytelevel;           /* ByteLevel pre-tokenizer and decoder: pieces spell bytes (tokenizer_bytes.c) */
    fa_tok_split *split;     /* the pre-tokenizer's pattern (Split, or ByteLevel's use_regex), NULL for none */
    added_token *added;      /* [n_added] */
    uint8_t added_first[32]; /* bit c: some added token starts with byte c */
    int32_t n_added;
    char *source;            /* the file's text, for writing it back */
    size_t source_len;
};

/* tokenizer_bytes.c: the pre-tokenizer's pattern, compiled by PCRE2 (UTF, Unicode properties)
 * with limits on the steps of a match. pattern NULL: GPT-2's (ByteLevel's use_regex); literal:
 * the pattern is a plain string. On error, msg says why (status FA_ERR_INVALID_VALUE or
 * FA_ERR_OUT_OF_MEMORY). */
fa_status fa_tok_split_compile(const char *pattern, size_t len, int literal, fa_tok_split **out, char *msg,
                               size_t cap);
void fa_tok_split_free(fa_tok_split *s);
/* One encoding call's match state for s (NULL when out of memory): a compiled pattern is
 * shared, its matches' state is not. */
fa_tok_matcher *fa_tok_matcher_new(const fa_tok_split *s);
void fa_tok_matcher_free(fa_tok_matcher *m);
/* The first match in text[at..n) (valid UTF-8) as [from, to), which may be empty: 1; 0 when
 * there is none; -1 when the match passed PCRE2's step or memory limits, -2 on another PCRE2
 * error. */
int fa_tok_split_next(const fa_tok_split *s, fa_tok_matcher *m, const char *text, size_t n, size_t at, size_t *from,
                      size_t *to);
/* s[0..n) spelled in the byte alphabet into out (at most 2n bytes); its length. */
size_t fa_tok_bytes_spelled(const char *s, size_t n, char *out);
/* A piece's bytes (HF's ByteLevel decoder): each character of the byte alphabet to its byte
 * when all are, else the piece as it is; into out (at most n bytes); the length. */
size_t fa_tok_bytes_read(const char *s, size_t n, char *out);

/* The merge table's hash of a (left << 32 | right) key. */
uint64_t fa_tok_hash64(uint64_t k);
/* The merge of (l, r): its slot, or -1. */
int64_t fa_tok_merge_find(const fa_tok_bpe *b, int32_t l, int32_t r);
/* A model.vocab id of s[0..n), or -1 (added tokens outside model.vocab are not BPE's). */
int32_t fa_tok_model_lookup(const fa_tokenizer *t, const char *s, size_t n);

#endif
