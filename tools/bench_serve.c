/* SPDX-License-Identifier: MIT */
/*
 * `flashattn bench-serve`: the runner serving many requests at once (continuous batching over
 * a paged KV cache: src/model/scheduler.c, steps run by the engine on the CPU or CUDA),
 * requests with seeded random prompt and output lengths arriving at once or as a Poisson
 * process; throughput, time to first token, inter-token latency and page use.
 */
#include "cli.h"
#include "engine.h"
#include "scheduler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The longest span of Poisson arrivals a run takes on (requests / rate, in seconds). */
#define MAX_ARRIVAL_S 3600

static const char *help =
    "usage: flashattn bench-serve [options]\n"
    "\n"
    "Serves --requests requests through the runner's continuous batching: each step mixes the\n"
    "running requests' decode rows with chunks of waiting prompts under --token-budget, the KV\n"
    "cache is --pages pages of --page-size tokens, and a request whose next token finds no page\n"
    "free takes the pages of the latest admitted one (which is recomputed later). Prompts are\n"
    "BOS plus seeded random ids; each request samples with the engine's formula from its own\n"
    "seed (--seed + its index). Steps run on the engine: cpu (float32, OpenBLAS) or cuda\n"
    "(bf16 weights and pages, cuBLAS; decode steps replay CUDA graphs unless --graphs off).\n"
    "Reports generated tok/s (and prompt + generated), time to first token (from arrival),\n"
    "inter-token latency and end-to-end latency percentiles, steps, preemptions and the share\n"
    "of pages in use, with a progress line on stderr while it runs.\n"
    "\n"
    "  --model PATH          llama2.c checkpoint or Hugging Face directory\n"
    "                                                 [" FA_MODELS_DIR "/stories260K.bin]\n"
    "  --config SPEC         synthetic weights of this shape instead (see gen-model)\n"
    "  --requests N          requests                                      [64]\n"
    "  --prompt-len LO,HI    prompt tokens, uniform in LO..HI (BOS included) [16,128]\n"
    "  --output-len LO,HI    generated tokens, uniform in LO..HI          [16,128]\n"
    "  --arrival all|poisson all at time 0, or a Poisson process of --rate [all]\n"
    "  --rate R              requests per second for --arrival poisson     [50]\n"
    "  --pages N             KV cache pages; 0 = room for --max-batch of the longest requests [0]\n"
    "  --page-size N         tokens a page                                 [16]\n"
    "  --max-batch N         sequences a step                              [16]\n"
    "  --token-budget N      query rows a step (>= --max-batch)            [256]\n"
    "  --temperature T       0 = greedy                                    [0]\n"
    "  --topp P              nucleus sampling when T > 0                   [0.9]\n"
    "  --seed S              lengths, prompts, arrivals and sampling       [1]\n"
    "  --json FILE|-         the results as one JSON object\n"
    "  --backend cpu|cuda    the engine's backend (auto: cuda where a device answers) [cpu]\n"
    "  --graphs on|off       cuda: decode steps replay a CUDA graph        [on]\n"
    "  --threads N           cpu: threads, 0 = all cores                   [0]\n";

typedef struct request {
    double arrival, first, last; /* seconds since the start */
    int32_t n, out;              /* prompt and output tokens */
    int32_t produced;            /* tokens generated so far */
    int64_t id;
    int added;
} request;

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1p-53; }

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (nearest rank) of v[0..n) sorted; 0 for none. */
static double quantile(const double *v, size_t n, double q)
{
    if (n == 0)
        return 0.0;
    size_t k = (size_t)ceil(q * (double)n);
    return v[k > 0 ? k - 1 : 0];
}

typedef struct opts {
    const char *model, *config, *json;
    long requests, p_lo, p_hi, o_lo, o_hi, pages, page_size, max_batch, budget, seed, threads;
    int poisson, no_graphs, budget_given;
    double rate, temperature, topp;
} opts;

static int parse_range(const char *v, long lo, long hi, long *a, long *b)
{
    long r[2];
    if (cli_parse_int_list(v, lo, hi, r, 2) != 2 || r[0] > r[1])
        return -1;
    *a = r[0], *b = r[1];
    return 0;
}

