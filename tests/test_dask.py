"""The dask backend: rows chunked along the softmax axis, merged by the T7 monoid.

Checked here: the results against the reference (within the error model) and the
certified mode against it bit for bit; bit identity of a fixed chunking under the
synchronous, threaded and process schedulers and a ``dask.distributed`` LocalCluster
of two worker processes (started and closed by a module fixture); the special-value
table; a row whose chunk maxima are further apart than the float range; argument errors.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("numba")
distributed = pytest.importorskip("distributed")

import dask  # noqa: E402
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from softmaxtheory import reference, testing  # noqa: E402
from softmaxtheory.accelerated import cpu  # noqa: E402
from softmaxtheory.accelerated import dask as dsm  # noqa: E402
from softmaxtheory.accelerated._dask_exact import ExactState  # noqa: E402
from softmaxtheory.spec import Constant, LogLength, Polynomial, Schedule  # noqa: E402

RNG = np.random.default_rng(20261201)

NEG = -np.inf


def _rows(dtype=np.float64) -> np.ndarray:
    """Random and adversarial rows of 300 items (β > 1, β = 1, ties, masks, huge values)."""
    n = 300
    rows = [
        RNG.standard_normal(n) * 3,  # β > 1
        RNG.standard_normal(n) * 0.1,  # β = 1
        np.where(RNG.random(n) < 0.5, NEG, RNG.standard_normal(n)),  # half masked
        np.full(n, 7.0),  # all tied
        np.concatenate([[40.0], np.zeros(n - 1)]),  # one-hot
        RNG.uniform(-0.9, 0.9, n) * float(np.finfo(dtype).max),  # shifts overflow
        np.concatenate([np.full(n - 2, -745.0), [0.0, -1.0]]),  # subnormal exponentials
    ]
    return np.array(rows).astype(dtype)


UNEVEN = (1, 7, 100, 3, 150, 39)  # blocks of the 300-item axis


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adaptive_softmax_matches_the_reference_on_uneven_chunks(dtype):
    x = _rows(dtype)
    dx = da.from_array(x, chunks=(3, UNEVEN))
    got = dsm.adaptive_softmax(dx)
    assert isinstance(got, da.Array) and got.chunks == dx.chunks
    p = got.compute()
    assert p.dtype == dtype
    testing.assert_adaptive_softmax_close(p, x)
    testing.assert_softmax_close(dsm.softmax(dx).compute(), x)
    testing.assert_entropy_close(dsm.entropy(dx).compute(), x)
    testing.assert_entropy_close(dsm.entropy(dx, entropy_eps=1e-9).compute(), x, entropy_eps=1e-9)
    rel = 1e-12 if dtype == np.float64 else 1e-5  # float32 block sums
    assert dsm.beta(dx).compute() == pytest.approx(reference.beta(x), rel=rel)


def test_close_to_the_cpu_backend_for_any_chunking():
    x = _rows()[:3]
    want = cpu.adaptive_softmax(x)
    for chunks in [(3, 300), (1, 1), (2, (299, 1)), (3, (0, 150, 0, 150))]:
        got = dsm.adaptive_softmax(da.from_array(x, chunks=chunks)).compute()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        np.testing.assert_allclose(
            dsm.entropy(da.from_array(x, chunks=chunks)).compute(), cpu.entropy(x), rtol=1e-13
        )


def test_any_axis_and_the_chunking_of_the_other_axes():
    x = RNG.standard_normal((4, 5, 60)) * 2
    for axis in (0, 1, -1):
        dx = da.from_array(x, chunks=(3, 2, 25))
        got = dsm.adaptive_softmax(dx, axis=axis)
        assert got.chunks == dx.chunks
        np.testing.assert_allclose(got.compute(), cpu.adaptive_softmax(x, axis=axis), rtol=1e-12)
        h = dsm.entropy(dx, axis=axis).compute()
        np.testing.assert_allclose(h, cpu.entropy(x, axis=axis), rtol=1e-13)


def test_long_blocks_use_fixed_kernel_chunks():
    """Blocks longer than cpu.CHUNK are split into fixed chunks (the CPU path's split)."""
    n = 2 * cpu.CHUNK + 5
    x = RNG.standard_normal(n).astype(np.float32) * 4
    dx = da.from_array(x, chunks=(cpu.CHUNK + 7, n - cpu.CHUNK - 7))
    p = dsm.adaptive_softmax(dx).compute()
    np.testing.assert_allclose(p, cpu.adaptive_softmax(x), rtol=2e-5, atol=0)
    assert float(dsm.entropy(dx).compute()) == pytest.approx(float(cpu.entropy(x)), rel=1e-6)


def test_float16_and_integer_input():
    h = np.arange(12, dtype=np.float16).reshape(2, 6)
    got = dsm.adaptive_softmax(da.from_array(h, chunks=(1, 4))).compute()
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, cpu.adaptive_softmax(h))
    i = np.arange(12).reshape(2, 6)
    got = dsm.softmax(da.from_array(i, chunks=(2, 5))).compute()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, cpu.softmax(i), rtol=1e-15)


