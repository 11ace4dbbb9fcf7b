/* SPDX-License-Identifier: MIT */
/*
 * The Llama runner: stories260K's greedy output against the models README, the tokenizer
 * (the README's prompt ids, round trips of random text), prefill = chunked prefill =
 * token-by-token decode, the sampler, and the loaders' refusals of broken files.
 * FLASHATTN_TEST_SEED=N replays the random cases.
 */
#include "model.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static uint64_t seed;

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The README's example: "Once upon a time", temperature 0, 64 steps: BOS and 64 tokens. */
static const int32_t readme_ids[65] = {
    1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
    338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426,
    385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266,
    267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310,
};

typedef struct story {
    fa_model *m;
    fa_tokenizer *t;
    fa_context_t ctx;
} story;

static int story_setup(void **state)
{
    story *s = calloc(1, sizeof(*s));
    char err[FA_MODEL_ERR_LEN];
    fa_context_options o = { sizeof(o), FA_BACKEND_CPU, 0 };
    if (!s || fa_model_open(FA_MODELS_DIR "/stories260K.bin", &s->m, err) != FA_OK ||
        fa_tokenizer_open(FA_MODELS_DIR "/tok512.bin", s->m->config.vocab_size, &s->t, err) != FA_OK ||
        fa_context_create(&o, &s->ctx) != FA_OK) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    *state = s;
    return 0;
}

static int story_teardown(void **state)
{
    story *s = *state;
    fa_context_destroy(s->ctx);
    fa_tokenizer_free(s->t);
    fa_model_free(s->m);
    free(s);
    return 0;
}

typedef struct collect {
    int32_t ids[1024];
    int n;
    char text[8192];
    size_t len;
} collect;

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    collect *c = user;
    c->ids[c->n++] = token;
    if (c->len + len < sizeof(c->text)) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = 0;
    }
    return 0;
}

/* context: the state's cache positions (0 = seq_len) */
static void generate(story *s, const char *prompt, int steps, int32_t chunk, fa_matvec mv, int32_t context,
                     collect *c)
{
    char err[FA_MODEL_ERR_LEN];
    fa_model_state *st;
    fa_sampler *smp;
    fa_model_state_options o = { chunk, FA_ALGORITHM_FLASH, mv, NULL, NULL, 0, context };
    assert_int_equal(fa_model_state_create(s->m, s->ctx, &o, &st, err), FA_OK);
    assert_int_equal(fa_sampler_create(s->m->config.vocab_size, 0.0f, 0.9f, 1, &smp, err), FA_OK);
    memset(c, 0, sizeof(*c));
    c->ids[c->n++] = FA_TOKEN_BOS;
    fa_generate_stats gs;
    assert_int_equal(fa_generate(s->m, s->t, st, smp, prompt, steps, on_token, c, &gs, err), FA_OK);
    fa_sampler_free(smp);
    fa_model_state_free(st);
}

static void test_greedy_readme(void **state)
{
    collect c;
    for (int v = 0; v < 4; v++) { /* whole prefill; 3-token chunks; BLAS matvec; a 64-position cache */
        generate(*state, "Once upon a time", v == 3 ? 0 : 64, v == 1 ? 3 : 0, v == 2 ? FA_MATVEC_BLAS : FA_MATVEC_OWN,
                 v == 3 ? 64 : 0, &c);
        assert_int_equal(c.n, 65);
        for (int i = 0; i < 65; i++)
            if (c.ids[i] != readme_ids[i]) {
                fprintf(stderr, "variant %d: id %d is %d, the README has %d\n", v, i, (int)c.ids[i],
                        (int)readme_ids[i]);
                fail();
            }
        assert_string_equal(c.text, "Once upon a time, there was a little girl named Lily. She "
                                    "loved to play outside in the park. One day, she saw a big, red "
                                    "ball. She wanted to play with it, but it was too high.\nLily");
    }
    /* a prompt longer than steps is cut: BOS, then prompt ids up to `steps` */
    generate(*state, "Once upon a time", 3, 0, FA_MATVEC_OWN, 3, &c);
    assert_int_equal(c.n, 4);
    assert_int_equal(c.ids[3], 261);
}

/* Generation ends at EOS as at BOS, and emits neither: a model whose every next token is EOS
 * (attention and FFN outputs zeroed, so the hidden state is the token's embedding, whose
 * first element is made positive; the final norm keeps only that element; only EOS's row of
 * the classifier weighs it). */
