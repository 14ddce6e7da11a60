r"""The conformance suite's properties (private; :mod:`softmaxtheory.conformance` re-exports).

Each property is a function ``check(target, run)`` (see
:mod:`softmaxtheory._check.runner` for how one ends); :data:`PROPERTIES` lists
them in report order with the kinds they apply to.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

import softmaxtheory  # the package the repro sources name (loaded: this is part of it)

from .. import strategies as strat
from .. import testing as tst
from .._formats import FORMATS, ROWWISE_KINDS, Kind
from ..spec import PAPER_ENTROPY_EPS, Constant, LogLength, Polynomial, Schedule
from . import error_model as model
from .memory import changed, snapshot
from .report import STOPPED, array_literal, row_literal, with_schedule
from .runner import Failed, Run, Skip, run_given
from .target import GRAD_MODES, Target, grad_call_lines

__all__ = ["PROPERTIES", "name_width", "properties_for"]


def _rng_array(
    seed: int, shape: int | tuple[int, ...], scale: float, dtype: str
) -> tuple[np.ndarray, str]:
    """Normal numbers of `shape` from generator `seed` in `dtype`, and their source text."""
    src = f"np.random.default_rng({seed}).normal(0.0, {scale}, {shape})"
    return strat.cast(eval(src, {"np": np}), dtype), _src_cast(src, dtype)


def _padded_array(
    seed: int, n: int, scale: float, masked: str, dtype: str, fill: str = "-np.inf"
) -> tuple[np.ndarray, str]:
    """:func:`_rng_array` of length `n` with `fill` where `masked` (source text in ``i``) holds.

    ``i`` is ``np.arange(n)``: ``"i < 3072"`` masks a run of 3072 leading items, as a
    left-padded sequence has; another `fill` (source text) sets those items instead.
    """
    src = (
        f"np.where((lambda i: {masked})(np.arange({n})), {fill}, "
        f"np.random.default_rng({seed}).normal(0.0, {scale}, {n}))"
    )
    return strat.cast(eval(src, {"np": np}), dtype), _src_cast(src, dtype)


def _qkv(
    t: Target, seeds_shapes: tuple, scale: float = 1.0
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Operands q, k, v of :func:`_rng_array` (``(seed, shape)`` each) and their sources."""
    made = [_rng_array(seed, shape, scale, t.dtype) for seed, shape in seeds_shapes]
    return (
        {name: a for name, (a, _) in zip("qkv", made, strict=True)},
        {name: src for name, (_, src) in zip("qkv", made, strict=True)},
    )


def _src_cast(src: str, dtype: str) -> str:
    if dtype == "bfloat16":
        return f"softmaxtheory.strategies.cast({src}, 'bfloat16')"
    # a source with an operator at its top level (the planted batches: ``a + b``) is
    # parenthesised, or ``.astype`` cast its last term alone and the snippet's x stayed
    # float64
    return f"{src if _one_term(src) else f'({src})'}.astype(np.{dtype})"


def _one_term(src: str) -> bool:
    """Whether `src` has no space or operator outside brackets and strings (``.astype`` binds)."""
    depth, quote = 0, ""
    for ch in src:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and (ch.isspace() or ch in "+-*/@%<>=&|^~"):
            return False
    return True


# ---------------------------------------------------------------------------
# the properties (row-wise kinds)
# ---------------------------------------------------------------------------


#: Rows checked by ``values`` before the random ones, whatever Hypothesis draws: masked
#: rows far from zero, where a kernel that writes its mask as a large negative number
#: (-1e4, a "finite mask") gives the masked items weight. Drawn rows found it only when
#: the sample happened to hold such a row.
MASKED_FAR_ROWS = (
    "np.array([[-10000.0, -10001.5, -np.inf, -10003.0, -np.inf, -10000.25]])",
    "np.array([[30000.0, 29998.0, -np.inf, 29999.5], [-np.inf, -20000.0, -np.inf, -20004.0]])",
)


def _deep_row_source(dtype: str) -> str:
    r"""A row of 257 items from 0 down to one below the log of the least subnormal of `dtype`.

    Its coefficients fill the whole range of `dtype`, subnormal ones included, at steps of
    :math:`e^{-2.9}` in float64: a kernel that drops the terms below a cutoff (
    :math:`e^{-100}` as an optimisation, float32's :math:`e^{-87.3}` reused in a float64
    kernel) returns 0 for normal numbers such as :math:`3.7 \cdot 10^{-44}`, and rows drawn
    at random reach below :math:`e^{-100}` in float64 only with ``--thorough``.
    """
    depth = math.ceil(-FORMATS[dtype].qmin * math.log(2.0)) + 1
    return f"np.linspace(0.0, {-float(depth)!r}, 257)[None, :]"


def _lowest_rows_source(dtype: str) -> str:
    r"""Rows of tied items at the lowest finite float of `dtype` and at 0.6 of it.

    Finite numbers are values, however low: each row is uniform. A kernel (or a wrapper)
    that reads the lowest float as a mask, as Hugging Face's additive masks write one,
    or everything below half of it, answers zeros or NaN there; no other row of the
    suite has its maximum that low.
    """
    low = -FORMATS[dtype].max_finite
    return f"np.array([[{low!r}] * 3, [{0.6 * low!r}] * 3])"


def _p_values(t: Target, run: Run) -> None:
    """Masked rows far from zero, a deep row, random batches, rows at the bottom of the range.

    The masked rows are :data:`MASKED_FAR_ROWS`, the deep row :func:`_deep_row_source`
    and, after the batches, the rows of tied items at the lowest float
    :func:`_lowest_rows_source`, checked whatever Hypothesis draws; the batches come
    from every row family, against the reference.
    """
    for src in MASKED_FAR_ROWS:
        x = strat.cast(eval(src, {"np": np}), t.dtype)
        run.compare(run.call(x), x, source=_src_cast(src, t.dtype), what="masked row far from 0")
    src = _deep_row_source(t.dtype)
    x = strat.cast(eval(src, {"np": np}), t.dtype)
    what = "a row whose weights reach the least subnormal"
    run.compare(run.call(x), x, source=_src_cast(src, t.dtype), what=what)
    strategy = strat.logit_batches(
        strat.shapes(max_dims=2, max_side=3), min_size=1, max_size=48, dtype=t.dtype
    )

    def body(x: np.ndarray) -> None:
        run.compare(run.call(x), x, what="values")

    run_given(t, strategy, t.budget(100), body)
    # last, so that a kernel wrong on drawn rows under one contract alone is told so first
    src = _lowest_rows_source(t.dtype)
    x = strat.cast(eval(src, {"np": np}), t.dtype)
    what = "tied items at the lowest finite float and at 0.6 of it (values, not masks)"
    run.compare(run.call(x), x, source=_src_cast(src, t.dtype), what=what)


#: An odd number of items added to a power of two: a row of such a length ends in a partial
#: block for every power-of-two block size below it, where a blocked kernel's tail code runs.
ODD_TAIL = 4099


#: Runs of ``-inf`` in a row of :data:`ODD_TAIL` items (``i`` its positions): padding masks
#: whole blocks, for every block size up to 2048. A blocked kernel that takes a block's
#: maximum and rescales by ``exp(m_block - m)`` gets ``exp(-inf - (-inf))``, NaN, there
#: unless it tests for it; random masks almost never fill a block.
PADDINGS = (
    ("i < 3072", "left padding: the first 3072 items masked"),
    ("i >= 1000", "right padding: all but the first 1000 items masked"),
    ("(i >= 1024) & (i < 3072)", "items 1024 to 3071 masked"),
)


#: Lengths between those ``values`` draws (at most 48) and the long ones: at and on each
#: side of 64, 128, 256, 512, 1024 and 2048, where a kernel switches paths (a row per warp
#: up to 128 items, a row per block beyond) or ends a block, and lengths between them. A
#: "warp per row" path that loads the normaliser under ``col < 64`` for ``col < n`` sums
#: half of a 100-item row, and no other length the suite sent lay between 49 and 129; a
#: kernel wrong at exactly 256, 512, 1024 or 2048 items (a ``<`` for ``<=`` at a path
#: switch), or for every length from 2048 to 4095, conformed when only 257, 513 and
#: 2047 were sent.
MID_LENGTHS = (
    *(50, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 511, 512, 513),
    *(700, 1023, 1024, 1025, 2048, 2049, 3000),
)


#: Runs of ``-inf`` in a row of ``16384 + 27`` items: padding over whole blocks of up to
#: 8192 items, on the left and on the right (:data:`PADDINGS` covers blocks up to 2048).
LONG_PADDINGS = (
    ("i < 12288", "left padding: the first 12288 items masked"),
    ("i >= 4000", "right padding: all but the first 4000 items masked"),
)


#: Rows with one item 1000 above the others at their last position (length, seed): a
#: kernel that takes its maximum from the first block only, or leaves a vectorised loop's
#: tail out of it, overflows ``exp`` there (NaN) in every dtype; a random row's maximum
#: stands a few units above the rest, where no such kernel overflows.
SPIKED_ROWS = ((33, 40), (ODD_TAIL, 41), (16411, 42))


def _p_long_rows(t: Target, run: Run) -> None:
    """Rows of 64 to 40963 items: accumulation error against the bound.

    Lengths that are powers of two and lengths that are not (``4096 + 3``,
    ``16384 + 27``, ``2**15 + 2**13 + 3``): a blocked kernel whose last, partial block
    is handled wrongly is right on the first kind. The lengths of sequences in
    practice (130, 1000, 2047: the other properties draw at most 48 items), and
    :data:`MID_LENGTHS`. Rows whose last item stands 1000 above the rest
    (:data:`SPIKED_ROWS`), each sent twice (a kernel may take another path on a
    shape's second call). Padded rows (:data:`PADDINGS`, :data:`LONG_PADDINGS`):
    whole blocks masked.
    """
    sizes = [(n, 2.0) for n in MID_LENGTHS] + [(130, 2.0), (1000, 3.0), (2047, 1.0)]
    sizes += [(4096, 1.0), (4099, 4.0), (16384, 2.0), (16411, 1.0), (40963, 2.0)]
    if t.thorough:
        sizes += [(65536, 3.0), (65536 + ODD_TAIL, 3.0), (16384, 8.0)]
    for seed, (n, scale) in enumerate(sizes):
        x, src = _rng_array(seed, n, scale, t.dtype)
        run.compare(run.call(x), x, source=src, what=f"long row, n = {n}")
    # a long row whose mass sits on ~e^H items (entropy in the adaptive window)
    x = strat.cast(strat.row_with_entropy(4.0, 8192, 3), t.dtype)
    src = _src_cast("softmaxtheory.strategies.row_with_entropy(4.0, 8192, 3)", t.dtype)
    run.compare(run.call(x), x, source=src, what="long row in the adaptive window, n = 8192")
    for n, seed in SPIKED_ROWS:
        x, src = _padded_array(seed, n, 3.0, f"i == {n - 1}", t.dtype, fill="1000.0")
        # twice: a kernel that times its variants on a shape's first call (an autotuner)
        # and runs the one it chose afterwards is checked on that one too
        for call in ("", ", called again"):
            what = f"n = {n}, the last item 1000 above the rest{call}"
            run.compare(run.call(x), x, source=src, what=what)
    padded = [(ODD_TAIL, masked, label) for masked, label in PADDINGS]
    padded += [(16411, masked, label) for masked, label in LONG_PADDINGS]
    if t.thorough:  # blocks of up to 32768
        padded.append((65536 + ODD_TAIL, "i < 49152", "left padding: 49152 items masked"))
    for seed, (n, masked, label) in enumerate(padded, start=30):
        x, src = _padded_array(seed, n, 2.0, masked, t.dtype)
        run.compare(run.call(x), x, source=src, what=f"padded row, n = {n}, {label}")


def _p_million_row(t: Target, run: Run) -> None:
    """One row of 2**20 + 4099 items (2**24 + 4099 with --thorough): a million keys.

    The odd length (:data:`ODD_TAIL`) leaves a partial last block for every block size
    up to 2**20, the largest blocks included, and the last item, which every partial
    last block holds, is the row's maximum by 6: about half the mass. A kernel that
    drops the partial block from its sum is then off by a factor near 2; when the tail
    was like the rest, the 4099 dropped items were 0.4 % of the sum, within what the
    float32 baseline allows a million-term sum. Then the same length with more than its
    first half masked (left padding).
    """
    k = 24 if t.thorough else 20
    n = (1 << k) + ODD_TAIL
    src = (
        "(lambda x: np.concatenate([x[:-1], [x.max() + 6.0]]))"
        f"(np.random.default_rng(20).normal(0.0, 2.0, {n}))"
    )
    x = strat.cast(eval(src, {"np": np}), t.dtype)
    what = f"long row, n = 2**{k} + {ODD_TAIL}, its maximum last"
    run.compare(run.call(x), x, source=_src_cast(src, t.dtype), what=what)
    # left padding over more than half the row: whole blocks of up to 2**(k-1) items masked,
    # as a kernel that splits a row into a fixed number of parts meets
    masked = f"i < {(1 << (k - 1)) + 5000}"
    x, src = _padded_array(21, n, 2.0, masked, t.dtype)
    what = f"long row, n = 2**{k} + {ODD_TAIL}, the first 2**{k - 1} + 5000 items masked"
    run.compare(run.call(x), x, source=src, what=what)


#: Distances inside the window from H_on and H_off at which :func:`_branch_entropies`
#: puts rows (beside those at 1e-4 on each side): β exceeds 1 by about 2e-7 to 6e-2
#: there (:math:`P'(H_{\mathrm{on}}) \approx 2`). A kernel that takes β = 1 while
#: :math:`P(H) < 1 + 10^{-4}` (skipping the second exponential) is off by 5e-4 relative
#: within 5e-5 of H_on, and one that sharpens by 1.001 for H in (5.90, H_off) is off
#: nowhere else; both conformed with rows at H_on and H_off +- 1e-4 only.
KINK_OFFSETS = (1e-7, 1e-6, 1e-5, 1e-3, 1e-2, 3e-2)


def _branch_entropies() -> list[float]:
    pts = strat.branch_points()
    centres = [0.3, pts["threshold"], 0.7, pts["H_on"], 2.0, pts["H_star"], 5.0, pts["H_off"]]
    hs = [h + d for h in [*centres, 6.5, 7.5] for d in (-1e-4, 0.0, 1e-4)]
    hs += [pts["H_on"] + d for d in KINK_OFFSETS] + [pts["H_off"] - d for d in KINK_OFFSETS]
    return hs


def _branch_rows(dtype: str) -> tuple[np.ndarray, str]:
    hs = _branch_entropies()
    rows = np.stack([strat.cast(strat.row_with_entropy(h, 2048, 1), dtype) for h in hs])
    src = _src_cast(
        f"np.stack([softmaxtheory.strategies.row_with_entropy(h, 2048, 1) for h in {hs!r}])",
        dtype,
    )
    return rows, src


