"""softmaxtheory.accelerated.cpu against the certified reference."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

from hypothesis import example, given, settings
from hypothesis import strategies as st

from softmaxtheory import bounds, reference
from softmaxtheory.accelerated import _cpu_kernels as cpu_kernels
from softmaxtheory.accelerated import cpu
from softmaxtheory.spec import Constant, LogLength, PaperPolynomial, Polynomial
from tests.support.strategies_support import NEG_INF, logit_rows

SCHEDULES = (None, Constant("2"), LogLength("0.5"), Polynomial(("1", "1"), "0.25"))
U = {np.float64: 2.0**-53, np.float32: 2.0**-24}


def ulp_error(got, exact, dtype) -> np.ndarray:
    """|got - exact| in ulps of `dtype` at `exact` (subnormal spacing below the normal range)."""
    got = np.asarray(got, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    spacing = np.spacing(np.abs(exact).astype(dtype)).astype(np.float64)
    return np.abs(got - exact) / spacing


def allowed_ulps(x, beta, dtype, h_ulps=8.0) -> np.ndarray:
    """The documented error bound of one adaptive-softmax output, in ulps.

    With z = x - m and zbar = sum_j alpha_j z_j (the mean of z under the output),
    log alpha_i = beta z_i - log sum_j e^(beta z_j) moves by |z_i - zbar| dbeta when beta
    moves by dbeta, and by at most u (|beta z_i| + |beta zbar|) for the rounding of the
    beta z_j: c0 + c1 (|beta z_i| + |beta zbar|) + |z_i - zbar| |dbeta| / u, where the
    entropy's error reaches beta through the schedule: |dbeta| <= |P'(H)| |dH|, |P'| <= 6
    for the schedules tested. (It was |z_i| dbeta / u: the largest item, z = 0, was allowed
    12 ulps however far beta's error moved its normaliser.)
    """
    x = np.asarray(x, dtype=np.float64)
    finite = x[np.isfinite(x)]
    z = np.where(np.isfinite(x), x - (finite.max() if finite.size else 0.0), 0.0)
    masked = x == -np.inf
    with np.errstate(under="ignore"):
        w = np.where(masked, 0.0, np.exp(beta * z))
    zbar = float(np.sum(w * np.where(masked, 0.0, z)) / np.sum(w)) if np.sum(w) > 0 else 0.0
    u = U[dtype]
    dbeta = 6.0 * h_ulps * u * max(1.0, abs(beta) * 4.0)
    return 12.0 + 3.0 * (np.abs(beta * z) + abs(beta * zbar)) + np.abs(z - zbar) * dbeta / u


def check_adaptive(row, dtype, schedule=None, eps=0.0) -> None:
    x = np.asarray(row, dtype=dtype)
    got = cpu.adaptive_softmax(x, schedule=schedule, entropy_eps=eps)
    exact = reference.adaptive_softmax(x, schedule=schedule, entropy_eps=eps, dtype=dtype)
    assert got.dtype == dtype
    assert np.array_equal(np.isnan(got), np.isnan(exact))
    b = float(reference.beta(x, schedule=schedule, entropy_eps=eps))
    err = ulp_error(got, exact, dtype)
    bound = allowed_ulps(x, b if b == b else 1.0, dtype)
    ok = np.isnan(exact) | (err <= bound)
    assert ok.all(), (x.tolist(), got.tolist(), exact.tolist(), err.max())


def check_entropy(row, dtype, eps=0.0) -> None:
    x = np.asarray(row, dtype=dtype)
    got = cpu.entropy(x, entropy_eps=eps)
    exact = reference.entropy(x, entropy_eps=eps, dtype=np.float64)
    assert got.dtype == dtype
    if np.isnan(exact):
        assert np.isnan(got)
        return
    # float64: H from float64 exps (a few ulps); float32: from float32 exps, the
    # same few ulps of float32, plus an absolute floor for H near 0
    tol = 16 * U[dtype] * abs(float(exact)) + 4 * U[dtype] * max(1.0, math.log(max(x.size, 1)))
    assert abs(float(got) - float(exact)) <= tol, (x.tolist(), float(got), float(exact))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@given(row=logit_rows(min_size=1, max_size=40, lo=-30.0, hi=30.0))
@example(row=[0.0, -50.0])
@example(row=[0.0, -745.0, -1000.0])
@example(row=[1.0, 1.0, 1.0, 1.0])
# beta off by 28 u moved the largest item's normaliser by 16 ulps, where |z_i| dbeta allowed 12
@example(row=[2.0136272433670777, 1.1336272433670778, 0.22362724336707773, -0.2, -0.59, 1.13,
              -1.19, -0.81, -2.44, -0.38, -1.09, 0.17, -0.25, 0.55, 0.12, -0.33, 0.4, -1.7, 0.87,
              0.07, 0.39, -2.29, -1.08, -0.33, 0.71, 0.44, 1.24, -0.9, -1.03, -1.83, -0.61, -1.14,
              -1.26, 1.23, 0.35, -0.02, 0.07, -1.21, 1.03])  # fmt: skip
def test_adaptive_softmax_matches_reference(dtype, row) -> None:
    check_adaptive(row, dtype)
    check_entropy(row, dtype)


@pytest.mark.parametrize("schedule", SCHEDULES[1:])
@given(row=logit_rows(min_size=1, max_size=30, lo=-20.0, hi=20.0))
@settings(max_examples=20)
@example(row=[0.0, NEG_INF])  # found by the thorough profile: LogLength gives beta = 0 here
def test_every_schedule(schedule, row) -> None:
    check_adaptive(row, np.float64, schedule)


@given(row=logit_rows(min_size=1, max_size=30, lo=-20.0, hi=20.0))
@settings(max_examples=20)
def test_entropy_eps_mode(row) -> None:
    check_adaptive(row, np.float64, None, 1e-9)
    check_entropy(row, np.float64, 1e-9)


ADVERSARIAL = {
    "one_hot": [0.0] + [-60.0] * 20,
    "near_one_hot": [0.0, -30.0, -31.0, -32.0],
    "huge_magnitude": [1e300, 1e300 - 2e284, -1e300],
    "subnormal_outputs": [0.0, -700.0, -740.0, -744.0],
    "ties": [3.0, 3.0, 3.0, -1.0, -1.0],
    "tiny_spread": [1.0, 1.0 + 2**-52, 1.0 - 2**-53],
    "masked": [NEG_INF, 2.0, NEG_INF, -1.0],
    "window": list(np.linspace(-4, 4, 40)),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_rows(name, dtype) -> None:
    row = np.asarray(ADVERSARIAL[name], dtype=np.float64)
    if dtype == np.float32:
        row = row[np.abs(row) < 1e30]
    check_adaptive(row, dtype)
    check_entropy(row, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_long_rows_against_reference(dtype) -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(scale=3.0, size=3000)
    x[:30] += 16.0
    check_adaptive(x, dtype)
    flat = rng.normal(scale=0.5, size=3000)
    check_adaptive(flat, dtype)
    assert float(cpu.beta(flat)) == 1.0 and float(cpu.beta(x)) > 1.0


def test_chunked_row_against_unchunked_and_reference() -> None:
    """A row longer than CHUNK takes the chunked path; it agrees with the row path."""
    rng = np.random.default_rng(3)
    n = cpu.CHUNK * 2 + 123
    x = rng.normal(scale=2.0, size=n)
    x[:200] += 14.0
    got = cpu.adaptive_softmax(x)
    # same row with the last item duplicated masked-out keeps its values: compare
    # against the reference on a subsample via the exact beta and scaling
    b = float(cpu.beta(x))
    h = float(cpu.entropy(x))
    assert b > 1.0
    href = float(reference.entropy(x))
    assert abs(h - href) <= 1e-12 * href
    z = x - x.max()
    ref = np.exp(b * z)
    ref /= ref.sum()
    assert np.max(np.abs(got - ref) / ref) < 1e-11
    assert abs(got.sum() - 1.0) < 1e-12


@pytest.mark.parametrize("threads", [1, 2])
def test_identical_bits_for_any_thread_count(threads) -> None:
    import numba

    rng = np.random.default_rng(11)
    long_row = rng.normal(scale=3.0, size=cpu.CHUNK * 3 + 5)
    long_row[:300] += 12.0
    batch = rng.normal(scale=3.0, size=(37, 700)).astype(np.float32)
    previous = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        base = [cpu.adaptive_softmax(long_row), cpu.adaptive_softmax(batch), cpu.softmax(batch)]
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        again = [cpu.adaptive_softmax(long_row), cpu.adaptive_softmax(batch), cpu.softmax(batch)]
    finally:
        numba.set_num_threads(previous)
    for a, b in zip(base, again, strict=True):
        assert a.tobytes() == b.tobytes()


def test_small_calls_run_their_kernels_on_one_thread(monkeypatch) -> None:
    """Every call opened a parallel region, whose cost outweighs a small call's work and,
    where the cores are busy with other processes (pytest-xdist's workers), GNU OpenMP's
    spinning workers multiply: the default check of ``adaptive_attention`` (many calls on
    a few logits) took 26.0 and 26.9 s in two processes on two cores, and 15.3 and 14.8 s
    with small calls on one thread. A call with less work than ``GRAIN`` logits (for
    attention weighted by the head dims), or with one piece for the threads to share
    (one row, one group of 16 rows, one chunk, one query), now runs on one thread, larger
    calls on the process's count, and the caller's count is restored after the call, a
    raising one included."""
    import numba

    threads = min(2, numba.config.NUMBA_NUM_THREADS)
    seen: list[tuple[str, int]] = []

    def spy(name: str) -> None:
        kernel = getattr(cpu._k, name)

        def wrapper(*args):
            seen.append((name, numba.get_num_threads()))
            if isinstance(args[0], np.ndarray) and args[0].size == 13:
                raise RuntimeError("planted")
            return kernel(*args)

        monkeypatch.setattr(cpu._k, name, wrapper)

    for name in ("rows_softmax_short", "rows_softmax", "rows_adaptive", "attention_stats",
                 "chunk_states", "chunks_write"):  # fmt: skip
        spy(name)
    rng = np.random.default_rng(3)
    previous = numba.get_num_threads()
    try:
        numba.set_num_threads(threads)
        q1, k, v = rng.normal(size=(1, 8)), rng.normal(size=(5000, 8)), rng.normal(size=(5000, 8))
        q64, wide = rng.normal(size=(64, 8)), rng.normal(size=(64, 64, 64))
        many, row = rng.normal(size=(64, cpu.GRAIN // 16)), rng.normal(size=4 * cpu.GRAIN)
        long_rows = rng.normal(size=(17, 2048))  # rows_adaptive's groups of 16 rows
        calls = {
            "few rows": (lambda: cpu.softmax(rng.normal(size=(3, 16))), 1),
            "many rows": (lambda: cpu.softmax(many), threads),
            "one long row": (lambda: cpu.softmax(row), 1),
            "one group of rows": (lambda: cpu.adaptive_softmax(long_rows[:16]), 1),
            "two groups of rows": (lambda: cpu.adaptive_softmax(long_rows), threads),
            "one query over many keys": (lambda: cpu.adaptive_attention(q1, k, v), 1),
            "few logits, small heads": (lambda: cpu.adaptive_attention(q64, k[:32], v[:32]), 1),
            "few logits, heads of 64": (lambda: cpu.adaptive_attention(*wide[:3]), threads),
            "a chunk": (lambda: cpu.StreamingSoftmax().update(row), 1),
            "two chunks": (lambda: cpu.StreamingSoftmax().update(np.zeros(cpu.CHUNK + 1)),
                           threads),
        }  # fmt: skip
        for label, (call, want) in calls.items():
            seen.clear()
            call()
            assert seen and all(n == want for _, n in seen), (label, seen)
            assert numba.get_num_threads() == threads, label
        with pytest.raises(RuntimeError, match="planted"):
            cpu.StreamingSoftmax().update(np.zeros(13))
        assert numba.get_num_threads() == threads
    finally:
        numba.set_num_threads(previous)


def test_polynomial_beta_is_bitwise_beta_float() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(scale=rng.uniform(0.1, 6.0, size=(200, 1)), size=(200, 50))
    h = cpu.entropy(x)
    sched = PaperPolynomial()
    want = sched.beta_float(h, np.full(200, 50))
    got = cpu.beta(x)
    assert got.tobytes() == want.tobytes()


SPECIAL = [
    ([0.0, NEG_INF, 1.0], "masked"),
    ([NEG_INF, NEG_INF], "all_masked"),
    ([1.0, math.nan, 0.0], "nan"),
    ([1.0, math.inf, 0.0], "plus_inf"),
    ([math.nan, NEG_INF], "nan_masked"),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize(("row", "name"), SPECIAL)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_special_value_table(row, name, dtype, schedule) -> None:
    x = np.asarray(row, dtype=dtype)
    for fn in (cpu.softmax, cpu.adaptive_softmax):
        kwargs = {} if fn is cpu.softmax else {"schedule": schedule}
        got = fn(x, **kwargs)
        assert got.dtype == dtype
        if name in ("nan", "plus_inf", "nan_masked"):
            assert np.isnan(got).all()
        elif name == "all_masked":
            assert got.tolist() == [0.0, 0.0]
        else:
            assert got[1] == 0.0 and got[0] > 0 and got[2] > 0
    h = cpu.entropy(x)
    b = cpu.beta(x, schedule=schedule)
    if name in ("nan", "plus_inf", "nan_masked"):
        assert np.isnan(h) and np.isnan(b)
    elif name == "all_masked":
        assert h == 0.0 and b == 1.0
    else:
        exact = reference.entropy(x, dtype=dtype)
        assert abs(float(h) - float(exact)) <= 4 * float(np.spacing(exact))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [1, 3, 64, 2000, cpu.CHUNK + 1])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_nan_of_either_sign_makes_its_row_invalid(n, sign, dtype) -> None:
    # the kernels take a row's maximum over integer order keys without counting NaNs: a
    # NaN with the sign bit set orders below -inf and is found in the sums instead (or,
    # in a row whose maximum is -inf, by a scan). Each row here holds one NaN of the
    # given sign among finite, masked or only masked items; the row next to it is clean.
    nan = math.copysign(math.nan, sign)
    rng = np.random.default_rng(n)
    finite = rng.normal(size=n)
    places = sorted({0, n // 2, n - 1})
    rows = []
    for at in places:
        for rest in ("finite", "masked", "peak"):
            row = np.full(n, NEG_INF) if rest == "masked" else finite.copy()
            if rest == "peak":
                row[(at + 1) % n] += 40.0  # a beta = 1 row but for the NaN
            row[at] = nan
            rows.append(row)
    clean = finite.copy()
    x = np.stack([clean, *rows, clean]).astype(dtype)
    assert (np.signbit(x[1:-1][np.isnan(x[1:-1])]) == (sign < 0)).all()
    want_clean = {
        "softmax": cpu.softmax(clean.astype(dtype)),
        "adaptive_softmax": cpu.adaptive_softmax(clean.astype(dtype)),
        "entropy": cpu.entropy(clean.astype(dtype)),
        "beta": cpu.beta(clean.astype(dtype)),
    }
    for name, want in want_clean.items():
        got = getattr(cpu, name)(x)
        assert np.isnan(got[1:-1]).all(), (name, np.argwhere(~np.isnan(got[1:-1]))[:3])
        for edge in (got[0], got[-1]):
            assert np.asarray(edge).tobytes() == np.asarray(want).tobytes(), name


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_attention_nan_logit_of_either_sign(sign) -> None:
    # the same search for NaNs in adaptive attention's pass 1, which takes the maximum of
    # each block of logits: an additive mask entry NaN makes that query's logit NaN
    rng = np.random.default_rng(3)
    S = 2 * cpu_kernels.KEY_BLOCK + 5
    q, k, v = (rng.normal(size=(1, m, 8)) for m in (6, S, S))
    mask = np.zeros((6, S))
    mask[3:] = NEG_INF  # queries 3..5 see the keys below 4 only
    mask[3:, :4] = 0.0
    nan = math.copysign(math.nan, sign)
    hit = {0: 1, 1: cpu_kernels.KEY_BLOCK + 2, 3: 2, 4: S - 1}  # query: key
    poisoned = mask.copy()
    for i, j in hit.items():
        poisoned[i, j] = nan
    clean = cpu.adaptive_attention(q, k, v, mask)
    got = cpu.adaptive_attention(q, k, v, poisoned)
    for i in range(6):
        if i in hit:
            assert np.isnan(got[0, i]).all(), i
        else:
            assert got[0, i].tobytes() == clean[0, i].tobytes(), i


def test_empty_rows() -> None:
    x = np.zeros((3, 0))
    assert cpu.softmax(x).shape == (3, 0)
    assert cpu.adaptive_softmax(x).shape == (3, 0)
    assert cpu.entropy(x).tolist() == [0.0] * 3
    assert cpu.beta(x).tolist() == [1.0] * 3
    assert cpu.softmax(np.zeros((0, 5))).shape == (0, 5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_axes_order_strides_and_out(dtype) -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(scale=3.0, size=(4, 5, 6)).astype(dtype)
    for axis in (0, 1, 2, -1, -2):
        moved = np.moveaxis(x, axis, -1)
        want = np.moveaxis(cpu.adaptive_softmax(np.ascontiguousarray(moved)), -1, axis)
        got = cpu.adaptive_softmax(x, axis=axis)
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()
        fortran = np.asfortranarray(x)
        assert cpu.adaptive_softmax(fortran, axis=axis).tobytes() == got.tobytes()
        out = np.empty((6, 5, 4), dtype=dtype).transpose()  # non-contiguous destination
        res = cpu.adaptive_softmax(x, axis=axis, out=out)
        assert res is out and np.array_equal(out, got)
        assert np.array_equal(
            cpu.softmax(x[:, ::2, :], axis=axis), cpu.softmax(x[:, ::2, :].copy(), axis=axis)
        )
        ent = cpu.entropy(x, axis=axis)
        assert ent.shape == tuple(s for i, s in enumerate(x.shape) if i != axis % 3)


def test_integer_input_is_float64() -> None:
    assert cpu.softmax(np.arange(4)).dtype == np.float64


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: cpu.softmax(np.array([1 + 1j])), TypeError, "x must be a real floating"),
        (lambda: cpu.softmax(np.array(["a"])), TypeError, "x must be a real floating"),
        (lambda: cpu.softmax(np.float64(1.0)), ValueError, "at least one axis"),
        (lambda: cpu.softmax(np.zeros(3), axis=1), ValueError, "axis 1 is out of range"),
        (lambda: cpu.softmax(np.zeros(3), axis=0.5), TypeError, "axis must be an int"),
        (lambda: cpu.softmax(np.zeros(3), out=np.zeros(4)), ValueError, "out must have shape"),
        (
            lambda: cpu.softmax(np.zeros(3), out=np.zeros(3, np.float32)),
            TypeError,
            "out must have dtype",
        ),
        (lambda: cpu.softmax(np.zeros(3), out=[0, 0, 0]), TypeError, "out must be a numpy array"),
        (lambda: cpu.adaptive_softmax(np.zeros(3), schedule="paper"), TypeError, "schedule must"),
        (lambda: cpu.entropy(np.zeros(3), entropy_eps=-1.0), ValueError, "entropy_eps"),
        (
            lambda: cpu.adaptive_attention(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros((2, 1))),
            ValueError,
            "feature size",
        ),
        (
            lambda: cpu.adaptive_attention(np.zeros(3), np.zeros((2, 3)), np.zeros((2, 1))),
            ValueError,
            "q must have shape",
        ),
        (
            lambda: cpu.adaptive_attention(
                np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 1)), mask=np.array(["x"])
            ),
            TypeError,
            "mask must be",
        ),
    ],
)
def test_clear_errors(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


@given(q=st.integers(1, 4), s=st.integers(1, 300), d=st.integers(1, 6), seed=st.integers(0, 100))
@settings(max_examples=15)
def test_attention_matches_reference(q, s, d, seed) -> None:
    rng = np.random.default_rng(seed)
    qa = rng.normal(scale=2.0, size=(q, d))
    ka = rng.normal(scale=2.0, size=(s, d))
    va = rng.normal(size=(s, 2))
    mask = rng.random((q, s)) < 0.8
    got = cpu.adaptive_attention(qa, ka, va, mask=mask)
    exact = reference.adaptive_attention(qa, ka, va, mask=mask)
    scale = np.abs(va).max()
    assert np.allclose(got, exact, rtol=0, atol=1e-11 * scale * max(1, s) ** 0.5)


def test_attention_special_rows_and_schedules() -> None:
    q = np.array([[1.0, 0.5], [0.0, 1.0], [2.0, -1.0]])
    k = np.random.default_rng(0).normal(size=(200, 2)) * 2
    v = np.random.default_rng(1).normal(size=(200, 3))
    add = np.zeros((3, 200))
    add[1, :] = -np.inf
    add[2, 5] = np.nan
    got = cpu.adaptive_attention(q, k, v, mask=add)
    assert got[1].tolist() == [0.0] * 3 and np.isnan(got[2]).all()
    for sched in SCHEDULES[1:]:
        g = cpu.adaptive_attention(q[:1], k, v, schedule=sched)
        e = reference.adaptive_attention(q[:1], k, v, schedule=sched)
        assert np.allclose(g, e, rtol=0, atol=1e-11)
    f32 = cpu.adaptive_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    assert f32.dtype == np.float32


def test_warm_start_uses_the_cache() -> None:
    """A fresh process imports and runs from the on-disk cache (no compilation)."""
    code = (
        "import numpy as np\n"
        "from softmaxtheory.accelerated import cpu\n"
        "cpu.adaptive_softmax(np.ones((2, 3)))\n"
        "cpu.adaptive_softmax(np.ones((2, 3), np.float32))\n"
        "cpu.adaptive_softmax(np.ones((2, 2000), np.float32))\n"
        "from softmaxtheory.accelerated import _cpu_kernels as k\n"
        "fs = (k.rows_adaptive, k.rows_adaptive_short)\n"
        "print(sum(len(f.stats.cache_hits) for f in fs),"
        " sum(sum(f.stats.cache_misses.values()) for f in fs))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    hits, misses = (int(v) for v in out.stdout.split())
    assert hits >= 1 and misses == 0


@pytest.mark.parametrize(
    "schedule",
    [
        PaperPolynomial(),
        Polynomial(("-1", "3"), "1"),  # a jump at the threshold: no log-free range above it
        Polynomial(("1", "0"), "0.25"),  # beta = max(H, 1): P reaches 1 at H = 1
        Polynomial(("0.5",), "0.5"),  # never above 1
    ],
)
def test_log_free_beta_one_range_is_sound(schedule):
    """Below the cut the schedule's float beta is exactly 1, and the cut is not far below H_on."""
    h_cut = cpu._beta_one_below(schedule)
    theta = float(schedule.exact_threshold)
    assert h_cut >= theta
    if math.isfinite(h_cut):
        grid = np.linspace(0.0, h_cut, 20001)
        assert np.all(schedule.beta_float(grid, 10) == 1.0)
    if isinstance(schedule, PaperPolynomial):
        assert bounds.adaptive_window()[0] - 1e-5 < h_cut < bounds.adaptive_window()[0]


def test_rows_near_the_log_free_cut_match_the_reference():
    """Rows whose entropy sits on either side of H_on take both branches of the kernel."""
    h_on = bounds.adaptive_window()[0]
    rows = []
    for target in (h_on - 1e-3, h_on - 1e-7, h_on + 1e-7, h_on + 1e-3, 0.3, 1e-6):
        for n in (8, 64, 300):
            k = 1
            lo, hi = 0.0, 60.0  # gap d between the top item and the n - 1 others
            for _ in range(200):
                d = 0.5 * (lo + hi)
                e = math.exp(-d)
                s = k + (n - k) * e
                h = math.log(s) + (n - k) * e * d / s
                lo, hi = (d, hi) if h > target else (lo, d)
            row = np.full(n, -0.5 * (lo + hi))
            row[0] = 0.0
            rows.append(row)
    for row in rows:
        for dtype in (np.float64, np.float32):
            x = row.astype(dtype)
            got = cpu.adaptive_softmax(x)
            ref = reference.adaptive_softmax(x, dtype=dtype)
            assert float(cpu.beta(x)) == pytest.approx(float(reference.beta(x)), rel=1e-5, abs=0)
            np.testing.assert_allclose(got, ref, rtol=2e-4 if dtype == np.float32 else 1e-9)


def test_attention_is_causal_matches_the_reference():
    rng = np.random.default_rng(7)
    q = rng.normal(size=(2, 5, 4))
    k = rng.normal(size=(2, 7, 4))
    v = rng.normal(size=(2, 7, 3))
    got = cpu.adaptive_attention(q, k, v, is_causal=True)
    ref = reference.adaptive_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
    free = cpu.adaptive_attention(q, k, v)
    assert not np.allclose(got, free)  # the triangle changed the result
    with pytest.raises(ValueError, match="not both"):
        cpu.adaptive_attention(q, k, v, mask=np.ones((5, 7), bool), is_causal=True)
    with pytest.raises(TypeError, match="is_causal"):
        cpu.adaptive_attention(q, k, v, is_causal=1)


def _block_case(rng, L, S, dtype, kind):
    """Operands whose special rows fall at every position of a block of queries."""
    q = rng.normal(size=(L, 8))
    k = rng.normal(size=(S, 8))
    v = rng.normal(size=(S, 3))
    if L > 2:
        q[2, 5] = np.nan  # one query of the block invalid, the others not
    if L > 4:  # the head of the second block: every logit -inf, yet the row is NaN
        k[:, 0] = np.abs(k[:, 0]) + 0.5
        q[4] = 0.0
        q[4, 0] = -np.inf
    if L > 1:
        q[1] *= 1e200 if dtype == np.float64 else 1e30  # logits beyond the float range
        k[: S // 2] *= 1e200 if dtype == np.float64 else 1e30
    if kind != "additive":  # (an additive -inf does not hide it: every row would be NaN)
        k[S - 1, 0] = np.inf  # the last key: masked by the triangle for early queries
    mask = None
    if kind == "bool":
        mask = rng.random((L, S)) < 0.7
        mask[0] = False  # a fully masked query at the head of a block
    elif kind == "additive":
        mask = np.where(rng.random((L, S)) < 0.7, rng.normal(size=(L, S)), -np.inf)
        mask[L - 1] = -np.inf
    return [a.astype(dtype) for a in (q, k, v)], mask


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "additive"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("L", "S"), [(1, 3), (2, 131), (3, 129), (5, 4), (6, 130), (9, 257)])
def test_attention_query_blocks_match_the_reference(L, S, dtype, kind) -> None:
    """The kernels form the logits of four queries at once (the last block repeats its
    final query) and stop a causal block at its last query's keys: every row of every
    block -- fully masked, invalid (a NaN component), with logits beyond the float range,
    regular -- must still be the reference's, at every query count modulo four and key
    counts on either side of a key block (128)."""
    rng = np.random.default_rng(L * 1000 + S)
    (q, k, v), mask = _block_case(rng, L, S, dtype, kind)
    causal = kind == "causal"
    got = cpu.adaptive_attention(q, k, v, mask=mask, is_causal=causal)
    ref = reference.adaptive_attention(q, k, v, mask=mask, is_causal=causal, dtype=dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=3e-5 if dtype == np.float32 else 1e-12, atol=1e-30)
    for i in range(L):  # each query alone: the same output, whatever its block
        row_mask = None if mask is None else mask[i : i + 1]
        if causal:
            row_mask = np.arange(S)[None] <= i
        one = cpu.adaptive_attention(q[i : i + 1], k, v, mask=row_mask)
        np.testing.assert_allclose(one[0], got[i], rtol=3e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_attention_additive_minus_inf_does_not_hide_a_non_finite_key(dtype) -> None:
    """-inf + NaN is NaN: a key with a NaN component makes every row NaN where the mask
    is additive, -inf on that key included, and no row where a boolean mask drops it
    (the reference's rule). The kernels finish masked rows in one vectorised loop and
    must look for such keys apart."""
    rng = np.random.default_rng(5)
    q = rng.normal(size=(6, 4)).astype(dtype)
    k = rng.normal(size=(140, 4)).astype(dtype)
    v = rng.normal(size=(140, 3)).astype(dtype)
    k[131, 2] = np.nan  # in the second key block
    add = np.zeros((6, 140), dtype)
    add[:, 131] = -np.inf
    keep = np.ones((6, 140), bool)
    keep[:, 131] = False
    for mask in (add, keep):
        got = cpu.adaptive_attention(q, k, v, mask=mask)
        ref = reference.adaptive_attention(q, k, v, mask=mask, dtype=dtype)
        assert np.isnan(ref).all() == (mask.dtype != bool)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_allclose(got, ref, rtol=3e-5 if dtype == np.float32 else 1e-12)


def _broadcast_operands(rng, pattern):
    """q, k, v and a mask over (batch 2, heads 3) slices, broadcast as `pattern` says."""
    views = {
        "own": lambda a: a,
        "shared over heads": lambda a: a[:, :1],  # (2, 1, ...)
        "shared over batch": lambda a: a[:1],  # (1, 3, ...)
        "one for all": lambda a: a[0, 0],  # no leading axes
        "zero strides": lambda a: np.broadcast_to(a[:1, :1], a.shape),
        "transposed": lambda a: np.ascontiguousarray(a.swapaxes(0, 1)).swapaxes(0, 1),
    }
    q = rng.normal(size=(2, 3, 5, 8))
    k = rng.normal(size=(2, 3, 70, 8))
    v = rng.normal(size=(2, 3, 70, 4))
    mask = np.where(rng.random((2, 3, 5, 70)) < 0.8, rng.normal(size=(2, 3, 5, 70)), -np.inf)
    return [views[p](a) for p, a in zip(pattern, (q, k, v, mask), strict=True)]


@pytest.mark.parametrize(
    "pattern",
    [
        ("own", "own", "own", "own"),
        ("own", "shared over heads", "shared over heads", "shared over batch"),
        ("transposed", "one for all", "zero strides", "one for all"),
        ("shared over batch", "transposed", "own", "zero strides"),
        ("zero strides", "own", "shared over batch", "shared over heads"),
    ],
)
def test_attention_slices_are_each_their_own_call(pattern):
    """The kernels run every (batch, head) slice's queries in one parallel loop, each
    operand a stack of its distinct slices: each slice's output must be, bit for bit,
    that slice alone, however its operands broadcast (a shared key stack, a mask per
    batch entry, a zero-stride view, a transposed array)."""
    q, k, v, mask = _broadcast_operands(np.random.default_rng(11), pattern)
    got = cpu.adaptive_attention(q, k, v, mask)
    assert got.shape == (2, 3, 5, 4)
    for b in range(2):
        for h in range(3):
            one = [np.broadcast_to(a, (2, 3, *a.shape[-2:]))[b, h] for a in (q, k, v, mask)]
            alone = cpu.adaptive_attention(*one)
            assert got[b, h].tobytes() == alone.tobytes(), (pattern, b, h)


def test_beta_zero_keeps_masked_items_at_zero():
    """LogLength gives beta = s log 1 = 0 to a row with one unmasked item: 0 * -inf is NaN."""
    sched = LogLength("0.5")
    for n in (2, 5000, CHUNK_PLUS):  # short rows, the general path and the chunked long rows
        x = np.full(n, -np.inf)
        x[1] = 3.0
        for dtype in (np.float64, np.float32):
            got = cpu.adaptive_softmax(x.astype(dtype), schedule=sched)
            assert got[1] == 1.0 and np.count_nonzero(got) == 1
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    got = cpu.adaptive_attention(q, k, v, is_causal=True, schedule=sched)  # query 0: one key
    ref = reference.adaptive_attention(q, k, v, is_causal=True, schedule=sched)
    np.testing.assert_allclose(got, ref, rtol=1e-12)


CHUNK_PLUS = cpu.CHUNK + 3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 5, 64), (2, 1, 1), (4, 7, 0), (0, 3, 5), (1, 2, 1000)])
def test_nonfinite_rows_agree_with_numpy(dtype, shape) -> None:
    """The attention's check of its operands' rows (one pass, no temporary) says what
    ``~isfinite(x).all(axis=2)`` says, for NaN, ±inf, the largest finite values (whose
    product with 0 is still 0) and subnormals, wherever they sit in a row."""
    from softmaxtheory.accelerated import _cpu_kernels as k

    rng = np.random.default_rng(sum(shape))
    specials = np.array([np.nan, np.inf, -np.inf], dtype=dtype)
    finite = np.array(
        [np.finfo(dtype).max, -np.finfo(dtype).max, np.finfo(dtype).smallest_subnormal, -0.0],
        dtype=dtype,
    )
    for trial in range(20):
        x = rng.normal(size=shape).astype(dtype)
        if x.size:
            flat = x.reshape(-1)
            where = rng.integers(0, flat.size, size=rng.integers(0, 4))
            flat[where] = rng.choice(specials if trial % 2 else finite, size=where.size)
        got = np.empty(shape[:2], dtype=np.bool_)
        k.rows_nonfinite(x, got)
        np.testing.assert_array_equal(got, ~np.isfinite(x).all(axis=2), err_msg=str(trial))
