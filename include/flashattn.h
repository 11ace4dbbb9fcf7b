/* SPDX-License-Identifier: MIT */
/*
 * flashattn — exact FlashAttention as a portable C library.
 *
 * One header. Every call returns an fa_status; the context keeps a readable
 * message for the last error, naming the offending field. The library never
 * aborts or exits on anything a caller passes and writes no output when it
 * returns an error.
 *
 * Threads: a context may be used by one thread at a time (it holds the last
 * error and the last run's report). Different contexts are independent.
 * Calls that take no context (fa_status_string, fa_version_string,
 * fa_attention_desc_init, fa_tensor_contiguous, fa_backend_name) are
 * thread-safe.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(FA_BUILDING_SHARED)
#define FA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0
#define FA_VERSION_STRING "0.1.0"

/* Largest head_dim any backend accepts. */
#define FA_MAX_HEAD_DIM 256
/* Largest num_heads_q / num_heads_kv. */
#define FA_MAX_HEADS 65536
/* Largest fa_context_options.num_threads. */
#define FA_MAX_THREADS 1024
/* Largest |scale| and softcap: scaled scores must stay representable in float32. */
#define FA_MAX_SCALE 1e37f

typedef enum fa_status {
    FA_OK = 0,
    FA_ERR_NULL_POINTER = 1,      /* a required pointer is NULL */
    FA_ERR_INVALID_SHAPE = 2,     /* a dimension is out of range or inconsistent */
    FA_ERR_INVALID_STRIDE = 3,    /* a stride is negative or zero, or an output overlaps
                                     itself, an input or another output */
    FA_ERR_INVALID_VALUE = 4,     /* a scalar (scale, window, softcap, dropout) is out of range */
    FA_ERR_INVALID_DTYPE = 5,     /* unknown dtype or an unsupported dtype combination */
    FA_ERR_SIZE_OVERFLOW = 6,     /* an index or byte count does not fit in 64 bits */
    FA_ERR_UNSUPPORTED = 7,       /* valid request that the chosen backend cannot run */
    FA_ERR_BACKEND_UNAVAILABLE = 8, /* backend not built or no usable device */
    FA_ERR_OUT_OF_MEMORY = 9,     /* workspace allocation failed */
    FA_ERR_BACKEND = 10,          /* the backend's runtime reported an error */
    FA_ERR_INVALID_ARGUMENT = 11, /* any other bad argument (wrong struct size, ...) */
    FA_ERR_IO = 12                /* a file could not be written (a full disk, a failing device):
                                     the runner's checkpoint and export writers */
} fa_status;

typedef enum fa_dtype {
    FA_DTYPE_F32 = 0,
    FA_DTYPE_F16 = 1,  /* IEEE binary16 */
    FA_DTYPE_BF16 = 2, /* bfloat16 */
    FA_DTYPE_E4M3 = 3  /* OCP 8-bit float E4M3 (1 sign, 4 exponent bits biased by 7, 3 mantissa
                        * bits; finite up to 448, 0x7f and 0xff NaN, no infinity): fa_forward's
                        * q, k and v, with descale factors (fa_descale) */
} fa_dtype;

typedef enum fa_backend {
    FA_BACKEND_AUTO = 0, /* CUDA when usable, else the CPU (GLES only when asked for) */
    FA_BACKEND_CPU = 1,
    FA_BACKEND_CUDA = 2,
    FA_BACKEND_GLES = 3
} fa_backend;

#define FA_BACKEND_COUNT 4

typedef enum fa_algorithm {
    FA_ALGORITHM_FLASH = 0,   /* tiled, online softmax, O(n) extra memory */
    FA_ALGORITHM_STANDARD = 1 /* materialises S and P: the baseline for comparisons */
} fa_algorithm;

typedef enum fa_layout {
    FA_LAYOUT_BSHD = 0, /* [batch, seq, heads, head_dim] */
    FA_LAYOUT_BHSD = 1  /* [batch, heads, seq, head_dim] */
} fa_layout;

/*
 * A 4-D tensor view [batch, seq, heads, head_dim]. head_dim is always
 * contiguous (element stride 1); the other three strides are in elements,
 * not bytes, and must be positive. data is aligned to its element size
 * (every pointer the library takes is). Packed QKV ([b, s, 3, h, d]) is
 * three views into one buffer with stride_seq = 3*h*d.
 */