static void test_stops_at_eos(void **state)
{
    story *s = *state;
    char err[FA_MODEL_ERR_LEN];
    const fa_model_config c = { 64, 96, 2, 8, 4, 512, 64, 0, 0.0f, 0.0f, { 0 }, 0, 0, { 0 } };
    fa_model *m;
    assert_int_equal(fa_model_synth(&c, 7, &m, err), FA_OK);
    float *wo = (float *)m->w.wo, *w2 = (float *)m->w.w2, *rf = (float *)m->w.rms_final;
    float *emb = (float *)m->w.token_embedding, *cls = (float *)m->w.classifier;
    memset(wo, 0, sizeof(float) * c.n_layers * c.dim * c.dim);
    memset(w2, 0, sizeof(float) * c.n_layers * c.dim * c.hidden_dim);
    for (int i = 0; i < c.dim; i++)
        rf[i] = i == 0 ? 1.0f : 0.0f;
    for (int r = 0; r < c.vocab_size; r++)
        emb[(size_t)r * c.dim] = 1.0f;
    memset(cls, 0, sizeof(float) * c.vocab_size * c.dim);
    cls[(size_t)FA_TOKEN_EOS * c.dim] = 1.0f;

    fa_model_state *st;
    fa_sampler *smp;
    assert_int_equal(fa_model_state_create(m, s->ctx, NULL, &st, err), FA_OK);
    assert_int_equal(fa_sampler_create(c.vocab_size, 0.0f, 0.9f, 1, &smp, err), FA_OK);
    collect col;
    memset(&col, 0, sizeof(col));
    fa_generate_stats gs;
    assert_int_equal(fa_generate(m, s->t, st, smp, "Once upon", 40, on_token, &col, &gs, err), FA_OK);
    assert_int_equal(gs.generated, 1);    /* EOS sampled right after the prompt */
    assert_int_equal(gs.decode_steps, 0); /* and nothing run after it */
    assert_int_equal(col.n, gs.prompt_tokens - 1); /* the prompt's tokens after BOS only */
    for (int i = 0; i < col.n; i++)
        assert_int_not_equal(col.ids[i], FA_TOKEN_EOS);
    fa_sampler_free(smp);
    fa_model_state_free(st);
    fa_model_free(m);
}

/* A NaN in the final norm's weights: generation stops with a message naming the logits'
 * position, once the prompt is in; greedy or sampled. */
static void test_nan_weights(void **state)
{
    story *s = *state;
    char err[FA_MODEL_ERR_LEN];
    const fa_model_config c = { 64, 96, 2, 8, 4, 512, 64, 0, 0.0f, 0.0f, { 0 }, 0, 0, { 0 } };
    fa_model *m;
    assert_int_equal(fa_model_synth(&c, 7, &m, err), FA_OK);
    ((float *)m->w.rms_final)[5] = NAN;
    for (int k = 0; k < 2; k++) {
        fa_model_state *st;
        fa_sampler *smp;
        assert_int_equal(fa_model_state_create(m, s->ctx, NULL, &st, err), FA_OK);
        assert_int_equal(fa_sampler_create(c.vocab_size, k ? 0.8f : 0.0f, 0.9f, 1, &smp, err), FA_OK);
        collect col;
        memset(&col, 0, sizeof(col));
        fa_generate_stats gs;
        assert_int_equal(fa_generate(m, s->t, st, smp, "Once upon", 40, on_token, &col, &gs, err),
                         FA_ERR_INVALID_VALUE);
        if (!strstr(err, "NaN") || !strstr(err, "position"))
            fail_msg("message '%s'", err);
        assert_int_equal(col.n, gs.prompt_tokens - 1); /* the prompt, no token after it */
        fa_sampler_free(smp);
        fa_model_state_free(st);
    }
    /* a sampler of another vocabulary: refused before anything runs */
    fa_model_state *st;
    fa_sampler *smp;
    assert_int_equal(fa_model_state_create(m, s->ctx, NULL, &st, err), FA_OK);
    assert_int_equal(fa_sampler_create(c.vocab_size + 1, 0.0f, 0.9f, 1, &smp, err), FA_OK);
    fa_generate_stats gs;
    assert_int_equal(fa_generate(m, s->t, st, smp, "Once", 8, NULL, NULL, &gs, err), FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(err, "sampler vocab_size"));
    fa_sampler_free(smp);
    fa_model_state_free(st);
    fa_model_free(m);
}

