"""The torch path on extreme and degenerate inputs: overflowing spreads, zero sizes, sparse
tensors, and compilation of the module (issues 13 and 14)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from softmaxtheory import reference as R  # noqa: E402, N812
from softmaxtheory.accelerated.torch import (  # noqa: E402
    AdaptiveSoftmax,
    adaptive_attention,
    adaptive_softmax,
    attention_entropy,
)
from softmaxtheory.spec import Constant, LogLength, PaperPolynomial, Polynomial, Schedule  # noqa: E402
from softmaxtheory.testing import assert_attention_close  # noqa: E402

BACKENDS = ["auto", "hybrid", "composition", "chunked"]
BIG = {torch.float64: 1e308, torch.float32: 3e38}


# ---------------------------------------------------------------- overflow-safe statistics


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("entropy_eps", [0.0, 1e-9])
@pytest.mark.parametrize("schedule", [None, Constant(1), LogLength("0.5")], ids=repr)
def test_softmax_of_an_overflowing_spread_is_the_reference(dtype, entropy_eps, schedule):
    """x - max x = -inf for finite x once the spread overflows: clamped, no 0 * -inf = NaN."""
    big = BIG[dtype]
    rows = [[big, -big], [-big, big], [big, -big, big], [0.0, -big, 1.0], [big, big],
            [big, -big, big, -big / 2], [-math.inf, big, -big]]  # fmt: skip
    for row in (torch.tensor(r, dtype=dtype) for r in rows):
        out = adaptive_softmax(row, schedule=schedule, entropy_eps=entropy_eps)
        ref = R.adaptive_softmax(row.double().numpy(), schedule=schedule, entropy_eps=entropy_eps)
        assert torch.isfinite(out).all()
        np.testing.assert_allclose(out.double().numpy(), ref, rtol=1e-6, atol=1e-300)


def test_issue_examples():
    big64 = torch.tensor([1e308, -1e308], dtype=torch.float64)
    assert adaptive_softmax(big64).tolist() == [1.0, 0.0]
    assert adaptive_softmax(torch.tensor([3e38, -3e38])).tolist() == [1.0, 0.0]
    assert AdaptiveSoftmax()(torch.tensor([3e38, -3e38])).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("detach_beta", [False, True])
def test_overflowing_spread_has_finite_gradients(detach_beta):
    """The clamp is a safe where: no NaN reaches a gradient."""
    x = torch.tensor([1e308, -1e308, 1e308, 0.0], dtype=torch.float64, requires_grad=True)
    adaptive_softmax(x, detach_beta=detach_beta)[0].backward()
    assert torch.isfinite(x.grad).all()


def _attention_case(name):
    """(q, k, v, scale) of finite attention inputs whose logits or spread overflow."""
    v = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)
    if name == "f32-spread":
        q = torch.tensor([[1.0], [0.5]])
        k = torch.tensor([[3e38], [-3e38], [3e38]])
        return q, k, v.float(), 1.0
    if name == "f32-beta":  # equal logits near the maximum: beta x overflows in pass 2
        q = torch.tensor([[1.0, 0.0]])
        k = torch.tensor([[3e38, 0.0], [3e38, 0.0], [3e38, 1.0]])
        return q, k, v.float(), 1.0
    if name == "f16-beta-q":  # beta q overflows float16
        q = torch.tensor([[6e4, 0.0]], dtype=torch.float16)
        k = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float16)
        return q, k, v.half(), 1.0
    if name == "f64-logits":  # q . k ~ 1e400: beyond float64
        q = torch.tensor([[1e200], [-3e199]], dtype=torch.float64)
        k = torch.tensor([[1e200], [-1e200], [5e199]], dtype=torch.float64)
        return q, k, v, 1.0
    if name == "f64-scale":  # scale = 1e308 (issue 14, item 4)
        q = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
        k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
        return q, k, v, 1e308
    raise AssertionError(name)


OVERFLOW_CASES = ["f32-spread", "f32-beta", "f16-beta-q", "f64-logits", "f64-scale"]


@pytest.mark.parametrize("case", OVERFLOW_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_with_overflowing_logits_is_the_reference(case, backend):
    """Finite inputs never give NaN where the reference gives numbers, on every backend."""
    q, k, v, scale = _attention_case(case)
    out = adaptive_attention(q, k, v, scale=scale, backend=backend)
    ref = R.adaptive_attention(
        q.double().numpy(), k.double().numpy(), v.double().numpy(), scale=scale
    )
    assert torch.isfinite(out).all(), out
    rtol = 1e-3 if q.dtype == torch.float16 else 1e-6
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=rtol)


def test_attention_overflow_gradients_are_finite():
    q, k, v, scale = _attention_case("f64-logits")
    args = [t.clone().requires_grad_() for t in (q, k, v)]
    adaptive_attention(*args, scale=scale).sum().backward()
    assert all(torch.isfinite(a.grad).all() for a in args)


# ---------------------------------------------------------------- zero sizes


ZERO_SHAPES = {
    "B=0": ((0, 2, 3, 4), (0, 2, 5, 4), (0, 2, 5, 3)),
    "H=0": ((2, 0, 3, 4), (2, 0, 5, 4), (2, 0, 5, 3)),
    "L=0": ((2, 2, 0, 4), (2, 2, 5, 4), (2, 2, 5, 3)),
    "S=0": ((2, 2, 3, 4), (2, 2, 0, 4), (2, 2, 0, 3)),
    "D=0": ((2, 2, 3, 0), (2, 2, 5, 0), (2, 2, 5, 3)),
    "Dv=0": ((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 0)),
    "issue": ((0, 3, 4), (0, 3, 4), (0, 3, 4)),
    # three leading dimensions: the (B, H) views once reshaped with an ambiguous -1
    "5-D L=0": ((2, 3, 2, 0, 4), (2, 3, 2, 5, 4), (2, 3, 2, 5, 3)),
    "5-D S=0": ((2, 3, 2, 3, 4), (2, 3, 2, 0, 4), (2, 3, 2, 0, 3)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", ["none", "causal", "bool"])
@pytest.mark.parametrize("name", list(ZERO_SHAPES))
def test_zero_size_dimensions_give_the_reference(name, mask, backend):
    """Every zero-size dimension: the reference's empty, zero or uniform result (no SIGFPE)."""
    qs, ks, vs = ZERO_SHAPES[name]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64) for s in (qs, ks, vs))
    attn_mask = None
    if mask == "bool":
        attn_mask = torch.ones(qs[-2], ks[-2], dtype=torch.bool)
    out = adaptive_attention(q, k, v, attn_mask, is_causal=mask == "causal", backend=backend)
    np_mask = None if attn_mask is None else attn_mask.numpy()
    if name == "D=0" and mask == "causal":
        # every logit is 0: the mean of the visible values (the reference raises
        # PrecisionError on this input, a defect reported separately)
        ref = (v.cumsum(-2)[..., :3, :] / torch.arange(1, 4).reshape(3, 1)).numpy()
    else:
        ref = R.adaptive_attention(
            q.numpy(), k.numpy(), v.numpy(), mask=np_mask, is_causal=mask == "causal"
        )
    assert out.shape == ref.shape
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-13, atol=1e-15)


def test_zero_size_softmax():
    for shape, dim in (((0, 3), -1), ((3, 0), -1), ((3, 0), 0), ((0,), 0)):
        x = torch.ones(shape)
        assert adaptive_softmax(x, dim).shape == x.shape


# ---------------------------------------------------------------- sparse tensors


def _qkv_sparse(which):
    args = [torch.ones(2, 2), torch.ones(3, 2), torch.ones(3, 1)]
    if which is not None:
        args[which] = args[which].to_sparse()
    return args


