r"""Exact real-root isolation for polynomials with rational coefficients.

Polynomials are tuples of :class:`~fractions.Fraction`, highest degree first
(the order of :data:`softmaxtheory.spec.PAPER_COEFFICIENTS`). Roots are isolated
with a Sturm sequence and refined by bisection at dyadic points, all in exact
rational arithmetic, so every decision (the sign of a polynomial, the number of
roots in an interval) is a proof rather than a floating-point guess.
"""

from __future__ import annotations

from fractions import Fraction

__all__ = [
    "Poly",
    "count_roots",
    "derivative",
    "evaluate",
    "evaluate_range",
    "gcd",
    "isolate_roots",
    "refine",
    "root_bound",
    "squarefree",
]

Poly = tuple[Fraction, ...]


def _trim(p: Poly) -> Poly:
    i = 0
    while i < len(p) - 1 and p[i] == 0:
        i += 1
    return tuple(p[i:])


def evaluate(p: Poly, x: Fraction) -> Fraction:
    """:math:`p(x)` exactly (Horner)."""
    acc = Fraction(0)
    for c in p:
        acc = acc * x + c
    return acc


def evaluate_range(p: Poly, lo: Fraction, hi: Fraction) -> tuple[Fraction, Fraction]:
    r"""An enclosure of :math:`\{p(x) : lo \le x \le hi\}` by interval Horner (exact rationals)."""
    a = b = Fraction(0)
    for c in p:
        products = (a * lo, a * hi, b * lo, b * hi)
        a, b = min(products) + c, max(products) + c
    return a, b


def derivative(p: Poly) -> Poly:
    """The derivative of `p`."""
    d = len(p) - 1
    if d == 0:
        return (Fraction(0),)
    return _trim(tuple(c * (d - i) for i, c in enumerate(p[:-1])))


def _remainder(a: Poly, b: Poly) -> Poly:
    a = list(a)
    while len(a) >= len(b) and any(a):
        factor = a[0] / b[0]
        for i in range(len(b)):
            a[i] -= factor * b[i]
        a.pop(0)
    return _trim(tuple(a)) if a else (Fraction(0),)


def _divide(a: Poly, b: Poly) -> Poly:
    a = list(a)
    quotient = []
    while len(a) >= len(b):
        factor = a[0] / b[0]
        quotient.append(factor)
        for i in range(len(b)):
            a[i] -= factor * b[i]
        a.pop(0)
    return tuple(quotient) if quotient else (Fraction(0),)


def gcd(a: Poly, b: Poly) -> Poly:
    """A greatest common divisor of two polynomials, not both zero (Euclid, exact)."""
    a, b = _trim(a), _trim(b)
    while not (len(b) == 1 and b[0] == 0):
        a, b = b, _remainder(a, b)
    return a


def squarefree(p: Poly) -> Poly:
    r""":math:`p / \gcd(p, p')`: the same real roots, each simple."""
    p = _trim(p)
    if len(p) <= 2:
        return p
    a = gcd(p, derivative(p))
    if len(a) == 1:
        return p
    return _trim(_divide(p, a))


def _sturm(p: Poly) -> list[Poly]:
    seq = [p, derivative(p)]
    while len(seq[-1]) > 1 or seq[-1][0] != 0:
        r = _remainder(seq[-2], seq[-1])
        if len(r) == 1 and r[0] == 0:
            break
        seq.append(tuple(-c for c in r))
    return seq


def _sign_changes(seq: list[Poly], x: Fraction) -> int:
    changes = 0
    last = 0
    for q in seq:
        v = evaluate(q, x)
        if v != 0:
            s = 1 if v > 0 else -1
            if last and s != last:
                changes += 1
            last = s
    return changes


def count_roots(p: Poly, lo: Fraction, hi: Fraction) -> int:
    """Number of distinct real roots of `p` in :math:`(lo, hi]` (Sturm's theorem)."""
    seq = _sturm(p)
    return _sign_changes(seq, lo) - _sign_changes(seq, hi)


def root_bound(p: Poly) -> Fraction:
    """A power of two above the modulus of every root (Cauchy's bound)."""
    lead = abs(p[0])
    bound = 1 + max((abs(c) / lead for c in p[1:]), default=Fraction(0))
    power = Fraction(1)
    while power <= bound:
        power *= 2
    return power


def isolate_roots(p: Poly) -> tuple[Poly, list[tuple[Fraction, Fraction]]]:
    """Disjoint intervals :math:`(a, b]`, one per distinct real root of `p`, in increasing order.

    Returns the square-free part of `p` (to pass to :func:`refine`) and the
    intervals, whose end points are dyadic rationals. A non-zero constant has
    no roots.

    Raises
    ------
    ValueError
        For the zero polynomial (every number is a root).
    """
    p = _trim(p)
    if len(p) == 1:
        if p[0] == 0:
            raise ValueError("the zero polynomial has no isolated roots")
        return p, []
    p = squarefree(p)
    seq = _sturm(p)
    bound = root_bound(p)
    out: list[tuple[Fraction, Fraction]] = []
    stack = [(-bound, bound)]
    while stack:
        a, b = stack.pop()
        k = _sign_changes(seq, a) - _sign_changes(seq, b)
        if k == 0:
            continue
        if k == 1:
            out.append((a, b))
            continue
        mid = (a + b) / 2
        stack.append((mid, b))
        stack.append((a, mid))
    return p, sorted(out)


def refine(p: Poly, a: Fraction, b: Fraction) -> tuple[Fraction, Fraction]:
    """Halve the isolating interval :math:`(a, b]` of a root of the square-free `p`.

    Returns the half that holds the root; when the midpoint is the root, the
    point interval ``(mid, mid)``.
    """
    if a == b:
        return a, b
    mid = (a + b) / 2
    if evaluate(p, mid) == 0:
        return mid, mid
    if count_roots(p, a, mid) == 1:
        return a, mid
    return mid, b
