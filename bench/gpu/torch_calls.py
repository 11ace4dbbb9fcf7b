# SPDX-License-Identifier: MIT
"""flashattn's Python package on a CUDA device through torch: what a call costs on the host
(small problems, the kernels' own time negligible) eager and replayed in a CUDA graph, and
forward / forward+backward throughput of flash_attn_func beside torch's SDPA, one process,
the same tensors. Needs the package installed with the CUDA backend.

Overhead rows: wall time of --calls calls queued back to back and one synchronisation, per
call, median of --reps runs (a GPU that keeps up shows the host's cost). Throughput rows:
median of CUDA-event timings after warm-up; TFLOP/s with FlashAttention's count (forward
4*b*h*s*s*d, halved when causal; forward+backward 3.5x that).

  python3 bench/gpu/torch_calls.py [--calls 2000] [--reps 7]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import flashattn
import flashattn.torch_ops  # noqa: F401

DEV = "cuda"
SHAPES = [(4, 4096, 16, 16, 128), (2, 8192, 32, 8, 128), (16, 1024, 32, 32, 64)]  # b, s, hq, hk, d


def per_call_us(fn, calls, reps):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


def graph_us(fn, inner, reps):
    """Per call, replaying a CUDA graph of `inner` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    return per_call_us(g.replay, 20, reps) / inner


def median_ms(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def overhead(calls, reps):
    bf = torch.bfloat16
    q = torch.randn(1, 1, 1, 64, device=DEV, dtype=bf)
    out, lse = torch.empty_like(q), torch.empty(1, 1, 1, device=DEV)
    qg = q.clone().requires_grad_()
    dl = torch.utils.dlpack.to_dlpack
    qt = q.transpose(1, 2)
    rows = {
        "flashattn._C.forward (to_dlpack capsules, output given)":
            lambda: flashattn._C.forward(dl(q), dl(q), dl(q), dl(out), dl(lse), None, None, 0, 0, 0.0, False, -1,
                                         -1, 0.0, 0.0, 0, 0, torch.cuda.current_stream().cuda_stream, False),
        "flash_attn_func, no gradient recorded": lambda: flashattn.flash_attn_func(q, q, q),
        "flash_attn_func, input requiring grad (dispatcher, autograd)": lambda: flashattn.flash_attn_func(qg, qg, qg),
        "torch SDPA, same tensors (baseline)": lambda: F.scaled_dot_product_attention(qt, qt, qt),
    }
    # a decode step: 8 sequences of 1024 cached tokens, GQA 32/8, d 128, pages of 16, one row appended
    b, hq, hk, d, pages_per = 8, 32, 8, 128, 72
    kc = torch.randn(b * pages_per, 16, hk, d, device=DEV, dtype=bf)
    vc = torch.randn_like(kc)
    table = torch.randperm(b * pages_per, device=DEV).to(torch.int32).view(b, pages_per)
    lens = torch.full((b,), 1024, dtype=torch.int32, device=DEV)
    qd, kn, vn = (torch.randn(b, 1, h, d, device=DEV, dtype=bf) for h in (hq, hk, hk))
    cu = torch.arange(b + 1, dtype=torch.int32, device=DEV)
    plan = flashattn.PagedPlan(batch=b, total_q=b, max_seqlen_q=1, max_seqlen_k=pages_per * 16, num_heads_q=hq,
                               num_heads_kv=hk, head_dim=d, page_size=16, dtype=bf, device=DEV)

    def kvcache():
        return flashattn.flash_attn_with_kvcache(qd, kc, vc, kn, vn, cache_seqlens=lens, block_table=table)

    def plan_run():
        return plan.run(qd.view(b, hq, d), kc, vc, table, lens, cu, kn.view(b, hk, d), vn.view(b, hk, d))
    decode = {"flash_attn_with_kvcache decode step (b8, 1024 cached, GQA 32/8, d128)": kvcache,
              "PagedPlan.run, the same step": plan_run}
    print("| call | µs a call, eager | µs a call, CUDA graph of 20 |")
    print("|---|---|---|")
    for name, fn in rows.items():
        print(f"| {name} | {per_call_us(fn, calls, reps):.1f} | — |")
    for name, fn in decode.items():
        print(f"| {name} | {per_call_us(fn, calls, reps):.1f} | {graph_us(fn, 20, reps):.1f} |")
    plan.close()


def throughput():
    print("\n| shape (bf16, causal) | pass | flashattn ms | TFLOP/s | SDPA ms | TFLOP/s | flashattn / SDPA |")
    print("|---|---|---|---|---|---|---|")
    for b, s, hq, hk, d in SHAPES:
        q = torch.randn(b, s, hq, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, s, hk, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, s, hk, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn_like(q)
        flops = 4 * b * hq * s * s * d / 2

        def ours():
            return flashattn.flash_attn_func(q, k, v, causal=True)

        def sdpa():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True, enable_gqa=hq != hk).transpose(1, 2)

        def forward_ms(f):
            with torch.no_grad():
                return median_ms(f)

        def train_ms(f):
            return median_ms(lambda: f().backward(do))
        for name, scale, time_of in (("forward", 1.0, forward_ms), ("forward+backward", 3.5, train_ms)):
            a, c = time_of(ours), time_of(sdpa)
            tf = flops * scale / 1e9
            print(f"| b{b} s{s} h{hq}/{hk} d{d} | {name} | {a:.3f} | {tf / a:.0f} | {c:.3f} | {tf / c:.0f} | "
                  f"{c / a:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    print(f"flashattn {flashattn.version()}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    overhead(args.calls, args.reps)
    throughput()


if __name__ == "__main__":
    main()
