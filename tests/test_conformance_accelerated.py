"""No false alarms on the library's own kernels (Numba CPU and torch)."""

from __future__ import annotations

import pytest

from softmaxtheory import conformance as conf


def _conforms(path, **kw):
    kernel, name = conf.load_kernel(path)
    results = conf.run_conformance(conf.Target(kernel, name, **kw))
    failed = [r for r in results if r.status == "fail"]
    assert not failed, "\n\n".join(f"{r.name}: {r.message}" for r in failed)
    assert any(r.status == "pass" for r in results)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    ("func", "kind"),
    [("softmax", "softmax"), ("entropy", "entropy"), ("adaptive_softmax", "adaptive_softmax")],
)
def test_numba_kernels_conform(func, kind, dtype):
    pytest.importorskip("numba")
    _conforms(f"softmaxtheory.accelerated.cpu:{func}", kind=kind, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_numba_attention_conforms(dtype):
    # float16 failed every property: the kernel returned float32 for float16 input (its
    # float32 path: test_attention_float32_path_is_float32_accurate, with the oracle)
    pytest.importorskip("numba")
    _conforms("softmaxtheory.accelerated.cpu:adaptive_attention", kind="attention", dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_torch_adaptive_softmax_conforms(dtype):
    pytest.importorskip("torch")
    _conforms(
        "softmaxtheory.accelerated.torch:adaptive_softmax",
        kind="adaptive_softmax",
        framework="torch",
        dtype=dtype,
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_torch_attention_conforms(dtype):
    pytest.importorskip("torch")
    _conforms(
        "softmaxtheory.accelerated.torch:adaptive_attention",
        kind="attention",
        framework="torch",
        dtype=dtype,
    )
