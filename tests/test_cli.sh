#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The command-line tool: help everywhere, one-line errors with exit 2 on bad usage,
# and a small benchmark whose JSON rows carry every documented field.
set -u
fa="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass=0

expect_rc() { # want, description, command...
  local want=$1 what=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: $what: exit $rc, want $want"; cat "$tmp/err"; fails=$((fails + 1))
  else
    pass=$((pass + 1))
  fi
}

# bad usage: exit 2 and one line on stderr that says what to do
expect_usage() { # description, command...
  expect_rc 2 "$@"
  local lines
  lines=$(wc -l <"$tmp/err")
  [ "$lines" -eq 1 ] || { echo "FAIL: $1: a usage error printed $lines lines"; cat "$tmp/err"; fails=$((fails + 1)); }
}

expect_rc 0 "top-level --help" "$fa" --help
for cmd in bench check info generate gen-model export-hf bench-model bench-serve; do
  grep -q "^  $cmd  " "$tmp/out" || { echo "FAIL: the top-level usage omits $cmd"; fails=$((fails + 1)); }
done
for cmd in bench check info generate gen-model export-hf bench-model bench-serve; do
  expect_rc 0 "$cmd --help" "$fa" $cmd --help
  grep -q "usage: flashattn $cmd" "$tmp/out" || { echo "FAIL: $cmd --help prints no usage"; fails=$((fails + 1)); }
  expect_usage "$cmd --bogus" "$fa" $cmd --bogus
  grep -q "unknown option '--bogus' (see \`flashattn $cmd --help\`)" "$tmp/err" ||
    { echo "FAIL: $cmd --bogus is not called an unknown option"; cat "$tmp/err"; fails=$((fails + 1)); }
done
expect_usage "no command" "$fa"
grep -q "no command given; \`flashattn --help\` lists the commands" "$tmp/err" ||
  { echo "FAIL: no command: want the line pointing at --help"; cat "$tmp/err"; fails=$((fails + 1)); }
expect_usage "unknown command" "$fa" frobnicate
expect_usage "a stray argument" "$fa" bench 512
expect_usage "head_dim too large" "$fa" bench --dim 300
expect_usage "heads not divisible" "$fa" bench --heads 6 --kv-heads 4
expect_usage "negative seq" "$fa" bench --seq -5
expect_usage "garbage number" "$fa" bench --seq 12abc
expect_usage "a number after a space" "$fa" bench --seq " 64"
for list in 1,,2 ,1 1, , 64,,; do
  expect_usage "an empty item in --seq $list" "$fa" bench --seq "$list"
done
expect_usage "17 lengths" "$fa" bench --seq 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17
expect_usage "missing value" "$fa" bench --seq
expect_usage "missing value after a common option" "$fa" bench --threads
expect_usage "bad dtype" "$fa" bench --dtype f64
expect_usage "bad window" "$fa" bench --window 3
expect_usage "descale factors without fp8" "$fa" bench --descale-rows 4
expect_usage "negative descale rows" "$fa" bench --dtype e4m3 --descale-rows -1
expect_usage "bad backend" "$fa" info --backend tpu
expect_usage "bad seed" "$fa" check --seed x
# a negative or too large seed is refused, not wrapped into 2^64 - 1 and run
expect_usage "negative seed" timeout 20 "$fa" check --seed -1 --quick
expect_usage "seed past 2^64" timeout 20 "$fa" check --seed 18446744073709551616 --quick
expect_usage "generate missing value" "$fa" generate --prompt
expect_usage "gen-model stray argument" "$fa" gen-model x

# shapes inside every flag's range whose buffers do not fit: exit 1 with one line, never a crash
# (b*sq*h*d*4 is 2^64 here: it wraps to 0 unchecked)
expect_rc 1 "bench: sizes past 64 bits" "$fa" bench --seq 16777216 --heads 4096 --dim 64 --batch 1048576 \
  --causal no --no-sgemm --no-standard --reps 1
grep -q "^flashattn bench: .*too large" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
  { echo "FAIL: sizes past 64 bits: want one line saying too large"; cat "$tmp/err"; fails=$((fails + 1)); }
expect_rc 1 "bench: keys past 64 bits" "$fa" bench --seq-q 1 --seq 16777216 --heads 4096 --dim 256 \
  --batch 1048576 --causal no --no-sgemm --no-standard --reps 1
expect_rc 1 "bench: 16 TiB of tensors" "$fa" bench --seq 16777216 --heads 4096 --dim 64 --causal no \
  --no-sgemm --no-standard --reps 1
grep -q "^flashattn bench: .*too large" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
  { echo "FAIL: 16 TiB of tensors: want one line saying too large"; cat "$tmp/err"; fails=$((fails + 1)); }

expect_rc 0 "info" "$fa" info --backend cpu
grep -q "cpu.kernels:" "$tmp/out" || { echo "FAIL: info names no kernel table"; fails=$((fails + 1)); }
# its plans (seven shapes, forward and backward) are of tensors that do not overlap
n=$(grep -c "block_q .* block_k" "$tmp/out")
[ "$n" -eq 14 ] || { echo "FAIL: info planned $n of 14 rows"; grep -v "block_q" "$tmp/out" | tail -5; fails=$((fails + 1)); }