typedef struct fa_tensor {
    void *data;
    fa_dtype dtype;
    int64_t stride_batch;
    int64_t stride_seq;
    int64_t stride_head;
} fa_tensor;

/*
 * Descale factors of an fp8 (FA_DTYPE_E4M3) input: element x of tensor t in batch b and kv
 * head g means x * data[b * stride_batch + g * stride_head] (float32, in the backend's
 * memory like the tensors; varlen: b is the sequence). Query head h takes the factor of its
 * kv head h / (num_heads_q / num_heads_kv). Strides are in elements and >= 0: both 0 is one
 * factor for the whole tensor; FlashAttention-3's [batch, num_heads_kv] layout is
 * stride_batch = num_heads_kv, stride_head = 1. data NULL is a factor of 1. Factors must be
 * finite and positive (like the inputs, they are not read for validation).
 *
 * Per block of rows (block quantisation): with block_rows > 0, row i of its sequence (query
 * rows for q_descale, key rows for k_descale and v_descale) takes the factor at
 * [b * stride_batch + g * stride_head + (i / block_rows) * stride_block] instead; e.g.
 * [batch, num_heads_kv, ceil(seqlen / block_rows)] is stride_batch = num_heads_kv * blocks,
 * stride_head = blocks, stride_block = 1. block_rows 0 (the default) is one factor for every
 * row. Any block_rows works on every backend that takes fp8. Block factors are applied in
 * float32 (the CPU scales k and v rows by them, CUDA the raw scores), so keep each, and q's
 * times k's, below 1e30, and v's of one sequence within 1e20 of each other.
 */
typedef struct fa_descale {
    const float *data;
    int64_t stride_batch;
    int64_t stride_head;
    int64_t stride_block; /* with block_rows > 0: between consecutive blocks of rows, >= 0 */
    int32_t block_rows;   /* 0: one factor for every row; else rows a factor, 1 .. 2^30 */
} fa_descale;

/*
 * One attention call: o = softmax(mask(cap(scale * q k^T))) v per head.
 *
 * Shapes: q, o [batch, seqlen_q, num_heads_q, head_dim];
 *         k, v [batch, seqlen_k, num_heads_kv, head_dim].
 * num_heads_q must be a multiple of num_heads_kv: query head h reads
 * key/value head h / (num_heads_q / num_heads_kv) (MHA, GQA, MQA).
 *
 * Masks. Query row i (0-based within its sequence) may attend key j when
 *   i + (sk - sq) - window_left <= j <= i + (sk - sq) + window_right,
 * with sq, sk that sequence's lengths and -1 meaning unbounded. causal = 1
 * is window_right = 0 (combined with any window_left). The diagonal is
 * aligned to the bottom-right corner when sq != sk, as in FlashAttention-2:
 * the last query sees every key, which is what chunked prefill and decode
 * with a KV cache need. Rows that can see no key produce o = 0 and
 * lse = -inf.
 *
 * Variable-length batches (TND layout): set cu_seqlens_q and cu_seqlens_k
 * (batch + 1 int32 cumulative offsets each, starting at 0, non-decreasing).
 * Then seqlen_q / seqlen_k are the total packed token counts (the extent of
 * the tensors along seq, 0 allowed), sequence b owns rows cu[b] .. cu[b+1]-1,
 * rows past cu[batch] are left untouched, and stride_batch is ignored.
 *
 * Inputs must be finite: NaN or inf in q, k or v gives unspecified output
 * (it may reach rows that do not see the offending key, as in other
 * implementations).
 *
 * Memory: an output (o, lse) shares no byte with an input or the other
 * output (FA_ERR_INVALID_STRIDE naming both); inputs may share memory, as
 * packed QKV does. A tensor's bytes are its elements through its strides
 * (seqlen_q / seqlen_k rows when varlen, lse through its resolved strides),
 * compared as addresses in one space (host, CUDA device or GLES buffer
 * pointers alike). Views interleaved without a common byte, such as o
 * between q's heads in one buffer, are accepted; the test is exact except
 * where two views' byte ranges meet and one of them reads an element twice
 * (an input's overlapping strides) or spans more than one step of the
 * other's largest stride without sharing it: those are refused too.
 *
 * lse (optional, float32): log-sum-exp of the capped, scaled scores of each
 * row, the natural-log softmax normaliser. Element (b, h, i) lives at
 * lse[b*lse_stride_batch + h*lse_stride_head + i*lse_stride_seq]; with all
 * three strides 0 the layout is contiguous [batch, heads, seqlen_q]
 * ([heads, total_q] for varlen, where i is the packed row and the batch
 * stride is unused).
 *
 * fp8 inputs (FA_DTYPE_E4M3 for q, k and v, o bf16 or float32): q, k and v are their bytes'
 * values times their descale factors (q_descale, k_descale, v_descale); the formula above
 * holds for those values. Backward, paged calls and GLES take no fp8.
 *
 * Initialise with fa_attention_desc_init(): it sets size and the defaults.
 */