SPARSE_MASK = torch.ones(2, 3, dtype=torch.bool).to_sparse()
SPARSE_CALLS = [
    (lambda: adaptive_softmax(torch.ones(2, 3).to_sparse()), "x must be a dense"),
    (lambda: AdaptiveSoftmax()(torch.ones(2, 3).to_sparse_csr()), "x must be a dense"),
    (lambda: adaptive_attention(*_qkv_sparse(0)), "q must be a dense"),
    (lambda: adaptive_attention(*_qkv_sparse(1)), "k must be a dense"),
    (lambda: adaptive_attention(*_qkv_sparse(2)), "v must be a dense"),
    (lambda: adaptive_attention(*_qkv_sparse(None), SPARSE_MASK), "attn_mask must be a dense"),
]


def _nested(*shapes, dtype=torch.float32):
    return torch.nested.nested_tensor([torch.ones(s, dtype=dtype) for s in shapes])


#: Nested tensors: the strided kind has the strided layout, and reached torch's "Internal
#: error: NestedTensorImpl doesn't support sizes. Please file an issue."
NESTED_CALLS = [
    (lambda: adaptive_softmax(_nested(3, 5)), "x must be a dense.*nested tensor; pad"),
    (lambda: AdaptiveSoftmax()(_nested(3, 5)), "x must be a dense.*nested"),
    (lambda: adaptive_attention(_nested((2, 4), (3, 4)), torch.ones(3, 4), torch.ones(3, 4)),
     "q must be a dense.*nested"),
    (lambda: attention_entropy(torch.ones(2, 4), torch.ones(3, 4), _nested((2, 3), dtype=bool)),
     "attn_mask must be a dense.*got a nested tensor"),
    # MaskedTensor: its masked-aware operators refused ours ("Multiple dispatch failed for
    # 'torch._ops.aten.permute.default'")
    (lambda: adaptive_softmax(_masked((2, 3))), r"x must be a plain tensor.*masked_fill"),
    (lambda: adaptive_attention(_masked((2, 4)), torch.ones(3, 4), torch.ones(3, 4)),
     r"q must be a plain tensor, got a MaskedTensor; pass q\.get_data\(\)"),
    (lambda: attention_entropy(torch.ones(2, 4), torch.ones(3, 4), _masked((2, 3), bool)),
     "attn_mask must be a dense.*got a MaskedTensor"),
]  # fmt: skip


def _masked(shape, dtype=torch.float32):
    mask = torch.ones(shape, dtype=torch.bool)
    mask[0, 0] = False
    return torch.masked.masked_tensor(torch.ones(shape, dtype=dtype), mask)


@pytest.mark.parametrize(("call", "word"), SPARSE_CALLS + NESTED_CALLS)
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.filterwarnings("ignore:The PyTorch API of MaskedTensors is in prototype stage")
def test_sparse_tensors_are_refused_by_name(call, word):
    with pytest.raises(TypeError, match=word):
        call()


# ---------------------------------------------------------------- compilation (issue 14, item 11)


def test_jit_script_is_refused_with_a_pointer_to_compile():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's own
        with pytest.raises(TypeError, match=r"torch\.compile"):
            torch.jit.script(AdaptiveSoftmax())


@pytest.mark.parametrize("schedule", [None, LogLength("0.5"), Constant("2")], ids=repr)
def test_module_compiles_in_one_graph(schedule):
    """torch.compile(fullgraph=True) traces the module without a graph break, same values."""
    torch._dynamo.reset()
    module = AdaptiveSoftmax(schedule=schedule)
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), module(x), rtol=0, atol=0)
    # another row length: Dynamo retraces with a symbolic length, which the host-side β
    # bound took as an argument ("assume_constant_result argument conversion failed")
    for shape in [(2, 5), (4, 9)]:
        y = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 3
        torch.testing.assert_close(compiled(y), module(y), rtol=0, atol=0)


@pytest.mark.parametrize("schedule", [None, LogLength("0.5"), Constant("2")], ids=repr)
def test_function_compiles_in_one_graph(schedule):
    """The function as well as the module: with the default schedule, torch.compile once
    failed inside Dynamo (AttributeError), which traced the default's construction."""
    torch._dynamo.reset()
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    fn = lambda t: adaptive_softmax(t, dim=0, schedule=schedule)  # noqa: E731
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["adaptive_attention", "attention_entropy"])
def test_attention_compiles_with_one_kind_of_graph_break(name):
    """Attention reads its operands' maxima on the host once (the overflow guard and the
    NaN rows), where torch.compile breaks the graph; nothing else breaks it (a
    ``max(..., default=0)`` did, with a logged warning in each frame), and the values
    equal eager's."""
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 9, 4, generator=g) for _ in range(3))
    fn = {
        "adaptive_attention": lambda q, k, v: adaptive_attention(q, k, v, is_causal=True),
        "attention_entropy": lambda q, k, v: attention_entropy(q, k)[0],
    }[name]
    torch._dynamo.reset()
    counters.clear()
    got = torch.compile(fn, backend="eager")(q, k, v)
    reasons = list(counters["graph_break"])
    assert reasons and all(r.startswith("Tensor.tolist()") for r in reasons), reasons
    torch.testing.assert_close(got, fn(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["narrow values", "float32 bias, bfloat16 operands"])
@pytest.mark.filterwarnings("ignore::UserWarning")  # (Dynamo's notes on the host reads)
def test_attention_compiles_where_the_cpu_flash_kernel_refuses(case):
    """torch's CPU flash kernel raises for values narrower than the keys (d_v != d) and for
    a mask of another dtype; eager code caught that and took the chunked path, but the
    compiled graph raised it when it ran (RuntimeError: "Q/K/V should have the same head
    size", the narrow values). The kernel's conditions are now checked before the call.
    (A float32 bias beside bfloat16 operands is routed past the kernel already.)"""
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 3, 7, 8, generator=g)
    if case == "narrow values":
        v, mask = torch.randn(2, 3, 7, 3, generator=g), None
    else:
        q, k = q.bfloat16(), k.bfloat16()
        v, mask = torch.randn(2, 3, 7, 8, generator=g).bfloat16(), torch.randn(5, 7, generator=g)
    fn = lambda q, k, v: adaptive_attention(q, k, v, attn_mask=mask)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager")
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("compiler", ["eager", "aot_eager"])
@pytest.mark.parametrize("kind", ["bool", "bias"])
@pytest.mark.filterwarnings("ignore::UserWarning")  # (Dynamo's notes on the host reads)
def test_attention_compiles_with_a_mask_shared_by_the_heads(compiler, kind):
    """The fused kernels' mask is a padded buffer written through a slice and expanded to
    every head (:func:`_additive`); traced and functionalized, it gives eager's values."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (5, 7, 7))
    keep = torch.rand(5, 7, generator=g) > 0.4
    keep[:, 0] = True
    mask = keep if kind == "bool" else torch.randn(5, 7, generator=g).masked_fill(~keep, -torch.inf)
    fn = lambda q, k, v: adaptive_attention(q, k, v, attn_mask=mask)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=compiler)
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("entropy_eps", [0.0, 1e-9])
def test_softmax_compiles_with_dynamic_shapes_from_the_first_call(entropy_eps):
    """torch.compile(dynamic=True) makes a float argument symbolic, on which the check of
    entropy_eps called math.isfinite ("torch.* op returned non-Tensor"); the function and
    the module now trace in one graph, for every length, with eager's values."""
    torch._dynamo.reset()
    fn = lambda t: adaptive_softmax(t, entropy_eps=entropy_eps)  # noqa: E731
    module = AdaptiveSoftmax(entropy_eps=entropy_eps)
    compiled_fn = torch.compile(fn, backend="eager", dynamic=True, fullgraph=True)
    compiled_module = torch.compile(module, backend="aot_eager", dynamic=True, fullgraph=True)
    for shape in [(3, 6), (2, 11), (5, 40)]:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[1])) * 3
        torch.testing.assert_close(compiled_fn(x), fn(x), rtol=0, atol=0)
        torch.testing.assert_close(compiled_module(x), module(x), rtol=0, atol=0)


