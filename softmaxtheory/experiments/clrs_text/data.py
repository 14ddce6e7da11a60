r"""CLRS-Text samples from our own samplers (private; numpy only).

CLRS-Text (Markeeva et al., 2024, arXiv 2406.04229) renders the execution of
CLRS algorithms as text. One sample is a *question* and an *answer*:

.. code-block:: text

    insertion_sort:
    key: [0.549 0.715 0.603 0.545], initial_trace: [0.549 0.715 0.603 0.545]
    trace | pred:
    [0.549 0.715 0.603 0.545], [0.549 0.603 0.715 0.545] | [0.545 0.549 0.603 0.715]

followed by a blank line. The question is ``"{algo}:\n{inputs}\n{names}:\n"``,
the answer ``"{output}\n\n"``; with the trace (``use_hints=True``, the
benchmark's default for fine-tuning) the question also holds
``initial_trace: {first hint}`` and the names read ``trace | {names}``, and the
answer is ``"{hint 2}, ..., {hint T-1} | {output}\n\n"``: the first recorded
hint goes into the question, the last (equal to the output) is dropped. The
hints, their order, the number formats (``.3g`` for node and edge scalars,
``.3f`` for a graph scalar, indices for one-hot masks, keys in the current
order for a permutation) and the input distributions follow the benchmark's
generator (``clrs/_src/clrs_text/clrs_utils.py`` and the samplers of the
``dm-clrs`` package); the code here is our own and needs only numpy, because
``dm-clrs`` pulls in JAX and TensorFlow.

Eight algorithms: the four sorts (``insertion_sort``, ``bubble_sort``,
``heapsort``, ``quicksort``: trace = the keys in their current order at every
probe), ``minimum``, ``binary_search``, ``find_maximum_subarray_kadane`` and
``mst_kruskal`` (trace = the edge mask of the tree so far). Inputs are drawn
as the benchmark draws them (uniform keys truncated to three decimals; Kadane
on :math:`U(-1, 1)`; an Erdős–Rényi graph for Kruskal) with one deliberate
difference: Kruskal's graph uses edge probability parameter 0.5 instead of the
benchmark's 0.2, so that graphs of 3 to 8 nodes have edges at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ALGORITHMS",
    "PAPER_EXCEPTIONS",
    "Sample",
    "format_example",
    "make_rng",
    "sample",
]

#: The algorithms the paper names as exceptions (adaptive temperature worse).
PAPER_EXCEPTIONS: tuple[str, ...] = ("heapsort", "mst_kruskal", "bubble_sort")

_SEP = ", "


@dataclass(frozen=True)
class Sample:
    r"""One CLRS-Text example.

    Attributes
    ----------
    algorithm : str
        The algorithm's CLRS name.
    size : int
        The problem size (items or nodes).
    question : str
        Ends with ``":\n"``.
    answer : str
        Ends with ``"\n\n"``.
    """

    algorithm: str
    size: int
    question: str
    answer: str

    @property
    def text(self) -> str:
        """``question + answer``."""
        return self.question + self.answer


# ----------------------------------------------------------------------- rendering


def _g(x: float) -> str:
    return f"{float(x):.3g}"


def _vec(values: np.ndarray) -> str:
    return "[" + " ".join(_g(v) for v in values) + "]"


def _ints(values: np.ndarray) -> str:
    return "[" + " ".join(str(int(v)) for v in values) + "]"


def _matrix(rows: np.ndarray, cell: Callable[[float], str]) -> str:
    return "[" + _SEP.join("[" + " ".join(cell(v) for v in r) + "]" for r in rows) + "]"


def _trunc(x: np.ndarray) -> np.ndarray:
    """The benchmark's ``truncate_decimals=3``."""
    return np.trunc(x * 1000.0) / 1000.0


@dataclass(frozen=True)
class _Trace:
    inputs: list[tuple[str, str]]  # (name, rendered value) in spec order
    names: str  # output names as shown (after "trace | ")
    hints: list[str]  # every recorded hint, rendered
    output: str  # the output, rendered
    plain_names: str  # output names without the trace
    plain_output: str  # the output without the trace


def format_example(algorithm: str, trace: _Trace, size: int, use_hints: bool = True) -> Sample:
    """Assemble question and answer the way CLRS-Text does (see the module docstring)."""
    inputs = _SEP.join(f"{name}: {value}" for name, value in trace.inputs)
    if not use_hints:
        question = f"{algorithm}:\n{inputs}\n{trace.plain_names}:\n"
        return Sample(algorithm, size, question, f"{trace.plain_output}\n\n")
    inputs = _SEP.join([inputs, f"initial_trace: {trace.hints[0]}"])
    steps = _SEP.join(trace.hints[1:-1])
    question = f"{algorithm}:\n{inputs}\ntrace | {trace.names}:\n"
    return Sample(algorithm, size, question, f"{steps} | {trace.output}\n\n")


# ----------------------------------------------------------------------- algorithms


