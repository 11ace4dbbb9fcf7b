/* SPDX-License-Identifier: MIT */
/* Continuous batching: the page allocator and the step scheduler (scheduler.h has the policy). */
#include "scheduler.h"

#include "fail.h"

#include <stdlib.h>
#include <string.h>

typedef struct req {
    int64_t id; /* -1: a free slot */
    fa_request_state state;
    int32_t prompt_len, generated, max_new;
    int32_t *tokens; /* prompt_len + max_new */
    int32_t cached;  /* tokens whose K/V the cache holds */
    int32_t *pages;  /* page ids, npages of them (room for the request's whole context) */
    int32_t npages;
    int32_t preemptions;
    int32_t rows; /* query rows in the pending step (0: not in it) */
} req;

struct fa_sched {
    fa_sched_options o;
    int32_t bt_row; /* pages of the longest context */
    req *reqs;      /* max_requests slots */
    int32_t *free_slots, nfree_slots;
    /* request id -> slot: open addressing over 2x max_requests or more entries (a power of 2),
     * key -1 empty; held requests are found in constant time however many there are */
    int64_t *hkey;
    int32_t *hslot, hmask;
    int32_t nfinished; /* held requests in FA_REQUEST_FINISHED */
    int32_t *free_pages, nfree;
    int32_t *waitq, whead, nwait; /* a ring of max_requests slots, its front at whead */
    int32_t *run, nrun;    /* slots in admission order */
    int64_t next_id, steps, preemptions;
    int32_t pending; /* a step awaits its commit */
    /* the step's arrays */
    int64_t *ids;
    int32_t *cu, *lens, *bt, *tokens, *positions, *seq_slot;
    int32_t *order; /* the running slots as a pass over them began (preemptions edit run) */
    uint8_t *sample;
    fa_step step;
};

static int32_t known(const req *r) { return r->prompt_len + r->generated; }

/* The waiting queue's i-th slot from the front, and its ends. */
static int32_t *wait_at(const fa_sched *s, int32_t i) { return &s->waitq[(s->whead + i) % s->o.max_requests]; }
static void wait_push_back(fa_sched *s, int32_t slot) { *wait_at(s, s->nwait++) = slot; }
static void wait_push_front(fa_sched *s, int32_t slot)
{
    s->whead = (s->whead + s->o.max_requests - 1) % s->o.max_requests;
    s->waitq[s->whead] = slot;
    s->nwait++;
}
static void wait_pop_front(fa_sched *s)
{
    s->whead = (s->whead + 1) % s->o.max_requests;
    s->nwait--;
}
/* slot out of the queue wherever it is (a waiting request finished early): the ring's two runs
 * (up to its end, then from its start) searched and closed up with memmove */
static void wait_remove(fa_sched *s, int32_t slot)
{
    const int32_t cap = s->o.max_requests, n1 = cap - s->whead < s->nwait ? cap - s->whead : s->nwait;
    const int32_t n2 = s->nwait - n1;
    int32_t *a = s->waitq + s->whead, *b = s->waitq, i = 0, j = 0;
    while (i < n1 && a[i] != slot)
        i++;
    if (i < n1) {
        memmove(a + i, a + i + 1, sizeof(int32_t) * (size_t)(n1 - i - 1));
        if (n2 > 0) {
            a[n1 - 1] = b[0];
            memmove(b, b + 1, sizeof(int32_t) * (size_t)(n2 - 1));
        }
    } else {
        while (j < n2 && b[j] != slot)
            j++;
        if (j == n2)
            return;
        memmove(b + j, b + j + 1, sizeof(int32_t) * (size_t)(n2 - j - 1));
    }
    s->nwait--;
}

/* The id table: where id's probe starts (Fibonacci hashing), its entry or the empty one where
 * it would go, and its removal. */
static int32_t id_home(const fa_sched *s, int64_t id)
{
    return (int32_t)((uint64_t)id * 0x9E3779B97F4A7C15ull >> 40) & s->hmask;
}
static int32_t id_entry(const fa_sched *s, int64_t id)
{
    int32_t e = id_home(s, id);
    while (s->hkey[e] >= 0 && s->hkey[e] != id)
        e = (e + 1) & s->hmask;
    return e;
}
static void id_forget(fa_sched *s, int64_t id)
{
    int32_t e = id_entry(s, id);
    s->hkey[e] = -1;
    /* later entries of the probe run move up into the hole where their home allows */
    for (int32_t j = (e + 1) & s->hmask; s->hkey[j] >= 0; j = (j + 1) & s->hmask) {
        const int32_t home = id_home(s, s->hkey[j]);
        if (((j - home) & s->hmask) >= ((j - e) & s->hmask)) {
            s->hkey[e] = s->hkey[j], s->hslot[e] = s->hslot[j];
            s->hkey[j] = -1;
            e = j;
        }
    }
}
static int32_t pages_for(const fa_sched *s, int64_t tokens) { return (int32_t)((tokens + s->o.page_size - 1) / s->o.page_size); }

