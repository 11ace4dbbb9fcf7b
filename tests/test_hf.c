/* SPDX-License-Identifier: MIT */
/*
 * Hugging Face checkpoints: stories260K converted to HF (f32, one file and 3 shards) generates
 * the .bin's greedy ids id for id; f16/bf16 exports equal the .bin with its weights rounded the
 * same way (logits bit for bit) and stay within the rounding's error model of f32; a GQA
 * synthetic model with a separate lm_head, rope_theta and rms_norm_eps round-trips exactly; the
 * un-permuted q/k give HF's rotate-half attention scores; rope_scaling's llama3 and linear
 * frequencies equal HF's formula in float64; and broken directories are refused
 * with the status and a message naming the file and field. FLASHATTN_TEST_SEED=N replays.
 */
#include "model.h"

#include <cjson/cJSON.h>
#include <dirent.h>
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
static fa_context_t ctx;
static fa_tokenizer *tok;
static fa_model *story;

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- scratch directories ---- */

static void mktemp_dir(char *dir)
{
    strcpy(dir, "/tmp/fa_hf_XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    b[len] = 0;
    *n = (size_t)len;
    return b;
}

static void spit(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static fa_model *open_hf(const char *dir)
{
    fa_model *m;
    char err[FA_MODEL_ERR_LEN];
    fa_status st = fa_model_load(dir, &m, err);
    if (st != FA_OK)
        fprintf(stderr, "%s: %s\n", dir, err);
    assert_int_equal(st, FA_OK);
    return m;
}

/* ---- generation and logits ---- */

typedef struct collect {
    int32_t ids[1024];
    int n;
} collect;

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)text, (void)len;
    collect *c = user;
    c->ids[c->n++] = token;
    return 0;
}

/* Greedy ids (prompt echo, then generated) of m with tokenizer t. */
static void greedy_with(const fa_model *m, const fa_tokenizer *t, const char *prompt, int steps, collect *c)
{
    char err[FA_MODEL_ERR_LEN];
    fa_model_state *st;
    fa_sampler *smp;
    assert_int_equal(fa_model_state_create(m, ctx, NULL, &st, err), FA_OK);
    assert_int_equal(fa_sampler_create(m->config.vocab_size, 0.0f, 0.9f, 1, &smp, err), FA_OK);
    memset(c, 0, sizeof(*c));
    if (fa_generate(m, t, st, smp, prompt, steps, on_token, c, NULL, err) != FA_OK)
        fail_msg("%s", err);
    fa_sampler_free(smp);
    fa_model_state_free(st);
}

static void greedy(const fa_model *m, const char *prompt, int steps, collect *c)
{
    greedy_with(m, tok, prompt, steps, c);
}

/* Last-token logits of n tokens (a prefill) into out[vocab]. */
static void logits_of(const fa_model *m, const int32_t *ids, int n, float *out)
{
    char err[FA_MODEL_ERR_LEN];
    fa_model_state *st;
    float *l;
    assert_int_equal(fa_model_state_create(m, ctx, NULL, &st, err), FA_OK);
    assert_int_equal(fa_model_forward(m, st, ids, n, 0, &l, err), FA_OK);
    memcpy(out, l, sizeof(float) * (size_t)m->config.vocab_size);
    fa_model_state_free(st);
}

/* The floats every tensor occupies: the image minus the header and the legacy RoPE tables
 * (which an HF checkpoint does not carry and the loader leaves zero). */
static void expect_same_weights(const fa_model *a, const fa_model *b)
{
    const fa_model_config *c = &a->config;
    assert_int_equal(a->bytes, b->bytes);
    assert_memory_equal(a->image, b->image, FA_MODEL_HEADER_BYTES);
    size_t head = (size_t)((const unsigned char *)(a->w.rms_final + c->dim) - (const unsigned char *)a->image);
    size_t rope = sizeof(float) * (size_t)c->seq_len * (size_t)(c->dim / c->n_heads);
    assert_memory_equal(a->image, b->image, head);
    assert_memory_equal((const char *)a->image + head + rope, (const char *)b->image + head + rope,
                        a->bytes - head - rope);
}

static void test_stories_f32(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN], one[64], three[64];
    mktemp_dir(one);
    mktemp_dir(three);
    assert_int_equal(fa_model_write_hf(story, one, FA_HF_F32, 1, err), FA_OK);
    assert_int_equal(fa_model_write_hf(story, three, FA_HF_F32, 3, err), FA_OK);
    char p[128];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/model-00003-of-00003.safetensors", three);
    assert_int_equal(stat(p, &sb), 0);
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", three);
    assert_int_equal(stat(p, &sb), 0);
    const char *prompts[] = { "Once upon a time", "Lily and Ben went to the park" };
    for (int v = 0; v < 2; v++) {
        fa_model *m = open_hf(v ? three : one);
        assert_int_equal(m->config.n_kv_heads, 4);
        assert_int_equal(m->config.shared_classifier, 1);
        assert_true(m->config.rope_theta == 10000.0f && m->config.norm_eps == 1e-5f);
        expect_same_weights(story, m);
        for (int k = 0; k < 2; k++) {
            collect a, b;
            greedy(story, prompts[k], 160, &a);
            greedy(m, prompts[k], 160, &b);
            assert_true(a.n > 100);
            assert_int_equal(a.n, b.n);
            assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n);
        }
        fa_model_free(m);
    }
    rm_dir(one);
    rm_dir(three);
}

/* The test's own roundings to 16 bits: bf16 to nearest even by bit arithmetic, f16 by the
 * compiler's _Float16 conversion (round to nearest even). */
static float round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1)) & 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return f;
}

static float round_f16(float f)
{
    return (float)(_Float16)f;
}

/* f16 and bf16 exports: the loaded model is the .bin with each weight rounded (logits bit for
 * bit), and its logits stay within a first-order error model of f32's: each weight carries a
 * relative error of at most u (2^-9 bf16, 2^-12 f16: half an ulp of an 8- or 11-bit
 * significand), and each of the 2 L + 2 products on the residual path (embedding, the two
 * sublayers of every layer, the classifier) adds at most u relative to the logits' scale, so
 * |dlogit| <= (2 L + 2) u max|logit|. */
