"""The Triton kernels compile for Hopper (sm_90) on this machine, without a GPU.

``TRITON_INTERPRET=1`` runs the kernels' Python on CPU tensors
(``tests/test_triton_interpret.py``), but it does not run Triton's compiler: a kernel can
interpret and still fail to compile for a GPU (a type that differs between the two branches
of a runtime ``if``, say). Triton's Linux wheel carries NVIDIA's ``ptxas``, so the whole
chain (Triton IR, LLVM, PTX, the sm_90 cubin) runs here. Each kernel is compiled with the
launch configuration :func:`~softmaxtheory.accelerated._triton_config.configs` picks first on
an H200 (227 KiB of shared memory per block), bfloat16, for each mask kind; the cubin's
resource usage (``cuobjdump -res-usage``) must show shared memory within the budget and no
heavy spill: none where the spill-free table of the installed Triton release chose the
tile, under ``MIN_STACK`` bytes of stack where the largest tile was kept.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from softmaxtheory.accelerated import _triton_attention as T  # noqa: E402, N812
from softmaxtheory.accelerated._triton_config import _spill_free, configs  # noqa: E402

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
    recorded = _spill_free(name, torch.bfloat16, cfg["BLOCK_D"], mask_elem, causal)
    usage = spills.resource_usage(name, cfg, mask_kind, causal, "bfloat16")
    assert usage["regs"] <= 255 and usage["local"] == 0
    # the policy of tools/triton_spills.py: a recorded tile spills nothing; the largest
    # tile is kept where it spills less than MIN_STACK bytes (Triton 3.6 spills 40 bytes
    # of stack in the masked pass 1 at D = 64, 128 x 64, where 3.9 spilled 2,520)
    limit = 1 if recorded is not None else spills.MIN_STACK
    assert usage["stack"] < limit, f"{name} spills: {usage}, {cfg}"
    assert usage["launch_shared"] <= H200_SMEM, (usage, cfg)
    assert usage["shared"] <= H200_SMEM


def test_spill_free_table_holds_candidates_that_fit():
    """Every recorded configuration, of every Triton release, is one of the kernel's own
    candidate tiles and fits an H200's shared memory; those of the installed release are
    what ``configs`` puts first for their case (before the others)."""
    from softmaxtheory.accelerated._triton_config import (
        _CUDA_BWD_TILES,
        _CUDA_TILES,
        smem_estimate,
        triton_release,
    )
    from softmaxtheory.accelerated._triton_spill_free import SPILL_FREE

    assert {"3.6", "3.9"} <= set(SPILL_FREE)  # the device machine's release and CI's
    for release, table in SPILL_FREE.items():
        assert table, release
        for (kernel, dtype, bd, kind, _causal), (bm, bn, warps, stages) in table.items():
            backward = "bwd" in kernel
            assert (bm, bn, stages) in (_CUDA_BWD_TILES if backward else _CUDA_TILES)
            assert warps in (4, 8)
            elem = 4 if dtype == "float32" else 2
            dv = bd if kernel == "attention_kernel" else 0
            assert smem_estimate(bm, bn, stages, bd, dv, elem, {0: 0, 1: 1, 2: elem}[kind]) <= (
                H200_SMEM
            )  # fmt: skip
    for (kernel, dtype, bd, kind, causal), (bm, bn, warps, stages) in SPILL_FREE.get(
        triton_release(), {}
    ).items():
        backward = "bwd" in kernel
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


def test_spill_free_table_follows_the_triton_release(monkeypatch):
    """Register allocation differs between releases: the table of the installed one is used,
    and a release without a table keeps the plain order."""
    from softmaxtheory.accelerated import _triton_config
    from softmaxtheory.accelerated._triton_spill_free import SPILL_FREE

    assert _triton_config.triton_release("3.6.0") == "3.6"
    assert _triton_config.triton_release("3.10.1+git1234") == "3.10"

    def first(version):
        monkeypatch.setattr(_triton_config.triton, "__version__", version)
        cfg = configs(torch.device("cuda"), 64, 0, torch.bfloat16, 1, H200_SMEM,
                      kernel="_entropy_kernel")[0]  # fmt: skip
        return cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]

    key = ("entropy_kernel", "bfloat16", 64, 1, False)  # pass 1 with a boolean mask
    plain = configs(torch.device("cuda"), 64, 0, torch.bfloat16, 1, H200_SMEM, tuned=False)[0]
    plain = plain["BLOCK_M"], plain["BLOCK_N"], plain["num_warps"], plain["num_stages"]
    for release, table in SPILL_FREE.items():
        assert first(f"{release}.0") == table.get(key, plain), release
    assert first("1.0.0") == plain
    # the releases disagree on this case: 3.9 spills at the largest tile, 3.6 does not
    assert key in SPILL_FREE["3.9"] and key not in SPILL_FREE["3.6"]


def test_spills_tool_keeps_other_releases(monkeypatch, tmp_path):
    """``--write`` replaces the installed release's table and keeps the others'."""
    import runpy

    from softmaxtheory.accelerated._triton_config import triton_release

    (tmp_path / "accelerated").mkdir()
    other = {"0.1": {("entropy_kernel", "bfloat16", 64, 1, False): (64, 32, 4, 2)}}
    (tmp_path / "accelerated" / "_triton_spill_free.py").write_text(f"SPILL_FREE = {other!r}\n")
    monkeypatch.setattr(spills, "ROOT", tmp_path)
    mine = {("entropy_kernel", "float32", 16, 1, False): (64, 32, 4, 2)}
    path = spills.write_table(mine)
    assert runpy.run_path(str(path))["SPILL_FREE"] == {**other, triton_release(): mine}