def _attention_call(name):
    """``(fn, (q, k, v))``: `name` as a function of three tensors, and its operands."""
    g = torch.Generator().manual_seed(3)
    fn = {
        "adaptive_attention": lambda q, k, v: adaptive_attention(q, k, v),
        "attention_entropy": lambda q, k, v: attention_entropy(q, k)[0],
    }[name]
    return fn, tuple(torch.randn(2, 3, 9, 4, generator=g) for _ in range(3))


@pytest.mark.parametrize("name", ["adaptive_attention", "attention_entropy"])
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_attention_refuses_jit_trace_by_name(name):
    """A trace keeps its example's path (the overflow guard, the NaN rows) for every later
    input; tracing the composition's fused CPU kernel killed the process (SIGSEGV)."""
    fn, (q, k, v) = _attention_call(name)
    with pytest.raises(TypeError, match=rf"{name} cannot be traced by torch\.jit\.trace"):
        torch.jit.trace(fn, (q, k, v))


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("name", ["adaptive_attention", "attention_entropy"])
def test_attention_refuses_torch_export_by_name(name, strict):
    """An exported graph cannot branch on the operands' magnitudes: torch.export stopped
    at the host read with "Could not guard on data-dependent expression"; it now stops at
    the attention function with the reason (in Dynamo's report under ``strict=True``).
    ``adaptive_softmax`` reads nothing on the host and exports."""
    if not hasattr(torch.compiler, "is_exporting"):
        pytest.skip("torch.compiler.is_exporting needs torch 2.4")
    fn, (q, k, v) = _attention_call(name)

    class Model(torch.nn.Module):
        def forward(self, q, k, v):
            return fn(q, k, v)

    torch._dynamo.reset()
    with pytest.raises(Exception, match=rf"{name} cannot be exported by torch\.export") as exc:
        torch.export.export(Model(), (q, k, v), strict=strict)
    assert strict or exc.type is TypeError
    torch.testing.assert_close(fn(q, k, v), fn(q, k, v), rtol=0, atol=0)  # eager still runs

    class Softmax(torch.nn.Module):
        def forward(self, x):
            return adaptive_softmax(x)

    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(4))
    exported = torch.export.export(Softmax(), (x,), strict=strict)
    torch.testing.assert_close(exported.module()(x), adaptive_softmax(x), rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # (the checks of the shape)
def test_adaptive_softmax_traces_to_eagers_values():
    """adaptive_softmax reads no value on the host: a trace from plain rows gives eager's
    values on masked, NaN and overflowing rows too."""
    g = torch.Generator().manual_seed(4)
    traced = torch.jit.trace(lambda x: adaptive_softmax(x), (torch.randn(4, 7, generator=g),))
    x = torch.randn(4, 7, generator=g, dtype=torch.float32)
    x[0, :3] = -torch.inf
    x[1, 2] = torch.nan
    x[2, :2] = torch.tensor([3e38, -3e38])
    x[3, :] = -torch.inf
    torch.testing.assert_close(traced(x), adaptive_softmax(x), rtol=0, atol=0, equal_nan=True)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # (the checks of the shape)
def test_adaptive_softmax_traces_with_a_gradient():
    """Traced from rows that require grad, the module records the same operations as
    without a graph (the lean backward's autograd Function, or intermediates written over
    without a graph, made the trace's check fail: "Graphs differed across invocations"),
    and the trace's values and gradients are eager's."""
    g = torch.Generator().manual_seed(5)
    module = AdaptiveSoftmax()
    traced = torch.jit.trace(module, (torch.randn(4, 7, generator=g).requires_grad_(),))
    x = torch.randn(4, 7, generator=g)
    x[0, :3] = -torch.inf
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = traced(xa), module(xb)
    torch.testing.assert_close(ya, yb, rtol=0, atol=0)
    weights = torch.randn(4, 7, generator=g)
    (ya * weights).sum().backward()
    (yb * weights).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-7)


def test_constants_are_marked_as_torchs_decorator_marks_them():
    """The schedule's host-side helpers are marked for ``torch.compile`` without importing
    Dynamo; torch's own decorator must still mark a function by exactly that attribute
    (if a torch release changes it, this fails before the compile tests do)."""
    from softmaxtheory.accelerated import _torch_common

    def theirs():
        return 1

    def ours():
        return 1

    torch.compiler.assume_constant_result(theirs)
    _torch_common.constant_under_compile(ours)
    assert vars(theirs) == vars(ours) == {"_dynamo_marked_constant": True}
    for fn in (_torch_common.poly_floats, _torch_common.beta_bound):
        assert fn._dynamo_marked_constant is True


@pytest.mark.parametrize(
    "make",
    [lambda: Constant(2.0), lambda: PaperPolynomial(), lambda: LogLength("0.3"),
     lambda: Polynomial(("1", "2"), "0.5")],
    ids=["Constant", "PaperPolynomial", "LogLength", "Polynomial"],
)  # fmt: skip
def test_a_schedule_built_inside_a_compiled_function(make):
    """``torch.compile(lambda x: adaptive_softmax(x, schedule=Constant(2.0)))`` raised
    InternalTorchDynamoError ("'Constant' object has no attribute 'beta'"): Dynamo traced
    the construction and passed the host-side helpers an object whose __post_init__ had
    not run. Constructors are now marked as torch.compiler.disable marks a function (the
    attribute checked below): the graph breaks there, and the values are eager's."""

    def theirs():
        return 1

    assert torch.compiler.disable(theirs, recursive=False)._torchdynamo_disable is True
    torch._dynamo.reset()
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(4))

    def f(t):
        return adaptive_softmax(t, schedule=make())

    torch.testing.assert_close(torch.compile(f, backend="eager")(x), f(x), rtol=0, atol=0)
    module = torch.compile(lambda t: AdaptiveSoftmax(schedule=make())(t), backend="eager")
    torch.testing.assert_close(module(x), f(x), rtol=0, atol=0)


