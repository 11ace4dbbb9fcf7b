// SPDX-License-Identifier: MIT
// flashattn._C: the C API over DLPack tensors (numpy, torch, CuPy, ... on the CPU or a CUDA
// device), zero copy: every tensor is viewed in place with its own strides, and the outputs
// are the caller's. Library errors become Python exceptions carrying the library's message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "flashattn.h"

namespace nb = nanobind;
using array = nb::ndarray<>;
using in_array = nb::ndarray<nb::ro>; // inputs may be read-only (broadcasts, frombuffer, memmaps)

namespace {

// ValueError with message m (nanobind copies it).
[[noreturn]] void bad(const std::string &m) { throw nb::value_error(m.c_str()); }

// A context and the lock its calls take: a context serves one thread at a time, and calls run
// with the GIL released, so Python threads sharing a device take turns (the message of a
// failed call is copied under the same lock).
struct device_ctx {
    fa_context_t ctx;
    std::mutex lock;
};

// One context per (backend, device), made on first use and kept for the process.
device_ctx &context_for(int device_type, int device_id)
{
    static std::mutex lock;
    static std::map<std::pair<int, int>, device_ctx *> made;
    std::lock_guard<std::mutex> g(lock);
    auto key = std::make_pair(device_type, device_id);
    auto it = made.find(key);
    if (it != made.end())
        return *it->second;
    fa_context_options opts = { sizeof(opts), FA_BACKEND_CPU, 0 };
    if (device_type == nb::device::cuda::value) {
        if (device_id != 0)
            bad("flashattn: tensors on CUDA device " + std::to_string(device_id) +
                ": the CUDA backend runs on device 0 (set CUDA_VISIBLE_DEVICES)");
        opts.backend = FA_BACKEND_CUDA;
    } else if (device_type != nb::device::cpu::value) {
        throw nb::value_error("flashattn: tensors must live on the CPU or a CUDA device");
    }
    fa_context_t ctx;
    if (fa_context_create(&opts, &ctx) != FA_OK)
        throw std::runtime_error(std::string("flashattn: ") + fa_last_create_error());
    auto *dc = new device_ctx; // kept for the process, as the contexts are
    dc->ctx = ctx;
    made[key] = dc;
    return *dc;
}

// The library's status (its message copied under the context's lock) as a Python exception:
// bad arguments are ValueError.
[[noreturn]] void raise(fa_status st, const std::string &message)
{
    std::string msg = "flashattn: " + message;
    if (st == FA_ERR_OUT_OF_MEMORY)
        throw std::bad_alloc();
    if (st == FA_ERR_BACKEND || st == FA_ERR_BACKEND_UNAVAILABLE)
        throw std::runtime_error(msg);
    bad(msg);
}

template <typename A> fa_dtype dtype_of(const A &a, const char *name, bool bf16_bits)
{
    const nb::dlpack::dtype t = a.dtype();
    if (t == nb::dtype<float>())
        return FA_DTYPE_F32;
    if (t.code == (uint8_t)nb::dlpack::dtype_code::Float && t.bits == 16 && t.lanes == 1)
        return FA_DTYPE_F16;
    if (t.code == (uint8_t)nb::dlpack::dtype_code::Bfloat && t.bits == 16 && t.lanes == 1)
        return FA_DTYPE_BF16;
    if (bf16_bits && t.code == (uint8_t)nb::dlpack::dtype_code::UInt && t.bits == 16 && t.lanes == 1)
        return FA_DTYPE_BF16; // a numpy bfloat16 (ml_dtypes) array's bits
    bad(std::string("flashattn: ") + name + " must be float32, float16 or bfloat16 (got another dtype)");
}

// A [batch, seq, heads, dim] (or [rows, heads, dim]) view of a, its last dimension contiguous.
template <typename A> fa_tensor view_of(const A &a, const char *name, int ndim, bool bf16_bits)
{
    if ((int)a.ndim() != ndim)
        bad(std::string("flashattn: ") + name + " must have " + std::to_string(ndim) + " dimensions, not " +
            std::to_string(a.ndim()));
    if (a.shape(ndim - 1) > 1 && a.stride(ndim - 1) != 1)
        bad(std::string("flashattn: ") + name +
            "'s last dimension is strided; flashattn reads head_dim contiguously: pass a contiguous copy "
            "(x.contiguous() in torch, np.ascontiguousarray in numpy)");
    fa_tensor t;
    t.data = (void *)a.data();
    t.dtype = dtype_of(a, name, bf16_bits);
    t.stride_batch = ndim == 4 ? a.stride(0) : 0;
    t.stride_seq = a.stride(ndim - 3);
    t.stride_head = a.stride(ndim - 2);
    return t;
}

template <typename A, typename B> void same_device(const A &a, const B &b, const char *name)
{
    if (a.device_type() != b.device_type() || a.device_id() != b.device_id())
        bad(std::string("flashattn: ") + name + " is on another device than q");
}

template <typename A> int32_t dim_of(const A &a, int i, const char *what)
{
    if (a.shape(i) > (size_t)INT32_MAX)
        bad(std::string("flashattn: ") + what + " exceeds 2^31 - 1");
    return (int32_t)a.shape(i);
}

// fa_forward on q, k, v into o (and lse): fixed-length [b, s, h, d] tensors, or varlen
// [rows, h, d] ones with cu_seqlens (int32 tensors on the same device as q).
void forward(in_array q, in_array k, in_array v, array o, std::optional<array> lse, std::optional<in_array> cu_q,
             std::optional<in_array> cu_k, int max_q, int max_k, float scale, bool causal, int window_left,
             int window_right, float softcap, float dropout_p, uint64_t seed, uint64_t offset, uintptr_t stream,
             bool bf16_bits)
{
    const bool varlen = cu_q.has_value();
    if (varlen != cu_k.has_value())
        throw nb::value_error("flashattn: give cu_seqlens_q and cu_seqlens_k together");
    const int nd = varlen ? 3 : 4;
    same_device(q, k, "k");
    same_device(q, v, "v");
    same_device(q, o, "out");
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.q = view_of(q, "q", nd, bf16_bits);
    d.k = view_of(k, "k", nd, bf16_bits);
    d.v = view_of(v, "v", nd, bf16_bits);
    d.o = view_of(o, "out", nd, bf16_bits);
    std::vector<int32_t> cuq, cuk; // copies: another thread may write the caller's arrays mid-call
    if (varlen) {
        for (const in_array *c : { &*cu_q, &*cu_k }) {
            if (c->ndim() != 1 || c->dtype() != nb::dtype<int32_t>())
                throw nb::value_error("flashattn: cu_seqlens must be 1-d int32 tensors");
            same_device(q, *c, "cu_seqlens");
        }
        if (q.device_type() != nb::device::cpu::value)
            throw nb::value_error("flashattn: varlen calls read cu_seqlens on the host: pass them as CPU tensors");
        if (cu_q->shape(0) != cu_k->shape(0) || cu_q->shape(0) < 2 || (cu_q->stride(0) != 1 && cu_q->shape(0) > 1) ||
            (cu_k->stride(0) != 1 && cu_k->shape(0) > 1))
            bad("flashattn: cu_seqlens_q and cu_seqlens_k must be contiguous, of batch + 1 entries each");
        d.batch = (int32_t)cu_q->shape(0) - 1;
        cuq.assign((const int32_t *)cu_q->data(), (const int32_t *)cu_q->data() + cu_q->shape(0));
        cuk.assign((const int32_t *)cu_k->data(), (const int32_t *)cu_k->data() + cu_k->shape(0));
        d.cu_seqlens_q = cuq.data();
        d.cu_seqlens_k = cuk.data();
        d.seqlen_q = dim_of(q, 0, "total_q"); /* the packed extents; the library checks the offsets */
        d.seqlen_k = dim_of(k, 0, "total_k");
        d.num_heads_q = dim_of(q, 1, "q's heads");
        d.num_heads_kv = dim_of(k, 1, "k's heads");
        d.head_dim = dim_of(q, 2, "q's head_dim");
        for (int32_t b = 0; b < d.batch; b++) { /* FlashAttention-2's bounds, as it documents them */
            const int64_t nq = (int64_t)d.cu_seqlens_q[b + 1] - d.cu_seqlens_q[b];
            const int64_t nk = (int64_t)d.cu_seqlens_k[b + 1] - d.cu_seqlens_k[b];
            if (nq > max_q || nk > max_k)
                bad("flashattn: sequence " + std::to_string(b) + " has " + std::to_string(nq) + " query and " +
                    std::to_string(nk) + " key rows, more than max_seqlen_q (" + std::to_string(max_q) +
                    ") or max_seqlen_k (" + std::to_string(max_k) + ")");
        }
    } else {
        d.batch = dim_of(q, 0, "batch");
        d.seqlen_q = dim_of(q, 1, "q's seqlen");
        d.seqlen_k = dim_of(k, 1, "k's seqlen");
        d.num_heads_q = dim_of(q, 2, "q's heads");
        d.num_heads_kv = dim_of(k, 2, "k's heads");
        d.head_dim = dim_of(q, 3, "q's head_dim");
    }
    /* every tensor's extents agree with the descriptor made from q and k: the library sees
     * pointers and strides only */
    const size_t hd = q.shape(nd - 1);
    if (k.shape(nd - 1) != hd || v.shape(nd - 1) != hd)
        bad("flashattn: k and v must have q's head_dim (" + std::to_string(hd) + "), not " +
            std::to_string(k.shape(nd - 1)) + " and " + std::to_string(v.shape(nd - 1)));
    for (int i = 0; i < nd; i++) {
        if (v.shape(i) != k.shape(i))
            bad("flashattn: v's shape must equal k's (dimension " + std::to_string(i) + ")");
        if (o.shape(i) != q.shape(i))
            bad("flashattn: out's shape must equal q's (dimension " + std::to_string(i) + ")");
    }
    if (!varlen && k.shape(0) != q.shape(0))
        bad("flashattn: k's batch (" + std::to_string(k.shape(0)) + ") must equal q's (" + std::to_string(q.shape(0)) +
            ")");
    if (lse) {
        same_device(q, *lse, "lse");
        if (lse->dtype() != nb::dtype<float>() || lse->ndim() != (size_t)(varlen ? 2 : 3))
            throw nb::value_error(varlen ? "flashattn: lse must be float32 [heads, total_q]"
                                         : "flashattn: lse must be float32 [batch, heads, seqlen_q]");
        const size_t want[3] = { varlen ? (size_t)d.num_heads_q : q.shape(0), varlen ? q.shape(0) : (size_t)d.num_heads_q,
                                 varlen ? 0 : q.shape(1) };
        for (int i = 0; i < (varlen ? 2 : 3); i++)
            if (lse->shape(i) != want[i])
                bad("flashattn: lse's shape must be [" + std::string(varlen ? "heads, total_q" : "batch, heads, seqlen_q") +
                    "] (dimension " + std::to_string(i) + ")");
        d.lse = (float *)lse->data();
        d.lse_stride_batch = varlen ? 0 : lse->stride(0);
        d.lse_stride_head = lse->stride(varlen ? 0 : 1);
        d.lse_stride_seq = lse->stride(varlen ? 1 : 2);
    }
    d.scale = scale;
    d.causal = causal ? 1 : 0;
    d.window_left = window_left;
    d.window_right = window_right;
    d.softcap = softcap;
    d.dropout_p = dropout_p;
    d.dropout_seed = seed;
    d.dropout_offset = offset;
    device_ctx &dc = context_for(q.device_type(), q.device_id());
    fa_status st = FA_OK;
    std::string message;
    {
        nb::gil_scoped_release unlocked;
        std::lock_guard<std::mutex> turn(dc.lock);
        if (q.device_type() == nb::device::cuda::value)
            st = fa_context_set_stream(dc.ctx, (void *)stream);
        if (st == FA_OK)
            st = fa_forward(dc.ctx, &d);
        if (st != FA_OK)
            message = fa_context_last_error(dc.ctx);
    }
    if (st != FA_OK)
        raise(st, message);
}

} // namespace

NB_MODULE(_C, m)
{
    m.doc() = "flashattn's C API over DLPack tensors (use the flashattn package's functions)";
    m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
          nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(), nb::arg("max_seqlen_q"),
          nb::arg("max_seqlen_k"), nb::arg("scale"), nb::arg("causal"), nb::arg("window_left"),
          nb::arg("window_right"), nb::arg("softcap"), nb::arg("dropout_p"), nb::arg("seed"), nb::arg("offset"),
          nb::arg("stream"), nb::arg("bf16_bits"));
    m.def("version", []() { return std::string(fa_version_string()); });
    m.def("backend_is_built", [](const std::string &name) {
        if (name == "cpu")
            return fa_backend_is_built(FA_BACKEND_CPU) != 0;
        if (name == "cuda")
            return fa_backend_is_built(FA_BACKEND_CUDA) != 0;
        if (name == "gles")
            return fa_backend_is_built(FA_BACKEND_GLES) != 0;
        throw nb::value_error("flashattn: backend must be cpu, cuda or gles");
    });
}
