"""softmaxtheory.accelerated.torch.adaptive_attention against the certified reference."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from softmaxtheory import reference as R  # noqa: E402, N812
from softmaxtheory.accelerated.torch import adaptive_attention  # noqa: E402
from softmaxtheory.spec import Constant, LogLength  # noqa: E402
from tests.support.layouts import view  # noqa: E402
from tests.test_torch_tolerances import attention_tolerance  # noqa: E402

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
BACKENDS = ["composition", "chunked"]


def _qkv(dtype, L=5, S=7, D=4, Dv=3, seed=0, mag=2.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, L, D, generator=g, dtype=torch.float64) * mag
    k = torch.randn(2, 2, S, D, generator=g, dtype=torch.float64) * mag
    v = torch.randn(2, 2, S, Dv, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _masks(L=5, S=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(L, S, generator=g) > 0.4
    keep[2] = False  # a fully masked query
    keep[0, 0] = True
    add = torch.randn(L, S, generator=g, dtype=torch.float64)
    add[~keep] = -math.inf
    zero_inf = torch.zeros(L, S, dtype=torch.float64).masked_fill(~keep, -math.inf)
    return {"none": None, "causal": "causal", "bool": keep, "bias": add, "zero_inf": zero_inf}


def _run_and_check(
    dtype, mask_name, backend, schedule=None, entropy_eps=0.0, Dv=3, layout=None, operand=None,
    scale=None,
):  # fmt: skip
    q, k, v = _qkv(dtype, Dv=Dv)
    if layout is not None:
        views = {"q": q, "k": k, "v": v}
        views[operand] = view(views[operand], layout)
        assert views[operand].stride(-1) != 1
        q, k, v = views.values()
    mask = _masks()[mask_name]
    causal = mask == "causal"
    attn_mask = None if (mask is None or causal) else mask
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(dtype)
    out = adaptive_attention(
        q, k, v, attn_mask, is_causal=causal, scale=scale, schedule=schedule,
        entropy_eps=entropy_eps, backend=backend,
    )  # fmt: skip
    assert out.dtype == dtype and out.shape == (2, 2, 5, Dv)
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    np_mask = None if attn_mask is None else attn_mask.double().numpy()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        np_mask = attn_mask.numpy()
    ref = R.adaptive_attention(
        qd, kd, vd, mask=np_mask, is_causal=causal, scale=scale, schedule=schedule,
        entropy_eps=entropy_eps,
    )  # fmt: skip
    keep = add = None
    if np_mask is not None and np_mask.dtype == bool:
        keep = np_mask
    elif np_mask is not None:
        add = np_mask
    elif causal:
        keep = np.tril(np.ones((5, 7), dtype=bool))
    tol = attention_tolerance(
        qd, kd, vd, ref, dtype, keep=keep, add=add, scale=scale, schedule=schedule
    )
    err = np.abs(out.double().numpy() - ref)
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol)}"
    return out


@pytest.mark.theorem("T10")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias", "zero_inf"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_reference(dtype, mask_name, backend):
    """adaptive_attention is within tolerance of the reference for each dtype, mask and backend."""
    out = _run_and_check(dtype, mask_name, backend)
    if mask_name == "bool":
        assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))  # fully masked


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", ["auto", "hybrid", *BACKENDS])
@pytest.mark.parametrize("layout", ["transposed", "stepped"])
@pytest.mark.parametrize("operand", ["q", "k", "v"])
def test_operands_whose_last_dimension_is_strided(dtype, backend, layout, operand):
    """Views whose last dimension is not unit-stride give the reference's values.

    With D = Dv the composition runs on torch's CPU flash kernel, which reads each row
    as contiguous without checking: before the operands were copied, these views gave
    errors up to 1e34 and NaN (torch 2.13).
    """
    _run_and_check(dtype, "none", backend, Dv=4, layout=layout, operand=operand)
    _run_and_check(dtype, "bool", backend, Dv=4, layout=layout, operand=operand)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", ["auto", "hybrid", *BACKENDS])
@pytest.mark.parametrize("scale", [0.0, -0.0, -0.7])
@pytest.mark.parametrize("mask_name", ["causal", "bool", "none"])
def test_scale_that_is_not_positive(dtype, backend, scale, mask_name):
    """A scale of 0 or below gives the reference's values with every mask.

    With ``is_causal=True`` and such a scale, torch's CPU flash kernel (which the
    composition and SDPA run) gave NaN rows (torch 2.13): it masks a causal entry
    after scaling. The fused kernels now get the negated queries and :math:`|s|`
    (or zero queries and scale 1).
    """
    _run_and_check(dtype, mask_name, backend, Dv=4, scale=scale)


@pytest.mark.parametrize("schedule", [Constant("1.7"), LogLength("0.6")], ids=repr)
@pytest.mark.parametrize("mask_name", ["none", "causal", "bool"])
def test_other_schedules(schedule, mask_name):
    _run_and_check(torch.float32, mask_name, "auto", schedule=schedule)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=str)
def test_entropy_eps_mode(dtype):
    _run_and_check(dtype, "causal", "auto", entropy_eps=1e-9)


@pytest.mark.theorem("T10")
def test_composition_entropy_identity():
    """Pass 1 alone: H = LSE - scale q . Attn(q, K, K) equals the reference entropy."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812

    q, k, v = _qkv(torch.float64, L=6, S=9)
    p = A.prepare(q, k, v, None, False, None)
    h = A._composition_entropy(p, detach_beta=True, add=A._additive(p))
    x = (p.scale * q @ k.transpose(-1, -2)).numpy()
    np.testing.assert_allclose(h.numpy(), R.entropy(x), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_one_hot_row_is_finite(dtype):
    q = torch.zeros(1, 1, 1, 4, dtype=dtype)
    q[..., 0] = 100.0
    k = torch.zeros(1, 1, 5, 4, dtype=dtype)
    k[..., 0, 0] = 100.0
    v = torch.arange(5, dtype=dtype).reshape(1, 1, 5, 1) + 1
    for backend in BACKENDS:
        out = adaptive_attention(q, k, v, scale=1.0, backend=backend)
        assert torch.isfinite(out).all()
        assert out.item() == 1.0  # all weight on the first key


def test_special_values():
    q, k, v = _qkv(torch.float64)
    q[0, 0, 1, 0] = math.nan
    k[0, 1, 3, 2] = math.inf
    for backend in BACKENDS:
        out = adaptive_attention(q, k, v, backend=backend)
        assert torch.isnan(out[0, 0, 1]).all()
        assert torch.isnan(out[0, 1]).all()  # an infinite key reaches every query
        assert torch.isfinite(out[1]).all() and torch.isfinite(out[0, 0, 0]).all()
    causal = adaptive_attention(q, k, v, is_causal=True)
    assert torch.isfinite(causal[0, 1, :3]).all() and torch.isnan(causal[0, 1, 3:]).all()


def test_broadcast_and_shapes():
    q, k, v = _qkv(torch.float64)
    out = adaptive_attention(q[0, 0], k[0, 0], v[0, 0])
    assert out.shape == (5, 3)
    torch.testing.assert_close(out, adaptive_attention(q, k, v)[0, 0])
    out = adaptive_attention(q, k[:1], v[:1])  # keys broadcast over the batch
    torch.testing.assert_close(out[1], adaptive_attention(q[1], k[0], v[0]))
    out5 = adaptive_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))
    torch.testing.assert_close(out5[0], adaptive_attention(q, k, v))


