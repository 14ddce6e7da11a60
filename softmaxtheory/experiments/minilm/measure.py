r"""Per-head measurements of all-MiniLM-L6-v2 beside the bounds of :mod:`softmaxtheory.bounds`.

For every head :math:`(l, h)` and every sequence length :math:`n`, with
:math:`x_{ij}` the head's pre-softmax logits (query :math:`i`, key :math:`j`):

* row spread :math:`\delta_i = \max_j x_{ij} - \min_j x_{ij}`
  (:func:`softmaxtheory.bounds.empirical_spread` over the keys);
  the head's **spread** is :math:`\max_i \delta_i` (what the T1 bound of the
  head needs: every row obeys it), its mean spread :math:`\frac1n\sum_i\delta_i`,
  and its global spread :math:`\max_{ij} x_{ij} - \min_{ij} x_{ij}` (all rows
  pooled);
* the largest coefficient :math:`\max_{ij} \alpha_{ij}`, :math:`\alpha_i =
  \mathrm{softmax}(x_i)` (in float64, from the captured logits), next to T1's
  :math:`1/(1 + (n-1)e^{-\delta})` at the head's spread, and T2's dispersion size
  :math:`n^\ast(\varepsilon = 1/2, \delta)`;
* T9's bound from the weights. The input of layer :math:`l` is a LayerNorm
  output :math:`y = \gamma \odot z + \beta` with
  :math:`z = (x - \mu)/\sqrt{\sigma^2 + \epsilon}`, and
  :math:`\lVert z\rVert_2^2 = d\,\sigma^2/(\sigma^2 + \epsilon) < d`, so

  .. math::

      \lVert y\rVert_2 \le \lVert \gamma \odot z\rVert_2 + \lVert\beta\rVert_2
      \le \max_k |\gamma_k|\,\sqrt d + \lVert\beta\rVert_2 = B_l ,

  whatever the token or the context. :func:`softmaxtheory.bounds.spread_from_weights`
  with :math:`B_l` and the head's query/key rows :math:`W_{Q,h}, b_{Q,h}, W_{K,h}, b_{K,h}`
  bounds its spread at every length. Folding the affine map into the projection,
  :math:`q = (W_{Q,h}\,\mathrm{diag}\,\gamma)\, z + (W_{Q,h}\beta + b_{Q,h})` with
  :math:`\lVert z\rVert < \sqrt d`, gives a second, tighter bound (the *folded* bound).

Every measured spread must lie below both bounds, and every coefficient below
its row's T1 bound (checked row by row, certified): :func:`measure` raises
:class:`BoundViolationError` otherwise.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import bounds
from .model import (
    MAX_POSITIONS,
    MiniLM,
    TextSample,
    forward,
    require,
    token_prefix,
)

__all__ = [
    "EPS",
    "PAPER_GEMMA_2B",
    "T1_SLACK",
    "BoundViolationError",
    "Experiment",
    "HeadBounds",
    "LengthResult",
    "Summary",
    "check_bounds",
    "head_bounds",
    "measure",
    "summarize",
]

#: The level of the dispersion sizes reported (the paper's example: max coefficient 1/2).
EPS = 0.5

#: Relative slack of the T1 check, for the float64 softmax that computes the
#: coefficients from the logits (its error is a few units in the last place).
T1_SLACK = 64 * 2.0**-52

#: The paper's figures for Gemma 2B on a ~4,000-token code sample (range: secondary source).
PAPER_GEMMA_2B = {
    "mean": 5.69,
    "std": 2.05,
    "min": 2.28,
    "max": 14.78,
    "tokens": 4000,
    "dispersion_size": 297,
}


class BoundViolationError(AssertionError):
    """A measurement exceeds a bound that must hold: a bug (or a wrong bound), never noise."""


def _up(x: float, ulps: int = 4) -> float:
    """`x` moved up by a few units in the last place (covers float rounding of a formula)."""
    for _ in range(ulps):
        x = math.nextafter(x, math.inf)
    return x


@dataclass(frozen=True)
class HeadBounds:
    r"""T9 bounds of every head, from the weights alone (valid at every length).

    Attributes
    ----------
    input_norm : numpy.ndarray, shape (layers,)
        :math:`B_l = \max|\gamma|\sqrt d + \lVert\beta\rVert` of each layer's input LayerNorm
        (rounded up).
    normalized_norm : float
        :math:`\sqrt d` rounded up: the bound on :math:`\lVert z\rVert`.
    weight : numpy.ndarray, shape (layers, heads)
        :func:`softmaxtheory.bounds.spread_from_weights` with :math:`B_l`.
    folded : numpy.ndarray, shape (layers, heads)
        The same with :math:`\gamma` and :math:`\beta` folded into the projection.
    """

    input_norm: np.ndarray
    normalized_norm: float
    weight: np.ndarray
    folded: np.ndarray


def _np64(t: Any) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def _fold(
    w: np.ndarray, b: np.ndarray, gamma: np.ndarray, beta: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    r"""Fold a LayerNorm's affine map into a projection: :math:`W\mathrm{diag}\gamma`, bias.

    The bias :math:`W\beta + b` is returned as the componentwise upper bound
    :math:`|\mathrm{fl}(W\beta + b)| + e` of its absolute value, where :math:`e`
    covers the error of a float64 dot product of :math:`d` terms
    (:math:`\le (d+1)u\sum|\text{terms}|`): its norm bounds the exact bias norm.
    """
    d = w.shape[-1]
    w_fold = w * gamma  # products of float32 values: exact in float64
    b_fold = w @ beta + b
    err = 2 * (d + 2) * 2.0**-53 * (np.abs(w) @ np.abs(beta) + np.abs(b))
    return w_fold, np.abs(b_fold) + err


def _single_threaded_blas() -> contextlib.AbstractContextManager[Any]:
    """Limit BLAS/LAPACK to one thread when ``threadpoolctl`` is installed.

    The spectral norms are batches of small SVDs (32 x 384); a multi-threaded
    OpenBLAS gains nothing on them and, on a busy machine, can be tens of times
    slower than one thread. Without ``threadpoolctl`` nothing changes.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def head_bounds(model: MiniLM) -> HeadBounds:
    r"""Compute the T9 spread bounds of all heads of `model` from its weights.

    Parameters
    ----------
    model : MiniLM
        The loaded weights (float32 values; float64 copies are exact).

    Returns
    -------
    HeadBounds
    """
    with _single_threaded_blas():
        return _head_bounds(model)


