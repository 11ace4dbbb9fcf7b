/* SPDX-License-Identifier: MIT */
/* AVX2 + FMA + F16C kernels: 6 x 16 register block. Compiled with -mavx2 -mfma -mf16c. */
#include "kernels.h"

#include <immintrin.h>

#define VLEN 8
#define KMR 6
#define KNAME "avx2"
#define VSPLAT(s) _mm256_set1_ps(s)
#define KTABLE fa_cpu_kernels_avx2
#define LOAD_F16(p) ((vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define STORE_F16(p, x) \
    _mm_storeu_si128((__m128i *)(p), _mm256_cvtps_ph((__m256)(x), _MM_FROUND_TO_NEAREST_INT))

#define MUL32(a, b) ((vq)_mm256_mul_epu32((__m256i)(a), (__m256i)(b)))

#include "simd.inc"
