/* SPDX-License-Identifier: MIT */
/* The CUDA backend's state and the host helpers its files share. */
#ifndef FA_CUDA_STATE_H
#define FA_CUDA_STATE_H

#include "../core/internal.h"
#include "cuda.h"

typedef struct cuda_state {
    int device;
    struct cudaDeviceProp prop;
    cudaStream_t stream;
    int hopper; /* compute capability 9.0: the sm_90a forward */
    int persistent_blocks; /* the Hopper forward's persistent grid: one block per multiprocessor */
    int pdl;               /* Hopper: the decode kernel and its split combine as programmatic
                            * dependents of the kernels before them */
    int pingpong;          /* Hopper forward: the consumer warpgroups' GEMMs take turns */
    int bwd_order;         /* FLASHATTN_CUDA_BWD_ORDER (params.h: bwd_order) */
    int bwd_tma;           /* FLASHATTN_CUDA_BWD_TMA=1 (params.h: bwd_tma) */
    int bwd_unordered;     /* FLASHATTN_CUDA_BWD_UNORDERED=1 (params.h: bwd_unordered) */
    int bwd_sched;         /* FLASHATTN_CUDA_BWD_SCHED=first 1, =stagger 2, =groups 3, else 0: by
                            * head_dim (params.h: bwd_sched; backend.c) */
    int bwd_group;         /* FLASHATTN_CUDA_BWD_GROUP (params.h: bwd_group), 0 when unset */
    float rescale_slack;   /* the Hopper forward's softmax slack (head_dim <= 128; < 0: off) */
    float rescale_slack_e4m3; /* the fp8 forward's (< 0, off, unless FLASHATTN_CUDA_SLACK_E4M3 sets it) */
    int32_t wide_min_q;       /* FLASHATTN_CUDA_WIDE_MIN_Q, or -1: the wide tiles' own bound */
    int64_t decode_wide_min;  /* fa_cuda_paged.decode_wide_min (FLASHATTN_CUDA_DECODE_WIDE_MIN) */
    cudaMemPool_t pool;    /* the calls' workspace, stream-ordered; keeps POOL_KEEP_BYTES bytes */
    void *tma_encode;      /* Hopper: the driver's tensor-map encoder (tma.c), NULL without one */
} cuda_state;

/* FA_ERR_BACKEND naming the runtime's error and what was being done. */
fa_status fa_cuda_fail(fa_context_t ctx, cudaError_t err, const char *what);

/* ptr is device (or managed) memory of the context's device; else a message naming `name`. */
fa_status fa_cuda_check_ptr(fa_context_t ctx, const cuda_state *s, const void *ptr, const char *name);

/* The most workspace fa_forward's decode route takes for split partials (256 MiB: b32 at 32k
 * keys and 32 heads takes 17 MiB); a call that would need more runs the tiles. */
#define FA_CUDA_DECODE_PARTS_MAX ((size_t)256 << 20)

/* Test builds (FA_CUDA_ORDERING_TEST): FLASHATTN_CUDA_DROP_ORDERING=N[:decode|:forward|
 * :backward] (N = 1, 2 or 4) into k->drop_ordering and k->drop_in (params.h), so that
 * bench/gpu/ordering_check.sh can show the grids failing without each of the Hopper kernels'
 * barrier waits; nothing in other builds. */
#ifdef FA_CUDA_ORDERING_TEST
void fa_cuda_ordering_test(fa_cuda_params *k);
#else
static inline void fa_cuda_ordering_test(fa_cuda_params *k) { (void)k; }
#endif

/* The paged kernels' head_dim instantiation (64, 128, 256) that holds dim. */
int32_t fa_cuda_paged_dpad(int32_t dim);

/* The decode kernel for `packed` rows of one kv head (a sequence's query rows times the group):
 * nq = 1 or 2 for its 8 * nq rows a block, 0 where they need the 64-row tiles. */
int fa_cuda_decode_nq(int64_t packed);

/* Splits of `split` keys from key 0 (grown per sequence where grow is set: fa_cuda_seq_split)
 * covering p's longest sequence (*splits, at least 1) and the bytes of their partials for `rows`
 * packed query rows (*bytes, 0 for one split); 0 when the grid (batch x heads_kv x splits blocks)
 * or the bytes overflow. */