static void test_stories_16bit(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN], dir[64];
    const int32_t ids[] = { 1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421 };
    const int n = sizeof(ids) / sizeof(ids[0]), V = story->config.vocab_size;
    float *ref = malloc(sizeof(float) * V), *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    logits_of(story, ids, n, ref);
    for (int d = FA_HF_F16; d <= FA_HF_BF16; d++) {
        mktemp_dir(dir);
        assert_int_equal(fa_model_write_hf(story, dir, (fa_hf_dtype)d, d == FA_HF_F16 ? 2 : 1, err), FA_OK);
        fa_model *m = open_hf(dir);
        /* the .bin rounded in memory */
        unsigned char *img = malloc(story->bytes);
        memcpy(img, story->image, story->bytes);
        float *f = (float *)(img + FA_MODEL_HEADER_BYTES);
        for (size_t i = 0; i < (story->bytes - FA_MODEL_HEADER_BYTES) / 4; i++)
            f[i] = d == FA_HF_F16 ? round_f16(f[i]) : round_bf16(f[i]);
        fa_model *q;
        assert_int_equal(fa_model_from_memory(img, story->bytes, 1, &q, err), FA_OK);
        expect_same_weights(q, m);
        logits_of(m, ids, n, a);
        logits_of(q, ids, n, b);
        assert_memory_equal(a, b, sizeof(float) * V);
        double mx = 0, scale = 0, u = d == FA_HF_F16 ? ldexp(1, -12) : ldexp(1, -9);
        for (int i = 0; i < V; i++) {
            mx = fmax(mx, fabs((double)a[i] - ref[i]));
            scale = fmax(scale, fabs((double)ref[i]));
        }
        double tol = (2.0 * story->config.n_layers + 2) * u * scale;
        printf("%s: max |logit - f32 logit| %.3g, bound %.3g (largest logit %.3g)\n",
               d == FA_HF_F16 ? "f16" : "bf16", mx, tol, scale);
        assert_true(mx > 0 && mx <= tol);
        fa_model_free(q);
        fa_model_free(m);
        rm_dir(dir);
    }
    free(ref), free(a), free(b);
}

/* GQA (4 heads over 2), a separate lm_head, rope_theta and rms_norm_eps not llama2.c's: the HF
 * round trip gives the same logits bit for bit, and both settings change them. */
static void test_gqa_roundtrip(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN], dir[64];
    fa_model_config c;
    assert_int_equal(fa_model_config_parse("64x3x4x2x96x-300x80", &c, err), FA_OK);
    c.rope_theta = 500000.0f;
    c.norm_eps = 1e-6f;
    fa_model *m, *base;
    assert_int_equal(fa_model_synth(&c, seed, &m, err), FA_OK);
    c.rope_theta = c.norm_eps = 0.0f;
    assert_int_equal(fa_model_synth(&c, seed, &base, err), FA_OK);
    mktemp_dir(dir);
    assert_int_equal(fa_model_write_hf(m, dir, FA_HF_F32, 4, err), FA_OK);
    fa_model *h = open_hf(dir);
    assert_true(h->config.rope_theta == 500000.0f && h->config.norm_eps == 1e-6f);
    assert_int_equal(h->config.shared_classifier, 0);
    expect_same_weights(m, h);
    uint64_t r = seed ^ 99;
    int32_t ids[50];
    for (int i = 0; i < 50; i++)
        ids[i] = (int32_t)(next(&r) % 300);
    float a[300], b[300], z[300];
    logits_of(m, ids, 50, a);
    logits_of(h, ids, 50, b);
    logits_of(base, ids, 50, z);
    assert_memory_equal(a, b, sizeof(a));
    double diff = 0;
    for (int i = 0; i < 300; i++)
        diff = fmax(diff, fabs((double)a[i] - z[i]));
    printf("theta 5e5, eps 1e-6 vs 1e4, 1e-5: max |logit diff| %.3g\n", diff);
    assert_true(diff > 1e-3);
    fa_model_free(h);
    fa_model_free(base);
    fa_model_free(m);
    rm_dir(dir);
}

/* One tensor of an f32 safetensors file, as the file stores it (HF's layout). */
static float *hf_tensor(const char *file, const char *name, size_t count)
{
    size_t n;
    char *b = slurp(file, &n);
    uint64_t len = 0;
    memcpy(&len, b, 8);
    cJSON *h = cJSON_ParseWithLength(b + 8, (size_t)len);
    cJSON *off = cJSON_GetObjectItem(cJSON_GetObjectItem(h, name), "data_offsets");
    assert_non_null(off);
    size_t at = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
    float *t = malloc(sizeof(float) * count);
    memcpy(t, b + 8 + len + at, sizeof(float) * count);
    cJSON_Delete(h);
    free(b);
    return t;
}

/* The runner's attention scores equal HF's: q = q_proj x and k = k_proj y from the file, each
 * head rotated HF's way (rotate_half: pairs (i, i + hs/2)), query head h against kv head
 * h / (heads / kv_heads); against the loaded wq, wk rotated in adjacent pairs. */
