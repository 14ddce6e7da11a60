"""A user's numpy softmax kernel and its tests (docs/testing.rst, part 1)."""

import numpy as np

from softmaxtheory.testing import assert_entropy_close, assert_softmax_close


def softmax(x):
    """Softmax along the last axis; -inf entries are masked."""
    x = np.asarray(x)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def entropy(x):
    """Entropy (nats) of the softmax of each row, as log s - t/s; 0 for a fully masked row."""
    x = np.asarray(x)
    m = np.max(x, axis=-1, keepdims=True)
    z = x - np.where(m == -np.inf, 0.0, m)  # a fully masked row stays -inf
    e = np.exp(z)
    s = np.sum(e, axis=-1)
    t = np.sum(np.where(e > 0, e * z, 0.0), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s == 0, 0.0, np.log(s) - t / s).astype(x.dtype)


def test_softmax_float32():
    x = np.random.default_rng(0).normal(0.0, 4.0, (8, 1000)).astype(np.float32)
    report = assert_softmax_close(softmax(x), x)
    assert report.max_ulp < 32  # the measured error is returned, not hidden


def test_entropy_float64():
    x = np.random.default_rng(1).normal(0.0, 2.0, (4, 300))
    assert_entropy_close(entropy(x), x)
