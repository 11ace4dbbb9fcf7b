# SPDX-License-Identifier: MIT
"""Emulates, in float64 on the CPU, the error of one attention row against float64 for the two
ways the CUDA backend sums P V: the standard algorithm's float32 FMAs over normalised f16 P, and
the flash kernels' tensor-core accumulators (unnormalised f16 P, 16 keys a step added to an
accumulator kept to --bits significant bits, rounded toward zero). Inputs as test_fuzz draws
them for a float32 output: q, k, v uniform in [-1, 1] rounded to f16, v's element 0 made
non-negative, scale 1 / sqrt(dim). Prints the largest error over --rows rows per trial.

  python3 bench/gpu/accum_emulation.py [--keys 3727] [--dim 9] [--rows 24] [--trials 4]
"""
import argparse

import numpy as np


def trunc_bits(x, bits):
    m, e = np.frexp(x)
    s = 2.0 ** bits
    return np.ldexp(np.trunc(m * s) / s, e)


def trial(rng, n, d, rows, bits_list):
    f16 = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    k = f16(rng.uniform(-1, 1, (n, d)))
    v = f16(rng.uniform(-1, 1, (n, d)))
    v[:, 0] = np.abs(v[:, 0])
    flash = {b: 0.0 for b in bits_list}
    standard = 0.0
    for _ in range(rows):
        q = f16(rng.uniform(-1, 1, d))
        s = k @ q / np.sqrt(d)
        p = np.exp(s - s.max())
        ref = (p @ v) / p.sum()
        l = float(np.float32(p.sum()))
        ph = f16(p.astype(np.float32))
        for b in bits_list:
            acc = np.zeros(d)
            for j in range(0, n, 16):
                acc = trunc_bits(acc + (ph[j:j + 16, None] * v[j:j + 16]).sum(0), b)
            flash[b] = max(flash[b], float(np.abs(acc / l - ref).max()))
        acc = np.zeros(d, np.float32)
        for pj, vj in zip(f16((p / l).astype(np.float32)), v):
            acc = (acc + np.float32(pj) * vj.astype(np.float32)).astype(np.float32)
        standard = max(standard, float(np.abs(acc - ref).max()))
    return standard, flash


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=3727)
    ap.add_argument("--dim", type=int, default=9)
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    if min(args.keys, args.dim, args.rows, args.trials) < 1:
        ap.error("--keys, --dim, --rows and --trials must be at least 1")
    rng = np.random.default_rng(args.seed)
    bits = [24, 23, 22, 21]
    print(f"keys {args.keys}, dim {args.dim}, {args.rows} rows a trial, seed {args.seed}")
    for _ in range(args.trials):
        standard, flash = trial(rng, args.keys, args.dim, args.rows, bits)
        print(f"standard {standard:.2g} | " + "  ".join(f"{b} bits {e:.2g}" for b, e in flash.items()))


if __name__ == "__main__":
    main()