typedef struct fa_attention_desc {
    size_t size; /* sizeof(fa_attention_desc): lets the struct grow */

    int32_t batch;
    int32_t seqlen_q;
    int32_t seqlen_k;
    int32_t num_heads_q;
    int32_t num_heads_kv;
    int32_t head_dim; /* 1 .. FA_MAX_HEAD_DIM */

    fa_tensor q, k, v; /* inputs, one dtype for all three */
    fa_tensor o;       /* output: q's dtype or FA_DTYPE_F32; bf16 or f32 for fp8 inputs */

    float *lse; /* optional output, NULL to skip */
    int64_t lse_stride_batch;
    int64_t lse_stride_head;
    int64_t lse_stride_seq;

    float scale;          /* 0 = default 1/sqrt(head_dim); else |scale| <= FA_MAX_SCALE */
    int32_t causal;       /* 0 or 1 */
    int32_t window_left;  /* -1 = unbounded, else >= 0 */
    int32_t window_right; /* -1 = unbounded, else >= 0 */
    float softcap;        /* 0 = off; else scores become softcap*tanh(s/softcap), <= FA_MAX_SCALE */

    const int32_t *cu_seqlens_q; /* varlen offsets, batch + 1 entries, or NULL */
    const int32_t *cu_seqlens_k; /* set both or neither */

    /* Dropout on the attention probabilities (training): p in [0, 1). Kept
     * probabilities are scaled by 1/(1-p); lse stays that of the undropped
     * softmax. The keep mask is a pure function of (seed, offset, batch,
     * query head, query row, key column), defined by fa_dropout_mask, so the
     * backward pass and every backend regenerate the same bits. */
    float dropout_p;
    uint64_t dropout_seed;
    uint64_t dropout_offset;

    fa_algorithm algorithm; /* FA_ALGORITHM_FLASH unless benchmarking */

    /* fp8 inputs only (else data NULL): each tensor's descale factors */
    fa_descale q_descale, k_descale, v_descale;
} fa_attention_desc;

/* What the last successful call ran: for logs, benchmarks and `flashattn info`. */
typedef struct fa_run_info {
    size_t size;              /* set to sizeof(fa_run_info) before the call */
    fa_backend backend;
    const char *backend_name; /* static string */
    const char *kernel;       /* static string, e.g. "flash-avx2" */
    int32_t block_q;          /* query rows per tile (0 where not tiled) */
    int32_t block_k;          /* key columns per tile */
    int32_t threads;
    uint64_t workspace_bytes; /* memory the call allocates beyond its inputs and outputs */
    double device_ms;         /* fa_forward: the attention kernels' own time on the GPU, by
                                 the backend's timers (GLES: a GL_EXT_disjoint_timer_query
                                 around the attention dispatches, without the repacking
                                 passes); 0 where not measured (CPU, CUDA, plans, backward,
                                 GLES without the extension or after a disjoint event) */
} fa_run_info;

typedef struct fa_context_options {
    size_t size;        /* sizeof(fa_context_options) */
    fa_backend backend; /* FA_BACKEND_AUTO picks the best usable one */
    int32_t num_threads; /* CPU threads, 0..FA_MAX_THREADS; 0 = OpenMP's default */
} fa_context_options;

typedef struct fa_context *fa_context_t;

/* Name of a status ("FA_ERR_INVALID_SHAPE"); never NULL, static storage. */
FA_API const char *fa_status_string(fa_status status);

/* Library version, e.g. "0.1.0"; static storage. */
FA_API const char *fa_version_string(void);

