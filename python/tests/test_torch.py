# SPDX-License-Identifier: MIT
"""flashattn from torch on the CPU: forward and gradients against a float64 reference and
against torch's SDPA (GQA, causal, windows, softcap, varlen, strided views, 16-bit), fp8
inputs with descale factors, deterministic gradients, torch.library.opcheck on every op,
torch.compile(fullgraph=True) of a small attention module and of a KV-cache decode step,
PagedPlan on torch tensors, and bad input raising ValueError. Skipped where torch is not
installed."""
import os

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import flashattn  # noqa: E402
import flashattn.torch_ops  # noqa: E402,F401  (registers torch.ops.flashattn)

SEED = int(os.environ.get("FLASHATTN_TEST_SEED", "20261202"))
print(f"flashattn torch tests: seed {SEED} (replay: FLASHATTN_TEST_SEED={SEED})")


def visible(sq, sk, causal, window):
    """[sq, sk] keys each query row sees, bottom-right aligned."""
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    wl, wr = window
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    vis = torch.ones(sq, sk, dtype=torch.bool)
    if wl >= 0:
        vis &= j >= i - wl
    if wr >= 0:
        vis &= j <= i + wr
    return vis


def standard(q, k, v, causal=False, window=(-1, -1), softcap=0.0):
    """Unfused attention in q's dtype (float64 for the reference), differentiable: [b, s, h, d]
    inputs, GQA by h // group, rows that see no key give 0."""
    hq, hk = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(hq // hk, dim=2), v.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    vis = visible(q.shape[1], k.shape[1], causal, window)
    s = s.masked_fill(~vis, float("-inf"))
    m = s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    p = torch.exp(s - m)
    den = p.sum(-1, keepdim=True)
    o = torch.einsum("bhqk,bkhd->bqhd", p / den.clamp_min(torch.finfo(den.dtype).tiny), v)
    return o


def grads(fn, inputs, g):
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    o = fn(*xs)
    o.backward(g.to(o.dtype))
    return o.detach(), [x.grad for x in xs]


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def rand(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)


CASES = [  # b, sq, sk, hq, hk, d, causal, window, softcap
    (2, 17, 17, 4, 4, 32, True, (-1, -1), 0.0),
    (1, 5, 33, 8, 2, 80, True, (-1, -1), 0.0),
    (3, 31, 40, 6, 3, 17, False, (7, 2), 0.0),
    (1, 64, 64, 4, 1, 64, True, (16, -1), 30.0),
    (2, 1, 130, 8, 8, 128, False, (-1, -1), 0.0),
    (1, 40, 9, 2, 1, 16, False, (-1, -1), 0.0),
]


def check_against_reference(case, dtype, floor):
    """out and the three gradients of flash_attn_func against float64, within twice the error
    of standard attention computed in `dtype`, plus a floor."""
    b, sq, sk, hq, hk, d, causal, window, softcap = case
    gen = torch.Generator().manual_seed(SEED + sum(map(hash, map(str, case))) % 1000)
    q, k, v = rand(gen, b, sq, hq, d, dtype=dtype), rand(gen, b, sk, hk, d, dtype=dtype), rand(gen, b, sk, hk, d,
                                                                                                 dtype=dtype)
    g = rand(gen, b, sq, hq, d, dtype=dtype)

    def ours(q, k, v):
        return flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap)

    def std(q, k, v):
        return standard(q, k, v, causal, window, softcap)
    o, gr = grads(ours, (q, k, v), g)
    ro, rg = grads(std, (q.double(), k.double(), v.double()), g.double())
    so, sg = grads(std, (q, k, v), g)
    assert o.dtype == dtype and o.shape == q.shape
    assert all(x.dtype == dtype for x in gr) and [x.shape for x in gr] == [q.shape, k.shape, v.shape]
    assert err(o, ro) <= 2 * err(so, ro) + floor
    for name, a, r, s in zip("qkv", gr, rg, sg):
        assert err(a, r) <= 2 * err(s, r) + floor * max(1.0, r.abs().max().item()), name


