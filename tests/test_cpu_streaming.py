"""The CPU streaming object (theorem T7): chunkings, merge orders, memory-mapped rows."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

pytest.importorskip("numba")

from hypothesis import example, given, settings
from hypothesis import strategies as st

from softmaxtheory import reference
from softmaxtheory.accelerated import cpu
from softmaxtheory.spec import Constant, LogLength


def stream(x, cuts, schedule=None, dtype=np.float64, order=None):
    parts = np.split(x, cuts)
    states = [cpu.StreamingSoftmax(schedule, dtype).update(p) for p in parts]
    order = order or list(range(len(states)))
    total = states[order[0]]
    for i in order[1:]:
        total = total + states[i]
    if total.needs_tempered_pass:
        for p in parts:
            total.update_tempered(p)
    return total, np.concatenate([total.normalize(p) for p in parts])


@st.composite
def rows_and_chunkings(draw):
    n = draw(st.integers(1, 400))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=draw(st.floats(0.1, 8.0)), size=n)
    if draw(st.booleans()):
        x[rng.random(n) < 0.2] = -np.inf
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    order = draw(st.permutations(range(len(cuts) + 1)))
    return x, cuts, list(order)


@pytest.mark.theorem("T7")
@given(case=rows_and_chunkings())
@settings(max_examples=40)
def test_any_chunking_and_merge_order(case) -> None:
    """Any chunking and merge order of the CPU stream gives the one-pass output and entropy."""
    x, cuts, order = case
    state, p = stream(x, cuts, order=order)
    whole = cpu.adaptive_softmax(x)
    assert np.allclose(p, whole, rtol=1e-12, atol=0)
    assert abs(state.entropy() - float(cpu.entropy(x))) <= 1e-13 * max(1.0, state.entropy())
    assert state.count == x.size and state.n_eff == int(np.sum(x > -np.inf))


@pytest.mark.theorem("T7")
def test_identity_and_entropy_against_reference() -> None:
    """A stream with empty chunks and a tempered pass matches the reference entropy and output."""
    rng = np.random.default_rng(0)
    x = rng.normal(scale=3.0, size=2000)
    x[:20] += 14.0
    state, p = stream(x, [0, 0, 700, 700, 1500])
    assert state.needs_tempered_pass
    h = float(reference.entropy(x))
    assert abs(state.entropy() - h) <= 4e-16 * h
    exact = reference.adaptive_softmax(x)
    assert np.max(np.abs(p - exact) / exact) < 1e-12


@pytest.mark.theorem("T7")
def test_a_maximum_rising_by_one_small_step_per_item_does_not_drift() -> None:
    """An ALiBi-like row fed an item at a time stays near the one-pass error.

    Each item is a new maximum, so every update rescales the running sums by the same
    factor :math:`e^{-2^{-16}}`; with that factor rounded once (``exp``) its error added
    up over the 20,000 merges to 2,980 ulps (the error model allows 2,170 here).
    """
    from softmaxtheory import testing

    x = np.arange(20_000) * 2.0**-16
    state = cpu.StreamingSoftmax(Constant("1"))
    for i in range(x.size):
        state.update(x[i : i + 1])
    report = testing.assert_softmax_close(state.normalize(x), x)
    assert report.max_ulp <= 64
    assert abs(state.entropy() - float(reference.entropy(x))) <= 64 * 2.0**-52 * state.entropy()


@pytest.mark.parametrize("schedule", [Constant("1"), Constant("2.5"), LogLength("0.5")])
def test_schedules(schedule) -> None:
    x = np.random.default_rng(1).normal(scale=2.0, size=500)
    _, p = stream(x, [100, 333], schedule)
    assert np.allclose(p, cpu.adaptive_softmax(x, schedule=schedule), rtol=1e-12, atol=0)


def test_special_rows() -> None:
    s, p = stream(np.array([1.0, np.nan, 0.0]), [1])
    assert np.isnan(s.entropy()) and np.isnan(p).all()
    s, p = stream(np.array([-np.inf, -np.inf]), [1])
    assert s.entropy() == 0.0 and s.beta() == 1.0 and p.tolist() == [0.0, 0.0]
    empty = cpu.StreamingSoftmax()
    assert empty.entropy() == 0.0 and empty.beta() == 1.0 and empty.count == 0


def test_normalize_before_tempered_pass_is_refused() -> None:
    x = np.random.default_rng(2).normal(scale=3.0, size=300)
    state = cpu.StreamingSoftmax(Constant("2")).update(x)
    assert state.needs_tempered_pass
    with pytest.raises(RuntimeError, match="update_tempered"):
        state.normalize(x)
    state.update_tempered(x[:100])
    with pytest.raises(RuntimeError, match="100 of 300"):
        state.normalize(x)


def test_update_after_normalize_is_refused() -> None:
    """Where beta = 1 no tempered pass closes pass 1: an update() after normalize() was
    accepted, and the values written before it and after summed to 2."""
    a, b = np.zeros(1000), np.full(20, 8.0)
    state = cpu.StreamingSoftmax().update(a)
    assert not state.needs_tempered_pass
    first = state.normalize(a)
    with pytest.raises(RuntimeError, match="update\\(\\) after normalize"):
        state.update(b)
    np.testing.assert_array_equal(state.normalize(a), first)  # the state is unchanged
    # a normalize() that raises (tempered pass incomplete) does not close the state
    sharp = cpu.StreamingSoftmax(Constant("2")).update(a)
    with pytest.raises(RuntimeError, match="update_tempered"):
        sharp.normalize(a)
    sharp.update(b)
    sharp.update_tempered(a).update_tempered(b)
    total = sharp.normalize(a).sum() + sharp.normalize(b).sum()
    assert abs(total - 1.0) < 1e-12


def test_errors() -> None:
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        cpu.StreamingSoftmax(dtype=np.int32)
    with pytest.raises(ValueError, match="chunk must be 1-d"):
        cpu.StreamingSoftmax().update(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="merge with a StreamingSoftmax"):
        cpu.StreamingSoftmax().merge(3)
    with pytest.raises(TypeError, match="chunk must be a real floating"):
        cpu.StreamingSoftmax().update(np.array([1j]))


def test_memory_mapped_file_in_chunks(tmp_path) -> None:
    n = cpu.CHUNK * 3 + 17
    rng = np.random.default_rng(3)
    x = rng.normal(scale=3.0, size=n).astype(np.float32)
    x[:500] += 14.0
    path = tmp_path / "row.npy"
    np.save(path, x)
    mm = np.load(path, mmap_mode="r")
    step = 50_000
    state = cpu.StreamingSoftmax(dtype=np.float32)
    for i in range(0, n, step):
        state.update(mm[i : i + step])
    if state.needs_tempered_pass:
        for i in range(0, n, step):
            state.update_tempered(mm[i : i + step])
    out = np.lib.format.open_memmap(tmp_path / "out.npy", mode="w+", dtype=np.float32, shape=(n,))
    for i in range(0, n, step):
        state.normalize(mm[i : i + step], out=out[i : i + step])
    whole = cpu.adaptive_softmax(x)
    assert np.allclose(out, whole, rtol=1e-5, atol=0)
    assert abs(float(out.astype(np.float64).sum()) - 1.0) < 1e-4


def test_npy_streaming_example_matches_the_in_memory_kernel(tmp_path):
    """docs/examples/stream_npy.py: memory-mapped chunks give the in-memory result."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "docs" / "examples" / "stream_npy.py"
    spec = importlib.util.spec_from_file_location("stream_npy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(5)
    row = (rng.normal(scale=3.0, size=300_001)).astype(np.float32)
    row[:700] += 14.0  # entropy inside the window: the tempered pass runs
    src, dst = tmp_path / "row.npy", tmp_path / "out.npy"
    np.save(src, row)
    report = module.adaptive_softmax_npy(str(src), str(dst), chunk=1 << 16)
    assert report["beta"] > 1.0
    got = np.load(dst)
    expected = cpu.adaptive_softmax(row)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=0)
    assert report["sum"] == pytest.approx(1.0, abs=1e-5)
    # its command line: a usage line, not a traceback, for missing or bad arguments
    assert module.main([]) == 2 and module.main([str(src), str(dst), "0"]) == 2
    assert module.main([str(src), str(dst), "65536"]) == 0


