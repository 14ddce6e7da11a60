r"""Data of the max-retrieval task (private; needs torch).

A *set* holds :math:`n` items; item :math:`j` has a priority
:math:`p_j \sim U(0, 1)` and a class :math:`c_j \sim U\{0, \dots, 9\}`; the set
comes with a scalar query :math:`q \sim U(0, 1)`. The target is the class of
the item of largest priority,

.. math::

    y = c_{j^\ast}, \qquad j^\ast = \operatorname{arg\,max}_j p_j .

The query carries no information about the answer (as in the paper); the head
has to learn to put its attention on the item of largest priority.

Training sets have :math:`n \sim U\{5, \dots, 16\}` items, drawn per set and
padded to 16 with a mask; evaluation sets have a fixed :math:`n`. Every seed
owns its own :class:`torch.Generator` streams (one for training data, one for
evaluation data, one for the initial weights), derived from the seed number
alone, so a run of seeds ``0..S-1`` and a run of seed ``s`` alone draw the same
numbers for seed ``s``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._seeds import derive_seed, make_generator

__all__ = [
    "NUM_CLASSES",
    "TRAIN_MAX_ITEMS",
    "TRAIN_MIN_ITEMS",
    "Sets",
    "derive_seed",
    "make_generator",
    "sample_eval_sets",
    "sample_train_sets",
    "stack_sets",
]

#: Number of item classes (the model predicts one of them).
NUM_CLASSES = 10

#: Smallest training set size.
TRAIN_MIN_ITEMS = 5

#: Largest training set size (training sets are padded to it).
TRAIN_MAX_ITEMS = 16


@dataclass(frozen=True)
class Sets:
    """A batch of sets, one or more leading batch dimensions ``(..., B)``.

    Attributes
    ----------
    priority : torch.Tensor, shape (..., B, N), float32
        Item priorities in :math:`[0, 1)`; padded items hold ``-1``.
    classes : torch.Tensor, shape (..., B, N), int64
        Item classes in ``0..9``; padded items hold 0.
    mask : torch.Tensor or None, shape (..., B, N), bool
        ``True`` for real items; ``None`` when every set is full.
    query : torch.Tensor, shape (..., B), float32
        The scalar queries.
    target : torch.Tensor, shape (..., B), int64
        Class of the item of largest priority.
    """

    priority: torch.Tensor
    classes: torch.Tensor
    mask: torch.Tensor | None
    query: torch.Tensor
    target: torch.Tensor

    @property
    def num_items(self) -> int:
        """The (padded) number of items per set, ``N``."""
        return int(self.priority.shape[-1])


def _targets(priority: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    idx = priority.argmax(dim=-1, keepdim=True)
    return classes.gather(-1, idx).squeeze(-1)


def sample_eval_sets(n: int, batch: int, generator: torch.Generator) -> Sets:
    r"""Draw `batch` full sets of `n` items each.

    Parameters
    ----------
    n : int
        Items per set, ``>= 1``.
    batch : int
        Number of sets, ``>= 1``.
    generator : torch.Generator
        The stream to draw from; the tensors live on its device.

    Returns
    -------
    Sets
        Shapes ``(batch, n)`` and ``(batch,)``; ``mask`` is ``None``.

    Raises
    ------
    ValueError
        If `n` or `batch` is below 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    dev = generator.device
    priority = torch.rand((batch, n), generator=generator, device=dev)
    classes = torch.randint(0, NUM_CLASSES, (batch, n), generator=generator, device=dev)
    query = torch.rand((batch,), generator=generator, device=dev)
    return Sets(priority, classes, None, query, _targets(priority, classes))


def sample_train_sets(
    batch: int,
    generator: torch.Generator,
    *,
    steps: int = 1,
    min_items: int = TRAIN_MIN_ITEMS,
    max_items: int = TRAIN_MAX_ITEMS,
) -> Sets:
    r"""Draw training sets of :math:`n \sim U\{\text{min\_items}, \dots, \text{max\_items}\}` items.

    Each set draws its own size; sets are padded to `max_items` (padded
    priorities are ``-1`` so they never win the arg max, and the mask marks
    them out of the attention).

    Parameters
    ----------
    batch : int
        Sets per step.
    generator : torch.Generator
        The stream to draw from; the tensors live on its device.
    steps : int, default 1
        Number of steps drawn at once (a leading dimension); drawing many
        steps in one call saves kernel launches on a GPU.
    min_items, max_items : int
        The range of set sizes (inclusive).

    Returns
    -------
    Sets
        Shapes ``(steps, batch, max_items)`` and ``(steps, batch)``.

    Raises
    ------
    ValueError
        For sizes below 1 or ``min_items > max_items``.
    """
    if batch < 1 or steps < 1:
        raise ValueError(f"batch and steps must be >= 1, got {batch} and {steps}")
    if not 1 <= min_items <= max_items:
        raise ValueError(f"need 1 <= min_items <= max_items, got {min_items} and {max_items}")
    dev = generator.device
    shape = (steps, batch, max_items)
    sizes = torch.randint(min_items, max_items + 1, shape[:2], generator=generator, device=dev)
    priority = torch.rand(shape, generator=generator, device=dev)
    classes = torch.randint(0, NUM_CLASSES, shape, generator=generator, device=dev)
    query = torch.rand(shape[:2], generator=generator, device=dev)
    mask = torch.arange(max_items, device=dev) < sizes.unsqueeze(-1)
    priority = torch.where(mask, priority, torch.full_like(priority, -1.0))
    classes = torch.where(mask, classes, torch.zeros_like(classes))
    return Sets(priority, classes, mask, query, _targets(priority, classes))


def stack_sets(parts: list[Sets]) -> Sets:
    """Stack sets of equal shapes along a new leading (seed) dimension."""
    if not parts:
        raise ValueError("parts must hold at least one Sets")
    masks = [p.mask for p in parts]
    if any(m is None for m in masks) and not all(m is None for m in masks):
        raise ValueError("either every part has a mask or none has")
    return Sets(
        torch.stack([p.priority for p in parts]),
        torch.stack([p.classes for p in parts]),
        None if masks[0] is None else torch.stack(masks),  # type: ignore[misc]
        torch.stack([p.query for p in parts]),
        torch.stack([p.target for p in parts]),
    )
