r"""Adaptive softmax and adaptive attention in torch (CPU and CUDA, autograd).

Imported as ``softmaxtheory.accelerated.torch``. The functions compute the
specification of :mod:`softmaxtheory.spec` on torch tensors:

.. math::

    \operatorname{adaptive\_softmax}(x) = \operatorname{softmax}\bigl(\beta(H(x))\,x\bigr),
    \qquad
    \mathrm{out}_i = \sum_j \operatorname{softmax}(\beta_i x_i)_j\, v_j,
    \quad x_{ij} = \mathrm{scale}\; q_i \cdot k_j\ (+\ \mathrm{mask}_{ij}).

float16 and bfloat16 inputs keep their statistics (entropy, β, sums) in
float32 and return the input dtype; float32 and float64 compute in their own
precision. Gradients flow through β by default (as in the paper's listing);
``detach_beta=True`` treats β as a constant.

Attention uses the T10 identity on a fused attention kernel that returns the
log-sum-exp (two calls, no :math:`L \times S` matrix), or, on CUDA with Triton
installed and no gradient needed, a Triton kernel whose first pass computes
the streaming state :math:`(m, s, t)` of theorem T7 without a second matmul.
Triton is imported only when that kernel is used.
"""

from __future__ import annotations

import torch
from softmaxtheory.accelerated import _torch_attention as _attn
from softmaxtheory.accelerated._torch_common import as_float_tensor, stats_dtype
from softmaxtheory.accelerated._torch_softmax import adaptive_softmax_lastdim
from torch import nn

from softmaxtheory.spec import Schedule, check_entropy_eps, resolve_schedule

__all__ = ["AdaptiveSoftmax", "adaptive_attention", "adaptive_softmax"]


def _check_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def adaptive_softmax(
    x: torch.Tensor,
    dim: int = -1,
    *,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    detach_beta: bool = False,
) -> torch.Tensor:
    r"""Adaptive-temperature softmax along `dim`.

    Parameters
    ----------
    x : torch.Tensor
        Logits (float16, bfloat16, float32, float64; integers are promoted
        to float64). ``-inf`` entries are masked.
    dim : int, default -1
        The axis to normalise along.
    schedule : Schedule, optional
        Temperature schedule (default :class:`~softmaxtheory.spec.PaperPolynomial`).
    entropy_eps : float, default 0.0
        ``0.0``: exact entropy :math:`\log s - t/s`; ``eps > 0``: the paper's
        listing :math:`-\sum p\log(p+\varepsilon)`.
    detach_beta : bool, default False
        Stop the gradient through β.

    Returns
    -------
    torch.Tensor
        Probabilities, same shape and dtype as `x` (float64 for integer input).
        Fully masked rows are zeros; rows with NaN or ``+inf`` are NaN.

    Raises
    ------
    TypeError
        For a non-tensor, a complex or boolean tensor, or a bad `schedule`.
    ValueError
        For a 0-d tensor, a `dim` out of range, or a bad `entropy_eps`.

    Examples
    --------
    >>> import torch
    >>> from softmaxtheory.accelerated.torch import adaptive_softmax
    >>> adaptive_softmax(torch.tensor([0.0, 0.0]))
    tensor([0.5000, 0.5000])
    """
    x = as_float_tensor(x, "x")
    schedule = resolve_schedule(schedule)
    eps = check_entropy_eps(entropy_eps)
    detach_beta = _check_flag(detach_beta, "detach_beta")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {dim!r}")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension, got a 0-d tensor")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim={dim} is out of range for a tensor with {x.ndim} dimensions")
    if x.shape[dim] == 0:
        return x.clone()
    xs = x.movedim(dim, -1)
    probs, _, _ = adaptive_softmax_lastdim(xs.to(stats_dtype(x.dtype)), schedule, eps, detach_beta)
    return probs.to(x.dtype).movedim(-1, dim)