/* Name of a backend ("cpu", "cuda", "gles", "auto"); "unknown" for other values. */
FA_API const char *fa_backend_name(fa_backend backend);

/* Whether a backend was compiled in (1) or not (0). Usability at run time
 * (a device present) is reported by fa_context_create. */
FA_API int fa_backend_is_built(fa_backend backend);

/* Fill *desc with defaults: size set, scale 0 (1/sqrt(d)), no mask, window
 * -1/-1, softcap 0, no dropout, flash algorithm, every pointer NULL. */
FA_API void fa_attention_desc_init(fa_attention_desc *desc);

/* A contiguous tensor view for the given layout and shape: strides in
 * elements. seqlen is the tensor's own sequence extent. */
FA_API fa_tensor fa_tensor_contiguous(void *data, fa_dtype dtype, fa_layout layout,
                                      int32_t seqlen, int32_t heads, int32_t head_dim);

/*
 * Create a context on a backend. opts may be NULL (auto backend, default
 * threads). On success *out owns the context: free it with
 * fa_context_destroy. On error *out is set to NULL and nothing is allocated;
 * the message is available from fa_last_create_error() on this thread.
 */
FA_API fa_status fa_context_create(const fa_context_options *opts, fa_context_t *out);

/* Message of the last failed fa_context_create on the calling thread. */
FA_API const char *fa_last_create_error(void);

/* Free a context; NULL is a no-op. */
FA_API void fa_context_destroy(fa_context_t ctx);

/* The backend the context runs on. */
FA_API fa_backend fa_context_backend(fa_context_t ctx);

/* Last error message of this context ("" when the last call succeeded).
 * Owned by the context, valid until the next call on it. Never NULL. */
FA_API const char *fa_context_last_error(fa_context_t ctx);

/*
 * Multi-line "key: value" text about the context's backend: features,
 * caches, kernels. Writes at most cap bytes including the terminator into
 * buf (may be NULL with cap 0) and sets *needed (if non-NULL) to the full
 * length + 1.
 */
FA_API fa_status fa_context_info(fa_context_t ctx, char *buf, size_t cap, size_t *needed);

/*
 * Validate desc and report what fa_forward would run (kernel, tiles,
 * workspace bytes) without touching any tensor data. info may be NULL
 * (validation only).
 */
FA_API fa_status fa_forward_plan(fa_context_t ctx, const fa_attention_desc *desc,
                                 fa_run_info *info);

/*
 * Attention forward. Reads q, k, v; writes o and (if set) lse. Blocks until
 * the result is written (CPU; CUDA queues it on the context's stream). On
 * error nothing is written and the context's message names the offending
 * field. Deterministic: the same inputs give the same bits whatever the
 * thread count.
 */
FA_API fa_status fa_forward(fa_context_t ctx, const fa_attention_desc *desc);

/*
 * Gradients of one attention call (training). The forward descriptor is
 * reused as is: its q, k, v, o and lse (required: pass the forward's
 * log-sum-exp) and every mask, softcap, varlen and dropout setting; the
 * backward regenerates the dropout mask from the same seed and offset.
 *   d_o        [batch, seqlen_q, heads_q, dim]: gradient of o (input)
 *   d_q        like q;  d_k, d_v like k, v (outputs; with GQA, d_k and d_v
 *              sum over the query heads of each group)
 * Each gradient tensor has its own strides and is q's dtype or FA_DTYPE_F32
 * (CUDA takes d_o in q's dtype only: FA_ERR_UNSUPPORTED otherwise).
 * Gradients must not overlap each other or any input, the forward's o and
 * lse included, by the forward's rule (packed dQKV with interleaved heads
 * is fine: distinct elements). Varlen rows past the last
 * sequence (cu_seqlens[batch] ..) are not written, as in the forward.
 * Accumulation is float32. forward->algorithm picks flash (O(n) workspace)
 * or standard (stores P: the baseline).
 */
typedef struct fa_backward_desc {
    size_t size; /* sizeof(fa_backward_desc) */
    const fa_attention_desc *forward;
    fa_tensor d_o;
    fa_tensor d_q, d_k, d_v;
} fa_backward_desc;

/* Set size, everything else zero/NULL. */
FA_API void fa_backward_desc_init(fa_backward_desc *desc);