fa_status fa_sched_create(const fa_sched_options *o, fa_sched **out, char *err)
{
    if (!o || !out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", o ? "out" : "options");
    *out = NULL;
    const struct {
        const char *name;
        int32_t v, lo, hi;
    } f[] = { { "num_pages", o->num_pages, 1, INT32_MAX },
              { "page_size", o->page_size, 1, 1 << 20 },
              { "token_budget", o->token_budget, 1, 1 << 24 },
              { "max_batch", o->max_batch, 1, o->token_budget },
              { "max_context", o->max_context, 1, 1 << 30 },
              { "max_requests", o->max_requests, 1, 1 << 20 } };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        if (f[i].v < f[i].lo || f[i].v > f[i].hi)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "%s (%d) must be in %d..%d%s", f[i].name, (int)f[i].v,
                                 (int)f[i].lo, (int)f[i].hi,
                                 i == 3 ? " (token_budget: every running decode fits a step)" : "");
    fa_sched *s = calloc(1, sizeof(*s));
    if (!s)
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the scheduler");
    s->o = *o;
    s->bt_row = pages_for(s, o->max_context);
    if ((int64_t)s->bt_row * o->max_batch > ((int64_t)1 << 26)) {
        const int32_t row = s->bt_row;
        free(s);
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "max_context (%d) / page_size (%d) = %d pages a sequence times max_batch (%d) makes a "
                             "block table of more than 2^26 entries: use larger pages or a smaller batch",
                             (int)o->max_context, (int)o->page_size, (int)row, (int)o->max_batch);
    }
    const size_t nb = (size_t)o->max_batch, nq = (size_t)o->token_budget, nr = (size_t)o->max_requests;
    s->reqs = calloc(nr, sizeof(req));
    s->free_slots = malloc(sizeof(int32_t) * nr);
    int32_t entries = 1;
    while (entries < 2 * o->max_requests)
        entries *= 2;
    s->hmask = entries - 1;
    s->hkey = malloc(sizeof(int64_t) * (size_t)entries);
    s->hslot = malloc(sizeof(int32_t) * (size_t)entries);
    s->free_pages = malloc(sizeof(int32_t) * (size_t)o->num_pages);
    s->waitq = malloc(sizeof(int32_t) * nr);
    s->run = malloc(sizeof(int32_t) * nr);
    s->ids = malloc(sizeof(int64_t) * nb);
    s->cu = malloc(sizeof(int32_t) * (nb + 1));
    s->lens = malloc(sizeof(int32_t) * nb);
    s->bt = malloc(sizeof(int32_t) * nb * (size_t)s->bt_row);
    s->tokens = malloc(sizeof(int32_t) * nq);
    s->positions = malloc(sizeof(int32_t) * nq);
    s->seq_slot = malloc(sizeof(int32_t) * nb);
    s->order = malloc(sizeof(int32_t) * nr);
    s->sample = malloc(nb);
    if (!s->reqs || !s->free_slots || !s->hkey || !s->hslot || !s->free_pages || !s->waitq || !s->run || !s->ids ||
        !s->cu || !s->lens || !s->bt || !s->tokens || !s->positions || !s->seq_slot || !s->order || !s->sample) {
        fa_sched_free(s);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the scheduler's tables");
    }
    for (size_t i = 0; i < nr; i++) {
        s->reqs[i].id = -1;
        s->free_slots[i] = (int32_t)(nr - 1 - i); /* slot 0 first */
    }
    s->nfree_slots = (int32_t)nr;
    for (int32_t e = 0; e < entries; e++)
        s->hkey[e] = -1;
    /* page 0 handed out first */
    for (int32_t i = 0; i < o->num_pages; i++)
        s->free_pages[i] = o->num_pages - 1 - i;
    s->nfree = o->num_pages;
    *out = s;
    return FA_OK;
}

void fa_sched_free(fa_sched *s)
{
    if (!s)
        return;
    for (int32_t i = 0; s->reqs && i < s->o.max_requests; i++) {
        free(s->reqs[i].tokens);
        free(s->reqs[i].pages);
    }
    free(s->reqs), free(s->free_slots), free(s->hkey), free(s->hslot), free(s->free_pages), free(s->waitq);
    free(s->run), free(s->ids), free(s->cu), free(s->lens), free(s->bt), free(s->tokens), free(s->positions);
    free(s->seq_slot), free(s->order), free(s->sample);
    free(s);
}