@pytest.mark.parametrize("case", CASES)
def test_float32(case):
    check_against_reference(case, torch.float32, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit(dtype):
    check_against_reference((2, 40, 40, 8, 2, 64, True, (-1, -1), 0.0), dtype, 2 * torch.finfo(dtype).eps)


@pytest.mark.parametrize("case", [c for c in CASES if c[7] == (-1, -1) and not c[8]])
def test_sdpa(case):
    """Forward and gradients against torch's SDPA (float32, its math on the CPU, the
    bottom-right causal mask given explicitly), within twice SDPA's own error against float64."""
    b, sq, sk, hq, hk, d, causal, window, softcap = case
    gen = torch.Generator().manual_seed(SEED + 7)
    q, k, v, g = rand(gen, b, sq, hq, d), rand(gen, b, sk, hk, d), rand(gen, b, sk, hk, d), rand(gen, b, sq, hq, d)
    mask = visible(sq, sk, causal, window)

    def sdpa(q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, enable_gqa=True)
        return o.transpose(1, 2)
    o, gr = grads(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal), (q, k, v), g)
    so, sg = grads(sdpa, (q, k, v), g)
    ro, rg = grads(sdpa, (q.double(), k.double(), v.double()), g.double())
    assert err(o, so) <= 2 * err(so, ro) + 1e-5
    for a, s, r in zip(gr, sg, rg):
        assert err(a, s) <= 2 * err(s, r) + 1e-5 * max(1.0, r.abs().max().item())


def test_deterministic_and_lse():
    gen = torch.Generator().manual_seed(SEED + 8)
    q, k, v = rand(gen, 2, 50, 8, 32), rand(gen, 2, 70, 2, 32), rand(gen, 2, 70, 2, 32)
    g = rand(gen, 2, 50, 8, 32)
    runs = [grads(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True), (q, k, v), g) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    o, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert lse.shape == (2, 8, 50) and lse.dtype == torch.float32 and not lse.requires_grad
    kr = k.double().repeat_interleave(4, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kr) / 32 ** 0.5
    s = s.masked_fill(~visible(50, 70, True, (-1, -1)), float("-inf"))
    assert err(lse, torch.logsumexp(s, -1)) < 2e-5


def test_strided_views():
    """[b, h, s, d] tensors seen as [b, s, h, d]: read in place, gradients of the views right."""
    gen = torch.Generator().manual_seed(SEED + 9)
    qb, kb, vb = rand(gen, 2, 4, 21, 32), rand(gen, 2, 2, 30, 32), rand(gen, 2, 2, 30, 32)
    g = rand(gen, 2, 21, 4, 32)
    o, gr = grads(lambda q, k, v: flashattn.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2),
                                                            v.transpose(1, 2), causal=True), (qb, kb, vb), g)
    ro, rg = grads(lambda q, k, v: standard(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True),
                   (qb.double(), kb.double(), vb.double()), g.double())
    assert err(o, ro) < 2e-5 and all(err(a, r) < 1e-4 for a, r in zip(gr, rg))


def test_varlen():
    """Packed sequences (one of no query rows, rows past the last sequence) against each
    sequence's float64 reference; gradients of rows past the last sequence are zero."""
    gen = torch.Generator().manual_seed(SEED + 10)
    lens_q, lens_k = [3, 0, 11, 1], [7, 4, 11, 20]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    tq, tk = int(cu_q[-1]) + 2, int(cu_k[-1])
    q, k, v, g = rand(gen, tq, 4, 24), rand(gen, tk, 2, 24), rand(gen, tk, 2, 24), rand(gen, tq, 4, 24)

    def ours(q, k, v):
        return flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)

    def ref(q, k, v):
        parts = [standard(q[None, cu_q[i]:cu_q[i + 1]], k[None, cu_k[i]:cu_k[i + 1]], v[None, cu_k[i]:cu_k[i + 1]],
                          True)[0] for i in range(4)]
        return torch.cat(parts + [torch.zeros_like(q[cu_q[-1]:])])
    o, gr = grads(ours, (q, k, v), g)
    ro, rg = grads(ref, (q.double(), k.double(), v.double()), g.double())
    assert err(o, ro) < 2e-5 and all(err(a, r) < 1e-4 for a, r in zip(gr, rg))
    assert torch.all(gr[0][cu_q[-1]:] == 0) and torch.all(o[cu_q[-1]:] == 0)
    o2, lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_lse=True)
    assert lse.shape == (4, tq) and torch.all(torch.isneginf(lse[:, cu_q[-1]:]))


def test_edges():
    gen = torch.Generator().manual_seed(SEED + 11)
    q = rand(gen, 1, 6, 2, 8).requires_grad_()
    o, lse = flashattn.flash_attn_func(q, q[:, :0], q[:, :0], return_lse=True)  # no keys
    assert torch.all(o == 0) and torch.all(torch.isneginf(lse))
    o.sum().backward()
    assert torch.all(q.grad == 0)
    e = torch.zeros(0, 6, 2, 8, requires_grad=True)
    assert flashattn.flash_attn_func(e, e, e).shape == e.shape