def _tied_huge_rows(dtype: str) -> tuple[np.ndarray, str]:
    r"""100 tied items at 0.5 and at 0.9 of the largest float of `dtype`, and 3 items at 0.

    The entropy is :math:`\log 100 \approx 4.6`, inside the window (β = 2.41), so the
    scaled logits :math:`\beta x` overflow: a kernel that forms them before subtracting
    the maximum (the paper's listing, ``softmax(beta * x)`` with β x rounded to the input
    dtype) answers NaN. Translated rows stop at 0.4 of the largest float, where β x
    stays finite, and rows as large as these have spreads that put H near 0 (β = 1).
    """
    top = FORMATS[dtype].max_finite
    src = (
        f"np.concatenate([np.full((2, 100), [[{0.5 * top!r}], [{0.9 * top!r}]]), "
        "np.zeros((2, 3))], axis=1)"
    )
    src = _src_cast(src, dtype)
    return eval(src, {"np": np, "softmaxtheory": softmaxtheory}), src


def _far_block_rows(dtype: str, masked: bool = False) -> tuple[np.ndarray, str]:
    r"""16 rows of 400 items, H from 5.68 to 5.87 (below H_off, |P'| near 2), 50 items far down.

    An entropy error :math:`\delta H` moves the far items' coefficients by
    :math:`|z|\,|P'(H)|\,\delta H` relative, so a far block (30 below the rest,
    4 in float16, whose range ends there for 400 items) magnifies it; the 16
    entropies span several 16-bit ulps of H, so some lie near a rounding midpoint.
    A bfloat16 kernel that rounds its float32 entropy to bfloat16 once was 249 ulps
    off here (90 allowed) and passed every other row of the suite. `masked`: the last
    10 items of each row masked (``-inf``), for a kernel with a path of its own for
    masked rows (one that rounded its entropy so there alone passed).
    """
    far = -4.0 if dtype == "float16" else -30.0
    src = (
        f"np.where(np.arange(400) < 50, {far!r}, np.linspace(0.05, 0.6, 16)[:, None] "
        "* np.random.default_rng(11).standard_normal(400))"
    )
    if masked:
        src = f"np.where(np.arange(400) >= 390, -np.inf, {src})"
    src = _src_cast(src, dtype)
    return eval(src, {"np": np, "softmaxtheory": softmaxtheory}), src


def _other_entropy_mode(t: Target) -> float:
    """The spec's other entropy mode: ``1e-9`` (the paper's guard) for a run at 0, else 0."""
    return PAPER_ENTROPY_EPS if t.entropy_eps == 0 else 0.0


def _in_other_entropy_mode(run: Run, check: Callable[[Run], None]) -> None:
    r"""Run `check` again at the other entropy mode, for a kernel that takes ``entropy_eps=``.

    The spec has two modes, :math:`H` (``entropy_eps=0``) and the paper's guarded
    :math:`-\sum_i p_i \log(p_i + 10^{-9})`; a kernel that takes the keyword is checked
    in both, the run's and :func:`_other_entropy_mode`, so that one that drops the
    keyword, or writes the guard as :math:`-p \log \max(p, \varepsilon)`, is caught by a
    default run. `check` gets a :class:`Run` of the target at that mode (its repro
    binds ``entropy_eps=``); what it measures counts in `run`, and a failure names
    the mode. Nothing runs for the softmax kind or a kernel whose signature does not
    name the keyword (:attr:`Target.names_eps`: a ``**kwargs`` may drop it).
    """
    t = run.target
    if t.kind == "softmax" or not t.names_eps:
        return
    eps = _other_entropy_mode(t)
    other = dataclasses.replace(t, entropy_eps=eps)
    other._takes.update(t._takes)  # the same kernel: nothing to probe again
    sub = Run(other)
    where = f"entropy_eps={eps!r} (the spec's other entropy mode; the kernel takes entropy_eps=)"
    try:
        check(sub)
    except tst.KernelMismatch as exc:
        exc.add_note(where)
        exc.entropy_modes = (t.entropy_eps, eps)  # the hint of its report
        raise
    except Failed as exc:
        text = str(exc)
        if text.startswith(STOPPED):
            raise
        raise type(exc)(f"at {where}: {text}") from exc
    finally:
        run.checks += sub.checks
        run.max_ulp = max(run.max_ulp, sub.max_ulp)
        run.notes.extend(n for n in sub.notes if n not in run.notes)


def _p_branch_points(t: Target, run: Run) -> None:
    """Rows around 0.5, H_on, H*, H_off and beyond (n = 2048); 256-2048 items at H in [5, H_off].

    The second set (:func:`softmaxtheory.strategies.window_rows`, some translated
    far from zero) is where β reacts most to an entropy error: a kernel whose
    statistics are computed in float16 fails there. Before them, rows with a block
    of items far below the rest (:func:`_far_block_rows`), unmasked and masked, show
    an entropy rounded once to bfloat16, and a row of 4099 items at H near 5.5 one
    that a kernel's path for long rows computes otherwise. The fixed rows are checked
    at the spec's other entropy mode too (:func:`_in_other_entropy_mode`).
    """
    # (the far items differ by a little, as in SPLIT_ROW)
    tail = f"-18.0 + np.random.default_rng(53).normal(0.0, 0.5, {ODD_TAIL})"
    long, long_src = _padded_array(52, ODD_TAIL, 0.1, "i >= 250", t.dtype, fill=tail)
    cases = [
        (*_branch_rows(t.dtype), "branch-point rows"),
        (*_tied_huge_rows(t.dtype), "100 tied items at 0.5 and 0.9 of the largest float"),
        (*_far_block_rows(t.dtype), "rows with a far block, H near H_off"),
        (*_far_block_rows(t.dtype, masked=True), "rows with a far block, 10 items masked"),
        (long, long_src, f"{ODD_TAIL} items, 250 near 0 and the rest near 18 below (H near 5.5)"),
    ]
    for rows, src, what in cases:
        run.compare(run.call(rows), rows, source=src, what=what)
    # many rows and a row past 65536 items, for paths of their own (checked in both modes)
    for rows, src, what in _large_inputs(t.dtype):
        run.compare(run.call(rows), rows, source=src, what=what)
        cases.append((rows, src, what))

    def other_mode(sub: Run) -> None:
        for rows, src, what in cases:
            sub.compare(sub.call(rows), rows, source=src, what=f"{what}, entropy_eps={eps!r}")

    eps = _other_entropy_mode(t)
    _in_other_entropy_mode(run, other_mode)

    def body(x: np.ndarray) -> None:
        run.compare(run.call(x[None, :]), x[None, :], what=f"{x.shape[0]} items, H in [5, H_off]")

    run_given(t, strat.window_rows(t.dtype), t.budget(8), body)


def _p_batch_independence(t: Target, run: Run) -> None:
    """A row's result must not depend on the other rows of the batch."""
    companions = [
        np.zeros(64),  # uniform: H = log 64
        np.where(np.arange(64) == 5, 0.0, -40.0),  # one-hot: H ~ 0
        np.random.default_rng(7).normal(0, 6, 64),
    ]

    def body(row: np.ndarray) -> None:
        n = row.shape[0]
        alone = run.call(row[None, :])
        run.compare(alone, row[None, :], what="row alone")
        for comp in companions:
            c = strat.cast(np.resize(comp, n), t.dtype)
            batch = np.stack([row, c, c])
            got = run.call(batch)
            run.compare(got, batch, what="row next to other rows (batch independence)")

    strategy = strat.logit_rows(max_size=48, dtype=t.dtype).filter(lambda r: r.shape[0] >= 2)
    run_given(t, strategy, t.budget(30), body)


#: Batches of many rows, ``(batch shape, n, scale)``: a kernel that gives each program a
#: group of rows and rounds the number of groups down (``rows // group`` for
#: ``ceil(rows / group)``) leaves the last rows unwritten, and batches of a few rows (the
#: other properties draw at most 9) never show it. The counts of rows (1031, 1045 and 231)
#: are odd, so they leave a partial last group for every group of a power-of-two size up
#: to 1024.
MANY_ROWS = (((1031,), 17, 1.0), ((5, 209), 12, 3.0), ((3, 7, 11), 5, 0.5))

#: What the first batch of :data:`MANY_ROWS` holds besides normal rows (numpy source in
#: ``r``, the row, and ``i``, the item; added to the normal numbers): row 517's last item
#: stands 1000 above the rest, and row 1029 lies 20000 below zero with its odd items
#: masked. A kernel that takes another path for large batches (a row per warp, say) and
#: leaves the maximum out, or writes the mask as -1e4, there is right on the normal rows
#: and only there; the other properties send such rows in batches of a few.
PLANTED_ROWS = (
    "np.where((r == 517) & (i == 16), 1000.0, 0.0)"
    " + np.where(r == 1029, np.where(i % 2 == 1, -np.inf, -20000.0), 0.0)"
)


#: A batch whose counts divide evenly, ``(2, 4, 8, 64)`` (numpy source, before its planted
#: rows): 64 rows of 64 items, as attention's scores of a batch of 2 with 4 heads and 8
#: queries over 64 keys come. Fused kernels take their fast path on such shapes alone
#: (Megatron's ``FusedScaleMaskSoftmax``: 16 < n <= 4096 and the row counts multiples of
#: 4), where the odd batches of :data:`MANY_ROWS` send them to their fallback.
EVEN_ROWS = "np.random.default_rng(47).normal(0.0, 2.0, (2, 4, 8, 64))"

#: What :data:`EVEN_ROWS` holds besides normal rows (numpy source in ``r``, the row of the
#: flattened batch, and ``i``, the item): as :data:`PLANTED_ROWS`, row 13's item 40
#: stands 1000 above the rest, and row 50 lies 20000 below zero with its odd items masked.
EVEN_PLANTED = (
    "np.where((r == 13) & (i == 40), 1000.0, 0.0)"
    " + np.where(r == 50, np.where(i % 2 == 1, -np.inf, -20000.0), 0.0)"
)


#: The batch of :func:`_large_inputs` (numpy source): 1031 rows, seven distinct ones in
#: turn (the reference certifies each once), at entropies near 2.5 where β exceeds 1.
REPEATED_ROWS = "np.random.default_rng(64).normal(0.0, 1.5, (7, 17))[np.arange(1031) % 7]"

#: The row past 65536 items of :func:`_large_inputs` (numpy source): 250 items near 0,
#: the rest near 18 below (an entropy near 5.5, in the adaptive window). The far items
#: differ by a little: the error model's sum allowance is probabilistic, and a
#: sum of tens of thousands of equal terms rounds the same way at every addition.
SPLIT_ROW = (
    "np.where(np.arange(69635) >= 250, -18.0 + np.random.default_rng(62).normal(0.0, 0.5, "
    "69635), np.random.default_rng(63).normal(0.0, 0.1, 69635))"
)


def _large_inputs(dtype: str) -> list[tuple[np.ndarray, str, str]]:
    """:data:`REPEATED_ROWS` and :data:`SPLIT_ROW`: (array, source, label) each.

    Sent with the ``schedules`` property's first schedule and at the spec's other entropy
    mode: a kernel's path for large batches or for rows split across programs must
    honour both keywords.
    """
    made = []
    for src, what in ((REPEATED_ROWS, "1031 rows of 17 items (7 repeated)"),
                      (SPLIT_ROW, "a row of 69635 items")):  # fmt: skip
        made.append((strat.cast(eval(src, {"np": np}), dtype), _src_cast(src, dtype), what))
    return made


def _p_many_rows(t: Target, run: Run) -> None:
    """Batches of 231 to 1045 rows (16411 more with --thorough), then 65537, against the reference.

    See :data:`MANY_ROWS`: every row is checked, the last ones included, and
    :data:`PLANTED_ROWS`, the rows of other properties that large batches lack. Then a
    batch whose counts divide evenly (:data:`EVEN_ROWS`, planted too). Then
    :data:`GRID_ROWS` rows: past 65535, where a GPU kernel that puts its rows on the
    second or third axis of its launch grid (CUDA's end at 65535) never writes the
    last ones.
    """
    cases = list(MANY_ROWS)
    if t.thorough:
        cases.append(((16411,), 8, 2.0))
    for seed, (batch, n, scale) in enumerate(cases, start=40):
        src = f"np.random.default_rng({seed}).normal(0.0, {scale}, {(*batch, n)})"
        what = f"{int(np.prod(batch))} rows of {n} items, batch shape {batch}"
        if seed == 40:
            src = f"(lambda r, i: {PLANTED_ROWS})(*np.ogrid[:{batch[0]}, :{n}]) + {src}"
            what += ", a spiked row and a masked row far below zero among them"
        x = strat.cast(eval(src, {"np": np}), t.dtype)
        run.compare(run.call(x), x, source=_src_cast(src, t.dtype), what=what)
    # counts that divide evenly, with the planted rows: a fused kernel's fast path
    src = (f"{EVEN_ROWS} + (lambda r, i: {EVEN_PLANTED})(*np.ogrid[:64, :64])"
           ".reshape(2, 4, 8, 64)")  # fmt: skip
    x = strat.cast(eval(src, {"np": np}), t.dtype)
    what = ("64 rows of 64 items, batch shape (2, 4, 8, 64) (counts that divide evenly), "
            "a spiked row and a masked row far below zero among them")  # fmt: skip
    run.compare(run.call(x), x, source=_src_cast(src, t.dtype), what=what)
    x = strat.cast(eval(GRID_ROWS, {"np": np}), t.dtype)
    what = "65537 rows of 4 items (7 rows repeated): past CUDA's grid limit of 65535"
    run.compare(run.call(x), x, source=_src_cast(GRID_ROWS, t.dtype), what=what)


#: 65537 rows, seven distinct ones in turn (the reference certifies each distinct row once).
GRID_ROWS = "np.random.default_rng(44).normal(0.0, 2.0, (7, 4))[np.arange(65537) % 7]"