fa_status fa_sched_add(fa_sched *s, const int32_t *tokens, int32_t n, int32_t max_new, int64_t *id, char *err)
{
    if (!s || !id)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", s ? "id" : "the scheduler");
    if (!tokens && n > 0)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "tokens must not be NULL");
    if (n < 1)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "the prompt has %d tokens: a request needs at least one (BOS)", (int)n);
    if (max_new < 1)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "max_new (%d) must be at least 1", (int)max_new);
    const int64_t held = (int64_t)n + max_new - 1; /* the last token is sampled, never cached */
    if (held > s->o.max_context)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "the prompt (%d tokens) plus max_new (%d) less one exceeds the context of %d tokens",
                             (int)n, (int)max_new, (int)s->o.max_context);
    if (pages_for(s, held) > s->o.num_pages)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "the prompt (%d tokens) plus max_new (%d) less one needs %d pages of %d tokens; the "
                             "cache has %d",
                             (int)n, (int)max_new, (int)pages_for(s, held), (int)s->o.page_size,
                             (int)s->o.num_pages);
    if (s->nfree_slots == 0)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE,
                             "the scheduler holds max_requests (%d) requests: release finished ones",
                             (int)s->o.max_requests);
    int32_t *t = malloc(sizeof(int32_t) * ((size_t)n + (size_t)max_new));
    int32_t *p = malloc(sizeof(int32_t) * (size_t)pages_for(s, held > 0 ? held : 1));
    if (!t || !p) {
        free(t), free(p);
        return fa_model_fail(err, FA_ERR_OUT_OF_MEMORY, "out of memory adding a request of %d tokens", (int)n);
    }
    memcpy(t, tokens, sizeof(int32_t) * (size_t)n);
    const int32_t slot = s->free_slots[--s->nfree_slots];
    req *r = &s->reqs[slot];
    const int32_t e = id_entry(s, s->next_id);
    s->hkey[e] = s->next_id, s->hslot[e] = slot;
    *r = (req){ .id = s->next_id++, .state = FA_REQUEST_WAITING, .prompt_len = n, .max_new = max_new,
                .tokens = t, .pages = p };
    wait_push_back(s, slot);
    *id = r->id;
    return FA_OK;
}

static void free_pages_of(fa_sched *s, req *r)
{
    while (r->npages > 0)
        s->free_pages[s->nfree++] = r->pages[--r->npages];
    r->cached = 0;
}

static void remove_slot(int32_t *list, int32_t *n, int32_t slot)
{
    for (int32_t i = 0; i < *n; i++)
        if (list[i] == slot) {
            memmove(list + i, list + i + 1, sizeof(int32_t) * (size_t)(*n - i - 1));
            (*n)--;
            return;
        }
}

/* Request slot back to the front of the queue, its pages freed (recomputed when it runs again). */
static void preempt(fa_sched *s, int32_t slot)
{
    req *r = &s->reqs[slot];
    free_pages_of(s, r);
    r->state = FA_REQUEST_WAITING;
    r->preemptions++;
    remove_slot(s->run, &s->nrun, slot);
    wait_push_front(s, slot);
    s->preemptions++;
    s->step.preempted++;
}

/* The most recently admitted running request not in the step and not `except`, or -1. */
static int32_t victim(const fa_sched *s, int32_t except)
{
    for (int32_t i = s->nrun - 1; i >= 0; i--)
        if (s->run[i] != except && s->reqs[s->run[i]].rows == 0)
            return s->run[i];
    return -1;
}

/* Pages for r's tokens up to `upto` from the free list; the count it could get. */
static void grow(fa_sched *s, req *r, int64_t upto)
{
    const int32_t want = pages_for(s, upto);
    while (r->npages < want && s->nfree > 0)
        r->pages[r->npages++] = s->free_pages[--s->nfree];
}

/* r (slot) joins the step with `rows` rows from its cached length. */
static void schedule(fa_sched *s, int32_t slot, int32_t rows)
{
    req *r = &s->reqs[slot];
    fa_step *st = &s->step;
    const int32_t b = st->batch++, q0 = st->total_q;
    r->rows = rows;
    s->seq_slot[b] = slot;
    s->ids[b] = r->id;
    s->lens[b] = r->cached;
    s->cu[b + 1] = q0 + rows;
    for (int32_t i = 0; i < rows; i++) {
        s->tokens[q0 + i] = r->tokens[r->cached + i];
        s->positions[q0 + i] = r->cached + i;
    }
    for (int32_t i = 0; i < s->bt_row; i++)
        s->bt[(int64_t)b * s->bt_row + i] = i < r->npages ? r->pages[i] : -1;
    s->sample[b] = r->cached + rows == known(r);
    st->total_q += rows;
    st->max_seqlen_q = rows > st->max_seqlen_q ? rows : st->max_seqlen_q;
    const int32_t keys = r->cached + rows;
    st->max_seqlen_k = keys > st->max_seqlen_k ? keys : st->max_seqlen_k;
}