@pytest.mark.parametrize("schedule", [Constant(2.5), LogLength(0.4)])
def test_other_schedules(schedule):
    x = _rows()[:2]
    dx = da.from_array(x, chunks=(1, UNEVEN))
    p = dsm.adaptive_softmax(dx, schedule=schedule).compute()
    testing.assert_adaptive_softmax_close(p, x, schedule=schedule)
    np.testing.assert_array_equal(
        dsm.beta(dx, schedule=schedule).compute(), cpu.beta(x, schedule=schedule)
    )


def test_a_user_schedules_negative_beta_is_refused():
    """A user's β < 0 gave every row a silently uniform output, as on the CPU."""

    class Negative(Schedule):
        needs_entropy = True

        def beta_float(self, entropy, n_eff):
            return -np.ones(np.broadcast(np.asarray(entropy), np.asarray(n_eff)).shape)

        def __repr__(self) -> str:
            return "Negative()"

    dx = da.from_array(_rows()[:2], chunks=(1, UNEVEN))
    with pytest.raises(ValueError, match=r"Negative\(\)\.beta_float returned beta = -1\.0"):
        dsm.adaptive_softmax(dx, schedule=Negative()).compute()


# ---------------------------------------------------------------------------
# certified mode
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_certified_equals_the_reference_bit_for_bit(dtype):
    x = _rows(dtype)[[0, 2, 4, 6]]
    dx = da.from_array(x, chunks=(2, UNEVEN))
    np.testing.assert_array_equal(
        dsm.adaptive_softmax(dx, certified=True).compute(),
        reference.adaptive_softmax(x, dtype=dtype),
    )
    np.testing.assert_array_equal(
        dsm.softmax(dx, certified=True).compute(), reference.softmax(x, dtype=dtype)
    )
    got_h = dsm.entropy(dx, certified=True).compute()
    assert got_h.dtype == dtype
    np.testing.assert_array_equal(got_h, reference.entropy(x, dtype=dtype))
    np.testing.assert_array_equal(dsm.beta(dx, certified=True).compute(), reference.beta(x))


def test_certified_entropy_below_the_subnormals():
    """[0, -781, -903] has entropy near 2**-1116 and a dead item of about the same mass:
    its certification raised PrecisionError, which stopped the whole compute()."""
    x = np.array([[0.0, -781.0, -903.0], [0.0, 1.0, 2.0]])
    got = dsm.entropy(da.from_array(x, chunks=(1, 1)), certified=True).compute()
    np.testing.assert_array_equal(got, reference.entropy(x))
    assert got[0] == 0.0 and got[1] > 0.8