def _p_dtype_shape(t: Target, run: Run) -> None:
    """Output dtype equals the input dtype; shapes (n,), (1, n), (2, 3, n), views.

    The views: transposed, batch slices and swapped batch axes, a slice inside its
    buffer, a row broadcast along a batch axis of stride 0, and in numpy negative strides.

    Then a new shape after a call in another dtype (:func:`_after_another_dtype`). A
    torch kernel is also called with inputs that require grad, under ``no_grad`` and
    under ``inference_mode`` (see :func:`_grad_modes`).
    """
    base = strat.cast(np.random.default_rng(11).normal(0, 3, (2, 3, 5)), t.dtype)
    cases: list[tuple[str, np.ndarray, Any]] = [
        ("1-d row", base[0, 0], None),
        ("shape (1, n)", base[0, :1], None),
        ("shape (2, 3, n)", base, None),
        ("n = 1", base[..., :1], None),
    ]
    for label, x, view in cases:
        out = run.call(x, view=view)
        got, _ = run.output(out, label)
        want = x.shape if t.kind != "entropy" else x.shape[:-1]
        if got.shape != want:
            raise Failed(f"{label}: output shape {got.shape}, expected {want}")
        run.compare(out, x, what=label)
    # non-contiguous inputs: a transposed view; batch views whose rows are contiguous but
    # not evenly spaced (a kernel handed one row stride reads the wrong rows there); a
    # slice that starts inside its buffer (a kernel that addresses the storage's start)
    base_src = _src_cast("np.random.default_rng(11).normal(0, 3, (2, 3, 5))", t.dtype)
    big_src = _src_cast("np.random.default_rng(12).normal(0, 3, (2, 5, 7))", t.dtype)
    big = strat.cast(np.random.default_rng(12).normal(0, 3, (2, 5, 7)), t.dtype)
    xt = np.ascontiguousarray(np.swapaxes(base[0], 0, 1))  # (5, 3): rows are columns
    if t.framework == "numpy":
        swap = lambda a: np.swapaxes(a, 0, 1)  # noqa: E731
    else:
        swap = lambda a: a.transpose(0, 1)  # noqa: E731
    views = [  # (label, the data sent, the view made of it there, the values it shows, and
        # numpy source text of the view, for the repro)
        ("non-contiguous (transposed) input", xt, swap, np.swapaxes(xt, 0, 1),
         f"np.swapaxes(np.ascontiguousarray(np.swapaxes(({base_src})[0], 0, 1)), 0, 1)"),
        ("a batch view x[:, :3] of a (2, 5, n) array", big, lambda a: a[:, :3], big[:, :3],
         f"({big_src})[:, :3]"),
        ("batch axes swapped, (5, 2, n) as a view of (2, 5, n)", big, swap,
         np.swapaxes(big, 0, 1), f"np.swapaxes({big_src}, 0, 1)"),
        ("x[1:, 1:] of a (5, n + 1) array (it starts inside its buffer)", big[0],
         lambda a: a[1:, 1:], big[0, 1:, 1:], f"({big_src})[0, 1:, 1:]"),
    ]  # fmt: skip
    # a batch axis of stride 0 (one row broadcast to four, read-only in numpy), and in
    # numpy negative strides (rows, then items, reversed): a kernel that refused such a
    # view, or took the row stride as unsigned and returned the rows in the other order,
    # conformed
    if t.framework == "numpy":
        rows4 = lambda a: np.broadcast_to(a[:1], (4, a.shape[-1]))  # noqa: E731
        views += [
            ("x[::-1], the rows reversed (a negative row stride)", big[0],
             lambda a: a[::-1], big[0, ::-1], f"({big_src})[0, ::-1]"),
            ("x[:, ::-1], the items reversed (a negative item stride)", big[0],
             lambda a: a[:, ::-1], big[0, :, ::-1], f"({big_src})[0, :, ::-1]"),
        ]  # fmt: skip
    else:
        rows4 = lambda a: a[:1].expand(4, a.shape[-1])  # noqa: E731
    views.append(
        ("one row broadcast to four (a batch stride of 0)", big[0], rows4,
         np.broadcast_to(big[0, :1], (4, 7)),
         f"np.broadcast_to(({big_src})[0, :1], (4, 7))"),
    )  # fmt: skip
    for label, data, view, shown, src in views:
        run.compare(run.call(data, view=view), np.ascontiguousarray(shown), what=label,
                    source=src)  # fmt: skip
    _after_another_dtype(t, run)
    if t.framework == "torch":
        far = strat.cast(eval(MASKED_FAR_ROWS[1], {"np": np}), t.dtype)
        # and 200 items, item 150 far above the rest: an inference path that works in
        # blocks and never rescales its running sum is right on short rows only
        spiked = _padded_array(57, 200, 3.0, "i == 150", t.dtype, fill="30.0")
        _grad_modes(t, run, [(base, base_src), (far, _src_cast(MASKED_FAR_ROWS[1], t.dtype)),
                             spiked])  # fmt: skip


#: The dtype :func:`_after_another_dtype` calls the kernel in first, by the checked dtype:
#: a less precise one where there is one (numpy has no bfloat16).
OTHER_DTYPES = {
    ("numpy", "float64"): "float32", ("numpy", "float32"): "float16",
    ("numpy", "float16"): "float32", ("torch", "float64"): "float32",
    ("torch", "float32"): "float16", ("torch", "float16"): "bfloat16",
    ("torch", "bfloat16"): "float16",
}  # fmt: skip

#: Logits of a shape no other property sends, for :func:`_after_another_dtype` (float64).
FRESH_SHAPE_ROWS = "np.random.default_rng(48).normal(0.0, 3.0, (2, 6007))"


def _after_another_dtype(t: Target, run: Run) -> None:
    """Logits of a new shape, first in another dtype (result unchecked), then in the target's.

    A kernel that caches a compiled variant, a workspace or a plan by shape and forgets
    the dtype in the key (as caches of rotary tables and compiled graphs have) runs the
    first call's variant on the second: a float32 call computes in float16. Every other
    call of a run is in one dtype, so no other property shows it. A kernel that refuses
    the other dtype is only checked in its own.
    """
    other = OTHER_DTYPES[(t.framework, t.dtype)]
    first = dataclasses.replace(t, dtype=other)
    x_other = strat.cast(eval(FRESH_SHAPE_ROWS, {"np": np}), other)
    try:
        first.call(x_other)
    except Failed:
        raise
    except Exception:
        pass
    x = strat.cast(eval(FRESH_SHAPE_ROWS, {"np": np}), t.dtype)
    if t.framework == "numpy":
        call = f"kernel(({FRESH_SHAPE_ROWS}).astype(np.{other}))"
    else:
        rows = f"softmaxtheory.strategies.cast({FRESH_SHAPE_ROWS}, {other!r})"
        call = f"_kernel(torch.from_numpy({rows}).to(torch.{other}).to({t.device!r}))"
    prelude = f"{call}  # the suite's call in {other} first, same shape"
    if t.framework == "torch":
        prelude = "import softmaxtheory.strategies\n" + prelude
    what = f"shape {x.shape}, called in {other} first"
    run.compare(run.call(x), x, source=_src_cast(FRESH_SHAPE_ROWS, t.dtype), what=what,
                prelude=prelude)  # fmt: skip


def _grad_modes(t: Target, run: Run, cases: list[tuple[np.ndarray, str]]) -> None:
    """The logits `cases` (arrays and their sources) in each of :data:`GRAD_MODES`.

    A torch kernel may take another path when an input requires grad (an autograd
    ``Function``) or under ``no_grad`` (an inference path that reuses its input's
    memory): each must give the reference's values and leave its input as it found
    it. A kernel that refuses inputs requiring grad (it is not differentiable) is
    noted (a raise on the first call in that mode; a raise after the kernel took such
    inputs fails); one that raises under ``no_grad`` or ``inference_mode`` fails. An
    output that does not require grad for inputs that do is noted (the kernel drops
    the gradient). Each mode ends with a fully masked row (:func:`_fully_masked_in_mode`).
    """
    for mode in GRAD_MODES:
        for i, (x, src) in enumerate(cases):
            what = f"{mode}, shape {x.shape}"
            try:
                out = t.call(x, grad_mode=mode)
            except Failed as exc:
                raise Failed(f"{what}: {exc}") from exc
            except Exception as exc:
                # a refusal is a raise on the mode's first call; once the kernel took
                # inputs requiring grad, a raise is a crash of its training path
                if GRAD_MODES[mode][0] and i == 0:
                    run.notes.append(f"{mode} refused with {type(exc).__name__}")
                    break
                raise _raised_in_mode(t, x, mode, what, exc) from exc
            run.compare(out, x, source=src, what=what, grad_mode=mode)
            _note_detached(run, mode, out, "x")
        else:
            _fully_masked_in_mode(t, run, mode)


def _note_detached(run: Run, mode: str, out: Any, operands: str) -> None:
    """Note (once) an output `out` that does not require grad in a mode whose inputs do."""
    detached = f"{mode}: the output does not require grad (no gradient reaches {operands})"
    if GRAD_MODES[mode][0] and not out.requires_grad and detached not in run.notes:
        run.notes.append(detached)


def _raised_in_mode(t: Target, x: np.ndarray, mode: str, what: str, exc: Exception) -> Failed:
    """The failure for a kernel that raised `exc` on logits `x` in `mode`, with a repro."""
    return Failed(
        f"{what}: the kernel raised {type(exc).__name__}: {exc}\nrepro:\n"
        + "\n".join([*t.repro_lines(x), *grad_call_lines(mode, "kernel(x)  # raises")])
    )


def _fully_masked_in_mode(t: Target, run: Run, mode: str) -> None:
    """A fully masked row in `mode`: zeros, as the special-value table says.

    NaN everywhere is the softmax kind's tolerated convention (``special_values`` notes
    it); a number is not: a training path that masks with ``finfo.min`` (an autograd
    ``Function``, say) gives the fully masked row the uniform distribution.
    """
    x = strat.cast(np.full((1, 5), -np.inf), t.dtype)
    what = f"{mode}, a fully masked row of 5 items"
    try:
        out = t.call(x, grad_mode=mode)
    except Failed as exc:
        raise Failed(f"{what}: {exc}") from exc
    except Exception as exc:
        raise _raised_in_mode(t, x, mode, what, exc) from exc
    got, _ = run.output(out, what)
    if np.all(got == 0) or (np.all(np.isnan(got)) and t.kind == "softmax" and not t.strict):
        return
    raise Failed(
        f"{what}: got {np.asarray(got, dtype=np.float64).ravel().tolist()}, where the "
        "special-value table gives zeros\nrepro:\n"
        + "\n".join([*t.repro_lines(x), *grad_call_lines(mode, "print(kernel(x))")])
    )


def _special_expected(t: Target) -> list[tuple[str, np.ndarray]]:
    """The cases of ``special_values``: (label, rows); the first row of each is special.

    Rows of three items, of one (a kernel with a fast path for ``n = 1``) and of
    :data:`ODD_TAIL` items (a kernel with another path for long rows), each beside a
    regular row of its length.
    """
    ninf, nan, inf = -np.inf, np.nan, np.inf
    n = ODD_TAIL
    regular = np.random.default_rng(43).normal(0.0, 2.0, n)
    at = np.arange(n) == 3000
    return [
        ("partly masked row", np.array([[0.5, ninf, 2.0, ninf, -1.0]])),
        ("one unmasked item", np.array([[ninf, 3.0, ninf]])),
        ("fully masked row", np.array([[ninf, ninf, ninf], [0.0, 1.0, 2.0]])),
        ("fully masked row, one item", np.array([[ninf], [2.0]])),
        (f"fully masked row, {n} items", np.stack([np.full(n, ninf), regular])),
        ("row with NaN", np.array([[0.0, nan, 1.0], [0.0, 1.0, 2.0]])),
        ("row with NaN, one item", np.array([[nan], [2.0]])),
        (f"row with NaN, {n} items", np.stack([np.where(at, nan, regular), regular])),
        ("row with +inf", np.array([[0.0, inf, 1.0], [0.0, 1.0, 2.0]])),
        ("row with +inf, one item", np.array([[inf], [2.0]])),
        (f"row with +inf, {n} items", np.stack([np.where(at, inf, regular), regular])),
        ("empty rows (n = 0)", np.zeros((2, 0))),
        # no rows at all: a kernel that returned a row of zeros for them conformed
        ("empty batch (0 rows of 5 items)", np.zeros((0, 5))),
    ]


def _p_special_values(t: Target, run: Run) -> None:
    """The special-value table: masks exact; NaN/+inf rows NaN; masked rows; n = 0."""
    # a convention's note -> its place in run.notes and the row lengths it was seen at
    conventions: dict[str, tuple[int, list[str]]] = {}
    for label, x64 in _special_expected(t):
        x = strat.cast(x64, t.dtype)
        try:
            out = t.call(x)
        except Failed:
            raise
        except Exception as exc:
            if label.startswith("empty"):
                what = "n = 0" if "n = 0" in label else "a batch of 0 rows"
                run.notes.append(f"{what} refused with {type(exc).__name__}")
                continue
            raise Failed(f"{label}: the kernel raised {type(exc).__name__}: {exc}") from exc
        got, _ = run.output(out, label)
        if label.startswith(("fully masked row", "row with +inf")):
            # conventions differ (torch.softmax and scipy.special.softmax answer NaN
            # everywhere for a fully masked row and for a row with +inf; a kernel that
            # guards its shifts may answer NaN at the +inf items and 0 beside them): by
            # default a softmax may answer NaN there, never a silent number; strict (and
            # every kind but softmax for a fully masked row) demands the table
            bad = got[0] if got.ndim else got
            ok_table = _matches_table(t, x, got)
            fully = label.startswith("fully")
            nan_ok = _nan_convention(bad, np.asarray(x[0]) == np.inf, fully)
            tolerated = not t.strict and (t.kind == "softmax" or not fully)
            table = _table_value(t, label)
            if not ok_table and not (tolerated and nan_ok):
                if nan_ok and not tolerated:
                    why = (
                        "NaN is tolerated only without strict, as torch.softmax's convention"
                        if t.kind == "softmax" or not fully
                        else f"NaN is torch.softmax's convention, not kind {t.kind}'s"
                    )
                else:
                    why = "NaNs are tolerated as a convention, finite numbers are not"
                raise Failed(f"{label}: got {got[0]!r}; the table gives {table} ({why})")
            if not ok_table:
                base, _, size = label.partition(", ")
                rest = f"{_nan_text(bad)} where the table gives {table}"
                note = f"{base}: {rest}"
                if note not in conventions:
                    conventions[note] = (len(run.notes), [])
                    run.notes.append(note)
                at, sizes = conventions[note]
                sizes.append(size or "3 items")
                if len(sizes) > 1:
                    run.notes[at] = f"{base} ({', '.join(sizes)}): {rest}"
            run.compare(out[1:], x[1:], what=label)
            continue
        run.compare(out, x, what=label)


def _nan_convention(got: np.ndarray, at_inf: np.ndarray, fully: bool) -> bool:
    """Whether `got` answers a special row with NaN as a convention, with no number in it.

    A fully masked row: NaN everywhere. A row with ``+inf``: NaN everywhere, or NaN at
    the ``+inf`` items and 0 at the others. A finite non-zero value beside a NaN
    (``[0.27, nan, 0.73]``) is a silent number, not a convention. `at_inf` marks the
    ``+inf`` items (an entropy's `got` is one number).
    """
    isnan = np.isnan(got)
    if np.all(isnan):
        return True
    if fully or np.ndim(got) == 0:
        return False
    return bool(np.all(isnan[at_inf]) and np.all(isnan | (got == 0)))


def _nan_text(got: np.ndarray) -> str:
    """``NaN``, or where the NaNs of a row are when some of its values are numbers."""
    flat = np.atleast_1d(np.asarray(got, dtype=np.float64))
    nans = int(np.isnan(flat).sum())
    if nans == flat.size:
        return "NaN"
    if flat.size <= 12:
        values = ", ".join("nan" if np.isnan(v) else repr(float(v)) for v in flat)
        return f"NaN at {nans} of {flat.size} items ([{values}])"
    # a long row by where its NaNs are and what the rest holds (all of a row of 4099
    # items wrote 20 kB of note)
    at = np.flatnonzero(np.isnan(flat))
    where = ", ".join(map(str, at[:6].tolist())) + (", ..." if at.size > 6 else "")
    rest = np.unique(flat[~np.isnan(flat)])
    others = ", ".join(repr(float(v)) for v in rest[:4]) + (", ..." if rest.size > 4 else "")
    return f"NaN at {nans} of {flat.size} items (at {where}; the others {others})"


def _table_value(t: Target, label: str) -> str:
    """What the special-value table gives on the first row of case `label`, in words."""
    if label.startswith("fully"):
        return "0" if t.kind == "entropy" else "zeros"
    return "NaN" if t.kind == "entropy" else "NaN at every item"


