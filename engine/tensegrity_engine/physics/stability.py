"""Where the explicit (semi-implicit Euler) step stays stable, as a bound on parameters.

Cable and contact forces are explicit in the semi-implicit integrator, so a step h is stable
only while the stiffest and most damped end node satisfies (per mode, mass m)

    h <= 2 / sqrt(k / m)        and        h <= 2 m / c,

with k, c the sums over the node's cables plus the ground contact, and m the smallest
effective end mass 1 / (1/m_rod + (L/2)^2 / I_t), halved for relative two-node modes. ANI
sub-steps by this bound; identification uses it the other way round: a model whose contact
damping puts the bound below the engine step fits 100 ms tuples (the ReLU normal force
clips the overshoot) and diverges within a second of its own rollout.

Under the soft contact law (`physics.soft_contact`) the ground is a constraint solved
implicitly within the step, stable at any step (its time constant is held at >= 2 h), so
only the penalty law's ground stiffness and damping enter these bounds; so are the rod
pairs' contacts under it (`physics.soft_pairs`). Penalty rod-rod contacts are left out as
before: they are brief and, at the config's values, far inside the step.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from tensegrity_engine.physics.topology import Topology

__all__ = ["explicit_step_limit", "contact_upper_bounds", "modal_step_limit", "stable_substeps", "STEP_MARGIN",
           "RK4_REACH"]

# How far past `modal_step_limit` a 1 ms step still runs true. Measured on SUPERball on the
# floor (multisine commands, 3 s, 1 ms against 1/8 ms; cable damping, stiffness, rod mass
# or contact damping scaled): up to 1.80x the limit the two differ by the floor's chaos
# alone (12-18 mm at 0.5 s; the nominal model is at 1.60x, 1.1x its cable damping at 1.76x,
# 10x its contact damping at 1.80x); from 1.92x on (1.2x the cable damping, 0.8x the rod
# mass) the 1 ms rollout runs away (340-650 mm at 0.5 s).
STEP_MARGIN = 1.8

# How much further than the semi-implicit step the classic Runge-Kutta step stays stable: its
# stability region reaches 2.83 / omega on an undamped mode and 2.79 m / c on a damped one,
# against 2 for the semi-implicit step; the smaller ratio bounds both.
RK4_REACH = 2.785 / 2.0


def _values(values: Mapping[str, object], name: str, size: int) -> np.ndarray:
    v = values[name]
    if hasattr(v, "detach"):
        v = v.detach().cpu().double().numpy()
    return np.broadcast_to(np.atleast_1d(np.asarray(v, dtype=np.float64)), (size,))


def _node_terms(topology: Topology, values: Mapping[str, object]) -> tuple[float, float, float]:
    """(smallest modal end mass, largest per-node cable stiffness, largest per-node cable damping)."""
    robot = topology.robot
    R, C = robot.num_rods, robot.num_cables
    mass = _values(values, "rod_mass", R)
    half = robot.rod_length / 2.0
    inertia_per_mass = (robot.uniform_rod_inertia()[:, 0] / robot.rod_mass      # I_t / m
                        * _values(values, "rod_inertia_factor", R))
    end_mass = 1.0 / (1.0 / mass + half ** 2 / (mass * inertia_per_mass))
    count = topology.node_cable_count
    k_node = float((count @ _values(values, "cable_stiffness", C)).max())
    c_node = float((count @ _values(values, "cable_damping", C)).max())
    return float(end_mass.min()) / 2.0, k_node, c_node


def _explicit_ground(topology: Topology, floor: bool) -> bool:
    """Whether the ground's force is explicit in the step (the penalty law on a floor)."""
    return floor and topology.robot.contact.law == "penalty"


def explicit_step_limit(topology: Topology, values: Mapping[str, object], *, floor: bool) -> float:
    """Largest stable semi-implicit step (s) for these parameter values."""
    m_min, k_node, c_node = _node_terms(topology, values)
    if _explicit_ground(topology, floor):
        k_node += float(np.max(_values(values, "contact_stiffness", 1)))
        c_node += float(np.max(_values(values, "contact_damping", 1)))
    return min(2.0 / math.sqrt(max(k_node, 1e-12) / m_min), 2.0 * m_min / max(c_node, 1e-12))


def contact_upper_bounds(topology: Topology, values: Mapping[str, object], step: float, *,
                         integrator: str = "semi_implicit") -> dict:
    """Largest contact stiffness (stable) and damping (deadbeat) for a semi-implicit ``step``
    given the cables and rod masses in ``values``: {name: upper} (absent where the cables
    alone already break it). With ``implicitfast`` the cable damping is implicit and takes
    nothing from the contact's budget."""
    m_min, k_node, c_node = _node_terms(topology, values)
    if integrator == "implicitfast":
        c_node = 0.0
    end_mass = 2.0 * m_min          # the ground does not move: a contact sees the whole end mass
    out = {}
    k_max = end_mass * (2.0 / step) ** 2 - k_node
    # Damping: deadbeat (h c / m = 1) is the most a step can damp; past it the discrete
    # response overshoots and damps less, and at twice it stops damping at all.
    c_max = end_mass / step - c_node
    if k_max > 0:
        out["contact_stiffness"] = k_max
    if c_max > 0:
        out["contact_damping"] = c_max
    return out


def modal_step_limit(topology: Topology, values: Mapping[str, object], *, floor: bool,
                     integrator: str = "semi_implicit") -> float:
    """`explicit_step_limit` per mode: the cables' relative two-node modes see half the end
    mass, a node against the ground (cables and contact) the whole of it. Contact damping
    then counts as much as it matters (10x the nominal still runs true at 1 ms, where the
    lumped bound says 3.6x past it). ``implicitfast`` damps each rod's own cable ends
    implicitly, which keeps a damper's two-node mode stable at any step (its relative
    velocity shrinks by 1 - 2 h c / (m + h c) > -1): only stiffness and contact bound it.
    ``rk4`` reaches `RK4_REACH` times further."""
    m_half, k_node, c_node = _node_terms(topology, values)
    if integrator == "implicitfast":
        c_node = 0.0
    limit = min(2.0 / math.sqrt(max(k_node, 1e-12) / m_half), 2.0 * m_half / max(c_node, 1e-12))
    if _explicit_ground(topology, floor):
        m_end = 2.0 * m_half
        k = k_node + float(np.max(_values(values, "contact_stiffness", 1)))
        c = c_node + float(np.max(_values(values, "contact_damping", 1)))
        limit = min(limit, 2.0 / math.sqrt(k / m_end), 2.0 * m_end / c)
    return limit * (RK4_REACH if integrator == "rk4" else 1.0)


def stable_substeps(topology: Topology, values: Mapping[str, object], step: float, *, floor: bool,
                    margin: float = STEP_MARGIN, integrator: str = "semi_implicit") -> int:
    """Sub-steps of ``step`` a rollout of these values with ``integrator`` (semi_implicit,
    implicitfast or rk4) needs to run true: the smallest n with step / n within ``margin`` times
    `modal_step_limit` (1 for a model the step suits; more for a stiffer, more damped or
    lighter one)."""
    limit = modal_step_limit(topology, values, floor=floor, integrator=integrator)
    return max(1, math.ceil(step / (margin * limit) - 1e-9))