# ---------------------------------------------------------------------------
# merging tempered sums: only copies of one pass-1 state, for a parallel pass 2
# ---------------------------------------------------------------------------

#: the report's row: two parts whose own β (1.748 and 2.399) differ from the row's
X1 = np.r_[np.zeros(20), 4.0]
X2 = np.r_[np.zeros(200), 4.0]

COPIERS = {
    "deepcopy": copy.deepcopy,
    "copy": copy.copy,
    "pickle": lambda s: pickle.loads(pickle.dumps(s)),
}


def test_merge_refuses_tempered_sums_for_another_beta() -> None:
    """Each part's own pass 2 (same maximum, β 1.748 and 2.399) merged silently gave a row
    summing to 0.991; the merge now raises, naming both β."""
    a = cpu.StreamingSoftmax().update(X1).update_tempered(X1)
    b = cpu.StreamingSoftmax().update(X2).update_tempered(X2)
    assert a.max == b.max and a.beta() != b.beta()
    for left, right in ((a, b), (b, a)):
        with pytest.raises(ValueError, match=r"different maxima or β") as info:
            left + right
        assert repr(a.beta()) in str(info.value) and repr(b.beta()) in str(info.value)
    with pytest.raises(ValueError, match="merge the pass-1 states of every part first"):
        a.merge(b)


