// SPDX-License-Identifier: MIT
// flashattn._C: the C API over DLPack tensors (numpy, torch, CuPy, ... on the CPU or a CUDA
// device), zero copy: every tensor is viewed in place with its own strides, and the outputs
// are the caller's. Library errors become Python exceptions carrying the library's message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <array>
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
// bad arguments are ValueError (a stride refused with the copy to pass), running out of memory
// MemoryError with the library's message.
[[noreturn]] void raise(fa_status st, const std::string &message)
{
    std::string msg = "flashattn: " + message;
    if (st == FA_ERR_OUT_OF_MEMORY) {
        PyErr_SetString(PyExc_MemoryError, msg.c_str());
        throw nb::python_error();
    }
    if (st == FA_ERR_BACKEND || st == FA_ERR_BACKEND_UNAVAILABLE)
        throw std::runtime_error(msg);
    if (st == FA_ERR_INVALID_STRIDE) // the library's field names are element strides of the array
        msg += " (a broadcast, reversed or overlapping view: pass a copy, x.contiguous() in torch or "
               "np.ascontiguousarray in numpy)";
    bad(msg);
}

// call(ctx) on context dc with the GIL released and its lock held (CUDA: on `stream`); a
// failure raised with the message copied under that lock, or with *why where the call set it
// (a failure of the binding's own, such as a plan closed by another thread meanwhile).
template <typename F> void run_in(device_ctx &dc, bool cuda, uintptr_t stream, F call, const char *const *why = nullptr)
{
    fa_status st = FA_OK;
    std::string message;
    {
        nb::gil_scoped_release unlocked;
        std::lock_guard<std::mutex> turn(dc.lock);
        if (cuda)
            st = fa_context_set_stream(dc.ctx, (void *)stream);
        if (st == FA_OK)
            st = call(dc.ctx);
        if (st != FA_OK)
            message = why && *why ? *why : fa_context_last_error(dc.ctx);
    }
    if (st != FA_OK)
        raise(st, message);
}

// call(ctx) on the device of `on`.
template <typename A, typename F> void run_on(const A &on, uintptr_t stream, F call)
{
    run_in(context_for(on.device_type(), on.device_id()), on.device_type() == nb::device::cuda::value, stream, call);
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
    if (bf16_bits && t.code == (uint8_t)nb::dlpack::dtype_code::UInt && t.bits == 8 && t.lanes == 1)
        return FA_DTYPE_E4M3; // a float8_e4m3fn array's bits (numpy ml_dtypes or torch), viewed as uint8
    bad(std::string("flashattn: ") + name + " must be float32, float16 or bfloat16 (got another dtype)");
}

// The element strides of a (at most 4 dimensions) as they address memory: the stride of an
// axis of one element, or of any axis of an empty array, addresses nothing, and such axes get
// the contiguous stride (numpy gives 0 to an axis inserted by x[:, None]).
template <typename A> void addressing_strides(const A &a, int64_t *st)
{
    const int n = (int)a.ndim();
    bool empty = false;
    for (int i = 0; i < n; i++)
        empty |= a.shape(i) == 0;
    int64_t run = 1;
    for (int i = n - 1; i >= 0; i--) {
        st[i] = empty || a.shape(i) <= 1 ? run : (int64_t)a.stride(i);
        run *= a.shape(i) > 1 ? (int64_t)a.shape(i) : 1;
    }
}

// A [batch, seq, heads, dim] (or [rows, heads, dim]) view of a, its last dimension contiguous.
template <typename A> fa_tensor view_of(const A &a, const char *name, int ndim, bool bf16_bits)
{
    if ((int)a.ndim() != ndim)
        bad(std::string("flashattn: ") + name + " must have " + std::to_string(ndim) + " dimensions, not " +
            std::to_string(a.ndim()));
    int64_t st[4] = { 0, 0, 0, 0 };
    addressing_strides(a, st);
    if (st[ndim - 1] != 1)
        bad(std::string("flashattn: ") + name +
            "'s last dimension is strided; flashattn reads head_dim contiguously: pass a contiguous copy "
            "(x.contiguous() in torch, np.ascontiguousarray in numpy)");
    fa_tensor t;
    t.data = (void *)a.data();
    t.dtype = dtype_of(a, name, bf16_bits);
    t.stride_batch = ndim == 4 ? st[0] : 0;
    t.stride_seq = st[ndim - 3];
    t.stride_head = st[ndim - 2];
    return t;
}

