/* SPDX-License-Identifier: MIT */
/*
 * The Llama runner: llama2.c checkpoints (legacy version-0 format), Hugging
 * Face Llama checkpoints (config.json + safetensors), llama2.c and Hugging Face
 * (tokenizer.json) tokenizers, a float32 forward pass whose attention is
 * flashattn's fa_forward, and a sampler. Glue around flashattn.h, OpenBLAS and OpenMP.
 *
 * Errors: every call that can fail returns an fa_status and, when err is not
 * NULL, writes a message naming the offending field into err (at most
 * FA_MODEL_ERR_LEN bytes). On error the out parameters are set to NULL (or
 * left untouched for plain values) and nothing is allocated.
 *
 * Threads: a model and a tokenizer are read-only once loaded and may be
 * shared by threads; a state, a sampler and the flashattn context belong to
 * one thread at a time.
 */
#ifndef FA_MODEL_H
#define FA_MODEL_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FA_MODEL_ERR_LEN 256
#define FA_MODEL_HEADER_BYTES 28 /* seven int32: dim .. seq_len */
#define FA_TOKEN_UNK 0
#define FA_TOKEN_BOS 1
#define FA_TOKEN_EOS 2
#define FA_MODEL_MAX_EOS 8 /* eos_token_id lists: Llama 3.1 Instruct has three */

/* RoPE frequency scaling (config.json's rope_scaling), applied by fa_model_rope_angle. */
typedef enum fa_rope_scaling_type {
    FA_ROPE_SCALING_NONE = 0,
    FA_ROPE_SCALING_LINEAR = 1, /* every frequency divided by factor */
    FA_ROPE_SCALING_LLAMA3 = 2  /* Llama-3.1: low frequencies / factor, high ones kept, a blend between */
} fa_rope_scaling_type;

typedef struct fa_rope_scaling {
    int32_t type;              /* fa_rope_scaling_type */
    float factor;              /* linear, llama3: > 0 */
    float low_freq_factor;     /* llama3: > 0 */
    float high_freq_factor;    /* llama3: > low_freq_factor */
    int32_t original_max_pos;  /* llama3: original_max_position_embeddings, > 0 */
} fa_rope_scaling;

/* The header, with vocab_size made positive and the classifier's sharing
 * read from its sign (a negative header vocab_size means a separate one). */
typedef struct fa_model_config {
    int32_t dim;        /* model width */
    int32_t hidden_dim; /* FFN width */
    int32_t n_layers;
    int32_t n_heads;    /* query heads; head_size = dim / n_heads */
    int32_t n_kv_heads; /* key/value heads (GQA when fewer than n_heads) */
    int32_t vocab_size; /* > 0 */
    int32_t seq_len;    /* longest context */
    int32_t shared_classifier; /* 1: the classifier is the embedding table */
    float rope_theta;   /* RoPE base; 0 in a config given to the library = llama2.c's 10000 */
    float norm_eps;     /* RMSNorm epsilon; 0 in a config given to the library = llama2.c's 1e-5 */
    fa_rope_scaling rope_scaling; /* all zero: none (llama2.c files cannot store one) */
    /* Special ids (config.json's bos_token_id and eos_token_id; llama2.c files: 1 and 2).
     * Generation stops at BOS, as run.c does, or at any EOS. bos_id -1: none. */
    int32_t bos_id;
    int32_t n_eos;
    int32_t eos_ids[FA_MODEL_MAX_EOS];
} fa_model_config;

/* Whether generation stops at token: the config's BOS or one of its EOS ids. */
int fa_model_is_stop(const fa_model_config *c, int32_t token);

#define FA_MODEL_ROPE_THETA 10000.0f
#define FA_MODEL_NORM_EPS 1e-5f

/* Views into the checkpoint image; shapes as stored, row-major, [out x in]. */
typedef struct fa_model_weights {
    const float *token_embedding; /* [vocab, dim] */
    const float *rms_att;         /* [layers, dim] */
    const float *wq;              /* [layers, n_heads * head_size, dim] */
    const float *wk;              /* [layers, kv_dim, dim] */
    const float *wv;              /* [layers, kv_dim, dim] */
    const float *wo;              /* [layers, dim, n_heads * head_size] */
    const float *rms_ffn;         /* [layers, dim] */
    const float *w1;              /* [layers, hidden, dim]  gate */
    const float *w2;              /* [layers, dim, hidden]  down */
    const float *w3;              /* [layers, hidden, dim]  up */
    const float *rms_final;       /* [dim] */
    const float *classifier;      /* [vocab, dim]; token_embedding when shared */
} fa_model_weights;

