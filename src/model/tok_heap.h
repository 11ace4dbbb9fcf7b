/* SPDX-License-Identifier: MIT */
/* The merge queue both BPE encoders share (tokenizer.c: llama2.c's, tokenizer_bpe.c: HF's): a
 * binary heap of candidate merges, the lowest key first and the leftmost of equal keys. */
#ifndef FA_TOK_HEAP_H
#define FA_TOK_HEAP_H

#include <stdint.h>

/* The pair whose left symbol is at pos, merged into id; key: HF's rank, or llama2.c's score
 * negated (the highest first). */
typedef struct fa_tok_cand {
    double key;
    int32_t pos, id;
} fa_tok_cand;

static inline int fa_tok_cand_before(const fa_tok_cand *a, const fa_tok_cand *b)
{
    return a->key != b->key ? a->key < b->key : a->pos < b->pos;
}

static inline void fa_tok_heap_push(fa_tok_cand *h, int64_t *n, fa_tok_cand c)
{
    int64_t i = (*n)++;
    for (; i > 0 && fa_tok_cand_before(&c, &h[(i - 1) / 2]); i = (i - 1) / 2)
        h[i] = h[(i - 1) / 2];
    h[i] = c;
}

static inline fa_tok_cand fa_tok_heap_pop(fa_tok_cand *h, int64_t *n)
{
    const fa_tok_cand top = h[0], last = h[--*n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && fa_tok_cand_before(&h[c + 1], &h[c]))
            c++;
        if (!fa_tok_cand_before(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

#endif
