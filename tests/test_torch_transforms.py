"""Second derivatives and ``torch.func`` transforms of the torch path.

A gradient penalty, a Hessian-vector product, ``torch.autograd.functional.jvp``
(which differentiates a recorded backward), per-sample gradients
(``vmap(grad(...))``) and forward-mode AD all reach the attention functions
through routes the first-order tests never take. Before these tests:

- the pass-1 backward was ``once_differentiable``: under ``create_graph=True`` a
  gradient of :func:`attention_entropy` came back without a graph, so its second
  derivative was silently zero (``torch.autograd.functional.jvp`` off by 0.7), and
  the hybrid backend's with it;
- ``vmap`` stopped at the host read of the operands' maxima ("Cannot access data
  pointer of Tensor that doesn't have storage");
- forward-mode AD stopped at the ``out=`` kernel of the β-scaled queries.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.autograd import forward_ad  # noqa: E402

from softmaxtheory.accelerated import _torch_attention  # noqa: E402
from softmaxtheory.accelerated.torch import (  # noqa: E402
    adaptive_attention,
    adaptive_softmax,
    attention_entropy,
)
from softmaxtheory.spec import PaperPolynomial, Schedule  # noqa: E402

#: torch's first forward-mode AD of a process scripts its jvp decompositions with
#: torch.jit.script, which torch 2.13 itself reports as deprecated
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning"
)

BACKENDS = ["auto", "hybrid", "composition", "chunked"]
MASKS = ["none", "causal", "bool", "bias"]


def _inputs(mask_name: str = "none", B: int = 2, H: int = 2, Hkv: int = 2, L: int = 3, S: int = 5):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, H, L, 4, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, 4, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, 3, generator=g, dtype=torch.float64)
    keep = torch.rand(L, S, generator=g) > 0.4
    keep[:, 0] = True
    kw: dict = {"enable_gqa": Hkv != H}
    if mask_name == "causal":
        kw["is_causal"] = True
    elif mask_name == "bool":
        kw["attn_mask"] = keep
    elif mask_name == "bias":
        bias = torch.randn(L, S, generator=g, dtype=torch.float64)
        kw["attn_mask"] = bias.masked_fill(~keep, -math.inf)
    return q, k, v, kw


def _attention(backend: str, kw: dict, detach_beta: bool = False):
    def f(q, k, v):
        if kw.get("enable_gqa"):  # the fused backends repeat heads themselves; keep one path
            g = q.shape[-3] // k.shape[-3]
            k, v = (t.repeat_interleave(g, dim=-3) for t in (k, v))
        args = {key: val for key, val in kw.items() if key != "enable_gqa"}
        return adaptive_attention(q, k, v, backend=backend, detach_beta=detach_beta, **args)

    return f


def _entropy(kw: dict):
    return lambda q, k: attention_entropy(q, k, **kw)[0]


def _tangents(*tensors):
    g = torch.Generator().manual_seed(9)
    return tuple(torch.randn(t.shape, generator=g, dtype=t.dtype) for t in tensors)


def _grad_args(*tensors):
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


def _sdpa_second_derivative_error(q, k, v, kw) -> str | None:
    """torch's error for SDPA's own second derivative at these inputs, or None if it has one."""
    mask = kw.get("attn_mask")
    args = _grad_args(q, k, v)

    def sdpa(a, b, c):
        return torch.nn.functional.scaled_dot_product_attention(
            a, b, c, mask, 0.0, kw.get("is_causal", False)
        )

    try:
        torch.autograd.gradgradcheck(sdpa, args, fast_mode=True)
    except RuntimeError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------- second derivatives


@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("gqa", [False, True], ids=["MHA", "GQA"])
def test_entropy_second_derivative(mask_name, gqa):
    """gradgradcheck of attention_entropy (float64): the pass-1 backward under
    ``create_graph=True`` is recorded, with respect to q, k and the row gradients."""
    q, k, _, kw = _inputs(mask_name, Hkv=1 if gqa else 2)
    assert torch.autograd.gradgradcheck(_entropy(kw), _grad_args(q, k))


def test_entropy_gradient_has_a_graph_under_create_graph():
    """The gradient penalty's route: the gradient of the entropy must carry a graph, and
    the penalty's gradient equal the one of the entropy written in plain torch."""
    q, k, _, _ = _inputs()
    a, b = _grad_args(q, k)
    (gq,) = torch.autograd.grad(attention_entropy(a, b)[0].sum(), a, create_graph=True)
    assert gq.grad_fn is not None
    (got,) = torch.autograd.grad((gq**2).sum(), a)

    def plain(q, k):
        x = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return -(torch.softmax(x, -1) * torch.log_softmax(x, -1)).sum(-1)

    a2, b2 = _grad_args(q, k)
    (gq2,) = torch.autograd.grad(plain(a2, b2).sum(), a2, create_graph=True)
    (want,) = torch.autograd.grad((gq2**2).sum(), a2)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_name", MASKS)