int fa_cuda_split_layout(const fa_problem *p, int64_t rows, int32_t split, int grow, int32_t *splits,
                         size_t *bytes);

/* A dense call on the paged decode kernel (fa_forward's decode route): a's K and V read in place
 * as a cache without a block table, split keys a split (grown per sequence: fa_cuda_seq_split),
 * partials in part (splits > 1); sm90: on the Hopper decode kernel (K and V rows whole 16-byte
 * chunks, fa_cuda_decode_sm90_fits; fixed-length keys by TMA boxes where s has the encoder). */
cudaError_t fa_cuda_dense_decode(const cuda_state *s, const fa_cuda_params *a, int nq, int sm90, int32_t split,
                                 int32_t splits, float *part, int bf16, cudaStream_t stream);

/* Whether the Hopper decode kernel takes head_dim dim (padded to 64 or 128, whole 16-byte rows). */
int fa_cuda_decode_sm90_fits(int32_t dim);

/* TMA (tma.c): the driver's cuTensorMapEncodeTiled, NULL where the driver has none. */
void *fa_cuda_tma_encoder(void);

/* The element kinds of the tensor maps below: f16 and bf16 (the values of a call's bf16 flag),
 * and fp8 e4m3 as bytes. */
#define FA_CUDA_TMA_F16 0
#define FA_CUDA_TMA_BF16 1
#define FA_CUDA_TMA_E4M3 2

/* Tensor maps of k's cache pools (k->pg: [page][token][head][dim], any element strides) for
 * a Hopper kernel's TMA loader with key tiles of `keys` rows: boxes of the tile where pages
 * hold whole tiles, of the page where tiles hold whole pages of 8 or more rows, 128-byte
 * swizzled, 128 bytes of columns, columns past dim and pages past the pool read as zeros. Sets
 * k->pg.tk, tv and tma_rows (and fk, fv and flat_rows where the pages are smaller than the tile
 * and follow one another in memory) and returns 1; 0 (k->pg left as it was: the loader copies
 * rows) where the page size suits no box, there is no encoder or it refuses (pools or strides
 * off 16 bytes). kind: FA_CUDA_TMA_*. dpad > 0 (a loader that takes either layout: the Hopper
 * forward's, its head_dim padded to dpad): where pages are smaller than the tile, maps of the
 * grouped layout (k->pg.grouped) where they encode. */
int fa_cuda_tma_paged(void *encoder, fa_cuda_params *k, int kind, int32_t keys, int32_t dpad);

/* The same for fixed-length dense keys (no cu_seqlens): sequence b is page b of seqlen_k
 * tokens, boxes of `rows` tokens (a tile's rows past seqlen_k read as zeros); also sets the
 * page size. 0 where that cannot be (varlen, no keys, no encoder or a refused map). */
int fa_cuda_tma_dense(void *encoder, fa_cuda_params *k, int kind, int32_t rows);

/* Maps of q and dout for the Hopper backward's loader (fixed length only): query tiles of 64
 * rows, sequence b's rows [batch b][head][row][dim] whatever the strides' order, columns past
 * dim and rows past seqlen_q read as zeros. Sets k->tq, tdo and bwd_tma = 1; 0 (bwd_tma 0: the
 * loader copies rows) for varlen, without an encoder or where it refuses (strides or bases
 * off 16 bytes). */
int fa_cuda_tma_backward(void *encoder, fa_cuda_params *k, int kind);

/* Paged calls (paged_host.c). */
fa_status fa_cuda_paged_plan(fa_context_t ctx, void *state, const fa_problem *p, void **plan,
                             fa_run_info *info);
fa_status fa_cuda_paged_run(fa_context_t ctx, void *state, void *plan, const fa_problem *p,
                            fa_run_info *info);
void fa_cuda_paged_plan_free(void *state, void *plan);
fa_status fa_cuda_append(fa_context_t ctx, void *state, const fa_problem *p);
fa_status fa_cuda_merge(fa_context_t ctx, void *state, const fa_merge_desc *d);

#endif
