/* SPDX-License-Identifier: MIT */
/* What this CPU offers: instruction sets (kernels/tables.c) and cache sizes, read at run time. */
#include "cpu.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Size of the data/unified cache of a level from sysfs (bytes), or 0. */
static int64_t sysfs_cache(int level)
{
    for (int idx = 0; idx < 8; idx++) {
        char path[96], buf[32];
        int lv = 0;
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/level", idx);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        int ok = fscanf(f, "%d", &lv) == 1;
        fclose(f);
        if (!ok || lv != level)
            continue;
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/type", idx);
        if (!(f = fopen(path, "r")))
            continue;
        ok = fgets(buf, sizeof(buf), f) != NULL;
        fclose(f);
        if (!ok || strncmp(buf, "Instruction", 11) == 0)
            continue;
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        if (!(f = fopen(path, "r")))
            continue;
        long kb = 0;
        char unit = 'K';
        ok = fscanf(f, "%ld%c", &kb, &unit) >= 1;
        fclose(f);
        if (ok && kb > 0)
            return (int64_t)kb * (unit == 'M' ? 1024 * 1024 : 1024);
    }
    return 0;
}

static int64_t cache_size(int level, int sc_name, int64_t fallback)
{
    int64_t v = sysfs_cache(level);
    if (v <= 0) {
        long s = sysconf(sc_name);
        v = s > 0 ? s : fallback;
    }
    return v;
}

void fa_cpu_machine_probe(fa_cpu_machine *m)
{
    memset(m, 0, sizeof(*m));
    fa_cpu_features_probe(&m->feat);
    m->l1d_bytes = cache_size(1, _SC_LEVEL1_DCACHE_SIZE, 32 * 1024);
    m->l2_bytes = cache_size(2, _SC_LEVEL2_CACHE_SIZE, 256 * 1024);
    m->l3_bytes = cache_size(3, _SC_LEVEL3_CACHE_SIZE, 0);
#ifdef _OPENMP
    m->max_threads = omp_get_max_threads();
#else
    m->max_threads = 1;
#endif
}
