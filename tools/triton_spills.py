#!/usr/bin/env python
"""Find, for each Triton kernel, the first launch configuration that compiles without spills.

Usage::

    python tools/triton_spills.py            # prints the table; --write updates the module
    python tools/triton_spills.py --write    # accelerated/_triton_spill_free.py

Register allocation differs between Triton releases, so the table holds one entry per
release (major.minor); ``--write`` replaces the running release's entry and keeps the others.

No GPU is needed: Triton's Linux wheel carries NVIDIA's ``ptxas`` and ``cuobjdump``, so each
candidate of :func:`softmaxtheory.accelerated._triton_config.configs` (H200 shared memory,
in its order) is compiled for sm_90 and its cubin's stack usage read. For each kernel, head-dim
block, mask kind and causal flag whose *first* candidate spills at least ``MIN_STACK`` bytes
(a heavy spill; a few bytes may cost less than a smaller tile), the first candidate that
does not spill is recorded; ``configs`` then tries that one first. bfloat16 stands for both 16-bit
dtypes; float32 is probed with a boolean mask. Two processes compile at once (a few minutes
per kernel on two cores).
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


def _signature(kernel, constexprs: dict, mask_kind: int, dtype: str) -> dict[str, str]:
    elem = "*fp32" if dtype == "float32" else "*bf16"
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "Mask":
            sig[name] = "*u8" if mask_kind == 1 else elem
        elif name in ("Q", "K", "V", "Out", "DQ", "DK"):
            sig[name] = elem
        elif name[0].isupper() and name not in ("L", "S", "D", "DV"):
            sig[name] = "*fp32"
        else:
            sig[name] = "i64" if name.startswith("stride") else "i32"
    return sig


def resource_usage(name: str, cfg: dict, mask_kind: int, causal: bool, dtype: str) -> dict:
    """Compile one kernel configuration for sm_90 and read its cubin's resource usage.

    Returns ``regs``, ``stack``, ``local`` and ``shared`` (bytes, from ``cuobjdump
    -res-usage``) and ``launch_shared`` (the shared memory Triton reserves at launch).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from softmaxtheory.accelerated import _triton_attention as T  # noqa: N812

    kernel = getattr(T, name)
    consts = {"MASK_KIND": mask_kind, "CAUSAL": causal, "UPCAST": False,
              "PRECISION": "ieee" if dtype == "float32" else "tf32",
              **{k: v for k, v in cfg.items() if k.startswith("BLOCK")}}  # fmt: skip
    if "ACC" in kernel.arg_names:
        consts["ACC"] = triton.language.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Triton's notices about its own defaults
        compiled = triton.compile(
            ASTSource(kernel, _signature(kernel, consts, mask_kind, dtype), constexprs=consts),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
        )
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        os.write(fd, compiled.asm["cubin"])
        os.close(fd)
        usage = subprocess.run([str(toolchain() / "cuobjdump"), "-res-usage", path],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
    finally:
        os.unlink(path)
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {usage}")
    regs, stack, shared, local = map(int, found.groups())
    return {"regs": regs, "stack": stack, "local": local, "shared": shared,
            "launch_shared": compiled.metadata.shared}  # fmt: skip


def toolchain() -> Path:
    """The folder of NVIDIA's tools in Triton's wheel (``ptxas``, ``cuobjdump``)."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def probe(job: tuple) -> tuple:
    """The first spill-free candidate of one case; None when the first one spills little."""
    import torch

    from softmaxtheory.accelerated._triton_config import configs

    name, d, mask_kind, causal, dtype = job
    tdtype = getattr(torch, dtype)
    mask_elem = {0: 0, 1: 1, 2: tdtype.itemsize}[mask_kind]
    cands = configs(torch.device("cuda"), d, d if name == "_attention_kernel" else 0, tdtype,
                    mask_elem, H200_SMEM, backward="bwd" in name, tuned=False)  # fmt: skip
    for i, cfg in enumerate(cands):
        stack = resource_usage(name, cfg, mask_kind, causal, dtype)["stack"]
        if i == 0 and stack < MIN_STACK:
            return job, None
        if stack == 0:
            return job, cfg
    return job, None


def main(argv: list[str] | None = None) -> int:
    """Probe every case and print (or write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update the package's table")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS,
                        help="probe only these kernels (not with --write)")  # fmt: skip
    parser.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS),
                        help="probe only these head dims (not with --write)")  # fmt: skip
    args = parser.parse_args(argv)
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
        '"""First spill-free launch configurations (generated by ``tools/triton_spills.py``).',
        "",
        "One table per Triton release (major.minor), each compiled for sm_90 with that",
        "release (H200 shared memory). Key: (kernel, dtype, head-dim block, mask kind,",
        "causal); value: (BLOCK_M, BLOCK_N, num_warps, num_stages). Only cases whose first",
        f"candidate spills {MIN_STACK} bytes or more are listed.",
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
