/* SPDX-License-Identifier: MIT */
/* Generation as llama2.c's run.c: BOS + prompt, `steps` forwards in all; stops when BOS is
 * sampled, as run.c does, and at EOS (the end of a sequence) as well. The prefill is timed
 * warm: a short forward of the prompt's start runs first. */
#include "fail.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

fa_status fa_generate_prompt(const fa_tokenizer *t, int32_t seq_len, const char *prompt, int32_t **ids,
                             int32_t *n, char *err)
{
    *ids = NULL;
    *n = 0;
    if (fa_tokenizer_bos(t) < 0)
        return fa_model_fail(err, FA_ERR_UNSUPPORTED, "%s", FA_GENERATE_NO_BOS);
    const size_t cap = strlen(prompt) + 3;
    int32_t *v = cap <= (size_t)INT32_MAX ? malloc(cap * sizeof(int32_t)) : NULL;
    if (!v)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the prompt's %zu bytes of tokens",
                             cap * sizeof(int32_t));
    int32_t k = 0;
    fa_status st = fa_tokenizer_encode(t, prompt, 1, 0, v, (int32_t)cap, &k, err);
    if (st == FA_OK && k > seq_len)
        st = fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                           "the prompt is %d tokens with BOS, more than the model's context of %d (seq_len); "
                           "shorten it", (int)k, (int)seq_len);
    if (st != FA_OK) {
        free(v);
        return st;
    }
    *ids = v;
    *n = k;
    return FA_OK;
}

fa_status fa_generate(const fa_model *m, const fa_tokenizer *t, fa_model_state *s, fa_sampler *smp,
                      const char *prompt, int32_t steps, fa_token_fn on_token, void *user,
                      fa_generate_stats *stats, char *err)
{
    fa_generate_stats z = { 0 };
    if (!stats)
        stats = &z;
    memset(stats, 0, sizeof(*stats));
    if (!m || !t || !s || !smp || !prompt) {
        if (err)
            snprintf(err, FA_MODEL_ERR_LEN, "%s is NULL",
                     !m ? "model" : !t ? "tokenizer" : !s ? "state" : !smp ? "sampler" : "prompt");
        return FA_ERR_NULL_POINTER;
    }
    if (fa_tokenizer_vocab_size(t) != m->config.vocab_size) {
        if (err)
            snprintf(err, FA_MODEL_ERR_LEN, "tokenizer vocab_size (%d) differs from the model's (%d)",
                     (int)fa_tokenizer_vocab_size(t), (int)m->config.vocab_size);
        return FA_ERR_INVALID_SHAPE;
    }
    if (fa_sampler_vocab_size(smp) != m->config.vocab_size) {
        if (err)
            snprintf(err, FA_MODEL_ERR_LEN, "sampler vocab_size (%d) differs from the model's (%d)",
                     (int)fa_sampler_vocab_size(smp), (int)m->config.vocab_size);
        return FA_ERR_INVALID_SHAPE;
    }
    const int32_t context = fa_model_state_context(s);
    if (steps <= 0 || steps > context)
        steps = context;
    int32_t *ids, n;
    fa_status st = fa_generate_prompt(t, m->config.seq_len, prompt, &ids, &n, err);
    if (st != FA_OK)
        return st;
    int32_t np = n < steps ? n : steps, stop = 0;
    stats->prompt_tokens = np;
    float *logits;
    /* the warm-up writes the cache positions the prefill then writes again with the same values */
    double t0 = now();
    st = fa_model_forward(m, s, ids, np < FA_GENERATE_WARMUP ? np : FA_GENERATE_WARMUP, 0, NULL, err);
    stats->warmup_s = now() - t0;
    if (st != FA_OK)
        goto done;
    t0 = now();
    st = fa_model_forward(m, s, ids, np, 0, &logits, err);
    stats->prefill_s = now() - t0;
    if (st != FA_OK)
        goto done;
    /* run.c feeds min(n, steps) prompt tokens and prints the prompt up to id `steps` */
    int32_t echo = n - 1 < steps ? n - 1 : steps;
    for (int32_t i = 1; i <= echo && !stop; i++) {
        size_t len;
        const char *txt = fa_tokenizer_decode(t, ids[i - 1], ids[i], &len);
        stop = on_token && on_token(user, ids[i], txt, len);
    }
    if (np < n || stop)
        goto done;
    /* a token is sampled from each of positions n-1 .. steps-1 (run.c's count) */
    int32_t pos = np, prev = ids[np - 1];
    t0 = now();
    int32_t token = fa_sampler_sample(smp, logits);
    for (;;) {
        if (token < 0) {
            st = fa_model_fail(err, FA_ERR_INVALID_VALUE,
                               "the logits at position %d are NaN or +inf: the model's weights hold NaN or inf "
                               "values, or its activations overflow",
                               (int)pos - 1);
            break;
        }
        stats->generated++;
        if (fa_model_is_stop(&m->config, token))
            break;
        size_t len;
        const char *txt = fa_tokenizer_decode(t, prev, token, &len);
        if (on_token && on_token(user, token, txt, len))
            break;
        if (pos >= steps)
            break;
        if ((st = fa_model_forward(m, s, &token, 1, pos, &logits, err)) != FA_OK)
            break;
        stats->decode_steps++;
        pos++;
        prev = token;
        token = fa_sampler_sample(smp, logits);
    }
    stats->decode_s = now() - t0;
done:
    free(ids);
    return st;
}
