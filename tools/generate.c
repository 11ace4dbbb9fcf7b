/* SPDX-License-Identifier: MIT */
/* `flashattn generate` (text from a llama2.c or Hugging Face checkpoint), `flashattn gen-model`
 * and `flashattn export-hf`. */
#include "cli.h"
#include "engine.h"
#include "model.h"

#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* dir/tokenizer.json into path when dir is a directory with an entry of that name: a file, or
 * anything else (a dangling link, one it may not read), which the tokenizer's load then
 * refuses naming it, rather than another tokenizer taken in its place. */
static int dir_tokenizer(const char *dir, char *path, size_t cap)
{
    struct stat sb;
    return stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) &&
           (size_t)snprintf(path, cap, "%s/tokenizer.json", dir) < cap && (lstat(path, &sb) == 0 || errno != ENOENT);
}

int cli_parse_matvec(const char *s, fa_matvec *out)
{
    static const char *const names[] = { [FA_MATVEC_AUTO] = "auto", [FA_MATVEC_OWN] = "own",
                                         [FA_MATVEC_BLAS] = "blas" };
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (fa_matvec)i;
            return 0;
        }
    return -1;
}

static const char *gen_help =
    "usage: flashattn generate [options]\n"
    "\n"
    "Generates text with a llama2.c checkpoint (legacy format, float32) or a Hugging Face\n"
    "Llama directory (config.json + safetensors, f32/f16/bf16) and a llama2.c tokenizer.bin\n"
    "or an HF tokenizer.json (Llama-2-style sentencepiece BPE; the directory's own is used),\n"
    "streaming it to stdout as it is produced. On cpu attention runs through fa_forward (the\n"
    "whole prompt in one causal prefill, then one query per step against the KV cache); on\n"
    "cuda the runner's engine serves the prompt as one request of its scheduler. At the\n"
    "end, stderr gets the prompt tokens, prefill ms and tok/s (timed warm, after a short\n"
    "forward of the prompt's start, whose ms is given too), and decode tok/s. Steps count\n"
    "the prompt (BOS included), as llama2.c's run.c does; generation stops at BOS or EOS.\n"
    "\n"
    "  --model PATH          checkpoint file or HF directory [" FA_MODELS_DIR "/stories260K.bin]\n"
    "  --tokenizer PATH      tokenizer.bin, or *.json as tokenizer.json\n"
    "                        [DIR/tokenizer.json when --model DIR has one, else\n"
    "                        " FA_MODELS_DIR "/tok512.bin]\n"
    "  --prompt TEXT                                                 [\"\"]\n"
    "  --steps N             positions, the KV cache's size; 0 = the model's seq_len [256]\n"
    "  --temperature T       0 = greedy (argmax)                     [1.0]\n"
    "  --topp P              nucleus sampling, 0 or 1 = off          [0.9]\n"
    "  --seed S              sampler seed                            [time]\n"
    "  --chunk N             prefill at most N tokens per forward    [whole prompt]\n"
    "  --matvec auto|own|blas  cpu: one-token projections, own loop or sgemv [auto]\n"
    "  --ids                 also print every token id (stderr)\n"
    "  --backend cpu|cuda    cpu: the float32 runner above; cuda: the engine (bf16 weights,\n"
    "                        paged bf16 KV cache, cuBLAS; prefill in steps of --chunk\n"
    "                        rows, sampling by the engine's formula from --seed) [cpu]\n"
    "  --graphs on|off       cuda: decode steps replay a CUDA graph  [on]\n"
    "  --threads N           cpu: attention threads, 0 = all cores   [0]\n";

typedef struct sink {
    int32_t *ids;
    int64_t n, cap; /* cap: seq_len + 1, past int32 at the largest seq_len */
    int open_line;  /* text written since its last newline */
} sink;

