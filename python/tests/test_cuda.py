# SPDX-License-Identifier: MIT
"""flashattn from torch on a CUDA device: forward and gradients (dense, varlen) and the KV
cache (pages of 16, GQA, appended rows with RoPE) in bfloat16 and float16 against float64
and against torch's SDPA, bitwise-deterministic gradients, torch's current stream (a side
stream's order kept, a busy default stream not waited for), torch.compile(fullgraph=True) of
an attention block and of a decode step, a decode loop captured in a CUDA graph and
replayed against eager, and bad input refused with the library's message. Skipped without
torch, a CUDA device and the CUDA backend; a CUDA build is also checked to import and run
on the CPU with no device visible (one wheel for machines with and without a GPU)."""
import os
import subprocess
import sys

import pytest

import flashattn

try:
    import torch
except ImportError:
    torch = None

HAVE_CUDA = (torch is not None and hasattr(torch.library, "custom_op") and torch.cuda.is_available() and
             "cuda" in flashattn.backends())
cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs torch >= 2.4, a CUDA device and the CUDA backend")
if HAVE_CUDA:
    import flashattn.torch_ops  # noqa: F401  (registers torch.ops.flashattn)
    F = torch.nn.functional

SEED = int(os.environ.get("FLASHATTN_TEST_SEED", "20261202"))
print(f"flashattn cuda tests: seed {SEED} (replay: FLASHATTN_TEST_SEED={SEED})")
DEV = "cuda"
SLEEP_CYCLES = 400_000_000  # torch.cuda._sleep: 0.2 s at 2 GHz, more at idle clocks


def gen(offset):
    return torch.Generator(device=DEV).manual_seed(SEED + offset)


def rand(g, *shape, dtype=None):
    return torch.randn(*shape, generator=g, device=DEV, dtype=torch.float32).to(dtype or torch.bfloat16)


def eps(dtype):
    return torch.finfo(dtype).eps


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def visible(sq, sk, causal, window):
    """[sq, sk] keys each query row sees, bottom-right aligned, on the device."""
    i = torch.arange(sq, device=DEV)[:, None] + (sk - sq)
    j = torch.arange(sk, device=DEV)[None, :]
    wl, wr = window
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=DEV)
    if wl >= 0:
        vis &= j >= i - wl
    if wr >= 0:
        vis &= j <= i + wr
    return vis


