/* SPDX-License-Identifier: MIT */
/* `flashattn`: benchmark, check and describe the library from the command line. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *usage =
    "usage: flashattn <command> [options]\n"
    "\n"
    "commands:\n"
    "  bench        time flash attention against standard attention, with errors against float64\n"
    "  check        run the conformance grid against float64; exit 1 on any failure\n"
    "  info         version, backends, CPU features, caches, chosen kernels and tile sizes\n"
    "  generate     text from a llama2.c or Hugging Face checkpoint, attention through flashattn\n"
    "  gen-model    write a synthetic llama2.c checkpoint of any Llama shape\n"
    "  export-hf    write a llama2.c checkpoint as a Hugging Face Llama directory\n"
    "  bench-model  the Llama runner end to end, flash against standard attention\n"
    "  bench-serve  the runner serving many requests at once (continuous batching, paged KV)\n"
    "\n"
    "`flashattn <command> --help` describes each command's options. Exit status: 0 done; 1 a\n"
    "check failed or the machine could not (no device, out of memory); 2 bad input (an option,\n"
    "a value or a file refused), with one line on stderr saying which.\n";

/* One line on stderr, "flashattn CMD: TEXT TAIL", TEXT from fmt: its control characters (a
 * newline or a terminal escape from a file's string or a command line) written as \n, \t or
 * \xNN, so that the line stays one line and the terminal untouched. */
static void error_line(const char *cmd, const char *tail, const char *fmt, va_list ap)
{
    char text[4096], out[4096];
    vsnprintf(text, sizeof(text), fmt, ap);
    size_t n = 0;
    const unsigned char *c = (const unsigned char *)text;
    for (; *c && n + 5 < sizeof(out); c++) {
        if (*c >= 0x20 && *c != 0x7f)
            out[n++] = (char)*c;
        else if (*c == '\n' || *c == '\t')
            out[n++] = '\\', out[n++] = *c == '\n' ? 'n' : 't';
        else
            n += (size_t)snprintf(out + n, 5, "\\x%02x", *c);
    }
    out[n] = '\0';
    fprintf(stderr, "flashattn %s: %s%s%s\n", cmd, out, *c ? "..." : "", tail);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    char tail[128];
    snprintf(tail, sizeof(tail), " (see `flashattn %s --help`)", cmd);
    va_list ap;
    va_start(ap, fmt);
    error_line(cmd, tail, fmt, ap);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_fail(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_line(cmd, "", fmt, ap);
    va_end(ap);
    return CLI_EXIT_FAIL;
}

/* The status's tail after err, through error_line's va_list. */
static void lib_line(const char *cmd, const char *tail, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_line(cmd, tail, fmt, ap);
    va_end(ap);
}

void cli_dir_of(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    snprintf(dir, cap, "%.*s", slash ? (int)(slash == path ? 1 : slash - path) : 1, slash ? path : ".");
}

int cli_output_ok(const char *cmd, const char *option, const char *path, int dash)
{
    struct stat sb;
    if (dash && strcmp(path, "-") == 0)
        return 0;
    if (!*path)
        return cli_usage_error(cmd, "%s: the file name is empty", option);
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode))
            return cli_usage_error(cmd, "%s: '%s' is a directory; give a file name", option, path);
        if (access(path, W_OK) == 0)
            return 0;
    } else if (errno == ENOENT) { /* a new file: its directory must take it */
        char dir[4096];
        cli_dir_of(path, dir, sizeof(dir));
        if (access(dir, W_OK | X_OK) == 0)
            return 0;
    }
    return cli_usage_error(cmd, "%s: cannot write '%s': %s", option, path, strerror(errno));
}

int cli_close(FILE *f)
{
    const int bad = ferror(f); /* before the close, which frees f */
    return fclose(f) != 0 || bad ? -1 : 0;
}

int cli_lib_error(const char *cmd, const char *err, fa_status st)
{
    char tail[64];
    snprintf(tail, sizeof(tail), " (%s)", fa_status_string(st));
    lib_line(cmd, tail, "%s", err);
    return st == FA_ERR_BACKEND_UNAVAILABLE || st == FA_ERR_OUT_OF_MEMORY || st == FA_ERR_BACKEND ? CLI_EXIT_FAIL
                                                                                                    : CLI_EXIT_USAGE;
}

