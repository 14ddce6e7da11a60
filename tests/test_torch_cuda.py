"""CUDA checks of the torch path (run them with ``pytest -m cuda`` on a GPU machine)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")


from softmaxtheory import reference as R  # noqa: E402, N812
from softmaxtheory.accelerated.torch import (  # noqa: E402
    adaptive_attention,
    adaptive_softmax,
    attention_entropy,
)
from tests.support.layouts import view  # noqa: E402
from tests.support.tiny_beta import (  # noqa: E402
    TINY_BETA_ROWS,
    TINY_BETA_SCHEDULES,
    tiny_beta_inputs,
)
from tests.test_torch_tolerances import attention_tolerance  # noqa: E402

#: The device of these tests (``SOFTMAXTHEORY_TEST_DEVICE=cpu`` runs their bodies on CPU, to
#: check the tests themselves on a machine without a GPU).
DEVICE = os.environ.get("SOFTMAXTHEORY_TEST_DEVICE", "cuda")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"
    ),
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
    if mask_name in ("keys", "key-bias"):  # key padding: one row, query stride 0 (MASK_ROWS)
        keep = keep[:1].reshape(1, 1, 1, S)
    mask = {"none": None, "causal": None, "bool": keep, "keys": keep}.get(mask_name)
    if mask_name in ("bias", "key-bias"):
        mask = torch.randn(keep.shape, generator=g, dtype=torch.float64).to(dtype)
        mask[~keep] = -math.inf
    return q, k, v, mask


#: The masks of the tests: none, causal, per entry, and per key (broadcast over the queries)
MASKS = ["none", "causal", "bool", "bias", "keys", "key-bias"]


@pytest.mark.parametrize("backend", ["auto", "hybrid", "triton", "composition", "chunked"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_name", MASKS)
def test_cuda_matches_reference(backend, dtype, mask_name):
    if backend == "triton":
        pytest.importorskip("triton")
    q, k, v, mask = _inputs(dtype, mask_name=mask_name)
    causal = mask_name == "causal"
    dev = [t.to(DEVICE) if t is not None else None for t in (q, k, v, mask)]
    with torch.no_grad():
        out = adaptive_attention(*dev[:3], dev[3], is_causal=causal, backend=backend)
    out = out.cpu().double().numpy()
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    keep = add = None
    shape = (*out.shape[-2:-1], k.shape[-2])  # (L, S): a key mask repeated over the rows
    if mask_name in ("bool", "keys"):
        keep = np.broadcast_to(mask.numpy(), (1, 1, *shape))[0, 0]
    elif mask_name in ("bias", "key-bias"):
        add = np.broadcast_to(mask.double().numpy(), (1, 1, *shape))[0, 0]
    elif causal:
        keep = np.tril(np.ones(shape, dtype=bool))
    ref = R.adaptive_attention(
        qd, kd, vd, mask=keep if mask_name in ("bool", "keys") else add, is_causal=causal
    )
    tol = attention_tolerance(qd, kd, vd, ref, dtype, keep=keep, add=add)
    err = np.abs(out - ref)
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol)}"


#: (case, operands made strided, scale, causal): the layouts and scales the fused kernels
#: do not take as given (each is copied or folded into the queries first)
ODD_CALLS = [
    ("strided q", "q", None, False),
    ("strided k v", "kv", None, True),
    ("scale 0 causal", "", 0.0, True),
    ("negative scale causal", "", -0.7, True),
    ("negative scale", "", -0.7, False),
]


@pytest.mark.parametrize("backend", ["auto", "hybrid", "triton", "composition"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ODD_CALLS, ids=[c[0] for c in ODD_CALLS])
def test_cuda_strided_operands_and_scales_that_are_not_positive(backend, dtype, case):
    """Views whose last dimension is not unit-stride and scales of 0 or below: the reference.

    D = Dv = 64, so that the composition and SDPA may pick flash or cuDNN, whose kernels
    assume both a unit stride and a positive scale.
    """
    if backend == "triton":
        pytest.importorskip("triton")
    _, strided, scale, causal = case
    g = torch.Generator().manual_seed(5)
    q, k, v = (
        (torch.randn(2, 2, n, 64, generator=g, dtype=torch.float64) * 1.5).to(dtype)
        for n in (40, 37, 37)
    )
    dev = [t.to(DEVICE) for t in (q, k, v)]
    dev = [view(t, "stepped") if name in strided else t for name, t in zip("qkv", dev, strict=True)]
    with torch.no_grad():
        out = adaptive_attention(*dev, is_causal=causal, scale=scale, backend=backend)
    out = out.cpu().double().numpy()
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    ref = R.adaptive_attention(qd, kd, vd, is_causal=causal, scale=scale)
    keep = np.tril(np.ones((40, 37), dtype=bool)) if causal else None
    tol = attention_tolerance(qd, kd, vd, ref, dtype, keep=keep, scale=scale)
    err = np.abs(out - ref)
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol)}"


def test_cuda_gradients_match_cpu():
    q, k, v, _ = _inputs(torch.float64, L=6, S=5, D=8)
    cpu_args = [t.clone().requires_grad_() for t in (q, k, v)]
    gpu_args = [t.to(DEVICE).requires_grad_() for t in (q, k, v)]
    g_cpu = torch.autograd.grad(adaptive_attention(*cpu_args).pow(2).sum(), cpu_args)
    g_gpu = torch.autograd.grad(adaptive_attention(*gpu_args).pow(2).sum(), gpu_args)
    for a, b in zip(g_cpu, g_gpu, strict=True):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_adaptive_softmax(dtype):
    x = (torch.randn(8, 300, dtype=torch.float64) * 4).to(dtype)
    out = adaptive_softmax(x.to(DEVICE)).cpu()
    ref = R.adaptive_softmax(x.double().numpy())
    assert (
        np.abs(out.double().numpy() - ref).max()
        <= 4
        * {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
        * 50
    )


def _reference_and_tol(q, k, v, mask, causal):
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    keep = add = None
    if mask is not None and mask.dtype == torch.bool:
        keep = mask.numpy()
    elif mask is not None:
        add = mask.double().numpy()
    elif causal:
        keep = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    ref = R.adaptive_attention(
        qd, kd, vd, mask=keep if keep is not None and not causal else add, is_causal=causal
    )
    return ref, attention_tolerance(qd, kd, vd, ref, q.dtype, keep=keep, add=add)


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias"])
@pytest.mark.parametrize("lengths", [(9, 9), (9, 13)], ids=["L=S", "L!=S"])
@pytest.mark.parametrize("gqa", [False, True], ids=["MHA", "GQA"])
def test_cuda_every_head_dim_runs(head_dim, dtype, mask_name, lengths, gqa):
    """No crash (no OutOfResources) at any head dim, dtype, mask, L = S or not, MHA or GQA
    (one key/value head shared by the query heads); within the tolerance."""
    L, S = lengths
    q, k, v, mask = _inputs(dtype, L=L, S=S, D=head_dim, mask_name=mask_name)
    if gqa:
        k, v = k[:, :1], v[:, :1]
        with torch.no_grad():
            h, _ = attention_entropy(
                q.to(DEVICE), k.to(DEVICE), None if mask is None else mask.to(DEVICE),
                mask_name == "causal", enable_gqa=True,
            )  # fmt: skip
        assert torch.isfinite(h).all()
    causal = mask_name == "causal"
    dev = [t.to(DEVICE) if t is not None else None for t in (q, k, v, mask)]
    if gqa:
        k, v = (t.expand(-1, q.shape[1], -1, -1) for t in (k, v))
    ref, tol = _reference_and_tol(q, k, v, mask, causal)
    with torch.no_grad():
        # the all-Triton forward too where shared memory runs short (its compiles are the
        # slow part of this test on a GPU)
        for backend in ("auto", "triton") if head_dim >= 128 else ("auto",):
            out = adaptive_attention(
                *dev[:3], dev[3], is_causal=causal, enable_gqa=gqa, backend=backend
            )
            err = np.abs(out.cpu().double().numpy() - ref)
            assert np.all(err <= tol), f"{backend}: max err/tol {np.max(err / tol)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("gqa", [False, True], ids=["MHA", "GQA"])
def test_cuda_attention_entropy(dtype, mask_name, gqa):
    """The Triton pass 1 on CUDA: entropy and LSE of the float64 logits (GQA: shared keys)."""
    q, k, _, mask = _inputs(dtype, mask_name=mask_name)
    if gqa:
        k = k[:, :1]
    causal = mask_name == "causal"
    with torch.no_grad():
        h, lse = attention_entropy(
            q.to(DEVICE), k.to(DEVICE), None if mask is None else mask.to(DEVICE), causal,
            enable_gqa=gqa,
        )  # fmt: skip
    kd = k.double().expand(-1, q.shape[1], -1, -1)
    x = (q.double() / math.sqrt(q.shape[-1])) @ kd.transpose(-1, -2)
    L, S = x.shape[-2:]
    if causal:
        x = x.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), -math.inf)
    elif mask is not None and mask.dtype == torch.bool:
        x = x.masked_fill(~mask, -math.inf)
    elif mask is not None:
        x = torch.where(mask == -math.inf, torch.full_like(x, -math.inf), x + mask.double())
    live = torch.isfinite(x).any(-1)
    ref_h = torch.zeros_like(h.cpu().double())
    ref_h[live] = torch.as_tensor(R.entropy(x[live].numpy()))
    u = 2.0**-24
    a = (q.double().abs() / math.sqrt(q.shape[-1])) @ kd.abs().transpose(-1, -2)
    finite = x.where(torch.isfinite(x), 0).abs()
    tol = 2 * q.shape[-1] * u * a.amax(-1) + 2 * S * u * (2 + finite.amax(-1)) + 4 * u
    assert torch.all((h.cpu().double() - ref_h).abs() <= tol)
    ref_lse = torch.logsumexp(x, -1)
    assert torch.all(
        (lse.cpu().double() - ref_lse)[live].abs() <= tol[live] * (1 + ref_lse.abs()[live])
    )
    assert torch.all(lse.cpu()[~live] == -math.inf) and torch.all(h.cpu()[~live] == 0)


#: Under the interpreter (SOFTMAXTHEORY_TEST_DEVICE=cpu) numpy warns where pass 1, queued
#: before the scan shows the operands too large for its variant, overflows (its result is
#: dropped); a GPU computes the same infinities silently.
EARLY_PASS_ONE_WARNINGS = pytest.mark.filterwarnings(
    "ignore:(overflow|invalid value) encountered:RuntimeWarning"
)


@EARLY_PASS_ONE_WARNINGS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("e", [20, 33, 60])
def test_cuda_pass_one_large_logits(dtype, e):
    """Logits of magnitude 2**e (ties included) through attention_entropy, with its pass 1
    queued before the scan and without: the log-sum-exp and entropy of float64 logits.
    Past 2**29 the kernel scales each product before the row maximum (raw_products)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 33, 64, generator=g).to(dtype)
    k = torch.randn(2, 3, 40, 64, generator=g)
    k = (torch.cat([k, k[..., :8, :]], dim=-2) * 2.0**e).to(dtype)
    x = (q.double() / 8) @ k.double().transpose(-1, -2)
    ref_h, ref_lse = torch.as_tensor(R.entropy(x.numpy())), torch.logsumexp(x, -1)
    tol = 2.0**-18 * 64 * x.abs().amax(-1)  # 64 products of relative error 2**-24 each
    for grad in (False, True):
        qd, kd = (t.to(DEVICE).requires_grad_(grad) for t in (q, k))
        h, lse = attention_entropy(qd, kd)
        assert torch.all((lse.detach().cpu().double() - ref_lse).abs() <= tol)
        # rows are one-hot or tied at these sizes; near 2**20 the tie's neighbours count
        h_tol = 1e-3 if e > 20 else 1e-2
        assert torch.all((h.detach().cpu().double() - ref_h).abs() <= h_tol)


