/* SPDX-License-Identifier: MIT */
/* AVX-512 (F) kernels: 12 x 32 register block. Compiled with -mavx512f -mfma -mf16c. */
#include "kernels.h"

#include <immintrin.h>

#define VLEN 16
#define KMR 12
#define KNAME "avx512"
#define VSPLAT(s) _mm512_set1_ps(s)
#define KTABLE fa_cpu_kernels_avx512
#define LOAD_F16(p) ((vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p))))
#define STORE_F16(p, x) \
    _mm256_storeu_si256((__m256i *)(p), _mm512_cvtps_ph((__m512)(x), _MM_FROUND_TO_NEAREST_INT))

#define MUL32(a, b) ((vq)_mm512_mul_epu32((__m512i)(a), (__m512i)(b)))

#include "simd.inc"
