"""A torch kernel is checked in training and in inference, not only as the suite calls it.

The suite called every kernel with gradients on and inputs that do not require them.
A kernel with a path of its own for inputs that require grad (an autograd
``Function``), or for ``torch.no_grad()`` (an inference path that reuses its input's
memory), passed whatever that path did. ``dtype_shape`` and ``attention_layouts`` now
call it in each of :data:`~softmaxtheory._check.target.GRAD_MODES`; each repro makes
the call the way the suite made it.
"""

from __future__ import annotations

import numpy as np
import pytest

from softmaxtheory import conformance as conf
from softmaxtheory._check.runner import Failed
from softmaxtheory._check.target import GRAD_MODES, grad_call_lines
from softmaxtheory.spec import Constant
from tests.support import broken_kernels as bk

torch = pytest.importorskip("torch")

SDPA = torch.nn.functional.scaled_dot_product_attention


def _caught(case):
    kernel, opts, prop = bk.CATALOGUE[case]
    target = conf.Target(kernel, f"tests.support.broken_kernels:{kernel.__name__}", **opts)
    res = conf.run_property(prop, target)
    assert res.status == "fail", res.message
    return res.message


def _exec(snippet):
    exec(compile(snippet, "<repro>", "exec"), {})


def test_a_write_under_no_grad_is_caught_and_its_repro_writes_under_no_grad(capsys):
    message = _caught("torch softmax in the input's memory under no_grad")
    assert message.startswith("under torch.no_grad(), shape (2, 3, 5): the kernel wrote to its")
    snippet = message.split("repro:\n", 1)[1]
    assert "with torch.no_grad():\n    kernel(x)\n" in snippet
    _exec(snippet)
    printed = capsys.readouterr().out.split()
    assert printed == [snippet.rsplit("# ", 1)[1].strip()]  # the value it wrote
    # called plainly (gradients on), the kernel leaves x alone: the mode makes the write
    plain = snippet.replace("with torch.no_grad():\n    kernel(x)", "kernel(x)")
    _exec(plain)
    before = snippet.splitlines()[-2].split(" was ", 1)[1].split(" before ", 1)[0]
    assert capsys.readouterr().out.split() == [before]


@pytest.mark.parametrize(
    "case",
    ["torch softmax in float32 when the input requires grad",
     "torch attention in float32 when q, k, v require grad"],
)  # fmt: skip
def test_a_training_path_is_checked_and_its_repro_requires_grad(case, capsys):
    message = _caught(case)
    assert "inputs requiring grad" in message
    snippet = message.split("repro:\n", 1)[1]
    assert ".requires_grad_()" in snippet
    got = message.split("  got      ", 1)[1].split("\n", 1)[0]
    _exec(snippet)
    kernel_value, reference_value = capsys.readouterr().out.split()
    assert float(kernel_value) == float(got)
    assert abs(float(kernel_value) - float(reference_value)) > 1e-9  # float32's error
    # without requires_grad_() the same call takes the right path
    _exec(snippet.replace(".requires_grad_()", ""))
    kernel_value, reference_value = capsys.readouterr().out.split()
    assert abs(float(kernel_value) - float(reference_value)) < 1e-12


def _numpy_round_trip(x):
    """A correct kernel that computes in numpy: ``x.numpy()`` refuses inputs requiring grad."""
    return torch.from_numpy(bk.softmax(x.numpy()))


def _numpy_round_trip_attention(q, k, v, attn_mask=None, is_causal=False):
    def conv(a):
        return None if a is None else a.numpy()

    out = bk.attention(conv(q), conv(k), conv(v), mask=conv(attn_mask), is_causal=is_causal)
    return torch.from_numpy(np.ascontiguousarray(out))


@pytest.mark.parametrize(
    ("kernel", "kind", "prop"),
    [(_numpy_round_trip, "softmax", "dtype_shape"),
     (_numpy_round_trip_attention, "attention", "attention_layouts")],
)  # fmt: skip
def test_a_kernel_that_is_not_differentiable_passes_with_a_note(kernel, kind, prop):
    """Refusing inputs that require grad is a kernel's choice (an inference kernel), noted;
    its values in the other modes are still checked."""
    target = conf.Target(kernel, kind=kind, framework="torch", dtype="float64")
    res = conf.run_property(prop, target)
    assert res.status == "pass", res.message
    assert res.notes == ["inputs requiring grad refused with RuntimeError"]