# GLES (where a GLES 3.1 driver is usable): info and a small bench with the variant and tiles
# in the row; on Mesa, a context limited to ES 3.0 is refused with a message naming 3.1.
if "$fa" info --backend gles >"$tmp/gl" 2>/dev/null; then
  grep -q "gles.forward.d64: \(tiled .* score blocks\|rows-tex .* buffer textures\|rows .* keys per step\)" "$tmp/gl" ||
    { echo "FAIL: gles info names no variant and tiles"; fails=$((fails + 1)); }
  grep -q "gles.forward.why:" "$tmp/gl" || { echo "FAIL: gles info gives no reason for the variant"; fails=$((fails + 1)); }
  FLASHATTN_GLES_FORWARD=tiled "$fa" info --backend gles >"$tmp/out" 2>&1
  grep -q "gles.forward.d64: tiled .* score blocks" "$tmp/out" || { echo "FAIL: gles info names no tiles"; cat "$tmp/out"; fails=$((fails + 1)); }
  expect_rc 0 "gles bench" "$fa" bench --backend gles --seq 64 --heads 2 --dim 32 --reps 3 --dtype f16
  grep -q "gles-flash-[a-z-]*f16pk  *[0-9]*x[0-9]" "$tmp/out" || { echo "FAIL: gles bench row"; cat "$tmp/out"; fails=$((fails + 1)); }
  # each variant the planner may pick, forced: its kernel in the row
  for v in tiled:gles-flash-tiled-f16pk rows:gles-flash-f16pk rows-tex:gles-flash-tex-f16pk; do
    if [ "${v%%:*}" = rows-tex ] && ! grep -q "gles.buffer_textures: GL_" "$tmp/gl"; then continue; fi
    FLASHATTN_GLES_FORWARD=${v%%:*} "$fa" bench --backend gles --seq 64 --heads 2 --dim 32 --reps 3 --dtype f16 >"$tmp/out" 2>&1
    grep -q "${v#*:}  *[0-9]*x[0-9]" "$tmp/out" || { echo "FAIL: gles bench row (${v%%:*} variant)"; cat "$tmp/out"; fails=$((fails + 1)); }
  done
  FLASHATTN_GLES_FORWARD=bogus "$fa" info --backend gles >"$tmp/out" 2>&1
  grep -q "FLASHATTN_GLES_FORWARD=bogus: use" "$tmp/out" || { echo "FAIL: a bad FLASHATTN_GLES_FORWARD is not named"; cat "$tmp/out"; fails=$((fails + 1)); }
  expect_rc 2 "gles check --backward (no backward there)" "$fa" check --backend gles --quick --backward
  for f in "--dropout 0.1" "--backward" "--dtype e4m3"; do # refused once, before any table
    expect_usage "gles bench $f" "$fa" bench --backend gles --seq 64 --heads 1 --dim 16 $f
  done
  # llvmpipe stops a shader's loops after 65535 iterations: a fused forward past that runs in
  # key chunks and is exact, and so do the standard's score and P V passes; its softmax pass
  # past it is refused with a message naming max_k, not answered wrong
  if grep -q "llvmpipe" "$tmp/gl"; then
    "$fa" bench --backend gles --seq-q 64 --seq 4096 --heads 1 --dim 192 --causal no --reps 1 >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne 0 ] || ! awk '$1 == "gles" { found = 1; if ($(NF - 3) + 0 > 1e-5) bad = 1 } END { exit !(found && !bad) }' "$tmp/out"; then
      echo "FAIL: 4096 keys at d192 on llvmpipe (key chunks): exit $rc, or flash not exact"; cat "$tmp/out" "$tmp/err"
      fails=$((fails + 1))
    fi
    if grep -q "standard skipped" "$tmp/err"; then
      echo "FAIL: 4096 keys at d192 on llvmpipe: the standard (in key chunks) was refused"; cat "$tmp/err"
      fails=$((fails + 1))
    fi
    # and a long key sequence in one dispatch is exact (20000 keys: the fused forward runs, the
    # standard's softmax pass walks a row's keys three times, past the limit, and is refused);
    # head_dim 32, whose program compiles in seconds
    "$fa" bench --backend gles --seq-q 64 --seq 20000 --heads 1 --dim 32 --causal no --reps 1 >"$tmp/out" 2>"$tmp/err"
    if ! awk '$1 == "gles" { found = 1; if ($(NF - 3) + 0 > 1e-5) bad = 1 } END { exit !(found && !bad) }' "$tmp/out"; then
      echo "FAIL: 20000 keys on llvmpipe: flash not exact"; cat "$tmp/out"; fails=$((fails + 1))
    fi
    grep -q "standard skipped .*max_k (20000 keys) at head_dim 32: the standard softmax pass.*llvmpipe" "$tmp/err" ||
      { echo "FAIL: llvmpipe's loop limit: the standard's refusal names no max_k or pass"; cat "$tmp/err"; fails=$((fails + 1)); }
  fi
  if grep -q "Mesa" "$tmp/gl"; then
    MESA_GLES_VERSION_OVERRIDE=3.0 "$fa" info --backend gles >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne 1 ] || ! grep -q "ES 3.1" "$tmp/err"; then
      echo "FAIL: an ES 3.0 context: exit $rc, want 1 and a message naming ES 3.1"; cat "$tmp/err"
      fails=$((fails + 1))
    fi
  fi
fi

expect_rc 0 "small bench" "$fa" bench --seq 64,100 --heads 2 --kv-heads 1 --dim 32 --causal both \
  --reps 3 --no-sgemm --json "$tmp/b.json" --plot "$tmp/b.svg"
rows=$(wc -l <"$tmp/b.json")
[ "$rows" -eq 4 ] || { echo "FAIL: bench wrote $rows JSON rows, want 4"; fails=$((fails + 1)); }
for field in backend kernel batch heads kv_heads seq_q seq_k head_dim dtype causal ms_flash \
  ms_standard speedup gflops bytes_flash bytes_standard max_abs_err mean_abs_err \
  frac_err_ge_1e3 rel_l2_err; do
  n=$(grep -c "\"$field\":" "$tmp/b.json")
  [ "$n" -eq 4 ] || { echo "FAIL: JSON field $field in $n of 4 rows"; fails=$((fails + 1)); }
done
# errors against float64 must be small and present
if grep -q '"max_abs_err":\(nan\|inf\)' "$tmp/b.json"; then echo "FAIL: non-finite error in bench"; fails=$((fails + 1)); fi
grep -q "<svg" "$tmp/b.svg" || { echo "FAIL: no SVG plot"; fails=$((fails + 1)); }
# fp8 inputs with descale factors per block of 5 rows: the error against float64 stays small
expect_rc 0 "fp8 bench with block factors" "$fa" bench --backend cpu --dtype e4m3 --descale-rows 5 --seq 70 \
  --heads 2 --dim 32 --causal yes --reps 3 --no-standard --no-sgemm --json "$tmp/f.json"
python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r["descale_rows"] == 5 and r["dtype"] == "e4m3" and r["rel_l2_err"] < 1e-2, r
' "$tmp/f.json" || { echo "FAIL: fp8 bench with block factors"; cat "$tmp/f.json"; fails=$((fails + 1)); }

