"""The tile sweep of a GPU run: every launch configuration of the pass-1 kernels, timed.

``softmaxtheory bench --device cuda --tiles`` times the Triton kernels of pass 1 and
of its backward once per candidate configuration: the ladder
``configs`` (``accelerated/_triton_config.py``) tries in order (largest
tile first), and a few wider tiles and warp counts it does not try (:data:`EXTRA`).
The ladder's order is a prior, set without a GPU from shared memory and register
spills (``tools/triton_spills.py``); one sweep on the device says which tile is
fastest there, and by how much the first candidate, the one that runs, trails it.

Pass 1 is timed at the benchmark's first shape, the backward at its backward shape
(bfloat16, no mask, not causal). The backward's two kernels are swept one at a time,
the other at its first candidate, so their rows time the pair.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["EXTRA", "KERNELS", "candidates", "launchers", "summarize", "sweep"]

#: The kernels swept, with whether they take the backward ladder.
KERNELS: dict[str, bool] = {
    "_entropy_kernel": False,
    "_entropy_bwd_dq_kernel": True,
    "_entropy_bwd_dk_kernel": True,
}

#: Configurations swept beyond the ladder, each a tuple of ``BLOCK_M``, ``BLOCK_N``,
#: ``num_warps`` and ``num_stages``. Wider key tiles and eight warps, which the ladder
#: leaves out for their register use.
EXTRA: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    "_entropy_kernel": ((128, 128, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (256, 64, 8, 3)),
    "_entropy_bwd_dq_kernel": ((64, 64, 8, 2), (128, 64, 8, 2)),
    "_entropy_bwd_dk_kernel": ((64, 64, 8, 2), (64, 128, 8, 2)),
}

_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def _tile(cfg: dict[str, int]) -> tuple[int, ...]:
    return tuple(cfg[k] for k in _KEYS)


def candidates(kernel: str, head_dim: int, dtype: Any, budget: int | None = None) -> list[dict]:
    """The configurations swept for `kernel` on CUDA: the ladder, then :data:`EXTRA`.

    Parameters
    ----------
    kernel : str
        A key of :data:`KERNELS`.
    head_dim : int
        The head dim of the queries and keys.
    dtype : torch.dtype
        The inputs' dtype.
    budget : int, optional
        Shared memory per block (bytes); the current CUDA device's by default.

    Returns
    -------
    list of dict
        Launch keyword arguments. The first is the one
        ``configs`` (``accelerated/_triton_config.py``) launches; extras
        already on the ladder, or whose estimated shared memory exceeds `budget`,
        are left out.
    """
    import torch

    from softmaxtheory.accelerated._triton_config import configs, smem_budget, smem_estimate

    device = torch.device("cuda")
    out = configs(device, head_dim, 0, dtype, 0, budget, backward=KERNELS[kernel],
                  kernel=kernel)  # fmt: skip
    if budget is None:
        budget = smem_budget(device)
    seen = {_tile(c) for c in out}
    elem = torch.finfo(dtype).bits // 8
    dims = {k: v for k, v in out[0].items() if k.startswith("BLOCK_D")}
    for bm, bn, warps, stages in EXTRA[kernel]:
        if (bm, bn, warps, stages) in seen:
            continue
        if smem_estimate(bm, bn, stages, dims["BLOCK_D"], 0, elem, 0) > budget:
            continue
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, **dims, "num_warps": warps,
                    "num_stages": stages})  # fmt: skip
    return out


def launchers(torch: Any, device: str, shape: tuple, backward_shape: tuple) -> dict:
    """For each kernel of :data:`KERNELS`: its shape, and a function that runs it once.

    Parameters
    ----------
    torch : module
        The torch module.
    device : str
        Where the operands live (``"cuda"``; ``"cpu"`` under ``TRITON_INTERPRET=1``).
    shape, backward_shape : tuple of int
        (B, H, L, S, D) of pass 1 and of its backward; bfloat16 normal operands.

    Returns
    -------
    dict
        Kernel name to ``(shape, run)``, where ``run(cfg)`` launches the kernel once in
        configuration `cfg` (the backward's other kernel in its first candidate).
    """
    from softmaxtheory.accelerated import _triton_attention as tri
    from softmaxtheory.accelerated._torch_attention import operands_log2_bound

    def operands(shape: tuple, seed: int) -> tuple:
        B, H, L, S, D = shape
        g = torch.Generator(device=device).manual_seed(seed)
        return tuple(torch.randn(B, H, n, D, device=device, dtype=torch.bfloat16, generator=g)
                     for n in (L, S))  # fmt: skip

    q, k = operands(shape, 0)
    scale = shape[-1] ** -0.5
    qb, kb = operands(backward_shape, 1)
    ent, lse = tri.triton_entropy(qb, kb, None, tri.MASK_NONE, False, scale)
    g = torch.Generator(device=device).manual_seed(2)
    d_ent, d_lse = (torch.randn(ent.shape, device=device, generator=g) for _ in range(2))

    bound = operands_log2_bound(q, k, scale)  # read once, not in the timed calls

    def forward(cfg: dict) -> Any:
        return tri.triton_entropy(q, k, None, tri.MASK_NONE, False, scale,
                                  candidates={"_entropy_kernel": [cfg]},
                                  log2_bound=bound)  # fmt: skip

    def backward(name: str) -> Callable[[dict], Any]:
        def run(cfg: dict) -> Any:
            return tri.triton_entropy_backward(qb, kb, None, tri.MASK_NONE, False, scale, 1,
                                               ent, lse, d_ent, d_lse,
                                               candidates={name: [cfg]})  # fmt: skip

        return run

    return {
        "_entropy_kernel": (shape, forward),
        "_entropy_bwd_dq_kernel": (backward_shape, backward("_entropy_bwd_dq_kernel")),
        "_entropy_bwd_dk_kernel": (backward_shape, backward("_entropy_bwd_dk_kernel")),
    }


def sweep(
    time_fn: Callable[[Callable[[], Any]], float],
    launchers: dict[str, tuple[tuple, Callable[[dict], Any]]],
    cands: dict[str, list[dict]],
    on_kernel: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """Time every configuration in `cands` with `time_fn`, kernel by kernel.

    Parameters
    ----------
    time_fn : callable
        Seconds one call of its argument takes (the benchmark's median of CUDA events).
    launchers : dict
        Kernel name to ``(shape, run)``; ``run(cfg)`` launches it once in `cfg`.
    cands : dict
        Kernel name to its configurations, the launched one first (:func:`candidates`).
    on_kernel : callable, optional
        Called with the rows so far after each configuration (the benchmark saves its
        JSON: a run stopped at its time limit keeps every configuration timed, not only
        the kernels finished).

    Returns
    -------
    list of dict
        One row per configuration: ``kernel``, ``shape``, ``config`` (BLOCK_M, BLOCK_N,
        num_warps, num_stages), ``first`` (whether it is the one launched) and
        ``seconds``, or ``error`` where Triton refused it (shared memory, registers).
    """
    from softmaxtheory.accelerated._triton_config import NoConfig

    rows: list[dict] = []
    for kernel, configs in cands.items():
        shape, run = launchers[kernel]
        for i, cfg in enumerate(configs):
            row: dict[str, Any] = {"kernel": kernel.strip("_"), "shape": list(shape),
                                   "config": list(_tile(cfg)), "first": i == 0}  # fmt: skip
            try:
                row["seconds"] = time_fn(lambda cfg=cfg, run=run: run(cfg))
            except NoConfig as exc:
                row["error"] = f"refused: {exc}"
            rows.append(row)
            if on_kernel is not None:
                on_kernel(rows)
    return rows


def summarize(rows: list[dict]) -> list[str]:
    """One line per kernel: the fastest configuration, and how far the launched one trails."""
    lines = []
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        timed = [r for r in rows if r["kernel"] == kernel and "seconds" in r]
        if not timed:
            lines.append(f"{kernel}: no configuration ran")
            continue
        best = min(timed, key=lambda r: r["seconds"])
        first = next((r for r in timed if r["first"]), None)
        trail = "the launched one did not run" if first is None else (
            f"launched {tuple(first['config'])} {first['seconds'] * 1e3:.3f} ms "
            f"({first['seconds'] / best['seconds']:.2f}x)"
        )  # fmt: skip
        lines.append(f"{kernel}: fastest {tuple(best['config'])} {best['seconds'] * 1e3:.3f} ms"
                     f" of {len(timed)}; {trail}")  # fmt: skip
    return lines
