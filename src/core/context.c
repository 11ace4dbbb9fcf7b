/* SPDX-License-Identifier: MIT */
/* Contexts, statuses, errors and dispatch to the backend a context holds. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char create_error[FA_ERROR_CAP];

const char *fa_status_string(fa_status status)
{
    switch (status) {
    case FA_OK: return "FA_OK";
    case FA_ERR_NULL_POINTER: return "FA_ERR_NULL_POINTER";
    case FA_ERR_INVALID_SHAPE: return "FA_ERR_INVALID_SHAPE";
    case FA_ERR_INVALID_STRIDE: return "FA_ERR_INVALID_STRIDE";
    case FA_ERR_INVALID_VALUE: return "FA_ERR_INVALID_VALUE";
    case FA_ERR_INVALID_DTYPE: return "FA_ERR_INVALID_DTYPE";
    case FA_ERR_SIZE_OVERFLOW: return "FA_ERR_SIZE_OVERFLOW";
    case FA_ERR_UNSUPPORTED: return "FA_ERR_UNSUPPORTED";
    case FA_ERR_BACKEND_UNAVAILABLE: return "FA_ERR_BACKEND_UNAVAILABLE";
    case FA_ERR_OUT_OF_MEMORY: return "FA_ERR_OUT_OF_MEMORY";
    case FA_ERR_BACKEND: return "FA_ERR_BACKEND";
    case FA_ERR_INVALID_ARGUMENT: return "FA_ERR_INVALID_ARGUMENT";
    case FA_ERR_IO: return "FA_ERR_IO";
    }
    return "FA_ERR_UNKNOWN_STATUS";
}

const char *fa_version_string(void) { return FA_VERSION_STRING; }

const char *fa_backend_name(fa_backend backend)
{
    switch (backend) {
    case FA_BACKEND_AUTO: return "auto";
    case FA_BACKEND_CPU: return "cpu";
    case FA_BACKEND_CUDA: return "cuda";
    case FA_BACKEND_GLES: return "gles";
    }
    return "unknown";
}

int fa_backend_is_built(fa_backend backend) { return fa_registry_get(backend) != NULL; }

void fa_attention_desc_init(fa_attention_desc *desc)
{
    if (!desc)
        return;
    memset(desc, 0, sizeof(*desc));
    desc->size = sizeof(*desc);
    desc->window_left = -1;
    desc->window_right = -1;
    desc->algorithm = FA_ALGORITHM_FLASH;
}

void fa_backward_desc_init(fa_backward_desc *desc)
{
    if (!desc)
        return;
    memset(desc, 0, sizeof(*desc));
    desc->size = sizeof(*desc);
}

fa_tensor fa_tensor_contiguous(void *data, fa_dtype dtype, fa_layout layout, int32_t seqlen,
                               int32_t heads, int32_t head_dim)
{
    fa_tensor t;
    t.data = data;
    t.dtype = dtype;
    int64_t d = head_dim, h = heads, s = seqlen;
    if (layout == FA_LAYOUT_BHSD) {
        t.stride_seq = d;
        t.stride_head = s * d;
    } else {
        t.stride_head = d;
        t.stride_seq = h * d;
    }
    t.stride_batch = s * h * d;
    return t;
}

void fa_appendf(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = *len < cap ? cap - *len : 0;
    int n = vsnprintf(room ? buf + *len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len += (size_t)n;
}

fa_status fa_error(struct fa_context *ctx, fa_status status, const char *fmt, ...)
{
    char *dst = ctx ? ctx->error : create_error;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, FA_ERROR_CAP, fmt, ap);
    va_end(ap);
    return status;
}

const char *fa_last_create_error(void) { return create_error; }

static fa_status try_backend_native(const fa_backend_iface *iface, int32_t threads, const void *native,
                                    fa_context_t *out)
{
    struct fa_context *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return fa_error(NULL, FA_ERR_OUT_OF_MEMORY, "out of memory allocating the context");
    ctx->iface = iface;
    fa_status st = iface->init(ctx, threads, native, &ctx->state);
    if (st != FA_OK) {
        /* the backend wrote its reason into ctx->error */
        snprintf(create_error, sizeof(create_error), "%s", ctx->error);
        free(ctx);
        return st;
    }
    *out = ctx;
    return FA_OK;
}