static void test_rope_layout(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN], dir[64], file[128];
    fa_model_config c;
    assert_int_equal(fa_model_config_parse("64x1x4x2x32x50x40", &c, err), FA_OK);
    fa_model *m;
    assert_int_equal(fa_model_synth(&c, seed, &m, err), FA_OK);
    mktemp_dir(dir);
    assert_int_equal(fa_model_write_hf(m, dir, FA_HF_F32, 1, err), FA_OK);
    fa_model *h = open_hf(dir);
    snprintf(file, sizeof(file), "%s/model.safetensors", dir);
    const int D = 64, H = 4, KV = 2, hs = 16, half = 8;
    float *wq = hf_tensor(file, "model.layers.0.self_attn.q_proj.weight", (size_t)D * D);
    float *wk = hf_tensor(file, "model.layers.0.self_attn.k_proj.weight", (size_t)KV * hs * D);
    uint64_t r = seed ^ 5;
    double x[64], y[64];
    for (int j = 0; j < D; j++)
        x[j] = (double)(next(&r) >> 11) / 9007199254740992.0 - 0.5, y[j] = (double)(next(&r) >> 11) / 9007199254740992.0 - 0.5;
    const int pq = 11, pk = 4;
    double qh[64], kh[32], qr[64], kr[32];
    for (int side = 0; side < 2; side++) {
        const float *Q = side ? h->w.wq : wq, *K = side ? h->w.wk : wk;
        double *q = side ? qr : qh, *k = side ? kr : kh, t[64];
        for (int o = 0; o < D; o++) {
            q[o] = 0;
            for (int j = 0; j < D; j++)
                q[o] += (double)Q[o * D + j] * x[j];
        }
        for (int o = 0; o < KV * hs; o++) {
            k[o] = 0;
            for (int j = 0; j < D; j++)
                k[o] += (double)K[o * D + j] * y[j];
        }
        for (int pass = 0; pass < 2; pass++) {
            double *v = pass ? k : q;
            int heads = pass ? KV : H, pos = pass ? pk : pq;
            for (int hh = 0; hh < heads; hh++)
                for (int i = 0; i < half; i++) {
                    double a = pos * pow(10000.0, -2.0 * i / hs), cs = cos(a), sn = sin(a);
                    int i0 = hh * hs + (side ? 2 * i : i), i1 = hh * hs + (side ? 2 * i + 1 : i + half);
                    t[0] = v[i0] * cs - v[i1] * sn;
                    t[1] = v[i1] * cs + v[i0] * sn;
                    v[i0] = t[0], v[i1] = t[1];
                }
        }
    }
    for (int hh = 0; hh < H; hh++) {
        double sh = 0, sr = 0, mag = 0;
        int g = hh / (H / KV);
        for (int j = 0; j < hs; j++) {
            sh += qh[hh * hs + j] * kh[g * hs + j];
            sr += qr[hh * hs + j] * kr[g * hs + j];
            mag += fabs(qh[hh * hs + j] * kh[g * hs + j]);
        }
        if (fabs(sh - sr) > 1e-12 * mag) {
            fprintf(stderr, "head %d: HF score %.17g, runner %.17g\n", hh, sh, sr);
            fail();
        }
    }
    free(wq), free(wk);
    fa_model_free(h);
    fa_model_free(m);
    rm_dir(dir);
}

/* HF's llama3 frequencies (_compute_llama3_parameters) and linear scaling, in float64. */
static double hf_inv_freq(double theta, int hs, int i, const fa_rope_scaling *r)
{
    double inv = pow(theta, -2.0 * i / hs);
    if (r->type == FA_ROPE_SCALING_LINEAR)
        return inv / r->factor;
    if (r->type != FA_ROPE_SCALING_LLAMA3)
        return inv;
    double old = r->original_max_pos, wavelen = 2 * M_PI / inv;
    if (wavelen < old / r->high_freq_factor)
        return inv;
    if (wavelen > old / r->low_freq_factor)
        return inv / r->factor;
    double smooth = (old / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
    return (1 - smooth) * inv / r->factor + smooth * inv;
}

/* rope_scaling: Llama-3.1-8B's llama3 parameters (theta 5e5, head_size 128) give HF's
 * frequencies within float rounding, with three bands checked by hand; linear divides them; a
 * config.json with either loads, and an export writes it back. */
static void test_rope_scaling(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN], dir[64];
    fa_model_config c;
    assert_int_equal(fa_model_config_parse("llama3-8b", &c, err), FA_OK);
    c.rope_scaling = (fa_rope_scaling){ FA_ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, 8192 };
    assert_int_equal(fa_model_config_check(&c, NULL, err), FA_OK);
    /* by hand: pair 0 (wavelength 2 pi) is kept; pair 30 has wavelength 2948 between 8192 / 4
     * and 8192, so smooth = (8192 / 2948.30 - 1) / 3 = 0.592844 and the frequency is
     * 0.00213112 (0.592844 + 0.407156 / 8) = 0.00137189; pair 63 (wavelength 2.56e6) is
     * 5e5^(-126/128) / 8 = 2.45514e-6 / 8 */
    const struct { int i; double f; } hand[] = { { 0, 1.0 }, { 20, 0.016560440080994446 },
                                                  { 30, 0.0013718935677611381 }, { 63, 3.068925988914511e-07 } };
    for (size_t k = 0; k < sizeof(hand) / sizeof(hand[0]); k++)
        assert_true(fabs(fa_model_rope_angle(&c, 1, hand[k].i) / hand[k].f - 1) < 2e-6);
    const fa_rope_scaling kinds[] = { { FA_ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, 8192 },
                                      { FA_ROPE_SCALING_LLAMA3, 32.0f, 1.0f, 32.0f, 4096 },
                                      { FA_ROPE_SCALING_LINEAR, 4.0f, 0, 0, 0 },
                                      { FA_ROPE_SCALING_NONE, 0, 0, 0, 0 } };
    int medium = 0;
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        c.rope_scaling = kinds[k];
        for (int i = 0; i < 64; i++) {
            double want = hf_inv_freq(5e5, 128, i, &kinds[k]);
            double wavelen = 2 * M_PI / pow(5e5, -i / 64.0);
            medium += kinds[k].type == FA_ROPE_SCALING_LLAMA3 && wavelen < kinds[k].original_max_pos / kinds[k].low_freq_factor &&
                      wavelen > kinds[k].original_max_pos / kinds[k].high_freq_factor;
            for (int pos = 1; pos < 100000; pos *= 7) {
                double got = fa_model_rope_angle(&c, pos, i);
                if (fabs(got / (pos * want) - 1) > 2e-6) {
                    fprintf(stderr, "scaling %zu pair %d pos %d: %.9g, HF %.9g\n", k, i, pos, got, pos * want);
                    fail();
                }
            }
        }
    }
    assert_true(medium >= 8); /* the blend is exercised, not only the two outer bands */
    /* through config.json and back */
    fa_model_config t;
    assert_int_equal(fa_model_config_parse("32x2x4x2x48x40x16", &t, err), FA_OK);
    t.rope_theta = 500000.0f;
    for (int k = 0; k < 3; k++) {
        t.rope_scaling = kinds[k];
        fa_model *m;
        assert_int_equal(fa_model_synth(&t, 3, &m, err), FA_OK);
        mktemp_dir(dir);
        assert_int_equal(fa_model_write_hf(m, dir, FA_HF_F32, 1, err), FA_OK);
        fa_model *h = open_hf(dir);
        assert_memory_equal(&h->config.rope_scaling, &kinds[k], sizeof(fa_rope_scaling));
        for (int i = 0; i < 4; i++)
            assert_true(fa_model_rope_angle(&h->config, 15, i) == fa_model_rope_angle(&m->config, 15, i));
        fa_model_free(h);
        fa_model_free(m);
        rm_dir(dir);
    }
}