def _matches_table(t: Target, x: np.ndarray, got: np.ndarray) -> bool:
    from .. import reference

    x0 = x[:1].astype(np.float32) if t.dtype == "bfloat16" else x[:1]
    if t.kind == "softmax":
        ref = reference.softmax(x0)
    elif t.kind == "entropy":
        ref = reference.entropy(x0, entropy_eps=t.entropy_eps)
    else:
        ref = reference.adaptive_softmax(x0, schedule=t.schedule, entropy_eps=t.entropy_eps)
    g = np.asarray(got[:1], dtype=np.float64)
    return bool(np.array_equal(g, ref, equal_nan=True))


@st.composite
def _dyadic_rows(draw: Any, dtype: str) -> np.ndarray:
    n = draw(st.integers(2, 24))
    ks = draw(st.lists(st.integers(-512, 512), min_size=n, max_size=n))
    return strat.cast(np.array(ks) / 16.0, dtype)


def _p_invariances(t: Target, run: Run) -> None:
    """T8: shift (x + c, exact, also far from zero, with masks), permutation, masking = removal."""
    # the far shifts keep the dyadic rows exact: every entry beyond 1e4 from zero
    shifts = {
        "float64": [3.0, -1000.0, 2.0**40, -3.0 * 2.0**14, -(2.0**45)],
        "float32": [3.0, -1000.0, 2.0**16, -3.0 * 2.0**14],
        "bfloat16": [2.0],
        "float16": [3.0, -16.0],
    }[t.dtype]

    def body(args: tuple[np.ndarray, int, list[int]]) -> None:
        x, perm_seed, drop = args
        n = x.shape[0]
        drop = sorted({d % n for d in drop})
        for c in shifts:
            xs = strat.cast(x.astype(np.float64) + c, t.dtype)
            if not np.array_equal(xs.astype(np.float64), x.astype(np.float64) + c):
                continue  # not exact in this dtype
            run.compare(run.call(xs), xs, what=f"shift by {c!r}")
            if abs(c) >= 1e4 and 0 < len(drop) < n:
                xm = xs.copy()
                xm[drop] = -np.inf
                run.compare(run.call(xm), xm, what=f"shift by {c!r}, masked entries")
        perm = np.random.default_rng(perm_seed).permutation(n)
        run.compare(run.call(x[perm]), x[perm], what="permutation")
        if len(drop) < n:
            masked = x.copy()
            masked[drop] = -np.inf
            kept = np.delete(x, drop)
            out_m = run.call(masked)
            run.compare(out_m, masked, what="masked entries")
            run.compare(run.call(kept), kept, what="masked entries removed")

    strategy = st.tuples(
        _dyadic_rows(t.dtype), st.integers(0, 1000), st.lists(st.integers(0, 50), max_size=4)
    )
    run_given(t, strategy, t.budget(30), body)


def _p_temperature_cap(t: Target, run: Run) -> None:
    """T5: beta >= 1, so the adaptive max is >= the softmax max (and entropy <= softmax's)."""
    from .. import reference

    def body(x: np.ndarray) -> None:
        out = run.call(x)
        got, _ = run.output(out, "temperature cap")
        if got.shape != x.shape:  # the shape check of run.compare, before the reshape here
            run.compare(out, x, what="temperature cap")
        xr, got = x.reshape(-1, x.shape[-1]), got.reshape(-1, x.shape[-1])
        sm = reference.softmax(xr)
        fmt = FORMATS[t.dtype]
        top_sm = np.max(sm, axis=-1)
        top = np.max(got.astype(np.float64), axis=-1)
        slack = 64 * fmt.u * top_sm + fmt.tiny
        if fmt.precision < 24 and not t.strict:
            # the default 16-bit contract: the scaled logits may be rounded once (any beta)
            cond = model.row_conditioning(xr)
            b = np.full(cond.H.shape, model.BETA_MAX)
            rel = model.logit_rounding_rel_error(cond, b, b, fmt)
            with np.errstate(over="ignore"):
                slack = slack + np.expm1(model.SLACK * np.max(rel, axis=-1)) * top_sm
        bad = np.flatnonzero(top < top_sm - slack)
        if bad.size:
            i = int(bad[0])
            raise Failed(
                f"temperature cap (T5) violated: the largest adaptive coefficient "
                f"{float(top[i])!r} is below the largest softmax coefficient {float(top_sm[i])!r}, "
                f"so beta < 1 on row {i}\nrepro:\nimport numpy as np\n{t.repro}\n"
                f"x = {row_literal(xr[i], t.dtype)}\n"
                f"print(float(kernel(x).max()))  # {float(top[i])!r}"
            )
        run.compare(out, x, what="temperature cap")

    # first two rows where P(H) < 1 (between the threshold and H_on, and beyond H_off),
    # whatever Hypothesis draws: beta = P(H) without max(P, 1) is below 1 on both
    for h, n in CAP_ROWS:
        body(strat.cast(strat.row_with_entropy(h, n, 1)[None, :], t.dtype))
    strategy = strat.logit_batches(
        strat.shapes(1, 3), max_size=40, dtype=t.dtype, families=("entropy", "translated")
    )
    run_given(t, strategy, t.budget(40), body)


#: ``(entropy, n)`` of the two-level rows ``temperature_cap`` checks first: P(0.6) = 0.43
#: and P(6.3) < 0 for the paper's polynomial, where beta must be 1.
CAP_ROWS = ((0.6, 64), (6.3, 2048))


#: The schedules passed as ``schedule=`` to a kernel that takes one.
OTHER_SCHEDULES: tuple[Schedule, ...] = (
    Constant("2"),
    Constant("0.5"),
    LogLength("0.5"),
    # beta jumps from 1 to 1.5 at H = 1, and P(H) = 2 - H/2 falls below 1 beyond H = 2,
    # where max(P, 1) binds: a kernel that leaves out the clamp scales by P there
    Polynomial(("-0.5", "2"), threshold="1"),
    # a cubic with a threshold other than 1 (beta 1.47 at H = 0.9, 1 below 0.7): a kernel
    # that hard-codes the threshold 1, reads it in bits (0.7 log2 e = 1.01) or evaluates
    # the polynomial from its last two coefficients conformed with the schedule above alone
    Polynomial(("0.1", "-0.5", "1", "0.9"), threshold="0.7"),
)

#: Rows of ``schedules`` with one unmasked item, or none: ``LogLength`` gives beta = 0
#: there (``n_eff = 1``), and a kernel that scales ``x - max`` without keeping its masked
#: items masked computes ``0 * -inf``, NaN.
SPARSE_ROWS = (
    "np.array([[0.3, -np.inf, -np.inf, -np.inf], [-np.inf, -np.inf, 2.0, -np.inf], "
    "[-np.inf, -np.inf, -np.inf, -np.inf], [0.3, 1.0, -np.inf, -np.inf]])"
)


def _p_schedules(t: Target, run: Run) -> None:
    r"""Other schedules passed as ``schedule=``: Constant, LogLength, a polynomial with a jump.

    Rows with masked items too: ``LogLength`` counts the unmasked items (its
    :math:`n_{\mathrm{eff}}`), and a kernel that passes the row's length is right
    on rows without masks only; rows with one unmasked item or none
    (:data:`SPARSE_ROWS`), where ``LogLength`` gives :math:`\beta = 0`; and a row of
    4099 items, every third masked (a second path for long rows).
    """
    if not t.takes_schedule:
        raise Skip("the kernel takes no schedule= keyword")
    rows, src = _branch_rows(t.dtype)
    # (H = 1.2: above the threshold 1 of the first polynomial, below the same threshold
    # read in bits, 1.44)
    hs = [0.3, 0.9, 1.2, 1.5, 2.5]
    small = np.stack([strat.cast(strat.row_with_entropy(h, 16, 1), t.dtype) for h in hs])
    small_src = _src_cast(
        f"np.stack([softmaxtheory.strategies.row_with_entropy(h, 16, 1) for h in {hs!r}])",
        t.dtype,
    )
    # 16 items, the odd ones masked: n_eff = 8
    hm = [0.3, 0.9, 1.5, 2.0]
    masked_src = (
        "np.where(np.arange(16) % 2 == 0, np.repeat(np.stack([softmaxtheory.strategies."
        f"row_with_entropy(h, 8, 1) for h in {hm!r}]), 2, axis=1), -np.inf)"
    )
    masked = strat.cast(eval(masked_src, {"np": np, "softmaxtheory": softmaxtheory}), t.dtype)
    sparse = strat.cast(eval(SPARSE_ROWS, {"np": np}), t.dtype)
    # a long row, every third item masked: a kernel whose path for long rows (blocked,
    # say) uses the paper's schedule whatever it was passed is right on the rows above
    long, long_src = _padded_array(51, ODD_TAIL, 2.0, "i % 3 == 0", t.dtype)
    cases = (
        (small, small_src),
        (masked, _src_cast(masked_src, t.dtype)),
        (sparse, _src_cast(SPARSE_ROWS, t.dtype)),
        (rows, src),
        (long, long_src),
    )
    for sched in OTHER_SCHEDULES:
        for x, xs in cases:
            out = run.call(x, schedule=sched)
            run.compare(out, x, schedule=sched, source=xs, what=f"schedule={sched!r}")
    # the first schedule on many rows and on a row past 65536 items: a path for large
    # batches or for rows split across programs must be passed the schedule too
    sched = OTHER_SCHEDULES[0]
    for x, xs, what in _large_inputs(t.dtype):
        out = run.call(x, schedule=sched)
        run.compare(out, x, schedule=sched, source=xs, what=f"{what}, schedule={sched!r}")


def _attention_schedules(
    run: Run, inputs: dict[str, Any], what: str, source: dict[str, str]
) -> None:
    """`inputs` again with each of :data:`OTHER_SCHEDULES`, for a kernel that takes ``schedule=``.

    With masks, ``LogLength`` counts each query's unmasked keys.
    """
    if not run.target.takes_schedule:
        return
    for sched in OTHER_SCHEDULES:
        _attention_compare(
            run, inputs, f"{what}, schedule={sched!r}", source=source, schedule=sched
        )


def _attention_other_mode(
    run: Run, inputs: dict[str, Any], what: str, source: dict[str, str]
) -> None:
    """`inputs` again at the other entropy mode, for a kernel that takes ``entropy_eps=``.

    See :func:`_in_other_entropy_mode`.
    """
    eps = _other_entropy_mode(run.target)
    _in_other_entropy_mode(
        run,
        lambda sub: _attention_compare(sub, inputs, f"{what}, entropy_eps={eps!r}", source=source),
    )


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------


#: The operand views of ``attention_layouts``: label -> source for numpy and for torch,
#: ``{x}`` standing for the operand. The same text runs in the suite and in the repro.
VIEWS = {
    "last axis of stride n": (
        "np.swapaxes(np.ascontiguousarray(np.swapaxes({x}, -1, -2)), -1, -2)",
        "{x}.transpose(-1, -2).contiguous().transpose(-1, -2)",
    ),
    "last axis of stride 2": (
        "np.stack([{x}, np.zeros_like({x})], -1).reshape(*{x}.shape[:-1], -1)[..., ::2]",
        "torch.stack([{x}, torch.zeros_like({x})], -1).flatten(-2)[..., ::2]",
    ),
    "head 0 broadcast (stride 0)": (
        "np.broadcast_to({x}[..., :1, :, :], {x}.shape)",
        "{x}[..., :1, :, :].expand({x}.shape)",
    ),
    "a slice of a wider buffer (it starts inside it)": (
        "np.concatenate([np.zeros_like({x}[..., :1]), {x}], -1)[..., 1:]",
        "torch.cat([torch.zeros_like({x}[..., :1]), {x}], -1)[..., 1:]",
    ),
    "heads of a (B, L, H, d) projection": (
        "np.swapaxes(np.ascontiguousarray(np.swapaxes({x}, -3, -2)), -3, -2)",
        "{x}.transpose(-3, -2).contiguous().transpose(-3, -2)",
    ),
}


def _view_source(t: Target, label: str) -> str:
    """The :data:`VIEWS` text of view `label` for the target's framework."""
    return VIEWS[label][0 if t.framework == "numpy" else 1]


def _view(t: Target, label: str) -> Callable[[Any], Any]:
    """The function of view `label` for the target's framework (its :data:`VIEWS` text)."""
    names: dict[str, Any] = {"np": np}
    if t.framework == "torch":
        import torch

        names["torch"] = torch
    return eval("lambda x: " + _view_source(t, label).format(x="x"), names)


def _attention_compare(
    run: Run,
    inputs: dict[str, Any],
    what: str,
    views: dict[str, str] | None = None,
    source: dict[str, str] | None = None,
    schedule: Schedule | None = None,
    grad_mode: str | None = None,
) -> Any:
    """Call the kernel on `inputs`, check its output against the reference and return it.

    ``inputs["scale"]`` is passed when present; `views` maps operands (``"q"``, ``"k"``,
    ``"v"``) to a label of :data:`VIEWS`, applied once they are in the framework (the
    repro applies them too); `source` maps operands to source text that rebuilds them
    (for the repro of operands too large to write out); `schedule`, when given, is
    passed as ``schedule=`` (the target's own otherwise); `grad_mode`, a label of
    :data:`~softmaxtheory._check.target.GRAD_MODES`, is how a torch kernel is called.
    A kernel that raises fails with the exception and a repro of the call.
    """
    t = run.target
    q, k, v, mask, causal = (inputs[n] for n in ("q", "k", "v", "mask", "is_causal"))
    views = views or {}
    try:
        out = t.call_attention(
            q, k, v, mask, causal, scale=inputs.get("scale"),
            views={n: _view(t, lb) for n, lb in views.items()}, schedule=schedule,
            enable_gqa=bool(inputs.get("enable_gqa")), grad_mode=grad_mode,
        )  # fmt: skip
    except Failed as exc:
        raise Failed(f"{what}: {exc}") from exc
    except Exception as exc:
        repro = _attention_call_repro(t, inputs, views, source, schedule, grad_mode)
        raise _Raised(
            f"{what}: the kernel raised {type(exc).__name__}: {exc}\nrepro:\n{repro}"
        ) from exc
    _attention_check(run, out, inputs, what, views, source, schedule, grad_mode)
    return out


class _Raised(Failed):
    """:func:`_attention_compare`'s failure when the kernel raised (the exception its cause)."""


def _attention_repro_head(
    t: Target,
    views: dict[str, str] | None,
    source: dict[str, str] | None,
    schedule: Schedule | None,
    grad_mode: str | None,
) -> str:
    """The lines that define ``kernel`` for an attention repro, the call made as the suite did.

    `views`, `source`, `schedule` and `grad_mode` as for :func:`_attention_compare`.
    """
    repro = t.attention_repro(
        {n: _view_source(t, lb) for n, lb in (views or {}).items()}, grad_mode
    )
    repro = with_schedule(repro, schedule)
    if source and any("softmaxtheory.strategies" in text for text in source.values()):
        repro = "import softmaxtheory.strategies\n" + repro
    return repro