def test_exact_fallback_reads_once_per_fallback_row(monkeypatch):
    """The exact path runs for fallback rows only, and once per row, not once per block.

    Regression: dask fused the reading into each block's task, repeating it per block.
    A guard below the fast pass's range (``entropy_eps = 1e-300``) sends every row to
    the exact path; the default guard sends none.
    """
    import softmaxtheory.accelerated._dask_exact as ex

    calls = []
    read = ex.read_state

    def counted(*args):
        calls.append(1)
        return read(*args)

    monkeypatch.setattr(ex, "read_state", counted)
    x = np.sin(np.arange(2000.0)).reshape(2, 1000) * 8
    dx = da.from_array(x, chunks=(1, 100))
    got = dsm.adaptive_softmax(dx, certified=True).compute(scheduler="sync")
    assert calls == []  # both rows certified from their blocks' enclosures
    np.testing.assert_array_equal(got, reference.adaptive_softmax(x))
    got = dsm.adaptive_softmax(dx, entropy_eps=1e-300, certified=True).compute(scheduler="sync")
    assert len(calls) == 2  # one per row, not one per block (20)
    np.testing.assert_array_equal(got, reference.adaptive_softmax(x, entropy_eps=1e-300))


def _fallbacks(dx, want, **kw):
    from softmaxtheory.accelerated import _dask_cert as ce

    rows = dsm._certified_rows(dx, -1, want, kw.get("schedule"), kw.get("entropy_eps", 0.0))[1]
    return ce.fallbacks(rows.compute(scheduler="sync"))


def test_certified_merges_a_few_numbers_per_block_not_the_row(monkeypatch):
    """Every merged object of the certified graph has a size independent of the row.

    A row of 40 000 distinct values in 40 blocks: the merged records (exact sums,
    bounds, counts and the row's readings) stay below 8 KB each — a whole-row exact
    state would hold 320 KB of distinct values — and no block builds an exact state.
    """
    import pickle

    from softmaxtheory.accelerated import _dask_cert as ce

    sizes = []
    fold = ce.fold

    def measured(parts):
        out = fold(parts)
        sizes.append(len(pickle.dumps(out)))
        return out

    def no_state(row):
        raise AssertionError("an exact state was built for a certified row")

    monkeypatch.setattr(ce, "fold", measured)
    monkeypatch.setattr(ExactState, "of_row", staticmethod(no_state))
    x = RNG.standard_normal(40_000) * 4
    dx = da.from_array(x, chunks=1000)
    for fn, ref, kw in [
        (dsm.adaptive_softmax, reference.adaptive_softmax, {"entropy_eps": 1e-6}),
        (dsm.entropy, reference.entropy, {}),
    ]:
        got = fn(dx, certified=True, **kw).compute(scheduler="sync")
        assert got.tobytes() == ref(x, **kw).tobytes()
    assert len(sizes) >= 5 * 6  # 40 blocks: 5 merges of 8 and a last one, per pass
    assert max(sizes) < 8_000


def test_rows_the_enclosures_cannot_decide_fall_back_to_the_exact_path(monkeypatch):
    """A crafted row whose entropy the enclosures cannot round, and a forced undecided item.

    ``[0, -700, ..., -700]`` (float64): the items at -700 lie beyond the double-double
    range, so their mass is only bounded, and the entropy (about 1e-301) is not decided:
    the row goes to the exact path, and still equals the reference bit for bit.
    A coefficient left undecided by mpmath (forced here) sends its row there too.
    """
    from softmaxtheory.reference import _fast

    x = np.zeros((2, 60))
    x[0, 1:] = -700.0
    x[1] = RNG.standard_normal(60)
    dx = da.from_array(x, chunks=(1, (7, 40, 13)))
    assert list(_fallbacks(dx, "entropy")) == ["the entropy is undecided", ""]
    assert dsm.entropy(dx, certified=True).compute().tobytes() == reference.entropy(x).tobytes()
    # float64 coefficients of items below -600 are each decided by mpmath: make one fail
    y = np.array([[0.0, -1.0, -650.0, -2.0] * 5, [0.0, -1.0, -3.0, -2.0] * 5])
    dy = da.from_array(y, chunks=(2, (3, 9, 8)))
    element = _fast.element_mp
    monkeypatch.setattr(
        _fast,
        "element_mp",
        lambda row, k, *a: None if row.xu[k] == -650.0 else element(row, k, *a),
    )
    assert list(_fallbacks(dy, "softmax")) == ["5 coefficients undecided", ""]
    got = dsm.softmax(dy, certified=True).compute(scheduler="sync")
    monkeypatch.setattr(_fast, "element_mp", element)
    assert got.tobytes() == reference.softmax(y).tobytes()