# the serving suite on a tiny shape: the bandwidth of the run, rows with GB/s and their share
# of it, JSON lines that parse and carry every column
expect_rc 0 "bench --paged --help" "$fa" bench --paged --help
grep -q "usage: flashattn bench --paged" "$tmp/out" || { echo "FAIL: bench --paged --help prints no usage"; fails=$((fails + 1)); }
expect_rc 0 "bench --paged" "$fa" bench --paged --batch 2 --seq 100 --heads 4 --kv-heads 2 --dim 32 \
  --page-size 16,7 --mix 5 --reps 3 --json "$tmp/p.json"
grep -q "^read bandwidth (same run): [0-9.]* GB/s" "$tmp/out" || { echo "FAIL: bench --paged measures no bandwidth"; cat "$tmp/out"; fails=$((fails + 1)); }
n=$(awk '$1 == "cpu" && $14 ~ /^[0-9]+%$/ && $12 + 0 > 0 && $13 + 0 > 0 { n++ } END { print n + 0 }' "$tmp/out")
[ "$n" -eq 4 ] || { echo "FAIL: bench --paged printed $n of 4 rows with GB/s and %"; cat "$tmp/out"; fails=$((fails + 1)); }
python3 -c '
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 4, len(rows)
want = "backend kernel page_size batch seq_q mix seq_k heads kv_heads head_dim dtype threads warm ms ms_contiguous paged_over_contiguous bytes gbs bandwidth_gbs bandwidth_kind pct_bandwidth gflops workspace_bytes max_abs_err rel_l2_err err_pairs_checked err_pairs".split()
for r in rows:
    missing = [k for k in want if k not in r]
    assert not missing, missing
    assert r["gbs"] > 0 and r["pct_bandwidth"] > 0 and r["ms"] > 0 and r["ms_contiguous"] > 0
    assert math.isfinite(r["max_abs_err"]) and r["rel_l2_err"] < 1e-2, r
assert sorted((r["page_size"], r["mix"]) for r in rows) == [(7, 0), (7, 5), (16, 0), (16, 5)]
' "$tmp/p.json" || { echo "FAIL: bench --paged JSON rows"; cat "$tmp/p.json"; fails=$((fails + 1)); }
expect_usage "bench --paged --page-size 0" "$fa" bench --paged --page-size 0
expect_usage "bench --paged --seq-q 0" "$fa" bench --paged --seq-q 0
expect_usage "bench --paged --mix -1" "$fa" bench --paged --mix -1
expect_usage "bench --paged kv heads not dividing heads" "$fa" bench --paged --heads 6 --kv-heads 4
expect_usage "bench --paged --batch 1,,2" "$fa" bench --paged --batch 1,,2
expect_usage "bench --paged --dtype f64" "$fa" bench --paged --dtype f64
expect_usage "bench --paged --bogus" "$fa" bench --paged --bogus
# query rows are the last of the cached keys: more of them than keys has no meaning
expect_usage "bench --paged --seq-q past --seq" "$fa" bench --paged --heads 2 --dim 8 --seq 16 --batch 1 --seq-q 17
expect_usage "bench --paged --mix past --seq" "$fa" bench --paged --heads 2 --dim 8 --seq 16 --batch 1 --mix 17
expect_usage "bench --paged lists of more than 256 rows" "$fa" bench --paged --heads 2 --dim 8 \
  --page-size 1,2,3,4,5,6,7,8,9 --seq 16,17,18,19,20,21,22,23 --batch 1,2,3,4
expect_usage "bench --paged on gles" "$fa" bench --paged --backend gles
grep -q "paged" "$tmp/err" || { echo "FAIL: bench --paged on gles: the message names no paged calls"; cat "$tmp/err"; fails=$((fails + 1)); }
expect_rc 1 "bench --paged: pages past int32" "$fa" bench --paged --seq 16777216 --page-size 1 --batch 65536 --heads 1 --dim 1
grep -q "too large" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
  { echo "FAIL: bench --paged with 2^40 pages: want one line saying too large"; cat "$tmp/err"; fails=$((fails + 1)); }

expect_rc 0 "bench --backward" "$fa" bench --seq 80 --heads 2 --dim 16 --causal yes --backward \
  --reps 3 --no-sgemm --json "$tmp/bw.json"
for field in ms_backward ms_backward_standard gflops_backward dq_rel_l2_err dk_rel_l2_err dv_rel_l2_err; do
  grep -q "\"$field\":[0-9]" "$tmp/bw.json" || { echo "FAIL: backward JSON lacks $field"; fails=$((fails + 1)); }
done

# The Llama runner: the models README's greedy example, exactly (text and ids)
want="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.
Lily"
expect_rc 0 "generate greedy" "$fa" generate --prompt "Once upon a time" --steps 64 --temperature 0 --ids
[ "$(cat "$tmp/out")" = "$want" ] || { echo "FAIL: generate text differs:"; cat "$tmp/out"; fails=$((fails + 1)); }
grep -q "^ids: 1 403 407 261 378 432 383 .* 426 13 438 310$" "$tmp/err" || { echo "FAIL: generate ids"; cat "$tmp/err"; fails=$((fails + 1)); }
grep -q "^prompt tokens 5, prefill .* ms (.* tok/s) after a .* ms warm-up, decode .* tok/s" "$tmp/err" || { echo "FAIL: generate summary"; cat "$tmp/err"; fails=$((fails + 1)); }
# stdout and stderr on one file, as `make run` shows them: the text ends in a newline before
# the statistics
"$fa" generate --prompt "Once upon a time" --steps 64 --temperature 0 >"$tmp/both" 2>&1
[ "$(tail -n 2 "$tmp/both" | head -n 1)" = "Lily" ] && tail -n 1 "$tmp/both" | grep -q "^prompt tokens 5, prefill" ||
  { echo "FAIL: generate: the text and the statistics are not on lines of their own"; tail -n 3 "$tmp/both"; fails=$((fails + 1)); }