/* The text ends its line before anything else is said (stderr may share stdout's file). */
static void end_text(sink *k)
{
    if (k->open_line)
        fputc('\n', stdout);
    k->open_line = 0;
    fflush(stdout);
}

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    sink *k = user;
    if (k->n < k->cap)
        k->ids[k->n++] = token;
    /* raw bytes, except control characters other than whitespace (a terminal's safety) */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if ((c >= 0x20 || c == '\n' || c == '\t' || c == '\r') && c != 0x7f) {
            fputc(c, stdout);
            k->open_line = c != '\n';
        }
    }
    return cli_stdout_ok() != 0; /* a standard output that fails stops the run (main says why) */
}

/* A step through the engine: its wall seconds into *dt. */
static fa_status engine_step(fa_engine *e, fa_sched *sc, const fa_sample_params *p, fa_step *s, int32_t *next,
                             double *dt, char *err)
{
    fa_status st = fa_sched_step(sc, s, err);
    if (st != FA_OK || s->batch == 0)
        return st;
    const double t0 = cli_now();
    st = fa_engine_step(e, s, p, next, NULL, err);
    *dt = cli_now() - t0;
    if (st != FA_OK)
        fa_sched_abort(sc, NULL);
    return st;
}

/* fa_generate's prompt, counts, echo and stops through the engine: one request of the scheduler
 * in pages of 16, the prompt in steps of at most `chunk` rows (0: the whole prompt), after a
 * warm-up request of the prompt's first FA_GENERATE_WARMUP tokens and two generated ones (the
 * first decode step of batch 1, where graphs are captured). */
static fa_status generate_engine(const fa_model *m, const fa_tokenizer *t, const fa_engine_options *base,
                                 const char *prompt, int32_t steps, int32_t chunk, const fa_sample_params *sp,
                                 sink *k, fa_generate_stats *gs, fa_engine_info *info, char *device,
                                 size_t device_cap, char *err)
{
    const fa_model_config *c = &m->config;
    memset(gs, 0, sizeof(*gs));
    if (steps <= 0 || steps > c->seq_len)
        steps = c->seq_len;
    int32_t *ids, n;
    fa_status st = fa_generate_prompt(t, c->seq_len, prompt, &ids, &n, err);
    if (st != FA_OK)
        return st;
    fa_engine *e = NULL;
    fa_sched *sc = NULL;
    const int32_t np = n < steps ? n : steps, warm = np < FA_GENERATE_WARMUP ? np : FA_GENERATE_WARMUP;
    gs->prompt_tokens = np;
    const int32_t warm_new = warm < c->seq_len ? 2 : 1, page = 16;
    const int32_t need = steps > warm + warm_new - 1 ? steps : warm + warm_new - 1;
    fa_engine_options eo = *base;
    eo.page_size = page;
    eo.num_pages = (need + page - 1) / page;
    eo.max_batch = 1;
    eo.token_budget = chunk > 0 && chunk < np ? chunk : np;
    const fa_sched_options so = { eo.num_pages, page, 1, eo.token_budget, c->seq_len, 1 };
    if ((st = fa_engine_create(m, &eo, &e, err)) != FA_OK || (st = fa_sched_create(&so, &sc, err)) != FA_OK)
        goto done;
    fa_step s;
    int32_t next[1];
    int64_t id;
    double dt = 0.0;
    const double t0 = cli_now();
    if ((st = fa_sched_add(sc, ids, warm, warm_new, &id, err)) != FA_OK)
        goto done;
    while ((st = engine_step(e, sc, sp, &s, next, &dt, err)) == FA_OK && s.batch > 0)
        if ((st = fa_sched_commit(sc, next, NULL, err)) != FA_OK)
            goto done;
    if (st != FA_OK || (st = fa_sched_release(sc, id, err)) != FA_OK)
        goto done;
    gs->warmup_s = cli_now() - t0;
    /* run.c's counts: positions np-1 .. steps-1 each give a token, the last one never fed */
    if ((st = fa_sched_add(sc, ids, np, steps - np + 1, &id, err)) != FA_OK)
        goto done;
    int32_t prev = ids[np - 1];
    /* the prompt as it is fed, before its steps (a step that fails leaves it shown) */
    uint8_t prompt_stop = 0;
    const int32_t echo = n - 1 < steps ? n - 1 : steps;
    for (int32_t i = 1; i <= echo && !prompt_stop; i++) {
        size_t len;
        const char *txt = fa_tokenizer_decode(t, ids[i - 1], ids[i], &len);
        prompt_stop = (uint8_t)on_token(k, ids[i], txt, len);
    }
    prompt_stop |= np < n; /* the prompt alone reaches `steps` */
    int started = 0;
    while ((st = engine_step(e, sc, sp, &s, next, &dt, err)) == FA_OK && s.batch > 0) {
        uint8_t stop = 0;
        if (!s.sample[0]) {
            gs->prefill_s += dt;
        } else if (!started) { /* the prompt's last chunk */
            gs->prefill_s += dt;
            started = 1;
            stop = prompt_stop;
        } else {
            gs->decode_s += dt;
            gs->decode_steps++;
        }
        if (s.sample[0] && !stop) {
            const int32_t token = next[0];
            gs->generated++;
            stop = fa_model_is_stop(&m->config, token);
            if (!stop) {
                size_t len;
                const char *txt = fa_tokenizer_decode(t, prev, token, &len);
                stop = (uint8_t)on_token(k, token, txt, len);
            }
            prev = token;
        }
        if ((st = fa_sched_commit(sc, next, &stop, err)) != FA_OK)
            goto done;
    }
done:
    if (e) { /* the report outlives the engine, its device name too */
        *info = fa_engine_get_info(e);
        snprintf(device, device_cap, "%s", info->device);
        info->device = device;
    }
    fa_sched_free(sc);
    fa_engine_free(e);
    free(ids);
    return st;
}

