"""The Triton kernels of adaptive attention, run on CPU under ``TRITON_INTERPRET=1``.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, and the torch path
takes the Triton kernel for CPU tensors only while it is set; so that the rest
of the suite is not affected, the kernels run in a child process (this file
executed as a script, with the variable set before triton is imported), which
saves inputs and outputs; the tests here compare them with the certified
reference under the derived tolerances.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_torch_tolerances import attention_tolerance  # noqa: E402

from softmaxtheory import reference as R  # noqa: E402, N812
from softmaxtheory.spec import LogLength, Polynomial  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MASKS = ("none", "causal", "bool", "bias")
SCHEDULES = {"paper": None, "loglength": LogLength("0.6"), "poly": Polynomial(("0.3", "0.9"))}
L, S, D, DV = 20, 19, 5, 3  # not multiples of the 16-wide blocks; D not a power of two


def _inputs(dtype: torch.dtype, mask_name: str):
    g = torch.Generator().manual_seed(7)
    q = (torch.randn(1, 2, L, D, generator=g, dtype=torch.float64) * 2).to(dtype)
    k = (torch.randn(1, 2, S, D, generator=g, dtype=torch.float64) * 2).to(dtype)
    v = torch.randn(1, 2, S, DV, generator=g, dtype=torch.float64).to(dtype)
    keep = torch.rand(L, S, generator=g) > 0.5
    keep[4] = False  # a fully masked query
    keep[0, 0] = True
    mask = None
    if mask_name == "bool":
        mask = keep
    elif mask_name == "bias":
        mask = torch.randn(L, S, generator=g, dtype=torch.float64).to(dtype)
        mask[~keep] = -math.inf
    return q, k, v, mask


def _cases():
    for dname in DTYPES:
        for mask_name in MASKS:
            yield dname, mask_name, "paper"
    for sname in ("loglength", "poly"):
        yield "float32", "causal", sname


#: Pass-1 cases: (name, dtype, H, H_kv, L, S, D, mask) at tiny lengths; odd lengths, every
#: head dim of issue 13 (16..128 and 96), grouped-query heads.
ENTROPY_CASES = [
    ("d16-f32", "float32", 2, 2, 5, 7, 16, "none"),
    ("d32-f16", "float16", 2, 2, 3, 5, 32, "causal"),
    ("d64-bf16", "bfloat16", 2, 2, 5, 3, 64, "bool"),
    ("d96-f32", "float32", 2, 2, 3, 5, 96, "bias"),
    ("d128-f16", "float16", 2, 2, 3, 4, 128, "none"),
    ("gqa-f32", "float32", 4, 2, 17, 19, 8, "causal"),
    ("gqa-bias-f16", "float16", 6, 3, 5, 18, 5, "bias"),
    ("odd-f32", "float32", 1, 1, 33, 35, 3, "bool"),
]


def _entropy_inputs(name: str):
    _, dname, H, Hkv, L_, S_, D_, mask_name = next(c for c in ENTROPY_CASES if c[0] == name)
    dtype = DTYPES[dname]
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(1, H, L_, D_, generator=g, dtype=torch.float64) * 2).to(dtype)
    k = (torch.randn(1, Hkv, S_, D_, generator=g, dtype=torch.float64) * 2).to(dtype)
    keep = torch.rand(L_, S_, generator=g) > 0.5
    keep[L_ // 2] = False  # a fully masked query
    keep[0, 0] = True
    mask = None
    if mask_name == "bool":
        mask = keep
    elif mask_name == "bias":
        mask = torch.randn(L_, S_, generator=g, dtype=torch.float64).to(dtype)
        mask[~keep] = -math.inf
    return q, k, mask, mask_name == "causal"


def _child(out_dir: Path) -> None:
    """Run in the child process (TRITON_INTERPRET=1): compute and save every case."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812
    from softmaxtheory.accelerated import _triton_attention as tri
    from softmaxtheory.accelerated.torch import adaptive_attention, attention_entropy

    for dname, mask_name, sname in _cases():
        q, k, v, mask = _inputs(DTYPES[dname], mask_name)
        causal = mask_name == "causal"
        kw = {"is_causal": causal, "schedule": SCHEDULES[sname]}
        out = adaptive_attention(q, k, v, mask, backend="triton", **kw)
        hybrid = adaptive_attention(q, k, v, mask, backend="hybrid", **kw)
        auto = adaptive_attention(q, k, v, mask, **kw)
        assert torch.equal(hybrid, auto), f"auto must take the hybrid: {dname} {mask_name}"
        np.save(out_dir / f"{dname}-{mask_name}-{sname}.npy", out.double().numpy())
        np.save(out_dir / f"hybrid-{dname}-{mask_name}-{sname}.npy", hybrid.double().numpy())
    for case in ENTROPY_CASES:
        q, k, mask, causal = _entropy_inputs(case[0])
        h, lse = attention_entropy(q, k, mask, causal, enable_gqa=True)
        p = A.prepare(q, k, None, mask, causal, None, enable_gqa=True)
        h_tri, lse_tri = A.triton_entropy_lse(p)
        assert torch.equal(h, h_tri.reshape(h.shape)), "attention_entropy takes the kernel"
        assert torch.equal(lse, lse_tri.reshape(lse.shape))
        np.save(out_dir / f"entropy-{case[0]}.npy", torch.stack([h, lse]).double().numpy())
    # the kernel itself on a finite row whose spread overflows float32 (not the guard)
    q = torch.ones(1, 1, 1, 16)
    k = torch.zeros(1, 1, 3, 16)
    k[0, 0, :, 0] = torch.tensor([3e38, -3e38, 3e38])
    h, lse = tri.triton_entropy(q, k, None, tri.MASK_NONE, False, 1.0)
    np.save(out_dir / "overflow.npy", torch.stack([h, lse]).double().numpy())
    # causal block skipping with L != S (a query block past the last key, one before it)
    q, k, _, _ = _inputs(torch.float32, "none")
    p = A.prepare(q[..., :, :], k[..., :7, :], None, None, True, None)
    h, lse = A.triton_entropy_lse(p)
    h2, lse2 = A.entropy_lse(p)
    np.save(out_dir / "causal-short.npy", torch.stack([h, lse, h2, lse2]).double().numpy())


