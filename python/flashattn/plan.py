# SPDX-License-Identifier: MIT
"""PagedPlan: the paged call planned once for a serving loop and run per step (and per
layer) on tensors alone, over fa_paged_plan_create / fa_paged_run."""
import sys

from . import (_C, _arrays, _bf16_numpy, _common, _device, _empty, _flags, _int, _is_torch, _same_dtype, _stream,
               _writable, _torch, _zeros)

_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
_ROPES = {None: 0, "neox": 1, "interleaved": 2}
_I32 = 2 ** 31 - 1


def _dtype_code(dtype):
    name = None
    if not isinstance(dtype, str):
        try:  # numpy scalar types (np.float16, ml_dtypes.bfloat16) and dtypes
            import numpy as np
            name = np.dtype(dtype).name
        except (ImportError, TypeError):
            pass
    if name is None:
        name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "")
    if name not in _DTYPES:
        raise ValueError(f"flashattn: dtype ({dtype!r}) must be float32, float16 or bfloat16")
    return _DTYPES[name]


def _torch_stream(device):
    """torch's current stream on a CUDA device, where torch is loaded (None otherwise: the
    library's default stream)."""
    torch = sys.modules.get("torch")
    if device[0] != 2 or torch is None or not torch.cuda.is_available() or device[1] >= torch.cuda.device_count():
        return None
    return torch.cuda.current_stream(device[1])