def _head_bounds(model: MiniLM) -> HeadBounds:
    d, heads, dh = model.width, model.heads, model.head_width
    sqrt_d = _up(math.sqrt(d))
    input_norm = np.empty(model.layers)
    weight = np.empty((model.layers, heads))
    folded = np.empty((model.layers, heads))
    for layer in range(model.layers):
        g_t, b_t = model.input_layer_norm(layer)
        gamma, beta = _np64(g_t), _np64(b_t)
        beta_norm = _up(float(np.linalg.norm(beta)) * (1 + 2 * d * 2.0**-53))
        input_norm[layer] = _up(float(np.max(np.abs(gamma))) * sqrt_d + beta_norm)
        wq, bq = (_np64(t) for t in model.projection(layer, "query"))
        wk, bk = (_np64(t) for t in model.projection(layer, "key"))
        wq_h = wq.reshape(heads, dh, d)
        wk_h = wk.reshape(heads, dh, d)
        bq_h = bq.reshape(heads, dh)
        bk_h = bk.reshape(heads, dh)
        weight[layer] = bounds.spread_from_weights(
            wq_h,
            wk_h,
            input_norm[layer],
            bias_q=bq_h,
            bias_k=bk_h,
            scale=model.scale,
            layout="out_in",
        )
        fq_w, fq_b = _fold(wq_h, bq_h, gamma, beta)
        fk_w, fk_b = _fold(wk_h, bk_h, gamma, beta)
        folded[layer] = bounds.spread_from_weights(
            fq_w, fk_w, sqrt_d, bias_q=fq_b, bias_k=fk_b, scale=model.scale, layout="out_in"
        )
    return HeadBounds(input_norm=input_norm, normalized_norm=sqrt_d, weight=weight, folded=folded)