typedef struct fa_model {
    fa_model_config config;
    fa_model_weights w;
    const void *image; /* the whole checkpoint: header then floats */
    size_t bytes;
    int owner;         /* how image is released: 0 borrowed, 1 munmap, 2 free */
} fa_model;

/* Check a configuration (every header rule; rope_theta and norm_eps 0 or finite
 * and positive; rope_scaling's fields for its type; special ids inside the vocabulary) and compute the checkpoint's size
 * in bytes. FA_ERR_INVALID_SHAPE names a bad field, FA_ERR_SIZE_OVERFLOW a size
 * that does not fit in 64 bits. bytes may be NULL. */
fa_status fa_model_config_check(const fa_model_config *c, uint64_t *bytes, char *err);

/* Memory-map a checkpoint and check it against its header. *out owns the
 * mapping: release with fa_model_free. */
fa_status fa_model_open(const char *path, fa_model **out, char *err);

/* The same over a caller's buffer (4-byte aligned), which must outlive the
 * model; take_ownership = 1 makes fa_model_free free() it (also on error). */
fa_status fa_model_from_memory(const void *data, size_t bytes, int take_ownership, fa_model **out,
                               char *err);

/* fa_model_from_memory with the release spelled out: owner 0 borrowed,
 * 1 munmap(data, bytes), 2 free(data); released on error too. */
fa_status fa_model_adopt(const void *data, size_t bytes, int owner, fa_model **out, char *err);

void fa_model_free(fa_model *m);

/* ---- Hugging Face Llama checkpoints ----
 * A directory with config.json (model_type "llama", or "mistral" without an active sliding
 * window) and model.safetensors, or model.safetensors.index.json naming shard files in the
 * same directory. Tensors F32, F16 or BF16, each checked against the config's shapes and the
 * file's bounds; converted to float32 in llama2.c's layout on load (q_proj/k_proj rows
 * un-permuted from HF's rotate-half order to adjacent pairs), so the forward pass is the same.
 * rope_scaling "llama3" and "linear" are read; configs the runner cannot run exactly (other
 * rope_scaling types, biases, another activation, head_dim
 * other than hidden_size / num_attention_heads, a sliding window) are refused with
 * FA_ERR_UNSUPPORTED naming the field. The model owns its weights; the files are unmapped
 * before return. Little-endian hosts only (as safetensors is). */
fa_status fa_model_open_hf(const char *dir, fa_model **out, char *err);

/* The same from memory: config.json's text and one safetensors image (both borrowed). */
fa_status fa_model_from_hf_memory(const char *config_json, size_t config_bytes,
                                  const void *safetensors, size_t safetensors_bytes,
                                  fa_model **out, char *err);

/* A directory is opened as a Hugging Face checkpoint, anything else as a llama2.c file. */
fa_status fa_model_load(const char *path, fa_model **out, char *err);

typedef enum fa_hf_dtype { FA_HF_F32 = 0, FA_HF_F16 = 1, FA_HF_BF16 = 2 } fa_hf_dtype;

/* Write m as a Hugging Face Llama directory (created if missing; existing files of the same
 * names are replaced): config.json and model.safetensors when shards is 1, else
 * model-0000k-of-0000N.safetensors and model.safetensors.index.json. Weights are rounded to
 * dtype to nearest even; q_proj/k_proj rows are permuted into HF's rotate-half order. Each file
 * is written as NAME.partial and renamed into place once all are written, so an error leaves
 * the directory as it was (its earlier export whole; a directory this call created removed):
 * FA_ERR_IO where the disk is full or the device fails, FA_ERR_INVALID_ARGUMENT where the
 * directory cannot take the files (no permission, a directory where a file goes). */
fa_status fa_model_write_hf(const fa_model *m, const char *dir, fa_hf_dtype dtype, int32_t shards,
                            char *err);

/* Name i of the files fa_model_write_hf(.., shards) writes or removes in its directory:
 * config.json, model.safetensors and model.safetensors.index.json, then (shards > 1) each
 * shard's; into name (64 bytes hold any). 0 past the last. */
int fa_model_hf_file(int32_t shards, int i, char *name, size_t n);

