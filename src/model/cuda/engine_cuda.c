/* SPDX-License-Identifier: MIT */
/*
 * The CUDA engine: bf16 weights and cache in device memory, one stream for everything
 * (cuBLAS, the layer kernels, flashattn's paged calls), one host synchronisation a step.
 *
 * A layer over a step's T rows (x the float32 residual stream):
 *   xb  = rmsnorm(x) g_att                      layers.cu
 *   qkv = xb [Wq; Wk; Wv]^T                     cuBLAS, bf16 out
 *   att = paged attention (q, k, v of qkv: RoPE, append into the pages, attend)
 *   x  += att Wo^T                              cuBLAS, float32 out, beta = 1
 *   xb  = rmsnorm(x) g_ffn
 *   h13 = xb [W1; W3]^T,  hg = silu(h1) h3
 *   x  += hg W2^T
 * then the sampled rows' final norm, the classifier (float32 logits) and the sampler. Steps of
 * a few rows (gemv.h; FLASHATTN_GEMV_ROWS) run each projection as one kernel with its
 * neighbour fused: norm + q, k, v; the output projection + the residual add; norm + gate, up
 * + SwiGLU; the down projection + the residual add; the final norm + the classifier.
 *
 * Decode steps (one query row a sequence) run at a bucket's batch, the powers of two below
 * max_batch and max_batch itself: the step's rows first, then padding rows (token 0 at
 * position 0 of a scratch page no request owns, never sampled). Their tables sit at fixed
 * places of one device buffer and every length the launches see is the bucket's or a plan's
 * bound, so a bucket's launches are captured once into a CUDA graph (its first step runs
 * them directly and captures them) and replayed after the table upload; with graphs off the
 * same launches run directly, so both give the same bits. Other steps launch as they come.
 */
#include "engine_cuda.h"
#include "fail.h"
#include "gemv.h"
#include "layers.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer_w {
    uint16_t *qkv; /* [dim + 2 kv_dim, dim] */
    uint16_t *o;   /* [dim, dim] */
    uint16_t *w13; /* [2 hidden, dim]: gate rows, then up rows */
    uint16_t *w2;  /* [dim, hidden] */
} layer_w;

struct fa_engine_cuda {
    const fa_model *m;
    fa_engine_options o;
    int dim, hid, kvd, hs, qkv_w, L, V, kvh, max_pages;
    float eps;
    cudaStream_t stream;
    cublasHandle_t blas;
    fa_context_t ctx;
    fa_paged_plan_t plan;        /* any step within the engine's bounds */
    fa_paged_plan_t plan_decode; /* steps of one query row a sequence: the decode kernel */
    int32_t scratch_page;        /* num_pages: the padding rows' page, beyond the requests' */
    int nbuckets;
    int32_t bucket[32];          /* decode batches, ascending; the last is max_batch */
    cudaGraphExec_t graph[32];   /* each bucket's decode step, once captured */
    int graphs;                  /* 1: replay graphs for decode steps */
    char graphs_off[FA_MODEL_ERR_LEN]; /* why a failed capture turned them off, or "" */
    int32_t captured;
    int64_t replays;
    void *blas_ws;               /* cuBLAS's workspace, the same for direct and captured GEMMs */
    fa_gemv_config gemv;         /* the few-row projections (gemv.h) */
    int gemv_dim, gemv_hid;      /* the most rows they take: projections from dim, from hidden */
    uint16_t *weights;   /* one allocation: the layers' matrices, the embedding, the classifier */
    layer_w *lw;         /* [layers] views into weights */
    uint16_t *emb, *cls; /* [vocab, dim]; cls == emb when shared */
    float *norms;        /* rms_att [layers, dim], rms_ffn [layers, dim], rms_final [dim] */
    uint16_t *kc, *vc;   /* [layers, pages, page_size, kv_heads, head_size] */
    float *rope;         /* cos [rope_pos, hs/2] then sin [rope_pos, hs/2] */
    int32_t rope_pos;    /* RoPE rows (fa_model_rope_rows) */
    float *x;            /* [T, dim] residual stream */
    uint16_t *xb;        /* [T, dim] normed input of a sublayer; the sampled rows' final norm */
    uint16_t *qkv;       /* [T, dim + 2 kv_dim] */
    uint16_t *att;       /* [T, dim] */
    uint16_t *h13;       /* [T, 2 hidden] */
    uint16_t *hg;        /* [T, hidden] */
    float *logits;       /* [B, vocab] */
    float *wts;          /* [B, vocab] the sampler's weights */
    int32_t *d_tab, *h_tab; /* a step's tables: device, pinned host */
    size_t tab_words;
    int32_t *d_next, *h_next; /* [B] */
    uint64_t weight_bytes, act_bytes, kv_bytes;
    char name[256]; /* the device's */
};

