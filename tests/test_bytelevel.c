/* SPDX-License-Identifier: MIT */
/*
 * Byte-level BPE tokenizer.json (Llama 3's kind): tests/data/bytelevel_tokenizer.json, written
 * and trained by Hugging Face's tokenizers (tests/data/make_bytelevel.py), encodes every text of
 * bytelevel_ids.json to the ids that library gave, with and without the template's BOS, and
 * under GPT-2's pre-tokenizer, a plain-string Split and a Split whose pattern matches empty
 * strings; the ids decode back to the text's bytes, and so do seeded random texts; a repeated
 * group over a long text matches (past the JIT's default stack); broken files, a runaway
 * pattern and text that is not UTF-8 get a status and a message; threads sharing a tokenizer
 * get the same ids.
 * FLASHATTN_TEST_SEED=N replays.
 */
#include "model.h"
#include "tok_json.h"

#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <pthread.h>

static uint64_t seed;
static char *base;        /* the tokenizer.json's text */
static cJSON *cases;      /* bytelevel_ids.json */
static int32_t vocab;     /* its vocab_size */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    s[fread(s, 1, (size_t)n, f)] = 0;
    fclose(f);
    return s;
}

static fa_tokenizer *load(const char *text)
{
    fa_tokenizer *t = NULL;
    char err[FA_MODEL_ERR_LEN];
    if (fa_tokenizer_from_json("bytelevel.json", text, strlen(text), vocab, &t, err) != FA_OK)
        fail_msg("%s", err);
    return t;
}

/* The fixture with one edit by cJSON (tok_json_with). */
static char *with(const char *key, const char *value) { return tok_json_with(base, key, value); }

/* Encodes text and compares with the case's list of ids named key. */
static void expect_case(const fa_tokenizer *t, const cJSON *c, const char *key, int bos)
{
    const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
    const cJSON *want = cJSON_GetObjectItem(c, key);
    const int32_t cap = (int32_t)strlen(text) + 3;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap), n = 0;
    char err[FA_MODEL_ERR_LEN];
    if (fa_tokenizer_encode(t, text, bos, 0, ids, cap, &n, err) != FA_OK)
        fail_msg("'%s': %s", text, err);
    int same = n == cJSON_GetArraySize(want);
    for (int i = 0; same && i < n; i++)
        same = ids[i] == cJSON_GetArrayItem(want, i)->valueint;
    if (!same) {
        fprintf(stderr, "'%s' (%s): %d ids, HF's %d:", text, key, (int)n, cJSON_GetArraySize(want));
        for (int i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
        fail();
    }
    free(ids);
}

/* text encoded without BOS and decoded token by token, as generation prints: the same bytes. */
static void expect_round_trip(const fa_tokenizer *t, const char *text)
{
    const size_t n = strlen(text);
    int32_t *ids = malloc(sizeof(int32_t) * (n + 3)), k = 0;
    char err[FA_MODEL_ERR_LEN], *out = malloc(4 * n + 8);
    if (fa_tokenizer_encode(t, text, 0, 0, ids, (int32_t)n + 3, &k, err) != FA_OK)
        fail_msg("'%s': %s", text, err);
    size_t at = 0;
    for (int32_t i = 0; i < k; i++) {
        size_t len;
        const char *p = fa_tokenizer_decode(t, i ? ids[i - 1] : -1, ids[i], &len);
        memcpy(out + at, p, len);
        at += len;
    }
    if (at != n || memcmp(out, text, n) != 0)
        fail_msg("'%s' decodes to %zu bytes '%.*s'", text, at, (int)at, out);
    free(ids), free(out);
}

