/* SPDX-License-Identifier: MIT */
/* What the two tokenizer readers share: the vocabulary table (pieces, their sorted index for
 * lookups, byte-fallback pieces), decoding, and the entry points of tokenizer.json's BPE
 * (tokenizer_json.c reads it, tokenizer_bpe.c encodes) that fa_tokenizer_encode and
 * fa_tokenizer_free dispatch to. */
#ifndef FA_MODEL_TOKENIZER_H
#define FA_MODEL_TOKENIZER_H

#include "model.h"

typedef struct fa_tok_bpe fa_tok_bpe; /* tokenizer.json: merges, added tokens, rules */

struct fa_tokenizer {
    int32_t vocab_size;
    int32_t max_token_length; /* longest piece in bytes */
    int32_t bos_id, eos_id;   /* what encoding adds when asked (-1: nothing); 1 and 2 but for byte-level BPE */
    float *scores;            /* [vocab] llama2.c: merge priority, higher first; NULL for tokenizer.json */
    uint32_t *offset;         /* [vocab + 1] start of each piece in text */
    char *text;               /* every piece back to back, each followed by a NUL: what the encoder matches */
    uint32_t *shown_offset;   /* [vocab + 1] start of each piece's decoded text in shown */
    char *shown;              /* decoded pieces (tokenizer.json: "▁" as a space); llama2.c: text itself */
    int32_t *sorted;          /* [vocab] ids ordered by piece bytes, then id */
    int16_t *byte_of;         /* [vocab] the byte a "<0xNN>" piece decodes to, or -1 */
    int32_t strip_after_bos;  /* leading spaces the piece right after BOS loses when decoded */
    char bytes[512];          /* byte b as a NUL-terminated string at bytes[2b] */
    fa_tok_bpe *bpe;          /* tokenizer.json only */
};

/* A table of vocab_size pieces whose text takes text_bytes (the NULs included): offset and
 * text allocated, the rest NULL; NULL when out of memory. */
fa_tokenizer *fa_tok_alloc(int32_t vocab_size, size_t text_bytes);

/* Once text and offset are filled: the sorted index, byte_of (when byte_pieces), the byte
 * strings; shown defaults to text. FA_ERR_OUT_OF_MEMORY or FA_OK. */
fa_status fa_tok_index(fa_tokenizer *t, int byte_pieces, char *err);

/* The lowest id whose piece is exactly s[0..n), or -1. */
int32_t fa_tok_lookup(const fa_tokenizer *t, const char *s, size_t n);

static inline size_t fa_tok_len(const fa_tokenizer *t, int32_t id)
{
    return t->offset[id + 1] - t->offset[id] - 1;
}

/* Length of the UTF-8 character at s (n > 0 bytes left): 1..4, or 0 when s does not start a
 * valid one (overlong forms, surrogates and code points past U+10FFFF are not). */
size_t fa_tok_utf8_len(const unsigned char *s, size_t n);
int fa_tok_valid_utf8(const char *s, size_t n);

/* tokenizer_json.c, tokenizer_bpe.c */
void fa_tok_bpe_free(fa_tok_bpe *b);
/* The text the tokenizer was read from. */
const char *fa_tok_bpe_source(const fa_tok_bpe *b, size_t *n);
fa_status fa_tok_bpe_encode(const fa_tokenizer *t, const char *text, int bos, int eos, int32_t *tokens,
                            int32_t cap, int32_t *n, char *err);

#endif