/* cuBLAS's workspace: set once, so that GEMMs captured in a graph allocate nothing and choose
 * the kernels they choose outside one (32 MiB: NVIDIA's recommendation for Hopper) */
#define BLAS_WORKSPACE ((size_t)32 << 20)

#define CUDA_TRY(call, what)                                                                            \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess)                                                                          \
            return fa_model_fail(err, FA_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(e_));          \
    } while (0)

#define BLAS_TRY(call, what)                                                                            \
    do {                                                                                                \
        cublasStatus_t b_ = (call);                                                                     \
        if (b_ != CUBLAS_STATUS_SUCCESS)                                                                \
            return fa_model_fail(err, FA_ERR_BACKEND, "%s: cuBLAS %s", what, cublasGetStatusString(b_)); \
    } while (0)

int fa_engine_cuda_available(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/* A device o->device is present, or why not. */
static fa_status check_device(const fa_engine_options *o, char *err)
{
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    cudaGetLastError();
    if (e != cudaSuccess || n == 0)
        return fa_model_fail(err, FA_ERR_BACKEND_UNAVAILABLE, "backend cuda: no CUDA device is present (%s)",
                             e != cudaSuccess ? cudaGetErrorString(e) : "the runtime counts none");
    if (o->device >= n)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "device (%d) must be below the %d CUDA device%s present",
                             (int)o->device, n, n == 1 ? "" : "s");
    return FA_OK;
}

/* Sizes of the parts, in bytes, from the model and the options. */
typedef struct sizes {
    uint64_t weights, norms, act, tables_words, page;
} sizes;

static sizes sizes_of(const fa_model_config *c, const fa_engine_options *o)
{
    const uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, hs = dim / (uint64_t)c->n_heads;
    const uint64_t kvd = hs * (uint64_t)c->n_kv_heads, V = (uint64_t)c->vocab_size, L = (uint64_t)c->n_layers;
    const uint64_t T = (uint64_t)o->token_budget, B = (uint64_t)o->max_batch;
    const uint64_t per_layer = (dim + 2 * kvd) * dim + dim * dim + 3 * hid * dim;
    const uint64_t pages = ((uint64_t)c->seq_len + (uint64_t)o->page_size - 1) / (uint64_t)o->page_size;
    sizes z;
    z.weights = 2 * (L * per_layer + V * dim * (c->shared_classifier ? 1 : 2));
    z.norms = 4 * (2 * L * dim + dim) + 4 * 2 * (uint64_t)c->seq_len * (hs / 2);
    z.act = T * (4 * dim + 2 * dim + 2 * (dim + 2 * kvd) + 2 * dim + 4 * hid + 2 * hid) + B * (8 * V + 4);
    z.tables_words = 2 * T + 6 * B + 1 + B * pages;
    z.page = 2 * 2 * L * (uint64_t)o->page_size * kvd;
    return z;
}

fa_status fa_engine_cuda_memory(const fa_model *m, const fa_engine_options *o, uint64_t *free_bytes,
                                uint64_t *fixed_bytes, uint64_t *page_bytes, char *err)
{
    const fa_status dv = check_device(o, err);
    if (dv != FA_OK)
        return dv;
    CUDA_TRY(cudaSetDevice(o->device), "selecting the device");
    size_t fr = 0, total = 0;
    CUDA_TRY(cudaMemGetInfo(&fr, &total), "reading the device's free memory");
    const sizes z = sizes_of(&m->config, o);
    *free_bytes = fr;
    /* the padding rows' scratch page, and room for cuBLAS's and the attention plan's workspaces */
    *fixed_bytes = z.weights + z.norms + z.act + 4 * z.tables_words + z.page + (256ull << 20);
    *page_bytes = z.page;
    return FA_OK;
}

void fa_engine_cuda_free(fa_engine_cuda *g)
{
    if (!g)
        return;
    if (g->stream)
        cudaStreamSynchronize(g->stream);
    for (int i = 0; i < g->nbuckets; i++)
        if (g->graph[i])
            cudaGraphExecDestroy(g->graph[i]);
    fa_paged_plan_destroy(g->plan);
    fa_paged_plan_destroy(g->plan_decode);
    if (g->ctx)
        fa_context_destroy(g->ctx);
    if (g->blas)
        cublasDestroy(g->blas);
    void *dev[] = { g->weights, g->norms, g->kc, g->vc, g->rope, g->x, g->xb, g->qkv, g->att,
                    g->h13, g->hg, g->logits, g->wts, g->d_tab, g->d_next, g->blas_ws };
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        cudaFree(dev[i]);
    cudaFreeHost(g->h_tab);
    cudaFreeHost(g->h_next);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    free(g->lw);
    free(g);
}

