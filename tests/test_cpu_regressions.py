"""Regressions of the CPU kernels found by the audit of issue 14 (aliasing, overflow, misuse).

Each test pins one defect that once gave a silently wrong result, a NaN, a hang or an
O(L·S) allocation.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("numba")

from softmaxtheory import reference, testing
from softmaxtheory.accelerated import cpu
from softmaxtheory.spec import Constant, LogLength, Polynomial, Schedule
from softmaxtheory.testing import assert_attention_close

INF = np.inf
#: the audit's row: β ≠ 1 under the paper's schedule
AUDIT_ROW = np.array([3.0, 1, 0, 0, -1, 2])


def _python(script: str, *args: str, env: dict | None = None, timeout: float = 600):
    """Run `script` in a fresh interpreter (``python -c``); assert it succeeds, return it."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True,
        timeout=timeout, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# ---------------------------------------------------------------------------
# 1. out aliasing the input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [6, 2000, cpu.CHUNK + 5])
@pytest.mark.parametrize("func", ["softmax", "adaptive_softmax"])
def test_out_is_x_gives_the_out_of_place_result(dtype, n, func) -> None:
    """``out=x`` (in place) gives the result of a separate output, bit for bit."""
    rng = np.random.default_rng(n)
    x = rng.normal(scale=2.0, size=(3, n)).astype(dtype)
    x[:, :6] = AUDIT_ROW
    x[:, 6:50] -= 6.0  # keep β ≠ 1 for the longer rows
    if n > 6:
        x[:, 50:] = -40.0
    f = getattr(cpu, func)
    expected = f(x.copy())
    y = x.copy()
    got = f(y, out=y)
    assert got is y
    np.testing.assert_array_equal(y, expected)


def test_out_is_x_audit_row() -> None:
    """The audit's example: in place gives the adaptive probabilities, not a re-softmax."""
    y = AUDIT_ROW.copy()
    cpu.adaptive_softmax(y, out=y)
    np.testing.assert_allclose(y, reference.adaptive_softmax(AUDIT_ROW), rtol=1e-13)


@pytest.mark.parametrize("func", ["softmax", "adaptive_softmax"])
@pytest.mark.parametrize("shift", [1, 3, -2])
def test_partially_overlapping_out(func, shift) -> None:
    """An `out` that overlaps `x` partially gives the result for the original `x`."""
    n = 40
    buf = np.random.default_rng(1).normal(scale=3.0, size=n + 8)
    lo = 4
    x = buf[lo : lo + n]
    out = buf[lo + shift : lo + shift + n]
    f = getattr(cpu, func)
    expected = f(x.copy())
    got = f(x, out=out)
    assert got is out
    np.testing.assert_array_equal(out, expected)


def test_aliasing_along_another_axis() -> None:
    """Aliasing through a transposed view (the non-direct path) is also correct."""
    x = np.random.default_rng(2).normal(scale=3.0, size=(5, 7))
    expected = cpu.adaptive_softmax(x.copy(), axis=0)
    cpu.adaptive_softmax(x, axis=0, out=x)
    np.testing.assert_array_equal(x, expected)


# ---------------------------------------------------------------------------
# 2. merging states whose maxima differ by more than the float maximum
# ---------------------------------------------------------------------------


def test_long_row_with_chunk_maxima_beyond_the_float_range() -> None:
    """Chunks at 1e308 and -1e308: finite entropy and probabilities (reference 11.09)."""
    z = np.r_[np.full(cpu.CHUNK, 1e308), np.full(10, -1e308)]
    h = float(cpu.entropy(z))
    assert h == pytest.approx(float(reference.entropy(z)), rel=1e-13)
    p = cpu.adaptive_softmax(z)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p[: cpu.CHUNK], 1.0 / cpu.CHUNK, rtol=1e-13)
    assert np.all(p[cpu.CHUNK :] == 0.0)
    flipped = z[::-1].copy()
    assert float(cpu.entropy(flipped)) == pytest.approx(h, rel=1e-13)


@pytest.mark.parametrize("order", [(1e308, -1e308), (-1e308, 1e308)])
def test_stream_with_maxima_beyond_the_float_range(order) -> None:
    """``update([1e308]).update([-1e308])`` (either order) finishes with the right answer."""
    state = cpu.StreamingSoftmax()
    for v in order:
        state.update([v])
    assert state.entropy() == 0.0
    assert state.beta() == 1.0 and not state.needs_tempered_pass
    assert state.n_eff == 2
    assert state.normalize([1e308]).tolist() == [1.0]
    assert state.normalize([-1e308]).tolist() == [0.0]


def test_item_whose_shift_overflows_still_counts() -> None:
    """x − m = −inf by overflow is an unmasked item: n_eff (LogLength's β) counts it."""
    x = np.array([1e308, -1e308, 1e308])
    sched = LogLength("0.5")
    assert float(cpu.beta(x, schedule=sched)) == float(reference.beta(x, schedule=sched))
    state = cpu.StreamingSoftmax(sched).update(x)
    assert state.n_eff == 3
    long = np.r_[np.full(cpu.CHUNK, -1e308), [1e308]]
    assert float(cpu.beta(long, schedule=sched)) == float(reference.beta(long, schedule=sched))


# ---------------------------------------------------------------------------
# 3, 4. attention logits: infinite keys, logits beyond the float range
# ---------------------------------------------------------------------------


def test_attention_infinite_key_gives_nan() -> None:
    """A key with ``+inf`` makes every query that sees it NaN (reference and torch)."""
    q = np.array([[1.0, 0], [-1, 0]])
    k = np.array([[INF, 0], [0, 1]])
    v = np.array([[1.0], [2]])
    ref = reference.adaptive_attention(q, k, v)
    got = cpu.adaptive_attention(q, k, v)
    assert np.isnan(ref).all() and np.isnan(got).all()
    # masked away by a boolean mask, the key does not count (as in the reference)
    keep = np.array([[False, True], [False, True]])
    np.testing.assert_array_equal(cpu.adaptive_attention(q, k, v, mask=keep), [[2.0], [2.0]])
    # a NaN or -inf component of a query poisons that query only
    q2 = np.array([[np.nan, 0], [1, 0]])
    k2 = np.array([[1.0, 0], [0, 1]])
    got2 = cpu.adaptive_attention(q2, k2, v)
    ref2 = reference.adaptive_attention(q2, k2, v)
    assert np.isnan(got2[0]).all() and np.isnan(ref2[0]).all()
    np.testing.assert_allclose(got2[1], ref2[1], rtol=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_attention_logits_beyond_the_float_range(dtype) -> None:
    """Logits that overflow (q, k ~ 1e200; scale = 1e308) give the reference's finite outputs."""
    rng = np.random.default_rng(0)
    big = 1e200 if dtype == np.float64 else 1e30
    q = (rng.normal(size=(2, 3, 4)) * big).astype(dtype)
    k = (rng.normal(size=(2, 5, 4)) * big).astype(dtype)
    v = rng.normal(size=(2, 5, 2)).astype(dtype)
    got = cpu.adaptive_attention(q, k, v)
    ref = reference.adaptive_attention(q, k, v, dtype=dtype)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=1e-6 if dtype == np.float32 else 1e-14)
    scale = 1e308 if dtype == np.float64 else 1e38
    qs, ks = rng.normal(size=(3, 4)).astype(dtype), rng.normal(size=(6, 4)).astype(dtype)
    vs = rng.normal(size=(6, 3)).astype(dtype)
    got = cpu.adaptive_attention(qs, ks, vs, scale=scale)
    ref = reference.adaptive_attention(qs, ks, vs, scale=scale, dtype=dtype)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=1e-6 if dtype == np.float32 else 1e-14)