expect_rc 0 "generate sampled, chunked prefill" "$fa" generate --prompt "Lily" --steps 40 --temperature 0.8 --topp 0.9 --seed 7 --chunk 2
cp "$tmp/out" "$tmp/s1"
expect_rc 0 "generate sampled again" "$fa" generate --prompt "Lily" --steps 40 --temperature 0.8 --topp 0.9 --seed 7 --matvec blas
cmp -s "$tmp/out" "$tmp/s1" || { echo "FAIL: the same seed gave different text"; fails=$((fails + 1)); }
expect_rc 2 "generate negative steps" "$fa" generate --steps -1
expect_rc 2 "generate bad temperature" "$fa" generate --temperature -1
expect_rc 2 "generate bad topp" "$fa" generate --topp 2
expect_usage "generate on gles" "$fa" generate --backend gles
expect_usage "generate bad --graphs" "$fa" generate --graphs maybe
# the CUDA engine: where a device answers, greedy text with graphs equals the text without them;
# elsewhere one line saying there is no CUDA, exit 1
if "$fa" info --backend cuda >/dev/null 2>&1; then
  expect_rc 0 "generate on cuda" "$fa" generate --backend cuda --prompt "Once upon a time" --steps 64 --temperature 0 --ids
  cp "$tmp/out" "$tmp/g_on"; grep "^ids:" "$tmp/err" >"$tmp/g_on_ids"
  grep -q "graphs on ([1-9][0-9]* captured, [1-9][0-9]* steps replayed)" "$tmp/err" ||
    { echo "FAIL: generate on cuda replayed no graph"; cat "$tmp/err"; fails=$((fails + 1)); }
  expect_rc 0 "generate on cuda, graphs off" "$fa" generate --backend cuda --prompt "Once upon a time" --steps 64 --temperature 0 --ids --graphs off
  grep "^ids:" "$tmp/err" | cmp -s - "$tmp/g_on_ids" && cmp -s "$tmp/out" "$tmp/g_on" ||
    { echo "FAIL: generate on cuda: graphs on and off give different tokens"; fails=$((fails + 1)); }
  expect_rc 0 "generate on cuda, sampled, chunked" "$fa" generate --backend cuda --prompt "Lily" --steps 40 --temperature 0.8 --seed 7 --chunk 2
else
  for args in "generate --backend cuda --steps 8" "bench-serve --backend cuda --requests 2"; do
    expect_rc 1 "$args without a device" "$fa" $args
    grep -q "cuda" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
      { echo "FAIL: $args: want one line about cuda"; cat "$tmp/err"; fails=$((fails + 1)); }
  done
fi
expect_rc 2 "generate unknown flag" "$fa" generate --frob
expect_rc 2 "gen-model without --out" "$fa" gen-model --config 110m
expect_rc 2 "gen-model bad config" "$fa" gen-model --config 64x3x5x1x8x8x8 --out "$tmp/x.bin"
expect_rc 2 "bench-model bad config" "$fa" bench-model --config 12b
expect_rc 2 "bench-model --page-size 0" "$fa" bench-model --page-size 0
expect_rc 2 "bench-model --page-size without the engine" "$fa" bench-model --page-size 32
expect_rc 2 "bench-model --reps 0" "$fa" bench-model --batch 1 --reps 0
expect_rc 2 "bench-model --reps without the engine" "$fa" bench-model --reps 2
# engine rows whose pages an int32 cannot count: refused before any row, saying what to change
expect_rc 2 "bench-model pages past int32" "$fa" bench-model --config 64x1x2x1x128x64x128 --prompt-len 600000 \
  --decode 0 --batch 1,4096 --page-size 1 --threads 1
grep -q "larger --page-size" "$tmp/err" && [ ! -s "$tmp/out" ] ||
  { echo "FAIL: bench-model pages past int32: want the refusal and no rows"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1)); }
expect_rc 2 "generate missing model" "$fa" generate --model "$tmp/none.bin"
grep -q "none.bin" "$tmp/err" || { echo "FAIL: missing model not named"; fails=$((fails + 1)); }
# a FIFO or a directory as the model or the tokenizer: refused by name at once, never waited on
mkfifo "$tmp/fifo"
for args in "generate --model $tmp/fifo" "generate --tokenizer $tmp/fifo" "generate --tokenizer $tmp" \
  "bench-model --model $tmp/fifo --prompt-len 4 --decode 1"; do
  expect_rc 2 "$args" timeout 20 "$fa" $args
  grep -q "is not a regular file" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
    { echo "FAIL: $args: want one line saying not a regular file"; cat "$tmp/err"; fails=$((fails + 1)); }
done
# a synthetic checkpoint with tok512's vocabulary runs; a truncated copy is refused by name
expect_rc 0 "gen-model" "$fa" gen-model --config 32x2x4x2x48x512x64 --seed 3 --out "$tmp/s.bin"
expect_rc 0 "generate on a synthetic model" "$fa" generate --model "$tmp/s.bin" --prompt "hi" --steps 20 --temperature 0
head -c 1000 "$tmp/s.bin" >"$tmp/t.bin"
expect_rc 2 "generate on a truncated model" "$fa" generate --model "$tmp/t.bin"
grep -q "truncated" "$tmp/err" || { echo "FAIL: truncation not reported"; cat "$tmp/err"; fails=$((fails + 1)); }
[ -s "$tmp/out" ] && { echo "FAIL: output written on error"; fails=$((fails + 1)); }
expect_rc 0 "bench-model" "$fa" bench-model --config 64x2x4x2x96x512x64 --prompt-len 40 --decode 4
grep -q "^flash " "$tmp/out" && grep -q "^standard " "$tmp/out" || { echo "FAIL: bench-model rows"; cat "$tmp/out"; fails=$((fails + 1)); }
# the engine's rows: a row a batch size, medians of --reps passes, every decode step timed
expect_rc 0 "bench-model --batch" "$fa" bench-model --config 64x2x4x2x96x512x64 --prompt-len 40 --decode 4 \
  --batch 1,3 --reps 2 --no-standard
grep -q "medians of 2 passes" "$tmp/out" && grep -qE "^1 .* 0/8 " "$tmp/out" && grep -qE "^3 .* 0/8 " "$tmp/out" ||
  { echo "FAIL: bench-model --batch rows"; cat "$tmp/out"; fails=$((fails + 1)); }