def test_merge_refuses_a_state_in_pass_two_with_one_in_pass_one() -> None:
    """Tempered sums merged with a pass-1 state (then completed) were relative to a part's
    β: refused, in either order."""
    a = cpu.StreamingSoftmax().update(X1).update_tempered(X1)
    b = cpu.StreamingSoftmax().update(X2)
    for left, right in ((a, b), (b, a)):
        with pytest.raises(ValueError, match="one is in pass 2 and the other is not a copy"):
            left + right


def test_merge_refuses_equal_states_computed_separately() -> None:
    """Two states fed the same items separately are two parts of a row (the row twice),
    not copies: their tempered sums are not merged as a parallel pass 2."""
    a = cpu.StreamingSoftmax().update(X1).update_tempered(X1[:5])
    b = cpu.StreamingSoftmax().update(X1).update_tempered(X1[5:])
    with pytest.raises(ValueError, match="equal but were computed separately"):
        a + b


@pytest.mark.parametrize("feed", [[], [np.zeros(0)], [np.zeros(0), np.zeros(0)]])
def test_copies_of_an_empty_state_merge_in_pass_two(feed) -> None:
    """A state fed no items has no lineage to tell copies by: copies of it, each in pass
    2, were refused as "equal but computed separately", against the copy-and-merge
    recipe. Any two such states are copies of the empty row."""
    s = cpu.StreamingSoftmax()
    for chunk in feed:
        s.update(chunk)
    a, b = copy.deepcopy(s), copy.copy(s)
    a.update_tempered(np.zeros(0))
    b.update_tempered(np.zeros(0))
    merged = a + b
    assert merged.count == 0 and merged.entropy() == 0.0
    assert merged.normalize(np.zeros(0)).shape == (0,)


def test_a_float32_state_refuses_finite_values_beyond_its_range() -> None:
    """A float64 chunk holding 1e39, converted to a float32 state, became +inf and the row
    NaN (numpy's overflow warning aside); it is refused, by every method that takes a
    chunk, and infinities given as such keep their meaning."""
    s = cpu.StreamingSoftmax(dtype=np.float32).update(np.array([1.0, 2.0]))
    for method in (s.update, s.normalize):
        with pytest.raises(ValueError, match=r"chunk holds -1e\+39, beyond the range"):
            method(np.array([1.0, -1e39]))
    assert s.count == 2 and s.entropy() == pytest.approx(0.5822031, rel=1e-6)
    t = cpu.StreamingSoftmax(dtype=np.float32).update(np.array([1.0, -np.inf, 3e38]))
    assert t.count == 3 and t.entropy() == 0.0


@st.composite
def parallel_pass_two(draw):
    """A row, its chunking and merge order, and pass 2 spread over 1 to 4 copies."""
    x, cuts, order = draw(rows_and_chunkings())
    workers = draw(st.integers(1, 4))
    owner = draw(
        st.lists(st.integers(0, workers - 1), min_size=len(cuts) + 1, max_size=len(cuts) + 1)
    )
    merge_order = list(draw(st.permutations(range(workers))))
    return x, cuts, order, owner, merge_order


@pytest.mark.theorem("T7")
@given(
    case=parallel_pass_two(),
    copier=st.sampled_from(sorted(COPIERS)),
    schedule=st.sampled_from([None, Constant("1"), LogLength("0.5")]),
)
@settings(max_examples=40, deadline=None)
# the report: deep copies of the merged state, one part each (count 602, not 301)
@example(case=(np.r_[X1, X2], [21], [0, 1], [0, 1], [0, 1]), copier="deepcopy", schedule=None)
# β = 1: update_tempered is a no-op, the doubled pass 1 halved every probability
@example(case=(X2, [50], [1, 0], [1, 1], [1, 0]), copier="pickle", schedule=Constant("1"))
def test_parallel_pass_two_on_copies_of_the_merged_state(case, copier, schedule) -> None:
    """Pass 2 on copies of the merged pass-1 state, each fed some chunks (perhaps none),
    merged in any order: the reference's probabilities, with pass 1 counted once."""
    x, cuts, order, owner, merge_order = case
    parts = np.split(x, cuts)
    states = [cpu.StreamingSoftmax(schedule).update(p) for p in parts]
    merged = states[order[0]]
    for i in order[1:]:
        merged = merged + states[i]
    copies = [COPIERS[copier](merged) for _ in merge_order]
    for cp in copies:
        cp.update_tempered(np.empty(0))  # every worker enters pass 2, chunks or not
    for part, w in zip(parts, owner, strict=True):
        copies[w].update_tempered(part)  # a no-op when β = 1
    final = copies[merge_order[0]]
    for w in merge_order[1:]:
        final = final + copies[w]
    assert final.count == x.size and final.n_eff == int(np.sum(x > -np.inf))
    p = np.concatenate([final.normalize(part) for part in parts])
    exact = reference.adaptive_softmax(x, schedule=schedule)
    np.testing.assert_allclose(p, exact, rtol=1e-12, atol=0)
    np.testing.assert_allclose(p, cpu.adaptive_softmax(x, schedule=schedule), rtol=1e-12, atol=0)