/* n float32 values from the host into bf16 at dst, through a device staging buffer */
static fa_status upload_bf16(fa_engine_cuda *g, uint16_t *dst, const float *src, size_t n, float *stage,
                             size_t stage_n, char *err)
{
    for (size_t done = 0; done < n;) {
        const size_t k = n - done < stage_n ? n - done : stage_n;
        CUDA_TRY(cudaMemcpyAsync(stage, src + done, k * sizeof(float), cudaMemcpyHostToDevice, g->stream),
                 "uploading the weights");
        CUDA_TRY(fa_layers_to_bf16(dst + done, stage, k, g->stream), "converting the weights to bf16");
        done += k;
    }
    return FA_OK;
}

static fa_status upload_weights(fa_engine_cuda *g, char *err)
{
    const fa_model_weights *w = &g->m->w;
    const size_t dim = (size_t)g->dim, kvd = (size_t)g->kvd, hid = (size_t)g->hid;
    const size_t stage_n = (size_t)16 << 20;
    float *stage = NULL;
    CUDA_TRY(cudaMalloc((void **)&stage, stage_n * sizeof(float)), "allocating the upload buffer");
    fa_status st = FA_OK;
    uint16_t *p = g->weights;
    for (int l = 0; l < g->L && st == FA_OK; l++) {
        layer_w *lw = &g->lw[l];
        const size_t dd = dim * dim, kd = kvd * dim, hd = hid * dim;
        lw->qkv = p, p += (dim + 2 * kvd) * dim;
        lw->o = p, p += dd;
        lw->w13 = p, p += 2 * hd;
        lw->w2 = p, p += hd;
        const struct {
            uint16_t *dst;
            const float *src;
            size_t n;
        } parts[] = { { lw->qkv, w->wq + l * dd, dd },           { lw->qkv + dd, w->wk + l * kd, kd },
                      { lw->qkv + dd + kd, w->wv + l * kd, kd }, { lw->o, w->wo + l * dd, dd },
                      { lw->w13, w->w1 + l * hd, hd },           { lw->w13 + hd, w->w3 + l * hd, hd },
                      { lw->w2, w->w2 + l * hd, hd } };
        for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]) && st == FA_OK; i++)
            st = upload_bf16(g, parts[i].dst, parts[i].src, parts[i].n, stage, stage_n, err);
    }
    const size_t vd = (size_t)g->V * dim;
    g->emb = p, p += vd;
    if (st == FA_OK)
        st = upload_bf16(g, g->emb, w->token_embedding, vd, stage, stage_n, err);
    if (g->m->config.shared_classifier) {
        g->cls = g->emb;
    } else {
        g->cls = p;
        if (st == FA_OK)
            st = upload_bf16(g, g->cls, w->classifier, vd, stage, stage_n, err);
    }
    const cudaError_t e = cudaStreamSynchronize(g->stream);
    cudaFree(stage);
    if (st == FA_OK && e != cudaSuccess)
        return fa_model_fail(err, FA_ERR_BACKEND, "uploading the weights: %s", cudaGetErrorString(e));
    return st;
}

static fa_status upload_small(fa_engine_cuda *g, char *err)
{
    const fa_model_config *c = &g->m->config;
    const size_t dim = (size_t)g->dim, L = (size_t)g->L, half = (size_t)g->hs / 2, S = (size_t)g->rope_pos;
    const size_t n_norm = 2 * L * dim + dim, n_rope = 2 * S * half;
    float *h = malloc(sizeof(float) * (n_norm > n_rope ? n_norm : n_rope));
    if (!h)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the norms");
    memcpy(h, g->m->w.rms_att, sizeof(float) * L * dim);
    memcpy(h + L * dim, g->m->w.rms_ffn, sizeof(float) * L * dim);
    memcpy(h + 2 * L * dim, g->m->w.rms_final, sizeof(float) * dim);
    cudaError_t e = cudaMemcpy(g->norms, h, sizeof(float) * n_norm, cudaMemcpyHostToDevice);
    for (size_t p = 0; p < S && e == cudaSuccess; p++)
        for (size_t i = 0; i < half; i++) {
            const float a = fa_model_rope_angle(c, (int32_t)p, (int32_t)i);
            h[p * half + i] = cosf(a);
            h[S * half + p * half + i] = sinf(a);
        }
    if (e == cudaSuccess)
        e = cudaMemcpy(g->rope, h, sizeof(float) * n_rope, cudaMemcpyHostToDevice);
    free(h);
    CUDA_TRY(e, "uploading the norms and RoPE tables");
    return FA_OK;
}

