"""The conformance suite checks what a kernel leaves in memory: its inputs and its results.

A kernel that writes its result into its input, or returns a buffer that its next call
overwrites, computes the right values in every call; before the suite gave the kernel
private copies and compared bits, ``softmaxtheory check`` passed both.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from softmaxtheory import conformance as conf
from softmaxtheory._check.memory import changed, private_copy, snapshot
from softmaxtheory._check.properties import FRESH_CALLS
from softmaxtheory._check.runner import Failed
from tests.support import broken_kernels as bk

torch = pytest.importorskip("torch")


# -- snapshots compare bits -------------------------------------------------------------


def test_a_nan_equals_itself_and_a_signed_zero_does_not():
    a = np.array([np.nan, 0.0, 1.0])
    shot = snapshot(a)
    assert changed(shot, snapshot(a.copy())) is None  # NaN != NaN as values, equal as bits
    b = a.copy()
    b[1] = -0.0
    change = changed(shot, snapshot(b))
    assert change is not None and change.index == (1,) and change.count == 1
    assert math.copysign(1.0, change.after) == -1.0
    assert "1 of its 3 elements changed (the first at index (1,): 0.0 became -0.0)" in str(change)


def test_a_snapshot_is_a_copy_of_the_values():
    a = np.arange(6.0).reshape(2, 3)
    shot = snapshot(a)
    a[1, 2] = 7.0
    change = changed(shot, snapshot(a))
    assert change is not None
    assert (change.index, change.before, change.after) == ((1, 2), 5.0, 7.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.bool])
def test_torch_tensors_of_every_width(dtype):
    t = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).to(dtype)
    shot = snapshot(t)
    assert changed(shot, snapshot(t.clone())) is None
    t[0, 1] = 1
    change = changed(shot, snapshot(t))
    assert change is not None and change.index == (0, 1)
    assert (change.before, change.after) == (0, 1)


def test_a_resized_array_is_a_change_and_other_objects_are_not_compared():
    shot = snapshot(np.zeros(3))
    assert "its shape changed from (3,) to (4,)" in str(changed(shot, snapshot(np.zeros(4))))
    assert snapshot([1.0, 2.0]) is None
    assert snapshot(np.zeros(2, dtype=complex)) is None
    assert changed(None, shot) is None and changed(shot, None) is None


def test_private_copy_shares_no_memory():
    a = np.arange(8.0)[::2]
    c = private_copy(a)
    assert not np.shares_memory(a, c) and c.flags.c_contiguous
    np.testing.assert_array_equal(a, c)


# -- writes to the input ----------------------------------------------------------------


def test_the_callers_array_is_never_handed_to_the_kernel():
    """The reference is computed from the caller's x: a kernel's write cannot reach it."""
    target = conf.Target(bk.softmax_in_place, "tests.support.broken_kernels:softmax_in_place")
    x = np.array([[0.0, 1.0, 2.0]])
    with pytest.raises(Failed, match=r"wrote to its input x \(shape \(1, 3\)\): 3 of its 3"):
        target.call(x)
    np.testing.assert_array_equal(x, [[0.0, 1.0, 2.0]])


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_attention_operands_and_the_mask_are_checked(framework):
    def scribbles_on_the_mask(q, k, v, mask=None, is_causal=False):
        out = bk.attention(q, k, v, mask=mask)
        mask[..., 0] = False
        return out

    def numpy_in(kernel):
        def wrapped(q, k, v, mask=None, is_causal=False):
            conv = lambda a: a.numpy() if torch.is_tensor(a) else a  # noqa: E731
            out = kernel(conv(q), conv(k), conv(v), mask=conv(mask))
            return torch.from_numpy(out) if framework == "torch" else out

        return wrapped

    target = conf.Target(numpy_in(scribbles_on_the_mask), kind="attention", framework=framework,
                         dtype="float64")  # fmt: skip
    q = np.ones((1, 2, 3))
    mask = np.ones((2, 2), dtype=bool)
    with pytest.raises(Failed, match=r"wrote to its input mask \(shape \(2, 2\)\): 2 of its 4"):
        target.call_attention(q, q[:, :2], q[:, :2], mask, False)
    assert mask.all()


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_write_repro_reproduces(framework, capsys):
    """The repro of a write calls the kernel on the input and prints what it wrote."""
    kernel = bk.softmax_in_place if framework == "numpy" else _torch_in_place
    name = f"tests.test_check_memory:{kernel.__name__}" if framework == "torch" else (
        "tests.support.broken_kernels:softmax_in_place")  # fmt: skip
    target = conf.Target(kernel, name, framework=framework, dtype="float32")
    res = conf.run_property("values", target)
    assert res.status == "fail" and "the kernel wrote to its input x" in res.message
    snippet = res.message.split("repro:\n", 1)[1]
    exec(compile(snippet, "<repro>", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert printed == [snippet.rsplit("# ", 1)[1].strip()]
    before = snippet.splitlines()[-2].split(" was ", 1)[1].split(" before ", 1)[0]
    assert float(before) != float(printed[0])


def _torch_in_place(x):
    return x.copy_(torch.softmax(x.double(), dim=-1).to(x.dtype))


# -- results that a later call overwrites --------------------------------------------------


@pytest.mark.parametrize(
    "case",
    ["output buffer reused between calls", "torch output buffer reused between calls",
     "attention output buffer reused between calls", "a pool of two output buffers used in turn"],
)  # fmt: skip
def test_fresh_results_repro_reproduces(case, capsys):
    kernel, opts, prop = bk.CATALOGUE[case]
    bk._BUFFERS.clear()
    bk._POOL.clear()
    target = conf.Target(kernel, f"tests.support.broken_kernels:{kernel.__name__}", **opts)
    res = conf.run_property(prop, target)
    assert res.status == "fail" and "returns memory that a later call overwrites" in res.message
    # a single reused buffer is overwritten by the next call, a pool of two by the one after
    by = 3 if kernel is bk.output_pool_of_two else 2
    assert f"the result of call 1 changed when the kernel was called again (by call {by})" in (
        res.message
    )
    snippet = res.message.split("repro:\n", 1)[1]
    assert snippet.count("\nkernel(") == by - 1
    bk._BUFFERS.clear()
    bk._POOL.clear()
    exec(compile(snippet, "<repro>", "exec"), {})
    assert capsys.readouterr().out.split() == ["False"]


#: Calls of :func:`_raises_after_eight` since the counter was reset.
_CALLS = [0]


def _raises_after_eight(*operands):
    """Defect: a pool of eight result buffers that runs out (the ninth call raises)."""
    _CALLS[0] += 1
    if _CALLS[0] > 8:
        raise MemoryError("the pool of 8 result buffers is exhausted")
    return bk.attention(*operands) if len(operands) == 3 else bk.softmax(*operands)


@pytest.mark.parametrize("kind", ["softmax", "attention"])
def test_a_kernel_that_raises_on_a_later_call_has_a_repro_of_every_call(kind, capsys):
    """The repro of a kernel that raises on fresh_results' ninth call makes all nine calls:
    the failure depends on the calls before it, so the last call alone would not raise."""
    name = "tests.test_check_memory:_raises_after_eight"
    _CALLS[0] = 0
    res = conf.run_property("fresh_results", conf.Target(_raises_after_eight, name, kind=kind))
    assert res.status == "fail", res.message
    assert "the kernel raised MemoryError: the pool of 8 result buffers is exhausted" in (
        res.message
    )
    assert f"on the property's call 9 of {3 * FRESH_CALLS}" in res.message  # numpy: 3 groups
    snippet = res.message.split("repro:\n", 1)[1]
    calls = [line for line in snippet.splitlines() if line.startswith("kernel(")]
    assert len(calls) == 9 and calls[-1].endswith("# raises")
    _CALLS[0] = 0
    with pytest.raises(MemoryError, match="exhausted"):
        exec(compile(snippet, "<repro>", "exec"), {})
    assert _CALLS[0] == 9


def test_a_kernel_that_returns_the_same_values_again_is_not_a_reused_buffer():
    """Memoising by content returns one object for equal inputs; that is not a defect."""
    cache = {}

    def memo(x):
        key = x.tobytes() + str(x.shape).encode()
        if key not in cache:
            cache[key] = bk.softmax(x)
        return cache[key]

    assert conf.run_property("fresh_results", conf.Target(memo)).status == "pass"
    assert conf.run_property("values", conf.Target(memo)).status == "pass"


@pytest.mark.parametrize("kind", ["softmax", "entropy", "adaptive_softmax", "attention"])
def test_fresh_results_applies_to_every_kind(kind):
    assert "fresh_results" in conf.properties_for(kind)
    kernel = {"softmax": bk.softmax, "entropy": bk.entropy,
              "adaptive_softmax": bk.adaptive_softmax, "attention": bk.attention}[kind]  # fmt: skip
    res = conf.run_property("fresh_results", conf.Target(kernel, kind=kind))
    # small, large, one row; then the operands updated in place
    assert res.status == "pass" and res.checks == 3 * FRESH_CALLS + 1


@pytest.mark.parametrize(
    "case",
    ["a softmax memoised by its logits' identity",
     "a boolean mask's additive form cached by its address"],
)  # fmt: skip
def test_a_kernel_keeping_what_it_derived_by_identity_fails_with_a_repro(case, capsys):
    """Every call handed the kernel fresh copies of its operands, so a kernel that keeps
    what it derived from an operand by the object's identity (id, data_ptr) passed every
    property, while a caller updating a buffer in place got stale results. The operands
    are now updated in place between two calls, and the repro shows it."""
    kernel, opts, prop = bk.CATALOGUE[case]
    if opts.get("framework") == "torch":
        pytest.importorskip("torch")
    bk._BY_IDENTITY.clear()
    target = conf.Target(kernel, f"tests.support.broken_kernels:{kernel.__name__}", **opts)
    res = conf.run_property(prop, target)
    assert res.status == "fail"
    assert res.message.startswith("operands updated in place between two calls")
    assert "by the object's identity" in res.message
    snippet = res.message.split("repro:\n", 1)[1]
    bk._BY_IDENTITY.clear()
    exec(compile(snippet, "<repro>", "exec"), {})
    assert capsys.readouterr().out.split() == ["False"]


@pytest.mark.parametrize("copy", [True, False])
def test_a_0d_result_keeps_its_shape(copy):
    """An entropy of one row is 0-d; a snapshot of it is not a 1-element array."""
    a = np.full((), 1.5)
    assert snapshot(a, copy=copy).bits.shape == ()
    assert changed(snapshot(a), snapshot(a, copy=copy)) is None


# -- the device of a torch result -------------------------------------------------------


def test_a_result_on_another_device_fails():
    """A kernel that moves its result (to the CPU, say, for CUDA input) fails by name."""

    def elsewhere(x):
        return torch.softmax(x, dim=-1).to("meta")

    res = conf.run_property("dtype_shape", conf.Target(elsewhere, framework="torch"))
    assert res.status == "fail"
    assert "the kernel returned a tensor on meta for input on cpu (device not preserved" in (
        res.message
    )
