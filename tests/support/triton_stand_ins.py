"""Stand-ins for the Triton kernels where a test tells the torch path that Triton runs here.

A test that patches ``triton_available`` to True on CPU (to run the GPU path's order of
calls without a GPU) must also replace every kernel that path launches; pass 1 each test
replaces its own way, the β kernel here.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["torch_beta_kernel"]


def torch_beta_kernel(monkeypatch: Any) -> None:
    """Replace the polynomial schedule's β kernel by torch's evaluation (equal bit for bit)."""
    from softmaxtheory.accelerated import _triton_beta
    from softmaxtheory.accelerated._torch_common import beta_from_entropy

    def beta(schedule: Any, entropy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        one = torch.ones((), device=entropy.device)
        return beta_from_entropy(schedule, entropy.detach(), one).to(dtype)

    monkeypatch.setattr(_triton_beta, "triton_polynomial_beta", beta)