/* ---- refusals ---- */

/* A tiny valid checkpoint (GQA, head_size 8) written in dir, f32, in `shards` files. */
static void tiny(char *dir, int shards)
{
    char err[FA_MODEL_ERR_LEN];
    fa_model_config c;
    fa_model *m;
    mktemp_dir(dir);
    assert_int_equal(fa_model_config_parse("32x2x4x2x48x40x16", &c, err), FA_OK);
    assert_int_equal(fa_model_synth(&c, 3, &m, err), FA_OK);
    assert_int_equal(fa_model_write_hf(m, dir, FA_HF_F32, shards, err), FA_OK);
    fa_model_free(m);
}

static void expect_hf(const char *dir, fa_status want, const char *a, const char *b)
{
    fa_model *m = (fa_model *)0x1;
    char err[FA_MODEL_ERR_LEN] = "";
    fa_status st = fa_model_open_hf(dir, &m, err);
    if (st != want || !strstr(err, a) || (b && !strstr(err, b))) {
        fprintf(stderr, "want %s naming '%s' and '%s', got %s: %s\n", fa_status_string(want), a,
                b ? b : "", fa_status_string(st), err);
        fail();
    }
    if (st == FA_OK)
        fa_model_free(m);
    else
        assert_null(m);
}

/* config.json with key set to v (NULL: removed) */
static void edit_config(const char *dir, const char *key, cJSON *v)
{
    char p[128];
    size_t n;
    snprintf(p, sizeof(p), "%s/config.json", dir);
    char *t = slurp(p, &n);
    cJSON *j = cJSON_Parse(t);
    free(t);
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    if (v)
        cJSON_AddItemToObject(j, key, v);
    t = cJSON_Print(j);
    spit(p, t, strlen(t));
    free(t);
    cJSON_Delete(j);
}

/* A safetensors file's header rewritten by edit (the data bytes kept as they are). */
static void edit_header(const char *file, void (*edit)(cJSON *h))
{
    size_t n;
    char *b = slurp(file, &n);
    uint64_t len;
    memcpy(&len, b, 8);
    cJSON *h = cJSON_ParseWithLength(b + 8, (size_t)len);
    edit(h);
    char *js = cJSON_PrintUnformatted(h);
    uint64_t nl = strlen(js);
    char *o = malloc(8 + nl + (n - 8 - len));
    memcpy(o, &nl, 8);
    memcpy(o + 8, js, nl);
    memcpy(o + 8 + nl, b + 8 + len, n - 8 - len);
    spit(file, o, 8 + nl + (n - 8 - len));
    free(o), free(js), free(b);
    cJSON_Delete(h);
}

static cJSON *entry(cJSON *h, const char *name)
{
    cJSON *e = cJSON_GetObjectItemCaseSensitive(h, name);
    assert_non_null(e);
    return e;
}

static void set_offsets(cJSON *h, const char *name, double add_begin, double add_end)
{
    cJSON *off = cJSON_GetObjectItem(entry(h, name), "data_offsets");
    double b = cJSON_GetArrayItem(off, 0)->valuedouble, e = cJSON_GetArrayItem(off, 1)->valuedouble;
    cJSON_ReplaceItemInArray(off, 0, cJSON_CreateNumber(b + add_begin));
    cJSON_ReplaceItemInArray(off, 1, cJSON_CreateNumber(e + add_end));
}

static void past_the_file(cJSON *h) { set_offsets(h, "model.norm.weight", 1e6, 1e6); }
/* q_proj of layer 0 reading the first bytes, which are another tensor's */
static void overlap(cJSON *h)
{
    cJSON *off = cJSON_GetObjectItem(entry(h, "model.layers.0.self_attn.q_proj.weight"), "data_offsets");
    const double b = cJSON_GetArrayItem(off, 0)->valuedouble, e = cJSON_GetArrayItem(off, 1)->valuedouble;
    cJSON_ReplaceItemInArray(off, 0, cJSON_CreateNumber(0));
    cJSON_ReplaceItemInArray(off, 1, cJSON_CreateNumber(e - b));
}
static void bad_metadata(cJSON *h)
{
    cJSON_DeleteItemFromObject(h, "__metadata__");
    cJSON_AddItemToObject(h, "__metadata__", cJSON_CreateNumber(5));
}
static void short_span(cJSON *h) { set_offsets(h, "model.norm.weight", 0, -4); }
static void wrong_shape(cJSON *h)
{
    cJSON_ReplaceItemInObject(entry(h, "model.norm.weight"), "shape", cJSON_CreateIntArray((int[]){ 33 }, 1));
}
static void bad_dtype(cJSON *h)
{
    cJSON_ReplaceItemInObject(entry(h, "model.layers.1.self_attn.v_proj.weight"), "dtype", cJSON_CreateString("I64"));
}
/* up_proj's bytes under a name the loader skips: a skipped tensor is checked all the same
 * (a rotary table is [head_dim / 2]) */
