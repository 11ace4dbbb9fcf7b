# SPDX-License-Identifier: MIT
"""flashattn in torch: custom ops (namespace ``flashattn``) with fake implementations, so
torch.compile traces through them without graph breaks, and autograd through fa_backward
(deterministic: the same inputs give the same gradient bits).

    torch.ops.flashattn.fwd          dense forward: (out, lse [batch, heads, seqlen_q])
    torch.ops.flashattn.varlen_fwd   packed sequences: (out, lse [heads, total_q])
    torch.ops.flashattn.bwd          (dq, dk, dv) of either forward
    torch.ops.flashattn.kvcache      paged or contiguous KV cache, new keys and values written
                                     into k_cache / v_cache in place (declared as a mutation)

flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache route torch tensors here;
importing this module (``import flashattn.torch_ops``) registers the ops. Outputs are allocated
by torch on q's device; CUDA calls run on torch's current stream. The lse output carries no
gradient (it is marked non-differentiable).
"""
from typing import Optional

import torch
from torch import Tensor

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"flashattn.torch_ops needs torch >= 2.4 (torch.library.custom_op), not {torch.__version__}")

from . import _C
from . import _common as _fa_common
from . import _cache_fit, _flags, _no_work_check, _rows_as

_dl = torch.utils.dlpack.to_dlpack  # a capsule: nanobind takes it in a microsecond, __dlpack__ in eight

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]

_U64 = 2 ** 64


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _seed_u64(seed):
    """The ops carry the 64-bit dropout seed as a signed int64 (torch's int)."""
    return seed + _U64 if seed < 0 else seed


def _seed_i64(seed):
    return seed - _U64 if seed >= 2 ** 63 else seed


def _dlo(t):
    return None if t is None else _dl(t)


def _eager(*tensors):
    """Whether a call may run the ops' implementations directly (tens of microseconds less
    than the dispatcher): plain tensors, no autograd to record, nothing tracing (torch.compile,
    torch.jit, fake tensors, dispatch or function modes)."""
    if _is_compiling() or _is_tracing() or _dispatch_modes() or _function_modes():
        return False
    grad = _grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not Tensor or grad and t.requires_grad):
            return False
    return True


_is_compiling, _is_tracing = torch.compiler.is_compiling, torch.jit.is_tracing
_dispatch_modes, _function_modes = torch._C._len_torch_dispatch_stack, torch._C._is_torch_function_mode_enabled
_grad_enabled = torch.is_grad_enabled


def _lastdim(t):
    """A gradient torch hands us with a strided last dimension, made readable (autograd's
    own tensors: the caller's inputs are never copied)."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


# ---- dense and varlen forward ----

def _fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_left: int,
        window_right: int, softcap: float, dropout_p: float, seed: int) -> tuple[Tensor, Tensor]:
    return _dense(q, k, v, softmax_scale, causal, window_left, window_right, softcap, dropout_p, seed, True)


def _dense(q, k, v, softmax_scale, causal, window_left, window_right, softcap, dropout_p, seed, with_lse):
    """fwd's implementation; lse None unless with_lse (calls outside autograd)."""
    b, sq, h, _ = q.shape
    if q.numel() == 0 or k.shape[1] == 0:  # nothing to attend: zeros, lse -inf
        _no_work_check(q, k, v, 4)
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device), \
            torch.full((b, h, sq), float("-inf"), dtype=torch.float32, device=q.device) if with_lse else None
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device) if with_lse else None
    _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dlo(lse), None, None, 0, 0, softmax_scale, causal, window_left,
               window_right, softcap, dropout_p, _seed_u64(seed), 0, _stream(q), False)
    return out, lse


fwd = torch.library.custom_op("flashattn::fwd", _fwd, mutates_args=())


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, dropout_p, seed):
    torch._check(q.dim() == 4, lambda: "flashattn: q must be [batch, seqlen, heads, head_dim]")
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
               max_seqlen_k: int, softmax_scale: float, causal: bool, window_left: int, window_right: int,
               softcap: float, dropout_p: float, seed: int) -> tuple[Tensor, Tensor]:
    # rows past cu_seqlens_q[-1] are not written: zeros (and lse -inf) rather than stale memory
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    if not q.numel():
        _no_work_check(q, k, v, 3)
    else:
        _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(cu_seqlens_q), _dl(cu_seqlens_k), max_seqlen_q,
                   max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, dropout_p,
                   _seed_u64(seed), 0, _stream(q), False)
    return out, lse


