/* SPDX-License-Identifier: MIT */
/*
 * Backward conformance: a grid case's forward (flash, as training runs it),
 * then flash and standard backward against the float64 backward. Flash
 * passes when each gradient's max error is at most twice the standard
 * backward's in the same precision plus a small floor.
 */
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Read a [rows, heads, dim]-shaped gradient into packed double rows. */
static void gather(const fa_attention_desc *d, const fa_tensor *t, int is_k, int32_t heads,
                   double *out)
{
    const int32_t dim = d->head_dim;
    const int32_t *cu = is_k ? d->cu_seqlens_k : d->cu_seqlens_q;
    const int32_t len = is_k ? d->seqlen_k : d->seqlen_q;
    for (int32_t b = 0; b < d->batch; b++) {
        int64_t r0 = cu ? cu[b] : (int64_t)b * len, n = cu ? cu[b + 1] - cu[b] : len;
        for (int64_t i = 0; i < n; i++)
            for (int32_t h = 0; h < heads; h++) {
                int64_t row = r0 + i, trow = cu ? row : i;
                int64_t base = (cu ? 0 : (int64_t)b * t->stride_batch) + trow * t->stride_seq +
                               (int64_t)h * t->stride_head;
                for (int32_t x = 0; x < dim; x++)
                    out[(row * heads + h) * dim + x] = fa_ref_decode(t->dtype, t->data, base + x);
            }
    }
}

static double max_err(const double *a, const double *b, int64_t n, double *ref_max, int *bad)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            *bad = 1;
        double d = fabs(a[i] - b[i]);
        e = isnan(d) ? INFINITY : fmax(e, d);
        *ref_max = fmax(*ref_max, fabs(b[i]));
    }
    return e;
}

/* Allocate backend copies of the host gradient buffers: go uploaded, the rest later. */
static int stage_grads(fa_context_t ctx, void *const host[4], const int64_t bytes[4], void *dev[4],
                       char *msg, size_t cap)
{
    for (int i = 0; i < 4; i++) {
        fa_status s = fa_memory_alloc(ctx, (size_t)bytes[i], &dev[i]);
        if (s == FA_OK && i == 0)
            s = fa_memory_upload(ctx, dev[0], host[0], (size_t)bytes[0]);
        if (s != FA_OK) {
            snprintf(msg, cap, "staging gradients: %s", fa_context_last_error(ctx));
            return -1;
        }
    }
    return 0;
}