class PagedPlan:
    """The paged attention of a serving loop, planned once: the kernel, KV split and GQA
    packing are chosen here, from host-side bounds, and on CUDA the workspace allocated; run()
    then takes any step within them, on CUDA allocating nothing and reading no device memory
    from the host, so a CUDA graph may capture it (the CPU takes its threads' buffers a call,
    MemoryError where they do not fit).

    Bounds: batch (sequences), total_q (packed query rows), max_seqlen_q (query rows of one
    sequence) and max_seqlen_k (its keys, cached plus appended) are upper bounds; num_heads_q,
    num_heads_kv, head_dim, page_size, dtype (the queries' and the cache's, "float32",
    "float16", "bfloat16" or a numpy / torch dtype), append (whether k and v are written into
    the cache), rotary (None, "neox" or "interleaved", over the first rotary_dim dimensions,
    0 = all), return_lse and kv_split (keys per split, a multiple of 16, 0 = the backend's)
    must match every run. softmax_scale, causal, window_size and softcap are fixed for the
    plan. device: "cpu", "cuda" or "cuda:N" (or a torch.device).

    A call beyond the bounds, or one that differs from the plan, raises ValueError with the
    library's message ("batch (9) exceeds the plan's bound (8): make a plan for larger
    bounds"). Calls take turns with other calls on the same device; close() (or the end of a
    with block, or garbage collection) frees the plan.
    """

    def __init__(self, *, batch, total_q, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, head_dim,
                 page_size, dtype="float32", device="cpu", append=True, rotary=None, rotary_dim=0,
                 return_lse=False, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, kv_split=0):
        scale, wl, wr = _common(0.0, softmax_scale, window_size, softcap, True)
        if not (rotary is None or isinstance(rotary, str)) or rotary not in _ROPES:
            raise ValueError(f"flashattn: rotary ({rotary!r}) must be None, 'neox' or 'interleaved'")
        _flags(append=append, return_lse=return_lse, causal=causal)
        append, return_lse, causal = bool(append), bool(return_lse), bool(causal)
        if rotary is None and rotary_dim:
            raise ValueError(f"flashattn: rotary_dim ({rotary_dim!r}) applies to a rotary plan: give rotary 'neox' or "
                             "'interleaved', or rotary_dim 0")
        dims = {name: _int(name, value, 0, _I32) for name, value in (
            ("batch", batch), ("total_q", total_q), ("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k),
            ("num_heads_q", num_heads_q), ("num_heads_kv", num_heads_kv), ("head_dim", head_dim),
            ("page_size", page_size), ("rotary_dim", rotary_dim), ("kv_split", kv_split))}
        self._device = _device(device)
        self._append, self._lse, self._rope = append, return_lse, _ROPES[rotary]
        # CUDA: the workspace is taken on the current stream and given back on it at close()
        self._made_on = _torch_stream(self._device)
        self._plan = _C.PagedPlan(self._device[0], self._device[1], dims["batch"], dims["total_q"],
                                  dims["max_seqlen_q"], dims["max_seqlen_k"], dims["num_heads_q"],
                                  dims["num_heads_kv"], dims["head_dim"], dims["page_size"], _dtype_code(dtype),
                                  append, self._rope, dims["rotary_dim"], return_lse, scale, causal, wl, wr,
                                  float(softcap), dims["kv_split"],
                                  0 if self._made_on is None else self._made_on.cuda_stream)

    def run(self, q, k_cache, v_cache, block_table, cache_seqlens, cu_seqlens_q, k=None, v=None, rotary_cos=None,
            rotary_sin=None):
        """One step: q [total_q, heads, head_dim] (sequence b's rows cu_seqlens_q[b] ..
        cu_seqlens_q[b + 1]) over k_cache / v_cache [pages, page_size, kv_heads, head_dim]
        through block_table int32 [batch, max_pages] and cache_seqlens int32 [batch] (tokens
        cached before the step, not advanced by it), k and v [total_q, kv_heads, head_dim]
        appended first when the plan appends, rotary_cos / rotary_sin float32 [max_pos,
        rotary_dim / 2] when it rotates. Every tensor on the plan's device. Returns out (q's
        shape and dtype; rows past the last sequence zero), or (out, lse float32
        [heads, total_q]) when the plan returns lse."""
        if self._append != (k is not None) or (k is None) != (v is None):
            raise ValueError("flashattn: this plan " + ("appends: give k and v" if self._append else
                                                        "does not append: k and v must be None"))
        if bool(self._rope) != (rotary_cos is not None) or (rotary_cos is None) != (rotary_sin is None):
            raise ValueError("flashattn: this plan " + ("rotates: give rotary_cos and rotary_sin" if self._rope else
                                                        "applies no rotary embedding: rotary_cos and rotary_sin "
                                                        "must be None"))
        if getattr(q, "ndim", None) != 3:
            raise ValueError("flashattn: q must be [total_q, heads, head_dim]")
        out = _zeros(tuple(q.shape), q)
        lse = None
        if self._lse:
            lse = _empty((q.shape[1], q.shape[0]), q, float32=True)
            lse[...] = float("-inf")
        if not _is_torch(q):  # torch tensors: the bindings check them, in code torch.compile may trace
            _arrays(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, cache_seqlens=cache_seqlens,
                    cu_seqlens_q=cu_seqlens_q, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin)
            _same_dtype(q, k_cache=k_cache, v_cache=v_cache, k=k, v=v)
            if k is not None:
                _writable(k_cache=k_cache, v_cache=v_cache)
        args = (q, out, k_cache, v_cache, block_table, cu_seqlens_q, cache_seqlens, k, v, rotary_cos, rotary_sin, lse)
        if _is_torch(q) and _torch():  # as DLPack capsules: the fast way in
            names = ("q", "out", "k_cache", "v_cache", "block_table", "cu_seqlens_q", "cache_seqlens", "k", "v",
                     "rotary_cos", "rotary_sin", "lse")
            for name, x in zip(names, args):
                if x is not None and not _is_torch(x):
                    raise ValueError(f"flashattn: {name} must be a torch tensor like q, not {type(x).__name__}")
            bf, args = False, tuple(map(_torch()._dlo, args))
        else:
            bf = _bf16_numpy(q)[1]
            args = tuple(None if x is None else _bf16_numpy(x)[0] for x in args)
        self._plan.run(*args, _stream(q), bf)
        return (out, lse) if self._lse else out

    def info(self):
        """What the plan runs: {"backend", "kernel", "block_q", "block_k", "threads",
        "workspace_bytes"}."""
        return self._plan.info()

    def close(self):
        """Free the plan now (a closed plan refuses run()). On CUDA its workspace goes back
        once the work queued on torch's current stream is done."""
        if self._made_on is not None:  # the release, queued on the plan's stream, waits for the runs
            self._made_on.wait_stream(_torch_stream(self._device))
        self._plan.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
