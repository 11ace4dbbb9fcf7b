/* SPDX-License-Identifier: MIT */
/* TMA tensor maps for the Hopper kernels' loaders (forward, decode, backward). The encoder is
 * the driver's cuTensorMapEncodeTiled, found through the runtime, so the library links no
 * libcuda. */
#include "state.h"

#include <cuda.h>
#include <stdint.h>
#include <string.h>

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

_Static_assert(sizeof(fa_cuda_tmap) == sizeof(CUtensorMap), "fa_cuda_tmap holds a CUtensorMap");

void *fa_cuda_tma_encoder(void)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return fn;
}

/* Rows of a page a box takes for key tiles of `keys` rows (fa_cuda_tma_paged), 0: none. */
static int32_t tma_rows(int32_t page_size, int32_t keys)
{
    if (page_size >= keys)
        return page_size % keys == 0 ? keys : 0;
    return keys % page_size == 0 && page_size % 8 == 0 ? page_size : 0;
}

/* The encoder's element type of a FA_CUDA_TMA_* kind, and its bytes. */
static CUtensorMapDataType tma_type(int kind, cuuint64_t *bytes)
{
    *bytes = kind == FA_CUDA_TMA_E4M3 ? 1 : 2;
    return kind == FA_CUDA_TMA_E4M3   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
           : kind == FA_CUDA_TMA_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

/* *map over the tensor of `rank` extents e (innermost first; element strides st of e[1..]):
 * boxes of extents box, the innermost 128 bytes, 128-byte swizzled. 0 where the encoder
 * refuses. */
static int map_nd(void *encoder, fa_cuda_tmap *map, const void *base, int kind, int rank, const cuuint64_t *e,
                  const int64_t *st, const cuuint32_t *box)
{
    cuuint64_t esz, stride[4];
    const CUtensorMapDataType type = tma_type(kind, &esz);
    const cuuint32_t step[5] = { 1, 1, 1, 1, 1 };
    for (int i = 0; i + 1 < rank; i++)
        stride[i] = (cuuint64_t)st[i] * esz;
    CUtensorMap m;
    memset(&m, 0, sizeof(m));
    const CUresult r = ((encode_tiled_fn)encoder)(&m, type, (cuuint32_t)rank, (void *)base, e, stride, box, step,
                                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return 0;
    memcpy(map, &m, sizeof(m));
    return 1;
}

/* map_nd over 4 dimensions with boxes of `rows` x 128 bytes. */
static int map_4d(void *encoder, fa_cuda_tmap *map, const void *base, int kind, const cuuint64_t e[4],
                  const int64_t st[3], int32_t rows)
{
    cuuint64_t esz;
    tma_type(kind, &esz);
    const cuuint32_t box[4] = { (cuuint32_t)(128 / esz), (cuuint32_t)rows, 1, 1 };
    return map_nd(encoder, map, base, kind, 4, e, st, box);
}

/* *map for a pool of rows ([page][token][head][dim] with any element strides, head_dim dim
 * contiguous): boxes of `rows` tokens x 128 bytes. 0 where the encoder refuses. */
static int pool_map(void *encoder, fa_cuda_tmap *map, const void *pool, int kind, int32_t dim, int32_t page_size,
                    int32_t heads, int32_t pages, int64_t stride_page, int64_t stride_token, int64_t stride_head,
                    int32_t rows)
{
    if (!encoder || pages < 1 || heads < 1 || stride_page <= 0 || stride_token <= 0 || stride_head <= 0)
        return 0;
    /* [page][token][head][dim] whatever the strides' order: innermost dim first */
    const cuuint64_t extent[4] = { (cuuint64_t)dim, (cuuint64_t)page_size, (cuuint64_t)heads, (cuuint64_t)pages };
    const int64_t stride[3] = { stride_token, stride_head, stride_page };
    return map_4d(encoder, map, pool, kind, extent, stride, rows);
}

/* k's K and V maps over pages of `size` tokens, `num` of them, with those page and token
 * strides (elements; the heads' from the views); set with tma_rows = rows where both encode. */
static int pool_maps(void *encoder, fa_cuda_params *k, int kind, int32_t size, int32_t num, int64_t k_sp,
                     int64_t k_st, int64_t v_sp, int64_t v_st, int32_t rows)
{
    fa_cuda_tmap tk, tv;
    if (!rows || !pool_map(encoder, &tk, k->k.p, kind, k->dim, size, k->heads_kv, num, k_sp, k_st, k->k.sh, rows) ||
        !pool_map(encoder, &tv, k->v.p, kind, k->dim, size, k->heads_kv, num, v_sp, v_st, k->v.sh, rows))
        return 0;
    k->pg.tk = tk;
    k->pg.tv = tv;
    k->pg.tma_rows = rows;
    return 1;
}

/* *map over a pool as rows [1][head][page * size + token][dim] (element strides per token and
 * per head; the outer dimension of one keeps the kernel's copies 4-D, as pool_map's): boxes of
 * `rows` rows x 128 bytes. 0 where the encoder refuses. */
static int flat_map(void *encoder, fa_cuda_tmap *map, const void *pool, int kind, int32_t dim, int64_t pool_rows,
                    int32_t heads, int64_t stride_token, int64_t stride_head, int32_t rows)
{
    const cuuint64_t extent[4] = { (cuuint64_t)dim, (cuuint64_t)pool_rows, (cuuint64_t)heads, 1 };
    const int64_t stride[3] = { stride_token, stride_head, stride_token };
    return map_4d(encoder, map, pool, kind, extent, stride, rows);
}

/* The grouped maps of one pool (fa_cuda_pages.grouped; head rows of dim = 64 x cb elements,
 * heads one after the other, so that column block j of head h is block h x cb + j of the
 * token's row): *map over pages of `size` tokens (boxes of a page's `rows` rows), *flat over
 * its rows page x size + token where pages follow one another in memory (flat NULL: none;
 * boxes of keys / cb rows, a run of `keys` rows in cb boxes). A box is its rows' groups of 8 x
 * every column block, landing as [row group][column block][8 rows][128 bytes]. 0 where the
 * encoder refuses either. */
static int grouped_maps(void *encoder, fa_cuda_tmap *map, fa_cuda_tmap *flat, const void *pool, int kind, int32_t cb,
                        int32_t heads, int32_t size, int32_t pages, int64_t sp, int64_t st, int32_t rows, int32_t keys)
{
    const int64_t stride[4] = { st, 64, 8 * st, sp };
    const cuuint64_t e[5] = { 64, 8, (cuuint64_t)heads * cb, (cuuint64_t)size / 8, (cuuint64_t)pages };
    const cuuint32_t box[5] = { 64, 8, (cuuint32_t)cb, (cuuint32_t)rows / 8, 1 };
    if (!map_nd(encoder, map, pool, kind, 5, e, stride, box))
        return 0;
    if (!flat)
        return 1;
    /* the outer dimension of one keeps the kernel's copies 5-D, as map's */
    const cuuint64_t ef[5] = { 64, 8, (cuuint64_t)heads * cb, (cuuint64_t)pages * size / 8, 1 };
    const cuuint32_t boxf[5] = { 64, 8, (cuuint32_t)cb, (cuuint32_t)(keys / 8 / cb), 1 };
    return map_nd(encoder, flat, pool, kind, 5, ef, stride, boxf);
}

int fa_cuda_tma_paged(void *encoder, fa_cuda_params *k, int kind, int32_t keys, int32_t dpad)
{
    fa_cuda_pages *g = &k->pg;
    g->flat_rows = 0;
    g->grouped = 0;
    const int32_t rows = tma_rows(g->size, keys);
    if (!pool_maps(encoder, k, kind, g->size, g->num, g->k_sp, g->k_st, g->v_sp, g->v_st, rows))
        return 0;
    /* a tile's rows past the pool read as zeros, as its pages past the pool do, and a run's
     * first row plus the tile stays an int32 coordinate */
    const int64_t pool_rows = (int64_t)g->num * g->size;
    const int flat = rows < keys && g->k_sp == g->size * g->k_st && g->v_sp == g->size * g->v_st &&
                     pool_rows + keys <= INT32_MAX;
    /* pages smaller than the tile, whole 16-bit head rows of two column blocks or more, heads
     * packed (or one kv head): a box a page (or a run) instead of one a page and column block */
    const int32_t cb = dpad / 64;
    const int packed = k->heads_kv == 1 || (k->k.sh == dpad && k->v.sh == dpad);
    fa_cuda_tmap tk, tv, fk, fv;
    if (rows < keys && kind != FA_CUDA_TMA_E4M3 && cb >= 2 && k->dim == dpad && packed &&
        grouped_maps(encoder, &tk, flat ? &fk : NULL, k->k.p, kind, cb, k->heads_kv, g->size, g->num, g->k_sp,
                     g->k_st, rows, keys) &&
        grouped_maps(encoder, &tv, flat ? &fv : NULL, k->v.p, kind, cb, k->heads_kv, g->size, g->num, g->v_sp,
                     g->v_st, rows, keys)) {
        g->tk = tk;
        g->tv = tv;
        g->grouped = 1;
    } else if (!flat || !flat_map(encoder, &fk, k->k.p, kind, k->dim, pool_rows, k->heads_kv, g->k_st, k->k.sh, keys) ||
               !flat_map(encoder, &fv, k->v.p, kind, k->dim, pool_rows, k->heads_kv, g->v_st, k->v.sh, keys))
        return 1;
    if (flat) {
        g->fk = fk;
        g->fv = fv;
        g->flat_rows = keys;
    }
    return 1;
}

int fa_cuda_tma_backward(void *encoder, fa_cuda_params *k, int kind)
{
    k->bwd_tma = 0;
    if (!encoder || k->cu_q || k->seqlen_q <= 0 || k->batch < 1 || k->heads_q < 1)
        return 0;
    const cuuint64_t extent[4] = { (cuuint64_t)k->dim, (cuuint64_t)k->seqlen_q, (cuuint64_t)k->heads_q,
                                   (cuuint64_t)k->batch };
    /* one sequence: its batch stride is never stepped (any view's sb will do, 0 included) */
    const int one = k->batch == 1;
    const int64_t sq[3] = { k->q.ss, k->q.sh, one ? k->q.ss : k->q.sb },
                  sd[3] = { k->dout.ss, k->dout.sh, one ? k->dout.ss : k->dout.sb };
    for (int i = 0; i < 3; i++)
        if (sq[i] <= 0 || sd[i] <= 0)
            return 0;
    fa_cuda_tmap tq, tdo;
    if (!map_4d(encoder, &tq, k->q.p, kind, extent, sq, 64) ||
        !map_4d(encoder, &tdo, k->dout.p, kind, extent, sd, 64))
        return 0;
    k->tq = tq;
    k->tdo = tdo;
    k->bwd_tma = 1;
    return 1;
}

int fa_cuda_tma_dense(void *encoder, fa_cuda_params *k, int kind, int32_t rows)
{
    if (k->cu_q || k->cu_k || k->seqlen_k <= 0 ||
        !pool_maps(encoder, k, kind, k->seqlen_k, k->batch, k->k.sb, k->k.ss, k->v.sb, k->v.ss, rows))
        return 0;
    k->pg.flat_rows = 0;
    k->pg.grouped = 0;
    k->pg.size = k->seqlen_k; /* a key's slot in its "page" is the key */
    k->pg.shift = -1;
    return 1;
}
