/* SPDX-License-Identifier: MIT */
/* What the Hugging Face reader (hf.c) and writer (hf_write.c) share: config.json's rules, the
 * tensor names and shapes of a Llama checkpoint, where each lands in the llama2.c image, and
 * the q/k row permutation between the two RoPE layouts. */
#ifndef FA_MODEL_HF_H
#define FA_MODEL_HF_H

#include "model.h"

#define FA_HF_PER_LAYER 9 /* input norm, q, k, v, o, post-attention norm, gate, up, down */
#define FA_HF_MAX_LAYERS 65536

/* One tensor: rows x cols floats (cols 0: a vector of rows) at float offset `offset` of the
 * image's float section; heads > 0 for q_proj/k_proj, whose rows are permuted per head. */
typedef struct fa_hf_tensor {
    uint64_t offset, rows, cols;
    int32_t heads;
} fa_hf_tensor;

/* config.json's text (n bytes) into a checked config; file names it in messages. */
fa_status fa_hf_parse_config(const char *text, size_t n, const char *file, fa_model_config *out,
                             char *err);

/* Slots: 0 model.embed_tokens, 1 model.norm, 2 lm_head, then FA_HF_PER_LAYER per layer in the
 * order above. c must have passed fa_model_config_check with n_layers <= FA_HF_MAX_LAYERS. */
int fa_hf_slot_count(const fa_model_config *c);
void fa_hf_slot_name(const fa_model_config *c, int slot, char *name, size_t cap);
fa_hf_tensor fa_hf_slot(const fa_model_config *c, int slot);

/* HF's conversion permutes each head's rows so that rotate-half RoPE pairs (i, i + hs/2) are
 * llama2.c's adjacent pairs (2i, 2i + 1): llama2.c row h*hs + 2i + p is HF row
 * h*hs + p*hs/2 + i. hf_row 0: r is a llama2.c row, the HF row holding it comes back;
 * hf_row 1: r is an HF row, the llama2.c row it holds comes back. heads 0: r itself. */
uint64_t fa_hf_permuted_row(uint64_t r, uint64_t rows, int32_t heads, int hf_row);

#endif