static int parse(int argc, char **argv, opts *o, fa_backend *backend)
{
    enum { MODEL, CONFIG, REQUESTS, PROMPT, OUTPUT, ARRIVAL, RATE, PAGES, PAGE_SIZE, BATCH, BUDGET, TEMP, TOPP,
           SEED, JSON, GRAPHS, N_OPTIONS };
    static const cli_option options[N_OPTIONS] = {
        [MODEL] = { "--model", 1 },         [CONFIG] = { "--config", 1 },     [REQUESTS] = { "--requests", 1 },
        [PROMPT] = { "--prompt-len", 1 },   [OUTPUT] = { "--output-len", 1 }, [ARRIVAL] = { "--arrival", 1 },
        [RATE] = { "--rate", 1 },           [PAGES] = { "--pages", 1 },       [PAGE_SIZE] = { "--page-size", 1 },
        [BATCH] = { "--max-batch", 1 },     [BUDGET] = { "--token-budget", 1 }, [TEMP] = { "--temperature", 1 },
        [TOPP] = { "--topp", 1 },           [SEED] = { "--seed", 1 },         [JSON] = { "--json", 1 },
        [GRAPHS] = { "--graphs", 1 },
    };
    cli_args args = { "bench-serve", help, argc, argv, options, N_OPTIONS, backend, &o->threads, 0 };
    int opt, rc;
    const char *v;
    const char *cmd = "bench-serve";
    while ((rc = cli_next_option(&args, &opt, &v)) == 1) {
        switch (opt) {
        case MODEL: o->model = v; break;
        case CONFIG: o->config = v; break;
        case REQUESTS:
            if (cli_parse_int(v, 1, 1000000, &o->requests) != 0)
                return cli_usage_error(cmd, "--requests needs an integer in 1..1000000");
            break;
        case PROMPT:
            if (parse_range(v, 1, 1 << 24, &o->p_lo, &o->p_hi) != 0)
                return cli_usage_error(cmd, "--prompt-len needs LO,HI with 1 <= LO <= HI");
            break;
        case OUTPUT:
            if (parse_range(v, 1, 1 << 24, &o->o_lo, &o->o_hi) != 0)
                return cli_usage_error(cmd, "--output-len needs LO,HI with 1 <= LO <= HI");
            break;
        case ARRIVAL:
            if (strcmp(v, "all") && strcmp(v, "poisson"))
                return cli_usage_error(cmd, "--arrival needs all or poisson");
            o->poisson = strcmp(v, "poisson") == 0;
            break;
        case RATE:
            if (cli_parse_float(v, &o->rate) != 0 || !(o->rate > 0.0) || o->rate > 1e9)
                return cli_usage_error(cmd, "--rate needs requests per second above 0 and at most 1e9, not '%s'", v);
            break;
        case PAGES:
            if (cli_parse_int(v, 0, INT32_MAX, &o->pages) != 0)
                return cli_usage_error(cmd, "--pages needs an integer in 0..%d", INT32_MAX);
            break;
        case PAGE_SIZE:
            if (cli_parse_int(v, 1, 1 << 20, &o->page_size) != 0)
                return cli_usage_error(cmd, "--page-size needs an integer in 1..%d", 1 << 20);
            break;
        case BATCH:
            if (cli_parse_int(v, 1, 1 << 16, &o->max_batch) != 0)
                return cli_usage_error(cmd, "--max-batch needs an integer in 1..%d", 1 << 16);
            break;
        case BUDGET:
            if (cli_parse_int(v, 1, 1 << 20, &o->budget) != 0)
                return cli_usage_error(cmd, "--token-budget needs an integer in 1..%d", 1 << 20);
            o->budget_given = 1;
            break;
        case TEMP:
            if (cli_parse_float(v, &o->temperature) != 0 || !(o->temperature >= 0.0) || o->temperature > 100.0)
                return cli_usage_error(cmd, "--temperature needs a number in 0..100");
            break;
        case TOPP:
            if (cli_parse_float(v, &o->topp) != 0 || !(o->topp >= 0.0) || o->topp > 1.0)
                return cli_usage_error(cmd, "--topp needs a number in 0..1");
            break;
        case SEED:
            if (cli_parse_int(v, 0, INT64_MAX, &o->seed) != 0)
                return cli_usage_error(cmd, "--seed needs an integer in 0..%lld", (long long)INT64_MAX);
            break;
        case JSON: o->json = v; break;
        case GRAPHS:
            if (cli_parse_graphs(v, &o->no_graphs) != 0)
                return cli_usage_error(cmd, "--graphs needs on or off");
            break;
        }
    }
    if (rc != 0)
        return rc == CLI_HELP ? -1 : rc;
    if (*backend != FA_BACKEND_CPU && *backend != FA_BACKEND_CUDA && *backend != FA_BACKEND_AUTO)
        return cli_usage_error(cmd, "--backend: the engine serves on cpu or cuda");
    if (o->model && o->config)
        return cli_usage_error(cmd, "give --model or --config, not both");
    if (o->max_batch > o->budget)
        return cli_usage_error(cmd, "--max-batch (%ld) must not exceed --token-budget (%ld): every running "
                                    "request's decode row fits a step", o->max_batch, o->budget);
    /* the Poisson arrivals span requests / rate seconds on average: at most an hour */
    if (o->poisson && (double)o->requests / o->rate > MAX_ARRIVAL_S)
        return cli_usage_error(cmd, "--rate %g: %ld requests would arrive over about %.3g s, more than the %d s a "
                                    "run may take; raise --rate or lower --requests",
                               o->rate, o->requests, (double)o->requests / o->rate, MAX_ARRIVAL_S);
    return 0;
}