def test_attention_overflow_with_masks_ties_and_additive_terms() -> None:
    """Overflowing rows keep the masks, ties and additive terms of the spec."""
    q = np.array([[1e200, 0.0], [1e200, 0.0], [1.0, 0.0]])
    k = np.array([[1e200, 0.0], [1e200, 0.0], [-1e200, 0.0], [0.0, 1.0]])
    v = np.array([[1.0], [3.0], [5.0], [7.0]])
    keep = np.array([[True, True, True, True], [False, True, True, True], [True] * 4])
    got = cpu.adaptive_attention(q, k, v, mask=keep, scale=1.0)
    ref = reference.adaptive_attention(q, k, v, mask=keep, scale=1.0)
    np.testing.assert_allclose(got, ref, rtol=1e-14)
    add = np.array([[0.0, -INF, 0.0, 1e308], [1e308, 1e308, 0.0, 0.0], [0.0] * 4])
    got = cpu.adaptive_attention(q, k, v, mask=add, scale=1.0)
    ref = reference.adaptive_attention(q, k, v, mask=add, scale=1.0)
    np.testing.assert_allclose(got, ref, rtol=1e-14)
    for sched in (Constant("1"), LogLength("0.5")):
        got = cpu.adaptive_attention(q, k, v, scale=1.0, schedule=sched)
        ref = reference.adaptive_attention(q, k, v, scale=1.0, schedule=sched)
        np.testing.assert_allclose(got, ref, rtol=1e-14)


# ---------------------------------------------------------------------------
# 5. StreamingSoftmax misuse
# ---------------------------------------------------------------------------


def test_tempered_pass_over_other_chunks_is_refused() -> None:
    """Pass 2 fed different items with the same count raises instead of misnormalising."""
    state = cpu.StreamingSoftmax().update(AUDIT_ROW)
    assert state.needs_tempered_pass
    state.update_tempered(AUDIT_ROW[:3])
    with pytest.raises(ValueError, match="not those fed to update"):
        state.update_tempered(AUDIT_ROW[:3])
    # refused before any change (the refused items counted as fed, and a merge of correct
    # worker copies was refused): the pass goes on with the right items
    with pytest.raises(RuntimeError, match="tempered"):
        state.normalize(AUDIT_ROW)
    state.update_tempered(AUDIT_ROW[3:])
    np.testing.assert_allclose(state.normalize(AUDIT_ROW), cpu.adaptive_softmax(AUDIT_ROW))


def test_a_refused_chunk_leaves_worker_copies_mergeable() -> None:
    x = np.r_[np.linspace(-3, 3, 10), [4.0, 4.0]]  # beta != 1
    merged = cpu.StreamingSoftmax().update(x[:6]) + cpu.StreamingSoftmax().update(x[6:])
    w0, w1 = copy.deepcopy(merged), copy.deepcopy(merged)
    with pytest.raises(ValueError, match="above the maximum"):
        w0.update_tempered(np.r_[x[:6], 99.0])
    w0.update_tempered(x[:6])
    w1.update_tempered(x[6:])
    np.testing.assert_allclose((w0 + w1).normalize(x), cpu.adaptive_softmax(x), rtol=1e-12)


def test_beta_one_tempered_pass_still_refuses_what_was_never_fed() -> None:
    x = np.array([0.0, 1.0, 2.0])
    state = cpu.StreamingSoftmax(schedule=Constant(1)).update(x)
    assert not state.needs_tempered_pass
    with pytest.raises(ValueError, match="above the maximum"):
        state.update_tempered(np.array([5.0]))
    with pytest.raises(ValueError, match="above the maximum"):
        state.update_tempered(np.array([np.nan]))
    state.update_tempered(x)
    with pytest.raises(ValueError, match="more than the 3 fed"):
        state.update_tempered(x[:1])
    np.testing.assert_allclose(state.normalize(x), cpu.softmax(x))


def test_tempered_pass_in_another_chunking_and_order_is_accepted() -> None:
    """The check is a multiset one: any chunking and order of the same items pass."""
    x = np.random.default_rng(0).normal(scale=3.0, size=1000)
    x[:20] += 14.0
    state = cpu.StreamingSoftmax().update(x[:300]).update(x[300:])
    assert state.needs_tempered_pass
    for part in (x[700:], x[:123], x[123:700]):
        state.update_tempered(part)
    p = np.concatenate([state.normalize(x[:500]), state.normalize(x[500:])])
    np.testing.assert_allclose(p, cpu.adaptive_softmax(x), rtol=1e-12)


def test_tempered_pass_with_more_items_than_pass_one_is_refused() -> None:
    state = cpu.StreamingSoftmax().update(AUDIT_ROW)
    state.update_tempered(AUDIT_ROW)
    with pytest.raises(ValueError, match="update_tempered"):
        state.update_tempered(AUDIT_ROW[:1])


def test_tempered_pass_with_a_value_above_the_maximum_is_refused() -> None:
    state = cpu.StreamingSoftmax().update(AUDIT_ROW)
    with pytest.raises(ValueError, match="never fed"):
        state.update_tempered(np.array([4.0]))


@pytest.mark.parametrize("schedule", [None, Constant("1")])
def test_normalize_of_a_value_never_fed_is_refused(schedule) -> None:
    """A value above the maximum, NaN or +inf was never fed: ValueError, as in the reference."""
    state = cpu.StreamingSoftmax(schedule).update(AUDIT_ROW)
    if state.needs_tempered_pass:
        state.update_tempered(AUDIT_ROW)
    for bad in (5.0, np.nan, INF):
        with pytest.raises(ValueError, match="never fed"):
            state.normalize(np.array([0.0, bad]))
        with pytest.raises(ValueError, match="never fed"):
            reference.StreamState.from_logits(AUDIT_ROW).normalize(np.array([0.0, bad]))
    assert state.normalize(np.array([3.0, -INF])).tolist()[1] == 0.0


def test_merged_states_keep_the_pass_checks() -> None:
    a = cpu.StreamingSoftmax().update(AUDIT_ROW[:3])
    b = cpu.StreamingSoftmax().update(AUDIT_ROW[3:])
    total = a + b
    total.update_tempered(AUDIT_ROW[::-1])
    np.testing.assert_allclose(
        total.normalize(AUDIT_ROW), cpu.adaptive_softmax(AUDIT_ROW), rtol=1e-14
    )


# ---------------------------------------------------------------------------
# 6. fork safety
# ---------------------------------------------------------------------------