static void test_encode_prompt(void **state)
{
    story *s = *state;
    int32_t ids[32], n;
    char err[FA_MODEL_ERR_LEN];
    assert_int_equal(fa_tokenizer_encode(s->t, "Once upon a time", 1, 0, ids, 32, &n, err), FA_OK);
    const int32_t want[] = { 1, 403, 407, 261, 378 };
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof(want));
    assert_int_equal(fa_tokenizer_encode(s->t, "", 1, 1, ids, 32, &n, err), FA_OK);
    assert_int_equal(n, 2); /* BOS, EOS: no dummy prefix for empty text */
    assert_int_equal(ids[1], FA_TOKEN_EOS);
    /* a byte the vocabulary has no piece for: byte fallback, byte + 3 */
    assert_int_equal(fa_tokenizer_encode(s->t, "\x01", 0, 0, ids, 32, &n, err), FA_OK);
    assert_int_equal(ids[n - 1], 0x01 + 3);
    size_t len;
    assert_memory_equal(fa_tokenizer_decode(s->t, 5, 13, &len), "\n", 1); /* <0x0A> */
    assert_int_equal(len, 1);
    assert_int_equal(fa_tokenizer_encode(s->t, "abc", 1, 0, ids, 5, &n, err), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "cap"));
}

/* Random text (ASCII, Latin, CJK, emoji, control bytes) encodes and decodes back. */
static void test_tokenizer_roundtrip(void **state)
{
    story *s = *state;
    static const char *alphabet[] = { "a", "e", " ", "t", "he", "Once", ".", "\n", "\t", "\x01",
                                      "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x99\x82", "Z", "  ", "'" };
    uint64_t r = seed;
    for (int round = 0; round < 200; round++) {
        char text[256] = "";
        int parts = (int)(next(&r) % 20);
        for (int i = 0; i < parts; i++)
            strcat(text, alphabet[next(&r) % (sizeof(alphabet) / sizeof(alphabet[0]))]);
        int32_t ids[300], n;
        char err[FA_MODEL_ERR_LEN], back[1024];
        assert_int_equal(fa_tokenizer_encode(s->t, text, 1, 0, ids, 300, &n, err), FA_OK);
        size_t at = 0;
        for (int i = 1; i < n; i++) {
            size_t len;
            const char *p = fa_tokenizer_decode(s->t, ids[i - 1], ids[i], &len);
            assert_true(ids[i] >= 0 && ids[i] < 512);
            memcpy(back + at, p, len);
            at += len;
        }
        back[at] = 0;
        if (strcmp(back, text) != 0) {
            fprintf(stderr, "round %d: '%s' came back as '%s'\n", round, text, back);
            fail();
        }
    }
}

/* Logits of the last token: one prefill = chunks of 7 = one token at a time, on a GQA
 * synthetic model (head_size 16) with random tokens. */
static void test_prefill_equals_decode(void **state)
{
    story *s = *state;
    char err[FA_MODEL_ERR_LEN];
    fa_model_config c;
    fa_model *m;
    /* the named shapes: Llama-3-8B's GQA, vocabulary and RoPE base */
    assert_int_equal(fa_model_config_parse("llama3-8b", &c, err), FA_OK);
    assert_int_equal(c.n_heads, 32);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.hidden_dim, 14336);
    assert_false(c.shared_classifier);
    assert_true(c.rope_theta == 5e5f);
    assert_int_equal(fa_model_config_parse("7b", &c, err), FA_OK);
    assert_true(c.rope_theta == 0.0f); /* llama2.c's default */
    assert_int_equal(fa_model_config_parse("64x3x4x2x96x300x80", &c, err), FA_OK);
    assert_int_equal(fa_model_synth(&c, seed, &m, err), FA_OK);
    uint64_t r = seed ^ 77;
    enum { N = 61 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)(next(&r) % 300);
    float *ref = malloc(sizeof(float) * 300);
    const int32_t chunks[] = { 0, 7, 1 };
    for (int v = 0; v < 3; v++) {
        fa_model_state *st;
        fa_model_state_options o = { chunks[v], FA_ALGORITHM_FLASH, FA_MATVEC_OWN, NULL, NULL, 0, 0 };
        assert_int_equal(fa_model_state_create(m, s->ctx, &o, &st, err), FA_OK);
        float *logits;
        if (v < 2) {
            assert_int_equal(fa_model_forward(m, st, ids, N, 0, &logits, err), FA_OK);
        } else {
            for (int i = 0; i < N; i++)
                assert_int_equal(fa_model_forward(m, st, &ids[i], 1, i, &logits, err), FA_OK);
        }
        if (v == 0) {
            memcpy(ref, logits, sizeof(float) * 300);
        } else {
            double mx = 0, scale = 0;
            for (int i = 0; i < 300; i++) {
                mx = fmax(mx, fabs(logits[i] - ref[i]));
                scale = fmax(scale, fabs(ref[i]));
            }
            printf("prefill vs %s: max |logit diff| %.3g (largest logit %.3g)\n",
                   v == 1 ? "7-token chunks" : "token by token", mx, scale);
            assert_true(scale > 0.1);
            assert_true(mx <= 1e-4 * scale);
        }
        fa_model_state_free(st);
    }
    free(ref);
    fa_model_free(m);
}

