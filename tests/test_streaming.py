"""T7: the exact streaming monoid ``reference.StreamState``.

Any chunking and any merge tree must give the state of the one-pass row (``==``),
and every reading (entropy, beta, normalize) must equal, bit for bit, the
reference functions on the whole row.
"""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from softmaxtheory import reference
from softmaxtheory.reference import StreamState
from softmaxtheory.spec import Constant, LogLength, Polynomial
from tests.support.strategies_support import NEG_INF, assert_bitwise_equal, logit_rows

pytestmark = pytest.mark.theorem("T7")

HP = 400
PREC = 200
TOL = mpmath.mpf(2) ** (-PREC + 6)

SCHEDULES = (None, Constant("1"), Constant("2.5"), LogLength("0.5"), Polynomial(("1", "1"), "0.5"))


@st.composite
def chunked_rows(draw, max_size: int = 14, lo: float = -40.0, hi: float = 40.0):
    """A row and a chunking of it (chunks may be empty)."""
    row = draw(logit_rows(min_size=0, max_size=max_size, lo=lo, hi=hi))
    if row and draw(st.integers(0, 7)) == 0:
        row = [NEG_INF] * len(row)  # sometimes fully masked
    cuts = sorted(draw(st.lists(st.integers(0, len(row)), max_size=6)))
    bounds = [0, *cuts, len(row)]
    chunks = [np.array(row[i:j], dtype=np.float64) for i, j in itertools.pairwise(bounds)]
    return np.array(row, dtype=np.float64), chunks


def fold(states):
    acc = StreamState()
    for s in states:
        acc = acc + s
    return acc


def random_tree(data, states):
    """Merge adjacent states in a random order (a random binary tree over the leaves)."""
    states = list(states)
    while len(states) > 1:
        i = data.draw(st.integers(0, len(states) - 2))
        states[i : i + 2] = [states[i].merge(states[i + 1])]
    return states[0] if states else StreamState()


def readings_match_whole_row(state: StreamState, row: np.ndarray, chunks, schedule, dtype, eps):
    h = reference.entropy(row, entropy_eps=eps, dtype=dtype)
    b = reference.beta(row, schedule=schedule, entropy_eps=eps, dtype=dtype)
    a = reference.adaptive_softmax(row, schedule=schedule, entropy_eps=eps, dtype=dtype)
    assert_bitwise_equal(np.asarray(state.entropy(entropy_eps=eps, dtype=dtype), dtype=dtype), h)
    assert_bitwise_equal(
        np.asarray(state.beta(schedule=schedule, entropy_eps=eps, dtype=dtype), dtype=dtype), b
    )
    start = 0
    for c in chunks:
        got = state.normalize(c, schedule=schedule, entropy_eps=eps, dtype=dtype)
        assert_bitwise_equal(got, a[start : start + len(c)], ("chunk at", start))
        start += len(c)
    # the whole row normalised at once as well
    assert_bitwise_equal(state.normalize(row, schedule=schedule, entropy_eps=eps, dtype=dtype), a)


@settings(max_examples=3 * settings.default.max_examples)
@given(
    case=chunked_rows(),
    data=st.data(),
    schedule=st.sampled_from(SCHEDULES),
    dtype=st.sampled_from((np.float64, np.float32, np.float16)),
    eps=st.sampled_from((0.0, 1e-9)),
)
def test_any_chunking_and_merge_tree_equals_one_pass(case, data, schedule, dtype, eps) -> None:
    """Any chunking and merge tree gives the one-pass state, and its readings match bit for bit."""
    row, chunks = case
    whole = StreamState.from_logits(row)
    leaves = [StreamState.from_logits(c) for c in chunks]
    # sequential updates, left fold, random tree, random order: all the one-pass state
    seq = StreamState()
    for c in chunks:
        seq = seq.update(c)
    assert seq == whole
    assert fold(leaves) == whole
    assert random_tree(data, leaves) == whole
    order = data.draw(st.permutations(range(len(leaves))))
    assert random_tree(data, [leaves[i] for i in order]) == whole
    assert whole.count == int(np.sum(row > -np.inf))
    live = row[row > -np.inf]
    assert whole.m == (live.max() if live.size else -math.inf)
    readings_match_whole_row(seq, row, chunks, schedule, dtype, eps)


