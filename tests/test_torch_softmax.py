"""softmaxtheory.accelerated.torch.adaptive_softmax against the certified reference."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from softmaxtheory import reference as R  # noqa: E402, N812
from softmaxtheory.accelerated.torch import AdaptiveSoftmax, adaptive_softmax  # noqa: E402
from softmaxtheory.spec import Constant, LogLength, Polynomial  # noqa: E402
from tests.test_torch_tolerances import softmax_tolerance  # noqa: E402

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
SCHEDULES = [None, Constant("1.5"), LogLength("0.7"), Polynomial(("0.2", "1.1"), "0.3")]
NP_EXACT = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16}


def _rows(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 40, generator=g, dtype=torch.float64) * torch.tensor(
        [0.1, 1.0, 3.0, 8.0, 30.0, 2.0], dtype=torch.float64
    ).unsqueeze(-1)
    x[5, ::3] = -math.inf  # masked entries
    return x.to(dtype)


def _check(x, out, schedule=None, entropy_eps=0.0):
    xd = x.double().numpy()  # exact values of the input
    ref = R.adaptive_softmax(xd, schedule=schedule, entropy_eps=entropy_eps)
    beta = R.beta(xd, schedule=schedule, entropy_eps=entropy_eps)
    tol = softmax_tolerance(xd, ref, beta, x.dtype, schedule)
    err = np.abs(out.double().numpy() - ref)
    assert out.dtype == x.dtype
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_matches_reference(dtype, schedule):
    x = _rows(dtype)
    _check(x, adaptive_softmax(x, schedule=schedule), schedule)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paper_entropy_eps_mode(dtype):
    x = _rows(dtype, seed=1)
    _check(x, adaptive_softmax(x, entropy_eps=1e-9), None, 1e-9)


def test_entropy_window_rows():
    """Rows whose entropy spans (H_on, H_off), where β > 1 and its slope is largest."""
    n = torch.arange(1, 9)
    xs = [torch.linspace(0, float(s), 64, dtype=torch.float64) for s in n]
    x = torch.stack(xs)
    beta = R.beta(x.numpy())
    assert beta.max() > 1.5
    _check(x, adaptive_softmax(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dim_argument_and_module(dtype):
    x = _rows(dtype).T.contiguous()  # normalise along dim 0
    out = adaptive_softmax(x, dim=0)
    assert torch.equal(out, AdaptiveSoftmax(dim=0)(x))
    torch.testing.assert_close(out.T, adaptive_softmax(x.T.contiguous()))
    _check(x.T.contiguous(), out.T.contiguous())


def test_module_is_a_drop_in_for_nn_softmax():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), AdaptiveSoftmax(dim=-1))
    out = model(torch.randn(3, 4))
    assert out.shape == (3, 8)
    torch.testing.assert_close(out.sum(-1), torch.ones(3))
    assert "detach_beta=False" in repr(model[1])
    plain = AdaptiveSoftmax(schedule=Constant(1))
    x = torch.randn(5, 7)
    torch.testing.assert_close(plain(x), torch.softmax(x, -1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values(dtype):
    inf, nan = math.inf, math.nan
    x = torch.tensor(
        [[1.0, -inf, 2.0, -inf], [-inf] * 4, [1.0, nan, 0.0, 0.0], [0.0, inf, 1.0, 2.0]],
        dtype=dtype,
    )
    out = adaptive_softmax(x)
    ref = R.adaptive_softmax(x.double().numpy())
    np.testing.assert_array_equal(np.isnan(out.double().numpy()), np.isnan(ref))
    assert torch.equal(out[1], torch.zeros(4, dtype=dtype))
    assert out[0, 1] == 0 and out[0, 3] == 0
    empty = adaptive_softmax(torch.zeros(3, 0, dtype=dtype))
    assert empty.shape == (3, 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_one_hot_row_is_finite_and_right(dtype):
    """The paper's listing gives NaN here (0 * log 0 in half precision)."""
    x = torch.tensor([[100.0, 0.0, 0.0, 0.0, 0.0], [12.0, 0.0, -3.0, 1.0, 0.0]], dtype=dtype)
    for eps in (0.0, 1e-9):
        out = adaptive_softmax(x, entropy_eps=eps)
        assert torch.isfinite(out).all()
        _check(x, out, None, eps)
    listing_p = torch.softmax(x[:1], -1)
    assert torch.isnan(-(listing_p * torch.log(listing_p)).sum())  # the listing's failure


