"""CUDA checks of the torch path (run them with ``pytest -m cuda`` on a GPU machine)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from softmaxtheory.accelerated.torch import adaptive_attention, adaptive_softmax  # noqa: E402
from test_torch_tolerances import attention_tolerance  # noqa: E402

from softmaxtheory import reference as R  # noqa: E402, N812

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(dtype, L=40, S=37, D=64, mask_name="none"):
    g = torch.Generator().manual_seed(11)
    q = (torch.randn(2, 2, L, D, generator=g, dtype=torch.float64) * 1.5).to(dtype)
    k = (torch.randn(2, 2, S, D, generator=g, dtype=torch.float64) * 1.5).to(dtype)
    v = torch.randn(2, 2, S, 16, generator=g, dtype=torch.float64).to(dtype)
    keep = torch.rand(L, S, generator=g) > 0.5
    keep[3] = False
    keep[0, 0] = True
    mask = {"none": None, "causal": None, "bool": keep}.get(mask_name)
    if mask_name == "bias":
        mask = torch.randn(L, S, generator=g, dtype=torch.float64).to(dtype)
        mask[~keep] = -math.inf
    return q, k, v, mask


@pytest.mark.parametrize("backend", ["triton", "composition", "chunked"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias"])
def test_cuda_matches_reference(backend, dtype, mask_name):
    if backend == "triton":
        pytest.importorskip("triton")
    q, k, v, mask = _inputs(dtype, mask_name=mask_name)
    causal = mask_name == "causal"
    dev = [t.cuda() if t is not None else None for t in (q, k, v, mask)]
    with torch.no_grad():
        out = adaptive_attention(*dev[:3], dev[3], is_causal=causal, backend=backend)
    out = out.cpu().double().numpy()
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    keep = add = None
    if mask_name == "bool":
        keep = mask.numpy()
    elif mask_name == "bias":
        add = mask.double().numpy()
    elif causal:
        keep = np.tril(np.ones((*out.shape[-2:-1], k.shape[-2]), dtype=bool))
    ref = R.adaptive_attention(
        qd, kd, vd, mask=keep if mask_name == "bool" else add, is_causal=causal
    )
    tol = attention_tolerance(qd, kd, vd, ref, dtype, keep=keep, add=add)
    err = np.abs(out - ref)
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol)}"


def test_cuda_gradients_match_cpu():
    q, k, v, _ = _inputs(torch.float64, L=6, S=5, D=8)
    cpu_args = [t.clone().requires_grad_() for t in (q, k, v)]
    gpu_args = [t.cuda().requires_grad_() for t in (q, k, v)]
    g_cpu = torch.autograd.grad(adaptive_attention(*cpu_args).pow(2).sum(), cpu_args)
    g_gpu = torch.autograd.grad(adaptive_attention(*gpu_args).pow(2).sum(), gpu_args)
    for a, b in zip(g_cpu, g_gpu, strict=True):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_adaptive_softmax(dtype):
    x = (torch.randn(8, 300, dtype=torch.float64) * 4).to(dtype)
    out = adaptive_softmax(x.cuda()).cpu()
    ref = R.adaptive_softmax(x.double().numpy())
    assert (
        np.abs(out.double().numpy() - ref).max()
        <= 4
        * {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
        * 50
    )
