"""The hybrid forward (pass 1, SDPA on β-scaled queries) and the Triton launch fallback, on CPU.

The hybrid's arithmetic does not depend on the device: on CPU its pass 1 is the torch
``attention_entropy`` and its pass 2 torch's own SDPA, the same composition CUDA runs with the
Triton pass 1. The launch-configuration fallback is exercised with a kernel stand-in that raises
Triton's ``OutOfResources`` for the larger tiles, as a GPU with too little shared memory would.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from softmaxtheory import reference as R  # noqa: E402, N812
from softmaxtheory.accelerated import _torch_attention as A  # noqa: E402, N812
from softmaxtheory.accelerated.torch import adaptive_attention  # noqa: E402
from softmaxtheory.spec import Constant, LogLength  # noqa: E402
from tests.test_torch_tolerances import attention_tolerance  # noqa: E402

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _case(dtype, mask_name, L=6, S=7, D=4, Dv=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(2, 2, L, D, generator=g, dtype=torch.float64) * 2).to(dtype)
    k = (torch.randn(2, 2, S, D, generator=g, dtype=torch.float64) * 2).to(dtype)
    v = torch.randn(2, 2, S, Dv, generator=g, dtype=torch.float64).to(dtype)
    keep = torch.rand(L, S, generator=g) > 0.4
    keep[2] = False  # a fully masked query
    keep[0, 0] = True
    mask = None
    if mask_name == "bool":
        mask = keep
    elif mask_name in ("bias", "zero_inf"):
        add = torch.randn(L, S, generator=g, dtype=torch.float64)
        if mask_name == "zero_inf":
            add = torch.zeros(L, S, dtype=torch.float64)
        mask = add.masked_fill(~keep, -math.inf).to(dtype)
    return q, k, v, mask


def _reference(q, k, v, mask, causal, schedule=None):
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    keep = add = None
    np_mask = None
    if mask is not None and mask.dtype == torch.bool:
        keep = np_mask = mask.numpy()
    elif mask is not None:
        add = np_mask = mask.double().numpy()
    elif causal:
        keep = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    ref = R.adaptive_attention(qd, kd, vd, mask=np_mask, is_causal=causal, schedule=schedule)
    tol = attention_tolerance(qd, kd, vd, ref, q.dtype, keep=keep, add=add, schedule=schedule)
    return ref, tol


@pytest.mark.theorem("T10")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias", "zero_inf"])
def test_hybrid_matches_reference(dtype, mask_name):
    """Pass 1 entropies, then SDPA on beta-scaled queries (and a beta-scaled bias) is the spec.

    softmax(beta_i x_i) has the logits of the query beta_i q_i (T10's second pass); an additive
    mask with finite non-zero entries is scaled by beta_i too, since the spec scales the whole
    logit. Checked against the certified reference under the derived tolerance.
    """
    q, k, v, mask = _case(dtype, mask_name)
    causal = mask_name == "causal"
    out = adaptive_attention(q, k, v, mask, is_causal=causal, backend="hybrid")
    assert out.dtype == dtype and out.shape == (2, 2, 6, 3)
    ref, tol = _reference(q, k, v, mask, causal)
    err = np.abs(out.double().numpy() - ref)
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol)}"
    if mask_name in ("bool", "bias", "zero_inf"):
        assert torch.all(out[:, :, 2] == 0)


@pytest.mark.parametrize("schedule", [Constant("1.7"), LogLength("0.6")], ids=repr)
def test_hybrid_other_schedules(schedule):
    q, k, v, _ = _case(torch.float32, "causal")
    out = adaptive_attention(q, k, v, is_causal=True, schedule=schedule, backend="hybrid")
    ref, tol = _reference(q, k, v, None, True, schedule)
    assert np.all(np.abs(out.double().numpy() - ref) <= tol)


def test_hybrid_bias_is_beta_scaled():
    """Without scaling the bias by beta, the answer differs from the spec on this input."""
    q, k, v, mask = _case(torch.float64, "bias")
    p = A.prepare(q, k, v, mask, False, None)
    entropy = A.entropy_lse(p)[0]
    from softmaxtheory.spec import PaperPolynomial

    beta = A.beta_from_entropy(PaperPolynomial(), entropy, p.n_eff)
    assert float(beta.max()) > 1.0  # the test needs beta != 1 somewhere
    out = adaptive_attention(q, k, v, mask, backend="hybrid")
    ref, _ = _reference(q, k, v, mask, False)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12, atol=1e-13)
    unscaled = torch.nn.functional.scaled_dot_product_attention(
        q * beta.unsqueeze(-1), k, v, attn_mask=mask
    )
    assert not np.allclose(unscaled.numpy()[:, :, [0, 1, 3, 4, 5]], ref[:, :, [0, 1, 3, 4, 5]])


@pytest.mark.parametrize("mask_name", ["none", "causal", "bias"])
@pytest.mark.parametrize("detach_beta", [False, True])
def test_hybrid_gradients_match_chunked(mask_name, detach_beta):
    """Through beta (torch pass 1) or with beta detached: the same gradients as the chunked path."""
    q, k, v, mask = _case(torch.float64, mask_name, L=4, S=5)
    causal = mask_name == "causal"
    if mask is not None:
        mask[2] = torch.tensor([0.5, -math.inf, 0.0, 1.0, 2.0], dtype=torch.float64)
    grads = []
    for backend in ("hybrid", "chunked"):
        args = [t.clone().requires_grad_() for t in (q, k, v)]
        out = adaptive_attention(
            *args, mask, is_causal=causal, detach_beta=detach_beta, backend=backend
        )
        grads.append(torch.autograd.grad((out**2).sum(), args))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_auto_on_cpu_without_interpreter_is_the_composition():
    q, k, v, _ = _case(torch.float32, "none")
    torch.testing.assert_close(
        adaptive_attention(q, k, v), adaptive_attention(q, k, v, backend="composition"),
        rtol=0, atol=0,
    )  # fmt: skip


def test_hybrid_refuses_entropy_eps():
    q, k, v, _ = _case(torch.float32, "none")
    with pytest.raises(ValueError, match="entropy_eps"):
        adaptive_attention(q, k, v, entropy_eps=1e-9, backend="hybrid")


# ---------------------------------------------------------------- launch configurations


triton_config = pytest.importorskip("softmaxtheory.accelerated._triton_config")
OutOfResources = pytest.importorskip("triton.runtime.errors").OutOfResources


class _FakeKernel:
    """Stands in for a JIT kernel: refuses tiles above `max_block_m` like a small GPU would."""

    def __init__(self, max_block_m):
        self.max_block_m = max_block_m
        self.__name__ = f"fake_kernel_{max_block_m}"
        self.calls = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.calls.append((grid, kw))
            if kw["BLOCK_M"] > self.max_block_m:
                raise OutOfResources(232448, 101376, "shared memory")

        return run


def test_launch_falls_back_to_a_smaller_configuration():
    """OutOfResources at launch: the next, smaller configuration runs; the refusal is remembered."""
    cands = triton_config.configs(torch.device("cuda"), 256, 256, torch.float32, 4, budget=1 << 30)
    assert [c["BLOCK_M"] for c in cands][:2] == [128, 128]
    kernel = _FakeKernel(max_block_m=64)
    used = triton_config.launch(kernel, lambda c: (c["BLOCK_M"],), (1, 2), {"X": 1}, cands)
    assert used["BLOCK_M"] == 64
    assert [kw["BLOCK_M"] for _, kw in kernel.calls] == [128, 128, 128, 64]
    assert kernel.calls[-1][0] == (64,)
    kernel.calls.clear()
    again = triton_config.launch(kernel, lambda c: (c["BLOCK_M"],), (1, 2), {"X": 1}, cands)
    assert again == used and len(kernel.calls) == 1  # refused configurations are skipped


def test_a_refusal_is_remembered_for_its_dtypes_and_device_only():
    """A tile refused with a float32 bias (more shared memory per tile) is tried again for a
    bfloat16 one; the memo's key held only the kernel, the tile and the compile-time
    arguments, so one refusal blocked that tile for every dtype and device of the process."""
    cands = triton_config.configs(torch.device("cuda"), 64, 0, torch.bfloat16, 4, budget=1 << 30)
    wide, narrow = torch.zeros(1, dtype=torch.float32), torch.zeros(1, dtype=torch.bfloat16)
    refuse = {"n": 1}

    class _OnceTooBig(_FakeKernel):
        def __getitem__(self, grid):
            def run(*args, **kw):
                self.calls.append(kw["BLOCK_M"])
                if refuse["n"]:
                    refuse["n"] -= 1
                    raise OutOfResources(232448, 101376, "shared memory")

            return run

    kernel = _OnceTooBig(0)
    first = triton_config.launch(kernel, lambda c: (1,), (wide,), {"Y": 1}, cands)
    assert first == cands[1]  # the largest was refused for the float32 bias
    kernel.calls.clear()
    assert triton_config.launch(kernel, lambda c: (1,), (narrow,), {"Y": 1}, cands) == cands[0]
    kernel.calls.clear()
    assert triton_config.launch(kernel, lambda c: (1,), (wide,), {"Y": 1}, cands) == cands[1]
    assert kernel.calls == [cands[1]["BLOCK_M"]]  # remembered for float32


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_head_dim_beyond_tritons_largest_block_has_no_config(device):
    """Head dims above 65,536: a block of 16 rows exceeds 2^20 elements, which Triton refuses
    (a ValueError under the interpreter, not OutOfResources); NoConfig sends the caller to
    the composition. Below, no CUDA candidate exceeds the largest block either."""
    assert triton_config.MAX_TILE == 2**20
    for dims in ((65537, 0), (64, 65537)):
        with pytest.raises(triton_config.NoConfig, match="largest block"):
            triton_config.configs(torch.device(device), *dims, torch.bfloat16, 0, budget=1 << 40)
    for head_dim in (1024, 8192, 65536):
        cands = triton_config.configs(
            torch.device(device), head_dim, head_dim, torch.bfloat16, 0, budget=1 << 40
        )
        assert cands and all(max(c["BLOCK_M"], c["BLOCK_N"]) * c["BLOCK_D"] <= 2**20 for c in cands)


def test_launch_raises_no_config_when_nothing_fits():
    cands = triton_config.configs(torch.device("cuda"), 64, 0, torch.float16, 0, budget=1 << 30)
    with pytest.raises(triton_config.NoConfig, match="no launch configuration"):
        triton_config.launch(_FakeKernel(max_block_m=8), lambda c: (1,), (), {}, cands)


class _UnlowerableKernel:
    """A kernel Triton's code generator cannot lower above `max_block_m` (as Triton 3.6 could
    not lower the float64 backward with a boolean mask for Hopper: 'Currently fp64 don't
    support largeK MMA'); `error` is raised instead when set."""

    __name__ = "unlowerable"

    def __init__(self, max_block_m, error=None):
        self.max_block_m, self.error, self.calls = max_block_m, error, []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.calls.append(kw["BLOCK_M"])
            if self.error is not None:
                raise self.error
            if kw["BLOCK_M"] > self.max_block_m:
                raise RuntimeError("PassManager::run failed")

        return run


def test_launch_skips_configurations_triton_cannot_lower():
    """A lowering failure is a plain RuntimeError from Triton: it reached the user (and two
    CUDA tests) on Triton 3.6; now the next configuration runs, and with none NoConfig sends
    the caller to the torch path. Other RuntimeErrors still reach the caller."""
    cands = triton_config.configs(torch.device("cuda"), 64, 64, torch.float64, 1, budget=1 << 30)
    kernel = _UnlowerableKernel(max_block_m=16)
    used = triton_config.launch(kernel, lambda c: (1,), (), {"F": 1}, cands)
    assert used["BLOCK_M"] == 16 and kernel.calls[-1] == 16 and len(kernel.calls) > 1
    with pytest.raises(triton_config.NoConfig, match="PassManager::run failed"):
        triton_config.launch(_UnlowerableKernel(max_block_m=0), lambda c: (1,), (), {"F": 2}, cands)
    bug = _UnlowerableKernel(0, RuntimeError("CUDA error: an illegal memory access"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        triton_config.launch(bug, lambda c: (1,), (), {"F": 3}, cands)
    assert bug.calls == [cands[0]["BLOCK_M"]]  # not retried


@pytest.mark.parametrize("head_dim", [16, 32, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("mask_elem", [0, 1, 4])
def test_configs_fit_the_shared_memory_budget(head_dim, dtype, mask_elem):
    """Every head dim and dtype gets candidates within a 100 KiB budget (an sm_80-class limit)."""
    budget = 100 * 1024
    elem = torch.finfo(dtype).bits // 8
    for value_dim in (0, head_dim):
        cands = triton_config.configs(
            torch.device("cuda"), head_dim, value_dim, dtype, mask_elem, budget=budget
        )
        assert cands
        for c in cands:
            est = triton_config.smem_estimate(
                c["BLOCK_M"], c["BLOCK_N"], c["num_stages"], c["BLOCK_D"],
                c.get("BLOCK_DV", 0), elem, mask_elem,
            )  # fmt: skip
            assert est <= budget or len(cands) == 1
        sizes = [c["BLOCK_M"] * c["BLOCK_N"] for c in cands]
        assert sizes == sorted(sizes, reverse=True)


def test_configs_on_cpu_are_one_small_tile():
    (cfg,) = triton_config.configs(torch.device("cpu"), 96, 96, torch.float32, 0)
    assert cfg == {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_D": 128, "BLOCK_DV": 128}


def test_dispatch_falls_back_when_no_configuration_runs(monkeypatch):
    """A Triton pass 1 that finds no configuration: the hybrid takes the torch pass 1 and
    backend="triton" the composition; the user sees a result, not an exception."""

    def refuse(p):
        raise triton_config.NoConfig("no launch configuration fits (simulated)")

    from tests.support.triton_stand_ins import torch_beta_kernel

    monkeypatch.setattr(A, "triton_available", lambda device: True)
    monkeypatch.setattr(A, "triton_entropy_lse", refuse)
    torch_beta_kernel(monkeypatch)
    q, k, v, mask = _case(torch.float32, "bool")
    with torch.no_grad():
        auto = adaptive_attention(q, k, v, mask)
        tri = adaptive_attention(q, k, v, mask, backend="triton")
    ref, tol = _reference(q, k, v, mask, False)
    for out in (auto, tri):
        assert np.all(np.abs(out.double().numpy() - ref) <= tol)
    torch.testing.assert_close(
        tri, adaptive_attention(q, k, v, mask, backend="composition"), rtol=0, atol=0
    )


@pytest.mark.parametrize(
    ("mask_name", "L", "S", "group"),
    [("bool", 5, 6, 2), ("bias", 4, 7, 1), ("causal", 7, 4, 1), ("none", 3, 5, 3)],
    ids=["bool-gqa", "bias", "causal-L>S", "none-gqa"],
)
def test_hybrid_gradcheck_beta_attached(mask_name, L, S, group):
    """float64 gradcheck of the hybrid with beta attached: the pass-1 backward (entropy
    contribution to dq, dk), dL/dbeta_i = <dq'_i, q_i> from SDPA's backward on the beta-scaled
    queries, and for an additive mask the beta-scaled bias's term."""
    q, k, v, mask = _case(torch.float64, mask_name, L=L, S=S, D=3, Dv=2, seed=8)
    q, k, v = q[:1], k[:1, :1], v[:1, :1]
    q = q.repeat_interleave(group, dim=1)
    if mask is not None:
        mask[:, 0] = True if mask.dtype == torch.bool else 0.5  # no fully masked query
    causal = mask_name == "causal"

    def fn(a, b, c):
        b, c = (t.expand(-1, a.shape[1], -1, -1) for t in (b, c))
        return adaptive_attention(a, b, c, mask, causal, backend="hybrid")

    args = tuple(t.clone().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("mask_name", ["bool", "bias", "causal"])
def test_hybrid_gradients_match_composition(mask_name):
    """The hybrid's gradients (beta attached) equal autograd through the composition path
    (through the chunked path for a bias, which the composition does not take)."""
    q, k, v, mask = _case(torch.float64, mask_name, L=6, S=5, seed=9)
    if mask is not None:
        mask[:, 0] = True if mask.dtype == torch.bool else 0.5
    causal = mask_name == "causal"
    other = "chunked" if mask_name == "bias" else "composition"
    grads = []
    for backend in ("hybrid", other):
        args = [t.clone().requires_grad_() for t in (q, k, v)]
        out = adaptive_attention(*args, mask, is_causal=causal, backend=backend)
        grads.append(torch.autograd.grad((out * torch.cos(out)).sum(), args))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_detached_beta_runs_no_pass_one_backward(monkeypatch):
    """detach_beta=True: SDPA's backward and the O(L) scaling only, no pass-1 graph or
    backward; with beta attached the pass-1 backward runs once."""
    calls = []
    original = A.entropy_lse_backward

    def spy(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(A, "entropy_lse_backward", spy)
    q, k, v, _ = _case(torch.float64, "none")
    for detach, expected in ((True, 0), (False, 1)):
        calls.clear()
        args = [t.clone().requires_grad_() for t in (q, k, v)]
        out = adaptive_attention(*args, detach_beta=detach, backend="hybrid")
        out.sum().backward()
        assert len(calls) == expected


@pytest.mark.parametrize("head_dim", [16, 32, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_backward_configs_fit_registers_and_shared_memory(head_dim, dtype):
    """The pass-1 backward's candidates: within a 100 KiB budget, accumulators of at most
    64 x 128 elements (BLOCK x head dim), largest first, never empty."""
    budget = 100 * 1024
    elem = torch.finfo(dtype).bits // 8
    for mask_elem in (0, 1, 4):
        cands = triton_config.configs(
            torch.device("cuda"), head_dim, 0, dtype, mask_elem, budget=budget, backward=True
        )
        assert cands
        for c in cands:
            assert max(c["BLOCK_M"], c["BLOCK_N"]) * c["BLOCK_D"] <= 64 * 128 or len(cands) == 1
            est = triton_config.smem_estimate(
                c["BLOCK_M"], c["BLOCK_N"], c["num_stages"], c["BLOCK_D"], 0, elem, mask_elem
            )
            assert est <= budget or len(cands) == 1
        sizes = [c["BLOCK_M"] * c["BLOCK_N"] for c in cands]
        assert sizes == sorted(sizes, reverse=True)


def test_backward_falls_back_to_the_torch_twin(monkeypatch):
    """A Triton pass-1 backward that finds no configuration: the torch twin computes the same
    gradients (no exception reaches the user)."""
    tri = pytest.importorskip("softmaxtheory.accelerated._triton_attention")
    refused = []

    def refuse(*args, **kwargs):
        refused.append(1)
        raise triton_config.NoConfig("no launch configuration fits (test)")

    q, k, v, mask = _case(torch.float64, "bias", seed=10)
    mask[:, 0] = 0.5
    plain = [t.clone().requires_grad_() for t in (q, k, v)]
    out = adaptive_attention(*plain, mask, backend="hybrid")
    expected = torch.autograd.grad(out.sum(), plain)
    original = A._pass1_forward
    monkeypatch.setattr(A, "_pass1_forward", lambda p, use: (*original(p, False)[:2], True))
    monkeypatch.setattr(tri, "triton_entropy_backward", refuse)
    args = [t.clone().requires_grad_() for t in (q, k, v)]
    out = adaptive_attention(*args, mask, backend="hybrid")
    for a, b in zip(torch.autograd.grad(out.sum(), args), expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert refused == [1]


@pytest.mark.parametrize("mask_shape", [(6, 7), (2, 1, 1, 7)], ids=["per query", "per key"])
def test_pass2_gets_a_shared_mask_at_its_own_size(monkeypatch, mask_shape):
    """SDPA turns a boolean mask into an additive one of the shape it is given: the expanded
    (B, H, L, S) view cost B·H times the mask's memory; pass 2 now hands it the mask's own
    shape, and the result is unchanged."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g) for n in (6, 7, 7))
    keep = torch.rand(mask_shape, generator=g) > 0.3
    seen = []
    sdpa = A.F.scaled_dot_product_attention

    def spy(*args, attn_mask=None, **kwargs):
        seen.append(None if attn_mask is None else tuple(attn_mask.shape))
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    want = adaptive_attention(q, k, v, attn_mask=keep, backend="chunked")
    monkeypatch.setattr(A.F, "scaled_dot_product_attention", spy)
    got = adaptive_attention(q, k, v, attn_mask=keep, backend="hybrid")
    assert seen == [(1, 1, 6, 7) if len(mask_shape) == 2 else (2, 1, 1, 7)]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_cudnn_refusal_is_remembered_for_its_signature_only(monkeypatch):
    """cuDNN's attention refusing one call turned it off for the whole process (every later
    call took the flash kernel, about half the speed on an H200); now the refused signature
    alone is remembered, and running out of memory is raised, not taken for a refusal."""
    calls = []

    def cudnn(q, k, v, *args, **kwargs):
        calls.append(q.shape[-1])
        if q.shape[-1] == 96:
            raise RuntimeError("cuDNN Frontend error: No valid execution plans built.")
        if q.shape[-1] == 32:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        lse = torch.logsumexp(q @ k.transpose(-1, -2), -1)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v, lse

    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", cudnn)
    monkeypatch.setattr(A, "_CUDNN_REFUSED", set())

    def qkv(d):
        return (torch.randn(1, 2, 5, d) for _ in range(3))

    assert A._cudnn_lse(*qkv(96), False, 1.0) is None
    assert A._cudnn_lse(*qkv(96), False, 1.0) is None and calls == [96]  # not asked again
    out, lse = A._cudnn_lse(*qkv(64), False, 1.0)  # another head dim: cuDNN again
    assert calls == [96, 64] and out.shape == (1, 2, 5, 64) and lse.shape == (1, 2, 5)
    assert A._cudnn_lse(*qkv(96), True, 1.0) is None and calls == [96, 64, 96]  # causal: new
    with pytest.raises(torch.cuda.OutOfMemoryError):
        A._cudnn_lse(*qkv(32), False, 1.0)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        A._cudnn_lse(*qkv(32), False, 1.0)  # (not remembered as a refusal)