@pytest.mark.parametrize(
    ("schedule", "eps"),
    [
        (None, 1e-7),
        (Constant(2.5), 0.0),
        (LogLength(0.4), 0.0),
        (Polynomial(coefficients=("0.01", "-0.2", "1.5"), threshold="0.3"), 1e-3),
    ],
)
def test_certified_random_rows_on_uneven_chunks(schedule, eps):
    """Random rows, uneven blocks: bit for bit the reference, none sent to the exact path."""
    x = np.concatenate(
        [RNG.standard_normal((3, 257)) * [[0.3], [2.0], [9.0]], RNG.integers(-4, 4, (1, 257))]
    )
    x[2, RNG.random(257) < 0.3] = NEG
    dx = da.from_array(x, chunks=(3, (1, 100, 2, 60, 94)))
    kw = {"schedule": schedule, "entropy_eps": eps}
    got = dsm.adaptive_softmax(dx, certified=True, **kw).compute()
    assert got.tobytes() == reference.adaptive_softmax(x, **kw).tobytes()
    assert (
        dsm.beta(dx, certified=True, **kw).compute().tobytes() == reference.beta(x, **kw).tobytes()
    )
    h = dsm.entropy(dx, certified=True, entropy_eps=eps).compute()
    assert h.tobytes() == reference.entropy(x, entropy_eps=eps).tobytes()
    assert all(f == "" for f in _fallbacks(dx, "adaptive_softmax", **kw))


@pytest.mark.theorem("T7")
def test_exact_states_merge_as_the_reference_stream_states():
    """T7: any chunking and merge tree of exact states gives the one-pass state.

    The certified mode's compact states (multisets of values) merged in dask's tree
    equal the reference's ``StreamState`` of the whole row, and so do two different
    merge orders of the same chunks.
    """
    x = np.concatenate([RNG.standard_normal(50), [NEG, NEG, 3.0, 3.0], RNG.integers(-3, 3, 40)])
    cuts = [0, 1, 17, 17, 60, 94]
    parts = [ExactState.of_row(x[a:b]) for a, b in zip(cuts, [*cuts[1:], x.size], strict=True)]
    left = parts[0]
    for p in parts[1:]:
        left = left.merge(p)
    right = parts[-1]
    for p in reversed(parts[:-1]):
        right = p.merge(right)
    whole = reference.StreamState.from_logits(x)
    assert left.to_stream_state() == whole == right.to_stream_state()
    stream = reference.StreamState()
    for a, b in zip(cuts, [*cuts[1:], x.size], strict=True):
        stream = stream.update(x[a:b])
    assert stream == whole
    dx = da.from_array(x, chunks=(1, 16, 43, 0, 34))
    assert float(dsm.entropy(dx, certified=True).compute()) == whole.entropy()


# ---------------------------------------------------------------------------
# special values and extreme rows
# ---------------------------------------------------------------------------

SPECIAL = np.array(
    [
        [1.0, NEG, 2.0, NEG, 0.5, 3.0],  # masked entries
        [NEG] * 6,  # fully masked
        [1.0, 2.0, np.nan, 0.0, 1.0, 2.0],  # NaN
        [1.0, np.inf, 2.0, 0.0, 1.0, 2.0],  # +inf
        [NEG, NEG, NEG, np.nan, NEG, NEG],  # NaN in a masked row
    ]
)


@pytest.mark.parametrize("certified", [False, True])
@pytest.mark.parametrize("chunks", [(5, 6), (2, (1, 2, 3)), (1, 1)])
def test_special_value_table(certified, chunks):
    dx = da.from_array(SPECIAL, chunks=chunks)
    kw = {"certified": certified}
    p = dsm.adaptive_softmax(dx, **kw).compute()
    s = dsm.softmax(dx, **kw).compute()
    h = dsm.entropy(dx, **kw).compute()
    b = dsm.beta(dx, **kw).compute()
    for got, want in ((p, cpu.adaptive_softmax(SPECIAL[0])), (s, cpu.softmax(SPECIAL[0]))):
        assert got[0, 1] == 0.0 and got[0, 3] == 0.0 and np.all(got[0, [0, 2, 4, 5]] > 0)
        np.testing.assert_allclose(got[0], want, rtol=1e-14)
        assert np.all(got[1] == 0.0)
        assert np.all(np.isnan(got[2:]))
    np.testing.assert_allclose(h[0], cpu.entropy(SPECIAL[0]), rtol=1e-14)
    assert h[1] == 0.0 and b[1] == 1.0
    assert np.all(np.isnan(h[2:])) and np.all(np.isnan(b[2:]))
    assert b[0] == pytest.approx(float(cpu.beta(SPECIAL[0])), rel=1e-14) and b[0] > 1.0


