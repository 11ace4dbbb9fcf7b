# SPDX-License-Identifier: MIT
"""flashattn's C API through ctypes, for benchmarks beside PyTorch (tensors stay on the GPU)."""
import ctypes as C
import os

FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16, FA_DTYPE_E4M3 = 0, 1, 2, 3
FA_BACKEND_CUDA = 2
FA_ALGORITHM_FLASH, FA_ALGORITHM_STANDARD = 0, 1


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("stride_batch", C.c_int64),
                ("stride_seq", C.c_int64), ("stride_head", C.c_int64)]


class Descale(C.Structure):
    _fields_ = [("data", C.c_void_p), ("stride_batch", C.c_int64), ("stride_head", C.c_int64),
                ("stride_block", C.c_int64), ("block_rows", C.c_int32)]


class AttentionDesc(C.Structure):
    _fields_ = [("size", C.c_size_t), ("batch", C.c_int32), ("seqlen_q", C.c_int32),
                ("seqlen_k", C.c_int32), ("num_heads_q", C.c_int32), ("num_heads_kv", C.c_int32),
                ("head_dim", C.c_int32), ("q", Tensor), ("k", Tensor), ("v", Tensor), ("o", Tensor),
                ("lse", C.c_void_p), ("lse_stride_batch", C.c_int64), ("lse_stride_head", C.c_int64),
                ("lse_stride_seq", C.c_int64), ("scale", C.c_float), ("causal", C.c_int32),
                ("window_left", C.c_int32), ("window_right", C.c_int32), ("softcap", C.c_float),
                ("cu_seqlens_q", C.c_void_p), ("cu_seqlens_k", C.c_void_p), ("dropout_p", C.c_float),
                ("dropout_seed", C.c_uint64), ("dropout_offset", C.c_uint64), ("algorithm", C.c_int),
                ("q_descale", Descale), ("k_descale", Descale), ("v_descale", Descale)]


class BackwardDesc(C.Structure):
    _fields_ = [("size", C.c_size_t), ("forward", C.POINTER(AttentionDesc)), ("d_o", Tensor),
                ("d_q", Tensor), ("d_k", Tensor), ("d_v", Tensor)]


class ContextOptions(C.Structure):
    _fields_ = [("size", C.c_size_t), ("backend", C.c_int), ("num_threads", C.c_int32)]


class RunInfo(C.Structure):
    _fields_ = [("size", C.c_size_t), ("backend", C.c_int), ("backend_name", C.c_char_p),
                ("kernel", C.c_char_p), ("block_q", C.c_int32), ("block_k", C.c_int32),
                ("threads", C.c_int32), ("workspace_bytes", C.c_uint64), ("device_ms", C.c_double)]


def load(path=None):
    lib = C.CDLL(path or os.environ.get("FLASHATTN_LIB", "build/libflashattn.so"))
    lib.fa_context_create.argtypes = [C.POINTER(ContextOptions), C.POINTER(C.c_void_p)]
    lib.fa_last_create_error.restype = C.c_char_p
    lib.fa_context_last_error.restype = C.c_char_p
    lib.fa_context_last_error.argtypes = [C.c_void_p]
    lib.fa_context_set_stream.argtypes = [C.c_void_p, C.c_void_p]
    lib.fa_forward.argtypes = [C.c_void_p, C.POINTER(AttentionDesc)]
    lib.fa_backward.argtypes = [C.c_void_p, C.POINTER(BackwardDesc)]
    lib.fa_context_last_run.argtypes = [C.c_void_p, C.POINTER(RunInfo)]
    lib.fa_attention_desc_init.argtypes = [C.POINTER(AttentionDesc)]
    lib.fa_backward_desc_init.argtypes = [C.POINTER(BackwardDesc)]
    lib.fa_context_info.argtypes = [C.c_void_p, C.c_char_p, C.c_size_t, C.POINTER(C.c_size_t)]
    return lib


def dtype_of(t):
    import torch
    return {torch.bfloat16: FA_DTYPE_BF16, torch.float16: FA_DTYPE_F16, torch.float32: FA_DTYPE_F32}[t.dtype]


def view(t):
    """A [batch, seq, heads, dim] torch tensor (any strides, dim contiguous) as an fa_tensor."""
    assert t.stride(3) == 1
    return Tensor(t.data_ptr(), dtype_of(t), t.stride(0), t.stride(1), t.stride(2))


class Context:
    def __init__(self, lib, stream=None):
        self.lib = lib
        self.ctx = C.c_void_p()
        opts = ContextOptions(C.sizeof(ContextOptions), FA_BACKEND_CUDA, 0)
        st = lib.fa_context_create(C.byref(opts), C.byref(self.ctx))
        if st != 0:
            raise RuntimeError(lib.fa_last_create_error().decode())
        if stream is not None:
            self.check(lib.fa_context_set_stream(self.ctx, C.c_void_p(stream)))

    def check(self, st):
        if st != 0:
            raise RuntimeError(self.lib.fa_context_last_error(self.ctx).decode())

    def info(self):
        buf = C.create_string_buffer(8192)
        self.check(self.lib.fa_context_info(self.ctx, buf, 8192, None))
        return buf.value.decode()

    def desc(self, q, k, v, o, lse=None, causal=False):
        d = AttentionDesc()
        self.lib.fa_attention_desc_init(C.byref(d))
        d.batch, d.seqlen_q, d.num_heads_q, d.head_dim = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
        d.seqlen_k, d.num_heads_kv = k.shape[1], k.shape[2]
        d.q, d.k, d.v, d.o = view(q), view(k), view(v), view(o)
        d.lse = lse.data_ptr() if lse is not None else None
        d.causal = 1 if causal else 0
        return d

    def forward(self, d):
        self.check(self.lib.fa_forward(self.ctx, C.byref(d)))

    def backward_desc(self, d, do, dq, dk, dv):
        b = BackwardDesc()
        self.lib.fa_backward_desc_init(C.byref(b))
        b.forward = C.pointer(d)
        b.d_o, b.d_q, b.d_k, b.d_v = view(do), view(dq), view(dk), view(dv)
        return b

    def backward(self, b):
        self.check(self.lib.fa_backward(self.ctx, C.byref(b)))

    def last_run(self):
        r = RunInfo()
        r.size = C.sizeof(RunInfo)
        self.check(self.lib.fa_context_last_run(self.ctx, C.byref(r)))
        return r