static void test_sampler(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN];
    fa_sampler *g, *t;
    float logits[4] = { 0.1f, 2.0f, -1.0f, 1.9f };
    assert_int_equal(fa_sampler_create(4, 0.0f, 0.0f, 1, &g, err), FA_OK);
    assert_int_equal(fa_sampler_sample(g, logits), 1);
    float bad[4] = { 0.1f, NAN, -1.0f, 1.9f };
    assert_int_equal(fa_sampler_sample(g, bad), -1);
    fa_sampler_free(g);
    /* every logit -inf: the first id at any temperature, as fa_sample_logits gives */
    assert_int_equal(fa_sampler_create(4, 1.0f, 0.0f, 1, &g, err), FA_OK);
    float none[4] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    assert_int_equal(fa_sampler_sample(g, none), 0);
    fa_sampler_free(g);
    /* temperature 1: frequencies follow softmax; top-p 0.5 keeps only the best token */
    assert_int_equal(fa_sampler_create(4, 1.0f, 0.0f, seed | 1, &t, err), FA_OK);
    int count[4] = { 0 };
    for (int i = 0; i < 20000; i++) {
        float l[4] = { 0.1f, 2.0f, -1.0f, 1.9f };
        int32_t k = fa_sampler_sample(t, l);
        assert_true(k >= 0 && k < 4);
        count[k]++;
    }
    fa_sampler_free(t);
    double z = expf(0.1f) + expf(2.0f) + expf(-1.0f) + expf(1.9f);
    assert_true(fabs(count[1] / 20000.0 - exp(2.0) / z) < 0.02);
    assert_true(fabs(count[2] / 20000.0 - exp(-1.0) / z) < 0.01);
    assert_int_equal(fa_sampler_create(4, 1.0f, 0.5f, seed | 1, &t, err), FA_OK);
    for (int i = 0; i < 1000; i++) {
        float l[4] = { 0.1f, 2.0f, -1.0f, 1.9f };
        int32_t k = fa_sampler_sample(t, l);
        assert_true(k == 1 || k == 3);
    }
    fa_sampler_free(t);
    assert_int_equal(fa_sampler_create(4, -1.0f, 0.5f, 1, &t, err), FA_ERR_INVALID_VALUE);
    assert_null(t);
    assert_non_null(strstr(err, "temperature"));
}

/* ---- refusals ---- */

static unsigned char *image(const char *spec, size_t *bytes)
{
    fa_model_config c;
    fa_model *m;
    char err[FA_MODEL_ERR_LEN];
    assert_int_equal(fa_model_config_parse(spec, &c, err), FA_OK);
    assert_int_equal(fa_model_synth(&c, 5, &m, err), FA_OK);
    unsigned char *p = malloc(m->bytes + 64);
    memcpy(p, m->image, m->bytes);
    *bytes = m->bytes;
    fa_model_free(m);
    return p;
}

static void expect_refusal(const unsigned char *p, size_t bytes, fa_status want, const char *field)
{
    fa_model *m = (fa_model *)0x1;
    char err[FA_MODEL_ERR_LEN] = "";
    fa_status st = fa_model_from_memory(p, bytes, 0, &m, err);
    if (st != want || !strstr(err, field)) {
        fprintf(stderr, "want %s naming '%s', got %s: %s\n", fa_status_string(want), field,
                fa_status_string(st), err);
        fail();
    }
    assert_null(m);
}

