"""Torch views of the same values in other memory layouts (for the attention tests)."""

from __future__ import annotations

from typing import Any

__all__ = ["LAYOUTS", "view"]

#: The layouts :func:`view` makes.
LAYOUTS = ("contiguous", "transposed", "stepped", "broadcast")


def view(t: Any, layout: str) -> Any:
    """The values of the tensor `t` in `layout`.

    ``transposed``: the last axis has stride n (the last two swapped in memory);
    ``stepped``: stride 2 (every other entry of a wider buffer); ``broadcast``: row 0
    repeated along the sequence (stride 0), so the values are row 0's; ``contiguous``:
    `t` itself.
    """
    if layout == "transposed":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "stepped":
        wide = t.new_zeros(*t.shape[:-1], 2 * t.shape[-1])
        wide[..., ::2] = t
        return wide[..., ::2]
    if layout == "broadcast":
        return t[..., :1, :].expand(t.shape)
    if layout == "contiguous":
        return t
    raise ValueError(f"unknown layout {layout!r}")
