r"""The single-head max-retrieval model, many seeds at once (private; needs torch).

Every parameter has a leading *seed* dimension :math:`S`: the :math:`S` models
are trained together as one batched model (``torch.baddbmm`` / ``einsum``),
each with its own initial weights, its own data stream and its own AdamW state.
AdamW acts element by element, and the loss is the sum of the per-seed losses,
so seed :math:`s` follows exactly the trajectory it would follow alone (up to
the floating-point order of the matrix products).

Architecture (width :math:`d = 128` by default), for one seed:

.. math::

    h_j &= \phi\bigl([p_j, \operatorname{onehot}(c_j)]\bigr), \qquad
    k_j = W_K h_j + b_K, \quad v_j = W_V h_j + b_V, \\
    u &= \psi(q), \qquad
    x_j = \frac{u \cdot k_j}{\sqrt d}, \qquad
    \alpha = \operatorname{softmax}(x), \qquad
    y = \rho\Bigl(\sum_j \alpha_j v_j\Bigr) \in \mathbb{R}^{10},

with :math:`\phi` an MLP :math:`11 \to d \to d \to d` (ReLU after every
layer), :math:`\psi` an MLP :math:`1 \to d \to d \to d` (ReLU between layers)
and :math:`\rho` an MLP :math:`d \to d \to d \to 10` (ReLU between layers).
At evaluation :math:`\alpha` is either the softmax (the baseline) or the
adaptive softmax :math:`\operatorname{softmax}(\beta(H(x))\,x)` of
:func:`softmaxtheory.accelerated.torch.adaptive_softmax`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from .._seeds import LossWindow, SeedLinear, make_generator
from .data import (
    NUM_CLASSES,
    Sets,
    sample_eval_sets,
    sample_train_sets,
    stack_sets,
)

__all__ = [
    "BoundViolation",
    "MaxRetrievalModel",
    "SizeResult",
    "TrainLog",
    "evaluate_size",
    "train",
]

#: Steps of training data drawn per call of the generator (fewer kernel launches).
DATA_BLOCK = 64


class BoundViolation(AssertionError):
    """A measured attention coefficient exceeded its theoretical bound (a bug)."""


class _SeedMLP(nn.Module):
    """A stack of :class:`SeedLinear` with ReLU between (and optionally after) layers."""

    def __init__(self, seeds: int, sizes: Sequence[int], *, final_relu: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SeedLinear(seeds, a, b) for a, b in itertools.pairwise(sizes))
        self.final_relu = final_relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < last or self.final_relu:
                x = torch.relu(x)
        return x


class MaxRetrievalModel(nn.Module):
    r"""One attention head for max retrieval, for several seeds at once.

    Parameters
    ----------
    seeds : sequence of int
        The seed numbers; parameter slice ``s`` is initialised from the
        ``"init"`` stream of ``seeds[s]`` only.
    width : int, default 128
        Width :math:`d` of every hidden layer, key, query and value.

    Notes
    -----
    Parameters have shape ``(S, fan_in, fan_out)`` and ``(S, 1, fan_out)``
    with ``S = len(seeds)``. Inputs carry the same leading seed dimension.
    """

    def __init__(self, seeds: Sequence[int], width: int = 128) -> None:
        super().__init__()
        self.seeds = tuple(int(s) for s in seeds)
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed")
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.width = width
        s = len(self.seeds)
        feat = 1 + NUM_CLASSES
        self.items = _SeedMLP(s, [feat, width, width, width], final_relu=True)
        self.keys = SeedLinear(s, width, width)
        self.values = SeedLinear(s, width, width)
        self.query = _SeedMLP(s, [1, width, width, width], final_relu=False)
        self.decoder = _SeedMLP(s, [width, width, width, NUM_CLASSES], final_relu=False)
        self.scale = 1.0 / math.sqrt(width)
        for i, seed in enumerate(self.seeds):
            gen = make_generator(seed, "init")
            for module in self.modules():
                if isinstance(module, SeedLinear):
                    module.init_seed(i, gen)

    @property
    def num_seeds(self) -> int:
        """``S``, the number of models trained together."""
        return len(self.seeds)

    def encode_items(self, priority: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """Hidden item features :math:`h_j`, shape ``(S, ..., N, d)``."""
        onehot = F.one_hot(classes, NUM_CLASSES).to(priority.dtype)
        return self.items(torch.cat([priority.unsqueeze(-1), onehot], dim=-1))

    def attention_logits(
        self, query: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        r"""Logits :math:`x_j = u \cdot k_j / \sqrt d` (``-inf`` on padded items), ``(S, ..., N)``.

        Parameters
        ----------
        query : torch.Tensor, shape (S, ...)
            Scalar queries.
        hidden : torch.Tensor, shape (S, ..., N, d)
            Item features from :meth:`encode_items`.
        mask : torch.Tensor or None
            ``True`` for real items.
        """
        u = self.query(query.unsqueeze(-1))
        k = self.keys(hidden)
        logits = torch.einsum("...d,...nd->...n", u, k) * self.scale
        if mask is not None:
            logits = logits.masked_fill(~mask, -torch.inf)
        return logits

    def readout(
        self, weights: torch.Tensor, hidden: torch.Tensor, values: torch.Tensor | None = None
    ) -> torch.Tensor:
        r"""Class logits :math:`\rho(\sum_j \alpha_j v_j)`, shape ``(S, ..., 10)``.

        Parameters
        ----------
        weights : torch.Tensor, shape (S, ..., N)
            Attention coefficients (cast to the values' dtype).
        hidden : torch.Tensor, shape (S, ..., N, d)
            Item features from :meth:`encode_items`.
        values : torch.Tensor, optional
            ``self.values(hidden)``, when already computed.
        """
        v = self.values(hidden) if values is None else values
        return self.decoder(torch.einsum("...n,...nd->...d", weights.to(v.dtype), v))

    def forward(
        self,
        sets: Sets,
        weights_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Class logits ``(S, ..., 10)`` of a batch of sets with a leading seed dimension.

        Parameters
        ----------
        sets : Sets
            Tensors of shape ``(S, ..., N)``.
        weights_fn : callable, optional
            Maps attention logits to coefficients along the last axis
            (default ``torch.softmax(x, -1)``).
        """
        hidden = self.encode_items(sets.priority, sets.classes)
        logits = self.attention_logits(sets.query, hidden, sets.mask)
        weights = torch.softmax(logits, -1) if weights_fn is None else weights_fn(logits)
        return self.readout(weights, hidden)


@dataclass
class TrainLog:
    """What :func:`train` did.

    Attributes
    ----------
    steps : int
        Optimiser steps taken (fewer than asked when the time budget ran out).
    seconds : float
        Wall time of training.
    final_loss : list of float
        Mean cross-entropy of each seed over the last logging window.
    history : list of tuple
        ``(step, [loss per seed])`` at each logging point.
    """

    steps: int = 0
    seconds: float = 0.0
    final_loss: list[float] = field(default_factory=list)
    history: list[tuple[int, list[float]]] = field(default_factory=list)


def train(
    model: MaxRetrievalModel,
    steps: int,
    *,
    batch: int = 128,
    lr: float = 1e-3,
    weight_decay: float = 1e-3,
    max_seconds: float | None = None,
    log_every: int = 250,
    on_step: Callable[[int, list[float] | None], None] | None = None,
) -> TrainLog:
    r"""Train every seed of `model` with AdamW on its own stream of training sets.

    The loss is :math:`\sum_s \mathrm{CE}_s`, the sum over seeds of each seed's
    mean cross-entropy over its batch, so each seed's gradient is its own.

    Parameters
    ----------
    model : MaxRetrievalModel
        The model; it stays on its device.
    steps : int
        Optimiser steps.
    batch : int, default 128
        Sets per step and seed.
    lr, weight_decay : float
        AdamW settings.
    max_seconds : float, optional
        Stop after this much wall time (checked every step; the host clock).
    log_every : int, default 250
        Steps between loss read-outs (each one synchronises with the device).
    on_step : callable, optional
        Called after every step with the step count and, at logging points,
        the per-seed losses (else ``None``).

    Returns
    -------
    TrainLog
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    device = next(model.parameters()).device
    gens = [make_generator(seed, "train", device=device) for seed in model.seeds]
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=lr,
        weight_decay=weight_decay,
        fused=True,
    )
    model.train()
    log = TrainLog()
    s = model.num_seeds
    window = LossWindow(s, device)
    start = time.perf_counter()
    block: Sets | None = None
    for step in range(steps):
        t = step % DATA_BLOCK
        if t == 0:
            block = stack_sets([sample_train_sets(batch, g, steps=DATA_BLOCK) for g in gens])
        assert block is not None
        sets = Sets(
            block.priority[:, t],
            block.classes[:, t],
            None if block.mask is None else block.mask[:, t],
            block.query[:, t],
            block.target[:, t],
        )
        logits = model(sets)
        per = F.cross_entropy(
            logits.reshape(-1, NUM_CLASSES), sets.target.reshape(-1), reduction="none"
        )
        per_seed = per.view(s, -1).mean(dim=1)
        loss = per_seed.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        window.add(per_seed)
        log.steps = step + 1
        losses = None
        if (step + 1) % log_every == 0 or step + 1 == steps:
            losses = window.flush(log, step + 1)
        if on_step is not None:
            on_step(step + 1, losses)
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            if window.steps:
                window.flush(log, step + 1)
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    log.seconds = time.perf_counter() - start
    model.eval()
    return log


@dataclass
class SizeResult:
    r"""Per-seed measurements at one evaluation size.

    Every array has one entry per seed.

    Attributes
    ----------
    n : int
        Items per set.
    sets : int
        Evaluation sets per seed.
    baseline_acc, adaptive_acc : numpy.ndarray
        Accuracy (fraction) with softmax and with the adaptive softmax, on the
        same sets.
    baseline_coef_mean, baseline_coef_max : numpy.ndarray
        Mean and largest softmax coefficient on the item of largest priority.
    adaptive_coef_mean, adaptive_coef_max : numpy.ndarray
        The same for the adaptive coefficients.
    spread_max, spread_mean : numpy.ndarray
        Largest and mean row spread :math:`\max_j x_j - \min_j x_j` of the
        head's logits (:func:`softmaxtheory.bounds.empirical_spread`).
    entropy_mean, beta_mean : numpy.ndarray
        Mean softmax entropy (nats) of the rows and mean β the schedule gives.
    bound : numpy.ndarray
        T1 bound :func:`~softmaxtheory.bounds.max_coefficient` at ``spread_max``.
    adaptive_bound : numpy.ndarray
        :func:`~softmaxtheory.bounds.adaptive_max_coefficient` at ``spread_max``.
    """

    n: int
    sets: int
    baseline_acc: np.ndarray
    adaptive_acc: np.ndarray
    baseline_coef_mean: np.ndarray
    baseline_coef_max: np.ndarray
    adaptive_coef_mean: np.ndarray
    adaptive_coef_max: np.ndarray
    spread_max: np.ndarray
    spread_mean: np.ndarray
    entropy_mean: np.ndarray
    beta_mean: np.ndarray
    bound: np.ndarray
    adaptive_bound: np.ndarray

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: arrays as lists of floats."""
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            out[key] = value.tolist() if isinstance(value, np.ndarray) else value
        return out


def _rounding_slack(n: int) -> float:
    r"""Relative rounding error allowed on a float64 softmax coefficient of `n` items.

    The largest coefficient is :math:`1/\sum_j e^{z_j}` with :math:`z_j \le 0`;
    :math:`n` exps (each within one unit roundoff :math:`u`), :math:`n - 1`
    additions and one division stay within :math:`(2n + 2)u` for
    :math:`nu \ll 1`; we allow :math:`(2n + 8)u`.
    """
    return (2 * n + 8) * 2.0**-53


@torch.no_grad()
def evaluate_size(
    model: MaxRetrievalModel,
    n: int,
    sets: int,
    *,
    schedule: Any = None,
    chunk_items: int = 1 << 16,
) -> SizeResult:
    r"""Evaluate every seed on `sets` sets of `n` items, with softmax and adaptive softmax.

    Seed ``s`` draws its sets from its own ``("eval", n)`` stream; both
    attentions see the very same sets and logits. The coefficients are
    computed in float64 from the float32 logits (softmax with
    :func:`torch.softmax`, the adaptive one with
    :func:`softmaxtheory.accelerated.torch.adaptive_softmax`), then used in
    float32 for the read-out.

    Checks theorem T1 on every seed: the largest coefficient on the max item
    never exceeds :math:`1/(1 + (n-1)e^{-\delta})` at the largest row spread
    :math:`\delta` measured for that seed (and T6's adaptive bound for the
    adaptive coefficients), up to the float64 rounding of the softmax.

    Parameters
    ----------
    model : MaxRetrievalModel
        A trained model.
    n : int
        Items per set.
    sets : int
        Sets per seed.
    schedule : softmaxtheory.spec.Schedule, optional
        Temperature schedule of the adaptive softmax (default the paper's).
    chunk_items : int, default 65536
        Items per seed processed at once (bounds the memory:
        about ``S * chunk_items * width * 4`` bytes per activation).

    Returns
    -------
    SizeResult

    Raises
    ------
    BoundViolation
        If a measured coefficient exceeds its bound.
    """
    from softmaxtheory import bounds
    from softmaxtheory.accelerated.torch import adaptive_softmax
    from softmaxtheory.spec import resolve_schedule

    schedule = resolve_schedule(schedule)
    model.eval()
    device = next(model.parameters()).device
    s = model.num_seeds
    data = stack_sets(
        [
            sample_eval_sets(n, sets, make_generator(seed, "eval", n, device=device))
            for seed in model.seeds
        ]
    )
    per_chunk = max(1, chunk_items // n)
    acc = {
        key: np.zeros(s)
        for key in ("base_ok", "adapt_ok", "bc_sum", "ac_sum", "sp_sum", "h_sum", "b_sum")
    }
    bc_max = np.zeros(s)
    ac_max = np.zeros(s)
    sp_max = np.zeros(s)
    for lo in range(0, sets, per_chunk):
        hi = min(sets, lo + per_chunk)
        pri = data.priority[:, lo:hi]
        hidden = model.encode_items(pri, data.classes[:, lo:hi])
        logits = model.attention_logits(data.query[:, lo:hi], hidden, None)
        x64 = logits.double()
        w_base = torch.softmax(x64, dim=-1)
        w_adapt = adaptive_softmax(x64, -1, schedule=schedule)
        target = data.target[:, lo:hi]
        values = model.values(hidden)
        pred_base = model.readout(w_base, hidden, values).argmax(-1)
        pred_adapt = model.readout(w_adapt, hidden, values).argmax(-1)
        top = pri.argmax(dim=-1, keepdim=True)
        c_base = w_base.gather(-1, top).squeeze(-1)
        c_adapt = w_adapt.gather(-1, top).squeeze(-1)
        entropy = -torch.special.xlogy(w_base, w_base).sum(-1)
        acc["base_ok"] += (pred_base == target).sum(-1).cpu().numpy()
        acc["adapt_ok"] += (pred_adapt == target).sum(-1).cpu().numpy()
        cb = c_base.cpu().numpy()
        ca = c_adapt.cpu().numpy()
        acc["bc_sum"] += cb.sum(-1)
        acc["ac_sum"] += ca.sum(-1)
        bc_max = np.maximum(bc_max, cb.max(-1))
        ac_max = np.maximum(ac_max, ca.max(-1))
        spreads = np.asarray(bounds.empirical_spread(logits), dtype=np.float64)
        acc["sp_sum"] += spreads.sum(-1)
        sp_max = np.maximum(sp_max, spreads.max(-1))
        h = entropy.cpu().numpy()
        acc["h_sum"] += h.sum(-1)
        acc["b_sum"] += schedule.beta_float(h, n).sum(-1)
    bound = np.asarray(bounds.max_coefficient(n, sp_max), dtype=np.float64)
    adaptive_bound = np.asarray(
        bounds.adaptive_max_coefficient(n, sp_max, schedule=schedule)
        if _has_adaptive_bound(schedule)
        else np.full(s, np.nan)
    )
    slack = 1.0 + _rounding_slack(n)
    for i in range(s):
        if not bc_max[i] <= bound[i] * slack:
            raise BoundViolation(
                f"T1 violated at n={n}, seed {model.seeds[i]}: coefficient {bc_max[i]!r} > "
                f"bound {bound[i]!r} for spread {sp_max[i]!r}"
            )
        if not np.isnan(adaptive_bound[i]) and not ac_max[i] <= adaptive_bound[i] * slack:
            raise BoundViolation(
                f"T6 violated at n={n}, seed {model.seeds[i]}: adaptive coefficient "
                f"{ac_max[i]!r} > bound {adaptive_bound[i]!r} for spread {sp_max[i]!r}"
            )
    return SizeResult(
        n=n,
        sets=sets,
        baseline_acc=acc["base_ok"] / sets,
        adaptive_acc=acc["adapt_ok"] / sets,
        baseline_coef_mean=acc["bc_sum"] / sets,
        baseline_coef_max=bc_max,
        adaptive_coef_mean=acc["ac_sum"] / sets,
        adaptive_coef_max=ac_max,
        spread_max=sp_max,
        spread_mean=acc["sp_sum"] / sets,
        entropy_mean=acc["h_sum"] / sets,
        beta_mean=acc["b_sum"] / sets,
        bound=bound,
        adaptive_bound=adaptive_bound,
    )


def _has_adaptive_bound(schedule: Any) -> bool:
    from softmaxtheory.spec import Constant, Polynomial

    return isinstance(schedule, Polynomial | Constant)
