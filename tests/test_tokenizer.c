/* SPDX-License-Identifier: MIT */
/*
 * Hugging Face tokenizer.json: stories260K's tok512.bin written as tokenizer.json encodes the
 * models README's prompts and random text (unicode, byte fallback) to the tokenizer.bin's ids
 * by HF's rank-ordered BPE, and decodes them back to the same bytes; a hand-written
 * tokenizer.json gives ids derived by hand (merge ranks, byte fallback, unk, added tokens,
 * lstrip/rstrip, Prepend/Replace against Metaspace, Metaspace's split), and ids recorded from
 * HF's tokenizers on it and seven variants; and broken files are refused with the status and a
 * message naming the field. FLASHATTN_TEST_SEED=N replays.
 */
#include "model.h"
#include "tokenizer.h"
#include "tok_json.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static uint64_t seed;
static fa_tokenizer *bin;  /* tok512.bin */
static fa_tokenizer *json; /* tok512.bin written as tokenizer.json and read back */
static char *json_text;    /* that file's text */

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int encode(const fa_tokenizer *t, const char *text, int32_t *ids)
{
    char err[FA_MODEL_ERR_LEN];
    int32_t n = 0;
    fa_status st = fa_tokenizer_encode(t, text, 1, 0, ids, (int32_t)strlen(text) + 3, &n, err);
    if (st != FA_OK)
        fprintf(stderr, "encode: %s\n", err);
    assert_int_equal(st, FA_OK);
    return n;
}

/* The bytes of ids[1..n) decoded one after the other, as generation prints them. */
static size_t decode(const fa_tokenizer *t, const int32_t *ids, int n, char *out)
{
    size_t at = 0;
    for (int i = 1; i < n; i++) {
        size_t len;
        const char *p = fa_tokenizer_decode(t, ids[i - 1], ids[i], &len);
        memcpy(out + at, p, len);
        at += len;
    }
    out[at] = 0;
    return at;
}

static void expect_same(const char *text)
{
    const size_t n = strlen(text);
    int32_t *a = malloc(sizeof(int32_t) * (n + 3)), *b = malloc(sizeof(int32_t) * (n + 3));
    int na = encode(bin, text, a), nb = encode(json, text, b);
    if (na != nb || memcmp(a, b, sizeof(int32_t) * (size_t)na) != 0) {
        fprintf(stderr, "'%s': tokenizer.bin gives %d ids, tokenizer.json %d:\n", text, na, nb);
        for (int i = 0; i < (na > nb ? na : nb); i++)
            fprintf(stderr, "  %d: %d %d\n", i, i < na ? a[i] : -1, i < nb ? b[i] : -1);
        fail();
    }
    char *da = malloc(4 * n + 8), *db = malloc(4 * n + 8);
    size_t la = decode(bin, a, na, da), lb = decode(json, b, nb, db);
    assert_int_equal(la, lb);
    assert_memory_equal(da, db, la);
    /* sentencepiece's round trip: the dummy prefix's space is what BOS strips */
    assert_int_equal(lb, n);
    assert_memory_equal(db, text, n);
    free(a), free(b), free(da), free(db);
}

static void test_stories_prompts(void **state)
{
    (void)state;
    int32_t ids[64];
    const int32_t want[] = { 1, 403, 407, 261, 378 };
    assert_int_equal(encode(json, "Once upon a time", ids), 5);
    assert_memory_equal(ids, want, sizeof(want));
    const char *prompts[] = { "Once upon a time", "Lily and Ben went to the park", "", " ", "  two spaces",
                              "trailing ", "One day,\nshe said: \"Hello!\"", "\xE2\x80\x9CQuoted\xE2\x80\x9D \xC3\xA9t\xC3\xA9",
                              "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 tab\there" };
    for (size_t i = 0; i < sizeof(prompts) / sizeof(prompts[0]); i++)
        expect_same(prompts[i]);
    /* the README's greedy run decodes to the same text through either file */
    const int32_t run[] = { 1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                            338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426,
                            385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266,
                            267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310 };
    char a[1024], b[1024];
    const int n = sizeof(run) / sizeof(run[0]);
    size_t la = decode(bin, run, n, a), lb = decode(json, run, n, b);
    assert_int_equal(la, lb);
    assert_string_equal(a, b);
    assert_true(strncmp(b, "Once upon a time, there was a little girl named Lily.", 53) == 0);
}

/* Random text: words of the vocabulary's pieces, ASCII, punctuation, whitespace runs and
 * characters only byte fallback can encode (2-, 3- and 4-byte UTF-8). */