/* Validate and report the kernel, tiles and workspace fa_backward would use. */
FA_API fa_status fa_backward_plan(fa_context_t ctx, const fa_backward_desc *desc, fa_run_info *info);

/*
 * Attention backward: writes d_q, d_k, d_v. Blocks until done (CPU; CUDA
 * queues it on the context's stream). On error nothing is written.
 * Deterministic: the same inputs give the same bits for any thread count or
 * GPU (no floating-point atomics; dK/dV and dQ are produced by
 * two passes that each own their outputs, at the cost of computing the
 * score and probability tiles twice).
 */
FA_API fa_status fa_backward(fa_context_t ctx, const fa_backward_desc *desc);

/*
 * The dropout keep mask, materialised: mask[r*ld + c] = 1 when the
 * probability of (batch, head, query row row0 + r, key column col0 + c) is
 * kept for probability p, 0 when it is dropped. Rows and columns count from
 * the start of their sequence (varlen: within the sequence), so row0 + rows
 * and col0 + cols are at most INT32_MAX. Definition,
 * identical on every backend: with Philox4x32-10 (Salmon et al., 2011),
 *   key     = { lo32(seed) ^ (head * 0x9E3779B9), hi32(seed) ^ (batch * 0xBB67AE85) }
 *   counter = { col / 4, row, lo32(offset), hi32(offset) }
 *   r       = word (col % 4) of philox(counter, key)
 *   keep    = (r >> 8) >= ceil(p * 2^24)
 * so the kept fraction is 1 - p (to 2^-24) and p = 0 keeps everything.
 * Returns FA_ERR_INVALID_VALUE / _SHAPE / _STRIDE / _NULL_POINTER on bad
 * arguments (nothing written; the message is fa_last_create_error()'s, on
 * this thread). Thread-safe; needs no context.
 */
FA_API fa_status fa_dropout_mask(float p, uint64_t seed, uint64_t offset, int32_t batch, int32_t head,
                                 int32_t row0, int32_t rows, int32_t col0, int32_t cols,
                                 uint8_t *mask, int64_t ld);

/*
 * Memory the context's backend computes on. The CPU takes host memory; GLES
 * takes host memory (uploaded by each call) or GL buffers from these calls or
 * fa_gles_buffer_wrap; the CUDA backend takes device memory
 * only, as cuDNN and FlashAttention do: its tensors, lse and gradients must
 * be device pointers (cudaMalloc, cudaMallocAsync, managed memory or these
 * calls), while cu_seqlens stay host arrays on every backend (the library
 * checks them and copies them to the device itself). These calls let a
 * program stay backend-neutral:
 *   fa_memory_alloc     *ptr = bytes of backend memory (bytes 0 gives a valid
 *                       pointer to nothing); free it with fa_memory_free
 *   fa_memory_upload    host src -> backend dst
 *   fa_memory_download  backend src -> host dst
 *   fa_memory_copy      backend src -> backend dst, both memory of this context
 *                       (on the GPU where the backend has one: cudaMemcpyAsync
 *                       device to device, glCopyBufferSubData between GL
 *                       buffers); ranges that overlap are refused with
 *                       FA_ERR_INVALID_ARGUMENT and a message naming dst and src
 * Copies are ordered after the work already queued on the context's stream
 * and are complete when they return. bytes 0 is a no-op that succeeds (the
 * pointers are not looked at); otherwise NULL dst or src is
 * FA_ERR_NULL_POINTER. On an error nothing is written and the context's
 * message says why.
 */
FA_API fa_status fa_memory_alloc(fa_context_t ctx, size_t bytes, void **ptr);
FA_API fa_status fa_memory_free(fa_context_t ctx, void *ptr);
FA_API fa_status fa_memory_upload(fa_context_t ctx, void *dst, const void *src, size_t bytes);
FA_API fa_status fa_memory_download(fa_context_t ctx, void *dst, const void *src, size_t bytes);
FA_API fa_status fa_memory_copy(fa_context_t ctx, void *dst, const void *src, size_t bytes);

/* A GLES context whose GL objects are shared with yours: egl_display an initialised
 * EGLDisplay, egl_context an OpenGL ES 3.1 EGLContext of yours on it (both as void *).
 * Your buffer objects then become tensor memory through fa_gles_buffer_wrap, no copies.
 * flashattn makes its own context current only inside its calls and restores whatever was
 * current before. Errors as fa_context_create (fa_last_create_error). */