static void drop_tensor(cJSON *h)
{
    cJSON *e = cJSON_DetachItemFromObject(h, "model.layers.1.mlp.up_proj.weight");
    cJSON_AddItemToObject(h, "model.layers.1.self_attn.rotary_emb.inv_freq", e);
}
/* ... and only under a layer's own name */
static void loose_skip_name(cJSON *h)
{
    cJSON *e = cJSON_DetachItemFromObject(h, "model.layers.1.mlp.up_proj.weight");
    cJSON_AddItemToObject(h, "junkrotary_emb.inv_freq", e);
}
static void gap(cJSON *h) { cJSON_DeleteItemFromObject(h, "model.layers.1.mlp.up_proj.weight"); }
static void rename_tensor(cJSON *h)
{
    cJSON *e = cJSON_DetachItemFromObject(h, "model.layers.0.self_attn.q_proj.weight");
    cJSON_AddItemToObject(h, "model.layers.0.self_attn.q_proj.bias", e);
}
static void twice(cJSON *h)
{
    cJSON_AddItemToObject(h, "model.norm.weight", cJSON_Duplicate(entry(h, "model.norm.weight"), 1));
}

static void test_config_refusals(void **state)
{
    (void)state;
    char dir[64], p[128];
    tiny(dir, 1);
    expect_hf(dir, FA_OK, "", NULL);
    const struct {
        const char *key;
        const char *json; /* NULL: the key removed */
        fa_status st;
        const char *field;
    } bad[] = {
        { "hidden_act", "\"gelu\"", FA_ERR_UNSUPPORTED, "hidden_act" },
        { "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0}", FA_ERR_INVALID_ARGUMENT,
          "rope_scaling.low_freq_factor is missing" },
        { "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1, "
                          "\"original_max_position_embeddings\": 64}", FA_ERR_INVALID_VALUE, "rope_scaling.high_freq_factor" },
        { "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                          "\"original_max_position_embeddings\": 6.5}", FA_ERR_INVALID_VALUE, "original_max_position_embeddings" },
        { "rope_scaling", "{\"type\": \"linear\", \"factor\": -2.0}", FA_ERR_INVALID_VALUE, "rope_scaling.factor" },
        { "rope_scaling", "{\"type\": \"linear\"}", FA_ERR_INVALID_ARGUMENT, "rope_scaling.factor is missing" },
        { "rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}", FA_ERR_UNSUPPORTED, "rope_scaling type 'dynamic'" },
        { "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", FA_ERR_UNSUPPORTED, "yarn" },
        { "rope_scaling", "{\"factor\": 4.0}", FA_ERR_INVALID_ARGUMENT, "rope_scaling.rope_type" },
        { "rope_scaling", "[1]", FA_ERR_INVALID_ARGUMENT, "rope_scaling must be an object" },
        { "model_type", "\"gpt2\"", FA_ERR_UNSUPPORTED, "model_type" },
        { "model_type", NULL, FA_ERR_INVALID_ARGUMENT, "model_type" },
        { "attention_bias", "true", FA_ERR_UNSUPPORTED, "attention_bias" },
        { "mlp_bias", "true", FA_ERR_UNSUPPORTED, "mlp_bias" },
        { "head_dim", "16", FA_ERR_UNSUPPORTED, "head_dim" },
        { "hidden_size", NULL, FA_ERR_INVALID_ARGUMENT, "hidden_size" },
        { "hidden_size", "32.5", FA_ERR_INVALID_SHAPE, "hidden_size" },
        { "vocab_size", "-4", FA_ERR_INVALID_SHAPE, "vocab_size" },
        { "num_key_value_heads", "3", FA_ERR_INVALID_SHAPE, "num_key_value_heads" },
        { "num_attention_heads", "5", FA_ERR_INVALID_SHAPE, "hidden_size (32) must be a multiple of num_attention_heads" },
        { "num_attention_heads", "32", FA_ERR_UNSUPPORTED, "head_dim (8)" },
        { "num_hidden_layers", "\"2\"", FA_ERR_INVALID_SHAPE, "num_hidden_layers" },
        { "rms_norm_eps", "0", FA_ERR_INVALID_VALUE, "rms_norm_eps" },
        { "rope_theta", "-1", FA_ERR_INVALID_VALUE, "rope_theta" },
        { "tie_word_embeddings", "1", FA_ERR_INVALID_VALUE, "tie_word_embeddings" },
        { "tie_word_embeddings", "false", FA_ERR_INVALID_ARGUMENT, "lm_head.weight" },
        { "bos_token_id", "\"<s>\"", FA_ERR_INVALID_VALUE, "bos_token_id" },
        { "bos_token_id", "64", FA_ERR_INVALID_VALUE, "bos_token_id (64) must be below vocab_size" },
        { "eos_token_id", "[2, -1]", FA_ERR_INVALID_VALUE, "eos_token_id" },
        { "eos_token_id", "[1, 2, 3, 4, 5, 6, 7, 8, 9]", FA_ERR_UNSUPPORTED, "at most 8" },
        { "eos_token_id", "[2, 64]", FA_ERR_INVALID_VALUE, "eos_token_id 64 must be below" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char keep[64];
        tiny(keep, 1);
        edit_config(keep, bad[i].key, bad[i].json ? cJSON_Parse(bad[i].json) : NULL);
        expect_hf(keep, bad[i].st, bad[i].field, bad[i].st == FA_ERR_INVALID_ARGUMENT &&
                  !strstr(bad[i].field, ".weight") ? "config.json" : NULL);
        rm_dir(keep);
    }
    /* special ids: absent, transformers' defaults (1 and 2); null, none; a list, all of it */
    const struct {
        const char *bos, *eos;
        int32_t want_bos, n_eos, eos0;
    } ids[] = { { NULL, NULL, 1, 1, 2 }, { "null", "null", -1, 0, 0 }, { "3", "[5, 7]", 3, 2, 5 } };
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        char keep[64], err[FA_MODEL_ERR_LEN];
        tiny(keep, 1);
        edit_config(keep, "bos_token_id", ids[i].bos ? cJSON_Parse(ids[i].bos) : NULL);
        edit_config(keep, "eos_token_id", ids[i].eos ? cJSON_Parse(ids[i].eos) : NULL);
        fa_model *m;
        assert_int_equal(fa_model_open_hf(keep, &m, err), FA_OK);
        assert_int_equal(m->config.bos_id, ids[i].want_bos);
        assert_int_equal(m->config.n_eos, ids[i].n_eos);
        if (ids[i].n_eos)
            assert_int_equal(m->config.eos_ids[0], ids[i].eos0);
        fa_model_free(m);
        rm_dir(keep);
    }
    /* mistral: accepted without a sliding window inside the context, refused with one */
    edit_config(dir, "model_type", cJSON_CreateString("mistral"));
    edit_config(dir, "sliding_window", cJSON_CreateNull());
    expect_hf(dir, FA_OK, "", NULL);
    edit_config(dir, "sliding_window", cJSON_CreateNumber(8));
    expect_hf(dir, FA_ERR_UNSUPPORTED, "sliding_window", "config.json");
    snprintf(p, sizeof(p), "%s/config.json", dir);
    /* files that are not JSON, or JSON cJSON takes and the format does not: a value cut at an
     * escaped NUL (read as "llama"), raw control characters, anything but whitespace after the
     * value, numbers strtod reads and JSON does not write, a \u escape without hex digits
     * (read as NUL), a key twice */
    const struct {
        const char *text;
        size_t len; /* 0: strlen */
        fa_status st;
        const char *says;
    } nojson[] = {
        { "{\"model_type\": \"llama\", ", 0, FA_ERR_INVALID_ARGUMENT, "not valid JSON" },
        { "[1, 2]", 0, FA_ERR_INVALID_ARGUMENT, "object" },
        { "{\"model_type\": \"llama\", \"rope_scaling\": {\"factor\": 2, \"factor\": 4}}", 0,
          FA_ERR_INVALID_ARGUMENT, "'factor' appears twice" },
        { "{\"model_type\": \"llama\\u0000gpt2\"}", 0, FA_ERR_INVALID_VALUE, "escapes a NUL character" },
        { "{\"model_type\": \"lla\x1b[2Jma\"}", 0, FA_ERR_INVALID_ARGUMENT,
          "control character inside a string at byte 19" },
        { "{\"model_type\": \"llama\"}\0\0", 25, FA_ERR_INVALID_ARGUMENT, "data after its JSON value (byte 23)" },
        { "{\"model_type\": \"llama\", \"hidden_size\": 064}", 0, FA_ERR_INVALID_ARGUMENT,
          "number JSON does not write at byte 39" },
        { "{\"model_type\": \"llama\", \"rms_norm_eps\": 1.e-5}", 0, FA_ERR_INVALID_ARGUMENT,
          "number JSON does not write at byte 40" },
        { "{\"model_type\": \"llama\\uZZZZ-x\"}", 0, FA_ERR_INVALID_ARGUMENT,
          "\\u escape without four hex digits at byte 21" },
        { "{\x0b\"model_type\": \"llama\"}", 0, FA_ERR_INVALID_ARGUMENT, "control character between tokens at byte 1" },
    };
    for (size_t i = 0; i < sizeof(nojson) / sizeof(nojson[0]); i++) {
        spit(p, nojson[i].text, nojson[i].len ? nojson[i].len : strlen(nojson[i].text));
        expect_hf(dir, nojson[i].st, "config.json", nojson[i].says);
    }
    unlink(p);
    expect_hf(dir, FA_ERR_INVALID_ARGUMENT, "config.json", dir);
    rm_dir(dir);
    expect_hf("/nonexistent/hf", FA_ERR_INVALID_ARGUMENT, "config.json", "/nonexistent/hf");
}