def test_integer_input_is_promoted_to_float64():
    out = adaptive_softmax(torch.tensor([[1, 2, 3]]))
    assert out.dtype == torch.float64
    ref = R.adaptive_softmax(np.array([[1.0, 2.0, 3.0]]))
    np.testing.assert_allclose(out.numpy(), ref, rtol=4 * 2.0**-53, atol=0)


@pytest.mark.parametrize(
    ("call", "exc", "word"),
    [
        (lambda: adaptive_softmax([1.0, 2.0]), TypeError, "x"),
        (lambda: adaptive_softmax(torch.tensor([1 + 1j])), TypeError, "x"),
        (lambda: adaptive_softmax(torch.tensor([True])), TypeError, "x"),
        (lambda: adaptive_softmax(torch.tensor(1.0)), ValueError, "x"),
        (lambda: adaptive_softmax(torch.ones(2, 3), dim=2), ValueError, "dim"),
        (lambda: adaptive_softmax(torch.ones(2, 3), dim=1.0), TypeError, "dim"),
        (lambda: adaptive_softmax(torch.ones(2), entropy_eps=-1.0), ValueError, "entropy_eps"),
        (lambda: adaptive_softmax(torch.ones(2), schedule="paper"), TypeError, "schedule"),
        (lambda: adaptive_softmax(torch.ones(2), detach_beta=1), TypeError, "detach_beta"),
    ],
)
def test_input_errors(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


# ---------------------------------------------------------------- gradients


def _grad_rows():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 7, generator=g, dtype=torch.float64) * 2
    x[2, 1] = -math.inf
    assert R.beta(x.numpy()).max() > 1  # β is not constant here
    return x


@pytest.mark.parametrize("schedule", [None, LogLength("0.5")], ids=repr)
def test_gradcheck_float64(schedule):
    x = _grad_rows().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: adaptive_softmax(t, schedule=schedule), (x,), eps=1e-6, atol=1e-8
    )


def test_gradcheck_float64_detached_beta():
    """detach_beta=True: the Jacobian is that of softmax(beta0 * x) with beta0 frozen."""
    x = _grad_rows()
    beta0 = torch.from_numpy(R.beta(x.numpy())).unsqueeze(-1)

    def frozen(t):
        return torch.softmax(beta0 * t, -1)

    xr = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(frozen, (xr,), eps=1e-6, atol=1e-8)
    jac = torch.autograd.functional.jacobian(lambda t: adaptive_softmax(t, detach_beta=True), x)
    torch.testing.assert_close(jac, torch.autograd.functional.jacobian(frozen, x))


def test_detach_beta_changes_the_gradient():
    x = torch.linspace(0, 3, 16, dtype=torch.float64).requires_grad_()
    w = torch.arange(16, dtype=torch.float64)
    (ga,) = torch.autograd.grad((adaptive_softmax(x) * w).sum(), x)
    (gb,) = torch.autograd.grad((adaptive_softmax(x, detach_beta=True) * w).sum(), x)
    assert not torch.allclose(ga, gb)
    # with beta frozen the Jacobian is beta * (diag(y) - y y^T)
    y = adaptive_softmax(x.detach())
    beta = float(R.beta(x.detach().numpy()))
    expected = beta * (y * w - y * (y * w).sum())
    torch.testing.assert_close(gb, expected, rtol=1e-12, atol=1e-14)