_FORK_SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp
    import sys
    import numpy as np
    from softmaxtheory.accelerated import cpu
    from softmaxtheory.accelerated import _cpu_kernels as kmod

    def results(seed):
        rng = np.random.default_rng(seed)
        x32 = rng.normal(size=(64, 100)).astype(np.float32)
        x64 = rng.normal(size=(64, 100)) * 3
        long = rng.normal(size=cpu.CHUNK + 1000) * 4
        q, k, v = (rng.normal(size=(2, 16, 8)) for _ in range(3))
        s = cpu.StreamingSoftmax(dtype=np.float64)
        for part in np.array_split(long, 3):
            s.update(part)
        out = [
            cpu.softmax(x32), cpu.softmax(long), cpu.entropy(x64), cpu.entropy(long),
            cpu.adaptive_softmax(x32), cpu.adaptive_softmax(x64),
            cpu.adaptive_softmax(long), np.float64(s.entropy()),
            cpu.adaptive_attention(q, k, v), cpu.adaptive_attention(q, k, v, is_causal=True),
        ]
        if s.needs_tempered_pass:
            for part in np.array_split(long, 3):
                s.update_tempered(part)
        out.append(s.normalize(long))
        return [np.asarray(a).tobytes() for a in out]

    def work(seed):
        return results(seed), kmod.kernels.serial

    if __name__ == "__main__":
        if sys.argv[1:] == ["warm"]:  # compile the kernels and their twins into the cache
            results(0)
            kmod.kernels.use_serial()
            results(0)
            sys.exit(0)
        results(0)                           # the parent has run every parallel kernel
        unsafe = kmod.fork_unsafe_layer_active()
        with mp.get_context("fork").Pool(2) as pool:
            got = pool.map(work, range(3))
        assert all(serial == unsafe for _, serial in got), (unsafe, got)
        names = ["softmax f32", "softmax long", "entropy f64", "entropy long",
                 "adaptive f32", "adaptive f64", "adaptive long", "stream entropy",
                 "attention", "attention causal", "stream normalize"]
        want = [results(s) for s in range(3)]
        diff = [(seed, names[i], np.frombuffer(a, np.uint8).size)
                for seed, ((r, _), w) in enumerate(zip(got, want))
                for i, (a, b) in enumerate(zip(r, w)) if a != b]
        assert not diff, f"the children's results differ (seed, output, bytes): {diff}"
        print("ok", unsafe)
    """
)


def test_fork_based_pool_after_a_kernel_call() -> None:
    """A fork-start pool works after kernel calls, with the parent's results bit for bit.

    With GNU OpenMP active in the parent (Numba's default without TBB) the children run
    the serial twins of the parallel kernels; their results must equal the parent's.
    A first process puts the kernels and the twins in Numba's cache, so that the children
    load the twins rather than compile them (a kernel's bits once depended on that; see
    ``test_bits_do_not_depend_on_the_process_history``).
    """
    _python(_FORK_SCRIPT, "warm", timeout=300)
    proc = _python(_FORK_SCRIPT, timeout=300)
    assert proc.stdout.startswith("ok"), proc.stdout
    assert "unsafe" not in proc.stderr
    assert "Terminating" not in proc.stderr


def test_serial_twins_cover_every_parallel_kernel() -> None:
    """Every parallel kernel has a serial twin, and the twins call no parallel kernel."""
    from softmaxtheory.accelerated import _cpu_kernels as kmod

    names = kmod.parallel_kernel_names()
    assert {"rows_softmax", "rows_adaptive_short", "_rows_short_second", "chunk_states"} <= set(
        names
    )
    twins = kmod.serial_twins()
    assert sorted(twins) == names
    for name, twin in twins.items():
        assert not twin.targetoptions.get("parallel"), name
        assert twin.py_func.__globals__["_rows_short_second"] is twins["_rows_short_second"]


_THREADS_SCRIPT = textwrap.dedent(
    """
    import concurrent.futures as cf
    import os
    import sys
    import threading
    import numpy as np
    import numba
    from softmaxtheory.accelerated import cpu
    from softmaxtheory.accelerated import _cpu_kernels as kmod

    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(96, 300)) * 3 for _ in range(6)]
    q, k, v = (rng.normal(size=(2, 4, 64, 16)) for _ in range(3))
    calls = [lambda x=x: cpu.adaptive_softmax(x) for x in xs]
    calls += [lambda x=x: cpu.entropy(x) for x in xs]
    calls += [lambda: cpu.adaptive_attention(q, k, v, is_causal=True)] * 4
    barrier = threading.Barrier(8)

    def first(i):  # the very first parallel calls of the process, at once
        barrier.wait()
        return calls[i]()

    with cf.ThreadPoolExecutor(8) as pool:
        firsts = list(pool.map(first, range(8)))
    want = [c() for c in calls]
    with cf.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda c: [c() for _ in range(5)][-1], calls))
    assert all(np.array_equal(a, b) for a, b in zip(firsts, want[:8]))
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    layer = numba.threading_layer()
    names = set(kmod.parallel_kernel_names())
    held = {n: isinstance(f, kmod._Locked) for n, f in vars(kmod.kernels).items() if n in names}
    assert held and set(held.values()) == {layer == "workqueue"}, (layer, held)
    # a fork while another thread holds the lock: the child has its own lock
    kmod.kernels.lock.acquire()
    pid = os.fork()
    if pid == 0:
        # (after GNU OpenMP the child runs the serial twins, perhaps compiled afresh:
        # the same bits, see test_bits_do_not_depend_on_the_process_history)
        ok = np.array_equal(cpu.adaptive_softmax(xs[0]), want[0])
        os._exit(0 if ok else 3)
    kmod.kernels.lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print("ok", layer)
    """
)


@pytest.mark.parametrize("layer", ["workqueue", "default"])
def test_parallel_kernels_from_many_threads(layer) -> None:
    """Eight Python threads calling parallel kernels at once, from the first call on.

    Numba's ``workqueue`` layer (where neither TBB nor OpenMP is installed) terminated the
    process: "Concurrent access has been detected". The kernels now run one at a time
    there, and without a lock elsewhere; a child forked while the lock was held can
    still call them.
    """
    proc = _python(_THREADS_SCRIPT, env={**os.environ, "NUMBA_THREADING_LAYER": layer})
    assert proc.stdout.startswith("ok"), proc.stdout
    if layer == "workqueue":
        assert proc.stdout.split() == ["ok", "workqueue"]


# ---------------------------------------------------------------------------
# 7. attention masks read in place; the float32 path; integer masks refused
# ---------------------------------------------------------------------------

_MEMORY_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from softmaxtheory.accelerated import cpu

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    kind, n = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(0)
    def inputs(n):
        q = rng.normal(size=(n, 64)); k = rng.normal(size=(n, 64)); v = rng.normal(size=(n, 64))
        if kind == "bool":
            return q, k, v, dict(mask=np.tril(np.ones((n, n), dtype=bool))[None])
        if kind == "row":  # a broadcast additive mask over the keys
            return q, k, v, dict(mask=np.where(np.arange(n) % 3 == 0, -np.inf, 0.0))
        return q, k, v, dict(is_causal=True)
    q, k, v, kw = inputs(64)
    cpu.adaptive_attention(q, k, v, **kw)          # compile / load every specialisation
    q, k, v, kw = inputs(n)
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    before = status("VmRSS:")
    cpu.adaptive_attention(q, k, v, **kw)
    print(status("VmHWM:") - before)
    """
)


