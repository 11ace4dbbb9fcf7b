/* SPDX-License-Identifier: MIT */
/* The dropout mask every backend shares: Philox4x32-10 keyed as fa_dropout_mask documents. */
#ifndef FA_CORE_DROPOUT_H
#define FA_CORE_DROPOUT_H

#include <stdint.h>

/* Philox4x32-10 of counter c under key k into out. */
void fa_philox4x32_10(const uint32_t c[4], const uint32_t k[2], uint32_t out[4]);

/* Keep threshold on the top 24 bits of a Philox word: ceil(p * 2^24). */
uint32_t fa_dropout_threshold(float p);

/* keep[c] = 1/0 for key columns col0 .. col0+n-1 of (batch, head, row). */
void fa_dropout_row(uint64_t seed, uint64_t offset, int32_t batch, int32_t head, int64_t row,
                    int64_t col0, int32_t n, uint32_t threshold, uint8_t *keep);

#endif
