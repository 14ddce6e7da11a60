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


def _child(out_dir: Path) -> None:
    """Run in the child process (TRITON_INTERPRET=1): compute and save every case."""
    from softmaxtheory.accelerated import _triton_attention as tri
    from softmaxtheory.accelerated.torch import adaptive_attention

    for dname, mask_name, sname in _cases():
        q, k, v, mask = _inputs(DTYPES[dname], mask_name)
        out = adaptive_attention(
            q, k, v, mask, is_causal=mask_name == "causal", schedule=SCHEDULES[sname],
            backend="triton",
        )  # fmt: skip
        auto = adaptive_attention(
            q, k, v, mask, is_causal=mask_name == "causal", schedule=SCHEDULES[sname]
        )
        assert torch.equal(out, auto), f"auto must take the Triton kernel: {dname} {mask_name}"
        np.save(out_dir / f"{dname}-{mask_name}-{sname}.npy", out.double().numpy())
    q, k, _, _ = _inputs(torch.float32, "none")
    m, s, t = tri.triton_stats(q, k, None, tri.MASK_NONE, False, 0.5)
    np.save(out_dir / "stats.npy", torch.stack([m, s, t]).numpy())


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


@pytest.mark.theorem("T7")
def test_pass_one_state_gives_the_entropy(child_outputs):
    """Pass 1 merges (m, s, t) block by block (T7); H = log s - t/s is the row entropy."""
    m, s, t = np.load(child_outputs / "stats.npy")
    q, k, _, _ = _inputs(torch.float32, "none")
    x = 0.5 * np.einsum("bhld,bhsd->bhls", q.double().numpy(), k.double().numpy())
    np.testing.assert_allclose(m, x.max(-1), rtol=2e-6)
    h = np.log(s) - t / s
    np.testing.assert_allclose(h, R.entropy(x), rtol=0, atol=S * 2.0**-24 * (2 + np.abs(x).max()))


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    _child(Path(sys.argv[1]))