def _attention_call_repro(
    t: Target,
    inputs: dict[str, Any],
    views: dict[str, str] | None,
    source: dict[str, str] | None,
    schedule: Schedule | None,
    grad_mode: str | None,
) -> str:
    """A snippet that makes the suite's call of an attention kernel on `inputs`.

    Operands of up to ``3 * REPRO_ITEMS`` values are written out, larger ones rebuilt
    from `source` where it has them (written out otherwise); the other arguments as
    for :func:`_attention_compare`.
    """
    names = [*"qkv", *(["mask"] if inputs["mask"] is not None else [])]
    lines = ["import numpy as np", _attention_repro_head(t, views, source, schedule, grad_mode)]
    for name in names:
        a, src = np.asarray(inputs[name]), (source or {}).get(name)
        if a.size > 3 * tst.REPRO_ITEMS and src is not None:
            lines.append(f"{name} = {src}")
        elif a.dtype == bool:  # (an operand without a source is written out, however long)
            lines.append(f"{name} = np.array({a.tolist()!r})")
        else:
            dtype = t.dtype if name != "mask" else a.dtype.name
            lines.append(f"{name} = {array_literal(a, dtype)}")
    kw = ", mask=mask" if inputs["mask"] is not None else ""
    kw += ", is_causal=True" if inputs["is_causal"] else ""
    kw += "" if inputs.get("scale") is None else f", scale={inputs['scale']!r}"
    kw += ", enable_gqa=True" if inputs.get("enable_gqa") else ""
    lines.append(f"kernel(q, k, v{kw})  # raises")
    return "\n".join(lines)


def _attention_check(
    run: Run,
    out: Any,
    inputs: dict[str, Any],
    what: str,
    views: dict[str, str] | None = None,
    source: dict[str, str] | None = None,
    schedule: Schedule | None = None,
    grad_mode: str | None = None,
) -> None:
    """Check the kernel's output `out` on `inputs` (see :func:`_attention_compare`)."""
    t = run.target
    q, k, v, mask, causal = (inputs[n] for n in ("q", "k", "v", "mask", "is_causal"))
    repro = _attention_repro_head(t, views, source, schedule, grad_mode)
    got, got_dtype = run.output(out, what)
    if got_dtype != t.dtype:
        raise Failed(f"{what}: the kernel returned dtype {got_dtype} for {t.dtype} input")
    try:
        rep = tst.assert_attention_close(
            got, (q, k, v), mask=mask, is_causal=causal, scale=inputs.get("scale"),
            schedule=schedule or t.schedule, entropy_eps=t.entropy_eps, dtype=t.dtype, repro=repro,
            strict=t.strict, source=source, enable_gqa=bool(inputs.get("enable_gqa")),
        )  # fmt: skip
    except tst.KernelMismatch as exc:
        run.record(exc.report)
        exc.add_note(what)
        raise
    run.record(rep)


#: The operand shapes of real models' attention, ``(q, k, v)`` with their seeds: head
#: dims 64 and 128, where kernels keep their tuned instances (and take a generic path for
#: others), with 4 queries, 4 (batch, head) slices and more than 16 keys, the counts a
#: fused kernel's dispatch asks for (Megatron's ``FusedScaleMaskSoftmax`` takes its kernel
#: when 16 < S, L and the slices are multiples of 4). The draws have head dims up to 8.
MODEL_SHAPES = (
    ((70, (2, 2, 4, 64)), (71, (2, 2, 20, 64)), (72, (2, 2, 20, 64))),
    ((73, (1, 4, 4, 128)), (74, (1, 4, 20, 128)), (75, (1, 4, 20, 128))),
)


def _model_shapes(t: Target, run: Run) -> None:
    """:data:`MODEL_SHAPES`, plainly, with a key-padding mask, causal and ``scale=2.0``.

    Each where the kernel takes it: a tuned path must honour every keyword.
    """
    for shapes in MODEL_SHAPES:
        ops, source = _qkv(t, shapes)
        (_, (_, _, L, d)), (_, (_, _, S, _)) = shapes[0], shapes[1]
        label = f"head dim {d}, {L} queries over {S} keys in 4 slices"
        base = {**ops, "mask": None, "is_causal": False}
        _attention_compare(run, base, label, source=source)
        if t.mask_keyword is not None:
            # (the mask's source too: its repro wrote ``np.asarray(<your mask>)``)
            pad_src = f"np.tile(np.arange({S}) < {S - 7}, ({L}, 1))"
            padding = eval(pad_src, {"np": np})
            _attention_compare(run, {**base, "mask": padding},
                               f"{label}, the last 7 keys masked",
                               source={**source, "mask": pad_src})  # fmt: skip
        if t.takes_causal:
            _attention_compare(run, {**base, "is_causal": True}, f"{label}, causal",
                               source=source)  # fmt: skip
        if t.takes_scale:
            _attention_compare(run, {**base, "scale": 2.0}, f"{label}, scale=2.0",
                               source=source)  # fmt: skip


def _p_attention_values(t: Target, run: Run) -> None:
    """Real models' shapes, then random q, k, v (sharp, flat, batched), against the reference.

    The shapes are :data:`MODEL_SHAPES`. A kernel that takes ``scale=`` also gets drawn
    scales, of either sign and 0 (:data:`~softmaxtheory.strategies.ATTENTION_SCALES`).
    """
    _model_shapes(t, run)
    run_given(
        t,
        strat.attention_inputs(t.dtype, scales=t.takes_scale),
        t.budget(50),
        lambda inp: _attention_compare(run, inp, "attention values"),
    )


def _p_attention_masks(t: Target, run: Run) -> None:
    """Boolean masks (True attends); masks with batch dimensions, as key-padding masks have.

    A mask of shape ``(B, 1, S)`` (each sequence its own padding) broadcasts over the
    queries, and one of shape ``(B, L, S)`` gives each batch entry its own mask: a
    kernel that reads the first entry's mask for every entry is right on 2-d masks.
    Then additive masks, key padding over whole blocks of 300 and of 4099 keys, masks of
    4-d operands (per head, and ``(B, 1, 1, S)``), masked keys with the largest logits,
    and queries whose every key is masked.
    """
    if t.mask_keyword is None:
        raise Skip("the kernel takes no mask= or attn_mask= keyword")
    strategy = strat.attention_inputs(t.dtype, masks=True, batch=False).filter(
        lambda d: d["mask"] is not None
    )
    run_given(t, strategy, t.budget(25), lambda inp: _attention_compare(run, inp, "masked"))
    (q, q_src), (k, k_src), (v, v_src) = (
        _rng_array(seed, shape, 1.0, t.dtype)
        for seed, shape in ((8, (3, 5, 4)), (9, (3, 7, 4)), (10, (3, 7, 2)))
    )
    source = {"q": q_src, "k": k_src, "v": v_src}
    lengths = np.array([7, 4, 2])  # keys kept per sequence: a key-padding mask
    padding = np.arange(7)[None, None, :] < lengths[:, None, None]  # (3, 1, 7)
    per_entry = np.random.default_rng(11).random((3, 5, 7)) < 0.6  # (3, 5, 7)
    per_entry[:, :, 0] = True  # every query keeps a key
    for label, mask in (("key padding, shape (3, 1, 7)", padding),
                        ("a mask per batch entry, shape (3, 5, 7)", per_entry)):  # fmt: skip
        inputs = {"q": q, "k": k, "v": v, "mask": mask, "is_causal": False}
        _attention_compare(run, inputs, f"masked, {label}", source=source)
    _additive_masks(run, {"q": q, "k": k, "v": v, "is_causal": False}, padding, source)
    # key padding over whole key blocks: entry 0 keeps its last 100 of 300 keys (left
    # padding), entry 1 its first 37 (right padding); see PADDINGS
    (q, q_src), (k, k_src), (v, v_src) = (
        _rng_array(seed, shape, 1.0, t.dtype)
        for seed, shape in ((13, (2, 4, 8)), (14, (2, 300, 8)), (15, (2, 300, 3)))
    )
    keys = np.arange(300)[None, None, :]
    blocks = np.concatenate([keys >= 200, keys < 37])  # (2, 1, 300)
    source = {"q": q_src, "k": k_src, "v": v_src,
              "mask": "np.concatenate([np.arange(300)[None, None, :] >= 200, "
                      "np.arange(300)[None, None, :] < 37])"}  # fmt: skip
    inputs = {"q": q, "k": k, "v": v, "mask": blocks, "is_causal": False}
    _attention_compare(run, inputs, "masked, key padding over whole blocks of keys", source=source)
    _attention_schedules(run, inputs, "masked, key padding", source)
    _attention_other_mode(run, inputs, "masked, key padding", source)
    if t.takes_scale:  # a masked path must take scale= too
        for scale in (2.0, -0.5):
            _attention_compare(run, {**inputs, "scale": scale},
                               f"masked, key padding, scale={scale}", source=source)  # fmt: skip
    _long_key_padding(run)
    _per_head_masks(run)
    _masked_far_keys(run)
    _fully_masked_queries(run)
    _fully_masked_queries(run, keys=1)
    # 100 queries, each with a mask of its own: a kernel that tiles the queries and
    # forgets the tile's row offset into the mask reads the first tile's rows for every
    # tile (the masks above have a few queries)
    ops, source = _qkv(t, ((53, (1, 100, 8)), (54, (1, 21, 8)), (55, (1, 21, 3))))
    mask_src = "(np.random.default_rng(56).random((100, 21)) < 0.5) | (np.arange(21) == 0)"
    inputs = {**ops, "mask": eval(mask_src, {"np": np}), "is_causal": False}
    _attention_compare(run, inputs, "masked, 100 queries, a mask row each, shape (100, 21)",
                       source={**source, "mask": mask_src})  # fmt: skip


def _long_key_padding(run: Run) -> None:
    """Key padding over whole chunks of up to 2048 of 4099 keys (``ODD_TAIL``).

    Entry 0 keeps keys 2100 and up (left padding: keys 0 to 2047 masked), entry 1 its
    first 1000 (right padding: keys 1024 to 4095). A kernel that splits the keys into
    chunks (of 512 or 1024, as memory-efficient attention does) and merges their
    normalisers by ``exp(m_chunk - m)`` gets NaN from a fully masked chunk; with 300 keys
    (the case before) every chunk of 512 or more held a kept key.
    """
    ops, source = _qkv(run.target, ((25, (2, 3, 8)), (26, (2, ODD_TAIL, 8)),
                                    (27, (2, ODD_TAIL, 3))))  # fmt: skip
    keys = f"np.arange({ODD_TAIL})[None, None, :]"
    source["mask"] = f"np.concatenate([{keys} >= 2100, {keys} < 1000])"
    inputs = {**ops, "mask": eval(source["mask"], {"np": np}), "is_causal": False}  # (2, 1, S)
    _attention_compare(run, inputs, f"masked, key padding over chunks of {ODD_TAIL} keys",
                       source=source)  # fmt: skip


def _per_head_masks(run: Run) -> None:
    """Masks of 4-d operands ``(B, H, L, d)``: one per (entry, head), and key padding.

    A ``(2, 3, 5, 7)`` mask gives every head its own pattern: a kernel that reads head 0's
    for every head is right on the 3-d masks of the cases before. A ``(2, 1, 1, 7)`` mask
    pads each entry's keys across all its heads and queries.
    """
    ops, ops_source = _qkv(run.target, ((28, (2, 3, 5, 4)), (29, (2, 3, 7, 4)),
                                        (30, (2, 3, 7, 2))))  # fmt: skip
    masks = (  # every query keeps key 2
        ("a mask per head, shape (2, 3, 5, 7)",
         "(np.random.default_rng(31).random((2, 3, 5, 7)) < 0.5) | (np.arange(7) == 2)"),
        ("key padding of 4-d operands, shape (2, 1, 1, 7)",
         "np.arange(7)[None, None, None, :] < np.array([5, 2])[:, None, None, None]"),
    )  # fmt: skip
    for label, mask_src in masks:
        inputs = {**ops, "mask": eval(mask_src, {"np": np}), "is_causal": False}
        source = {**ops_source, "mask": mask_src}
        _attention_compare(run, inputs, f"masked, {label}", source=source)


def _masked_far_keys(run: Run, additive: bool = False) -> None:
    """Masked keys whose logits are 15000 above the others: a mask must remove a key.

    A kernel that writes its mask as a large negative number (-1e4, a "finite mask")
    adds it to a logit of 15000 and attends to the masked keys; drawn logits are a few
    units, where -1e4 removes a key as well as ``-inf`` does.
    """
    t = run.target
    src = {
        "q": "np.tile([[[50.0, 0.0, 0.0, 0.0], [0.0, 50.0, 0.0, 0.0]]], (2, 1, 1))",
        "k": "np.tile(np.array([[600.0, 0, 0, 0], [0, 0, 1, 0], [1, 1, 0, 0], [0, 600, 0, 0], "
        "[0, -1, 0, 1], [0, 0, 0, -1]])[None], (2, 1, 1))",
        "v": "np.random.default_rng(19).normal(0.0, 1.0, (2, 6, 3))",
        "mask": "np.tile(np.array([False, True, True, False, True, True])[None, None], (2, 2, 1))",
    }
    if additive:
        src["mask"] = f"np.where({src['mask']}, 0.0, -np.inf)"
    arrays = {n: eval(text, {"np": np}) for n, text in src.items()}
    inputs = {n: strat.cast(a, t.dtype) for n, a in arrays.items() if n != "mask"}
    mask = strat.cast(arrays["mask"], t.dtype) if additive else arrays["mask"]
    inputs.update(mask=mask, is_causal=False)
    source = {n: _src_cast(text, t.dtype) for n, text in src.items() if n != "mask"}
    source["mask"] = _src_cast(src["mask"], t.dtype) if additive else src["mask"]
    what = "masked keys with the largest logits (15000)" + (", additive mask" if additive else "")
    _attention_compare(run, inputs, what, source=source)


def _zeros_expected(run: Run, values: np.ndarray, what: str, why: str) -> None:
    """Fail unless `values` (outputs of queries that attend nothing) are all 0.

    All NaN (SDPA's convention) is noted instead, and fails under strict; `why` ends
    the failure's message.
    """
    values = np.asarray(values, dtype=np.float64)
    if np.all(values == 0):
        return
    if not (np.all(np.isnan(values)) and not run.target.strict):
        nan = " (NaN is tolerated only without strict)" if np.all(np.isnan(values)) else ""
        raise Failed(f"{what}: got {values.ravel().tolist()!r}, the table gives zeros{nan}; "
                     f"{why}")  # fmt: skip
    run.notes.append(f"{what}: NaN where the table gives zeros")


def _fully_masked_queries(run: Run, additive: bool = False, keys: int = 6) -> None:
    """Queries whose every key is masked: their output is 0 (the special-value table).

    NaN there (SDPA's convention) is noted, and a failure under strict; a number that
    is not 0 (the mean of the values, from a finite mask) fails. The other queries are
    checked against the reference. With ``keys=1``, the one key masked: a fast path for
    one key that returns its value whatever the mask fails.
    """
    t = run.target
    (q, _), (k, _), (v, _) = (
        _rng_array(seed, shape, 1.0, t.dtype)
        for seed, shape in ((21, (2, 4, 4)), (22, (2, keys, 4)), (23, (2, keys, 3)))
    )
    mask = np.random.default_rng(24).random((2, 4, keys)) < 0.6
    mask[:, :, 0] = True
    mask[:, 2, :] = False  # query 2 of each batch entry attends to nothing
    what = "masked, a query whose every key is masked"
    if keys == 1:
        what += ", one key"
    if additive:
        mask = strat.cast(np.where(mask, 0.0, -np.inf), t.dtype)
        what += ", additive mask"
    inputs = {"q": q, "k": k, "v": v, "mask": mask, "is_causal": False}
    try:
        out = t.call_attention(q, k, v, mask, False)
    except Failed as exc:
        raise Failed(f"{what}: {exc}") from exc
    except Exception as exc:
        repro = _attention_call_repro(t, inputs, None, None, None, None)
        raise Failed(
            f"{what}: the kernel raised {type(exc).__name__}: {exc}\nrepro:\n{repro}"
        ) from exc
    got, _ = run.output(out, what)
    _zeros_expected(run, got[:, 2], what, "a number there means masked keys were attended "
                    "(a mask written as a finite number?)")  # fmt: skip
    keep = [0, 1, 3]
    rest = {"q": q[:, keep], "k": k, "v": v, "mask": mask[:, keep], "is_causal": False}
    _attention_check(run, out[:, keep], rest, f"{what}: the other queries")