// The element strides of a float32 lse array (addressing_strides), every one positive: the
// library reads all-zero lse strides as "packed", so a broadcast array must never reach it.
template <typename A> std::array<int64_t, 3> lse_strides(const A &a, const char *name)
{
    std::array<int64_t, 3> st = { 0, 0, 0 };
    addressing_strides(a, st.data());
    for (int i = 0; i < (int)a.ndim(); i++)
        if (st[i] <= 0)
            bad(std::string("flashattn: ") + name + "'s dimension " + std::to_string(i) + " has stride " +
                std::to_string(st[i]) + " (a broadcast or reversed view): pass a copy, x.contiguous() in torch "
                "or np.ascontiguousarray in numpy");
    return st;
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

// One dense or varlen call's descriptor, with its own copies of cu_seqlens (another thread
// may write the caller's arrays mid-call): the descriptor points into them.
struct dense_call {
    fa_attention_desc d;
    std::vector<int32_t> cuq, cuk;
};

// The descriptor of q, k, v, o (and lse): fixed-length [b, s, h, d] tensors, or varlen
// [rows, h, d] ones with cu_seqlens (int32 CPU tensors: the library reads them on the host on
// every backend). Every extent is checked against q's and k's; the library sees pointers and
// strides only.
template <typename O, typename L>
void describe(dense_call &c, const in_array &q, const in_array &k, const in_array &v, const O &o, const L *lse,
              const std::optional<in_array> &cu_q, const std::optional<in_array> &cu_k, int max_q, int max_k,
              float scale, bool causal, int window_left, int window_right, float softcap, float dropout_p,
              uint64_t seed, uint64_t offset, bool bf16_bits)
{
    const bool varlen = cu_q.has_value();
    if (varlen != cu_k.has_value())
        throw nb::value_error("flashattn: give cu_seqlens_q and cu_seqlens_k together");
    const int nd = varlen ? 3 : 4;
    same_device(q, k, "k");
    same_device(q, v, "v");
    same_device(q, o, "out");
    fa_attention_desc &d = c.d;
    fa_attention_desc_init(&d);
    d.q = view_of(q, "q", nd, bf16_bits);
    d.k = view_of(k, "k", nd, bf16_bits);
    d.v = view_of(v, "v", nd, bf16_bits);
    d.o = view_of(o, "out", nd, bf16_bits);
    if (varlen) {
        for (const in_array *a : { &*cu_q, &*cu_k }) {
            if (a->ndim() != 1 || a->dtype() != nb::dtype<int32_t>())
                throw nb::value_error("flashattn: cu_seqlens must be 1-d int32 tensors");
            if (a->device_type() != nb::device::cpu::value)
                bad("flashattn: cu_seqlens must be CPU tensors: the library reads them on the host on every "
                    "backend (keep a CPU copy beside the device one; .cpu() would synchronise each call)");
        }
        if (cu_q->shape(0) != cu_k->shape(0) || cu_q->shape(0) < 2 || (cu_q->stride(0) != 1 && cu_q->shape(0) > 1) ||
            (cu_k->stride(0) != 1 && cu_k->shape(0) > 1))
            bad("flashattn: cu_seqlens_q and cu_seqlens_k must be contiguous, of batch + 1 entries each");
        d.batch = (int32_t)cu_q->shape(0) - 1;
        c.cuq.assign((const int32_t *)cu_q->data(), (const int32_t *)cu_q->data() + cu_q->shape(0));
        c.cuk.assign((const int32_t *)cu_k->data(), (const int32_t *)cu_k->data() + cu_k->shape(0));
        d.cu_seqlens_q = c.cuq.data();
        d.cu_seqlens_k = c.cuk.data();
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
        const std::array<int64_t, 3> ls = lse_strides(*lse, "lse");
        d.lse_stride_batch = varlen ? 0 : ls[0];
        d.lse_stride_head = ls[varlen ? 0 : 1];
        d.lse_stride_seq = ls[varlen ? 1 : 2];
    }
    d.scale = scale;
    d.causal = causal ? 1 : 0;
    d.window_left = window_left;
    d.window_right = window_right;
    d.softcap = softcap;
    d.dropout_p = dropout_p;
    d.dropout_seed = seed;
    d.dropout_offset = offset;
}

// fa_forward on q, k, v into o (and lse).
void forward(in_array q, in_array k, in_array v, array o, std::optional<array> lse, std::optional<in_array> cu_q,
             std::optional<in_array> cu_k, int max_q, int max_k, float scale, bool causal, int window_left,
             int window_right, float softcap, float dropout_p, uint64_t seed, uint64_t offset, uintptr_t stream,
             bool bf16_bits)
{
    dense_call c;
    describe(c, q, k, v, o, lse ? &*lse : nullptr, cu_q, cu_k, max_q, max_k, scale, causal, window_left,
             window_right, softcap, dropout_p, seed, offset, bf16_bits);
    run_on(q, stream, [&](fa_context_t ctx) { return fa_forward(ctx, &c.d); });
}

// fa_forward on fp8 (e4m3) q, k, v (their bits as uint8) into o (bf16 bits as uint16, or
// float32), with FlashAttention-3's descale factors: float32 [batch, num_heads_kv] each (varlen:
// batch = sequences), any strides (an expanded scalar is one factor for all), None for 1; with
// its block_rows > 0 (q's, k's, v's), a tensor's are [batch, num_heads_kv, blocks] instead, one
// per block of that many rows, blocks = ceil(seqlen / block_rows) (varlen: the packed rows).
void forward_fp8(in_array q, in_array k, in_array v, array o, std::optional<array> lse, std::optional<in_array> cu_q,
                 std::optional<in_array> cu_k, int max_q, int max_k, std::optional<in_array> q_descale,
                 std::optional<in_array> k_descale, std::optional<in_array> v_descale, int q_block_rows,
                 int k_block_rows, int v_block_rows, float scale, bool causal, int window_left, int window_right,
                 float softcap, float dropout_p, uint64_t seed, uintptr_t stream)
{
    dense_call c;
    describe(c, q, k, v, o, lse ? &*lse : nullptr, cu_q, cu_k, max_q, max_k, scale, causal, window_left,
             window_right, softcap, dropout_p, seed, 0, true);
    if (c.d.q.dtype != FA_DTYPE_E4M3)
        bad("flashattn: q_descale, k_descale and v_descale are for float8_e4m3fn inputs");
    const struct {
        const std::optional<in_array> &a;
        const char *name;
        fa_descale *out;
        int block_rows, rows;
    } ds[] = { { q_descale, "q_descale", &c.d.q_descale, q_block_rows, c.d.seqlen_q },
               { k_descale, "k_descale", &c.d.k_descale, k_block_rows, c.d.seqlen_k },
               { v_descale, "v_descale", &c.d.v_descale, v_block_rows, c.d.seqlen_k } };
    for (const auto &x : ds) {
        if (!x.a)
            continue;
        const in_array &a = *x.a;
        same_device(q, a, x.name);
        const size_t blocks = x.block_rows > 0 ? ((size_t)x.rows + x.block_rows - 1) / x.block_rows : 0;
        if (a.dtype() != nb::dtype<float>() || a.ndim() != (x.block_rows > 0 ? 3u : 2u) ||
            a.shape(0) != (size_t)c.d.batch || a.shape(1) != (size_t)c.d.num_heads_kv ||
            (x.block_rows > 0 && a.shape(2) != blocks))
            bad(std::string("flashattn: ") + x.name + " must be float32 [batch, num_heads_kv" +
                (x.block_rows > 0 ? ", blocks" : "") + "] ([" + std::to_string(c.d.batch) + ", " +
                std::to_string(c.d.num_heads_kv) + (x.block_rows > 0 ? ", " + std::to_string(blocks) : "") +
                "] here" + (x.block_rows > 0 ? ": a factor per block of " + std::to_string(x.block_rows) + " rows" : "") +
                ")");
        int64_t st[3] = { 0, 0, 0 }; // an axis of one element: stride 0, whatever the array says
        for (size_t i = 0; i < a.ndim(); i++)
            st[i] = a.shape(i) > 1 ? a.stride(i) : 0;
        *x.out = fa_descale{ (const float *)a.data(), st[0], st[1], st[2], x.block_rows };
    }
    run_on(q, stream, [&](fa_context_t ctx) { return fa_forward(ctx, &c.d); });
}

// fa_backward: the forward's q, k, v, o and lse (required) with every setting as the forward
// had them, and d_o like o; writes d_q like q and d_k, d_v like k and v (q's dtype or
// float32, any strides with head_dim contiguous).
void backward(in_array q, in_array k, in_array v, in_array o, in_array lse, in_array d_o, array d_q, array d_k,
              array d_v, std::optional<in_array> cu_q, std::optional<in_array> cu_k, int max_q, int max_k,
              float scale, bool causal, int window_left, int window_right, float softcap, float dropout_p,
              uint64_t seed, uint64_t offset, uintptr_t stream, bool bf16_bits)
{
    dense_call c;
    describe(c, q, k, v, o, &lse, cu_q, cu_k, max_q, max_k, scale, causal, window_left, window_right, softcap,
             dropout_p, seed, offset, bf16_bits);
    const int nd = cu_q ? 3 : 4;
    same_device(q, d_o, "dout");
    same_device(q, d_q, "dq");
    same_device(q, d_k, "dk");
    same_device(q, d_v, "dv");
    fa_backward_desc b;
    fa_backward_desc_init(&b);
    b.forward = &c.d;
    b.d_o = view_of(d_o, "dout", nd, bf16_bits);
    b.d_q = view_of(d_q, "dq", nd, bf16_bits);
    b.d_k = view_of(d_k, "dk", nd, bf16_bits);
    b.d_v = view_of(d_v, "dv", nd, bf16_bits);
    for (int i = 0; i < nd; i++) {
        if (d_o.shape(i) != q.shape(i) || d_q.shape(i) != q.shape(i))
            bad("flashattn: dout and dq must have q's shape (dimension " + std::to_string(i) + ")");
        if (d_k.shape(i) != k.shape(i) || d_v.shape(i) != k.shape(i))
            bad("flashattn: dk and dv must have k's shape (dimension " + std::to_string(i) + ")");
    }
    run_on(q, stream, [&](fa_context_t ctx) { return fa_backward(ctx, &b); });
}

// fa_paged_forward: q [total_q, h, d] (rows of sequence b from cu_q[b]) over a cache of
// [pages, page_size, kv_heads, d] through block_table [batch, max_pages] and cache_seqlens
// [batch], k_new / v_new [total_q, kv_heads, d] appended first (RoPE applied with rope_cos /
// rope_sin [max_pos, rope_dim / 2]: rope 0 none, 1 NeoX, 2 interleaved). Every table lives on
// q's device (the CUDA backend reads them there). The caches may be read-only arrays: the
// Python layer refuses those where k_new and v_new are given (flashattn/__init__.py: _writable).
struct paged_call {
    fa_paged_desc d;
    std::vector<int32_t> cu_copy, bt_copy, len_copy; /* host tables, copied */
};

void describe_paged(paged_call &c, const in_array &q, const array &o, const in_array &k_cache, const in_array &v_cache,
                    const in_array &block_table, const in_array &cu_q, const in_array &cache_seqlens,
                    const std::optional<in_array> &k_new, const std::optional<in_array> &v_new,
                    const std::optional<in_array> &rope_cos, const std::optional<in_array> &rope_sin, int rope,
                    const std::optional<array> &lse, int max_q, int max_k, float scale, bool causal,
                    int window_left, int window_right, float softcap, bool bf16_bits)
{
    same_device(q, o, "out");
    same_device(q, k_cache, "k_cache");
    same_device(q, v_cache, "v_cache");
    for (const in_array *t : { &block_table, &cu_q, &cache_seqlens })
        if (t->dtype() != nb::dtype<int32_t>() || (t->ndim() == 1 ? t->stride(0) != 1 && t->shape(0) > 1 : false))
            bad("flashattn: block_table, cu_seqlens and cache_seqlens must be contiguous int32 tensors");
    if (block_table.ndim() != 2 || cu_q.ndim() != 1 || cache_seqlens.ndim() != 1 ||
        cache_seqlens.shape(0) + 1 != cu_q.shape(0) || block_table.shape(0) != cache_seqlens.shape(0) ||
        (block_table.shape(1) > 1 && block_table.stride(1) != 1))
        bad("flashattn: block_table must be [batch, max_pages] (rows contiguous), cache_seqlens [batch], "
            "cu_seqlens [batch + 1]");
    same_device(q, block_table, "block_table");
    same_device(q, cu_q, "cu_seqlens");
    same_device(q, cache_seqlens, "cache_seqlens");
    if (k_cache.ndim() != 4 || v_cache.ndim() != 4)
        bad("flashattn: k_cache and v_cache must be [pages, page_size, kv_heads, head_dim]");
    for (int i = 0; i < 4; i++)
        if (k_cache.shape(i) != v_cache.shape(i))
            bad("flashattn: v_cache's shape must equal k_cache's");
    fa_paged_desc &d = c.d;
    fa_paged_desc_init(&d);
    d.q = view_of(q, "q", 3, bf16_bits);
    d.o = view_of(o, "out", 3, bf16_bits);
    for (int i = 0; i < 3; i++)
        if (o.shape(i) != q.shape(i))
            bad("flashattn: out's shape must equal q's");
    if (k_cache.shape(3) != q.shape(2))
        bad("flashattn: k_cache must have q's head_dim");
    const fa_tensor kc = view_of(k_cache, "k_cache", 4, bf16_bits), vc = view_of(v_cache, "v_cache", 4, bf16_bits);
    if (vc.dtype != kc.dtype) /* the library takes one dtype for both pools */
        bad("flashattn: v_cache's dtype must equal k_cache's");
    d.batch = dim_of(cache_seqlens, 0, "batch");
    d.total_q = dim_of(q, 0, "total_q");
    d.max_seqlen_q = max_q;
    d.max_seqlen_k = max_k;
    d.num_heads_q = dim_of(q, 1, "q's heads");
    d.head_dim = dim_of(q, 2, "q's head_dim");
    /* on the CPU the library reads the tables on the host, twice (checks, then the walk):
     * copies, so another thread writing the caller's arrays cannot slip between */
    const bool host = q.device_type() == nb::device::cpu::value;
    std::vector<int32_t> &cu_copy = c.cu_copy, &bt_copy = c.bt_copy, &len_copy = c.len_copy;
    /* before any read of the table: its rows one after another (a broadcast or reversed table
     * would have the copy below read past its buffer) */
    if (block_table.shape(0) > 1 && block_table.stride(0) != (int64_t)block_table.shape(1))
        bad("flashattn: block_table's rows must be contiguous one after another");
    if (host) {
        cu_copy.assign((const int32_t *)cu_q.data(), (const int32_t *)cu_q.data() + cu_q.shape(0));
        bt_copy.assign((const int32_t *)block_table.data(),
                       (const int32_t *)block_table.data() + block_table.shape(0) * block_table.shape(1));
        len_copy.assign((const int32_t *)cache_seqlens.data(),
                        (const int32_t *)cache_seqlens.data() + cache_seqlens.shape(0));
    }
    d.cu_seqlens_q = host ? cu_copy.data() : (const int32_t *)cu_q.data();
    d.cache.k = kc.data;
    d.cache.v = vc.data;
    d.cache.dtype = kc.dtype;
    d.cache.num_pages = dim_of(k_cache, 0, "pages");
    d.cache.page_size = dim_of(k_cache, 1, "page_size");
    d.cache.num_heads = dim_of(k_cache, 2, "kv heads");
    d.cache.k_stride_page = kc.stride_batch, d.cache.k_stride_token = kc.stride_seq, d.cache.k_stride_head = kc.stride_head;
    d.cache.v_stride_page = vc.stride_batch, d.cache.v_stride_token = vc.stride_seq, d.cache.v_stride_head = vc.stride_head;
    d.block_table = host ? bt_copy.data() : (const int32_t *)block_table.data();
    d.max_pages_per_seq = dim_of(block_table, 1, "max_pages");
    d.cache_seqlens = host ? len_copy.data() : (const int32_t *)cache_seqlens.data();
    if (k_new.has_value() != v_new.has_value())
        bad("flashattn: give k and v together");
    if (k_new) {
        same_device(q, *k_new, "k");
        same_device(q, *v_new, "v");
        d.k_new = view_of(*k_new, "k", 3, bf16_bits);
        d.v_new = view_of(*v_new, "v", 3, bf16_bits);
        for (int i = 0; i < 3; i++)
            if (k_new->shape(i) != v_new->shape(i) || k_new->shape(i) != (i == 0 ? q.shape(0) : k_cache.shape(i + 1)))
                bad("flashattn: k and v must be [total_q, kv_heads, head_dim], one new row per query row");
    }
    if (rope) {
        if (!rope_cos || !rope_sin)
            bad("flashattn: rotary_cos and rotary_sin go together");
        for (const in_array *t : { &*rope_cos, &*rope_sin }) {
            same_device(q, *t, "rotary tables");
            if (t->dtype() != nb::dtype<float>() || t->ndim() != 2 || (t->shape(1) > 1 && t->stride(1) != 1) ||
                t->stride(0) != (int64_t)t->shape(1))
                bad("flashattn: rotary_cos and rotary_sin must be contiguous float32 [max_pos, rotary_dim / 2]");
        }
        if (rope_cos->shape(0) != rope_sin->shape(0) || rope_cos->shape(1) != rope_sin->shape(1))
            bad("flashattn: rotary_cos and rotary_sin must have one shape");
        if (rope_cos->shape(1) == 0) /* rope_dim 0 would mean the whole head_dim to the library */
            bad("flashattn: rotary_cos and rotary_sin have no columns: they are [max_pos, rotary_dim / 2], "
                "rotary_dim at least 2");
        d.rope = rope == 1 ? FA_ROPE_NEOX : FA_ROPE_INTERLEAVED;
        d.rope_dim = 2 * dim_of(*rope_cos, 1, "rotary_dim");
        d.rope_max_pos = dim_of(*rope_cos, 0, "rotary positions");
        d.rope_cos = (const float *)rope_cos->data();
        d.rope_sin = (const float *)rope_sin->data();
    }
    if (lse) {
        same_device(q, *lse, "lse");
        if (lse->dtype() != nb::dtype<float>() || lse->ndim() != 2 || lse->shape(0) != q.shape(1) ||
            lse->shape(1) != q.shape(0))
            bad("flashattn: lse must be float32 [heads, total_q]");
        d.lse = (float *)lse->data();
        const std::array<int64_t, 3> ls = lse_strides(*lse, "lse");
        d.lse_stride_head = ls[0];
        d.lse_stride_seq = ls[1];
    }
    d.scale = scale;
    d.causal = causal ? 1 : 0;
    d.window_left = window_left;
    d.window_right = window_right;
    d.softcap = softcap;
}

void paged_forward(in_array q, array o, in_array k_cache, in_array v_cache, in_array block_table, in_array cu_q,
                   in_array cache_seqlens, std::optional<in_array> k_new, std::optional<in_array> v_new,
                   std::optional<in_array> rope_cos, std::optional<in_array> rope_sin, int rope,
                   std::optional<array> lse, int max_q, int max_k, float scale, bool causal, int window_left,
                   int window_right, float softcap, uintptr_t stream, bool bf16_bits)
{
    paged_call c;
    describe_paged(c, q, o, k_cache, v_cache, block_table, cu_q, cache_seqlens, k_new, v_new, rope_cos, rope_sin,
                   rope, lse, max_q, max_k, scale, causal, window_left, window_right, softcap, bf16_bits);
    run_on(q, stream, [&](fa_context_t ctx) { return fa_paged_forward(ctx, &c.d); });
}

// fa_paged_plan for a serving loop: made once from host-side bounds and settings (no tensor),
// run per step on tensors within them. The plan keeps its context (made for the process) and
// takes that context's lock for every call, its destruction included.
struct paged_plan {
    device_ctx *dc;
    int device_type, device_id;
    fa_paged_plan_t plan = nullptr;
    fa_paged_desc bounds;
    int rope;

    paged_plan(int device_type_, int device_id_, int batch, int total_q, int max_q, int max_k, int heads_q,
               int heads_kv, int head_dim, int page_size, int dtype, bool append, int rope_, int rope_dim,
               bool with_lse, float scale, bool causal, int window_left, int window_right, float softcap,
               int kv_split, uintptr_t stream)
        : device_type(device_type_), device_id(device_id_), rope(rope_)
    {
        if (dtype < FA_DTYPE_F32 || dtype > FA_DTYPE_BF16 || rope < 0 || rope > 2)
            bad("flashattn: dtype and rope must be fa_dtype and fa_rope values");
        if (page_size < 1)
            bad("flashattn: page_size (" + std::to_string(page_size) + ") must be at least 1");
        dc = &context_for(device_type, device_id);
        static int present; /* stands for the pointers whose presence the plan records */
        fa_paged_desc &b = bounds;
        fa_paged_desc_init(&b);
        b.batch = batch, b.total_q = total_q, b.max_seqlen_q = max_q, b.max_seqlen_k = max_k;
        b.num_heads_q = heads_q, b.head_dim = head_dim;
        b.q.dtype = b.o.dtype = b.cache.dtype = (fa_dtype)dtype;
        b.cache.num_pages = 1, b.cache.page_size = page_size, b.cache.num_heads = heads_kv;
        b.max_pages_per_seq = std::max(1, (int)(((int64_t)max_k + page_size - 1) / page_size));
        if (append) {
            b.k_new.data = b.v_new.data = &present;
            b.k_new.dtype = b.v_new.dtype = (fa_dtype)dtype;
        }
        b.rope = rope == 0 ? FA_ROPE_NONE : rope == 1 ? FA_ROPE_NEOX : FA_ROPE_INTERLEAVED;
        b.rope_dim = rope_dim, b.rope_max_pos = 1;
        b.lse = with_lse ? (float *)&present : nullptr;
        b.scale = scale, b.causal = causal ? 1 : 0, b.window_left = window_left, b.window_right = window_right;
        b.softcap = softcap, b.kv_split = kv_split;
        /* CUDA: the workspace comes from the context's pool on `stream` (the caller's), which
         * orders it before the runs queued there and its release after them */
        run_in(*dc, device_type == nb::device::cuda::value, stream,
               [&](fa_context_t ctx) { return fa_paged_plan_create(ctx, &b, &plan); });
    }
    paged_plan(const paged_plan &) = delete;
    paged_plan &operator=(const paged_plan &) = delete;
    ~paged_plan() { close(); }

    void close()
    {
        std::lock_guard<std::mutex> turn(dc->lock);
        fa_paged_plan_destroy(plan);
        plan = nullptr;
    }

    void run(in_array q, array o, in_array k_cache, in_array v_cache, in_array block_table, in_array cu_q,
             in_array cache_seqlens, std::optional<in_array> k_new, std::optional<in_array> v_new,
             std::optional<in_array> rope_cos, std::optional<in_array> rope_sin, std::optional<array> lse,
             uintptr_t stream, bool bf16_bits)
    {
        if (!plan)
            bad("flashattn: the plan is closed");
        if ((int)q.device_type() != device_type || (int)q.device_id() != device_id)
            bad("flashattn: q is on another device than the plan's");
        if (k_cache.ndim() != 4 || block_table.ndim() != 2)
            bad("flashattn: k_cache must be [pages, page_size, kv_heads, head_dim] and block_table "
                "[batch, max_pages]");
        /* the plan's bounds, clipped to what this call's block_table can hold */
        const int64_t room = (int64_t)block_table.shape(1) * (int64_t)k_cache.shape(1);
        const int max_k = room < bounds.max_seqlen_k ? (int)room : bounds.max_seqlen_k;
        paged_call c;
        describe_paged(c, q, o, k_cache, v_cache, block_table, cu_q, cache_seqlens, k_new, v_new, rope_cos, rope_sin,
                       rope, lse, bounds.max_seqlen_q, max_k, bounds.scale, bounds.causal != 0, bounds.window_left,
                       bounds.window_right, bounds.softcap, bf16_bits);
        c.d.kv_split = bounds.kv_split; /* rope_dim: the tables' width, checked against the plan's */
        const char *why = nullptr; // closed by another thread since the test above
        run_in(
            *dc, device_type == nb::device::cuda::value, stream,
            [&](fa_context_t) {
                if (!plan)
                    why = "the plan is closed";
                return plan ? fa_paged_run(plan, &c.d) : FA_ERR_INVALID_ARGUMENT;
            },
            &why);
    }

    nb::dict info()
    {
        if (!plan)
            bad("flashattn: the plan is closed");
        fa_run_info ri;
        ri.size = sizeof(ri);
        const char *why = nullptr;
        run_in(
            *dc, false, 0,
            [&](fa_context_t) {
                if (!plan)
                    why = "the plan is closed";
                return plan ? fa_paged_plan_info(plan, &ri) : FA_ERR_INVALID_ARGUMENT;
            },
            &why);
        nb::dict r;
        r["backend"] = std::string(ri.backend_name ? ri.backend_name : "");
        r["kernel"] = std::string(ri.kernel ? ri.kernel : "");
        r["block_q"] = ri.block_q;
        r["block_k"] = ri.block_k;
        r["threads"] = ri.threads;
        r["workspace_bytes"] = ri.workspace_bytes;
        return r;
    }
};

// fa_merge_states: partial results o_in [states, rows, heads, dim] with lse_in float32
// [states, heads, rows] (natural log) over disjoint keys into o [rows, heads, dim] and lse
// [heads, rows].
void merge(in_array o_in, in_array lse_in, array o, std::optional<array> lse, uintptr_t stream, bool bf16_bits)
{
    same_device(o_in, o, "out");
    same_device(o_in, lse_in, "lse");
    if (o_in.ndim() != 4 || lse_in.ndim() != 3 || o.ndim() != 3)
        bad("flashattn: merge_states takes o [states, rows, heads, head_dim] and lse [states, heads, rows]");
    if (lse_in.dtype() != nb::dtype<float>() || lse_in.shape(0) != o_in.shape(0) ||
        lse_in.shape(1) != o_in.shape(2) || lse_in.shape(2) != o_in.shape(1))
        bad("flashattn: merge_states' lse must be float32 [states, heads, rows] matching o");
    for (int i = 0; i < 3; i++)
        if (o.shape(i) != o_in.shape(i + 1))
            bad("flashattn: merge_states' out must be [rows, heads, head_dim]");
    fa_merge_desc d;
    fa_merge_desc_init(&d);
    d.num_states = dim_of(o_in, 0, "states");
    d.rows = dim_of(o_in, 1, "rows");
    d.num_heads = dim_of(o_in, 2, "heads");
    d.head_dim = dim_of(o_in, 3, "head_dim");
    d.o_in = view_of(o_in, "o", 4, bf16_bits);
    d.lse_in = (const float *)lse_in.data();
    const std::array<int64_t, 3> li = lse_strides(lse_in, "lse");
    d.lse_in_stride_state = li[0], d.lse_in_stride_head = li[1], d.lse_in_stride_row = li[2];
    d.o = view_of(o, "out", 3, bf16_bits);
    if (lse) {
        same_device(o_in, *lse, "lse out");
        if (lse->dtype() != nb::dtype<float>() || lse->ndim() != 2 || lse->shape(0) != o_in.shape(2) ||
            lse->shape(1) != o_in.shape(1))
            bad("flashattn: merge_states' lse out must be float32 [heads, rows]");
        d.lse = (float *)lse->data();
        const std::array<int64_t, 3> lo = lse_strides(*lse, "lse out");
        d.lse_stride_head = lo[0], d.lse_stride_row = lo[1];
    }
    run_on(o_in, stream, [&](fa_context_t ctx) { return fa_merge_states(ctx, &d); });
}

// fa_context_info of the context serving a device (made on first use, as a call makes it).
std::string context_info(int device_type, int device_id)
{
    device_ctx &dc = context_for(device_type, device_id);
    std::lock_guard<std::mutex> turn(dc.lock);
    size_t need = 0;
    fa_context_info(dc.ctx, nullptr, 0, &need);
    std::string text(need, '\0');
    if (need && fa_context_info(dc.ctx, &text[0], need, nullptr) != FA_OK)
        throw std::runtime_error(std::string("flashattn: ") + fa_context_last_error(dc.ctx));
    text.resize(need ? need - 1 : 0);
    return text;
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
    m.def("forward_fp8", &forward_fp8, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
          nb::arg("lse").none(), nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(),
          nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("q_descale").none(), nb::arg("k_descale").none(),
          nb::arg("v_descale").none(), nb::arg("q_block_rows"), nb::arg("k_block_rows"), nb::arg("v_block_rows"),
          nb::arg("scale"), nb::arg("causal"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"),
          nb::arg("dropout_p"), nb::arg("seed"), nb::arg("stream"));
    m.def("paged_forward", &paged_forward, nb::arg("q"), nb::arg("out"), nb::arg("k_cache"), nb::arg("v_cache"),
          nb::arg("block_table"), nb::arg("cu_seqlens_q"), nb::arg("cache_seqlens"), nb::arg("k").none(),
          nb::arg("v").none(), nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(), nb::arg("rope"),
          nb::arg("lse").none(), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
          nb::arg("scale"), nb::arg("causal"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"),
          nb::arg("stream"), nb::arg("bf16_bits"));
    m.def("backward", &backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
          nb::arg("dout"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("cu_seqlens_q").none(),
          nb::arg("cu_seqlens_k").none(), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("scale"),
          nb::arg("causal"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"),
          nb::arg("dropout_p"), nb::arg("seed"), nb::arg("offset"), nb::arg("stream"), nb::arg("bf16_bits"));
    nb::class_<paged_plan>(m, "PagedPlan")
        .def(nb::init<int, int, int, int, int, int, int, int, int, int, int, bool, int, int, bool, float, bool, int,
                      int, float, int, uintptr_t>(),
             nb::arg("device_type"), nb::arg("device_id"), nb::arg("batch"), nb::arg("total_q"),
             nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("num_heads_q"), nb::arg("num_heads_kv"),
             nb::arg("head_dim"), nb::arg("page_size"), nb::arg("dtype"), nb::arg("append"), nb::arg("rope"),
             nb::arg("rope_dim"), nb::arg("lse"), nb::arg("scale"), nb::arg("causal"), nb::arg("window_left"),
             nb::arg("window_right"), nb::arg("softcap"), nb::arg("kv_split"), nb::arg("stream"))
        .def("run", &paged_plan::run, nb::arg("q"), nb::arg("out"), nb::arg("k_cache"), nb::arg("v_cache"),
             nb::arg("block_table"), nb::arg("cu_seqlens_q"), nb::arg("cache_seqlens"), nb::arg("k").none(),
             nb::arg("v").none(), nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(), nb::arg("lse").none(),
             nb::arg("stream"), nb::arg("bf16_bits"))
        .def("info", &paged_plan::info)
        .def("close", &paged_plan::close);
    m.def("merge", &merge, nb::arg("o"), nb::arg("lse"), nb::arg("out"), nb::arg("lse_out").none(),
          nb::arg("stream"), nb::arg("bf16_bits"));
    m.def("version", []() { return std::string(fa_version_string()); });
    m.def("info", &context_info, nb::arg("device_type"), nb::arg("device_id"));
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
