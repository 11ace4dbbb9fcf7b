/* SPDX-License-Identifier: MIT */
/* The Hopper backwards' block order and dQ order (src/cuda/bwd_order.h) on the CPU, where a
 * mistake would otherwise show only as wrong gradients or a kernel that never ends on a GPU:
 * every block index maps to one (key tile, head, sequence); at every query tile the key tiles'
 * turns are a permutation, in the order the blocks of a group reach the tile; and blocks
 * launched in index order onto as few multiprocessors as a group needs never stall, while
 * one multiprocessor fewer can. Random configurations from a printed seed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "bwd_order.h"

static uint64_t seed;

static uint64_t next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int uniform(uint64_t *s, int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(next(s) % (uint64_t)(hi - lo + 1));
}

/* A launch: the longest sequence's key tiles, kv heads, sequences with their key tiles (nk)
 * and query tiles (nm), and the group size the host chose from a cap. */
enum { MAX_BATCH = 4 };
typedef struct {
    int tiles, heads, batch, gs;
    int nk[MAX_BATCH], nm[MAX_BATCH];
} launch_t;

static launch_t random_launch(uint64_t *s, int max_tiles, int max_nm)
{
    launch_t l;
    memset(&l, 0, sizeof(l));
    l.tiles = uniform(s, 1, max_tiles);
    l.heads = uniform(s, 1, 3);
    l.batch = uniform(s, 1, MAX_BATCH);
    for (int b = 0; b < l.batch; b++) {
        l.nk[b] = b == 0 ? l.tiles : uniform(s, 1, l.tiles);
        l.nm[b] = uniform(s, 1, max_nm);
    }
    fa_cuda_params p;
    memset(&p, 0, sizeof(p));
    p.bwd_sched = 3, p.bwd_group = uniform(s, 1, l.tiles + 2);
    p.max_k = l.tiles * 128, p.max_q = 64, p.win_left = p.win_right = INT64_MAX / 4;
    fa_bwd_schedule(&p, l.tiles);
    assert_int_equal(p.bwd_sched, 2);
    l.gs = p.bwd_group;
    return l;
}

static void test_blocks_once(void **state)
{
    (void)state;
    uint64_t s = seed;
    for (int it = 0; it < 1000; it++) {
        const launch_t l = random_launch(&s, 40, 1);
        const int n = l.tiles * l.heads * l.batch;
        char *seen = calloc((size_t)n, 1);
        assert_non_null(seen);
        for (int x = 0; x < n; x++) {
            int t, h, b;
            fa_bwd_block(x, l.tiles, l.heads, l.batch, 2, l.gs, &t, &h, &b);
            assert_true(t >= 0 && t < l.tiles && h >= 0 && h < l.heads && b >= 0 && b < l.batch);
            const int at = (b * l.heads + h) * l.tiles + t;
            assert_int_equal(seen[at], 0);
            seen[at] = 1;
            /* one group: head-major, the key tiles last first */
            fa_bwd_block(x, l.tiles, l.heads, l.batch, 2, l.tiles, &t, &h, &b);
            assert_int_equal(t, l.tiles - 1 - x % l.tiles);
            assert_int_equal(h, x / l.tiles % l.heads);
            assert_int_equal(b, x / l.tiles / l.heads);
        }
        free(seen);
    }
}

/* Every query tile's turns are 0 .. nk - 1, each once, and within a group they follow the
 * steps at which the blocks reach the tile (ties: the higher place, launched first, first). */
static void test_turns_in_arrival_order(void **state)
{
    (void)state;
    uint64_t s = seed + 1;
    for (int it = 0; it < 1000; it++) {
        const launch_t l = random_launch(&s, 40, 24);
        for (int b = 0; b < l.batch; b++) {
            const int nk = l.nk[b], nm = l.nm[b];
            int *turn_of = malloc(sizeof(int) * (size_t)nk), *arrive = malloc(sizeof(int) * (size_t)nk);
            int *gl = malloc(sizeof(int) * (size_t)nk), *before = malloc(sizeof(int) * (size_t)nk);
            assert_true(turn_of && arrive && gl && before);
            for (int i = 0; i < nm; i++) {
                unsigned char *used = calloc((size_t)nk, 1);
                assert_non_null(used);
                for (int j = 0; j < nk; j++) {
                    int gn;
                    fa_bwd_group(j, l.tiles, nk, l.gs, &gl[j], &gn, &before[j]);
                    assert_true(gl[j] >= 0 && gl[j] < gn && gn <= l.gs);
                    turn_of[j] = fa_bwd_turn(gl[j], gn, before[j], i, nm);
                    assert_true(turn_of[j] >= 0 && turn_of[j] < nk);
                    assert_int_equal(used[turn_of[j]], 0);
                    used[turn_of[j]] = 1;
                    arrive[j] = ((i - fa_bwd_start(gl[j], gn, nm)) % nm + nm) % nm;
                }
                free(used);
                for (int j = 0; j < nk; j++)
                    for (int k = 0; k < nk; k++) {
                        if (before[j] != before[k] || j == k)
                            continue;
                        const int first = arrive[j] < arrive[k] || (arrive[j] == arrive[k] && gl[j] > gl[k]);
                        assert_int_equal(turn_of[j] < turn_of[k], first);
                    }
            }
            free(turn_of), free(arrive), free(gl), free(before);
        }
    }
}

