/* SPDX-License-Identifier: MIT */
/* The dropout mask every backend shares: Philox4x32-10 keyed as fa_dropout_mask documents. */
#ifndef FA_CORE_DROPOUT_H
#define FA_CORE_DROPOUT_H

#include <stdint.h>

/* Device code (CUDA) compiles the same function: the mask must match bit for bit. */
#ifdef __CUDACC__
#define FA_HOST_DEVICE __host__ __device__
#else
#define FA_HOST_DEVICE
#endif

/* Philox4x32-10 (Salmon et al., SC 2011) of counter c under key k into out. */
static inline FA_HOST_DEVICE void fa_philox4x32_10(const uint32_t c[4], const uint32_t k[2],
                                                   uint32_t out[4])
{
    uint32_t x0 = c[0], x1 = c[1], x2 = c[2], x3 = c[3], k0 = k[0], k1 = k[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * x0, p1 = (uint64_t)0xCD9E8D57u * x2;
        uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0, y1 = (uint32_t)p1;
        uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1, y3 = (uint32_t)p0;
        x0 = y0, x1 = y1, x2 = y2, x3 = y3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = x0, out[1] = x1, out[2] = x2, out[3] = x3;
}

/* Keep threshold on the top 24 bits of a Philox word: ceil(p * 2^24). */
uint32_t fa_dropout_threshold(float p);

/* keep[c] = 1/0 for key columns col0 .. col0+n-1 of (batch, head, row): the
 * definition fa_dropout_mask documents, one Philox call per 4 columns. */
static inline void fa_dropout_row(uint64_t seed, uint64_t offset, int32_t batch, int32_t head,
                                  int64_t row, int64_t col0, int32_t n, uint32_t threshold,
                                  uint8_t *keep)
{
    const uint32_t key[2] = { (uint32_t)seed ^ ((uint32_t)head * 0x9E3779B9u),
                              (uint32_t)(seed >> 32) ^ ((uint32_t)batch * 0xBB67AE85u) };
    uint32_t ctr[4] = { 0, (uint32_t)row, (uint32_t)offset, (uint32_t)(offset >> 32) }, r[4];
    int64_t block = -1;
    for (int32_t c = 0; c < n; c++) {
        int64_t col = col0 + c;
        if (col >> 2 != block) {
            block = col >> 2;
            ctr[0] = (uint32_t)block;
            fa_philox4x32_10(ctr, key, r);
        }
        keep[c] = (r[col & 3] >> 8) >= threshold;
    }
}

#endif
