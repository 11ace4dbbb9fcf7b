# SPDX-License-Identifier: MIT
"""flashattn's CUDA forward and forward+backward beside PyTorch's scaled_dot_product_attention
backends (flash = FlashAttention-2, cuDNN, memory-efficient) and, where `flash_attn.cute`
imports, FlashAttention-4 (bench/gpu/fetch_fa4.sh and device_fa4.sh install it), in one process
on one GPU. Each row's "vs best" is ours over the better of cuDNN and FA4.

FlashAttention's benchmark shapes: batch * seq = 16k tokens, hidden 2048 (heads = 2048 / d),
bf16, [batch, seq, heads, dim] tensors (SDPA gets the transposed view, as FlashAttention's own
benchmark passes them). Medians of CUDA-event timings after warm-up; TFLOP/s with FlashAttention's
count (forward 4*b*h*s*s*d, halved when causal; forward+backward 3.5x that).

  python3 bench/gpu/attention.py [--lib build/libflashattn.so] [--json out.jsonl] [--quick]
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import flashattn_ctypes as fa  # noqa: E402

PEERS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
         "mem-efficient": SDPBackend.EFFICIENT_ATTENTION}


def load_fa4():
    """FlashAttention-4's flash_attn_func, or None and why not."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # not installed, or its runtime does not load here
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    return flash_attn_func, None


def first(y):
    """FA4 returns (out, lse) where SDPA returns out."""
    return y[0] if isinstance(y, tuple) else y


