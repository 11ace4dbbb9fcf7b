# SPDX-License-Identifier: MIT
"""flashattn: exact FlashAttention from Python, on numpy arrays and torch (or any DLPack)
tensors, CPU or CUDA, without copies.

The names and keywords follow FlashAttention-2's, so switching is an import change::

    from flashattn import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)          # q, k, v: [batch, seq, heads, head_dim]

Tensors may have any positive strides with the last dimension contiguous (read-only arrays
too); outputs are allocated by the caller's framework (numpy or torch), on q's device; CUDA
calls run on torch's current stream. Calls from several threads take turns per device. Bad
arguments raise ValueError with the library's message naming the field.
"""
import math
import numbers
import operator
import re
import struct
import sys

from . import _C

try:
    from numpy import empty as _np_empty, ndarray as _np_ndarray
except ImportError:  # torch-only environments
    _np_empty, _np_ndarray = None, type(None)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "merge_states", "PagedPlan",
           "backends", "info", "version"]
__version__ = _C.version()

_torch_ops = None


def _torch():
    """flashattn.torch_ops, imported on the first torch tensor (or at import when torch is);
    None with a torch too old for torch.library.custom_op (< 2.4), whose tensors then take
    the plain DLPack path (no autograd, no torch.compile)."""
    global _torch_ops
    if _torch_ops is None:
        try:
            from . import torch_ops
        except ImportError:
            torch_ops = False
        _torch_ops = torch_ops
    return _torch_ops or None


def version():
    """The C library's version string."""
    return _C.version()


def backends():
    """The backends compiled into this build: "cpu", and "cuda" and "gles" where they were
    built. A built backend may still find no device here: info() says."""
    return [name for name in ("cpu", "cuda", "gles") if _C.backend_is_built(name)]


def _device(device):
    """(DLPack device type, index) of "cpu", "cuda", "cuda:N" or a torch.device."""
    text = str(device) if type(device).__name__ == "device" else device
    if text == "cpu":
        return 1, 0
    if isinstance(text, str) and (text == "cuda" or text.startswith("cuda:")):
        index = text[5:] or "0"
        if not index.isdigit():
            raise ValueError(f"flashattn: device ({device!r}) must be 'cpu', 'cuda' or 'cuda:N'")
        return 2, int(index)
    raise ValueError(f"flashattn: device ({device!r}) must be 'cpu', 'cuda' or 'cuda:N'")


def info(device="cpu"):
    """What the backend serving device ("cpu", "cuda", "cuda:N" or a torch.device) is, as
    `flashattn info` prints it: "key: value" lines (the device, its kernels and tiles).
    RuntimeError with the library's reason where that backend is not built or finds no
    device."""
    return _C.info(*_device(device))


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
    if not isinstance(x, numbers.Real) or isinstance(x, bool):
        raise ValueError(f"flashattn: {name} must be a number, not {type(x).__name__}")
    try:
        finite = math.isfinite(x)
    except OverflowError:  # an int past float64's range
        raise ValueError(f"flashattn: {name} (an integer of {len(str(abs(x)))} digits) does not fit in "
                         "float32") from None
    if not finite:
        raise ValueError(f"flashattn: {name} ({x}) must be finite")
    try:
        x32 = struct.unpack("f", struct.pack("f", float(x)))[0]
    except OverflowError:
        x32 = math.inf
    if not math.isfinite(x32):  # past float32's largest value after rounding
        raise ValueError(f"flashattn: {name} ({x}) does not fit in float32")
    if x != 0 and x32 == 0:
        raise ValueError(f"flashattn: {name} ({x}) rounds to 0 in float32, which means 'off' or 'default'")


def _int(name, x, lo, hi):
    """An integer argument (no float, no string, no bool) in lo..hi."""
    if isinstance(x, bool) or _numpy_bool(x):
        raise ValueError(f"flashattn: {name} must be an integer, not {x!r}")
    try:
        v = operator.index(x)
    except TypeError:
        raise ValueError(f"flashattn: {name} must be an integer, not {type(x).__name__}") from None
    if not lo <= v <= hi:
        raise ValueError(f"flashattn: {name} ({v}) must be in {lo}..{hi}")
    return v


