"""The variance of a Gauss-Newton estimate, per element, in raw (reparameterised) units.

Shared by the published uncertainty (`identification.uncertainty`) and by the windowed
solver's convergence test (`windows.WindowLevenbergMarquardt`), so the solver stops by the
same sigma the node publishes.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

SINGULAR = 1e-8        # relative eigenvalue below which a direction counts as unconstrained
# The cluster jackknife's variance of each value needs groups, not more groups than values
# (the sandwich's meat does): measured on a regression with one offset per group, 2-sigma
# coverage 92-96 % from 10 groups on, with 5 to 55 values (the plain sigma 29-44 %). A value
# per cable (57 values) on fewer windows than that published the plain sigma before: K's
# 0.5 % for a mean 4.8 % off (kitchen_sink, docs/online_identification.md).
MIN_JACKKNIFE_GROUPS = 10


@dataclasses.dataclass(frozen=True)
class ElementVariance:
    """The normal matrix H scaled to unit diagonal (``Hs``, elements ``alive``: H's diagonal
    above 0, ``scale`` its square root), its eigen-decomposition and inverse with the
    directions below ``floor`` inverted at it, and the variances of the alive elements in
    raw units: s^2 H^-1's (``model``) and the robust one where the groups allow it."""
    scale: torch.Tensor
    alive: torch.Tensor
    Hs: torch.Tensor
    lam: torch.Tensor
    V: torch.Tensor
    floor: float
    inv: torch.Tensor
    model: torch.Tensor
    robust: Optional[torch.Tensor]
    groups: int

    @property
    def total(self) -> torch.Tensor:
        """The larger of the two (alive elements)."""
        return self.model if self.robust is None else torch.maximum(self.model, self.robust)


def element_variance(H: torch.Tensor, rss: float, dof: int, scores: Optional[torch.Tensor] = None,
                     group_information: Optional[torch.Tensor] = None,
                     singular: float = SINGULAR) -> Optional[ElementVariance]:
    """`ElementVariance` of the estimate whose normal matrix is H [P, P], residual sum of
    squares ``rss`` on ``dof`` degrees of freedom; with ``scores`` [G, P] (each independent
    group's share of J'r) the cluster-robust variance too: the jackknife with
    ``group_information`` [G, P, P] from `MIN_JACKKNIFE_GROUPS` groups on, else the sandwich
    with more groups than values. None if no element is touched by the data."""
    H = H.detach().double().cpu()
    s2 = rss / max(dof, 1)
    scale = H.diagonal().clamp(min=0).sqrt()
    alive = scale > 0
    if not bool(alive.any()):
        return None
    d = scale[alive]
    Hs = H[alive][:, alive] / (d[:, None] * d[None, :])
    lam, V = torch.linalg.eigh(Hs)
    floor = singular * float(lam.max().clamp(min=1e-300))
    # every direction counts, the unconstrained ones at the floor's curvature: a value
    # with a small share in a near-null direction is still that uncertain
    inv = (V / lam.clamp(min=floor)) @ V.T
    model = inv.diagonal() * s2 / d ** 2
    robust, groups = None, 0
    enough = scores is not None and (scores.shape[0] >= MIN_JACKKNIFE_GROUPS if group_information is not None
                                     else scores.shape[0] > len(d))
    if enough:
        G = scores.detach().double().cpu()[:, alive] / d
        groups = G.shape[0]
        if group_information is not None:
            HG = group_information.detach().double().cpu()[:, alive][:, :, alive] / (d[:, None] * d[None, :])
            robust = jackknife_variance(Hs, HG, G, floor).diagonal() / d ** 2
        else:
            meat = G.T @ G * (groups / (groups - 1))           # CR1's small-sample factor
            robust = (inv @ meat @ inv).diagonal() / d ** 2
    return ElementVariance(scale=scale, alive=alive, Hs=Hs, lam=lam, V=V, floor=floor, inv=inv, model=model,
                           robust=robust, groups=groups)


def raw_sigmas(info: dict, singular: float = SINGULAR) -> torch.Tensor:
    """[P] 1-sigma per raw element from `windows.reduced_information`'s ``info`` (the larger
    of the plain and the robust variance, as published); inf for an element no residual
    touches, and for all where the variance cannot be had."""
    P = info["H"].shape[0]
    out = torch.full((P,), math.inf, dtype=torch.float64)
    try:
        ev = element_variance(info["H"], info["rss"], info["dof"], info.get("G"), info.get("HG"), singular)
    except RuntimeError:             # eigh failed to converge on a non-finite matrix
        return out
    if ev is not None:
        out[ev.alive] = ev.total.sqrt()
    return out


class SettledValues:
    """The raw values after each accepted step of a solver on one problem, and how far they
    moved over the last steps in their 1-sigma: a convergence test in the values, not the
    objective (whose latents may go on improving it). A parameter the data does not
    determine has a wide sigma, so its drift does not hold the others' convergence back."""

    def __init__(self):
        self.path: list[torch.Tensor] = []

    def clear(self) -> None:
        self.path = []

    def add(self, theta: torch.Tensor) -> None:
        self.path.append(theta.detach().double().cpu().clone())

    def span(self, steps: int, sigmas) -> float:
        """The largest |value now - value ``steps`` accepted steps ago| / its sigma over the
        elements (``sigmas()``: [P] raw 1-sigma, called only when due); inf until that many
        steps were taken."""
        steps = max(1, int(steps))
        del self.path[:-(steps + 1)]
        if len(self.path) <= steps:
            return math.inf
        moved = (self.path[-1] - self.path[0]).abs()
        return float((moved / sigmas().to(moved.dtype)).max())


def jackknife_variance(H: torch.Tensor, HG: torch.Tensor, G: torch.Tensor, floor: float) -> torch.Tensor:
    """[P, P] delete-one-group jackknife covariance of a Gauss-Newton estimate (CR3): leaving
    group g out moves the estimate by one Newton step, (H - H_g)^-1 g_g (the others' gradient
    at the estimate is -g_g), and the covariance is (G-1)/G times the scatter of those moves.
    Directions the other groups leave unconstrained are inverted at ``floor`` (the full
    matrix's), so a value that only one group determines gets that floor's large variance
    instead of the near-zero one the sandwich gives its nearly exactly fitted group."""
    lam, V = torch.linalg.eigh(H[None] - HG)
    moves = V @ ((V.transpose(1, 2) @ G[..., None]) / lam.clamp(min=floor)[..., None])
    moves = moves[..., 0]
    centred = moves - moves.mean(0)
    groups = G.shape[0]
    return centred.T @ centred * ((groups - 1) / groups)
