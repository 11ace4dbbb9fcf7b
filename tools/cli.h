/* SPDX-License-Identifier: MIT */
/* Shared pieces of the `flashattn` command-line tool. */
#ifndef FA_TOOLS_CLI_H
#define FA_TOOLS_CLI_H

#include "flashattn.h"
#include "model.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes: 0 ok; 1 a check failed, or the machine could not do what was asked (no device,
 * out of memory, a backend's runtime error); 2 bad input: usage, and every value or file the
 * library refuses (cli_lib_error). */
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

int cmd_bench(int argc, char **argv);
int cmd_bench_paged(int argc, char **argv); /* `bench --paged` */
int cmd_check(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_gen_model(int argc, char **argv);
int cmd_export_hf(int argc, char **argv);
int cmd_bench_model(int argc, char **argv);
int cmd_bench_serve(int argc, char **argv);

/* Print "flashattn <cmd>: <message>" plus a hint to stderr; returns CLI_EXIT_USAGE. Every
 * error line of the tool escapes control characters (a file's strings, a command line's). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Print "flashattn <cmd>: <message>" to stderr; returns CLI_EXIT_FAIL (the machine could not). */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether the file at path can be written at the end of a run (a writable file, or a new one,
 * in a writable directory; a character device such as /dev/null; "-", standard output, where
 * dash is set): checked before the run, so that a bad output path costs no run. A FIFO, a
 * socket or a block device is refused (a FIFO nobody reads would block the run forever). 0,
 * or CLI_EXIT_USAGE after naming the option and the reason. */
int cli_output_ok(const char *cmd, const char *option, const char *path, int dash);

/* 1 when paths a and b would write the same file (the same inode where both exist, else the
 * same name in the same directory); character devices (/dev/null) are never the same. */
int cli_same_output(const char *a, const char *b);

/* An output file written whole or not at all. A regular file (or a new one) is written as a
 * temporary beside it, PATH.XXXXXX, renamed over it by cli_out_commit after every write, the
 * flush, fsync and close succeeded: a failure, or SIGINT, SIGTERM, SIGHUP, SIGPIPE or SIGXFSZ on the
 * way, removes the temporary and leaves an earlier file as it was. "-" (standard output) and a
 * character device are written directly. Every function below that fails has printed one
 * line naming the option, the file and the system's reason (standard output's is left to
 * main, which says it once at exit) and returns CLI_EXIT_FAIL, the temporary removed. */
typedef struct cli_out {
    FILE *f;
    const char *cmd, *option, *path; /* in messages: "bench", "--json", the name given */
    char target[4096];               /* what is renamed over: path, or the file a link names */
    char tmp[4200];                  /* the temporary; "" when written directly */
    int slot;                        /* its place in the signal handler's list, or -1 */
} cli_out;

/* dash: "-" is standard output (else a file of that name). */
int cli_out_open(cli_out *o, const char *cmd, const char *option, const char *path, int dash);
/* Whether every write so far reached the file (flushed): call it after each record, so that a
 * run stops at the first write that fails, and right after a failed write, whose errno gives
 * the reason. */
int cli_out_check(cli_out *o);
int cli_out_commit(cli_out *o);
/* Drop what was written: the temporary removed (a direct file is closed as it is). */
void cli_out_abort(cli_out *o);

/* fclose(f), non-zero also where a write to f had failed before. */
int cli_close(FILE *f);

/* 0 while standard output takes what is written to it (flushed here), -1 once a write to it
 * failed; main then prints one line with the reason at exit. */
int cli_stdout_ok(void);

/* The directory a file at path would be created in: path up to its last '/', or ".". */
void cli_dir_of(const char *path, char *dir, size_t cap);

/* Print "flashattn <cmd>: <err> (<status>)" to stderr; returns CLI_EXIT_USAGE where st says
 * the input was bad (a value, shape, dtype, size or file refused, or a request the backend
 * cannot run), else CLI_EXIT_FAIL. */
int cli_lib_error(const char *cmd, const char *err, fa_status st);

/* Strict parsers: the whole string must be a number in range (no sign on unsigned, no
 * spaces). 0 on success. */
int cli_parse_int(const char *s, long lo, long hi, long *out);
int cli_parse_u64(const char *s, uint64_t *out);
int cli_parse_float(const char *s, double *out);
/* Comma-separated integers ("512,1024"), at most cap of them, none empty ("1,,2", ",1" and
 * "1," are refused). Returns the count or -1. */
int cli_parse_int_list(const char *s, long lo, long hi, long *out, int cap);

int cli_parse_backend(const char *s, fa_backend *out);
int cli_parse_matvec(const char *s, fa_matvec *out); /* auto, own, blas */
int cli_parse_graphs(const char *s, int *no_graphs);  /* on, off: the CUDA engine's decode graphs */
int cli_parse_dtype(const char *s, fa_dtype *out);
const char *cli_dtype_name(fa_dtype t);
/* Bytes of an element; o's dtype for inputs of dtype in (bf16 for fp8, else in). */
int64_t cli_dtype_bytes(fa_dtype t);
fa_dtype cli_out_dtype(fa_dtype in);

/* One option of a command: its name ("--seq") and whether a value follows it. */
typedef struct cli_option {
    const char *name;
    int takes_value;
} cli_option;

/* A command line read by cli_next_option. */
typedef struct cli_args {
    const char *cmd;           /* the command, in messages */
    const char *help;          /* printed to stdout for --help or -h */
    int argc;
    char **argv;               /* argv[0] is the command */
    const cli_option *options; /* n_options of them; the index is what cli_next_option gives */
    int n_options;
    fa_backend *backend;       /* where not NULL, --backend NAME and --threads N are read here */
    long *threads;
    int at;                    /* the next argument (start at 0) */
} cli_args;

#define CLI_HELP (-1)

/* The next option: 1 with its index into a->options in *which and, where it takes one, its
 * value in *value; 0 after the last. Every command's bad usage is told here in one line, exit
 * status CLI_EXIT_USAGE: an argument that is no option of the command, an option whose value
 * is missing, a bad --backend or --threads. CLI_HELP after printing a->help. */
int cli_next_option(cli_args *a, int *which, const char **value);

/* A note on stderr, once, where OpenBLAS runs kernels below what the CPU has (it picks them
 * by CPU model: 0.3.21 takes Emerald Rapids for a Prescott), naming OPENBLAS_CORETYPE. */
void cli_blas_note(void);

/* The product of n factors (each >= 0) into *out: 0, or -1 when it does not fit in a size_t. */
int cli_size(size_t *out, const int64_t *factors, int n);

/* MemAvailable from /proc/meminfo in bytes, 0 when unknown. */
uint64_t cli_mem_available(void);

/* Tensors for a descriptor that is only planned, from its shape fields (contiguous BSHD of
 * dtype dt): planning checks shapes, strides, alignment and overlaps but never touches data,
 * so q, k, v, o and, when bd is not NULL, lse, d_o, d_q, d_k and d_v get disjoint page-aligned
 * address ranges that hold no memory. */
void cli_plan_tensors(fa_attention_desc *d, fa_dtype dt, fa_backward_desc *bd);

/* Median of v[0..n) (sorts v). */
double cli_median(double *v, int n);

/* n (<= CLI_TURNS_MAX) calls of fn timed in turns (fn(arg[0]), fn(arg[1]), .., fn(arg[0]),
 * ..): one warm-up call each, then reps rounds (0: adaptive from the slowest call, at least 3, more while a round
 * stays under ~0.4 s); median milliseconds of each into ms[]. Side by side this way, a noisy
 * machine's slow spells fall on every call alike. -1 when a call fails. */
#define CLI_TURNS_MAX 2
int cli_time_turns(int (*fn)(void *), void *const arg[], int n, long reps, double ms[]);
/* The same with evict(evict_arg) before every call, untimed (NULL: nothing). */
int cli_time_turns_evict(int (*fn)(void *), void *const arg[], int n, long reps, void (*evict)(void *),
                         void *evict_arg, double ms[]);

/* Backward of a forward descriptor that has been run (o and lse filled). */
typedef struct cli_bwd_row {
    double ms, ms_std, gflops;
    uint64_t bytes, bytes_std;
    int has_std, checked;
    double max_err[3], rel_l2[3]; /* dq, dk, dv against float64 (batch 0, kv head 0) */
} cli_bwd_row;

/* Time flash and (unless no_standard) standard backward of d (tensors in backend memory),
 * check errors against float64 through host_d (the same call on host copies). 0, or
 * CLI_EXIT_FAIL after printing the library's error. */
int cli_bench_backward(fa_context_t ctx, fa_attention_desc *d, const fa_attention_desc *host_d,
                       long reps, int no_standard, double fwd_flops, cli_bwd_row *r);

/* Monotonic seconds. */
double cli_now(void);

/* Create a context or print why not; returns NULL on failure. */
fa_context_t cli_context(fa_backend backend, int threads);

/* bench-model's engine rows: prefill and decode tok/s for each batch size, KV pages of `page`
 * tokens, medians of `reps` passes after a warm-up (bench_engine.c). */
struct fa_model;
int cli_bench_engine(const struct fa_model *m, fa_backend backend, int no_graphs, int32_t page, const int32_t *ids,
                     int32_t n, int32_t decode, const long *batches, int n_batches, int reps);

#endif
