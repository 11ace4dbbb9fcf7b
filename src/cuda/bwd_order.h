/* SPDX-License-Identifier: MIT */
/* The Hopper backwards' block order and staggered dQ order in integers, one owner for the
 * kernels' scheduler (backward_sm90_sched.cuh, which says why this order) and for
 * tests/test_bwd_order.c, which checks it on the CPU: every block mapped once, every query
 * tile's turns a permutation in arrival order, no stall while a group's blocks fit. */
#ifndef FA_CUDA_BWD_ORDER_H
#define FA_CUDA_BWD_ORDER_H

#include "params.h"

/* Block index x -> key tile, kv head, sequence. order 1: key-tile major; else head-major in
 * groups of gs key tiles (every head's first group, then every head's second; gs = tiles: one
 * group), the key tiles last first either way. */
static inline FA_CUDA_HD void fa_bwd_block(int64_t x, int tiles, int heads, int batch, int order, int gs,
                                           int *tile, int *h, int *b)
{
    const int64_t hb = (int64_t)heads * batch;
    if (order == 1) {
        *tile = tiles - 1 - (int)(x / hb), *h = (int)(x % hb % heads), *b = (int)(x % hb / heads);
        return;
    }
    const int g = (int)(x / (hb * gs));
    const int n = gs < tiles - g * gs ? gs : tiles - g * gs; /* group g holds n tiles a head */
    const int64_t r = x - hb * gs * g;
    const int i = (int)(r / n);
    *tile = tiles - 1 - g * gs - (int)(r % n), *h = i % heads, *b = i / heads;
}

/* Key tile `tile` of a sequence of nk key tiles, in groups of gs counted from the top of the
 * longest sequence's tiles: its place gl in its group (from the group's lowest tile), the
 * group's size gn in this sequence, and the sequence's tiles in earlier groups. */
static inline FA_CUDA_HD void fa_bwd_group(int tile, int tiles, int nk, int gs, int *gl, int *gn, int *before)
{
    const int top = tiles - 1 - (tiles - 1 - tile) / gs * gs;
    const int hi = nk < top + 1 ? nk : top + 1, lo = top + 1 - gs > 0 ? top + 1 - gs : 0;
    *gl = tile - lo, *gn = hi - lo, *before = nk - hi;
}

/* The staggered order: the tile at gl of a group of gn starts at query tile gl nm / gn (of
 * nm) and wraps around. */
static inline FA_CUDA_HD int fa_bwd_start(int gl, int gn, int nm)
{
    return (int)((int64_t)gl * nm / gn);
}

/* Its turn at query tile i (0: it stores): the earlier groups' tiles, then its group's tiles
 * that started at or below i, nearest first, then the others. */
static inline FA_CUDA_HD int fa_bwd_turn(int gl, int gn, int before, int i, int nm)
{
    int top = (int)(((int64_t)(i + 1) * gn - 1) / nm); /* the last that started at or below i */
    if (top > gn - 1)
        top = gn - 1;
    return before + (gl <= top ? top - gl : top + gn - gl);
}

/* The launch's order (params.h: bwd_sched, bwd_group), from tiles = key tiles of the longest
 * sequence: 2 where no mask cuts a sequence's spans (win_* resolved, causal folded in), in
 * head-major groups of at most p->bwd_group key tiles, as even as they go; one group only
 * unless the launch passed 3. */
static inline void fa_bwd_schedule(fa_cuda_params *p, int tiles)
{
    if (p->bwd_sched >= 2 &&
        (tiles < 1 || p->bwd_order == 1 || p->bwd_group < 1 || p->win_left < p->max_k - 1 ||
         p->win_right < p->max_q - 1 || (p->bwd_sched == 2 && tiles > p->bwd_group)))
        p->bwd_sched = 1;
    if (p->bwd_sched >= 2) {
        const int groups = (tiles + p->bwd_group - 1) / p->bwd_group;
        p->bwd_sched = 2;
        p->bwd_group = (tiles + groups - 1) / groups;
    }
}

#endif
