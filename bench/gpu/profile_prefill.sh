#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Where the runner's prefill time goes on a CUDA machine: Nsight Compute's duration of every
# kernel of `flashattn bench-model --backend cuda` (its warm-up request of 64 tokens, then one
# prompt of LEN tokens and one decode step, graphs off; the weights' conversion to bf16 at load
# too), summed by kernel name, largest first.
# Needs build/flashattn (bench/gpu/device_runner.sh builds it); the CSV goes to $OUT (or build/).
#   bench/gpu/profile_prefill.sh [LEN] [CONFIG]      (defaults: 2048 7b)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
len=${1:-2048}
cfg=${2:-7b}
ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  ./build/flashattn bench-model --backend cuda --config "$cfg" --prompt-len "$len" --decode 1 --batch 1 \
  --graphs off > "$out/ncu_prefill_$len.csv" 2> "$out/ncu_prefill_$len.err"
echo "ncu rc=$?"
python3 - "$out/ncu_prefill_$len.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
name, val = head.index("Kernel Name"), head.index("Metric Value")
tot, cnt = collections.Counter(), collections.Counter()
for r in rows[1:]:
    try:
        ns = float(r[val].replace(",", ""))
    except ValueError:
        continue
    k = r[name].split("(")[0][:90]
    tot[k] += ns
    cnt[k] += 1
all_ns = sum(tot.values())
print(f"{sum(cnt.values())} kernels, {all_ns / 1e6:.2f} ms in all (warm-up request and decode step included)")
for k, ns in tot.most_common(25):
    print(f"{ns / 1e6:9.3f} ms {100 * ns / all_ns:5.1f}% {cnt[k]:5d}x  {k}")
PY