def _no_inference(x):
    if not torch.is_grad_enabled():
        raise RuntimeError("this kernel needs autograd on")
    return torch.softmax(x, dim=-1)


def _attention_no_inference(q, k, v, attn_mask=None, is_causal=False):
    if torch.is_inference_mode_enabled():
        raise RuntimeError("inference tensors are not supported")
    return SDPA(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def test_raising_under_no_grad_fails_with_a_repro_that_raises():
    target = conf.Target(_no_inference, "tests.test_check_grad_modes:_no_inference",
                         framework="torch", dtype="float64")  # fmt: skip
    res = conf.run_property("dtype_shape", target)
    assert res.status == "fail"
    assert res.message.startswith(
        "under torch.no_grad(), shape (2, 3, 5): the kernel raised RuntimeError: this kernel"
    )
    snippet = res.message.split("repro:\n", 1)[1]
    assert snippet.endswith("with torch.no_grad():\n    kernel(x)  # raises")
    with pytest.raises(RuntimeError, match="needs autograd on"):
        _exec(snippet)


def test_attention_raising_under_inference_mode_fails_with_a_repro_that_raises():
    target = conf.Target(
        _attention_no_inference, "tests.test_check_grad_modes:_attention_no_inference",
        kind="attention", framework="torch", dtype="float64", schedule=Constant(1),
    )  # fmt: skip
    res = conf.run_property("attention_layouts", target)
    assert res.status == "fail"
    assert res.message.startswith("under torch.inference_mode(): the kernel raised RuntimeError")
    snippet = res.message.split("repro:\n", 1)[1]
    assert "    with torch.inference_mode():  # as the suite called it\n" in snippet
    with pytest.raises(RuntimeError, match="inference tensors are not supported"):
        _exec(snippet)


def _few_queries(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if q.shape[-2] > 1000:
        raise ValueError("at most 1000 queries")
    return SDPA(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def test_an_attention_kernel_that_raises_fails_with_a_repro_that_raises():
    """The failure of a raising attention kernel carried the operands' shapes; it now
    carries a repro, its operands rebuilt from their source when they are large."""
    target = conf.Target(_few_queries, "tests.test_check_grad_modes:_few_queries",
                         kind="attention", framework="torch", dtype="float32",
                         schedule=Constant(1))  # fmt: skip
    res = conf.run_property("attention_batch", target)
    assert res.status == "fail"
    assert res.message.startswith(
        "1031 queries over 5 keys: the kernel raised ValueError: at most 1000 queries"
    )
    snippet = res.message.split("repro:\n", 1)[1]
    assert "q = np.random.default_rng(37).normal(0.0, 1.5, (1, 1031, 4))" in snippet
    assert snippet.endswith("kernel(q, k, v)  # raises")
    with pytest.raises(ValueError, match="at most 1000 queries"):
        _exec(snippet)


def test_every_mode_has_repro_lines():
    assert grad_call_lines(None) == ["kernel(x)"]
    assert grad_call_lines("inputs requiring grad") == ["x.requires_grad_()", "kernel(x)"]
    for mode, (requires_grad, context) in GRAD_MODES.items():
        if context is not None:
            assert not requires_grad
            assert grad_call_lines(mode) == [f"with torch.{context}():", "    kernel(x)"]
            with getattr(torch, context)():  # a context manager torch has
                assert not torch.is_grad_enabled()


def test_an_attention_write_has_a_repro_that_writes(capsys):
    """A write to an attention operand is reported with a repro (it was for the row kinds
    only) that makes the suite's call on the operands as the kernel got them."""
    message = _caught("torch attention scaling q in place under no_grad")
    assert message.startswith("under torch.no_grad(): the kernel wrote to its input q")
    snippet = message.split("repro:\n", 1)[1]
    assert "with torch.no_grad():\n    kernel(q, k, v)\n" in snippet
    _exec(snippet)
    assert capsys.readouterr().out.split() == [snippet.rsplit("# ", 1)[1].strip()]


def _scales_v_in_place(q, k, v, attn_mask=None, is_causal=False, scale=None, schedule=None):
    out = bk.attention(q, k, v, mask=attn_mask, is_causal=is_causal, schedule=schedule)
    v *= 2.0
    return out


def test_a_numpy_attention_write_repro_passes_every_keyword(capsys):
    target = conf.Target(_scales_v_in_place, f"{__name__}:_scales_v_in_place", kind="attention",
                         schedule=Constant(1))  # fmt: skip
    q = np.random.default_rng(0).normal(size=(1, 3, 2))
    mask = np.array([[True, False, True]] * 3)
    with pytest.raises(Failed) as info:
        target.call_attention(q, q, q, mask, True, scale=0.5, schedule=Constant(2))
    snippet = str(info.value).split("repro:\n", 1)[1]
    call = "kernel(q, k, v, attn_mask=mask, is_causal=True, scale=0.5, schedule=softmaxtheory."
    assert f"{call}spec.Constant(beta=2))\n" in snippet
    assert "mask = np.array([[True, False, True], [True, False, True], [True, False, True]])" in (
        snippet
    )
    _exec(snippet)
    assert capsys.readouterr().out.split() == [snippet.rsplit("# ", 1)[1].strip()]


def _doubles_q_when_training(q, k, v, attn_mask=None, is_causal=False, scale=None):
    out = SDPA(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    if q.requires_grad:
        q.data.mul_(2.0)  # past autograd's guard on leaves
    return out


def test_an_attention_write_in_training_has_a_repro_that_requires_grad(capsys):
    """The repro made ``x`` require grad, a name an attention call does not have."""
    target = conf.Target(
        _doubles_q_when_training, f"{__name__}:_doubles_q_when_training", kind="attention",
        framework="torch", dtype="float32", schedule=Constant(1),
    )  # fmt: skip
    res = conf.run_property("attention_layouts", target)
    assert res.status == "fail" and "inputs requiring grad" in res.message
    snippet = res.message.split("repro:\n", 1)[1]
    assert "q.requires_grad_()\nk.requires_grad_()\nv.requires_grad_()\nkernel(q, k, v)" in snippet
    _exec(snippet)
    assert capsys.readouterr().out.split() == [snippet.rsplit("# ", 1)[1].strip()]


def _small_operands_only(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if max(a.numel() for a in (q, k, v)) > 200:
        raise RuntimeError("workspace too small")
    return SDPA(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def test_a_raise_on_large_operands_without_a_source_has_a_runnable_repro():
    """Operands over 192 values without a source were written ``np.asarray(<your q>)``."""
    target = conf.Target(
        _small_operands_only, f"{__name__}:_small_operands_only", kind="attention",
        framework="torch", dtype="float32", schedule=Constant(1),
    )  # fmt: skip
    res = conf.run_property("attention_layouts", target)
    assert res.status == "fail" and "<your" not in res.message
    with pytest.raises(RuntimeError, match="workspace too small"):
        _exec(res.message.split("repro:\n", 1)[1])


def _training_path_refusing_masks(x):
    if x.requires_grad and torch.isinf(x).any():
        raise RuntimeError("backward buffer NaN on -inf")
    return torch.softmax(x, dim=-1)


def _attention_training_path_refusing_masks(q, k, v, attn_mask=None, is_causal=False):
    if q.requires_grad and attn_mask is not None:
        raise NotImplementedError("masks in training")
    return SDPA(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


@pytest.mark.parametrize(
    ("kernel", "kind", "prop"),
    [(_training_path_refusing_masks, "softmax", "dtype_shape"),
     (_attention_training_path_refusing_masks, "attention", "attention_layouts")],
)  # fmt: skip
def test_a_training_path_that_crashes_after_taking_grad_inputs_fails(kernel, kind, prop):
    """A raise after the kernel took inputs requiring grad was noted as a refusal."""
    target = conf.Target(kernel, kind=kind, framework="torch", dtype="float32",
                         schedule=Constant(1))  # fmt: skip
    res = conf.run_property(prop, target)
    assert res.status == "fail"
    assert res.message.startswith("inputs requiring grad") and "the kernel raised" in res.message


def test_torch_settings_left_changed_fail_and_are_restored(capsys):
    """A kernel that leaves torch's grad mode or default dtype changed passed every value
    check while the caller's training stopped recording gradients; it fails now, with a
    repro that prints the setting before and after, and the suite restores it."""
    for case, expr, after in (
        ("torch's grad mode switched off and left off", "torch.is_grad_enabled()", "False"),
        ("torch's default dtype changed and left so", "torch.get_default_dtype()",
         "torch.float64"),
    ):  # fmt: skip
        message = _caught(case)
        assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
        assert message.startswith("the kernel left torch's")
        snippet = message.split("repro:\n", 1)[1]
        assert f"print({expr})  # {after}: the kernel left it changed" in snippet
        _exec(snippet)
        assert capsys.readouterr().out.split()[-1] == after
        torch.set_grad_enabled(True)
        torch.set_default_dtype(torch.float32)


def test_paths_of_their_own_in_each_mode_are_checked():
    """Inference and training paths met only two tiny inputs: a blocked inference
    softmax that never rescales, a finfo.min training mask (fully masked rows), a
    KV-cache path aligning causal masks bottom right, one dropping scale= and a static
    decoding buffer under inference_mode all passed. Each fails now, in its mode."""
    assert _caught("an inference path without the running sum's rescaling").startswith(
        "under torch.no_grad(), shape (200,)"
    )
    assert _caught("a training path masking with finfo.min").startswith(
        "inputs requiring grad, a fully masked row of 5 items: got [0.2"
    )
    assert "under torch.no_grad(), causal, 2 queries over 7 keys" in _caught(
        "a causal mask aligned bottom right at inference"
    )
    assert "under torch.no_grad(), scale=2.0" in _caught("scale= dropped at inference")
    message = _caught("an inference path returning a static buffer")
    assert "(under torch.inference_mode())" in message
    assert "with torch.inference_mode():\n    first = kernel(x1)" in message


def test_a_detached_output_is_noted_and_torch_softmax_passes_every_mode():
    """A kernel whose output drops the gradient (decorated with torch.no_grad, say) gives
    right values: it passes, with a note; torch.softmax passes with neither."""

    @torch.no_grad()
    def detached(x):
        return torch.softmax(x, dim=-1)

    res = conf.run_property("dtype_shape", conf.Target(detached, framework="torch",
                                                       dtype="float32"))  # fmt: skip
    assert res.status == "pass", res.message
    assert res.notes == ["inputs requiring grad: the output does not require grad "
                         "(no gradient reaches x)"]  # fmt: skip
    plain = conf.Target(lambda x: torch.softmax(x, dim=-1), framework="torch", dtype="float32")
    res = conf.run_property("dtype_shape", plain)
    assert res.status == "pass" and not res.notes, res.message


@torch.no_grad()
def _attention_detached(q, k, v, attn_mask=None, is_causal=False, scale=None):
    return SDPA(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def test_a_detached_attention_output_is_noted_and_sdpa_passes_without_a_note():
    """The note for an output that drops the gradient covered the row kinds alone: an
    attention kernel under torch.no_grad passed with no word. It is noted now, once."""
    opts = dict(kind="attention", framework="torch", dtype="float64", schedule=Constant(1))
    target = conf.Target(_attention_detached, **opts)
    res = conf.run_property("attention_layouts", target)
    assert res.status == "pass", res.message
    assert res.notes == ["inputs requiring grad: the output does not require grad "
                         "(no gradient reaches q, k and v)"]  # fmt: skip
    res = conf.run_property("attention_layouts", conf.Target(SDPA, **opts))
    assert res.status == "pass" and not res.notes, (res.message, res.notes)