@pytest.mark.parametrize("certified", [False, True])
def test_empty_rows(certified):
    dx = da.from_array(np.zeros((3, 0)), chunks=(2, 1))
    kw = {"certified": certified}
    assert dsm.adaptive_softmax(dx, **kw).compute().shape == (3, 0)
    np.testing.assert_array_equal(dsm.entropy(dx, **kw).compute(), np.zeros(3))
    np.testing.assert_array_equal(dsm.beta(dx, **kw).compute(), np.ones(3))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_chunk_maxima_further_apart_than_the_float_range(dtype):
    """The finite ⊕: block maxima differ by about 2·max float (their difference overflows)."""
    big = np.finfo(dtype).max
    x = np.concatenate([np.full(5, -big), RNG.standard_normal(5), np.full(5, big)]).astype(dtype)
    x[-1] = np.nextafter(big, 0, dtype=dtype)
    dx = da.from_array(x, chunks=5)
    p = dsm.adaptive_softmax(dx).compute()
    h = dsm.entropy(dx).compute()
    assert np.isfinite(h) and np.all(np.isfinite(p))
    want = cpu.adaptive_softmax(x)
    np.testing.assert_array_equal(p, want)
    assert float(h) == pytest.approx(float(cpu.entropy(x)), rel=1e-12)
    np.testing.assert_array_equal(
        dsm.adaptive_softmax(dx, certified=True).compute(),
        reference.adaptive_softmax(x, dtype=dtype),
    )


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False) | st.just(NEG), min_size=1, max_size=40),
    st.lists(st.integers(0, 12), max_size=5),
)
@example([0.0, NEG, 1.0], [0, 1])
@example([NEG], [])
def test_any_split_is_within_the_error_model(values, cuts):
    x = np.array(values)
    bounds = sorted(min(c, x.size) for c in cuts)
    sizes = tuple(np.diff([0, *bounds, x.size]).tolist())
    dx = da.from_array(x, chunks=(sizes,))
    testing.assert_adaptive_softmax_close(dsm.adaptive_softmax(dx).compute(), x)
    testing.assert_entropy_close(dsm.entropy(dx).compute(), x)


# ---------------------------------------------------------------------------
# bit identity under every scheduler
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_client():
    """Two worker processes (one thread each), started and closed around this module."""
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=50,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


def _graphs():
    x = _rows(np.float32)
    dx = da.from_array(x, chunks=(4, UNEVEN))
    # one dtype: each worker process loads the compiled kernels of each dtype it meets
    y = da.from_array(x[:3], chunks=(1, (13,) * 23 + (1,)))  # 24 blocks: two levels of merges
    return (
        dsm.adaptive_softmax(dx),
        dsm.entropy(dx),
        dsm.beta(y),
        dsm.adaptive_softmax(y, entropy_eps=1e-9),
        dsm.softmax(y),
        dsm.adaptive_softmax(y[:, :40], certified=True),
    )


def test_identical_bits_under_every_scheduler(cluster_client):
    graphs = _graphs()
    want = dask.compute(*graphs, scheduler="sync")
    runs = {
        "threads": dask.compute(*graphs, scheduler="threads", num_workers=2),
        "processes": dask.compute(*graphs, scheduler="processes", num_workers=2),
        "distributed": dask.compute(*graphs, scheduler=cluster_client),
    }
    assert len(cluster_client.scheduler_info()["workers"]) == 2
    for name, got in runs.items():
        for a, b in zip(want, got, strict=True):
            assert a.dtype == b.dtype, name
            assert a.tobytes() == b.tobytes(), name


