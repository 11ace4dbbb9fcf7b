#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Whether the Hopper forward's softmax runs beside the tensor cores, from the SASS.

In every key tile, a consumer warpgroup issues S(n) = Q K(n)^T and P(n-1) V(n-1), waits for
S(n) alone (WARPGROUP.DEPBAR.LE gsb0, 0x1), turns it into P(n), and only then waits for the
product (WARPGROUP.DEPBAR.LE gsb0, 0x0). ptxas may move that second wait up: after a branch
(the mask's, the softcap's) it puts it at the top of the block that joins it, and the softmax
then waits for P(n-1) V(n-1) (docs/perf/h200.md, "the softmax beside P V"). This script finds,
in each sm_90a flash_forward_sm90_ws kernel but fp8's, the first DEPBAR.LE 0x1 and counts the
softmax's row maxima (FMNMX) and exponentials (MUFU.EX2) on the path from it to the next
DEPBAR.LE 0x0, following unconditional branches and stepping over the mask's arm, as a key
tile without a mask runs.

    bench/gpu/sass_overlap.py build/libflashattn.so     (or an object file; needs cuobjdump)

Exit status 1 when a kernel's unmasked key tile waits for P V before its softmax.
"""
import argparse
import re
import shutil
import subprocess
import sys

INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def kernels(sass):
    for part in sass.split("Function : ")[1:]:
        name = part.split("\n", 1)[0].strip()
        ops = [(int(m.group(1), 16), m.group(2)) for m in INS.finditer(part)]
        yield name, ops


def walk(ops, start, budget=4000):
    """Instructions from index start to the next DEPBAR.LE 0x0 along an unmasked key tile's
    path: unconditional branches followed, a conditional one taken where the code it would
    fall into is the mask's (ISETP / FSEL, no FMNMX)."""
    at = {a: i for i, (a, _) in enumerate(ops)}
    i, seen = start, []
    while i < len(ops) and budget > 0:
        budget -= 1
        a, op = ops[i]
        if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in op:
            return seen, True
        m = re.match(r"(@!?U?P\w+\s+)?BRA(\.\w+)*\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)", op)
        if m and not op.startswith("BRA.DIV"):
            target = int(m.group(3), 16)
            if m.group(1) is None and target in at:  # unconditional
                i = at[target]
                continue
            # conditional: the mask's test (softmax_step) jumps over the mask's arm, the
            # softcap's (to_logits) to its tanh arm; taken where the mask's arm follows
            nxt = [o for _, o in ops[i + 1:i + 40]]
            if target in at and target > a and sum("ISETP" in o for o in nxt) > 8 \
                    and not any("FMNMX" in o for o in nxt[:20]):
                i = at[target]
                continue
        seen.append(op)
        i += 1
    return seen, False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary", help="libflashattn.so or an object file with the sm_90a image")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = ap.parse_args()
    try:
        sass = subprocess.run([args.cuobjdump, "-sass", args.binary], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"sass_overlap.py: cannot disassemble {args.binary}: {e} (cuobjdump and nvdisasm of the CUDA "
              "toolkit on PATH, or --cuobjdump)", file=sys.stderr)
        return 2
    bad = checked = 0
    for name, ops in kernels(sass):
        if "flash_forward_sm90_ws" not in name or "e4m3" in name:
            continue
        for i, (_, op) in enumerate(ops):
            if "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in op:
                continue
            path, found = walk(ops, i + 1)
            mx = sum(o.startswith("FMNMX") for o in path)
            ex = sum(o.startswith("MUFU.EX2") for o in path)
            ok = found and mx >= 16 and ex >= 16
            checked += 1
            bad += not ok
            short = re.sub(r"^_ZN2fa21flash_forward_sm90_wsINS_13sm90_mainloopI", "", name)[:60]
            print(f"{'ok  ' if ok else 'LATE'} {short}: {mx} FMNMX, {ex} MUFU.EX2 before the wait for P V")
            break
    if checked == 0:
        print("sass_overlap.py: no Hopper forward kernel found", file=sys.stderr)
        return 2
    print(f"{checked - bad} of {checked} kernels run the softmax beside P V")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