def test_bad_input():
    gen = torch.Generator().manual_seed(SEED + 12)
    q, k = rand(gen, 1, 8, 4, 32), rand(gen, 1, 8, 4, 16)
    with pytest.raises(ValueError, match="head_dim"):
        flashattn.flash_attn_func(q, k, k)
    with pytest.raises(ValueError, match="contiguous"):
        flashattn.flash_attn_func(q[..., ::2], q[..., ::2], q[..., ::2])
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        qi = q.to(torch.int32)
        flashattn.flash_attn_func(qi, qi, qi)
    with pytest.raises(ValueError, match="num_heads"):
        k3 = rand(gen, 1, 8, 3, 32)
        flashattn.flash_attn_func(q, k3, k3)
    with pytest.raises(ValueError, match="window"):
        flashattn.flash_attn_func(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match="k must be a torch tensor"):
        flashattn.flash_attn_func(q, q.numpy(), q)
    with pytest.raises(ValueError, match="v must have 4 dimensions"):
        flashattn.flash_attn_func(q, q, q[0])
    with pytest.raises(ValueError, match="seed"):
        flashattn.flash_attn_func(q, q, q, seed=2 ** 64)
    with pytest.raises(ValueError, match="softmax_scale 0"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=0.0)
    with pytest.raises(ValueError, match="int32"):
        cu = torch.tensor([0, 8])
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        cu = torch.tensor([0, 8], dtype=torch.int32)
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 4, 8)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, "8")
    with pytest.raises(ValueError, match="k and v"):
        flashattn.flash_attn_with_kvcache(q, q, q, k=q)
    with pytest.raises(ValueError, match="cache_batch_idx"):
        flashattn.flash_attn_with_kvcache(q, q, q, cache_batch_idx=torch.tensor([0.5]))
    # flags are booleans ("False" would read as true)
    with pytest.raises(ValueError, match="causal must be True or False, not 'False'"):
        flashattn.flash_attn_func(q, q, q, causal="False")
    with pytest.raises(ValueError, match="return_lse must be True or False"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, return_lse="no")
    with pytest.raises(ValueError, match="rotary_interleaved must be True or False"):
        flashattn.flash_attn_with_kvcache(q, q, q, rotary_interleaved=None)
    # calls with nothing to compute check their tensors as calls with work do
    k64 = torch.zeros(2, 7, 3, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="k's dtype"):
        flashattn.flash_attn_func(torch.zeros(2, 0, 4, 8), k64, k64)
    with pytest.raises(ValueError, match=r"head_dim \(0\)"):
        flashattn.flash_attn_func(q[..., :0], q[..., :0], q[..., :0])
    with pytest.raises(ValueError, match="multiple of k's"):
        cu3 = torch.tensor([0, 3, 5], dtype=torch.int32)
        flashattn.flash_attn_varlen_func(torch.zeros(0, 4, 8), torch.zeros(5, 3, 8), torch.zeros(5, 3, 8), cu3, cu3,
                                         3, 3)
    # cache_batch_idx past int32 is refused, not wrapped onto another row; tables' dtypes by name
    kc, kn = torch.zeros(4, 4, 2, 8), torch.ones(2, 1, 2, 8)
    with pytest.raises(ValueError, match=r"cache_batch_idx\[1\] \(-1\) is not a page.*outside int32 read as -1"):
        flashattn.flash_attn_with_kvcache(torch.zeros(2, 1, 4, 8), kc, kc.clone(), kn, kn.clone(), cache_seqlens=1,
                                          cache_batch_idx=torch.tensor([0, 2 ** 32 + 3]))
    assert not kc.any()
    with pytest.raises(ValueError, match="cache_seqlens must be int32, not torch.int64"):
        flashattn.flash_attn_with_kvcache(torch.zeros(2, 1, 4, 8), kc, kc, cache_seqlens=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="pass 2\\^31 - 1 keys"):
        flashattn.flash_attn_with_kvcache(torch.zeros(2, 1, 4, 8), kc, kc,
                                          block_table=torch.zeros(2, 2 ** 30, dtype=torch.int32))
    # no query rows: empty outputs
    o0, l0 = flashattn.flash_attn_with_kvcache(torch.zeros(2, 0, 4, 8), kc, kc, cache_seqlens=1,
                                               return_softmax_lse=True)
    assert o0.shape == (2, 0, 4, 8) and l0.shape == (2, 4, 0)
    # an lse broadcast along every axis (all strides 0: "packed" to the library) is refused
    o, lse = flashattn.flash_attn_func(q, q, q, return_lse=True)
    with pytest.raises(ValueError, match=r"lse's dimension \d has stride 0"):
        torch.ops.flashattn.bwd(o, q, q, q, o, torch.zeros(()).expand(1, 4, 8), None, None, 0, 0, 0.0, False, -1, -1,
                                0.0, 0.0, 0)
    with pytest.raises(ValueError, match=r"lse's dimension \d has stride 0"):
        flashattn.merge_states(torch.zeros(2, 3, 4, 8), torch.zeros(()).expand(2, 4, 3))