def test_merged_copies_fed_too_much_or_other_items_are_refused() -> None:
    """Copies that together were fed more items than the row, or other items, raise a
    ValueError at the merge (not a misleading 'feed every chunk' error at normalize)."""
    merged = cpu.StreamingSoftmax().update(X1) + cpu.StreamingSoftmax().update(X2)
    assert merged.needs_tempered_pass and merged.count == 222
    a, b = copy.deepcopy(merged), copy.deepcopy(merged)
    for s in (a, b):
        s.update_tempered(X1).update_tempered(X2)
    with pytest.raises(ValueError, match=r"fed 444 items .* more than the 222"):
        a + b
    c, d = copy.deepcopy(merged), copy.deepcopy(merged)
    c.update_tempered(X1).update_tempered(X2[:100])
    d.update_tempered(X2[:101])  # X2[100:] was due: the same count, other items
    with pytest.raises(ValueError, match="not those fed to update"):
        c + d


def test_pass_one_merges_of_copies_are_the_monoid() -> None:
    """In pass 1 a state merged with itself or a copy is the row twice (T7's ⊕, as the
    reference's StreamState); only copies in pass 2 keep pass 1 once."""
    s = cpu.StreamingSoftmax().update(X1)
    for twice in (s + s, s + copy.deepcopy(s), s + pickle.loads(pickle.dumps(s))):
        assert twice.count == 2 * X1.size
        row = np.r_[X1, X1]
        assert twice.entropy() == pytest.approx(float(reference.entropy(row)), rel=1e-12)
        assert (reference.StreamState.from_logits(X1) + reference.StreamState.from_logits(X1)) == (
            reference.StreamState.from_logits(row)
        )
    # a copy that entered pass 2 with no chunk merges as a pass-2 worker
    merged = cpu.StreamingSoftmax().update(X1) + cpu.StreamingSoftmax().update(X2)
    busy, idle = copy.deepcopy(merged), copy.deepcopy(merged)
    busy.update_tempered(X1).update_tempered(X2)
    idle.update_tempered([])
    done = idle + busy
    assert done.count == X1.size + X2.size
    p = np.concatenate([done.normalize(X1), done.normalize(X2)])
    np.testing.assert_allclose(p, reference.adaptive_softmax(np.r_[X1, X2]), rtol=1e-12)
    with pytest.raises(RuntimeError, match="after the tempered pass started"):
        idle.update(X1)


def test_sum_merges_states_and_a_normalised_state_is_not_merged() -> None:
    """``sum(states)`` failed (0 + state had no meaning), for the parts' pass-1 states and
    for pass-2 copies alike; and a state merged after normalize() gave a row whose values
    did not match those already written (they summed to 1, the merged row's to 0.5)."""
    x = np.random.default_rng(4).normal(0.0, 2.0, 1000)
    parts = np.array_split(x, 4)
    merged = sum(cpu.StreamingSoftmax().update(p) for p in parts)
    assert merged.count == 1000
    assert merged.entropy() == pytest.approx(cpu.entropy(x), rel=1e-13)
    copies = [copy.deepcopy(merged) for _ in parts]
    for c, p in zip(copies, parts, strict=True):
        c.update_tempered(p)
    final = sum(copies)
    got = np.concatenate([final.normalize(p) for p in parts])
    np.testing.assert_allclose(got, cpu.adaptive_softmax(x), rtol=1e-13, atol=0)
    plain = cpu.StreamingSoftmax(Constant(1)).update(parts[1])  # (beta = 1: one pass)
    done = cpu.StreamingSoftmax(Constant(1)).update(parts[0])
    done.normalize(parts[0])
    for attempt in (lambda: done + plain, lambda: plain + done, lambda: sum([done])):
        with pytest.raises(RuntimeError, match=r"merge\(\) after normalize\(\)"):
            attempt()