def test_gradient_matches_reference_finite_difference():
    """d/dx_k of sum_i w_i y_i against a central difference of the mpmath reference."""
    x = torch.tensor([0.3, -1.2, 2.0, 0.7, 1.1, -0.4], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0, 0.25], dtype=torch.float64)
    (grad,) = torch.autograd.grad((adaptive_softmax(x) * w).sum(), x)
    h = 2.0**-20  # x +- h are exact floats; the reference is exact at them
    base = x.detach().tolist()
    for idx in range(len(base)):
        up, dn = list(base), list(base)
        up[idx] += h
        dn[idx] -= h
        with mpmath.workprec(113):
            fu = mpmath.fsum(
                wi * yi for wi, yi in zip(w.tolist(), R.adaptive_softmax_mp(up), strict=False)
            )
            fd = mpmath.fsum(
                wi * yi for wi, yi in zip(w.tolist(), R.adaptive_softmax_mp(dn), strict=False)
            )
            fd_grad = float((fu - fd) / (2 * h))
        # central difference: truncation h^2/6 * |third derivative| ~ 1e-12 here
        assert abs(grad[idx].item() - fd_grad) <= 1e-9 * (1 + abs(fd_grad))


def test_masked_entries_get_zero_gradient():
    x = torch.tensor([[1.0, -math.inf, 2.0], [-math.inf] * 3], dtype=torch.float64)
    x.requires_grad_()
    adaptive_softmax(x).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert x.grad[0, 1] == 0 and torch.equal(x.grad[1], torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("schedule", "eps"),
    [(None, 0.0), (None, 1e-9), (Constant("1.5"), 0.0), (LogLength("0.7"), 0.0),
     (Constant("1e-310"), 0.0)],  # a β below 2**10 / max: the overflowed shifts' path
    ids=["paper", "paper-eps", "constant", "log-length", "tiny-constant"],
)  # fmt: skip
def test_written_over_intermediates_give_the_same_bits(dtype, schedule, eps):
    """Without a graph to record, the intermediates of the row's size are written over once
    read (``_torch_common.may_reuse``): the same operations on the same operands, so the
    bits of the recorded path, for every schedule, masked and fully masked rows, and a row
    whose spread overflows."""
    x = _rows(dtype, seed=3)
    x[2] = -math.inf  # a fully masked row
    big = torch.finfo(dtype).max / 1.5
    x[3, :2] = torch.tensor([big, -big], dtype=torch.float64).to(dtype)  # x - max overflows
    given = x.clone()
    kwargs = {"schedule": schedule, "entropy_eps": eps}
    recorded = adaptive_softmax(x.clone().requires_grad_(), **kwargs).detach()
    with torch.no_grad():
        reused = adaptive_softmax(x, **kwargs)
    with torch.inference_mode():
        inferred = adaptive_softmax(x, **kwargs)
    assert torch.equal(reused, recorded) and torch.equal(inferred, recorded)
    assert torch.equal(x, given)  # the input itself is never written


