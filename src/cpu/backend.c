/* SPDX-License-Identifier: MIT */
/* The CPU backend: kernel table choice, planning and the two algorithms behind one interface. */
#include "cpu.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static fa_status cpu_init(fa_context_t ctx, int32_t num_threads, const void *native, void **state)
{
    (void)native;
    fa_cpu_state *s = calloc(1, sizeof(*s));
    if (!s)
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the CPU backend");
    fa_cpu_machine_probe(&s->mach);
    s->threads = num_threads > 0 ? num_threads : s->mach.max_threads;
#ifdef _OPENMP
    /* OpenMP exits the process when it cannot start the threads a region asks for. */
    if (s->threads > omp_get_thread_limit())
        s->threads = omp_get_thread_limit();
#endif
    if (s->threads < 1)
        s->threads = 1;

    const char *want = getenv("FLASHATTN_CPU_KERNELS");
    for (int i = 0; i < fa_cpu_kernel_table_count; i++) {
        const fa_cpu_kernel_entry *e = &fa_cpu_kernel_tables[i];
        if (want && *want && strcmp(want, e->kern->name) != 0)
            continue;
        if (!e->usable(&s->mach.feat)) {
            if (want && *want) {
                free(s);
                return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                                "FLASHATTN_CPU_KERNELS=%s, but this CPU lacks the instructions "
                                "those kernels need",
                                want);
            }
            continue;
        }
        s->kern = e->kern;
        s->table = e;
        s->kern_reason = (want && *want) ? "forced by FLASHATTN_CPU_KERNELS"
                                         : "widest instruction set this CPU supports";
        break;
    }
    if (!s->kern) {
        char names[128];
        size_t n = 0;
        for (int i = 0; i < fa_cpu_kernel_table_count; i++)
            fa_appendf(names, sizeof(names), &n, "%s%s", i == 0 ? ""
                       : i + 1 == fa_cpu_kernel_table_count ? " or " : ", ",
                       fa_cpu_kernel_tables[i].kern->name);
        free(s);
        return fa_error(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                        "FLASHATTN_CPU_KERNELS=%s names no kernel table; use %s",
                        want ? want : "", names);
    }
    *state = s;
    return FA_OK;
}

static void cpu_destroy(void *state)
{
    fa_cpu_state *s = state;
    if (s)
        free(s->scratch);
    free(s);
}

static void cpu_info(void *state, char *buf, size_t cap, size_t *len)
{
    const fa_cpu_state *s = state;
    const fa_cpu_machine *m = &s->mach;
    const fa_cpu_features *f = &m->feat;
#if defined(__aarch64__)
    fa_appendf(buf, cap, len,
               "cpu.features: asimd=%s fphp=%s asimdhp=%s asimddp=%s asimdfhm=%s (HWCAP)\n",
               f->asimd ? "yes" : "no", f->fphp ? "yes" : "no", f->asimdhp ? "yes" : "no",
               f->asimddp ? "yes" : "no", f->asimdfhm ? "yes" : "no");
#else
    fa_appendf(buf, cap, len, "cpu.features: avx2=%s fma=%s f16c=%s avx512f=%s\n",
               f->avx2 ? "yes" : "no", f->fma ? "yes" : "no", f->f16c ? "yes" : "no",
               f->avx512f ? "yes" : "no");
#endif
    fa_appendf(buf, cap, len, "cpu.cache: L1d %lld KiB, L2 %lld KiB, L3 %lld KiB (per core for L1/L2)\n",
               (long long)m->l1d_bytes / 1024, (long long)m->l2_bytes / 1024,
               (long long)m->l3_bytes / 1024);
    fa_appendf(buf, cap, len, "cpu.threads: %d\n", s->threads);
    fa_appendf(buf, cap, len, "cpu.kernels: %s (%s)\n", s->kern->name, s->kern_reason);
    fa_appendf(buf, cap, len, "cpu.kernels.available:");
    for (int i = 0; i < fa_cpu_kernel_table_count; i++)
        fa_appendf(buf, cap, len, " %s%s", fa_cpu_kernel_tables[i].kern->name,
                   fa_cpu_kernel_tables[i].usable(f) ? "" : "(unsupported here)");
    fa_appendf(buf, cap, len, "\ncpu.register_block: %d x %d floats\n", s->kern->mr, s->kern->nr);
}