def median_ms(fn, warmup, reps):
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/libflashattn.so")
    ap.add_argument("--json", help="append one JSON line per shape here")
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--dims", default="64,128", help="head dims, comma-separated")
    ap.add_argument("--no-peers", action="store_true", help="flashattn alone (A/B runs of its kernels)")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="SDPA backends beside it, comma-separated (torch-flash gives the diff column)")
    args = ap.parse_args()
    unknown = [n for n in args.peers.split(",") if n and n not in PEERS]
    if unknown:
        ap.error(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(PEERS)})")
    peers = {} if args.no_peers else {n: PEERS[n] for n in args.peers.split(",") if n}

    torch.manual_seed(0)
    lib = fa.load(args.lib)
    ctx = fa.Context(lib, torch.cuda.current_stream().cuda_stream)
    print(ctx.info(), end="")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    fa4, why = (None, "--no-peers") if args.no_peers else load_fa4()
    print("FlashAttention-4: a peer" if fa4 else f"FlashAttention-4: not a peer ({why})")

    seqs = [1024, 4096, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    out = open(args.json, "a") if args.json else None
    rows = []
    for d in (int(x) for x in args.dims.split(",")):
        for causal in (False, True):
            for s in seqs:
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                o = torch.empty_like(q)
                lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                do = torch.randn_like(q)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                desc = ctx.desc(q, k, v, o, lse, causal)
                bdesc = ctx.backward_desc(desc, do, dq, dk, dv)
                flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
                r = {"d": d, "causal": causal, "seq": s, "batch": b, "heads": h}

                r["flashattn_fwd_ms"] = median_ms(lambda: ctx.forward(desc), 3, args.reps)
                r["kernel"] = ctx.last_run().kernel.decode()
                if not args.no_backward:
                    def fwd_bwd():
                        ctx.forward(desc)
                        ctx.backward(bdesc)
                    r["flashattn_fwdbwd_ms"] = median_ms(fwd_bwd, 3, args.reps)

                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                ref = None
                for name, be in peers.items():
                    try:
                        with sdpa_kernel(be):
                            y = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            if name == "torch-flash":
                                ref = y
                            r[name + "_fwd_ms"] = median_ms(
                                lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), 3, args.reps)
                            if not args.no_backward:
                                qg, kg, vg = (x.detach().requires_grad_() for x in (qt, kt, vt))
                                dot = do.transpose(1, 2)

                                def peer_fwd_bwd():
                                    F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(dot)
                                r[name + "_fwdbwd_ms"] = median_ms(peer_fwd_bwd, 3, args.reps)
                    except RuntimeError as e:
                        r[name + "_error"] = str(e).splitlines()[0][:120]
                if fa4 is not None:  # [batch, seq, heads, dim] as ours; its first call of a shape compiles
                    try:
                        y = first(fa4(q, k, v, causal=causal))
                        if ref is not None:
                            r["max_abs_diff_fa4_vs_torch_flash"] = (y.float() - ref.transpose(1, 2).float()).abs().max().item()
                        r["fa4_fwd_ms"] = median_ms(lambda: fa4(q, k, v, causal=causal), 3, args.reps)
                        if not args.no_backward:
                            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

                            def fa4_fwd_bwd():
                                first(fa4(qg, kg, vg, causal=causal)).backward(do)
                            r["fa4_fwdbwd_ms"] = median_ms(fa4_fwd_bwd, 3, args.reps)
                    except Exception as e:
                        r["fa4_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                if ref is not None:  # the same function, to bf16 rounding (the tests judge correctness)
                    ctx.forward(desc)
                    torch.cuda.synchronize()
                    r["max_abs_diff_vs_torch_flash"] = (o.float() - ref.transpose(1, 2).float()).abs().max().item()
                for key in list(r):
                    if key.endswith("_fwd_ms"):
                        r[key[:-3] + "_tflops"] = flops / r[key] / 1e9
                    elif key.endswith("_fwdbwd_ms"):
                        r[key[:-3] + "_tflops"] = 3.5 * flops / r[key] / 1e9
                rows.append(r)

                def tf(key):
                    x = r.get(key)
                    return f"{x:6.1f}" if x is not None else "   n/a"

                def ratio(key):
                    x = r.get(key)
                    return f"x{x:4.2f}" if x is not None else "  n/a"

                def vs_best(part):  # ours over the better of cuDNN and FA4
                    best = max((r[k] for k in (f"cudnn_{part}_tflops", f"fa4_{part}_tflops") if k in r), default=None)
                    ours = r.get(f"flashattn_{part}_tflops")
                    return ours / best if best and ours else None  # JSON null, not NaN
                r["fwd_vs_best"], r["fwdbwd_vs_best"] = vs_best("fwd"), vs_best("fwdbwd")
                if out:
                    out.write(json.dumps(r) + "\n")
                    out.flush()
                print(f"d{d:<3} {'causal' if causal else 'full  '} s{s:<6} fwd: ours {tf('flashattn_fwd_tflops')} "
                      f"fa2 {tf('torch-flash_fwd_tflops')} cudnn {tf('cudnn_fwd_tflops')} fa4 {tf('fa4_fwd_tflops')} "
                      f"eff {tf('mem-efficient_fwd_tflops')} vs best {ratio('fwd_vs_best')} | fwd+bwd: ours "
                      f"{tf('flashattn_fwdbwd_tflops')} fa2 {tf('torch-flash_fwdbwd_tflops')} cudnn {tf('cudnn_fwdbwd_tflops')} "
                      f"fa4 {tf('fa4_fwdbwd_tflops')} vs best {ratio('fwdbwd_vs_best')} | "
                      f"diff {r.get('max_abs_diff_vs_torch_flash', float('nan')):.3g}", flush=True)
                del q, k, v, o, lse, do, dq, dk, dv

    # Extra device memory of one call at seq 32k (b1, h16, d128, causal): the call's own workspace.
    s, h, d = 32768, 16, 128
    q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, do = torch.empty_like(q), torch.randn_like(q)
    lse = torch.empty(1, h, s, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    desc = ctx.desc(q, k, v, o, lse, True)
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    ctx.forward(desc)
    fwd_ws = ctx.last_run().workspace_bytes
    ctx.backward(ctx.backward_desc(desc, do, dq, dk, dv))
    bwd_ws = ctx.last_run().workspace_bytes
    torch.cuda.synchronize()
    free1 = torch.cuda.mem_get_info()[0]
    io = sum(x.numel() * x.element_size() for x in (q, k, v, o, do, dq, dk, dv, lse))
    mem = {"memory_seq": s, "forward_workspace_bytes": fwd_ws, "backward_workspace_bytes": bwd_ws,
           "device_free_drop_bytes": free0 - free1, "inputs_outputs_bytes": io}
    print(f"memory at s{s} h{h} d{d} causal: forward workspace {fwd_ws} B, backward workspace {bwd_ws / 2**20:.2f} MiB, "
          f"device free memory dropped {(free0 - free1) / 2**20:.2f} MiB (inputs+outputs {io / 2**30:.2f} GiB)")
    if out:
        out.write(json.dumps(mem) + "\n")


if __name__ == "__main__":
    main()