def test_attention_second_derivative(backend, mask_name):
    """gradgradcheck of adaptive_attention with β attached (float64). The chunked path is
    plain torch and always has one; the fused ones run pass 2 on SDPA and may only lack one
    where SDPA itself does, with SDPA's error."""
    q, k, v, kw = _inputs(mask_name)
    f = _attention(backend, kw)
    try:
        ok = torch.autograd.gradgradcheck(f, _grad_args(q, k, v), fast_mode=True)
    except RuntimeError as exc:
        sdpa = _sdpa_second_derivative_error(q, k, v, kw)
        assert backend != "chunked" and sdpa is not None and str(exc) == sdpa, (exc, sdpa)
    else:
        assert ok


@pytest.mark.parametrize("backend", ["auto", "hybrid", "composition"])
@pytest.mark.parametrize("mask_name", MASKS)
def test_detached_beta_second_derivative_is_the_chunked_ones(backend, mask_name):
    """With ``detach_beta=True`` the gradient holds β constant, so it is no function's
    derivative and gradgradcheck cannot apply; every backend must still record the same
    second derivative (β constant throughout) as the plain-torch chunked path."""
    q, k, v, kw = _inputs(mask_name)
    u = _tangents(q)[0]

    def second(b):
        args = _grad_args(q, k, v)
        out = _attention(b, kw, detach_beta=True)(*args)
        (gq,) = torch.autograd.grad((out**2).sum(), args[0], create_graph=True)
        return torch.autograd.grad((gq * u).sum(), args)

    want = second("chunked")
    try:
        got = second(backend)
    except RuntimeError as exc:
        assert str(exc) == _sdpa_second_derivative_error(q, k, v, kw)
        return
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("detach_beta", [False, True])
def test_softmax_second_derivative(detach_beta):
    """adaptive_softmax is plain torch: recorded backward, with β attached or held constant
    (then compared with softmax at that constant β, which is what it differentiates)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    if not detach_beta:
        assert torch.autograd.gradgradcheck(adaptive_softmax, (x,))
        return
    u = torch.randn(3, 6, generator=g, dtype=torch.float64)

    def second(f):
        (gx,) = torch.autograd.grad((f(x) ** 2).sum(), x, create_graph=True)
        return torch.autograd.grad((gx * u).sum(), x)[0]

    xd = x.detach()
    h = -(torch.softmax(xd, -1) * torch.log_softmax(xd, -1)).sum(-1)
    b = torch.as_tensor(PaperPolynomial().beta_float(h.numpy(), 6)).unsqueeze(-1)
    got = second(lambda t: adaptive_softmax(t, detach_beta=True))
    want = second(lambda t: torch.softmax(b * t, -1))
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- the double-backward jvp


@pytest.mark.parametrize("mask_name", MASKS)
def test_double_backward_jvp_equals_forward_mode(mask_name):
    """``torch.autograd.functional.jvp`` differentiates a backward recorded at zero row
    gradients; it must equal forward-mode AD. Before: 0.71 apart for the entropy."""
    q, k, v, kw = _inputs(mask_name)
    tq, tk, tv = _tangents(q, k, v)
    _, via_backward = torch.autograd.functional.jvp(_entropy(kw), (q, k), (tq, tk))
    _, forward = torch.func.jvp(_entropy(kw), (q, k), (tq, tk))
    torch.testing.assert_close(via_backward, forward, rtol=1e-10, atol=1e-12)
    for backend in ("hybrid", "chunked"):
        f = _attention(backend, kw)
        _, via_backward = torch.autograd.functional.jvp(f, (q, k, v), (tq, tk, tv))
        _, forward = torch.func.jvp(f, (q, k, v), (tq, tk, tv))
        torch.testing.assert_close(via_backward, forward, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- torch.func transforms


def _per_slice(f, *tensors):
    return torch.stack([f(*(t[i] for t in tensors)) for i in range(tensors[0].shape[0])])


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_name", MASKS)
def test_vmap_is_the_loop_over_slices(backend, mask_name):
    q, k, v, kw = _inputs(mask_name)
    f = _attention(backend, kw)
    torch.testing.assert_close(
        torch.func.vmap(f)(q, k, v), _per_slice(f, q, k, v), rtol=1e-12, atol=1e-14
    )
    fe = _entropy(kw)
    torch.testing.assert_close(torch.func.vmap(fe)(q, k), _per_slice(fe, q, k), rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["bool", "bias", "0/-inf"])
def test_vmap_over_the_mask_alone_is_the_loop_over_slices(backend, kind):
    """vmap over a stack of masks with plain q, k, v (SDPA takes it): the tiles formed
    from plain q and k are plain, and the batched mask was written into them in place
    ("vmap: inplace arithmetic ... is not possible"), or added with ``out=`` ("Batching
    rule not implemented for aten::add.out"), on every backend and in attention_entropy."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, n, 3, dtype=torch.float64, generator=g) for n in (4, 5, 5))
    keep = torch.rand(3, 4, 5, generator=g) > 0.3
    keep[..., 0] = True
    masks = {
        "bool": keep,
        "bias": torch.where(
            keep, torch.randn(3, 4, 5, dtype=torch.float64, generator=g), -math.inf
        ),
        "0/-inf": torch.where(keep, 0.0, -math.inf).double(),
    }[kind]

    def f(m):
        return adaptive_attention(q, k, v, attn_mask=m, backend=backend)

    def fe(m):
        return torch.stack(attention_entropy(q, k, attn_mask=m))

    torch.testing.assert_close(
        torch.func.vmap(f)(masks), _per_slice(f, masks), rtol=1e-12, atol=1e-14
    )
    torch.testing.assert_close(
        torch.func.vmap(fe)(masks), _per_slice(fe, masks), rtol=1e-12, atol=0
    )
    ks = torch.randn(3, 1, 5, 3, dtype=torch.float64, generator=g)  # keys and masks batched

    def fk(kk, m):
        return adaptive_attention(q, kk, v, attn_mask=m, backend=backend)

    torch.testing.assert_close(
        torch.func.vmap(fk)(ks, masks), _per_slice(fk, ks, masks), rtol=1e-12, atol=1e-14
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_name", MASKS)
def test_forward_mode_equals_reverse_mode(backend, mask_name):
    """``torch.func.jvp`` and ``torch.autograd.forward_ad`` against the Jacobian from
    reverse mode (``torch.func.jacrev`` of the chunked path, plain torch)."""
    q, k, v, kw = _inputs(mask_name, B=1, H=1, Hkv=1)
    tq, tk, tv = _tangents(q, k, v)
    f = _attention(backend, kw)
    jac = torch.func.jacrev(_attention("chunked", kw), argnums=(0, 1, 2))(q, k, v)
    want = sum((j * t).flatten(-t.ndim).sum(-1) for j, t in zip(jac, (tq, tk, tv), strict=True))
    _, got = torch.func.jvp(f, (q, k, v), (tq, tk, tv))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    with forward_ad.dual_level():
        duals = [forward_ad.make_dual(a, t) for a, t in ((q, tq), (k, tk), (v, tv))]
        got = forward_ad.unpack_dual(f(*duals)).tangent
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_name", ["none", "bias"])
def test_per_sample_gradients(backend, mask_name):
    """``vmap(grad(...))`` (per-sample gradients) equals a loop of autograd gradients."""
    q, k, v, kw = _inputs(mask_name)
    f = _attention(backend, kw)

    def loss(a, b, c):
        return (f(a[None], b[None], c[None]) ** 2).sum()

    got = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1)))(q, k, v)
    for i in range(q.shape[0]):
        a, b = _grad_args(q[i], k[i])
        want = torch.autograd.grad(loss(a, b, v[i]), (a, b))
        for x, y in zip(got, want, strict=True):
            torch.testing.assert_close(x[i], y, rtol=1e-10, atol=1e-12)