/* Up to `rows` of r's pending tokens, fewer where pages run out: taken from later requests
 * when `must` (a decode, or nothing else could run). Returns the rows it gets. */
static int32_t fit(fa_sched *s, int32_t slot, int32_t rows, int must)
{
    req *r = &s->reqs[slot];
    for (;;) {
        grow(s, r, (int64_t)r->cached + rows);
        const int32_t room = r->npages * s->o.page_size - r->cached;
        if (room >= rows || (!must && room > 0))
            return room < rows ? room : rows;
        const int32_t v = victim(s, slot);
        if (v < 0)
            return room > 0 ? room : 0;
        preempt(s, v);
    }
}

fa_status fa_sched_step(fa_sched *s, fa_step *out, char *err)
{
    if (!s || !out)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", s ? "out" : "the scheduler");
    if (s->pending)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "the previous step is not committed (fa_sched_commit)");
    fa_step *st = &s->step;
    memset(st, 0, sizeof(*st));
    s->cu[0] = 0;
    int32_t budget = s->o.token_budget, n = s->nrun;
    /* decodes first: one row each, in admission order */
    memcpy(s->order, s->run, sizeof(int32_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        const int32_t slot = s->order[i];
        req *r = &s->reqs[slot];
        if (r->state != FA_REQUEST_RUNNING || known(r) - r->cached != 1)
            continue; /* preempted by an earlier one, or in its prompt */
        if (fit(s, slot, 1, 1) == 1) {
            schedule(s, slot, 1);
            budget--;
        } else { /* nothing left to take: it waits for pages (never alone: add's check) */
            preempt(s, slot);
        }
    }
    /* then prompts already started, then new ones, in order, chunks as the budget allows */
    n = s->nrun;
    memcpy(s->order, s->run, sizeof(int32_t) * (size_t)n);
    for (int32_t i = 0; i < n && budget > 0; i++) {
        const int32_t slot = s->order[i];
        req *r = &s->reqs[slot];
        const int32_t left = known(r) - r->cached;
        if (r->state != FA_REQUEST_RUNNING || r->rows || left <= 1)
            continue;
        const int32_t rows = fit(s, slot, left < budget ? left : budget, st->batch == 0);
        if (rows > 0) {
            schedule(s, slot, rows);
            budget -= rows;
        }
    }
    while (s->nwait > 0 && s->nrun < s->o.max_batch && budget > 0) {
        const int32_t slot = *wait_at(s, 0);
        req *r = &s->reqs[slot];
        const int32_t left = known(r) - r->cached;
        grow(s, r, (int64_t)r->cached + (left < budget ? left : budget));
        const int32_t room = r->npages * s->o.page_size - r->cached;
        if (room <= 0) { /* no page free: it waits */
            free_pages_of(s, r);
            break;
        }
        wait_pop_front(s);
        s->run[s->nrun++] = slot;
        r->state = FA_REQUEST_RUNNING;
        const int32_t rows = left < budget ? left : budget;
        schedule(s, slot, rows < room ? rows : room);
        budget -= s->reqs[slot].rows;
    }
    st->max_pages_per_seq = s->bt_row;
    st->page_size = s->o.page_size;
    st->ids = s->ids;
    st->cu_seqlens_q = s->cu;
    st->cache_seqlens = s->lens;
    st->block_table = s->bt;
    st->tokens = s->tokens;
    st->positions = s->positions;
    st->sample = s->sample;
    s->pending = st->batch > 0;
    s->steps += st->batch > 0;
    *out = *st;
    return FA_OK;
}

static void finish(fa_sched *s, int32_t slot)
{
    req *r = &s->reqs[slot];
    free_pages_of(s, r);
    if (r->state == FA_REQUEST_RUNNING)
        remove_slot(s->run, &s->nrun, slot);
    else if (r->state == FA_REQUEST_WAITING)
        wait_remove(s, slot);
    r->state = FA_REQUEST_FINISHED;
    s->nfinished++;
}

