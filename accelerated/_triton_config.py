r"""Launch configurations of the Triton kernels, with a fallback (private; imports triton).

A configuration is the tile shape (``BLOCK_M`` queries by ``BLOCK_N`` keys,
head dims padded to powers of two) and, on CUDA, ``num_warps`` and
``num_stages``. :func:`configs` lists the candidates for a head dim, dtype
and mask kind from the largest to the smallest, keeping those whose
estimated shared memory

.. math::

    \mathrm{smem} \approx \mathrm{BLOCK\_M}\cdot D\cdot b
    + \mathrm{stages}\cdot\bigl(\mathrm{BLOCK\_N}\,(D + D_v)\,b
    + \mathrm{BLOCK\_M}\,\mathrm{BLOCK\_N}\,b_\mathrm{mask}\bigr)

(:math:`b` bytes per element) fits the device's per-block budget.
:func:`launch` tries them in order: a configuration that Triton refuses with
``OutOfResources`` (the estimate is only an estimate), or that its code
generator cannot lower for this device (an MLIR pass failure: Triton 3.6 has no
float64 MMA with a large K for Hopper, so the float64 backward with a boolean
mask did not compile there), is remembered and the next one is tried; when
none runs, :class:`NoConfig` tells the caller to take the torch composition
instead. No user ever sees either.

This module defines no kernel, so importing it does not fix the
``TRITON_INTERPRET`` mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
from triton.runtime.errors import OutOfResources

__all__ = ["NoConfig", "configs", "launch", "on_tensors_device", "smem_budget", "triton_release"]

#: Shared memory per block assumed when the device does not report it (bytes).
DEFAULT_SMEM = 99 * 1024

#: CUDA candidates (BLOCK_M, BLOCK_N, num_stages), largest first.
_CUDA_TILES = (
    (128, 64, 3),
    (128, 64, 2),
    (128, 32, 2),
    (64, 64, 2),
    (64, 32, 2),
    (32, 32, 1),
    (16, 16, 1),
)

#: CUDA candidates of the pass-1 backward kernels: smaller query tiles (a (BLOCK_M, D)
#: float32 accumulator and three (BLOCK_M, BLOCK_N) tiles live in registers).
_CUDA_BWD_TILES = (
    (64, 64, 2),
    (64, 32, 2),
    (32, 64, 2),
    (32, 32, 2),
    (32, 32, 1),
    (16, 16, 1),
)

#: Largest max(BLOCK_M, BLOCK_N) * BLOCK_D of a backward candidate (accumulator registers).
_BWD_MAX_ACC = 64 * 128

#: Configurations Triton refused in this process: (kernel name, device, tensor dtypes,
#: config items, compile-time arguments). The device and dtypes are part of it: a tile
#: refused for a float32 bias (or on a smaller GPU of the process) may fit a bfloat16 one.
_REFUSED: set[tuple[Any, ...]] = set()

#: Elements of Triton's largest block (``triton.language.TRITON_MAX_TENSOR_NUMEL``).
MAX_TILE = int(getattr(triton.language, "TRITON_MAX_TENSOR_NUMEL", 2**20))


class NoConfig(RuntimeError):
    """No launch configuration of a Triton kernel fits this device (use the composition)."""


def smem_budget(device: torch.device) -> int:
    """Shared memory one block may use on `device` (bytes; :data:`DEFAULT_SMEM` if unknown)."""
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or DEFAULT_SMEM)


def smem_estimate(
    block_m: int, block_n: int, stages: int, bd: int, bdv: int, elem: int, mask_elem: int
) -> int:
    """Estimated shared memory (bytes) of one program (see the module docstring)."""
    per_stage = block_n * (bd + bdv) * elem + block_m * block_n * mask_elem
    return block_m * bd * elem + stages * per_stage


def configs(
    device: torch.device,
    head_dim: int,
    value_dim: int,
    dtype: torch.dtype,
    mask_elem: int,
    budget: int | None = None,
    *,
    backward: bool = False,
    kernel: str = "",
    causal: bool = False,
    tuned: bool = True,
) -> list[dict[str, int]]:
    """Candidate configurations, largest first (a recorded one first where it compiles better).

    Parameters
    ----------
    device : torch.device
        Where the kernel runs (CPU: the interpreter, one small tile).
    head_dim, value_dim : int
        Feature sizes of the keys and of the values (``value_dim = 0``: the
        pass-1 kernel, which reads no values).
    dtype : torch.dtype
        Input dtype.
    mask_elem : int
        Bytes per mask element read per tile (0: no mask).
    budget : int, optional
        Shared memory per block in bytes (default: what the device reports).
    backward : bool, default False
        Candidates of the pass-1 backward kernels (smaller tiles, the
        accumulator ``max(BLOCK_M, BLOCK_N) * BLOCK_D`` at most ``64 * 128``).
    kernel : str, optional
        The kernel's name (``"entropy_kernel"``, ``"entropy_bwd_dq_kernel"``,
        ``"entropy_bwd_dk_kernel"``, ``"attention_kernel"``); with `causal` it
        selects the entry of :data:`._triton_spill_free.SPILL_FREE` for the
        installed Triton release (:func:`triton_release`).
    causal : bool, default False
        Whether the launch is causal.
    tuned : bool, default True
        Put the recorded configuration first: where the largest candidate
        spills heavily (128 bytes of stack or more), or has its ``wgmma``
        serialized, when compiled for sm_90 by the installed Triton release, the
        first one that does neither (``tools/triton_spills.py``; 16-bit dtypes
        share the bfloat16 entries). False, or a release the table does not
        hold, gives the plain order.

    Returns
    -------
    list of dict
        Keyword arguments of the launch: ``BLOCK_M``, ``BLOCK_N``,
        ``BLOCK_D`` (and ``BLOCK_DV`` when ``value_dim > 0``), and on CUDA
        ``num_warps`` and ``num_stages``. Never empty: the smallest
        candidate is kept even if the estimate exceeds the budget (Triton
        then decides).

    Raises
    ------
    NoConfig
        If even a block of 16 rows of the head dim exceeds Triton's largest
        block (:data:`MAX_TILE` elements: head dims above 65,536).
    """
    bd = max(16, triton.next_power_of_2(max(head_dim, 1)))
    bdv = max(16, triton.next_power_of_2(max(value_dim, 1))) if value_dim else 0
    dims = {"BLOCK_D": bd, **({"BLOCK_DV": bdv} if value_dim else {})}
    if 16 * max(bd, bdv) > MAX_TILE:
        raise NoConfig(
            f"head dim {head_dim} (values {value_dim}) needs blocks of 16 x {max(bd, bdv)} "
            f"elements, beyond Triton's largest block ({MAX_TILE})"
        )
    if device.type != "cuda":
        return [{"BLOCK_M": 16, "BLOCK_N": 16, **dims}]
    if budget is None:
        budget = smem_budget(device)
    elem = torch.finfo(dtype).bits // 8
    out = []
    for block_m, block_n, stages in _CUDA_BWD_TILES if backward else _CUDA_TILES:
        if smem_estimate(block_m, block_n, stages, bd, bdv, elem, mask_elem) > budget:
            continue
        if backward and max(block_m, block_n) * bd > _BWD_MAX_ACC and block_m > 16:
            continue
        if max(block_m, block_n) * max(bd, bdv) > MAX_TILE:
            continue
        warps = 8 if block_m >= 128 and max(bd, bdv) > 64 else 4
        out.append(
            {"BLOCK_M": block_m, "BLOCK_N": block_n, **dims, "num_warps": warps,
             "num_stages": stages}
        )  # fmt: skip
    if not out:
        out.append(
            {"BLOCK_M": 16, "BLOCK_N": 16, **dims, "num_warps": 4, "num_stages": 1}
        )  # fmt: skip
    if tuned and kernel:
        first = _spill_free(kernel, dtype, bd, mask_elem, causal)
        if first is not None:
            block_m, block_n, warps, stages = first
            if smem_estimate(block_m, block_n, stages, bd, bdv, elem, mask_elem) <= budget:
                same = ("BLOCK_M", "BLOCK_N", "num_stages")
                cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, **dims, "num_warps": warps,
                       "num_stages": stages}  # fmt: skip
                out = [cfg] + [c for c in out if any(c[k] != cfg[k] for k in same)]
    return out


def _spill_free(
    kernel: str, dtype: torch.dtype, bd: int, mask_elem: int, causal: bool
) -> tuple[int, int, int, int] | None:
    """The recorded configuration of a case (None: the first candidate compiles well)."""
    from ._triton_spill_free import SPILL_FREE

    table = SPILL_FREE.get(triton_release(), {})
    name = "float32" if dtype == torch.float32 else "bfloat16"
    kind = 0 if mask_elem == 0 else (1 if mask_elem == 1 else 2)
    return table.get((kernel.strip("_"), name, bd, kind, causal))


def triton_release(version: str | None = None) -> str:
    """The release (major.minor) of `version`, by default the installed Triton's.

    The spill-free table has one entry per release: register allocation, and so which
    tiles spill, changes between releases. A release without an entry uses the plain
    order of candidates.
    """
    if version is None:
        version = triton.__version__
    return ".".join(version.split("+")[0].split(".")[:2])


def on_tensors_device(args: Sequence[object]) -> contextlib.AbstractContextManager[Any]:
    """A context in which the device of the first CUDA tensor of `args` is the current one.

    Triton launches on the current CUDA device, whatever its tensors' device: given
    tensors on ``cuda:1`` while ``cuda:0`` is current (a process that never called
    ``torch.cuda.set_device``), a kernel would run on ``cuda:0`` with ``cuda:1``
    addresses. No CUDA tensor (the interpreter, on CPU): a context that does nothing.
    """
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "cuda":
            return torch.cuda.device(a.device)
    return contextlib.nullcontext()


def _lowering_failed(exc: BaseException) -> bool:
    """Whether `exc` is Triton's code generator failing to lower a kernel for the device.

    Triton reports a failed MLIR pass as a plain ``RuntimeError`` whose message
    starts ``PassManager::run failed``, before anything is launched; every other
    ``RuntimeError`` (a CUDA error, a bug) is the caller's to see.
    """
    return "PassManager::run failed" in str(exc)


def launch(
    kernel: Any,
    grid: Callable[[dict[str, int]], tuple[int, ...]],
    args: Sequence[object],
    constexprs: dict[str, object],
    candidates: Sequence[dict[str, int]],
) -> dict[str, int]:
    """Launch `kernel` with the first candidate configuration Triton accepts.

    The launch runs on the device of its tensors (:func:`on_tensors_device`).

    Parameters
    ----------
    kernel : triton.JITFunction
        The kernel (``kernel[grid](*args, **constexprs, **config)``).
    grid : callable
        The launch grid of a configuration.
    args : sequence
        Positional arguments of the kernel.
    constexprs : dict
        Compile-time arguments shared by every configuration.
    candidates : sequence of dict
        From :func:`configs`, largest first.

    Returns
    -------
    dict
        The configuration that ran.

    Raises
    ------
    NoConfig
        If Triton refused every candidate with ``OutOfResources``, or could not
        lower it for the device (:func:`_lowering_failed`).
    """
    name = getattr(kernel, "__name__", repr(kernel))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    where = (str(tensors[0].device) if tensors else "", tuple(str(a.dtype) for a in tensors))
    last: Exception | None = None
    for cfg in candidates:
        key = (name, *where, tuple(sorted(cfg.items())),
               tuple(sorted(map(str, constexprs.items()))))  # fmt: skip
        if key in _REFUSED:
            continue
        try:
            with on_tensors_device(args):
                kernel[grid(cfg)](*args, **constexprs, **cfg)
        except OutOfResources as exc:
            _REFUSED.add(key)
            last = exc
            continue
        except RuntimeError as exc:
            if not _lowering_failed(exc):
                raise
            _REFUSED.add(key)
            last = exc
            continue
        return cfg
    raise NoConfig(f"no launch configuration of {name} fits this device: {last}") from last