def _common(dropout_p, softmax_scale, window_size, softcap, deterministic):
    """The keywords shared by the calls; deterministic is accepted for FlashAttention-2's
    signature: flashattn is deterministic whatever it says."""
    if type(dropout_p) is not float or dropout_p:
        _check_float("dropout_p", dropout_p)
        if not 0 <= dropout_p < 1:  # checked here too for calls with nothing to attend
            raise ValueError(f"flashattn: dropout_p ({dropout_p}) must be in [0, 1)")
    if type(softcap) is not float or softcap:
        _check_float("softcap", softcap)
        if softcap < 0:
            raise ValueError(f"flashattn: softcap ({softcap}) must be >= 0 (0 = off)")
    if softmax_scale is not None:
        _check_float("softmax_scale", softmax_scale)
        if softmax_scale == 0:
            raise ValueError("flashattn: softmax_scale 0 is not supported (the library reads 0 as 1/sqrt(head_dim)); "
                             "pass None for that")
        if softmax_scale < 0:
            raise ValueError(f"flashattn: softmax_scale ({softmax_scale}) must be positive")
    if type(window_size) is not tuple or len(window_size) != 2 or type(window_size[0]) is not int or \
            type(window_size[1]) is not int:
        try:
            wl, wr = window_size
        except (TypeError, ValueError):
            raise ValueError("flashattn: window_size must be a pair (left, right), -1 for unbounded") from None
        window_size = (_int("window_size[0]", wl, -(2 ** 31), 2 ** 31 - 1),
                       _int("window_size[1]", wr, -(2 ** 31), 2 ** 31 - 1))
    wl, wr = window_size
    if not (-(2 ** 31) <= wl < 2 ** 31 and -(2 ** 31) <= wr < 2 ** 31):
        raise ValueError("flashattn: window_size's entries must fit in 32 bits")
    if wl < -1 or wr < -1:
        raise ValueError(f"flashattn: window_size ({wl}, {wr}): each entry is -1 (unbounded) or a count of keys >= 0")
    return float(softmax_scale or 0.0), wl, wr


def _no_work_check(q, k, v, nd):
    """What the library would check of a call with nothing to attend, which never reaches it:
    q's dtype, and k and v going with q."""
    if str(getattr(q, "dtype", "")).replace("torch.", "") not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"flashattn: q must be float32, float16 or bfloat16, not {getattr(q, 'dtype', type(q))}")
    _kv_fit(q, k, v, nd)


def _trivial(q, k, v, out_shape, lse_shape, return_lse, zeros_like):
    """Calls with nothing to attend: empty outputs, or (no keys) zeros and lse -inf, once the
    arrays are what a call with work would take (the library, never reached, checks no more)."""
    _no_work_check(q, k, v, len(out_shape))
    out = zeros_like(out_shape, q)
    lse = zeros_like(lse_shape, q, float32=True) if return_lse else None
    if lse is not None:
        lse[...] = float("-inf")
    return (out, lse) if return_lse else out


def _i32_table(name, x, nd, rows=None):
    """x: an int32 array of nd dimensions (rows rows where given), as the library takes it
    (the check of a call that never reaches it, having nothing to attend)."""
    if getattr(x, "ndim", None) != nd or str(getattr(x, "dtype", "")).replace("torch.", "") != "int32":
        raise ValueError(f"flashattn: {name} must be int32 of {nd} dimension{'s' if nd > 1 else ''}, not "
                         f"{getattr(x, 'dtype', type(x))} of shape {tuple(getattr(x, 'shape', ()))}")
    if rows is not None and x.shape[0] != rows:
        raise ValueError(f"flashattn: {name} has {x.shape[0]} rows, want {rows}")


def _cache_fit(q, k_cache, v_cache, k=None, v=None):
    """The caches (and new k, v) go with q [batch, seqlen_q, heads, head_dim]: the checks the
    library makes of a call that it never sees, having nothing to attend or append."""
    hq, d = q.shape[2], q.shape[3]
    if k_cache.ndim != 4 or tuple(v_cache.shape) != tuple(k_cache.shape) or k_cache.shape[3] != d:
        raise ValueError(f"flashattn: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must be "
                         f"[pages, page_size, kv_heads, {d}]")
    if hq == 0 or k_cache.shape[2] == 0 or hq % k_cache.shape[2] or not 1 <= d <= 256:
        raise ValueError(f"flashattn: q's heads ({hq}) must be a multiple of the cache's ({k_cache.shape[2]}), "
                         f"both at least 1, and head_dim ({d}) in 1..256")
    _same_dtype(q, k_cache=k_cache, v_cache=v_cache, k=k, v=v)