/* The paged call of layer l over a step (tables at their device addresses). */
static fa_paged_desc attention_desc(const fa_engine_cuda *g, int l)
{
    const fa_model_config *c = &g->m->config;
    const int32_t pages = g->scratch_page + 1;
    const size_t layer = (size_t)l * (size_t)pages * (size_t)g->o.page_size * (size_t)g->kvd;
    fa_paged_desc d;
    fa_paged_desc_init(&d);
    d.num_heads_q = c->n_heads;
    d.head_dim = g->hs;
    const fa_tensor rows = { NULL, FA_DTYPE_BF16, 0, g->qkv_w, g->hs };
    d.q = rows, d.q.data = g->qkv;
    d.k_new = rows, d.k_new.data = g->qkv + g->dim;
    d.v_new = rows, d.v_new.data = g->qkv + g->dim + g->kvd;
    d.o = fa_tensor_contiguous(g->att, FA_DTYPE_BF16, FA_LAYOUT_BSHD, 1, c->n_heads, g->hs);
    d.cache = fa_kv_cache_contiguous(g->kc + layer, g->vc + layer, FA_DTYPE_BF16, FA_LAYOUT_BSHD, pages,
                                     g->o.page_size, g->kvh, g->hs);
    d.rope = FA_ROPE_INTERLEAVED; /* llama2.c's adjacent pairs (HF's are un-permuted on load) */
    d.rope_max_pos = g->rope_pos;
    d.rope_cos = g->rope;
    d.rope_sin = g->rope + (size_t)g->rope_pos * (size_t)(g->hs / 2);
    d.causal = 1;
    return d;
}

fa_status fa_engine_cuda_create(const fa_model *m, const fa_engine_options *o, fa_engine_cuda **out,
                                fa_engine_info *info, char *err)
{
    *out = NULL;
    const fa_model_config *c = &m->config;
    const fa_status dv = check_device(o, err);
    if (dv != FA_OK)
        return dv;
    if (o->num_pages == INT32_MAX)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "num_pages (%d) must be below %d: the engine keeps a page of its own", (int)o->num_pages,
                             INT32_MAX);
    CUDA_TRY(cudaSetDevice(o->device), "selecting the device");
    CUDA_TRY(cudaFree(NULL), "starting the device"); /* the primary context, current for flashattn too */
    fa_engine_cuda *g = calloc(1, sizeof(*g));
    if (!g)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the engine");
    g->m = m, g->o = *o;
    g->dim = c->dim, g->hid = c->hidden_dim, g->L = c->n_layers, g->V = c->vocab_size, g->kvh = c->n_kv_heads;
    g->hs = c->dim / c->n_heads, g->kvd = g->hs * c->n_kv_heads, g->qkv_w = g->dim + 2 * g->kvd;
    g->eps = c->norm_eps > 0.0f ? c->norm_eps : FA_MODEL_NORM_EPS;
    g->max_pages = (c->seq_len + o->page_size - 1) / o->page_size;
    g->rope_pos = fa_model_rope_rows(c, o->num_pages, o->page_size);
    const sizes z = sizes_of(c, o);
    const size_t T = (size_t)o->token_budget, B = (size_t)o->max_batch, V = (size_t)g->V;
    g->scratch_page = o->num_pages;
    const uint64_t page_elems = (uint64_t)o->page_size * (uint64_t)g->kvd;
    const uint64_t cache_elems = (uint64_t)g->L * ((uint64_t)o->num_pages + 1) * page_elems;
    g->weight_bytes = z.weights, g->act_bytes = z.act;
    g->kv_bytes = 4 * (uint64_t)g->L * (uint64_t)o->num_pages * page_elems; /* the requests' pages */
    for (int64_t b = 1; b < o->max_batch; b *= 2)
        g->bucket[g->nbuckets++] = (int32_t)b;
    g->bucket[g->nbuckets++] = o->max_batch;
    g->graphs = !o->no_graphs;
    g->tab_words = (size_t)z.tables_words;
    fa_status st = FA_OK;
    char what[96];
#define ALLOC(ptr, bytes, name)                                                                         \
    do {                                                                                                \
        cudaError_t e_ = st == FA_OK ? cudaMalloc((void **)&(ptr), (bytes)) : cudaSuccess;              \
        if (e_ != cudaSuccess) {                                                                        \
            snprintf(what, sizeof(what), "allocating %s (%llu bytes)", name, (unsigned long long)(bytes)); \
            st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "%s: %s", what, cudaGetErrorString(e_));      \
        }                                                                                               \
    } while (0)
    cudaError_t e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        st = fa_model_fail(err, FA_ERR_BACKEND, "creating a stream: %s", cudaGetErrorString(e));
    if (st == FA_OK && !(g->lw = calloc((size_t)g->L, sizeof(layer_w))))
        st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory for the layers");
    ALLOC(g->weights, z.weights, "the bf16 weights");
    ALLOC(g->norms, sizeof(float) * (2 * (size_t)g->L * g->dim + g->dim), "the norms");
    ALLOC(g->rope, sizeof(float) * 2 * (size_t)g->rope_pos * (size_t)(g->hs / 2), "the RoPE tables");
    ALLOC(g->kc, 2 * cache_elems, "the key pages");
    ALLOC(g->vc, 2 * cache_elems, "the value pages");
    ALLOC(g->x, 4 * T * g->dim, "the residual stream");
    ALLOC(g->xb, 2 * T * g->dim, "the normed rows");
    ALLOC(g->qkv, 2 * T * g->qkv_w, "q, k and v");
    ALLOC(g->att, 2 * T * g->dim, "the attention output");
    ALLOC(g->h13, 4 * T * g->hid, "the FFN's gate and up");
    ALLOC(g->hg, 2 * T * g->hid, "the FFN's product");
    ALLOC(g->logits, 4 * B * V, "the logits");
    ALLOC(g->wts, 4 * B * V, "the sampler's weights");
    ALLOC(g->d_tab, 4 * g->tab_words, "the step tables");
    ALLOC(g->d_next, 4 * B, "the next tokens");
    ALLOC(g->blas_ws, BLAS_WORKSPACE, "cuBLAS's workspace");
