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

import re
import subprocess
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from softmaxtheory.accelerated import _triton_attention as T  # noqa: E402, N812
from softmaxtheory.accelerated._triton_config import configs  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
if not (BIN / "ptxas").exists() or not (BIN / "cuobjdump").exists():
    pytest.skip("this Triton has no NVIDIA toolchain (ptxas)", allow_module_level=True)

#: Shared memory per block of an H200 (``shared_memory_per_block_optin``), bytes.
H200_SMEM = 232448

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


def _signature(kernel, constexprs: dict, mask_kind: int) -> dict[str, str]:
    """Argument types: bfloat16 inputs and output, float32 statistics, int64 strides."""
    bf16 = {"Q", "K", "V", "Out"}
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "Mask":
            sig[name] = "*u8" if mask_kind == T.MASK_BOOL else "*bf16"
        elif name in bf16:
            sig[name] = "*bf16"
        elif name[0].isupper() and name not in ("L", "S", "D", "DV"):
            sig[name] = "*fp32"
        else:
            sig[name] = "i64" if name.startswith("stride") else "i32"
    return sig


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[0].strip('_')}-d{c[1]}-mask{c[3]}-{'causal' if c[4] else 'full'}"
                        for c in CASES],
)  # fmt: skip
def test_kernel_compiles_for_hopper(case, tmp_path):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name, d, dv, mask_kind, causal, backward = case
    kernel = getattr(T, name)
    mask_elem = {T.MASK_NONE: 0, T.MASK_BOOL: 1, T.MASK_ADD: 2}[mask_kind]
    cfg = configs(
        torch.device("cuda"), d, dv, torch.bfloat16, mask_elem, H200_SMEM, backward=backward,
        kernel=name, causal=causal,
    )[0]  # fmt: skip
    constexprs = {
        "MASK_KIND": mask_kind, "CAUSAL": causal, "PRECISION": "tf32", "UPCAST": False,
        **{k: v for k, v in cfg.items() if k.startswith("BLOCK")},
    }  # fmt: skip
    if "ACC" in kernel.arg_names:
        constexprs["ACC"] = triton.language.float32
    src = ASTSource(kernel, _signature(kernel, constexprs, mask_kind), constexprs=constexprs)
    options = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Triton's notices about its own defaults
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    usage = subprocess.run(
        [str(BIN / "cuobjdump"), "-res-usage", str(cubin)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    assert found, usage
    regs, stack, shared, local = map(int, found.groups())
    assert regs <= 255
    assert local == 0 and stack == 0, f"{name} spills ({stack} bytes of stack): {cfg}"
    assert compiled.metadata.shared <= H200_SMEM, (compiled.metadata.shared, cfg)
    assert shared <= H200_SMEM


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