def _sort_trace(keys: np.ndarray, order_states: list[np.ndarray]) -> _Trace:
    rendered = [_vec(keys[s]) for s in order_states]
    return _Trace([("key", _vec(keys))], "pred", rendered, rendered[-1], "pred", rendered[-1])


def _insertion_sort(keys: np.ndarray) -> _Trace:
    a = keys.copy()
    pos = np.arange(a.size)
    states = [pos.copy()]
    for j in range(1, a.size):
        key, p = a[j], pos[j]
        i = j - 1
        while i >= 0 and a[i] > key:
            a[i + 1], pos[i + 1] = a[i], pos[i]
            i -= 1
        a[i + 1], pos[i + 1] = key, p
        states.append(pos.copy())
    return _sort_trace(keys, states)


def _bubble_sort(keys: np.ndarray) -> _Trace:
    a = keys.copy()
    pos = np.arange(a.size)
    states = [pos.copy()]
    for i in range(a.size - 1):
        for j in range(a.size - 1, i, -1):
            if a[j] < a[j - 1]:
                a[[j, j - 1]] = a[[j - 1, j]]
                pos[[j, j - 1]] = pos[[j - 1, j]]
            states.append(pos.copy())
    return _sort_trace(keys, states)


def _heapsort(keys: np.ndarray) -> _Trace:
    a = keys.copy()
    n = a.size
    pos = np.arange(n)
    states = [pos.copy()]

    def heapify(i: int, heap_size: int) -> None:
        while True:
            left, right = 2 * i + 1, 2 * i + 2
            largest = left if left < heap_size and a[left] > a[i] else i
            if right < heap_size and a[right] > a[largest]:
                largest = right
            if largest != i:
                a[[i, largest]] = a[[largest, i]]
                pos[[i, largest]] = pos[[largest, i]]
            states.append(pos.copy())
            if largest == i:
                return
            i = largest

    for i in range(n - 1, -1, -1):
        heapify(i, n)
    heap_size = n
    for i in range(n - 1, 0, -1):
        a[[0, i]] = a[[i, 0]]
        pos[[0, i]] = pos[[i, 0]]
        heap_size -= 1
        states.append(pos.copy())
        heapify(0, heap_size)
    return _sort_trace(keys, states)


def _quicksort(keys: np.ndarray) -> _Trace:
    a = keys.copy()
    pos = np.arange(a.size)
    states = [pos.copy()]

    def partition(p: int, r: int) -> int:
        x = a[r]
        i = p - 1
        for j in range(p, r):
            if a[j] <= x:
                i += 1
                a[[i, j]] = a[[j, i]]
                pos[[i, j]] = pos[[j, i]]
            states.append(pos.copy())
        a[[i + 1, r]] = a[[r, i + 1]]
        pos[[i + 1, r]] = pos[[r, i + 1]]
        states.append(pos.copy())
        return i + 1

    def sort(p: int, r: int) -> None:
        if p < r:
            q = partition(p, r)
            sort(p, q - 1)
            sort(q + 1, r)

    sort(0, a.size - 1)
    trace = _sort_trace(keys, states)
    # the output is the final order, whatever the last probe held
    final = _vec(keys[pos])
    return _Trace(trace.inputs, "pred", trace.hints, final, "pred", final)


def _minimum(keys: np.ndarray) -> _Trace:
    states = [0]
    best = 0
    for i in range(1, keys.size):
        if keys[best] > keys[i]:
            best = i
        states.append(best)
    hints = [str(s) for s in states]
    return _Trace([("key", _vec(keys))], "min", hints, str(best), "min", str(best))


def _binary_search(keys: np.ndarray, target: float) -> _Trace:
    low, high = 0, keys.size - 1
    states = [(low, high)]
    while low < high:
        mid = (low + high) // 2
        if target <= keys[mid]:
            high = mid
        else:
            low = mid + 1
        states.append((low, high))
    hints = [f"({lo}{_SEP}{hi})" for lo, hi in states]
    inputs = [("key", _vec(keys)), ("target", f"{float(target):.3f}")]
    return _Trace(inputs, "(low, high)", hints, hints[-1], "return", str(high))


def _kadane(keys: np.ndarray) -> _Trace:
    best_low = best_high = i = 0
    best_sum = total = keys[0]
    states = [(0, 0)]
    for j in range(1, keys.size):
        x = keys[j]
        if total + x >= x:
            total += x
        else:
            i, total = j, x
        if total > best_sum:
            best_low, best_high, best_sum = i, j, total
        states.append((best_low, best_high))
    hints = [f"({lo}{_SEP}{hi})" for lo, hi in states]
    plain = f"{best_low}{_SEP}{best_high}"
    names = "(best_low, best_high)"
    return _Trace([("key", _vec(keys))], names, hints, hints[-1], "start, end", plain)


