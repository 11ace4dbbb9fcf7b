# SPDX-License-Identifier: MIT
"""Decode over a paged KV cache on the GPU: flashattn's paged call (page 16, shuffled pages), its
contiguous cache (one page per sequence) and its dense fa_forward (one query a sequence, K/V
[b, s, h, d]; nhd only) beside cuDNN's dense decode through torch SDPA, one process, the same
data. Each row: time (median of --reps timed runs after warm-up, each run a
CUDA graph of --inner calls), K+V bytes read / time, and that as a share of the HBM copy rate
measured in the same run (the better of a 4 GiB copy, read + write, and a 4 GiB read).

  python3 bench/gpu/decode.py [--lib build/libflashattn.so] [--json FILE] [--quick]
"""
import argparse
import ctypes as C
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import flashattn_ctypes as fc  # noqa: E402
from flashattn_ctypes import FA_BACKEND_CUDA, FA_DTYPE_BF16, ContextOptions, RunInfo, Tensor  # noqa: E402


class KvCache(C.Structure):
    _fields_ = [("k", C.c_void_p), ("v", C.c_void_p), ("dtype", C.c_int), ("num_pages", C.c_int32),
                ("page_size", C.c_int32), ("num_heads", C.c_int32), ("k_stride_page", C.c_int64),
                ("k_stride_token", C.c_int64), ("k_stride_head", C.c_int64), ("v_stride_page", C.c_int64),
                ("v_stride_token", C.c_int64), ("v_stride_head", C.c_int64), ("k_scale", C.c_void_p),
                ("v_scale", C.c_void_p)]


class PagedDesc(C.Structure):
    _fields_ = [("size", C.c_size_t), ("batch", C.c_int32), ("total_q", C.c_int32),
                ("max_seqlen_q", C.c_int32), ("max_seqlen_k", C.c_int32), ("num_heads_q", C.c_int32),
                ("head_dim", C.c_int32), ("q", Tensor), ("o", Tensor), ("cu_seqlens_q", C.c_void_p),
                ("cache", KvCache), ("block_table", C.c_void_p), ("block_table_stride", C.c_int64),
                ("max_pages_per_seq", C.c_int32), ("cache_seqlens", C.c_void_p), ("k_new", Tensor),
                ("v_new", Tensor), ("rope", C.c_int), ("rope_dim", C.c_int32), ("rope_max_pos", C.c_int32),
                ("rope_cos", C.c_void_p), ("rope_sin", C.c_void_p), ("positions", C.c_void_p),
                ("lse", C.c_void_p), ("lse_stride_head", C.c_int64), ("lse_stride_seq", C.c_int64),
                ("scale", C.c_float), ("causal", C.c_int32), ("window_left", C.c_int32),
                ("window_right", C.c_int32), ("softcap", C.c_float), ("sinks", C.c_void_p),
                ("kv_split", C.c_int32), ("check_tables", C.c_int32)]


def load(path):
    lib = C.CDLL(path)
    lib.fa_paged_desc_init.argtypes = [C.POINTER(PagedDesc)]
    lib.fa_paged_plan_create.argtypes = [C.c_void_p, C.POINTER(PagedDesc), C.POINTER(C.c_void_p)]
    lib.fa_paged_run.argtypes = [C.c_void_p, C.POINTER(PagedDesc)]
    lib.fa_paged_plan_info.argtypes = [C.c_void_p, C.POINTER(RunInfo)]
    lib.fa_paged_plan_destroy.argtypes = [C.c_void_p]
    lib.fa_context_create.argtypes = [C.POINTER(ContextOptions), C.POINTER(C.c_void_p)]
    lib.fa_context_last_error.restype = C.c_char_p
    lib.fa_context_last_error.argtypes = [C.c_void_p]
    lib.fa_context_set_stream.argtypes = [C.c_void_p, C.c_void_p]
    return lib