def test_import_and_first_calls_leave_dynamo_unloaded():
    """``torch._dynamo`` takes as long to import as torch itself; the torch path neither
    imports it nor Triton on CPU (a fresh process)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "import softmaxtheory.accelerated.torch as T\n"
        "q = torch.randn(2, 3, 5, 4, requires_grad=True)\n"
        "T.adaptive_attention(q, q, q).sum().backward()\n"
        "T.attention_entropy(q, q)[0].sum().backward()\n"
        "T.adaptive_softmax(q).sum().backward()\n"
        "print(sorted(m for m in ('torch._dynamo', 'triton') if m in sys.modules))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["[]"]


def test_compiled_module_gradients():
    torch._dynamo.reset()
    module = AdaptiveSoftmax()
    x = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    (compiled(a) ** 2).sum().backward()
    (module(b) ** 2).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- masks at the edges


def _ref_attention(q, k, v, mask=None, causal=False):
    m = None if mask is None else mask.numpy()
    return R.adaptive_attention(q.numpy(), k.numpy(), v.numpy(), mask=m, is_causal=causal)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_with_one_key_column_covers_every_key(backend):
    """A (..., L, 1) mask (a query-padding mask) broadcasts over all S keys: every query keeps
    all keys or none, and the entropy counts S keys, not 1."""
    from softmaxtheory.accelerated.torch import attention_entropy

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, n, d, generator=g, dtype=torch.float64)
               for n, d in ((5, 4), (7, 4), (7, 2)))  # fmt: skip
    mask = torch.tensor([True, False, False, True, False]).unsqueeze(-1)  # (5, 1)
    h, _ = attention_entropy(q, k, attn_mask=mask)
    h_all, _ = attention_entropy(q, k)
    torch.testing.assert_close(h[..., [0, 3]], h_all[..., [0, 3]])
    assert torch.all(h[..., [1, 2, 4]] == 0)
    out = adaptive_attention(q, k, v, mask, backend=backend)
    np.testing.assert_allclose(out.numpy(), _ref_attention(q, k, v, mask), rtol=1e-12, atol=1e-13)


def test_mask_that_would_widen_the_keys_is_refused():
    """A mask cannot enlarge the (L, S) axes: (2, 3) against one key is an error, as in the
    reference, not a row with log 3 entropy."""
    from softmaxtheory.accelerated.torch import attention_entropy

    q, k, v = torch.randn(2, 4), torch.randn(1, 4), torch.randn(1, 2)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="attn_mask of shape"):
        attention_entropy(q, k, attn_mask=mask)
    with pytest.raises(ValueError, match="attn_mask of shape"):
        adaptive_attention(q, k, v, mask)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_non_finite_key_does_not_reach_other_rows(backend):
    """A key holding -inf or NaN makes NaN only the rows that see it: a causal row before it,
    or a row whose mask removes it, is the reference's finite answer."""
    q = torch.tensor([[-0.3, -0.7], [1.4, 0.04]], dtype=torch.float64)
    v = torch.tensor([[0.85, 2.0], [0.5, 0.1]], dtype=torch.float64)
    k = torch.tensor([[1.4, 1.0], [0.03, -math.inf]], dtype=torch.float64)
    out = adaptive_attention(q, k, v, is_causal=True, backend=backend)
    ref = _ref_attention(q, k, v, causal=True)
    np.testing.assert_allclose(out[0].numpy(), ref[0], rtol=1e-12)
    assert torch.isnan(out[1]).all() and np.isnan(ref[1]).all()
    k = torch.tensor([[1.4, 1.0], [0.03, math.nan]], dtype=torch.float64)
    mask = torch.tensor([[True, False], [True, False]])
    out = adaptive_attention(q, k, v, mask, backend=backend)
    np.testing.assert_allclose(out.numpy(), _ref_attention(q, k, v, mask), rtol=1e-12)


def test_user_schedule_refuses_a_gradient_through_beta():
    """A user's Schedule is evaluated through numpy, so no gradient can flow through β: with
    detach_beta=False and inputs that require grad it is an error naming the remedy, not a
    gradient that silently treats β as constant; detach_beta=True runs."""
    from softmaxtheory.spec import Schedule

    class Squared(Schedule):
        needs_entropy = True

        def beta_float(self, entropy, n_eff):
            return 1.0 + np.asarray(entropy, dtype=np.float64) ** 2

    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="detach_beta=True"):
        adaptive_softmax(x, schedule=Squared())
    adaptive_softmax(x, schedule=Squared(), detach_beta=True).sum().backward()
    q, k, v = (torch.randn(1, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    with pytest.raises(ValueError, match="detach_beta=True"):
        adaptive_attention(q, k, v, schedule=Squared())
    with torch.no_grad():
        adaptive_attention(q, k, v, schedule=Squared())


GRAPH_SHAPES = [
    ((2, 3, 4), (2, 0, 4), (2, 0, 4)),  # no keys
    ((0, 3, 4),) * 3,  # empty batch
    ((2, 0, 4), (2, 3, 4), (2, 3, 4)),  # no queries
    ((2, 3, 4), (2, 3, 4), (2, 3, 0)),  # values of width 0
]


@pytest.mark.parametrize("shape", GRAPH_SHAPES)
def test_zero_size_results_join_the_graph(shape):
    """As SDPA's, a zero-size or no-key result requires grad when an input does, and its
    backward gives zero gradients instead of failing."""
    from softmaxtheory.accelerated.torch import attention_entropy

    q, k, v = (torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shape)
    out = adaptive_attention(q, k, v)
    assert out.requires_grad
    out.sum().backward()
    assert all(t.grad is not None and torch.all(t.grad == 0) for t in (q, k, v))
    h, _ = attention_entropy(q, k)
    assert h.requires_grad


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("qs", "ks"),
    [
        ((1, 0, 5, 8), (1, 2, 7, 8)),  # the report's shapes
        ((2, 3, 0, 5, 8), (2, 3, 2, 7, 8)),  # three leading dimensions
        ((2, 3, 0, 5, 8), (2, 3, 2, 0, 8)),  # and no keys
    ],
)
def test_gqa_with_no_query_heads_gives_sdpas_empty_result(qs, ks, backend, requires_grad):
    """enable_gqa with zero query heads and some key heads: SDPA answers an empty result,
    where the key heads were expanded to the zero query heads (a raw ``expand`` error). Now
    the empty result every zero size gets, whose backward gives empty or zero gradients. A
    key head count that does not divide the query heads' (0 included, where SDPA answers
    zeros) is refused by name."""
    import torch.nn.functional as F  # noqa: N812

    g = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(s, generator=g, dtype=torch.float64).requires_grad_(requires_grad)
        for s in (qs, ks, (*ks[:-1], 3))
    )
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    out = adaptive_attention(q, k, v, enable_gqa=True, backend=backend)
    assert (out.shape, out.dtype, out.requires_grad) == (want.shape, want.dtype, requires_grad)
    h, lse = attention_entropy(q, k, enable_gqa=True)
    stats = (want.shape[:-1], torch.float64, requires_grad)
    assert all((t.shape, t.dtype, t.requires_grad) == stats for t in (h, lse))
    if requires_grad:
        (out.sum() + h.sum() + lse.sum()).backward()
        for t in (q, k, v):
            assert t.grad.shape == t.shape and not t.grad.any()
    # 0 key heads for some query heads, and a count that does not divide: named errors
    for hq, hkv in ((2, 0), (3, 2)):
        q, k, v = torch.ones(1, hq, 5, 8), torch.ones(1, hkv, 7, 8), torch.ones(1, hkv, 7, 3)
        with pytest.raises(ValueError, match="enable_gqa needs"):
            adaptive_attention(q, k, v, enable_gqa=True, backend=backend)
        with pytest.raises(ValueError, match="enable_gqa needs"):
            attention_entropy(q, k, enable_gqa=True)


