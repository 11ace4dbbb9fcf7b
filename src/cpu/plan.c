/* SPDX-License-Identifier: MIT */
/*
 * The CPU planner: tile sizes from the cache sizes read at run time, the
 * shape, and the kernel's register block. Measurements behind the choices
 * are in docs/perf/cpu.md.
 */
#include "cpu.h"

#include <stdlib.h>

/* Keys per split of a paged decode by default: 8 splits of a 4k sequence share out two to
 * eight cores, and the merge reads (dim + 2) floats per head and split, under 1% of the keys. */
#define FA_CPU_PAGED_SPLIT 512

static int32_t round_up(int32_t x, int32_t m) { return (x + m - 1) / m * m; }

/* A positive integer from the environment (tuning knob), or 0. */
static int32_t env_int(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return 0;
    char *end;
    long v = strtol(s, &end, 10);
    return (*end == '\0' && v > 0 && v <= 1 << 20) ? (int32_t)v : 0;
}

/* Bytes one thread touches per key tile: Q^T, K, V, S^T, O. */
static int64_t tile_bytes(int32_t cols, int32_t bk, int32_t dim, int32_t dpad)
{
    return 4 * ((int64_t)cols * dim + (int64_t)bk * dim + (int64_t)bk * dpad + (int64_t)bk * cols +
                (int64_t)cols * dpad);
}

/* Tasks of a call with pos query positions each; for paged calls, whose lengths a plan does
 * not read, a bound from the call's bounds. */
static int64_t count_tasks(const fa_problem *p, int32_t pos)
{
    int64_t n = 0;
    if (p->paged) {
        int64_t per_seq = (int64_t)p->batch * (((int64_t)p->max_q + pos - 1) / pos);
        int64_t packed = ((int64_t)p->desc->seqlen_q + pos - 1) / pos + p->batch;
        return (per_seq < packed ? per_seq : packed) * p->heads_kv;
    }
    for (int32_t b = 0; b < p->batch; b++)
        n += ((int64_t)fa_problem_seq(p, b).q_len + pos - 1) / pos;
    return n * p->heads_kv;
}

/* Shared by every algorithm: how query rows are grouped into tasks. */
void fa_cpu_plan_columns(const fa_cpu_state *s, const fa_problem *p, fa_cpu_plan *pl)
{
    const int32_t nr = s->kern->nr, dim = p->dim;
    const int32_t dpad = round_up(dim, nr);
    const int64_t budget = s->mach.l2_bytes / 2;

    /* Columns per task: the widest of 128/96/64/32 whose tiles fit half of L2
     * with a 128-key tile (measured best on Zen 4, docs/perf/cpu.md). */
    int32_t cols = env_int("FLASHATTN_CPU_BLOCK_Q");
    if (!cols) {
        static const int32_t cand[] = { 128, 96, 64, 32 };
        cols = 32;
        for (size_t i = 0; i < sizeof(cand) / sizeof(cand[0]); i++)
            if (tile_bytes(cand[i], 128, dim, dpad) <= budget) {
                cols = cand[i];
                break;
            }
    }
    /* Tiles that straddle a causal/window edge compute masked scores too: keep the
     * block under 1/16 of the queries so that waste stays small (512-token causal:
     * 32 columns ran 150 GFLOP/s against 128 at 128 columns; docs/perf/cpu.md). */
    int banded = p->win_right < p->max_k || p->win_left < p->max_k;
    if (banded && !env_int("FLASHATTN_CPU_BLOCK_Q")) {
        int32_t cap = round_up(p->max_q / 16, nr / 2);
        if (cap < nr)
            cap = nr;
        if (cols > cap)
            cols = cap;
    }
    int32_t pos = cols / p->group;
    if (pos < 1)
        pos = 1;
    if (pos > p->max_q)
        pos = p->max_q > 0 ? p->max_q : 1;
    /* Key tile for the flash path, from the block width before any split for
     * threads below: tile boundaries set the rounding, and must not depend on
     * the thread count. */
    int32_t bk = env_int("FLASHATTN_CPU_BLOCK_K");
    if (!bk) {
        bk = 128;
        while (bk > 32 && tile_bytes(round_up(pos * p->group, nr), bk, dim, dpad) > budget)
            bk /= 2;
    }
    pl->block_k = bk < p->max_k || p->max_k == 0 ? bk : p->max_k;
    /* Decode: every query row of a sequence in one task (the split-KV path
     * takes whole sequences), and at most half a register block of them. Its kernels read K
     * and V in place in 16- and 32-bit dtypes; fp8 keys take the tiles, which widen as they
     * load. */
    pl->use_dot = pos >= p->max_q && pos * p->group * 2 <= nr && p->in_dtype != FA_DTYPE_E4M3;
    /* Enough tasks for every thread to stay busy: at least 3 per thread. This
     * only regroups rows; each row's arithmetic is the same either way. */
    while (!pl->use_dot && pos > 1 && pos * p->group > nr &&
           count_tasks(p, pos) < 3 * (int64_t)s->threads)
        pos = (pos + 1) / 2;

    pl->pos_per_task = pos;
    pl->cols = pos * p->group;
    pl->cols_pad = round_up(pl->cols, nr);
    pl->cols_vec = round_up(pl->cols, nr / 2);
    pl->dim_pad = dpad;
    pl->task_count = count_tasks(p, pos);
    pl->threads = s->threads;
    if (pl->task_count < pl->threads)
        pl->threads = (int)(pl->task_count > 0 ? pl->task_count : 1);
}