#: The float mask of ``attention_masks`` over 300 keys (numpy source): a bias of
#: normal(0, 2) values, entry 0 keeping its last 100 keys and entry 1 its first 37.
LONG_BIAS = (
    "np.where(np.concatenate([np.arange(300)[None, None, :] >= 200, "
    "np.arange(300)[None, None, :] < 37]), "
    "np.random.default_rng(19).normal(0.0, 2.0, (2, 1, 300)), -np.inf)"
)


def _additive_masks(
    run: Run, base: dict[str, Any], padding: np.ndarray, source: dict[str, str]
) -> None:
    """Float masks, added to the logits (``-inf`` removes a key), when the kernel takes them.

    A kernel that refuses a float mask (an exception) is noted as taking boolean masks
    only; one that takes it must add it: reading it as a boolean (nonzero attends) or
    multiplying by it gives other values. `padding` is the boolean key-padding mask,
    given here as 0 and ``-inf``. The first mask goes through the ``schedules``
    property's schedules too, where the kernel takes ``schedule=``; then a bias of real
    values over 300 keys (:data:`LONG_BIAS`).
    """
    t = run.target
    rng = np.random.default_rng(12)
    bias = rng.normal(0.0, 2.0, (5, 7))
    bias[rng.random((5, 7)) < 0.3] = -np.inf
    bias[:, 1] = 0.0  # every query keeps a key, and some entries are exactly 0
    cases = [("additive mask, shape (5, 7)", strat.cast(bias, t.dtype)),
             ("additive key padding, shape (3, 1, 7)",
              strat.cast(np.where(padding, 0.0, -np.inf), t.dtype))]  # fmt: skip
    (label, mask), rest = cases[0], cases[1:]
    first = {**base, "mask": mask}
    if not _refusable_case(run, first, f"masked, {label}", "float (additive) masks", source):
        return
    # LogLength counts the keys a float mask leaves (its -inf removes one): a kernel that
    # counts the keys of a boolean mask alone counts every key here
    _attention_schedules(run, first, f"masked, {label}", source)
    if t.takes_scale:
        _attention_compare(run, {**first, "scale": 2.0}, f"masked, {label}, scale=2.0",
                           source=source)  # fmt: skip
    for label, mask in rest:
        _attention_compare(run, {**base, "mask": mask}, f"masked, {label}", source=source)
    # a bias of real values over 300 keys (the masks above have 7): a long-key path that
    # keeps only which entries are finite is right on 0 / -inf padding
    ops, long_source = _qkv(t, ((13, (2, 4, 8)), (14, (2, 300, 8)), (15, (2, 300, 3))))
    mask = strat.cast(eval(LONG_BIAS, {"np": np}), t.dtype)
    _attention_compare(run, {**ops, "mask": mask, "is_causal": False},
                       "masked, a bias of real values over 300 keys, shape (2, 1, 300)",
                       source={**long_source, "mask": _src_cast(LONG_BIAS, t.dtype)})  # fmt: skip
    # -inf in a float mask removes a key as False does: a kernel that clamps the mask at
    # -1e4 (or the float minimum) attends masked keys far above the others, and gives a
    # query whose every key is masked the mean of the values
    _masked_far_keys(run, additive=True)
    _fully_masked_queries(run, additive=True)
    _lowest_float_masks(run)


def _lowest_float_masks(run: Run) -> None:
    r"""Float masks whose entries for some queries are all the lowest finite float (or 0.6 of it).

    Hugging Face writes masked keys as the lowest float; it is a value, not ``-inf``: a
    query whose every key carries it attends them all (its logits, rounded, are about
    equal: nearly the mean of the values, which lie near 3), where a kernel that reads the
    lowest float (or everything below half of it) as a mask answers 0 or NaN. The other
    queries keep some keys at 0.
    """
    t = run.target
    ops, source = _qkv(t, ((57, (2, 4, 4)), (58, (2, 6, 4)), (59, (2, 6, 3))))
    # values near 3: the rounded logits' allowance spans the values, and 0 lies outside
    v_src = "np.random.default_rng(59).normal(3.0, 0.5, (2, 6, 3))"
    ops["v"], source["v"] = strat.cast(eval(v_src, {"np": np}), t.dtype), _src_cast(v_src, t.dtype)
    low = -FORMATS[t.dtype].max_finite
    mask_src = (
        f"np.where(np.arange(4)[:, None] < 2, np.array([{low!r}, {0.6 * low!r}, 0.0, 0.0])"
        "[:, None], np.where((np.random.default_rng(60).random((2, 4, 6)) < 0.5) & "
        f"(np.arange(6) > 0), {low!r}, 0.0))"
    )
    mask = strat.cast(eval(mask_src, {"np": np}), t.dtype)
    inputs = {**ops, "mask": mask, "is_causal": False}
    what = "masked, queries whose every key carries the lowest finite float (0.6 of it)"
    _attention_compare(run, inputs, what, source={**source, "mask": _src_cast(mask_src, t.dtype)})


def _p_attention_causal(t: Target, run: Run) -> None:
    r"""``is_causal=True`` (keys j > i masked); with drawn scales when the kernel takes them.

    Drawn cases, then 130 queries and keys (whole key blocks beyond the diagonal),
    one query over 5 keys (a decoding step: the query sees key 0 only), and 5 queries
    over 261 keys (the mask aligned to the top left at a length where a kernel may
    switch to a long-sequence path).

    A causal mask applied before a scale of 0 or below gives :math:`0 \cdot (-\infty)`
    (NaN) or :math:`+\infty` in the masked logits: torch's CPU flash kernel did (2.13).
    """
    if not t.takes_causal:
        raise Skip("the kernel takes no is_causal= keyword")
    strategy = strat.attention_inputs(t.dtype, causal=True, scales=t.takes_scale).filter(
        lambda d: d["is_causal"]
    )
    run_given(t, strategy, t.budget(25), lambda inp: _attention_compare(run, inp, "causal"))
    # 130 queries and keys: for the first queries, whole blocks of keys lie beyond the
    # diagonal (masked), for every block size up to 64
    (q, q_src), (k, k_src), (v, v_src) = (
        _rng_array(seed, shape, 1.0, t.dtype)
        for seed, shape in ((16, (1, 130, 8)), (17, (1, 130, 8)), (18, (1, 130, 3)))
    )
    inputs = {"q": q, "k": k, "v": v, "mask": None, "is_causal": True}
    source = {"q": q_src, "k": k_src, "v": v_src}
    _attention_compare(run, inputs, "causal, 130 queries and keys", source=source)
    _attention_schedules(run, inputs, "causal, 130 queries and keys", source)
    _attention_other_mode(run, inputs, "causal, 130 queries and keys", source)
    # one query over 5 keys (a decoding step): top-left aligned, the query sees key 0
    # only; a single-query path that skips the causal mask attends all 5
    ops, source = _qkv(t, ((34, (2, 1, 4)), (35, (2, 5, 4)), (36, (2, 5, 3))))
    inputs = {**ops, "mask": None, "is_causal": True}
    _attention_compare(run, inputs, "causal, one query over 5 keys", source=source)
    # 5 queries over 261 keys: the drawn cases with L != S have a few keys; a kernel that
    # sends long key sequences to a path aligning the mask to the bottom right (query i
    # sees keys j <= i + S - L, FlashAttention's convention) is right on them
    ops, source = _qkv(t, ((48, (1, 5, 8)), (49, (1, 261, 8)), (50, (1, 261, 3))))
    inputs = {**ops, "mask": None, "is_causal": True}
    _attention_compare(run, inputs, "causal, 5 queries over 261 keys", source=source)


#: The non-finite entries ``attention_special_values`` plants, as ``(what, operand, index,
#: values)``: each case puts `values` at `index` of `operand` (q, k, v of shapes (2, 4, 8),
#: (2, 6, 8), (2, 6, 3)).
ATTENTION_SPECIAL = (
    ("NaN in a query: its row is NaN", "q", ((0, 1, 2),), (math.nan,)),
    ("NaN in a key: every query attending it is NaN", "k", ((1, 3, 0),), (math.nan,)),
    ("NaN in a value: its column is NaN", "v", ((0, 2, 1),), (math.nan,)),
    ("+inf in a value: its column is +inf", "v", ((1, 4, 0),), (math.inf,)),
    ("+inf and -inf in one value column: NaN", "v", ((0, 1, 2), (0, 5, 2)), (math.inf, -math.inf)),
)


def _p_attention_special_values(t: Target, run: Run) -> None:
    r"""NaN and infinities in q, k and v, none of them masked: the special-value table.

    A logit that is NaN makes its query's row NaN (the table's "contains NaN"), so a
    NaN in a query gives that query NaN and a NaN in a key every query of its batch
    entry that attends it; a
    value enters its column of every output with a positive weight, so NaN or
    :math:`\pm\infty` there is NaN or :math:`\pm\infty` in that column, and
    :math:`+\infty` with :math:`-\infty` NaN. A kernel that zeroes NaN
    (``nan_to_num``) or drops the keys holding one passes every finite input.
    Masked keys holding NaN and infinite keys are left out: there conventions
    differ (SDPA adds the mask to a NaN logit, and weighs a masked NaN value by 0).
    Then a NaN query over one key, and empty sequences (:func:`_empty_sequences`).
    """
    base = {
        name: _rng_array(seed, shape, 1.0, t.dtype)
        for name, seed, shape in (("q", 21, (2, 4, 8)), ("k", 22, (2, 6, 8)), ("v", 23, (2, 6, 3)))
    }
    for what, operand, where, values in ATTENTION_SPECIAL:
        arrays = {name: a.copy() for name, (a, _) in base.items()}
        for index, value in zip(where, values, strict=True):
            arrays[operand][index] = value
        inputs = {**arrays, "mask": None, "is_causal": False}
        source = {name: src for name, (_, src) in base.items() if name != operand}
        _attention_compare(run, inputs, what, source=source)
    # one key: a fast path that returns its value (softmax over one key is 1) must still
    # give the NaN query NaN
    arrays = {"q": base["q"][0].copy(), "k": base["k"][0][:, :1], "v": base["v"][0][:, :1]}
    arrays["q"][0, 1, 2] = math.nan
    _attention_compare(run, {**arrays, "mask": None, "is_causal": False},
                       "NaN in a query, one key: its row is NaN",
                       source={n: f"({base[n][1]})[:, :1]" for n in "kv"})  # fmt: skip
    _empty_sequences(run)


def _empty_sequences(run: Run) -> None:
    """Empty sequences: no keys (S = 0), no queries (L = 0).

    With no keys every query attends nothing, so its output is 0, as for a query whose
    every key is masked (NaN noted, a failure under strict); with no queries the output
    is empty. A refusal (an exception) is noted, as ``n = 0`` is for the row kinds.
    A flash-style kernel that writes its output after the last key block leaves
    uninitialised memory when there is no block.
    """
    t = run.target
    cast = lambda a: strat.cast(a, t.dtype)  # noqa: E731
    g = np.random.default_rng(26)
    cases = (
        ("no keys (S = 0)", (1, 3, 4), (1, 0, 4), (1, 0, 2)),
        ("no queries (L = 0)", (1, 0, 4), (1, 5, 4), (1, 5, 2)),
    )
    for what, *shapes in cases:
        q, k, v = (cast(g.normal(0, 1, shape)) for shape in shapes)
        try:
            out = t.call_attention(q, k, v, None, False)
        except Failed as exc:
            raise Failed(f"{what}: {exc}") from exc
        except Exception as exc:
            run.notes.append(f"{what} refused with {type(exc).__name__}")
            continue
        got, got_dtype = run.output(out, what)
        want = (*q.shape[:-1], v.shape[-1])
        if got.shape != want or got_dtype != t.dtype:
            raise Failed(f"{what}: got shape {got.shape}, dtype {got_dtype}; expected {want}, "
                         f"{t.dtype}")  # fmt: skip
        why = f"q {q.shape}, k {k.shape}, v {v.shape}: every query attends nothing"
        _zeros_expected(run, got, what, why)
        run.checks += 1


def _p_attention_layouts(t: Target, run: Run) -> None:
    """Operands that are views: strided, broadcast, offset, and projections' heads.

    A last axis of stride n or 2, heads broadcast (stride 0), slices that start inside
    their buffer, and heads of ``(B, L, H, d)`` projections. The same values as
    contiguous operands, so the same outputs. With ``d = dv`` (the case fused kernels
    take). A kernel that reads each row as contiguous memory without
    checking gets these wrong: torch's CPU flash kernel did (2.13). One that addresses
    an operand from its storage's start (``untyped_storage().data_ptr()`` for
    ``data_ptr()``) reads a slice's neighbours; one that assumes packed heads reads a
    projection's heads wrongly. Then k and v whose leading dimensions broadcast
    against q's (:func:`_broadcast_heads`).
    """
    rng = np.random.default_rng(23)
    cast = lambda a: strat.cast(a, t.dtype)  # noqa: E731
    q = cast(rng.normal(0, 2, (2, 6, 8)))
    k = cast(rng.normal(0, 1, (2, 7, 8)))
    v = cast(rng.normal(0, 1, (2, 7, 8)))
    base = {"q": q, "k": k, "v": v, "mask": None, "is_causal": False}
    for label in ("last axis of stride n", "last axis of stride 2",
                  "a slice of a wider buffer (it starts inside it)"):  # fmt: skip
        for name in "qkv":
            _attention_compare(run, base, f"{name} as a view, {label}", {name: label})
        _attention_compare(run, base, f"q, k and v as views, {label}", dict.fromkeys("qkv", label))
    # 4-d operands as a model makes them: (B, L, H, d) projections with heads and
    # sequence swapped, so that neither heads nor rows are packed
    g = np.random.default_rng(24)
    heads = {"q": cast(g.normal(0, 2, (2, 3, 5, 8))), "k": cast(g.normal(0, 1, (2, 3, 6, 8))),
             "v": cast(g.normal(0, 1, (2, 3, 6, 4))), "mask": None, "is_causal": False}  # fmt: skip
    label = "heads of a (B, L, H, d) projection"
    _attention_compare(run, heads, f"q, k and v as {label}", dict.fromkeys("qkv", label))
    # the values the view shows: head 0 in both heads
    shared = {**base, "k": np.repeat(k[:1], 2, axis=0), "v": np.repeat(v[:1], 2, axis=0)}
    label = "head 0 broadcast (stride 0)"
    _attention_compare(run, shared, f"k and v as views, {label}", dict.fromkeys("kv", label))
    _broadcast_heads(run)
    if t.takes_causal:
        label = "last axis of stride n"
        sq = {**base, "q": cast(rng.normal(0, 2, (2, 7, 8))), "is_causal": True}
        _attention_compare(run, sq, f"causal, q, k and v as views, {label}",
                           dict.fromkeys("qkv", label))  # fmt: skip
    if t.framework == "torch":
        _attention_grad_modes(run, base)


