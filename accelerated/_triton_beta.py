r"""β of the polynomial schedule in one Triton kernel (private; imports triton).

The hybrid forward turns pass 1's entropies into :math:`\beta_i` before pass 2.
In torch that is about fifteen elementwise kernels on the :math:`B H L` rows
(the float64 Horner steps, the clamp, the threshold, the NaN rows, the cast):
each costs a launch on the device and a dispatch on the host, for a few
megabytes of work. :func:`triton_polynomial_beta` does it in one kernel, with
the same float64 operations in the same order, unfused (the kernel is compiled
without multiply-add contraction, as torch runs each step as its own kernel),
so its β equals :func:`~._torch_common.beta_from_entropy`'s bit for bit:

.. math::

    P(H) = (\cdots((c_0 H + c_1) H + c_2) \cdots) H + c_{n-1}, \qquad
    \beta = \begin{cases} \max(P(H), 1) & H > \theta \\ 1 & H \le \theta \end{cases},

NaN where :math:`H` is NaN, rounded once to the statistics dtype. It carries
no gradient: the path with β attached keeps the torch evaluation.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..spec import Polynomial
from ._torch_common import poly_floats
from ._triton_config import on_tensors_device

__all__ = ["BLOCK", "LAUNCH_OPTIONS", "triton_polynomial_beta"]

#: Rows per program.
BLOCK = 1024

#: Compiler options of the launch: no multiply-add contraction, so that each Horner step
#: rounds its product and its sum separately, as torch's kernels (one per step) do.
LAUNCH_OPTIONS = {"enable_fp_fusion": False}


@triton.jit
def _polynomial_beta_kernel(Ent, Coeffs, Beta, n, N_COEFFS: tl.constexpr, BLOCK: tl.constexpr):
    """β of rows ``[pid * BLOCK, (pid + 1) * BLOCK)``; `Coeffs` holds c_0..c_{n-1}, then θ."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    h = tl.load(Ent + offs, mask=inside, other=0.0).to(tl.float64)
    if N_COEFFS == 1:
        p = tl.zeros_like(h) + tl.load(Coeffs)
    else:
        p = h * tl.load(Coeffs)
        for i in tl.static_range(1, N_COEFFS - 1):
            p = (p + tl.load(Coeffs + i)) * h
        p = p + tl.load(Coeffs + N_COEFFS - 1)
    threshold = tl.load(Coeffs + N_COEFFS)
    beta = tl.where(h > threshold, tl.maximum(p, 1.0, propagate_nan=tl.PropagateNan.ALL), 1.0)
    beta = tl.where(h != h, h, beta)  # NaN rows stay NaN
    tl.store(Beta + offs, beta.to(Beta.dtype.element_ty), mask=inside)


@functools.lru_cache(maxsize=64)
def _coefficients(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """The coefficients and threshold as a float64 tensor on `device` (made once)."""
    return torch.tensor(values, dtype=torch.float64, device=device)


def triton_polynomial_beta(
    schedule: Polynomial, entropy: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """β of each row of `entropy` under `schedule`, in `dtype` (float32 or float64).

    Parameters
    ----------
    schedule : Polynomial
        The schedule (its coefficients and threshold as floats, as
        :func:`~._torch_common.poly_floats` gives them).
    entropy : torch.Tensor
        Row entropies (float32 or float64), any shape; not differentiated.
    dtype : torch.dtype
        The dtype of the result (the statistics dtype of the inputs).

    Returns
    -------
    torch.Tensor
        β, shape of `entropy`, equal to ``beta_from_entropy(schedule, entropy,
        n_eff).to(dtype)`` (which ignores ``n_eff`` for this schedule).
    """
    coeffs, threshold = poly_floats(schedule)
    table = _coefficients((*coeffs, threshold), entropy.device)
    h = entropy.detach().contiguous()
    beta = torch.empty(h.shape, dtype=dtype, device=h.device)
    n = h.numel()
    if n:
        with on_tensors_device((h,)):
            _polynomial_beta_kernel[(triton.cdiv(n, BLOCK),)](
                h, table, beta, n, N_COEFFS=len(coeffs), BLOCK=BLOCK, **LAUNCH_OPTIONS
            )
    return beta