static void test_stories_random(void **state)
{
    (void)state;
    static const char *const extra[] = { " ", "  ", "\n", "\t", ",", ".", "!", "?", "'", "\"", "-", "0", "7",
                                         "\xC3\xA9", "\xC3\xB1", "\xC2\xA0", "\xE2\x80\x99", "\xE2\x82\xAC",
                                         "\xC3\x9F", "\xCE\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
                                         "\xF0\x90\x8D\x88", "<", ">", "s", "/", "\x01", "\x7F" };
    uint64_t r = seed;
    char text[512];
    for (int round = 0; round < 3000; round++) {
        size_t at = 0;
        const int parts = 1 + (int)(next(&r) % 24);
        for (int k = 0; k < parts; k++) {
            const uint64_t c = next(&r);
            const char *piece;
            size_t len;
            char one[2];
            if (c % 3 == 0) {
                /* a merged piece of the vocabulary (ids 259..511) */
                piece = fa_tokenizer_decode(bin, 0, 259 + (int32_t)(c / 3 % 253), &len);
            } else if (c % 3 == 1) {
                piece = extra[c / 3 % (sizeof(extra) / sizeof(extra[0]))];
                len = strlen(piece);
            } else {
                one[0] = (char)(' ' + c / 3 % 95);
                one[1] = 0;
                piece = one, len = 1;
            }
            if (at + len < sizeof(text)) {
                memcpy(text + at, piece, len);
                at += len;
            }
        }
        text[at] = 0;
        /* "<s>", "</s>" and "<unk>" are added tokens in tokenizer.json, plain text to run.c */
        if (strstr(text, "<s>") || strstr(text, "</s>") || strstr(text, "<unk>"))
            continue;
        expect_same(text);
    }
    /* bytes that are not UTF-8 encode (byte fallback) and decode back to themselves */
    for (int round = 0; round < 500; round++) {
        size_t n = 1 + next(&r) % 40;
        for (size_t i = 0; i < n; i++)
            text[i] = (char)(1 + next(&r) % 255);
        text[n] = 0;
        if (strstr(text, "\xE2\x96\x81"))
            continue; /* "▁" in the text is a space to HF's normalizer */
        int32_t ids[64];
        char back[256];
        int k = encode(json, text, ids);
        assert_int_equal(decode(json, ids, k, back), n);
        assert_memory_equal(back, text, n);
    }
}

/* ---- a tokenizer.json written by hand ---- */

#define PLAIN "\"single_word\": false, \"lstrip\": false, \"rstrip\": false"
static const char hand_base[] =
    "{\"version\": \"1.0\", \"added_tokens\": ["
    " {\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false, " PLAIN "},"
    " {\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false, " PLAIN "},"
    " {\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false, " PLAIN "},"
    " {\"id\": 15, \"content\": \"ab!\", \"special\": false, \"normalized\": false, " PLAIN "},"
    " {\"id\": 16, \"content\": \"<sep>\", \"special\": true, \"normalized\": false, \"single_word\": false,"
    "  \"lstrip\": true, \"rstrip\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
    "   {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
    "   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
    " \"pre_tokenizer\": null,"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
    "   {\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"},"
    "   {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true,"
    "   \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4, \"\\u2581\": 5, \"a\": 6, \"b\": 7,"
    "     \"c\": 8, \"\\u2581a\": 9, \"ab\": 10, \"\\u2581ab\": 11, \"bc\": 12, \"abc\": 13, \"b\\u2581\": 14},"
    "   \"merges\": [\"a b\", \"\\u2581 a\", \"b c\", \"\\u2581a b\", \"ab c\", \"b \\u2581\"]}}";

/* the merges as HF writes them today: pairs */
static const char hand_pairs[] = "\"merges\": [[\"a\", \"b\"], [\"\\u2581\", \"a\"], [\"b\", \"c\"], [\"\\u2581a\", \"b\"], "
                                 "[\"ab\", \"c\"], [\"b\", \"\\u2581\"]]";

/* hand_base with the text from `from` replaced by `to` (once). */
static char *edited(const char *base, const char *from, const char *to)
{
    const char *at = strstr(base, from);
    assert_non_null(at);
    size_t n = strlen(base) - strlen(from) + strlen(to);
    char *s = malloc(n + 1);
    memcpy(s, base, (size_t)(at - base));
    strcpy(s + (at - base), to);
    strcat(s, at + strlen(from));
    return s;
}

static fa_tokenizer *from_text(const char *text, int32_t vocab)
{
    char err[FA_MODEL_ERR_LEN];
    fa_tokenizer *t;
    fa_status st = fa_tokenizer_from_json("hand.json", text, strlen(text), vocab, &t, err);
    if (st != FA_OK)
        fprintf(stderr, "%s\n", err);
    assert_int_equal(st, FA_OK);
    return t;
}

static void expect_ids(const fa_tokenizer *t, const char *text, const int32_t *want, int n)
{
    int32_t ids[64];
    int k = encode(t, text, ids);
    if (k != n || memcmp(ids, want, sizeof(int32_t) * (size_t)n) != 0) {
        fprintf(stderr, "'%s':", text);
        for (int i = 0; i < k; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, " (want");
        for (int i = 0; i < n; i++)
            fprintf(stderr, " %d", want[i]);
        fprintf(stderr, ")\n");
        fail();
    }
}

#define IDS(...) (const int32_t[]){ __VA_ARGS__ }, (int)(sizeof((const int32_t[]){ __VA_ARGS__ }) / sizeof(int32_t))

