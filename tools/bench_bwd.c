/* SPDX-License-Identifier: MIT */
/* `flashattn bench --backward`: flash and standard backward side by side, errors against float64. */
#include "cli.h"
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct bwd_call {
    fa_context_t ctx;
    const fa_backward_desc *bd;
    fa_attention_desc *fwd; /* bd's forward descriptor, whose algorithm the call sets */
    fa_algorithm algorithm;
} bwd_call;

static int run_backward(void *arg)
{
    bwd_call *c = arg;
    c->fwd->algorithm = c->algorithm;
    return fa_backward(c->ctx, c->bd) == FA_OK && fa_context_synchronize(c->ctx) == FA_OK ? 0 : -1;
}

/* A view of batch 0 and kv head 0 (with its query heads): small enough for the
 * float64 backward, and dK/dV there still sum over every query row. */
static void sub_view(const fa_attention_desc *d, fa_attention_desc *s, const fa_backward_desc *bd,
                     fa_backward_desc *sb)
{
    *s = *d;
    s->batch = 1;
    s->num_heads_q = d->num_heads_q / d->num_heads_kv;
    s->num_heads_kv = 1;
    s->lse_stride_seq = 1;
    s->lse_stride_head = d->seqlen_q;
    s->lse_stride_batch = (int64_t)d->seqlen_q * d->num_heads_q;
    *sb = *bd;
    sb->forward = s;
}

static void compare(const fa_tensor *t, int32_t rows, int32_t heads, int32_t dim, const double *ref,
                    double *max_err, double *rel_l2)
{
    double mx = 0, num = 0, den = 0;
    for (int32_t i = 0; i < rows; i++)
        for (int32_t h = 0; h < heads; h++)
            for (int32_t x = 0; x < dim; x++) {
                double want = ref[((int64_t)i * heads + h) * dim + x];
                double got = fa_ref_decode(t->dtype, t->data,
                                           i * t->stride_seq + (int64_t)h * t->stride_head + x);
                double e = fabs(got - want);
                mx = e > mx || isnan(e) ? e : mx;
                num += e * e;
                den += want * want;
            }
    *max_err = mx;
    *rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
}

