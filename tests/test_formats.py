"""The vocabulary of ``softmaxtheory._formats`` against numpy's and torch's own tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from softmaxtheory import _formats as fm


@pytest.mark.parametrize("name", ["float64", "float32", "float16"])
def test_numpy_formats_match_finfo(name: str) -> None:
    f = fm.FORMATS[name]
    info = np.finfo(name)
    assert f.precision == info.nmant + 1
    assert f.u == float(info.eps) / 2
    assert f.tiny == float(info.smallest_normal)
    assert f.smallest_subnormal == float(info.smallest_subnormal)
    assert f.max_finite == float(info.max)
    assert f.storage == np.dtype(name)


def test_bfloat16_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    f = fm.FORMATS["bfloat16"]
    info = torch.finfo(torch.bfloat16)
    assert f.u == info.eps / 2
    assert f.tiny == info.smallest_normal
    assert f.max_finite == info.max
    sub = torch.tensor(f.smallest_subnormal, dtype=torch.float32).to(torch.bfloat16)
    assert float(sub) == f.smallest_subnormal
    assert float((sub / 2).to(torch.bfloat16)) == 0.0
    assert f.storage == np.dtype("float32")
    assert f.internal is fm.FORMATS["float32"]


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("float32", "float32"),
        (np.float16, "float16"),
        (np.dtype("float64"), "float64"),
        ("torch.bfloat16", "bfloat16"),
    ],
)
def test_format_named_accepts_every_spelling(spelling: object, name: str) -> None:
    assert fm.format_named(spelling).name == name


@pytest.mark.parametrize("bad", ["int32", "complex64", None, "float8"])
def test_format_named_names_the_argument(bad: object) -> None:
    with pytest.raises(ValueError, match="out_dtype must be float64, float32, float16 or bfloat16"):
        fm.format_named(bad, "out_dtype")


def test_default_dtype_and_literals() -> None:
    assert fm.default_dtype("numpy") == "float64"
    assert fm.default_dtype("torch") == "float32"
    with pytest.raises(ValueError, match="framework must be one of"):
        fm.default_dtype("jax")
    assert fm.DTYPES == tuple(fm.FORMATS)
    assert "adaptive_softmax" in fm.KINDS and "adaptive_softmax" in fm.QUANTITIES
    assert fm.THEOREMS[0] == "T1" and len(fm.THEOREMS) == 10
    assert math.isfinite(fm.FORMATS["bfloat16"].max_finite)


def test_row_codes_are_the_public_enum() -> None:
    from softmaxtheory.spec import RowKind

    assert [fm.ROW_REGULAR, fm.ROW_EMPTY, fm.ROW_MASKED, fm.ROW_INVALID] == [
        RowKind.REGULAR,
        RowKind.EMPTY,
        RowKind.MASKED,
        RowKind.INVALID,
    ]


def test_one_format_record_behind_the_reference_names() -> None:
    """``reference.BinaryFormat`` is the vocabulary's class, ``reference.FORMATS`` its records."""
    from softmaxtheory import reference

    assert reference.BinaryFormat is fm.Format is fm.BinaryFormat
    assert list(reference.FORMATS) == list(fm.NUMPY_DTYPES) == ["float64", "float32", "float16"]
    for name, fmt in reference.FORMATS.items():
        assert fmt is fm.FORMATS[name]
        assert fmt.dtype == np.dtype(name)  # the documented attributes of BinaryFormat
        assert fmt.qmin == int(np.log2(np.finfo(name).smallest_subnormal))
        assert 2.0**fmt.emax == float(np.finfo(name).max) / (2 - 2.0 ** (1 - fmt.precision))


def test_bfloat16_has_no_numpy_dtype() -> None:
    with pytest.raises(ValueError, match="bfloat16 has no numpy dtype"):
        _ = fm.FORMATS["bfloat16"].dtype


@pytest.mark.parametrize(
    ("args", "match"),
    [
        # (name, precision, emin, emax) by mistake: refused, not misread
        (("float64", 53, -1022, 1023), "qmin must be 2 - emax - precision = -1074, got -1022"),
        (("tiny", 1, 0, 1), "precision must be an int of at least 2, got 1"),
        (("odd", 11, 1, 0), "emax must be an int of at least 1, got 0"),
        (("odd", 11.0, -24, 15), "precision must be an int of at least 2, got 11.0"),
    ],
)
def test_format_validates_its_fields(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fm.BinaryFormat(*args)