class AdaptiveSoftmax(nn.Module):
    """Adaptive-temperature softmax as a module: a drop-in for ``torch.nn.Softmax``.

    Parameters
    ----------
    dim : int, default -1
        The axis to normalise along.
    schedule : Schedule, optional
        Temperature schedule (default :class:`~softmaxtheory.spec.PaperPolynomial`).
    entropy_eps : float, default 0.0
        Entropy mode (see :func:`adaptive_softmax`).
    detach_beta : bool, default False
        Stop the gradient through β.

    Examples
    --------
    >>> import torch
    >>> from softmaxtheory.accelerated.torch import AdaptiveSoftmax
    >>> AdaptiveSoftmax(dim=0)(torch.tensor([0.0, 0.0]))
    tensor([0.5000, 0.5000])
    """

    def __init__(
        self,
        dim: int = -1,
        *,
        schedule: Schedule | None = None,
        entropy_eps: float = 0.0,
        detach_beta: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"dim must be an int, got {dim!r}")
        self.dim = dim
        self.schedule = resolve_schedule(schedule)
        self.entropy_eps = check_entropy_eps(entropy_eps)
        self.detach_beta = _check_flag(detach_beta, "detach_beta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply :func:`adaptive_softmax` along ``self.dim``."""
        return adaptive_softmax(
            x,
            self.dim,
            schedule=self.schedule,
            entropy_eps=self.entropy_eps,
            detach_beta=self.detach_beta,
        )

    def extra_repr(self) -> str:  # noqa: D102
        return (
            f"dim={self.dim}, schedule={self.schedule!r}, entropy_eps={self.entropy_eps}, "
            f"detach_beta={self.detach_beta}"
        )


def adaptive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    schedule: Schedule | None = None,
    entropy_eps: float = 0.0,
    detach_beta: bool = False,
    backend: str = "auto",
) -> torch.Tensor:
    r"""Adaptive attention with the conventions of ``scaled_dot_product_attention``.

    Parameters
    ----------
    q : torch.Tensor, shape (..., L, D)
        Queries, typically (B, H, L, D).
    k : torch.Tensor, shape (..., S, D)
        Keys.
    v : torch.Tensor, shape (..., S, Dv)
        Values. Leading dimensions broadcast; `q`, `k`, `v` share a dtype.
    attn_mask : torch.Tensor, optional
        Broadcastable to ``(..., L, S)``. Boolean: ``True`` takes part in
        attention. Floating: added to the logits (``-inf`` masks); the whole
        logit, mask included, is multiplied by :math:`\beta_i` (the spec).
    is_causal : bool, default False
        Mask keys ``j > i`` (top-left aligned); not together with `attn_mask`.
    scale : float, optional
        Logit scale, default :math:`1/\sqrt{D}`.
    schedule : Schedule, optional
        Temperature schedule (default :class:`~softmaxtheory.spec.PaperPolynomial`).
    entropy_eps : float, default 0.0
        Entropy mode (see :func:`adaptive_softmax`).
    detach_beta : bool, default False
        Stop the gradient through β.
    backend : {"auto", "composition", "triton", "chunked"}, default "auto"
        ``"composition"``: T10 on the fused kernel with log-sum-exp (CPU:
        ``_scaled_dot_product_flash_attention_for_cpu``; CUDA: flash or
        memory-efficient attention). ``"triton"``: the Triton kernel (CUDA, or
        CPU tensors under ``TRITON_INTERPRET=1``; forward only).
        ``"chunked"``: blocks of queries against all keys, memory
        :math:`O(\mathrm{block}\cdot S)`. ``"auto"`` takes Triton on CUDA when
        no gradient is needed, else the composition, and the chunked path for
        ``entropy_eps > 0``, additive masks with finite non-zero entries, or
        when no fused kernel accepts the inputs.

    Returns
    -------
    torch.Tensor, shape (..., L, Dv)
        Outputs in the input dtype. A query with every key masked gives
        zeros; a NaN or infinite query, unmasked key or mask entry (NaN /
        ``+inf``) gives a NaN row.

    Raises
    ------
    TypeError
        For non-tensors, mixed or unsupported dtypes, or a bad `scale`.
    ValueError
        For mismatched shapes, a mask together with `is_causal`, a mask that
        requires grad, or a `backend` that cannot run these inputs.

    Examples
    --------
    >>> import torch
    >>> from softmaxtheory.accelerated.torch import adaptive_attention
    >>> q = torch.tensor([[1.0, 0.0]]); k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> v = torch.tensor([[1.0], [-1.0]])
    >>> adaptive_attention(q, k, v, scale=0.0)
    tensor([[0.]])
    """
    schedule = resolve_schedule(schedule)
    eps = check_entropy_eps(entropy_eps)
    detach_beta = _check_flag(detach_beta, "detach_beta")
    if backend not in _attn.BACKENDS:
        raise ValueError(f"backend must be one of {_attn.BACKENDS}, got {backend!r}")
    prepared = _attn.prepare(q, k, v, attn_mask, is_causal, scale)
    out = _attn.attention(prepared, schedule, eps, detach_beta, backend)
    return out.reshape(*prepared.lead, *out.shape[-2:])