static fa_status try_backend(const fa_backend_iface *iface, int32_t threads, fa_context_t *out)
{
    return try_backend_native(iface, threads, NULL, out);
}

fa_status fa_context_create_native(fa_backend id, const void *native, fa_context_t *out)
{
    create_error[0] = '\0';
    if (!out)
        return fa_error(NULL, FA_ERR_NULL_POINTER, "out must not be NULL");
    *out = NULL;
    const fa_backend_iface *iface = fa_registry_get(id);
    if (!iface)
        return fa_error(NULL, FA_ERR_BACKEND_UNAVAILABLE,
                        "backend '%s' was not built into this library (see `flashattn info`)",
                        fa_backend_name(id));
    return try_backend_native(iface, 0, native, out);
}

fa_status fa_context_import(fa_context_t ctx, uint64_t handle, size_t bytes, void **ptr)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (!ptr)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "ptr must not be NULL");
    *ptr = NULL;
    if (!ctx->iface->mem_import)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "this '%s' context imports no memory objects of the caller's",
                        ctx->iface->name);
    fa_status st = ctx->iface->mem_import(ctx, ctx->state, handle, bytes, ptr);
    if (st == FA_OK)
        ctx->error[0] = '\0';
    return st;
}

fa_status fa_context_create(const fa_context_options *opts, fa_context_t *out)
{
    create_error[0] = '\0';
    if (!out)
        return fa_error(NULL, FA_ERR_NULL_POINTER, "out must not be NULL");
    *out = NULL;
    fa_context_options o = { sizeof(o), FA_BACKEND_AUTO, 0 };
    if (opts) {
        if (opts->size != sizeof(*opts))
            return fa_error(NULL, FA_ERR_INVALID_ARGUMENT,
                            "opts->size (%zu) must be sizeof(fa_context_options) (%zu)",
                            opts->size, sizeof(*opts));
        o = *opts;
    }
    if (o.num_threads < 0 || o.num_threads > FA_MAX_THREADS)
        return fa_error(NULL, FA_ERR_INVALID_VALUE, "opts->num_threads (%d) must be in 0..%d",
                        (int)o.num_threads, FA_MAX_THREADS);
    if ((int)o.backend < 0 || (int)o.backend >= FA_BACKEND_COUNT)
        return fa_error(NULL, FA_ERR_INVALID_ARGUMENT, "opts->backend (%d) is not a fa_backend",
                        (int)o.backend);
    if (o.backend != FA_BACKEND_AUTO) {
        const fa_backend_iface *iface = fa_registry_get(o.backend);
        if (!iface)
            return fa_error(NULL, FA_ERR_BACKEND_UNAVAILABLE,
                            "backend '%s' was not built into this library (see `flashattn info`)",
                            fa_backend_name(o.backend));
        return try_backend(iface, o.num_threads, out);
    }
    /* Auto: CUDA first, the CPU always works. GLES is asked for by name: whether a given
     * GLES device beats the CPU depends on it (Mesa's llvmpipe, a GLES on the CPU, does not). */
    static const fa_backend order[] = { FA_BACKEND_CUDA, FA_BACKEND_CPU };
    fa_status st = FA_ERR_BACKEND_UNAVAILABLE;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        const fa_backend_iface *iface = fa_registry_get(order[i]);
        if (iface && (st = try_backend(iface, o.num_threads, out)) == FA_OK)
            return FA_OK;
    }
    return st;
}

void fa_context_destroy(fa_context_t ctx)
{
    if (!ctx)
        return;
    ctx->iface->destroy(ctx->state);
    free(ctx);
}