def _kv_fit(q, k, v, nd):
    """k and v: arrays of q's dtype and nd dimensions, shaped to go with q (the checks the
    library makes of a call that it never sees, having nothing to attend)."""
    for name, x in (("k", k), ("v", v)):
        if getattr(x, "ndim", None) != nd:
            raise ValueError(f"flashattn: {name} must be an array of {nd} dimensions like q")
    _same_dtype(q, k=k, v=v)
    if tuple(v.shape) != tuple(k.shape) or k.shape[-1] != q.shape[-1] or (nd == 4 and k.shape[0] != q.shape[0]):
        raise ValueError(f"flashattn: k {tuple(k.shape)} and v {tuple(v.shape)} do not go with q {tuple(q.shape)}")
    hq, hk = q.shape[-2], k.shape[-2]
    if hq == 0 or hk == 0 or hq % hk:
        raise ValueError(f"flashattn: q's heads ({hq}) must be a multiple of k's ({hk}), both at least 1")
    if not 1 <= q.shape[-1] <= 256:
        raise ValueError(f"flashattn: head_dim ({q.shape[-1]}) must be in 1..256")


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, return_lse=False, deterministic=True, seed=0, q_descale=None, k_descale=None,
                    v_descale=None, descale_block_rows=0):
    """Attention over [batch, seqlen, heads, head_dim] tensors (k and v may have fewer heads:
    GQA / MQA). causal is bottom-right aligned when seqlen_q != seqlen_k. Returns out, or
    (out, lse) with lse float32 [batch, heads, seqlen_q] (natural log). torch tensors go
    through torch.ops.flashattn.fwd: differentiable (fa_backward) and traceable by
    torch.compile. float8_e4m3fn q, k, v (torch, or numpy through ml_dtypes) take
    FlashAttention-3's q_descale, k_descale, v_descale (float32 [batch, num_heads_kv], None
    for 1) and give a bfloat16 out, forward only. descale_block_rows (an int, or one each for
    q, k and v) > 0 takes a factor per block of that many rows instead: float32 [batch,
    num_heads_kv, ceil(seqlen / block_rows)]."""
    _arrays(q=q, k=k, v=v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    _required(q=q, k=k, v=v)
    _flags(causal=causal, return_lse=return_lse)
    blocks = _block_rows(descale_block_rows)
    if _is_fp8(q) or q_descale is not None or k_descale is not None or v_descale is not None or any(blocks):
        scale, wl, wr = _common(dropout_p, softmax_scale, window_size, softcap, deterministic)
        return _fp8_forward(q, k, v, None, None, 0, 0, (q_descale, k_descale, v_descale), blocks, scale, wl, wr,
                            causal, softcap, dropout_p, _int("seed", seed, 0, 2 ** 64 - 1), return_lse)
    if _is_torch(q) and _torch():
        return _torch().flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                                        return_lse, deterministic, seed)
    scale, wl, wr = _common(dropout_p, softmax_scale, window_size, softcap, deterministic)
    if getattr(q, "ndim", None) != 4:
        raise ValueError("flashattn: q must be [batch, seqlen, heads, head_dim]")
    seed = seed if type(seed) is int and 0 <= seed < 2 ** 64 else _int("seed", seed, 0, 2 ** 64 - 1)
    if (type(q) is _np_ndarray and type(k) is _np_ndarray and type(v) is _np_ndarray and
            q.dtype.name != "bfloat16" and k.dtype == q.dtype and v.dtype == q.dtype and q.size and
            k.shape[1:2] != (0,)):  # numpy's common case
        out = _np_empty(q.shape, q.dtype)
        lse = _np_empty((q.shape[0], q.shape[2], q.shape[1]), "float32") if return_lse else None
        _C.forward(q, k, v, out, lse, None, None, 0, 0, scale, bool(causal), wl, wr, float(softcap),
                   float(dropout_p), int(seed), 0, 0, False)
        return (out, lse) if return_lse else out
    lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    if 0 in tuple(q.shape) or (getattr(k, "ndim", 0) == 4 and k.shape[1] == 0):
        return _trivial(q, k, v, tuple(q.shape), lse_shape, return_lse, _zeros)
    _same_dtype(q, k=k, v=v)
    out = _empty(tuple(q.shape), q)
    lse = _empty(lse_shape, q, float32=True) if return_lse else None
    (qq, bf), (kk, _), (vv, _), (oo, _) = (_bf16_numpy(x) for x in (q, k, v, out))
    _C.forward(qq, kk, vv, oo, lse, None, None, 0, 0, scale, bool(causal), wl, wr, float(softcap),
               float(dropout_p), seed, 0, _stream(q), bf)
    return (out, lse) if return_lse else out