# a Hugging Face export of stories260K generates the .bin's text; bad exports are refused
# (with tokenizer.json, which generate takes from the directory)
expect_rc 0 "export-hf" "$fa" export-hf --model "$(dirname "$0")/../models/stories260K.bin" --out "$tmp/hf" --shards 2 \
  --tokenizer "$(dirname "$0")/../models/tok512.bin"
expect_rc 0 "generate from an HF directory" "$fa" generate --model "$tmp/hf" --prompt "Once upon a time" --steps 40 --temperature 0 --ids
head -1 "$tmp/out" >"$tmp/hf.txt"
grep "^ids:" "$tmp/err" >"$tmp/hf.ids"
expect_rc 0 "generate from the .bin" "$fa" generate --prompt "Once upon a time" --steps 40 --temperature 0 --ids
head -1 "$tmp/out" | cmp -s - "$tmp/hf.txt" || { echo "FAIL: the HF export generates other text"; fails=$((fails + 1)); }
grep "^ids:" "$tmp/err" | cmp -s - "$tmp/hf.ids" || { echo "FAIL: the HF export generates other ids"; fails=$((fails + 1)); }
# the size check counts the files it will read: a stray sparse .safetensors beside them does
# not let a config of a huge vocabulary allocate its image
mkdir "$tmp/hfbig" && cp "$tmp/hf"/* "$tmp/hfbig/" && truncate -s 300G "$tmp/hfbig/stray.safetensors"
sed -i 's/"vocab_size":[[:space:]]*[0-9]*/"vocab_size": 2147483647/' "$tmp/hfbig/config.json"
expect_usage "generate from a directory with a stray sparse shard" "$fa" generate --model "$tmp/hfbig" --steps 3
grep -q "bytes of safetensors to read" "$tmp/err" || { echo "FAIL: a stray shard counted for the size check"; cat "$tmp/err"; fails=$((fails + 1)); }
# ... nor does a context of 2^31 positions (RoPE tables of 64 GiB in the image)
cp "$tmp/hf/config.json" "$tmp/hfbig/config.json" && rm "$tmp/hfbig/stray.safetensors"
sed -i 's/"max_position_embeddings":[[:space:]]*[0-9]*/"max_position_embeddings": 2147483647/' "$tmp/hfbig/config.json"
expect_usage "generate with max_position_embeddings 2^31 - 1" "$fa" generate --model "$tmp/hfbig" --steps 3
grep -q "GiB of RoPE tables" "$tmp/err" || { echo "FAIL: a huge context not refused before allocating"; cat "$tmp/err"; fails=$((fails + 1)); }
rm -rf "$tmp/hfbig"
expect_rc 0 "export-hf of an HF directory" "$fa" export-hf --model "$tmp/hf" --out "$tmp/hf2"
cmp -s "$tmp/hf/tokenizer.json" "$tmp/hf2/tokenizer.json" || { echo "FAIL: tokenizer.json not carried over"; fails=$((fails + 1)); }
sed -i 's/"BPE"/"Unigram"/' "$tmp/hf2/tokenizer.json"
expect_rc 2 "generate with a tokenizer.json it cannot read" "$fa" generate --model "$tmp/hf2"
grep -q "tokenizer.json': model.type" "$tmp/err" || { echo "FAIL: the refused tokenizer.json names no field"; cat "$tmp/err"; fails=$((fails + 1)); }
cp "$tmp/hf/tokenizer.json" "$tmp/tok.bin" # a tokenizer.json under another name: both readings said
expect_rc 2 "generate with a tokenizer.json named .bin" "$fa" generate --tokenizer "$tmp/tok.bin" --steps 3
grep -q "begins like JSON" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
  { echo "FAIL: a tokenizer.json named .bin: want one line saying it looks like JSON"; cat "$tmp/err"; fails=$((fails + 1)); }
expect_rc 0 "generate with --tokenizer over the directory's" "$fa" generate --model "$tmp/hf2" --tokenizer "$(dirname "$0")/../models/tok512.bin" --steps 5
# a JSON file of far more values than it can need is refused before it is parsed into a tree
python3 -c "import sys; sys.stdout.write('{\"x\":[' + ','.join(['0'] * 1000000) + ']}')" >"$tmp/many.json"
expect_usage "generate with a tokenizer.json of a million values" "$fa" generate --tokenizer "$tmp/many.json" --steps 3
grep -q "JSON values; what it describes needs at most" "$tmp/err" ||
  { echo "FAIL: a tokenizer.json of a million values parsed"; cat "$tmp/err"; fails=$((fails + 1)); }
# a tokenizer.json that is a dangling link is refused naming it, not replaced by the default
rm "$tmp/hf2/tokenizer.json" && ln -s nowhere.json "$tmp/hf2/tokenizer.json"
expect_usage "generate with a dangling tokenizer.json" "$fa" generate --model "$tmp/hf2" --steps 5
grep -q "hf2/tokenizer.json" "$tmp/err" || { echo "FAIL: a dangling tokenizer.json is not named"; cat "$tmp/err"; fails=$((fails + 1)); }
# a later export without a tokenizer takes the earlier one's tokenizer.json away (another model's)
expect_rc 0 "export-hf over an export" "$fa" export-hf --model "$(dirname "$0")/../models/stories260K.bin" --out "$tmp/hf2"
[ ! -e "$tmp/hf2/tokenizer.json" ] && grep -q "tokenizer.json, from another export, removed" "$tmp/out" ||
  { echo "FAIL: export-hf left another export's tokenizer.json"; cat "$tmp/out"; fails=$((fails + 1)); }
# an export never writes over the checkpoint it reads (mapped while it runs), by any name
cp "$(dirname "$0")/../models/stories260K.bin" "$tmp/hf2/config.json"
ln -s "$tmp/hf2/config.json" "$tmp/link.bin"
expect_usage "export-hf over its own checkpoint" "$fa" export-hf --model "$tmp/link.bin" --out "$tmp/hf2"
cmp -s "$(dirname "$0")/../models/stories260K.bin" "$tmp/hf2/config.json" ||
  { echo "FAIL: export-hf wrote over the checkpoint it read"; fails=$((fails + 1)); }