int cmd_generate(int argc, char **argv)
{
    const char *model_path = FA_MODELS_DIR "/stories260K.bin",
               *tok_path = FA_MODELS_DIR "/tok512.bin", *prompt = "";
    long steps = 256, seed = -1, chunk = 0, threads = 0;
    double temperature = 1.0, topp = 0.9;
    int print_ids = 0, no_graphs = 0, tok_given = 0;
    char dir_tok[4096];
    fa_matvec matvec = FA_MATVEC_AUTO;
    fa_backend backend = FA_BACKEND_CPU;
    enum { MODEL, TOKENIZER, PROMPT, STEPS, TEMPERATURE, TOPP, SEED, CHUNK, MATVEC, IDS, GRAPHS, N_OPTIONS };
    static const cli_option options[N_OPTIONS] = {
        [MODEL] = { "--model", 1 },   [TOKENIZER] = { "--tokenizer", 1 },
        [PROMPT] = { "--prompt", 1 }, [STEPS] = { "--steps", 1 },
        [TEMPERATURE] = { "--temperature", 1 }, [TOPP] = { "--topp", 1 },
        [SEED] = { "--seed", 1 },     [CHUNK] = { "--chunk", 1 },
        [MATVEC] = { "--matvec", 1 }, [IDS] = { "--ids", 0 },
        [GRAPHS] = { "--graphs", 1 },
    };
    cli_args args = { "generate", gen_help, argc, argv, options, N_OPTIONS, &backend, &threads, 0 };
    int opt, rc;
    const char *v;
    while ((rc = cli_next_option(&args, &opt, &v)) == 1) {
        switch (opt) {
        case MODEL:
            model_path = v;
            break;
        case TOKENIZER:
            tok_path = v;
            tok_given = 1;
            break;
        case PROMPT:
            prompt = v;
            break;
        case STEPS:
            if (cli_parse_int(v, 0, INT32_MAX, &steps) != 0)
                return cli_usage_error("generate", "--steps needs an integer in 0..%d", INT32_MAX);
            break;
        case TEMPERATURE:
            if (cli_parse_float(v, &temperature) != 0 || temperature < 0 || temperature > FLT_MAX)
                return cli_usage_error("generate", "--temperature needs a number >= 0 (0: argmax) within float's "
                                                   "range, not '%s'", v);
            break;
        case TOPP:
            if (cli_parse_float(v, &topp) != 0 || topp < 0 || topp > 1)
                return cli_usage_error("generate", "--topp needs a number in 0..1");
            break;
        case SEED:
            if (cli_parse_int(v, 0, INT64_MAX, &seed) != 0)
                return cli_usage_error("generate", "--seed needs an integer in 0..%lld",
                                       (long long)INT64_MAX);
            break;
        case CHUNK:
            if (cli_parse_int(v, 1, INT32_MAX, &chunk) != 0)
                return cli_usage_error("generate", "--chunk needs an integer in 1..%d", INT32_MAX);
            break;
        case MATVEC:
            if (cli_parse_matvec(v, &matvec) != 0)
                return cli_usage_error("generate", "--matvec needs auto, own or blas");
            break;
        case IDS:
            print_ids = 1;
            break;
        case GRAPHS:
            if (cli_parse_graphs(v, &no_graphs) != 0)
                return cli_usage_error("generate", "--graphs needs on or off");
            break;
        }
    }
    if (rc != 0)
        return rc == CLI_HELP ? 0 : rc;
    if (backend != FA_BACKEND_CPU && backend != FA_BACKEND_CUDA)
        return cli_usage_error("generate", "--backend: generate runs on cpu or cuda");
    if (seed < 0)
        seed = (long)time(NULL);
    if (!tok_given && dir_tokenizer(model_path, dir_tok, sizeof(dir_tok)))
        tok_path = dir_tok;

    char err[FA_MODEL_ERR_LEN];
    fa_model *m = NULL;
    fa_tokenizer *tok = NULL;
    fa_sampler *smp = NULL;
    fa_model_state *st = NULL;
    fa_context_t ctx = NULL;
    sink k = { NULL, 0, 0, 0 };
    rc = CLI_EXIT_FAIL;
    fa_status s;
    if ((s = fa_model_load(model_path, &m, err)) != FA_OK ||
        (s = fa_tokenizer_open(tok_path, m->config.vocab_size, &tok, err)) != FA_OK ||
        (s = fa_sampler_create(m->config.vocab_size, (float)temperature, (float)topp,
                               (uint64_t)seed, &smp, err)) != FA_OK) {
        rc = cli_lib_error("generate", err, s);
        goto done;
    }
    k.cap = (int64_t)m->config.seq_len + 1;
    k.ids = malloc(sizeof(int32_t) * (size_t)k.cap);
    if (!k.ids) {
        fprintf(stderr, "flashattn generate: out of memory\n");
        goto done;
    }
    fa_generate_stats gs;
    fa_engine_info ei = { 0 };
    char device[256] = "";
    if (backend == FA_BACKEND_CUDA) {
        const fa_engine_options eo = { .backend = FA_BACKEND_CUDA, .no_graphs = no_graphs };
        const fa_sample_params sp = { (float)temperature, (float)topp, (uint64_t)seed };
        s = generate_engine(m, tok, &eo, prompt, (int32_t)(steps > INT32_MAX ? 0 : steps),
                            chunk < m->config.seq_len ? (int32_t)chunk : 0, &sp, &k, &gs, &ei, device,
                            sizeof(device), err);
    } else {
        cli_blas_note();
        if (!(ctx = cli_context(FA_BACKEND_CPU, (int)threads)))
            goto done;
        /* the cache holds the run's positions only (a long-context model's whole context may
         * not fit in memory) */
        const int32_t context = steps > 0 && steps < m->config.seq_len ? (int32_t)steps : 0;
        const int32_t cap = context ? context : m->config.seq_len;
        fa_model_state_options so = { chunk < cap ? (int32_t)chunk : 0, FA_ALGORITHM_FLASH, matvec, NULL, NULL, 0,
                                      context };
        if ((s = fa_model_state_create(m, ctx, &so, &st, err)) != FA_OK) {
            const size_t n = strlen(err); /* the library's options.context is --steps here */
            if (s == FA_ERR_OUT_OF_MEMORY && !context && n < sizeof(err))
                snprintf(err + n, sizeof(err) - n, " (--steps N sets it to N positions)");
        } else
            s = fa_generate(m, tok, st, smp, prompt, (int32_t)(steps > INT32_MAX ? 0 : steps), on_token, &k,
                            &gs, err);
    }
    end_text(&k);
    if (cli_stdout_ok() != 0) /* the text was lost: no statistics of it */
        goto done;
    if (s != FA_OK) {
        rc = cli_lib_error("generate", err, s);
        goto done;
    }
    if (print_ids) {
        fprintf(stderr, "ids: %d", (int)fa_tokenizer_bos(tok));
        for (int64_t i = 0; i < k.n; i++)
            fprintf(stderr, " %d", (int)k.ids[i]);
        fprintf(stderr, "\n");
    }
    fprintf(stderr,
            "prompt tokens %d, prefill %.3f ms (%.0f tok/s) after a %.3f ms warm-up, decode %d "
            "tokens in %.3f ms (%.1f tok/s), seed %ld",
            (int)gs.prompt_tokens, gs.prefill_s * 1e3,
            gs.prefill_s > 0 ? gs.prompt_tokens / gs.prefill_s : 0.0, gs.warmup_s * 1e3,
            (int)gs.decode_steps,
            gs.decode_s * 1e3, gs.decode_s > 0 ? gs.decode_steps / gs.decode_s : 0.0, seed);
    if (backend == FA_BACKEND_CUDA)
        fprintf(stderr, "; cuda engine on %s, graphs %s (%d captured, %lld steps replayed)%s%s", ei.device,
                ei.graphs ? "on" : "off", (int)ei.graphs_captured, (long long)ei.graph_replays,
                ei.graphs_off ? "; turned off: " : "", ei.graphs_off ? ei.graphs_off : "");
    fprintf(stderr, "\n");
    rc = 0;
done:
    free(k.ids);
    fa_model_state_free(st);
    fa_context_destroy(ctx);
    fa_sampler_free(smp);
    fa_tokenizer_free(tok);
    fa_model_free(m);
    return rc;
}

