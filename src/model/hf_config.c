/* SPDX-License-Identifier: MIT */
/*
 * Hugging Face Llama checkpoints, config.json (hf.h): its fields read with cJSON into a
 * fa_model_config, each checked and named when wrong, with LlamaConfig's defaults.
 */
#include "fail.h"
#include "hf.h"
#include "json.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <string.h>

/* An integer field: absent or null takes dflt when required is 0. */
static fa_status json_int(const cJSON *o, const char *file, const char *key, int required,
                          int32_t dflt, int32_t *out, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': %s is missing", file, key);
        *out = dflt;
        return FA_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= 1.0 && d <= (double)INT32_MAX && d == floor(d)))
        return fa_model_fail(err, FA_ERR_INVALID_SHAPE, "'%s': %s must be a positive integer below 2^31",
                             file, key);
    *out = (int32_t)d;
    return FA_OK;
}

/* A positive finite float field, dflt when absent. */
static fa_status json_float(const cJSON *o, const char *file, const char *key, double dflt,
                            float *out, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    double d = !v || cJSON_IsNull(v) ? dflt : cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d > 0.0 && d <= FLT_MAX && (float)d > 0.0f))
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': %s must be a positive number a float32 holds "
                                                        "(at most 3.4e38)", file, key);
    *out = (float)d;
    return FA_OK;
}

/* A boolean field, dflt when absent or null. */
static fa_status json_bool(const cJSON *o, const char *file, const char *key, int dflt, int *out,
                           char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return FA_OK;
    }
    if (!cJSON_IsBool(v))
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': %s must be true or false", file, key);
    *out = cJSON_IsTrue(v);
    return FA_OK;
}

/* bos_token_id (an id or null) and eos_token_id (an id, a list of ids, or null); absent:
 * transformers' LlamaConfig / MistralConfig defaults, 1 and 2; null: none. c->vocab_size is
 * read already. */
static fa_status json_special_ids(const cJSON *o, const char *file, fa_model_config *c, char *err)
{
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(o, "bos_token_id");
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id");
    c->bos_id = !bos && c->vocab_size > FA_TOKEN_BOS ? FA_TOKEN_BOS : -1;
    c->n_eos = !eos && c->vocab_size > FA_TOKEN_EOS;
    c->eos_ids[0] = FA_TOKEN_EOS;
    if (bos && !cJSON_IsNull(bos)) {
        const double d = cJSON_IsNumber(bos) ? bos->valuedouble : -1;
        if (!(d >= 0 && d < 2147483647.0 && d == floor(d)))
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': bos_token_id must be a token id or null", file);
        c->bos_id = (int32_t)d;
        if (c->bos_id >= c->vocab_size)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': bos_token_id (%d) must be below vocab_size (%d)", file,
                                 (int)c->bos_id, (int)c->vocab_size);
    }
    if (!eos || cJSON_IsNull(eos))
        return FA_OK;
    c->n_eos = 0;
    const cJSON *one = cJSON_IsArray(eos) ? eos->child : eos;
    if (cJSON_IsArray(eos) && cJSON_GetArraySize(eos) > FA_MODEL_MAX_EOS)
        return fa_model_fail(err, FA_ERR_UNSUPPORTED, "'%s': eos_token_id lists %d ids; at most %d are supported", file,
                             cJSON_GetArraySize(eos), FA_MODEL_MAX_EOS);
    for (; one; one = cJSON_IsArray(eos) ? one->next : NULL) {
        const double d = cJSON_IsNumber(one) ? one->valuedouble : -1;
        if (!(d >= 0 && d < 2147483647.0 && d == floor(d)))
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': eos_token_id must be a token id, a list of them, or "
                                 "null", file);
        if (d >= c->vocab_size)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': eos_token_id %.0f must be below vocab_size (%d)", file,
                                 d, (int)c->vocab_size);
        c->eos_ids[c->n_eos++] = (int32_t)d;
    }
    return FA_OK;
}