const char *fa_cpu_kernel_name(const fa_cpu_state *s, int standard, int dot, int paged)
{
    return s->table->report[(paged ? FA_CPU_REPORT_PAGED : standard ? FA_CPU_REPORT_STANDARD
                                                            : FA_CPU_REPORT_FLASH) + (dot ? 1 : 0)];
}

static fa_status plan_call(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                           fa_cpu_plan *pl, fa_run_info *info)
{
    memset(pl, 0, sizeof(*pl));
    int standard = p->desc->algorithm == FA_ALGORITHM_STANDARD;
    fa_status st = standard ? fa_cpu_plan_standard(ctx, s, p, pl) : fa_cpu_plan_flash(ctx, s, p, pl);
    if (st != FA_OK)
        return st;
    info->kernel = fa_cpu_kernel_name(s, standard, pl->use_dot, 0);
    info->block_q = pl->cols;
    info->block_k = pl->block_k;
    info->threads = pl->threads;
    info->workspace_bytes = pl->workspace_bytes;
    return FA_OK;
}

static fa_status cpu_plan(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    fa_cpu_plan pl;
    return plan_call(ctx, state, p, &pl, info);
}

static fa_status cpu_forward(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    fa_cpu_plan pl;
    fa_status st = plan_call(ctx, state, p, &pl, info);
    if (st != FA_OK)
        return st;
    if (p->desc->algorithm == FA_ALGORITHM_STANDARD)
        return fa_cpu_standard_forward(ctx, state, p, &pl);
    if (pl.use_dot)
        return fa_cpu_decode_forward(ctx, state, p, &pl);
    return fa_cpu_flash_forward(ctx, state, p, &pl);
}

static fa_status backward_plan(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                               fa_cpu_plan *pl, fa_run_info *info)
{
    memset(pl, 0, sizeof(*pl));
    fa_status st = fa_cpu_plan_backward(ctx, s, p, pl);
    if (st != FA_OK)
        return st;
    info->kernel = s->table->report[p->desc->algorithm == FA_ALGORITHM_STANDARD
                                        ? FA_CPU_REPORT_BACKWARD_STANDARD
                                        : FA_CPU_REPORT_BACKWARD];
    info->block_q = pl->cols;
    info->block_k = pl->block_k;
    info->threads = pl->threads;
    info->workspace_bytes = pl->workspace_bytes;
    return FA_OK;
}

static fa_status cpu_plan_backward(fa_context_t ctx, void *state, const fa_problem *p,
                                   fa_run_info *info)
{
    fa_cpu_plan pl;
    return backward_plan(ctx, state, p, &pl, info);
}

static fa_status cpu_backward(fa_context_t ctx, void *state, const fa_problem *p, fa_run_info *info)
{
    fa_cpu_plan pl;
    fa_status st = backward_plan(ctx, state, p, &pl, info);
    return st != FA_OK ? st : fa_cpu_backward(ctx, state, p, &pl);
}

const fa_backend_iface fa_cpu_backend = {
    .id = FA_BACKEND_CPU,
    .name = "cpu",
    .init = cpu_init,
    .destroy = cpu_destroy,
    .info = cpu_info,
    .plan = cpu_plan,
    .forward = cpu_forward,
    .plan_backward = cpu_plan_backward,
    .backward = cpu_backward,
    .paged_plan = fa_cpu_paged_plan,
    .paged_run = fa_cpu_paged_run,
    .paged_plan_free = fa_cpu_paged_plan_free,
    .append = fa_cpu_append,
    .merge = fa_cpu_merge,
};