def _is_fp8(x):
    """Whether x holds float8_e4m3fn elements (torch, or numpy through ml_dtypes)."""
    return str(getattr(x, "dtype", "")).endswith("float8_e4m3fn")


def _arrays(**named):
    """Each given value is an array (numpy, torch or another with shape and dtype); None
    stands for an argument left out. A list or a scalar would reach the bindings as a type
    error listing every signature."""
    for name, x in named.items():
        if x is not None and not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise ValueError(f"flashattn: {name} must be a numpy array or a torch tensor, not {type(x).__name__}")
        if isinstance(x, _np_ndarray):  # dtypes the bindings would refuse with a type error naming no argument
            dt = x.dtype
            if not dt.isnative:
                raise ValueError(f"flashattn: {name} is in non-native byte order ({dt.str}): pass "
                                 f"{name}.astype({name}.dtype.newbyteorder('='))")
            if dt.kind == "O" or (dt.name.startswith(("float8_", "float6_", "float4_"))
                                  and dt.name != "float8_e4m3fn") or dt.name in ("int4", "uint4", "int2", "uint2"):
                raise ValueError(f"flashattn: {name}'s dtype ({dt.name}) is not one flashattn takes: float32, "
                                 "float16, bfloat16, float8_e4m3fn (forward only) and int32 tables")


def _required(**named):
    """Each is given (not None): the bindings would answer None with a type error listing
    every signature."""
    for name, x in named.items():
        if x is None:
            raise ValueError(f"flashattn: {name} is required (an array or tensor), not None")


def _writable(**named):
    """Each given numpy array can be written: the caches a call appends into."""
    for name, x in named.items():
        if isinstance(x, _np_ndarray) and not x.flags.writeable:
            raise ValueError(f"flashattn: {name} is read-only, and the call appends k and v into it "
                             "(np.require(x, requirements='W') gives a writable copy)")


def _numpy_bool(x):
    return type(x).__module__ == "numpy" and type(x).__name__ in ("bool_", "bool")


def _flags(**named):
    """Each value is a bool (or an integer 0 or 1): a string such as 'no' would be true."""
    for name, x in named.items():
        if x is True or x is False:  # the usual case, first (and plain for torch.compile to trace)
            continue
        if not (_numpy_bool(x) or (isinstance(x, numbers.Integral) and x in (0, 1))):
            raise ValueError(f"flashattn: {name} must be True or False, not {x!r}")


def _same_dtype(q, **others):
    """Each array of others has q's dtype, by name: the bits of bfloat16 and float8 go to the
    library as integers, so an integer array in their place would pass for them."""
    want = str(getattr(q, "dtype", ""))
    for name, x in others.items():
        got = str(getattr(x, "dtype", ""))
        if x is not None and hasattr(x, "dtype") and got != want:
            raise ValueError(f"flashattn: {name}'s dtype ({got}) must equal q's ({want})")


def _block_rows(x):
    """descale_block_rows as (q's, k's, v's): one count for all three, or a count each; 0 (or
    None) is one factor a (batch, kv head)."""
    if type(x) is int and x == 0 or x is None:  # the default, first
        return (0, 0, 0)

    def count(name, y):
        if type(y).__name__ in ("bool", "bool_"):  # an integer to operator.index, not a count
            raise ValueError(f"flashattn: {name} must be an integer, not {type(y).__name__}")
        return _int(name, y, 0, 2 ** 30)
    if isinstance(x, (tuple, list)):
        if len(x) != 3:
            raise ValueError(f"flashattn: descale_block_rows must be an integer or three (q's, k's, v's), not {len(x)}")
        return tuple(count(f"descale_block_rows[{i}]", y) for i, y in enumerate(x))
    return (count("descale_block_rows", x),) * 3