/* A required positive number of rope_scaling: integral when integer is set. */
static fa_status scaling_number(const cJSON *rs, const char *file, const char *key, int integer, double *out,
                                char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rs, key);
    if (!v || cJSON_IsNull(v))
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': rope_scaling.%s is missing", file, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d > 0.0 && d <= (integer ? (double)INT32_MAX : FLT_MAX) && (float)d > 0.0f && (!integer || d == floor(d))))
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "'%s': rope_scaling.%s must be a positive %s", file, key,
                             integer ? "integer below 2^31" : "number");
    *out = d;
    return FA_OK;
}

/* rope_scaling: "llama3" (factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings) or "linear" (factor); the type under "rope_type", or
 * "type" as older configs write it. Others (dynamic, yarn, longrope, ...) are refused. */
static fa_status parse_rope_scaling(const cJSON *rs, const char *file, fa_rope_scaling *out, char *err)
{
    if (!cJSON_IsObject(rs))
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': rope_scaling must be an object or null", file);
    const char *rt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rs, "rope_type"));
    if (!rt)
        rt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rs, "type"));
    if (!rt)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': rope_scaling.rope_type is missing or not a string",
                             file);
    fa_rope_scaling r = { 0 };
    if (strcmp(rt, "linear") == 0)
        r.type = FA_ROPE_SCALING_LINEAR;
    else if (strcmp(rt, "llama3") == 0)
        r.type = FA_ROPE_SCALING_LLAMA3;
    else if (strcmp(rt, "default") != 0)
        return fa_model_fail(err, FA_ERR_UNSUPPORTED,
                             "'%s': rope_scaling type '%.40s' is not supported (llama3, linear, default)", file, rt);
    double f = 0, lo = 0, hi = 0, old = 0;
    fa_status st = FA_OK;
    if (r.type != FA_ROPE_SCALING_NONE && (st = scaling_number(rs, file, "factor", 0, &f, err)) != FA_OK)
        return st;
    if (r.type == FA_ROPE_SCALING_LLAMA3 &&
        ((st = scaling_number(rs, file, "low_freq_factor", 0, &lo, err)) ||
         (st = scaling_number(rs, file, "high_freq_factor", 0, &hi, err)) ||
         (st = scaling_number(rs, file, "original_max_position_embeddings", 1, &old, err))))
        return st;
    if (r.type == FA_ROPE_SCALING_LLAMA3 && !((float)hi > (float)lo))
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "'%s': rope_scaling.high_freq_factor (%g) must exceed low_freq_factor (%g)", file, hi, lo);
    r.factor = (float)f;
    r.low_freq_factor = (float)lo;
    r.high_freq_factor = (float)hi;
    r.original_max_pos = (int32_t)old;
    *out = r;
    return FA_OK;
}

