/* SPDX-License-Identifier: MIT */
/* Counter-based dropout: the backward pass regenerates the forward's mask instead of storing it. */
#include "dropout.h"

#include "internal.h"

#include <math.h>
#include <string.h>

uint32_t fa_dropout_threshold(float p) { return (uint32_t)ceil((double)p * 16777216.0); }

fa_status fa_dropout_mask(float p, uint64_t seed, uint64_t offset, int32_t batch, int32_t head,
                          int32_t row0, int32_t rows, int32_t col0, int32_t cols, uint8_t *mask,
                          int64_t ld)
{
    if (!(p >= 0.0f && p < 1.0f))
        return fa_error(NULL, FA_ERR_INVALID_VALUE, "p (%g) must be in [0, 1)", (double)p);
    if (batch < 0 || head < 0 || row0 < 0 || col0 < 0 || rows < 0 || cols < 0)
        return fa_error(NULL, FA_ERR_INVALID_SHAPE,
                        "batch, head, row0, col0, rows and cols must all be >= 0");
    /* a row or column index is below a sequence length (int32): the last one is INT32_MAX - 1 */
    if ((int64_t)row0 + rows > INT32_MAX)
        return fa_error(NULL, FA_ERR_INVALID_SHAPE, "row0 (%d) + rows (%d) must be <= INT32_MAX",
                        (int)row0, (int)rows);
    if ((int64_t)col0 + cols > INT32_MAX)
        return fa_error(NULL, FA_ERR_INVALID_SHAPE, "col0 (%d) + cols (%d) must be <= INT32_MAX",
                        (int)col0, (int)cols);
    if (ld < cols)
        return fa_error(NULL, FA_ERR_INVALID_STRIDE, "ld (%lld) must be >= cols (%d)", (long long)ld,
                        (int)cols);
    if (rows > 0 && cols > 0 && !mask)
        return fa_error(NULL, FA_ERR_NULL_POINTER, "mask must not be NULL");
    uint32_t t = fa_dropout_threshold(p);
    for (int32_t r = 0; r < rows; r++)
        fa_dropout_row(seed, offset, batch, head, (int64_t)row0 + r, col0, cols, t, mask + r * ld);
    return FA_OK;
}