@pytest.mark.parametrize("kind", ["causal", "bool", "row"])
def test_attention_mask_memory_is_not_quadratic(kind) -> None:
    """At L = S = 4096, D = 64 the peak RSS grows by far less than one L·S float64 copy."""
    n = 4096
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT, kind, str(n)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    growth = int(proc.stdout.strip().splitlines()[-1])
    # a float64 copy of the mask is 128 MiB, a boolean one 16 MiB
    assert growth < 12 * 2**20, f"peak RSS grew by {growth / 2**20:.1f} MiB"


def test_attention_float32_path_is_float32_accurate() -> None:
    """float32 inputs are computed in float32, within the float32 error model."""
    rng = np.random.default_rng(7)
    q = rng.normal(size=(2, 9, 8)).astype(np.float32)
    k = rng.normal(size=(2, 300, 8)).astype(np.float32)
    v = rng.normal(size=(2, 300, 3)).astype(np.float32)
    mask = rng.random((9, 300)) < 0.8
    for kw in ({}, {"mask": mask}, {"is_causal": True}, {"schedule": Constant("1")}):
        got = cpu.adaptive_attention(q, k, v, **kw)
        assert got.dtype == np.float32
        assert_attention_close(got, (q, k, v), **kw)
    add = np.where(mask, 0.0, -np.inf).astype(np.float32)
    got = cpu.adaptive_attention(q, k, v, mask=add)
    assert_attention_close(got, (q, k, v), mask=add)


@pytest.mark.parametrize(
    ("dtypes", "want"),
    [
        ((np.float16,) * 3, np.float16),
        ((np.float16, np.float32, np.float16), np.float32),
        ((np.float32,) * 3, np.float32),
        ((np.float16, np.float16, np.int64), np.float64),
        ((np.float64, np.float16, np.float16), np.float64),
    ],
)
def test_attention_returns_the_inputs_common_dtype(dtypes, want) -> None:
    """float16 inputs gave float32 outputs (DESIGN: float16 returns float16, as the rows do)."""
    rng = np.random.default_rng(3)
    shapes = ((2, 5, 4), (2, 7, 4), (2, 7, 3))
    q, k, v = (rng.normal(size=s).astype(dt) for s, dt in zip(shapes, dtypes, strict=True))
    got = cpu.adaptive_attention(q, k, v)
    assert got.dtype == want
    assert cpu.adaptive_attention(q[:0], k[:0], v[:0]).dtype == want  # (no slice at all)
    wide = cpu.adaptive_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    if want != np.float64:  # the float64 kernel's result, rounded once more, within a rounding
        assert_attention_close(got, (q, k, v))
        np.testing.assert_allclose(got, wide, rtol=4 * np.finfo(want).eps, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.int64, np.int8, np.uint8])
def test_integer_attention_mask_is_refused(dtype) -> None:
    """An integer mask is refused (as torch does), never taken as additive."""
    q = np.zeros((2, 3))
    with pytest.raises(TypeError, match="mask"):
        cpu.adaptive_attention(q, q, q, mask=np.zeros((2, 2), dtype=dtype))


# ---------------------------------------------------------------------------
# 8. Numba's on-disk cache shared by processes compiling at once
# ---------------------------------------------------------------------------


def _interleaved_saves(cls, folder) -> tuple:
    """Two processes save signatures A and B of one function into one cache at once.

    Both read the (empty) index before either writes it, and their writes interleave
    as index A, index B, data B, data A, the order that paired B with A's machine code
    in Numba's numbered files. Returns what a later process loads for A and for B.
    """
    files = [cls(str(folder), "f-1.py311", "stamp") for _ in range(2)]
    key_a, key_b = (((sig,), ("magic",), ("code hash", "")) for sig in ("A", "B"))
    deferred = []
    for f in files:
        f._load_index = dict  # the index each read before the other wrote
    files[0]._save_data = lambda name, data: deferred.append((name, data))
    files[0].save(key_a, "machine code of A")
    files[1].save(key_b, "machine code of B")
    for name, data in deferred:
        cls._save_data(files[0], name, data)
    later = cls(str(folder), "f-1.py311", "stamp")
    return later.load(key_a), later.load(key_b)


def test_interleaved_cache_saves_never_pair_a_signature_with_another_ones_code(tmp_path):
    """With keyed data files the later process gets B's code for B, and A only as A's.

    Numba's numbered files give A's code for B in this interleaving (checked by hand
    with ``IndexDataCacheFile``): a signature then runs another's machine code,
    computing other bits or failing to unbox. The forked children of
    ``test_fork_based_pool_after_a_kernel_call`` differed from their parent so, twice,
    on a cold cache.
    """
    from softmaxtheory.accelerated._numba_cache import KeyedIndexDataCacheFile

    got_a, got_b = _interleaved_saves(KeyedIndexDataCacheFile, tmp_path)
    assert got_b == "machine code of B"
    assert got_a in (None, "machine code of A")  # a lost entry: compiled again later


def test_every_cached_kernel_uses_keyed_data_files():
    """The kernels, their serial twins and the dask block kernels all get the keyed files
    (with another Numba whose internals differ, this says the guard no longer applies)."""
    from numba.core.dispatcher import Dispatcher

    from softmaxtheory.accelerated import _cpu_kernels as kmod
    from softmaxtheory.accelerated import _dask_blocks
    from softmaxtheory.accelerated._numba_cache import KeyedIndexDataCacheFile

    found = [
        obj
        for mod in (kmod, _dask_blocks)
        for obj in vars(mod).values()
        if isinstance(obj, Dispatcher) and getattr(obj._cache, "_cache_file", None) is not None
    ]
    found += list(kmod.serial_twins().values())
    assert len(found) > 60
    assert all(type(d._cache._cache_file) is KeyedIndexDataCacheFile for d in found)


# ---------------------------------------------------------------- 9. byte order


@pytest.mark.parametrize("dtype", [">f8", ">f4", ">f2", ">i4"])
def test_big_endian_input_gives_the_native_result(dtype) -> None:
    """A big-endian array (a .npy written on such a machine, a FITS or network buffer) is
    the same values: every backend gives the native input's bits, in native order.

    The Numba kernels and the dask backend raised a TypingError ("non-precise type
    pyobject") on such input; numpy, scipy and the reference take it.
    """
    import dask.array as da

    from softmaxtheory.accelerated import dask as D  # noqa: N812

    def same(got, want, what):
        assert got.dtype.isnative and got.dtype == want.dtype, what
        assert got.tobytes() == want.tobytes(), what

    x = np.random.default_rng(4).normal(0, 2, (3, 70)).astype(dtype)
    native = x.astype(np.dtype(dtype).newbyteorder("="))
    for func in (cpu.softmax, cpu.entropy, cpu.beta, cpu.adaptive_softmax,
                 reference.softmax, reference.adaptive_softmax):  # fmt: skip
        same(func(x), func(native), func)
    for func in (D.softmax, D.entropy, D.beta, D.adaptive_softmax):
        chunked = [da.from_array(a, chunks=(2, 32)) for a in (x, native)]
        same(*(func(c).compute() for c in chunked), func)
    q, qn = x[None, :, :8], native[None, :, :8]
    m = x[:, :3].astype(">f8")  # an additive mask, big-endian too
    for mask, mask_native in ((None, None), (m, m.astype("=f8"))):
        got = cpu.adaptive_attention(q, q[:, :3], q[:, :3], mask=mask)
        same(got, cpu.adaptive_attention(qn, qn[:, :3], qn[:, :3], mask=mask_native), mask)
    stream, stream_native = cpu.StreamingSoftmax(), cpu.StreamingSoftmax()
    stream.update(x[0])
    stream_native.update(native[0])
    assert stream.entropy() == stream_native.entropy()