def test_transforms_are_seen_and_plain_tensors_are_not():
    from softmaxtheory.accelerated._torch_common import transformed, unwrapped

    x = torch.randn(3, 4)
    assert not transformed(x, None)
    seen = []

    def probe(t):
        seen.append((transformed(t), unwrapped(t).shape))
        return t

    torch.func.vmap(probe)(x)
    torch.func.jvp(probe, (x,), (x,))
    torch.func.grad(lambda t: probe(t).sum())(x)
    assert seen == [(True, (3, 4))] * 3
    with forward_ad.dual_level():
        assert transformed(forward_ad.make_dual(x, x))
        assert not transformed(x)


def test_triton_backend_refuses_a_transform_by_name(monkeypatch):
    """backend='triton' launches kernels on raw pointers: under a transform it must say so
    (it reached "Cannot access data pointer of Tensor that doesn't have storage")."""
    monkeypatch.setattr(_torch_attention, "triton_available", lambda device: True)
    q, k, v, _ = _inputs()
    q, k, v = (t.float() for t in (q, k, v))
    f = _attention("triton", {})
    with torch.no_grad(), pytest.raises(ValueError, match=r"torch\.func transform"):
        torch.func.vmap(f)(q, k, v)
    with torch.no_grad(), pytest.raises(ValueError, match="forward-mode AD"):
        torch.func.jvp(f, (q, k, v), _tangents(q, k, v))