def test_fp8():
    """torch.float8_e4m3fn inputs with descale factors [batch, num_heads_kv] (one expanded from a
    scalar): bfloat16 out against float64 of the exact fp8 values times their factors."""
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    gen = torch.Generator().manual_seed(SEED + 30)
    b, sq, sk, hq, hk, d = 2, 9, 40, 4, 2, 32
    q, k, v = (rand(gen, b, s, h, d).to(torch.float8_e4m3fn) for s, h in ((sq, hq), (sk, hk), (sk, hk)))
    qd = torch.rand(b, hk, generator=gen) + 0.5
    kd = torch.tensor(0.75).expand(b, hk)
    vd = torch.rand(b, hk, generator=gen) + 0.5
    out = flashattn.flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    wq = q.double() * qd.double().repeat_interleave(hq // hk, dim=1)[:, None, :, None]
    ref = standard(wq, k.double() * 0.75, v.double() * vd.double()[:, None, :, None], causal=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert err(out, ref) <= 2 ** -8 * ref.abs().max().item() + 1e-6
    with pytest.raises(ValueError, match="v_descale"):
        flashattn.flash_attn_func(q, k, v, v_descale=vd.double())


def test_seed_range():
    """A seed above 2^63 travels through the op's int64 and back."""
    gen = torch.Generator().manual_seed(SEED + 13)
    q = rand(gen, 1, 16, 2, 16)
    a = flashattn.flash_attn_func(q, q, q, dropout_p=0.3, seed=2 ** 64 - 5)
    b = flashattn.flash_attn_func(q, q, q, dropout_p=0.3, seed=2 ** 64 - 5)
    c = flashattn.flash_attn_func(q, q, q, dropout_p=0.3, seed=7)
    assert torch.equal(a, b) and not torch.equal(a, c)


def kvcache_args(gen):
    b, sq, hq, hk, d, page, pages_per = 2, 2, 4, 2, 16, 16, 3
    kc, vc = rand(gen, b * pages_per, page, hk, d), rand(gen, b * pages_per, page, hk, d)
    table = torch.randperm(b * pages_per, generator=gen).to(torch.int32).view(b, pages_per)
    lens = torch.tensor([5, 20], dtype=torch.int32)
    q, kn, vn = rand(gen, b, sq, hq, d), rand(gen, b, sq, hk, d), rand(gen, b, sq, hk, d)
    ang = torch.arange(64)[:, None] * 10000.0 ** (-torch.arange(d // 4) * 2.0 / (d // 2))
    return q, kc, vc, kn, vn, table, lens, ang.cos(), ang.sin()


def test_kvcache():
    """The torch path against the numpy one (itself tested against float64): the same output
    and lse, and the same cache written in place."""
    np = pytest.importorskip("numpy")
    q, kc, vc, kn, vn, table, lens, cos, sin = kvcache_args(torch.Generator().manual_seed(SEED + 14))
    kc_np, vc_np = kc.numpy().copy(), vc.numpy().copy()
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=lens, block_table=table, causal=True,
                                                 return_softmax_lse=True)
    want, wlse = flashattn.flash_attn_with_kvcache(q.numpy(), kc_np, vc_np, kn.numpy(), vn.numpy(), cos.numpy(),
                                                   sin.numpy(), lens.numpy(), block_table=table.numpy(),
                                                   causal=True, return_softmax_lse=True)
    assert np.array_equal(out.numpy(), want) and np.array_equal(lse.numpy(), wlse)
    assert np.array_equal(kc.numpy(), kc_np) and np.array_equal(vc.numpy(), vc_np)
    assert not np.array_equal(kc_np, kvcache_args(torch.Generator().manual_seed(SEED + 14))[1].numpy())
    kc2 = rand(torch.Generator().manual_seed(1), 2, 30, 2, 16)  # contiguous, rows chosen by cache_batch_idx
    o2 = flashattn.flash_attn_with_kvcache(q, kc2, kc2, cache_seqlens=9, cache_batch_idx=torch.tensor([1, 0]))
    ref = standard(q.double(), kc2[[1, 0], :9].double(), kc2[[1, 0], :9].double())
    assert err(o2, ref) < 2e-5


def test_opcheck():
    """torch.library.opcheck: schema (mutations declared), autograd registration, fake
    implementations and AOT dispatch with dynamic shapes, for every op."""
    gen = torch.Generator().manual_seed(SEED + 15)
    q, k, v = (rand(gen, 2, 9, 4, 16).requires_grad_(), rand(gen, 2, 12, 2, 16).requires_grad_(),
               rand(gen, 2, 12, 2, 16).requires_grad_())
    ops = torch.ops.flashattn
    torch.library.opcheck(ops.fwd.default, (q, k, v, 0.0, True, -1, -1, 0.0, 0.0, 0))
    torch.library.opcheck(ops.fwd.default, (q, k, v, 0.3, False, 3, 2, 10.0, 0.0, 0))
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32)
    qv, kv, vv = (x[0].detach().requires_grad_() for x in (q, k, v))
    torch.library.opcheck(ops.varlen_fwd.default, (qv, kv, vv, cu_q, cu_k, 5, 7, 0.0, True, -1, -1, 0.0, 0.0, 0))
    out, lse = ops.fwd(q, k, v, 0.0, True, -1, -1, 0.0, 0.0, 0)
    dout = torch.randn(out.shape, generator=gen)
    torch.library.opcheck(ops.bwd.default, (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, None, None,
                                            0, 0, 0.0, True, -1, -1, 0.0, 0.0, 0))
    qa, kc, vc, kn, vn, table, lens, cos, sin = kvcache_args(gen)
    cu = torch.arange(0, 5, 2, dtype=torch.int32)
    torch.library.opcheck(ops.kvcache.default, (qa.reshape(4, 4, 16), kc, vc, table, cu, lens, kn.reshape(4, 2, 16),
                                                vn.reshape(4, 2, 16), cos, sin, 2, 2, 0.0, True, -1, -1, 0.0))
    torch.library.opcheck(ops.kvcache.default, (qa.reshape(4, 4, 16), kc, vc, table, cu, lens, None, None, None,
                                                None, 0, 2, 0.0, False, -1, -1, 0.0))


class Attention(torch.nn.Module):
    """A small attention block: projections, RMS-normalised queries, causal GQA attention."""

    def __init__(self, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.hd)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], -1)
        q = F.rms_norm(q.view(b, s, self.heads, self.hd), (self.hd,))
        o = flashattn.flash_attn_func(q, k.view(b, s, self.kv_heads, self.hd), v.view(b, s, self.kv_heads, self.hd),
                                      causal=True)
        return self.out(o.reshape(b, s, -1))