# ------------------------------------------------------------ 10. the process's history

_HISTORY_SCRIPT = textwrap.dedent(
    """
    import hashlib
    import json
    import pickle
    import sys
    import numpy as np
    from numba.core.dispatcher import Dispatcher
    from softmaxtheory.accelerated import cpu
    from softmaxtheory.accelerated import _cpu_kernels as kmod

    mode, sigfile = sys.argv[1:]
    helpers = {n: d for n, d in vars(kmod).items()
               if isinstance(d, Dispatcher) and d.targetoptions.get("fastmath")}
    if mode == "helpers-first":  # load every fast-math helper before any kernel
        with open(sigfile, "rb") as f:
            loaded = pickle.load(f)
        assert sum(map(len, loaded.values())) > 20, loaded
        for name, sigs in loaded.items():
            for sig in sigs:
                helpers[name].compile(sig)
    rng = np.random.default_rng(0)
    rows = {"f32": rng.normal(size=(64, 100)).astype(np.float32),
            "f64": rng.normal(size=(64, 100)) * 3,
            "long f32": (rng.normal(size=(2, 3000)) * 4).astype(np.float32),
            "chunked f64": rng.normal(size=cpu.CHUNK + 1000) * 4}
    out = {}
    for name, x in rows.items():
        out["softmax " + name] = cpu.softmax(x)
        out["entropy " + name] = cpu.entropy(x)
        out["adaptive " + name] = cpu.adaptive_softmax(x)
    stream = cpu.StreamingSoftmax(dtype=np.float32)
    for part in np.array_split(rows["long f32"][0], 3):
        stream.update(part)
    out["stream entropy"] = np.float64(stream.entropy())
    for dtype in (np.float64, np.float32):
        q, k, v = (rng.normal(size=(2, 40, 24)).astype(dtype) for _ in range(3))
        out[f"attention {dtype.__name__}"] = cpu.adaptive_attention(q, k, v, is_causal=True)
    if mode == "cold":
        with open(sigfile, "wb") as f:
            pickle.dump({n: list(d.signatures) for n, d in helpers.items()}, f)
    print(json.dumps({n: hashlib.sha256(np.asarray(a).tobytes()).hexdigest()
                      for n, a in out.items()}))
    """
)


def test_bits_do_not_depend_on_the_process_history(tmp_path) -> None:
    """A program's first run (compiling) and its later runs (loading Numba's cache) give the
    same bits, whichever kernels or helpers the process loaded first.

    Each fast-math helper is inlined into its callers (``forceinline``). Called through its
    symbol, a kernel ran whichever copy of the helper the process had loaded first: the
    helper's own, or the copy linked into the kernel's cached code and optimised again,
    whose reassociated sums were ordered otherwise. Cold and warm runs differed in 4 of
    14 outputs (float32 and float64 rows of 100 items, up to 62 ulps).
    """
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    sigfile = str(tmp_path / "signatures.pickle")

    def run(mode):
        return json.loads(_python(_HISTORY_SCRIPT, mode, sigfile, env=env).stdout)

    cold = run("cold")  # compiles every kernel into the empty cache
    for mode in ("kernels-first", "helpers-first"):
        warm = run(mode)
        assert warm.keys() == cold.keys()
        differ = sorted(name for name in cold if cold[name] != warm[name])
        assert not differ, f"{mode}: the warm process gave other bits for {differ}"


def test_fast_math_stays_where_it_is_declared() -> None:
    """Every fast-math function is force-inlined and calls no jitted function that lacks
    flags of its own.

    Numba compiles a callee that sets no ``fastmath`` with its first caller's flags, and
    keeps that code for every later caller: a flag-free helper (Neumaier's compensated
    sum, the Horner recurrence that must equal ``numpy.polyval``) first called from a
    reassociating loop would lose its meaning everywhere, depending on the call order.
    """
    from numba.core.dispatcher import Dispatcher

    from softmaxtheory.accelerated import _cpu_kernels as kmod
    from softmaxtheory.accelerated import _dask_blocks

    jitted = {
        name: obj
        for mod in (kmod, _dask_blocks)
        for name, obj in vars(mod).items()
        if isinstance(obj, Dispatcher)
    }
    flagged = {name for name, d in jitted.items() if d.targetoptions.get("fastmath")}
    assert {"exp64", "exp32", "_block_stats", "_short_s", "_dot1", "_dot4", "_weights"} <= flagged
    for name in sorted(flagged):
        options = jitted[name].targetoptions
        assert options.get("forceinline") is True, name
        calls = set(jitted[name].py_func.__code__.co_names) & set(jitted)
        unflagged = {c for c in calls if "fastmath" not in jitted[c].targetoptions}
        assert not unflagged, f"{name} calls {unflagged}, which would inherit its flags"


# ------------------------------------------------------------ 11. Numba's JIT switched off