/* The hand-written file's ids, each derived by hand. */
static void hand_cases(const char *base)
{
    fa_tokenizer *t = from_text(base, 20);
    /* "▁abc": (a b) has rank 0, before (▁ a) at rank 1: [▁ ab c]; (▁ ab) is no merge, (ab c)
     * rank 4: [▁ abc] */
    expect_ids(t, "abc", IDS(1, 5, 13));
    /* "▁ab": [▁ ab]; "▁ab" (11) is a piece, but no merge reaches it from there */
    expect_ids(t, "ab", IDS(1, 5, 10));
    /* "▁a▁b": (▁ a) at 0; nothing joins "▁a" and "▁" */
    expect_ids(t, "a b", IDS(1, 9, 5, 7));
    /* "▁ab▁": (a b) first, so (b ▁) never forms */
    expect_ids(t, "ab ", IDS(1, 5, 10, 5));
    /* "▁cb▁": (b ▁) rank 5 is the only merge */
    expect_ids(t, "cb ", IDS(1, 5, 8, 14));
    /* é is no piece: its bytes C3 A9 are */
    expect_ids(t, "\xC3\xA9", IDS(1, 5, 3, 4));
    /* d has neither a piece nor a byte piece: unk, and a run of them one unk (fuse_unk) */
    expect_ids(t, "add d", IDS(1, 9, 0, 5, 0));
    expect_ids(t, "ddd", IDS(1, 5, 0));
    /* added tokens split the text first; each side is normalized on its own (▁ prepended) */
    expect_ids(t, "a<s>b", IDS(1, 9, 1, 5, 7));
    expect_ids(t, "</s>a", IDS(1, 2, 9));
    expect_ids(t, "cab!", IDS(1, 5, 8, 15));
    /* <sep> takes the spaces on both sides (lstrip, rstrip) */
    expect_ids(t, "a <sep> b", IDS(1, 9, 16, 5, 7));
    expect_ids(t, "a<sep>  b", IDS(1, 9, 16, 5, 7));
    expect_ids(t, "", IDS(1));
    /* decoding: ▁ as a space, the first piece after BOS without it, byte pieces as bytes */
    size_t len;
    const char *p = fa_tokenizer_decode(t, 1, 9, &len);
    assert_true(len == 1 && p[0] == 'a');
    p = fa_tokenizer_decode(t, 9, 11, &len);
    assert_true(len == 3 && memcmp(p, " ab", 3) == 0);
    p = fa_tokenizer_decode(t, 5, 3, &len);
    assert_true(len == 1 && (unsigned char)p[0] == 0xC3);
    p = fa_tokenizer_decode(t, 9, 16, &len);
    assert_true(len == 5 && memcmp(p, "<sep>", 5) == 0);
    p = fa_tokenizer_decode(t, 9, 17, &len); /* ids past the file's (vocab 20) decode to "" */
    assert_true(len == 0);
    fa_tokenizer_free(t);

    /* Metaspace instead of the normalizers: no ▁ before text that starts with one, and with
     * prepend_scheme "first" none after an added token; split: no merge crosses a ▁ */
    const char *meta = "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", "
                       "\"prepend_scheme\": \"first\", \"split\": true},";
    char *a = edited(base, "\"pre_tokenizer\": null,", meta);
    char *b = edited(a, "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
                        "   {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
                        "   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},",
                     "\"normalizer\": null,");
    t = from_text(b, 20);
    expect_ids(t, "a b", IDS(1, 9, 5, 7));
    expect_ids(t, " a", IDS(1, 9));
    expect_ids(t, "a<s>b", IDS(1, 9, 1, 7));
    expect_ids(t, "cb ", IDS(1, 5, 8, 7, 5));
    fa_tokenizer_free(t);
    free(a);
    /* the same without split: (b ▁) forms again */
    a = edited(b, "\"split\": true", "\"split\": false");
    t = from_text(a, 20);
    expect_ids(t, "cb ", IDS(1, 5, 8, 14));
    fa_tokenizer_free(t);
    free(a), free(b);
    /* with the Prepend normalizer, " a" keeps both: "▁▁a"; a "▁" in the text is a space */
    t = from_text(base, 20);
    expect_ids(t, " a", IDS(1, 5, 9));
    expect_ids(t, "a\xE2\x96\x81" "b", IDS(1, 9, 5, 7));
    fa_tokenizer_free(t);
}

/* hand_base with its merges as pairs */
static char *with_pairs(void)
{
    const char *m = strstr(hand_base, "\"merges\"");
    const size_t head = (size_t)(m - hand_base);
    char *s = malloc(head + strlen(hand_pairs) + 3);
    memcpy(s, hand_base, head);
    strcpy(s + head, hand_pairs);
    strcat(s, "}}");
    return s;
}

/* Both spellings of the merges give the same ids. */
static void test_hand(void **state)
{
    (void)state;
    hand_cases(hand_base);
    char *p = with_pairs();
    hand_cases(p);
    free(p);
}

/* ---- against HF's tokenizers ---- */

/* Texts and their ids from HF's tokenizers (0.23.3, encode(text, add_special_tokens=False)) on
 * the hand-written file and variants of it; each row ends at -1. */
