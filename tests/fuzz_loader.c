/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for the checkpoint and tokenizer loaders (src/model): any bytes must
 * give FA_OK or a refusal, never a crash or an out-of-bounds read. The same bytes go to
 * each loader: as a llama2.c checkpoint, as a tokenizer.bin and a tokenizer.json, as a
 * safetensors file of a tiny fixed config, and as config.json. A model a loader accepts has
 * every weight array read end to end (AddressSanitizer checks the bounds); an accepted
 * tokenizer encodes and decodes text made from the same bytes.
 *
 *   fuzz_loader -max_total_time=25 CORPUS_DIR
 */
#include "hf.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>

static float touch(const float *p, size_t n)
{
    volatile float acc = 0.0f;
    if (n) {
        acc += p[0];
        acc += p[n - 1];
    }
    return acc;
}

static void touch_model(const fa_model *m)
{
    const fa_model_config *c = &m->config;
    size_t d = (size_t)c->dim, L = (size_t)c->n_layers, h = (size_t)c->hidden_dim;
    size_t kv = d / (size_t)c->n_heads * (size_t)c->n_kv_heads, v = (size_t)c->vocab_size;
    touch(m->w.token_embedding, v * d);
    touch(m->w.rms_att, L * d);
    touch(m->w.wq, L * d * d);
    touch(m->w.wk, L * kv * d);
    touch(m->w.wv, L * kv * d);
    touch(m->w.wo, L * d * d);
    touch(m->w.rms_ffn, L * d);
    touch(m->w.w1, L * h * d);
    touch(m->w.w2, L * d * h);
    touch(m->w.w3, L * h * d);
    touch(m->w.rms_final, d);
    touch(m->w.classifier, v * d);
}

/* The shape of `make fuzz`'s seed checkpoint (gen-model 8x1x2x1x8x16x4), tied embeddings. */
static const char tiny_config[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 8, "
    "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
    "\"vocab_size\": 16, \"max_position_embeddings\": 4, \"tie_word_embeddings\": true}";

/* The bytes as a safetensors file of tiny_config, and as a config.json (parsed only: a config
 * may ask for any size; one that is small is then loaded over an empty safetensors header). */
static void hf(const uint8_t *data, size_t size)
{
    fa_model *m = NULL;
    char err[FA_MODEL_ERR_LEN];
    if (fa_model_from_hf_memory(tiny_config, sizeof(tiny_config) - 1, data, size, &m, err) == FA_OK) {
        touch_model(m);
        fa_model_free(m);
    }
    fa_model_config c;
    uint64_t bytes;
    if (fa_hf_parse_config((const char *)data, size, "config.json", &c, err) == FA_OK &&
        fa_model_config_check(&c, &bytes, err) == FA_OK && bytes < (1u << 20)) {
        static const char empty[] = "\x02\0\0\0\0\0\0\0{}";
        if (fa_model_from_hf_memory((const char *)data, size, empty, sizeof(empty) - 1, &m, err) == FA_OK)
            fa_model_free(m); /* only a model without tensors could be complete: never */
    }
}

/* An accepted tokenizer encodes text made of the input's last bytes and decodes every id. */
static void exercise(fa_tokenizer *t, const uint8_t *data, size_t size, int32_t vocab)
{
    char text[64], err[FA_MODEL_ERR_LEN];
    size_t n = size < sizeof(text) - 1 ? size : sizeof(text) - 1;
    memcpy(text, data + size - n, n);
    text[n] = 0;
    int32_t ids[sizeof(text) + 3], k = 0;
    if (fa_tokenizer_encode(t, text, 1, 1, ids, (int32_t)(sizeof(ids) / sizeof(ids[0])), &k, err) == FA_OK)
        for (int32_t i = 1; i < k; i++) {
            size_t len;
            const char *p = fa_tokenizer_decode(t, ids[i - 1], ids[i], &len);
            volatile char sink = len ? p[len - 1] : 0;
            (void)sink;
        }
    for (int32_t id = -1; id <= vocab; id++) {
        size_t len;
        const char *p = fa_tokenizer_decode(t, FA_TOKEN_BOS, id, &len);
        volatile char sink = len ? p[0] : 0;
        (void)sink;
    }
    fa_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hf(data, size);
    /* the loader wants 4-byte aligned images, as mmap gives */
    void *img = malloc(size ? size : 1);
    if (!img)
        return 0;
    memcpy(img, data, size);
    fa_model *m = NULL;
    char err[FA_MODEL_ERR_LEN];
    if (fa_model_from_memory(img, size, 0, &m, err) == FA_OK) {
        touch_model(m);
        fa_model_free(m);
    }
    free(img);
    /* the same bytes as a tokenizer.bin and a tokenizer.json of a vocabulary size taken from the
     * first two */
    int32_t vocab = size >= 2 ? 3 + (int32_t)((data[0] | data[1] << 8) % 600) : 512;
    fa_tokenizer *t = NULL;
    if (fa_tokenizer_from_memory(data, size, vocab, &t, err) == FA_OK)
        exercise(t, data, size, vocab);
    if (fa_tokenizer_from_json("tokenizer.json", (const char *)data, size, vocab, &t, err) == FA_OK)
        exercise(t, data, size, vocab);
    return 0;
}