static void test_safetensors_refusals(void **state)
{
    (void)state;
    const struct {
        void (*edit)(cJSON *h);
        fa_status st;
        const char *a, *b;
    } bad[] = {
        { past_the_file, FA_ERR_INVALID_SHAPE, "model.norm.weight", "data_offsets end" },
        { short_span, FA_ERR_INVALID_SHAPE, "model.norm.weight", "span" },
        { wrong_shape, FA_ERR_INVALID_SHAPE, "model.norm.weight", "shape [32]" },
        { bad_dtype, FA_ERR_INVALID_DTYPE, "model.layers.1.self_attn.v_proj.weight", "I64" },
        { drop_tensor, FA_ERR_INVALID_SHAPE, "model.layers.1.self_attn.rotary_emb.inv_freq", "shape [4]" },
        { loose_skip_name, FA_ERR_INVALID_ARGUMENT, "junkrotary_emb.inv_freq", "unexpected" },
        { rename_tensor, FA_ERR_INVALID_ARGUMENT, "q_proj.bias", "unexpected" },
        { twice, FA_ERR_INVALID_ARGUMENT, "model.norm.weight", "twice" },
        { overlap, FA_ERR_INVALID_ARGUMENT, "inside the bytes of tensor", "must not overlap" },
        { gap, FA_ERR_INVALID_ARGUMENT, "belong to no tensor", "model.layers.1.mlp.down_proj.weight" },
        { bad_metadata, FA_ERR_INVALID_ARGUMENT, "__metadata__", "object of strings" },
    };
    char dir[64], file[128];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tiny(dir, 1);
        snprintf(file, sizeof(file), "%s/model.safetensors", dir);
        edit_header(file, bad[i].edit);
        expect_hf(dir, bad[i].st, bad[i].a, bad[i].b);
        if (i < 4)
            expect_hf(dir, bad[i].st, file, NULL); /* the file is named too */
        rm_dir(dir);
    }
    /* four bytes after the last tensor's: data that no tensor owns */
    tiny(dir, 1);
    snprintf(file, sizeof(file), "%s/model.safetensors", dir);
    size_t nt;
    char *t = slurp(file, &nt), *t4 = realloc(t, nt + 4);
    assert_non_null(t4);
    memset(t4 + nt, 0, 4);
    spit(file, t4, nt + 4);
    free(t4);
    expect_hf(dir, FA_ERR_INVALID_ARGUMENT, file, "after the last tensor, belong to no tensor");
    rm_dir(dir);
    /* raw bytes: a header length past the end, a file shorter than the length field, no
     * JSON object in the header, and no weights file at all */
    tiny(dir, 1);
    snprintf(file, sizeof(file), "%s/model.safetensors", dir);
    size_t n;
    char *b = slurp(file, &n);
    uint64_t len = n - 7;
    memcpy(b, &len, 8);
    spit(file, b, n);
    expect_hf(dir, FA_ERR_INVALID_SHAPE, file, "header length");
    len = UINT64_MAX;
    memcpy(b, &len, 8);
    spit(file, b, n);
    expect_hf(dir, FA_ERR_INVALID_SHAPE, file, "header length");
    spit(file, b, 5); /* far less data than the config's tensors: refused before the image */
    expect_hf(dir, FA_ERR_INVALID_SHAPE, dir, "need at least");
    len = 4;
    memcpy(b, &len, 8);
    memcpy(b + 8, "[12]", 4);
    spit(file, b, n);
    expect_hf(dir, FA_ERR_INVALID_ARGUMENT, file, "header is not a JSON object");
    memcpy(b + 8, "{\"a\"", 4);
    spit(file, b, n);
    expect_hf(dir, FA_ERR_INVALID_ARGUMENT, file, "header is not valid JSON");
    free(b);
    unlink(file);
    expect_hf(dir, FA_ERR_INVALID_ARGUMENT, "neither", "model.safetensors.index.json");
    rm_dir(dir);
    /* in memory: the same checks */
    char err[FA_MODEL_ERR_LEN];
    fa_model *m = (fa_model *)0x1;
    const char *cfg = "{\"model_type\":\"llama\",\"hidden_size\":32,\"intermediate_size\":48,"
                      "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":40,"
                      "\"max_position_embeddings\":16}";
    /* ten bytes cannot hold the config's tensors: refused before the image is allocated */
    assert_int_equal(fa_model_from_hf_memory(cfg, strlen(cfg), "\x02\0\0\0\0\0\0\0{}", 10, &m, err),
                     FA_ERR_INVALID_SHAPE);
    assert_non_null(strstr(err, "need at least"));
    assert_null(m);
}