def timed(fn, reps, inner):
    """Median ms per call: each timed run replays a CUDA graph of `inner` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def hbm_rate():
    """The better of a 4 GiB copy (read + write) and a 4 GiB read (a sum), TB/s."""
    x = torch.empty(1 << 31, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    copy = 2 * x.numel() * 2 / (timed(lambda: y.copy_(x), 10, 4) * 1e-3) / 1e12
    s = torch.empty((), dtype=torch.float32, device="cuda")
    read = x.numel() * 2 / (timed(lambda: torch.sum(x, dim=0, dtype=torch.float32, out=s), 10, 4) * 1e-3) / 1e12
    return max(copy, read), copy, read


class Paged:
    """flashattn's paged call: qn queries per sequence (q [b * qn, hq, d]) over a cache viewed
    through a block table, the queries the last qn of each sequence's kv_len keys."""

    def __init__(self, lib, ctx, q, o, k, v, table, lens, page, kv_len, split=0, hnd=False, qn=1, causal=False):
        """k, v: [pages, page, heads, d], or [pages, heads, page, d] with hnd."""
        b, (_, hq, d) = lens.shape[0], q.shape
        hkv = k.shape[1] if hnd else k.shape[2]
        tok, head = (2, 1) if hnd else (1, 2)
        self.lib, self.keep = lib, (q, o, k, v, table, lens)
        self.cu = torch.arange(0, b * qn + 1, qn, dtype=torch.int32, device="cuda")
        dd = PagedDesc()
        lib.fa_paged_desc_init(C.byref(dd))
        dd.batch, dd.total_q, dd.max_seqlen_q, dd.max_seqlen_k = b, b * qn, qn, kv_len
        dd.num_heads_q, dd.head_dim = hq, d
        dd.q = Tensor(q.data_ptr(), FA_DTYPE_BF16, 0, q.stride(0), q.stride(1))
        dd.o = Tensor(o.data_ptr(), FA_DTYPE_BF16, 0, o.stride(0), o.stride(1))
        dd.causal = 1 if causal else 0
        dd.cu_seqlens_q = self.cu.data_ptr()
        dd.cache = KvCache(k.data_ptr(), v.data_ptr(), FA_DTYPE_BF16, k.shape[0], page, hkv, k.stride(0),
                           k.stride(tok), k.stride(head), v.stride(0), v.stride(tok), v.stride(head), None, None)
        dd.block_table, dd.max_pages_per_seq = table.data_ptr(), table.shape[1]
        dd.cache_seqlens = lens.data_ptr()
        dd.kv_split = split
        self.desc = dd
        self.plan = C.c_void_p()
        st = lib.fa_paged_plan_create(ctx, C.byref(dd), C.byref(self.plan))
        if st != 0:
            raise RuntimeError(lib.fa_context_last_error(ctx).decode())
        info = RunInfo()
        info.size = C.sizeof(RunInfo)
        lib.fa_paged_plan_info(self.plan, C.byref(info))
        self.kernel, self.split = info.kernel.decode(), info.block_k
        self.ctx = ctx

    def __call__(self):
        st = self.lib.fa_paged_run(self.plan, C.byref(self.desc))
        if st != 0:
            raise RuntimeError(self.lib.fa_context_last_error(self.ctx).decode())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/libflashattn.so")
    ap.add_argument("--json", help="append one JSON line per case here")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--split", type=int, default=0, help="kv_split (0: the library's default)")
    ap.add_argument("--case", help="one case BATCHxKVxHEADS_KV (e.g. 32x4096x8)")
    ap.add_argument("--layout", choices=("nhd", "hnd"), default="nhd",
                    help="cache pages [page, token, head, dim] (nhd) or [page, head, token, dim] (hnd); "
                         "cuDNN gets the same keys as [b, s, h, d] or [b, h, s, d] memory")
    args = ap.parse_args()
    lib = load(args.lib)
    ctx = C.c_void_p()
    opts = ContextOptions(C.sizeof(ContextOptions), FA_BACKEND_CUDA, 0)
    if lib.fa_context_create(C.byref(opts), C.byref(ctx)) != 0:
        sys.exit("no CUDA context")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dense = fc.Context(fc.load(args.lib), torch.cuda.current_stream().cuda_stream)
    hbm, copy, read = hbm_rate()
    print(f"HBM: copy {copy:.2f} TB/s, read {read:.2f} TB/s; {torch.cuda.get_device_name()}; commit {commit}; "
          f"layout {args.layout}")
    hnd = args.layout == "hnd"
    cases = [(32, 4096), (32, 16384), (32, 32768), (8, 4096), (8, 16384), (8, 32768), (1, 131072)]
    if args.quick:
        cases = [(32, 4096), (8, 16384), (1, 131072)]
    kv_heads = (32, 8)
    if args.case:
        b_, kv_, hkv_ = (int(x) for x in args.case.split("x"))
        cases, kv_heads = [(b_, kv_)], (hkv_,)
    d, page, hq = 128, 16, 32
    print(f"{'case':<22} {'paged ms':>9} {'TB/s':>6} {'%HBM':>5} {'contig':>7} {'dense':>7} {'TB/s':>6} "
          f"{'cuDNN ms':>9} {'TB/s':>6} {'ratio':>6} {'dense ratio':>11} {'paged/contig':>12}  kernel")
    torch.manual_seed(0)
    for hkv in kv_heads:
        for b, kv in cases:
            pages = b * kv // page
            kc = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device="cuda")
            vc = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device="cuda")
            if hnd:  # the same keys, each page's heads one after another
                kc, vc = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
            table = torch.randperm(pages, device="cuda", dtype=torch.int64).to(torch.int32).view(b, kv // page)
            lens = torch.full((b,), kv, dtype=torch.int32, device="cuda")
            q = torch.randn(b, hq, d, dtype=torch.bfloat16, device="cuda")
            o = torch.empty_like(q)
            paged = Paged(lib, ctx, q, o, kc, vc, table, lens, page, kv, args.split, hnd)
            # the same keys contiguous per sequence: [b, kv, hkv, d] (hnd: [b, hkv, kv, d]), one page
            # of kv tokens each
            if hnd:
                kd = kc[table.long()].permute(0, 2, 1, 3, 4).reshape(b, hkv, kv, d)
                vd = vc[table.long()].permute(0, 2, 1, 3, 4).reshape(b, hkv, kv, d)
            else:
                kd = kc[table.long()].reshape(b, kv, hkv, d)
                vd = vc[table.long()].reshape(b, kv, hkv, d)
            o2 = torch.empty_like(q)
            ident = torch.arange(b, dtype=torch.int32, device="cuda").view(b, 1)
            contig = Paged(lib, ctx, q, o2, kd, vd, ident, lens, kv, kv, args.split, hnd)
            lib.fa_context_set_stream(ctx, C.c_void_p(torch.cuda.current_stream().cuda_stream))
            paged()
            contig()
            qs = q.view(b, hq, 1, d)
            ks, vs = (kd, vd) if hnd else (kd.transpose(1, 2), vd.transpose(1, 2))
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                try:
                    ref = F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=hkv != hq)
                    gqa_mode = "enable_gqa"
                    peer = lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=hkv != hq)  # noqa: E731
                except RuntimeError:
                    ke = ks.repeat_interleave(hq // hkv, dim=1).contiguous()
                    ve = vs.repeat_interleave(hq // hkv, dim=1).contiguous()
                    ref = F.scaled_dot_product_attention(qs, ke, ve)
                    gqa_mode = "expanded"
                    peer = lambda: F.scaled_dot_product_attention(qs, ke, ve)  # noqa: E731
                torch.cuda.synchronize()
                err = (o.float() - ref.view(b, hq, d).float()).abs().max().item()
                err2 = (o2.float() - ref.view(b, hq, d).float()).abs().max().item()
                t_peer = timed(peer, args.reps, args.inner)

            def run_ours(fn):
                stream = torch.cuda.current_stream().cuda_stream
                lib.fa_context_set_stream(ctx, C.c_void_p(stream))
                fn()

            t_paged = timed(lambda: run_ours(paged), args.reps, args.inner)
            t_contig = timed(lambda: run_ours(contig), args.reps, args.inner)
            t_dense, err3, dense_kernel = float("nan"), float("nan"), "-"
            if not hnd:  # fa_forward on [b, 1, hq, d] over [b, kv, hkv, d]: its decode route
                q4, o4 = q.view(b, 1, hq, d), torch.empty(b, 1, hq, d, dtype=torch.bfloat16, device="cuda")
                ddesc = dense.desc(q4, kd, vd, o4)

                def run_dense():
                    stream = C.c_void_p(torch.cuda.current_stream().cuda_stream)
                    dense.check(dense.lib.fa_context_set_stream(dense.ctx, stream))
                    dense.forward(ddesc)

                run_dense()
                torch.cuda.synchronize()
                dense_kernel = dense.last_run().kernel.decode()
                err3 = (o4.view(b, hq, d).float() - ref.view(b, hq, d).float()).abs().max().item()
                t_dense = timed(run_dense, args.reps, args.inner)
            nbytes = 2 * b * kv * hkv * d * 2
            tb = lambda ms: nbytes / (ms * 1e-3) / 1e12  # noqa: E731
            name = f"b{b} kv{kv} h{hq}/kv{hkv}"
            print(f"{name:<22} {t_paged:9.4f} {tb(t_paged):6.2f} {100 * tb(t_paged) / hbm:5.1f} {t_contig:7.4f} "
                  f"{t_dense:7.4f} {tb(t_dense):6.2f} {t_peer:9.4f} {tb(t_peer):6.2f} {t_peer / t_paged:6.2f} "
                  f"{t_peer / t_dense:11.2f} {t_paged / t_contig:12.3f}  {paged.kernel} split {paged.split}, dense "
                  f"{dense_kernel}; max err {err:.2e}/{err2:.2e}/{err3:.2e} vs cuDNN ({gqa_mode})")
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"commit": commit, "case": name, "batch": b, "kv": kv, "heads_q": hq,
                                        "heads_kv": hkv, "page": page, "layout": args.layout, "paged_ms": t_paged, "contig_ms": t_contig,
                                        "cudnn_ms": t_peer, "dense_ms": t_dense, "dense_kernel": dense_kernel, "kv_bytes": nbytes, "hbm_tbs": hbm,
                                        "cudnn_gqa": gqa_mode, "kernel": paged.kernel, "split": paged.split,
                                        "env": {k: v for k, v in os.environ.items() if k.startswith("FLASHATTN_")},
                                        "max_err": err}) + "\n")
            lib.fa_paged_plan_destroy(paged.plan)
            lib.fa_paged_plan_destroy(contig.plan)
            del kc, vc, kd, vd
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