FA_API fa_status fa_gles_context_create(void *egl_display, void *egl_context, fa_context_t *out);

/* On a context from fa_gles_context_create: your GL buffer object `buffer` (at least `bytes`
 * long) as tensor memory. *ptr stands for its first byte, as fa_memory_alloc's pointers do:
 * put ptr + offset into fa_tensor.data (every tensor of a call in such buffers, or all in
 * host memory). What your context wrote into them must be complete before the call
 * (glFinish, or a fence and glWaitSync; glMemoryBarrier first after shader writes), as for
 * any context sharing them. fa_forward reads and writes the buffers on the GPU and finishes
 * its commands before it returns, so your context sees o and lse after the call.
 * fa_memory_free(ctx, *ptr) forgets the mapping; the buffer stays yours. */
FA_API fa_status fa_gles_buffer_wrap(fa_context_t ctx, uint32_t buffer, size_t bytes, void **ptr);

/*
 * The stream the context's calls are queued on: a cudaStream_t for the CUDA
 * backend (NULL = the legacy default stream). On CUDA, fa_forward and
 * fa_backward return once their kernels are queued; the results are ready
 * when the stream reaches them (cudaStreamSynchronize or
 * fa_context_synchronize). Other backends block until done and accept only
 * NULL here (FA_ERR_UNSUPPORTED otherwise).
 */
FA_API fa_status fa_context_set_stream(fa_context_t ctx, void *stream);

/* Wait until every call queued on the context has finished; FA_ERR_BACKEND
 * with the runtime's message if any of them failed on the device. */
FA_API fa_status fa_context_synchronize(fa_context_t ctx);

/* Report of the last successful fa_forward / fa_forward_plan / fa_backward /
 * fa_backward_plan on ctx. Clears the context's error message on success. */
FA_API fa_status fa_context_last_run(fa_context_t ctx, fa_run_info *info);

/* ==== Serving: a paged KV cache, append with RoPE, plan once and run per layer ==== */

/* Largest fa_merge_desc.num_states. */
#define FA_MAX_MERGE_STATES 64

/* Rotary position embedding of the new rows (fa_paged_desc.rope). */
typedef enum fa_rope {
    FA_ROPE_NONE = 0,
    FA_ROPE_NEOX = 1,       /* pairs (x[i], x[i + rope_dim/2]): Hugging Face Llama, GPT-NeoX */
    FA_ROPE_INTERLEAVED = 2 /* pairs (x[2i], x[2i + 1]): GPT-J, Meta's and llama2.c's Llama */
} fa_rope;

/*
 * A paged KV cache: a pool of num_pages pages of page_size tokens each. Key
 * element (page, t, h, x) lives at k[page*k_stride_page + t*k_stride_token +
 * h*k_stride_head + x] (strides in elements, head_dim contiguous), values the
 * same through v's strides. [page, token, head, dim] (vLLM, FlashInfer NHD),
 * [page, head, token, dim] (FlashInfer HND) and K and V interleaved in one
 * tensor ([page, 2, token, head, dim]) are all views; fa_kv_cache_contiguous
 * builds the first two. Any page_size >= 1 works.
 */
typedef struct fa_kv_cache {
    void *k, *v;
    fa_dtype dtype; /* the queries' dtype */
    int32_t num_pages;
    int32_t page_size;
    int32_t num_heads; /* kv heads */
    int64_t k_stride_page, k_stride_token, k_stride_head;
    int64_t v_stride_page, v_stride_token, v_stride_head;
    /* reserved for quantised caches (fp8, int8 with per-page scales): must be NULL */
    const float *k_scale, *v_scale;
} fa_kv_cache;

/* A cache of separate K and V pools in layout BSHD ([page, token, head, dim]) or BHSD
 * ([page, head, token, dim]). */
FA_API fa_kv_cache fa_kv_cache_contiguous(void *k, void *v, fa_dtype dtype, fa_layout layout,
                                          int32_t num_pages, int32_t page_size, int32_t num_heads,
                                          int32_t head_dim);

