/* SPDX-License-Identifier: MIT */
/* `flashattn`: benchmark, check and describe the library from the command line. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
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

/* The file a write to path replaces: the one a symbolic link names (the link stays a link),
 * else path itself. */
static void out_target(const char *path, char *target, size_t cap)
{
    struct stat sb;
    char real[PATH_MAX];
    if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode) && realpath(path, real) && strlen(real) < cap)
        snprintf(target, cap, "%s", real);
    else
        snprintf(target, cap, "%s", path);
}

int cli_output_ok(const char *cmd, const char *option, const char *path, int dash)
{
    struct stat sb;
    if (dash && strcmp(path, "-") == 0)
        return 0;
    if (!*path)
        return cli_usage_error(cmd, "%s: the file name is empty", option);
    char target[4096], dir[4096];
    out_target(path, target, sizeof(target));
    cli_dir_of(target, dir, sizeof(dir));
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode))
            return cli_usage_error(cmd, "%s: '%s' is a directory; give a file name", option, path);
        if (!S_ISREG(sb.st_mode) && !S_ISCHR(sb.st_mode)) {
            const char *what = S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISSOCK(sb.st_mode) ? "a socket" : "a block device";
            return cli_usage_error(cmd, "%s: '%s' is %s, not a regular file; give a file name%s", option, path, what,
                                   dash ? ", or - for standard output" : "");
        }
        if (access(path, W_OK) != 0)
            return cli_usage_error(cmd, "%s: cannot write '%s': %s", option, path, strerror(errno));
        if (S_ISCHR(sb.st_mode) || access(dir, W_OK | X_OK) == 0)
            return 0;
        /* a file is replaced whole: its new contents are written beside it first */
        return cli_usage_error(cmd, "%s: cannot replace '%s': its directory '%s' is not writable (%s)", option, path,
                               dir, strerror(errno));
    }
    if (errno == ENOENT && access(dir, W_OK | X_OK) == 0) /* a new file: its directory must take it */
        return 0;
    return cli_usage_error(cmd, "%s: cannot write '%s': %s", option, path, strerror(errno));
}

int cli_same_output(const char *a, const char *b)
{
    struct stat sa, sb;
    const int has_a = stat(a, &sa) == 0, has_b = stat(b, &sb) == 0;
    if (has_a || has_b)
        return has_a && has_b && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && !S_ISCHR(sa.st_mode);
    char da[4096], db[4096], ra[PATH_MAX], rb[PATH_MAX];
    const char *na = strrchr(a, '/'), *nb = strrchr(b, '/');
    cli_dir_of(a, da, sizeof(da));
    cli_dir_of(b, db, sizeof(db));
    return strcmp(na ? na + 1 : a, nb ? nb + 1 : b) == 0 && realpath(da, ra) && realpath(db, rb) &&
           strcmp(ra, rb) == 0;
}

/* The temporaries being written, removed by on_signal: a run stopped by ^C, a kill or a reader
 * that closed its pipe leaves no PATH.XXXXXX behind. */
#define OUT_PENDING 4
static char pending[OUT_PENDING][4200];
static volatile sig_atomic_t pending_set[OUT_PENDING];

static void on_signal(int sig)
{
    for (int i = 0; i < OUT_PENDING; i++)
        if (pending_set[i])
            unlink(pending[i]);
    signal(sig, SIG_DFL);
    raise(sig); /* the default action once this returns: the signals are blocked in here, so
                 * a second one (timeout signals the process and then its group) waits too */
}

/* Register o's temporary with on_signal, installed on first use where the signal is not ignored
 * (nohup's SIGHUP stays ignored). */
static void pend(cli_out *o)
{
    static int installed;
    static const int sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGXFSZ };
    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaddset(&sa.sa_mask, sigs[i]);
    for (size_t i = 0; !installed && i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL)
            sigaction(sigs[i], &sa, NULL);
    }
    installed = 1;
    for (int i = 0; i < OUT_PENDING; i++)
        if (!pending_set[i]) {
            memcpy(pending[i], o->tmp, sizeof(o->tmp));
            pending_set[i] = 1;
            o->slot = i;
            return;
        }
}

/* Close o's file and remove its temporary; one line naming the file and strerror(e) where e. */
static int out_drop(cli_out *o, int e)
{
    if (o->f && o->f != stdout)
        fclose(o->f);
    o->f = NULL;
    if (o->tmp[0])
        unlink(o->tmp);
    if (o->slot >= 0)
        pending_set[o->slot] = 0;
    o->slot = -1;
    o->tmp[0] = '\0';
    return e ? cli_fail(o->cmd, "cannot write %s file '%s': %s", o->option, o->path, strerror(e)) : CLI_EXIT_FAIL;
}