fa_backend fa_context_backend(fa_context_t ctx) { return ctx ? ctx->iface->id : FA_BACKEND_AUTO; }

const char *fa_context_last_error(fa_context_t ctx)
{
    return ctx ? ctx->error : "ctx is NULL";
}

fa_status fa_context_info(fa_context_t ctx, char *buf, size_t cap, size_t *needed)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (!buf && cap)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "buf is NULL but cap is %zu", cap);
    size_t len = 0;
    if (cap)
        buf[0] = '\0';
    fa_appendf(buf, cap, &len, "backend: %s\n", ctx->iface->name);
    ctx->iface->info(ctx->state, buf, cap, &len);
    if (needed)
        *needed = len + 1;
    ctx->error[0] = '\0';
    return FA_OK;
}

static fa_status check_info_arg(fa_context_t ctx, const fa_run_info *info)
{
    if (info && info->size != sizeof(*info))
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                        "info->size (%zu) must be sizeof(fa_run_info) (%zu)", info->size,
                        sizeof(*info));
    return FA_OK;
}

static void remember(fa_context_t ctx, const fa_run_info *ri, fa_run_info *info)
{
    ctx->last_run = *ri;
    ctx->has_last_run = 1;
    if (info)
        *info = *ri;
    ctx->error[0] = '\0';
}

static void run_info_start(fa_context_t ctx, fa_run_info *ri)
{
    memset(ri, 0, sizeof(*ri));
    ri->size = sizeof(*ri);
    ri->backend = ctx->iface->id;
    ri->backend_name = ctx->iface->name;
}

typedef fa_status (*backend_call)(struct fa_context *ctx, void *state, const fa_problem *p,
                                  fa_run_info *info);

/* Run a backend entry point on a validated problem and remember its report
 * (copied to info when non-NULL). st is the validation's status. */
static fa_status dispatch(fa_context_t ctx, fa_status st, const fa_problem *p, backend_call fn,
                          fa_run_info *info)
{
    if (st != FA_OK)
        return st;
    fa_run_info ri;
    run_info_start(ctx, &ri);
    if ((st = fn(ctx, ctx->state, p, &ri)) != FA_OK)
        return st;
    remember(ctx, &ri, info);
    return FA_OK;
}

fa_status fa_forward_plan(fa_context_t ctx, const fa_attention_desc *desc, fa_run_info *info)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    fa_status st = check_info_arg(ctx, info);
    if (st != FA_OK)
        return st;
    fa_problem p;
    return dispatch(ctx, fa_validate_forward(ctx, desc, &p), &p, ctx->iface->plan, info);
}

fa_status fa_forward(fa_context_t ctx, const fa_attention_desc *desc)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    fa_problem p;
    return dispatch(ctx, fa_validate_forward(ctx, desc, &p), &p, ctx->iface->forward, NULL);
}

fa_status fa_backward_plan(fa_context_t ctx, const fa_backward_desc *desc, fa_run_info *info)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    fa_status st = check_info_arg(ctx, info);
    if (st != FA_OK)
        return st;
    fa_problem p;
    return dispatch(ctx, fa_validate_backward(ctx, desc, &p), &p, ctx->iface->plan_backward, info);
}

fa_status fa_backward(fa_context_t ctx, const fa_backward_desc *desc)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    fa_problem p;
    return dispatch(ctx, fa_validate_backward(ctx, desc, &p), &p, ctx->iface->backward, NULL);
}

fa_status fa_context_last_run(fa_context_t ctx, fa_run_info *info)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (!info)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "info must not be NULL");
    fa_status st = check_info_arg(ctx, info);
    if (st != FA_OK)
        return st;
    if (!ctx->has_last_run)
        return fa_error(ctx, FA_ERR_INVALID_ARGUMENT, "no call has run on this context yet");
    *info = ctx->last_run;
    ctx->error[0] = '\0';
    return FA_OK;
}