#undef ALLOC
    if (st == FA_OK && ((e = cudaMallocHost((void **)&g->h_tab, 4 * g->tab_words)) != cudaSuccess ||
                        (e = cudaMallocHost((void **)&g->h_next, 4 * B)) != cudaSuccess))
        st = fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "pinned host memory for the step tables: %s",
                           cudaGetErrorString(e));
    if (st == FA_OK) {
        cublasStatus_t b = cublasCreate(&g->blas);
        if (b == CUBLAS_STATUS_SUCCESS && (b = cublasSetStream(g->blas, g->stream)) == CUBLAS_STATUS_SUCCESS)
            b = cublasSetWorkspace(g->blas, g->blas_ws, BLAS_WORKSPACE);
        if (b != CUBLAS_STATUS_SUCCESS)
            st = fa_model_fail(err, FA_ERR_BACKEND, "cuBLAS: %s", cublasGetStatusString(b));
    }
    if (st == FA_OK) {
        const fa_context_options co = { sizeof(co), FA_BACKEND_CUDA, 0 };
        if (fa_context_create(&co, &g->ctx) != FA_OK)
            st = fa_model_fail(err, FA_ERR_BACKEND, "flashattn's cuda context: %s", fa_last_create_error());
        else if (fa_context_set_stream(g->ctx, g->stream) != FA_OK)
            st = fa_model_fail(err, FA_ERR_BACKEND, "flashattn's stream: %s", fa_context_last_error(g->ctx));
    }
    if (st == FA_OK && (e = fa_gemv_config_init(&g->gemv, o->device)) != cudaSuccess)
        st = fa_model_fail(err, FA_ERR_BACKEND, "reading the device's attributes: %s", cudaGetErrorString(e));
    if (st == FA_OK) {
        g->gemv_dim = fa_gemv_rows(&g->gemv, g->dim);
        g->gemv_hid = fa_gemv_rows(&g->gemv, g->hid);
    }
    if (st == FA_OK)
        st = upload_weights(g, err);
    if (st == FA_OK)
        st = upload_small(g, err);
    for (int l = 0; l < g->L && st == FA_OK; l++) { /* finite keys and values for the padding rows */
        const size_t at = ((size_t)l * ((size_t)o->num_pages + 1) + (size_t)o->num_pages) * (size_t)page_elems;
        if ((e = cudaMemsetAsync(g->kc + at, 0, 2 * page_elems, g->stream)) != cudaSuccess ||
            (e = cudaMemsetAsync(g->vc + at, 0, 2 * page_elems, g->stream)) != cudaSuccess)
            st = fa_model_fail(err, FA_ERR_BACKEND, "clearing the scratch page: %s", cudaGetErrorString(e));
    }
    if (st == FA_OK) { /* one plan for every step: the engine's bounds */
        fa_paged_desc b = attention_desc(g, 0);
        b.batch = o->max_batch;
        b.total_q = b.max_seqlen_q = o->token_budget;
        b.max_seqlen_k = c->seq_len;
        b.max_pages_per_seq = g->max_pages;
        fa_status pc = fa_paged_plan_create(g->ctx, &b, &g->plan);
        b.total_q = o->max_batch, b.max_seqlen_q = 1;
        if (pc == FA_OK)
            pc = fa_paged_plan_create(g->ctx, &b, &g->plan_decode);
        if (pc != FA_OK)
            st = fa_model_fail(err, FA_ERR_BACKEND, "planning the paged attention: %s",
                               fa_context_last_error(g->ctx));
    }
    if (st != FA_OK) {
        fa_engine_cuda_free(g);
        return st;
    }
    struct cudaDeviceProp prop;
    snprintf(g->name, sizeof(g->name), "%s", cudaGetDeviceProperties(&prop, o->device) == cudaSuccess ? prop.name : "cuda");
    *info = (fa_engine_info){ FA_BACKEND_CUDA, g->name, g->weight_bytes, g->kv_bytes,
                              g->act_bytes, 0, 0, 0, 0, NULL, g->gemv_dim };
    *out = g;
    return FA_OK;
}

