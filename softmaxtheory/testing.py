r"""Assertions that check a kernel's output against the certified reference.

Four plain functions, usable with or without pytest (no Hypothesis needed):
:func:`assert_softmax_close`, :func:`assert_entropy_close`,
:func:`assert_adaptive_softmax_close` and :func:`assert_attention_close`.
Each takes the kernel's output and its input (numpy arrays or torch tensors,
float64/32/16 or bfloat16), computes the exact result with
:mod:`softmaxtheory.reference`, measures the error of every element in units
in the last place (ulps) of the kernel's dtype and accepts it when it lies
within the error model (see the documentation page *The error model*):

* ``mode="auto"`` (default): an element passes when its error is within the
  a-priori bound derived for that element **or** within ``baseline_factor``
  times the error of the naive same-precision algorithm plus ``floor_ulps``;
* ``mode="bound"`` or ``mode="baseline"``: only one of the two rules;
* ``mode="ulps"``: a fixed number of ulps, ``max_ulps``.

Two contracts for float16 and bfloat16 kernels (``strict``): by default a
kernel may round the logits of its final softmax (:math:`\beta x`, or
:math:`\beta(x - m)`) once to its dtype, as the paper's listing run natively
in 16 bits does (backward stable at its own precision); ``strict=True``
demands float32-grade statistics and output (the output rounded once). The
β and the entropy must be float32-grade in both. For float32 and float64
kernels the two contracts coincide. A failure message says whether the
element passes under the other contract.

The reference is the float64 correctly rounded value (certified by Ziv's
strategy: a double-double pass with proven error bounds, mpmath where that
pass cannot decide; see the documentation page on the reference):
for float32, float16 and bfloat16 kernels its error is far below their ulp,
for float64 kernels it is at most half an ulp.

On success each function returns an :class:`ErrorReport` with what it
measured; on failure it raises :class:`KernelMismatch` (an
:class:`AssertionError`) whose message names the worst element (index, value
got, exact value, error in ulps, allowed ulps, the row's :math:`H` and
:math:`\beta`) and a snippet that reproduces it; the report is attached as
``exc.report``.

Examples
--------
>>> import numpy as np
>>> from softmaxtheory.testing import assert_softmax_close
>>> x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, -np.inf]], dtype=np.float32)
>>> e = np.exp(x - x.max(axis=-1, keepdims=True))
>>> report = assert_softmax_close(e / e.sum(axis=-1, keepdims=True), x)
>>> report.dtype, report.max_ulp <= 1.0
('float32', True)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._check import error_model as model
from ._check.report import array_literal, fmt_ulp, is_torch, row_literal
from ._formats import DTYPES, Format, Kind, format_named
from .spec import (
    Constant,
    Polynomial,
    Schedule,
    check_entropy_eps,
    check_mask_dtype,
    exact_float64,
    expand_kv_heads,
    refuse_dtype,
    refuse_masked,
    resolve_schedule,
)

__all__ = [
    "MODES",
    "ErrorReport",
    "KernelMismatch",
    "assert_adaptive_softmax_close",
    "assert_attention_close",
    "assert_entropy_close",
    "assert_softmax_close",
    "to_numpy",
]

#: The tolerance modes.
MODES: tuple[str, ...] = ("auto", "bound", "baseline", "ulps")

#: Rows up to this length are written out in full in a repro snippet.
REPRO_ITEMS = 64

#: The dtypes numpy holds natively (bfloat16 travels as float32).
_NUMPY_FLOATS = tuple(d for d in DTYPES if d != "bfloat16")


@dataclass(frozen=True)
class ErrorReport:
    """What an assertion measured.

    Attributes
    ----------
    kind : str
        ``softmax``, ``entropy``, ``adaptive_softmax`` or ``attention``.
    dtype : str
        The kernel's format; ulps are ulps of this format.
    max_ulp : float
        Largest error over all elements, in ulps (``inf`` for a NaN where a
        number was due or vice versa).
    max_rel_error : float
        Largest relative error over the elements with a nonzero exact value.
    worst_ratio : float
        Largest error divided by the error allowed for that element (a pass
        has ``worst_ratio <= 1``).
    worst_index : tuple of int
        Index of the element with the largest `worst_ratio`.
    size : int
        Number of elements checked (:math:`N`).
    passed : bool
        Whether every element was accepted.
    message : str
        The description of the worst element (with a repro snippet).
    contract : str
        ``"default"`` or ``"strict"`` (see the module documentation).
    other_contract_passed : bool or None
        Whether every element would pass under the other contract (``None``
        for float32 and float64 kernels, where the contracts coincide).
    n_failed : int
        Number of elements outside the error model (:math:`k`; 0 on a pass).
        The failure message reports it as ``failing elements: k / N``.
    """

    kind: str
    dtype: str
    max_ulp: float
    max_rel_error: float
    worst_ratio: float
    worst_index: tuple[int, ...]
    size: int
    passed: bool
    message: str = field(default="", repr=False)
    contract: str = "default"
    other_contract_passed: bool | None = None
    n_failed: int = 0

    def __str__(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        return (
            f"{self.kind} [{self.dtype}] {verdict}: max {fmt_ulp(self.max_ulp)} ulp, "
            f"max relative error {self.max_rel_error:.3g}, worst error/allowed "
            f"{self.worst_ratio:.3g} over {self.size} elements"
        )


class KernelMismatch(AssertionError):
    """A kernel's output is outside the error model; ``report`` holds the measurements."""

    def __init__(self, message: str, report: ErrorReport) -> None:
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------------------
# input conversion
# ---------------------------------------------------------------------------


def to_numpy(a: Any, name: str) -> tuple[np.ndarray, str]:
    """Convert a numpy array, torch tensor or sequence to numpy, exactly.

    Returns
    -------
    array, dtype_name : numpy.ndarray, str
        bfloat16 tensors become float32 arrays (exact) with the name
        ``"bfloat16"``; integer input becomes float64.

    Raises
    ------
    TypeError
        For a dtype that is not real floating or integer, or a masked array
        with masked entries (whose mask ``numpy.asarray`` would drop).
    """
    roles = {"logits": "logits", "mask": "mask", "actual": "result", "output": "result"}
    refuse_masked(a, name, roles.get(name, "operand"))
    if is_torch(a):
        t = a.detach().cpu()
        dname = str(t.dtype).removeprefix("torch.")
        if dname == "bfloat16":
            return t.float().numpy(), "bfloat16"
        if dname in _NUMPY_FLOATS:
            return t.numpy(), dname
        if t.is_floating_point() or t.is_complex() or dname == "bool":
            raise refuse_dtype(name, t.dtype, "tensor")
        return exact_float64(t.numpy(), name), "float64"
    arr = np.asarray(a)
    if arr.dtype.kind in "iu":
        return exact_float64(arr, name), "float64"
    if arr.dtype.name not in _NUMPY_FLOATS:
        raise refuse_dtype(name, arr.dtype)
    return arr, arr.dtype.name


