# SPDX-License-Identifier: MIT
"""One shape's forward + backward, flashattn and torch's flash backend, a few times each:
the workload for a per-kernel profile (ncu -k regex:...) of the backward.

  ncu --clock-control none -k regex:'dk_dv|dq_|rowsum|flash_bwd' python3 bench/gpu/profile_bwd.py --d 128
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import flashattn_ctypes as fa  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/libflashattn.so")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    lib = fa.load(args.lib)
    ctx = fa.Context(lib, torch.cuda.current_stream().cuda_stream)
    s, d = args.seq, args.d
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, do = torch.empty_like(q), torch.randn_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    desc = ctx.desc(q, k, v, o, lse, args.causal)
    bdesc = ctx.backward_desc(desc, do, dq, dk, dv)
    for _ in range(args.reps):
        ctx.forward(desc)
        ctx.backward(bdesc)
    if not args.no_peer:
        qg, kg, vg = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for _ in range(args.reps):
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal).backward(do.transpose(1, 2))
    torch.cuda.synchronize()
    print(f"b{b} h{h} s{s} d{d} causal={args.causal}: done")


if __name__ == "__main__":
    main()