static void test_index_refusals(void **state)
{
    (void)state;
    char dir[64], p[128];
    const struct {
        const char *tensor; /* the weight_map entry changed */
        const char *shard;  /* its new value; NULL: removed */
        const char *a, *b;
    } bad[] = {
        { "model.embed_tokens.weight", "model-00009-of-00003.safetensors", "cannot open",
          "model-00009-of-00003.safetensors" },
        { "model.embed_tokens.weight", "../model.safetensors", "weight_map", "model.embed_tokens.weight" },
        { "model.norm.weight", NULL, "does not name it", "model.norm.weight" },
        { "model.norm.weight", "model-00001-of-00003.safetensors", "another shard", "model.norm.weight" },
        { "model.layers.0.mlp.nothing.weight", "model-00001-of-00003.safetensors", "weight_map",
          "model.layers.0.mlp.nothing.weight" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tiny(dir, 3);
        snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
        size_t n;
        char *t = slurp(p, &n);
        cJSON *j = cJSON_Parse(t), *map = cJSON_GetObjectItem(j, "weight_map");
        free(t);
        cJSON_DeleteItemFromObjectCaseSensitive(map, bad[i].tensor);
        if (bad[i].shard) {
            cJSON *e = cJSON_CreateString(bad[i].shard);
            e->string = strdup(bad[i].tensor);
            cJSON_InsertItemInArray(map, i < 2 ? 0 : cJSON_GetArraySize(map), e); /* first: read first */
        }
        t = cJSON_Print(j);
        spit(p, t, strlen(t));
        free(t);
        cJSON_Delete(j);
        fa_model *m = (fa_model *)0x1;
        char err[FA_MODEL_ERR_LEN] = "";
        fa_status st = fa_model_open_hf(dir, &m, err);
        if (st != FA_ERR_INVALID_ARGUMENT || !strstr(err, bad[i].a) || !strstr(err, bad[i].b)) {
            fprintf(stderr, "index case %zu: %s: %s\n", i, fa_status_string(st), err);
            fail();
        }
        assert_null(m);
        rm_dir(dir);
    }
    /* the index itself: not JSON, no weight_map */
    tiny(dir, 2);
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
    spit(p, "{\"metadata\": {}}", 16);
    expect_hf(dir, FA_ERR_INVALID_ARGUMENT, "model.safetensors.index.json", "weight_map");
    spit(p, "{", 1);
    expect_hf(dir, FA_ERR_INVALID_ARGUMENT, "model.safetensors.index.json", "not valid JSON");
    rm_dir(dir);
}

/* A second export into the same directory in the other layout is what loads; a header far
 * longer than the model's tensors need is refused before it is parsed. */
static void test_reexport_and_bounds(void **state)
{
    (void)state;
    char dir[64], err[FA_MODEL_ERR_LEN], file[128];
    fa_model_config c;
    fa_model *a, *b, *h;
    assert_int_equal(fa_model_config_parse("32x2x4x2x48x40x16", &c, err), FA_OK);
    assert_int_equal(fa_model_synth(&c, 1, &a, err), FA_OK);
    assert_int_equal(fa_model_synth(&c, 2, &b, err), FA_OK);
    tiny(dir, 1);
    assert_int_equal(fa_model_write_hf(a, dir, FA_HF_F32, 1, err), FA_OK);
    assert_int_equal(fa_model_write_hf(b, dir, FA_HF_F32, 3, err), FA_OK);
    assert_int_equal(fa_model_open_hf(dir, &h, err), FA_OK);
    assert_memory_equal(h->w.token_embedding, b->w.token_embedding, sizeof(float) * 32 * 40);
    fa_model_free(h);
    assert_int_equal(fa_model_write_hf(a, dir, FA_HF_F32, 1, err), FA_OK); /* and back */
    assert_int_equal(fa_model_open_hf(dir, &h, err), FA_OK);
    assert_memory_equal(h->w.token_embedding, a->w.token_embedding, sizeof(float) * 32 * 40);
    fa_model_free(h);
    /* a header of 2 MB for a model of 21 tensors */
    snprintf(file, sizeof(file), "%s/model.safetensors", dir);
    size_t n;
    const uint64_t len = (2u << 20) + 2;
    char *img = slurp(file, &n), *big = malloc(8 + (size_t)len + n);
    memcpy(big, &len, 8);
    big[8] = '{';
    memset(big + 9, ' ', (size_t)len - 2);
    big[8 + len - 1] = '}';
    memcpy(big + 8 + len, img, n);
    spit(file, big, 8 + (size_t)len + n);
    expect_hf(dir, FA_ERR_INVALID_SHAPE, file, "header length");
    free(img), free(big);
    rm_dir(dir);
    fa_model_free(a);
    fa_model_free(b);
}

/* An export that fails part way (here a directory where a shard goes; a full disk alike)
 * removes what it wrote: no config.json without its weights, no partial shard. */
static void test_export_failure(void **state)
{
    (void)state;
    char dir[64], err[FA_MODEL_ERR_LEN], p[128];
    fa_model_config c;
    fa_model *a;
    struct stat sb;
    assert_int_equal(fa_model_config_parse("32x2x4x2x48x40x16", &c, err), FA_OK);
    assert_int_equal(fa_model_synth(&c, 1, &a, err), FA_OK);
    mktemp_dir(dir);
    const char *block[] = { "model-00002-of-00003.safetensors", "model.safetensors" };
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof(p), "%s/%s", dir, block[k]);
        assert_int_equal(mkdir(p, 0777), 0);
        assert_int_equal(fa_model_write_hf(a, dir, FA_HF_F32, k ? 1 : 3, err), FA_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err, block[k]));
        assert_int_equal(rmdir(p), 0);
        const char *gone[] = { "config.json", "model-00001-of-00003.safetensors",
                               "model.safetensors.index.json" };
        for (int g = 0; g < 3; g++) {
            snprintf(p, sizeof(p), "%s/%s", dir, gone[g]);
            assert_int_not_equal(stat(p, &sb), 0);
        }
    }
    assert_int_equal(rmdir(dir), 0); /* empty: nothing else was left */
    fa_model_free(a);
}

