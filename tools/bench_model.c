/* SPDX-License-Identifier: MIT */
/*
 * `flashattn bench-model`: the Llama runner end to end on a synthetic (or given)
 * checkpoint, prefill and decode with flash attention and with standard attention
 * in the same run.
 */
#include "cli.h"
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *help =
    "usage: flashattn bench-model [options]\n"
    "\n"
    "Runs the Llama runner on a synthetic checkpoint made in memory (seeded weights, the\n"
    "gen-model format) or on --model, twice in one run: attention through flash and through\n"
    "standard attention (S and P in memory). For each: prefill latency and tok/s of one\n"
    "causal prefill of the whole prompt (random token ids), attention's share of it, decode\n"
    "tok/s (one token per step after the prompt), and the memory attention allocates beyond\n"
    "the runner's state (KV cache, activations). Refuses a shape whose weights and state do\n"
    "not fit in the memory available here.\n"
    "\n"
    "  --config 110m|1b|7b|llama3-8b|DIMxLAYERSxHEADSxKVHEADSxHIDDENxVOCABxSEQ  [110m]\n"
    "                        (see `flashattn gen-model --help`); seq grows to fit the run\n"
    "  --model PATH          a checkpoint file or HF directory instead of --config\n"
    "  --prompt-len N        prompt tokens, one prefill                    [512]\n"
    "  --decode N            decode steps after the prompt                 [32]\n"
    "  --seed S              weights and prompt ids                        [1]\n"
    "  --matvec auto|own|blas  one-token projections: own loop or sgemv [auto]\n"
    "  --no-standard         skip the standard-attention run\n"
    "  --backend cpu|cuda    cpu: the float32 runner above; cuda: the engine (bf16, paged KV,\n"
    "                        cuBLAS), prefill and decode tok/s for each --batch: medians of\n"
    "                        --reps passes after a warm-up pass (it captures the graphs) [cpu]\n"
    "  --batch LIST          engine batch sizes, comma-separated (with --batch the CPU runs\n"
    "                        the engine too)                                [1,8,32]\n"
    "  --graphs on|off       cuda: decode steps replay a CUDA graph per batch  [on]\n"
    "  --reps N              engine: timed passes a batch size (1..100)     [3]\n"
    "  --page-size N         engine: tokens a KV page (1..65536)           [16]\n"
    "  --threads N           attention threads, 0 = all cores              [0]\n";

typedef struct result {
    double prefill_ms, attn_ms, decode_tok_s;
    uint64_t workspace;
    int ok;
} result;

typedef struct progress_line {
    char what[64];
    int on; /* off during the warm-up */
} progress_line;

static void progress(void *user, int32_t layer, int32_t n_layers)
{
    const progress_line *p = user;
    if (!p->on)
        return;
    fprintf(stderr, "\r  %s: layer %d/%d%s", p->what, (int)layer, (int)n_layers,
            layer == n_layers ? "\n" : "");
    fflush(stderr);
}

/* The workspace fa_forward would allocate for the prompt's attention (no data touched). */
static uint64_t attention_workspace(fa_context_t ctx, const fa_model_config *c, int32_t n,
                                    fa_algorithm alg)
{
    int32_t hs = c->dim / c->n_heads;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = d.seqlen_k = n;
    d.num_heads_q = c->n_heads;
    d.num_heads_kv = c->n_kv_heads;
    d.head_dim = hs;
    d.causal = 1;
    d.algorithm = alg;
    cli_plan_tensors(&d, FA_DTYPE_F32, NULL);
    fa_run_info ri = { .size = sizeof(ri) };
    return fa_forward_plan(ctx, &d, &ri) == FA_OK ? ri.workspace_bytes : UINT64_MAX;
}