cp "$tmp/hf2/config.json" "$tmp/hf2/model-00002-of-00003.safetensors"
expect_usage "export-hf over its own checkpoint as a shard" "$fa" export-hf --model "$tmp/hf2/model-00002-of-00003.safetensors" \
  --out "$tmp/hf2" --shards 3
rm -f "$tmp/hf2/model-00002-of-00003.safetensors" "$tmp/link.bin"
# gen-model's failed write removes its partial file, never what --out named if not a file
if [ "$(id -u)" = 0 ] && mknod "$tmp/full" c 1 7 2>/dev/null; then
  expect_rc 1 "gen-model onto a full device" "$fa" gen-model --config 64x1x8x4x172x512x64 --out "$tmp/full"
  [ -c "$tmp/full" ] || { echo "FAIL: gen-model removed the device it could not write"; fails=$((fails + 1)); }
fi
# a file's text and the command line reach the error line with control characters escaped
cp -r "$tmp/hf" "$tmp/hf3"
sed -i 's/"model_type":[[:space:]]*"llama"/"model_type": "lla\\nma\\u001b[2J"/' "$tmp/hf3/config.json"
expect_usage "a config whose string holds a newline and an escape" "$fa" generate --model "$tmp/hf3"
grep -q 'lla\\nma\\x1b\[2J' "$tmp/err" || { echo "FAIL: control characters not escaped"; cat -v "$tmp/err"; fails=$((fails + 1)); }
expect_usage "an option with a newline" "$fa" generate $'--bo\ngus'
for args in "gen-model --config 64x1x8x4x172x512x64 --out" "bench --seq 64 --json" "bench-serve --requests 2 --json"; do
  expect_usage "$args ''" "$fa" $args ''
  grep -q "the file name is empty" "$tmp/err" || { echo "FAIL: $args '': want the empty name refused"; cat "$tmp/err"; fails=$((fails + 1)); }
done
for list in 1,2, '' 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17; do
  expect_usage "bench-model --batch '$list'" "$fa" bench-model --batch "$list"
done
expect_usage "bench-model --batch past seq_len" "$fa" bench-model --config 64x1x8x4x172x512x64 --prompt-len 8 --decode 1 \
  --batch 1,65
[ -s "$tmp/out" ] && { echo "FAIL: bench-model --batch past seq_len printed rows first"; fails=$((fails + 1)); }
expect_usage "bench --softcap past its range" "$fa" bench --softcap 1e38
expect_usage "bench-model with --model and --config" "$fa" bench-model --model "$(dirname "$0")/../models/stories260K.bin" \
  --config 64x1x8x4x172x512x64
expect_usage "generate with a hex temperature" "$fa" generate --temperature 0x10 --steps 2
# memory sized to the run, not to a context of 10^8 positions (51 s and 9 GB before)
expect_rc 0 "bench-serve on a model of a long context" timeout 30 "$fa" bench-serve --config 64x1x8x4x172x512x100000000 \
  --requests 2 --prompt-len 4,4 --output-len 2,2
expect_usage "bench-serve with no ids for prompts" "$fa" bench-serve --config 64x1x8x4x172x3x64 --requests 2
expect_usage "export-hf into a regular file" "$fa" export-hf --model "$(dirname "$0")/../models/stories260K.bin" \
  --out "$tmp/hf/config.json"
grep -q "exists and is not a directory" "$tmp/err" || { echo "FAIL: export-hf into a file"; cat "$tmp/err"; fails=$((fails + 1)); }
expect_usage "a config.json given as a checkpoint" "$fa" export-hf --model "$tmp/hf/config.json" --out "$tmp/y"
grep -q "begins like JSON" "$tmp/err" || { echo "FAIL: config.json as a checkpoint"; cat "$tmp/err"; fails=$((fails + 1)); }
expect_rc 1 "gen-model past the disk" "$fa" gen-model --config 4096x2147483647x32x32x11008x32000x4096 --out "$tmp/huge.bin"
grep -q "GiB free" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] && [ ! -e "$tmp/huge.bin" ] ||
  { echo "FAIL: gen-model past the disk: want one line and no file"; cat "$tmp/err"; fails=$((fails + 1)); }
expect_usage "export-hf without --out" "$fa" export-hf --model x.bin
expect_usage "export-hf bad dtype" "$fa" export-hf --model x.bin --out "$tmp/y" --dtype f8
expect_rc 2 "export-hf of a missing model" "$fa" export-hf --model "$tmp/none.bin" --out "$tmp/y"
sed -i 's/"silu"/"gelu"/' "$tmp/hf/config.json"
expect_rc 2 "generate from a config it cannot run" "$fa" generate --model "$tmp/hf"
grep -q "hidden_act" "$tmp/err" || { echo "FAIL: the refused config names no field"; cat "$tmp/err"; fails=$((fails + 1)); }

# continuous batching: a small served workload, its JSON, and its refusals
expect_rc 0 "bench-serve" "$fa" bench-serve --requests 12 --prompt-len 2,40 --output-len 4,30 --max-batch 4 \
  --token-budget 16 --pages 12 --arrival poisson --rate 500 --json "$tmp/serve.json"
grep -q "^time to first token ms: p50" "$tmp/out" && grep -q "^pages in use: mean" "$tmp/out" ||
  { echo "FAIL: bench-serve report"; cat "$tmp/out"; fails=$((fails + 1)); }
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["requests"]==12 and r["generated_tok_s"]>0 and len(r["itl_ms"])==3' \
  "$tmp/serve.json" || { echo "FAIL: bench-serve JSON"; fails=$((fails + 1)); }