@given(a=chunked_rows(max_size=6), b=chunked_rows(max_size=6), c=chunked_rows(max_size=6))
@example(
    a=(np.array([1.0]), [np.array([1.0])]),
    b=(np.array([]), [np.array([])]),
    c=(np.array([NEG_INF]), [np.array([NEG_INF])]),
)
def test_monoid_laws(a, b, c) -> None:
    """Merging is commutative and associative with identity StreamState(), and concatenates rows."""
    sa, sb, sc = (StreamState.from_logits(r) for r, _ in (a, b, c))
    e = StreamState()
    assert e + sa == sa and sa + e == sa and e.merge(sa) == sa
    assert sa + sb == sb + sa
    assert (sa + sb) + sc == sa + (sb + sc)
    assert sa + sb == StreamState.from_logits(np.concatenate([a[0], b[0]]))
    # states are immutable: merging did not change the operands
    assert sa == StreamState.from_logits(a[0])
    assert e == StreamState()


def test_identity_and_masked_chunks() -> None:
    """The empty state and fully masked chunks are identities; masked items normalise to 0."""
    e = StreamState()
    assert e.m == -math.inf and e.count == 0
    assert e.s_mp() == 0 and e.t_mp() == 0
    assert e.entropy() == 0.0 and e.beta() == 1.0
    assert e.beta(schedule=Constant(3)) == 1.0  # the special-value table: fully masked -> 1
    assert StreamState.from_logits([]) == e
    assert StreamState.from_logits([NEG_INF, NEG_INF]) == e
    s = StreamState.from_logits([0.5, -2.0])
    assert s.update([NEG_INF, NEG_INF, NEG_INF]) == s
    assert s.update([]) == s
    assert_bitwise_equal(e.normalize([NEG_INF, NEG_INF]), np.zeros(2))
    # a chunk with masked entries: zeros there, the rest as in the whole row
    row = np.array([1.0, NEG_INF, -3.0, 1.0, NEG_INF, 0.25])
    st_ = StreamState.from_logits(row[:2]).update(row[2:])
    assert st_ == StreamState.from_logits(row[row > -np.inf])
    assert_bitwise_equal(st_.normalize(row[:2]), reference.adaptive_softmax(row)[:2])
    assert st_.normalize(row[:2])[1] == 0.0
    assert st_.count == 4


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_invalid_chunk_poisons_the_state(bad) -> None:
    """A NaN or +inf logit makes every later reading NaN, whatever is merged after it."""
    s = StreamState.from_logits([0.0, 1.0]).update([2.0, bad])
    assert math.isnan(s.entropy()) and math.isnan(s.beta())
    assert math.isnan(s.entropy(dtype=np.float32))
    assert np.all(np.isnan(s.normalize([0.0, 1.0])))
    # whatever is merged afterwards, the state stays invalid
    t = s + StreamState.from_logits([5.0])
    assert math.isnan(t.entropy())
    assert math.isnan(float(StreamState.from_logits([bad]).merge(StreamState()).beta()))
    assert math.isnan(float(reference.entropy([0.0, 1.0, 2.0, bad])))  # the same as one pass


def mp(v) -> mpmath.mpf:
    with mpmath.workprec(HP):
        return mpmath.mpf(v)


def close(a, b) -> bool:
    with mpmath.workprec(HP):
        return abs(a - b) <= TOL * max(abs(a), abs(b), mpmath.mpf(2) ** -2000)


@given(a=chunked_rows(max_size=7, lo=-300, hi=300), b=chunked_rows(max_size=7, lo=-300, hi=300))
@example(
    a=(np.array([0.0, -1.0]), [np.array([0.0, -1.0])]),
    b=(np.array([700.0, 5e-324]), [np.array([700.0, 5e-324])]),
)
def test_merge_formula_and_sums_at_high_precision(a, b) -> None:
    """The merged sums s, t match their definition and the merge formula; log s - t/s is H."""
    s1, s2 = StreamState.from_logits(a[0]), StreamState.from_logits(b[0])
    s = s1 + s2
    row = np.concatenate([a[0], b[0]])
    live = row[row > -np.inf]
    if live.size == 0:
        assert s == StreamState() and s.m == -math.inf
        return
    M = max(s1.m, s2.m)
    assert s.m == M == live.max()
    with mpmath.workprec(HP):
        # direct definition from the row
        zs = [mp(v) - mp(M) for v in live.tolist()]
        s_def = mpmath.fsum(mpmath.exp(z) for z in zs)
        t_def = mpmath.fsum(mpmath.exp(z) * z for z in zs)
        assert close(s.s_mp(prec=PREC), s_def)
        assert close(s.t_mp(prec=PREC), t_def)
        # the merge formula from the two parts
        s_m, t_m = mpmath.mpf(0), mpmath.mpf(0)
        for part in (s1, s2):
            if part.count == 0:
                continue
            w = mpmath.exp(mp(part.m) - mp(M))
            s_m += part.s_mp(prec=PREC) * w
            t_m += (part.t_mp(prec=PREC) + part.s_mp(prec=PREC) * (mp(part.m) - mp(M))) * w
        assert close(s.s_mp(prec=PREC), s_m)
        assert close(s.t_mp(prec=PREC), t_m)
        # H = log s - t / s is the entropy of the row
        H = mpmath.log(s.s_mp(prec=PREC)) - s.t_mp(prec=PREC) / s.s_mp(prec=PREC)
        assert abs(H - reference.entropy_mp(row, prec=PREC)) <= TOL * (1 + abs(H))
    assert s.s_mp() >= 1 and s.t_mp() <= 0


