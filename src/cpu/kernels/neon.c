/* SPDX-License-Identifier: MIT */
/* AArch64 Advanced SIMD (NEON) kernels: 8 x 8 register block. Compiled with -march=armv8-a+simd.
 * f16 is widened with FCVTL / narrowed with FCVTN (base ARMv8, rounding to nearest even as
 * FPCR has it), bf16 by shifting 16-bit lanes into the top of 32-bit lanes; the arithmetic is
 * float32 FMA (FMLA) throughout. */
#include "kernels.h"

#include <arm_neon.h>

#define VLEN 4
#define KMR 8
#ifndef KNAME /* neon_fhm.c includes this file under its own name */
#define KNAME "neon"
#define KTABLE fa_cpu_kernels_neon
#endif
#define VSPLAT(s) vdupq_n_f32(s)
#define LOAD_F16(p) ((vf)vcvt_f32_f16(vld1_f16((const float16_t *)(p))))
#define STORE_F16(p, x) vst1_f16((float16_t *)(p), vcvt_f16_f32((float32x4_t)(x)))

#define MUL32(a, b) ((vq)vmull_u32(vmovn_u64((uint64x2_t)(a)), vmovn_u64((uint64x2_t)(b))))

#include "simd.inc"