static void set_field(unsigned char *p, int field, int32_t v)
{
    memcpy(p + 4 * field, &v, 4);
}

static void test_checkpoint_refusals(void **state)
{
    (void)state;
    size_t bytes;
    unsigned char *p = image("32x2x4x2x48x40x16", &bytes), *q = malloc(bytes + 64);
    fa_model *m;
    char err[FA_MODEL_ERR_LEN];
    assert_int_equal(fa_model_from_memory(p, bytes, 0, &m, err), FA_OK);
    assert_int_equal(m->config.n_kv_heads, 2);
    assert_ptr_equal(m->w.classifier, m->w.token_embedding);
    fa_model_free(m);
    expect_refusal(p, bytes - 1, FA_ERR_INVALID_SHAPE, "truncated");
    expect_refusal(p, bytes + 4, FA_ERR_INVALID_SHAPE, "trailing");
    expect_refusal(p, 27, FA_ERR_INVALID_SHAPE, "header");
    expect_refusal(p, 0, FA_ERR_INVALID_SHAPE, "header");
    expect_refusal(p + 1, bytes - 1, FA_ERR_INVALID_ARGUMENT, "aligned");
    /* one header field at a time: dim hidden layers heads kv vocab seq */
    const struct {
        int field;
        int32_t v;
        fa_status st;
        const char *name;
    } bad[] = {
        { 0, 0, FA_ERR_INVALID_SHAPE, "dim" },           { 0, -32, FA_ERR_INVALID_SHAPE, "dim" },
        { 1, -1, FA_ERR_INVALID_SHAPE, "hidden_dim" },   { 2, 0, FA_ERR_INVALID_SHAPE, "n_layers" },
        { 3, 0, FA_ERR_INVALID_SHAPE, "n_heads" },       { 3, 5, FA_ERR_INVALID_SHAPE, "n_heads" },
        { 3, 32, FA_ERR_INVALID_SHAPE, "head_size" },    { 4, 3, FA_ERR_INVALID_SHAPE, "n_kv_heads" },
        { 4, 8, FA_ERR_INVALID_SHAPE, "n_kv_heads" },    { 4, -2, FA_ERR_INVALID_SHAPE, "n_kv_heads" },
        { 5, 0, FA_ERR_INVALID_SHAPE, "vocab_size" },    { 5, INT32_MIN, FA_ERR_INVALID_SHAPE, "no magnitude" },
        { 5, -40, FA_ERR_INVALID_SHAPE, "truncated" }, /* a separate classifier the file lacks */
        { 6, 0, FA_ERR_INVALID_SHAPE, "seq_len" },       { 6, 17, FA_ERR_INVALID_SHAPE, "truncated" },
        { 1, INT32_MAX, FA_ERR_INVALID_SHAPE, "truncated" },
        { 2, INT32_MAX, FA_ERR_INVALID_SHAPE, "truncated" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memcpy(q, p, bytes);
        set_field(q, bad[i].field, bad[i].v);
        expect_refusal(q, bytes, bad[i].st, bad[i].name);
    }
    /* head_size 512 > FA_MAX_HEAD_DIM; sizes that overflow 64 bits */
    memcpy(q, p, bytes);
    set_field(q, 0, 1024), set_field(q, 3, 2), set_field(q, 4, 2);
    expect_refusal(q, bytes, FA_ERR_INVALID_SHAPE, "head_size");
    memcpy(q, p, bytes);
    set_field(q, 0, 1 << 24), set_field(q, 3, 1 << 16), set_field(q, 4, 1 << 16);
    set_field(q, 2, INT32_MAX);
    expect_refusal(q, bytes, FA_ERR_SIZE_OVERFLOW, "64-bit");
    /* a separate classifier is found at the end */
    free(p);
    p = image("32x2x4x2x48x-40x16", &bytes);
    assert_int_equal(fa_model_from_memory(p, bytes, 0, &m, err), FA_OK);
    assert_true(m->w.classifier == m->w.rms_final + 32 + 16 * 8);
    assert_int_equal((const unsigned char *)(m->w.classifier + 40 * 32) - p, (long)bytes);
    fa_model_free(m);
    free(p);
    free(q);
    assert_int_equal(fa_model_open("/nonexistent/model.bin", &m, err), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "/nonexistent/model.bin"));
    assert_int_equal(fa_model_config_parse("64x2", &(fa_model_config){ 0 }, err), FA_ERR_INVALID_SHAPE);
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char *buf = malloc(1 << 16);
    *n = fread(buf, 1, 1 << 16, f);
    fclose(f);
    return buf;
}