def test_compile():
    """torch.compile(fullgraph=True) (a graph break raises) of the block: forward and
    gradients equal eager's."""
    torch.manual_seed(SEED + 16)
    m = Attention()
    x = torch.randn(2, 33, 64)
    want = m(x)
    want.square().sum().backward()
    want_g = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    explained = torch._dynamo.explain(m)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    cm = torch.compile(m, fullgraph=True)
    got = cm(x)
    got.square().sum().backward()
    assert err(got, want) < 1e-5
    assert all(err(p.grad, g) < 1e-4 for p, g in zip(m.parameters(), want_g))


def test_compile_kvcache():
    """A decode step compiled with fullgraph=True writes the cache in place as eager does."""
    gen = torch.Generator().manual_seed(SEED + 17)
    q, kc, vc, kn, vn, table, lens, cos, sin = kvcache_args(gen)

    def step(q, kc, vc, kn, vn, lens):
        return flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=lens, block_table=table, causal=True)
    kc_e, vc_e = kc.clone(), vc.clone()
    want = step(q, kc_e, vc_e, kn, vn, lens)
    got = torch.compile(step, fullgraph=True)(q, kc, vc, kn, vn, lens)
    assert torch.equal(got, want) and torch.equal(kc, kc_e) and torch.equal(vc, vc_e)