/*
 * One serving call: ragged queries against each sequence's pages, with the
 * new rows' keys and values appended first.
 *
 * Sequence b owns query rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 of q and
 * o ([total_q, num_heads_q, head_dim], stride_batch ignored): one row for a
 * decode, a few for speculative verification, a chunk for chunked prefill, in
 * any mix. Its cache holds cache_seqlens[b] tokens, token j in page
 * block_table[b*block_table_stride + j/page_size] at slot j % page_size.
 *
 * Append (k_new.data set): row r of k_new and v_new ([total_q, num_heads,
 * head_dim]) is the new token of query row r; the call writes sequence b's
 * new rows at tokens cache_seqlens[b] .. cache_seqlens[b] + n_b - 1 (n_b its
 * query rows) and then attends over all cache_seqlens[b] + n_b keys. Without
 * append it attends over the cache_seqlens[b] cached keys. cache_seqlens is
 * not advanced: the caller adds n_b for the next step. A page a call writes
 * must appear once among the entries the call uses (one sequence's, once);
 * sequences may share the pages they only read (a common prefix). Host
 * tables (and check_tables) are checked for this, naming the entry.
 *
 * RoPE (rope != FA_ROPE_NONE): the first rope_dim dimensions (even, 0 = all)
 * of q and of the appended keys are rotated before anything else, so the
 * cache holds rotated keys: x' = x cos - y sin, y' = x sin + y cos for each
 * pair (x, y) of the style's pairing, with cos/sin = rope_cos/rope_sin[pos *
 * rope_dim/2 + i] (float32 tables of rope_max_pos rows). The position of query
 * row i of sequence b is positions[row] when positions is set, else
 * (its keys) - n_b + i: the appended token's own index in the cache.
 *
 * Masks, softcap, scale, GQA (num_heads_q a multiple of cache.num_heads) and
 * lse ([num_heads_q, total_q] by default; lse_stride_head/_seq otherwise) are
 * fa_attention_desc's, causal aligned bottom-right. sinks (optional, float32
 * [num_heads_q]): one logit per query head that joins every row's softmax
 * with no value, o = sum_j e^s_j v_j / (e^sink + sum_j e^s_j), and lse
 * includes it.
 *
 * Memory. q, o, k_new, v_new, lse, the cache and the small arrays
 * (cu_seqlens_q, block_table, cache_seqlens, positions, rope tables, sinks)
 * are all memory of the context's backend: on CUDA device memory, so a
 * serving loop never synchronises, and they are read only on the device.
 * There the lengths and page ids cannot be checked before the kernels run:
 * kernels clamp them so that no access leaves the cache, and check_tables = 1
 * downloads and checks them first, naming the first bad entry (a debugging
 * aid: it synchronises). On the CPU they are always checked.
 *
 * Bounds: max_seqlen_q and max_seqlen_k bound every sequence's query rows and
 * keys (cached + appended); a plan is made for them.
 */
typedef struct fa_paged_desc {
    size_t size; /* sizeof(fa_paged_desc) */

    int32_t batch;        /* sequences, >= 1 */
    int32_t total_q;      /* packed query rows, >= 0 */
    int32_t max_seqlen_q; /* >= every sequence's query rows */
    int32_t max_seqlen_k; /* >= every sequence's keys, cached plus appended */
    int32_t num_heads_q;
    int32_t head_dim; /* 1 .. FA_MAX_HEAD_DIM */

    fa_tensor q, o; /* o: q's dtype or FA_DTYPE_F32 */
    const int32_t *cu_seqlens_q; /* batch + 1 offsets from 0, non-decreasing, <= total_q */

    fa_kv_cache cache;
    const int32_t *block_table; /* [batch, max_pages_per_seq] page ids in 0 .. num_pages-1 */
    int64_t block_table_stride; /* elements between rows; 0 = max_pages_per_seq */
    int32_t max_pages_per_seq;  /* pages a sequence may own: its keys <= this * page_size */
    const int32_t *cache_seqlens; /* [batch] tokens cached before this call */

    fa_tensor k_new, v_new; /* data NULL: nothing appended; else cache.dtype */

    fa_rope rope;
    int32_t rope_dim;     /* even, <= head_dim; 0 = head_dim */
    int32_t rope_max_pos; /* rows of the tables */
    const float *rope_cos, *rope_sin; /* [rope_max_pos, rope_dim/2] */
    const int32_t *positions;         /* optional [total_q] positions of the query rows */

    float *lse; /* optional output */
    int64_t lse_stride_head, lse_stride_seq;

    float scale; /* 0 = 1/sqrt(head_dim) */
    int32_t causal;
    int32_t window_left, window_right;
    float softcap;
    const float *sinks; /* optional [num_heads_q] */

    /* Keys per KV split, a multiple of 16 (0 = the backend's default). Split
     * boundaries depend on nothing but a sequence's own length and this, so a
     * sequence gets the same bits alone or in any batch of one plan (or of
     * one-shot calls of the same max_seqlen_q: the bounds choose the kernel). */
    int32_t kv_split;
    int32_t check_tables; /* 1: check device-side lengths and page ids first (CUDA; syncs) */
} fa_paged_desc;