class _Halves(Schedule):
    """A user's schedule, evaluated through numpy: beta = 1 + H / 2."""

    needs_entropy = True

    def beta_float(self, entropy, n_eff):
        return 1.0 + 0.5 * np.asarray(entropy, dtype=np.float64) + 0.0 * np.asarray(n_eff)

    def __repr__(self) -> str:
        return "_Halves()"


def test_a_user_schedule_under_a_transform_is_refused_by_name():
    """A user's Schedule runs through numpy, which no transform can enter: the call stopped
    at torch's "Cannot access data pointer of Tensor that doesn't have storage", detached
    β included; it now names the schedule. Outside a transform it runs."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    q, k, v, _ = _inputs()

    def softmax(r):
        return adaptive_softmax(r, schedule=_Halves(), detach_beta=True)

    def attention(q, k, v):
        return adaptive_attention(q, k, v, schedule=_Halves(), detach_beta=True)

    for call in (
        lambda: torch.func.vmap(softmax)(x),
        lambda: torch.func.jacrev(softmax)(x[0]),
        lambda: torch.func.jvp(softmax, (x,), (torch.ones_like(x),)),
        lambda: torch.func.vmap(attention)(q, k, v),
    ):
        with pytest.raises(TypeError, match=r"schedule _Halves\(\) is evaluated through numpy"):
            call()
    want = torch.stack([softmax(r) for r in x])
    torch.testing.assert_close(softmax(x), want, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("mask_name", ["none", "bool", "causal"])
def test_vmap_keeps_each_slices_special_values(mask_name):
    """The host reads see every slice at once (a NaN in one, logits near the float maximum
    in another); each slice must still get its own answer: NaN rows only where its own
    inputs hold them, the overflow-safe values where its logits are huge."""
    q, k, v, kw = _inputs(mask_name, B=3)
    q[1, 0, 2, 1] = math.nan
    k[2, 1, 0, 0] = math.inf  # key 0: every query sees it (causal, and the masks keep it)
    q[0] *= 1e200
    for f in (_attention("auto", kw), lambda a, b, c: _entropy(kw)(a, b)):
        got = torch.func.vmap(f)(q, k, v)
        want = _per_slice(f, q, k, v)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14, equal_nan=True)
        assert torch.isnan(got[1]).any() and torch.isnan(got[2]).any()
        assert not torch.isnan(got[0]).any()