def _broadcast_heads(run: Run) -> None:
    """Keys and values of shape ``(2, 1, 6, d)`` against queries ``(2, 3, 5, 8)``.

    Leading dimensions that broadcast, as the reference and
    ``scaled_dot_product_attention``'s math path take them. A kernel that refuses
    them (an exception) is noted; one that returns a result must pair each query head
    with the one key head: a kernel that flattens the (batch, head) slices and reads k
    and v at slice ``i % 2`` reads batch entry 1's keys for batch entry 0's second head.
    """
    t = run.target
    ops, source = _qkv(t, ((25, (2, 3, 5, 8)), (26, (2, 1, 6, 8)), (27, (2, 1, 6, 4))))
    inputs = {**ops, "mask": None, "is_causal": False}
    what = "k and v of shape (2, 1, 6, d) broadcast over q's 3 heads"
    _refusable_case(run, inputs, what, "leading dimensions that broadcast", source)


def _refusable_case(
    run: Run, inputs: dict[str, Any], what: str, refused: str, source: dict[str, str]
) -> bool:
    """Check the attention call `inputs`, a case a kernel may refuse; whether it was taken.

    A kernel that raises on it is noted (`refused`, then "refused with" and the error), not
    failed; one that returns a result is checked against the reference.
    """
    t = run.target
    try:
        with np.errstate(all="ignore"):
            out = t.call_attention(
                inputs["q"], inputs["k"], inputs["v"], inputs["mask"], inputs["is_causal"]
            )
    except Failed as exc:
        raise Failed(f"{what}: {exc}") from exc
    except Exception as exc:
        run.notes.append(f"{refused} refused with {type(exc).__name__}")
        return False
    _attention_check(run, out, inputs, what, source=source)
    return True


def _attention_grad_modes(run: Run, base: dict[str, Any]) -> None:
    """The operands `base` in each of :data:`GRAD_MODES`, and variants the kernel takes.

    Masked, causal with fewer queries than keys, and with ``scale=2.0``. As
    :func:`_grad_modes` for the row kinds: each path must give the reference's values
    and leave its operands alone; refusing q, k and v that require grad is noted,
    raising under ``no_grad`` or ``inference_mode`` fails, and an output that does not
    require grad for operands that do is noted.
    """
    t = run.target
    cases = [("", base)]
    if t.mask_keyword is not None:
        padding = np.tile(np.arange(base["k"].shape[-2]) < 5, (base["q"].shape[-2], 1))
        cases.append((", key padding", {**base, "mask": padding}))
    # an inference path (a KV cache's) must align a causal mask to the top left when
    # L < S, and take scale=
    if t.takes_causal:
        q, keys = base["q"][..., :2, :], base["k"].shape[-2]
        cases.append((f", causal, 2 queries over {keys} keys", {**base, "q": q, "is_causal": True}))
    if t.takes_scale:
        cases.append((", scale=2.0", {**base, "scale": 2.0}))
    for mode in GRAD_MODES:
        for i, (label, inputs) in enumerate(cases):
            try:
                out = _attention_compare(run, inputs, f"{mode}{label}", grad_mode=mode)
            except _Raised as exc:
                if not GRAD_MODES[mode][0] or i > 0:  # (see _grad_modes)
                    raise
                run.notes.append(f"{mode} refused with {type(exc.__cause__).__name__}")
                break
            _note_detached(run, mode, out, "q, k and v")


def _p_attention_batch(t: Target, run: Run) -> None:
    """Each batch entry and query row is independent of the others; long key sequences.

    256 keys, and 256 + 5: a kernel that loops over key blocks and handles its last,
    partial block wrongly is right on whole blocks. 1031 queries (an odd number: a
    partial last tile of queries). Batches of 67 and 69 (batch, head) slices: every
    slice is checked, the last ones included, and one of the 67 holds a far key
    (:data:`PLANTED_KEY`). A kernel that takes
    ``enable_gqa=`` also gets 6 query heads over 2 key and value heads (SDPA's
    pairing: query head h reads key head h // 3), causal too when it takes
    ``is_causal=``.
    """
    (q, q_src), (k, k_src), (v, v_src) = (
        _rng_array(seed, shape, scale, t.dtype)
        for seed, shape, scale in (
            (5, (3, 4, 8), 2.0),
            (6, (3, 261, 8), 1.0),
            (7, (3, 261, 4), 1.0),
        )
    )
    base = {"mask": None, "is_causal": False}
    for keys in (256, 261):
        kv = {"q": q, "k": k[:, :keys], "v": v[:, :keys], **base}
        cut = f"[:, :{keys}]"
        source = {"q": q_src, "k": f"({k_src}){cut}", "v": f"({v_src}){cut}"}
        _attention_compare(run, kv, f"batched (3 heads, {keys} keys)", source=source)
    _attention_other_mode(run, kv, f"batched (3 heads, {keys} keys)", source)
    # the long unmasked input with a scale and the other schedules, where the kernel takes
    # them: a path for long key sequences (a flash kernel, say) must be passed them too
    if t.takes_scale:
        _attention_compare(run, {**kv, "scale": 2.0}, f"batched (3 heads, {keys} keys), "
                           "scale=2.0", source=source)  # fmt: skip
    _attention_schedules(run, kv, f"batched (3 heads, {keys} keys)", source)
    # head dims past the block a kernel may fix (64, 128): q and k of 192, v of 160
    ops, wide = _qkv(t, ((57, (2, 5, 192)), (58, (2, 70, 192)), (59, (2, 70, 160))))
    _attention_compare(run, {**ops, **base}, "head dim 192, value dim 160", source=wide)
    for i in range(2):
        one = {"q": q[i : i + 1, :1], "k": k[i : i + 1], "v": v[i : i + 1], **base}
        cut = f"[{i}:{i + 1}]"
        source = {"q": f"({q_src}){cut}[:, :1]", "k": f"({k_src}){cut}", "v": f"({v_src}){cut}"}
        _attention_compare(run, one, f"head {i}, query 0 alone", source=source)
    _far_unmasked_key(t, run)
    # 1031 queries over 5 keys: a kernel that tiles the queries and rounds the number of
    # tiles down leaves the last queries unwritten, for every tile of a power-of-two size
    # up to 1024 (the other cases have at most 130 queries)
    ops, source = _qkv(t, ((37, (1, 1031, 4)), (38, (1, 5, 4)), (39, (1, 5, 3))), 1.5)
    _attention_compare(run, {**ops, **base}, "1031 queries over 5 keys", source=source)
    # 65537 (batch, head) slices, five distinct ones in turn: a GPU kernel with the slices
    # on the second or third axis of its launch grid (CUDA's end at 65535) never writes
    # the last ones
    ops = {name: strat.cast(eval(src, {"np": np}), t.dtype) for name, src in GRID_SLICES.items()}
    source = {name: _src_cast(src, t.dtype) for name, src in GRID_SLICES.items()}
    what = "65537 (batch, head) slices (5 repeated): past CUDA's grid limit of 65535"
    _attention_compare(run, {**ops, **base}, what, source=source)
    # many (batch, head) slices, an odd number of them: a kernel that gives each program a
    # group of slices and rounds the number of groups down leaves the last ones unwritten
    for seed, lead in ((8, (67,)), (11, (3, 23))):
        source = {
            name: f"np.random.default_rng({seed + i}).normal(0.0, 1.5, {(*lead, rows, d)})"
            for i, (name, rows, d) in enumerate((("q", 3, 8), ("k", 21, 8), ("v", 21, 4)))
        }
        count = int(np.prod(lead))
        what = f"{count} slices, batch shape {lead}"
        if lead == (67,):  # slice 40 holds a far key (see PLANTED_KEY)
            source = {n: PLANTED_KEY.get(n, "{}").format(src) for n, src in source.items()}
            what += ", slice 40 with a key whose logit is about 1000 above the others"
        ops = {n: strat.cast(eval(src, {"np": np}), t.dtype) for n, src in source.items()}
        source = {n: _src_cast(src, t.dtype) for n, src in source.items()}
        _attention_compare(run, {**ops, **base}, what, source=source)
        if lead == (67,):
            _many_slices_masked(run, ops, source, what)
    if t.takes_gqa:
        # grouped-query attention: 6 query heads over 2 key and value heads, query head h
        # reading key head h // 3 (a kernel pairing h with h % 2 is right when they are equal)
        (q, q_src), (k, k_src), (v, v_src) = (
            _rng_array(seed, shape, 1.5, t.dtype)
            for seed, shape in ((31, (2, 6, 5, 8)), (32, (2, 2, 7, 8)), (33, (2, 2, 7, 3)))
        )
        grouped = {"q": q, "k": k, "v": v, **base, "enable_gqa": True}
        source = {"q": q_src, "k": k_src, "v": v_src}
        _attention_compare(run, grouped, "enable_gqa=True, 6 query heads over 2", source=source)
        causal = {**grouped, "is_causal": True}
        if t.takes_causal:
            _attention_compare(run, causal, "enable_gqa=True and is_causal=True", source=source)
        # 200 keys: a path for long key sequences pairs the heads too
        ops, long_source = _qkv(t, ((60, (2, 6, 5, 8)), (61, (2, 2, 200, 8)), (62, (2, 2, 200, 3))))
        _attention_compare(run, {**ops, **base, "enable_gqa": True},
                           "enable_gqa=True, 6 query heads over 2, 200 keys",
                           source=long_source)  # fmt: skip
        # the grouped path with a key-padding mask and a scale, where the kernel takes them
        extra, parts = {}, []
        if t.mask_keyword is not None:
            mask_src = "np.arange(7)[None, None, None, :] < np.array([7, 3])[:, None, None, None]"
            extra["mask"] = eval(mask_src, {"np": np})
            source = {**source, "mask": mask_src}
            parts.append("a key-padding mask (2, 1, 1, 7)")
        if t.takes_scale:
            extra["scale"] = 2.0
            parts.append("scale=2.0")
        if parts:
            what = f"enable_gqa=True with {' and '.join(parts)}"
            _attention_compare(run, {**grouped, **extra}, what, source=source)
        if t.mask_keyword is not None:
            # a mask of its own for each query head: a kernel that reads it at the key
            # head's index (h // 3) is right on the key-padding mask above, shared by all
            head_src = (
                "(np.random.default_rng(34).random((2, 6, 5, 7)) < 0.5) | (np.arange(7) == 0)"
            )
            per_head = {**grouped, "mask": eval(head_src, {"np": np})}
            _attention_compare(run, per_head, "enable_gqa=True with a mask per query head",
                               source={**source, "mask": head_src})  # fmt: skip


#: The key-padding mask of the 67 slices (numpy source): slice b keeps its first
#: 1 + b % 21 keys, so that each slice has a mask of its own.
MANY_SLICES_PADDING = "np.arange(21)[None, None, :] < (1 + np.arange(67) % 21)[:, None, None]"


def _many_slices_masked(
    run: Run, ops: dict[str, np.ndarray], source: dict[str, str], what: str
) -> None:
    """The 67 slices of ``attention_batch`` causal, and with a key-padding mask per slice.

    Where the kernel takes them: a path for many slices that drops ``is_causal=``, or
    reads the first slice's mask for every slice (no batch stride), is right on the
    other properties' masks, which come with a few slices.
    """
    t = run.target
    if t.takes_causal:
        _attention_compare(run, {**ops, "mask": None, "is_causal": True}, f"{what}, causal",
                           source=source)  # fmt: skip
    if t.mask_keyword is not None:
        mask = eval(MANY_SLICES_PADDING, {"np": np})
        _attention_compare(
            run, {**ops, "mask": mask, "is_causal": False},
            f"{what}, a key-padding mask per slice, shape (67, 1, 21)",
            source={**source, "mask": MANY_SLICES_PADDING},
        )  # fmt: skip


#: What the 67 (batch, head) slices of ``attention_batch`` hold besides normal numbers
#: (numpy source around ``{}``, the normal operand): query 0 of slice 40 is 100 along the
#: first axis and key 5 is 30 there, a logit of about 1060 (as :data:`FAR_KEY_SOURCES`).
#: A kernel that takes another path for many slices and leaves the maximum out is right
#: on normal slices; the other properties send far keys in one or two slices.
PLANTED_KEY = {
    "q": "np.where((lambda s, r: (s == 40) & (r == 0))(*np.ogrid[:67, :3])[..., None], "
    "100.0 * (np.arange(8) == 0), {})",
    "k": "np.where((lambda s, r: (s == 40) & (r == 5))(*np.ogrid[:67, :21])[..., None], "
    "30.0 * (np.arange(8) == 0), {})",
}

#: Operands of 65537 (batch, head) slices, five distinct ones in turn (numpy source).
GRID_SLICES = {
    name: f"np.random.default_rng({seed}).normal(0.0, 1.5, (5, {rows}, {d}))[np.arange(65537) % 5]"
    for name, seed, rows, d in (("q", 45, 1, 4), ("k", 46, 3, 4), ("v", 47, 3, 2))
}


#: The operands of :func:`_far_unmasked_key` (numpy source, float64): query 0 is 100 along
#: the first axis, and key 200 of 261 is 30 there, so that its logit, about 1060 at the
#: default scale, stands far above the others (a few tens).
FAR_KEY_SOURCES = {
    "q": "np.vstack([100.0 * np.eye(1, 8), np.random.default_rng(41).normal(0.0, 1.0, (1, 8))])"
    "[None]",
    "k": "np.where((np.arange(261) == 200)[:, None], 30.0 * np.eye(1, 8), "
    "np.random.default_rng(42).normal(0.0, 1.0, (261, 8)))[None]",
    "v": "np.random.default_rng(43).normal(0.0, 1.0, (1, 261, 4))",
}


def _far_unmasked_key(t: Target, run: Run) -> None:
    """An unmasked key whose logit (about 1060) is far above the others, past the first blocks.

    A kernel that exponentiates the logits without subtracting the row's maximum, or
    that keeps the maximum of its first key block for the blocks after it (a fixed
    maximum without its overflow fallback), overflows there and returns NaN; the
    suite's other unmasked logits are at most a few tens, far below float64's overflow
    of ``exp`` at 709, so a float64 kernel with either defect passed them.
    """
    ops = {n: strat.cast(eval(src, {"np": np}), t.dtype) for n, src in FAR_KEY_SOURCES.items()}
    source = {n: _src_cast(src, t.dtype) for n, src in FAR_KEY_SOURCES.items()}
    what = "key 200 of 261 with a logit about 1000 above the others (not masked)"
    for call in ("", ", called again"):  # the second call as in long_rows' spiked rows
        _attention_compare(
            run, {**ops, "mask": None, "is_causal": False}, what + call, source=source
        )


#: Calls of :func:`_p_fresh_results`: a kernel that cycles through a pool of fewer
#: output buffers than this overwrites a result the caller kept.
FRESH_CALLS = 6


