# SPDX-License-Identifier: MIT
"""flashattn.PagedPlan from numpy on the CPU: a decode loop of several steps against a
float64 reference, calls beyond the bounds refused with the library's message, and bad
arguments raising ValueError (docs/python.md's example runs in test_docs.py)."""
import os

import numpy as np
import pytest

import flashattn
from test_numpy import reference, rope_ref

SEED = int(os.environ.get("FLASHATTN_TEST_SEED", "20261202"))


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def rope_tables(max_pos, rotary_dim):
    ang = np.arange(max_pos)[:, None] * 10000.0 ** (-np.arange(rotary_dim // 2) * 2.0 / rotary_dim)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def test_decode_loop():
    """Three sequences in shuffled pages of 16: a prefill chunk each, then decode steps; every
    step's output against float64 attention over the rotated keys appended so far."""
    rng = np.random.default_rng(SEED + 20)
    print(f"test_decode_loop: seed {SEED + 20}")
    b, hq, hk, d, page, pages_per = 3, 8, 2, 32, 16, 4
    kc, vc = np.zeros((b * pages_per, page, hk, d), np.float32), np.zeros((b * pages_per, page, hk, d), np.float32)
    table = rng.permutation(b * pages_per).astype(np.int32).reshape(b, pages_per)
    cos, sin = rope_tables(64, d)
    plan = flashattn.PagedPlan(batch=b, total_q=16, max_seqlen_q=8, max_seqlen_k=pages_per * page, num_heads_q=hq,
                               num_heads_kv=hk, head_dim=d, page_size=page, rotary="neox", return_lse=True,
                               causal=True)
    info = plan.info()
    assert info["backend"] == "cpu" and info["kernel"]
    keys = [np.zeros((0, hk, d)) for _ in range(b)]
    vals = [np.zeros((0, hk, d)) for _ in range(b)]
    lens = np.zeros(b, np.int32)
    for step, rows in enumerate([[5, 8, 3], [1, 1, 1], [1, 1, 1], [2, 1, 0]]):
        cu = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
        tq = int(cu[-1])
        q, kn, vn = rand(rng, tq, hq, d), rand(rng, tq, hk, d), rand(rng, tq, hk, d)
        out, lse = plan.run(q, kc, vc, table, lens, cu, kn, vn, cos, sin)
        assert out.shape == q.shape and lse.shape == (hq, tq)
        for s in range(b):
            r = slice(cu[s], cu[s + 1])
            pos = lens[s] + np.arange(rows[s])
            keys[s] = np.concatenate([keys[s], rope_ref(kn[r], pos, cos, sin, False)])
            vals[s] = np.concatenate([vals[s], vn[r]])
            if not rows[s]:
                continue
            qr = rope_ref(q[r], pos, cos, sin, False)
            ro, rl = reference(qr[None], keys[s][None], vals[s][None], causal=True)
            assert np.max(np.abs(out[r] - ro[0])) < 3e-5, (step, s)
            assert np.max(np.abs(lse[:, r] - rl[0])) < 3e-5, (step, s)
        lens += np.array(rows, np.int32)
    plan.close()
    with pytest.raises(ValueError, match="closed"):
        plan.run(q, kc, vc, table, lens, cu, kn, vn, cos, sin)


def test_bounds_refused():
    rng = np.random.default_rng(SEED + 21)
    hq, hk, d, page = 4, 2, 16, 8
    plan = flashattn.PagedPlan(batch=2, total_q=4, max_seqlen_q=2, max_seqlen_k=32, num_heads_q=hq,
                               num_heads_kv=hk, head_dim=d, page_size=page, append=False)
    kc, vc = rand(rng, 8, page, hk, d), rand(rng, 8, page, hk, d)
    table = np.arange(8, dtype=np.int32).reshape(2, 4)
    lens = np.array([10, 20], np.int32)
    q = rand(rng, 4, hq, d)
    out = plan.run(q, kc, vc, table, lens, np.array([0, 2, 4], np.int32))
    for s in range(2):
        keys = np.concatenate([kc[table[s, j // page], j % page][None] for j in range(lens[s])])
        vals = np.concatenate([vc[table[s, j // page], j % page][None] for j in range(lens[s])])
        ro, _ = reference(q[None, 2 * s:2 * s + 2], keys[None], vals[None])
        assert np.max(np.abs(out[2 * s:2 * s + 2] - ro[0])) < 2e-5
    with pytest.raises(ValueError, match=r"batch \(3\) exceeds the plan's bound \(2\)"):
        plan.run(rand(rng, 3, hq, d), kc, vc, np.arange(9, dtype=np.int32).reshape(3, 3) % 8,
                 np.array([1, 1, 1], np.int32), np.array([0, 1, 2, 3], np.int32))
    with pytest.raises(ValueError, match=r"total_q \(6\) exceeds the plan's bound \(4\)"):
        plan.run(rand(rng, 6, hq, d), kc, vc, table, lens, np.array([0, 2, 4], np.int32))
    with pytest.raises(ValueError, match="max_seqlen_q"):  # a sequence of 3 query rows, bound 2
        plan.run(q, kc, vc, table, lens, np.array([0, 3, 4], np.int32))
    with pytest.raises(ValueError, match="num_heads_q"):
        plan.run(rand(rng, 4, 2 * hq, d), kc, vc, table, lens, np.array([0, 2, 4], np.int32))
    with pytest.raises(ValueError, match="does not append"):
        plan.run(q, kc, vc, table, lens, np.array([0, 2, 4], np.int32), rand(rng, 4, hk, d), rand(rng, 4, hk, d))
    with pytest.raises(ValueError, match="rotary"):
        cos, sin = rope_tables(8, d)
        plan.run(q, kc, vc, table, lens, np.array([0, 2, 4], np.int32), rotary_cos=cos, rotary_sin=sin)
    with pytest.raises(ValueError, match="cache.dtype"):
        plan.run(q.astype(np.float16), kc.astype(np.float16), vc.astype(np.float16), table, lens,
                 np.array([0, 2, 4], np.int32))


@pytest.mark.parametrize("bad, match", [
    (dict(batch=0), "batch"),
    (dict(batch=1.5), "batch"),
    (dict(num_heads_q=3), "num_heads_q"),
    (dict(head_dim=0), "head_dim"),
    (dict(page_size=0), "page_size"),
    (dict(max_seqlen_k=-1), "max_seqlen_k"),
    (dict(dtype="int8"), "dtype"),
    (dict(dtype=np.int16), "dtype"),
    (dict(device="tpu"), "device"),
    (dict(rotary="yarn"), "rotary"),
    (dict(rotary=[]), "rotary"),
    (dict(rotary_dim=8), "rotary_dim"),
    (dict(window_size=(True, False)), "window_size"),
    (dict(causal="yes"), "causal"),
    (dict(rotary="neox", rotary_dim=3), "rope_dim"),
    (dict(kv_split=10), "kv_split"),
    (dict(softmax_scale=0.0), "softmax_scale"),
    (dict(window_size=(1,)), "window_size"),
    (dict(append="yes"), "append"),
])
def test_bad_plan(bad, match):
    args = dict(batch=2, total_q=2, max_seqlen_q=1, max_seqlen_k=64, num_heads_q=4, num_heads_kv=2, head_dim=16,
                page_size=16)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        flashattn.PagedPlan(**args)


def test_plan_dtype_forms():
    """dtype as a string, a numpy dtype or a numpy scalar type alike."""
    for dt in ("float16", np.dtype(np.float16), np.float16):
        plan = flashattn.PagedPlan(batch=1, total_q=1, max_seqlen_q=1, max_seqlen_k=16, num_heads_q=2,
                                   num_heads_kv=2, head_dim=16, page_size=16, dtype=dt)
        plan.close()


def test_plan_closed_while_running():
    """A plan closed by one thread while another runs it: the runner's error says so."""
    import threading
    kc = np.zeros((8, 16, 2, 64), np.float32)
    bt, lens = np.arange(8, dtype=np.int32).reshape(2, 4), np.array([50, 50], np.int32)
    cu, q = np.array([0, 2, 4], np.int32), np.zeros((4, 4, 64), np.float32)
    errors = []
    for _ in range(5):
        plan = flashattn.PagedPlan(batch=2, total_q=4, max_seqlen_q=2, max_seqlen_k=64, num_heads_q=4,
                                   num_heads_kv=2, head_dim=64, page_size=16, append=False)

        def loop():
            try:
                while True:
                    plan.run(q, kc, kc, bt, lens, cu)
            except ValueError as e:
                errors.append(str(e))

        t = threading.Thread(target=loop)
        t.start()
        plan.close()
        t.join()
    assert errors and all(e == "flashattn: the plan is closed" for e in errors), errors


def test_plan_out_of_memory():
    """A CPU run whose thread buffers do not fit: MemoryError with the library's message, the
    cache untouched."""
    plan = flashattn.PagedPlan(batch=2 ** 31 - 1, total_q=2 ** 31 - 1, max_seqlen_q=2 ** 31 - 1,
                               max_seqlen_k=2 ** 31 - 1, num_heads_q=4, num_heads_kv=2, head_dim=8, page_size=4,
                               append=False)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if plan.info()["workspace_bytes"] < 2 * memory:  # the kernel's overcommit may grant it
        pytest.skip(f"{plan.info()['workspace_bytes']} bytes of workspace may fit in {memory} bytes of memory")
    kc = np.ones((2, 4, 2, 8), np.float32)
    with pytest.raises(MemoryError, match="out of memory allocating"):
        plan.run(np.zeros((1, 4, 8), np.float32), kc, kc, np.zeros((1, 2), np.int32), np.array([4], np.int32),
                 np.array([0, 1], np.int32))
    assert (kc == 1).all()