static const char *const hf_texts[] = {
    "dd\xC3\xA9" "d",
    " a<s> b",
    "ab!ab!",
    "<s>  </s>",
    "\xE3\x80\x80" "<sep>\xC2\xA0" "c",
    "abc abcab\xE2\x96\x81" "a",
    "x\xC3\xA9" "x",
    " <sep>  ab ",
    " \tbcxd<sep>\nb",
    "\xC3\xA9" "bc\xE3\x80\x80" "\xE3\x80\x80" "c\xE2\x96\x81" "cx\xE3\x80\x80" "b\n",
    "\xE2\x96\x81" "\nb\n\n",
    "b\xE2\x96\x81" "bx </s>\xE3\x80\x80" " xd",
};
static const struct {
    const char *name;
    const char *edit[2][2]; /* from, to; NULL: none */
    int32_t ids[sizeof(hf_texts) / sizeof(hf_texts[0])][16];
} hf_variants[] = {
    { "as written", { { NULL, NULL } },
      {
          { 5, 3, 4, 0, -1 },
          { 5, 9, 1, 5, 5, 7, -1 },
          { 15, 15, -1 },
          { 1, 5, 5, 5, 2, -1 },
          { 16, 5, 8, -1 },
          { 5, 13, 5, 13, 10, 9, -1 },
          { 5, 3, 4, 0, -1 },
          { 16, 5, 10, 5, -1 },
          { 5, 5, 0, 12, 0, 16, 5, 7, -1 },
          { 5, 3, 4, 12, 0, 8, 5, 8, 0, 7, 0, -1 },
          { 5, 5, 0, 7, 0, -1 },
          { 5, 14, 7, 0, 5, 2, 5, 0, 5, 0, -1 },
      } },
    { "Metaspace first, split", { { "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [   {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}, ", "\"normalizer\": null, " }, { "\"pre_tokenizer\": null,", "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"first\", \"split\": true}," } },
      {
          { 5, 3, 4, 0, -1 },
          { 9, 1, 5, 7, -1 },
          { 15, 15, -1 },
          { 1, 5, 5, 2, -1 },
          { 16, 8, -1 },
          { 5, 13, 5, 13, 10, 9, -1 },
          { 5, 3, 4, 0, -1 },
          { 16, 10, 5, -1 },
          { 5, 0, 12, 0, 16, 7, -1 },
          { 5, 3, 4, 12, 0, 8, 5, 8, 0, 7, 0, -1 },
          { 5, 0, 7, 0, -1 },
          { 5, 7, 5, 7, 0, 5, 2, 0, 5, 0, -1 },
      } },
    { "Metaspace always, no split", { { "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [   {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}, ", "\"normalizer\": null, " }, { "\"pre_tokenizer\": null,", "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"always\", \"split\": false}," } },
      {
          { 5, 3, 4, 0, -1 },
          { 9, 1, 5, 7, -1 },
          { 15, 15, -1 },
          { 1, 5, 5, 2, -1 },
          { 16, 5, 8, -1 },
          { 5, 13, 5, 13, 10, 9, -1 },
          { 5, 3, 4, 0, -1 },
          { 16, 5, 10, 5, -1 },
          { 5, 0, 12, 0, 16, 5, 7, -1 },
          { 5, 3, 4, 12, 0, 8, 5, 8, 0, 7, 0, -1 },
          { 5, 0, 7, 0, -1 },
          { 5, 14, 7, 0, 5, 2, 5, 0, 5, 0, -1 },
      } },
    { "Metaspace never", { { "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [   {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}, ", "\"normalizer\": null, " }, { "\"pre_tokenizer\": null,", "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"never\", \"split\": true}," } },
      {
          { 3, 4, 0, -1 },
          { 9, 1, 5, 7, -1 },
          { 15, 15, -1 },
          { 1, 5, 5, 2, -1 },
          { 16, 8, -1 },
          { 13, 5, 13, 10, 9, -1 },
          { 3, 4, 0, -1 },
          { 16, 10, 5, -1 },
          { 5, 0, 12, 0, 16, 7, -1 },
          { 3, 4, 12, 0, 8, 5, 8, 0, 7, 0, -1 },
          { 5, 0, 7, 0, -1 },
          { 7, 5, 7, 0, 5, 2, 0, 5, 0, -1 },
      } },
    { "unk not fused", { { "\"fuse_unk\": true", "\"fuse_unk\": false" } },
      {
          { 5, 0, 3, 4, 0, 0, -1 },
          { 5, 9, 1, 5, 5, 7, -1 },
          { 15, 15, -1 },
          { 1, 5, 5, 5, 2, -1 },
          { 16, 5, 8, -1 },
          { 5, 13, 5, 13, 10, 9, -1 },
          { 5, 3, 4, 0, 0, -1 },
          { 16, 5, 10, 5, -1 },
          { 5, 5, 0, 12, 0, 0, 16, 5, 7, -1 },
          { 5, 3, 4, 12, 0, 0, 8, 5, 8, 0, 0, 7, 0, -1 },
          { 5, 5, 0, 7, 0, 0, -1 },
          { 5, 14, 7, 0, 5, 2, 5, 0, 5, 0, 0, -1 },
      } },
    { "no byte fallback", { { "\"byte_fallback\": true", "\"byte_fallback\": false" } },
      {
          { 5, 0, -1 },
          { 5, 9, 1, 5, 5, 7, -1 },
          { 15, 15, -1 },
          { 1, 5, 5, 5, 2, -1 },
          { 16, 5, 8, -1 },
          { 5, 13, 5, 13, 10, 9, -1 },
          { 5, 0, -1 },
          { 16, 5, 10, 5, -1 },
          { 5, 5, 0, 12, 0, 16, 5, 7, -1 },
          { 5, 0, 12, 0, 8, 5, 8, 0, 7, 0, -1 },
          { 5, 5, 0, 7, 0, -1 },
          { 5, 14, 7, 0, 5, 2, 5, 0, 5, 0, -1 },
      } },
    { "no unk_token", { { "\"unk_token\": \"<unk>\", ", "\"unk_token\": null, " } },
      {
          { 5, 3, 4, -1 },
          { 5, 9, 1, 5, 5, 7, -1 },
          { 15, 15, -1 },
          { 1, 5, 5, 5, 2, -1 },
          { 16, 5, 8, -1 },
          { 5, 13, 5, 13, 10, 9, -1 },
          { 5, 3, 4, -1 },
          { 16, 5, 10, 5, -1 },
          { 5, 5, 12, 16, 5, 7, -1 },
          { 5, 3, 4, 12, 8, 5, 8, 7, -1 },
          { 5, 5, 7, -1 },
          { 5, 14, 14, 2, 5, 5, -1 },
      } },
    { "ignore_merges", { { "\"byte_fallback\": true", "\"byte_fallback\": true, \"ignore_merges\": true" } },
      {
          { 5, 3, 4, 0, -1 },
          { 5, 9, 1, 5, 5, 7, -1 },
          { 15, 15, -1 },
          { 1, 5, 5, 5, 2, -1 },
          { 16, 5, 8, -1 },
          { 5, 13, 5, 13, 10, 9, -1 },
          { 5, 3, 4, 0, -1 },
          { 16, 5, 10, 5, -1 },
          { 5, 5, 0, 12, 0, 16, 5, 7, -1 },
          { 5, 3, 4, 12, 0, 8, 5, 8, 0, 7, 0, -1 },
          { 5, 5, 0, 7, 0, -1 },
          { 5, 14, 7, 0, 5, 2, 5, 0, 5, 0, -1 },
      } },
};