@EARLY_PASS_ONE_WARNINGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_overflow_and_zero_sizes(dtype):
    """The reference's numbers on CUDA: overflowing spreads, and every zero-size dimension."""
    big = torch.finfo(dtype).max / 2
    x = torch.tensor([big, -big], dtype=dtype, device=DEVICE)
    assert adaptive_softmax(x).cpu().tolist() == [1.0, 0.0]
    q = torch.ones(1, 1, 1, 16, dtype=dtype, device=DEVICE)
    k = torch.zeros(1, 1, 3, 16, dtype=dtype, device=DEVICE)
    k[..., 0] = torch.tensor([big, -big, big], dtype=dtype)
    v = torch.tensor([1.0, 2.0, 4.0], dtype=dtype, device=DEVICE).reshape(1, 1, 3, 1)
    with torch.no_grad():
        for backend in ("auto", "hybrid", "triton", "composition", "chunked"):
            out = adaptive_attention(q, k, v, scale=1.0, backend=backend)
            assert out.cpu().double().item() == pytest.approx(2.5, rel=1e-2), backend
    for qs, ks in (((0, 3, 4), (0, 5, 4)), ((2, 0, 4), (2, 5, 4)), ((2, 3, 4), (2, 0, 4))):
        q = torch.ones(qs, dtype=dtype, device=DEVICE)
        k = torch.ones(ks, dtype=dtype, device=DEVICE)
        v = torch.ones(*ks[:-1], 2, dtype=dtype, device=DEVICE)
        out = adaptive_attention(q, k, v)
        assert out.shape == (*qs[:-1], 2) and torch.all(out == 0)
        h, lse = attention_entropy(q, k)
        assert h.shape == lse.shape == qs[:-1]


