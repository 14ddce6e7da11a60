"""The Triton kernels compile for Hopper (sm_90) on this machine, without a GPU.

``TRITON_INTERPRET=1`` runs the kernels' Python on CPU tensors
(``tests/test_triton_interpret.py``), but it does not run Triton's compiler: a kernel can
interpret and still fail to compile for a GPU (a type that differs between the two branches
of a runtime ``if``, say). Triton's Linux wheel carries NVIDIA's ``ptxas``, so the whole
chain (Triton IR, LLVM, PTX, the sm_90 cubin) runs here. Each kernel is compiled with the
launch configuration :func:`~softmaxtheory.accelerated._triton_config.configs` picks first on
an H200 (227 KiB of shared memory per block), as the JIT specializes it for contiguous
tensors, for each mask kind; the cubin's resource usage (``cuobjdump -res-usage``) must show
shared memory within the budget and no heavy spill (under ``MIN_STACK`` bytes of stack),
whether the largest tile was kept or the table of the installed Triton release chose one.
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

#: (kernel, head dim, mask kind, causal, dtype); the value dim is the head dim. Each must
#: compile without a heavy spill in the configuration ``configs`` puts first: the largest
#: candidate, or where that one spills heavily the one recorded by ``tools/triton_spills.py``
#: (``accelerated/_triton_spill_free.py``; only float32 kernels, whose IEEE products run on
#: the FMA units, need one under Triton 3.6 and 3.9).
CASES = [
    ("_entropy_kernel", 64, T.MASK_NONE, False, "bfloat16"),
    ("_entropy_kernel", 128, T.MASK_NONE, True, "bfloat16"),
    ("_entropy_kernel", 64, T.MASK_BOOL, False, "bfloat16"),
    ("_entropy_kernel", 256, T.MASK_ADD, False, "bfloat16"),
    ("_entropy_kernel", 128, T.MASK_BOOL, False, "float32"),
    ("_entropy_bwd_dq_kernel", 64, T.MASK_NONE, True, "bfloat16"),
    ("_entropy_bwd_dk_kernel", 64, T.MASK_NONE, False, "bfloat16"),
    ("_entropy_bwd_dk_kernel", 128, T.MASK_BOOL, False, "bfloat16"),
    ("_entropy_bwd_dq_kernel", 64, T.MASK_BOOL, False, "float32"),
    # float16's logit gradients are multiplied in TF32 (float16 lacks their range)
    ("_entropy_bwd_dq_kernel", 64, T.MASK_NONE, False, "float16"),
    ("_entropy_bwd_dk_kernel", 128, T.MASK_BOOL, False, "float16"),
    ("_attention_kernel", 64, T.MASK_NONE, True, "bfloat16"),
    ("_attention_kernel", 256, T.MASK_BOOL, False, "bfloat16"),
]


def _mask_elem(mask_kind, dtype=torch.bfloat16):
    return {T.MASK_NONE: 0, T.MASK_BOOL: 1, T.MASK_ADD: dtype.itemsize}[mask_kind]


def _first(name, d=64, mask_kind=T.MASK_NONE, causal=False, dtype=torch.bfloat16):
    """The configuration ``configs`` launches first on an H200."""
    return configs(torch.device("cuda"), d, d if name == "_attention_kernel" else 0, dtype,
                   _mask_elem(mask_kind, dtype), H200_SMEM, backward="bwd" in name, kernel=name,
                   causal=causal)[0]  # fmt: skip


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[0].strip('_')}-d{c[1]}-mask{c[2]}-{'causal' if c[3] else 'full'}"
                        f"-{c[4]}" for c in CASES],
)  # fmt: skip
def test_kernel_compiles_for_hopper(case):
    name, d, mask_kind, causal, dtype = case
    tdtype = getattr(torch, dtype)
    mask_elem = _mask_elem(mask_kind, tdtype)
    cfg = _first(name, d, mask_kind, causal, tdtype)
    usage = spills.resource_usage(name, cfg, mask_kind, causal, dtype)
    assert usage["regs"] <= 255 and usage["local"] == 0
    # the policy of tools/triton_spills.py: the first candidate under MIN_STACK bytes of
    # stack runs first, the largest one where it qualifies
    assert usage["stack"] < spills.MIN_STACK, f"{name} spills: {usage}, {cfg}"
    if dtype == "bfloat16":  # no 16-bit kernel needs a smaller tile
        assert _spill_free(name, tdtype, cfg["BLOCK_D"], mask_elem, causal) is None
    assert usage["launch_shared"] <= H200_SMEM, (usage, cfg)
    assert usage["shared"] <= H200_SMEM


def test_compiled_variant_is_the_jits():
    """The probe compiles what the JIT launches for contiguous tensors with sizes that are
    multiples of 16 (unit strides constant, the rest marked divisible by 16): its tile loads
    are 16-byte vectors, pipelined through ``cp.async``. Without that specialization pass 1
    loaded its tiles 2 bytes at a time, synchronously, in 184 registers instead of 124."""
    for name in ("_entropy_kernel", "_entropy_bwd_dq_kernel", "_attention_kernel"):
        ptx = spills._compile(name, _first(name), T.MASK_NONE, False, "bfloat16").asm["ptx"]
        assert "cp.async" in ptx, name
        assert "ld.global.b16" not in ptx, name


def test_group_size_is_not_specialized_in_pass_one():
    """Pass 1 and its dq kernel use the query heads per key head in one division per
    program, so the JIT compiles it as a plain integer (``do_not_specialize``): MHA and
    GQA launches share one variant, which cut the CUDA tests' Triton variants from 261 to
    189 (their bodies run under the interpreter, launches counted). The dk kernel loops
    over a group's heads and keeps a group of 1 constant. The probe compiles the same."""
    for name, plain in (("_entropy_kernel", True), ("_entropy_bwd_dq_kernel", True),
                        ("_entropy_bwd_dk_kernel", False)):  # fmt: skip
        kernel = getattr(T, name)
        consts = {"BLOCK_D": 64}
        sig, _ = spills._signature(kernel, consts, T.MASK_NONE, "bfloat16", 64)
        assert (sig["group"] == "i32") is plain and ("group" in consts) is not plain, name