def _fp8_forward(q, k, v, cu_q, cu_k, max_q, max_k, descales, blocks, scale, wl, wr, causal, softcap, dropout_p,
                 seed, return_lse):
    """fp8 (e4m3) q, k, v with FlashAttention-3's descale factors (per block of rows where
    blocks, _block_rows', says): out bfloat16, outside the torch ops (fp8 has no backward).
    Elements go in as their bits (uint8 views)."""
    varlen = cu_q is not None
    if not _is_fp8(q):
        raise ValueError("flashattn: descale factors (q_descale, k_descale, v_descale, descale_block_rows) are for "
                         f"float8_e4m3fn inputs; q is {getattr(q, 'dtype', type(q))}")
    _same_dtype(q, k=k, v=v)
    if getattr(q, "ndim", None) != (3 if varlen else 4):
        raise ValueError("flashattn: q must be [total_q, heads, head_dim] for varlen calls" if varlen else
                         "flashattn: q must be [batch, seqlen, heads, head_dim]")
    lse_shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
    if _is_torch(q):
        import torch
        out = torch.zeros(tuple(q.shape), dtype=torch.bfloat16, device=q.device)
        lse = torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device) if return_lse else None
        bits, obits = (lambda x: x.view(torch.uint8) if _is_fp8(x) else x), out
    else:
        import ml_dtypes
        import numpy as np
        out = np.zeros(tuple(q.shape), dtype=ml_dtypes.bfloat16)
        lse = np.full(lse_shape, -np.inf, dtype=np.float32) if return_lse else None
        bits, obits = (lambda x: x.view(np.uint8) if _is_fp8(x) else _bf16_numpy(x)[0]), out.view(np.uint16)
    if 0 in tuple(q.shape) or (not varlen and getattr(k, "ndim", 0) == 4 and k.shape[1] == 0):
        _kv_fit(q, k, v, q.ndim)  # nothing to attend: the library never sees the call
        seqs = len(cu_q) - 1 if varlen else q.shape[0]
        rows = (q.shape[0], k.shape[0], k.shape[0]) if varlen else (q.shape[1], k.shape[1], k.shape[1])
        for name, x, n, r in zip(("q_descale", "k_descale", "v_descale"), descales, blocks, rows):
            want = (seqs, k.shape[-2]) + (((r + n - 1) // n,) if n else ())
            if x is not None and (tuple(x.shape) != want or "float32" not in str(x.dtype)):
                raise ValueError(f"flashattn: {name} must be float32 [batch, num_heads_kv{', blocks' if n else ''}] "
                                 f"({list(want)} here{f': a factor per block of {n} rows' if n else ''})")
    else:
        _C.forward_fp8(bits(q), bits(k), bits(v), obits, lse, cu_q, cu_k, max_q, max_k, *descales, *blocks, scale,
                       bool(causal), wl, wr, float(softcap), float(dropout_p), seed, _stream(q))
    return (out, lse) if return_lse else out


def _zeros(shape, like, float32=False):
    if _is_torch(like):
        import torch
        return torch.zeros(shape, dtype=torch.float32 if float32 else like.dtype, device=like.device)
    import numpy as np
    return np.zeros(shape, dtype=np.float32 if float32 else like.dtype)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           return_lse=False, deterministic=True, seed=0, q_descale=None, k_descale=None,
                           v_descale=None, descale_block_rows=0):
    """Attention over packed sequences: q [total_q, heads, head_dim], k and v [total_k,
    kv_heads, head_dim], sequence b's rows cu_seqlens[b] .. cu_seqlens[b + 1] (int32, on the
    CPU on every device); max_seqlen_* are Python ints. Returns out, or (out, lse) with lse
    float32 [heads, total_q]. torch tensors go through torch.ops.flashattn.varlen_fwd. fp8
    inputs as flash_attn_func's, descale factors [num_sequences, num_heads_kv] (per block of
    rows: [num_sequences, num_heads_kv, ceil(total / block_rows)], total the packed rows of
    q, or of k for k's and v's; a sequence's blocks count from its own first row)."""
    _arrays(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, q_descale=q_descale,
            k_descale=k_descale, v_descale=v_descale)
    _required(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _flags(causal=causal, return_lse=return_lse)
    blocks = _block_rows(descale_block_rows)
    if _is_fp8(q) or q_descale is not None or k_descale is not None or v_descale is not None or any(blocks):
        scale, wl, wr = _common(dropout_p, softmax_scale, window_size, softcap, deterministic)
        return _fp8_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, _int("max_seqlen_q", max_seqlen_q, 0, 2 ** 31 - 1),
                            _int("max_seqlen_k", max_seqlen_k, 0, 2 ** 31 - 1), (q_descale, k_descale, v_descale),
                            blocks, scale, wl, wr, causal, softcap, dropout_p,
                            _int("seed", seed, 0, 2 ** 64 - 1), return_lse)
    if _is_torch(q) and _torch():
        return _torch().flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                               dropout_p, softmax_scale, causal, window_size, softcap, return_lse,
                                               deterministic, seed)
    scale, wl, wr = _common(dropout_p, softmax_scale, window_size, softcap, deterministic)
    if getattr(q, "ndim", None) != 3:
        raise ValueError("flashattn: q must be [total_q, heads, head_dim] for varlen calls")
    seed = _int("seed", seed, 0, 2 ** 64 - 1)
    max_q = _int("max_seqlen_q", max_seqlen_q, 0, 2 ** 31 - 1)
    max_k = _int("max_seqlen_k", max_seqlen_k, 0, 2 ** 31 - 1)
    if 0 in tuple(q.shape):
        _i32_table("cu_seqlens_q", cu_seqlens_q, 1)
        _i32_table("cu_seqlens_k", cu_seqlens_k, 1, rows=cu_seqlens_q.shape[0])
        if cu_seqlens_q.shape[0] == 0:
            raise ValueError("flashattn: cu_seqlens_q must hold num_sequences + 1 offsets")
        for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[0]), ("cu_seqlens_k", cu_seqlens_k, k.shape[0])):
            at = [int(x) for x in cu.tolist()]
            if at[0] < 0 or any(b < a for a, b in zip(at, at[1:])) or at[-1] > total:
                raise ValueError(f"flashattn: {name} must rise from 0 or more to at most {total} rows, not {at[:8]}")
        return _trivial(q, k, v, tuple(q.shape), (q.shape[1], q.shape[0]), return_lse, _zeros)
    # rows past cu_seqlens_q[-1] are not written: zeros (and lse -inf) rather than stale memory
    out = _zeros(tuple(q.shape), q)
    lse = None
    if return_lse:
        lse = _zeros((q.shape[1], q.shape[0]), q, float32=True)
        lse[...] = float("-inf")
    _same_dtype(q, k=k, v=v)
    (qq, bf), (kk, _), (vv, _), (oo, _) = (_bf16_numpy(x) for x in (q, k, v, out))
    _C.forward(qq, kk, vv, oo, lse, cu_seqlens_q, cu_seqlens_k, max_q, max_k, scale, bool(causal), wl, wr,
               float(softcap), float(dropout_p), seed, 0, _stream(q), bf)
    return (out, lse) if return_lse else out