def standard(q, k, v, causal=False, window=(-1, -1), softcap=0.0):
    """Unfused attention in q's dtype (float64 for the reference), differentiable: [b, s, h, d]
    inputs, GQA by h // group."""
    hq, hk = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(hq // hk, dim=2), v.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible(q.shape[1], k.shape[1], causal, window), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v)


def sdpa(q, k, v, causal=False, window=(-1, -1)):
    """torch's SDPA on [b, s, h, d] tensors, the bottom-right mask given explicitly."""
    square = q.shape[1] == k.shape[1] and window == (-1, -1)
    mask = None if square or not (causal or window != (-1, -1)) else visible(q.shape[1], k.shape[1], causal, window)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                       is_causal=causal and square, enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def grads(fn, inputs, g):
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    o = fn(*xs)
    o.backward(g.to(o.dtype))
    return o.detach(), [x.grad for x in xs]


def within(ours, base, ref, dtype, what):
    """ours against float64 within twice the baseline's (SDPA's or unfused attention's) error
    in the same precision, plus a floor of 2 eps scaled by the reference's magnitude."""
    floor = 2 * eps(dtype) * max(1.0, ref.abs().max().item())
    assert err(ours, ref) <= 2 * err(base, ref) + floor, f"{what}: {err(ours, ref):.3g} vs {err(base, ref):.3g}"


CASES = [  # b, sq, sk, hq, hk, d, causal, window
    (2, 128, 128, 8, 8, 64, True, (-1, -1)),
    (1, 77, 300, 8, 2, 128, True, (-1, -1)),
    (2, 200, 200, 4, 1, 80, False, (32, 8)),
    (1, 1, 513, 16, 4, 128, False, (-1, -1)),
    (1, 64, 190, 4, 2, 256, True, (-1, -1)),
    (3, 33, 17, 6, 3, 40, False, (-1, -1)),
]
DTYPES = [torch.bfloat16, torch.float16] if torch is not None else []


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_dense(case, dtype):
    """out, dq, dk and dv of flash_attn_func against float64, within twice SDPA's error."""
    b, sq, sk, hq, hk, d, causal, window = case
    g = gen(sum(case[:6]))
    q, k, v = rand(g, b, sq, hq, d, dtype=dtype), rand(g, b, sk, hk, d, dtype=dtype), rand(g, b, sk, hk, d,
                                                                                          dtype=dtype)
    do = rand(g, b, sq, hq, d, dtype=dtype)
    o, gr = grads(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window), (q, k, v), do)
    so, sg = grads(lambda q, k, v: sdpa(q, k, v, causal, window), (q, k, v), do)
    ro, rg = grads(lambda q, k, v: standard(q, k, v, causal, window), (q.double(), k.double(), v.double()),
                   do.double())
    assert o.device == q.device and o.dtype == dtype and o.shape == q.shape
    assert [x.dtype for x in gr] == [dtype] * 3 and [x.shape for x in gr] == [q.shape, k.shape, v.shape]
    within(o, so, ro, dtype, "out")
    for name, a, s, r in zip(("dq", "dk", "dv"), gr, sg, rg):
        within(a, s, r, dtype, name)


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softcap_and_lse(dtype):
    """softcap (which SDPA lacks) against unfused attention in the same precision, and lse
    against float64."""
    g = gen(30)
    q, k, v, do = rand(g, 2, 96, 8, 64, dtype=dtype), rand(g, 2, 96, 2, 64, dtype=dtype), \
        rand(g, 2, 96, 2, 64, dtype=dtype), rand(g, 2, 96, 8, 64, dtype=dtype)
    o, gr = grads(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, softcap=20.0), (q, k, v), do)
    so, sg = grads(lambda q, k, v: standard(q, k, v, True, softcap=20.0), (q, k, v), do)
    ro, rg = grads(lambda q, k, v: standard(q, k, v, True, softcap=20.0), (q.double(), k.double(), v.double()),
                   do.double())
    within(o, so, ro, dtype, "out")
    for name, a, s, r in zip(("dq", "dk", "dv"), gr, sg, rg):
        within(a, s, r, dtype, name)
    _, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(4, dim=2)) / 8.0
    s = s.masked_fill(~visible(96, 96, True, (-1, -1)), float("-inf"))
    assert lse.shape == (2, 8, 96) and lse.dtype == torch.float32 and lse.device == q.device
    assert err(lse, torch.logsumexp(s, -1)) < 1e-3


@cuda
def test_float32_refused():
    """float32 inputs: the CUDA backend's own message (its kernels take f16, bf16 and fp8)."""
    q = torch.ones(1, 8, 2, 64, device=DEV)
    with pytest.raises(ValueError, match="f16, bf16 or fp8 inputs"):
        flashattn.flash_attn_func(q, q, q)


@cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_varlen(dtype):
    """Packed sequences (one with no query rows, two rows past the last sequence) against each
    sequence's float64 reference, within twice SDPA's error; rows past the end get zeros."""
    g = gen(31)
    lens_q, lens_k = [3, 0, 111, 1], [7, 4, 111, 200]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)  # on the CPU
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    tq, tk = int(cu_q[-1]) + 2, int(cu_k[-1])
    q, k, v = rand(g, tq, 8, 128, dtype=dtype), rand(g, tk, 2, 128, dtype=dtype), rand(g, tk, 2, 128, dtype=dtype)
    do = rand(g, tq, 8, 128, dtype=dtype)

    def per_sequence(attend):
        def run(q, k, v):
            parts = [attend(q[None, cu_q[i]:cu_q[i + 1]], k[None, cu_k[i]:cu_k[i + 1]], v[None, cu_k[i]:cu_k[i + 1]])[0]
                     for i in range(4) if lens_q[i]]
            return torch.cat(parts + [torch.zeros_like(q[cu_q[-1]:])])
        return run
    o, gr = grads(lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                                   causal=True), (q, k, v), do)
    so, sg = grads(per_sequence(lambda q, k, v: sdpa(q, k, v, True)), (q, k, v), do)
    ro, rg = grads(per_sequence(lambda q, k, v: standard(q, k, v, True)), (q.double(), k.double(), v.double()),
                   do.double())
    within(o, so, ro, dtype, "out")
    for name, a, s, r in zip(("dq", "dk", "dv"), gr, sg, rg):
        within(a, s, r, dtype, name)
    assert torch.all(o[cu_q[-1]:] == 0) and torch.all(gr[0][cu_q[-1]:] == 0)
    assert torch.all(gr[1][cu_k[1]:cu_k[2]] == 0)  # keys of the sequence with no query rows
    with pytest.raises(ValueError, match="CPU tensor"):
        flashattn.flash_attn_varlen_func(q, k, v, cu_q.to(DEV), cu_k, max(lens_q), max(lens_k))