def test_exponentials_are_bare_ex2():
    """The kernels hold base-2 logits, so every exponential is one ``ex2.approx.ftz.f32``;
    ``tl.exp`` of a float32 would compile to a multiply by log2 e and ``ex2.approx.f32``,
    whose subnormal guard costs a compare and two multiplies more."""
    for name in spills.KERNELS:
        ptx = spills._compile(name, _first(name), T.MASK_NONE, False, "bfloat16").asm["ptx"]
        assert ptx.count("ex2.approx.ftz.f32") >= 16, name
        assert "ex2.approx.f32" not in ptx, name


def test_sass_census_counts_the_exponentials():
    """The census reads opcodes from the SASS: pass 1 at a 128 x 64 tile on 4 warps computes
    64 exponentials per thread per key block, in two loops (interior and edge)."""
    counts = spills.sass_census("_entropy_kernel", _first("_entropy_kernel"))
    assert counts["MUFU"] >= 128 and counts["HGMMA"] > 0
    assert counts["total"] > counts["fp32"] >= counts["FFMA"] > 0


@pytest.mark.parametrize("name", spills.KERNELS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    ("mask_kind", "mask_rows"), [(T.MASK_NONE, True), (T.MASK_BOOL, True), (T.MASK_BOOL, False)]
)
def test_wgmma_is_pipelined(name, d, mask_kind, mask_rows):
    """ptxas overlaps each loop's tensor-core products (one wait per loop and dot), instead
    of waiting after every wgmma: it serializes them (C7515, "non wgmma instructions
    defining accumulator registers") on some address forms, as it did in the dq kernel with
    the scalar start of :func:`_load_block`. Each innermost loop holds an exponential per
    entry of its tile, the edge and interior alike. ``mask_rows=False``: a boolean mask per
    key, one row broadcast over the queries (the kernels' ``MASK_ROWS`` variant)."""
    cfg = _first(name, d, mask_kind)
    counts = spills.sass_census(name, cfg, mask_kind, mask_rows=mask_rows)
    loops = counts["loops"]
    assert counts["HGMMA"] > len(loops) and spills.pipelined(name, counts), counts
    per_thread = cfg["BLOCK_M"] * cfg["BLOCK_N"] // (32 * cfg["num_warps"])
    assert all(mufu >= per_thread for _, mufu in loops), (loops, cfg)


def test_pipelined_counts_one_wait_per_loop_and_dot():
    """The probe's test: pass 1 has one product per tile, the other kernels two; a kernel
    without wgmma (float32 products) has nothing to serialize."""
    two_loops = {"HGMMA": 16, "loops": [(540, 68), (693, 68)]}
    assert spills.pipelined("_entropy_kernel", {**two_loops, "wgmma waits": 2})
    assert not spills.pipelined("_entropy_kernel", {**two_loops, "wgmma waits": 3})
    assert spills.pipelined("_entropy_bwd_dq_kernel", {**two_loops, "wgmma waits": 4})
    assert not spills.pipelined("_attention_kernel", {**two_loops, "wgmma waits": 16})
    assert spills.pipelined("_attention_kernel", {"loops": [(900, 68)], "wgmma waits": 0})


def test_beta_kernel_rounds_each_horner_step():
    """The β kernel is launched without multiply-add contraction: each float64 Horner step
    rounds its product and its sum, as torch's one kernel per step does (so the two agree
    bit for bit on a GPU). Compiled with the default options, the steps would fuse."""
    import warnings

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from softmaxtheory.accelerated import _triton_beta as TB  # noqa: N812

    kernel = TB._polynomial_beta_kernel
    sig = {"Ent": "*fp32", "Coeffs": "*fp64", "Beta": "*fp32", "n": "i32",
           "N_COEFFS": "constexpr", "BLOCK": "constexpr"}  # fmt: skip

    def ptx(options):
        source = ASTSource(kernel, sig, constexprs={"N_COEFFS": 5, "BLOCK": TB.BLOCK})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        return compiled.asm["ptx"]

    assert "fma.rn.f64" in ptx({})
    launched = ptx(dict(TB.LAUNCH_OPTIONS))
    assert "fma.rn.f64" not in launched
    assert launched.count("mul.rn.f64") >= 4 and launched.count("add.rn.f64") >= 4


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

    def first(version, tuned=True):
        monkeypatch.setattr(_triton_config.triton, "__version__", version)
        cfg = configs(torch.device("cuda"), 128, 128, torch.bfloat16, 1, H200_SMEM,
                      kernel="_attention_kernel", tuned=tuned)[0]  # fmt: skip
        return cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]

    key = ("attention_kernel", "bfloat16", 128, 1, False)  # pass 2, a boolean mask
    plain = first("1.0.0", tuned=False)
    for release, table in SPILL_FREE.items():
        assert first(f"{release}.0") == table.get(key, plain), release
    assert first("1.0.0") == plain
    # the releases disagree on this case: 3.6 serializes the largest tile's wgmma, 3.9 not
    assert SPILL_FREE["3.6"][key] != SPILL_FREE["3.9"].get(key, plain)


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