static void test_hf_reference(void **state)
{
    (void)state;
    const size_t nt = sizeof(hf_texts) / sizeof(hf_texts[0]);
    for (size_t v = 0; v < sizeof(hf_variants) / sizeof(hf_variants[0]); v++) {
        char *text = edited(hand_base, "", "");
        for (int e = 0; e < 2 && hf_variants[v].edit[e][0]; e++) {
            char *next = edited(text, hf_variants[v].edit[e][0], hf_variants[v].edit[e][1]);
            free(text);
            text = next;
        }
        fa_tokenizer *t = from_text(text, 20);
        for (size_t i = 0; i < nt; i++) {
            const int32_t *want = hf_variants[v].ids[i];
            int n = 0;
            while (want[n] >= 0)
                n++;
            int32_t ids[64], k = 0;
            char err[FA_MODEL_ERR_LEN];
            assert_int_equal(fa_tokenizer_encode(t, hf_texts[i], 0, 0, ids, 64, &k, err), FA_OK);
            if (k != n || memcmp(ids, want, sizeof(int32_t) * (size_t)n) != 0) {
                fprintf(stderr, "%s, text %zu: %d ids, HF's %d\n", hf_variants[v].name, i, (int)k, n);
                fail();
            }
        }
        fa_tokenizer_free(t);
        free(text);
    }
}

/* ---- refusals ---- */

static void expect_refused(const char *text, int32_t vocab, fa_status want, const char *a, const char *b)
{
    tok_json_expect_refused(text, vocab, want, a, b);
}

/* The hand-written file with one edit by cJSON (tok_json_with). */
static char *with(const char *key, const char *value) { return tok_json_with(hand_base, key, value); }