expect_usage "bench-serve batch over budget" "$fa" bench-serve --max-batch 20 --token-budget 8
expect_usage "bench-serve --json in a missing directory" "$fa" bench-serve --requests 2 --json "$tmp/none/x.json"
expect_usage "bench --plot in a missing directory" "$fa" bench --seq 64 --plot "$tmp/none/x.svg"
expect_usage "bench --plot naming a directory" "$fa" bench --seq 64 --plot "$tmp"
expect_usage "bench --json in a missing directory" "$fa" bench --seq 64 --json "$tmp/none/x.json"
expect_usage "gen-model --out in a missing directory" "$fa" gen-model --config 8x1x1x1x8x512x16 --out "$tmp/none/x.bin"
# a full disk under standard output and under each output option: exit 1, one line naming the
# file and the reason (generate: no statistics of the text it lost)
if [ -c /dev/full ]; then
  for args in "--help" "--version" "bench --help" "generate --steps 20 --temperature 0" \
    "bench --seq 16 --heads 1 --dim 8 --no-sgemm --reps 1" "bench --seq 16 --heads 1 --dim 8 --no-sgemm --reps 1 --json -"; do
    "$fa" $args >/dev/full 2>"$tmp/err"
    rc=$?
    # (bench's title goes to stderr with --json -)
    if [ $rc -eq 1 ] && grep -q "writing the standard output failed: No space left on device" "$tmp/err" &&
      [ "$(grep -vc "^flashattn [0-9.]* bench: backend" "$tmp/err")" -eq 1 ]; then
      pass=$((pass + 1))
    else
      echo "FAIL: $args into a full disk: exit $rc, want 1 and one line naming stdout"; cat "$tmp/err"; fails=$((fails + 1))
    fi
  done
  for args in "bench --seq 64 --heads 2 --dim 16 --reps 1 --json" "bench --seq 64 --heads 2 --dim 16 --reps 1 --plot" \
    "bench-serve --requests 2 --prompt-len 4,4 --output-len 2,2 --json" "gen-model --config 8x1x1x1x8x8x8 --out"; do
    "$fa" $args /dev/full >/dev/null 2>"$tmp/err"
    rc=$?
    grep -q "cannot write --[a-z]* file '/dev/full': No space left on device" "$tmp/err" && [ $rc -eq 1 ] ||
      { echo "FAIL: $args /dev/full: exit $rc, want 1 and the reason"; cat "$tmp/err"; fails=$((fails + 1)); }
  done
fi
expect_usage "bench-serve arrivals past an hour" timeout 20 "$fa" bench-serve --requests 2 --arrival poisson --rate 1e-300
# a prompt longer than the context is refused by its token count (encoded in O(n log n): 0.03 s here)
head -c 60000 /dev/zero | tr '\0' 'a' >"$tmp/long.txt"
expect_rc 2 "generate with a prompt past the context" timeout 20 "$fa" generate --steps 5 --prompt "$(cat "$tmp/long.txt")"
grep -q "more than the model's context of 512" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
  { echo "FAIL: a prompt past the context: want one line naming the context"; cat "$tmp/err"; fails=$((fails + 1)); }
expect_usage "bench-serve empty range" "$fa" bench-serve --prompt-len 9,3
expect_usage "bench-serve cache too small" "$fa" bench-serve --pages 2
expect_usage "bench-serve past the context" "$fa" bench-serve --output-len 600,600
expect_usage "bench-serve on gles" "$fa" bench-serve --backend gles
expect_usage "bench-serve bad --graphs" "$fa" bench-serve --graphs 1
if "$fa" info --backend cuda >/dev/null 2>&1; then
  expect_rc 0 "bench-serve on cuda" "$fa" bench-serve --backend cuda --requests 12 --prompt-len 2,40 --output-len 4,30 \
    --max-batch 4 --token-budget 16 --pages 12 --json "$tmp/serve_cuda.json"
  grep -q "^engine: cuda on .*, graphs on" "$tmp/out" || { echo "FAIL: bench-serve on cuda report"; cat "$tmp/out"; fails=$((fails + 1)); }
fi

# output files are written whole or not at all: a write that fails (a file size limit stands in
# for a full disk) leaves the earlier file as it was and no temporary beside it, exit 1
no_partials() { # description, directory
  if ls -a "$2" | grep -q "\.partial$\|\.json\.\|\.bin\.\|\.svg\."; then
    echo "FAIL: $1: a temporary was left"; ls -a "$2"; fails=$((fails + 1))
  fi
}
mkdir "$tmp/w"
echo old >"$tmp/w/b.json"
echo old >"$tmp/w/g.bin"
(trap '' XFSZ; ulimit -f 1; exec "$fa" bench --seq 16,24,32,40,48 --heads 1 --dim 8 --no-sgemm --reps 1 \
  --json "$tmp/w/b.json" >/dev/null 2>"$tmp/err")
rc=$?
[ $rc -eq 1 ] && [ "$(cat "$tmp/w/b.json")" = old ] && grep -q "cannot write --json file '.*b.json': File too large" "$tmp/err" ||
  { echo "FAIL: bench --json past the file size limit: exit $rc"; cat "$tmp/err"; fails=$((fails + 1)); }
echo old >"$tmp/w/p.json"
(trap '' XFSZ; ulimit -f 1; exec "$fa" bench --paged --heads 2 --dim 8 --seq 16,32,48,64,80,96 --batch 1,2,3 \
  --reps 1 --warm --json "$tmp/w/p.json" >/dev/null 2>"$tmp/err")