fa_status fa_sched_commit(fa_sched *s, const int32_t *next, const uint8_t *stop, char *err)
{
    if (!s)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "the scheduler is NULL");
    if (!s->pending)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "no step to commit");
    const fa_step *st = &s->step;
    for (int32_t b = 0; b < st->batch; b++)
        if (st->sample[b] && !next)
            return fa_model_fail(err, FA_ERR_NULL_POINTER, "next must not be NULL: the step samples tokens");
    for (int32_t b = 0; b < st->batch; b++) {
        const int32_t slot = s->seq_slot[b];
        req *r = &s->reqs[slot];
        r->cached += r->rows;
        r->rows = 0;
        if (st->sample[b])
            r->tokens[known(r)] = next[b], r->generated++;
        if (r->generated == r->max_new || (stop && stop[b]))
            finish(s, slot);
    }
    s->pending = 0;
    return FA_OK;
}

fa_status fa_sched_abort(fa_sched *s, char *err)
{
    if (!s)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "the scheduler is NULL");
    if (!s->pending)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "no step to abort");
    for (int32_t b = 0; b < s->step.batch; b++)
        s->reqs[s->seq_slot[b]].rows = 0;
    s->pending = 0;
    s->steps--; /* it did not run (its preemptions did happen) */
    return FA_OK;
}

static int32_t slot_of(const fa_sched *s, int64_t id)
{
    if (id < 0)
        return -1;
    const int32_t e = id_entry(s, id);
    return s->hkey[e] == id ? s->hslot[e] : -1;
}

fa_status fa_sched_finish(fa_sched *s, int64_t id, char *err)
{
    if (!s)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "the scheduler is NULL");
    const int32_t slot = slot_of(s, id);
    if (slot < 0)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "request %lld is not held", (long long)id);
    if (s->pending && s->reqs[slot].rows)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT,
                             "request %lld is in the step awaiting its commit: commit first", (long long)id);
    if (s->reqs[slot].state != FA_REQUEST_FINISHED)
        finish(s, slot);
    return FA_OK;
}

fa_status fa_sched_request(const fa_sched *s, int64_t id, fa_request_info *info, char *err)
{
    if (!s || !info)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", s ? "info" : "the scheduler");
    const int32_t slot = slot_of(s, id);
    if (slot < 0)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "request %lld is not held", (long long)id);
    const req *r = &s->reqs[slot];
    *info = (fa_request_info){ r->state, r->prompt_len, r->generated, r->max_new, r->cached,
                               r->npages, r->preemptions, r->tokens };
    return FA_OK;
}

fa_status fa_sched_release(fa_sched *s, int64_t id, char *err)
{
    if (!s)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "the scheduler is NULL");
    const int32_t slot = slot_of(s, id);
    if (slot < 0)
        return fa_model_fail(err, FA_ERR_INVALID_VALUE, "request %lld is not held", (long long)id);
    req *r = &s->reqs[slot];
    if (r->state != FA_REQUEST_FINISHED)
        return fa_model_fail(err, FA_ERR_INVALID_ARGUMENT, "request %lld has not finished", (long long)id);
    free(r->tokens), free(r->pages);
    id_forget(s, id);
    memset(r, 0, sizeof(*r));
    r->id = -1;
    s->free_slots[s->nfree_slots++] = slot;
    s->nfinished--;
    return FA_OK;
}

fa_sched_stats fa_sched_get_stats(const fa_sched *s)
{
    if (!s)
        return (fa_sched_stats){ 0 };
    return (fa_sched_stats){ s->nwait, s->nrun, s->nfinished, s->nfree, s->o.num_pages - s->nfree, s->steps,
                             s->preemptions };
}

fa_status fa_step_check_arrays(const fa_step *st, int32_t vocab_size, char *err)
{
    if (!st)
        return fa_model_fail(err, FA_ERR_NULL_POINTER, "step is NULL");
    const struct {
        const void *p;
        const char *name;
    } ptrs[] = { { st->cu_seqlens_q, "step.cu_seqlens_q" }, { st->cache_seqlens, "step.cache_seqlens" },
                 { st->block_table, "step.block_table" },   { st->tokens, "step.tokens" },
                 { st->positions, "step.positions" },       { st->sample, "step.sample" } };
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
        if (!ptrs[i].p)
            return fa_model_fail(err, FA_ERR_NULL_POINTER, "%s is NULL", ptrs[i].name);
    for (int32_t i = 0; i < st->total_q; i++)
        if (st->tokens[i] < 0 || st->tokens[i] >= vocab_size)
            return fa_model_fail(err, FA_ERR_INVALID_VALUE, "step.tokens[%d] (%d) is outside 0..vocab_size-1 (%d)",
                                 (int)i, (int)st->tokens[i], (int)vocab_size - 1);
    return FA_OK;
}