static int run(const fa_model *m, fa_context_t ctx, fa_algorithm alg, fa_matvec mv,
               const int32_t *ids, int32_t n, int32_t decode, result *r)
{
    const char *name = alg == FA_ALGORITHM_FLASH ? "flash" : "standard";
    char err[FA_MODEL_ERR_LEN];
    progress_line line = { .on = 0 };
    snprintf(line.what, sizeof(line.what), "%s prefill of %d tokens", name, (int)n);
    /* per-layer progress for the long prefills only */
    /* the cache holds the run's positions only */
    const int64_t need = (int64_t)n + decode;
    fa_model_state_options o = { n, alg, mv, n >= 2048 ? progress : NULL, &line, 0,
                                 need < m->config.seq_len ? (int32_t)need : 0 };
    fa_model_state *s = NULL;
    fa_status st = fa_model_state_create(m, ctx, &o, &s, err);
    if (st != FA_OK)
        return cli_lib_error("bench-model", err, st);
    float *logits;
    /* warm-up: threads started, pages of the state touched once */
    int32_t warm = n < 16 ? n : 16;
    if ((st = fa_model_forward(m, s, ids, warm, 0, &logits, err)) != FA_OK)
        goto fail;
    line.on = 1;
    /* one prefill per measurement; short prompts are repeated and the median kept */
    double ms[5], attn[5];
    int reps = 0;
    double spent = 0;
    do {
        fa_model_state_reset_stats(s);
        double t0 = cli_now();
        if ((st = fa_model_forward(m, s, ids, n, 0, &logits, err)) != FA_OK)
            goto fail;
        double dt = cli_now() - t0;
        fa_model_stats ms_ = fa_model_state_stats(s);
        ms[reps] = dt * 1e3;
        attn[reps] = ms_.attention_s * 1e3;
        r->workspace = ms_.attention_workspace;
        spent += dt;
        reps++;
    } while (reps < 5 && spent < 2.0);
    r->prefill_ms = cli_median(ms, reps);
    r->attn_ms = cli_median(attn, reps);
    line.on = 0;
    /* decode: greedy continuation of the prompt, one token per forward */
    int32_t tok = ids[n - 1];
    double t0 = cli_now(), shown = t0;
    for (int32_t i = 0; i < decode; i++) {
        int32_t best = 0;
        for (int32_t v = 1; v < m->config.vocab_size; v++)
            best = logits[v] > logits[best] ? v : best;
        tok = best;
        if ((st = fa_model_forward(m, s, &tok, 1, n + i, &logits, err)) != FA_OK)
            goto fail;
        if (cli_now() - shown >= 1.0) { /* a line for decodes that take seconds */
            shown = cli_now();
            fprintf(stderr, "\r  %s decode: token %d/%d", name, (int)i + 1, (int)decode);
            fflush(stderr);
        }
    }
    double dt = cli_now() - t0;
    if (shown > t0)
        fprintf(stderr, "\r  %s decode: token %d/%d\n", name, (int)decode, (int)decode);
    r->decode_tok_s = decode > 0 ? decode / dt : 0.0;
    fa_model_stats fin = fa_model_state_stats(s);
    if (fin.attention_workspace > r->workspace)
        r->workspace = fin.attention_workspace;
    r->ok = 1;
    fa_model_state_free(s);
    return 0;
fail:
    fprintf(stderr, "\nflashattn bench-model: %s (%s)\n", err, fa_status_string(st));
    fa_model_state_free(s);
    return CLI_EXIT_FAIL;
}

