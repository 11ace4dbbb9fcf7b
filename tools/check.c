/* SPDX-License-Identifier: MIT */
/* `flashattn check`: the conformance grid against float64 on any backend. */
#include "cli.h"
#include "ref.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *help =
    "usage: flashattn check [--backend auto|cpu|cuda|gles] [--threads N] [--quick]\n"
    "                       [--backward] [--seed N] [--verbose]\n"
    "\n"
    "Runs the conformance grid (dtypes x head_dim {1..256} x sequence lengths {1..2048},\n"
    "sq != sk both ways, causal / window / softcap, GQA, layouts, varlen, LSE) with fresh\n"
    "random inputs. Each case runs flash and standard attention and compares both with a\n"
    "float64 reference: flash passes when its max error is at most 2x standard's in the\n"
    "same precision plus a small floor. Failures print the shape and seed to replay.\n"
    "\n"
    "  --quick     short sequences only (<= 200), about 10x faster\n"
    "  --backward  also check dQ, dK, dV of every case against a float64 backward\n"
    "              (short sequences)\n"
    "  --seed N    grid seed (default: time); the same seed replays the same cases\n"
    "  --verbose   one line per case\n"
    "Exit status: 0 all passed, 1 any failure, 2 bad usage.\n";

int cmd_check(int argc, char **argv)
{
    fa_backend backend = FA_BACKEND_AUTO;
    long threads = 0;
    int quick = 0, verbose = 0, backward = 0;
    uint64_t seed = (uint64_t)time(NULL);
    enum { QUICK, BACKWARD, SEED, VERBOSE, N_OPTIONS };
    static const cli_option options[N_OPTIONS] = {
        [QUICK] = { "--quick", 0 }, [BACKWARD] = { "--backward", 0 },
        [SEED] = { "--seed", 1 },   [VERBOSE] = { "--verbose", 0 },
    };
    cli_args args = { "check", help, argc, argv, options, N_OPTIONS, &backend, &threads, 0 };
    int opt, next;
    const char *v;
    while ((next = cli_next_option(&args, &opt, &v)) == 1) {
        if (opt == SEED && cli_parse_u64(v, &seed) != 0)
            return cli_usage_error("check", "--seed needs an integer in 0..%llu",
                                   (unsigned long long)UINT64_MAX);
        quick |= opt == QUICK;
        backward |= opt == BACKWARD;
        verbose |= opt == VERBOSE;
    }
    if (next != 0)
        return next == CLI_HELP ? 0 : next;
    fa_context_t ctx = cli_context(backend, (int)threads);
    if (!ctx)
        return CLI_EXIT_FAIL;
    if (backward && fa_context_backend(ctx) == FA_BACKEND_GLES) {
        fa_context_destroy(ctx);
        return cli_usage_error("check", "the gles backend has no backward (inference only): drop "
                                        "--backward, or use --backend cpu or cuda");
    }
    static fa_case cases[FA_GRID_MAX];
    int n = fa_grid_build(quick ? 0 : 1, seed, cases, FA_GRID_MAX), failed = 0;
    int tty = isatty(fileno(stderr));
    printf("conformance grid: %d cases on backend %s, seed %llu (replay with --seed %llu%s)\n", n,
           fa_backend_name(fa_context_backend(ctx)), (unsigned long long)seed,
           (unsigned long long)seed, quick ? " --quick" : "");
    for (int i = 0; i < n; i++) {
        char desc[256];
        fa_case_format(&cases[i], desc, sizeof(desc));
        if (tty && !verbose)
            fprintf(stderr, "\r[%3d/%d] %-100.100s", i + 1, n, desc);
        fa_case_result r;
        int rc = fa_case_run(ctx, &cases[i], &r);
        if (tty && !verbose)
            fprintf(stderr, "\r%*s\r", 110, "");
        if (rc != 0 || !r.passed) {
            failed++;
            printf("FAIL case %d: %s\n", i, r.message);
            if (rc != 0) /* the message is the API error: show what was asked */
                printf("     %s\n", desc);
        } else if (verbose) {
            printf("ok   case %d: err %.3g (standard %.3g, tol %.3g) lse err %.3g: %s\n", i,
                   r.err_flash, r.err_standard, r.tolerance, r.lse_err_flash, desc);
        }
    }
    int total = n;
    if (backward) {
        /* the float64 backward costs ~3x the forward: the short-sequence grid */
        int nb = fa_grid_build(0, seed, cases, FA_GRID_MAX), nf8 = 0;
        for (int i = 0; i < nb; i++)
            nf8 += cases[i].dtype == FA_DTYPE_E4M3;
        printf("backward grid: %d cases (the %d fp8 ones are forward only)\n", nb - nf8, nf8);
        for (int i = 0; i < nb; i++) {
            fa_bwd_result r;
            if (cases[i].dtype == FA_DTYPE_E4M3)
                continue;
            if (tty && !verbose)
                fprintf(stderr, "\r[backward %3d/%d]", i + 1, nb);
            int rc = fa_case_run_backward(ctx, &cases[i], &r);
            if (tty && !verbose)
                fprintf(stderr, "\r%*s\r", 30, "");
            if (rc != 0 || !r.passed) {
                failed++;
                printf("FAIL backward case %d: %s\n", i, r.message);
            } else if (verbose) {
                printf("ok   backward case %d: dq %.3g dk %.3g dv %.3g\n", i, r.err_flash[0],
                       r.err_flash[1], r.err_flash[2]);
            }
        }
        total += nb - nf8;
    }
    fa_context_destroy(ctx);
    printf("check: %d passed, %d failed\n", total - failed, failed);
    return failed ? CLI_EXIT_FAIL : 0;
}