/* Llama 3's conventions end to end on the CPU: config.json's bos_token_id and eos_token_id
 * list survive the HF round trip; the byte-level tokenizer.json beside the weights (the
 * tokenizer test's fixture) starts prompts with its template's BOS; greedy generation stops
 * at the first id of the EOS list, and a model whose list has none of its ids does not. */
static void test_llama3_ids(void **state)
{
    (void)state;
    char err[FA_MODEL_ERR_LEN], dir[64];
    fa_model_config c;
    fa_tokenizer *t;
    assert_int_equal(fa_model_config_parse("64x2x4x2x96x-868x96", &c, err), FA_OK);
    c.bos_id = 863, c.n_eos = 1, c.eos_ids[0] = 867; /* <|begin_of_text|>, <|eot_id|> */
    fa_model *m;
    assert_int_equal(fa_tokenizer_open(FA_TEST_DATA_DIR "/bytelevel_tokenizer.json", 868, &t, err), FA_OK);
    const char *prompt = "Once upon a time, the quick brown fox";
    int32_t ids[64], n = 0;
    assert_int_equal(fa_tokenizer_encode(t, prompt, 1, 0, ids, 64, &n, err), FA_OK);
    assert_int_equal(ids[0], 863);
    collect *a = malloc(sizeof(collect)), *b = malloc(sizeof(collect));
    /* the EOS list gets a token greedy decoding makes for the first time, 3 steps in or later,
     * other than BOS, the EOS already listed and id 2 (checked not to stop); some seeds' weights
     * repeat a few tokens from the start (seed 224): the next seed then */
    uint64_t ms = seed;
    int j = 0;
    for (;; ms++) {
        assert_true(ms - seed < 16);
        assert_int_equal(fa_model_synth(&c, ms, &m, err), FA_OK);
        greedy_with(m, t, prompt, 80, a);
        fa_model_free(m);
        for (j = n - 1 + 3; j < a->n; j++) {
            int seen = a->ids[j] == 863 || a->ids[j] == 867 || a->ids[j] == 2;
            for (int k = n - 1; k < j && !seen; k++)
                seen = a->ids[k] == a->ids[j];
            if (!seen)
                break;
        }
        if (j < a->n)
            break;
    }
    const int32_t g = a->ids[j];
    c.n_eos = 2, c.eos_ids[1] = g;
    assert_int_equal(fa_model_synth(&c, ms, &m, err), FA_OK);
    mktemp_dir(dir);
    assert_int_equal(fa_model_write_hf(m, dir, FA_HF_BF16, 1, err), FA_OK);
    fa_model *h = open_hf(dir);
    assert_int_equal(h->config.bos_id, 863);
    assert_int_equal(h->config.n_eos, 2);
    assert_int_equal(h->config.eos_ids[0], 867);
    assert_int_equal(h->config.eos_ids[1], g);
    assert_true(fa_model_is_stop(&h->config, g) && fa_model_is_stop(&h->config, 863) && !fa_model_is_stop(&h->config, 2));
    greedy_with(m, t, prompt, 80, b);
    print_message("greedy made %d ids; with id %d in the EOS list it stops after %d\n", a->n, (int)g, b->n);
    assert_int_equal(b->n, j);
    assert_memory_equal(a->ids, b->ids, sizeof(int32_t) * (size_t)j);
    fa_model_free(h), fa_model_free(m), fa_tokenizer_free(t), free(a), free(b);
    rm_dir(dir);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("hf: seed %llu (replay: FLASHATTN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    char err[FA_MODEL_ERR_LEN];
    fa_context_options o = { sizeof(o), FA_BACKEND_CPU, 0 };
    if (fa_model_open(FA_MODELS_DIR "/stories260K.bin", &story, err) != FA_OK ||
        fa_tokenizer_open(FA_MODELS_DIR "/tok512.bin", 512, &tok, err) != FA_OK ||
        fa_context_create(&o, &ctx) != FA_OK) {
        fprintf(stderr, "setup: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_f32),
        cmocka_unit_test(test_stories_16bit),
        cmocka_unit_test(test_gqa_roundtrip),
        cmocka_unit_test(test_rope_layout),
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_safetensors_refusals),
        cmocka_unit_test(test_index_refusals),
        cmocka_unit_test(test_reexport_and_bounds),
        cmocka_unit_test(test_export_failure),
        cmocka_unit_test(test_llama3_ids),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fa_context_destroy(ctx);
    fa_tokenizer_free(tok);
    fa_model_free(story);
    return rc;
}