/* Shapes by name: "110m" (dim 768, 12 layers, 12 heads), "1b" (TinyLlama-1.1B:
 * 2048, 22 layers, 32 heads, 4 kv heads), "7b" (Llama-2-7B), "llama3-8b" (32 heads over
 * 8 kv heads, vocab 128256, rope_theta 5e5, context 8192), or
 * "DIMxLAYERSxHEADSxKVHEADSxHIDDENxVOCABxSEQ" (a negative VOCAB asks for a
 * separate classifier). The result passed fa_model_config_check. */
fa_status fa_model_config_parse(const char *spec, fa_model_config *c, char *err);

/* Bytes written so far, of total: called as a long write goes on. */
typedef void (*fa_progress_fn)(void *user, uint64_t done, uint64_t total);

/* Synthetic checkpoints: seeded uniform weights scaled by 1/sqrt(fan_in) (unit
 * gains), so activations keep their size through any depth. The in-memory model takes the
 * config's rope_theta, norm_eps (when positive), rope_scaling and, when n_eos > 0, its special
 * ids (else llama2.c's 1 and 2), none of which a llama2.c file holds. Value i of the
 * float section is a pure function of (seed, i): the file and the in-memory
 * image hold the same bits. fa_model_synth_write calls progress (where not NULL) after each
 * 4 MiB; a write that fails is FA_ERR_IO. */
fa_status fa_model_synth_write(const fa_model_config *c, uint64_t seed, FILE *f, fa_progress_fn progress, void *user,
                               char *err);
fa_status fa_model_synth(const fa_model_config *c, uint64_t seed, fa_model **out, char *err);

/* ---- tokenizers: llama2.c tokenizer.bin (max_token_length, then per id: float score,
 *      int32 len, len bytes) or Hugging Face tokenizer.json (Llama-2-style sentencepiece
 *      BPE: merges by rank, byte fallback, the "▁" word marker, added tokens) ---- */
typedef struct fa_tokenizer fa_tokenizer;

/* A path ending in ".json" is read as tokenizer.json, anything else as tokenizer.bin.
 * vocab_size comes from the model: a tokenizer.bin must hold exactly that many records; a
 * tokenizer.json's ids (model.vocab and added_tokens) must be 0..n-1 with n <= vocab_size
 * (ids n.. decode to ""), with ids 1 and 2 (BOS, EOS) special added tokens. */
fa_status fa_tokenizer_open(const char *path, int32_t vocab_size, fa_tokenizer **out, char *err);
fa_status fa_tokenizer_from_memory(const void *data, size_t bytes, int32_t vocab_size,
                                   fa_tokenizer **out, char *err);
/* tokenizer.json's text (bytes long; file names it in messages). Llama-3's byte-level BPE and
 * any other scheme are refused with FA_ERR_UNSUPPORTED naming the field. */
fa_status fa_tokenizer_from_json(const char *file, const char *json, size_t bytes, int32_t vocab_size,
                                 fa_tokenizer **out, char *err);
/* Write t as tokenizer.json at path. A tokenizer.bin becomes a sentencepiece-style BPE: ids 0..2
 * <unk> <s> </s> as special added tokens, spaces in pieces as "▁", and as merges every split of
 * a piece into two pieces, ranked by the piece's score (then the ids), as HF's converter
 * does; a tokenizer read from tokenizer.json is written back as it was read. */
fa_status fa_tokenizer_write_json(const fa_tokenizer *t, const char *path, char *err);
void fa_tokenizer_free(fa_tokenizer *t);
int32_t fa_tokenizer_vocab_size(const fa_tokenizer *t);

/* tokenizer.bin: run.c's encoding: BOS when bos, a dummy-prefix space when text is not
 * empty, each UTF-8 character's piece or its byte-fallback ids (byte + 3),
 * then merges of the best-scoring adjacent pair until none is in the
 * vocabulary; EOS when eos. tokens needs strlen(text) + 3 entries.
 * tokenizer.json: HF's encoding: added tokens matched in the text (leftmost, longest), the
 * text between them normalized and pre-tokenized as the file says, each character's piece
 * or its <0xNN> pieces (byte fallback) or unk (byte-level files: the pieces of the text's
 * bytes, which must be valid UTF-8), then HF's BPE merges (lowest rank first, leftmost among
 * equals); BOS and EOS are fa_tokenizer_bos's and id 2 (byte-level files: none: a model's EOS
 * is its config's). FA_ERR_INVALID_ARGUMENT when the result exceeds cap (possible only for a
 * vocabulary without "▁"), for text that is not UTF-8 or a pattern past its step limit. */