static void expect_tok_refusal(const unsigned char *p, size_t n, int32_t vocab, fa_status want,
                               const char *field)
{
    fa_tokenizer *t = (fa_tokenizer *)0x1;
    char err[FA_MODEL_ERR_LEN] = "";
    fa_status st = fa_tokenizer_from_memory(p, n, vocab, &t, err);
    if (st != want || !strstr(err, field)) {
        fprintf(stderr, "tokenizer: want %s naming '%s', got %s: %s\n", fa_status_string(want),
                field, fa_status_string(st), err);
        fail();
    }
    assert_null(t);
}

static void test_tokenizer_refusals(void **state)
{
    (void)state;
    size_t n;
    unsigned char *p = read_file(FA_MODELS_DIR "/tok512.bin", &n), *q = malloc(n);
    fa_tokenizer *t;
    char err[FA_MODEL_ERR_LEN];
    assert_int_equal(n, 6227);
    assert_int_equal(fa_tokenizer_from_memory(p, n, 512, &t, err), FA_OK);
    fa_tokenizer_free(t);
    expect_tok_refusal(p, n, 511, FA_ERR_INVALID_SHAPE, "vocab_size");  /* pieces left over */
    expect_tok_refusal(p, n, 513, FA_ERR_INVALID_SHAPE, "vocab_size");  /* one piece short */
    expect_tok_refusal(p, n, 2, FA_ERR_INVALID_SHAPE, "vocab_size");
    expect_tok_refusal(p, n - 1, 512, FA_ERR_INVALID_SHAPE, "token 511");
    expect_tok_refusal(p, 3, 512, FA_ERR_INVALID_SHAPE, "max_token_length");
    int32_t v = 0;
    memcpy(q, p, n), memcpy(q, &v, 4);
    expect_tok_refusal(q, n, 512, FA_ERR_INVALID_SHAPE, "max_token_length");
    /* record 0: score at 4, len at 8 */
    v = -1;
    memcpy(q, p, n), memcpy(q + 8, &v, 4);
    expect_tok_refusal(q, n, 512, FA_ERR_INVALID_SHAPE, "len of token 0");
    v = 8; /* over max_token_length (7) */
    memcpy(q, p, n), memcpy(q + 8, &v, 4);
    expect_tok_refusal(q, n, 512, FA_ERR_INVALID_SHAPE, "len of token 0");
    float nan = NAN;
    memcpy(q, p, n), memcpy(q + 4, &nan, 4);
    expect_tok_refusal(q, n, 512, FA_ERR_INVALID_VALUE, "score of token 0");
    free(p);
    free(q);
    assert_int_equal(fa_tokenizer_open("/nonexistent/tok.bin", 512, &t, err), FA_ERR_INVALID_ARGUMENT);
    assert_null(t);
}

/* A FIFO (open() would wait for a writer) and a directory, as checkpoint and as tokenizer:
 * refused at once as not regular files. SIGALRM ends a run that blocks. */
static void test_non_regular_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/fa_model_XXXXXX", fifo[64];
    assert_non_null(mkdtemp(dir));
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *paths[] = { fifo, dir };
    char err[FA_MODEL_ERR_LEN];
    alarm(20);
    for (int i = 0; i < 2; i++) {
        fa_model *m = (fa_model *)0x1;
        fa_tokenizer *t = (fa_tokenizer *)0x1;
        assert_int_equal(fa_model_open(paths[i], &m, err), FA_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err, "is not a regular file"));
        assert_null(m);
        assert_int_equal(fa_tokenizer_open(paths[i], 512, &t, err), FA_ERR_INVALID_ARGUMENT);
        if (!strstr(err, "is not a regular file")) {
            fprintf(stderr, "tokenizer '%s': %s\n", paths[i], err);
            fail();
        }
        assert_null(t);
    }
    alarm(0);
    unlink(fifo);
    rmdir(dir);
}