def _arange_i32(n, step, like):
    """[0, step, ..., n * step], int32 (n + 1 zeros for step 0: sequences without queries)."""
    if _is_torch(like):
        import torch
        if step == 0:
            return torch.zeros(n + 1, dtype=torch.int32, device=like.device)
        return torch.arange(0, n * step + 1, step, dtype=torch.int32, device=like.device)
    import numpy as np
    if step == 0:
        return np.zeros(n + 1, dtype=np.int32)
    return np.arange(0, n * step + 1, step, dtype=np.int32)


def _i32_like(values, like):
    if _is_torch(like):
        import torch
        return torch.as_tensor(values, dtype=torch.int32, device=like.device)
    import numpy as np
    return np.ascontiguousarray(values, dtype=np.int32)


def _one_run(name, x):
    """x [batch, seq, ...] with its batch and seq dimensions one run of rows, so that the
    [batch * seq, ...] reshape the paged call takes is a view, never a copy."""
    if x.shape[0] > 1 and x.shape[1] > 1:
        st = x.stride() if _is_torch(x) else tuple(s // x.itemsize for s in x.strides)
        if st[0] != x.shape[1] * st[1]:
            raise ValueError(f"flashattn: {name}'s batch and seqlen must be one run of rows, as a contiguous "
                             "tensor has them (x.contiguous() or np.ascontiguousarray)")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            return_softmax_lse=False):
    """Attention of q [batch, seqlen_q, heads, head_dim] over a KV cache, the new k and v
    [batch, seqlen_q, kv_heads, head_dim] (when given) first written into it at each
    sequence's cache_seqlens (in place; RoPE from rotary_cos / rotary_sin [max_pos,
    rotary_dim / 2] applied to q and the new keys, interleaved pairs or NeoX halves).

    The cache is paged, k_cache / v_cache [num_pages, page_size, kv_heads, head_dim] with
    block_table int32 [batch, max_pages] (any page_size, 16 included), or contiguous,
    [batch_cache, seqlen_cache, kv_heads, head_dim] with cache_batch_idx choosing rows.
    cache_seqlens: an int or int32 [batch] of tokens already cached (default: none). causal
    is bottom-right aligned. Returns out, or (out, softmax_lse [batch, heads, seqlen_q]).
    torch tensors go through torch.ops.flashattn.kvcache, which declares the cache write."""
    _arrays(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
            block_table=block_table)
    _required(q=q, k_cache=k_cache, v_cache=v_cache)
    _flags(causal=causal, rotary_interleaved=rotary_interleaved, return_softmax_lse=return_softmax_lse)
    if _is_torch(q) and _torch():
        return _torch().flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                                cache_batch_idx, block_table, softmax_scale, causal, window_size,
                                                softcap, rotary_interleaved, return_softmax_lse)
    scale, wl, wr = _common(0.0, softmax_scale, window_size, softcap, True)
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if _is_fp8(x):
            raise ValueError(f"flashattn: {name} is float8_e4m3fn; flash_attn_with_kvcache takes float32, float16 "
                             "or bfloat16 (fp8 is a forward of flash_attn_func / flash_attn_varlen_func)")
    if getattr(q, "ndim", None) != 4:
        raise ValueError("flashattn: q must be [batch, seqlen_q, heads, head_dim]")
    b, sq, hq, d = (int(x) for x in q.shape)
    _one_run("q", q)
    if k_cache.ndim != 4:
        raise ValueError("flashattn: k_cache must be 4-d")
    _arrays(cache_batch_idx=cache_batch_idx)
    if block_table is None:  # a contiguous cache: each sequence one page of the cache's length
        n = int(k_cache.shape[0])
        if cache_batch_idx is None:
            if b > n:
                raise ValueError(f"flashattn: batch ({b}) is more than k_cache's rows ({n}): a contiguous cache "
                                 "holds a row a sequence (cache_batch_idx chooses them)")
            rows = list(range(b))
        else:
            kind = getattr(cache_batch_idx.dtype, "kind", None)
            if cache_batch_idx.ndim != 1 or cache_batch_idx.shape[0] != b or kind not in ("i", "u"):
                raise ValueError("flashattn: cache_batch_idx must be [batch] integers")
            rows = [int(i) for i in cache_batch_idx]
            for i, r in enumerate(rows):
                if not 0 <= r < n:
                    raise ValueError(f"flashattn: cache_batch_idx[{i}] ({r}) is not a row of k_cache (0..{n - 1})")
        block_table = _i32_like([[r] for r in rows], q).reshape(b, 1)
    elif cache_batch_idx is not None:
        raise ValueError("flashattn: cache_batch_idx applies to a contiguous cache, not with block_table")
    elif block_table.ndim != 2:
        raise ValueError("flashattn: block_table must be int32 [batch, max_pages]")
    if cache_seqlens is None:
        cache_seqlens = 0
    if isinstance(cache_seqlens, numbers.Integral):
        cache_seqlens = _i32_like([_int("cache_seqlens", cache_seqlens, 0, 2 ** 31 - 1)] * b, q)
    _arrays(cache_seqlens=cache_seqlens)
    page = int(k_cache.shape[1])
    max_k = int(block_table.shape[1]) * page  # the tables' capacity: no look at device lengths
    if max_k > 2 ** 31 - 1:
        raise ValueError(f"flashattn: block_table's {block_table.shape[1]} pages of {page} tokens pass 2^31 - 1 "
                         "keys a sequence")
    if k is not None:
        _writable(k_cache=k_cache, v_cache=v_cache)
    if b == 0:  # no sequence: nothing to attend or append (validated as far as shapes go)
        _i32_table("block_table", block_table, 2, rows=0)
        _i32_table("cache_seqlens", cache_seqlens, 1, rows=0)
        _cache_fit(q, k_cache, v_cache, k, v)
        out = _zeros((0, sq, hq, d), q)
        return (out, _zeros((0, hq, sq), q, float32=True)) if return_softmax_lse else out
    out = _empty((b * sq, hq, d), q)
    lse = None
    if return_softmax_lse:
        lse = _zeros((hq, b * sq), q, float32=True)
    bf = False
    _same_dtype(q, k_cache=k_cache, v_cache=v_cache, k=k, v=v)
    qq, bf = _bf16_numpy(q.reshape(b * sq, hq, d))
    oo, _ = _bf16_numpy(out)
    kc, _ = _bf16_numpy(k_cache)
    vc, _ = _bf16_numpy(v_cache)
    kn = vn = None
    if (k is None) != (v is None):
        raise ValueError("flashattn: give k and v together")
    if k is not None:
        if tuple(k.shape[:2]) != (b, sq) or tuple(v.shape) != tuple(k.shape):
            raise ValueError("flashattn: k and v must be [batch, seqlen_q, kv_heads, head_dim]: one new key a "
                             "query row")
        _one_run("k", k)
        _one_run("v", v)
        kn, _ = _bf16_numpy(k.reshape(b * sq, k.shape[2], k.shape[3]))
        vn, _ = _bf16_numpy(v.reshape(b * sq, v.shape[2], v.shape[3]))
    rope = 0
    if rotary_cos is not None or rotary_sin is not None:
        rope = 2 if rotary_interleaved else 1
    with _rows_as(cache_batch_idx):
        _C.paged_forward(qq, oo, kc, vc, block_table, _arange_i32(b, sq, q), cache_seqlens, kn, vn, rotary_cos,
                         rotary_sin, rope, lse, sq, max_k, scale, bool(causal), wl, wr, float(softcap), _stream(q),
                         bf)
    out = out.reshape(b, sq, hq, d)
    if return_softmax_lse:
        return out, lse.reshape(hq, b, sq).transpose(1, 0, 2) if not _is_torch(lse) else \
            lse.reshape(hq, b, sq).permute(1, 0, 2)
    return out