int cli_bench_backward(fa_context_t ctx, fa_attention_desc *d, const fa_attention_desc *host_d,
                       long reps, int no_standard, double fwd_flops, cli_bwd_row *r)
{
    memset(r, 0, sizeof(*r));
    const int64_t b = d->batch, sq = d->seqlen_q, sk = d->seqlen_k, hq = d->num_heads_q,
                  hk = d->num_heads_kv, dim = d->head_dim;
    const fa_dtype t = d->q.dtype;
    const int64_t esz = t == FA_DTYPE_F32 ? 4 : 2;
    size_t qbytes = 0, kbytes = 0;
    if (cli_size(&qbytes, (const int64_t[]){ b, sq, hq, dim, esz }, 5) ||
        cli_size(&kbytes, (const int64_t[]){ b, sk, hk, dim, esz }, 5)) {
        fprintf(stderr, "flashattn bench: the backward's gradients of sq %lld sk %lld h %lld d %lld "
                        "are too large\n",
                (long long)sq, (long long)sk, (long long)hq, (long long)dim);
        return CLI_EXIT_FAIL;
    }
    const int64_t nq = (int64_t)(qbytes / (size_t)esz);
    void *go = malloc(qbytes), *gq = malloc(qbytes), *gk = malloc(kbytes), *gv = malloc(kbytes);
    double *ref[3] = { NULL, NULL, NULL };
    int rc = CLI_EXIT_FAIL;
    const fa_algorithm keep = d->algorithm;
    if (!go || !gq || !gk || !gv) {
        fprintf(stderr, "flashattn bench: out of memory for the backward buffers\n");
        goto done;
    }
    fa_rng rng = { (uint64_t)(sq * 7919 + sk) };
    fa_ref_fill(&rng, t, go, nq, 1.0);
    const fa_layout lay = d->q.stride_head == dim ? FA_LAYOUT_BSHD : FA_LAYOUT_BHSD;
    fa_backward_desc bd;
    fa_backward_desc_init(&bd);
    bd.forward = d;
    bd.d_o = fa_tensor_contiguous(go, t, lay, (int32_t)sq, (int32_t)hq, (int32_t)dim);
    bd.d_q = fa_tensor_contiguous(gq, t, lay, (int32_t)sq, (int32_t)hq, (int32_t)dim);
    bd.d_k = fa_tensor_contiguous(gk, t, lay, (int32_t)sk, (int32_t)hk, (int32_t)dim);
    bd.d_v = fa_tensor_contiguous(gv, t, lay, (int32_t)sk, (int32_t)hk, (int32_t)dim);
    /* d_o and the gradients in backend memory; bd keeps the host views for the check */
    fa_backward_desc dbd = bd;
    bd.forward = host_d;
    void *dev[4] = { NULL, NULL, NULL, NULL };
    const size_t bytes[4] = { qbytes, qbytes, kbytes, kbytes };
    void *const host[4] = { go, gq, gk, gv };
    for (int i = 0; i < 4; i++)
        if (fa_memory_alloc(ctx, bytes[i], &dev[i]) != FA_OK ||
            (i == 0 && fa_memory_upload(ctx, dev[0], go, bytes[0]) != FA_OK))
            goto api_error;
    dbd.d_o.data = dev[0], dbd.d_q.data = dev[1], dbd.d_k.data = dev[2], dbd.d_v.data = dev[3];
    fa_run_info ri = { .size = sizeof(ri) };
    if (!no_standard) {
        d->algorithm = FA_ALGORITHM_STANDARD;
        if (fa_backward_plan(ctx, &dbd, &ri) == FA_OK && ri.workspace_bytes < (uint64_t)12 << 30) {
            r->bytes_std = ri.workspace_bytes;
            r->has_std = 1;
        }
    }
    d->algorithm = FA_ALGORITHM_FLASH;
    /* in turns, the standard first: the gradients left are the flash backward's */
    bwd_call calls[2] = { { ctx, &dbd, d, FA_ALGORITHM_STANDARD }, { ctx, &dbd, d, FA_ALGORITHM_FLASH } };
    void *const arg[2] = { &calls[0], &calls[1] };
    const int first = r->has_std ? 0 : 1;
    double ms[2] = { 0.0, 0.0 };
    if (fa_backward_plan(ctx, &dbd, &ri) != FA_OK ||
        cli_time_turns(run_backward, arg + first, 2 - first, reps, ms + first) != 0)
        goto api_error;
    r->ms_std = ms[0];
    r->ms = ms[1];
    for (int i = 1; i < 4; i++)
        if (fa_memory_download(ctx, host[i], dev[i], bytes[i]) != FA_OK)
            goto api_error;
    r->bytes = ri.workspace_bytes;
    r->gflops = 2.5 * fwd_flops / (r->ms * 1e-3) / 1e9;

    /* float64 check on batch 0, kv head 0, when that stays under ~2e9 multiply-adds */
    const int64_t g = hq / hk;
    if ((double)g * sq * sk * dim * 4.0 <= 2e9) {
        fa_attention_desc s;
        fa_backward_desc sb;
        sub_view(host_d, &s, &bd, &sb);
        for (int i = 0; i < 3; i++)
            ref[i] = malloc(sizeof(double) * (size_t)((i ? sk : sq * g) * dim));
        if (ref[0] && ref[1] && ref[2] && fa_ref_backward(&sb, ref[0], ref[1], ref[2]) == 0) {
            compare(&bd.d_q, (int32_t)sq, (int32_t)g, (int32_t)dim, ref[0], &r->max_err[0], &r->rel_l2[0]);
            compare(&bd.d_k, (int32_t)sk, 1, (int32_t)dim, ref[1], &r->max_err[1], &r->rel_l2[1]);
            compare(&bd.d_v, (int32_t)sk, 1, (int32_t)dim, ref[2], &r->max_err[2], &r->rel_l2[2]);
            r->checked = 1;
        }
    }
    rc = 0;
    goto done;
api_error:
    fprintf(stderr, "flashattn bench: backward: %s\n", fa_context_last_error(ctx));
done:
    d->algorithm = keep;
    for (int i = 0; i < 4; i++)
        fa_memory_free(ctx, dev[i]);
    free(go), free(gq), free(gk), free(gv);
    for (int i = 0; i < 3; i++)
        free(ref[i]);
    return rc;
}
