# SPDX-License-Identifier: MIT
"""flashattn: exact FlashAttention from Python, on numpy arrays and torch (or any DLPack)
tensors, CPU or CUDA, without copies.

The names and keywords follow FlashAttention-2's, so switching is an import change::

    from flashattn import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)          # q, k, v: [batch, seq, heads, head_dim]

Tensors may have any strides whose last dimension is contiguous; outputs are allocated by the
caller's framework (numpy or torch), on q's device; CUDA calls run on torch's current stream.
Bad arguments raise ValueError with the library's message naming the field.
"""
from . import _C

try:
    from numpy import empty as _np_empty, ndarray as _np_ndarray
except ImportError:  # torch-only environments
    _np_empty, _np_ndarray = None, type(None)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "version"]
__version__ = _C.version()


def version():
    """The C library's version string."""
    return _C.version()


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _bf16_numpy(x):
    """A numpy bfloat16 (ml_dtypes) array as its uint16 bits, which DLPack can carry."""
    dt = getattr(x, "dtype", None)
    if dt is not None and getattr(dt, "name", "") == "bfloat16" and not _is_torch(x):
        return x.view("uint16"), True
    return x, False


def _empty(shape, like, float32=False):
    if _is_torch(like):
        import torch
        return torch.empty(shape, dtype=torch.float32 if float32 else like.dtype, device=like.device)
    import numpy as np
    return np.empty(shape, dtype=np.float32 if float32 else like.dtype)


def _stream(q):
    if _is_torch(q) and q.is_cuda:
        import torch
        return torch.cuda.current_stream(q.device).cuda_stream
    return 0


def _check_float(name, x):
    if not isinstance(x, (int, float)):
        raise ValueError(f"flashattn: {name} must be a number, not {type(x).__name__}")


def _common(dropout_p, softmax_scale, window_size, softcap, deterministic):
    """The keywords shared by the calls; deterministic is accepted for FlashAttention-2's
    signature: flashattn is deterministic whatever it says."""
    if type(dropout_p) is not float and type(dropout_p) is not int:
        _check_float("dropout_p", dropout_p)
    if type(softcap) is not float and type(softcap) is not int:
        _check_float("softcap", softcap)
    if softmax_scale is not None:
        _check_float("softmax_scale", softmax_scale)
    try:
        wl, wr = window_size
        wl, wr = int(wl), int(wr)
    except (TypeError, ValueError):
        raise ValueError("flashattn: window_size must be a pair (left, right), -1 for unbounded") from None
    return float(softmax_scale or 0.0), wl, wr


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, return_lse=False, deterministic=True, seed=0):
    """Attention over [batch, seqlen, heads, head_dim] tensors (k and v may have fewer heads:
    GQA / MQA). causal is bottom-right aligned when seqlen_q != seqlen_k. Returns out, or
    (out, lse) with lse float32 [batch, heads, seqlen_q] (natural log)."""
    scale, wl, wr = _common(dropout_p, softmax_scale, window_size, softcap, deterministic)
    if getattr(q, "ndim", None) != 4:
        raise ValueError("flashattn: q must be [batch, seqlen, heads, head_dim]")
    if type(q) is _np_ndarray and q.dtype.name != "bfloat16":  # numpy's common case, the fast path
        out = _np_empty(q.shape, q.dtype)
        lse = _np_empty((q.shape[0], q.shape[2], q.shape[1]), "float32") if return_lse else None
        _C.forward(q, k, v, out, lse, None, None, 0, 0, scale, bool(causal), wl, wr, float(softcap),
                   float(dropout_p), int(seed), 0, 0, False)
        return (out, lse) if return_lse else out
    out = _empty(tuple(q.shape), q)
    lse = _empty((q.shape[0], q.shape[2], q.shape[1]), q, float32=True) if return_lse else None
    (qq, bf), (kk, _), (vv, _), (oo, _) = (_bf16_numpy(x) for x in (q, k, v, out))
    _C.forward(qq, kk, vv, oo, lse, None, None, 0, 0, scale, bool(causal), wl, wr, float(softcap),
               float(dropout_p), int(seed), 0, _stream(q), bf)
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           return_lse=False, deterministic=True, seed=0):
    """Attention over packed sequences: q [total_q, heads, head_dim], k and v [total_k,
    kv_heads, head_dim], sequence b's rows cu_seqlens[b] .. cu_seqlens[b + 1] (int32, on the
    CPU); max_seqlen_* are Python ints. Returns out, or (out, lse) with lse float32
    [heads, total_q]."""
    scale, wl, wr = _common(dropout_p, softmax_scale, window_size, softcap, deterministic)
    if getattr(q, "ndim", None) != 3:
        raise ValueError("flashattn: q must be [total_q, heads, head_dim] for varlen calls")
    out = _empty(tuple(q.shape), q)
    lse = _empty((q.shape[1], q.shape[0]), q, float32=True) if return_lse else None
    (qq, bf), (kk, _), (vv, _), (oo, _) = (_bf16_numpy(x) for x in (q, k, v, out))
    _C.forward(qq, kk, vv, oo, lse, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), scale,
               bool(causal), wl, wr, float(softcap), float(dropout_p), int(seed), 0, _stream(q), bf)
    return (out, lse) if return_lse else out