static void test_refusals(void **state)
{
    (void)state;
    const struct {
        const char *key, *json; /* json NULL: the key removed */
        fa_status st;
        const char *field;
    } bad[] = {
        { "model", NULL, FA_ERR_INVALID_ARGUMENT, "model is missing" },
        { "model.type", "\"Unigram\"", FA_ERR_UNSUPPORTED, "model.type 'Unigram'" },
        { "model.type", NULL, FA_ERR_INVALID_ARGUMENT, "model.type" },
        { "model.vocab", NULL, FA_ERR_INVALID_ARGUMENT, "model.vocab" },
        { "model.vocab.abc", "25", FA_ERR_INVALID_VALUE, "model.vocab['abc']" },
        { "model.vocab.abc", "-1", FA_ERR_INVALID_VALUE, "model.vocab['abc']" },
        { "model.vocab.abc", "3.5", FA_ERR_INVALID_VALUE, "model.vocab['abc']" },
        { "model.vocab.abc", "\"13\"", FA_ERR_INVALID_VALUE, "model.vocab['abc']" },
        { "model.vocab.abc", "12", FA_ERR_INVALID_VALUE, "model.vocab gives id 12 to both" },
        { "model.vocab.abc", NULL, FA_ERR_INVALID_VALUE, "id 13 is in neither" },
        { "model.merges", NULL, FA_ERR_INVALID_ARGUMENT, "model.merges" },
        { "model.merges", "[\"a b c\"]", FA_ERR_INVALID_ARGUMENT, "model.merges[0]" },
        { "model.merges", "[[\"a\"]]", FA_ERR_INVALID_ARGUMENT, "model.merges[0]" },
        { "model.merges", "[[\"a\", \"b\"], [\"c\", 5]]", FA_ERR_INVALID_ARGUMENT, "model.merges[1]" },
        { "model.merges", "[\"a b\", \"x b\"]", FA_ERR_INVALID_VALUE, "model.merges[1] ('x' 'b'): the left part" },
        { "model.merges", "[\"a c\"]", FA_ERR_INVALID_VALUE, "model.merges[0] ('a' 'c'): their concatenation" },
        { "model.merges", "[\"a b\", \"b c\", \"a b\"]", FA_ERR_INVALID_VALUE, "model.merges[2] ('a' 'b') is there twice" },
        { "model.merges", "[\"a b\", [\"b\", \"c\"]]", FA_ERR_INVALID_ARGUMENT, "model.merges[1] is an array where" },
        { "model.dropout", "0.1", FA_ERR_UNSUPPORTED, "model.dropout" },
        { "model.continuing_subword_prefix", "\"##\"", FA_ERR_UNSUPPORTED, "model.continuing_subword_prefix" },
        { "model.unk_token", "\"<nope>\"", FA_ERR_INVALID_VALUE, "model.unk_token '<nope>'" },
        { "model.unk_token", "7", FA_ERR_INVALID_VALUE, "model.unk_token" },
        { "model.byte_fallback", "\"yes\"", FA_ERR_INVALID_VALUE, "model.byte_fallback" },
        { "added_tokens", "{}", FA_ERR_INVALID_ARGUMENT, "added_tokens" },
        { "added_tokens", "[{\"content\": \"<s>\", \"special\": true}]", FA_ERR_INVALID_ARGUMENT, "added_tokens[0].id" },
        { "added_tokens", "[{\"id\": 1, \"special\": true}]", FA_ERR_INVALID_ARGUMENT, "added_tokens[0].content" },
        { "added_tokens", "[{\"id\": 1, \"content\": \"<x>\", \"special\": true}]", FA_ERR_INVALID_VALUE,
          "added_tokens[0] gives id 1 to '<x>'" },
        { "added_tokens", "[{\"id\": 1, \"content\": \"<s>\", \"special\": true}, {\"id\": 1, \"content\": \"<s>\", \"special\": true}]",
          FA_ERR_INVALID_VALUE, "added_tokens[1] repeats id 1" },
        { "added_tokens", "[{\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": true}]",
          FA_ERR_UNSUPPORTED, "added_tokens[0] ('<s>'): normalized true" },
        { "normalizer", "{\"type\": \"NFKC\"}", FA_ERR_UNSUPPORTED, "normalizer type 'NFKC'" },
        { "normalizer", "{\"type\": \"Prepend\", \"prepend\": \"_\"}", FA_ERR_UNSUPPORTED, "normalizer Prepend's prepend" },
        { "normalizer", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" \"}, \"content\": \"\\u2581\"}",
          FA_ERR_UNSUPPORTED, "normalizer Replace" },
        { "normalizer", "{\"type\": \"Sequence\"}", FA_ERR_INVALID_ARGUMENT, "normalizer.normalizers" },
        { "normalizer", "[]", FA_ERR_INVALID_ARGUMENT, "normalizer is not an object" },
        { "pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}", FA_ERR_UNSUPPORTED,
          "with a ByteLevel pre_tokenizer" },
        { "pre_tokenizer", "{\"type\": \"Whitespace\"}", FA_ERR_UNSUPPORTED, "pre_tokenizer type 'Whitespace'" },
        { "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"_\"}", FA_ERR_UNSUPPORTED,
          "pre_tokenizer.replacement" },
        { "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"sometimes\"}",
          FA_ERR_INVALID_VALUE, "pre_tokenizer.prepend_scheme" },
        { "decoder", "{\"type\": \"ByteLevel\"}", FA_ERR_UNSUPPORTED, "go together" },
        { "decoder", NULL, FA_ERR_UNSUPPORTED, "decoder is missing" },
        { "decoder", "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}", FA_ERR_UNSUPPORTED,
          "Strip before Replace" },
        { "decoder", "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, "
                     "\"content\": \" \"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 2}]}",
          FA_ERR_UNSUPPORTED, "decoder Strip" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *s = with(bad[i].key, bad[i].json);
        expect_refused(s, 20, bad[i].st, bad[i].field, "bad.json");
        free(s);
    }
    /* text, not structure */
    expect_refused("{\"model\": ", 20, FA_ERR_INVALID_ARGUMENT, "bad.json", "not valid JSON");
    expect_refused("[1]", 20, FA_ERR_INVALID_ARGUMENT, "bad.json", "not a JSON object");
    char *trail = edited(hand_base, "]}}", "]}} x");
    expect_refused(trail, 20, FA_ERR_INVALID_ARGUMENT, "bad.json", "data after");
    free(trail);
    /* the model's vocabulary is smaller than the file's ids */
    expect_refused(hand_base, 16, FA_ERR_INVALID_VALUE, "the model's vocab_size is 16", NULL);
    expect_refused(hand_base, 2, FA_ERR_INVALID_SHAPE, "vocab_size (2)", NULL);
    /* edits of the added tokens inside the whole list */
    const struct {
        const char *from, *to;
        fa_status st;
        const char *field;
    } edits[] = {
        { "\"content\": \"</s>\", \"special\": true", "\"content\": \"</s>\", \"special\": false", FA_ERR_INVALID_VALUE,
          "stops at id 2" },
        { "\"id\": 15, \"content\": \"ab!\"", "\"id\": 15, \"content\": \"abc\"", FA_ERR_INVALID_VALUE,
          "token 'abc' is there twice" },
        { "\"b\\u2581\": 14", "\"b\\u2581\": 16", FA_ERR_INVALID_VALUE, "gives id 16 to '<sep>'" },
        { "\"id\": 15, \"content\": \"ab!\"", "\"id\": 17, \"content\": \"ab!\"", FA_ERR_INVALID_VALUE,
          "id 15 is in neither" },
        { "\"lstrip\": true", "\"lstrip\": 1", FA_ERR_INVALID_VALUE, "added_tokens[4].lstrip" },
        { "\"single_word\": false,  \"lstrip\": true", "\"single_word\": true,  \"lstrip\": true", FA_ERR_UNSUPPORTED,
          "added_tokens[4] ('<sep>'): single_word" },
    };
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        char *e = edited(hand_base, edits[i].from, edits[i].to);
        expect_refused(e, 20, edits[i].st, edits[i].field, "bad.json");
        free(e);
    }
    /* added tokens outside model.vocab numbered otherwise than HF numbers them (in order) */
    char *x = edited(hand_base, "\"id\": 15, \"content\": \"ab!\"", "\"id\": 16, \"content\": \"ab!\"");
    char *y = edited(x, "\"id\": 16, \"content\": \"<sep>\"", "\"id\": 15, \"content\": \"<sep>\"");
    expect_refused(y, 20, FA_ERR_INVALID_VALUE, "added_tokens[3] ('ab!') has id 16", "numbers");
    free(x), free(y);
    /* a key twice in one object: model.vocab's, or the file's own (cJSON keeps both) */
    char *twice = edited(hand_base, "\"c\": 8,", "\"c\": 8, \"c\": 17,");
    expect_refused(twice, 20, FA_ERR_INVALID_ARGUMENT, "key 'c' appears twice in one object", NULL);
    free(twice);
    twice = edited(hand_base, "\"model\": {", "\"model\": null, \"model\": {");
    expect_refused(twice, 20, FA_ERR_INVALID_ARGUMENT, "key 'model' appears twice in one object", NULL);
    free(twice);
    char *bad_utf8 = edited(hand_base, "\"c\": 8,", "\"\xC3\": 17, \"c\": 8,");
    expect_refused(bad_utf8, 20, FA_ERR_INVALID_VALUE, "id 17 is not valid UTF-8", NULL);
    free(bad_utf8);
    /* the stories file at a smaller vocabulary, and fa_tokenizer_open by name */
    expect_refused(json_text, 300, FA_ERR_INVALID_VALUE, "the model's vocab_size is 300", NULL);
    char err[FA_MODEL_ERR_LEN];
    fa_tokenizer *t;
    assert_int_equal(fa_tokenizer_open("/nonexistent/tokenizer.json", 512, &t, err), FA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "/nonexistent/tokenizer.json"));
}