/* Decode: a task is (sequence, chunk of keys, group of kv heads). Heads that
 * share each key's row in memory ([seq, heads, dim], stride_head <
 * stride_seq) are taken together so that row is read in one sweep; head-major
 * caches go one head per task. Chunk sizes are a function of the shape only
 * (never of the thread count), so the merge order, and so the bits, are
 * always the same: about 64 tasks per call, no chunk under 256 keys. */
static fa_status plan_decode(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                             fa_cpu_plan *pl)
{
    const fa_attention_desc *d = p->desc;
    int interleaved = d->k.stride_head < d->k.stride_seq && d->v.stride_head < d->v.stride_seq;
    pl->decode_heads = interleaved ? p->heads_kv : 1;
    int64_t groups = p->heads_kv / pl->decode_heads;
    int32_t chunk = env_int("FLASHATTN_CPU_BLOCK_K");
    if (p->paged) /* a sequence's chunks from its own length only: the same bits in any batch */
        chunk = p->paged->desc->kv_split ? p->paged->desc->kv_split : FA_CPU_PAGED_SPLIT;
    if (!chunk) {
        int64_t streams = (int64_t)p->batch * groups;
        int64_t per = streams >= 64 ? 1 : (64 + streams - 1) / streams;
        const int64_t keys = ((p->max_k + per - 1) / per + 63) / 64 * 64; /* int64: max_k may be 2^31 - 1 */
        chunk = keys < 256 ? 256 : keys > INT32_MAX ? INT32_MAX / 64 * 64 : (int32_t)keys;
    }
    pl->block_k = chunk;
    int64_t nslots = 0; /* paged: a bound, every sequence at its longest */
    for (int32_t b = 0; b < p->batch; b++) {
        int64_t lo, hi;
        nslots += p->paged ? ((int64_t)p->max_k + chunk - 1) / chunk + 1 : fa_cpu_decode_chunks(p, pl, b, &lo, &hi);
    }
    pl->task_count = nslots * groups;
    if (pl->threads > pl->task_count)
        pl->threads = (int)pl->task_count;
    /* Tens of microseconds of work do not pay for waking threads (a small model's decode
     * step ran 3x slower on two threads than on one): one thread below 2^17 multiply-adds
     * per product. The bits do not depend on the thread count. */
    int64_t work;
    if (fa_mul_ok((int64_t)p->batch * p->heads_q, p->max_k, &work) && fa_mul_ok(work, p->dim, &work) &&
        work < ((int64_t)1 << 17))
        pl->threads = 1;
    pl->per_thread_floats = fa_cpu_decode_thread_floats(s->kern, p, pl);
    int64_t bytes;
    if (!fa_mul_ok(nslots, fa_cpu_decode_slot_floats(p, pl), &bytes) || !fa_mul_ok(bytes, 4, &bytes))
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW, "decode workspace for this shape overflows");
    pl->workspace_bytes = (uint64_t)bytes +
                          (uint64_t)pl->threads * (uint64_t)pl->per_thread_floats * 4u +
                          (uint64_t)(nslots + p->batch + 1) * 12u;
    return FA_OK;
}

fa_status fa_cpu_plan_flash(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                            fa_cpu_plan *pl)
{
    fa_cpu_plan_columns(s, p, pl);
    if (pl->use_dot)
        return plan_decode(ctx, s, p, pl);
    pl->per_thread_floats = fa_cpu_flash_thread_floats(p, pl);
    pl->workspace_bytes = (uint64_t)pl->threads * (uint64_t)pl->per_thread_floats * 4u +
                          (uint64_t)pl->task_count * sizeof(fa_cpu_task);
    return FA_OK;
}

fa_status fa_cpu_plan_standard(fa_context_t ctx, const fa_cpu_state *s, const fa_problem *p,
                               fa_cpu_plan *pl)
{
    fa_cpu_plan_columns(s, p, pl);
    pl->block_k = p->max_k;
    pl->per_thread_floats = fa_cpu_standard_thread_floats(p, pl);
    int64_t scores = fa_cpu_standard_scores(p, pl), bytes;
    if (scores < 0 || !fa_mul_ok(scores, 4, &bytes) || (uint64_t)bytes > SIZE_MAX / 2)
        return fa_error(ctx, FA_ERR_SIZE_OVERFLOW,
                        "standard attention's score matrix for this shape does not fit in memory "
                        "addressing; use the flash algorithm");
    pl->workspace_bytes = (uint64_t)bytes +
                          (uint64_t)pl->threads * (uint64_t)pl->per_thread_floats * 4u +
                          (uint64_t)pl->task_count * (sizeof(fa_cpu_task) + sizeof(int64_t));
    return FA_OK;
}