varlen_fwd = torch.library.custom_op("flashattn::varlen_fwd", _varlen_fwd, mutates_args=())


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
      window_right, softcap, dropout_p, seed):
    torch._check(q.dim() == 3, lambda: "flashattn: q must be [total_q, heads, head_dim] for varlen calls")
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


# ---- backward ----

def _bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
        window_left: int, window_right: int, softcap: float, dropout_p: float,
        seed: int) -> tuple[Tensor, Tensor, Tensor]:
    varlen = cu_seqlens_q is not None
    keyless = k.shape[0 if varlen else 1] == 0
    # varlen rows past the last sequence are not written: their gradient is zero
    new = torch.zeros if varlen or keyless or q.numel() == 0 else torch.empty
    dq = new(q.shape, dtype=q.dtype, device=q.device)
    dk = new(k.shape, dtype=k.dtype, device=k.device)
    dv = new(v.shape, dtype=v.dtype, device=v.device)
    if q.numel() == 0 or keyless:
        return dq, dk, dv
    _C.backward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(_lastdim(dout)), _dl(dq), _dl(dk), _dl(dv),
                _dlo(cu_seqlens_q), _dlo(cu_seqlens_k), max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                window_left, window_right, softcap, dropout_p, _seed_u64(seed), 0, _stream(q), False)
    return dq, dk, dv


bwd = torch.library.custom_op("flashattn::bwd", _bwd, mutates_args=())


@bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      window_left, window_right, softcap, dropout_p, seed):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_fwd(ctx, inputs, output):
    q, k, v = inputs[:3]
    ctx.settings = inputs[3:]
    ctx.save_for_backward(q, k, v, *output)
    ctx.mark_non_differentiable(output[1])


def _backward_fwd(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, None, None, 0, 0, *ctx.settings)
    return (dq, dk, dv) + (None,) * len(ctx.settings)


def _setup_varlen(ctx, inputs, output):
    q, k, v, cu_q, cu_k = inputs[:5]
    ctx.settings = inputs[5:]
    ctx.save_for_backward(q, k, v, cu_q, cu_k, *output)
    ctx.mark_non_differentiable(output[1])


def _backward_varlen(ctx, dout, _dlse):
    q, k, v, cu_q, cu_k, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.settings)
    return (dq, dk, dv) + (None,) * (2 + len(ctx.settings))


fwd.register_autograd(_backward_fwd, setup_context=_setup_fwd)
varlen_fwd.register_autograd(_backward_varlen, setup_context=_setup_varlen)


# ---- the KV cache ----

def _kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, cu_seqlens_q: Tensor,
            cache_seqlens: Tensor, k: Optional[Tensor], v: Optional[Tensor], rotary_cos: Optional[Tensor],
            rotary_sin: Optional[Tensor], rope: int, max_seqlen_q: int, softmax_scale: float, causal: bool,
            window_left: int, window_right: int, softcap: float) -> tuple[Tensor, Tensor]:
    return _paged(q, k_cache, v_cache, block_table, cu_seqlens_q, cache_seqlens, k, v, rotary_cos, rotary_sin, rope,
                  max_seqlen_q, softmax_scale, causal, window_left, window_right, softcap, True)


def _paged(q, k_cache, v_cache, block_table, cu_seqlens_q, cache_seqlens, k, v, rotary_cos, rotary_sin, rope,
           max_seqlen_q, softmax_scale, causal, window_left, window_right, softcap, with_lse):
    """kvcache's implementation; lse None unless with_lse (calls outside torch.compile)."""
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device) if with_lse else None
    max_k = block_table.shape[1] * k_cache.shape[1]  # the tables' capacity: no look at device lengths
    _C.paged_forward(_dl(q), _dl(out), _dl(k_cache), _dl(v_cache), _dl(block_table), _dl(cu_seqlens_q),
                     _dl(cache_seqlens), _dlo(k), _dlo(v), _dlo(rotary_cos), _dlo(rotary_sin), rope, _dlo(lse),
                     max_seqlen_q, max_k, softmax_scale, causal, window_left, window_right, softcap, _stream(q), False)
    return out, lse


