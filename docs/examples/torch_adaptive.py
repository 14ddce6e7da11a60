"""A user's torch adaptive softmax and its tests (docs/testing.rst, part 2)."""

import torch

from softmaxtheory.testing import KernelMismatch, assert_adaptive_softmax_close

PAPER = (-0.037, 0.481, -2.3, 4.917, -1.791)


def adaptive_softmax(x):
    """softmax(beta(H) x), paper schedule, statistics in float32; zeros if fully masked."""
    xf = x.float()
    masked = torch.isneginf(xf).all(dim=-1, keepdim=True)
    z = xf - xf.amax(dim=-1, keepdim=True)
    p = torch.softmax(z, dim=-1)
    H = -(p * torch.log(p).nan_to_num(neginf=0.0)).sum(dim=-1, keepdim=True)
    P = torch.zeros_like(H)
    for c in PAPER:
        P = P * H + c
    beta = torch.where(H > 0.5, torch.clamp(P, min=1.0), torch.ones_like(H))
    return torch.where(masked, 0.0, torch.softmax(beta * z, dim=-1)).to(x.dtype)


def adaptive_softmax_no_clamp(x):
    """The same with a defect: beta = P(H) may fall below 1."""
    xf = x.float()
    z = xf - xf.amax(dim=-1, keepdim=True)
    p = torch.softmax(z, dim=-1)
    H = -(p * torch.log(p).nan_to_num(neginf=0.0)).sum(dim=-1, keepdim=True)
    P = torch.zeros_like(H)
    for c in PAPER:
        P = P * H + c
    beta = torch.where(H > 0.5, P, torch.ones_like(H))
    return torch.softmax(beta * z, dim=-1).to(x.dtype)


def test_adaptive_softmax_bfloat16():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(16, 64, generator=g) * 2).to(torch.bfloat16)
    report = assert_adaptive_softmax_close(adaptive_softmax(x), x)
    assert report.dtype == "bfloat16" and report.passed


def test_the_defect_is_caught():
    x = torch.zeros(1, 2, dtype=torch.float32)
    x[0, 1] = -0.5  # H = 0.66 nats: P(H) = 0.54 < 1
    try:
        assert_adaptive_softmax_close(adaptive_softmax_no_clamp(x), x)
    except KernelMismatch as exc:
        assert "beta = 1.0" in str(exc)
    else:
        raise AssertionError("the defect was not caught")