#: Agreement of gradients with float64 autograd on CPU, relative to the largest reference
#: gradient (an empirical consistency bound, as in test_triton_interpret.py).
GRAD_RTOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2}


def _grads(q, k, v, mask, causal, w, detach_beta, backend="auto"):
    args = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = adaptive_attention(*args, mask, causal, detach_beta=detach_beta, backend=backend)
    return torch.autograd.grad((out.double() * w).sum(), args)


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias"])
def test_cuda_backward_matches_cpu_float64(head_dim, dtype, mask_name):
    """Forward + backward on CUDA (Triton pass 1 and its backward with beta attached; SDPA's
    backward alone with detach_beta=True) against float64 autograd of the chunked path."""
    q, k, v, mask = _inputs(dtype, L=19, S=23, D=head_dim, mask_name=mask_name)
    if mask is not None and mask.dtype == torch.bool:
        mask[3, 0] = True  # no fully masked query: its LSE would be -inf on both sides
    elif mask is not None:
        mask[3, 0] = 0.5
    causal = mask_name == "causal"
    w = torch.randn(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    md = None if mask is None else (mask if mask.dtype == torch.bool else mask.double())
    dev = [t.to(DEVICE) if t is not None else None for t in (q, k, v, mask)]
    for detach in (False, True):
        got = _grads(*dev, causal, w.to(DEVICE), detach)
        ref = _grads(q.double(), k.double(), v.double(), md, causal, w, detach, "chunked")
        for name, a, b in zip("qkv", got, ref, strict=True):
            err = float((a.cpu().double() - b).abs().max())
            scale = float(b.abs().max())
            assert err <= GRAD_RTOL[dtype] * scale, f"d{name} detach={detach}: {err} vs {scale}"


def _float64_through_the_kernels(mask_name, monkeypatch):
    """(entropy, attention, args): float64 functions whose pass 1 runs in Triton (forced)."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812

    monkeypatch.setattr(A, "_TRITON_FLOAT64", True)
    q, k, v, mask = _inputs(torch.float64, L=5, S=6, D=4, mask_name=mask_name)
    q, k, v = q[:1], k[:1, :1], v[:1, :1, :, :2]
    if mask is not None:
        mask[3, 0] = True if mask.dtype == torch.bool else 0.5
        mask[:, 0] = True if mask.dtype == torch.bool else mask[:, 0].clamp(min=-1.0)
    causal = mask_name == "causal"
    dev = [t.to(DEVICE) if t is not None else None for t in (q, k, v, mask)]
    args = tuple(t.clone().requires_grad_() for t in dev[:3])

    def entropy(a, b):
        return attention_entropy(a, b, dev[3], causal, enable_gqa=True)

    def attention(a, b, c):
        b, c = (t.expand(-1, a.shape[1], -1, -1) for t in (b, c))
        return adaptive_attention(a, b, c, dev[3], causal)

    return entropy, attention, args


@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias"])
def test_cuda_gradcheck_float64_through_the_kernels(mask_name, monkeypatch):
    """float64 gradcheck on CUDA of attention_entropy (GQA) and of adaptive attention with beta
    attached, both through the Triton pass 1 and its backward (forced for float64)."""
    entropy, attention, args = _float64_through_the_kernels(mask_name, monkeypatch)
    assert torch.autograd.gradcheck(entropy, args[:2], fast_mode=True)
    assert torch.autograd.gradcheck(attention, args, fast_mode=True)


@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias"])
def test_cuda_second_derivatives_float64_through_the_kernels(mask_name, monkeypatch):
    """gradgradcheck of the same: pass 1 forward in Triton, the backward recorded
    (``create_graph=True``) in torch; the entropy's was silently zero before. Attention's pass 2
    is SDPA's, which may lack a second derivative: then SDPA's own error, nothing else."""
    entropy, attention, args = _float64_through_the_kernels(mask_name, monkeypatch)
    assert torch.autograd.gradgradcheck(entropy, args[:2], fast_mode=True)
    try:
        assert torch.autograd.gradgradcheck(attention, args, fast_mode=True)
    except RuntimeError as exc:
        assert "not implemented" in str(exc) and "scaled_dot_product" in str(exc), exc


@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias"])
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_cuda_transforms_take_torch_operations(mask_name):
    """vmap, jvp and vmap(grad) on the device (float32, backend "auto"): the Triton kernels and
    the out= kernel cannot take wrapped tensors, so the paths route around them; the results
    equal the loop over slices and reverse mode."""
    q, k, v, mask = _inputs(torch.float32, L=9, S=7, D=16, mask_name=mask_name)
    q, k, v, mask = (t.to(DEVICE) if t is not None else None for t in (q, k, v, mask))
    causal = mask_name == "causal"

    def f(a, b, c):
        return adaptive_attention(a, b, c, mask, causal)

    def fe(a, b):
        return attention_entropy(a, b, mask, causal)[0]

    loop = torch.stack([f(q[i], k[i], v[i]) for i in range(q.shape[0])])
    torch.testing.assert_close(torch.func.vmap(f)(q, k, v), loop, rtol=1e-5, atol=1e-6)
    loop = torch.stack([fe(q[i], k[i]) for i in range(q.shape[0])])
    torch.testing.assert_close(torch.func.vmap(fe)(q, k), loop, rtol=1e-5, atol=1e-5)
    tangents = tuple(torch.randn_like(t) for t in (q, k, v))
    out, jvp = torch.func.jvp(f, (q, k, v), tangents)
    # the dot-product test: <w, J t> = <J^T w, t> (reverse mode on the normal path)
    w = torch.randn_like(out)
    args = tuple(t.clone().requires_grad_() for t in (q, k, v))
    vjp = torch.autograd.grad(f(*args), args, w)
    lhs = (w.double() * jvp.double()).sum()
    rhs = sum((a.double() * t.double()).sum() for a, t in zip(vjp, tangents, strict=True))
    assert abs(float(lhs - rhs)) <= 1e-4 * (1 + abs(float(rhs))), (float(lhs), float(rhs))
    per_sample = torch.func.vmap(torch.func.grad(lambda a, b, c: f(a, b, c).square().sum()))
    got = per_sample(q, k, v)
    for i in range(q.shape[0]):
        a = q[i].clone().requires_grad_()
        (want,) = torch.autograd.grad(f(a, k[i], v[i]).square().sum(), a)
        torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-5)


def test_cuda_beta_kernel_equals_torch():
    """On the device, the polynomial schedule's β kernel (compiled without multiply-add
    contraction) equals torch's elementwise float64 Horner steps bit for bit; so the hybrid
    without a gradient (the kernel's β) equals the hybrid with one (torch's)."""
    from softmaxtheory.accelerated._torch_attention import triton_available
    from softmaxtheory.accelerated._torch_common import beta_from_entropy
    from softmaxtheory.spec import PaperPolynomial, Polynomial

    device = torch.device(DEVICE)
    if not triton_available(device):
        pytest.skip("the Triton kernels do not run on this device here")
    from softmaxtheory.accelerated._triton_beta import triton_polynomial_beta

    g = torch.Generator().manual_seed(3)
    h = (torch.rand(8, 16, 2048, generator=g, dtype=torch.float64) * 9).to(device)
    one = torch.ones((), device=device)
    for schedule in (PaperPolynomial(), Polynomial(("0.3", "0.9"), threshold="0.2")):
        for dtype in (torch.float32, torch.float64):
            ref = beta_from_entropy(schedule, h.to(dtype), one).to(dtype)
            assert torch.equal(triton_polynomial_beta(schedule, h.to(dtype), dtype), ref)
    for mask_name in ("bias", "causal"):
        q, k, v, mask = _inputs(torch.bfloat16, mask_name=mask_name)
        q, k, v = (t.to(device) for t in (q, k, v))
        mask = None if mask is None else mask.to(device)
        causal = mask_name == "causal"
        with torch.no_grad():
            plain = adaptive_attention(q, k, v, mask, is_causal=causal)
        graded = adaptive_attention(q.clone().requires_grad_(), k, v, mask, is_causal=causal)
        assert torch.equal(plain, graded.detach()), mask_name


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_cuda_more_batch_heads_than_a_grid_axis_holds(backend):
    """B * H = 65552 batch-heads: the kernels once put them on the second grid axis, which
    ends at 65535 on CUDA (a launch error); their grid is 1-d now. The values equal the
    chunked torch path's; pass 1 and its backward run too. (Under the interpreter, the body
    runs on 3 * 16 batch-heads.)"""
    B = 4097 if DEVICE == "cuda" else 3
    g = torch.Generator().manual_seed(23)
    q, k, v = (torch.randn(B, 16, 9, 16, generator=g).to(torch.bfloat16).to(DEVICE)
               for _ in range(3))  # fmt: skip
    with torch.no_grad():
        got = adaptive_attention(q, k, v, is_causal=True, backend=backend)
        want = adaptive_attention(q, k, v, is_causal=True, backend="chunked")
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2**-6)
    qg, kg = q.float().requires_grad_(), k.float().requires_grad_()
    h, _ = attention_entropy(qg, kg, is_causal=True)
    h.sum().backward()
    qc, kc = q.float().cpu().requires_grad_(), k.float().cpu().requires_grad_()
    hc, _ = attention_entropy(qc, kc, is_causal=True)
    hc.sum().backward()
    torch.testing.assert_close(h.cpu(), hc, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(qg.grad.cpu(), qc.grad, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(kg.grad.cpu(), kc.grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("backend", ["auto", "hybrid", "triton"])
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=str)
def test_cuda_autocast_computes_as_sdpa_does(backend, low):
    """Under ``torch.autocast``, float32 operands are cast to its dtype (SDPA's rule) and
    the call equals the one on the cast operands; autocast is off inside."""
    g = torch.Generator().manual_seed(29)
    q, k, v = (torch.randn(2, 4, 33, 64, generator=g).to(DEVICE) for _ in range(3))
    with torch.no_grad():
        with torch.autocast(q.device.type, dtype=low):
            out = adaptive_attention(q, k, v, is_causal=True, backend=backend)
            h, _ = attention_entropy(q, k, is_causal=True)
        want = adaptive_attention(q.to(low), k.to(low), v.to(low), is_causal=True,
                                  backend=backend)  # fmt: skip
        h_low, _ = attention_entropy(q.to(low), k.to(low), is_causal=True)
    assert out.dtype == low and torch.equal(out, want)
    assert torch.equal(h, h_low)


@pytest.mark.parametrize("sname", list(TINY_BETA_SCHEDULES))
@pytest.mark.parametrize("row", list(TINY_BETA_ROWS))
@pytest.mark.parametrize("backend", ["auto", "hybrid", "triton", "composition", "chunked"])
def test_cuda_tiny_beta_with_shifts_beyond_the_float32_range(sname, row, backend):
    """β from 1e-37 to below the least float32 subnormal with logits ±3e38 (a shift of
    -6e38): the reference's outputs for the exact β, strictly. On a GPU this also checks
    that no kernel flushes a subnormal β (or β·(x − m)) to zero."""
    from softmaxtheory.testing import assert_attention_close

    q, k, v = tiny_beta_inputs(row, DEVICE)
    schedule = TINY_BETA_SCHEDULES[sname]
    got = adaptive_attention(q, k, v, scale=1.0, schedule=schedule, backend=backend)
    assert got.device.type == q.device.type
    assert_attention_close(got.cpu(), (q.cpu(), k.cpu(), v.cpu()), scale=1.0,
                           schedule=schedule, strict=True)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "case",
    ["narrow values", "values of 3", "head dim 12", "bool mask", "bias", "causal", "offset rows"],
)
@pytest.mark.filterwarnings("ignore::UserWarning")  # (Dynamo's notes on the host reads)
def test_cuda_compiled_composition_takes_no_kernel_that_refuses(dtype, case):
    """Compiled, the composition's fused calls cannot fall back on a refusal (the compiled
    graph raises it past the ``try``): the memory-efficient kernel is sent only what it takes
    (a mask padded to aligned rows: S = 37 here), cuDNN is skipped, and head sizes it would
    refuse take the chunked path. The values lie within the derived bound of the reference."""
    D, Dv, mask_name = 64, 64, "none"
    if case == "narrow values":
        Dv = 16
    elif case == "values of 3":
        Dv = 3
    elif case == "head dim 12":
        D = Dv = 12
    elif case in ("bool mask", "bias", "causal"):
        mask_name = {"bool mask": "bool", "bias": "bias", "causal": "causal"}[case]
    q, k, v, mask = _inputs(dtype, D=D, mask_name=mask_name)
    v = torch.randn(*v.shape[:-1], Dv, generator=torch.Generator().manual_seed(2)).to(dtype)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.masked_fill(mask != -math.inf, 0.0)  # 0 / -inf: the composition takes it
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    if case == "offset rows":  # rows of 68 elements, starting 4 into the buffer
        wide = torch.zeros(*q.shape[:-1], D + 4, dtype=dtype, device=DEVICE)
        wide[..., 4:] = q
        q = wide[..., 4:]
    mask = None if mask is None else mask.to(DEVICE)
    causal = mask_name == "causal"

    def fn(q, k, v):
        return adaptive_attention(q, k, v, mask, is_causal=causal, backend="composition")

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(fn, backend="eager")(q, k, v).cpu().double().numpy()
    qd, kd, vd = (t.cpu().double().numpy() for t in (q, k, v))
    keep = add = None
    if mask is not None and mask.dtype == torch.bool:
        keep = mask.cpu().numpy()
    elif mask is not None:
        add = mask.cpu().double().numpy()
    ref = R.adaptive_attention(qd, kd, vd, mask=add if keep is None else keep, is_causal=causal)
    if causal:
        keep = np.tril(np.ones(ref.shape[-2:-1] + k.shape[-2:-1], dtype=bool))
    tol = attention_tolerance(qd, kd, vd, ref, dtype, keep=keep, add=add)
    err = np.abs(out - ref)
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol)}"


def test_cuda_warm_up_before_timing():
    """The benchmark keeps the device busy for a while before its first case (clocks)."""
    from softmaxtheory.bench.torch import warm_device

    spent = warm_device(torch, DEVICE, 0.2)
    assert spent >= 0.2 if DEVICE == "cuda" else spent == 0.0