static const char *gm_help =
    "usage: flashattn gen-model --config SHAPE --out PATH [--seed S]\n"
    "\n"
    "Writes a synthetic llama2.c checkpoint (legacy format) with seeded uniform weights\n"
    "scaled by 1/sqrt(fan_in) and unit norm gains, for benchmarks of any Llama shape.\n"
    "\n"
    "  --config 110m|1b|7b|llama3-8b|DIMxLAYERSxHEADSxKVHEADSxHIDDENxVOCABxSEQ\n"
    "                        110m: 768x12x12x12x2048x32000x1024 (llama2.c stories110M)\n"
    "                        1b:   2048x22x32x4x5632x-32000x2048 (TinyLlama-1.1B)\n"
    "                        7b:   4096x32x32x32x11008x-32000x4096 (Llama-2-7B)\n"
    "                        llama3-8b: 4096x32x32x8x14336x-128256x8192 (Llama-3-8B; its\n"
    "                        rope_theta 5e5 holds in memory, a llama2.c file keeps 1e4)\n"
    "                        a negative VOCAB stores a separate classifier\n"
    "  --out PATH            the checkpoint to write\n"
    "  --seed S                                                      [1]\n";

/* gen-model's progress on stderr for a checkpoint of PROGRESS_BYTES or more: one line rewritten
 * in place on a terminal, else a line every 10%. */