@dataclass(frozen=True)
class LengthResult:
    r"""Measurements of every head at one sequence length :math:`n`.

    Arrays of shape (layers, heads) unless stated.

    Attributes
    ----------
    length : int
        :math:`n`, positions including ``[CLS]`` and ``[SEP]`` (every query attends to all).
    spread_max, spread_mean, spread_global : numpy.ndarray
        Largest and mean row spread, and the spread of all the head's logits pooled.
    spread_text : numpy.ndarray
        Largest row spread with the special tokens left out: the rows and keys of
        ``[CLS]`` (first) and ``[SEP]`` (last) dropped.
    norm_bound : numpy.ndarray
        :math:`2 s \max_i\lVert q_i\rVert \max_j\lVert k_j\rVert`
        (:func:`softmaxtheory.bounds.spread_from_norms` of the measured norms).
    max_coefficient : numpy.ndarray
        :math:`\max_{ij}\alpha_{ij}`.
    log_gap : numpy.ndarray
        :math:`\log(1 - \max_{ij}\alpha_{ij})`, computed from the logits without
        cancellation (it shows how close to 1 a saturated head gets).
    t1_bound : numpy.ndarray
        :func:`softmaxtheory.bounds.max_coefficient` at :math:`(n, \text{spread\_max})`.
    dispersion_size : numpy.ndarray of object (int)
        :func:`softmaxtheory.bounds.dispersion_size` at :math:`(1/2, \text{spread\_max})`.
    t1_ratio : numpy.ndarray
        :math:`\max_i \max_j\alpha_{ij} / \mathrm{T1}(n, \delta_i)`: at most 1 (row by row).
    input_norm_max, normalized_norm_max : numpy.ndarray, shape (layers,)
        Largest :math:`\lVert y\rVert` and :math:`\lVert z\rVert` over the tokens of each
        layer's input.
    """

    length: int
    spread_max: np.ndarray
    spread_mean: np.ndarray
    spread_global: np.ndarray
    spread_text: np.ndarray
    norm_bound: np.ndarray
    max_coefficient: np.ndarray
    log_gap: np.ndarray
    t1_bound: np.ndarray
    dispersion_size: np.ndarray
    t1_ratio: np.ndarray
    input_norm_max: np.ndarray
    normalized_norm_max: np.ndarray


