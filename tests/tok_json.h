/* SPDX-License-Identifier: MIT */
/* What the tokenizer.json tests share: a file edited by cJSON, and a refusal checked for its
 * status and message. Failures go through cmocka. */
#ifndef FA_TESTS_TOK_JSON_H
#define FA_TESTS_TOK_JSON_H

#include "model.h"

/* base with one edit: the item at path ("model.type", "pre_tokenizer.pretokenizers.0"; numbers
 * index arrays) set to the JSON text value, or removed (objects only) when value is NULL.
 * malloc'd. */
char *tok_json_with(const char *base, const char *path, const char *value);

/* text read as "bad.json" at vocab ids is refused with status want, a message holding a (and b
 * when not NULL), and no tokenizer. */
void tok_json_expect_refused(const char *text, int32_t vocab, fa_status want, const char *a, const char *b);

#endif