#define PROGRESS_BYTES (256ull << 20)
typedef struct progress {
    const char *path;
    int tty, shown, width; /* shown: the percent last printed; width: the terminal line's */
} progress;

static void on_progress(void *user, uint64_t done, uint64_t total)
{
    progress *p = user;
    const int pct = (int)(100 * done / total), at = p->tty ? pct : pct / 10 * 10;
    if (at <= p->shown)
        return;
    p->shown = at;
    const int n = fprintf(stderr, "%s  writing %s: %d%% of %.2f GiB%s", p->tty ? "\r" : "", p->path, at,
                          (double)total / 1073741824.0, p->tty ? "" : "\n");
    p->width = n > p->width ? n : p->width;
}

int cmd_gen_model(int argc, char **argv)
{
    const char *spec = NULL, *out = NULL;
    long seed = 1;
    enum { CONFIG, OUT, SEED, N_OPTIONS };
    static const cli_option options[N_OPTIONS] = {
        [CONFIG] = { "--config", 1 }, [OUT] = { "--out", 1 }, [SEED] = { "--seed", 1 },
    };
    cli_args args = { "gen-model", gm_help, argc, argv, options, N_OPTIONS, NULL, NULL, 0 };
    int opt, rc;
    const char *v;
    while ((rc = cli_next_option(&args, &opt, &v)) == 1) {
        if (opt == CONFIG)
            spec = v;
        else if (opt == OUT)
            out = v;
        else if (cli_parse_int(v, 0, INT64_MAX, &seed) != 0)
            return cli_usage_error("gen-model", "--seed needs an integer in 0..%lld",
                                   (long long)INT64_MAX);
    }
    if (rc != 0)
        return rc == CLI_HELP ? 0 : rc;
    if (!spec || !out)
        return cli_usage_error("gen-model", "--config and --out are required");
    char err[FA_MODEL_ERR_LEN];
    fa_model_config c;
    uint64_t bytes = 0;
    if (fa_model_config_parse(spec, &c, err) != FA_OK)
        return cli_usage_error("gen-model", "--config: %s", err);
    fa_model_config_check(&c, &bytes, NULL);
    if ((rc = cli_output_ok("gen-model", "--out", out, 0)) != 0)
        return rc;
    /* the room first: a checkpoint of any shape may be asked for, and one past the disk would
     * fill it before failing */
    char dir[4096];
    cli_dir_of(out, dir, sizeof(dir));
    struct statvfs fs;
    if (statvfs(dir, &fs) == 0 && (double)fs.f_bavail * (double)fs.f_frsize < (double)bytes) {
        const double free_b = (double)fs.f_bavail * (double)fs.f_frsize;
        const int gib = (double)bytes >= 1073741824.0; /* small checkpoints in MiB, not 0.00 GiB */
        return cli_fail("gen-model", "the checkpoint takes %.2f %s and '%s' has %.2f %s free",
                        (double)bytes / (gib ? 1073741824.0 : 1048576.0), gib ? "GiB" : "MiB", dir,
                        free_b / (gib ? 1073741824.0 : 1048576.0), gib ? "GiB" : "MiB");
    }
    cli_out f;
    if ((rc = cli_out_open(&f, "gen-model", "--out", out, 0)) != 0)
        return rc;
    progress pg = { out, isatty(STDERR_FILENO), 0, 0 };
    fa_status s = fa_model_synth_write(&c, (uint64_t)seed, f.f, bytes >= PROGRESS_BYTES ? on_progress : NULL, &pg,
                                       err);
    if (pg.tty && pg.width)
        fprintf(stderr, "\r%*s\r", pg.width, "");
    if (s != FA_OK && ferror(f.f)) /* the write's own reason, naming the file */
        return cli_out_check(&f);
    if (s != FA_OK) {
        cli_out_abort(&f);
        return cli_lib_error("gen-model", err, s);
    }
    if ((rc = cli_out_commit(&f)) != 0)
        return rc;
    printf("wrote %s: dim %d, layers %d, heads %d, kv heads %d, hidden %d, vocab %d%s, seq %d, "
           "%.1f MiB, seed %ld\n",
           out, (int)c.dim, (int)c.n_layers, (int)c.n_heads, (int)c.n_kv_heads, (int)c.hidden_dim,
           (int)c.vocab_size, c.shared_classifier ? "" : " (separate classifier)", (int)c.seq_len,
           (double)bytes / 1048576.0, seed);
    return 0;
}

