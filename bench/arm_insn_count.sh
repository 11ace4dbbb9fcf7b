#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Guest instructions one forward call executes under qemu-aarch64, per CPU kernel table.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: bench/arm_insn_count.sh [--build DIR] [--tables "T1 T2 ..."] [--reps N] [--shape "ARGS"]...

Runs `flashattn bench` of an aarch64 build (make test-arm's build-arm) under qemu-aarch64 with
a TCG plugin that counts executed guest instructions (bench/qemu_insn_count.c, built here with
the host's cc; QEMU plugin API 1, as Debian 12's qemu-user 7.2 has). Each shape runs twice per
table, with --reps 1 and --reps N: bench makes one warm-up call plus --reps timed calls, and
everything else (inputs, the float64 error check) is the same in both runs, so the difference
over N - 1 is the instructions of one forward call. Single-threaded (OMP_THREAD_LIMIT=1).

Instruction counts are not time: they ignore latency, throughput, memory and the cache.

  --build DIR     the aarch64 build directory              [build-arm]
  --tables LIST   kernel tables (FLASHATTN_CPU_KERNELS)    [neon_fhm neon ref]
  --reps N        the second run's --reps (>= 2)           [3]
  --shape ARGS    flashattn bench shape options, repeatable
                  [decode: --seq 4096 --seq-q 1 --heads 32 --kv-heads 8 --dim 128 --dtype f16,
                   prefill: --seq 256 --heads 8 --dim 128 --dtype f16]
Output: one markdown table row per shape and table: instructions per call and per
(query head x query row x key).
EOF
}

build=build-arm
tables="neon_fhm neon ref"
reps=3
shapes=()
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --tables) tables=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --shape) shapes+=("$2"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
[ "$reps" -ge 2 ] || { echo "--reps must be at least 2" >&2; exit 2; }
if [ ${#shapes[@]} -eq 0 ]; then
    shapes=("--seq 4096 --seq-q 1 --heads 32 --kv-heads 8 --dim 128 --dtype f16"
            "--seq 256 --heads 8 --dim 128 --dtype f16")
fi
[ -x "$build/flashattn" ] || { echo "no $build/flashattn: run make test-arm first" >&2; exit 1; }

here=$(cd "$(dirname "$0")" && pwd)
plugin="$build/qemu_insn_count.so"
cc -shared -fPIC -O2 -o "$plugin" "$here/qemu_insn_count.c"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# count REPS TABLE SHAPE...: prints "instructions kernel" of one bench run
count() {
    local r=$1 t=$2
    shift 2
    local out
    out=$(OMP_THREAD_LIMIT=1 OPENBLAS_NUM_THREADS=1 FLASHATTN_CPU_KERNELS=$t \
        qemu-aarch64 -L /usr/aarch64-linux-gnu -plugin "$plugin" -d plugin -D "$log" \
        "$build/flashattn" bench "$@" --causal no --threads 1 --reps "$r" --no-standard --no-sgemm)
    echo "$(sed -n 's/^insns: //p' "$log") $(echo "$out" | awk '$1 == "cpu" { print $2 }')"
}

echo "qemu: $(qemu-aarch64 --version | head -1); flashattn $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "| shape | table | kernel | instructions per call | per head x row x key |"
echo "|---|---|---|---:|---:|"
for shape in "${shapes[@]}"; do
    # shellcheck disable=SC2086  # the shape is a list of options
    set -- $shape
    seq=$(echo "$shape" | sed -n 's/.*--seq \([0-9]*\).*/\1/p')
    sq=$(echo "$shape" | sed -n 's/.*--seq-q \([0-9]*\).*/\1/p')
    heads=$(echo "$shape" | sed -n 's/.*--heads \([0-9]*\).*/\1/p')
    for t in $tables; do
        read -r c1 kernel < <(count 1 "$t" "$@")
        read -r cn _ < <(count "$reps" "$t" "$@")
        per=$(( (cn - c1) / (reps - 1) ))
        unit=$(awk -v p="$per" -v h="$heads" -v q="${sq:-$seq}" -v k="$seq" \
            'BEGIN { printf "%.1f", p / (h * q * k) }')
        echo "| $shape | $t | $kernel | $per | $unit |"
    done
done