@pytest.mark.parametrize(
    ("kwargs", "exc", "word"),
    [
        ({"q": [1.0]}, TypeError, "q"),
        ({"k": None}, TypeError, "k must be a torch.Tensor"),
        ({"v": None}, TypeError, "v must be a torch.Tensor"),  # (was an AttributeError)
        ({"k": torch.ones(2, 3, 5, dtype=torch.float64)}, ValueError, "feature"),
        ({"v": torch.ones(2, 3, 9, 3, dtype=torch.float64)}, ValueError, "key length"),
        ({"v": torch.ones(2, 2, 7, 3, dtype=torch.float32)}, TypeError, "dtype"),
        (
            {"attn_mask": torch.ones(5, 7, dtype=torch.bool), "is_causal": True},
            ValueError,
            "not both",
        ),
        ({"attn_mask": torch.ones(5, 7, dtype=torch.int64)}, TypeError, "attn_mask"),
        ({"attn_mask": torch.ones(4, 7, dtype=torch.bool)}, ValueError, "attn_mask"),
        ({"scale": "x"}, TypeError, "scale"),
        ({"scale": math.inf}, ValueError, "scale"),
        ({"backend": "cuda"}, ValueError, "backend"),
        ({"is_causal": 1}, TypeError, "is_causal"),
    ],
)
def test_input_errors(kwargs, exc, word):
    q, k, v = _qkv(torch.float64)
    args = {"q": q, "k": k, "v": v, **kwargs}
    with pytest.raises(exc, match=word):
        adaptive_attention(**args)