static const char *ex_help =
    "usage: flashattn export-hf --model FILE.bin --out DIR [--tokenizer PATH] [--dtype f32|f16|bf16]\n"
    "                           [--shards N]\n"
    "\n"
    "Writes a llama2.c checkpoint as a Hugging Face Llama directory: config.json and\n"
    "model.safetensors, or N shard files and model.safetensors.index.json. q_proj and k_proj\n"
    "rows are permuted into HF's rotate-half order; f16 and bf16 round to nearest even.\n"
    "With a tokenizer, tokenizer.json too: a tokenizer.bin becomes a sentencepiece-style BPE\n"
    "(merges ranked by the pieces' scores), a tokenizer.json is copied as it was read;\n"
    "without one, a tokenizer.json already in DIR (another model's) is removed.\n"
    "`flashattn generate --model DIR` reads it back.\n"
    "\n"
    "  --model PATH          the llama2.c checkpoint (or an HF directory) to convert\n"
    "  --out DIR             the directory to write (created if missing)\n"
    "  --tokenizer PATH      tokenizer.bin or *.json to write as tokenizer.json\n"
    "                        [--model DIR's tokenizer.json if it has one, else none]\n"
    "  --dtype f32|f16|bf16  tensor type                              [f32]\n"
    "  --shards N            safetensors files                        [1]\n";