/* y [T, out] (row pitch ldy, float32 or bf16) (+)= x [T, in] (bf16, pitch ldx) w [out, in]^T */
static cublasStatus_t gemm(fa_engine_cuda *g, void *y, cudaDataType yt, int ldy, const uint16_t *x, int ldx,
                           const uint16_t *w, int T, int out, int in, float beta)
{
    const float alpha = 1.0f;
    return cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &alpha, w, CUDA_R_16BF, in, x, CUDA_R_16BF,
                        ldx, &beta, y, yt, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* A step's shape and its tables on the device, as its launches read them. */
typedef struct launch {
    int T, B, ns;                /* rows, sequences, sampled rows */
    int max_q, max_k, max_pages; /* the attention call's bounds and the block table's row length */
    fa_paged_plan_t plan;
    const int32_t *tok, *pos, *cu, *len, *rows, *bt; /* [T], [T], [B + 1], [B], [ns], [B, max_pages] */
    const float *temp, *topp, *u;                    /* [ns] */
} launch;

/* The packed host tables: tokens, positions, cu_seqlens, cache lengths, sampled rows, their
 * temperature / topp / uniform (float bits), the block table; their device places in *l.
 * Returns the words written. */
static size_t place_tables(const fa_engine_cuda *g, launch *l)
{
    const int32_t *d = g->d_tab;
    size_t at = 0;
    l->tok = d + at, at += (size_t)l->T;
    l->pos = d + at, at += (size_t)l->T;
    l->cu = d + at, at += (size_t)l->B + 1;
    l->len = d + at, at += (size_t)l->B;
    l->rows = d + at, at += (size_t)l->ns;
    l->temp = (const float *)(d + at), at += (size_t)l->ns;
    l->topp = (const float *)(d + at), at += (size_t)l->ns;
    l->u = (const float *)(d + at), at += (size_t)l->ns;
    l->bt = d + at, at += (size_t)l->B * (size_t)l->max_pages;
    return at;
}

/* The host copy of a device table of l: where the step's values go. */
static int32_t *host_of(const fa_engine_cuda *g, const void *dev)
{
    return g->h_tab + ((const int32_t *)dev - g->d_tab);
}

/* Every launch of a step, queued on the stream: layers, final norm, classifier, sampler. */
static fa_status enqueue(fa_engine_cuda *g, const launch *s, char *err)
{
    const int T = s->T, dim = g->dim, hid = g->hid;
    CUDA_TRY(fa_layers_embed(g->x, g->emb, s->tok, T, dim, g->stream), "the embedding");
    const int few = T <= g->gemv_dim, few_down = T <= g->gemv_hid; /* the fused few-row kernels */
    for (int l = 0; l < g->L; l++) {
        const layer_w *w = &g->lw[l];
        const float *g_att = g->norms + (size_t)l * dim, *g_ffn = g->norms + ((size_t)g->L + l) * dim;
        if (few) {
            CUDA_TRY(fa_gemv_norm_proj(&g->gemv, g->qkv, 0, g->qkv_w, g->x, NULL, g_att, g->eps, w->qkv, T, g->qkv_w,
                                       dim, g->stream),
                     "the attention norm and q, k, v");
        } else {
            CUDA_TRY(fa_layers_rmsnorm(g->xb, g->x, NULL, g_att, T, dim, g->eps, g->stream), "the attention norm");
            BLAS_TRY(gemm(g, g->qkv, CUDA_R_16BF, g->qkv_w, g->xb, dim, w->qkv, T, g->qkv_w, dim, 0.0f), "q, k, v");
        }
        fa_paged_desc a = attention_desc(g, l);
        a.batch = s->B;
        a.total_q = T;
        a.max_seqlen_q = s->max_q;
        a.max_seqlen_k = s->max_k;
        a.cu_seqlens_q = s->cu;
        a.cache_seqlens = s->len;
        a.positions = s->pos;
        a.block_table = s->bt;
        a.max_pages_per_seq = s->max_pages;
        if (fa_paged_run(s->plan, &a) != FA_OK)
            return fa_model_fail(err, FA_ERR_BACKEND, "layer %d paged attention: %s", l,
                                 fa_context_last_error(g->ctx));
        if (few)
            CUDA_TRY(fa_gemv_residual(&g->gemv, g->x, dim, g->att, w->o, T, dim, dim, g->stream),
                     "the attention output");
        else
            BLAS_TRY(gemm(g, g->x, CUDA_R_32F, dim, g->att, dim, w->o, T, dim, dim, 1.0f), "the attention output");
        if (few) {
            CUDA_TRY(fa_gemv_norm_swiglu(&g->gemv, g->hg, g->x, g_ffn, g->eps, w->w13, T, hid, dim, g->stream),
                     "the FFN norm, gate, up and SwiGLU");
        } else {
            CUDA_TRY(fa_layers_rmsnorm(g->xb, g->x, NULL, g_ffn, T, dim, g->eps, g->stream), "the FFN norm");
            BLAS_TRY(gemm(g, g->h13, CUDA_R_16BF, 2 * hid, g->xb, dim, w->w13, T, 2 * hid, dim, 0.0f), "gate, up");
            CUDA_TRY(fa_layers_swiglu(g->hg, g->h13, T, hid, g->stream), "SwiGLU");
        }
        if (few_down) /* its rows are hidden long: the fused kernel may take fewer of them, or none */
            CUDA_TRY(fa_gemv_residual(&g->gemv, g->x, dim, g->hg, w->w2, T, dim, hid, g->stream), "the FFN output");
        else
            BLAS_TRY(gemm(g, g->x, CUDA_R_32F, dim, g->hg, hid, w->w2, T, dim, hid, 1.0f), "the FFN output");
    }
    if (s->ns > 0) {
        const float *g_fin = g->norms + 2 * (size_t)g->L * dim;
        if (s->ns <= g->gemv_dim) {
            CUDA_TRY(fa_gemv_norm_proj(&g->gemv, g->logits, 1, g->V, g->x, s->rows, g_fin, g->eps, g->cls, s->ns,
                                       g->V, dim, g->stream),
                     "the final norm and the classifier");
        } else {
            CUDA_TRY(fa_layers_rmsnorm(g->xb, g->x, s->rows, g_fin, s->ns, dim, g->eps, g->stream), "the final norm");
            BLAS_TRY(gemm(g, g->logits, CUDA_R_32F, g->V, g->xb, dim, g->cls, s->ns, g->V, dim, 0.0f),
                     "the classifier");
        }
        CUDA_TRY(fa_layers_sample(g->d_next, g->wts, g->logits, s->temp, s->topp, s->u, s->ns, g->V, g->stream),
                 "sampling");
    }
    return FA_OK;
}

/* The decode launches of bucket i captured into g->graph[i]. Relaxed mode: the libraries'
 * host-side queries while the launches are recorded (flashattn looks at its pointers'
 * attributes) are no stream work, and this thread does nothing else until the capture ends. */
static fa_status capture(fa_engine_cuda *g, int i, const launch *s, char *err)
{
    CUDA_TRY(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeRelaxed), "starting a graph capture");
    const fa_status st = enqueue(g, s, err);
    cudaGraph_t graph = NULL;
    const cudaError_t e = cudaStreamEndCapture(g->stream, &graph);
    if (st != FA_OK || e != cudaSuccess) {
        if (graph)
            cudaGraphDestroy(graph);
        cudaGetLastError();
        return st != FA_OK ? st
                           : fa_model_fail(err, FA_ERR_BACKEND,
                                           "capturing the decode step of batch %d: %s (no_graphs runs without "
                                           "graphs)",
                                           (int)g->bucket[i], cudaGetErrorString(e));
    }
    const cudaError_t ie = cudaGraphInstantiate(&g->graph[i], graph, 0);
    cudaGraphDestroy(graph);
    if (ie != cudaSuccess) {
        g->graph[i] = NULL;
        return fa_model_fail(err, FA_ERR_BACKEND,
                             "instantiating the decode graph of batch %d: %s (no_graphs runs without graphs)",
                             (int)g->bucket[i], cudaGetErrorString(ie));
    }
    g->captured++;
    return FA_OK;
}

