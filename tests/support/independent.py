"""An independent, deliberately naive evaluation at very high precision.

It shares no code with the reference: plain mpmath formulas under a scoped
``workprec`` far above what any rounding decision needs, then one rounding to
the target format through exact rationals (CPython's int/int division is
correctly rounded, subnormals included).
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np

PAPER = [Fraction(c) for c in ("-0.037", "0.481", "-2.3", "4.917", "-1.791")]


def round_to(value: mpmath.mpf, dtype) -> float:
    """Round an exact-enough mpf once to ``dtype`` (nearest, ties to even)."""
    if mpmath.isnan(value):
        return math.nan
    if value == 0:
        return 0.0
    if mpmath.mag(value) < -1200:  # far below every format's least subnormal: a signed zero
        return -0.0 if value < 0 else 0.0
    sign, man, exp, _ = value._mpf_  # value == (-1)**sign * man * 2**exp
    frac = (-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp)
    f64 = float(frac)  # correctly rounded to float64
    if np.dtype(dtype) == np.float64:
        return f64
    t = np.dtype(dtype).type
    top = Fraction(float(np.finfo(t).max))
    below = Fraction(float(np.nextafter(np.finfo(t).max, t(0))))
    if abs(frac) >= top + (top - below) / 2:  # the tie too: the largest float's last bit is odd
        return math.inf if frac > 0 else -math.inf
    best = None
    with np.errstate(over="ignore"):  # the largest float's upper neighbour is inf
        c = t(f64)
        cands = (np.nextafter(c, t(-np.inf)), c, np.nextafter(c, t(np.inf)))
    for cand in cands:
        if not np.isfinite(cand):
            continue
        d = abs(Fraction(float(cand)) - frac)
        bits = np.uint16 if t is np.float16 else np.uint32
        key = (d, int(np.frombuffer(cand.tobytes(), dtype=bits)[0]) & 1)
        if best is None or key < best[0]:
            best = (key, cand)
    return float(best[1])


def exact_row(
    x,
    *,
    prec: int = 2600,
    schedule_coeffs=PAPER,
    threshold=Fraction(1, 2),
    entropy_eps: float = 0.0,
):
    """Return (softmax, H, beta, adaptive) of one regular row as mpf lists at `prec` bits."""
    with mpmath.workprec(prec):
        xs = [mpmath.mpf(float(v)) for v in np.asarray(x, dtype=np.float64)]
        live = [v for v in xs if v != -mpmath.inf]
        m = max(live)
        e = [mpmath.exp(v - m) if v != -mpmath.inf else mpmath.mpf(0) for v in xs]
        s = mpmath.fsum(e)
        p = [ei / s for ei in e]
        if entropy_eps == 0.0:
            H = -mpmath.fsum(pi * mpmath.log(pi) for pi in p if pi != 0)
        else:
            eps = mpmath.mpf(entropy_eps)
            H = -mpmath.fsum(pi * mpmath.log(pi + eps) for pi in p)
        if H > mpmath.mpf(threshold.numerator) / threshold.denominator:
            P = mpmath.mpf(0)
            for c in schedule_coeffs:
                P = P * H + mpmath.mpf(c.numerator) / c.denominator
            beta = max(P, mpmath.mpf(1))
        else:
            beta = mpmath.mpf(1)
        ea = [mpmath.exp(beta * (v - m)) if v != -mpmath.inf else mpmath.mpf(0) for v in xs]
        sa = mpmath.fsum(ea)
        return p, H, beta, [ei / sa for ei in ea]