int cli_out_open(cli_out *o, const char *cmd, const char *option, const char *path, int dash)
{
    memset(o, 0, sizeof(*o));
    o->cmd = cmd, o->option = option, o->path = path, o->slot = -1;
    if (dash && strcmp(path, "-") == 0) {
        o->f = stdout;
        return 0;
    }
    out_target(path, o->target, sizeof(o->target));
    struct stat sb;
    const int exists = stat(o->target, &sb) == 0;
    if (exists && S_ISCHR(sb.st_mode)) /* /dev/null and the like cannot be replaced */
        return (o->f = fopen(o->target, "w")) ? 0 : out_drop(o, errno);
    if ((size_t)snprintf(o->tmp, sizeof(o->tmp), "%s.XXXXXX", o->target) >= sizeof(o->tmp)) {
        o->tmp[0] = '\0';
        return out_drop(o, ENAMETOOLONG);
    }
    const int fd = mkstemp(o->tmp);
    if (fd < 0) {
        o->tmp[0] = '\0';
        return out_drop(o, errno);
    }
    pend(o);
    const mode_t mask = umask(0);
    umask(mask);
    /* the replaced file's permissions, or a new file's (mkstemp makes it 0600) */
    if (fchmod(fd, exists ? sb.st_mode & 07777 : 0666 & ~mask) != 0 || !(o->f = fdopen(fd, "w"))) {
        const int e = errno;
        close(fd);
        return out_drop(o, e);
    }
    return 0;
}

int cli_out_check(cli_out *o)
{
    const int before = errno; /* a write that failed just before left its reason here */
    if (!o->f)
        return CLI_EXIT_FAIL;
    if (o->f == stdout)
        return cli_stdout_ok() == 0 ? 0 : CLI_EXIT_FAIL;
    errno = 0;
    if (fflush(o->f) == 0 && !ferror(o->f))
        return 0;
    return out_drop(o, errno ? errno : before ? before : EIO);
}

int cli_out_commit(cli_out *o)
{
    int rc = cli_out_check(o);
    if (rc != 0 || o->f == stdout) {
        o->f = NULL;
        return rc;
    }
    int e = o->tmp[0] && fsync(fileno(o->f)) != 0 ? errno : 0;
    if (fclose(o->f) != 0 && !e)
        e = errno ? errno : EIO;
    o->f = NULL;
    if (!e && o->tmp[0] && rename(o->tmp, o->target) != 0)
        e = errno;
    if (e)
        return out_drop(o, e);
    if (o->slot >= 0)
        pending_set[o->slot] = 0;
    o->slot = -1;
    return 0;
}

void cli_out_abort(cli_out *o) { out_drop(o, 0); }

static int stdout_errno; /* of the first write to standard output that failed */

int cli_stdout_ok(void)
{
    if (!stdout_errno) {
        errno = 0;
        if (fflush(stdout) != 0 || ferror(stdout))
            stdout_errno = errno ? errno : EIO;
    }
    return stdout_errno ? -1 : 0;
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
    return st == FA_ERR_BACKEND_UNAVAILABLE || st == FA_ERR_OUT_OF_MEMORY || st == FA_ERR_BACKEND || st == FA_ERR_IO
               ? CLI_EXIT_FAIL
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
    /* decimal only: no hex floats; an underflow (1e-320) reads as the tiny value strtod gives */
    if ((errno && !(errno == ERANGE && fabs(v) < 1.0)) || *end || !isfinite(v) || strpbrk(s, "xX"))
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

/* A descriptor 0, 1 or 2 that the caller closed (`>&-`) would be taken by the first file the
 * tool opens, and what is meant for standard output would land in that file: each closed one
 * is opened on /dev/null first. -1 when that fails. */
static int open_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF && open("/dev/null", fd ? O_WRONLY : O_RDONLY) != fd)
            return -1; /* open takes the lowest free descriptor: fd, the ones below it being open */
    return 0;
}

int main(int argc, char **argv)
{
    if (open_std_fds() != 0) {
        fprintf(stderr, "flashattn: cannot open /dev/null for a closed standard stream: %s\n", strerror(errno));
        return CLI_EXIT_FAIL;
    }
    if (argc < 2) {
        fputs("flashattn: no command given; `flashattn --help` lists the commands\n", stderr);
        return CLI_EXIT_USAGE;
    }
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = { { "bench", cmd_bench },           { "check", cmd_check },
                     { "info", cmd_info },             { "generate", cmd_generate },
                     { "bench-model", cmd_bench_model }, { "bench-serve", cmd_bench_serve },
                     { "gen-model", cmd_gen_model },   { "export-hf", cmd_export_hf } };
    const char *cmd = argv[1], *name = ""; /* name: the command in the message below */
    int rc = 0;
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage, stdout);
    } else if (strcmp(cmd, "--version") == 0) {
        printf("flashattn %s\n", fa_version_string());
    } else {
        size_t i = 0, n = sizeof(commands) / sizeof(commands[0]);
        while (i < n && strcmp(cmd, commands[i].name) != 0)
            i++;
        if (i == n) {
            fprintf(stderr, "flashattn: unknown command '%s' (see `flashattn --help`)\n", cmd);
            return CLI_EXIT_USAGE;
        }
        name = cmd;
        rc = commands[i].run(argc - 1, argv + 1);
    }
    /* standard output that could not be written (a full disk) is a failure; a reader that
     * closes its pipe ends the process by SIGPIPE, as it ends cat or grep */
    if (cli_stdout_ok() != 0) {
        fprintf(stderr, "flashattn%s%s: writing the standard output failed: %s\n", *name ? " " : "", name,
                strerror(stdout_errno));
        return rc ? rc : CLI_EXIT_FAIL;
    }
    return rc;
}