fa_status fa_hf_parse_config(const char *text, size_t n, const char *file, fa_model_config *out,
                             char *err)
{
    fa_status st;
    cJSON *j = fa_json_object(text, n, 65536, file, "", &st, err); /* a config is a few dozen */
    if (!j)
        return st;
    fa_model_config c = { 0 };
    int32_t hd = 0, window = 0;
    int tied = 0, bias = 0, mlp_bias = 0;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    const char *type = cJSON_GetStringValue(mt);
    if (!type) {
        st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "'%s': model_type is missing or not a string", file);
        goto done;
    }
    int mistral = strcmp(type, "mistral") == 0;
    if (strcmp(type, "llama") != 0 && !mistral) {
        st = fa_model_fail(err, FA_ERR_UNSUPPORTED,
                           "'%s': model_type '%.40s' is not supported (llama, mistral)", file, type);
        goto done;
    }
    if ((st = json_int(j, file, "hidden_size", 1, 0, &c.dim, err)) ||
        (st = json_int(j, file, "intermediate_size", 1, 0, &c.hidden_dim, err)) ||
        (st = json_int(j, file, "num_hidden_layers", 1, 0, &c.n_layers, err)) ||
        (st = json_int(j, file, "num_attention_heads", 1, 0, &c.n_heads, err)) ||
        (st = json_int(j, file, "num_key_value_heads", 0, c.n_heads, &c.n_kv_heads, err)) ||
        (st = json_int(j, file, "vocab_size", 1, 0, &c.vocab_size, err)) ||
        (st = json_int(j, file, "max_position_embeddings", 1, 0, &c.seq_len, err)) ||
        (st = json_int(j, file, "head_dim", 0, 0, &hd, err)) ||
        (st = json_float(j, file, "rms_norm_eps", 1e-6, &c.norm_eps, err)) ||
        (st = json_float(j, file, "rope_theta", 10000.0, &c.rope_theta, err)) ||
        (st = json_bool(j, file, "tie_word_embeddings", 0, &tied, err)) ||
        (st = json_bool(j, file, "attention_bias", 0, &bias, err)) ||
        (st = json_bool(j, file, "mlp_bias", 0, &mlp_bias, err)) ||
        (st = json_special_ids(j, file, &c, err)))
        goto done;
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
        st = fa_model_fail(err, FA_ERR_UNSUPPORTED, "'%s': hidden_act '%.40s' is not supported (silu)",
                           file, cJSON_IsString(act) ? act->valuestring : "(not a string)");
        goto done;
    }
    if (rs && !cJSON_IsNull(rs) && (st = parse_rope_scaling(rs, file, &c.rope_scaling, err)) != FA_OK)
        goto done;
    if (bias || mlp_bias) {
        st = fa_model_fail(err, FA_ERR_UNSUPPORTED, "'%s': %s true is not supported (no biases)", file,
                           bias ? "attention_bias" : "mlp_bias");
        goto done;
    }
    if (c.n_layers > FA_HF_MAX_LAYERS) {
        st = fa_model_fail(err, FA_ERR_INVALID_SHAPE, "'%s': num_hidden_layers (%d) exceeds %d", file,
                           (int)c.n_layers, FA_HF_MAX_LAYERS);
        goto done;
    }
    /* the header rules in HF's names; fa_model_config_check below has the rest (sizes) */
    if (c.dim % c.n_heads || c.n_heads % c.n_kv_heads || c.n_kv_heads > c.n_heads) {
        st = fa_model_fail(err, FA_ERR_INVALID_SHAPE,
                           "'%s': %s (%d) must be a multiple of %s (%d)", file,
                           c.dim % c.n_heads ? "hidden_size" : "num_attention_heads",
                           (int)(c.dim % c.n_heads ? c.dim : c.n_heads),
                           c.dim % c.n_heads ? "num_attention_heads" : "num_key_value_heads",
                           (int)(c.dim % c.n_heads ? c.n_heads : c.n_kv_heads));
        goto done;
    }
    if (hd && hd * (int64_t)c.n_heads != c.dim) {
        st = fa_model_fail(err, FA_ERR_UNSUPPORTED,
                           "'%s': head_dim (%d) must equal hidden_size / num_attention_heads (%d / %d)",
                           file, (int)hd, (int)c.dim, (int)c.n_heads);
        goto done;
    }
    if (mistral && (st = json_int(j, file, "sliding_window", 0, 0, &window, err)) != FA_OK)
        goto done;
    if (window && window < c.seq_len) {
        st = fa_model_fail(err, FA_ERR_UNSUPPORTED,
                           "'%s': sliding_window (%d) below max_position_embeddings (%d) is not supported",
                           file, (int)window, (int)c.seq_len);
        goto done;
    }
    c.shared_classifier = tied;
    char inner[FA_MODEL_ERR_LEN];
    if ((st = fa_model_config_check(&c, NULL, inner)) != FA_OK) {
        fa_model_fail(err, st, "'%s': %s", file, inner);
        goto done;
    }
    *out = c;
done:
    cJSON_Delete(j);
    return st;
}