static void test_hf_ids(void **state)
{
    (void)state;
    fa_tokenizer *t = load(base);
    char *gpt2_text = with("pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}");
    char *string_text = with("pre_tokenizer.pretokenizers.0",
                             "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\"}");
    char *empty_text = with("pre_tokenizer.pretokenizers.0",
                            "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?=[A-Z])\"}, \"behavior\": \"Isolated\"}");
    fa_tokenizer *gpt2 = load(gpt2_text), *string = load(string_text), *empty = load(empty_text);
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "cases")) {
        expect_case(t, c, "ids", 1);
        expect_case(t, c, "ids_plain", 0);
        expect_case(gpt2, c, "ids_gpt2", 0);
        expect_case(string, c, "ids_string", 0);
        expect_case(empty, c, "ids_empty", 0);
        expect_round_trip(t, cJSON_GetObjectItem(c, "text")->valuestring);
        k++;
    }
    print_message("%d texts as HF's tokenizers encodes them (5 ways each)\n", k);
    assert_true(k > 200);
    fa_tokenizer_free(t), fa_tokenizer_free(gpt2), fa_tokenizer_free(string), fa_tokenizer_free(empty);
    free(gpt2_text), free(string_text), free(empty_text);
}

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Any valid UTF-8 comes back byte for byte: random code points of every length. */
static void test_random_round_trip(void **state)
{
    (void)state;
    fa_tokenizer *t = load(base);
    uint64_t s = seed;
    char text[512];
    for (int r = 0; r < 300; r++) {
        size_t n = 0;
        const int chars = 1 + (int)(next(&s) % 60);
        for (int i = 0; i < chars; i++) {
            static const uint32_t top[] = { 0x80, 0x800, 0x10000, 0x110000 };
            uint32_t cp = (uint32_t)(next(&s) % top[next(&s) % 4]);
            if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0)
                cp = ' ';
            if (cp < 0x80) {
                text[n++] = (char)cp;
            } else if (cp < 0x800) {
                text[n++] = (char)(0xC0 | cp >> 6), text[n++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                text[n++] = (char)(0xE0 | cp >> 12), text[n++] = (char)(0x80 | (cp >> 6 & 0x3F));
                text[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                text[n++] = (char)(0xF0 | cp >> 18), text[n++] = (char)(0x80 | (cp >> 12 & 0x3F));
                text[n++] = (char)(0x80 | (cp >> 6 & 0x3F)), text[n++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        text[n] = 0;
        expect_round_trip(t, text);
    }
    fa_tokenizer_free(t);
}

/* Threads sharing one tokenizer each get HF's ids (a pattern's match state is per call). */
typedef struct shared_run {
    const fa_tokenizer *t;
    int mismatches;
} shared_run;

static void *encode_all(void *arg)
{
    shared_run *r = arg;
    char err[FA_MODEL_ERR_LEN];
    for (int rep = 0; rep < 4; rep++) {
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "cases")) {
            const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
            const cJSON *want = cJSON_GetObjectItem(c, "ids_plain");
            const int32_t cap = (int32_t)strlen(text) + 3;
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap), n = 0;
            int same = fa_tokenizer_encode(r->t, text, 0, 0, ids, cap, &n, err) == FA_OK &&
                       n == cJSON_GetArraySize(want);
            for (int i = 0; same && i < n; i++)
                same = ids[i] == cJSON_GetArrayItem(want, i)->valueint;
            r->mismatches += !same;
            free(ids);
        }
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    fa_tokenizer *t = load(base);
    pthread_t th[4];
    shared_run runs[4];
    for (int i = 0; i < 4; i++) {
        runs[i] = (shared_run){ t, 0 };
        assert_int_equal(pthread_create(&th[i], NULL, encode_all, &runs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(runs[i].mismatches, 0);
    }
    fa_tokenizer_free(t);
}

/* The template's BOS is what encoding adds; without a post_processor, nothing. */
static void test_bos(void **state)
{
    (void)state;
    const int32_t bos = (int32_t)cJSON_GetObjectItem(cases, "bos")->valueint;
    char *none = with("post_processor", NULL);
    fa_tokenizer *t = load(base), *u = load(none);
    int32_t ids[16], n = 0;
    char err[FA_MODEL_ERR_LEN];
    assert_int_equal(fa_tokenizer_encode(u, "hi", 1, 0, ids, 16, &n, err), FA_OK);
    assert_int_not_equal(ids[0], bos);
    assert_int_equal(fa_tokenizer_encode(t, "hi", 1, 0, ids, 16, &n, err), FA_OK);
    assert_int_equal(ids[0], bos);
    /* EOS comes from the model's config.json, not from a byte-level tokenizer: none added */
    int32_t m = 0;
    assert_int_equal(fa_tokenizer_encode(t, "hi", 1, 1, ids, 16, &m, err), FA_OK);
    assert_int_equal(m, n);
    fa_tokenizer_free(t), fa_tokenizer_free(u), free(none);
}

static void expect_refused(const char *text, fa_status want, const char *a, const char *b)
{
    tok_json_expect_refused(text, vocab, want, a, b);
}

static void test_refusals(void **state)
{
    (void)state;
    const struct {
        const char *key, *json;
        fa_status st;
        const char *a, *b;
    } bad[] = {
        { "pre_tokenizer.pretokenizers.0", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}",
          FA_ERR_INVALID_VALUE, "Split's pattern", "does not compile" },
        { "pre_tokenizer.pretokenizers.0", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}",
          FA_ERR_UNSUPPORTED, "Split's behavior 'Removed'", NULL },
        { "pre_tokenizer.pretokenizers.0", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Isolated\", "
                                           "\"invert\": true}",
          FA_ERR_UNSUPPORTED, "invert", NULL },
        { "pre_tokenizer.pretokenizers.0", "{\"type\": \"Split\", \"pattern\": {}, \"behavior\": \"Isolated\"}",
          FA_ERR_INVALID_ARGUMENT, "Split's pattern must be", NULL },
        { "pre_tokenizer.pretokenizers.1", "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": false}",
          FA_ERR_UNSUPPORTED, "add_prefix_space true", NULL },
        { "pre_tokenizer.pretokenizers.1", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}",
          FA_ERR_UNSUPPORTED, "use_regex true after a Split", NULL },
        { "pre_tokenizer.pretokenizers.1", "{\"type\": \"Digits\"}", FA_ERR_UNSUPPORTED, "a Split then ByteLevel", NULL },
        { "pre_tokenizer", "{\"type\": \"Whitespace\"}", FA_ERR_UNSUPPORTED, "pre_tokenizer type 'Whitespace'", NULL },
        { "decoder", "{\"type\": \"Fuse\"}", FA_ERR_UNSUPPORTED, "go together", NULL },
        { "decoder", NULL, FA_ERR_UNSUPPORTED, "decoder is missing", NULL },
        { "normalizer", "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}",
          FA_ERR_UNSUPPORTED, "with a ByteLevel pre_tokenizer", NULL },
        { "post_processor", "{\"type\": \"RobertaProcessing\"}", FA_ERR_UNSUPPORTED, "post_processor 'RobertaProcessing'",
          NULL },
        { "post_processor.processors.1.single",
          "[{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<|begin_of_text|>\", \"type_id\": 0}}]",
          FA_ERR_UNSUPPORTED, "single template", NULL },
        { "post_processor.processors.1.single", "{\"a\": 1, \"b\": 2}", FA_ERR_UNSUPPORTED, "single template", NULL },
        { "post_processor.processors.1.special_tokens",
          "{\"<|begin_of_text|>\": {\"id\": \"<|begin_of_text|>\", \"ids\": [5], \"tokens\": [\"<|begin_of_text|>\"]}}",
          FA_ERR_INVALID_VALUE, "is not a special token", NULL },
        { "post_processor.processors.1.special_tokens",
          "{\"<|begin_of_text|>\": {\"id\": \"<|begin_of_text|>\", \"ids\": [], \"tokens\": []}}",
          FA_ERR_INVALID_VALUE, "must hold one id", NULL },
        { "post_processor.processors.1.special_tokens",
          "{\"<|begin_of_text|>\": {\"id\": \"<|begin_of_text|>\", \"ids\": {\"x\": 863}}}",
          FA_ERR_INVALID_VALUE, "must hold one id", NULL },
        { "post_processor.processors.0",
          "{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}]}",
          FA_ERR_UNSUPPORTED, "a second TemplateProcessing", NULL },
        { "pre_tokenizer.pretokenizers.0", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\C\"}, \"behavior\": \"Isolated\"}",
          FA_ERR_INVALID_VALUE, "does not compile", NULL },
        { "model.byte_fallback", "true", FA_ERR_UNSUPPORTED, "model.byte_fallback true", "with a ByteLevel" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *s = with(bad[i].key, bad[i].json);
        expect_refused(s, bad[i].st, bad[i].a, bad[i].b ? bad[i].b : "bad.json");
        free(s);
    }
    /* a NUL escaped inside a string (cJSON's strings would end there): the pattern, as text */
    const char *at = strstr(base, "(?i:'s");
    assert_non_null(at);
    char *nul = malloc(strlen(base) + 16);
    sprintf(nul, "%.*sa\\u0000b|%s", (int)(at - base), base, at);
    expect_refused(nul, FA_ERR_INVALID_VALUE, "escapes a NUL character", "bad.json");
    free(nul);
}

/* A pattern that backtracks without end stops at PCRE2's step limit, so does one whose every
 * match backtracks heavily, and text that is not UTF-8 is refused: a status and a message, in
 * bounded time. */
static void test_encode_refusals(void **state)
{
    (void)state;
    char *slow = with("pre_tokenizer.pretokenizers.0",
                      "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a+a+)+[bd]\"}, \"behavior\": \"Isolated\"}");
    fa_tokenizer *t = load(slow), *u = load(base);
    char text[64], err[FA_MODEL_ERR_LEN];
    memset(text, 'a', 60);
    text[60] = 'c', text[61] = 0;
    int32_t ids[80], n = 0;
    const clock_t c0 = clock();
    assert_int_equal(fa_tokenizer_encode(t, text, 1, 0, ids, 80, &n, err), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "more steps or memory than its limits"));
    print_message("a runaway pattern stopped after %.2f s: %s\n", (double)(clock() - c0) / CLOCKS_PER_SEC, err);
    assert_int_equal(fa_tokenizer_encode(u, "ok \xC3\x28 no", 1, 0, ids, 80, &n, err), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "not valid UTF-8"));
    /* a repeated group over 20,000 characters: past PCRE2's default JIT stack, still a match */
    char *group = with("pre_tokenizer.pretokenizers.0",
                       "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?:a|b)+\"}, \"behavior\": \"Isolated\"}");
    fa_tokenizer *g = load(group);
    const int32_t len = 20000;
    char *ab = malloc((size_t)len + 1);
    int32_t *many = malloc(sizeof(int32_t) * ((size_t)len + 3)), k = 0;
    for (int32_t i = 0; i < len; i++)
        ab[i] = i % 2 ? 'b' : 'a';
    ab[len] = 0;
    if (fa_tokenizer_encode(g, ab, 0, 0, many, len + 3, &k, err) != FA_OK)
        fail_msg("%s", err);
    assert_true(k > 0 && k <= len);
    /* the same group without the JIT, over 20 words of 5,000 characters: each word a heavy
     * match, each earning the next by its length */
    char *words = with("pre_tokenizer.pretokenizers.0", "{\"type\": \"Split\", \"pattern\": {\"Regex\": "
                                                        "\"(*NO_JIT)(?:a|b)+|\\\\s+\"}, \"behavior\": \"Isolated\"}");
    fa_tokenizer *wt = load(words);
    const int32_t wlen = 20 * 5001;
    char *text20 = malloc((size_t)wlen + 1);
    int32_t *ids20 = malloc(sizeof(int32_t) * ((size_t)wlen + 3));
    assert_non_null(text20), assert_non_null(ids20);
    for (int32_t i = 0; i < wlen; i++)
        text20[i] = i % 5001 == 5000 ? ' ' : i % 2 ? 'b' : 'a';
    text20[wlen] = 0;
    if (fa_tokenizer_encode(wt, text20, 0, 0, ids20, wlen + 3, &k, err) != FA_OK)
        fail_msg("20 words of 5,000 characters without the JIT: %s", err);
    fa_tokenizer_free(wt);
    free(words), free(text20), free(ids20);
    /* each character a heavy match that succeeds (2^18 ways of spelling a run of a's before the
     * fallback '.'): the encoding stops after a few such matches instead of taking them all */
    char *heavy = with("pre_tokenizer.pretokenizers.0", "{\"type\": \"Split\", \"pattern\": {\"Regex\": "
                                                        "\"(?:a|a){1,18}c|.\"}, \"behavior\": \"Isolated\"}");
    fa_tokenizer *h = load(heavy);
    memset(ab, 'a', 2000);
    ab[2000] = 0;
    const clock_t c1 = clock();
    assert_int_equal(fa_tokenizer_encode(h, ab, 0, 0, many, len + 3, &k, err), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "more steps or memory than its limits"));
    print_message("heavy matches at every character stopped after %.2f s\n", (double)(clock() - c1) / CLOCKS_PER_SEC);
    fa_tokenizer_free(t), fa_tokenizer_free(u), fa_tokenizer_free(g), fa_tokenizer_free(h);
    free(slow), free(group), free(heavy), free(ab), free(many);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("bytelevel: seed %llu (replay: FLASHATTN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    char *ids = slurp(FA_TEST_DATA_DIR "/bytelevel_ids.json");
    base = slurp(FA_TEST_DATA_DIR "/bytelevel_tokenizer.json");
    cases = ids ? cJSON_Parse(ids) : NULL;
    if (!base || !cases) {
        fprintf(stderr, "setup: cannot read " FA_TEST_DATA_DIR "/bytelevel_{tokenizer,ids}.json\n");
        return 1;
    }
    vocab = (int32_t)cJSON_GetObjectItem(cases, "vocab_size")->valueint;
    free(ids);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_ids),        cmocka_unit_test(test_random_round_trip),
        cmocka_unit_test(test_bos),           cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_encode_refusals), cmocka_unit_test(test_threads),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cJSON_Delete(cases);
    free(base);
    return rc;
}