/* The tok512 file written again is the same text; a tokenizer read from tokenizer.json is
 * written back as it was read. */
static void test_write(void **state)
{
    (void)state;
    char dir[] = "/tmp/fa_tok_XXXXXX", path[64], err[FA_MODEL_ERR_LEN];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    fa_tokenizer *t = from_text(hand_base, 20);
    assert_int_equal(fa_tokenizer_write_json(t, path, err), FA_OK);
    fa_tokenizer_free(t);
    FILE *f = fopen(path, "rb");
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    assert_int_equal(n, strlen(hand_base));
    assert_memory_equal(buf, hand_base, n);
    assert_int_equal(fa_tokenizer_write_json(bin, path, err), FA_OK);
    assert_int_equal(fa_tokenizer_open(path, 512, &t, err), FA_OK);
    int32_t a[64], b[64];
    const char *s = "Once upon a time, Lily's cat \xE2\x80\x9Cran\xE2\x80\x9D away.";
    int na = encode(t, s, a), nb = encode(json, s, b);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof(int32_t) * (size_t)na);
    fa_tokenizer_free(t);
    unlink(path);
    rmdir(dir);
}

/* run.c's merges, the reference: while some adjacent pair is a piece, the pair of the highest
 * score (the leftmost of equals) becomes it, found by a scan of every pair. */