_NO_JIT_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import dask.array as da
    from softmaxtheory.accelerated import cpu
    from softmaxtheory.accelerated import dask as sd

    calls = [lambda: cpu.softmax(np.ones(3)), lambda: cpu.StreamingSoftmax().update(np.ones(3)),
             lambda: cpu.adaptive_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2))),
             lambda: sd.entropy(da.ones(3)).compute()]
    for call in calls:
        try:
            call()
        except RuntimeError as exc:
            assert "NUMBA_DISABLE_JIT is set" in str(exc), exc
        else:
            raise AssertionError("ran without its kernels")
    print("ok")
    """
)


def test_with_numbas_jit_switched_off_the_kernels_say_so() -> None:
    """``NUMBA_DISABLE_JIT=1`` (set to debug one's own Numba code) runs every jitted function
    as Python: the kernels' intrinsics and overloads then raised a bare
    ``NotImplementedError``, and ``bench`` started a pure-Python copy of 256 MiB. Both
    now say what is wrong."""
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    assert _python(_NO_JIT_SCRIPT, env=env, timeout=300).stdout.strip() == "ok"
    bench = subprocess.run(
        [sys.executable, "-m", "softmaxtheory", "bench", "--quick"], capture_output=True,
        text=True, timeout=300, env=env,
    )  # fmt: skip
    assert bench.returncode == 2
    assert bench.stderr.startswith("softmaxtheory bench: error: ")
    assert "NUMBA_DISABLE_JIT" in bench.stderr and "Traceback" not in bench.stderr


# ------------------------------------------------------------ 12. no writable cache location

_NO_CACHE_SCRIPT = textwrap.dedent(
    """
    import json
    import warnings
    import numpy as np

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from softmaxtheory.accelerated import cpu
        from softmaxtheory.accelerated._numba_cache import NoDiskCacheWarning
        from softmaxtheory.accelerated import _cpu_kernels as kmod
    ours = [w for w in caught if issubclass(w.category, NoDiskCacheWarning)]
    x = np.random.default_rng(3).normal(size=(16, 40)) * 3
    print(json.dumps({
        "warnings": [str(w.message) for w in ours],
        "cached": type(kmod.rows_softmax_short._cache).__name__,
        "softmax": cpu.softmax(x).tobytes().hex(),
        "adaptive": cpu.adaptive_softmax(x).tobytes().hex(),
    }))
    """
)


def test_without_a_writable_cache_location_the_kernels_compile_in_memory() -> None:
    """A read-only installation run by a user with no writable home (a container's non-root
    user, a serverless function) gives Numba no cache location: ``cache=True`` raised
    ``RuntimeError`` ("no locator available") at import, so the CPU backend could not be
    imported. Now it warns once, compiles in memory and gives the cached kernels' bits.

    (``NUMBA_CACHE_LOCATOR_CLASSES`` leaves Numba only the locator of zip imports, which
    finds nothing for a plain file: the state of such a machine, checked there by hand.)
    """
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "ZipCacheLocator"}
    got = json.loads(_python(_NO_CACHE_SCRIPT, env=env).stdout)
    assert len(got["warnings"]) == 1, got["warnings"]
    assert "no locator available" in got["warnings"][0]
    assert "NUMBA_CACHE_DIR" in got["warnings"][0]
    assert got["cached"] == "NullCache"
    x = np.random.default_rng(3).normal(size=(16, 40)) * 3
    assert got["softmax"] == cpu.softmax(x).tobytes().hex()
    assert got["adaptive"] == cpu.adaptive_softmax(x).tobytes().hex()


# ------------------------------------------------------------ 13. a β that is 0 or nearly so


def _tempered_exact(x: np.ndarray, beta: Fraction) -> np.ndarray:
    """softmax(β x) of a row: each exponent β (x_i − m) exact, then rounded (masked: 0)."""
    live = x > -INF
    m = Fraction(float(x[live].max()))
    z = [
        float(beta * (Fraction(float(v)) - m)) if ok else -INF
        for v, ok in zip(x, live, strict=True)
    ]
    w = np.exp(np.array(z))
    return w / w.sum()


def _on_path(path: str, x: np.ndarray, schedule) -> np.ndarray:
    """The CPU's probabilities of the row `x` on one of its paths: a short row (and a
    batch), a row padded with masked items to an in-memory or a chunked length, the
    stream."""
    if path == "short":
        batch = cpu.adaptive_softmax(np.stack([x, x[::-1]]), schedule=schedule)
        np.testing.assert_array_equal(batch[1], batch[0][::-1])
        return batch[0]
    if path == "stream":
        state = cpu.StreamingSoftmax(schedule, x.dtype)
        chunks = np.array_split(x, 2)
        for c in chunks:
            state.update(c)
        if state.needs_tempered_pass:
            for c in chunks:
                state.update_tempered(c)
        return np.concatenate([state.normalize(c) for c in chunks])
    n = 2000 if path == "in-memory" else cpu.CHUNK + 5
    padded = np.full(n, -INF, dtype=x.dtype)
    padded[: x.size] = x
    p = cpu.adaptive_softmax(padded, schedule=schedule)
    assert np.all(p[x.size :] == 0.0)
    return p[: x.size]


@pytest.mark.parametrize(
    ("dtype", "beta"), [(np.float64, "1e-400"), (np.float32, "1e-300"), (np.float32, "1e-50")]
)
def test_masked_item_with_a_beta_that_rounds_to_zero(dtype, beta) -> None:
    """-inf is a mask (T8) whatever β: a β that rounds to 0 in the row's format made the
    short rows' ``0 * -inf`` NaN, and the whole row NaN (the reference: [0, 1/2, 1/2])."""
    x = np.array([-INF, 3.0, 1.0], dtype=dtype)
    schedule = Constant(beta)
    np.testing.assert_array_equal(reference.adaptive_softmax(x, schedule=schedule), [0, 0.5, 0.5])
    np.testing.assert_array_equal(_on_path("short", x, schedule), [0.0, 0.5, 0.5])


@pytest.mark.parametrize("path", ["short", "in-memory", "chunked", "stream"])
@pytest.mark.parametrize(
    ("dtype", "beta"),
    [
        (np.float64, "1e-400"),  # rounds to 0: uniform
        (np.float64, "1e-310"),  # subnormal: β (x − m) = −0.02
        (np.float32, "1e-300"),  # 0 in float32, not in float64: uniform
        (np.float32, "1e-40"),  # subnormal in float32: β (x − m) = −0.06
    ],
)
def test_overflowed_shift_with_a_tiny_beta(path, dtype, beta) -> None:
    """x − m overflows (±1e308, ±3e38) while β (x − m) is small: the weight of the exact
    product, not NaN (``0 * -inf``, short rows) nor 0 (the other paths gave [1, 0])."""
    big = 1e308 if dtype == np.float64 else 3e38
    x = np.array([big, -big], dtype=dtype)
    schedule = Constant(beta)
    want = _tempered_exact(x, schedule.exact_beta)
    got = _on_path(path, x, schedule)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-14 if dtype == np.float64 else 1e-6, atol=0)


@pytest.mark.parametrize("path", ["short", "in-memory", "chunked", "stream"])
def test_overflowed_shift_with_a_zero_beta_of_another_schedule(path) -> None:
    """LogLength with a scale that rounds to 0 (β through ``beta_float``, rows_finish):
    the two unmasked items get 1/2 each, not [1, 0]."""
    x = np.array([1e308, -1e308])
    np.testing.assert_array_equal(_on_path(path, x, LogLength("1e-400")), [0.5, 0.5])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_attention_overflowed_shift_with_a_tiny_beta(dtype) -> None:
    """Attention logits ±1e308 (±3e38 in float32) with β = 1e-308 (1e-40): the clamped
    shift gave the second key e^-1.8 instead of e^-2 (1.284 for 1.238); a masked key
    keeps weight 0 with β = 0."""
    big, beta = (1e308, "1e-308") if dtype == np.float64 else (3e38, "1e-40")
    q = np.zeros((1, 2), dtype=dtype)
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=dtype)
    v = np.array([[1.0], [3.0], [100.0]], dtype=dtype)
    add = np.array([[big, -big, -INF]], dtype=dtype)
    schedule = Constant(beta)
    w = _tempered_exact(add[0], schedule.exact_beta)
    want = w @ v.astype(np.float64)
    got = cpu.adaptive_attention(q, k, v, mask=add, scale=1.0, schedule=schedule)
    np.testing.assert_allclose(got[0], want, rtol=1e-14 if dtype == np.float64 else 1e-6)
    zero = cpu.adaptive_attention(q, k, v, mask=add, scale=1.0, schedule=Constant("1e-400"))
    np.testing.assert_allclose(zero[0], [2.0], rtol=1e-14 if dtype == np.float64 else 1e-6)