def test_triton_reads_a_wide_bias_in_its_own_dtype():
    """A float32 bias beside bfloat16 queries is not rounded to bfloat16: the Triton kernels
    read it as it is, and ``auto`` does not send it through SDPA (which would round it)."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812

    q, k, v = (torch.randn(1, 2, 4, 8).to(torch.bfloat16) for _ in range(3))
    bias = -0.37 * (torch.arange(4.0) + 200).expand(4, 4)
    p = A.prepare(q, k, v, bias, False, None)
    assert A._bias_wider(p) and A._triton_mask(p)[1].dtype == torch.float32
    assert not A._bias_wider(A.prepare(q, k, v, bias.to(torch.bfloat16), False, None))


@pytest.mark.parametrize("backend", BACKENDS)
def test_additive_minus_inf_does_not_shield_a_nan_logit(backend):
    """An additive mask is added to the logit: a NaN query or an infinite key under -inf still
    gives a NaN logit, so NaN rows, as the reference and the CPU kernels give; a boolean mask
    removes the key first (zeros for the fully masked query)."""
    from softmaxtheory.accelerated.torch import attention_entropy

    q = torch.tensor([[math.nan, 1.0], [0.5, 0.2]], dtype=torch.float64)
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [math.inf, 1.0]], dtype=torch.float64)
    v = torch.arange(6.0, dtype=torch.float64).reshape(3, 2)
    add = torch.tensor([[-math.inf] * 3, [0.0, 0.0, -math.inf]], dtype=torch.float64)
    for mask in (add, torch.isfinite(add)):
        out = adaptive_attention(q, k, v, mask, backend=backend)
        ref = _ref_attention(q, k, v, mask)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12, atol=0)  # NaN where ref is
    h, _ = attention_entropy(q, k, add)
    assert torch.isnan(h).all()


@pytest.mark.parametrize("schedule", [Constant("1e39"), Constant("1e300"), LogLength("1e300")],
                         ids=repr)  # fmt: skip
def test_beta_above_the_float_maximum_is_not_nan(schedule):
    """A β beyond float32's maximum must not round to inf (inf * 0 = NaN): β x is formed in
    float64 where β is finite, so softmax and attention give the reference's answer."""
    x = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1e-45, 2e-45], [3.0, 3.0, -1.0]])
    out = adaptive_softmax(x, schedule=schedule)
    ref = R.adaptive_softmax(x.numpy(), schedule=schedule)
    np.testing.assert_allclose(out.numpy(), ref, rtol=2e-7, atol=0)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 5, 3, generator=g) for _ in range(3))
    ref = R.adaptive_attention(q.numpy(), k.numpy(), v.numpy(), schedule=schedule)
    for backend in BACKENDS:
        out = adaptive_attention(q, k, v, schedule=schedule, backend=backend)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("detach_beta", [False, True])
def test_a_gradient_past_the_float_range_overflows_to_signed_infinities(detach_beta):
    """Tied logits under β = 1e300 in float32: the exact gradient of a weight is
    β p (e_0 - p), far beyond float32's range, so its float is ±inf, and 0 where p is 0.
    The row maximum's gradient, exactly 0 (softmax is shift-invariant), was formed as
    inf - inf and made every entry NaN."""
    x = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, -1.0]], requires_grad=True)
    y = adaptive_softmax(x, schedule=Constant("1e300"), detach_beta=detach_beta)
    y[:, 0].sum().backward()
    inf = math.inf
    want = torch.tensor([[inf, -inf, -inf], [inf, -inf, 0.0]])
    assert torch.equal(x.grad, want), x.grad


# ---------------------------------------------------------------- masks SDPA refuses