kvcache = torch.library.custom_op("flashattn::kvcache", _kvcache, mutates_args=("k_cache", "v_cache"))


@kvcache.register_fake
def _(q, k_cache, v_cache, block_table, cu_seqlens_q, cache_seqlens, k, v, rotary_cos, rotary_sin, rope,
      max_seqlen_q, softmax_scale, causal, window_left, window_right, softcap):
    torch._check(q.dim() == 3, lambda: "flashattn: q must be [total_q, heads, head_dim]")
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


# ---- the functions, for torch tensors ----

def _common(dropout_p, softmax_scale, window_size, softcap):
    return _fa_common(dropout_p, softmax_scale, window_size, softcap, True)


def _seed(seed):
    if type(seed) is not int or not 0 <= seed < _U64:
        raise ValueError(f"flashattn: seed ({seed!r}) must be an integer in 0..2^64 - 1")
    return _seed_i64(seed)


def _tensor(name, x, ndim):
    if not isinstance(x, Tensor):
        raise ValueError(f"flashattn: {name} must be a torch tensor like q, not {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"flashattn: {name} must have {ndim} dimensions, not {x.dim()}")


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    return_lse=False, deterministic=True, seed=0):
    """flashattn.flash_attn_func for torch tensors, through torch.ops.flashattn.fwd."""
    scale, wl, wr = _common(dropout_p, softmax_scale, window_size, softcap)
    _flags(causal=causal, return_lse=return_lse)
    if not isinstance(q, Tensor) or q.dim() != 4:
        raise ValueError("flashattn: q must be [batch, seqlen, heads, head_dim]")
    _tensor("k", k, 4)
    _tensor("v", v, 4)
    args = (q, k, v, scale, bool(causal), wl, wr, float(softcap), float(dropout_p), _seed(seed))
    out, lse = _dense(*args, return_lse) if _eager(q, k, v) else torch.ops.flashattn.fwd(*args)
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, return_lse=False,
                           deterministic=True, seed=0):
    """flashattn.flash_attn_varlen_func for torch tensors, through torch.ops.flashattn.varlen_fwd."""
    scale, wl, wr = _common(dropout_p, softmax_scale, window_size, softcap)
    _flags(causal=causal, return_lse=return_lse)
    if not isinstance(q, Tensor) or q.dim() != 3:
        raise ValueError("flashattn: q must be [total_q, heads, head_dim] for varlen calls")
    _tensor("k", k, 3)
    _tensor("v", v, 3)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _tensor(name, cu, 1)
        if cu.dtype != torch.int32:
            raise ValueError(f"flashattn: {name} must be int32 (cu_seqlens must be 1-d int32 tensors)")
        if cu.device.type != "cpu":
            raise ValueError(f"flashattn: {name} must be a CPU tensor: the library reads cu_seqlens on the host "
                             "on every backend (keep a CPU copy beside the device one)")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if type(n) is not int or not 0 <= n < 2 ** 31:
            raise ValueError(f"flashattn: {name} ({n!r}) must be an integer in 0..2^31 - 1")
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, bool(causal), wl, wr,
            float(softcap), float(dropout_p), _seed(seed))
    out, lse = _varlen_fwd(*args) if _eager(q, k, v) else torch.ops.flashattn.varlen_fwd(*args)
    return (out, lse) if return_lse else out