/* 1 when dir/name is the file `in` describes. */
static int same_file(const struct stat *in, const char *dir, const char *name)
{
    char path[4200];
    struct stat sb;
    return (size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) < sizeof(path) && stat(path, &sb) == 0 &&
           sb.st_dev == in->st_dev && sb.st_ino == in->st_ino;
}

/* The name under DIR that an export would write over the checkpoint at model (a llama2.c
 * file, mapped while the export reads it: the same file by any name or link), or NULL. An HF
 * directory is read into memory whole, so writing over its files loses nothing. */
static const char *export_clash(const char *model, const char *dir, int shards)
{
    static char name[64];
    struct stat in;
    if (stat(model, &in) != 0 || !S_ISREG(in.st_mode))
        return NULL;
    if (same_file(&in, dir, "tokenizer.json"))
        return "tokenizer.json";
    for (int i = 0; fa_model_hf_file(shards, i, name, sizeof(name)); i++)
        if (same_file(&in, dir, name))
            return name;
    return NULL;
}

/* tokenizer.json written as DIR/tokenizer.json.partial (its name into tok_tmp, the final one
 * into tok_out), DIR created where missing (*made), before the model's files: it is renamed
 * into place after them, so that an export that fails leaves an earlier one whole. 0, or the
 * exit status after one line. */
