#!/usr/bin/env python
"""Find, for each Triton kernel, the first launch configuration that compiles well.

"Well": without heavy spills, and with the tensor-core products of each loop overlapped.

Usage::

    python tools/triton_spills.py            # prints the table; --write updates the module
    python tools/triton_spills.py --write    # accelerated/_triton_spill_free.py

Register allocation differs between Triton releases, so the table holds one entry per
release (major.minor); ``--write`` replaces the running release's entry and keeps the others.

No GPU is needed: Triton's Linux wheel carries NVIDIA's ``ptxas`` and ``cuobjdump``, so each
candidate of :func:`softmaxtheory.accelerated._triton_config.configs` (H200 shared memory,
in its order) is compiled for sm_90 and its cubin's stack usage and SASS read. Each is
compiled as Triton's JIT specializes it for contiguous tensors whose sizes are multiples
of 16 (:data:`MODEL`): unit strides as constants, the other integers marked as multiples
of 16.
For each kernel, head-dim block, mask kind and causal flag whose *first* candidate spills
at least ``MIN_STACK`` bytes (a heavy spill; a few bytes may cost less than a smaller tile)
or has its wgmma serialized (:func:`pipelined`), the first candidate that does neither is
recorded; ``configs`` then tries that one first.
bfloat16 stands for both 16-bit dtypes; float32 is probed with a boolean mask. Two
processes compile at once (about a second per compilation).
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("_entropy_kernel", "_entropy_bwd_dq_kernel", "_entropy_bwd_dk_kernel",
           "_attention_kernel")  # fmt: skip
HEAD_DIMS = (16, 32, 64, 128, 256)
#: (mask kind, causal, dtype) probed per kernel and head dim
VARIANTS = ((0, False, "bfloat16"), (0, True, "bfloat16"), (1, False, "bfloat16"),
            (2, False, "bfloat16"), (1, False, "float32"))  # fmt: skip
H200_SMEM = 232448
#: Spills of the first candidate below this many bytes of stack are kept.
MIN_STACK = 128


#: The launch the compiled variants model: contiguous (B, H, L, D) tensors and a (B, H, L, S)
#: mask, every size a multiple of 16, MHA (the benchmark's shapes; the batch size only
#: scales strides the kernels do not see).
MODEL = {"H": 16, "L": 4096, "S": 4096}


def _model_ints(kernel, d: int, dv: int, mask_kind: int) -> dict[str, int]:
    """The integer arguments of `kernel` at the :data:`MODEL` launch with head dim `d`."""
    H, L, S = MODEL["H"], MODEL["L"], MODEL["S"]
    dv = dv or d
    values = {"num_heads": H, "group": 1, "L": L, "S": S, "D": d, "DV": dv}
    shapes = {"q": (H, L, d), "k": (H, S, d), "v": (H, S, dv), "o": (H, L, dv),
              "mask": (H, L, S) if mask_kind else (0, 0, 0)}  # fmt: skip
    for t, (h, n, e) in shapes.items():
        values |= {f"stride_{t}_batch": h * n * e, f"stride_{t}_head": n * e}
        seq, last = (f"stride_{t}_q", f"stride_{t}_k") if t == "mask" else (
            f"stride_{t}_seq", f"stride_{t}_dim")  # fmt: skip
        values |= {seq: e, last: 1 if mask_kind or t != "mask" else 0}
    return {name: values[name] for name in kernel.arg_names if name in values}


def _signature(
    kernel, constexprs: dict, mask_kind: int, dtype: str, d: int, dv: int = 0
) -> tuple[dict[str, str], dict]:
    """Argument types and attributes as Triton's JIT specializes the :data:`MODEL` launch.

    The JIT compiles an integer argument equal to 1 (a unit stride) as the constant 1
    (unless the kernel lists it in ``do_not_specialize``), and marks integers that are
    multiples of 16, and 16-byte aligned pointers, as such
    (``tt.divisibility``): that is what lets the tile loads be vectorized and pipelined
    (``cp.async``). Compiling without these (every integer a plain ``i32``) gives another
    kernel: scalar loads and, at D = 64, 184 registers for pass 1 where the launched one
    has 124. Adds the unit strides to `constexprs`; returns the signature and attributes.
    """
    elem = {"float32": "*fp32", "float16": "*fp16"}.get(dtype, "*bf16")
    ints = _model_ints(kernel, d, dv, mask_kind)
    sig, attrs = {}, {}
    for i, (name, param) in enumerate(zip(kernel.arg_names, kernel.params, strict=True)):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        if param.do_not_specialize:  # launched as a plain i32, whatever its value
            sig[name] = "i32"
            continue
        if name in ints and ints[name] == 1:
            sig[name], constexprs[name] = "constexpr", 1
            continue
        if name == "Mask":
            sig[name] = "*u8" if mask_kind == 1 else elem
        elif name in ("Q", "K", "V", "Out", "DQ", "DK"):
            sig[name] = elem
        elif name[0].isupper() and name not in ("L", "S", "D", "DV"):
            sig[name] = "*fp32"
        elif name == "scale":
            sig[name] = "fp32"
            continue
        else:
            sig[name] = "i32"
            if ints[name] % 16:
                continue
        attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _compile(name: str, cfg: dict, mask_kind: int, causal: bool, dtype: str, module=None,
             mask_rows: bool = True):  # fmt: skip
    """Compile kernel `name` of `module` (the package's kernels by default) for sm_90.

    ``mask_rows=False``: the mask is one row broadcast over the queries (``MASK_ROWS``).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if module is None:
        from softmaxtheory.accelerated import _triton_attention as module

    kernel = getattr(module, name)
    consts = {"MASK_KIND": mask_kind, "CAUSAL": causal, "UPCAST": False,
              "PRECISION": "ieee" if dtype == "float32" else "tf32",
              **{k: v for k, v in cfg.items() if k.startswith("BLOCK")}}  # fmt: skip
    if "ACC" in kernel.arg_names:
        consts["ACC"] = triton.language.float32
    if "RAW" in kernel.arg_names:  # as launched with a positive scale
        consts["RAW"] = mask_kind != 2
    if "MASK_ROWS" in kernel.arg_names:  # a constexpr with a default: the JIT fills it in
        consts["MASK_ROWS"] = mask_rows
    sig, attrs = _signature(kernel, consts, mask_kind, dtype, cfg["BLOCK_D"],
                            cfg.get("BLOCK_DV", 0))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Triton's notices about its own defaults
        return triton.compile(
            ASTSource(kernel, sig, constexprs=consts, attrs=attrs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
        )


def _cuobjdump(compiled, flag: str) -> str:
    """``cuobjdump <flag>`` of a compiled kernel's cubin."""
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        os.write(fd, compiled.asm["cubin"])
        os.close(fd)
        return subprocess.run([str(toolchain() / "cuobjdump"), flag, path],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    finally:
        os.unlink(path)


def resource_usage(
    name: str, cfg: dict, mask_kind: int, causal: bool, dtype: str, compiled=None
) -> dict:
    """Compile one kernel configuration for sm_90 and read its cubin's resource usage.

    The variant compiled is the one the JIT launches for the :data:`MODEL` shapes
    (:func:`_signature`). Returns ``regs``, ``stack``, ``local`` and ``shared`` (bytes,
    from ``cuobjdump -res-usage``) and ``launch_shared`` (the shared memory Triton
    reserves at launch). `compiled`: the kernel already compiled.
    """
    if compiled is None:
        compiled = _compile(name, cfg, mask_kind, causal, dtype)
    usage = _cuobjdump(compiled, "-res-usage")
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {usage}")
    regs, stack, shared, local = map(int, found.groups())
    return {"regs": regs, "stack": stack, "local": local, "shared": shared,
            "launch_shared": compiled.metadata.shared}  # fmt: skip


#: SASS opcodes of float32 arithmetic (the census' ``fp32`` count).
FP32_OPS = ("FADD", "FFMA", "FMUL", "FMNMX", "FSEL", "FSETP")


def sass_census(name: str, cfg: dict, mask_kind: int = 0, causal: bool = False,
                dtype: str = "bfloat16", module=None, compiled=None,
                mask_rows: bool = True) -> dict:  # fmt: skip
    """Instruction counts of one compiled kernel's SASS, by opcode (static, not executed).

    Adds ``total`` (every instruction), ``fp32`` (the :data:`FP32_OPS`), ``wgmma waits``
    (``WARPGROUP.DEPBAR``: as many as ``HGMMA`` where ptxas serializes the products), and ``loops``:
    for each innermost loop in code order (the edge and interior blocks; the interior
    one is the kernels' steady state), its instruction count and how many of them are
    exponentials (``MUFU``). `module`
    holds the kernel (another revision of ``_triton_attention.py``, say); `compiled`, the
    kernel already compiled; ``mask_rows=False``, the variant for a mask broadcast over
    the queries.
    """
    if compiled is None:
        compiled = _compile(name, cfg, mask_kind, causal, dtype, module, mask_rows)
    sass = _cuobjdump(compiled, "-sass")
    program = []  # (address, opcode, branch target or None)
    for line in sass.splitlines():
        found = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*)", line)
        if found:
            target = (
                re.search(r"0x([0-9a-f]+)", found.group(3)) if found.group(2) == "BRA" else None
            )
            program.append((int(found.group(1), 16), found.group(2),
                            int(target.group(1), 16) if target else None))  # fmt: skip
    counts: dict[str, int] = {}
    for _, op, _ in program:
        counts[op] = counts.get(op, 0) + 1
    counts["total"] = len(program)
    # waits on the wgmma pipeline: one per loop and dot where ptxas overlaps the products,
    # one per wgmma where it serializes them (its C7515 "Potential Performance Loss")
    counts["wgmma waits"] = sass.count("WARPGROUP.DEPBAR")
    counts["fp32"] = sum(counts.get(op, 0) for op in FP32_OPS)
    # innermost loops (a backward branch enclosing no other): key or query blocks
    loops = [(target, address) for address, op, target in program
             if op == "BRA" and target is not None and target < address]  # fmt: skip
    for first, last in loops:
        if any(first <= a < b < last or first < a < b <= last for a, b in loops):
            continue
        body = [op for address, op, _ in program if first <= address <= last]
        counts.setdefault("loops", []).append((len(body), body.count("MUFU")))
    return counts


def pipelined(name: str, counts: dict) -> bool:
    """Whether ptxas overlaps the tensor-core products of each loop of kernel `name`.

    From :func:`sass_census`' `counts`: at most one ``wgmma`` wait per loop and dot (pass 1
    has one dot per tile, the other kernels two). Where ptxas serializes the products (its
    C7515, "non wgmma instructions defining accumulator registers"), it waits after every
    ``wgmma``. Which tiles it serializes changes with the kernel's code, the tile and the
    release. Kernels without ``wgmma`` (float32 products) count as pipelined.
    """
    dots = 1 if name == "_entropy_kernel" else 2
    return counts.get("HGMMA", 0) == 0 or counts["wgmma waits"] <= dots * len(counts["loops"])


def census(module=None) -> dict[str, dict[str, int]]:
    """:func:`sass_census` of each kernel at the benchmark's case.

    D = 64, bfloat16, no mask, not causal, in the configuration ``configs`` puts first.
    """
    import torch

    from softmaxtheory.accelerated._triton_config import configs

    out = {}
    for name in KERNELS:
        dv = 64 if name == "_attention_kernel" else 0
        cfg = configs(torch.device("cuda"), 64, dv, torch.bfloat16, 0, H200_SMEM,
                      backward="bwd" in name, kernel=name)[0]  # fmt: skip
        out[name] = sass_census(name, cfg, module=module)
    return out


def toolchain() -> Path:
    """The folder of NVIDIA's tools in Triton's wheel (``ptxas``, ``cuobjdump``)."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def probe(job: tuple) -> tuple:
    """The first candidate of one case that compiles well; None when that is the first.

    Well: under :data:`MIN_STACK` bytes of stack, with its products pipelined
    (:func:`pipelined`) and, for 16-bit inputs, on ``wgmma``. When no candidate is, the
    first without a heavy spill.
    """
    import torch

    from softmaxtheory.accelerated._triton_config import configs

    name, d, mask_kind, causal, dtype = job
    tdtype = getattr(torch, dtype)
    mask_elem = {0: 0, 1: 1, 2: tdtype.itemsize}[mask_kind]
    cands = configs(torch.device("cuda"), d, d if name == "_attention_kernel" else 0, tdtype,
                    mask_elem, H200_SMEM, backward="bwd" in name, tuned=False)  # fmt: skip
    spill_free = None  # index of the first candidate without a heavy spill
    for i, cfg in enumerate(cands):
        compiled = _compile(name, cfg, mask_kind, causal, dtype)
        if resource_usage(name, cfg, mask_kind, causal, dtype, compiled)["stack"] >= MIN_STACK:
            continue
        if spill_free is None:
            spill_free = i
        counts = sass_census(name, cfg, mask_kind, causal, dtype, compiled=compiled)
        # a tile too small for wgmma (mma.sync) is not the remedy for serialized wgmma
        if pipelined(name, counts) and (dtype == "float32" or counts.get("HGMMA", 0)):
            return job, (None if i == 0 else cfg)
    return job, (None if not spill_free else cands[spill_free])


def main(argv: list[str] | None = None) -> int:
    """Probe every case and print (or write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update the package's table")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS,
                        help="probe only these kernels (not with --write)")  # fmt: skip
    parser.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS),
                        help="probe only these head dims (not with --write)")  # fmt: skip
    parser.add_argument("--sass", nargs="?", const="", metavar="FILE",
                        help="print each kernel's SASS instruction counts at D = 64 (bfloat16, "
                        "no mask), and each loop's against its exponentials' cycles, instead; "
                        "with FILE, also those of the kernels in FILE (another revision of "
                        "accelerated/_triton_attention.py)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.sass is not None:
        sys.path.insert(0, str(ROOT))
        _print_census(args.sass)
        return 0
    partial = args.kernels != list(KERNELS) or args.head_dims != list(HEAD_DIMS)
    if args.write and partial:
        parser.error("--write needs every kernel and head dim")
    sys.path.insert(0, str(ROOT))
    jobs = [(n, d, *v) for n in args.kernels for d in args.head_dims for v in VARIANTS]
    table = {}
    with ProcessPoolExecutor(2) as pool:
        for (name, d, mask_kind, causal, dtype), cfg in pool.map(probe, jobs):
            if cfg is not None:
                key = (name.strip("_"), dtype, d, mask_kind, causal)
                table[key] = tuple(cfg[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps",
                                                    "num_stages"))  # fmt: skip
                print(key, table[key], flush=True)
    if args.write:
        write_table(table)
    return 0


def _print_census(other: str) -> None:
    columns = {"this tree": census()}
    if other:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "softmaxtheory.accelerated._triton_attention_other", other
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        columns = {other: census(module), **columns}
    ops = ("total", "fp32", "MUFU")
    for name in KERNELS:
        print(name)
        for label, table in columns.items():
            # a loop body issues one instruction per cycle per warp, and each MUFU.EX2 keeps
            # the exponential unit busy for 8: at least max(instructions, 8 * MUFU) cycles
            loops = ", ".join(f"{n} ({mufu} MUFU: {8 * mufu} cycles)"
                              for n, mufu in table[name].get("loops", []))  # fmt: skip
            print(f"  {label:<40}" + "  ".join(f"{op} {table[name].get(op, 0):>5}" for op in ops)
                  + f"  loops {loops}")  # fmt: skip


def write_table(table: dict) -> Path:
    """Store `table` as the running Triton release's entry of the package's table.

    Entries of other releases are kept: register allocation differs between releases (the
    device machine runs one, CI another), so each has its own.
    """
    from softmaxtheory.accelerated._triton_config import triton_release

    path = ROOT / "accelerated" / "_triton_spill_free.py"
    tables = dict(runpy.run_path(str(path))["SPILL_FREE"]) if path.exists() else {}
    tables[triton_release()] = table
    lines = [
        '"""Launch configurations that compile well (generated by ``tools/triton_spills.py``).',
        "",
        "One table per Triton release (major.minor), each compiled for sm_90 with that",
        "release (H200 shared memory), as the JIT specializes contiguous tensors. Key:",
        "(kernel, dtype, head-dim block, mask kind, causal); value: (BLOCK_M, BLOCK_N,",
        f"num_warps, num_stages), the first candidate under {MIN_STACK} bytes of stack whose",
        "wgmma ptxas does not serialize. Only cases whose first candidate spills",
        f"{MIN_STACK} bytes or more, or has its wgmma serialized, are listed.",
        '"""',
        "",
        '__all__ = ["SPILL_FREE"]',
        "",
        "SPILL_FREE: dict[str, dict[tuple[str, str, int, int, bool], tuple[int, int, int, int]]]"
        " = {",
    ]
    for version in sorted(tables, key=lambda v: tuple(map(int, v.split(".")))):
        lines.append(f'    "{version}": {{')
        # names and dtypes hold no quotes: double them as the formatter does
        lines += [f"        {k!r}: {v!r},".replace("'", '"')
                  for k, v in sorted(tables[version].items())]  # fmt: skip
        lines.append("    },")
    lines += ["}", ""]
    path.write_text("\n".join(lines))
    return path


if __name__ == "__main__":
    raise SystemExit(main())