def _rows(name, x):
    """x [batch, seq, ...] as [batch * seq, ...], which must be a view, never a copy."""
    b, s = x.shape[0], x.shape[1]
    if b > 1 and s > 1 and x.stride(0) != s * x.stride(1):
        raise ValueError(f"flashattn: {name}'s batch and seqlen must be one run of rows, as a contiguous tensor "
                         "has them (x.contiguous())")
    return x.reshape(b * s, *x.shape[2:])


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            return_softmax_lse=False):
    """flashattn.flash_attn_with_kvcache for torch tensors, through torch.ops.flashattn.kvcache."""
    scale, wl, wr = _common(0.0, softmax_scale, window_size, softcap)
    _flags(causal=causal, rotary_interleaved=rotary_interleaved, return_softmax_lse=return_softmax_lse)
    if not isinstance(q, Tensor) or q.dim() != 4:
        raise ValueError("flashattn: q must be [batch, seqlen_q, heads, head_dim]")
    _tensor("k_cache", k_cache, 4)
    _tensor("v_cache", v_cache, 4)
    b, sq, hq, d = q.shape
    dev = q.device
    widened = False
    if block_table is None:  # a contiguous cache: each sequence one page of the cache's length
        if cache_batch_idx is None:
            block_table = torch.arange(b, dtype=torch.int32, device=dev).view(b, 1)
        else:
            idx = torch.as_tensor(cache_batch_idx, device=dev)
            if idx.dim() != 1 or idx.shape[0] != b or idx.dtype.is_floating_point or idx.dtype == torch.bool:
                raise ValueError("flashattn: cache_batch_idx must be [batch] integers")
            if idx.dtype != torch.int32:  # values past int32 become -1, a row the library refuses, not another row
                idx, widened = torch.where((idx >= 0) & (idx < 2 ** 31), idx, -1), True
            block_table = idx.to(torch.int32).view(b, 1)
    elif cache_batch_idx is not None:
        raise ValueError("flashattn: cache_batch_idx applies to a contiguous cache, not with block_table")
    else:
        _tensor("block_table", block_table, 2)
        if block_table.dtype != torch.int32:
            raise ValueError(f"flashattn: block_table must be int32, not {block_table.dtype}")
    if cache_seqlens is None:
        cache_seqlens = 0
    if isinstance(cache_seqlens, int):
        if not 0 <= cache_seqlens < 2 ** 31:
            raise ValueError(f"flashattn: cache_seqlens ({cache_seqlens}) must be in 0..2^31 - 1")
        cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=dev)
    else:
        _tensor("cache_seqlens", cache_seqlens, 1)
        if cache_seqlens.dtype != torch.int32:
            raise ValueError(f"flashattn: cache_seqlens must be int32, not {cache_seqlens.dtype}")
    page = k_cache.shape[1]
    if block_table.shape[1] * page > 2 ** 31 - 1:
        raise ValueError(f"flashattn: block_table's {block_table.shape[1]} pages of {page} tokens pass 2^31 - 1 "
                         "keys a sequence")
    if sq == 0:  # no query rows: nothing to attend or append (validated as far as shapes go)
        _cache_fit(q, k_cache, v_cache, k, v)
        out = q.new_zeros(q.shape)
        return (out, torch.empty((b, hq, 0), dtype=torch.float32, device=dev)) if return_softmax_lse else out
    if (k is None) != (v is None):
        raise ValueError("flashattn: give k and v together")
    kn = vn = None
    if k is not None:
        _tensor("k", k, 4)
        _tensor("v", v, 4)
        if tuple(k.shape[:2]) != (b, sq) or tuple(v.shape) != tuple(k.shape):
            raise ValueError("flashattn: k and v must be [batch, seqlen_q, kv_heads, head_dim]: one new key a "
                             "query row")
        kn, vn = _rows("k", k), _rows("v", v)
    rope = 0
    if rotary_cos is not None or rotary_sin is not None:
        rope = 2 if rotary_interleaved else 1
    cu_q = torch.arange(0, b * sq + 1, sq, dtype=torch.int32, device=dev)
    args = (_rows("q", q), k_cache, v_cache, block_table, cu_q, cache_seqlens, kn, vn, rotary_cos, rotary_sin, rope,
            sq, scale, bool(causal), wl, wr, float(softcap))
    with _rows_as(cache_batch_idx, widened):
        if _eager(q, k_cache, v_cache, kn, vn):
            out, lse = _paged(*args, return_softmax_lse)
        else:
            out, lse = torch.ops.flashattn.kvcache(*args)
    out = out.view(b, sq, hq, d)
    if return_softmax_lse:
        return out, lse.view(hq, b, sq).permute(1, 0, 2)
    return out
