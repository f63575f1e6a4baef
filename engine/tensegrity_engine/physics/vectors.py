"""Small vector helpers of the engine's hot path.

The engine keeps vectors components-first, ``[..., 3, n]``: small matmuls and elementwise
ops over the last axis are fast there (see `collision`). ``outer`` works on the last axis.
"""
from __future__ import annotations

import torch

from tensegrity_engine.physics import collision


def cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cross product of components-first vectors [..., 3, n]."""
    return collision.cross(a, b, dim=-2)


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Dot product of components-first vectors [..., 3, n] -> [..., n]."""
    return collision.dot(a, b, dim=-2)


def outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.unsqueeze(-1) * b.unsqueeze(-2)