# ---------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------


FUNCS = [dsm.softmax, dsm.entropy, dsm.beta, dsm.adaptive_softmax]


@pytest.mark.parametrize("fn", FUNCS)
def test_argument_errors_name_the_argument(fn):
    good = da.from_array(np.zeros((2, 3)), chunks=1)
    with pytest.raises(TypeError, match=r"x must be a dask\.array\.Array.*'A dask kernel'"):
        fn(np.zeros((2, 3)))
    taken = re.escape("x must be a real floating (float16, float32, float64) or integer array")
    with pytest.raises(TypeError, match=taken):
        fn(da.from_array(np.zeros(3, dtype=complex)))
    with pytest.raises(TypeError, match=taken):
        fn(da.from_array(np.zeros(3, dtype=bool)))
    with pytest.raises(ValueError, match="x must have at least one axis"):
        fn(da.from_array(np.float64(1.0)))
    with pytest.raises(TypeError, match="axis must be an int"):
        fn(good, axis=1.0)
    with pytest.raises(TypeError, match="axis must be an int"):
        fn(good, axis=True)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        fn(good, axis=2)
    with pytest.raises(TypeError, match="certified must be a bool"):
        fn(good, certified=1)
    if fn is not dsm.softmax:
        with pytest.raises(ValueError, match="entropy_eps"):
            fn(good, entropy_eps=-1e-9)
        with pytest.raises(ValueError, match="entropy_eps"):
            fn(good, entropy_eps=float("nan"), certified=True)


@pytest.mark.parametrize("fn", FUNCS)
def test_masked_chunks_are_refused_with_the_fill_that_removes_them(fn):
    """dask's masked arrays keep their masks in the blocks, which the kernels would read as
    plain values: softmax gave the masked 2.0 a weight of 0.245. The named fill removes it."""
    data = da.from_array(np.array([[1.0, 2.0, 3.0]]), chunks=2)
    x = da.ma.masked_array(data, mask=np.array([[False, True, False]]))
    with pytest.raises(TypeError, match=r"masked-array chunks.*ma\.filled\(x, -np\.inf\)"):
        fn(x)
    if fn is dsm.softmax:
        got = fn(da.ma.filled(x, -np.inf), certified=True).compute()
        np.testing.assert_array_equal(got, reference.softmax(np.array([[1.0, -np.inf, 3.0]])))


def test_unknown_chunk_sizes_are_refused():
    x = da.from_array(np.arange(6.0), chunks=2)
    unknown = x[x > 1]
    with pytest.raises(ValueError, match="x must have known chunk sizes"):
        dsm.softmax(unknown)


class _CountingReader:
    """A 1-d float64 array on "disk" that appends a line to a file at each read."""

    def __init__(self, n: int, log: str) -> None:
        self.shape, self.dtype, self.ndim, self.log = (n,), np.dtype(np.float64), 1, log

    def __getitem__(self, key):
        k = key[0] if isinstance(key, tuple) else key
        with open(self.log, "a") as f:
            f.write(f"{k.start}\n")
        return np.sin(np.arange(k.start, k.stop, dtype=np.float64)) * 8


def test_every_pass_reads_its_blocks_afresh(tmp_path):
    """No block is kept from one pass to the next (memory: a few blocks, not the row)."""
    log = tmp_path / "reads"
    x = da.from_array(_CountingReader(1000, str(log)), chunks=100, meta=np.empty(0))
    p = dsm.adaptive_softmax(x).compute(scheduler="threads")
    reads = log.read_text().split()
    assert sorted(set(reads)) == sorted(str(i) for i in range(0, 1000, 100))
    assert float(dsm.beta(x).compute()) > 1.0  # so three passes: states, tempered, write
    assert len(reads) == 30
    np.testing.assert_allclose(p, cpu.adaptive_softmax(np.sin(np.arange(1000.0)) * 8), rtol=1e-12)