int fa_case_run_backward(fa_context_t ctx, const fa_case *c, fa_bwd_result *res)
{
    memset(res, 0, sizeof(*res));
    const char *refused = fa_backend_refuses(ctx, c);
    if (refused) {
        res->passed = fa_case_check_refused(ctx, c, refused, res->message, sizeof(res->message)) == 0;
        return 0;
    }
    fa_case_inputs in;
    fa_case_staged st;
    memset(&st, 0, sizeof(st));
    void *go = NULL, *g[3] = { NULL, NULL, NULL }, *dev[4] = { NULL, NULL, NULL, NULL };
    double *ref[3] = { NULL, NULL, NULL }, *got[3] = { NULL, NULL, NULL };
    int rc = -1;
    if (fa_case_inputs_make(c, 1, &in) != 0)
        goto oom;
    fa_attention_desc *d = &in.d;
    const int32_t dim = c->head_dim, hq = c->heads_q, hk = c->heads_kv;
    const fa_dtype gdt = c->o_f32 ? FA_DTYPE_F32 : c->dtype;
    const int64_t esz = c->dtype == FA_DTYPE_F32 ? 4 : 2, gsz = gdt == FA_DTYPE_F32 ? 4 : 2;
    const int64_t n[3] = { in.rows * hq * dim, in.krows * hk * dim, in.krows * hk * dim };
    const fa_layout lay = c->layout == FA_CASE_BHSD ? FA_LAYOUT_BHSD : FA_LAYOUT_BSHD;

    if (fa_case_stage(ctx, &in, &st, res->message, sizeof(res->message)) != 0)
        goto done;
    st.d.algorithm = FA_ALGORITHM_FLASH;
    if (fa_forward(ctx, &st.d) != FA_OK) {
        snprintf(res->message, sizeof(res->message), "forward: %s", fa_context_last_error(ctx));
        goto done;
    }
    fa_backward_desc bd;
    fa_backward_desc_init(&bd);
    bd.forward = d;
    go = malloc((size_t)((n[0] ? n[0] : 1) * esz));
    for (int i = 0; i < 3; i++) {
        g[i] = malloc((size_t)((n[i] ? n[i] : 1) * gsz));
        ref[i] = malloc(sizeof(double) * (size_t)(n[i] ? n[i] : 1));
        got[i] = malloc(sizeof(double) * (size_t)(n[i] ? n[i] : 1));
        if (!g[i] || !ref[i] || !got[i])
            goto oom;
    }
    if (!go)
        goto oom;
    fa_rng rng = { c->seed ^ 0x5bd1e995u };
    fa_ref_fill(&rng, c->dtype, go, n[0], 1.0);
    /* Element 0 of every dO row non-negative, as v's (fa_case_inputs_make): dv = P^T dO then
     * sums terms of one sign there, so that the gradients' largest element, which the floor
     * and the standard's gross bound scale with, is as large as the terms (at d1 over three
     * bf16 rows dv cancelled to 1% of them, and P's bf16 rounding passed that bound) */
    for (int64_t i = 0; i < n[0]; i += dim)
        fa_ref_encode(c->dtype, go, i, fabs(fa_ref_decode(c->dtype, go, i)));
    bd.d_o = fa_tensor_contiguous(go, c->dtype, lay, d->seqlen_q, hq, dim);
    bd.d_q = fa_tensor_contiguous(g[0], gdt, lay, d->seqlen_q, hq, dim);
    bd.d_k = fa_tensor_contiguous(g[1], gdt, lay, d->seqlen_k, hk, dim);
    bd.d_v = fa_tensor_contiguous(g[2], gdt, lay, d->seqlen_k, hk, dim);
    if (fa_ref_backward(&bd, ref[0], ref[1], ref[2]) != 0)
        goto oom;

    /* the same call on backend memory */
    void *const host[4] = { go, g[0], g[1], g[2] };
    const int64_t bytes[4] = { n[0] * esz, n[0] * gsz, n[1] * gsz, n[2] * gsz };
    if (stage_grads(ctx, host, bytes, dev, res->message, sizeof(res->message)) != 0)
        goto done;
    fa_backward_desc dbd = bd;
    dbd.forward = &st.d;
    dbd.d_o.data = dev[0];
    dbd.d_q.data = dev[1];
    dbd.d_k.data = dev[2];
    dbd.d_v.data = dev[3];

    double err[2][3], ref_max[3] = { 0, 0, 0 };
    int bad = 0;
    const fa_tensor *gt[3] = { &bd.d_q, &bd.d_k, &bd.d_v };
    for (int a = 0; a < 2; a++) {
        st.d.algorithm = a ? FA_ALGORITHM_FLASH : FA_ALGORITHM_STANDARD;
        fa_status s = FA_OK;
        for (int i = 0; i < 3 && s == FA_OK; i++) {
            memset(g[i], 0xff, (size_t)((n[i] ? n[i] : 1) * gsz)); /* NaN: all must be written */
            s = fa_memory_upload(ctx, dev[i + 1], g[i], (size_t)bytes[i + 1]);
        }
        if (s == FA_OK)
            s = fa_backward(ctx, &dbd);
        if (s == FA_OK)
            s = fa_context_synchronize(ctx);
        for (int i = 0; i < 3 && s == FA_OK; i++)
            s = fa_memory_download(ctx, g[i], dev[i + 1], (size_t)bytes[i + 1]);
        if (s != FA_OK) {
            snprintf(res->message, sizeof(res->message), "backward: %s", fa_context_last_error(ctx));
            goto done;
        }
        for (int i = 0; i < 3; i++) {
            gather(d, gt[i], i > 0, i ? hk : hq, got[i]);
            int bad_here = 0; /* a non-finite standard gradient would also void the tolerance */
            err[a][i] = max_err(got[i], ref[i], n[i], &ref_max[i], &bad_here);
            bad |= bad_here;
        }
    }
    static const char *names[3] = { "dq", "dk", "dv" };
    res->passed = !bad;
    char detail[256] = "";
    size_t used = 0;
    /* The floor scales with the case's gradient magnitude, not each tensor's own: where a
     * mask leaves one key per row, dS = P (dP - D) is exactly 0 and so is dq and dk, but
     * any finite-precision P leaves rounding noise of the size of dP there. */
    const double grad_max = fmax(ref_max[0], fmax(ref_max[1], ref_max[2]));
    for (int i = 0; i < 3; i++) {
        res->err_flash[i] = err[1][i];
        res->err_standard[i] = err[0][i];
        res->tolerance[i] = 2.0 * err[0][i] + 16.0 * fa_unit_roundoff(gdt) * fmax(grad_max, 1e-3);
        /* the standard backward shares the tile code: its own error must stay a
         * rounding error, or a shared formula mistake would pass unseen. Checked
         * where o is float32 and logits are moderate: a 16-bit o enters
         * dS = P (dP - D) through D = dO . o, where dP and D nearly cancel, and
         * large logits amplify that rounding into dK beyond any fixed bound. */
        int guard = d->o.dtype == FA_DTYPE_F32 && c->logit_scale <= 1.0f;
        double gross = 1e-2 * fmax(grad_max, 1e-3);
        if (!(err[1][i] <= res->tolerance[i]) || (guard && !(err[0][i] <= gross)))
            res->passed = 0;
        used += (size_t)snprintf(detail + used, sizeof(detail) - used, "%s %.3g (std %.3g, tol %.3g) ",
                                 names[i], err[1][i], err[0][i], res->tolerance[i]);
    }
    if (!res->passed) {
        char desc[256];
        fa_case_format(c, desc, sizeof(desc));
        snprintf(res->message, sizeof(res->message), "%s%s: %s", bad ? "non-finite gradient; " : "",
                 detail, desc);
    }
    rc = 0;
    goto done;
oom:
    snprintf(res->message, sizeof(res->message), "out of memory setting up the case");
done:
    for (int i = 0; i < 4; i++)
        fa_memory_free(ctx, dev[i]);
    fa_case_unstage(ctx, &st);
    fa_case_inputs_free(&in);
    free(go);
    for (int i = 0; i < 3; i++) {
        free(g[i]);
        free(ref[i]);
        free(got[i]);
    }
    return rc;
}
