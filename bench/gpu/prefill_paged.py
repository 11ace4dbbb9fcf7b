# SPDX-License-Identifier: MIT
"""Chunked prefill against a paged KV cache on the GPU: flashattn's paged call (page 16, shuffled
pages; each sequence's last CHUNK keys are its queries, causal bottom-right) beside flashattn's
dense fa_forward on the same keys stored contiguously, one process, the same data. Each row:
median ms of timed runs of --inner calls after warm-up (calls of milliseconds: no graphs),
TFLOP/s (4 * heads * d * visible (query, key) pairs) and the dense / paged time ratio; the
two outputs' max difference is printed as a sanity check.

  python3 bench/gpu/prefill_paged.py [--lib build/libflashattn.so] [--json FILE] [--page N] [--in-order | --shuffle-within G]
"""
import argparse
import ctypes as C
import json
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import decode  # noqa: E402
import flashattn_ctypes as fc  # noqa: E402


def timed(fn, reps, inner):
    """Median ms per call over reps runs of inner calls, after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/libflashattn.so")
    ap.add_argument("--json", help="append one JSON line per case here")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--page", type=int, default=16, help="tokens a page (a power of two up to 2048)")
    ap.add_argument("--in-order", action="store_true", help="each sequence's pages in pool order, not shuffled")
    ap.add_argument("--shuffle-within", type=int, default=0, metavar="G",
                    help="shuffle pages only within aligned groups of G (a power of two; 0: the whole pool)")
    args = ap.parse_args()
    lib = decode.load(args.lib)
    ctx = C.c_void_p()
    opts = fc.ContextOptions(C.sizeof(fc.ContextOptions), fc.FA_BACKEND_CUDA, 0)
    if lib.fa_context_create(C.byref(opts), C.byref(ctx)) != 0:
        sys.exit("no CUDA context")
    dense = fc.Context(fc.load(args.lib), torch.cuda.current_stream().cuda_stream)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"{torch.cuda.get_device_name()}; commit {commit}")
    print(f"{'case':<30} {'paged ms':>9} {'TFLOP/s':>8} {'dense ms':>9} {'TFLOP/s':>8} {'paged/dense':>11}  kernel")
    d, page, hq = 128, args.page, 32
    if page < 1 or page > 2048 or page & (page - 1):
        sys.exit("--page: a power of two from 1 to 2048")
    group = args.shuffle_within
    if group < 0 or group & (group - 1) or (group and args.in_order):
        sys.exit("--shuffle-within: a power of two, without --in-order")
    torch.manual_seed(0)
    for hkv in (32, 8):
        for b, kv, chunk in ((1, 8192, 2048), (4, 8192, 512), (4, 16384, 2048), (16, 4096, 256)):
            pages = b * kv // page
            kc = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device="cuda")
            vc = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device="cuda")
            if args.in_order:
                order = torch.arange(pages, device="cuda")
            elif group:  # each group's pages among themselves
                if pages % group:
                    sys.exit(f"--shuffle-within {group}: does not divide the {pages} pages of b{b} kv{kv}")
                base = torch.arange(0, pages, group, device="cuda").unsqueeze(1)
                order = (base + torch.argsort(torch.rand(pages // group, group, device="cuda"), dim=1)).flatten()
            else:
                order = torch.randperm(pages, device="cuda")
            table = order.to(torch.int32).view(b, kv // page)
            lens = torch.full((b,), kv, dtype=torch.int32, device="cuda")
            q = torch.randn(b, chunk, hq, d, dtype=torch.bfloat16, device="cuda")
            o = torch.empty_like(q)
            paged = decode.Paged(lib, ctx, q.view(b * chunk, hq, d), o.view(b * chunk, hq, d), kc, vc, table, lens,
                                 page, kv, qn=chunk, causal=True)
            kd = kc[table.long()].reshape(b, kv, hkv, d)
            vd = vc[table.long()].reshape(b, kv, hkv, d)
            o2 = torch.empty_like(q)
            desc = dense.desc(q, kd, vd, o2, causal=True)

            def run_paged():
                lib.fa_context_set_stream(ctx, C.c_void_p(torch.cuda.current_stream().cuda_stream))
                paged()

            def run_dense():
                dense.check(dense.lib.fa_context_set_stream(dense.ctx,
                                                            C.c_void_p(torch.cuda.current_stream().cuda_stream)))
                dense.forward(desc)

            run_paged()
            run_dense()
            torch.cuda.synchronize()
            err = (o.float() - o2.float()).abs().max().item()
            kernel = dense.last_run().kernel.decode()
            t_paged = timed(run_paged, args.reps, args.inner)
            t_dense = timed(run_dense, args.reps, args.inner)
            pairs = chunk * (kv - chunk) + chunk * (chunk + 1) // 2
            flops = 4 * b * hq * d * pairs
            tf = lambda ms: flops / (ms * 1e-3) / 1e12  # noqa: E731
            name = f"b{b} kv{kv} chunk{chunk} h{hq}/kv{hkv}"
            print(f"{name:<30} {t_paged:9.4f} {tf(t_paged):8.1f} {t_dense:9.4f} {tf(t_dense):8.1f} "
                  f"{t_dense / t_paged:11.3f}  {paged.kernel} vs {kernel}; max diff {err:.2e}")
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"commit": commit, "case": name, "batch": b, "kv": kv, "chunk": chunk,
                                        "heads_q": hq, "heads_kv": hkv, "page": page,
                                        "in_order": args.in_order, "shuffle_within": group, "paged_ms": t_paged,
                                        "dense_ms": t_dense, "flops": flops, "paged_kernel": paged.kernel,
                                        "dense_kernel": kernel, "max_diff": err}) + "\n")
            lib.fa_paged_plan_destroy(paged.plan)
            del kc, vc, kd, vd
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
