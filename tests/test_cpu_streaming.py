"""The CPU streaming object (theorem T7): chunkings, merge orders, memory-mapped rows."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from hypothesis import given, settings
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