def test_lazy_until_computed():
    def boom(block):
        raise AssertionError("computed too early")

    x = da.from_array(np.zeros((2, 8)), chunks=(1, 3)).map_blocks(boom, dtype=np.float64)
    for fn in FUNCS:
        assert isinstance(fn(x), da.Array)
        assert isinstance(fn(x, certified=True), da.Array)


def test_certified_config_names_an_unknown_quantity():
    """A misspelt reading fails loudly instead of computing a different one."""
    from softmaxtheory.accelerated import _dask_cert as ce

    with pytest.raises(ValueError, match="want must be one of"):
        ce.Config("adaptive", None, 0.0, np.dtype(np.float64), 3)


def test_the_large_row_example_runs_end_to_end(tmp_path):
    """docs/examples/dask_large_row.py, at a small row: its certified step called a private
    helper with a name that had changed ('adaptive') and raised ValueError after the float
    runs; no test ran it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "docs" / "examples" / "dask_large_row.py"
    out = tmp_path / "run.json"
    argv = [
        sys.executable, str(script), "--n", "200000", "--chunk", "50000", "--workers", "1",
        "--certified-n", "20000", "--certified-chunk", "5000", "--dir", str(tmp_path / "d"),
        "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(script.parents[2])}
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    cert = doc["certified"]
    assert cert["equals_reference_bit_for_bit"] is True
    assert cert["same_bits_threads_and_cluster"] is True
    assert cert["n"] == 20000


def test_stacked_arrays_of_different_chunks():
    """da.stack of two differently chunked rows: dask's clone corrupts the graph of
    rechunk-merge task objects it makes (dask/dask#12455), and softmax, adaptive_softmax and
    the certified entropy raised "Cannot fuse tasks with multiple outputs" at compute."""
    x = np.random.default_rng(0).normal(size=(2, 9))
    b = da.stack([da.from_array(x[0], chunks=4), da.from_array(x[1], chunks=5)])
    assert np.array_equal(dsm.softmax(b).compute(), cpu.softmax(x))
    assert np.array_equal(
        dsm.adaptive_softmax(b, certified=True).compute(), reference.adaptive_softmax(x)
    )
    assert np.array_equal(dsm.entropy(b, certified=True).compute(), reference.entropy(x))
    testing.assert_adaptive_softmax_close(dsm.adaptive_softmax(b).compute(), x)


@pytest.mark.parametrize(
    ("func", "kind", "dtype"),
    [
        ("softmax", "softmax", "float64"),
        ("entropy", "entropy", "float16"),
        ("adaptive_softmax", "adaptive_softmax", "float32"),
    ],
)
def test_the_backend_conforms_through_the_documented_wrapper(func, kind, dtype):
    """docs/examples/dask_kernels.py: numpy in, dask blocks (three per row), numpy out.
    Through it the conformance suite runs every property of the kind on the dask backend
    (examples cut to 3 per property here; the guide reports the default run)."""
    from softmaxtheory import conformance as conf
    from tests.support.broken_kernels import example as load

    kernel = load("dask_kernels", func)
    target = conf.Target(kernel, f"dask_kernels:{func}", kind=kind, dtype=dtype, examples=3)
    results = conf.run_conformance(target)
    failed = [r for r in results if r.status == "fail"]
    assert not failed, "\n\n".join(f"{r.name}: {r.message}" for r in failed)
    assert sum(r.status == "pass" for r in results) >= 9


@pytest.mark.parametrize("certified", [False, True])
def test_an_integer_float64_cannot_hold_is_refused_at_compute(certified):
    """[2**53, 2**53 + 1] in two chunks gave 0.5 each, also with certified=True, which
    promises the reference's bits where the reference refuses the input: each block now
    refuses it when computed, naming x."""
    x = np.array([2**53, 2**53 + 1], dtype=np.int64)
    for f in (dsm.softmax, dsm.entropy, dsm.adaptive_softmax):
        with pytest.raises(ValueError, match=r"x holds the integer 9007199254740993"):
            f(da.from_array(x, chunks=1), certified=certified).compute()
    held = np.array([2**60, 2**60 + 256], dtype=np.int64)
    got = dsm.softmax(da.from_array(held, chunks=1), certified=certified).compute()
    np.testing.assert_array_equal(got, reference.softmax(held))