static int32_t scan_merges(const fa_tokenizer *t, int32_t *ids, int32_t k, char *buf)
{
    for (;;) {
        float best = -INFINITY;
        int32_t best_id = -1, best_at = -1;
        for (int32_t i = 0; i + 1 < k; i++) {
            const size_t la = t->offset[ids[i] + 1] - t->offset[ids[i]] - 1;
            const size_t lb = t->offset[ids[i + 1] + 1] - t->offset[ids[i + 1]] - 1;
            memcpy(buf, t->text + t->offset[ids[i]], la);
            memcpy(buf + la, t->text + t->offset[ids[i + 1]], lb);
            const int32_t id = fa_tok_lookup(t, buf, la + lb);
            if (id >= 0 && t->scores[id] > best)
                best = t->scores[id], best_id = id, best_at = i;
        }
        if (best_at < 0)
            return k;
        ids[best_at] = best_id;
        memmove(&ids[best_at + 1], &ids[best_at + 2], sizeof(int32_t) * (size_t)(k - best_at - 2));
        k--;
    }
}

/* The encoder's merges against the scan on random llama2.c vocabularies whose scores take two
 * or three values (ties everywhere), with pieces of letters and spaces, sometimes an empty one,
 * over random texts of those letters and spaces. */
static void test_merge_order(void **state)
{
    (void)state;
    uint64_t r = seed ^ 0x5eedull;
    unsigned char *blob = malloc(1 << 16);
    char piece[16], text[64], buf[64], err[FA_MODEL_ERR_LEN];
    assert_non_null(blob);
    for (int v = 0; v < 200; v++) {
        size_t at = 4;
        const int32_t max_len = 16, letters = 2 + (int)(next(&r) % 3), scores = 2 + (int)(next(&r) % 2);
        int32_t n = 0;
        memcpy(blob, &max_len, 4);
#define PIECE(s, l)                                                                             \
    do {                                                                                        \
        const float sc = (float)(next(&r) % (uint64_t)scores);                                  \
        const int32_t len_ = (l);                                                               \
        memcpy(blob + at, &sc, 4), memcpy(blob + at + 4, &len_, 4), memcpy(blob + at + 8, s, (size_t)len_); \
        at += 8 + (size_t)len_, n++;                                                            \
    } while (0)
        PIECE("<unk>", 5);
        PIECE("<s>", 3);
        PIECE("</s>", 4);
        for (int b = 0; b < 256; b++) {
            snprintf(piece, sizeof(piece), "<0x%02X>", b);
            PIECE(piece, 6);
        }
        PIECE(" ", 1);
        for (int c = 0; c < letters; c++) {
            piece[0] = (char)('a' + c);
            PIECE(piece, 1);
        }
        if (next(&r) % 4 == 0)
            PIECE("", 0);
        for (int e = 5 + (int)(next(&r) % 60); e > 0; e--) {
            const int len = 2 + (int)(next(&r) % 5);
            for (int j = 0; j < len; j++)
                piece[j] = next(&r) % 6 == 0 ? ' ' : (char)('a' + next(&r) % (uint64_t)letters);
            PIECE(piece, len);
        }
#undef PIECE
        fa_tokenizer *t = NULL;
        assert_int_equal(fa_tokenizer_from_memory(blob, at, n, &t, err), FA_OK);
        for (int k = 0; k < 100; k++) {
            const int len = (int)(next(&r) % 60);
            for (int j = 0; j < len; j++)
                text[j] = next(&r) % 6 == 0 ? ' ' : (char)('a' + next(&r) % (uint64_t)letters);
            text[len] = 0;
            int32_t got[64], want[64], ng = encode(t, text, got), nw = 0;
            want[nw++] = FA_TOKEN_BOS; /* BOS, the dummy prefix's space, then a piece a character */
            if (len > 0)
                want[nw++] = fa_tok_lookup(t, " ", 1);
            for (int j = 0; j < len; j++)
                want[nw++] = fa_tok_lookup(t, text + j, 1);
            nw = scan_merges(t, want, nw, buf);
            if (ng != nw || memcmp(got, want, sizeof(int32_t) * (size_t)ng) != 0) {
                fprintf(stderr, "vocabulary %d, text '%s': the encoder's %d ids differ from the scan's %d\n", v,
                        text, (int)ng, (int)nw);
                fail();
            }
        }
        fa_tokenizer_free(t);
    }
    free(blob);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("tokenizer: seed %llu (replay: FLASHATTN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    char err[FA_MODEL_ERR_LEN], dir[] = "/tmp/fa_tok_XXXXXX", path[64];
    if (!mkdtemp(dir) || fa_tokenizer_open(FA_MODELS_DIR "/tok512.bin", 512, &bin, err) != FA_OK) {
        fprintf(stderr, "setup: %s\n", err);
        return 1;
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (fa_tokenizer_write_json(bin, path, err) != FA_OK || fa_tokenizer_open(path, 512, &json, err) != FA_OK) {
        fprintf(stderr, "setup: %s\n", err);
        return 1;
    }
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    json_text = malloc((size_t)len + 1);
    json_text[fread(json_text, 1, (size_t)len, f)] = 0;
    fclose(f);
    unlink(path);
    rmdir(dir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_prompts),
        cmocka_unit_test(test_stories_random),
        cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_hand),
        cmocka_unit_test(test_hf_reference),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_write),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fa_tokenizer_free(bin);
    fa_tokenizer_free(json);
    free(json_text);
    return rc;
}