@pytest.mark.parametrize("beta", ["1e-305", "1e-310"])
def test_attention_logits_beyond_the_float_range_with_a_tiny_beta(beta) -> None:
    """Logits 1e400, −1e400 and 0 (the scaled path): β (x − m) ≤ −1e85, the maximum takes
    all the weight. The shift clamped to −1e300 made it −1e-5 (weights ≈ 1: 2.99999)."""
    q = np.array([[1e200, 0.0]])
    k = np.array([[1e200, 0.0], [-1e200, 0.0], [0.0, 1.0]])
    v = np.array([[1.0], [3.0], [5.0]])
    schedule = Constant(beta)
    got = cpu.adaptive_attention(q, k, v, scale=1.0, schedule=schedule)
    np.testing.assert_array_equal(got, [[1.0]])
    np.testing.assert_array_equal(
        reference.adaptive_attention(q, k, v, scale=1.0, schedule=schedule), [[1.0]]
    )


@pytest.mark.parametrize("func", ["softmax", "adaptive_softmax"])
def test_out_of_the_other_byte_order_is_written(func):
    # '>f8' is float64: out=x for big-endian x raised "out must have dtype float64, got >f8"
    x = np.array([[1.0, 2.0, 3.0], [0.5, -np.inf, 4.0]])
    want = getattr(cpu, func)(x)
    order = ">" if np.little_endian else "<"
    out = np.zeros(want.shape, dtype=f"{order}f8")
    assert getattr(cpu, func)(x, out=out) is out
    np.testing.assert_array_equal(out, want)
    xb = x.astype(f"{order}f8")
    assert getattr(cpu, func)(xb, out=xb) is xb
    np.testing.assert_array_equal(xb, want)
    with pytest.raises(TypeError, match=r"must have dtype float64, got [<>]f4"):
        getattr(cpu, func)(x, out=np.zeros(want.shape, dtype=f"{order}f4"))


def test_streaming_normalize_into_the_other_byte_order():
    x = np.array([3.0, 1.0, 0.0, 0.0, -1.0, 2.0])
    state = cpu.StreamingSoftmax().update(x)
    state.update_tempered(x)
    order = ">" if np.little_endian else "<"
    out = np.zeros(6, dtype=f"{order}f8")
    assert state.normalize(x, out=out) is out
    np.testing.assert_array_equal(out, state.normalize(x))


@pytest.mark.parametrize("shift", [1, -1, 0])
def test_streaming_normalize_into_a_shifted_view_of_the_chunk(shift):
    """An `out` one item off the chunk got values of items it had overwritten
    ([1.6e-05, 0.003378, 0.003398, ...] for [1.6e-05, 5.4e-05, 0.000175, ...]);
    the chunk itself as `out` was and is right."""
    x = np.linspace(-3.0, 3.0, 10)
    state = cpu.StreamingSoftmax().update(x)
    state.update_tempered(x)
    want = state.normalize(x)
    assert state.beta() > 1.0  # the tempered values, not plain softmax
    buf = np.zeros(12)
    lo = 1
    buf[lo : lo + 10] = x
    out = buf[lo + shift : lo + shift + 10]
    assert state.normalize(buf[lo : lo + 10], out=out) is out
    np.testing.assert_array_equal(out, want)


# ------------------------------------------------- 14. torch imported after Numba's threads

_OPENMP_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from softmaxtheory.accelerated import cpu
    cpu.softmax(np.ones((64, 5000)))  # a parallel call: Numba's threads start
    import torch
    with open("/proc/self/maps") as f:
        print(sorted({line.split()[-1] for line in f if "libgomp" in line}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="GNU OpenMP's loading, Linux")
def test_torch_imported_after_the_kernels_runs_on_its_own_openmp():
    """Numba's threads, started first, loaded the system's ``libgomp``; torch, imported
    after, bound to it instead of its own copy, and its float16 attention on the CPU ran
    about 500 times slower. The kernels load torch's copy first (``_openmp``)."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None:
        pytest.skip("torch is not installed")
    ours = [
        os.path.realpath(p)
        for root in spec.submodule_search_locations
        for p in glob.glob(os.path.join(root, "lib", "libgomp*.so*"))
    ]
    if not ours:
        pytest.skip("this torch ships no libgomp of its own")
    loaded = {os.path.realpath(p) for p in eval(_python(_OPENMP_SCRIPT).stdout)}
    assert loaded & set(ours), f"torch's {ours} not loaded; the process holds {loaded}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [8, 65, cpu.CHUNK + 3])
@pytest.mark.parametrize("func", [cpu.softmax, cpu.adaptive_softmax])
def test_an_output_just_after_its_input_gets_the_same_bits(func, n, dtype):
    """LLVM runs the vectorised loop (store to `out`, load from `x`) only when `out` starts
    at least a vector footprint (256 bytes here) after `x`; closer, the scalar copy ran and
    its sums came out in another order: an output 64 bytes after its input gave an adaptive
    softmax up to 65 ulps from the usual bits, and ``out=None`` did so at random, wherever
    numpy placed the result. Such outputs now take a buffer apart from the input."""
    rng = np.random.default_rng(n)
    x0 = (rng.standard_normal((2, n)) * 4).astype(dtype)
    x0[0, :3] = [9.0, 8.5, 8.0]  # β ≠ 1 on this row (a few dominant items), β = 1 below
    want = func(x0.copy())
    size, step = x0.size, max(1, 24 // x0.itemsize)
    for gap in range(size, size + 320 // x0.itemsize, step):
        buf = np.zeros(gap + size, dtype=dtype)
        x = buf[:size].reshape(x0.shape)
        x[...] = x0
        out = buf[gap:].reshape(x0.shape)
        np.testing.assert_array_equal(func(x, out=out), want)
        assert func(x, out=out) is out


def test_a_fresh_output_is_taken_apart_from_its_input(monkeypatch):
    """``out=None``: where numpy's allocator puts the result just after the input (as its
    cache of small blocks does), another buffer is taken, so the bits do not depend on it."""
    x0 = AUDIT_ROW.reshape(1, -1)
    want = cpu.adaptive_softmax(x0)
    buf = np.zeros(64)
    x = buf[:6].reshape(1, 6)
    x[...] = x0
    empty_like = np.empty_like
    made = []

    def adjacent(a, *args, **kwargs):
        if a.__array_interface__["data"][0] == x.__array_interface__["data"][0]:
            made.append(1)
            return buf[8:14].reshape(a.shape)  # 64 bytes after the input row
        return empty_like(a, *args, **kwargs)

    monkeypatch.setattr(np, "empty_like", adjacent)
    np.testing.assert_array_equal(cpu.adaptive_softmax(x), want)
    assert made  # the allocation was offered the adjacent block


class _Returns(Schedule):
    """A user's schedule whose ``beta_float`` returns `value` (a function of the rows)."""

    needs_entropy = True

    def __init__(self, value):
        self.value = value

    def beta_float(self, entropy, n_eff):
        return self.value(np.broadcast(np.asarray(entropy), np.asarray(n_eff)).shape)

    def __repr__(self) -> str:
        return "_Returns()"


