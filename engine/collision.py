"""Differentiable collision checker for capsule rods (paper Section III-D).

Everything is closed-form torch on batched tensors, so contact points, normals and
depths carry gradients with respect to the rod states; nothing geometric is detached.
The only non-smooth operations are the clamps of the closest-point parameters to the
segments, whose sub-gradients are the correct one-sided derivatives.

Capsule-plane: a capsule is a sphere swept along its axis segment, so its deepest
points against a plane are the two segment ends (two contact points per rod; a rod lying
flat gets a line contact represented by both).  Capsule-capsule: closest points of the
two axis segments, depth = r_a + r_b - distance.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

# Keeps norms differentiable when two segments touch axis-to-axis.
_NORM_EPS = 1e-12


class GroundContacts(NamedTuple):
    point: torch.Tensor   # [..., R, 2, 3] deepest point of each end sphere (on the capsule surface)
    depth: torch.Tensor   # [..., R, 2] penetration (> 0 means in contact)


class RodContacts(NamedTuple):
    point_a: torch.Tensor  # [..., P, 3] surface point on rod a
    point_b: torch.Tensor  # [..., P, 3] surface point on rod b
    normal: torch.Tensor   # [..., P, 3] unit normal pointing from b to a
    depth: torch.Tensor    # [..., P] penetration (> 0 means in contact)


def ground_contacts(nodes: torch.Tensor, radius: torch.Tensor, ground_height: float) -> GroundContacts:
    """Contacts of capsules (end nodes [..., R, 2, 3], radius [R]) with the plane z = h."""
    radius = radius[:, None]
    depth = radius - (nodes[..., 2] - ground_height)
    point = torch.cat([nodes[..., :2], (nodes[..., 2] - radius).unsqueeze(-1)], dim=-1)
    return GroundContacts(point, depth)


def segment_closest_points(a0, a1, b0, b1, eps: float = 1e-9):
    """Closest points between segments [a0, a1] and [b0, b1] (all [..., 3]).

    Returns (s, t, pa, pb) with pa = a0 + s (a1 - a0), s, t in [0, 1].  Follows the
    classic clamped solution (Ericson, Real-Time Collision Detection, 5.1.9); the
    parallel case falls back to s = 0, which is a valid closest pair.
    """
    d1, d2, r = a1 - a0, b1 - b0, a0 - b0
    a = (d1 * d1).sum(-1)
    e = (d2 * d2).sum(-1)
    f = (d2 * r).sum(-1)
    c = (d1 * r).sum(-1)
    b = (d1 * d2).sum(-1)
    denom = a * e - b * b
    parallel = denom <= eps * a * e
    s = torch.where(parallel, torch.zeros_like(denom),
                    ((b * f - c * e) / torch.where(parallel, torch.ones_like(denom), denom)))
    s = s.clamp(0.0, 1.0)
    t = (b * s + f) / e
    # If t leaves [0, 1], clamp it and recompute s for the clamped t.
    t_clamped = t.clamp(0.0, 1.0)
    s = torch.where(t != t_clamped, ((b * t_clamped - c) / a).clamp(0.0, 1.0), s)
    t = t_clamped
    pa = a0 + s.unsqueeze(-1) * d1
    pb = b0 + t.unsqueeze(-1) * d2
    return s, t, pa, pb


def rod_rod_contacts(nodes: torch.Tensor, radius: torch.Tensor, pairs: torch.Tensor) -> RodContacts:
    """Capsule-capsule contacts for rod pairs [P, 2] (long) from end nodes [..., R, 2, 3]."""
    ia, ib = pairs[:, 0], pairs[:, 1]
    na, nb = nodes[..., ia, :, :], nodes[..., ib, :, :]
    _, _, pa, pb = segment_closest_points(na[..., 0, :], na[..., 1, :], nb[..., 0, :], nb[..., 1, :])
    diff = pa - pb
    dist = torch.sqrt((diff * diff).sum(-1) + _NORM_EPS)
    normal = diff / dist.unsqueeze(-1)
    ra, rb = radius[ia], radius[ib]
    depth = ra + rb - dist
    return RodContacts(pa - ra.unsqueeze(-1) * normal, pb + rb.unsqueeze(-1) * normal, normal, depth)


def all_pairs(num_rods: int) -> torch.Tensor:
    return torch.combinations(torch.arange(num_rods), r=2)