fa_status fa_memory_alloc(fa_context_t ctx, size_t bytes, void **ptr)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (!ptr)
        return fa_error(ctx, FA_ERR_NULL_POINTER, "ptr must not be NULL");
    *ptr = NULL;
    fa_status st;
    if (ctx->iface->mem_alloc) {
        if ((st = ctx->iface->mem_alloc(ctx, ctx->state, bytes, ptr)) != FA_OK)
            return st;
    } else if (!(*ptr = fa_alloc_aligned(bytes))) {
        return fa_error(ctx, FA_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes", bytes);
    }
    ctx->error[0] = '\0';
    return FA_OK;
}

/* st, the context's message cleared where it is FA_OK (the header's promise after a success) */
static fa_status settled(fa_context_t ctx, fa_status st)
{
    if (st == FA_OK)
        ctx->error[0] = '\0';
    return st;
}

fa_status fa_memory_free(fa_context_t ctx, void *ptr)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (ptr && ctx->iface->mem_free)
        return settled(ctx, ctx->iface->mem_free(ctx, ctx->state, ptr));
    free(ptr);
    return settled(ctx, FA_OK);
}

static fa_status memory_copy(fa_context_t ctx, void *dst, const void *src, size_t bytes,
                             fa_copy_kind kind)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (bytes && (!dst || !src))
        return fa_error(ctx, FA_ERR_NULL_POINTER, "%s must not be NULL", dst ? "src" : "dst");
    if (!bytes)
        return settled(ctx, FA_OK);
    if (kind == FA_COPY_WITHIN) {
        const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
        if (d > UINTPTR_MAX - bytes || s > UINTPTR_MAX - bytes)
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                            "%s (%p) + bytes (%zu) passes the end of the address space",
                            d > UINTPTR_MAX - bytes ? "dst" : "src",
                            d > UINTPTR_MAX - bytes ? dst : src, bytes);
        if (d < s + bytes && s < d + bytes)
            return fa_error(ctx, FA_ERR_INVALID_ARGUMENT,
                            "dst [%p, +%zu bytes) overlaps src [%p, +%zu bytes): copy between "
                            "disjoint ranges", dst, bytes, src, bytes);
    }
    if (ctx->iface->mem_copy) {
        fa_status st = ctx->iface->mem_copy(ctx, ctx->state, dst, src, bytes, kind);
        if (st != FA_OK)
            return st;
    } else {
        memmove(dst, src, bytes);
    }
    ctx->error[0] = '\0';
    return FA_OK;
}

fa_status fa_memory_upload(fa_context_t ctx, void *dst, const void *src, size_t bytes)
{
    return memory_copy(ctx, dst, src, bytes, FA_COPY_UPLOAD);
}

fa_status fa_memory_download(fa_context_t ctx, void *dst, const void *src, size_t bytes)
{
    return memory_copy(ctx, dst, src, bytes, FA_COPY_DOWNLOAD);
}

fa_status fa_memory_copy(fa_context_t ctx, void *dst, const void *src, size_t bytes)
{
    return memory_copy(ctx, dst, src, bytes, FA_COPY_WITHIN);
}

fa_status fa_context_set_stream(fa_context_t ctx, void *stream)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (ctx->iface->set_stream)
        return settled(ctx, ctx->iface->set_stream(ctx, ctx->state, stream));
    if (stream)
        return fa_error(ctx, FA_ERR_UNSUPPORTED,
                        "stream: the %s backend runs synchronously and takes no stream (pass NULL)",
                        ctx->iface->name);
    return settled(ctx, FA_OK);
}

fa_status fa_context_synchronize(fa_context_t ctx)
{
    if (!ctx)
        return FA_ERR_NULL_POINTER;
    if (ctx->iface->synchronize)
        return settled(ctx, ctx->iface->synchronize(ctx, ctx->state));
    return settled(ctx, FA_OK);
}