@cuda
def test_deterministic():
    """Two backward passes over the same inputs give the same bits (GQA, several key tiles)."""
    g = gen(32)
    q, k, v, do = rand(g, 2, 300, 16, 128), rand(g, 2, 700, 4, 128), rand(g, 2, 700, 4, 128), rand(g, 2, 300, 16, 128)
    runs = [grads(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True), (q, k, v), do) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def rope(x, pos, cos, sin, interleaved):
    """x [n, h, d] rotated at positions pos [n] with tables [max_pos, rd / 2], in float64."""
    x = x.double().clone()
    rd = 2 * cos.shape[1]
    c, s = cos[pos][:, None, :].double(), sin[pos][:, None, :].double()
    lo, hi = (slice(0, rd, 2), slice(1, rd, 2)) if interleaved else (slice(0, rd // 2), slice(rd // 2, rd))
    a, b = x[..., lo].clone(), x[..., hi].clone()
    x[..., lo], x[..., hi] = a * c - b * s, a * s + b * c
    return x


def rope_tables(max_pos, rotary_dim):
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * \
        10000.0 ** (-torch.arange(rotary_dim // 2, dtype=torch.float64) * 2.0 / rotary_dim)
    return ang.cos().float().to(DEV), ang.sin().float().to(DEV)


def paged_cache(g, b, pages_per, hk, d, dtype):
    """A pool of b * pages_per pages of 16 tokens and a shuffled block table."""
    kc, vc = rand(g, b * pages_per, 16, hk, d, dtype=dtype), rand(g, b * pages_per, 16, hk, d, dtype=dtype)
    table = torch.randperm(b * pages_per, generator=g, device=DEV).to(torch.int32).view(b, pages_per)
    return kc, vc, table


def gather(cache, table, b, n):
    """Sequence b's first n tokens of a paged cache: [n, heads, dim]."""
    j = torch.arange(n, device=DEV)
    return cache[table[b, j // 16].long(), j % 16]


@cuda
@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kvcache_paged(dtype, interleaved, sq):
    """Pages of 16 in a shuffled table, GQA 8/2, sq new rows a sequence appended with RoPE
    over half the head (one sequence past the 1024 keys of a split): the cache holds the
    rotated keys and the values afterwards and nothing else changed; out and lse against
    float64 over the rotated keys, within twice SDPA's error."""
    g = gen(33 + sq + 2 * interleaved)
    b, hq, hk, d, pages_per = 3, 8, 2, 128, 80
    lens = [5, 16, 1100]
    kc, vc, table = paged_cache(g, b, pages_per, hk, d, dtype)
    kc0, vc0 = kc.clone(), vc.clone()
    q, kn, vn = rand(g, b, sq, hq, d, dtype=dtype), rand(g, b, sq, hk, d, dtype=dtype), rand(g, b, sq, hk, d,
                                                                                          dtype=dtype)
    cos, sin = rope_tables(2048, d // 2)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=lens_t, block_table=table, causal=True,
                                                 rotary_interleaved=interleaved, return_softmax_lse=True)
    assert out.shape == q.shape and out.device == q.device and lse.shape == (b, hq, sq)
    touched = torch.zeros(kc.shape[:2], dtype=torch.bool, device=DEV)
    for s in range(b):
        pos = lens[s] + torch.arange(sq, device=DEV)
        krot = rope(kn[s], pos, cos, sin, interleaved)
        qrot = rope(q[s], pos, cos, sin, interleaved)
        pages, slots = table[s, pos // 16].long(), pos % 16
        touched[pages, slots] = True
        assert err(kc[pages, slots], krot) <= eps(dtype) * max(1.0, krot.abs().max().item())
        assert torch.equal(vc[pages, slots], vn[s])
        old_k, old_v = gather(kc0, table, s, lens[s]), gather(vc0, table, s, lens[s])
        keys, vals = torch.cat([old_k.double(), krot]), torch.cat([old_v.double(), vn[s].double()])
        ro = standard(qrot[None], keys[None], vals[None], causal=True)[0]
        so = sdpa(qrot.to(dtype)[None], keys.to(dtype)[None], vals.to(dtype)[None], causal=True)[0]
        within(out[s], so, ro, dtype, f"out of sequence {s}")
        sc = torch.einsum("qhd,khd->hqk", qrot, keys.repeat_interleave(hq // hk, dim=1)) / d ** 0.5
        bound = 4 * eps(dtype) * max(1.0, sc.abs().max().item())
        sc = sc.masked_fill(~visible(sq, lens[s] + sq, True, (-1, -1)), float("-inf"))
        assert err(lse[s], torch.logsumexp(sc, -1)) < bound
    assert torch.equal(kc[~touched], kc0[~touched]) and torch.equal(vc[~touched], vc0[~touched])


@cuda
def test_kvcache_contiguous():
    """A contiguous cache with rows chosen by cache_batch_idx (a device tensor) and lengths as
    a device tensor, against SDPA's error."""
    g = gen(40)
    kc, vc = rand(g, 3, 300, 2, 64), rand(g, 3, 300, 2, 64)
    q = rand(g, 2, 1, 8, 64)
    rows = torch.tensor([2, 0], device=DEV)
    lens = torch.tensor([300, 41], dtype=torch.int32, device=DEV)
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_batch_idx=rows)
    for s, (r, n) in enumerate([(2, 300), (0, 41)]):
        ro = standard(q[s:s + 1].double(), kc[None, r, :n].double(), vc[None, r, :n].double())
        so = sdpa(q[s:s + 1], kc[None, r, :n], vc[None, r, :n])
        within(out[s:s + 1], so, ro, torch.bfloat16, f"sequence {s}")


@cuda
def test_plan():
    """PagedPlan on the device: the CUDA decode kernel, and the same bits as
    flash_attn_with_kvcache for a decode step (split boundaries depend on each sequence's
    length alone)."""
    g = gen(41)
    b, hq, hk, d = 4, 8, 2, 128
    kc, vc, table = paged_cache(g, b, 80, hk, d, torch.bfloat16)
    kc2, vc2 = kc.clone(), vc.clone()
    q, kn, vn = rand(g, b, 1, hq, d), rand(g, b, 1, hk, d), rand(g, b, 1, hk, d)
    lens = torch.tensor([0, 17, 1023, 1200], dtype=torch.int32, device=DEV)
    cos, sin = rope_tables(2048, d)
    want = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                             block_table=table, causal=True, rotary_interleaved=False)
    with flashattn.PagedPlan(batch=b, total_q=b, max_seqlen_q=1, max_seqlen_k=80 * 16, num_heads_q=hq,
                             num_heads_kv=hk, head_dim=d, page_size=16, dtype=torch.bfloat16,
                             device=torch.device(DEV), rotary="neox", causal=True) as plan:
        info = plan.info()
        assert info["backend"] == "cuda" and info["kernel"].startswith("paged-decode"), info
        cu = torch.arange(b + 1, dtype=torch.int32, device=DEV)
        got = plan.run(q.view(b, hq, d), kc2, vc2, table, lens, cu, kn.view(b, hk, d), vn.view(b, hk, d), cos, sin)
        assert torch.equal(got.view(b, 1, hq, d), want) and torch.equal(kc2, kc) and torch.equal(vc2, vc)


@cuda
def test_current_stream():
    """Every call queues on torch's current stream: on a side stream whose inputs are written
    after a sleep, the forward, its backward, the KV cache call and a plan's run read those
    inputs (work queued elsewhere would read the zeros before them); and a call made on the
    side stream while the default stream sleeps finishes before the default stream does."""
    g = gen(42)
    q, k, v, do = rand(g, 1, 256, 8, 128), rand(g, 1, 256, 2, 128), rand(g, 1, 256, 2, 128), rand(g, 1, 256, 8, 128)
    kc, vc, table = paged_cache(g, 2, 8, 2, 128, torch.bfloat16)
    lens = torch.tensor([3, 100], dtype=torch.int32, device=DEV)
    qd, kd, vd = rand(g, 2, 1, 8, 128), rand(g, 2, 1, 2, 128), rand(g, 2, 1, 2, 128)

    def attention(q, k, v):
        return flashattn.flash_attn_func(q, k, v, causal=True)
    plan = flashattn.PagedPlan(batch=2, total_q=2, max_seqlen_q=1, max_seqlen_k=128, num_heads_q=8, num_heads_kv=2,
                               head_dim=128, page_size=16, dtype=torch.bfloat16, device=DEV, append=False)
    cu = torch.arange(3, dtype=torch.int32, device=DEV)
    want_o, want_g = grads(attention, (q, k, v), do)
    kc_w, vc_w = kc.clone(), vc.clone()
    want_kv = flashattn.flash_attn_with_kvcache(qd, kc_w, vc_w, kd, vd, cache_seqlens=lens, block_table=table)
    want_plan = plan.run(qd.view(2, 8, 128), kc_w, vc_w, table, lens + 1, cu)  # over the appended rows too

    side = torch.cuda.Stream()
    later = [torch.zeros_like(x) for x in (q, k, v, qd, kd, vd)]
    kc_s, vc_s = kc.clone(), vc.clone()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        for dst, src in zip(later, (q, k, v, qd, kd, vd)):
            dst.copy_(src)
        o, gr = grads(attention, later[:3], do)
        out_kv = flashattn.flash_attn_with_kvcache(later[3], kc_s, vc_s, later[4], later[5], cache_seqlens=lens,
                                                   block_table=table)
        out_plan = plan.run(later[3].view(2, 8, 128), kc_s, vc_s, table, lens + 1, cu)
    torch.cuda.synchronize()
    assert torch.equal(o, want_o) and all(torch.equal(a, b) for a, b in zip(gr, want_g))
    assert torch.equal(out_kv, want_kv) and torch.equal(out_plan, want_plan)
    assert torch.equal(kc_s, kc_w) and torch.equal(vc_s, vc_w)

    torch.cuda._sleep(SLEEP_CYCLES)  # the default stream, busy
    with torch.cuda.stream(side):
        o2 = attention(q, k, v)
        out_plan2 = plan.run(qd.view(2, 8, 128), kc_s, vc_s, table, lens + 1, cu)
        done = side.record_event()
    done.synchronize()
    assert not torch.cuda.default_stream().query(), "a call on a side stream waited for the default stream"
    torch.cuda.synchronize()
    assert torch.equal(o2, want_o) and torch.equal(out_plan2, want_plan)
    plan.close()


class Attention(torch.nn.Module if torch is not None else object):
    """A small attention block in float32 (projections, RMS-normalised queries) with bfloat16
    causal GQA attention."""

    def __init__(self, dim=256, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.hd)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], -1)
        q = F.rms_norm(q.view(b, s, self.heads, self.hd), (self.hd,))
        o = flashattn.flash_attn_func(q.bfloat16(), k.view(b, s, self.kv_heads, self.hd).bfloat16(),
                                      v.view(b, s, self.kv_heads, self.hd).bfloat16(), causal=True)
        return self.out(o.float().reshape(b, s, -1))


@cuda
def test_compile():
    """torch.compile(fullgraph=True) of the block on the device (inductor): no graph break,
    forward and parameter gradients as eager's (within bfloat16 rounding: inductor fuses the
    float32 parts differently)."""
    torch.manual_seed(SEED + 43)
    m = Attention().to(DEV)
    x = torch.randn(2, 100, 256, device=DEV)
    want = m(x)
    want.square().sum().backward()
    want_g = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    explained = torch._dynamo.explain(m)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    got = torch.compile(m, fullgraph=True)(x)
    got.square().sum().backward()
    assert err(got, want) <= 4 * eps(torch.bfloat16) * max(1.0, want.abs().max().item())
    for p, w in zip(m.parameters(), want_g):
        assert err(p.grad, w) <= 4 * eps(torch.bfloat16) * max(1.0, w.abs().max().item())


@cuda
def test_compile_kvcache():
    """A decode step compiled with fullgraph=True on the device writes the cache in place and
    returns the bits eager does."""
    g = gen(45)
    kc, vc, table = paged_cache(g, 2, 8, 2, 128, torch.bfloat16)
    q, kn, vn = rand(g, 2, 1, 8, 128), rand(g, 2, 1, 2, 128), rand(g, 2, 1, 2, 128)
    lens = torch.tensor([7, 64], dtype=torch.int32, device=DEV)
    cos, sin = rope_tables(256, 128)

    def step(q, kc, vc, kn, vn, lens):
        return flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=lens, block_table=table, causal=True)
    kc_e, vc_e = kc.clone(), vc.clone()
    want = step(q, kc_e, vc_e, kn, vn, lens)
    got = torch.compile(step, fullgraph=True)(q, kc, vc, kn, vn, lens)
    assert torch.equal(got, want) and torch.equal(kc, kc_e) and torch.equal(vc, vc_e)


@cuda
@pytest.mark.parametrize("path", ["kvcache", "plan"])
def test_graph_decode_loop(path):
    """One decode step over two layers (each appending its rotated keys into its own paged
    cache, then attending; the lengths advanced on the device) captured in a CUDA graph and
    replayed for six steps: every step's outputs and the caches equal an eager run's bits."""
    g = gen(44)
    layers, b, hq, hk, d, pages_per = 2, 4, 8, 2, 128, 80
    pools = [paged_cache(g, b, pages_per, hk, d, torch.bfloat16) for _ in range(layers)]
    table = pools[0][2]
    caches = [(kc, vc) for kc, vc, _ in pools]
    eager_caches = [(kc.clone(), vc.clone()) for kc, vc in caches]
    start = torch.tensor([3, 17, 500, 1020], dtype=torch.int32, device=DEV)
    lens, eager_lens = start.clone(), start.clone()
    cos, sin = rope_tables(2048, d)
    q = torch.zeros(layers, b, 1, hq, d, dtype=torch.bfloat16, device=DEV)  # the graph's inputs
    kn, vn = (torch.zeros(layers, b, 1, hk, d, dtype=torch.bfloat16, device=DEV) for _ in range(2))
    cu = torch.arange(b + 1, dtype=torch.int32, device=DEV)
    plan = flashattn.PagedPlan(batch=b, total_q=b, max_seqlen_q=1, max_seqlen_k=pages_per * 16, num_heads_q=hq,
                               num_heads_kv=hk, head_dim=d, page_size=16, dtype=torch.bfloat16, device=DEV,
                               rotary="neox", causal=True)

    def step(caches, lens):
        outs = []
        for layer, (kc, vc) in enumerate(caches):
            if path == "kvcache":
                o = flashattn.flash_attn_with_kvcache(q[layer], kc, vc, kn[layer], vn[layer], rotary_cos=cos,
                                                      rotary_sin=sin, cache_seqlens=lens, block_table=table,
                                                      causal=True, rotary_interleaved=False)
            else:
                o = plan.run(q[layer].view(b, hq, d), kc, vc, table, lens, cu, kn[layer].view(b, hk, d),
                             vn[layer].view(b, hk, d), cos, sin).view(b, 1, hq, d)
            outs.append(o)
        lens.add_(1)
        return torch.stack(outs)

    scratch = [(kc.clone(), vc.clone()) for kc, vc in caches]
    side = torch.cuda.Stream()  # warm-up on a side stream, as torch's graph capture asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(scratch, start.clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step(caches, lens)
    assert torch.equal(lens, start)  # capture queues nothing
    for t in range(6):
        for x in (q, kn, vn):
            x.copy_(torch.randn(x.shape, generator=g, device=DEV))
        graph.replay()
        want = step(eager_caches, eager_lens)
        assert static_out.abs().sum() > 0 and torch.equal(static_out, want), f"step {t}"
    torch.cuda.synchronize()
    assert torch.equal(lens, start + 6) and torch.equal(lens, eager_lens)
    for (kc, vc), (ke, ve) in zip(caches, eager_caches):
        assert torch.equal(kc, ke) and torch.equal(vc, ve)
    del graph
    plan.close()


@cuda
def test_bad_input():
    """Tensors on the wrong device and settings the CUDA backend lacks: ValueError with the
    message of the binding or of the library."""
    q = torch.ones(1, 8, 4, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="k is on another device than q"):
        flashattn.flash_attn_func(q, q.cpu(), q.cpu())
    kc = torch.zeros(4, 16, 4, 64, dtype=torch.bfloat16)
    table = torch.arange(4, dtype=torch.int32).view(1, 4)
    with pytest.raises(ValueError, match="k_cache is on another device than q"):
        flashattn.flash_attn_with_kvcache(q, kc, kc, block_table=table.to(DEV), cache_seqlens=3)
    with pytest.raises(ValueError, match="block_table is on another device than q"):
        flashattn.flash_attn_with_kvcache(q, kc.to(DEV), kc.to(DEV), block_table=table, cache_seqlens=3)
    with pytest.raises(ValueError, match="cache_seqlens is on another device than q"):
        flashattn.flash_attn_with_kvcache(q, kc.to(DEV), kc.to(DEV), block_table=table.to(DEV),
                                          cache_seqlens=torch.tensor([3], dtype=torch.int32))
    with pytest.raises(ValueError, match="rotary tables is on another device than q"):
        cos = torch.ones(64, 16)
        flashattn.flash_attn_with_kvcache(q, kc.to(DEV), kc.to(DEV), q[:, :, :4], q[:, :, :4], rotary_cos=cos,
                                          rotary_sin=cos, block_table=table.to(DEV), cache_seqlens=3)
    with pytest.raises(ValueError, match="f16 or bf16"):
        kf = kc.float().to(DEV)
        flashattn.flash_attn_with_kvcache(q.float(), kf, kf, block_table=table.to(DEV), cache_seqlens=3)
    with pytest.raises(ValueError, match="f16 or bf16"):
        flashattn.PagedPlan(batch=1, total_q=1, max_seqlen_q=1, max_seqlen_k=64, num_heads_q=4, num_heads_kv=4,
                            head_dim=64, page_size=16, dtype="float32", device=DEV)
    with pytest.raises(ValueError, match="head_dim"):
        big = torch.ones(1, 8, 2, 512, dtype=torch.bfloat16, device=DEV)
        flashattn.flash_attn_func(big, big, big)
    with pytest.raises(ValueError, match="device 0"):
        flashattn.PagedPlan(batch=1, total_q=1, max_seqlen_q=1, max_seqlen_k=64, num_heads_q=4, num_heads_kv=4,
                            head_dim=64, page_size=16, dtype="bfloat16", device="cuda:1")
    with flashattn.PagedPlan(batch=1, total_q=8, max_seqlen_q=8, max_seqlen_k=64, num_heads_q=4, num_heads_kv=4,
                             head_dim=64, page_size=16, dtype="bfloat16", device=DEV, append=False) as plan:
        with pytest.raises(ValueError, match="another device than the plan's"):
            plan.run(q[0].cpu(), kc, kc, table, torch.tensor([3], dtype=torch.int32),
                     torch.tensor([0, 8], dtype=torch.int32))
    o, lse = flashattn.flash_attn_func(q, q, q, return_lse=True)
    with pytest.raises(ValueError, match="lse is on another device"):
        flashattn.merge_states(torch.stack([o[0], o[0]]), torch.stack([lse[0], lse[0]]).cpu())
    bad = torch.stack([lse[0], lse[0]])
    bad[1, 0, 0] = float("nan")
    mo, ml = flashattn.merge_states(torch.stack([o[0], o[0]]), bad)
    assert torch.isnan(ml[0, 0]) and torch.isnan(mo[0, 0].float()).all() and not torch.isnan(ml[0, 1:]).any()


@cuda
def test_info():
    """flashattn.info names the device torch sees."""
    text = flashattn.info(torch.device(DEV))
    assert text.startswith("backend: cuda\n") and torch.cuda.get_device_name(0) in text, text
    print(text)


@pytest.mark.skipif("cuda" not in flashattn.backends(), reason="the CUDA backend is not built")
def test_cuda_build_without_a_device():
    """A build with the CUDA backend links no CUDA library (the runtime is static, the driver
    looked up when a CUDA context is made), so with no device visible it imports, runs on the
    CPU, and says why it cannot make a CUDA context."""
    pytest.importorskip("numpy")
    code = ("import numpy as np, flashattn\n"
            "q = np.ones((1, 4, 2, 8), np.float32)\n"
            "assert (flashattn.flash_attn_func(q, q, q) == 1).all()\n"
            "try:\n"
            "    flashattn.info('cuda')\n"
            "except RuntimeError as e:\n"
            "    assert 'no usable CUDA device' in str(e), e\n"
            "else:\n"
            "    raise AssertionError('a CUDA context with no device visible')\n")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    ldd = subprocess.run(["ldd", flashattn._C.__file__], capture_output=True, text=True)
    if ldd.returncode == 0:
        assert "libcudart" not in ldd.stdout and "libcuda." not in ldd.stdout, ldd.stdout
