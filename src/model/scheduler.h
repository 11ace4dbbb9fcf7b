/* SPDX-License-Identifier: MIT */
/*
 * Continuous batching over a paged KV cache: the cache's page allocator and a scheduler that
 * turns requests into steps. A step is one ragged batch: every running request that is
 * decoding contributes one query row, requests still in their prompt contribute a chunk of
 * it, under a token budget; the step carries exactly what a paged attention call and the
 * layers around it need (cu_seqlens, cached lengths, block-table rows, each row's token and
 * position). Backend-neutral: it knows no model and owns only its tables.
 *
 * Policy. Requests run in arrival order. Each step first gives every decoding request its
 * row, then continues unfinished prompts, then admits waiting requests while the budget, the
 * batch and the pages allow. A decode whose next token needs a page when none is free takes
 * the pages of the most recently admitted running request, which goes back to the front of
 * the queue with what it has generated (recomputed when it runs again): no running request
 * ever fails for want of pages. A request that could never fit (longer than the context, or
 * than the whole cache) is refused when added.
 *
 * Errors: every call that can fail returns an fa_status and writes a message naming the
 * offending field into err (FA_MODEL_ERR_LEN bytes; may be NULL). A scheduler belongs to one
 * thread at a time.
 */
#ifndef FA_SCHEDULER_H
#define FA_SCHEDULER_H

#include "model.h"

typedef struct fa_sched_options {
    int32_t num_pages;    /* pages in the cache (>= 1) */
    int32_t page_size;    /* tokens a page (>= 1; 16 is the usual) */
    int32_t max_batch;    /* sequences a step (1..token_budget) */
    int32_t token_budget; /* query rows a step (>= 1) */
    int32_t max_context;  /* a sequence's longest context: the model's seq_len (>= 1) */
    int32_t max_requests; /* requests held at once, waiting or running (>= 1) */
} fa_sched_options;

typedef enum fa_request_state {
    FA_REQUEST_WAITING = 0, /* queued, or preempted and queued again */
    FA_REQUEST_RUNNING = 1, /* holds pages: in its prompt or decoding */
    FA_REQUEST_FINISHED = 2 /* max_new tokens, or finished by the caller; pages freed */
} fa_request_state;

typedef struct fa_request_info {
    fa_request_state state;
    int32_t prompt_len, generated, max_new;
    int32_t cached;      /* tokens in the cache */
    int32_t pages;       /* pages held */
    int32_t preemptions; /* times it gave its pages back */
    const int32_t *tokens; /* prompt then generated tokens (prompt_len + generated), owned */
} fa_request_info;

/* One step; the arrays are owned by the scheduler and valid until the next fa_sched_step. */
typedef struct fa_step {
    int32_t batch;             /* sequences (0: nothing to run) */
    int32_t total_q;           /* query rows */
    int32_t max_seqlen_q, max_seqlen_k;
    int32_t max_pages_per_seq; /* the block table's row length */
    int32_t page_size;         /* tokens a page (the scheduler's) */
    const int64_t *ids;        /* [batch] the request of each sequence */
    const int32_t *cu_seqlens_q;  /* [batch + 1] */
    const int32_t *cache_seqlens; /* [batch] tokens cached before the step */
    const int32_t *block_table;   /* [batch, max_pages_per_seq], -1 past a sequence's pages */
    const int32_t *tokens;        /* [total_q] each row's input token */
    const int32_t *positions;     /* [total_q] each row's position in its sequence */
    const uint8_t *sample;        /* [batch] 1: the sequence's last row gives its next token */
    int32_t preempted;            /* requests this step sent back to the queue */
} fa_step;

/* A step's arrays are present and its tokens within 0..vocab_size-1 (a caller's own step is
 * checked as the scheduler's): the check fa_model_forward_step and fa_engine_step share. */
fa_status fa_step_check_arrays(const fa_step *st, int32_t vocab_size, char *err);

typedef struct fa_sched_stats {
    int32_t waiting, running, finished;
    int32_t pages_free, pages_used;
    int64_t steps, preemptions;
} fa_sched_stats;

typedef struct fa_sched fa_sched;

fa_status fa_sched_create(const fa_sched_options *o, fa_sched **out, char *err);
void fa_sched_free(fa_sched *s);

/* A request: n prompt tokens (n >= 1: the runner's prompts start with BOS) and up to max_new
 * (>= 1) generated ones. The cache holds at most n + max_new - 1 of them (the last sampled
 * token is never fed back). Refused: those past max_context, more pages than the cache holds,
 * or max_requests already held. *id is its handle. */
fa_status fa_sched_add(fa_sched *s, const int32_t *tokens, int32_t n, int32_t max_new, int64_t *id,
                       char *err);

/* The next step into *step (batch 0 when no request is waiting or running). */
fa_status fa_sched_step(fa_sched *s, fa_step *step, char *err);

/* After the step's forward: next[i] is the token sampled for sequence i where step.sample[i]
 * (ignored elsewhere); stop[i] (may be NULL) ends request i now (EOS). A request reaching
 * max_new finishes. Finished requests free their pages at once. */
fa_status fa_sched_commit(fa_sched *s, const int32_t *next, const uint8_t *stop, char *err);

/* Drop the pending step after a failed forward: nothing it fed counts as cached, the pages it
 * took stay with their requests, the next fa_sched_step schedules those rows again, and the
 * stats do not count it as a step. */
fa_status fa_sched_abort(fa_sched *s, char *err);

/* End a request early (the caller's cancel); its pages are freed. A request in the pending
 * step is refused until that step is committed or aborted. */
fa_status fa_sched_finish(fa_sched *s, int64_t id, char *err);

/* A request's state; FA_ERR_INVALID_VALUE for an unknown id. Finished requests stay queryable
 * until fa_sched_release. */
fa_status fa_sched_request(const fa_sched *s, int64_t id, fa_request_info *info, char *err);

/* Forget a finished request (its slot becomes free for fa_sched_add). */
fa_status fa_sched_release(fa_sched *s, int64_t id, char *err);

/* The scheduler's counts (all 0 for NULL). */
fa_sched_stats fa_sched_get_stats(const fa_sched *s);

#endif
