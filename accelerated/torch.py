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

Attention takes two passes, because β needs the row's entropy before the
output can be formed: pass 1 reads only :math:`QK^\top` (the running state
:math:`(m, s, t)` of theorem T7 gives each query's entropy and log-sum-exp,
no values read; public as :func:`attention_entropy`), pass 2 is attention on
the β-scaled logits. On CUDA pass 1 is a Triton kernel and pass 2 is
``scaled_dot_product_attention`` itself on the β-scaled queries (the hybrid);
the portable composition uses the T10 identity on a fused attention kernel
that returns the log-sum-exp (two calls, no :math:`L \times S` matrix).
Gradients through β: pass 1 has its own backward (Triton kernels on CUDA,
:math:`\partial H_i/\partial x_{ij} = -p_{ij}(\log p_{ij} + H_i)`, no values
read), and SDPA's own backward serves pass 2. Triton is imported only when
its kernels are used.
"""

from __future__ import annotations

import torch
from torch import nn

from ..spec import Schedule, check_entropy_eps, resolve_schedule
from . import _torch_attention as _attn
from ._torch_common import as_flag, as_float_tensor, as_index, autocast_dtype
from ._torch_softmax import adaptive_softmax_rows

__all__ = ["AdaptiveSoftmax", "adaptive_attention", "adaptive_softmax", "attention_entropy"]


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
        to float64, and one that float64 does not hold, beyond 2**53, is a
        ValueError outside ``torch.compile`` and ``torch.func``). ``-inf``
        entries are masked.
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
        For a non-tensor, a complex or boolean tensor, or a bad `schedule` (a user
        :class:`~softmaxtheory.spec.Schedule` under a ``torch.func`` transform included).
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
    detach_beta = as_flag(detach_beta, "detach_beta")
    dim = as_index(dim, "dim")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension, got a 0-d tensor")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim={dim} is out of range for a tensor with {x.ndim} dimensions")
    if x.shape[dim] == 0:
        return x.clone()
    xs = x.movedim(dim, -1)
    probs = adaptive_softmax_rows(xs, schedule, eps, detach_beta)
    return probs.to(x.dtype).movedim(-1, dim)


class AdaptiveSoftmax(nn.Module):
    """Adaptive-temperature softmax as a module: a drop-in for ``torch.nn.Softmax``.

    The module compiles with ``torch.compile`` (``fullgraph=True``: the
    schedule's constants are folded in, no graph break; gradients included).
    ``torch.jit.script`` is not supported (TorchScript cannot type the
    schedule object); it raises a TypeError that points to ``torch.compile``.

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
        self.dim = as_index(dim, "dim")
        self.schedule = resolve_schedule(schedule)
        self.entropy_eps = check_entropy_eps(entropy_eps)
        self.detach_beta = as_flag(detach_beta, "detach_beta")

    def __prepare_scriptable__(self) -> AdaptiveSoftmax:
        """Refuse ``torch.jit.script`` with a clear message (use ``torch.compile``)."""
        raise TypeError(
            "AdaptiveSoftmax does not support torch.jit.script (the schedule is a Python "
            "object TorchScript cannot type); compile it with torch.compile(module) instead"
        )

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
    enable_gqa: bool = False,
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
        Queries, typically (B, H, L, D): float16, bfloat16, float32 or float64
        (integer tensors are promoted to float64, as :func:`adaptive_softmax`
        promotes them; SDPA refuses them).
    k : torch.Tensor, shape (..., S, D)
        Keys (with `enable_gqa`, ``k.shape[-3]`` is the number of key heads).
    v : torch.Tensor, shape (..., S, Dv)
        Values. Leading dimensions broadcast; `q`, `k`, `v` share a dtype.
    attn_mask : torch.Tensor, optional
        Broadcastable to ``(..., L, S)``, the leading dimensions of `q`, `k`
        and `v` (it may not add any, as in SDPA). Boolean: ``True`` takes part
        in attention. Floating (16 bits or more): added to the logits (``-inf``
        masks); the whole logit, mask included, is multiplied by
        :math:`\beta_i` (the spec).
    is_causal : bool, default False
        Mask keys ``j > i`` (top-left aligned); not together with `attn_mask`.
        SDPA's fifth argument is ``dropout_p``, which this function does not
        take (no dropout): pass `is_causal` by keyword when porting a call.
    scale : float, optional
        Logit scale, default :math:`1/\sqrt{D}`.
    enable_gqa : bool, default False
        Grouped-query attention, as in ``scaled_dot_product_attention``:
        ``q.shape[-3]`` query heads share ``k.shape[-3]`` key and value heads
        (a divisor), query head :math:`h` reading key head
        :math:`\lfloor h / g \rfloor` with :math:`g` query heads per key head.
        Pass 1 of the hybrid path reads the key heads as they are; the other
        paths repeat each key and value head :math:`g` times. ``v.shape[-3]``
        may differ from ``k.shape[-3]`` (another divisor of the query heads), as
        SDPA allows: both are then repeated up to the query heads.
    schedule : Schedule, optional
        Temperature schedule (default :class:`~softmaxtheory.spec.PaperPolynomial`).
    entropy_eps : float, default 0.0
        Entropy mode (see :func:`adaptive_softmax`).
    detach_beta : bool, default False
        Stop the gradient through β.
    backend : {"auto", "hybrid", "composition", "triton", "chunked"}, default "auto"
        ``"hybrid"``: pass 1 (each query's entropy, from :math:`QK^\top`
        alone: the Triton kernel of :func:`attention_entropy` on CUDA, its
        torch version elsewhere; each with its own backward when a gradient
        reaches β), then pass 2 through ``scaled_dot_product_attention``
        itself on the β-scaled queries (with a β-scaled bias for an additive mask with
        finite non-zero entries), so pass 2 runs on whatever fused kernel SDPA
        picks. ``"composition"``: T10 on the fused kernel with log-sum-exp
        (CPU: ``_scaled_dot_product_flash_attention_for_cpu``; CUDA: cuDNN,
        flash or memory-efficient attention). ``"triton"``: both passes as
        Triton kernels (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``;
        forward only). ``"chunked"``: blocks of queries against all keys
        (causal: those up to the block's last query), memory
        :math:`O(\mathrm{block}\cdot S)`. ``"auto"`` takes the hybrid where the
        Triton pass 1 runs (CUDA, float16/bfloat16/float32), with or
        without a gradient through β (with ``detach_beta=True`` the backward
        is SDPA's alone), else the composition, and the chunked path for
        ``entropy_eps > 0``, additive masks with finite non-zero entries off
        the hybrid, or when no fused kernel accepts the inputs. Logits whose size could overflow the
        statistics dtype (or β times them) take an overflow-safe chunked path
        (float64 tiles, power-of-two units) on every backend; a Triton
        configuration that does not fit the device's shared memory falls
        back to a smaller one, then to the composition. Under a
        ``torch.func`` transform (``vmap``, ``grad``, ``jvp``, ...) or
        forward-mode AD, ``"auto"`` takes the chunked path. Second
        derivatives (``create_graph=True``): every backend's own parts are
        recorded; pass 2's is SDPA's, which torch lacks for some kernels,
        so ``"chunked"`` is the backend that always has one.

    Returns
    -------
    torch.Tensor, shape (..., L, Dv)
        Outputs in the input dtype (under ``torch.autocast``, floating operands
        other than float64 are cast to its dtype first, as SDPA casts them). A
        query with every key masked gives zeros; a NaN or infinite query,
        unmasked key or mask entry (NaN / ``+inf``) gives a NaN row. Finite
        inputs never give NaN, however large: values whose sum over the keys
        could overflow the fused kernels' unnormalised accumulator
        (:math:`S \max|v|` near the float maximum) are scaled by a power of two
        before them and the output back after; operands whose products could
        overflow or underflow in some order of the scale (raw products
        :math:`q_i \cdot k_j` beyond the float range, a subnormal scale) take
        the float64 path. Zero-size inputs give zero-size outputs; ``S = 0`` (no
        keys) gives zeros.

    Raises
    ------
    TypeError
        For non-tensors, mixed or unsupported dtypes (``backend="triton"``
        with float64 included), or a bad `scale` or `enable_gqa`.
    ValueError
        For mismatched shapes or heads, a mask together with `is_causal`, a mask
        that requires grad, or a `backend` that cannot run these inputs (an
        unknown name, ``"triton"`` with no Triton for the device, or with
        gradients).

    Examples
    --------
    >>> import torch
    >>> from softmaxtheory.accelerated.torch import adaptive_attention
    >>> q = torch.tensor([[1.0, 0.0]]); k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> v = torch.tensor([[1.0], [-1.0]])
    >>> adaptive_attention(q, k, v, scale=0.0)
    tensor([[0.]])
    """
    _attn.refuse_tracing("adaptive_attention")
    low = autocast_dtype(q)
    if low is not None:  # as SDPA under autocast: floating operands in `low`, float64 as is
        with torch.autocast(q.device.type, enabled=False):
            return adaptive_attention(
                *_autocast_operands((q, k, v, attn_mask), low), is_causal, scale, enable_gqa,
                schedule=schedule, entropy_eps=entropy_eps, detach_beta=detach_beta,
                backend=backend,
            )  # fmt: skip
    schedule = resolve_schedule(schedule)
    eps = check_entropy_eps(entropy_eps)
    detach_beta = as_flag(detach_beta, "detach_beta")
    if backend not in _attn.BACKENDS:
        raise ValueError(f"backend must be one of {_attn.BACKENDS}, got {backend!r}")
    if v is None:  # (prepare takes None for attention_entropy, which has no values)
        raise TypeError("v must be a torch.Tensor, got NoneType")
    early = _attn.pass1_early(q, k, v, schedule, eps, detach_beta, backend)
    prepared = _attn.prepare(
        q, k, v, attn_mask, is_causal, scale, enable_gqa=enable_gqa, early=early
    )
    out = _attn.attention(prepared, schedule, eps, detach_beta, backend)
    return out.reshape(*prepared.lead, *out.shape[-2:])


def attention_entropy(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Each query's attention entropy and log-sum-exp (pass 1 of adaptive attention).

    For the logits :math:`x_{ij} = \mathrm{scale}\; q_i \cdot k_j
    (+\ \mathrm{mask}_{ij})` over the unmasked keys,

    .. math::

        \mathrm{LSE}_i = \log \sum_j e^{x_{ij}}, \qquad
        H_i = -\sum_j p_{ij} \log p_{ij}, \quad p_{ij} = e^{x_{ij} - \mathrm{LSE}_i},

    computed from the running state :math:`(m, s, t)` of theorem T7 with
    :math:`H = \log s - t/s` and :math:`\mathrm{LSE} = m + \log s`. No
    values are read: the cost is the :math:`QK^\top` product alone, and the
    memory :math:`O(B H L)` (no :math:`L \times S` matrix on the Triton path).

    Parameters
    ----------
    q : torch.Tensor, shape (..., H, L, D)
        Queries.
    k : torch.Tensor, shape (..., S, D)
        Keys; leading dimensions broadcast with those of `q` (with
        `enable_gqa`, ``k.shape[-3]`` is the number of key heads ``H_kv``).
    attn_mask : torch.Tensor, optional
        Broadcastable to ``(..., H, L, S)``; boolean (``True`` takes part) or
        additive (``-inf`` masks), as in ``scaled_dot_product_attention``.
    is_causal : bool, default False
        Mask keys ``j > i`` (top-left aligned); not together with `attn_mask`.
    scale : float, optional
        Logit scale, default :math:`1/\sqrt{D}`.
    enable_gqa : bool, default False
        Grouped-query attention: ``H`` a multiple of ``H_kv``; query head
        ``h`` reads key head ``h // (H / H_kv)`` (no copy of `k`).

    Returns
    -------
    entropy, lse : torch.Tensor, shape (..., H, L)
        float32 (float64 for float64 inputs), differentiable with respect to
        `q` and `k`, twice too (``create_graph=True``), and under the
        ``torch.func`` transforms and forward-mode AD. A query with every key
        masked (or ``S = 0``) has entropy 0 and log-sum-exp ``-inf``; a NaN or
        infinite query, unmasked key or mask entry gives NaN. Entropies are clamped to
        :math:`[0, \log n_\mathrm{eff}]`.

    Notes
    -----
    On CUDA (float16, bfloat16, float32; and on CPU under
    ``TRITON_INTERPRET=1``) a Triton kernel streams the key blocks per query
    block; a causal query block stops at its last visible key block.
    Elsewhere a torch implementation runs blocks of queries against all
    keys. Either has its own backward, which keeps only ``(H, LSE)`` and
    recomputes :math:`p_{ij} = e^{x_{ij} - \mathrm{LSE}_i}` tile by tile:

    .. math::

        \frac{\partial H_i}{\partial x_{ij}} = -p_{ij}(\log p_{ij} + H_i),
        \qquad
        \frac{\partial\,\mathrm{LSE}_i}{\partial x_{ij}} = p_{ij}

    (two Triton kernels on CUDA, for the query and the key gradients; with
    `enable_gqa` a key's gradient sums over the query heads of its group).
    Finite logits whose spread overflows the float maximum give the
    reference's numbers, not NaN (such inputs differentiate through an
    overflow-safe torch path).

    Raises
    ------
    TypeError
        For non-tensors, sparse tensors, mixed or unsupported dtypes, or a bad
        `scale`, `is_causal` or `enable_gqa`.
    ValueError
        For mismatched shapes or heads, or a mask together with `is_causal`.

    Examples
    --------
    >>> import torch
    >>> from softmaxtheory.accelerated.torch import attention_entropy
    >>> q = torch.zeros(1, 2); k = torch.zeros(4, 2)
    >>> h, lse = attention_entropy(q, k)
    >>> torch.allclose(h, torch.log(torch.tensor([4.0]))), torch.allclose(lse, h)
    (True, True)
    """
    _attn.refuse_tracing("attention_entropy")
    low = autocast_dtype(q)
    if low is not None:  # as adaptive_attention under autocast
        with torch.autocast(q.device.type, enabled=False):
            return attention_entropy(
                *_autocast_operands((q, k, attn_mask), low), is_causal, scale, enable_gqa
            )
    early = _attn.pass1_early(q, k, None, None)
    prepared = _attn.prepare(
        q, k, None, attn_mask, is_causal, scale, enable_gqa=enable_gqa, early=early
    )
    h, lse = _attn.attention_entropy(prepared)
    shape = (*prepared.lead, prepared.q.shape[-2])
    return h.reshape(shape), lse.reshape(shape)


def _autocast_operands(tensors: tuple, low: torch.dtype) -> list:
    """`tensors` cast to `low` as autocast casts SDPA's operands: every floating one but float64.

    (A bfloat16 key under float16 autocast is cast too: SDPA then runs in float16, where
    casting float32 alone left mixed dtypes and a TypeError.)
    """
    return [
        t.to(low)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
        else t
        for t in tensors
    ]