fa_status fa_tokenizer_encode(const fa_tokenizer *t, const char *text, int bos, int eos,
                              int32_t *tokens, int32_t cap, int32_t *n, char *err);

/* The bytes token stands for after prev: byte-fallback pieces become their
 * byte, and a piece right after BOS loses one leading space. Returns a pointer
 * owned by the tokenizer ("" for an id out of range); *len gets its length. */
const char *fa_tokenizer_decode(const fa_tokenizer *t, int32_t prev, int32_t token, size_t *len);

/* The id encoding puts first when asked for BOS (tokenizer.bin: 1; tokenizer.json: 1, or for
 * byte-level BPE its post_processor's, -1 when it has none). */
int32_t fa_tokenizer_bos(const fa_tokenizer *t);

/* ---- sampler ---- */
typedef struct fa_sampler fa_sampler;

/* temperature 0 = argmax; top-p in (0, 1) samples from the smallest set of
 * tokens whose probability reaches topp (0 or >= 1 = the whole distribution). */
fa_status fa_sampler_create(int32_t vocab_size, float temperature, float topp, uint64_t seed,
                            fa_sampler **out, char *err);
void fa_sampler_free(fa_sampler *s);
int32_t fa_sampler_vocab_size(const fa_sampler *s);
/* A token id in [0, vocab_size), or -1 where a logit is NaN or +inf; logits [vocab_size] is
 * overwritten. */
int32_t fa_sampler_sample(fa_sampler *s, float *logits);

/* ---- the forward pass ---- */
/* RoPE's angle (radians) for pair i of a head at position pos: every backend's tables. The
 * frequency is theta^(-2i/head_size), scaled as config.rope_scaling says (HF's
 * _compute_llama3_parameters and linear scaling, in float as HF computes inv_freq). */
float fa_model_rope_angle(const fa_model_config *c, int32_t pos, int32_t i);
/* Positions a paged cache's RoPE tables hold: no sequence passes its pages, nor seq_len. */
static inline int32_t fa_model_rope_rows(const fa_model_config *c, int32_t num_pages, int32_t page_size)
{
    const int64_t room = (int64_t)num_pages * page_size;
    return room < c->seq_len ? (int32_t)room : c->seq_len;
}


/* One-token projections. Measured here (docs/runner.md): our loop is faster on large
 * matrices (110M: 70 vs 47-57 tok/s, bandwidth-bound, rows over OpenMP threads), sgemv
 * on small ones (stories260K, one thread: 6000 vs 4600 tok/s). */
typedef enum fa_matvec {
    FA_MATVEC_AUTO = 0, /* own for matrices of >= 65536 weights, sgemv below */
    FA_MATVEC_OWN = 1,  /* our OpenMP loop */
    FA_MATVEC_BLAS = 2  /* cblas_sgemv */
} fa_matvec;

typedef struct fa_model_state_options {
    int32_t max_tokens;     /* tokens per forward chunk (prefill); 0 = seq_len */
    fa_algorithm algorithm; /* attention: flash, or standard for comparisons */
    fa_matvec matvec;       /* the one-token projections */
    /* called after each layer of each chunk (long prefills); may be NULL */
    void (*progress)(void *user, int32_t layer, int32_t n_layers);
    void *progress_user;
    int32_t paged; /* 1: for fa_model_forward_step only (no cache of its own; max_tokens = the
                      scheduler's token_budget or more) */
    int32_t context; /* positions the cache holds, 0 = seq_len (a long-context model's whole
                        context may not fit in memory); not with paged */
} fa_model_state_options;

/* Accumulated since the state was made or fa_model_state_reset. */
typedef struct fa_model_stats {
    double forward_s;             /* inside fa_model_forward */
    double attention_s;           /* inside fa_forward */
    uint64_t attention_workspace; /* the largest workspace one fa_forward allocated */
    uint64_t state_bytes;         /* KV cache + activations + RoPE table */
    uint64_t kv_cache_bytes;
} fa_model_stats;

typedef struct fa_model_state fa_model_state;

/* Buffers for one sequence. ctx (a CPU context) is borrowed and must outlive
 * the state; opts may be NULL (defaults). */