def _kruskal(weights: np.ndarray) -> _Trace:
    n = weights.shape[0]
    in_mst = np.zeros((n, n), dtype=np.int64)
    pi = np.arange(n)
    states: list[np.ndarray] = [in_mst.copy()]
    lx, ly, wts = [], [], []
    for i in range(n):
        for j in range(i + 1, n):
            if weights[i, j] > 0:
                lx.append(i)
                ly.append(j)
                wts.append(weights[i, j])
    for ind in np.argsort(wts, kind="quicksort"):
        u, v = lx[ind], ly[ind]
        states.append(in_mst.copy())
        root_u, root_v = u, v
        mask_u = np.zeros(n, dtype=bool)
        mask_v = np.zeros(n, dtype=bool)
        mask_u[u] = mask_v[v] = True
        while pi[root_u] != root_u:
            root_u = pi[root_u]
            pi[mask_u] = root_u
            mask_u[root_u] = True
            states.append(in_mst.copy())
        while pi[root_v] != root_v:
            root_v = pi[root_v]
            pi[mask_v] = root_v
            mask_v[root_v] = True
            states.append(in_mst.copy())
        if root_u != root_v:
            in_mst[u, v] = in_mst[v, u] = 1
            if root_u < root_v:
                pi[root_u] = root_v
            else:
                pi[root_v] = root_u
        states.append(in_mst.copy())
    hints = [_matrix(s, lambda v: str(int(v))) for s in states]
    out = _matrix(in_mst, lambda v: str(int(v)))
    return _Trace([("A", _matrix(weights, _g))], "in_mst", hints, out, "in_mst", out)


def _draw_keys(rng: np.random.Generator, n: int, low: float = 0.0) -> np.ndarray:
    return _trunc(rng.uniform(low, 1.0, size=n))


def _draw_graph(rng: np.random.Generator, n: int, p: float = 0.5) -> np.ndarray:
    mat = rng.binomial(1, p, size=(n, n))
    mat = mat * mat.T
    w = rng.uniform(0.0, 1.0, size=(n, n))
    w = np.sqrt(w * w.T + 1e-3)
    return _trunc(mat * w)


def _search_inputs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, float]:
    keys = np.sort(rng.uniform(0.0, 1.0, size=n))
    target = rng.uniform(0.0, 1.0)
    return _trunc(keys), float(_trunc(np.array(target)))


#: name -> function(rng, size) -> _Trace, in the benchmark's naming.
_BUILDERS: dict[str, Callable[[np.random.Generator, int], _Trace]] = {
    "insertion_sort": lambda rng, n: _insertion_sort(_draw_keys(rng, n)),
    "bubble_sort": lambda rng, n: _bubble_sort(_draw_keys(rng, n)),
    "heapsort": lambda rng, n: _heapsort(_draw_keys(rng, n)),
    "quicksort": lambda rng, n: _quicksort(_draw_keys(rng, n)),
    "minimum": lambda rng, n: _minimum(_draw_keys(rng, n)),
    "binary_search": lambda rng, n: _binary_search(*_search_inputs(rng, n)),
    "find_maximum_subarray_kadane": lambda rng, n: _kadane(_draw_keys(rng, n, low=-1.0)),
    "mst_kruskal": lambda rng, n: _kruskal(_draw_graph(rng, n)),
}

#: The algorithms this module can sample, in a fixed order.
ALGORITHMS: tuple[str, ...] = tuple(_BUILDERS)

#: Direct entry points for given inputs (tests compare them with published examples).
TRACERS: dict[str, Callable[..., _Trace]] = {
    "insertion_sort": _insertion_sort,
    "bubble_sort": _bubble_sort,
    "heapsort": _heapsort,
    "quicksort": _quicksort,
    "minimum": _minimum,
    "binary_search": _binary_search,
    "find_maximum_subarray_kadane": _kadane,
    "mst_kruskal": _kruskal,
}


def make_rng(seed: int, purpose: str, *extra: int) -> np.random.Generator:
    """An independent numpy generator per ``(seed, purpose, *extra)``.

    Parameters
    ----------
    seed : int
        Model seed (``>= 0``).
    purpose : {"train", "eval", "init"}
        Which stream.
    *extra : int
        Further words (algorithm index, size).
    """
    from .._seeds import derive_seed  # imports torch: only when a stream is made

    return np.random.default_rng(derive_seed(seed, purpose, *extra))


def sample(
    algorithm: str, size: int, rng: np.random.Generator, *, use_hints: bool = True
) -> Sample:
    """Draw one CLRS-Text example of `algorithm` at problem size `size`.

    Parameters
    ----------
    algorithm : str
        One of :data:`ALGORITHMS`.
    size : int
        Items (or graph nodes), ``>= 2``.
    rng : numpy.random.Generator
        The random stream (the sample is a function of its state alone).
    use_hints : bool, default True
        Include the execution trace (question ``trace | ...``, answer
        ``... | output``).

    Raises
    ------
    ValueError
        For an unknown `algorithm` or a `size` below 2.
    """
    if algorithm not in _BUILDERS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 2:
        raise ValueError(f"size must be an integer >= 2, got {size!r}")
    trace = _BUILDERS[algorithm](rng, int(size))
    return format_example(algorithm, trace, int(size), use_hints=use_hints)