@pytest.mark.parametrize(
    ("q_shape", "mask_shape"),
    [((2, 3, 5, 4), (4, 2, 3, 5, 7)), ((5, 4), (3, 5, 7)), ((5, 4), (1, 1, 5, 7))],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mask_may_not_widen_the_leading_dimensions(q_shape, mask_shape, backend):
    """SDPA's output follows q, k and v, and it refuses a mask with leading dimensions they
    lack; the mask's broadcast used to set the output's, so a (4, B, H, L, S) mask made four
    copies of the output and a (1, 1, L, S) one gave 2-D queries a 4-D result."""
    import torch.nn.functional as F  # noqa: N812

    q = torch.randn(q_shape)
    k = torch.randn((*q_shape[:-2], 7, 4))
    v = torch.randn((*q_shape[:-2], 7, 6))
    mask = torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for m in (mask, torch.zeros(mask_shape)):
        with pytest.raises(ValueError, match="would widen the leading dimensions"):
            adaptive_attention(q, k, v, m, backend=backend)
    with pytest.raises(ValueError, match="would widen the leading dimensions"):
        attention_entropy(q, k, mask)
    # broadcasting over the leading dimensions they have is still fine, as in SDPA
    ok = torch.ones((*(1,) * (len(q_shape) - 2), 5, 7), dtype=torch.bool)
    assert adaptive_attention(q, k, v, ok, backend=backend).shape == (*q_shape[:-1], 6)


def test_a_zero_dimensional_tensor_scale_is_taken_as_sdpa_takes_it():
    """``scale=torch.tensor(0.5)`` (a learned temperature, say) runs SDPA; it raised a
    TypeError here. Booleans and tensors of other shapes are still refused."""
    import torch.nn.functional as F  # noqa: N812

    q, k, v = (torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    want = F.scaled_dot_product_attention(q, k, v, scale=0.5)
    for scale in (torch.tensor(0.5), torch.tensor(0.5, dtype=torch.float64), np.float32(0.5)):
        got = adaptive_attention(q, k, v, scale=scale, schedule=Constant(1))
        torch.testing.assert_close(got, want)
    for bad in (torch.tensor(True), torch.tensor([0.5]), True):
        with pytest.raises(TypeError, match="scale must be a float"):
            adaptive_attention(q, k, v, scale=bad)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_a_float8_mask_is_refused_by_name(dtype):
    """A float8 additive mask passed the floating check and then failed inside torch
    (``"isfinite" not implemented``): a TypeError that names the dtypes to use instead."""
    dtype = getattr(torch, dtype, None) or pytest.skip("torch without float8")
    q = torch.randn(2, 5, 4)
    mask = torch.zeros(5, 5).to(dtype)
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64"):
        adaptive_attention(q, q, q, mask)


# ---------------------------------------------------------------- meta tensors


@pytest.mark.parametrize(
    ("shapes", "kwargs"),
    [
        (((2, 8, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3)), {"enable_gqa": True}),
        (((5, 4), (7, 4), (7, 6)), {"is_causal": True}),
        (((3, 5, 4), (1, 7, 4), (1, 7, 4)), {"attn_mask": (5, 1)}),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_meta_tensors_give_the_shapes_and_dtypes_of_real_ones(shapes, kwargs, dtype):
    """Shape inference on the meta device (a model built there): attention raised
    ``Cannot copy out of meta tensor`` at its host read; it now answers with the shapes,
    dtypes and gradients a real call has, computed from no values."""
    g = torch.Generator().manual_seed(5)

    def make(device):
        ts = [torch.randn(s, generator=g).to(dtype).to(device).requires_grad_() for s in shapes]
        kw = dict(kwargs)
        if "attn_mask" in kw:
            kw["attn_mask"] = torch.ones(kw["attn_mask"], dtype=torch.bool, device=device)
        return ts, kw

    (meta, kw_meta), (real, kw_real) = make("meta"), make("cpu")
    for fn in (adaptive_attention, lambda q, k, v, **kw: attention_entropy(q, k, **kw)[1]):
        got, want = fn(*meta, **kw_meta), fn(*real, **kw_real)
        assert got.device.type == "meta"
        assert (got.shape, got.dtype, got.requires_grad) == (want.shape, want.dtype, True)
        got.sum().backward()
        assert meta[0].grad.shape == meta[0].shape and meta[0].grad.device.type == "meta"


@pytest.mark.parametrize(
    ("shapes", "kwargs"),
    [
        (((2, 8, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3)), {"enable_gqa": True}),
        (((5, 4), (7, 4), (7, 6)), {"is_causal": True}),
    ],
)
def test_fake_tensors_give_the_shapes_of_real_ones(shapes, kwargs):
    """Under ``FakeTensorMode`` (memory estimators, sharding planners), whose tensors report a
    real device, the host reads raised ``DataDependentOutputException``; SDPA answers there,
    and so do these now, as on the meta device."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    real = [torch.randn(s) for s in shapes]
    want = (adaptive_attention(*real, **kwargs), attention_entropy(*real[:2], **kwargs)[0],
            adaptive_softmax(real[0], schedule=_HalfEntropy(), detach_beta=True))  # fmt: skip
    with FakeTensorMode():
        fake = [torch.randn(s).requires_grad_() for s in shapes]
        got = (adaptive_attention(*fake, **kwargs), attention_entropy(*fake[:2], **kwargs)[0],
               adaptive_softmax(fake[0], schedule=_HalfEntropy(), detach_beta=True))  # fmt: skip
        for g, w in zip(got, want, strict=True):
            assert isinstance(g, FakeTensor) and (g.shape, g.dtype) == (w.shape, w.dtype)
        got[0].sum().backward()
        assert fake[0].grad.shape == fake[0].shape


class _HalfEntropy(Schedule):
    """A user's schedule (evaluated through numpy): β = 1 + H / 2."""

    needs_entropy = True

    def beta_float(self, entropy, n_eff):
        h = np.asarray(entropy, dtype=np.float64)
        shape = np.broadcast(h, np.asarray(n_eff)).shape
        return np.broadcast_to(1.0 + 0.5 * np.nan_to_num(h), shape).copy()


def test_a_user_schedules_negative_beta_is_refused():
    """A user's β < 0 made the output silently uniform on every path, as on the CPU."""

    class Negative(_HalfEntropy):
        def beta_float(self, entropy, n_eff):
            return -super().beta_float(entropy, n_eff)

        def __repr__(self) -> str:
            return "Negative()"

    x = torch.tensor([[0.0, 1.0, 2.0]])
    with pytest.raises(ValueError, match=r"Negative\(\)\.beta_float returned beta = -1\.\d+"):
        adaptive_softmax(x, schedule=Negative(), detach_beta=True)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=r"beta must be positive"):
            adaptive_attention(x, x, x, schedule=Negative(), detach_beta=True, backend=backend)


class _ByLength(Schedule):
    """A user's schedule that reads the unmasked count alone: β = 1 + n / 10."""

    needs_entropy = False

    def beta_float(self, entropy, n_eff):
        return 1.0 + 0.1 * np.asarray(n_eff, dtype=np.float64)


@pytest.mark.parametrize("schedule", [_HalfEntropy(), _ByLength()], ids=lambda s: type(s).__name__)
@pytest.mark.parametrize(
    "kwargs", [{}, {"detach_beta": True}, {"entropy_eps": 1e-9}, {"dim": 0}], ids=str
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_meta_softmax_with_a_users_schedule(schedule, kwargs, dtype):
    """adaptive_softmax (and the module) on the meta device with a user's schedule raised
    ``Cannot copy out of meta tensor`` where β is read through numpy on the host; it now
    answers as for the built-in schedules: the shape, dtype and gradient of a real call."""
    real = torch.randn(3, 4, generator=torch.Generator().manual_seed(6)).to(dtype)
    meta = real.to("meta")
    want = adaptive_softmax(real, schedule=schedule, **kwargs)
    for out in (
        adaptive_softmax(meta, schedule=schedule, **kwargs),
        AdaptiveSoftmax(schedule=schedule, **kwargs)(meta),
    ):
        assert out.device.type == "meta"
        assert (out.shape, out.dtype) == (want.shape, want.dtype)
    meta.requires_grad_()
    if schedule.needs_entropy and "detach_beta" not in kwargs:
        with pytest.raises(ValueError, match="detach_beta=True"):  # as for real tensors
            adaptive_softmax(meta, schedule=schedule, **kwargs)
        return
    out = adaptive_softmax(meta, schedule=schedule, **kwargs)
    assert out.requires_grad
    out.sum().backward()
    assert meta.grad.device.type == "meta" and meta.grad.shape == meta.shape


# ---------------------------------------------------------------- autocast


@pytest.mark.parametrize("backend", ["auto", "hybrid", "composition", "chunked"])
@pytest.mark.parametrize("kind", ["none", "causal", "bool", "bias"])
def test_autocast_computes_as_sdpa_does(backend, kind):
    """Under ``torch.autocast``, SDPA casts float32 operands to the autocast dtype and
    returns that dtype. The backends disagreed: the composition ignored autocast, while
    autocast rounded the chunked path's and the hybrid's own products (errors of 2e-2
    against float32). Now every backend equals its call on the cast operands, bit for
    bit, with autocast off inside; gradients reach the float32 leaves."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 3, 17, 8, generator=g).requires_grad_() for _ in range(3))
    keep = torch.rand(17, 17, generator=g) > 0.3
    keep[:, 0] = True
    mask = {"bool": keep, "bias": torch.where(keep, torch.randn(17, 17, generator=g), -math.inf)}
    kw = {"attn_mask": mask[kind]} if kind in mask else {"is_causal": kind == "causal"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = adaptive_attention(q, k, v, backend=backend, **kw)
        h, lse = attention_entropy(q, k, **kw)
        assert torch.is_autocast_enabled("cpu")  # left as it was
    low = {**kw, "attn_mask": kw["attn_mask"].bfloat16()} if kind == "bias" else kw
    cast = [t.bfloat16() for t in (q, k, v)]
    assert out.dtype == torch.bfloat16 and h.dtype == lse.dtype == torch.float32
    assert torch.equal(out, adaptive_attention(*cast, backend=backend, **low))
    h_low, lse_low = attention_entropy(*cast[:2], **low)
    assert torch.equal(h, h_low) and torch.equal(lse, lse_low)
    (out.float().sum() + h.sum()).backward()
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # float64 is not autocast's to cast
        assert adaptive_attention(*(t.double() for t in (q, k, v)), **kw).dtype == torch.float64


def test_autocast_casts_every_floating_operand_but_float64_as_sdpa_does():
    """SDPA under float16 autocast casts a bfloat16 key to float16 as it casts float32
    ones; casting float32 alone left the dtypes mixed and raised a TypeError that listed
    them after the cast."""
    g = torch.Generator().manual_seed(9)
    q, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(2))
    k = torch.randn(1, 2, 5, 8, generator=g).bfloat16()
    with torch.autocast("cpu", dtype=torch.float16):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        out = adaptive_attention(q, k, v, schedule=Constant(1.0))
        h, _ = attention_entropy(q, k)
    assert want.dtype == out.dtype == torch.float16
    cast = [t.half() for t in (q, k, v)]
    assert torch.equal(out, adaptive_attention(*cast, schedule=Constant(1.0)))
    assert torch.equal(h, attention_entropy(*cast[:2])[0])


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_mask_entry_leaves_the_other_rows_gradients_finite(backend, bad):
    """A NaN or +inf additive-mask entry makes its row NaN; a loss on the other rows got NaN
    for every key's and value's gradient (and, +inf on the hybrid, the queries'): the
    entry's NaN weights met every key and value in the backward's sums. The entries are 0
    inside the kernels now, the row is NaN as before, and the other rows' gradients are
    those of the same mask with a 0 there, bit for bit."""
    g = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(1, 1, n, d, generator=g) for n, d in ((4, 8), (6, 8), (6, 3)))
    mask = torch.zeros(4, 6)
    mask[1, 1] = -math.inf
    zero = mask.clone()
    mask[3, 2] = bad
    grads = []
    for m in (mask, zero):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = adaptive_attention(*leaves, attn_mask=m, backend=backend)
        if m is mask:
            assert torch.isnan(out[..., 3, :]).all()
        grads.append(torch.autograd.grad(out[..., :3, :].sum(), leaves))
    for got, want in zip(*grads, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["auto", "chunked", "composition", "hybrid"])
@pytest.mark.parametrize(
    ("q", "k", "scale", "dtype"),
    [
        (1e308, [0.0, 0.0], 1e308, torch.float64),  # every logit 0: was NaN
        (1e300, [1e-300, 0.0], 1e300, torch.float64),  # logits 1e300 and 0: NaN, hybrid 0
        (1e160, [0.0, 0.0], 1e160, torch.float64),  # chunked NaN, hybrid 0
        (3e38, [1e-30, 0.0], 1e30, torch.float32),  # float32: NaN on every backend
    ],
)
def test_scaled_queries_beyond_the_float_range_with_small_logits(backend, q, k, scale, dtype):
    """``scale * q`` overflows where the logits ``scale * q * k`` do not (keys near 0): the
    products are formed before the scale. Every backend gave NaN or (hybrid) 0 where the
    reference gives the weighted values; the entropy's pass is the same."""
    qt = torch.tensor([[q]], dtype=dtype)
    kt = torch.tensor([[x] for x in k], dtype=dtype)
    vt = torch.tensor([[1.0], [3.0]], dtype=dtype)
    want = R.adaptive_attention(qt.double().numpy(), kt.double().numpy(), vt.double().numpy(),
                                scale=scale)  # fmt: skip
    got = adaptive_attention(qt, kt, vt, scale=scale, backend=backend)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-6, atol=0)
    h, _ = attention_entropy(qt, kt, scale=scale)
    logits = scale * (qt.double().numpy() @ kt.double().numpy().T)
    np.testing.assert_allclose(h.double().numpy(), R.entropy(logits), rtol=1e-6, atol=1e-12)


def _far_operands(case):
    """``(q, k, v, kwargs)`` of the cases of the next test (float32 unless named)."""
    g = torch.Generator().manual_seed(12)
    if case == "raw products overflow":  # q . k = 1e40 > float32's maximum, logits ~1
        q, k = torch.tensor([[1e20]]), torch.tensor([[1e20], [0.0], [-5e19]])
        return q, k, torch.tensor([[1.0], [0.0], [2.0]]), {"scale": 1e-40}
    if case == "raw products overflow, float64":
        q = torch.tensor([[1e155]], dtype=torch.float64)
        k = torch.tensor([[1e155], [0.0]], dtype=torch.float64)
        return q, k, torch.tensor([[1.0], [0.0]], dtype=torch.float64), {"scale": 1e-310}
    if case == "scale rounds to 0":  # 1e-50 is 0 in float32: causal rows lost their weights
        q, k = torch.ones(2, 1), torch.ones(2, 1)
        return q, k, torch.tensor([[1.0], [3.0]]), {"scale": 1e-50, "is_causal": True}
    if case == "subnormal scale":  # 3e-45 is a float32 subnormal 7 % off
        q, k = torch.tensor([[1e25]]), torch.tensor([[1e20], [-1e20], [0.0]])
        return q, k, torch.tensor([[1.0], [0.0], [0.0]]), {"scale": 3e-45}
    if case == "subnormal scaled queries":  # scale * q ~ 1e-44 against keys of 2.5e37
        q = torch.full((2, 4096), 1e-35)
        k = (torch.rand(5, 4096, generator=g) + 0.5) * 2.5e37
        return q, k, torch.randn(5, 2, generator=g), {"scale": 1e-9}
    # "keys summed as values": the composition's pass 1 sums e^(x - m) k over the keys, and a
    # schedule that grows with the entropy (that of 4096 near-equal keys, 8.3) shows it
    q, k = torch.tensor([[2e-36]]), torch.rand(4096, 1, generator=g) * 1e35 + 1.5e36
    v = torch.randn(4096, 1, generator=g)
    return q, k, v, {"scale": 1.0, "schedule": Polynomial((0.5, 1.0))}  # beta = 1 + H / 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "case",
    [
        "raw products overflow",
        "raw products overflow, float64",
        "scale rounds to 0",
        "subnormal scale",
        "subnormal scaled queries",
        "keys summed as values",
    ],
)
def test_every_order_of_the_scale_forms_the_logits(backend, case):
    """The kernels apply the scale in their own order, so each order must work, not only
    the logits' size: raw products beyond the float range with a tiny scale gave 0 (auto,
    composition) and NaN (hybrid); a scale that float32 rounds to 0 gave causal rows of
    0; a subnormal scale, or scaled queries in the subnormals, lost digits (7 %, 82 ulps);
    4096 keys of 2e36 overflowed the composition's sum of the keys (an entropy of 0 for
    8.3). The overflow guard now sends these to the safe path, and each is within the
    oracle's bound; so is pass 1 on its own."""
    q, k, v, kw = _far_operands(case)
    out = adaptive_attention(q, k, v, backend=backend, **kw)
    assert_attention_close(out, (q, k, v), **kw)
    kw.pop("schedule", None)
    h, lse = attention_entropy(q, k, **kw)
    x = (kw["scale"] * q.double().numpy()) @ k.double().numpy().T  # (no overflow here)
    if kw.get("is_causal"):
        x = np.where(np.tri(*x.shape, dtype=bool), x, -np.inf)
    np.testing.assert_allclose(h.double().numpy(), R.entropy(x), rtol=1e-5, atol=1e-6)
    want_lse = np.logaddexp.reduce(x, axis=-1)
    np.testing.assert_allclose(lse.double().numpy(), want_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_far_below_their_bound_keep_their_small_products(backend):
    """The bound scale * max|q| * max|k| * D (2**2047 here) sent the call to the safe path,
    whose power-of-two scaling made the product of two small entries underflow: the logit
    1 became 0 and the output 1/3 instead of 0.523. A row whose unscaled logits fit keeps
    them; a row whose logits overflow float64 (the first below) takes the scaled ones.
    The gradient stays finite."""
    q = torch.tensor([[0.0, 1e308, 1.0], [1e308, 0.0, 0.0]], dtype=torch.float64)
    k = torch.tensor([[0.0, 0.0, 0.0], [1e308, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.0], [2.0], [1.0]], dtype=torch.float64)
    want = R.adaptive_attention(q.numpy(), k.numpy(), v.numpy())
    for rows in ([0], [1], [0, 1]):
        got = adaptive_attention(q[rows], k, v, backend=backend)
        np.testing.assert_allclose(got.numpy(), want[rows], rtol=1e-12, atol=0)
    # a logit overflowing downward (-1e616) beside 0 and 0.58 has weight 0: the row keeps
    # its unscaled logits (it took the scaled ones, and gave 1/2 for 0.640)
    qn = torch.tensor([[0.0, -1e308, 1.0]], dtype=torch.float64)
    kn = torch.tensor([[0.0, 1e308, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    vn = torch.tensor([[0.0], [0.0], [1.0]], dtype=torch.float64)
    np.testing.assert_allclose(
        adaptive_attention(qn, kn, vn, backend=backend).numpy(),
        R.adaptive_attention(qn.numpy(), kn.numpy(), vn.numpy()), rtol=1e-12, atol=0,
    )  # fmt: skip
    h, _ = attention_entropy(q[:1], k)
    np.testing.assert_allclose(h.numpy(), R.entropy(q[:1].numpy() @ k.numpy().T / math.sqrt(3)))
    qg = q.clone().requires_grad_()
    adaptive_attention(qg, k, v, backend=backend).sum().backward()
    assert torch.isfinite(qg.grad[0]).all()


@pytest.mark.parametrize(
    "schedule", [Constant("1e-310"), Constant("1e-400"), LogLength("1e-310"), Constant("3e-306")]
)
@pytest.mark.parametrize(
    "row", [[1e308, -1e308], [1e308, -1e308, -math.inf, 0.0], [-math.inf, 3.0, 1.0]]
)
def test_tiny_beta_with_a_shift_beyond_the_float_range(schedule, row):
    """A shift x - m beyond the float range was clamped to -1.8e308 before β scaled it:
    under β = 1e-310, [1e308, -1e308] gave [0.50449, 0.49551] for [0.50500, 0.49500] (the
    exponent -0.018 for -0.02), in adaptive_softmax and in attention alike."""
    from softmaxtheory.testing import assert_adaptive_softmax_close

    x = torch.tensor(row, dtype=torch.float64, requires_grad=True)
    got = adaptive_softmax(x, schedule=schedule)
    assert_adaptive_softmax_close(got.detach(), x.detach(), schedule=schedule, strict=True)
    got[0].backward()
    assert torch.isfinite(x.grad).all()
    finite = [v for v in row if v > -math.inf]
    k = torch.tensor([[v] for v in finite], dtype=torch.float64)
    v = torch.arange(1.0, len(finite) + 1, dtype=torch.float64).unsqueeze(-1)
    q = torch.ones(1, 1, dtype=torch.float64)
    for backend in ("auto", "composition", "chunked"):
        out = adaptive_attention(q, k, v, scale=1.0, schedule=schedule, backend=backend)
        assert_attention_close(out, (q, k, v), scale=1.0, schedule=schedule, strict=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["auto", "composition", "hybrid", "chunked"])
def test_values_near_the_float_maximum_do_not_overflow_the_fused_sums(dtype, backend):
    # the fused kernels sum e^{x - m} v before dividing: values of max / 4 gave inf, and
    # NaN where a later key raised the running maximum (inf * e^{-800} = inf * 0)
    fmax = torch.finfo(dtype).max
    S, D = 600, 16
    q = torch.zeros(1, 1, 1, D, dtype=dtype)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, S, D, dtype=dtype)
    k[0, 0, -1, 0] = 800.0  # the last key dominates: the output is 1 + 599 e^-800 max / 4
    v = torch.full((1, 1, S, D), fmax / 4, dtype=dtype)
    v[0, 0, -1] = 1.0
    out = adaptive_attention(q, k, v, scale=1.0, backend=backend)
    assert torch.all(out == 1.0), out
    # uniform weights: the output is the value itself, max / 4
    v = torch.full((1, 1, 8, 2), fmax / 4, dtype=dtype, requires_grad=True)
    q, k = torch.zeros(1, 1, 3, 2, dtype=dtype), torch.zeros(1, 1, 8, 2, dtype=dtype)
    out = adaptive_attention(q, k, v, schedule=Constant(1), backend=backend)
    assert torch.all(out == fmax / 4), out
    out.sum().backward()  # d out / d v = the weights, 3 queries * 1/8 each
    torch.testing.assert_close(v.grad, torch.full_like(v, 3 / 8), rtol=1e-12, atol=0)


@pytest.mark.parametrize("backend", ["auto", "composition", "hybrid", "chunked"])
def test_values_at_the_float_maximum_give_the_float_maximum(backend):
    """Every value at +-max: the output is +-max, which rounded a few ulps above it and
    became inf when multiplied back by the scale taken off the values (float64, 40 keys;
    float32, 3 keys)."""
    torch.manual_seed(0)
    for dtype, S in ((torch.float64, 40), (torch.float32, 3)):
        fmax = torch.finfo(dtype).max
        q, k = torch.randn(3, 4, dtype=dtype), torch.randn(S, 4, dtype=dtype)
        v = torch.full((S, 2), fmax, dtype=dtype)
        v[:, 1] = -fmax
        for schedule in (None, Constant(1)):
            out = adaptive_attention(q, k, v, schedule=schedule, backend=backend)
            assert torch.isfinite(out).all(), out
            assert_attention_close(out, (q, k, v), schedule=schedule)


@pytest.mark.parametrize("backend", ["auto", "composition", "hybrid", "chunked"])
def test_small_values_beside_huge_ones_keep_their_bits(backend):
    """Values near the float maximum are scaled down before the fused kernels; one scale
    for every column took a column of subnormal values 78 ulps off (its bound: a few).
    Each column has its own scale: the small column's output is the one it has alone."""
    torch.manual_seed(0)
    S = 64
    q, k = torch.randn(2, 4, dtype=torch.float64), torch.randn(S, 4, dtype=torch.float64)
    v = torch.empty(S, 2, dtype=torch.float64)
    v[:, 0] = 1e307
    v[:, 1] = torch.randint(1, 10**6, (S,)).double() * 5e-324
    out = adaptive_attention(q, k, v, backend=backend)
    alone = adaptive_attention(q, k, v[:, 1:], backend=backend)
    assert torch.equal(out[:, 1:], alone), (out[:, 1], alone[:, 0])
    assert_attention_close(out, (q, k, v))
    # grouped-query attention: two key heads, each with its own columns' scales
    q = torch.randn(1, 4, 3, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 5, 3, dtype=torch.float64)
    v[:, 0, :, 0] = torch.finfo(torch.float64).max / 2
    v[:, 1, :, 1] = 1e-310
    out = adaptive_attention(q, k, v, enable_gqa=True, backend=backend)
    rep = (q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    assert_attention_close(out, rep)


# ---------------------------------------------------------------- the operands' scan


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str
)
def test_operand_scan_is_the_largest_magnitude(dtype):
    """The scan's max |t| (aminmax on the CPU): exact, NaN over inf, inf, empty gives 0."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812

    g = torch.Generator().manual_seed(4)
    base = torch.randn(3, 5, 7, generator=g).to(dtype)
    cases = {"random": base, "negative peak": base - 100, "positive peak": base + 100}
    for name, t in cases.items():
        want = t.abs().amax()
        assert A._scan([t]).tolist() == [want.item()], name
    for spot, want in ((math.inf, math.inf), (-math.inf, math.inf), (math.nan, math.nan)):
        for place in (0, 50, 104):
            t = base.clone().reshape(-1)
            t[place] = spot
            got = A._scan([t.reshape(3, 5, 7)]).item()
            assert got == want or (math.isnan(want) and math.isnan(got)), (spot, place)
    t = base.clone().reshape(-1)
    t[3], t[9] = math.inf, -math.nan
    assert math.isnan(A._scan([t]).item())  # a NaN of either sign wins over an infinity
    peak = base.abs().amax().item()
    assert A._scan([base, torch.empty(0, 4, dtype=dtype), -base]).tolist() == [peak, 0.0, peak]


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_an_integer_float64_cannot_hold_is_refused(dtype):
    """Integer tensors are promoted to float64; 2**53 + 1 (and 2**64 - 1) were rounded,
    and [2**53, 2**53 + 1] gave 0.5 each where the reference refuses the row. Refused now,
    naming the argument; integers float64 holds are promoted as before."""
    top = 2**53 + 1 if dtype == torch.int64 else 2**64 - 1
    x = torch.tensor([2**53, top], dtype=dtype)
    with pytest.raises(ValueError, match=rf"x holds the integer {top}, which float64"):
        adaptive_softmax(x)
    with pytest.raises(ValueError, match=rf"k holds the integer {top}, which float64"):
        adaptive_attention(torch.ones(1, 1, dtype=dtype), x[:, None], torch.ones(2, 1))
    held = torch.tensor([2**60, 2**60 + 256], dtype=dtype)
    want = R.adaptive_softmax(np.array([2**60, 2**60 + 256], dtype=np.uint64))
    np.testing.assert_allclose(adaptive_softmax(held).numpy(), want, rtol=1e-15, atol=0)