def test_dtype_error_names_the_dtypes_given():
    # an integer q counts as float64 (the spec); the error names int32, not float64
    q, k, v = _qkv(torch.float32)
    with pytest.raises(TypeError, match=r"got torch\.int32, torch\.float32, torch\.float32 \("):
        adaptive_attention(q.to(torch.int32), k, v)
    with pytest.raises(TypeError, match=r"got torch\.float64, torch\.float32, torch\.float32$"):
        adaptive_attention(q.double(), k, v)
    out = adaptive_attention(q.round().to(torch.int32), k.double(), v.double())
    assert out.dtype == torch.float64


def test_triton_backend_refuses_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        adaptive_attention(q, k, v, backend="triton")


# ---------------------------------------------------------------- gradients


def _small_grad_inputs():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64) * 1.5
    k = torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) * 1.5
    v = torch.randn(1, 2, 5, 2, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_name", ["none", "causal", "bool"])
def test_gradcheck_float64(backend, mask_name):
    q, k, v = _small_grad_inputs()
    keep = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 1, 1, 1]], dtype=torch.bool)
    mask = {"none": None, "causal": None, "bool": keep}[mask_name]
    causal = mask_name == "causal"
    x = (q @ k.transpose(-1, -2) / 2).numpy()
    assert R.beta(x).max() > 1  # β varies

    def f(q, k, v):
        return adaptive_attention(q, k, v, mask, is_causal=causal, backend=backend)

    args = tuple(t.clone().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_detached_beta(backend):
    """detach_beta=True: gradients are those of attention with β frozen (a scaled query)."""
    q, k, v = _small_grad_inputs()
    x = (q @ k.transpose(-1, -2) / 2).numpy()
    beta0 = torch.from_numpy(R.beta(x)).unsqueeze(-1)
    args = tuple(t.clone().requires_grad_() for t in (q, k, v))
    out = adaptive_attention(*args, detach_beta=True, backend=backend)
    grads = torch.autograd.grad(out.pow(2).sum(), args)
    args2 = tuple(t.clone().requires_grad_() for t in (q, k, v))

    def frozen(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(beta0 * q, k, v)

    assert torch.autograd.gradcheck(frozen, args2, eps=1e-6, atol=1e-8)
    expected = torch.autograd.grad(frozen(*args2).pow(2).sum(), args2)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    full = torch.autograd.grad(adaptive_attention(*args, backend=backend).pow(2).sum(), args)
    assert not torch.allclose(full[0], grads[0])


def test_gradient_matches_reference_finite_difference():
    """d/dq of sum(out * w) against a central difference of the certified reference."""
    q, k, v = _small_grad_inputs()
    q, k, v = q[0, 0, :1], k[0, 0], v[0, 0]
    w = torch.tensor([[1.0, -0.5]], dtype=torch.float64)
    qr = q.clone().requires_grad_()
    (grad,) = torch.autograd.grad((adaptive_attention(qr, k, v) * w).sum(), qr)
    h = 2.0**-20
    kd, vd, wd = k.numpy(), v.numpy(), w.numpy()
    for d in range(q.shape[-1]):
        up, dn = q.numpy().copy(), q.numpy().copy()
        up[0, d] += h
        dn[0, d] -= h
        fu = (R.adaptive_attention(up, kd, vd) * wd).sum()
        fd = (R.adaptive_attention(dn, kd, vd) * wd).sum()
        # the certified values are correctly rounded: rounding error 2 * 2^-53 / (2h)
        fd_grad = (fu - fd) / (2 * h)
        assert abs(grad[0, d].item() - fd_grad) <= 1e-8 * (1 + abs(fd_grad))


# ---------------------------------------------------------------- memory


#: The prelude of the peak-memory children: ``hwm()``, the process's peak resident bytes.
_HWM = """
import torch
from softmaxtheory.accelerated.torch import adaptive_attention
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
"""


def _peak_growth(body: str) -> int:
    """Bytes the peak grew by in a fresh process running `body` (which prints the growth)."""
    if not sys.platform.startswith("linux"):
        pytest.fail("this check reads /proc/self/status (Linux)")
    code = _HWM + textwrap.dedent(body)
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().splitlines()[-1])


def test_long_sequence_peak_memory_far_below_the_score_matrix():
    """L = S = 16384, D = 64: an L x S float32 matrix needs 1 GiB; we stay far below."""
    extra = _peak_growth(
        """
        L = 16384
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 1, L, 64, generator=g) for _ in range(3))
        causal = adaptive_attention(q[..., :64, :], k[..., :64, :], v[..., :64, :], is_causal=True)
        base = hwm()
        out = adaptive_attention(q, k, v)
        out2 = adaptive_attention(q, k, v, is_causal=True)
        assert torch.isfinite(out).all() and torch.isfinite(out2).all()
        print(hwm() - base)
        """
    )
    assert extra < 2**30 // 8, f"peak grew by {extra / 2**20:.1f} MiB"


def test_mask_shared_by_every_head_is_not_copied_per_head():
    """A (L, S) mask beside 64 heads: its additive form was built at (B, H, L, S), 512 MiB
    for this float32 call (SDPA grew by 21 MiB); it is now built once and expanded."""
    extra = _peak_growth(
        """
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(4, 16, 1024, 64, generator=g) for _ in range(3))
        keep = torch.rand(1024, 1024, generator=g) > 0.2
        keep[:, 0] = True
        bias = torch.randn(1024, 1024, generator=g).masked_fill(~keep, -torch.inf)
        adaptive_attention(q[:, :1, :64], k[:, :1, :64], v[:, :1, :64], attn_mask=keep[:64, :64])
        base = hwm()
        for mask in (keep, bias.masked_fill(keep, 0.0)):  # boolean, then additive 0 / -inf
            assert torch.isfinite(adaptive_attention(q, k, v, attn_mask=mask)).all()
        print(hwm() - base)
        """
    )
    assert extra < 2**27, f"peak grew by {extra / 2**20:.1f} MiB"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "shape", [(2, 1, 1, 7), (1, 2, 5, 1), (2, 1, 5, 7), (5, 7)], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("kind", ["bool", "bias"])
def test_masks_broadcast_along_any_axis(backend, shape, kind):
    """Masks of every broadcast shape (key padding, one per query, one per batch), as the
    reference reads them expanded to (B, H, L, S)."""
    q, k, v = _qkv(torch.float64)
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(shape, generator=g) > 0.3
    mask = keep
    if kind == "bias":
        mask = torch.randn(shape, generator=g, dtype=torch.float64).masked_fill(~keep, -math.inf)
    out = adaptive_attention(q, k, v, attn_mask=mask, backend=backend)
    full = mask.expand(2, 2, 5, 7).numpy()
    ref = R.adaptive_attention(q.numpy(), k.numpy(), v.numpy(), mask=full)
    tol = attention_tolerance(
        q.numpy(), k.numpy(), v.numpy(), ref, torch.float64,
        keep=full if kind == "bool" else None, add=None if kind == "bool" else full,
    )  # fmt: skip
    assert np.all(np.abs(out.numpy() - ref) <= tol)


def test_additive_form_of_a_mask_is_aligned_and_not_broadcast():
    """The fused kernels' mask: built once per distinct slice, its rows at multiples of 16
    elements (torch's memory-efficient CUDA kernel refuses others), the values unchanged."""
    from softmaxtheory.accelerated import _torch_attention as ta

    q, k, v = _qkv(torch.float16, L=5, S=100)
    keep = torch.rand(5, 100, generator=torch.Generator().manual_seed(1)) > 0.5
    for mask in (keep, torch.zeros(5, 100).masked_fill(~keep, -math.inf)):
        p = ta.prepare(q, k, v, mask, False, None)
        add = ta._additive(p)
        assert add.shape == (2, 2, 5, 100) and add.dtype == torch.float16
        assert add.stride()[:2] == (0, 0) and add.stride()[2] % 16 == 0 and add.stride(3) == 1
        assert ta._rows_aligned(add, 16) and not ta._rows_aligned(keep, 8)
        want = torch.zeros(5, 100, dtype=torch.float16).masked_fill(~keep, -math.inf)
        assert torch.equal(add, want.expand(2, 2, 5, 100))


def test_memory_efficient_kernel_conditions():
    """What is sent to torch's memory-efficient CUDA kernel: only what it takes (a compiled
    graph would raise its refusals past our ``try``)."""
    from softmaxtheory.accelerated import _torch_attention as ta

    q, k, v = _qkv(torch.float16, D=16, Dv=8)
    takes = ta._cuda_efficient_takes
    assert takes(q, k, v, None)
    assert not takes(q.double(), k.double(), v.double(), None)  # no float64 kernel
    assert not takes(q, k, v[..., :6], None)  # value rows of 6 elements
    assert not takes(q[..., :12], k[..., :12], v, None)  # query rows of 12
    assert not takes(q, k[..., :8], v, None)  # heads of two sizes
    assert not takes(q, k, v.float(), None)
    bias = torch.zeros(5, 7, dtype=torch.float16).expand(2, 2, 5, 7)
    assert not takes(q, k, v, bias)  # rows of 7 elements
    padded = torch.zeros(5, 16, dtype=torch.float16)[:, :7].expand(2, 2, 5, 7)
    assert takes(q, k, v, padded) and not takes(q, k, v, padded.float())
    # views the kernels' 16-byte loads cannot read in place: rows of 20 elements, a start
    # 4 elements into the buffer; copied (a clone, as the second is contiguous already)
    wide = torch.zeros(2, 2, 5, 20, dtype=torch.float16)
    shifted = torch.zeros(2 * 2 * 5 * 16 + 4, dtype=torch.float16)[4:].view(2, 2, 5, 16)
    for view_ in (wide[..., :16], shifted):
        assert not takes(view_, k, v, None)
        fixed = ta._aligned_rows(view_)
        assert takes(fixed, k, v, None) and torch.equal(fixed, view_)
    assert ta._aligned_rows(q) is q


# ---------------------------------------------------------------- Numba cross-check


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_agrees_with_numba_kernels(dtype):
    cpu = pytest.importorskip("softmaxtheory.accelerated.cpu")
    q, k, v = _qkv(dtype)
    keep = _masks()["bool"]
    ours = adaptive_attention(q, k, v, keep).double().numpy()
    theirs = np.asarray(cpu.adaptive_attention(q.numpy(), k.numpy(), v.numpy(), mask=keep.numpy()))
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    ref = R.adaptive_attention(qd, kd, vd, mask=keep.numpy())
    tol = attention_tolerance(qd, kd, vd, ref, dtype, keep=keep.numpy())
    assert np.all(np.abs(ours - theirs) <= 2 * tol)
    x = torch.randn(4, 50, dtype=dtype) * 3
    np.testing.assert_allclose(
        torch.softmax(x, -1).numpy(), np.asarray(cpu.softmax(x.numpy())), rtol=1e-3, atol=1e-7
    )


def test_gpu_bench_reports_missing_cuda(monkeypatch, capsys):
    import argparse

    from softmaxtheory.bench_torch import run_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    status = run_device(argparse.Namespace(device="cuda", repeat=1, json=False))
    assert status == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mode", ["none", "mask", "causal"])
def test_non_finite_values_whose_weight_underflows(dtype, mode):
    """An unmasked key's weight is exactly positive: its infinite value reaches the output.

    ``v = [1, -inf]`` with the second weight e^(-1e6) (0 in floating point) gave NaN
    (0 * -inf); the reference gives -inf. +inf and -inf in one column give NaN,
    a NaN value gives NaN; masked keys' values are ignored.
    """
    q = torch.tensor([[1e3, 0.0], [0.0, 1.0]], dtype=torch.float64)
    k = torch.tensor([[1e3, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    v = torch.tensor(
        [[1.0, 1.0, 1.0, 2.0], [-math.inf, math.inf, math.nan, 3.0], [1.0, -math.inf, 1.0, 4.0]],
        dtype=torch.float64,
    )
    mask = torch.tensor([[True, True, False], [False, True, True]]) if mode == "mask" else None
    causal = mode == "causal"
    want = R.adaptive_attention(
        q.numpy(), k.numpy(), v.numpy(), mask=None if mask is None else mask.numpy(),
        is_causal=causal,
    )  # fmt: skip
    for backend in BACKENDS:
        got = adaptive_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=mask, is_causal=causal,
            backend=backend,
        ).to(torch.float64).numpy()  # fmt: skip
        special = ~np.isfinite(want)
        np.testing.assert_array_equal(got[special], want[special])
        assert np.all(np.isfinite(got[~special]))
        np.testing.assert_allclose(got[~special], want[~special], rtol=1e-6)


def test_fully_masked_query_holding_inf_gives_zeros():
    """The masked logits of a fully masked query are never formed: zeros, not NaN."""
    q = torch.tensor([[math.inf, 0.0], [1.0, 0.0]], dtype=torch.float64)
    k = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    v = torch.tensor([[1.0]], dtype=torch.float64)
    mask = torch.tensor([[False], [True]])
    for backend in BACKENDS:
        got = adaptive_attention(q, k, v, attn_mask=mask, backend=backend)
        assert got.tolist() == [[0.0], [1.0]]
    from softmaxtheory.accelerated.torch import attention_entropy

    h, lse = attention_entropy(q, k, attn_mask=mask)
    assert h.tolist() == [0.0, 0.0] and lse[0].item() == -math.inf


def _gqa_inputs(dtype=torch.float64, heads=6, kv_heads=2, L=5, S=7, seed=3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, L, 4, generator=g, dtype=torch.float64) * 2.0
    k = torch.randn(2, kv_heads, S, 4, generator=g, dtype=torch.float64) * 2.0
    v = torch.randn(2, kv_heads, S, 3, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("backend", ["auto", "hybrid", "composition", "chunked"])
@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_grouped_query_attention_reads_key_head_h_over_g(backend, mask_name, dtype):
    """enable_gqa: query head h reads key and value head h // g, as SDPA's enable_gqa; the
    result equals attention on the repeated heads and the reference on them."""
    q, k, v = _gqa_inputs(dtype)
    mask = _masks()[mask_name]
    causal = mask == "causal"
    attn_mask = None if (mask is None or causal) else mask
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(dtype)
    kw = {"is_causal": causal, "backend": backend}
    out = adaptive_attention(q, k, v, attn_mask, enable_gqa=True, **kw)
    kr, vr = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    rep = adaptive_attention(q, kr, vr, attn_mask, **kw)
    assert out.shape == (2, 6, 5, 3)
    torch.testing.assert_close(out, rep, rtol=0, atol=8 * torch.finfo(dtype).eps)
    if dtype == torch.float64 and backend == "auto":
        np_mask = None if attn_mask is None else attn_mask.numpy()
        ref = R.adaptive_attention(
            q.numpy(), kr.numpy(), vr.numpy(), mask=np_mask, is_causal=causal
        )
        assert np.max(np.abs(out.numpy() - ref)) < 1e-12


def test_grouped_query_attention_needs_a_head_axis():
    """With 2-d operands enable_gqa was ignored, where the reference, the oracle and SDPA refuse
    them: a result nothing could check."""
    from softmaxtheory.accelerated.torch import attention_entropy

    q, k, v = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5, 2)
    for args in ((q, k, v), (q[None], k[None], v)):
        with pytest.raises(ValueError, match="enable_gqa needs a head axis"):
            adaptive_attention(*args, enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa needs a head axis"):
        attention_entropy(q, k, enable_gqa=True)
    assert adaptive_attention(q, k, v).shape == (3, 2)  # without the flag, as before


@pytest.mark.parametrize("backend", ["hybrid", "composition"])
def test_grouped_query_attention_gradcheck(backend):
    """Gradients through β with enable_gqa: a key head's gradient sums over its group."""
    q, k, v = _gqa_inputs(heads=4, kv_heads=2, L=3, S=4)
    q, k, v = q[:1], k[:1], v[:1]

    def f(q, k, v):
        return adaptive_attention(q, k, v, is_causal=True, enable_gqa=True, backend=backend)

    args = tuple(t.clone().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-8)


@pytest.mark.parametrize(("kv_heads", "v_heads"), [(2, 1), (1, 2), (2, 6), (6, 3), (6, 1)])
@pytest.mark.parametrize("backend", ["auto", "composition"])
def test_grouped_query_attention_with_own_value_heads(kv_heads, v_heads, backend):
    """Keys and values with different head counts, as SDPA's enable_gqa takes them (each
    repeated for its query heads); they raised 'k and v must have the same heads'."""
    q, k, _ = _gqa_inputs(heads=6, kv_heads=kv_heads)
    v = torch.randn(
        2, v_heads, k.shape[2], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5)
    )
    out = adaptive_attention(q, k, v, is_causal=True, enable_gqa=True, backend=backend)
    kr, vr = k.repeat_interleave(6 // kv_heads, dim=1), v.repeat_interleave(6 // v_heads, dim=1)
    ref = R.adaptive_attention(q.numpy(), kr.numpy(), vr.numpy(), is_causal=True)
    assert out.shape == (2, 6, q.shape[2], 3)
    assert np.max(np.abs(out.numpy() - ref)) < 1e-12
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )
    one = adaptive_attention(q, k, v, is_causal=True, enable_gqa=True, schedule=Constant(1))
    torch.testing.assert_close(one, sdpa, rtol=0, atol=1e-14)


def test_grouped_query_attention_errors():
    q, k, v = _gqa_inputs()
    with pytest.raises(ValueError, match="do not broadcast"):
        adaptive_attention(q, k, v)  # 6 query heads, 2 key heads, no enable_gqa
    with pytest.raises(ValueError, match="multiple of the key heads"):
        adaptive_attention(q[:, :5], k, v, enable_gqa=True)
    with pytest.raises(ValueError, match="multiple of the value heads"):
        adaptive_attention(q, k, torch.cat([v, v[:, :2]], dim=1), enable_gqa=True)  # 6 and 4
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        adaptive_attention(q, k, v, enable_gqa="yes")


@pytest.mark.parametrize("backend", ["chunked", "hybrid"])
@pytest.mark.parametrize("group", [1, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize(("L", "S"), [(23, 23), (23, 11), (11, 23)])
def test_causal_blocks_of_queries_read_only_the_keys_they_see(monkeypatch, L, S, group, backend):
    """Under ``is_causal`` the torch tiles of a block of queries stop at its last query's key
    (the chunked path weights only those values): in blocks of 3 queries the outputs are the
    reference's and the gradients pass gradcheck."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812

    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 2, L, 4, generator=g, dtype=torch.float64) * 2
    k = torch.randn(1, 2 // group, S, 4, generator=g, dtype=torch.float64) * 2
    v = torch.randn(1, 2 // group, S, 3, generator=g, dtype=torch.float64)
    monkeypatch.setattr(A, "CHUNK_ELEMENTS", 2 * S * 3)  # blocks of 3 queries
    kw = {"is_causal": True, "enable_gqa": group > 1, "backend": backend}
    out = adaptive_attention(q, k, v, **kw)
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    ref = R.adaptive_attention(q.numpy(), kr.numpy(), vr.numpy(), is_causal=True)
    assert np.max(np.abs(out.numpy() - ref)) < 1e-12
    lg, sg = (7 if L >= S else 4), (7 if S >= L else 4)  # (shorter, in the same proportion)
    args = tuple(
        t.clone().requires_grad_() for t in (q[..., :lg, :], k[..., :sg, :], v[..., :sg, :])
    )
    monkeypatch.setattr(A, "CHUNK_ELEMENTS", 2 * sg * 2)  # blocks of 2
    assert torch.autograd.gradcheck(lambda a, b, c: adaptive_attention(a, b, c, **kw), args)


@pytest.mark.parametrize(
    ("schedule", "eps"),
    [(None, 0.0), (None, 1e-9), (LogLength("0.6"), 0.0), (Constant("1e-30"), 0.0),
     (Constant("1e300"), 0.0)],
    ids=["paper", "paper-eps", "loglength", "tiny-beta", "huge-beta"],
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True], ids=["unmasked", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_chunked_tiles_whose_masks_are_known_give_the_general_paths_bits(
    monkeypatch, dtype, causal, schedule, eps
):
    """Over finite operands the chunked path's tiles have known masks (none, or the causal
    mask's) and, where nothing records them, are written over from block to block: its
    outputs and gradients are those of the general path, which reads the masks from the
    tiles, bit for bit, for every branch of the row softmax (the entropy mode, a β that
    reads the length only, β tiny enough for the overflowed shifts, β beyond float32)."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812
    from tests.support.spies import record_results

    q, k, v = _qkv(dtype, L=29, S=31, D=8, Dv=3, seed=12)
    monkeypatch.setattr(A, "CHUNK_ELEMENTS", 2 * 2 * 31 * 5)  # blocks of 5 queries
    kw = {"is_causal": causal, "schedule": schedule, "entropy_eps": eps, "backend": "chunked"}
    g = torch.randn(2, 2, 29, 3, generator=torch.Generator().manual_seed(13), dtype=dtype)

    def run():
        with torch.no_grad():
            out0 = adaptive_attention(q, k, v, **kw)
        args = tuple(t.clone().requires_grad_() for t in (q, k, v))
        out = adaptive_attention(*args, **kw)
        return out0, out.detach(), *torch.autograd.grad((out * g).sum(), args)

    verdicts = record_results(monkeypatch, A, "_masks_known")
    known = run()
    assert verdicts and all(verdicts)
    monkeypatch.setattr(A, "_masks_known", lambda p, t: False)
    general = run()
    for a, b in zip(known, general, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(known[0], known[1])