def test_long_row_in_many_chunks() -> None:
    """A masked 4000-item row in 41 chunks, merged as a balanced tree, equals the one-pass row."""
    rng = np.random.default_rng(7)
    row = rng.normal(0.0, 2.0, 4000)
    row[rng.integers(0, 4000, 50)] = NEG_INF
    row[17] = row[3000]  # a tie across chunks
    cuts = np.sort(rng.integers(0, 4000, 40))
    chunks = np.split(row, cuts)
    leaves = [StreamState.from_logits(c) for c in chunks]
    # balanced tree
    level = leaves
    while len(level) > 1:
        level = [
            level[i] + level[i + 1] if i + 1 < len(level) else level[i]
            for i in range(0, len(level), 2)
        ]
    state = level[0]
    assert state == StreamState.from_logits(row)
    assert state.entropy() == reference.entropy(row)
    assert state.beta() == reference.beta(row)
    a = reference.adaptive_softmax(row)
    got = np.concatenate([state.normalize(c) for c in chunks])
    assert_bitwise_equal(got, a)


@pytest.mark.parametrize("d", [1e4, 1e7, 1e300])
def test_sums_with_huge_spread(d) -> None:
    """s = 1 + e, t = -d e with e = exp(-d) far below any float: certified, and cheap."""
    state = StreamState.from_logits([-d]) + StreamState.from_logits([0.0])
    assert state == StreamState.from_logits([0.0, -d])
    with mpmath.workprec(300):
        e = mpmath.exp(-mpmath.mpf(d))
        s, t = 1 + e, -mpmath.mpf(d) * e
        tol = mpmath.mpf(2) ** -113
        assert abs(state.s_mp() - s) <= tol * s
        assert abs(state.t_mp() - t) <= tol * abs(t)
    assert state.entropy() == reference.entropy([0.0, -d]) == 0.0
    assert state.beta() == 1.0
    assert_bitwise_equal(state.normalize([-d, 0.0]), np.array([0.0, 1.0]))


def test_equal_states_hash_equally() -> None:
    """Every invalid state equals every other; their hashes read the NaN maximum, which Python
    hashes by identity, so a pickled copy was equal but hashed differently (two set members)."""
    import pickle

    bad = StreamState.from_logits([np.nan])
    copy = pickle.loads(pickle.dumps(bad))
    other = StreamState.from_logits([1.0, np.inf])
    assert bad == copy == other
    assert hash(bad) == hash(copy) == hash(other)
    assert len({bad, copy, other}) == 1
    good = StreamState.from_logits([0.0, -1.0])
    assert hash(good) == hash(pickle.loads(pickle.dumps(good)))
    assert len({good, bad}) == 2


def test_a_zero_maximum_is_positive_whatever_the_order():
    """The state's m took the sign of whichever zero came first: [0.0, -0.0] gave +0.0 and
    [-0.0, 0.0] gave -0.0, though the states compared equal."""
    states = [
        StreamState.from_logits([0.0, -0.0]),
        StreamState.from_logits([-0.0, 0.0]),
        StreamState.from_logits([-0.0]).update([0.0]),
        StreamState.from_logits([-0.0, -1.0]),
    ]
    assert all(s.m == 0.0 and math.copysign(1.0, s.m) == 1.0 for s in states)
    assert states[0] == states[1] == states[2]


def test_the_unmasked_count_has_one_name_in_both_streaming_objects():
    """StreamState.count counts unmasked items, StreamingSoftmax.count every item: both now
    have n_eff for the unmasked ones."""
    from softmaxtheory.accelerated import cpu

    chunk = np.array([0.5, -np.inf, 2.0, -np.inf])
    ref = StreamState.from_logits(chunk)
    fast = cpu.StreamingSoftmax().update(chunk)
    assert ref.n_eff == ref.count == fast.n_eff == 2 and fast.count == 4