/* Set size, window -1/-1, everything else zero/NULL. */
FA_API void fa_paged_desc_init(fa_paged_desc *desc);

/* The paged call in one step: plan, run, free. Blocks on the CPU; queued on the stream on
 * CUDA (the workspace is the context's own, kept between calls). On error nothing is
 * written, the cache included. */
FA_API fa_status fa_paged_forward(fa_context_t ctx, const fa_paged_desc *desc);

/* Only the append of desc (k_new and v_new into the pages, keys rotated as desc->rope
 * says); q, o and lse are not looked at. */
FA_API fa_status fa_kv_append(fa_context_t ctx, const fa_paged_desc *desc);

/*
 * Plan once, run per layer. fa_paged_plan_create reads the shapes, dtypes,
 * bounds and settings of `bounds` (no pointer in it is read) and decides the
 * kernel, the KV split and the GQA packing; it allocates the plan's
 * workspace. fa_paged_run then takes any call within those bounds: the same
 * num_heads_q, head_dim, cache.num_heads, page_size, dtypes, rope style, kv_split
 * and presence of k_new, lse and sinks; batch, total_q, max_seqlen_q and max_seqlen_k
 * at most the plan's. On CUDA it allocates nothing, synchronises with nothing
 * and reads no device memory from the host, so it may be captured in a graph
 * and replayed (the CPU takes its thread buffers per call). The plan belongs
 * to its context (one thread at a time, errors in the context's message) and
 * must be destroyed before it.
 */
typedef struct fa_paged_plan *fa_paged_plan_t;
FA_API fa_status fa_paged_plan_create(fa_context_t ctx, const fa_paged_desc *bounds,
                                      fa_paged_plan_t *out);
FA_API fa_status fa_paged_run(fa_paged_plan_t plan, const fa_paged_desc *desc);
/* What the plan runs (kernel, split, workspace); info->size set by the caller. */
FA_API fa_status fa_paged_plan_info(fa_paged_plan_t plan, fa_run_info *info);
/* NULL is a no-op. */
FA_API void fa_paged_plan_destroy(fa_paged_plan_t plan);

/*
 * Merge attention states: num_states partial results (o_s, lse_s) of the same
 * queries over disjoint key sets become the result over their union,
 *   lse = log sum_s e^lse_s,  o = sum_s e^(lse_s - lse) o_s,
 * in state order (deterministic). A row whose states are all -inf gets o = 0,
 * lse = -inf; one with a NaN or +inf lse_s gets o and lse NaN. o_in is [state, row, head, dim] (stride_batch steps states),
 * lse_in element (s, h, r) at s*lse_in_stride_state + h*lse_in_stride_head +
 * r*lse_in_stride_row (all 0 = [state, head, row]; the stride of an axis of one
 * entry is not read); o [row, head, dim] in o_in's dtype or float32, lse
 * (optional) as in fa_paged_desc. rows 0 merges nothing. Backend memory.
 */
typedef struct fa_merge_desc {
    size_t size; /* sizeof(fa_merge_desc) */
    int32_t num_states; /* 1 .. FA_MAX_MERGE_STATES */
    int32_t rows, num_heads, head_dim;
    fa_tensor o_in;
    const float *lse_in;
    int64_t lse_in_stride_state, lse_in_stride_head, lse_in_stride_row;
    fa_tensor o;
    float *lse;
    int64_t lse_stride_head, lse_stride_row;
} fa_merge_desc;

/* Set size, everything else zero/NULL. */
FA_API void fa_merge_desc_init(fa_merge_desc *desc);
FA_API fa_status fa_merge_states(fa_context_t ctx, const fa_merge_desc *desc);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_H */
