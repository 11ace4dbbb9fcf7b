#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Python package's call overhead over the C call, CPU, the smallest problem (b1 s1 h1 d8
# float32): the C call alone (bench/call_overhead.c against BUILD's libflashattn), the
# binding (flashattn._C.forward, output preallocated) and flash_attn_func (its output
# allocated by numpy). Needs `pip install .` done.   bench/call_overhead.sh [BUILD]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
cc -O2 "$here/call_overhead.c" -I"$here/../include" -L"$build" -lflashattn -Wl,-rpath,"$build" -o /tmp/fa_call_overhead
/tmp/fa_call_overhead
python3 - <<'PY'
import statistics, timeit
import numpy as np
import flashattn
q = np.random.rand(1, 1, 1, 8).astype(np.float32)
o = np.empty_like(q)
calls = {
    "flashattn._C.forward": lambda: flashattn._C.forward(q, q, q, o, None, None, None, 0, 0, 0.0, False, -1, -1,
                                                         0.0, 0.0, 0, 0, 0, False),
    "flash_attn_func": lambda: flashattn.flash_attn_func(q, q, q),
}
for name, fn in calls.items():
    fn()
    t = statistics.median(timeit.repeat(fn, number=20000, repeat=9)) / 20000
    print(f"{name}: {t * 1e6:.2f} us per call")
PY