#: The operand shapes of :func:`_p_fresh_results`, small then large: a caching allocator
#: that keeps a workspace only for large results (4096 items or more, 64 keys or more)
#: hands out fresh memory for small ones; then one row, or one query (a decoding step,
#: whose path may return a static buffer, as a replayed CUDA graph does).
FRESH_SHAPES = {
    "rows": ({"x": (2, 5)}, {"x": (2, 4099)}, {"x": (1, 6)}),
    "attention": (
        {"q": (2, 3, 4), "k": (2, 5, 4), "v": (2, 5, 4)},
        {"q": (2, 3, 4), "k": (2, 261, 4), "v": (2, 261, 4)},
        {"q": (2, 1, 4), "k": (2, 6, 4), "v": (2, 6, 4)},
    ),
}


def _fresh_sources(t: Target, size: int = 0) -> list[list[tuple[str, str]]]:
    """The operands of :func:`_p_fresh_results`' calls: (name, numpy source text) each.

    `size` 0 is the small shapes of :data:`FRESH_SHAPES`, 1 the large ones, 2 one row
    or one query (a decoding step).
    """
    shapes = FRESH_SHAPES["attention" if t.kind == "attention" else "rows"][size]
    seed = 31 + 3 * FRESH_CALLS * size
    return [
        [
            (name, f"np.random.default_rng({seed + 3 * call + i}).normal(0.0, 3.0, {shape})")
            for i, (name, shape) in enumerate(shapes.items())
        ]
        for call in range(FRESH_CALLS)
    ]


def _fresh_lines(t: Target) -> tuple[list[str], Callable[[str], str]]:
    """The first lines of a :func:`_p_fresh_results` repro, and how it makes an operand."""
    head = t._repro_head() or "kernel = ...  # your kernel"
    if t.framework == "numpy":
        return ["import numpy as np", head], lambda src: _src_cast(src, t.dtype)
    make = lambda src: f"torch.from_numpy({src}).to(torch.{t.dtype}).to({t.device!r})"  # noqa: E731
    return ["import numpy as np", "import torch", head], make


def _in_mode(mode: str | None, calls: list[str]) -> list[str]:
    """The repro lines `calls`, run in :data:`GRAD_MODES` `mode` (a context) or plainly."""
    context = None if mode is None else GRAD_MODES[mode][1]
    if context is None:
        return calls
    return [f"with torch.{context}():", *(f"    {line}" for line in calls)]


def _fresh_repro(
    t: Target, calls: list[list[tuple[str, str]]], first: int, last: int, mode: str | None
) -> str:
    """A snippet: keep call `first`'s result, make the calls up to `last`, print if it changed.

    The calls are made in `mode` (see :func:`_in_mode`).
    """
    lines, make = _fresh_lines(t)
    if t.framework == "numpy":
        copy, equal = "kept = first.copy()", "np.array_equal(first, kept, equal_nan=True)"
    else:
        copy, equal = "kept = first.clone()", "torch.equal(first.view(-1), kept.view(-1))"
    names = [name for name, _ in calls[0]]
    for i in range(first, last + 1):
        lines += [f"{name}{i + 1} = {make(src)}" for name, src in calls[i]]
    made = [f"first = kernel({', '.join(f'{n}{first + 1}' for n in names)})", copy]
    made += [
        f"kernel({', '.join(f'{n}{i + 1}' for n in names)})" for i in range(first + 1, last + 1)
    ]
    lines += _in_mode(mode, made)
    lines += ["# the later calls changed the first result:", f"print({equal})  # False"]
    return "\n".join(lines)


#: One call of :func:`_p_fresh_results`: its operands (names and numpy sources) and the
#: :data:`GRAD_MODES` label it was made in (None: plainly).
FreshCall = tuple[list[tuple[str, str]], "str | None"]


def _fresh_raise_repro(t: Target, made: list[FreshCall]) -> str:
    """A snippet that makes the calls `made` of :func:`_p_fresh_results` in turn.

    `made` is every call of the property up to the one that raised, so that a kernel
    whose failure depends on the calls before it (a pool of buffers that runs out, a
    cache that fills) fails in the snippet too.
    """
    lines, make = _fresh_lines(t)
    for i, (operands, _) in enumerate(made):
        lines += [f"{name}{i + 1} = {make(src)}" for name, src in operands]
    for i, (operands, mode) in enumerate(made):
        args = ", ".join(f"{name}{i + 1}" for name, _ in operands)
        call = f"kernel({args})" + ("  # raises" if i == len(made) - 1 else "")
        lines += _in_mode(mode, [call])
    return "\n".join(lines)


def _p_fresh_results(t: Target, run: Run) -> None:
    """A result the caller keeps does not change when the kernel is called again.

    :data:`FRESH_CALLS` calls on inputs of one shape and dtype, small, large, then one
    row or query (:data:`FRESH_SHAPES`); every result must keep its bits through the
    later calls. A kernel that returns a buffer it reuses (a workspace cached between
    calls, or a pool of a few) passes every value check, yet a caller that keeps results
    holds a later one twice. (Every property also checks every call for writes to the
    kernel's inputs.) A torch kernel makes the one-row or one-query calls again under
    ``torch.inference_mode()``, where a decoding path may hand out a static buffer.
    Last, the same operand objects twice, updated in place between the calls
    (:func:`_updated_in_place`).
    """
    made: list[FreshCall] = []
    sizes = len(FRESH_SHAPES["rows"])
    modes: list[str | None] = [None] * sizes
    if t.framework == "torch":
        modes.append("under torch.inference_mode()")
    for size, mode in enumerate(modes):
        _fresh_calls(t, run, _fresh_sources(t, min(size, sizes - 1)), made, mode, len(modes))
    _updated_in_place(t, run)


def _fresh_calls(
    t: Target,
    run: Run,
    calls: list[list[tuple[str, str]]],
    made: list[FreshCall],
    mode: str | None = None,
    groups: int = 3,
) -> None:
    """:func:`_p_fresh_results` on the operands `calls` (:func:`_fresh_sources`).

    `made` lists the calls the property made before, for the repro of a kernel that
    raises; each call is appended to it. The calls are made in `mode`, a label of
    :data:`GRAD_MODES` (None: plainly); `groups` is how many groups of calls the
    property makes, for the failure's count.
    """
    arrays = [
        {name: strat.cast(eval(src, {"np": np}), t.dtype) for name, src in operands}
        for operands in calls
    ]

    def call(inputs: dict[str, np.ndarray]) -> Any:
        if t.kind == "attention":
            return t.call_attention(
                inputs["q"], inputs["k"], inputs["v"], None, False, grad_mode=mode
            )
        return t.call(inputs["x"], grad_mode=mode)

    outs: list[Any] = []
    kept: list[Any] = []
    for i, inputs in enumerate(arrays):
        made.append((calls[i], mode))
        try:
            outs.append(call(inputs))
        except Failed:
            raise
        except Exception as exc:
            raise Failed(
                f"the kernel raised {type(exc).__name__}: {exc}\non the property's call "
                f"{len(made)} of {groups * FRESH_CALLS} ({FRESH_CALLS} small, {FRESH_CALLS} "
                f"large, then {FRESH_CALLS} of one row or query"
                + (", then those under torch.inference_mode()" if groups > 3 else "")
                + f"; new values)\nrepro:\n{_fresh_raise_repro(t, made)}"
            ) from exc
        kept.append(snapshot(outs[-1]))
        for j in range(i):
            change = changed(kept[j], snapshot(outs[j]))
            if change is not None:
                raise Failed(
                    f"the result of call {j + 1} changed when the kernel was called again "
                    f"(by call {i + 1}): {change}. The kernel returns memory that a later call "
                    "overwrites (a reused buffer, or a pool of a few); a caller that keeps "
                    "results holds a later one twice"
                    + ("" if mode is None else f" ({mode})")
                    + f".\nrepro:\n{_fresh_repro(t, calls, j, i, mode)}"
                )
    what = "fresh results" + ("" if mode is None else f", {mode}")
    for out, inputs in zip(outs, arrays, strict=True):
        if t.kind == "attention":
            _attention_check(run, out, {**inputs, "mask": None, "is_causal": False}, what,
                             grad_mode=mode)  # fmt: skip
        else:
            run.compare(out, inputs["x"], what=what, grad_mode=mode)


#: The operands of :func:`_updated_in_place` (numpy sources): the first call's, then the
#: values written into the same objects before the second call. The second logits mask
#: other items, the second mask other keys.
IN_PLACE = {
    "rows": (
        {"x": "np.random.default_rng(90).normal(0.0, 3.0, (2, 7))"},
        {"x": "np.where(np.arange(7) % 3 == 0, -np.inf, "
              "np.random.default_rng(91).normal(0.0, 3.0, (2, 7)))"},
    ),
    "attention": (
        {"q": "np.random.default_rng(92).normal(0.0, 2.0, (2, 3, 4))",
         "k": "np.random.default_rng(93).normal(0.0, 2.0, (2, 5, 4))",
         "v": "np.random.default_rng(94).normal(0.0, 1.0, (2, 5, 4))",
         "mask": "np.tile(np.arange(5) < 4, (3, 1))"},
        {"q": "np.random.default_rng(95).normal(0.0, 2.0, (2, 3, 4))",
         "k": "np.random.default_rng(96).normal(0.0, 2.0, (2, 5, 4))",
         "v": "np.random.default_rng(97).normal(0.0, 1.0, (2, 5, 4))",
         "mask": "np.tile(np.arange(5) % 2 == 0, (3, 1))"},
    ),
}  # fmt: skip


def _in_place_sources(t: Target) -> tuple[dict[str, str], dict[str, str]]:
    """:data:`IN_PLACE`'s two sets of operands for `t` (without a mask if it takes none)."""
    first, second = IN_PLACE["attention" if t.kind == "attention" else "rows"]
    if t.kind == "attention" and t.mask_keyword is None:
        first, second = ({n: s for n, s in ops.items() if n != "mask"} for ops in (first, second))
    return first, second


def _updated_in_place(t: Target, run: Run) -> None:
    """The same operand objects twice, their values updated in place between the calls.

    A kernel that keeps what it derived from an operand (a converted mask, a transposed
    key matrix) by the object's identity (``id``, ``data_ptr``) gives the second call
    the first call's values: a caller that updates a buffer in place (a decoding loop's
    preallocated mask, a CUDA graph's static inputs) gets stale results. Fresh copies,
    which every other call hands the kernel, never show it.
    """
    sources = _in_place_sources(t)
    arrays = [
        {n: (a if (a := eval(src, {"np": np})).dtype == bool else strat.cast(a, t.dtype))
         for n, src in ops.items()}
        for ops in sources
    ]  # fmt: skip
    kept: dict[str, Any] = {}

    def same(name: str) -> Callable[[Any], Any]:
        def view(arg: Any) -> Any:
            if name not in kept:
                kept[name] = arg
            elif t.framework == "torch":
                kept[name].copy_(arg)
            else:
                np.copyto(kept[name], arg)
            return kept[name]

        return view

    what = "operands updated in place between two calls"
    for inputs in arrays:
        try:
            if t.kind == "attention":
                out = t.call_attention(inputs["q"], inputs["k"], inputs["v"], inputs.get("mask"),
                                       False, views={n: same(n) for n in inputs})  # fmt: skip
            else:
                out = t.call(inputs["x"], view=same("x"))
        except Failed:
            raise
        except Exception as exc:
            raise Failed(
                f"{what}: the kernel raised {type(exc).__name__}: {exc}\nrepro:\n"
                + _in_place_repro(t, sources, "  # raises")
            ) from exc
    try:
        if t.kind == "attention":
            _attention_check(run, out, {"mask": None, **arrays[1], "is_causal": False}, what)
        else:
            run.compare(out, arrays[1]["x"], what=what)
    except (Failed, tst.KernelMismatch) as exc:
        head = str(exc).partition("\nrepro:\n")[0]
        if isinstance(exc, tst.KernelMismatch):  # `what` is a note of it
            head = f"{what}\n{head}"
        raise Failed(
            f"{head}\nThe kernel gave the second call a result of the first call's values: "
            "it keeps something it derived from an operand by the object's identity, and a "
            "caller that updates its buffers in place (a decoding loop's mask, a CUDA "
            f"graph's static inputs) gets stale results.\nrepro:\n{_in_place_repro(t, sources)}"
        ) from exc


def _in_place_repro(t: Target, sources: tuple[dict[str, str], ...], note: str = "") -> str:
    """A snippet: call the kernel, update its operands in place, compare with fresh copies."""
    lines, make = _fresh_lines(t)
    first, second = sources
    names = list(first)
    bool_make = (lambda src: src) if t.framework == "numpy" else (
        lambda src: f"torch.from_numpy({src}).to({t.device!r})")  # fmt: skip
    build = {n: bool_make if n == "mask" else make for n in names}
    lines += [f"{n} = {build[n](first[n])}" for n in names]
    passed = [n for n in names if n != "mask"]
    args = ", ".join(passed + ([f"{t.mask_keyword}=mask"] if "mask" in names else []))
    lines.append(f"kernel({args})  # the first call")
    update = "{n}[...] = {v}" if t.framework == "numpy" else "{n}.copy_({v})"
    lines += [update.format(n=n, v=build[n](second[n])) for n in names]
    if note:
        lines.append(f"kernel({args}){note}")
        return "\n".join(lines)
    copy = ".copy()" if t.framework == "numpy" else ".clone()"
    fresh = ", ".join(f"{a}{copy}" for a in args.split(", "))
    equal = "np.array_equal({}, {}, equal_nan=True)" if t.framework == "numpy" else (
        "torch.equal({}, {})")  # fmt: skip
    lines += [
        f"same, fresh = kernel({args}), kernel({fresh})",
        "# the same objects, updated, against fresh copies of them:",
        f"print({equal.format('same', 'fresh')})  # False",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------


#: Every property in report order, mapping its name to its check and the kinds it applies to.
PROPERTIES: dict[str, tuple[Callable[[Target, Run], None], tuple[Kind, ...]]] = {
    "values": (_p_values, ROWWISE_KINDS),
    "long_rows": (_p_long_rows, ROWWISE_KINDS),
    "million_row": (_p_million_row, ROWWISE_KINDS),
    "branch_points": (_p_branch_points, ("entropy", "adaptive_softmax")),
    "batch_independence": (_p_batch_independence, ROWWISE_KINDS),
    "many_rows": (_p_many_rows, ROWWISE_KINDS),
    "dtype_shape": (_p_dtype_shape, ROWWISE_KINDS),
    "special_values": (_p_special_values, ROWWISE_KINDS),
    "invariances": (_p_invariances, ROWWISE_KINDS),
    "temperature_cap": (_p_temperature_cap, ("adaptive_softmax",)),
    "schedules": (_p_schedules, ("adaptive_softmax",)),
    "attention_values": (_p_attention_values, ("attention",)),
    "attention_batch": (_p_attention_batch, ("attention",)),
    "attention_masks": (_p_attention_masks, ("attention",)),
    "attention_causal": (_p_attention_causal, ("attention",)),
    "attention_layouts": (_p_attention_layouts, ("attention",)),
    "attention_special_values": (_p_attention_special_values, ("attention",)),
    "fresh_results": (_p_fresh_results, (*ROWWISE_KINDS, "attention")),
}


def properties_for(kind: str) -> list[str]:
    """The properties that apply to a kind, in report order."""
    return [name for name, (_, kinds) in PROPERTIES.items() if kind in kinds]


def name_width(kind: str) -> int:
    """The width of the report's name column for `kind`: 20, or its longest property name."""
    return max(20, *(len(name) for name in properties_for(kind)))