int cmd_bench_model(int argc, char **argv)
{
    const char *spec = "110m", *path = NULL;
    long prompt_len = 512, decode = 32, seed = 1, threads = 0, page = 16, reps = 3;
    int no_standard = 0, no_graphs = 0, page_set = 0, reps_set = 0;
    fa_matvec mv = FA_MATVEC_AUTO;
    fa_backend backend = FA_BACKEND_CPU;
    long batches[16] = { 1, 8, 32 };
    int n_batches = 3, engine = 0, config_set = 0;
    enum { CONFIG, MODEL, PROMPT_LEN, DECODE, SEED, MATVEC, NO_STANDARD, BATCH, GRAPHS, PAGE, REPS, N_OPTIONS };
    static const cli_option options[N_OPTIONS] = {
        [CONFIG] = { "--config", 1 }, [MODEL] = { "--model", 1 },
        [PROMPT_LEN] = { "--prompt-len", 1 }, [DECODE] = { "--decode", 1 },
        [SEED] = { "--seed", 1 },     [MATVEC] = { "--matvec", 1 },
        [NO_STANDARD] = { "--no-standard", 0 }, [BATCH] = { "--batch", 1 },
        [GRAPHS] = { "--graphs", 1 }, [PAGE] = { "--page-size", 1 },
        [REPS] = { "--reps", 1 },
    };
    cli_args args = { "bench-model", help, argc, argv, options, N_OPTIONS, &backend, &threads, 0 };
    int opt, rc;
    const char *v;
    while ((rc = cli_next_option(&args, &opt, &v)) == 1) {
        switch (opt) {
        case CONFIG:
            spec = v;
            config_set = 1;
            break;
        case MODEL:
            path = v;
            break;
        case PROMPT_LEN:
            if (cli_parse_int(v, 1, 1 << 24, &prompt_len) != 0)
                return cli_usage_error("bench-model", "--prompt-len needs an integer in 1..%d", 1 << 24);
            break;
        case DECODE:
            if (cli_parse_int(v, 0, 1 << 20, &decode) != 0)
                return cli_usage_error("bench-model", "--decode needs an integer in 0..%d", 1 << 20);
            break;
        case SEED:
            if (cli_parse_int(v, 0, INT64_MAX, &seed) != 0)
                return cli_usage_error("bench-model", "--seed needs an integer in 0..%lld",
                                       (long long)INT64_MAX);
            break;
        case MATVEC:
            if (cli_parse_matvec(v, &mv) != 0)
                return cli_usage_error("bench-model", "--matvec needs auto, own or blas");
            break;
        case NO_STANDARD:
            no_standard = 1;
            break;
        case PAGE:
            if (cli_parse_int(v, 1, 1 << 16, &page) != 0)
                return cli_usage_error("bench-model", "--page-size needs an integer in 1..%d", 1 << 16);
            page_set = 1;
            break;
        case BATCH:
            engine = 1;
            if ((n_batches = cli_parse_int_list(v, 1, 4096, batches, 16)) < 0)
                return cli_usage_error("bench-model", "--batch needs up to 16 batch sizes in 1..4096, "
                                                      "comma-separated");
            break;
        case REPS:
            if (cli_parse_int(v, 1, 100, &reps) != 0)
                return cli_usage_error("bench-model", "--reps needs an integer in 1..100");
            reps_set = 1;
            break;
        case GRAPHS:
            if (cli_parse_graphs(v, &no_graphs) != 0)
                return cli_usage_error("bench-model", "--graphs needs on or off");
            break;
        }
    }
    if (rc != 0)
        return rc == CLI_HELP ? 0 : rc;
    if (backend != FA_BACKEND_CPU && backend != FA_BACKEND_CUDA)
        return cli_usage_error("bench-model", "--backend: the runner runs on cpu or cuda");
    if (path && config_set)
        return cli_usage_error("bench-model", "--config and --model both name the model: give one");
    engine |= backend == FA_BACKEND_CUDA;
    if (page_set && !engine)
        return cli_usage_error("bench-model", "--page-size sizes the engine's KV pages: add --batch or --backend cuda");
    if (reps_set && !engine)
        return cli_usage_error("bench-model", "--reps counts the engine's passes: add --batch or --backend cuda");
    char err[FA_MODEL_ERR_LEN];
    fa_model_config c;
    if (!path) {
        if (fa_model_config_parse(spec, &c, err) != FA_OK)
            return cli_usage_error("bench-model", "--config: %s", err);
        if (c.seq_len < prompt_len + decode)
            c.seq_len = (int32_t)(prompt_len + decode);
    }
    if (backend != FA_BACKEND_CPU) { /* the device first: before the weights are made or read */
        fa_context_t dev = cli_context(backend, 0);
        if (!dev)
            return CLI_EXIT_FAIL;
        fa_context_destroy(dev);
    }
    fa_context_t ctx = cli_context(FA_BACKEND_CPU, (int)threads);
    if (!ctx)
        return CLI_EXIT_FAIL;
    fa_model *m = NULL;
    int32_t *ids = NULL;
    rc = CLI_EXIT_FAIL;
    fa_status st;
    if (path) {
        if ((st = fa_model_load(path, &m, err)) != FA_OK) { /* a llama2.c file or an HF directory */
            rc = cli_lib_error("bench-model", err, st);
            goto done;
        }
        c = m->config;
        if (prompt_len + decode > c.seq_len) {
            rc = cli_usage_error("bench-model", "--prompt-len + --decode (%ld) exceeds the "
                                                "model's seq_len (%d)",
                                 prompt_len + decode, (int)c.seq_len);
            goto done;
        }
    }
    /* a decode step of B rows runs within the engine's token budget, at most seq_len rows */
    for (int i = 0; engine && i < n_batches; i++)
        if (batches[i] > c.seq_len) {
            rc = cli_usage_error("bench-model", "--batch %ld exceeds the model's seq_len (%d), the rows a step "
                                                "can take: use batch sizes up to %d",
                                 batches[i], (int)c.seq_len, (int)c.seq_len);
            goto done;
        }
    uint64_t wbytes = 0;
    if ((st = fa_model_config_check(&c, &wbytes, err)) != FA_OK) {
        rc = cli_lib_error("bench-model", err, st);
        goto done;
    }
    if (backend == FA_BACKEND_CPU)
        cli_blas_note(); /* once the model is known good: a refusal stays one line */
    int32_t hs = c.dim / c.n_heads, n = (int32_t)prompt_len;
    /* run()'s state: a cache of the run's positions, activations of the prompt */
    const double positions = fmin((double)n + (double)decode, (double)c.seq_len);
    double state = 4.0 * ((double)c.n_layers * positions * hs * c.n_kv_heads * 2 +
                          (double)n * (4.0 * c.dim + 2.0 * c.hidden_dim) + c.vocab_size + positions * hs);
    uint64_t ws_flash = attention_workspace(ctx, &c, n, FA_ALGORITHM_FLASH);
    uint64_t ws_std = attention_workspace(ctx, &c, n, FA_ALGORITHM_STANDARD);
    double avail = (double)cli_mem_available(), gib = 1024.0 * 1024.0 * 1024.0;
    double need = (path ? 0.0 : (double)wbytes) + (engine && backend != FA_BACKEND_CPU ? 0.0 : state + (double)ws_flash);
    if (avail > 0 && need > 0.9 * avail) {
        fprintf(stderr,
                "flashattn bench-model: %s needs %.1f GiB (weights %.1f, KV cache and activations "
                "%.1f) but %.1f GiB is available here: refusing (a smaller --config or "
                "--prompt-len fits)\n",
                path ? path : spec, need / gib, path ? 0.0 : wbytes / gib, state / gib, avail / gib);
        goto done;
    }
    if (!no_standard && avail > 0 && need + (double)ws_std > 0.9 * avail) {
        fprintf(stderr,
                "flashattn bench-model: standard attention would allocate %.1f GiB more (S and P "
                "of %d tokens); %.1f GiB available: standard skipped\n",
                ws_std / gib, (int)n, avail / gib);
        no_standard = 1;
    }
    if (!path) {
        fprintf(stderr, "generating %s weights in memory (%.1f MiB, seed %ld)...\n", spec,
                wbytes / 1048576.0, seed);
        double t0 = cli_now();
        if ((st = fa_model_synth(&c, (uint64_t)seed, &m, err)) != FA_OK) {
            rc = cli_lib_error("bench-model", err, st);
            goto done;
        }
        fprintf(stderr, "  done in %.1f s\n", cli_now() - t0);
    }
    ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!ids) {
        fprintf(stderr, "flashattn bench-model: out of memory for the prompt\n");
        goto done;
    }
    uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    for (int32_t i = 0; i < n; i++) { /* xorshift64: random ids, BOS first */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = i == 0 && m->config.bos_id >= 0 ? m->config.bos_id : (int32_t)(x % (uint64_t)c.vocab_size);
    }
    if (engine) {
        rc = cli_bench_engine(m, backend, no_graphs, (int32_t)page, ids, n, (int32_t)decode, batches, n_batches, (int)reps);
        goto done;
    }
    double params = (double)(wbytes - FA_MODEL_HEADER_BYTES) / 4.0 - (double)c.seq_len * hs;
    printf("model %s: dim %d, layers %d, heads %d, kv heads %d, hidden %d, vocab %d%s, "
           "%.1fM parameters (%.1f MiB), seed %ld\n",
           path ? path : spec, (int)c.dim, (int)c.n_layers, (int)c.n_heads, (int)c.n_kv_heads,
           (int)c.hidden_dim, (int)c.vocab_size, c.shared_classifier ? "" : " + classifier",
           params / 1e6, wbytes / 1048576.0, seed);
    printf("prompt %d tokens (one causal prefill), then %ld decode steps; state (KV cache, "
           "activations) %.1f MiB in both runs\n",
           (int)n, decode, state / 1048576.0);
    result res[2] = { { 0 } };
    if ((rc = run(m, ctx, FA_ALGORITHM_FLASH, mv, ids, n, (int32_t)decode, &res[0])) != 0)
        goto done;
    if (!no_standard &&
        (rc = run(m, ctx, FA_ALGORITHM_STANDARD, mv, ids, n, (int32_t)decode, &res[1])) != 0)
        goto done;
    printf("%-9s %11s %13s %9s %10s %12s %15s\n", "attention", "prefill_ms", "prefill_tok/s",
           "attn_ms", "attn_share", "decode_tok/s", "attn_extra_MiB");
    for (int i = 0; i < 2; i++) {
        if (!res[i].ok)
            continue;
        printf("%-9s %11.1f %13.1f %9.1f %9.1f%% %12.1f %15.2f\n", i ? "standard" : "flash",
               res[i].prefill_ms, n / (res[i].prefill_ms * 1e-3), res[i].attn_ms,
               100.0 * res[i].attn_ms / res[i].prefill_ms, res[i].decode_tok_s,
               res[i].workspace / 1048576.0);
    }
    if (res[1].ok)
        printf("prefill end to end: flash %.2fx faster than standard; attention alone %.2fx\n",
               res[1].prefill_ms / res[0].prefill_ms, res[1].attn_ms / res[0].attn_ms);
    rc = 0;
done:
    free(ids);
    fa_model_free(m);
    fa_context_destroy(ctx);
    return rc;
}
