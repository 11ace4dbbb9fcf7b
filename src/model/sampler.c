/* SPDX-License-Identifier: MIT */
/* Next-token sampling: argmax, temperature, top-p (nucleus). fa_sampler draws from a seeded
 * xorshift64* stream (llama2.c's run.c); the engine's formula draws from (seed, position). */
#include "engine.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    float p;
    int32_t id;
} cand;

struct fa_sampler {
    int32_t vocab_size;
    float temperature, topp;
    uint64_t state; /* xorshift64*, never 0 */
    cand *cands;    /* [vocab] top-p scratch */
};

fa_status fa_sampler_create(int32_t vocab_size, float temperature, float topp, uint64_t seed,
                            fa_sampler **out, char *err)
{
    const char *bad = NULL;
    if (!out)
        bad = "out is NULL";
    else if (vocab_size <= 0)
        bad = "vocab_size must be positive";
    else if (!(temperature >= 0.0f) || !isfinite(temperature))
        bad = "temperature must be finite and >= 0";
    else if (!(topp >= 0.0f) || !isfinite(topp))
        bad = "topp must be finite and >= 0";
    if (bad) {
        if (err)
            snprintf(err, FA_MODEL_ERR_LEN, "%s", bad);
        if (out)
            *out = NULL;
        return out ? FA_ERR_INVALID_VALUE : FA_ERR_NULL_POINTER;
    }
    *out = NULL;
    fa_sampler *s = calloc(1, sizeof(*s));
    cand *c = malloc(sizeof(cand) * (size_t)vocab_size);
    if (!s || !c) {
        free(s);
        free(c);
        if (err)
            snprintf(err, FA_MODEL_ERR_LEN, "out of memory for the sampler");
        return FA_ERR_OUT_OF_MEMORY;
    }
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->topp = topp;
    s->state = seed ? seed : 0x2545F4914F6CDD1Dull;
    s->cands = c;
    *out = s;
    return FA_OK;
}

void fa_sampler_free(fa_sampler *s)
{
    if (!s)
        return;
    free(s->cands);
    free(s);
}

int32_t fa_sampler_vocab_size(const fa_sampler *s)
{
    return s ? s->vocab_size : 0;
}

/* A float in [0, 1) from the top 24 bits of xorshift64* (Vigna, 2016). */
static float coin(fa_sampler *s)
{
    s->state ^= s->state >> 12;
    s->state ^= s->state << 25;
    s->state ^= s->state >> 27;
    uint32_t r = (uint32_t)((s->state * 0x2545F4914F6CDD1Dull) >> 32);
    return (float)(r >> 8) / 16777216.0f;
}

static int by_prob_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    return x->p < y->p ? 1 : x->p > y->p ? -1 : (x->id > y->id) - (x->id < y->id);
}

int32_t fa_sampler_sample(fa_sampler *s, float *logits)
{
    int32_t n = s->vocab_size, best = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!(logits[i] < INFINITY)) /* NaN or +inf */
            return -1;
        if (logits[i] > logits[best])
            best = i;
    }
    if (s->temperature == 0.0f)
        return best;
    /* softmax(logits / T) from the maximum, so exp never overflows */
    float mx = logits[best], sum = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        float p = expf((logits[i] - mx) / s->temperature);
        logits[i] = p == p ? p : 0.0f;
        sum += logits[i];
    }
    if (!(sum > 0.0f)) /* every logit -inf: argmax's first id, as fa_sample_logits gives */
        return best;
    for (int32_t i = 0; i < n; i++)
        logits[i] /= sum;
    float r = coin(s);
    if (s->topp <= 0.0f || s->topp >= 1.0f) {
        float cdf = 0.0f;
        for (int32_t i = 0; i < n; i++) {
            cdf += logits[i];
            if (r < cdf)
                return i;
        }
        return n - 1; /* rounding left the cdf short of 1 */
    }
    /* Top-p: tokens under (1 - topp) / (n - 1) cannot be in the nucleus unless it is
     * everything, so only the rest are sorted. */
    float cutoff = (1.0f - s->topp) / (float)(n > 1 ? n - 1 : 1);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] >= cutoff)
            s->cands[m++] = (cand){ logits[i], i };
    if (m == 0)
        return best;
    qsort(s->cands, (size_t)m, sizeof(cand), by_prob_desc);
    float mass = 0.0f;
    int32_t last = m - 1;
    for (int32_t i = 0; i < m; i++) {
        mass += s->cands[i].p;
        if (mass > s->topp) {
            last = i;
            break;
        }
    }
    float target = r * mass, cdf = 0.0f;
    for (int32_t i = 0; i <= last; i++) {
        cdf += s->cands[i].p;
        if (target < cdf)
            return s->cands[i].id;
    }
    return s->cands[last].id;
}

/* splitmix64's finaliser (Steele, Lea, Flood 2014) */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float fa_sample_uniform(uint64_t seed, int32_t position)
{
    const uint64_t z = mix64(mix64(seed + 0x9E3779B97F4A7C15ull) ^ (uint64_t)(uint32_t)position);
    return (float)(z >> 40) / 16777216.0f;
}

static int desc_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The CUDA sampler (src/model/cuda/layers.cu) computes the same: the nucleus threshold as the
 * largest weight tau whose {w >= tau} mass reaches topp of the total, the draw by walking
 * token ids in order. Only the sums' rounding order differs. */
int32_t fa_sample_logits(const float *logits, int32_t n, const fa_sample_params *p, float u, float *scratch)
{
    int32_t best = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!(logits[i] < INFINITY)) /* NaN or +inf */
            return -1;
        if (logits[i] > logits[best])
            best = i;
    }
    if (!(p->temperature > 0.0f))
        return best;
    const float mx = logits[best];
    float total = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        const float w = expf((logits[i] - mx) / p->temperature);
        scratch[i] = w == w ? w : 0.0f;
        total += scratch[i];
    }
    float tau = 0.0f, mass = total;
    if (p->topp > 0.0f && p->topp < 1.0f) {
        float *sorted = scratch + n; /* scratch holds 2n */
        memcpy(sorted, scratch, sizeof(float) * (size_t)n);
        qsort(sorted, (size_t)n, sizeof(float), desc_float);
        const float want = p->topp * total;
        float c = 0.0f;
        tau = sorted[n - 1];
        for (int32_t i = 0; i < n; i++) {
            c += sorted[i];
            if (c >= want) {
                tau = sorted[i];
                break;
            }
        }
        mass = 0.0f;
        for (int32_t i = 0; i < n; i++)
            if (scratch[i] >= tau)
                mass += scratch[i];
    }
    const float r = u * mass;
    float c = 0.0f;
    int32_t last = best;
    for (int32_t i = 0; i < n; i++)
        if (scratch[i] >= tau && scratch[i] > 0.0f) {
            c += scratch[i];
            last = i;
            if (r < c)
                return i;
        }
    return last; /* rounding left the sum short of r */
}
