# SPDX-License-Identifier: MIT
"""flashattn from numpy on the CPU against a float64 reference: odd shapes, GQA, masks,
softcap, lse, 16-bit and fp8 inputs, strided views, varlen, and bad input raising ValueError."""
import os

import numpy as np
import pytest

import flashattn

SEED = int(os.environ.get("FLASHATTN_TEST_SEED", "20261202"))
print(f"flashattn python tests: seed {SEED} (replay: FLASHATTN_TEST_SEED={SEED})")


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """o and lse in float64 for [b, s, h, d] inputs, bottom-right causal, GQA by h // group."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    o = np.zeros((b, sq, hq, d))
    lse = np.full((b, hq, sq), -np.inf)
    i = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    wl, wr = window
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    vis = np.ones((sq, sk), dtype=bool)
    if wl >= 0:
        vis &= j >= i - wl
    if wr >= 0:
        vis &= j <= i + wr
    for bb in range(b):
        for h in range(hq):
            s = q[bb, :, h] @ k[bb, :, h // (hq // hk)].T * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            s = np.where(vis, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            p = np.exp(s - m)
            tot = p.sum(axis=1, keepdims=True)
            o[bb, :, h] = np.where(tot > 0, (p @ v[bb, :, h // (hq // hk)]) / np.where(tot > 0, tot, 1), 0)
            lse[bb, h] = np.where(tot[:, 0] > 0, np.log(np.where(tot[:, 0] > 0, tot[:, 0], 1)) + m[:, 0], -np.inf)
    return o, lse


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


CASES = [  # b, sq, sk, hq, hk, d, causal, window, softcap
    (1, 1, 1, 1, 1, 1, False, (-1, -1), 0.0),
    (2, 17, 17, 4, 4, 16, True, (-1, -1), 0.0),
    (1, 5, 33, 8, 2, 80, True, (-1, -1), 0.0),
    (3, 31, 40, 6, 3, 17, False, (7, 2), 0.0),
    (1, 64, 64, 4, 1, 64, True, (16, -1), 30.0),
    (2, 1, 300, 32, 8, 128, False, (-1, -1), 0.0),
    (1, 9, 9, 2, 2, 256, False, (-1, -1), 5.0),
]


@pytest.mark.parametrize("case", CASES)
def test_float32(case):
    b, sq, sk, hq, hk, d, causal, window, softcap = case
    rng = np.random.default_rng(SEED + hash(case) % 1000)
    q, k, v = rand(rng, b, sq, hq, d), rand(rng, b, sk, hk, d), rand(rng, b, sk, hk, d)
    o, lse = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                       return_lse=True)
    ro, rl = reference(q, k, v, causal, window, softcap)
    assert o.dtype == np.float32 and o.shape == q.shape and lse.shape == (b, hq, sq)
    assert np.max(np.abs(o - ro)) < 2e-5
    fin = np.isfinite(rl)
    assert np.all(np.isfinite(lse) == fin)
    assert np.max(np.abs(lse[fin] - rl[fin]), initial=0.0) < 2e-5


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit(dtype):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dt = ml_dtypes.bfloat16
        unit = 2.0 ** -8
    else:
        dt = np.float16
        unit = 2.0 ** -11
    rng = np.random.default_rng(SEED)
    q, k, v = (rand(rng, 2, 40, 8, 64).astype(dt) for _ in range(3))
    o = flashattn.flash_attn_func(q, k, v, causal=True)
    assert o.dtype == q.dtype
    ro, _ = reference(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), causal=True)
    # the output rounds once to the 16-bit type: a few units of its rounding at the outputs' size
    assert np.max(np.abs(o.astype(np.float64) - ro)) < 8 * unit * max(1.0, np.max(np.abs(ro)))


def test_strided_views():
    """[b, h, s, d] arrays seen as [b, s, h, d] (head_dim contiguous): read in place."""
    rng = np.random.default_rng(SEED + 1)
    qb, kb, vb = rand(rng, 2, 4, 21, 32), rand(rng, 2, 2, 30, 32), rand(rng, 2, 2, 30, 32)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (qb, kb, vb))
    assert not q.flags.c_contiguous
    o = flashattn.flash_attn_func(q, k, v, causal=True)
    ro, _ = reference(q, k, v, causal=True)
    assert np.max(np.abs(o - ro)) < 2e-5
    sliced = rand(rng, 2, 21, 4, 64)[:, :, :, :32]  # head_dim padded in memory
    o2 = flashattn.flash_attn_func(sliced, sliced, sliced)
    assert np.max(np.abs(o2 - reference(sliced, sliced, sliced)[0])) < 2e-5
    q1 = rand(rng, 2, 4, 32)[:, None]  # decode's one query a sequence, an inserted axis (stride 0)
    assert q1.strides[1] == 0
    o3 = flashattn.flash_attn_func(q1, k, v)
    assert np.max(np.abs(o3 - reference(q1, k, v)[0])) < 2e-5


def test_varlen():
    rng = np.random.default_rng(SEED + 2)
    lens_q, lens_k = [3, 0, 11, 1], [7, 4, 11, 20]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q, k, v = rand(rng, cu_q[-1], 4, 24), rand(rng, cu_k[-1], 2, 24), rand(rng, cu_k[-1], 2, 24)
    o, lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                              return_lse=True)
    assert lse.shape == (4, cu_q[-1])
    for bb in range(4):
        if lens_q[bb] == 0:
            continue
        s = slice(cu_q[bb], cu_q[bb + 1])
        t = slice(cu_k[bb], cu_k[bb + 1])
        ro, rl = reference(q[None, s], k[None, t], v[None, t], causal=True)
        assert np.max(np.abs(o[s] - ro[0])) < 2e-5
        assert np.max(np.abs(lse[:, s] - rl[0])) < 2e-5


def test_bad_input():
    rng = np.random.default_rng(SEED + 3)
    q, k = rand(rng, 1, 8, 4, 32), rand(rng, 1, 8, 4, 16)
    with pytest.raises(ValueError, match="head_dim"):
        flashattn.flash_attn_func(q, k, k)
    with pytest.raises(ValueError, match="contiguous"):
        flashattn.flash_attn_func(q[..., ::2], q[..., ::2], q[..., ::2])
    with pytest.raises(ValueError, match=r"k.stride_seq \(0\) must be positive \(a broadcast.*np.ascontiguousarray"):
        flashattn.flash_attn_func(q, np.broadcast_to(q[:, :1], q.shape), q)
    with pytest.raises(ValueError, match=r"v.stride_seq \(-\d+\) must be positive \(a broadcast, reversed"):
        flashattn.flash_attn_func(q, q, q[:, ::-1])
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        qi = q.astype(np.int32)
        flashattn.flash_attn_func(qi, qi, qi)
    with pytest.raises(ValueError, match="num_heads"):
        k3 = rand(rng, 1, 8, 3, 32)
        flashattn.flash_attn_func(q, k3, k3)
    with pytest.raises(ValueError, match=r"window_size \(-2, 0\): each entry is -1"):
        flashattn.flash_attn_func(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match=r"softmax_scale \(-0.5\) must be positive"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=-0.5)
    with pytest.raises(ValueError, match="window_size"):
        flashattn.flash_attn_func(q, q, q, window_size=5)
    with pytest.raises(ValueError, match=r"window_size\[0\] must be an integer, not True"):
        flashattn.flash_attn_func(q, q, q, window_size=(True, False))
    with pytest.raises(ValueError, match=r"softcap \(1e\+300\) does not fit in float32"):
        flashattn.flash_attn_func(q, q, q, softcap=1e300)
    with pytest.raises(ValueError, match="softmax_scale"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=float("nan"))
    with pytest.raises(ValueError, match=r"k's dtype \(float16\) must equal q's \(float32\)"):
        flashattn.flash_attn_func(q, q.astype(np.float16), q)
    with pytest.raises(ValueError, match="causal must be True or False, not 'no'"):
        flashattn.flash_attn_func(q, q, q, causal="no")
    with pytest.raises(ValueError, match="k must be a numpy array or a torch tensor, not list"):
        flashattn.flash_attn_func(q, q.tolist(), q)
    with pytest.raises(ValueError, match="cu_seqlens_q must be a numpy array or a torch tensor, not list"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], [0, 8], [0, 8], 8, 8)
    with pytest.raises(ValueError, match="k is required"):
        flashattn.flash_attn_func(q, None, q)
    with pytest.raises(ValueError, match=r"softmax_scale \(an integer of 401 digits\) does not fit in float32"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=10 ** 400)
    # the library's words about the block table made from cache_batch_idx name cache_batch_idx
    kc, kn = np.zeros((4, 8, 4, 32), np.float32), rand(rng, 2, 1, 4, 32)
    with pytest.raises(ValueError, match=r"cache_batch_idx\[1\] \(1\) is a page this call appends to"):
        flashattn.flash_attn_with_kvcache(rand(rng, 2, 1, 4, 32), kc, kc.copy(), kn, kn.copy(), cache_seqlens=1,
                                          cache_batch_idx=np.array([1, 1]))
    assert not kc.any()
    # empty calls check their arrays as calls with work do
    q0 = rand(rng, 0, 5, 4, 32)
    assert flashattn.flash_attn_func(q0, q0, q0).shape == q0.shape
    with pytest.raises(ValueError, match="k must be a numpy array or a torch tensor, not str"):
        flashattn.flash_attn_func(q0, "garbage", None)
    with pytest.raises(ValueError, match="do not go with q"):
        flashattn.flash_attn_func(q, rand(rng, 1, 0, 4, 32), rand(rng, 1, 0, 4, 16))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        flashattn.flash_attn_func(q0.astype(np.int64), q0.astype(np.int64), q0.astype(np.int64))
    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    if ml_dtypes is not None:  # integers are no stand-in for bfloat16 or float8 elements
        qb = q.astype(ml_dtypes.bfloat16)
        with pytest.raises(ValueError, match=r"k's dtype \(uint16\) must equal q's \(bfloat16\)"):
            flashattn.flash_attn_func(qb, qb.view(np.uint16), qb)
        q8 = q.astype(np.uint8)
        with pytest.raises(ValueError, match="float8_e4m3fn inputs"):
            flashattn.flash_attn_func(q8, q8, q8, q_descale=np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match=r"must be \[batch, seqlen, heads, head_dim\]"):
        flashattn.flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="k's batch"):
        flashattn.flash_attn_func(q, rand(rng, 2, 8, 4, 32), rand(rng, 2, 8, 4, 32))
    with pytest.raises(ValueError, match="v's shape"):
        flashattn.flash_attn_func(q, q, rand(rng, 1, 9, 4, 32))
    with pytest.raises(ValueError, match="cu_seqlens"):
        cu = np.array([0, 8], dtype=np.int64)
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8)
    # dtypes the bindings cannot take are refused by name
    with pytest.raises(ValueError, match="q is in non-native byte order"):
        qs = q.astype(">f4")
        flashattn.flash_attn_func(qs, qs, qs)
    with pytest.raises(ValueError, match=r"k's dtype \(object\) is not one flashattn takes"):
        flashattn.flash_attn_func(q, q.astype(object), q)
    if ml_dtypes is not None:
        q5 = q.astype(ml_dtypes.float8_e5m2)
        with pytest.raises(ValueError, match=r"q's dtype \(float8_e5m2\)"):
            flashattn.flash_attn_func(q5, q5, q5)
        q8 = np.zeros((1, 1, 4, 32), ml_dtypes.float8_e4m3fn)
        c8 = np.zeros((2, 16, 4, 32), ml_dtypes.float8_e4m3fn)
        with pytest.raises(ValueError, match="q is float8_e4m3fn; flash_attn_with_kvcache takes"):
            flashattn.flash_attn_with_kvcache(q8, c8, c8)
        with pytest.raises(ValueError, match="merge_states' o is float8_e4m3fn"):
            flashattn.merge_states(np.zeros((2, 3, 4, 32), ml_dtypes.float8_e4m3fn), np.zeros((2, 4, 3), np.float32))


def test_empty_calls_validate():
    """Calls with nothing to compute refuse what a call with work refuses."""
    q0, k = np.zeros((0, 2, 8), np.float32), np.zeros((12, 2, 8), np.float32)
    cu0 = np.zeros(3, np.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k must be int32"):
        flashattn.flash_attn_varlen_func(q0, k, k, cu0, np.ones((2, 2), np.int32), 0, 7)
    with pytest.raises(ValueError, match="cu_seqlens_k must rise"):
        flashattn.flash_attn_varlen_func(q0, k, k, cu0, np.array([0, 9, 3], np.int32), 0, 9)
    assert flashattn.flash_attn_varlen_func(q0, k, k, cu0, np.array([0, 9, 12], np.int32), 0, 9).shape == q0.shape
    with pytest.raises(ValueError, match=r"q's heads \(0\)"):
        flashattn.flash_attn_func(np.zeros((1, 4, 0, 8), np.float32), np.zeros((1, 4, 2, 8), np.float32),
                                  np.zeros((1, 4, 2, 8), np.float32))
    qb, cache = np.zeros((0, 1, 4, 16), np.float32), np.zeros((6, 4, 2, 16), np.float32)
    with pytest.raises(ValueError, match="block_table must be int32"):
        flashattn.flash_attn_with_kvcache(qb, cache, cache, block_table=np.zeros((0, 3), np.float32))
    with pytest.raises(ValueError, match=r"must be \[pages, page_size, kv_heads, 8\]"):
        flashattn.flash_attn_with_kvcache(np.zeros((0, 1, 4, 8), np.float32), cache, cache,
                                          block_table=np.zeros((0, 3), np.int32))
    assert flashattn.flash_attn_with_kvcache(qb, cache, cache, block_table=np.zeros((0, 3), np.int32)).shape == qb.shape


@pytest.mark.parametrize("varlen", [False, True])
def test_fp8(varlen):
    """float8_e4m3fn inputs (ml_dtypes) with FlashAttention-3's descale factors, one per (batch,
    kv head): bfloat16 out and float32 lse against float64 of the exact fp8 values times their
    factors; the CPU multiplies those values exactly, so out is off by its bf16 rounding."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(SEED + 40)
    b, sq, sk, hq, hk, d = 2, 19, 37, 6, 2, 64
    q, k, v = (rand(rng, b, s, h, d).astype(ml_dtypes.float8_e4m3fn) for s, h in ((sq, hq), (sk, hk), (sk, hk)))
    ds = [rng.uniform(0.5, 2.0, (b, hk)).astype(np.float32) for _ in range(3)]
    wide = [x.astype(np.float64) * f.astype(np.float64)[:, None, :, None]
            for x, f in zip((q, k, v), (np.repeat(ds[0], hq // hk, axis=1), ds[1], ds[2]))]
    ro, rl = reference(*wide, causal=True)
    if varlen:
        cu_q, cu_k = (np.array([0, s, 2 * s], dtype=np.int32) for s in (sq, sk))
        o, lse = flashattn.flash_attn_varlen_func(q.reshape(b * sq, hq, d), k.reshape(b * sk, hk, d),
                                                  v.reshape(b * sk, hk, d), cu_q, cu_k, sq, sk, causal=True,
                                                  return_lse=True, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
        o, lse = o.reshape(b, sq, hq, d), lse.reshape(hq, b, sq).transpose(1, 0, 2)
    else:
        o, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True, q_descale=ds[0],
                                           k_descale=ds[1], v_descale=ds[2])
    assert o.dtype == ml_dtypes.bfloat16 and o.shape == q.shape
    assert np.max(np.abs(o.astype(np.float64) - ro)) <= 2 ** -8 * np.max(np.abs(ro)) + 1e-6
    assert np.max(np.abs(lse - rl)) < 1e-4
    with pytest.raises(ValueError, match=r"q_descale must be float32 \[batch, num_heads_kv\]"):
        flashattn.flash_attn_func(q, k, v, q_descale=ds[0][:1])
    with pytest.raises(ValueError, match="float8_e4m3fn inputs"):
        x = rand(rng, b, sq, hk, d)
        flashattn.flash_attn_func(x, x, x, k_descale=ds[1])
    with pytest.raises(ValueError, match=r"k's dtype \(float32\) must equal q's \(float8_e4m3fn\)"):
        flashattn.flash_attn_func(q, k.astype(np.float32), v)
    # no query rows: nothing runs, and the arguments are checked all the same
    q0 = q[:, :0]
    assert flashattn.flash_attn_func(q0, k, v, q_descale=ds[0]).shape == q0.shape
    with pytest.raises(ValueError, match=r"q_descale must be float32 \[batch, num_heads_kv\]"):
        flashattn.flash_attn_func(q0, k, v, q_descale=ds[0][:1])
    with pytest.raises(ValueError, match="do not go with q"):
        flashattn.flash_attn_func(q0, k[:, :, :1], v)


@pytest.mark.parametrize("varlen", [False, True])
def test_fp8_block_factors(varlen):
    """fp8 inputs with a descale factor per (batch, kv head) and block of 16 query rows, 5 key
    rows for k and 32 for v (descale_block_rows), against float64 of the exact values times
    their rows' factors; a sequence's blocks count from its own first row."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(SEED + 41)
    b, sq, sk, hq, hk, d = 2, 19, 37, 6, 2, 64
    q, k, v = (rand(rng, b, s, h, d).astype(ml_dtypes.float8_e4m3fn) for s, h in ((sq, hq), (sk, hk), (sk, hk)))
    blk, seqs = (16, 5, 32), (sq, sk, sk)
    rows = tuple(b * s for s in seqs) if varlen else seqs  # varlen: blocks of the packed rows
    ds = [rng.uniform(0.5, 2.0, (b, hk, -(-r // n))).astype(np.float32) for r, n in zip(rows, blk)]

    def per_row(f, s, n, heads):  # [b, s, heads]: row i of its sequence takes block i // n
        return np.repeat(f[:, :, np.arange(s) // n], heads // hk, axis=1).transpose(0, 2, 1).astype(np.float64)
    wide = [x.astype(np.float64) * per_row(f, s, n, h)[..., None]
            for x, f, s, n, h in zip((q, k, v), ds, seqs, blk, (hq, hk, hk))]
    ro, rl = reference(*wide, causal=True)
    if varlen:
        cu_q, cu_k = (np.array([0, s, 2 * s], dtype=np.int32) for s in (sq, sk))
        o, lse = flashattn.flash_attn_varlen_func(q.reshape(b * sq, hq, d), k.reshape(b * sk, hk, d),
                                                  v.reshape(b * sk, hk, d), cu_q, cu_k, sq, sk, causal=True,
                                                  return_lse=True, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2],
                                                  descale_block_rows=blk)
        o, lse = o.reshape(b, sq, hq, d), lse.reshape(hq, b, sq).transpose(1, 0, 2)
    else:
        o, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True, q_descale=ds[0],
                                           k_descale=ds[1], v_descale=ds[2], descale_block_rows=blk)
    assert np.max(np.abs(o.astype(np.float64) - ro)) <= 2 ** -8 * np.max(np.abs(ro)) + 1e-6
    assert np.max(np.abs(lse - rl)) < 1e-4
    if varlen:
        return
    with pytest.raises(ValueError, match=r"k_descale must be float32 \[batch, num_heads_kv, blocks\] \(\[2, 2, 8\]"):
        flashattn.flash_attn_func(q, k, v, k_descale=ds[1][:, :, :7], descale_block_rows=blk)
    with pytest.raises(ValueError, match=r"q_descale must be float32 \[batch, num_heads_kv\]"):
        flashattn.flash_attn_func(q, k, v, q_descale=ds[0])  # per-block factors without the block size
    with pytest.raises(ValueError, match="descale_block_rows must be an integer or three"):
        flashattn.flash_attn_func(q, k, v, descale_block_rows=(16, 5))
    with pytest.raises(ValueError, match=r"descale_block_rows \(-1\) must be in 0..1073741824"):
        flashattn.flash_attn_func(q, k, v, descale_block_rows=-1)
    with pytest.raises(ValueError, match=r"descale_block_rows\[1\] must be an integer, not bool"):
        flashattn.flash_attn_func(q, k, v, descale_block_rows=(16, True, 32))
    with pytest.raises(ValueError, match=r"k_descale.stride_block \(-1\) must be >= 0 \(a broadcast, reversed"):
        flashattn.flash_attn_func(q, k, v, k_descale=ds[1][:, :, ::-1], descale_block_rows=blk)
    with pytest.raises(ValueError, match="descale_block_rows\\) are for float8_e4m3fn inputs"):
        x = rand(rng, b, sq, hk, d)
        flashattn.flash_attn_func(x, x, x, descale_block_rows=16)
    # None is the default's 0; a view with one block in reverse reads as well as a plain one
    one = np.ones((b, hk, 1), np.float32)[:, :, ::-1]
    o1 = flashattn.flash_attn_func(q, k, v, k_descale=one, descale_block_rows=(0, 64, 0))
    assert np.array_equal(o1.astype(np.float32), flashattn.flash_attn_func(q, k, v, descale_block_rows=None).astype(np.float32))
    # no query rows: the shapes are checked all the same
    with pytest.raises(ValueError, match=r"v_descale must be float32 \[batch, num_heads_kv, blocks\]"):
        flashattn.flash_attn_func(q[:, :0], k, v, v_descale=ds[1], descale_block_rows=blk)


def test_threads():
    """Calls from several threads take turns per device: every result right (decode shapes of
    different lengths regrow the context's scratch)."""
    import threading
    errs = []

    def work(i):
        rng = np.random.default_rng(SEED + 10 + i)
        q, k = rand(rng, 1, 1, 8, 64), rand(rng, 1, 512 * (i + 1), 8, 64)
        want = reference(q, k, k)[0]
        for _ in range(20):
            if np.max(np.abs(flashattn.flash_attn_func(q, k, k) - want)) > 2e-5:
                errs.append(i)
    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs


def test_edges():
    rng = np.random.default_rng(SEED + 4)
    q = rand(rng, 1, 6, 2, 8)
    ro = q.copy()
    ro.setflags(write=False)  # read-only inputs are read in place
    assert np.max(np.abs(flashattn.flash_attn_func(ro, ro, ro) - reference(q, q, q)[0])) < 2e-5
    b = np.broadcast_to(q[:, :1], (1, 6, 2, 8))  # a stride-0 view is refused by name, not crashed on
    with pytest.raises(ValueError, match="stride"):
        flashattn.flash_attn_func(q, b, b)
    empty = np.zeros((0, 6, 2, 8), np.float32)
    assert flashattn.flash_attn_func(empty, empty, empty).shape == empty.shape
    o, lse = flashattn.flash_attn_func(q, q[:, :0], q[:, :0], return_lse=True)  # no keys
    assert np.all(o == 0) and np.all(np.isneginf(lse))
    # nothing to attend: what a call with work refuses is refused all the same
    for kw, what in ((dict(dropout_p=2.0), "dropout_p"), (dict(softcap=-1.0), "softcap")):
        with pytest.raises(ValueError, match=what):
            flashattn.flash_attn_func(empty, empty, empty, **kw)
    with pytest.raises(ValueError, match="head_dim"):
        flashattn.flash_attn_func(q[..., :0], q[..., :0], q[..., :0])
    with pytest.raises(ValueError, match="softmax_scale 0"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=0.0)
    with pytest.raises(ValueError, match="rounds to 0"):
        flashattn.flash_attn_func(q, q, q, softcap=1e-60)
    assert np.allclose(flashattn.flash_attn_func(q, q, q, softmax_scale=np.float32(0.3)),
                       reference(q, q, q, scale=0.3)[0], atol=2e-5)
    with pytest.raises(ValueError, match="integer"):
        flashattn.flash_attn_func(q, q, q, window_size="12")
    with pytest.raises(ValueError, match="seed"):
        flashattn.flash_attn_func(q, q, q, seed=-1)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises(ValueError, match="dtype"):
        flashattn.flash_attn_func(q, q.astype(ml_dtypes.bfloat16), q)


def rope_ref(x, pos, cos, sin, interleaved):
    """x [n, h, d] rotated at positions pos [n] with tables [max_pos, rd / 2], in float64."""
    x = np.array(x, dtype=np.float64)
    rd = 2 * cos.shape[1]
    c, s = cos[pos][:, None, :].astype(np.float64), sin[pos][:, None, :].astype(np.float64)
    if interleaved:
        a, b = x[..., 0:rd:2].copy(), x[..., 1:rd:2].copy()
        x[..., 0:rd:2], x[..., 1:rd:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., : rd // 2].copy(), x[..., rd // 2: rd].copy()
        x[..., : rd // 2], x[..., rd // 2: rd] = a * c - b * s, a * s + b * c
    return x


@pytest.mark.parametrize("interleaved", [True, False])
def test_kvcache_paged(interleaved):
    """Pages of 16 in a shuffled table: the new keys land rotated at each sequence's length and
    attention sees the cache plus them (bottom-right causal)."""
    rng = np.random.default_rng(SEED + 5 + interleaved)
    b, sq, hq, hk, d, page = 3, 2, 8, 2, 32, 16
    lens = np.array([5, 16, 33], dtype=np.int32)
    pages_per = 4
    table = rng.permutation(b * pages_per).astype(np.int32).reshape(b, pages_per)
    kc, vc = rand(rng, b * pages_per, page, hk, d), rand(rng, b * pages_per, page, hk, d)
    kc0 = kc.copy()
    q, kn, vn = rand(rng, b, sq, hq, d), rand(rng, b, sq, hk, d), rand(rng, b, sq, hk, d)
    max_pos = 64
    ang = np.arange(max_pos)[:, None] * 10000.0 ** (-np.arange(d // 4) * 2.0 / (d // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)  # rotary_dim = d / 2
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=lens, block_table=table, causal=True,
                                                 rotary_interleaved=interleaved, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (b, hq, sq)
    for bb in range(b):
        pos = lens[bb] + np.arange(sq)
        krot = rope_ref(kn[bb], pos, cos, sin, interleaved)
        keys = np.concatenate([kc0[table[bb, j // page], j % page][None] for j in range(lens[bb])] + [krot]) \
            if lens[bb] else krot
        vals = np.concatenate([vc[table[bb, j // page], j % page][None] for j in range(lens[bb])] + [vn[bb]])
        qr = rope_ref(q[bb], pos, cos, sin, interleaved)
        ro, rl = reference(qr[None], keys[None], vals[None], causal=True)
        assert np.max(np.abs(out[bb] - ro[0])) < 3e-5
        assert np.max(np.abs(lse[bb] - rl[0])) < 3e-5
        for i in range(sq):  # the cache holds the rotated keys now
            j = lens[bb] + i
            assert np.max(np.abs(kc[table[bb, j // page], j % page] - krot[i])) < 3e-6


def test_kvcache_contiguous():
    rng = np.random.default_rng(SEED + 7)
    kc, vc = rand(rng, 2, 50, 4, 16), rand(rng, 2, 50, 4, 16)
    q = rand(rng, 2, 1, 4, 16)
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20)
    ro, _ = reference(q, kc[:, :20], vc[:, :20])
    assert np.max(np.abs(out - ro)) < 2e-5
    with pytest.raises(ValueError, match="k and v"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, k=rand(rng, 2, 1, 4, 16))
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=51)
    qs = rand(rng, 2, 2, 4, 16).transpose(1, 0, 2, 3)  # [2, 2, ...] whose rows are not one run
    with pytest.raises(ValueError, match="one run of rows"):
        flashattn.flash_attn_with_kvcache(qs, kc, vc, cache_seqlens=20)
    # one dtype for both pools (a float16 v_cache beside a float32 k_cache was read as float32)
    with pytest.raises(ValueError, match="v_cache's dtype"):
        flashattn.flash_attn_with_kvcache(q, kc, vc.astype(np.float16), cache_seqlens=20)
    # rotary tables without columns (rotary_dim 0 would mean the whole head_dim)
    z = np.ones((64, 0), np.float32)
    with pytest.raises(ValueError, match="no columns"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, k=rand(rng, 2, 1, 4, 16), v=rand(rng, 2, 1, 4, 16),
                                          cache_seqlens=20, rotary_cos=z, rotary_sin=z)
    # no query rows: an empty output; no sequences: empty outputs too, as flash_attn_func gives
    out = flashattn.flash_attn_with_kvcache(rand(rng, 2, 0, 4, 16), kc, vc, cache_seqlens=20)
    assert out.shape == (2, 0, 4, 16)
    out, lse = flashattn.flash_attn_with_kvcache(rand(rng, 0, 1, 4, 16), kc, vc, return_softmax_lse=True)
    assert out.shape == (0, 1, 4, 16) and lse.shape == (0, 4, 1)
    # cache rows: chosen by integers within the cache, one a sequence
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, cache_batch_idx=np.array([1, 0]))
    ro, _ = reference(q, kc[::-1, :20], vc[::-1, :20])
    assert np.max(np.abs(out - ro)) < 2e-5
    for idx, match in ((np.array([0.9, 1.2]), "integers"), (np.array([0, 2]), r"cache_batch_idx\[1\] \(2\)"),
                       ([0, 1], "cache_batch_idx must be a numpy array")):
        with pytest.raises(ValueError, match=match):
            flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, cache_batch_idx=idx)
    with pytest.raises(ValueError, match=r"batch \(3\) is more than k_cache's rows \(2\)"):
        flashattn.flash_attn_with_kvcache(rand(rng, 3, 1, 4, 16), kc, vc)
    with pytest.raises(ValueError, match="cache_seqlens must be a numpy array"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=[3, 5])
    with pytest.raises(ValueError, match=r"cache_seqlens \(1099511627776\)"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=2 ** 40)
    # a read-only cache is read, and refused where the call would append into it
    kr, vr = kc.copy(), vc.copy()
    kr.flags.writeable = vr.flags.writeable = False
    assert np.array_equal(flashattn.flash_attn_with_kvcache(q, kr, vr, cache_seqlens=20),
                          flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20))
    with pytest.raises(ValueError, match="k_cache is read-only"):
        flashattn.flash_attn_with_kvcache(q, kr, vr, k=rand(rng, 2, 1, 4, 16), v=rand(rng, 2, 1, 4, 16),
                                          cache_seqlens=20)


def test_block_table_layout():
    """A block table whose rows are not one after another is refused before it is read (a
    broadcast table of 100,000 rows over one row's buffer was copied from past its end)."""
    kc = np.zeros((4, 16, 1, 8), np.float32)
    for b, table in ((100_000, np.broadcast_to(np.zeros((1, 1024), np.int32), (100_000, 1024))),
                     (4096, np.zeros((4096, 4096), np.int32)[::-1])):
        with pytest.raises(ValueError, match="block_table's rows must be contiguous"):
            flashattn.flash_attn_with_kvcache(np.zeros((b, 1, 1, 8), np.float32), kc, kc.copy(), block_table=table)
    q = np.zeros((2, 1, 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"block_table must be int32 \[batch, max_pages\]"):
        flashattn.flash_attn_with_kvcache(q, kc, kc.copy(), block_table=np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="pass 2\\^31 - 1 keys"):
        flashattn.flash_attn_with_kvcache(q, kc, kc.copy(), block_table=np.zeros((2, 2 ** 28), np.int32))


def test_merge_states():
    """Attention over two halves of the keys, merged, equals attention over all of them."""
    rng = np.random.default_rng(SEED + 8)
    q, k, v = rand(rng, 1, 7, 4, 32), rand(rng, 1, 50, 4, 32), rand(rng, 1, 50, 4, 32)
    oa, la = flashattn.flash_attn_func(q, k[:, :20], v[:, :20], return_lse=True)
    ob, lb = flashattn.flash_attn_func(q, k[:, 20:], v[:, 20:], return_lse=True)
    o, lse = flashattn.merge_states(np.stack([oa[0], ob[0]]), np.stack([la[0], lb[0]]))
    ro, rl = reference(q, k, v)
    assert np.max(np.abs(o - ro[0])) < 2e-5 and np.max(np.abs(lse - rl[0])) < 2e-5
    with pytest.raises(ValueError, match="lse"):
        flashattn.merge_states(np.stack([oa[0], ob[0]]), np.stack([la[0], lb[0]])[:, :3])
    bad = np.stack([la[0], lb[0]])
    bad[1, 2, 3] = np.nan  # it read as a state without keys, and o came out NaN
    with pytest.raises(ValueError, match=r"lse\[1, 2, 3\] is nan"):
        flashattn.merge_states(np.stack([oa[0], ob[0]]), bad)
    # no rows: empty outputs; one head: an lse broadcast along it (stride 0) is read as it is
    o0, l0 = flashattn.merge_states(np.zeros((2, 0, 4, 8), np.float32), np.zeros((2, 4, 0), np.float32))
    assert o0.shape == (0, 4, 8) and l0.shape == (4, 0)
    l1 = np.stack([la[0, 0], lb[0, 0]])  # [states, rows] of head 0
    o1, m1 = flashattn.merge_states(np.stack([oa[0][:, :1], ob[0][:, :1]]), l1[:, None, :])
    assert np.array_equal(o1, o[:, :1]) and np.array_equal(m1, lse[:1])
    # broadcast along every axis: all its strides 0, which the library would read as packed
    # (out of bounds); refused by name, like a partly broadcast one
    for bad_lse in (np.broadcast_to(np.float32(0), (2, 4, 7)), np.broadcast_to(la[0][None], (2, 4, 7))):
        with pytest.raises(ValueError, match=r"lse's dimension \d has stride 0 \(a broadcast"):
            flashattn.merge_states(np.stack([oa[0], ob[0]]), bad_lse)


def test_backends_and_info():
    """The built backends, and the library's description of the CPU one; a backend left out
    of the build is refused with the library's reason."""
    built = flashattn.backends()
    assert built[0] == "cpu" and set(built) <= {"cpu", "cuda", "gles"}
    text = flashattn.info()
    assert text.startswith("backend: cpu\n") and "cpu.kernels" in text and text == flashattn.info("cpu")
    with pytest.raises(ValueError, match="device"):
        flashattn.info("tpu")
    if "cuda" not in built:
        with pytest.raises(RuntimeError, match="not built"):
            flashattn.info("cuda")