class _rows_as:
    """Around a call over a contiguous cache with cache_batch_idx: the library's messages
    about the block table made from it name cache_batch_idx instead."""

    def __init__(self, cache_batch_idx, widened=False):
        self.given = cache_batch_idx is not None
        self.note = "; entries outside int32 read as -1" if widened else ""

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if self.given and kind is ValueError and "block_table[" in str(err):
            msg = re.sub(r"block_table\[(\d+)\]\[0\]", r"cache_batch_idx[\1]", str(err))
            raise ValueError(msg + f" (the contiguous cache's rows, as cache_batch_idx gives them{self.note})") from None
        return False


def merge_states(o, lse):
    """Merge partial attention results over disjoint key sets: o [states, rows, heads,
    head_dim] and lse float32 [states, heads, rows] (natural log, as the calls here return it,
    -inf for a state that saw no key) become (o [rows, heads, head_dim], lse [heads, rows]),
    in state order (deterministic). No gradient flows through it."""
    if not _is_torch(o):
        _arrays(o=o, lse=lse)
    if getattr(o, "ndim", None) != 4 or getattr(lse, "ndim", None) != 3:
        raise ValueError("flashattn: merge_states takes o [states, rows, heads, head_dim] and lse "
                         "[states, heads, rows]")
    if _is_fp8(o):
        raise ValueError("flashattn: merge_states' o is float8_e4m3fn; it takes float32, float16 or bfloat16")
    out = _empty(tuple(o.shape[1:]), o)
    lse_out = _empty((o.shape[2], o.shape[1]), o, float32=True)
    if _is_torch(o) and _torch():  # DLPack capsules, which tensors that require grad may give too
        if not _is_torch(lse):
            raise ValueError("flashattn: merge_states' lse must be a torch tensor like o")
        dl = _torch()._dl
        _C.merge(dl(o), dl(lse), dl(out), dl(lse_out), _stream(o), False)
        return out, lse_out
    np = sys.modules.get("numpy")  # numpy arrays mean numpy is loaded; anything else goes to the library as is
    if np is not None and isinstance(lse, np.ndarray) and lse.dtype == np.float32:
        bad = np.isnan(lse) | (lse == np.inf)  # -inf is a state without keys; NaN and +inf are no state
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"flashattn: merge_states' lse{list(at)} is {lse[at]}: each entry is finite, or -inf "
                             "for a state that saw no key")
    oo, bf = _bf16_numpy(o)
    ot, _ = _bf16_numpy(out)
    _C.merge(oo, lse, ot, lse_out, _stream(o), bf)
    return out, lse_out


from .plan import PagedPlan  # noqa: E402  (it uses the helpers above)

if "torch" in sys.modules:  # register the torch ops now, before anything traces a call
    _torch()