rc=$?
[ $rc -eq 1 ] && [ "$(cat "$tmp/w/p.json")" = old ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
  { echo "FAIL: bench --paged --json past the file size limit: exit $rc"; cat "$tmp/err"; fails=$((fails + 1)); }
expect_usage "bench --dropout 1 as a float32" "$fa" bench --seq 16 --heads 1 --dim 8 --no-sgemm --dropout 0.999999999
expect_usage "bench --softcap 0 as a float32" "$fa" bench --seq 16 --heads 1 --dim 8 --no-sgemm --softcap 1e-320
expect_usage "generate --temperature past float" "$fa" generate --temperature 1e39
(trap '' XFSZ; ulimit -f 64; exec "$fa" gen-model --config 64x2x4x2x96x512x64 --out "$tmp/w/g.bin" >/dev/null 2>"$tmp/err")
rc=$?
[ $rc -eq 1 ] && [ "$(cat "$tmp/w/g.bin")" = old ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
  { echo "FAIL: gen-model past the file size limit: exit $rc"; cat "$tmp/err"; fails=$((fails + 1)); }
no_partials "bench and gen-model past the file size limit" "$tmp/w"
# an export that fails (past the limit, or a directory where a file goes) leaves the earlier one whole
expect_rc 0 "export-hf to replace" "$fa" export-hf --model "$(dirname "$0")/../models/stories260K.bin" --out "$tmp/w/hf" \
  --tokenizer "$(dirname "$0")/../models/tok512.bin"
(cd "$tmp/w/hf" && cksum config.json model.safetensors tokenizer.json) >"$tmp/w/sums"
(trap '' XFSZ; ulimit -f 64; exec "$fa" export-hf --model "$(dirname "$0")/../models/stories260K.bin" --out "$tmp/w/hf" \
  --tokenizer "$(dirname "$0")/../models/tok512.bin" --shards 2 >/dev/null 2>"$tmp/err")
rc=$?
[ $rc -eq 1 ] && grep -q "File too large" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
  { echo "FAIL: export-hf past the file size limit: exit $rc, want 1"; cat "$tmp/err"; fails=$((fails + 1)); }
mkdir "$tmp/w/hf/model-00002-of-00002.safetensors"
expect_usage "export-hf with a directory where a shard goes" "$fa" export-hf \
  --model "$(dirname "$0")/../models/stories260K.bin" --out "$tmp/w/hf" --shards 2
grep -q "model-00002-of-00002.safetensors' is in the way" "$tmp/err" ||
  { echo "FAIL: export-hf: the file in the way is not named"; cat "$tmp/err"; fails=$((fails + 1)); }
rmdir "$tmp/w/hf/model-00002-of-00002.safetensors"
(cd "$tmp/w/hf" && cksum config.json model.safetensors tokenizer.json) | cmp -s - "$tmp/w/sums" &&
  [ "$(ls "$tmp/w/hf" | wc -l)" -eq 3 ] || { echo "FAIL: a failed export-hf changed the earlier one"; ls -a "$tmp/w/hf"; fails=$((fails + 1)); }
no_partials "a failed export-hf" "$tmp/w/hf"
# a run stopped by a signal (^C one second into a run of many seconds) leaves no temporary either
timeout -s INT 1 "$fa" bench --seq 2048,2049,2050,2051,2052,2053,2054,2055 --heads 8 --dim 64 --no-sgemm \
  --reps 20 --json "$tmp/w/b.json" >/dev/null 2>&1
[ "$(cat "$tmp/w/b.json")" = old ] || { echo "FAIL: bench stopped by SIGINT replaced its --json file"; fails=$((fails + 1)); }
no_partials "bench stopped by SIGINT" "$tmp/w"
# an output that is a FIFO would block the run: refused at once; /dev/null is written
for args in "gen-model --config 8x1x1x1x8x8x8 --out" "bench --seq 16 --json" "bench --seq 16 --plot" "bench-serve --json"; do
  expect_usage "$args FIFO" timeout 20 "$fa" $args "$tmp/fifo"
  grep -q "is a FIFO, not a regular file" "$tmp/err" || { echo "FAIL: $args FIFO: not named"; cat "$tmp/err"; fails=$((fails + 1)); }
done
expect_rc 0 "gen-model into /dev/null" "$fa" gen-model --config 8x1x1x1x8x8x8 --out /dev/null
# --json and --plot on one file: refused, by any name of it
for plot in "$tmp/w/same.out" "$tmp/w/../w/same.out"; do
  expect_usage "bench --json and --plot on one file" "$fa" bench --seq 16 --json "$tmp/w/same.out" --plot "$plot"
done
[ -e "$tmp/w/same.out" ] && { echo "FAIL: bench wrote the file its --json and --plot share"; fails=$((fails + 1)); }
# bench-serve --json -: standard output is the JSON object alone, the report on stderr; a file
# holds one object after two runs
expect_rc 0 "bench-serve --json -" "$fa" bench-serve --requests 2 --prompt-len 4,4 --output-len 2,2 --json -
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["requests"] == 2' "$tmp/out" &&
  grep -q "^throughput: " "$tmp/err" || { echo "FAIL: bench-serve --json - mixes the report into the JSON"; cat "$tmp/out"; fails=$((fails + 1)); }
for run in 1 2; do
  "$fa" bench-serve --requests 2 --prompt-len 4,4 --output-len 2,2 --json "$tmp/w/s.json" >/dev/null 2>&1
done
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/w/s.json" ||
  { echo "FAIL: bench-serve --json: two runs leave more than one object"; cat "$tmp/w/s.json"; fails=$((fails + 1)); }
# a closed standard output does not send the table into the --json file
(exec "$fa" bench --seq 16 --heads 1 --dim 8 --no-sgemm --reps 1 --json "$tmp/w/cl.json" >&- 2>/dev/null)
python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2, len(rows)' "$tmp/w/cl.json" || { echo "FAIL: closed stdout: the --json file holds other text"; cat "$tmp/w/cl.json"; fails=$((fails + 1)); }

# EGL and GLES are loaded at run time: with libEGL.so.1 hidden (a private mount namespace,
# where the machine allows one) the CPU backend runs and the GLES one says what to install
egl=$(ldconfig -p 2>/dev/null | awk '/libEGL.so.1 .*x86-64|libEGL.so.1 .*AArch64/ { print $NF; exit }')
# (not in sanitizer builds, which link them)
if grep -q "gles  built" <("$fa" info 2>&1) && [ -n "$egl" ] && ! ldd "$fa" 2>/dev/null | grep -q "libEGL.so.1" &&
  unshare --mount true 2>/dev/null; then
  before=$fails
  unshare --mount sh -c "mount --bind /dev/null '$egl' && '$fa' info" >"$tmp/out" 2>&1
  grep -q "gles  built, not usable here: libEGL.so.1 could not be loaded .*(Debian: libegl1 libgles2)" "$tmp/out" ||
    { echo "FAIL: without libEGL.so.1, info does not say what to install"; cat "$tmp/out"; fails=$((fails + 1)); }
  unshare --mount sh -c "mount --bind /dev/null '$egl' && '$fa' bench --seq 64 --heads 1 --dim 32 --reps 1" \
    >"$tmp/out" 2>&1 || { echo "FAIL: without libEGL.so.1 the CPU bench does not run"; cat "$tmp/out"; fails=$((fails + 1)); }
  [ "$fails" -eq "$before" ] && pass=$((pass + 1))
fi

echo "cli: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