/* Blocks launched in index order onto `slots` multiprocessors, one block each; a resident
 * block adds at its next query tile once the tile's count equals its turn, and leaves after
 * its last. 1 when every block finishes, 0 on a stall. */
static int runs_through(const launch_t *l, int slots)
{
    const int n = l->tiles * l->heads * l->batch;
    int *step = calloc((size_t)n, sizeof(int)), *res = malloc(sizeof(int) * (size_t)slots);
    int *count = calloc((size_t)MAX_BATCH * l->heads * 64, sizeof(int)); /* nm <= 64 */
    assert_true(step && res && count);
    int next_block = 0, resident = 0, done = 0;
    for (;;) {
        while (resident < slots && next_block < n)
            res[resident++] = next_block++;
        int progressed = 0;
        for (int r = 0; r < resident; r++) {
            const int x = res[r];
            int t, h, b, gl, gn, before;
            fa_bwd_block(x, l->tiles, l->heads, l->batch, 2, l->gs, &t, &h, &b);
            const int nk = l->nk[b], nm = l->nm[b];
            if (t < nk && step[x] < nm) {
                fa_bwd_group(t, l->tiles, nk, l->gs, &gl, &gn, &before);
                const int i = (fa_bwd_start(gl, gn, nm) + step[x]) % nm;
                int *c = &count[(b * l->heads + h) * 64 + i];
                if (*c != fa_bwd_turn(gl, gn, before, i, nm))
                    continue;
                (*c)++, step[x]++, progressed = 1;
                if (step[x] < nm)
                    continue;
            }
            res[r--] = res[--resident], done++, progressed = 1; /* finished (or past its sequence) */
        }
        if (done == n || !progressed)
            break;
    }
    free(step), free(res), free(count);
    return done == n;
}

static void test_no_stall_while_a_group_fits(void **state)
{
    (void)state;
    uint64_t s = seed + 2;
    for (int it = 0; it < 1000; it++) {
        const launch_t l = random_launch(&s, it % 10 ? 16 : 70, 32);
        assert_true(runs_through(&l, l.gs));
        assert_true(runs_through(&l, l.gs + 1));
        assert_true(runs_through(&l, 2 * l.gs));
    }
    /* the control: a group of four whose adds wrap needs its four blocks at once */
    launch_t l;
    memset(&l, 0, sizeof(l));
    l.tiles = 4, l.heads = 1, l.batch = 1, l.gs = 4, l.nk[0] = 4, l.nm[0] = 4;
    assert_true(runs_through(&l, 4));
    assert_false(runs_through(&l, 3));
}

/* The host's choice: masked calls, key-tile-major blocks and empty batches first first; more
 * key tiles than a group only when asked (3); groups as even as they go. */
static void test_schedule(void **state)
{
    (void)state;
    fa_cuda_params p;
    memset(&p, 0, sizeof(p));
    const fa_cuda_params base = { .bwd_sched = 2, .bwd_group = 66, .max_k = 4096, .max_q = 4096,
                                  .win_left = 4095, .win_right = 4095 };
    p = base, fa_bwd_schedule(&p, 32);
    assert_int_equal(p.bwd_sched, 2);
    assert_int_equal(p.bwd_group, 32);
    p = base, p.win_right = 0, fa_bwd_schedule(&p, 32); /* causal */
    assert_int_equal(p.bwd_sched, 1);
    p = base, p.win_left = 100, fa_bwd_schedule(&p, 32); /* a window */
    assert_int_equal(p.bwd_sched, 1);
    p = base, p.bwd_order = 1, fa_bwd_schedule(&p, 32);
    assert_int_equal(p.bwd_sched, 1);
    p = base, fa_bwd_schedule(&p, 0);
    assert_int_equal(p.bwd_sched, 1);
    p = base, fa_bwd_schedule(&p, 128); /* one group would not fit */
    assert_int_equal(p.bwd_sched, 1);
    p = base, p.bwd_sched = 3, fa_bwd_schedule(&p, 128);
    assert_int_equal(p.bwd_sched, 2);
    assert_int_equal(p.bwd_group, 64);
    p = base, p.bwd_sched = 3, fa_bwd_schedule(&p, 133);
    assert_int_equal(p.bwd_sched, 2);
    assert_int_equal(p.bwd_group, 45);
    p = base, p.bwd_sched = 1, fa_bwd_schedule(&p, 32);
    assert_int_equal(p.bwd_sched, 1);
}

int main(void)
{
    const char *s = getenv("FLASHATTN_TEST_SEED");
    seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("bwd_order: seed=%llu (replay: FLASHATTN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_once),
        cmocka_unit_test(test_turns_in_arrival_order),
        cmocka_unit_test(test_no_stall_while_a_group_fits),
        cmocka_unit_test(test_schedule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