static void test_forward_refusals(void **state)
{
    story *s = *state;
    char err[FA_MODEL_ERR_LEN];
    fa_model_state *st;
    assert_int_equal(fa_model_state_create(s->m, s->ctx, NULL, &st, err), FA_OK);
    int32_t ids[2] = { 1, 512 };
    float *logits = NULL;
    assert_int_equal(fa_model_forward(s->m, st, ids, 2, 0, &logits, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "tokens[1]"));
    assert_null(logits);
    assert_int_equal(fa_model_forward(s->m, st, ids, 1, 512, &logits, err), FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(err, "seq_len"));
    assert_int_equal(fa_model_forward(s->m, st, ids, 0, 0, &logits, err), FA_ERR_INVALID_SHAPE);
    fa_model_state_free(st);
    fa_model_state_options o = { 513, FA_ALGORITHM_FLASH, FA_MATVEC_OWN, NULL, NULL, 0, 0 };
    assert_int_equal(fa_model_state_create(s->m, s->ctx, &o, &st, err), FA_ERR_INVALID_VALUE);
    assert_non_null(strstr(err, "max_tokens"));
    assert_null(st);
    /* a cache of 16 positions: its size, its bound, and the options it refuses */
    const fa_model_state_options bad[3] = { { 0, FA_ALGORITHM_FLASH, FA_MATVEC_OWN, NULL, NULL, 0, 513 },
                                            { 0, FA_ALGORITHM_FLASH, FA_MATVEC_OWN, NULL, NULL, 1, 16 },
                                            { 17, FA_ALGORITHM_FLASH, FA_MATVEC_OWN, NULL, NULL, 0, 16 } };
    for (int i = 0; i < 3; i++) {
        assert_int_equal(fa_model_state_create(s->m, s->ctx, &bad[i], &st, err), FA_ERR_INVALID_VALUE);
        assert_non_null(strstr(err, i == 2 ? "max_tokens" : "context"));
        assert_null(st);
    }
    o = (fa_model_state_options){ 0, FA_ALGORITHM_FLASH, FA_MATVEC_OWN, NULL, NULL, 0, 16 };
    assert_int_equal(fa_model_state_create(s->m, s->ctx, &o, &st, err), FA_OK);
    assert_int_equal(fa_model_state_context(st), 16);
    const fa_model_config *c = &s->m->config;
    assert_int_equal(fa_model_state_stats(st).kv_cache_bytes,
                     2ull * c->n_layers * 16 * (c->dim / c->n_heads) * c->n_kv_heads * sizeof(float));
    assert_int_equal(fa_model_forward(s->m, st, ids, 1, 15, &logits, err), FA_OK);
    assert_int_equal(fa_model_forward(s->m, st, ids, 1, 16, &logits, err), FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(err, "options.context"));
    fa_model_state_free(st);
    /* a state made for another model: refused, whatever its context (more layers and kv heads
     * than the state holds, a longer context) */
    const fa_model_config ca = { 64, 96, 2, 8, 4, 512, 64, 0, 0.0f, 0.0f, { 0 }, 0, 0, { 0 } };
    const fa_model_config cb = { 64, 96, 6, 8, 8, 4096, 128, 0, 0.0f, 0.0f, { 0 }, 0, 0, { 0 } };
    fa_model *ma, *mb;
    assert_int_equal(fa_model_synth(&ca, 1, &ma, err), FA_OK);
    assert_int_equal(fa_model_synth(&cb, 2, &mb, err), FA_OK);
    for (int32_t context = 0; context <= 16; context += 16) {
        o = (fa_model_state_options){ 0, FA_ALGORITHM_FLASH, FA_MATVEC_OWN, NULL, NULL, 0, context };
        assert_int_equal(fa_model_state_create(ma, s->ctx, &o, &st, err), FA_OK);
        assert_int_equal(fa_model_forward(mb, st, ids, 1, 0, &logits, err), FA_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err, "another model"));
        fa_model_state_free(st);
    }
    fa_model_free(ma);
    fa_model_free(mb);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("model: seed %llu (replay: FLASHATTN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_readme),
        cmocka_unit_test(test_stops_at_eos),
        cmocka_unit_test(test_nan_weights),
        cmocka_unit_test(test_encode_prompt),
        cmocka_unit_test(test_tokenizer_roundtrip),
        cmocka_unit_test(test_prefill_equals_decode),
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_checkpoint_refusals),
        cmocka_unit_test(test_tokenizer_refusals),
        cmocka_unit_test(test_non_regular_files),
        cmocka_unit_test(test_forward_refusals),
    };
    return cmocka_run_group_tests(tests, story_setup, story_teardown);
}