/* strtol and strtoull skip leading spaces and take a sign; the parsers take neither */
static int starts_number(const char *s, int sign)
{
    return s && ((*s >= '0' && *s <= '9') || (sign && *s == '-' && s[1] >= '0' && s[1] <= '9'));
}

int cli_parse_int(const char *s, long lo, long hi, long *out)
{
    if (!starts_number(s, 1))
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_u64(const char *s, uint64_t *out)
{
    if (!starts_number(s, 0))
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int cli_parse_float(const char *s, double *out)
{
    if (!s || !*s || isspace((unsigned char)*s))
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || strpbrk(s, "xX")) /* decimal only: no hex floats */
        return -1;
    *out = v;
    return 0;
}

int cli_parse_int_list(const char *s, long lo, long hi, long *out, int cap)
{
    if (!s)
        return -1;
    int n = 0;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        char item[32];
        if (n >= cap || len == 0 || len >= sizeof(item))
            return -1;
        memcpy(item, s, len);
        item[len] = 0;
        if (cli_parse_int(item, lo, hi, &out[n++]) != 0)
            return -1;
        if (!comma)
            return n;
        s = comma + 1;
    }
}

int cli_parse_backend(const char *s, fa_backend *out)
{
    static const fa_backend all[] = { FA_BACKEND_AUTO, FA_BACKEND_CPU, FA_BACKEND_CUDA, FA_BACKEND_GLES };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (strcmp(s, fa_backend_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    return -1;
}

int cli_parse_dtype(const char *s, fa_dtype *out)
{
    if (strcmp(s, "f32") == 0)
        *out = FA_DTYPE_F32;
    else if (strcmp(s, "f16") == 0)
        *out = FA_DTYPE_F16;
    else if (strcmp(s, "bf16") == 0)
        *out = FA_DTYPE_BF16;
    else if (strcmp(s, "e4m3") == 0)
        *out = FA_DTYPE_E4M3;
    else
        return -1;
    return 0;
}

const char *cli_dtype_name(fa_dtype t)
{
    return t == FA_DTYPE_F32 ? "f32" : t == FA_DTYPE_F16 ? "f16" : t == FA_DTYPE_E4M3 ? "e4m3" : "bf16";
}

int64_t cli_dtype_bytes(fa_dtype t) { return t == FA_DTYPE_F32 ? 4 : t == FA_DTYPE_E4M3 ? 1 : 2; }

fa_dtype cli_out_dtype(fa_dtype in) { return in == FA_DTYPE_E4M3 ? FA_DTYPE_BF16 : in; }

int cli_next_option(cli_args *a, int *which, const char **value)
{
    for (;;) {
        if (++a->at >= a->argc)
            return 0;
        const char *arg = a->argv[a->at];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(a->help, stdout);
            return CLI_HELP;
        }
        const int backend = a->backend && strcmp(arg, "--backend") == 0,
                  threads = a->backend && strcmp(arg, "--threads") == 0;
        int i = 0;
        while (!backend && !threads && i < a->n_options && strcmp(arg, a->options[i].name) != 0)
            i++;
        if (!backend && !threads && i == a->n_options)
            return cli_usage_error(a->cmd, arg[0] == '-' ? "unknown option '%s'"
                                                         : "unexpected argument '%s'", arg);
        const char *v = NULL;
        if (backend || threads || a->options[i].takes_value) {
            if (a->at + 1 >= a->argc)
                return cli_usage_error(a->cmd, "%s needs a value", arg);
            v = a->argv[++a->at];
        }
        if (backend) {
            if (cli_parse_backend(v, a->backend) != 0)
                return cli_usage_error(a->cmd, "--backend needs auto, cpu, cuda or gles");
        } else if (threads) {
            if (cli_parse_int(v, 0, FA_MAX_THREADS, a->threads) != 0)
                return cli_usage_error(a->cmd, "--threads needs an integer in 0..%d", FA_MAX_THREADS);
        } else {
            *which = i;
            *value = v;
            return 1;
        }
    }
}

int cli_size(size_t *out, const int64_t *factors, int n)
{
    size_t r = 1;
    for (int i = 0; i < n; i++)
        if (factors[i] < 0 || (uint64_t)factors[i] > SIZE_MAX ||
            __builtin_mul_overflow(r, (size_t)factors[i], &r))
            return -1;
    *out = r;
    return 0;
}

uint64_t cli_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* The next of cli_plan_tensors' address ranges: at *at, then *at moved past its rows x cols
 * elements and a page of gap. The callers' shapes (info's table, a runner's prompt) keep the
 * ranges far below the top of the address space. */
static void *plan_range(uintptr_t *at, int64_t rows, int64_t cols, int64_t esz)
{
    void *p = (void *)*at;
    *at += ((uintptr_t)(rows * cols * esz) + 8191) & ~(uintptr_t)4095;
    return p;
}

void cli_plan_tensors(fa_attention_desc *d, fa_dtype dt, fa_backward_desc *bd)
{
    const int64_t esz = cli_dtype_bytes(dt), b = d->batch, sq = d->seqlen_q,
                  sk = d->seqlen_k, hq = d->num_heads_q, hk = d->num_heads_kv, dim = d->head_dim;
    uintptr_t at = 1u << 20;
    d->q = fa_tensor_contiguous(plan_range(&at, b * sq, hq * dim, esz), dt, FA_LAYOUT_BSHD,
                                d->seqlen_q, d->num_heads_q, d->head_dim);
    d->o = d->q;
    d->o.dtype = cli_out_dtype(dt);
    d->o.data = plan_range(&at, b * sq, hq * dim, cli_dtype_bytes(d->o.dtype));
    d->k = fa_tensor_contiguous(plan_range(&at, b * sk, hk * dim, esz), dt, FA_LAYOUT_BSHD,
                                d->seqlen_k, d->num_heads_kv, d->head_dim);
    d->v = d->k;
    d->v.data = plan_range(&at, b * sk, hk * dim, esz);
    if (!bd)
        return;
    d->lse = plan_range(&at, b * hq, sq, 4);
    fa_backward_desc_init(bd);
    bd->forward = d;
    bd->d_o = bd->d_q = d->q;
    bd->d_o.data = plan_range(&at, b * sq, hq * dim, esz);
    bd->d_q.data = plan_range(&at, b * sq, hq * dim, esz);
    bd->d_k = bd->d_v = d->k;
    bd->d_k.data = plan_range(&at, b * sk, hk * dim, esz);
    bd->d_v.data = plan_range(&at, b * sk, hk * dim, esz);
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

fa_context_t cli_context(fa_backend backend, int threads)
{
    fa_context_options o = { sizeof(o), backend, threads };
    fa_context_t ctx = NULL;
    fa_status st = fa_context_create(&o, &ctx);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn: cannot use backend '%s': %s (%s)\n", fa_backend_name(backend),
                fa_last_create_error(), fa_status_string(st));
        return NULL;
    }
    return ctx;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("flashattn %s\n", fa_version_string());
        return 0;
    }
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = { { "bench", cmd_bench },           { "check", cmd_check },
                     { "info", cmd_info },             { "generate", cmd_generate },
                     { "bench-model", cmd_bench_model }, { "bench-serve", cmd_bench_serve },
                     { "gen-model", cmd_gen_model },   { "export-hf", cmd_export_hf } };
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(cmd, commands[i].name) == 0) {
            int rc = commands[i].run(argc - 1, argv + 1);
            /* standard output that could not be written (a full disk) is a failure; a reader that
             * closes its pipe ends the process by SIGPIPE, as it ends cat or grep */
            errno = 0;
            if (fflush(stdout) != 0 || ferror(stdout)) {
                fprintf(stderr, "flashattn %s: writing the standard output failed%s%s\n", cmd, errno ? ": " : "",
                        errno ? strerror(errno) : "");
                return rc ? rc : CLI_EXIT_FAIL;
            }
            return rc;
        }
    fprintf(stderr, "flashattn: unknown command '%s' (see `flashattn --help`)\n", cmd);
    return CLI_EXIT_USAGE;
}