@pytest.mark.parametrize(("dtype", "most"), [(torch.float32, 2.5), (torch.bfloat16, 5.0)])
def test_peak_memory_without_a_graph(dtype, most):
    """Counted op by op, without a graph the peak beside the input is at most 2.5x a float32
    input (two tensors of its size and the mask; 5.3x when every operation formed its own
    result) and 5x a bfloat16 one (its float32 copy is dropped after the shift; 12.5x)."""
    from tests.support.live_bytes import OpLedger

    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(0)).to(dtype)
    x[:, 300:] = -math.inf
    with torch.no_grad(), OpLedger() as ledger:
        adaptive_softmax(x)
    assert ledger.peak <= most * x.numel() * x.element_size(), ledger.peak / x.nbytes


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("detach_beta", [False, True])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_lean_backward_matches_the_recorded_one(schedule, detach_beta, dtype):
    """The backward of ``_AdaptiveSoftmax`` (the logits and the result kept, the rest
    recomputed) gives the recorded forward's gradient up to rounding, masked and fully
    masked rows included (0 there, never NaN)."""
    from softmaxtheory.accelerated._torch_softmax import adaptive_softmax_lastdim
    from softmaxtheory.spec import resolve_schedule

    x = _rows(dtype, seed=5)
    x[2] = -math.inf
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(6)).to(dtype)
    xa = x.clone().requires_grad_()
    (lean,) = torch.autograd.grad(
        adaptive_softmax(xa, schedule=schedule, detach_beta=detach_beta), xa, g
    )
    xb = x.clone().requires_grad_()
    recorded_out = adaptive_softmax_lastdim(xb, resolve_schedule(schedule), 0.0, detach_beta)[0]
    (recorded,) = torch.autograd.grad(recorded_out.to(dtype), xb, g)
    assert torch.isfinite(lean).all()
    assert torch.all(lean[x == -math.inf] == 0) and torch.all(lean[2] == 0)
    # float32 and float64: a few dozen ulps of the largest entry; bfloat16: one rounding
    unit = 2.0**-8 if dtype == torch.bfloat16 else 64 * torch.finfo(dtype).eps
    tol = unit * recorded.double().abs().max().item()
    torch.testing.assert_close(lean.double(), recorded.double(), rtol=0, atol=tol)


@pytest.mark.parametrize(
    ("dtype", "forward", "both"), [(torch.float32, 2.5, 5.5), (torch.bfloat16, 5.0, 14.0)]
)
def test_lean_backward_memory(dtype, forward, both):
    """Counted op by op with a graph recorded: the forward's peak beside the input is at
    most 2.5x a float32 input and forward + backward 5.5x (the recorded forward kept about
    seven tensors of the input's size: 7.3x and 10.3x; torch.softmax: 1x and 2x); bfloat16
    at most 5x and 14x (16.5x and 23.5x)."""
    from tests.support.live_bytes import OpLedger

    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(0)).to(dtype)
    x[:, 300:] = -math.inf
    x.requires_grad_()
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    with OpLedger() as ledger:
        out = adaptive_softmax(x)
        after_forward = ledger.peak
        out.backward(grad)
    assert after_forward <= forward * x.nbytes, after_forward / x.nbytes
    assert ledger.peak <= both * x.nbytes, ledger.peak / x.nbytes


_ENTRY = st.one_of(
    st.floats(-30.0, 30.0),
    st.just(-math.inf),
    st.sampled_from([1e300, -1e300, 1e-300, 0.0, -0.0]),  # spreads past the float range
)


@given(
    rows=st.lists(st.lists(_ENTRY, min_size=1, max_size=9), min_size=1, max_size=4).filter(
        lambda r: len({len(row) for row in r}) == 1
    ),
    detach_beta=st.booleans(),
)
@example(rows=[[0.0, -math.inf], [1e300, -1e300]], detach_beta=False)
def test_lean_backward_on_any_float64_rows(rows, detach_beta):
    """Float64 rows with masks, one-hot rows and spreads that overflow: the lean backward's
    gradient is the recorded one's up to rounding, and finite where the row is."""
    from softmaxtheory.accelerated._torch_softmax import adaptive_softmax_lastdim
    from softmaxtheory.spec import PaperPolynomial

    x = torch.tensor(rows, dtype=torch.float64)
    g = torch.linspace(-1.0, 1.0, x.numel(), dtype=torch.float64).reshape(x.shape)
    xa = x.clone().requires_grad_()
    (lean,) = torch.autograd.grad(adaptive_softmax(xa, detach_beta=detach_beta), xa, g)
    xb = x.clone().requires_grad_()
    out = adaptive_softmax_lastdim(xb, PaperPolynomial(), 0.0, detach_beta)[0]
    (recorded,) = torch.autograd.grad(out, xb, g)
    assert torch.isfinite(lean).all() and torch.isfinite(recorded).all()
    scale = max(1.0, recorded.abs().max().item())
    torch.testing.assert_close(lean, recorded, rtol=0, atol=1e-12 * scale)