/* The bucket a step of one query row a sequence runs in, or -1 for other steps. */
static int bucket_of(const fa_engine_cuda *g, const fa_step *st)
{
    if (st->max_seqlen_q != 1 || st->total_q != st->batch)
        return -1;
    for (int i = 0; i < g->nbuckets; i++)
        if (g->bucket[i] >= st->batch)
            return i;
    return -1;
}

/* A decode step at bucket i's batch P: the step's B rows, then P - B padding rows on the
 * scratch page; rows [ns, P) of the final norm and the sampler are padding too (argmax of row
 * r, never read). Every table has the bucket's extent and the block table rows of max_pages
 * entries, so the launches depend on i alone. */
static size_t pack_decode(const fa_engine_cuda *g, int i, const fa_step *st, int32_t ns, const int32_t *rows,
                          const float *temperature, const float *topp, const float *u, launch *l)
{
    const int P = g->bucket[i], B = st->batch, M = g->max_pages;
    *l = (launch){ .T = P, .B = P, .ns = P, .max_q = 1, .max_k = g->m->config.seq_len, .max_pages = M,
                   .plan = g->plan_decode };
    const size_t words = place_tables(g, l);
    int32_t *tok = host_of(g, l->tok), *pos = host_of(g, l->pos), *cu = host_of(g, l->cu);
    int32_t *len = host_of(g, l->len), *rw = host_of(g, l->rows), *bt = host_of(g, l->bt);
    float *tp = (float *)host_of(g, l->temp), *pp = (float *)host_of(g, l->topp), *up = (float *)host_of(g, l->u);
    for (int b = 0; b < P; b++) {
        const int real = b < B;
        tok[b] = real ? st->tokens[b] : 0;
        pos[b] = real ? st->positions[b] : 0;
        cu[b] = b;
        len[b] = real ? st->cache_seqlens[b] : 0;
        int32_t *row = bt + (size_t)b * (size_t)M;
        const int32_t have = real ? st->max_pages_per_seq : 0;
        for (int32_t j = 0; j < M; j++) {
            const int32_t page = j < have ? st->block_table[(size_t)b * (size_t)have + (size_t)j] : -1;
            row[j] = page >= 0 ? page : g->scratch_page;
        }
        const int sampled = b < ns;
        rw[b] = sampled ? rows[b] : b;
        tp[b] = sampled ? temperature[b] : 0.0f;
        pp[b] = sampled ? topp[b] : 0.0f;
        up[b] = sampled ? u[b] : 0.0f;
    }
    cu[P] = P;
    return words;
}