@dataclass(frozen=True)
class _Tolerance:
    r"""The acceptance rule of an assertion: its public keywords, validated once.

    Built from the keywords of the ``assert_*_close`` functions (same names,
    same defaults); an invalid combination raises on construction, so a
    tolerance that exists is a valid one.

    Attributes
    ----------
    mode : str
        One of :data:`MODES`.
    max_ulps : float or None
        The tolerance of ``mode="ulps"`` (required there, ignored otherwise).
    baseline_factor, floor_ulps : float
        The baseline rule :math:`\mathrm{err} \le k\,\mathrm{err}_{\text{naive}} + \text{floor}`.
    strict : bool
        The contract of 16-bit kernels (see the module documentation).

    Raises
    ------
    ValueError
        If `mode` is not one of :data:`MODES`, ``mode="ulps"`` lacks a finite
        ``max_ulps >= 0``, or `baseline_factor` or `floor_ulps` is negative or not
        finite.
    TypeError
        If `strict` is not a bool.
    """

    mode: str = "auto"
    max_ulps: float | None = None
    baseline_factor: float = 4.0
    floor_ulps: float = 2.0
    strict: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("max_ulps", "baseline_factor", "floor_ulps"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real)
            ):
                raise TypeError(f"{name} must be a real number, got {value!r}")
        if self.max_ulps is not None and self.mode != "ulps":
            # numpy.testing's maxulp is the tolerance: ignoring it passed 10 ulps at max_ulps=2
            raise ValueError(
                f"max_ulps applies to mode='ulps' only, and mode is {self.mode!r}: pass "
                "mode='ulps' with it (or leave it out for the error model's rule)"
            )
        if self.mode == "ulps" and (self.max_ulps is None or not 0 <= self.max_ulps < math.inf):
            raise ValueError(f"mode='ulps' needs a finite max_ulps >= 0, got {self.max_ulps!r}")
        # (an infinite factor or floor accepted any error: a check that cannot fail)
        for name in ("baseline_factor", "floor_ulps"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not isinstance(self.strict, bool | np.bool_):
            raise TypeError(f"strict must be a bool, got {self.strict!r}")
        object.__setattr__(self, "strict", bool(self.strict))

    @property
    def contract(self) -> str:
        """``"strict"`` or ``"default"``."""
        return "strict" if self.strict else "default"

    def allowed(self, bound: np.ndarray, naive: np.ndarray, spacing: np.ndarray) -> np.ndarray:
        """The absolute error allowed for each element.

        `bound` is the a-priori bound (the final rounding included), `naive` the
        naive algorithm's absolute error and `spacing` the format's ulp at the
        exact value. Where the naive algorithm gives no number (an overflow: its
        error is infinite or NaN) the baseline rule grants its floor only: it
        means "as accurate as the naive algorithm", which there is not at all.
        """
        if self.mode == "bound":
            return bound
        if self.mode == "ulps":
            return float(self.max_ulps or 0.0) * spacing
        naive = np.asarray(naive, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            scaled = np.where(np.isfinite(naive), self.baseline_factor * naive, 0.0)
        base = self.floor_ulps * spacing + scaled
        if self.mode == "baseline":
            return base
        return np.maximum(bound, base)


# ---------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------


@dataclass
class _Checked:
    err: np.ndarray  # ulps (for the report: inf where a zero's spacing cannot express it)
    allowed: np.ndarray  # ulps (likewise)
    ref: np.ndarray
    got: np.ndarray
    ratio: np.ndarray  # error / allowed, formed from the absolute values


def _flush_allowance(fmt: Format) -> float:
    """The absolute error granted to a kernel that flushes subnormal results to zero.

    The smallest normal number of the kernel's dtype, but of float32 for float16: its
    6.1e-5 is about 1000 subnormal ulps, every coefficient of a row of more than 16,384
    items, and no float16 kernel flushes (the conversions of x86, ARM and CUDA keep
    subnormals; torch's float16 softmax returns them).
    """
    return format_named("float32").tiny if fmt.name == "float16" else fmt.tiny


def _measure(
    got: np.ndarray,
    ref: np.ndarray,
    bound_abs: np.ndarray,
    naive: np.ndarray,
    fmt: Format,
    tol: _Tolerance,
    toward_zero: bool = True,
) -> _Checked:
    """Errors, allowances and their ratio, element by element.

    The ratio is formed from absolute values: in ulps at an exact 0 (the smallest
    subnormal) a float64 error of 1e-15 and its allowance of 4e-15 both overflow,
    and inf / inf failed a result within its bound. The flushing allowance
    (:func:`_flush_allowance`) is granted to a result between 0 and the exact value,
    where a flush puts it (`toward_zero`; a coefficient or an entropy, whose flushed
    terms only lower it), or either way (an attention output, a weighted mean that a
    flushed weight moves either way). Granted either way to coefficients, it passed an
    all-zero float16 row of 40,000 items and values 10 to 530 times too large.
    """
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    sp = model.ulp(ref, fmt)
    has_sp = np.isfinite(sp)
    spacing = np.where(has_sp, sp, 1.0)  # a special exact value: the error is 0 or inf
    flushed = _flush_allowance(fmt)
    if toward_zero:
        with np.errstate(invalid="ignore"):
            between = (np.abs(got) <= np.abs(ref)) & (got * ref >= 0)
        flushed = np.where(between, flushed, 0.0)
    extra = np.where(has_sp, np.nan_to_num(bound_abs, nan=0.0) + flushed, 0.0)
    bound = 0.5 * spacing + extra  # the final rounding, and the absolute allowance below tiny
    d = model.abs_error(got, ref)
    allowed_abs = tol.allowed(bound, model.abs_error(naive, ref), spacing)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(d == 0, 0.0, d / np.where(allowed_abs > 0, allowed_abs, 0.0))
        err, allowed = d / spacing, allowed_abs / spacing
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    return _Checked(err, allowed, ref, got, ratio)


def _summarise(
    kind: Kind,
    fmt: Format,
    chk: _Checked,
    describe: Any,
    contract: str = "default",
    other: _Checked | None = None,
) -> ErrorReport:
    err = chk.err
    size = int(err.size)
    other_passed = None if other is None else bool(np.all(other.ratio <= 1.0))
    if size == 0:
        return ErrorReport(kind, fmt.name, 0.0, 0.0, 0.0, (), 0, True, "", contract, other_passed)
    ratio = chk.ratio
    flat = int(np.argmax(ratio))
    worst = tuple(int(i) for i in np.unravel_index(flat, err.shape))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(chk.got - chk.ref) / np.abs(chk.ref)
    rel = np.where((chk.ref == 0) | (err == 0), 0.0, rel)
    rel = np.where(np.isnan(rel), np.inf, rel)
    report = ErrorReport(
        kind=kind,
        dtype=fmt.name,
        max_ulp=float(np.max(err)),
        max_rel_error=float(np.max(rel)),
        worst_ratio=float(ratio.flat[flat]),
        worst_index=worst,
        size=size,
        passed=bool(ratio.flat[flat] <= 1.0),
        contract=contract,
        other_contract_passed=other_passed,
        n_failed=int(np.count_nonzero(ratio > 1.0)),
    )
    if report.passed:
        return report
    return dataclasses.replace(report, message=describe(report, chk))


def _input_lines(
    name: str, x: np.ndarray, in_dtype: str, source: str | None, index: tuple[int, ...]
) -> tuple[str, tuple[int, ...]]:
    """Lines defining `name` as the kernel's input; the index of the worst row in it.

    The whole input when it is small (a row's result may depend on the others,
    when the kernel is wrong), else the rebuilding expression `source`, else the
    row alone.
    """
    if x.size <= 4 * REPRO_ITEMS:
        body = array_literal(x, in_dtype)
        line, picked = f"{name} = {body}", index
    elif source is not None:
        line, picked = f"{name} = {source}", index
    else:
        row = x[index]
        if row.shape[-1] <= REPRO_ITEMS:
            line = f"{name} = {row_literal(row, in_dtype)}  # row {index} of the input"
        else:
            line = f"{name} = <your {name}>[{', '.join(map(str, index))}]  # {row.shape[-1]} items"
        picked = ()
    if in_dtype == "bfloat16":
        line += "  # bfloat16 values (exact in float32): torch.from_numpy(x).to(torch.bfloat16)"
    return line, picked


def _contract_note(contract: str, other_passed: bool | None) -> str:
    """One line saying which 16-bit contract was applied and how the other one judges."""
    if other_passed is None:
        return ""
    if contract == "strict":
        head = "contract strict (float32-grade statistics and output)"
        tail = (
            "passes under the default 16-bit contract (one rounding of the scaled logits "
            "allowed; drop strict)"
            if other_passed
            else "fails under the default 16-bit contract too"
        )
    else:
        head = "contract default (one rounding of the scaled logits to the 16-bit dtype allowed)"
        tail = (
            "passes under strict (unexpected: strict is tighter)"
            if other_passed
            else "fails under strict too (strict is tighter)"
        )
    return f"{head}: this check {tail}"


def _failure_text(report: ErrorReport, chk: _Checked, what: str, row_info: str, repro: str) -> str:
    i = report.worst_index
    got = float(chk.got[i])
    exact = float(chk.ref[i])
    note = _contract_note(report.contract, report.other_contract_passed)
    if note:
        row_info += f"\n  {note}"
    return (
        f"{what} is outside the error model at index {i}:\n"
        f"  got      {got!r}\n"
        f"  exact    {exact!r}  (correctly rounded to float64)\n"
        f"  error    {fmt_ulp(float(chk.err[i]))} ulp of {report.dtype} "
        f"(allowed {fmt_ulp(float(chk.allowed[i]))})\n"
        f"  {row_info}\n"
        f"  failing elements: {report.n_failed} / {report.size} "
        f"({100.0 * report.n_failed / max(report.size, 1):.3g}%)\n"
        f"  over all {report.size} elements: max {fmt_ulp(report.max_ulp)} ulp, max relative "
        f"error {report.max_rel_error:.3g}\n"
        f"repro:\n{repro}"
    )


def _row_h_beta(row: np.ndarray, schedule: Schedule, entropy_eps: float) -> str:
    from . import reference

    r = np.asarray(row)
    try:
        H = float(reference.entropy(r, entropy_eps=entropy_eps))
        b = float(reference.beta(r, schedule=schedule, entropy_eps=entropy_eps))
    except ArithmeticError:  # a row at the jump of a user schedule
        return "row: H at the jump of the schedule"
    return f"row: n = {r.shape[-1]}, H = {H!r} nats, beta = {b!r} ({schedule!r})"


def _refuse_narrower_result(got_dtype: str, given: Any, in_dtype: str) -> None:
    """Fail a result in a narrower format than its floating input, given no ``dtype=``.

    The tolerance comes from the result's format: a float32 softmax rounded to float16
    passed at half an ulp of float16, whatever its float32 error had been.
    """
    floating = given.is_floating_point() if is_torch(given) else np.asarray(given).dtype.kind == "f"
    if floating and format_named(got_dtype).precision < format_named(in_dtype).precision:
        raise KernelMismatch(
            f"dtype mismatch: the kernel returned {got_dtype} for {in_dtype} input, a "
            f"narrower format: checked at {got_dtype}'s precision, any error below it would "
            f"pass. Pass dtype={got_dtype!r} if a {got_dtype} result is the kernel's contract",
            ErrorReport("dtype", got_dtype, math.inf, math.inf, math.inf, (), 0, False),
        )


def _prepare_rowwise(actual: Any, logits: Any, dtype: Any, vector: bool) -> tuple:
    got, got_dtype = to_numpy(actual, "actual")
    x, in_dtype = to_numpy(logits, "logits")
    if dtype is None:
        _refuse_narrower_result(got_dtype, logits, in_dtype)
    fmt = format_named(dtype if dtype is not None else got_dtype)
    if x.ndim == 0:
        raise ValueError("logits must have at least one axis (shape (..., n))")
    want = x.shape if vector else x.shape[:-1]
    if got.shape != want:
        raise KernelMismatch(
            f"shape mismatch: the kernel returned shape {got.shape}, expected {want} for logits "
            f"of shape {x.shape}",
            ErrorReport("shape", fmt.name, math.inf, math.inf, math.inf, (), 0, False),
        )
    return got, x, fmt, in_dtype


def _reference_rows(fn: Any, x: np.ndarray, **kw: Any) -> np.ndarray:
    return np.asarray(fn(x, dtype=np.float64, **kw), dtype=np.float64)


def _raise_or_return(report: ErrorReport) -> ErrorReport:
    __tracebackhide__ = True
    if not report.passed:
        raise KernelMismatch(report.message, report)
    return report


def _repro_call(repro: str | None, call: str) -> str:
    """The snippet: imports, the caller's `repro` lines, then `call`.

    An import line of `call` that `repro` already made is not repeated.
    """
    head = "import numpy as np\nfrom softmaxtheory import reference\n"
    if repro:
        head += repro.rstrip() + "\n"
        made = {ln for ln in head.splitlines() if ln.startswith(("import ", "from "))}
        call = "\n".join(ln for ln in call.split("\n") if ln not in made)
    return head + call


def assert_softmax_close(
    actual: Any,
    logits: Any,
    *,
    dtype: Any = None,
    mode: str = "auto",
    max_ulps: float | None = None,
    baseline_factor: float = 4.0,
    floor_ulps: float = 2.0,
    strict: bool = False,
    repro: str | None = None,
    source: str | None = None,
) -> ErrorReport:
    r"""Check :math:`\operatorname{softmax}(x)` along the last axis.

    Parameters
    ----------
    actual : array_like or torch.Tensor
        The kernel's output, shape ``(..., n)``.
    logits : array_like or torch.Tensor
        The kernel's input :math:`x` (its exact values are used).
    dtype : str, optional
        The kernel's format (default: the dtype of `actual`); ``"bfloat16"``
        for bfloat16 results given as float32. A result in a narrower format than
        its floating input (float16 for float32 logits) fails unless `dtype` names
        that format: checked at its precision, any error below it would pass.
    mode : {"auto", "bound", "baseline", "ulps"}
        Acceptance rule (see the module documentation).
    max_ulps : float, optional
        The tolerance of ``mode="ulps"``, in ulps of the exact value (not of the
        correctly rounded one): 0.5 accepts exactly the correctly rounded result, and 0
        only an exact one. No allowance for flushed subnormals is added.
    baseline_factor, floor_ulps : float
        The baseline rule: error :math:`\le k \cdot e_{\text{naive}} + \text{floor}` (ulps).
    strict : bool, default False
        The contract of float16 and bfloat16 kernels: by default the logits of
        the final softmax may be rounded once to the kernel's dtype (backward
        stable at its precision); ``True`` demands float32-grade statistics and
        output. No effect on float32 and float64 kernels.
    repro : str, optional
        Python lines that define ``kernel`` (for the repro snippet).
    source : str, optional
        An expression that rebuilds the logits (for long rows in the snippet).

    Returns
    -------
    ErrorReport
        The measurements.

    Raises
    ------
    KernelMismatch
        If an element is outside the error model (or the shape is wrong).
    """
    __tracebackhide__ = True
    tol = _Tolerance(mode, max_ulps, baseline_factor, floor_ulps, strict)
    case = _RowCheck("softmax", Constant(1), 0.0, dtype, repro, source)
    return _check_rowwise(case, actual, logits, tol)


def assert_entropy_close(
    actual: Any,
    logits: Any,
    *,
    entropy_eps: float = 0.0,
    dtype: Any = None,
    mode: str = "auto",
    max_ulps: float | None = None,
    baseline_factor: float = 4.0,
    floor_ulps: float = 2.0,
    strict: bool = False,
    repro: str | None = None,
    source: str | None = None,
) -> ErrorReport:
    r"""Check the entropy :math:`H = -\sum_i p_i \log(p_i + \varepsilon)` (nats) of each row.

    Parameters
    ----------
    actual : array_like or torch.Tensor
        The kernel's output, shape ``(...)``.
    logits : array_like or torch.Tensor
        The kernel's input, shape ``(..., n)``.
    entropy_eps : float, default 0.0
        The kernel's entropy mode (``1e-9``: the paper's listing).
    dtype, mode, max_ulps, baseline_factor, floor_ulps, strict, repro, source
        As in :func:`assert_softmax_close`.

    Returns
    -------
    ErrorReport
        The measurements.

    Raises
    ------
    KernelMismatch
        If an element is outside the error model (or the shape is wrong).
    """
    __tracebackhide__ = True
    tol = _Tolerance(mode, max_ulps, baseline_factor, floor_ulps, strict)
    case = _RowCheck("entropy", Constant(1), entropy_eps, dtype, repro, source)
    return _check_rowwise(case, actual, logits, tol)


def assert_adaptive_softmax_close(
    actual: Any,
    logits: Any,
    *,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    dtype: Any = None,
    mode: str = "auto",
    max_ulps: float | None = None,
    baseline_factor: float = 4.0,
    floor_ulps: float = 2.0,
    strict: bool = False,
    repro: str | None = None,
    source: str | None = None,
) -> ErrorReport:
    r"""Check the adaptive softmax :math:`\operatorname{softmax}(\beta(H(x))\,x)`.

    At a jump of a user schedule (a row whose entropy lies within its error
    bound of the threshold) the values of either side are accepted.

    Parameters
    ----------
    actual : array_like or torch.Tensor
        The kernel's output, shape ``(..., n)``.
    logits : array_like or torch.Tensor
        The kernel's input.
    schedule : Schedule, optional
        The schedule the kernel implements (default: the paper's).
    entropy_eps : float, default 0.0
        The kernel's entropy mode.
    dtype, mode, max_ulps, baseline_factor, floor_ulps, strict, repro, source
        As in :func:`assert_softmax_close`.

    Returns
    -------
    ErrorReport
        The measurements.

    Raises
    ------
    KernelMismatch
        If an element is outside the error model (or the shape is wrong).
    """
    __tracebackhide__ = True
    tol = _Tolerance(mode, max_ulps, baseline_factor, floor_ulps, strict)
    case = _RowCheck("adaptive_softmax", schedule, entropy_eps, dtype, repro, source)
    return _check_rowwise(case, actual, logits, tol)


def _check_text(value: Any, name: str) -> None:
    """`value` is None or a str (a snippet's lines): refused at the call, not at a failure."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a str of Python source, got {type(value).__name__}")


@dataclass(frozen=True)
class _RowCheck:
    """What a row-wise assertion checks, besides the arrays and the tolerance.

    The schedule is resolved and `entropy_eps` validated on construction.
    """

    kind: Kind  # "softmax", "entropy" or "adaptive_softmax"
    schedule: Schedule | None
    entropy_eps: float
    dtype: Any  # the kernel's format, None: the dtype of the output
    repro: str | None
    source: str | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", resolve_schedule(self.schedule))
        object.__setattr__(self, "entropy_eps", check_entropy_eps(self.entropy_eps))
        _check_text(self.repro, "repro")
        _check_text(self.source, "source")

    @property
    def vector(self) -> bool:
        """One output per item (softmax), rather than one per row (entropy)."""
        return self.kind != "entropy"


def _check_rowwise(case: _RowCheck, actual: Any, logits: Any, tol: _Tolerance) -> ErrorReport:
    __tracebackhide__ = True
    from . import reference

    with np.errstate(all="ignore"):
        got, x, fmt, in_dtype = _prepare_rowwise(actual, logits, case.dtype, case.vector)
        kind, schedule, entropy_eps = case.kind, case.schedule, case.entropy_eps
        assert schedule is not None  # resolved by _RowCheck
        ui = fmt.internal.u
        lowp = fmt.precision < 24  # float16, bfloat16: two contracts
        cond = model.row_conditioning(x, entropy_eps)
        # checks[False]: the default contract, checks[True]: strict (the same for 32/64 bits)
        if kind == "softmax":
            ref = _reference_rows(reference.softmax, x)
            ones = np.ones(cond.H.shape)
            rel = model.softmax_rel_error(cond, ones, ui, scale_first=False)
            naive = model.naive_softmax(x, fmt)
            bound = _probability_bound(rel, ref, got, fmt)
            checks = {True: _measure(got, ref, bound, naive, fmt, tol)}
            if lowp:
                rel = rel + model.logit_rounding_rel_error(cond, ones, np.zeros(ones.shape), fmt)
                bound = _probability_bound(rel, ref, got, fmt)
                checks[False] = _measure(got, ref, bound, naive, fmt, tol)
        elif kind == "entropy":
            ref = _reference_rows(reference.entropy, x, entropy_eps=entropy_eps)
            dH = model.entropy_abs_error(cond, ui, entropy_eps)
            naive = model.round_to_format(model.naive_entropy(x, fmt, entropy_eps), fmt)
            checks = {True: _measure(got, ref, model.SLACK * dH, naive, fmt, tol)}
            if lowp:
                dH = dH + model.logit_rounding_entropy_error(cond, fmt)
                checks[False] = _measure(got, ref, model.SLACK * dH, naive, fmt, tol)
        else:
            checks = _check_adaptive(got, x, cond, fmt, schedule, entropy_eps, tol, lowp)
        chk = checks[tol.strict] if lowp else checks[True]
        other = checks[not tol.strict] if lowp else None

        def describe(report: ErrorReport, c: _Checked) -> str:
            idx = report.worst_index
            ridx = idx[:-1] if case.vector else idx
            row = x[ridx]
            info = _row_h_beta(
                row, schedule if kind == "adaptive_softmax" else Constant(1), entropy_eps
            )
            kw = ""
            if kind != "softmax" and entropy_eps:
                kw += f", entropy_eps={entropy_eps!r}"
            if kind == "adaptive_softmax" and not _is_paper(schedule):
                kw += f", schedule=softmaxtheory.spec.{schedule!r}"
            lines, picked = _input_lines("x", x, in_dtype, case.source, ridx)
            full = (*picked, idx[-1]) if case.vector else picked
            pick = f"[{', '.join(map(str, full))}]" if full else ""
            call = (
                lines
                + f"\nprint(float(kernel(x){pick}))  # {float(c.got[idx])!r}"
                + f"\nprint(float(reference.{kind}(x{kw}){pick}))  # {float(c.ref[idx])!r}"
            )
            if "softmaxtheory.spec" in kw:
                call = "import softmaxtheory.spec\n" + call
            what = kind.replace("_", " ")  # "adaptive softmax"
            return _failure_text(report, c, what, info, _repro_call(case.repro, call))

        report = _summarise(kind, fmt, chk, describe, tol.contract, other)
    return _raise_or_return(report)


def _probability_bound(
    rel: np.ndarray, ref: np.ndarray, got: np.ndarray, fmt: Format
) -> np.ndarray:
    r"""The absolute error allowed a coefficient whose logarithm may be off by `rel`.

    The error model bounds :math:`|\log\tilde y - \log y| \le r` (:math:`r` =
    SLACK times `rel`), a window :math:`[y e^{-r}, y e^{r}]` that is not symmetric:
    below the exact value the error is at most :math:`y(1 - e^{-r}) < y` (no
    coefficient is negative, however large :math:`r`), above it :math:`y(e^r - 1)`
    and at most :math:`1 - y` (nor above 1, but for eight units of `fmt`: a kernel
    whose numerator and sum take separate exponentials may pass 1 by an ulp). The
    symmetric :math:`y(e^r - 1)` on both sides let ``-exact`` pass once
    :math:`r \ge \log 2`.
    """
    y = np.abs(np.asarray(ref, dtype=np.float64))
    r = model.SLACK * np.asarray(rel, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        up = np.minimum(np.expm1(r) * y, np.maximum(1.0 - y, 0.0) + 8.0 * fmt.u)
        down = -np.expm1(-r) * y
    return np.where(np.asarray(got, dtype=np.float64) < y, down, up)


def _is_paper(schedule: Schedule) -> bool:
    from .spec import PaperPolynomial

    return isinstance(schedule, PaperPolynomial) or (
        type(schedule) is Polynomial and schedule == PaperPolynomial()
    )


def _jump_sides(schedule: Polynomial, entropy_eps: float) -> tuple[Schedule, Schedule]:
    r"""The two sides of a jump: β = 1 (H at or below the threshold), or max(P(H), 1).

    The second is `schedule`'s polynomial with a threshold below every entropy,
    guarded ones included (:math:`H_\eta \ge -\log(1 + \eta) > -1 - \eta`).
    """
    return Constant(1), Polynomial(schedule.coefficients, threshold=-1.0 - float(entropy_eps))


def _check_adaptive(
    got: np.ndarray,
    x: np.ndarray,
    cond: model.RowConditioning,
    fmt: Format,
    schedule: Schedule,
    entropy_eps: float,
    tol: _Tolerance,
    lowp: bool,
) -> dict[bool, _Checked]:
    """The checks of the strict contract (key True) and, for 16-bit kernels, the default one."""
    from . import reference

    ui = fmt.internal.u
    dH = model.entropy_abs_error(cond, ui, entropy_eps)
    beta, dbeta = model.beta_error(schedule, cond, dH, ui)
    jump = model.near_jump(schedule, cond.H, dH) & cond.regular
    ref = np.zeros(x.shape)
    try:
        ref[...] = _reference_rows(
            reference.adaptive_softmax, x, schedule=schedule, entropy_eps=entropy_eps
        )
    except reference.PrecisionError:
        for idx in np.ndindex(x.shape[:-1]):
            if jump[idx]:
                continue  # decided below
            ref[idx] = _reference_rows(
                reference.adaptive_softmax, x[idx], schedule=schedule, entropy_eps=entropy_eps
            )
    contracts = (True, False) if lowp else (True,)

    def rel_of(c: model.RowConditioning, b: np.ndarray, db: np.ndarray, strict: bool) -> np.ndarray:
        # strict demands the shifted form in every dtype: scaling x first loses
        # beta (|x| + |m|) u, all of a float32 row near 3e6 (any coefficients passed)
        rel = model.adaptive_rel_error(
            c, b, db, ui, scale_first=not tol.strict, fmax=fmt.internal.max_finite
        )
        if not strict:
            rel = rel + model.logit_rounding_rel_error(c, b, db, fmt)
        return rel

    naive = model.naive_adaptive_softmax(x, fmt, schedule, entropy_eps)
    checks = {}
    for strict in contracts:
        bound = _probability_bound(rel_of(cond, beta, dbeta, strict), ref, got, fmt)
        checks[strict] = _measure(got, ref, bound, naive, fmt, tol)
    if not np.any(jump):
        return checks
    assert isinstance(schedule, Polynomial)
    left, right = _jump_sides(schedule, entropy_eps)
    # np.ndindex, not np.nonzero: a 1-d row's jump flag is 0-d, which nonzero refuses
    for idx in (i for i in np.ndindex(x.shape[:-1]) if jump[i]):
        row = x[idx]
        c1 = model.row_conditioning(row, entropy_eps)
        sides = []
        for side in (left, right):
            r = _reference_rows(
                reference.adaptive_softmax, row, schedule=side, entropy_eps=entropy_eps
            )
            b_side, _ = model.beta_error(side, c1, dH[idx], ui)
            nv = model.naive_adaptive_softmax(row, fmt, side, entropy_eps)
            sides.append((r, b_side, nv))
        for strict in contracts:
            best = None
            for r, b_side, nv in sides:
                rel1 = rel_of(c1, b_side, dbeta[idx], strict)
                c = _measure(got[idx], r, _probability_bound(rel1, r, got[idx], fmt), nv, fmt, tol)
                score = float(np.max(c.ratio))
                if best is None or score < best[0]:
                    best = (score, c)
            assert best is not None
            c, chk = best[1], checks[strict]
            chk.err[idx], chk.allowed[idx], chk.ref[idx] = c.err, c.allowed, c.ref
            chk.ratio[idx] = c.ratio
    return checks


def assert_attention_close(
    actual: Any,
    logits_or_qkv: Any,
    *,
    mask: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    dtype: Any = None,
    mode: str = "auto",
    max_ulps: float | None = None,
    baseline_factor: float = 4.0,
    floor_ulps: float = 2.0,
    strict: bool = False,
    repro: str | None = None,
    source: dict[str, str] | None = None,
    enable_gqa: bool = False,
) -> ErrorReport:
    r"""Check attention :math:`\mathrm{out}_i = \sum_j \operatorname{softmax}(\beta_i x_i)_j v_j`.

    At a jump of a user schedule (a query whose entropy lies within its error
    bound of the threshold) the values of either side are accepted.

    Parameters
    ----------
    actual : array_like or torch.Tensor
        The kernel's output, shape ``(..., L, dv)``.
    logits_or_qkv : tuple
        ``(q, k, v)`` with shapes ``(..., L, d)``, ``(..., S, d)``, ``(..., S, dv)``;
        the logits are :math:`x_{ij} = \mathrm{scale}\; q_i \cdot k_j` (+ mask). Or
        ``(logits, v)`` with shapes ``(..., L, S)`` and ``(..., S, dv)``, for a kernel
        that is given its logits (``-inf`` entries are masked; `scale` must be left
        ``None``).
    mask : array_like, optional
        Boolean (``True`` attends) or additive float mask, broadcastable to ``(..., L, S)``.
    is_causal : bool, default False
        Mask keys ``j > i``.
    scale : float, optional
        Default ``1 / sqrt(d)``.
    schedule : Schedule, optional
        Default: the paper's; ``Constant(1)`` is plain attention.
    entropy_eps : float, default 0.0
        The kernel's entropy mode.
    dtype, mode, max_ulps, baseline_factor, floor_ulps, strict, repro
        As in :func:`assert_softmax_close`. The failure's snippet calls the kernel
        with the keywords of this check, ``kernel(q, k, v, mask=mask,
        is_causal=True, scale=...)`` (each only when set; ``kernel(x, v, ...)``
        given logits), so `repro` defines a ``kernel`` that takes them.
    source : dict of str to str, optional
        Source text that rebuilds an input, by name (``"q"``, ``"k"``, ``"v"``, ``"x"``,
        ``"mask"``): the snippet uses it for inputs too large to write out (otherwise
        ``<your q>``).
    enable_gqa : bool, default False
        Grouped-query attention (``(q, k, v)`` only): `k` and `v` may have fewer
        heads (axis -3) than `q`, query head :math:`h` reading key head
        :math:`\lfloor h / (H_q / H_k) \rfloor`, as SDPA's ``enable_gqa=True``
        (:func:`~softmaxtheory.spec.expand_kv_heads`); the snippet passes it on.

    Returns
    -------
    ErrorReport
        The measurements.

    Raises
    ------
    KernelMismatch
        If an element is outside the error model (or the shape is wrong).
    """
    __tracebackhide__ = True
    from . import reference

    tol = _Tolerance(mode, max_ulps, baseline_factor, floor_ulps, strict)
    _check_text(repro, "repro")
    if not isinstance(logits_or_qkv, tuple | list) or len(logits_or_qkv) not in (2, 3):
        raise TypeError("logits_or_qkv must be a tuple (q, k, v) or (logits, v)")
    if source is not None and not (
        isinstance(source, dict) and all(isinstance(t, str) for t in source.values())
    ):
        raise TypeError("source must be a dict mapping input names to source text")
    schedule = resolve_schedule(schedule)
    entropy_eps = check_entropy_eps(entropy_eps)
    got, got_dtype = to_numpy(actual, "actual")
    m = None
    if mask is not None:
        if not is_torch(mask):
            refuse_masked(mask, "mask", "mask")
        # as every backend: an integer mask is ambiguous (read as additive, it failed a
        # kernel taking 1 as attend and passed one adding it)
        check_mask_dtype(mask.dtype if is_torch(mask) else np.asarray(mask).dtype)
        m = to_numpy(mask, "mask")[0] if not _is_bool(mask) else _bool_numpy(mask)
    given_mask, x = m, None
    folded = False  # is_causal joined to the mask of given -inf logits (see below)
    if len(logits_or_qkv) == 2:
        if scale is not None:
            raise ValueError("scale applies to (q, k, v); given logits, leave scale=None")
        (x, in_dtype), (v, _) = (
            to_numpy(a, n) for a, n in zip(logits_or_qkv, ("logits", "v"), strict=True)
        )
        q, k, m, scale = _logits_as_qk(x, m)
        if is_causal is True and given_mask is None and m is not None:
            # -inf logits made a mask the caller did not pass, and the reference (as
            # SDPA) refuses a mask with is_causal: the triangle joins that mask instead
            # ("pass either mask or is_causal=True, not both", for no mask given)
            m = m & np.tril(np.ones(x.shape[-2:], dtype=bool))
            is_causal, folded = False, True
        if enable_gqa:
            raise ValueError("enable_gqa applies to (q, k, v), not to given logits")
    else:
        (q, in_dtype), (k, _), (v, _) = (
            to_numpy(a, n) for a, n in zip(logits_or_qkv, "qkv", strict=True)
        )
    if not isinstance(enable_gqa, bool | np.bool_):
        raise TypeError(f"enable_gqa must be a bool, got {enable_gqa!r}")
    grouped = (k, v) if enable_gqa else None
    if enable_gqa:
        k, v = expand_kv_heads(q, k, v)
    if dtype is None:
        _refuse_narrower_result(got_dtype, logits_or_qkv[0], in_dtype)
    fmt = format_named(dtype if dtype is not None else got_dtype)
    ref = np.asarray(
        reference.adaptive_attention(
            q, k, v, mask=m, scale=scale, is_causal=is_causal, schedule=schedule,
            entropy_eps=entropy_eps, dtype=np.float64,
        ),
        dtype=np.float64,
    )  # fmt: skip
    if got.shape != ref.shape:
        raise KernelMismatch(
            f"shape mismatch: the kernel returned shape {got.shape}, expected {ref.shape}",
            ErrorReport("shape", fmt.name, math.inf, math.inf, math.inf, (), 0, False),
        )
    case = _AttentionCheck(
        q, k, v, m, in_dtype, scale, is_causal, schedule, entropy_eps, repro,
        logits=x, given_mask=given_mask, source=source or {}, grouped=grouped,
        causal_folded=folded,
    )  # fmt: skip
    with np.errstate(all="ignore"):
        report = _attention_quiet(got, ref, fmt, case, tol)
    return _raise_or_return(report)


@dataclass(frozen=True, eq=False)
class _AttentionCheck:
    """An attention problem as numpy arrays (given logits already expressed as q and k)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray | None
    in_dtype: str  # the dtype the inputs came in (for the repro snippet)
    scale: float | None
    is_causal: bool
    schedule: Schedule
    entropy_eps: float
    repro: str | None
    logits: np.ndarray | None  # the kernel's given logits (exact inputs), or None for q, k, v
    given_mask: np.ndarray | None  # the mask as the kernel was given it
    source: dict[str, str]  # source text that rebuilds an input, by name
    grouped: tuple[np.ndarray, np.ndarray] | None = None  # k, v as given, with enable_gqa
    causal_folded: bool = False  # given logits with -inf and is_causal: the mask holds both

    @property
    def given_logits(self) -> bool:
        """The kernel was given its logits: they are exact inputs."""
        return self.logits is not None


def _attention_quiet(
    got: np.ndarray, ref: np.ndarray, fmt: Format, case: _AttentionCheck, tol: _Tolerance
) -> ErrorReport:
    __tracebackhide__ = True
    q, k, v, m = case.q, case.k, case.v, case.mask
    scale, is_causal, schedule, entropy_eps = (
        case.scale, case.is_causal, case.schedule, case.entropy_eps
    )  # fmt: skip
    d = q.shape[-1]
    sc = (1.0 / math.sqrt(d) if d else 1.0) if scale is None else float(scale)
    keep, add = _mask_parts(m, is_causal, q.shape[-2], k.shape[-2])
    q64, k64, v64 = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    with np.errstate(all="ignore"):
        logits = (q64 @ np.swapaxes(k64, -1, -2)) * sc + add
        logits = np.where(keep, logits, -np.inf)
        absdot = (np.abs(q64) @ np.swapaxes(np.abs(k64), -1, -2)) * abs(sc)
    ui = fmt.internal.u
    lowp = fmt.precision < 24
    # given logits are the kernel's input, exact: only the dot products' error counts, and
    # under the default 16-bit contract one rounding of the (scaled) logits to the dtype
    dot_err = 0.0 if case.given_logits else (d + 2) * ui * absdot
    lead = logits.shape[:-2]
    vb = np.broadcast_to(v64, (*lead, *v64.shape[-2:]))
    naive = model.naive_attention(q, k, v, keep, add, sc, schedule, entropy_eps, fmt)
    checks = {}
    for strict_c in (True, False) if lowp else (True,):
        # the logits stored once: in the dtype (default) or in float32 (strict)
        u_store = ui if strict_c else fmt.u
        logit_err = dot_err + u_store * np.abs(np.where(np.isfinite(logits), logits, 0))
        bound = model.attention_bound(logits, logit_err, vb, schedule, entropy_eps, fmt)
        checks[strict_c] = _measure(got, ref, bound, naive, fmt, tol, toward_zero=False)
        _attention_either_side(
            checks[strict_c], got, fmt, case, tol, logits, logit_err, vb, (sc, keep, add)
        )
    chk = checks[tol.strict] if lowp else checks[True]
    other = checks[not tol.strict] if lowp else None

    def describe(report: ErrorReport, c: _Checked) -> str:
        idx = report.worst_index
        row = logits[idx[:-1]]
        cond = model.row_conditioning(row, entropy_eps)
        b = schedule.beta_float(cond.H, cond.n_eff)
        info = (
            f"query row: {int(cond.n_eff)} keys attended, H ~ {float(cond.H):.6g} nats, "
            f"beta ~ {float(b):.6g} ({schedule!r}; float64 estimates)"
        )
        if np.any(np.isnan(row) | (row == np.inf)):
            info = "query row: its logits hold NaN or +inf, so the table gives it NaN"
        elif not np.all(np.isfinite(vb[idx[:-2]][row > -np.inf, idx[-1]])):
            info = f"value column {idx[-1]} holds NaN or an infinity at a key this query attends"
        call = _attention_repro(case, c.got[idx], c.ref[idx], idx)
        return _failure_text(report, c, "attention output", info, _repro_call(case.repro, call))

    return _summarise("attention", fmt, chk, describe, tol.contract, other)


def _attention_either_side(
    chk: _Checked,
    got: np.ndarray,
    fmt: Format,
    case: _AttentionCheck,
    tol: _Tolerance,
    logits: np.ndarray,
    logit_err: np.ndarray,
    vb: np.ndarray,
    parts: tuple[float, np.ndarray, np.ndarray],
) -> None:
    r"""At a jump of the schedule, accept either side: patch `chk` where that is better.

    A query whose entropy lies within its error bound of a threshold where β jumps
    (:func:`~softmaxtheory._check.error_model.near_jump`) may get β = 1 or
    :math:`\max(P(H), 1)` from a sound kernel; its row is measured against both
    and keeps the better (as :func:`assert_adaptive_softmax_close` does).
    """
    from . import reference

    schedule, eps = case.schedule, case.entropy_eps
    if not model.rule_jumps(schedule):  # no jump: the rows' conditioning is not needed again
        return
    cond, _, dH = model.attention_entropy_error(logits, logit_err, eps, fmt.internal.u)
    jump = model.near_jump(schedule, cond.H, dH) & cond.regular
    if not np.any(jump):
        return
    assert isinstance(schedule, Polynomial)
    sc, keep, add = parts  # the resolved scale and the mask's parts, as the caller has them
    best: _Checked | None = None
    score = np.full(jump.shape, np.inf)
    for side in _jump_sides(schedule, eps):
        ref = reference.adaptive_attention(
            case.q, case.k, case.v, mask=case.mask, scale=case.scale, is_causal=case.is_causal,
            schedule=side, entropy_eps=eps, dtype=np.float64,
        )  # fmt: skip
        naive = model.naive_attention(case.q, case.k, case.v, keep, add, sc, side, eps, fmt)
        bound = model.attention_bound(logits, logit_err, vb, side, eps, fmt)
        ref = np.asarray(ref, dtype=np.float64)
        c = _measure(got, ref, bound, naive, fmt, tol, toward_zero=False)
        row = np.max(c.ratio, axis=-1, initial=0.0)
        better = jump & (row < score)
        score = np.where(better, row, score)
        if best is None:
            best = c
        else:
            take = better[..., None]
            for name in ("err", "allowed", "ref", "ratio"):
                getattr(best, name)[...] = np.where(take, getattr(c, name), getattr(best, name))
    assert best is not None
    take = jump[..., None]
    for name in ("err", "allowed", "ref", "ratio"):
        getattr(chk, name)[...] = np.where(take, getattr(best, name), getattr(chk, name))


def _attention_repro(case: _AttentionCheck, got: float, ref: float, idx: tuple) -> str:
    """The lines of an attention repro: the inputs, the kernel's call and the reference's.

    The kernel is called as it was checked: ``kernel(q, k, v, ...)`` (``kernel(x, v,
    ...)`` given logits) with ``mask=mask`` when a mask was given, ``is_causal=True``
    and ``scale=`` when set. The arrays are written out when they are small.
    """
    k, v = case.grouped or (case.k, case.v)
    arrays: list[tuple[str, np.ndarray]] = [("q", case.q), ("k", k), ("v", v)]
    if case.logits is not None:
        arrays = [("x", case.logits), ("v", case.v)]
    if case.given_mask is not None:
        arrays.append(("mask", case.given_mask))
    small = max(a.size for _, a in arrays) <= 3 * REPRO_ITEMS
    lines = []
    for name, a in arrays:
        if not small:
            lines.append(f"{name} = {case.source.get(name, f'np.asarray(<your {name}>)')}")
        elif a.dtype == bool:
            lines.append(f"{name} = np.array({np.asarray(a).tolist()!r})")
        else:
            dtype = case.in_dtype if name != "mask" else np.asarray(a).dtype.name
            lines.append(f"{name} = {array_literal(a, dtype)}")
    kernel_kw = ", mask=mask" if case.given_mask is not None else ""
    kernel_kw += ", is_causal=True" if case.is_causal or case.causal_folded else ""
    kernel_kw += ", enable_gqa=True" if case.grouped is not None else ""
    if case.logits is None:
        kernel_kw += "" if case.scale is None else f", scale={case.scale!r}"
        args, ref_args = "q, k, v", "q, k, v"
        ref_kw = f"scale={case.scale!r}, is_causal={case.is_causal!r}"
        ref_kw += ", mask=mask" if case.given_mask is not None else ""
        ref_kw += ", enable_gqa=True" if case.grouped is not None else ""
    else:  # the reference takes the logits as q = x (0 where -inf) and k = I, scale 1
        args = "x, v"
        ref_args = "np.where(np.isneginf(x), 0.0, x), np.eye(x.shape[-1]), v"
        ref_kw = f"scale=1.0, is_causal={case.is_causal!r}"
        if case.causal_folded:  # (the reference takes no mask with is_causal: joined)
            lines.append("keep = ~np.isneginf(x) & np.tril(np.ones(x.shape[-2:], dtype=bool))")
            ref_kw += ", mask=keep"
        elif case.mask is not None:
            lines.append("keep = ~np.isneginf(x)")
            if case.given_mask is None:
                ref_kw += ", mask=keep"
            elif case.given_mask.dtype == bool:
                ref_kw += ", mask=keep & mask"
            else:
                ref_kw += ", mask=np.where(keep, mask, -np.inf)"
    if not _is_paper(case.schedule):
        ref_kw += f", schedule=softmaxtheory.spec.{case.schedule!r}"
        lines.insert(0, "import softmaxtheory.spec")
    if case.entropy_eps:
        ref_kw += f", entropy_eps={case.entropy_eps!r}"
    where = list(idx)
    return "\n".join(lines) + (
        f"\nprint(float(kernel({args}{kernel_kw}){where!r}))  # {float(got)!r}"
        f"\nprint(reference.adaptive_attention({ref_args}, {ref_kw}){where!r})  # {float(ref)!r}"
    )


def _is_bool(mask: Any) -> bool:
    if is_torch(mask):
        return str(mask.dtype) == "torch.bool"
    return np.asarray(mask).dtype == bool


def _bool_numpy(mask: Any) -> np.ndarray:
    if is_torch(mask):
        return mask.detach().cpu().numpy().astype(bool)
    refuse_masked(mask, "mask", "mask")
    return np.asarray(mask, dtype=bool)


def _logits_as_qk(
    x: np.ndarray, m: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, float]:
    r"""Express given logits as q, k, mask and scale of the reference's attention.

    With :math:`q = x` and :math:`k = I_S` (scale 1) every dot product
    :math:`q_i \cdot k_j = x_{ij}` is exact; ``-inf`` logits become a boolean mask
    (combined with a boolean `m`; an additive `m` stays additive).
    """
    if x.ndim < 2:
        raise ValueError(f"logits must have shape (..., L, S), got {x.shape}")
    finite = x > -np.inf
    keep = finite | np.isnan(x)  # NaN logits stay, so the row is NaN as in the table
    q = np.where(keep, x, 0.0).astype(x.dtype)
    k = np.eye(x.shape[-1], dtype=x.dtype)
    if m is None:
        mask = None if keep.all() else keep
    elif m.dtype == bool:
        mask = keep & m
    else:  # an additive mask, which must also mask the -inf logits
        mask = np.where(keep, np.asarray(m, dtype=np.float64), -np.inf)
    return q, k, mask, 1.0


def _mask_parts(
    m: np.ndarray | None, is_causal: bool, L: int, S: int
) -> tuple[np.ndarray, np.ndarray]:
    keep = np.ones((L, S), dtype=bool)
    add = np.zeros((L, S))
    if is_causal:
        keep = np.tril(keep)
    if m is not None:
        if m.dtype == bool:
            keep = m
        else:
            add = np.asarray(m, dtype=np.float64)
    return keep, add