static void sleep_until(double t0, double when)
{
    double dt = when - (cli_now() - t0);
    if (dt > 1.0) /* a second at most: the caller looks again */
        dt = 1.0;
    if (dt > 0.0) {
        struct timespec ts = { (time_t)dt, (long)((dt - floor(dt)) * 1e9) };
        nanosleep(&ts, NULL);
    }
}

int cmd_bench_serve(int argc, char **argv)
{
    opts o = { .requests = 64, .p_lo = 16, .p_hi = 128, .o_lo = 16, .o_hi = 128, .page_size = 16,
               .max_batch = 16, .budget = 256, .seed = 1, .rate = 50.0, .topp = 0.9 };
    fa_backend backend = FA_BACKEND_CPU;
    int rc = parse(argc, argv, &o, &backend);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (o.json && (rc = cli_output_ok("bench-serve", "--json", o.json, 1)) != 0)
        return rc;
    /* with the JSON on standard output, the report goes to stderr (as bench does) */
    FILE *out = o.json && strcmp(o.json, "-") == 0 ? stderr : stdout;
    char err[FA_MODEL_ERR_LEN];
    fa_model *m = NULL;
    fa_status st;
    if (o.config) {
        fa_model_config c;
        if (fa_model_config_parse(o.config, &c, err) != FA_OK)
            return cli_usage_error("bench-serve", "--config: %s", err);
        if (c.seq_len < o.p_hi + o.o_hi)
            c.seq_len = (int32_t)(o.p_hi + o.o_hi);
        st = fa_model_synth(&c, (uint64_t)o.seed, &m, err);
    } else {
        st = fa_model_load(o.model ? o.model : FA_MODELS_DIR "/stories260K.bin", &m, err);
    }
    if (st != FA_OK)
        return cli_lib_error("bench-serve", err, st);
    const fa_model_config *c = &m->config;
    if (c->vocab_size < 4) { /* prompts draw from ids 3.. (0..2: <unk>, BOS, EOS) */
        const int32_t v = c->vocab_size;
        fa_model_free(m);
        return cli_usage_error("bench-serve", "the model's vocab_size (%d) leaves no ids for prompts: it needs 4 "
                                              "or more (0..2 are <unk>, BOS and EOS)", (int)v);
    }
    if (o.p_hi + o.o_hi > c->seq_len) {
        const int32_t ctx_len = c->seq_len;
        fa_model_free(m);
        return cli_usage_error("bench-serve", "the longest request (%ld prompt + %ld output tokens) exceeds the "
                                              "model's context of %d", o.p_hi, o.o_hi, (int)ctx_len);
    }
    if (o.budget > c->seq_len) { /* a step's rows lie in one context: the default fits itself to it */
        const int32_t ctx_len = c->seq_len;
        if (o.budget_given || o.max_batch > ctx_len) {
            fa_model_free(m);
            return cli_usage_error("bench-serve", "%s (%ld) exceeds the model's context of %d%s",
                                   o.budget_given ? "--token-budget" : "--max-batch",
                                   o.budget_given ? o.budget : o.max_batch, (int)ctx_len,
                                   o.budget_given ? "" : " (the default: give a smaller one)");
        }
        o.budget = ctx_len;
    }
    const long per = (o.p_hi + o.o_hi + o.page_size - 1) / o.page_size;
    if (o.pages == 0)
        o.pages = per * o.max_batch > INT32_MAX ? INT32_MAX : per * o.max_batch;
    if (o.pages < per) {
        fa_model_free(m);
        return cli_usage_error("bench-serve", "--pages (%ld) cannot hold the longest request (%ld pages of %ld)",
                               o.pages, per, o.page_size);
    }
    if (backend != FA_BACKEND_CUDA)
        cli_blas_note();
    fa_sched *sc = NULL;
    fa_engine *e = NULL;
    request *rq = calloc((size_t)o.requests, sizeof(request));
    double *itl = malloc(sizeof(double) * (size_t)(o.requests * o.o_hi + 1));
    fa_sample_params *params = malloc(sizeof(fa_sample_params) * (size_t)o.max_batch);
    int32_t *next = malloc(sizeof(int32_t) * (size_t)o.max_batch), *prompt = malloc(sizeof(int32_t) * (size_t)o.p_hi);
    rc = CLI_EXIT_FAIL;
    if (!rq || !itl || !params || !next || !prompt) {
        fprintf(stderr, "flashattn bench-serve: out of memory for %ld requests\n", o.requests);
        goto done;
    }
    /* no request passes its longest prompt and output: the scheduler's tables sized to that */
    const fa_sched_options so = { (int32_t)o.pages, (int32_t)o.page_size, (int32_t)o.max_batch, (int32_t)o.budget,
                                  (int32_t)(o.p_hi + o.o_hi), (int32_t)(o.requests < 1 << 20 ? o.requests : 1 << 20) };
    const fa_engine_options eo = { backend, so.num_pages, so.page_size, so.max_batch, so.token_budget,
                                   (int32_t)o.threads, 0, o.no_graphs };
    if ((st = fa_engine_create(m, &eo, &e, err)) != FA_OK || (st = fa_sched_create(&so, &sc, err)) != FA_OK) {
        rc = cli_lib_error("bench-serve", err, st);
        goto done;
    }
    /* the workload: lengths and arrivals from the seed */
    uint64_t r = (uint64_t)o.seed;
    double t_arrive = 0.0;
    for (long i = 0; i < o.requests; i++) {
        rq[i].n = (int32_t)(o.p_lo + (long)(next_u64(&r) % (uint64_t)(o.p_hi - o.p_lo + 1)));
        rq[i].out = (int32_t)(o.o_lo + (long)(next_u64(&r) % (uint64_t)(o.o_hi - o.o_lo + 1)));
        if (o.poisson)
            t_arrive += -log(1.0 - uniform(&r)) / o.rate;
        rq[i].arrival = t_arrive;
    }
    long added = 0, finished = 0, tokens_out = 0, tokens_in = 0, steps = 0;
    size_t n_itl = 0;
    double pages_sum = 0.0, pages_peak = 0.0, last_print = -1.0;
    const double t0 = cli_now();
    while (finished < o.requests) {
        const double now = cli_now() - t0;
        for (; added < o.requests && rq[added].arrival <= now; added++) {
            request *q = &rq[added];
            prompt[0] = c->bos_id >= 0 ? c->bos_id : FA_TOKEN_BOS % c->vocab_size;
            for (int32_t j = 1; j < q->n; j++)
                prompt[j] = 3 + (int32_t)(next_u64(&r) % (uint64_t)(c->vocab_size - 3));
            if ((st = fa_sched_add(sc, prompt, q->n, q->out, &q->id, err)) != FA_OK) {
                fprintf(stderr, "\nflashattn bench-serve: request %ld: %s (%s)\n", added, err, fa_status_string(st));
                goto done;
            }
            q->added = 1;
            tokens_in += q->n;
        }
        fa_step step;
        if ((st = fa_sched_step(sc, &step, err)) != FA_OK) {
            fprintf(stderr, "\nflashattn bench-serve: %s (%s)\n", err, fa_status_string(st));
            goto done;
        }
        if (step.batch == 0) { /* idle until the next arrival */
            if (added == o.requests) { /* cannot happen: a request alone always fits */
                fprintf(stderr, "\nflashattn bench-serve: the scheduler made no progress\n");
                goto done;
            }
            sleep_until(t0, rq[added].arrival);
            continue;
        }
        for (int32_t b = 0; b < step.batch; b++) /* ids are handed out in order from 0 */
            params[b] = (fa_sample_params){ (float)o.temperature, (float)o.topp, (uint64_t)o.seed + (uint64_t)step.ids[b] };
        if ((st = fa_engine_step(e, &step, params, next, NULL, err)) != FA_OK) {
            fprintf(stderr, "\nflashattn bench-serve: %s (%s)\n", err, fa_status_string(st));
            goto done;
        }
        const double t = cli_now() - t0;
        const fa_sched_stats before = fa_sched_get_stats(sc);
        if ((st = fa_sched_commit(sc, next, NULL, err)) != FA_OK) {
            fprintf(stderr, "\nflashattn bench-serve: %s (%s)\n", err, fa_status_string(st));
            goto done;
        }
        for (int32_t b = 0; b < step.batch; b++) {
            if (!step.sample[b])
                continue;
            request *q = &rq[step.ids[b]];
            if (q->produced++ == 0)
                q->first = t;
            else
                itl[n_itl++] = (t - q->last) * 1e3;
            q->last = t;
            tokens_out++;
            fa_request_info info;
            if (fa_sched_request(sc, q->id, &info, NULL) == FA_OK && info.state == FA_REQUEST_FINISHED) {
                fa_sched_release(sc, q->id, NULL);
                finished++;
            }
        }
        steps++;
        const double used = (double)before.pages_used / (double)so.num_pages;
        pages_sum += used;
        pages_peak = used > pages_peak ? used : pages_peak;
        if (t - last_print >= 0.25 || finished == o.requests) {
            const fa_sched_stats ss = fa_sched_get_stats(sc);
            fprintf(stderr, "\r  step %ld: %ld/%ld done, %d running, %d waiting, pages %d/%d, %.0f tok/s   ", steps,
                    finished, o.requests, (int)ss.running, (int)ss.waiting, (int)ss.pages_used, (int)so.num_pages,
                    tokens_out / fmax(t, 1e-9));
            fflush(stderr);
            last_print = t;
        }
    }
    fprintf(stderr, "\n");
    const double wall = cli_now() - t0;
    double *ttft = malloc(sizeof(double) * (size_t)o.requests), *e2e = malloc(sizeof(double) * (size_t)o.requests);
    if (!ttft || !e2e) {
        free(ttft), free(e2e);
        fprintf(stderr, "flashattn bench-serve: out of memory for the latencies\n");
        goto done;
    }
    for (long i = 0; i < o.requests; i++) {
        ttft[i] = (rq[i].first - rq[i].arrival) * 1e3;
        e2e[i] = (rq[i].last - rq[i].arrival) * 1e3;
    }
    qsort(ttft, (size_t)o.requests, sizeof(double), cmp_double);
    qsort(e2e, (size_t)o.requests, sizeof(double), cmp_double);
    qsort(itl, n_itl, sizeof(double), cmp_double);
    const fa_sched_stats fin = fa_sched_get_stats(sc);
    fprintf(out, "%ld requests (%s), prompts %ld..%ld, outputs %ld..%ld tokens; %d pages of %d, batch <= %d, "
            "budget %d rows\n",
            o.requests, o.poisson ? "Poisson arrivals" : "all at once", o.p_lo, o.p_hi, o.o_lo, o.o_hi,
            (int)so.num_pages, (int)so.page_size, (int)so.max_batch, (int)so.token_budget);
    fprintf(out, "throughput: %.1f generated tok/s, %.1f tok/s with prompts, %.2f s, %ld steps, %lld "
            "preemptions\n",
            tokens_out / wall, (tokens_out + tokens_in) / wall, wall, steps, (long long)fin.preemptions);
    fprintf(out, "time to first token ms: p50 %.2f  p90 %.2f  p99 %.2f\n",
            quantile(ttft, (size_t)o.requests, 0.5), quantile(ttft, (size_t)o.requests, 0.9),
            quantile(ttft, (size_t)o.requests, 0.99));
    fprintf(out, "inter-token latency ms: p50 %.3f  p90 %.3f  p99 %.3f\n", quantile(itl, n_itl, 0.5),
            quantile(itl, n_itl, 0.9), quantile(itl, n_itl, 0.99));
    fprintf(out, "end-to-end latency ms:  p50 %.1f  p90 %.1f  p99 %.1f\n",
            quantile(e2e, (size_t)o.requests, 0.5), quantile(e2e, (size_t)o.requests, 0.9),
            quantile(e2e, (size_t)o.requests, 0.99));
    fprintf(out, "pages in use: mean %.0f%%, peak %.0f%%\n", 100.0 * pages_sum / (double)steps, 100.0 * pages_peak);
    const fa_engine_info ei = fa_engine_get_info(e);
    if (ei.backend == FA_BACKEND_CUDA)
        fprintf(out, "engine: cuda on %s, graphs %s (%d batches captured, %lld decode steps replayed)%s%s\n",
                ei.device, ei.graphs ? "on" : "off", (int)ei.graphs_captured, (long long)ei.graph_replays,
                ei.graphs_off ? "; turned off: " : "", ei.graphs_off ? ei.graphs_off : "");
    else
        fprintf(out, "engine: cpu\n");
    rc = 0;
    cli_out json;
    if (o.json && (rc = cli_out_open(&json, "bench-serve", "--json", o.json, 1)) == 0) {
        fprintf(json.f,
                "{\"requests\": %ld, \"arrival\": \"%s\", \"rate\": %g, \"prompt_len\": [%ld, %ld], "
                "\"output_len\": [%ld, %ld], \"pages\": %d, \"page_size\": %d, \"max_batch\": %d, "
                "\"token_budget\": %d, \"seconds\": %.6f, \"generated_tok_s\": %.3f, \"total_tok_s\": %.3f, "
                "\"steps\": %ld, \"preemptions\": %lld, \"ttft_ms\": [%.4f, %.4f, %.4f], "
                "\"itl_ms\": [%.4f, %.4f, %.4f], \"e2e_ms\": [%.4f, %.4f, %.4f], \"pages_mean\": %.4f, "
                "\"pages_peak\": %.4f, \"seed\": %ld, \"backend\": \"%s\", \"graphs\": %d, "
                "\"graph_replays\": %lld}\n",
                o.requests, o.poisson ? "poisson" : "all", o.poisson ? o.rate : 0.0, o.p_lo, o.p_hi, o.o_lo,
                o.o_hi, (int)so.num_pages, (int)so.page_size, (int)so.max_batch, (int)so.token_budget, wall,
                tokens_out / wall, (tokens_out + tokens_in) / wall, steps, (long long)fin.preemptions,
                quantile(ttft, (size_t)o.requests, 0.5), quantile(ttft, (size_t)o.requests, 0.9),
                quantile(ttft, (size_t)o.requests, 0.99), quantile(itl, n_itl, 0.5), quantile(itl, n_itl, 0.9),
                quantile(itl, n_itl, 0.99), quantile(e2e, (size_t)o.requests, 0.5),
                quantile(e2e, (size_t)o.requests, 0.9), quantile(e2e, (size_t)o.requests, 0.99),
                pages_sum / (double)steps, pages_peak, o.seed, fa_backend_name(ei.backend), (int)ei.graphs,
                (long long)ei.graph_replays);
        rc = cli_out_commit(&json);
    }
    free(ttft), free(e2e);
done:
    free(rq), free(itl), free(params), free(next), free(prompt);
    fa_sched_free(sc);
    fa_engine_free(e);
    fa_model_free(m);
    return rc;
}
