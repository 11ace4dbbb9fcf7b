#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Nsight Compute profile of the dense forward (or backward): flashattn's Hopper kernel beside
# cuDNN's (torch SDPA) on the same tensors, with what says where a compute-bound kernel loses: the pipes'
# utilisation (tensor, MUFU, FMA), shared-memory wavefronts and bank conflicts, L2 throughput,
# warp stalls and the top stalling instructions. On a CUDA machine:
#   bench/gpu/profile_forward.sh [CASE ...]   CASE = dDIM-sSEQ[-causal][-bwd] (default d64-s4096 d128-s4096 d128-s8192-causal)
# -bwd: the backward's kernels instead (ours, then cuDNN's), after a forward each.
# NCU_EXTRA adds ncu options (for instance "--print-details all": the sections' tables too).
# NCU_SOURCE=1: also our kernel's SASS, instruction by instruction, with its executions and
# warp-stall samples by reason, as CSV ($OUT/sass_CASE.csv.gz; every profiled kernel's where
# this ncu cannot filter an imported report).
# batch x seq = 16k, hidden 2048 (bench/gpu/attention.py's shapes). Builds the library alone into
# build/ when build/libflashattn.so is missing; reports go to $OUT (or build/), one file a case.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
mkdir -p "$out"
. bench/gpu/device_env.sh
device_library "$out" || exit 1
[ $# -gt 0 ] || set -- d64-s4096 d128-s4096 d128-s8192-causal
# the pipe and shared-memory metrics this ncu knows by these names (names differ between versions)
metrics=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}' |
  grep -E '^(sm__pipe_(tensor_op_gmma|shared|xu|fma|alu|fmaheavy)_cycles_active|sm__inst_executed_pipe_(xu|fma|alu|lsu|uniform)|l1tex__data_pipe_lsu_wavefronts_mem_shared|l1tex__data_bank_conflicts_pipe_lsu_mem_shared|smsp__inst_executed|sm__cycles_elapsed)$' |
  sed -E 's/(_cycles_active)$/\1.avg.pct_of_peak_sustained_active/; /pct_of_peak/!s/$/.sum/' | paste -sd, -)
echo "metrics: $metrics"
src=0
[ "${NCU_SOURCE:-0}" = 1 ] && src=1
for c in "$@"; do
  rep=/tmp/ncu_fwd_$c.ncu-rep
  rm -f "$rep"
  case $c in
  *-bwd) ours=backward_sm90 kre='regex:backward_sm90|bprop' ;;
  *) ours=flash_forward_sm90 kre='regex:flash_forward_sm90|sdpa|fprop|fmha|cudnn' ;;
  esac
  ncu --clock-control none --kernel-name-base demangled -k "$kre" \
    --launch-count 2 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
    --section SourceCounters ${metrics:+--metrics "$metrics"} ${NCU_EXTRA:-} \
    $([ $src = 1 ] && echo "--import-source no -o ${rep%.ncu-rep}") python3 - "$c" > "$out/ncu_fwd_$c.txt" 2>&1 <<'PY'
import re, sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
sys.path.insert(0, "bench/gpu")
import flashattn_ctypes as fa
m = re.fullmatch(r"d(\d+)-s(\d+)(-causal)?(-bwd)?", sys.argv[1])
d, s, causal, bwd = int(m[1]), int(m[2]), bool(m[3]), bool(m[4])
b, h = 16384 // s, 2048 // d
torch.manual_seed(0)
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o, do = torch.empty_like(q), torch.randn_like(q)
lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
ctx = fa.Context(fa.load("build/libflashattn.so"))
desc = ctx.desc(q, k, v, o, lse, causal)
ctx.forward(desc)
if bwd:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ctx.backward(ctx.backward_desc(desc, do, dq, dk, dv))
print("kernel:", ctx.last_run().kernel.decode())
qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(bwd) for x in (q, k, v))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    if bwd:
        out.backward(do.transpose(1, 2))
torch.cuda.synchronize()
PY
  rc=$?
  echo "== $c: rc=$rc -> $out/ncu_fwd_$c.txt"
  if [ $src = 1 ] && [ $rc -eq 0 ] && [ -f "$rep" ]; then
    # the run's own lines (the kernel's name, ncu's notes) first, then the report's sections
    ncu -i "$rep" --page details --print-details all >> "$out/ncu_fwd_$c.txt" 2>&1
    ncu -i "$rep" --page source --csv --print-source sass -k regex:$ours \
      --launch-count 1 2> "$out/sass_$c.err" | gzip > "$out/sass_$c.csv.gz"
    [ "$(zcat "$out/sass_$c.csv.gz" | wc -l)" -gt 10 ] || # an ncu without filters on import: every kernel
      ncu -i "$rep" --page source --csv --print-source sass 2>> "$out/sass_$c.err" | gzip > "$out/sass_$c.csv.gz"
    echo "sass: $(zcat "$out/sass_$c.csv.gz" | wc -l) lines"; head -c 600 "$out/sass_$c.err"
  elif [ $src = 1 ]; then
    echo "no report to read the SASS from (rc=$rc)"
  fi
  grep -E "^  [A-Za-z_].*\(|kernel:|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued|cycles_active|inst_executed|mem_shared|bank_conflicts|elapsed.sum|Shared .*Wavefronts" "$out/ncu_fwd_$c.txt" | head -60
done
