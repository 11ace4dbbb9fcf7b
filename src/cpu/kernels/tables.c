/* SPDX-License-Identifier: MIT */
/*
 * The kernel tables this build compiled, each with the instructions it needs. The CMake
 * function fa_kernel_table() compiles a table's file with its flags and defines
 * FA_KERNELS_<NAME>; adding a table is that line and one entry here. This file is compiled
 * with baseline flags: it only reads what the CPU offers.
 */
#include "kernels.h"

#include <string.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

/* Names of a table in reports, derived from its name once here. */
#define FA_TABLE(id, test)                                                                     \
    {                                                                                          \
        &fa_cpu_kernels_##id, test,                                                            \
        {                                                                                      \
            "flash-" #id, "flash-" #id "-decode", "standard-" #id, "standard-" #id "-decode",  \
                "paged-" #id, "paged-" #id "-decode", "backward-" #id,                         \
                "backward-standard-" #id                                                       \
        }                                                                                      \
    }

#ifdef FA_KERNELS_AVX512
extern const fa_cpu_kernels fa_cpu_kernels_avx512;
static int avx512_usable(const fa_cpu_features *f) { return f->avx512f && f->fma && f->f16c; }
#endif
#ifdef FA_KERNELS_AVX2
extern const fa_cpu_kernels fa_cpu_kernels_avx2;
static int avx2_usable(const fa_cpu_features *f) { return f->avx2 && f->fma && f->f16c; }
#endif
#ifdef FA_KERNELS_NEON_FHM
extern const fa_cpu_kernels fa_cpu_kernels_neon_fhm;
static int neon_fhm_usable(const fa_cpu_features *f) { return f->asimd && f->asimdhp && f->asimdfhm; }
#endif
#ifdef FA_KERNELS_NEON
extern const fa_cpu_kernels fa_cpu_kernels_neon;
static int neon_usable(const fa_cpu_features *f) { return f->asimd; }
#endif
extern const fa_cpu_kernels fa_cpu_kernels_ref;
static int ref_usable(const fa_cpu_features *f) { (void)f; return 1; }

const fa_cpu_kernel_entry fa_cpu_kernel_tables[] = {
#ifdef FA_KERNELS_AVX512
    FA_TABLE(avx512, avx512_usable),
#endif
#ifdef FA_KERNELS_AVX2
    FA_TABLE(avx2, avx2_usable),
#endif
#ifdef FA_KERNELS_NEON_FHM
    FA_TABLE(neon_fhm, neon_fhm_usable),
#endif
#ifdef FA_KERNELS_NEON
    FA_TABLE(neon, neon_usable),
#endif
    FA_TABLE(ref, ref_usable),
};
const int fa_cpu_kernel_table_count = sizeof(fa_cpu_kernel_tables) / sizeof(fa_cpu_kernel_tables[0]);

void fa_cpu_features_probe(fa_cpu_features *f)
{
    memset(f, 0, sizeof(*f));
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f->avx2 = __builtin_cpu_supports("avx2") != 0;
    f->fma = __builtin_cpu_supports("fma") != 0;
    f->f16c = __builtin_cpu_supports("f16c") != 0;
    f->avx512f = __builtin_cpu_supports("avx512f") != 0;
#elif defined(__aarch64__) && defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    f->asimd = (hw & HWCAP_ASIMD) != 0;
    f->fphp = (hw & HWCAP_FPHP) != 0;
    f->asimdhp = (hw & HWCAP_ASIMDHP) != 0;
    f->asimddp = (hw & HWCAP_ASIMDDP) != 0;
    f->asimdfhm = (hw & HWCAP_ASIMDFHM) != 0;
#endif
}