fa_status fa_model_state_create(const fa_model *m, fa_context_t ctx,
                                const fa_model_state_options *opts, fa_model_state **out,
                                char *err);
void fa_model_state_free(fa_model_state *s);
/* The positions the state's cache holds (options.context, or the model's seq_len). */
int32_t fa_model_state_context(const fa_model_state *s);
/* Statistics; the KV cache is simply overwritten by the next forward. */
fa_model_stats fa_model_state_stats(const fa_model_state *s);
void fa_model_state_reset_stats(fa_model_state *s);

/*
 * Run n tokens at positions pos .. pos+n-1 (one causal prefill, in chunks of
 * max_tokens; n = 1 is a decode step), writing their keys and values into the
 * cache. The cache must already hold positions 0 .. pos-1. *logits (may be
 * NULL) points at the last token's [vocab_size] logits inside the state.
 */
fa_status fa_model_forward(const fa_model *m, fa_model_state *s, const int32_t *tokens, int32_t n,
                           int32_t pos, float **logits, char *err);

/* ---- steps over a paged KV cache (continuous batching: scheduler.h makes the steps) ---- */
typedef struct fa_model_kv fa_model_kv;
struct fa_step;

/* Every layer's keys and values in num_pages pages of page_size tokens (host memory, float32),
 * and the RoPE tables the paged calls read. */
fa_status fa_model_kv_create(const fa_model *m, int32_t num_pages, int32_t page_size, fa_model_kv **out,
                             char *err);
void fa_model_kv_free(fa_model_kv *kv);

/* One step: its rows through every layer, each layer's attention one fa_paged_forward that
 * appends the rows' keys and values at their sequences' cached lengths (RoPE applied in the
 * call). logits[b * vocab_size ..] gets sequence b's next-token logits where step->sample[b]
 * (other rows untouched). The step's tables must match kv (as the scheduler that made it was
 * created with kv's num_pages and page_size). */
fa_status fa_model_forward_step(const fa_model *m, fa_model_state *s, fa_model_kv *kv, const struct fa_step *step,
                                float *logits, char *err);

/* ---- generation, as llama2.c's run.c: `steps` forwards (positions 0 .. steps-1, the
 *      prompt's included), each followed by the next token (the prompt's own, then
 *      sampled ones), so BOS + `steps` tokens in all; generation stops at BOS ---- */
typedef struct fa_generate_stats {
    int32_t prompt_tokens; /* BOS included */
    int32_t generated;     /* sampled tokens */
    double warmup_s;       /* a first forward of the prompt's first FA_GENERATE_WARMUP tokens:
                              threads started, weights paged in (a cold call is mostly that) */
    double prefill_s;      /* the prompt's prefill after it */
    int32_t decode_steps;  /* one-token forwards */
    double decode_s;
} fa_generate_stats;

#define FA_GENERATE_WARMUP 16
/* Why generation refuses a tokenizer without BOS: prompts start with one, as run.c's do. */
#define FA_GENERATE_NO_BOS                                                                      \
    "the tokenizer adds no BOS (its post_processor has no template with one); generation starts " \
    "every prompt with BOS"

/* The prompt as generation feeds it: BOS, then its tokens, into *ids (malloc'd; the caller
 * frees it) and *n. Refused with a message: a tokenizer without BOS, and a prompt of more
 * tokens than the model's context (seq_len). */
fa_status fa_generate_prompt(const fa_tokenizer *t, int32_t seq_len, const char *prompt, int32_t **ids,
                             int32_t *n, char *err);

/* Called with each token as it is produced (prompt tokens after BOS too) and
 * its text; a non-zero return stops generation. */
typedef int (*fa_token_fn)(void *user, int32_t token, const char *text, size_t len);

/* steps <= 0 or > the state's context (fa_model_state_context) means that. The prompt's first FA_GENERATE_WARMUP tokens run
 * once before its prefill (stats->warmup_s), so that stats->prefill_s is a warm time.
 * FA_ERR_INVALID_VALUE where logits come out NaN or +inf (weights holding such values). */
fa_status fa_generate(const fa_model *m, const fa_tokenizer *t, fa_model_state *s, fa_sampler *smp,
                      const char *prompt, int32_t steps, fa_token_fn on_token, void *user,
                      fa_generate_stats *stats, char *err);

#endif
