/* SPDX-License-Identifier: MIT */
/* `flashattn info`: what was built, what runs here, and what the planner picks. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char *help =
    "usage: flashattn info [--backend auto|cpu|cuda|gles] [--threads N]\n"
    "\n"
    "Prints the version, the backends built into the library and whether each can run\n"
    "here, the chosen backend's details (CPU features, cache sizes, kernel table and\n"
    "why), and the kernel and tile sizes the planner picks for typical shapes.\n";

static void plan_row(fa_context_t ctx, int32_t sq, int32_t sk, int32_t hq, int32_t hk, int32_t d,
                     int causal, fa_dtype dt)
{
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.batch = 1;
    desc.seqlen_q = sq;
    desc.seqlen_k = sk;
    desc.num_heads_q = hq;
    desc.num_heads_kv = hk;
    desc.head_dim = d;
    desc.causal = causal;
    fa_backward_desc bd; /* with lse: the backward needs one */
    cli_plan_tensors(&desc, dt, &bd);
    char shape[64];
    snprintf(shape, sizeof(shape), "sq%d sk%d hq%d hkv%d d%d%s %s", (int)sq, (int)sk, (int)hq,
             (int)hk, (int)d, causal ? " causal" : "", cli_dtype_name(dt));
    for (int pass = 0; pass < 2; pass++) {
        fa_run_info ri = { .size = sizeof(ri) };
        fa_status st = pass ? fa_backward_plan(ctx, &bd, &ri) : fa_forward_plan(ctx, &desc, &ri);
        if (st != FA_OK) {
            printf("  %-42s %s\n", shape, fa_context_last_error(ctx));
            continue;
        }
        printf("  %-42s %-24s block_q %4d  block_k %4d  threads %d  workspace %.1f KiB\n",
               pass ? "" : shape, ri.kernel, (int)ri.block_q, (int)ri.block_k, (int)ri.threads,
               (double)ri.workspace_bytes / 1024.0);
    }
}

int cmd_info(int argc, char **argv)
{
    fa_backend backend = FA_BACKEND_AUTO;
    long threads = 0;
    cli_args args = { "info", help, argc, argv, NULL, 0, &backend, &threads, 0 };
    int opt, rc;
    const char *v;
    if ((rc = cli_next_option(&args, &opt, &v)) != 0) /* --backend and --threads only */
        return rc == CLI_HELP ? 0 : rc;
    printf("flashattn %s\n", fa_version_string());
    printf("backends:\n");
    static const fa_backend all[] = { FA_BACKEND_CPU, FA_BACKEND_CUDA, FA_BACKEND_GLES };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        const char *state = "not built";
        fa_context_t probe = NULL;
        if (fa_backend_is_built(all[i])) {
            fa_context_options o = { sizeof(o), all[i], 0 };
            state = fa_context_create(&o, &probe) == FA_OK ? "built, usable"
                                                             : "built, not usable here";
        }
        printf("  %-5s %s%s%s\n", fa_backend_name(all[i]), state,
               probe || !fa_backend_is_built(all[i]) ? "" : ": ",
               probe || !fa_backend_is_built(all[i]) ? "" : fa_last_create_error());
        fa_context_destroy(probe);
    }
    fa_context_t ctx = cli_context(backend, (int)threads);
    if (!ctx)
        return CLI_EXIT_FAIL;
    size_t need = 0;
    fa_context_info(ctx, NULL, 0, &need);
    char *text = malloc(need);
    if (text && fa_context_info(ctx, text, need, NULL) == FA_OK)
        fputs(text, stdout);
    free(text);
    printf("plans (forward, then backward: kernel and tiles per shape):\n");
    plan_row(ctx, 512, 512, 8, 8, 64, 1, FA_DTYPE_F32);
    plan_row(ctx, 2048, 2048, 8, 8, 64, 1, FA_DTYPE_F32);
    plan_row(ctx, 2048, 2048, 32, 32, 128, 0, FA_DTYPE_F32);
    plan_row(ctx, 2048, 2048, 32, 8, 128, 1, FA_DTYPE_BF16);
    plan_row(ctx, 8192, 8192, 8, 8, 128, 1, FA_DTYPE_F16);
    plan_row(ctx, 1, 4096, 32, 32, 128, 0, FA_DTYPE_F16);
    plan_row(ctx, 1, 4096, 32, 8, 128, 0, FA_DTYPE_F16);
    fa_context_destroy(ctx);
    return 0;
}