@pytest.fixture(scope="module")
def child_outputs(tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("triton_interpret")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run(
        [sys.executable, __file__, str(out_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=Path(__file__).parent,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return out_dir


def test_parent_process_is_not_interpreting():
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


@pytest.mark.parametrize(("dname", "mask_name", "sname"), list(_cases()))
def test_kernel_matches_reference(child_outputs, dname, mask_name, sname):
    dtype = DTYPES[dname]
    q, k, v, mask = _inputs(dtype, mask_name)
    out = np.load(child_outputs / f"{dname}-{mask_name}-{sname}.npy")
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    keep = add = None
    if mask_name == "bool":
        keep = mask.numpy()
    elif mask_name == "bias":
        add = mask.double().numpy()
    elif mask_name == "causal":
        keep = np.tril(np.ones((L, S), dtype=bool))
    ref = R.adaptive_attention(
        qd, kd, vd, mask=keep if keep is not None and mask_name != "causal" else add,
        is_causal=mask_name == "causal", schedule=SCHEDULES[sname],
    )  # fmt: skip
    tol = attention_tolerance(qd, kd, vd, ref, dtype, keep=keep, add=add, schedule=SCHEDULES[sname])
    err = np.abs(out - ref)
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol)}"
    if mask_name in ("bool", "bias"):
        assert np.all(out[:, :, 4] == 0)  # the fully masked query


@pytest.mark.parametrize(("dname", "mask_name", "sname"), list(_cases()))
def test_hybrid_matches_reference(child_outputs, dname, mask_name, sname):
    """backend="hybrid" (Triton pass 1, SDPA on beta-scaled queries) matches the reference."""
    dtype = DTYPES[dname]
    q, k, v, mask = _inputs(dtype, mask_name)
    out = np.load(child_outputs / f"hybrid-{dname}-{mask_name}-{sname}.npy")
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    keep = add = None
    if mask_name == "bool":
        keep = mask.numpy()
    elif mask_name == "bias":
        add = mask.double().numpy()
    elif mask_name == "causal":
        keep = np.tril(np.ones((L, S), dtype=bool))
    ref = R.adaptive_attention(
        qd, kd, vd, mask=keep if keep is not None and mask_name != "causal" else add,
        is_causal=mask_name == "causal", schedule=SCHEDULES[sname],
    )  # fmt: skip
    tol = attention_tolerance(qd, kd, vd, ref, dtype, keep=keep, add=add, schedule=SCHEDULES[sname])
    err = np.abs(out - ref)
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol)}"


