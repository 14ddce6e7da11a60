r"""Many models trained as one: seeded streams, batched layers, per-model losses (private).

Both training experiments train :math:`S` seeds (and, for CLRS-Text, several
copies of each) as one batched model: every parameter has a leading *model*
dimension (:class:`SeedLinear`), each model draws from its own random streams
(:func:`derive_seed`, :func:`make_generator`), the loss is the sum of the
per-model losses, so each model's gradient is its own, and
:class:`LossWindow` reads the per-model losses out. Needs numpy and torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "LossWindow",
    "SeedLinear",
    "derive_seed",
    "make_generator",
]

#: Purposes of the per-seed random streams (the second word of the derived seed).
_PURPOSES = {"init": 0, "train": 1, "eval": 2}


def derive_seed(seed: int, purpose: str, *extra: int) -> int:
    """The seed of one random stream of one model seed.

    Parameters
    ----------
    seed : int
        The model's seed number (``>= 0``).
    purpose : {"init", "train", "eval"}
        Which stream.
    *extra : int
        Further non-negative words (the evaluation size, for the ``"eval"``
        streams: one stream per seed and size).

    Returns
    -------
    int
        A 63-bit seed from :class:`numpy.random.SeedSequence` of
        ``(seed, purpose, *extra)``: independent streams for distinct tuples.

    Raises
    ------
    ValueError
        For a negative `seed` or an unknown `purpose`.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if purpose not in _PURPOSES:
        raise ValueError(f"purpose must be one of {sorted(_PURPOSES)}, got {purpose!r}")
    if any(isinstance(e, bool) or not isinstance(e, int | np.integer) or e < 0 for e in extra):
        raise ValueError(f"extra words must be integers >= 0, got {extra!r}")
    words = [int(seed), _PURPOSES[purpose], *(int(e) for e in extra)]
    state = np.random.SeedSequence(words).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def make_generator(
    seed: int, purpose: str, *extra: int, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A :class:`torch.Generator` on `device` seeded by :func:`derive_seed`."""
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(derive_seed(seed, purpose, *extra))
    return gen


class SeedLinear(nn.Module):
    """``S`` independent affine maps ``x @ W[s] + b[s]``."""

    def __init__(self, seeds: int, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.fan_in = fan_in
        self.weight = nn.Parameter(torch.empty(seeds, fan_in, fan_out))
        self.bias = nn.Parameter(torch.empty(seeds, 1, fan_out))

    def init_seed(self, s: int, generator: torch.Generator) -> None:
        r"""PyTorch's ``nn.Linear`` default: :math:`U(\pm 1/\sqrt{\text{fan\_in}})`."""
        bound = 1.0 / math.sqrt(self.fan_in)
        w = torch.rand(self.weight.shape[1:], generator=generator) * (2 * bound) - bound
        b = torch.rand(self.bias.shape[1:], generator=generator) * (2 * bound) - bound
        with torch.no_grad():
            self.weight[s].copy_(w)
            self.bias[s].copy_(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[1:-1]
        flat = x.reshape(x.shape[0], -1, x.shape[-1])
        out = torch.baddbmm(self.bias, flat, self.weight)
        return out.reshape(x.shape[0], *lead, out.shape[-1])


class LossWindow:
    """The mean loss of each model over the steps since the last read-out.

    Parameters
    ----------
    models : int
        Number of models (the length of every loss vector).
    device : torch.device or str
        Where the running sum lives (read-outs synchronise with it).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> window, log = LossWindow(2, "cpu"), SimpleNamespace(history=[], final_loss=[])
    >>> window.add(torch.tensor([1.0, 3.0]))
    >>> window.add(torch.tensor([3.0, 5.0]))
    >>> window.flush(log, 2)
    [2.0, 4.0]
    >>> log.history, log.final_loss, window.steps
    ([(2, [2.0, 4.0])], [2.0, 4.0], 0)
    """

    def __init__(self, models: int, device: Any) -> None:
        self.running = torch.zeros(models, device=device)
        self.steps = 0

    def add(self, per_model: torch.Tensor) -> None:
        """Add one step's per-model losses (detached from the graph)."""
        self.running += per_model.detach()
        self.steps += 1

    def flush(self, log: Any, step: int) -> list[float]:
        """Read the window's mean losses out into `log` and start a new window.

        Appends ``(step, losses)`` to ``log.history``, sets ``log.final_loss``
        and returns the losses (one per model).
        """
        losses = (self.running / self.steps).tolist()
        log.history.append((step, losses))
        log.final_loss = losses
        self.running.zero_()
        self.steps = 0
        return losses