_BAD_BETAS = {
    "negative": (lambda shape: np.full(shape, -1.0), ValueError, "beta = -1.0; beta must be"),
    "-inf": (lambda shape: np.full(shape, -np.inf), ValueError, "beta must be positive"),
    "complex": (lambda shape: np.ones(shape, complex), TypeError, "not real numbers"),
    "shape": (lambda shape: np.ones(7), ValueError, r"returned shape \(7,\) for rows"),
    "object": (lambda shape: object(), TypeError, "not real numbers"),
}


@pytest.mark.parametrize("case", sorted(_BAD_BETAS))
def test_a_user_schedules_bad_beta_is_refused_by_every_cpu_path(case):
    """A user's β ≤ 0 made the output silently uniform (not the softmax of β x), and a
    Python float, a list, an integer array or the wrong length failed deep inside a
    kernel (IndexError, "cannot convert float NaN to integer", Numba's lowering error).
    Each path now refuses with the schedule's name; good values still run."""
    value, exc, match = _BAD_BETAS[case]
    sched = _Returns(value)
    x = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    q = np.ones((1, 2, 3))
    calls = [
        lambda: cpu.adaptive_softmax(x, schedule=sched),
        lambda: cpu.beta(x, schedule=sched),
        lambda: cpu.adaptive_softmax(np.zeros(cpu.CHUNK + 1), schedule=sched),
        lambda: cpu.adaptive_attention(q, q, q, schedule=sched),
        lambda: cpu.StreamingSoftmax(sched).update(x[0]).beta(),
    ]
    for call in calls:
        with pytest.raises(exc, match=rf"_Returns\(\)\.beta_float .*{match}"):
            call()


@pytest.mark.parametrize(
    "value",
    [lambda shape: 2.0, lambda shape: [2.0] * math.prod(shape), lambda shape: np.full(shape, 2)],
    ids=["float", "list", "int array"],
)
def test_a_user_schedules_scalar_list_or_integers_are_read_as_beta(value):
    """A Python float is broadcast over the rows, a list or an integer array read as float64
    (they failed inside the kernels); each gives the softmax of 2x."""
    x = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    want = cpu.softmax(2 * x)
    np.testing.assert_allclose(cpu.adaptive_softmax(x, schedule=_Returns(value)), want, rtol=1e-15)


def test_set_num_threads_takes_integers_only():
    """``set_num_threads(2.7)`` set 2 threads without a word; a bool set 1."""
    import numba

    before = numba.get_num_threads()
    for bad in (2.7, True, "2"):
        with pytest.raises(TypeError, match="n must be an int"):
            cpu.set_num_threads(bad)
    assert numba.get_num_threads() == before
    cpu.set_num_threads(np.int64(1))
    try:
        assert numba.get_num_threads() == 1
    finally:
        cpu.set_num_threads(before)


BIG = np.array([[2**53, 2**53 + 1]], dtype=np.int64)  # float64 rounds 2**53 + 1 to 2**53


@pytest.mark.parametrize(
    "call",
    [
        lambda x: cpu.softmax(x),
        lambda x: cpu.entropy(x),
        lambda x: cpu.adaptive_softmax(x),
        lambda x: cpu.beta(x),
        lambda x: cpu.StreamingSoftmax().update(x[0]),
        lambda x: cpu.adaptive_attention(np.ones((1, 1)), x.T, np.ones((2, 1))),
        lambda x: cpu.adaptive_attention(np.ones((1, 1)), np.ones((2, 1)), x.T),
    ],
    ids=["softmax", "entropy", "adaptive_softmax", "beta", "streaming", "keys", "values"],
)
def test_an_integer_float64_cannot_hold_is_refused_as_the_reference_refuses_it(call):
    """Rounded, [2**53, 2**53 + 1] became [2**53, 2**53]: softmax 0.5 each for a row whose
    coefficients are 0.269 and 0.731, a silent wrong number; the reference refuses it. So
    does every CPU entry point now, naming the argument; integers float64 holds (2**60 and
    its neighbours 256 apart) are taken as they are."""
    with pytest.raises(ValueError, match=r"9007199254740993, which float64 cannot hold"):
        reference.softmax(BIG)
    with pytest.raises(ValueError, match=r"9007199254740993, which float64 cannot hold"):
        call(BIG)
    held = np.array([[2**60, 2**60 + 256]], dtype=np.int64)
    np.testing.assert_array_equal(cpu.softmax(held), reference.softmax(held))


def test_a_high_degree_schedule_skips_the_exact_shortcut_and_stays_right():
    """The exact search for the entropies where beta is 1 (a shortcut of the kernels) grew
    like the degree to the fifth: 5.7 s at degree 30, 47 s at 45, on the first call.
    Past degree 16 the threshold is the cut (beta = 1 at or below it by definition)."""
    rng = np.random.default_rng(1)
    coeffs = tuple(repr(round(float(c), 3)) for c in rng.normal(0.0, 0.01, 46))
    high = Polynomial(coeffs, "0.01")
    assert cpu._beta_one_below(high) == 0.01
    low = Polynomial(("-0.5", "2.0", "0.25"), "0.1")  # P < 1 - 1e-9 up to about 0.4
    assert 0.1 < cpu._beta_one_below(low) < 0.5
    x = rng.normal(0.0, 1.0, (4, 2000))
    testing.assert_adaptive_softmax_close(cpu.adaptive_softmax(x, schedule=high), x, schedule=high)


@pytest.mark.parametrize("mask_shape", [None, (2, 6, 5, 7), (1, 1, 5, 7), (6, 5, 7), (5, 7)])
@pytest.mark.parametrize("v_heads", [2, 3])
def test_grouped_query_attention_matches_the_reference(mask_shape, v_heads):
    """cpu.adaptive_attention had no enable_gqa (the reference, the torch functions and the
    assertion helpers take it): keys with fewer heads failed to broadcast. Keys and values
    of as many heads are read in place (q viewed as (..., Hk, g, L, d)); others repeated."""
    rng = np.random.default_rng(8)
    q, k = rng.normal(0.0, 1.0, (2, 6, 5, 4)), rng.normal(0.0, 1.0, (2, 2, 7, 4))
    v = rng.normal(0.0, 1.0, (2, v_heads, 7, 3))
    mask = None
    if mask_shape is not None:
        mask = rng.random(mask_shape) > 0.3
        mask[..., 0] = True
    got = cpu.adaptive_attention(q, k, v, mask, enable_gqa=True)
    assert got.shape == (2, 6, 5, 3)
    assert_attention_close(got, (q, k, v), mask=mask, enable_gqa=True)
    causal = cpu.adaptive_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert_attention_close(causal, (q, k, v), is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match=r"query heads \(6\) must be a multiple of k's \(4\)"):
        cpu.adaptive_attention(q, np.ones((2, 4, 7, 4)), np.ones((2, 4, 7, 3)), enable_gqa=True)
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        cpu.adaptive_attention(q, k, v, enable_gqa=1)