/* Any other step: its own extents and the step's block table as it is. */
static size_t pack_step(const fa_engine_cuda *g, const fa_step *st, int32_t ns, const int32_t *rows,
                        const float *temperature, const float *topp, const float *u, launch *l)
{
    const int T = st->total_q, B = st->batch;
    *l = (launch){ .T = T, .B = B, .ns = ns, .max_q = st->max_seqlen_q, .max_k = st->max_seqlen_k,
                   .max_pages = st->max_pages_per_seq, .plan = st->max_seqlen_q == 1 ? g->plan_decode : g->plan };
    const size_t words = place_tables(g, l);
    memcpy(host_of(g, l->tok), st->tokens, 4 * (size_t)T);
    memcpy(host_of(g, l->pos), st->positions, 4 * (size_t)T);
    memcpy(host_of(g, l->cu), st->cu_seqlens_q, 4 * (size_t)(B + 1));
    memcpy(host_of(g, l->len), st->cache_seqlens, 4 * (size_t)B);
    memcpy(host_of(g, l->rows), rows, 4 * (size_t)ns);
    memcpy(host_of(g, l->temp), temperature, 4 * (size_t)ns);
    memcpy(host_of(g, l->topp), topp, 4 * (size_t)ns);
    memcpy(host_of(g, l->u), u, 4 * (size_t)ns);
    memcpy(host_of(g, l->bt), st->block_table, 4 * (size_t)B * (size_t)st->max_pages_per_seq);
    return words;
}

fa_status fa_engine_cuda_step(fa_engine_cuda *g, const fa_step *st, int32_t ns, const int32_t *rows,
                              const float *temperature, const float *topp, const float *u, int32_t *next,
                              float *logits, char *err)
{
    const int i = bucket_of(g, st);
    launch l;
    const size_t words = i >= 0 ? pack_decode(g, i, st, ns, rows, temperature, topp, u, &l)
                                : pack_step(g, st, ns, rows, temperature, topp, u, &l);
    CUDA_TRY(cudaMemcpyAsync(g->d_tab, g->h_tab, 4 * words, cudaMemcpyHostToDevice, g->stream),
             "uploading the step");
    if (i >= 0 && g->graphs && g->graph[i]) {
        CUDA_TRY(cudaGraphLaunch(g->graph[i], g->stream), "replaying the decode graph");
        g->replays++;
    } else {
        fa_status rc = enqueue(g, &l, err);
        /* recorded now, replayed from the next step on; a capture that fails turns graphs off
         * for good (the step has run: it still counts), its reason kept for fa_engine_get_info */
        if (rc == FA_OK && i >= 0 && g->graphs && capture(g, i, &l, g->graphs_off) != FA_OK)
            g->graphs = 0;
        if (rc != FA_OK) {
            cudaStreamSynchronize(g->stream);
            return rc;
        }
    }
    if (ns > 0) {
        CUDA_TRY(cudaMemcpyAsync(g->h_next, g->d_next, 4 * (size_t)ns, cudaMemcpyDeviceToHost, g->stream),
                 "downloading the tokens");
        if (logits)
            CUDA_TRY(cudaMemcpyAsync(logits, g->logits, 4 * (size_t)ns * (size_t)g->V, cudaMemcpyDeviceToHost,
                                     g->stream),
                     "downloading the logits");
    }
    CUDA_TRY(cudaStreamSynchronize(g->stream), "the step");
    memcpy(next, g->h_next, 4 * (size_t)ns);
    return FA_OK;
}

void fa_engine_cuda_graph_counts(const fa_engine_cuda *g, int *on, int32_t *captured, int64_t *replays,
                                 const char **off)
{
    *on = g->graphs;
    *captured = g->captured;
    *replays = g->replays;
    *off = g->graphs_off[0] ? g->graphs_off : NULL;
}