def test_plan_torch():
    """PagedPlan on torch tensors: the same bits as flash_attn_with_kvcache for a decode step."""
    q, kc, vc, kn, vn, table, lens, cos, sin = kvcache_args(torch.Generator().manual_seed(SEED + 18))
    kc2, vc2 = kc.clone(), vc.clone()
    want = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                             block_table=table, causal=True)
    with flashattn.PagedPlan(batch=2, total_q=4, max_seqlen_q=2, max_seqlen_k=48, num_heads_q=4, num_heads_kv=2,
                             head_dim=16, page_size=16, dtype=torch.float32, device=torch.device("cpu"),
                             rotary="interleaved", rotary_dim=8, causal=True) as plan:
        got = plan.run(q.reshape(4, 4, 16), kc2, vc2, table, lens, torch.arange(0, 5, 2, dtype=torch.int32),
                       kn.reshape(4, 2, 16), vn.reshape(4, 2, 16), cos, sin)
        assert torch.equal(got.view(2, 2, 4, 16), want) and torch.equal(kc2, kc)
        with pytest.raises(ValueError, match="exceeds the plan's bound"):
            plan.run(torch.zeros(5, 4, 16), kc2, vc2, table, lens, torch.tensor([0, 2, 4], dtype=torch.int32),
                     torch.zeros(5, 2, 16), torch.zeros(5, 2, 16), cos, sin)
        with pytest.raises(ValueError, match=r"rope_dim \(4\) differs from the plan's \(8\)"):
            plan.run(q.reshape(4, 4, 16), kc2, vc2, table, lens, torch.arange(0, 5, 2, dtype=torch.int32),
                     kn.reshape(4, 2, 16), vn.reshape(4, 2, 16), cos[:, :2].contiguous(), sin[:, :2].contiguous())
        with pytest.raises(ValueError, match="k_cache must be a torch tensor like q, not ndarray"):
            plan.run(q.reshape(4, 4, 16), kc2.numpy(), vc2, table, lens, torch.arange(0, 5, 2, dtype=torch.int32),
                     kn.reshape(4, 2, 16), vn.reshape(4, 2, 16), cos, sin)


def test_merge_states():
    """Two halves of the keys, merged, equal attention over all of them (outputs that carry
    autograd history taken as they are)."""
    gen = torch.Generator().manual_seed(SEED + 19)
    q, k, v = rand(gen, 1, 7, 4, 32).requires_grad_(), rand(gen, 1, 50, 4, 32), rand(gen, 1, 50, 4, 32)
    oa, la = flashattn.flash_attn_func(q, k[:, :20], v[:, :20], return_lse=True)
    ob, lb = flashattn.flash_attn_func(q, k[:, 20:], v[:, 20:], return_lse=True)
    o, lse = flashattn.merge_states(torch.stack([oa[0], ob[0]]), torch.stack([la[0], lb[0]]))
    whole, wl = flashattn.flash_attn_func(q, k, v, return_lse=True)
    assert err(o, whole[0]) < 2e-5 and err(lse, wl[0]) < 2e-5
    with pytest.raises(ValueError, match="lse"):
        flashattn.merge_states(torch.stack([oa[0], ob[0]]), torch.stack([la[0], lb[0]]).numpy())
    # a NaN or +inf lse (tensors are not inspected on the host): NaN in that row, the rest as before
    lse_in = torch.stack([la[0], lb[0]]).detach().clone()
    lse_in[1, 2, 3], lse_in[0, 1, 5] = float("nan"), float("inf")
    o2, lse2 = flashattn.merge_states(torch.stack([oa[0], ob[0]]), lse_in)
    assert torch.isnan(lse2[2, 3]) and torch.isnan(o2[3, 2]).all() and torch.isnan(lse2[1, 5])
    keep = ~torch.isnan(lse2)
    assert torch.equal(lse2[keep], lse[keep]) and not torch.isnan(o2[0]).any()


def test_import_order():
    """flashattn imported before torch, and the first call compiled: the ops register on the
    first torch tensor, inside the trace, with no graph break."""
    import subprocess
    import sys
    code = ("import flashattn, torch\n"
            "f = torch.compile(lambda q: flashattn.flash_attn_func(q, q, q, causal=True), fullgraph=True, "
            "backend='eager')\n"
            "q = torch.ones(1, 4, 2, 8)\n"
            "assert torch.equal(f(q), torch.ones(1, 4, 2, 8))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