def _entropy_reference(q, k, mask, causal, group):
    """float64 logits, their reference entropies and log-sum-exps, and a bound on the logits."""
    qd, kd = q.double().numpy(), np.repeat(k.double().numpy(), group, axis=1)
    scale = 1.0 / math.sqrt(qd.shape[-1])
    x = scale * np.einsum("bhld,bhsd->bhls", qd, kd)
    a = scale * np.einsum("bhld,bhsd->bhls", np.abs(qd), np.abs(kd))
    L_, S_ = x.shape[-2:]
    keep = np.ones((L_, S_), dtype=bool)
    if causal:
        keep = np.tril(keep)
    elif mask is not None and mask.dtype == torch.bool:
        keep = mask.numpy()
    elif mask is not None:
        x = x + np.where(mask.numpy() == -np.inf, 0.0, mask.double().numpy())
        keep = mask.numpy() != -np.inf
    x = np.where(keep, x, -np.inf)
    return x, a, keep


@pytest.mark.theorem("T7")
@pytest.mark.parametrize("case", [c[0] for c in ENTROPY_CASES])
def test_pass_one_kernel_gives_the_entropy(child_outputs, case):
    """The Triton pass 1 merges (m, s, t) block by block (T7): H = log s - t/s and LSE = m + log s.

    Checked against the certified reference entropy of the float64 logits (every head dim,
    odd lengths, masks, causal, grouped-query heads). Error bound, float32 statistics
    (u = 2^-24): the logits' accumulation D u a_ij enters H twice, the sums
    gamma_S u (2 + max|x|).
    """
    q, k, mask, causal = _entropy_inputs(case)
    group = q.shape[1] // k.shape[1]
    h, lse = np.load(child_outputs / f"entropy-{case}.npy")
    x, a, keep = _entropy_reference(q, k, mask, causal, group)
    u = 2.0**-24
    D_, S_ = q.shape[-1], x.shape[-1]
    finite = np.where(np.isfinite(x), np.abs(x), 0.0)
    tol = 2 * D_ * u * a.max(-1) + 2 * S_ * u * (2 + finite.max(-1)) + 4 * u
    live = keep.any(-1)
    ref_h = np.zeros_like(h)
    ref_h[..., live] = R.entropy(x[..., live, :])
    assert np.all(np.abs(h - ref_h) <= tol), f"max err/tol {np.max(np.abs(h - ref_h) / tol)}"
    with np.errstate(divide="ignore"):
        ref_lse = np.log(np.sum(np.exp(x - finite.max(-1, keepdims=True)), -1)) + finite.max(-1)
    assert np.all(lse[..., ~live] == -np.inf) and np.all(h[..., ~live] == 0)
    err = np.abs(lse[..., live] - ref_lse[..., live])
    assert np.all(err <= tol[..., live] * (1 + np.abs(ref_lse[..., live])))


def test_pass_one_kernel_overflowing_spread(child_outputs):
    """A finite float32 row [3e38, -3e38, 3e38] (spread beyond the float maximum): H = log 2."""
    h, lse = np.load(child_outputs / "overflow.npy")
    assert np.isfinite(h).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(h, math.log(2), rtol=1e-6)
    np.testing.assert_allclose(lse, 3e38, rtol=1e-6)


def test_pass_one_causal_skip_matches_torch(child_outputs):
    """Causal with L > S: query blocks stop at their last visible key block; same as torch."""
    h, lse, h2, lse2 = np.load(child_outputs / "causal-short.npy")
    np.testing.assert_allclose(h, h2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, lse2, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    _child(Path(sys.argv[1]))