def _top_coefficients(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Per row: :math:`\max_j \alpha_j` and :math:`\log(1 - \max_j \alpha_j)`.

    With :math:`m = \max_j x_j` and one top item :math:`t`,
    :math:`\max_j\alpha_j = 1/S` and :math:`1 - \max_j\alpha_j = O/S` where
    :math:`S = \sum_j e^{x_j - m}` and :math:`O = S - 1 = \sum_{j \ne t} e^{x_j - m}`;
    :math:`\log O` is a log-sum-exp over the other items, so the gap keeps its
    digits (and does not underflow) when the coefficient rounds to 1.
    """
    m = np.max(x, axis=-1, keepdims=True)
    y = x - m
    s = np.sum(np.exp(y), axis=-1)
    top = np.argmax(y, axis=-1)
    np.put_along_axis(y, top[..., None], -np.inf, axis=-1)
    m2 = np.max(y, axis=-1, keepdims=True)
    log_other = m2[..., 0] + np.log(np.sum(np.exp(y - m2), axis=-1))
    return 1.0 / s, log_other - np.log(s)


def _measure_length(
    model: MiniLM, ids: list[int], hb: HeadBounds, *, check: bool = True
) -> LengthResult:
    torch = require("torch", "torch")
    n = len(ids)
    with torch.no_grad():
        res = forward(model, [ids])
    shape = (model.layers, model.heads)
    out: dict[str, np.ndarray] = {
        k: np.empty(shape)
        for k in (
            "spread_max",
            "spread_mean",
            "spread_global",
            "spread_text",
            "norm_bound",
            "max_coefficient",
            "log_gap",
            "t1_bound",
            "t1_ratio",
        )
    }
    sizes = np.empty(shape, dtype=object)
    in_norm = np.empty(model.layers)
    z_norm = np.empty(model.layers)
    for layer in range(model.layers):
        x = _np64(res.logits[layer][0])  # (heads, n, n); float32 -> float64 is exact
        rows = bounds.empirical_spread(x)  # (heads, n)
        alpha, log_gap = _top_coefficients(x)  # (heads, n) each
        row_bound = bounds.max_coefficient(n, rows)  # certified, row by row
        out["spread_max"][layer] = rows.max(axis=-1)
        out["spread_mean"][layer] = rows.mean(axis=-1)
        out["spread_global"][layer] = bounds.empirical_spread(x, axis=(-2, -1))
        out["spread_text"][layer] = bounds.empirical_spread(x[:, 1:-1, 1:-1]).max(axis=-1)
        out["max_coefficient"][layer] = alpha.max(axis=-1)
        out["log_gap"][layer] = log_gap.min(axis=-1)
        out["t1_ratio"][layer] = (alpha / row_bound).max(axis=-1)
        # T1 is increasing in the spread and correctly rounded: the largest row bound is
        # the bound at the head's spread
        out["t1_bound"][layer] = row_bound.max(axis=-1)
        sizes[layer] = bounds.dispersion_size(EPS, out["spread_max"][layer])
        qn = np.linalg.norm(_np64(res.queries[layer][0]), axis=-1).max(axis=-1)
        kn = np.linalg.norm(_np64(res.keys[layer][0]), axis=-1).max(axis=-1)
        out["norm_bound"][layer] = bounds.spread_from_norms(qn, kn, model.scale)
        in_norm[layer] = np.linalg.norm(_np64(res.inputs[layer][0]), axis=-1).max()
        z_norm[layer] = np.linalg.norm(_np64(res.normalized[layer][0]), axis=-1).max()
    result = LengthResult(
        length=n,
        dispersion_size=sizes,
        input_norm_max=in_norm,
        normalized_norm_max=z_norm,
        **out,
    )
    if check:
        check_bounds(result, hb)
    return result


def check_bounds(result: LengthResult, hb: HeadBounds) -> None:
    r"""Raise :class:`BoundViolationError` if a measurement of `result` exceeds its bound.

    Checked: every row's largest coefficient against T1 at that row's spread
    (up to :data:`T1_SLACK`) and each head's against T1 at its spread; each
    head's spread against both T9 weight bounds (no slack) and against
    :math:`2s\max\lVert q\rVert\max\lVert k\rVert` (relative slack
    :math:`10^{-5}`: the norms and the logits are rounded separately); each
    layer's inputs against :math:`B_l` (no slack) and the normalized inputs
    against :math:`\sqrt d` (relative slack :math:`10^{-5}`: a computed
    :math:`z` is within rounding of norm :math:`\sqrt d`). The weight bounds
    exceed the measured values by orders of magnitude, far more than the
    forward pass's rounding (float32: relative ~1e-6).
    """

    def check(what: str, bad: np.ndarray) -> None:
        """Raise naming the first few offenders: (layer, head) masks, or (layer,) masks."""
        if not np.any(bad):
            return
        if bad.ndim == 1:
            where = ", ".join(f"layer {l_}" for (l_,) in np.argwhere(bad)[:5])
        else:
            where = ", ".join(f"layer {l_} head {h_}" for l_, h_ in np.argwhere(bad)[:5])
        raise BoundViolationError(f"n = {result.length}: {what} ({where})")

    check("a coefficient exceeds its row's T1 bound", result.t1_ratio > 1 + T1_SLACK)
    check(
        "a max coefficient exceeds the head's T1 bound",
        result.max_coefficient > result.t1_bound * (1 + T1_SLACK),
    )
    for name in ("weight", "folded"):
        check(f"a spread exceeds the {name} T9 bound", result.spread_max > getattr(hb, name))
    check("a spread exceeds 2 s max|q| max|k|", result.spread_max > result.norm_bound * (1 + 1e-5))
    check("a layer input exceeds B_l", result.input_norm_max > hb.input_norm)
    check(
        "a normalized input exceeds sqrt(d)",
        result.normalized_norm_max > hb.normalized_norm * (1 + 1e-5),
    )


@dataclass(frozen=True)
class Summary:
    r"""Statistics over the heads at one length (the largest of the run).

    Attributes
    ----------
    length : int
        The length summarised.
    heads : int
        Number of heads (72).
    mean, std, min, max, median : float
        Of the per-head spreads (``std`` with ``ddof=1``).
    dispersion_size : int
        :math:`n^\ast(1/2, \text{mean})`: T2's size at the mean spread.
    statistic : str
        Which per-head spread: ``"max"``, ``"mean"``, ``"global"`` or ``"text"``.
    """

    length: int
    heads: int
    statistic: str
    mean: float
    std: float
    min: float
    max: float
    median: float
    dispersion_size: int


def summarize(result: LengthResult, statistic: str = "max") -> Summary:
    """Mean ± std (ddof=1), range and median over heads of one per-head spread statistic.

    Parameters
    ----------
    result : LengthResult
        One length's measurements.
    statistic : {'max', 'mean', 'global', 'text'}
        Which per-head spread to summarise (the field ``spread_<statistic>``).

    Returns
    -------
    Summary
    """
    if statistic not in ("max", "mean", "global", "text"):
        raise ValueError(f"statistic must be 'max', 'mean', 'global' or 'text', got {statistic!r}")
    s = getattr(result, f"spread_{statistic}").ravel()
    mean = float(np.mean(s))
    return Summary(
        length=result.length,
        heads=int(s.size),
        statistic=statistic,
        mean=mean,
        std=float(np.std(s, ddof=1)),
        min=float(np.min(s)),
        max=float(np.max(s)),
        median=float(np.median(s)),
        dispersion_size=int(bounds.dispersion_size(EPS, mean)),
    )


@dataclass(frozen=True)
class Experiment:
    """A whole run: the text, the bounds, one :class:`LengthResult` per length.

    Attributes
    ----------
    text : TextSample
        The text the prefixes were taken from.
    dtype : str
        Precision of the forward pass.
    lengths : tuple of int
        The lengths, increasing.
    bounds : HeadBounds
        Weight bounds (length-independent).
    results : list of LengthResult
        In the order of `lengths`.
    layers, heads : int
        The model's shape.
    """

    text: TextSample
    dtype: str
    lengths: tuple[int, ...]
    bounds: HeadBounds
    results: list[LengthResult] = field(default_factory=list)
    layers: int = 6
    heads: int = 12

    @property
    def last(self) -> LengthResult:
        """The result at the largest length."""
        return self.results[-1]


def measure(
    model: MiniLM,
    tokenizer: Any,
    text: TextSample,
    lengths: Sequence[int],
    *,
    progress: Callable[[str], None] | None = None,
    check: bool = True,
) -> Experiment:
    """Run the model on prefixes of `text` and measure every head at every length.

    Parameters
    ----------
    model : MiniLM
        From :func:`~softmaxtheory.experiments.minilm.model.load_model`.
    tokenizer : tokenizers.Tokenizer
        From :func:`~softmaxtheory.experiments.minilm.model.load_tokenizer`.
    text : TextSample
        The text; it must have at least ``max(lengths) - 2`` tokens.
    lengths : sequence of int
        Positions per run (``[CLS]`` and ``[SEP]`` included), each in [3, 512].
    progress : callable, optional
        Called with a line of progress text.
    check : bool, default True
        Raise :class:`BoundViolationError` if a bound fails (see :func:`check_bounds`).

    Returns
    -------
    Experiment
    """
    lens = sorted(set(int(n) for n in lengths))
    if not lens:
        raise ValueError("lengths must not be empty")
    if lens[0] < 3 or lens[-1] > MAX_POSITIONS:
        raise ValueError(f"lengths must lie in [3, {MAX_POSITIONS}], got {lens}")
    say = progress or (lambda _line: None)
    say("bounding the spread of every head from its weights (T9)")
    hb = head_bounds(model)
    exp = Experiment(
        text=text,
        dtype=str(model.dtype).removeprefix("torch."),
        lengths=tuple(lens),
        bounds=hb,
        layers=model.layers,
        heads=model.heads,
    )
    for n in lens:
        ids = token_prefix(tokenizer, text.text, n)
        say(f"n = {n}: forward pass and {model.layers * model.heads * n} rows")
        exp.results.append(_measure_length(model, ids, hb, check=check))
    return exp
