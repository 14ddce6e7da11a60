"""The Triton kernels compile for Hopper (sm_90) on this machine, without a GPU.

``TRITON_INTERPRET=1`` runs the kernels' Python on CPU tensors
(``tests/test_triton_interpret.py``), but it does not run Triton's compiler: a kernel can
interpret and still fail to compile for a GPU (a type that differs between the two branches
of a runtime ``if``, say). Triton's Linux wheel carries NVIDIA's ``ptxas``, so the whole
chain (Triton IR, LLVM, PTX, the sm_90 cubin) runs here. Each kernel is compiled with the
launch configuration :func:`~softmaxtheory.accelerated._triton_config.configs` picks first on
an H200 (227 KiB of shared memory per block), bfloat16, for each mask kind; the cubin's
resource usage (``cuobjdump -res-usage``) must show shared memory within the budget and no
spilled registers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from softmaxtheory.accelerated import _triton_attention as T  # noqa: E402, N812
from softmaxtheory.accelerated._triton_config import configs  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "triton_spills", Path(__file__).parent.parent / "tools" / "triton_spills.py"
)
spills = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spills)
if not (spills.toolchain() / "ptxas").exists() or not (spills.toolchain() / "cuobjdump").exists():
    pytest.skip("this Triton has no NVIDIA toolchain (ptxas)", allow_module_level=True)

H200_SMEM = spills.H200_SMEM

#: (kernel, head dim, value dim, mask kind, causal, backward candidates). Each must compile
#: without spilling registers in the configuration ``configs`` puts first: the largest
#: candidate, or where that one spills heavily the recorded spill-free one
#: (``accelerated/_triton_spill_free.py``, from ``tools/triton_spills.py``). Before that
#: table, the pass-1 kernel with a boolean mask at D = 64 spilled 2,520 bytes of stack.
CASES = [
    ("_entropy_kernel", 64, 0, T.MASK_NONE, False, False),
    ("_entropy_kernel", 128, 0, T.MASK_NONE, True, False),
    ("_entropy_kernel", 64, 0, T.MASK_BOOL, False, False),
    ("_entropy_kernel", 256, 0, T.MASK_ADD, False, False),
    ("_entropy_bwd_dq_kernel", 64, 0, T.MASK_NONE, True, True),
    ("_entropy_bwd_dk_kernel", 64, 0, T.MASK_NONE, False, True),
    ("_entropy_bwd_dk_kernel", 128, 0, T.MASK_BOOL, False, True),
    ("_attention_kernel", 64, 64, T.MASK_NONE, True, False),
]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[0].strip('_')}-d{c[1]}-mask{c[3]}-{'causal' if c[4] else 'full'}"
                        for c in CASES],
)  # fmt: skip
def test_kernel_compiles_for_hopper(case):
    name, d, dv, mask_kind, causal, backward = case
    mask_elem = {T.MASK_NONE: 0, T.MASK_BOOL: 1, T.MASK_ADD: 2}[mask_kind]
    cfg = configs(
        torch.device("cuda"), d, dv, torch.bfloat16, mask_elem, H200_SMEM, backward=backward,
        kernel=name, causal=causal,
    )[0]  # fmt: skip
    usage = spills.resource_usage(name, cfg, mask_kind, causal, "bfloat16")
    assert usage["regs"] <= 255
    assert usage["local"] == 0 and usage["stack"] == 0, f"{name} spills: {usage}, {cfg}"
    assert usage["launch_shared"] <= H200_SMEM, (usage, cfg)
    assert usage["shared"] <= H200_SMEM


def test_spill_free_table_holds_candidates_that_fit():
    """Every recorded configuration is one of the kernel's own candidate tiles, fits an H200's
    shared memory, and is what ``configs`` puts first for its case (before the others)."""
    from softmaxtheory.accelerated._triton_config import _CUDA_BWD_TILES, _CUDA_TILES
    from softmaxtheory.accelerated._triton_spill_free import SPILL_FREE

    assert SPILL_FREE
    for (kernel, dtype, bd, kind, causal), (bm, bn, warps, stages) in SPILL_FREE.items():
        backward = "bwd" in kernel
        assert (bm, bn, stages) in (_CUDA_BWD_TILES if backward else _CUDA_TILES)
        elem = {0: 0, 1: 1, 2: 2}[kind]
        dv = bd if kernel == "attention_kernel" else 0
        cands = configs(torch.device("cuda"), bd, dv, getattr(torch, dtype), elem, H200_SMEM,
                        backward=backward, kernel=kernel, causal=causal)  # fmt: skip
        first = cands[0]
        assert (first["BLOCK_M"], first["BLOCK_N"], first["num_warps"], first["num_stages"]) == (
            bm, bn, warps, stages,
        )  # fmt: skip
        plain = configs(torch.device("cuda"), bd, dv, getattr(torch, dtype), elem, H200_SMEM,
                        backward=backward, tuned=False)  # fmt: skip
        assert plain[0] != first and len(cands) <= len(plain) + 1
