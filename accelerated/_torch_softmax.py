r"""Adaptive softmax along the last axis of a torch tensor (private).

The row is shifted by its maximum, :math:`z = x - \max x`, the entropy is read
from the T7 statistics (or, with ``entropy_eps > 0``, as the paper's listing
:math:`-\sum p \log(p + \varepsilon)`), β from the schedule, and the output is
:math:`\operatorname{softmax}(\beta z) = \operatorname{softmax}(\beta x)`.
Masked (``-inf``) entries never enter an arithmetic operation, so gradients
stay finite on masked and fully masked rows.
"""

from __future__ import annotations

import torch
from softmaxtheory.accelerated._torch_common import beta_from_entropy, entropy_from_stats

from softmaxtheory.spec import Schedule

__all__ = ["adaptive_softmax_lastdim"]


def adaptive_softmax_lastdim(
    x: torch.Tensor,
    schedule: Schedule,
    entropy_eps: float,
    detach_beta: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Adaptive softmax of float32/float64 rows along the last axis.

    Returns
    -------
    tuple of torch.Tensor
        ``(probabilities, entropy, beta)``; entropy and β have the row shape,
        β in the dtype of `x` (``n = 0`` rows are handled by the caller).
    """
    masked = x == -torch.inf
    n_eff = (~masked).sum(-1)
    m = torch.amax(x, dim=-1, keepdim=True)
    m_safe = torch.where(m == -torch.inf, torch.zeros_like(m), m)
    z = torch.where(masked, torch.zeros_like(x), x - m_safe)
    entropy = None
    if schedule.needs_entropy:
        e = torch.where(masked, torch.zeros_like(z), torch.exp(z))
        s = e.sum(-1)
        if entropy_eps == 0.0:
            entropy = entropy_from_stats(s, (e * z).sum(-1))
        else:
            s_safe = torch.where(s == 0, torch.ones_like(s), s)
            p = e / s_safe.unsqueeze(-1)
            entropy = -(p * torch.log(p + entropy_eps)).sum(-1)
            entropy = torch.where(s == 0, torch.zeros_like(entropy), entropy)
    beta = beta_from_entropy(schedule, entropy, n_eff).to(x.dtype)
    if detach_beta:
        beta = beta.detach()
    y = torch.where(masked, torch.full_like(z, -torch.inf), beta.unsqueeze(-1) * z)
    e2 = torch.exp(y)
    s2 = e2.sum(-1, keepdim=True)
    s2 = torch.where(s2 == 0, torch.ones_like(s2), s2)
    if entropy is None:
        entropy = torch.full_like(beta, torch.nan)
    return e2 / s2, entropy, beta