static int stage_tokenizer(const fa_tokenizer *t, const char *dir, char *tok_out, char *tok_tmp, int *made)
{
    struct stat sb;
    if ((size_t)snprintf(tok_out, 4096, "%s/tokenizer.json", dir) >= 4096)
        return cli_usage_error("export-hf", "--out: path '%.200s/tokenizer.json' is too long", dir);
    *made = mkdir(dir, 0777) == 0;
    if (!*made && errno != EEXIST)
        return cli_usage_error("export-hf", "--out: cannot create directory '%s': %s", dir, strerror(errno));
    if (!*made && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        return cli_usage_error("export-hf", "--out: '%s' exists and is not a directory", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return cli_usage_error("export-hf", "--out: cannot write in '%s': %s", dir, strerror(errno));
    if (stat(tok_out, &sb) == 0 && !S_ISREG(sb.st_mode))
        return cli_usage_error("export-hf", "--out: '%s' is in the way: it is not a regular file", tok_out);
    snprintf(tok_tmp, 4200, "%s.partial", tok_out);
    char err[FA_MODEL_ERR_LEN];
    fa_status s = fa_tokenizer_write_json(t, tok_tmp, err);
    if (s == FA_OK)
        return 0;
    unlink(tok_tmp);
    *tok_tmp = '\0';
    if (*made)
        rmdir(dir);
    return cli_lib_error("export-hf", err, s); /* a full disk: FA_ERR_IO, exit 1 */
}

int cmd_export_hf(int argc, char **argv)
{
    const char *model_path = NULL, *out = NULL, *tok_path = NULL;
    char dir_tok[4096];
    fa_hf_dtype dtype = FA_HF_F32;
    long shards = 1;
    enum { MODEL, OUT, TOKENIZER, DTYPE, SHARDS, N_OPTIONS };
    static const cli_option options[N_OPTIONS] = {
        [MODEL] = { "--model", 1 }, [OUT] = { "--out", 1 }, [TOKENIZER] = { "--tokenizer", 1 },
        [DTYPE] = { "--dtype", 1 }, [SHARDS] = { "--shards", 1 },
    };
    cli_args args = { "export-hf", ex_help, argc, argv, options, N_OPTIONS, NULL, NULL, 0 };
    int opt, rc;
    const char *v;
    while ((rc = cli_next_option(&args, &opt, &v)) == 1) {
        if (opt == MODEL) {
            model_path = v;
        } else if (opt == OUT) {
            out = v;
        } else if (opt == TOKENIZER) {
            tok_path = v;
        } else if (opt == DTYPE) {
            if (strcmp(v, "f32") == 0)
                dtype = FA_HF_F32;
            else if (strcmp(v, "f16") == 0)
                dtype = FA_HF_F16;
            else if (strcmp(v, "bf16") == 0)
                dtype = FA_HF_BF16;
            else
                return cli_usage_error("export-hf", "--dtype needs f32, f16 or bf16");
        } else if (cli_parse_int(v, 1, 99999, &shards) != 0) {
            return cli_usage_error("export-hf", "--shards needs an integer in 1..99999");
        }
    }
    if (rc != 0)
        return rc == CLI_HELP ? 0 : rc;
    if (!model_path || !out)
        return cli_usage_error("export-hf", "--model and --out are required");
    if (!tok_path && dir_tokenizer(model_path, dir_tok, sizeof(dir_tok)))
        tok_path = dir_tok;
    const char *clash = export_clash(model_path, out, (int)shards);
    if (clash)
        return cli_usage_error("export-hf", "--out would overwrite the checkpoint being read (as '%s'): choose "
                                            "another directory", clash);
    char err[FA_MODEL_ERR_LEN], tok_out[4096], tok_tmp[4200] = "";
    fa_model *m;
    fa_tokenizer *t = NULL;
    fa_status s = fa_model_load(model_path, &m, err);
    /* the tokenizer is read before anything is written, so that a bad one leaves no files */
    if (s == FA_OK && tok_path && (s = fa_tokenizer_open(tok_path, m->config.vocab_size, &t, err)) != FA_OK)
        fa_model_free(m);
    if (s != FA_OK)
        return cli_lib_error("export-hf", err, s);
    int made = 0;
    if (t && (rc = stage_tokenizer(t, out, tok_out, tok_tmp, &made)) != 0) {
        fa_tokenizer_free(t);
        fa_model_free(m);
        return rc;
    }
    fa_tokenizer_free(t);
    s = fa_model_write_hf(m, out, dtype, (int32_t)shards, err);
    fa_model_free(m);
    if (s != FA_OK) { /* the directory as it was: the staged tokenizer.json goes too */
        if (*tok_tmp)
            unlink(tok_tmp);
        if (made)
            rmdir(out);
        return cli_lib_error("export-hf", err, s);
    }
    if (*tok_tmp && rename(tok_tmp, tok_out) != 0) {
        const int e = errno;
        unlink(tok_tmp);
        return cli_fail("export-hf", "cannot write '%s': %s (the model's files are written)", tok_out, strerror(e));
    }
    /* a tokenizer.json left from another export would be read with this model */
    int stale = 0;
    if (!tok_path && (size_t)snprintf(tok_out, sizeof(tok_out), "%s/tokenizer.json", out) < sizeof(tok_out))
        stale = unlink(tok_out) == 0;
    printf("wrote %s: %s, %ld file%s%s%s\n", out, dtype == FA_HF_F32 ? "f32" : dtype == FA_HF_F16 ? "f16" : "bf16",
           shards, shards == 1 ? "" : "s and an index", tok_path ? ", tokenizer.json" : "",
           stale ? " (its tokenizer.json, from another export, removed: --tokenizer writes one)" : "");
    return 0;
}
