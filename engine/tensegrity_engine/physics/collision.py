"""Differentiable collision checker for capsule rods (paper Section III-D).

Everything is closed-form torch on batched tensors, so contact points, normals and
depths carry gradients with respect to the rod states; nothing geometric is detached.
The only non-smooth operations are the clamps of the closest-point parameters to the
segments, whose sub-gradients are the correct one-sided derivatives.

Capsule-plane: a capsule is a sphere swept along its axis segment, so its deepest
points against a plane are the two segment ends (two contact points per rod; a rod lying
flat gets a line contact represented by both).  Capsule-capsule: closest points of the
two axis segments, depth = r_a + r_b - distance.

Vectors may be laid out with their 3 components on any axis ``dim`` (the engine's hot path
uses components-first ``[..., 3, n]``, where small matmuls and elementwise ops are fast).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from tensegrity_engine.physics.state import end_nodes

# Keeps norms differentiable when two segments touch axis-to-axis.
_NORM_EPS = 1e-12


def dot(a: torch.Tensor, b: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Dot product over a size-3 axis, as explicit adds (torch's reductions over a
    3-long axis are an order of magnitude slower than two adds)."""
    prod = a * b
    return prod.select(dim, 0) + prod.select(dim, 1) + prod.select(dim, 2)


def cross(a: torch.Tensor, b: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if dim == -1:
        return torch.linalg.cross(a, b, dim=-1)
    a0, a1, a2 = a.select(dim, 0), a.select(dim, 1), a.select(dim, 2)
    b0, b1, b2 = b.select(dim, 0), b.select(dim, 1), b.select(dim, 2)
    return torch.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], dim)


class GroundContacts(NamedTuple):
    point: torch.Tensor   # [..., R, 2, 3] deepest point of each end sphere (on the capsule surface)
    depth: torch.Tensor   # [..., R, 2] penetration (> 0 means in contact)


class RodContacts(NamedTuple):
    point_a: torch.Tensor  # surface point on rod a
    point_b: torch.Tensor  # surface point on rod b
    normal: torch.Tensor   # unit normal pointing from b to a
    depth: torch.Tensor    # [..., P] penetration (> 0 means in contact)


def ground_contacts(nodes: torch.Tensor, radius: torch.Tensor, ground_height: float) -> GroundContacts:
    """Contacts of capsules (end nodes [..., R, 2, 3], radius [R]) with the plane z = h."""
    radius = radius[:, None]
    depth = radius - (nodes[..., 2] - ground_height)
    point = torch.cat([nodes[..., :2], (nodes[..., 2] - radius).unsqueeze(-1)], dim=-1)
    return GroundContacts(point, depth)


def segment_closest_points(a0, a1, b0, b1, dim: int = -1, eps: float = 1e-9):
    """Closest points between segments [a0, a1] and [b0, b1] (components on ``dim``).

    Returns (s, t, pa, pb) with pa = a0 + s (a1 - a0), s, t in [0, 1].  Follows the
    classic clamped solution (Ericson, Real-Time Collision Detection, 5.1.9); the
    parallel case falls back to s = 0, which is a valid closest pair.
    """
    d1, d2, r = a1 - a0, b1 - b0, a0 - b0
    a = dot(d1, d1, dim)
    e = dot(d2, d2, dim)
    f = dot(d2, r, dim)
    c = dot(d1, r, dim)
    b = dot(d1, d2, dim)
    denom = a * e - b * b
    parallel = denom <= eps * a * e
    s = torch.where(parallel, torch.zeros_like(denom),
                    (b * f - c * e) / torch.where(parallel, torch.ones_like(denom), denom))
    s = s.clamp(0.0, 1.0)
    t = (b * s + f) / e
    # If t leaves [0, 1], clamp it and recompute s for the clamped t.
    t_clamped = t.clamp(0.0, 1.0)
    s = torch.where(t != t_clamped, ((b * t_clamped - c) / a).clamp(0.0, 1.0), s)
    t = t_clamped
    pa = a0 + s.unsqueeze(dim) * d1
    pb = b0 + t.unsqueeze(dim) * d2
    return s, t, pa, pb


def capsule_contacts(a0, a1, b0, b1, radius_a, radius_b, dim: int = -1) -> RodContacts:
    """Capsule-capsule contacts between axis segments [a0, a1] and [b0, b1]."""
    _, _, pa, pb = segment_closest_points(a0, a1, b0, b1, dim)
    diff = pa - pb
    dist = torch.sqrt(dot(diff, diff, dim) + _NORM_EPS)
    normal = diff / dist.unsqueeze(dim)
    depth = radius_a + radius_b - dist
    return RodContacts(pa - radius_a.unsqueeze(dim) * normal, pb + radius_b.unsqueeze(dim) * normal,
                       normal, depth)


def rod_rod_contacts(nodes: torch.Tensor, radius: torch.Tensor, ia: torch.Tensor,
                     ib: torch.Tensor) -> RodContacts:
    """Capsule-capsule contacts of rod pairs (ia[p], ib[p]) from end nodes [..., R, 2, 3]."""
    na, nb = nodes.index_select(-3, ia), nodes.index_select(-3, ib)
    return capsule_contacts(na[..., 0, :], na[..., 1, :], nb[..., 0, :], nb[..., 1, :],
                            radius.index_select(0, ia), radius.index_select(0, ib))


def all_pairs(num_rods: int) -> torch.Tensor:
    return torch.combinations(torch.arange(num_rods), r=2)


def rods_overlapping(robot, states) -> np.ndarray:
    """[...] whether any two rods' capsules overlap in each of ``states`` [..., R, 13] (numpy
    or torch): where the engine's and MuJoCo's rod-rod contact models part by design, and
    what makes data of a robot "without contact" (held in the air) contact data after all."""
    states = torch.as_tensor(np.asarray(states))
    if robot.num_rods < 2:
        return np.zeros(states.shape[:-2], dtype=bool)
    nodes = end_nodes(states, torch.as_tensor(robot.rod_length, dtype=states.dtype) / 2)
    pairs = all_pairs(robot.num_rods)
    depth = rod_rod_contacts(nodes, torch.as_tensor(robot.rod_radius, dtype=states.dtype), pairs[:, 0],
                             pairs[:, 1]).depth
    return (depth > 0).any(dim=-1).numpy()
