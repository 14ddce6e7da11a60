"""The one Ziv loop (``softmaxtheory._certify.loop``) and its one exception."""

from __future__ import annotations

import mpmath
import pytest
from mpmath import libmp

from softmaxtheory import reference
from softmaxtheory._certify import interval as ivl
from softmaxtheory._certify.loop import CertificationError, certify, precisions
from softmaxtheory.spec import Polynomial


def test_precisions_double_and_end_at_the_cap() -> None:
    assert list(precisions(100, 960)) == [100, 200, 400, 800, 960]
    assert list(precisions(64, 256)) == [64, 128, 256]
    assert list(precisions(2000, 960)) == [960]


@pytest.mark.parametrize(("start", "cap"), [(0, 960), (64, 0), (64.0, 960), (True, 960)])
def test_precisions_names_a_bad_argument(start: object, cap: object) -> None:
    with pytest.raises(ValueError, match=r"(start|cap) must be a positive int"):
        list(precisions(start, cap))  # type: ignore[arg-type]


def test_certify_returns_the_first_decision_and_keeps_state() -> None:
    seen: list[int] = []

    def attempt(p: int) -> str | None:
        seen.append(p)
        return "decided" if p >= 400 else None

    assert certify(attempt, start=100, cap=960) == "decided"
    assert seen == [100, 200, 400]


ERROR = reference.PrecisionError


def test_certify_raises_the_given_subclass_with_its_message() -> None:
    with pytest.raises(reference.PrecisionError) as info:
        certify(
            lambda p: None,
            start=100,
            cap=960,
            what="x",
            why="too close",
            error=reference.PrecisionError,
        )
    assert str(info.value) == "could not certify x within 960 bits: too close"


def test_interval_certify_raises_certification_error_at_its_cap() -> None:
    """An enclosure that never shrinks past a rounding boundary: the interval loop gives up."""
    straddle = (libmp.from_float(1.0), libmp.from_float(1.0 + 2.0**-52))
    with pytest.raises(CertificationError, match=f"within {ivl.MAX_PRECISION} bits"):
        ivl.certify(lambda prec: straddle, ivl.float_of)


def test_one_exception_for_the_interval_code_and_the_reference() -> None:
    """The reference's refusal is a CertificationError: one ``except`` catches both loops."""
    assert issubclass(reference.PrecisionError, CertificationError)
    assert ivl.CertificationError is CertificationError
    with mpmath.workprec(1400):
        log2 = mpmath.nstr(mpmath.log(2), 400, strip_zeros=False)
    jump = Polynomial(("2",), log2)  # within 2**-1000 of the entropy of [0, 0]
    with pytest.raises(CertificationError, match="could not certify the beta of a row of 2 items"):
        reference.beta([0.0, 0.0], schedule=jump)
