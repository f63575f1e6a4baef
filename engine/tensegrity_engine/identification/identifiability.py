"""What would determine the values the data leaves undetermined, in words an operator can act on.

`ParameterUncertainty.weak_directions` is a basis of the directions the data does not
constrain (any rotation of it: `eigh` picks one when weak eigenvalues are equal), so
everything here depends on the subspace only, never on one basis vector:

- *The force scale.* Multiplying every mass, stiffness and damping by the same factor
  leaves the motion unchanged (`scale.py`). When `ParameterUncertainty.force_scale` lies in
  the weak subspace (at least `SCALE_SHARE` of it), no motion determines it; a weighed mass
  in the robot YAML (rod_mass left out of `learn`) or a known force (a wrench) does. It is
  then projected out and the rest explained as below.
- *Anything else.* Each parameter's share of the weak subspace (the projector's diagonal
  summed over its elements, so a value per cable counts as one parameter); those with at
  least `CARRIES` are undetermined, and two of them that the projector couples (a block of
  norm at least `CARRIES`) trade off: one piece of advice per coupled group, with the motion
  that makes each act (`REVEALED_BY`): a friction the robot never slid on, a winch speed the
  commands never reached. The motion that reveals either member of a group separates them.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from tensegrity_engine.identification.scale import SCALE_GROUP

__all__ = ["Advice", "REVEALED_BY", "CARRIES", "SCALE_SHARE", "BOUND_HINTS", "excitation_advice", "advice_text",
           "unfixed_force_scale", "structure_hints"]

# What a value pinned at one end of its range (`ParameterUncertainty.at_bound`) points to,
# where that was measured. A SUPERball whose cables' stiffness and damping spread +-20 %,
# fitted with one shared value, drives the motors' time constant to its lower bound: 2 ms
# against 25-200 ms true, on every seed of zoo/stiff_light and zoo/kitchen_sink and on a
# stiffness spread alone. With a value per cable it comes back to within 3 % (kitchen_sink,
# 5 seeds; 6.4 % on one more run: docs/online_identification.md).
BOUND_HINTS = {
    ("actuator_time_constant", "lower"): "cables that differ from each other pin the motors' time constant "
                                         "at its lower bound: a stiffness per cable is tried next (per_cable_stiffness, "
                                         "structure_on_pin), the held-out data decide; where the cables are "
                                         "known to differ, fit it from the start (per_element: "
                                         "[cable_stiffness])",
    ("rod_inertia_factor", "upper"): "the rods' inertia factor at its top (beyond all of a rod's mass at its "
                                     "ends) came with cables that differ from each other: a stiffness per cable is "
                                     "tried next (per_cable_stiffness, structure_on_pin), the held-out data decide",
}

# The motion (or measurement) that makes each learnable parameter act on the poses.
REVEALED_BY = {
    "cable_stiffness": "cables stretched by different amounts (large rest-length changes under load), or a "
                       "load cell's tension (cable_states effort, tension_weight)",
    # for commanded motion the cables' lag c / k adds to the motors' (`lag_split`): only the motion
    # the commands do not drive tells them apart
    "cable_damping": "the structure oscillating on its own (after an impact or a sudden release; command "
                     "steps alone show the cables' lag c/k only added to the motors'), or the winches' encoders "
                     "that take the motors' lag out of it (cable_states position, rest_length_weight)",
    "cable_slack_damping": "cables going slack and taut again (commands that slacken them)",
    "rod_mass": "rods lifted or swung against gravity by the cables",
    "rod_inertia_factor": "rods spinning or tumbling (fast changes of their orientation)",
    "actuator_time_constant": "command steps faster than the motors follow (steps, a fast multisine), beside "
                              "motion the commands do not drive, which shows the cables' damping alone; or the "
                              "winches' encoders (cable_states position, rest_length_weight)",
    "actuator_max_speed": "command changes large enough for the winches to reach their top speed",
    "actuator_delay": "command steps whose timing the poses can resolve (sharp steps)",
    "actuator_gain": "commands over the winches' whole range",
    "actuator_offset": "commands over the winches' whole range",
    "contact_stiffness": "impacts on the floor (the robot tipping over, rods dropped)",
    "contact_damping": "impacts on the floor (the robot tipping over, rods dropped)",
    "contact_time_constant": "impacts on the floor (the robot tipping over, rods dropped)",
    "contact_damping_ratio": "impacts on the floor (the robot tipping over, rods dropped)",
    "friction_sliding": "rods sliding on the floor (rolling with slip, pushes along the floor)",
    "friction_torsional": "rods twisting about the normal while they touch the floor",
    "friction_rolling": "rods rolling on the floor",
}

# A parameter is undetermined when its elements hold at least this share of the weak
# subspace (1: all of one direction), and two are coupled when the projector's block
# between them has at least this norm (a pure two-way trade-off: 0.5).
CARRIES = 0.1
# The force scale is undetermined when at least this much of it lies in the weak subspace.
SCALE_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class Advice:
    names: tuple           # the parameters the direction moves (names, not element labels)
    text: str              # what would determine it
    force_scale: bool      # no motion would: a weighed mass or a known force


def _name(label: str) -> str:
    return re.sub(r"\[\d+\]$", "", label)


def _basis(weak_directions) -> tuple[list, np.ndarray]:
    """Labels and the [labels, k] matrix of the basis vectors."""
    labels = list(dict.fromkeys(lab for d in weak_directions for lab in d))
    B = np.array([[d.get(lab, 0.0) for d in weak_directions] for lab in labels], dtype=np.float64)
    return labels, B.reshape(len(labels), len(weak_directions))


def _without(B: np.ndarray, g: np.ndarray) -> np.ndarray:
    """An orthonormal basis of span(B) less the unit vector g (which lies in it)."""
    rest = B - np.outer(g, g @ B)
    U, sv, _ = np.linalg.svd(rest, full_matrices=False)
    return U[:, sv > 0.5]


def excitation_advice(u) -> tuple[Advice, ...]:
    """What would determine the unconstrained directions of ``u`` (a `ParameterUncertainty`:
    its ``weak_directions`` and ``force_scale``): the force scale first, then one `Advice`
    per group of undetermined parameters that trade off."""
    labels, B = _basis(u.weak_directions)
    if not labels:
        return ()
    out = []
    scale = u.force_scale
    f = np.array([scale.get(lab, 0.0) for lab in labels])
    projected = B @ (B.T @ f)
    if scale and float(projected @ projected) >= SCALE_SHARE * sum(c * c for c in scale.values()):
        moved = tuple(dict.fromkeys(_name(lab) for lab in scale))
        out.append(Advice(moved, f"the force scale ({', '.join(moved)} together): poses fix only forces per unit "
                          "mass, so no motion determines it; weigh the rods (the robot YAML's rod mass, rod_mass "
                          "left out of learn) or give the data a known force (a wrench, or a cable's load cell: "
                          "cable_states effort with tension_weight)", True))
        B = _without(B, projected / np.linalg.norm(projected))
    if B.shape[1] == 0:
        return tuple(out)
    P = B @ B.T
    names = list(dict.fromkeys(_name(lab) for lab in labels))
    rows = {n: [i for i, lab in enumerate(labels) if _name(lab) == n] for n in names}
    share = {n: float(np.diag(P)[rows[n]].sum()) for n in names}
    weak = [n for n in names if share[n] >= CARRIES] or [max(names, key=share.get)]
    groups: list[list[str]] = []
    for n in sorted(weak, key=lambda n: -share[n]):
        linked = [g for g in groups if any(np.linalg.norm(P[np.ix_(rows[n], rows[m])]) >= CARRIES for m in g)]
        merged = [n] + [m for g in linked for m in g]
        groups = [g for g in groups if g not in linked] + [merged]
    for group in groups:
        group = sorted(group, key=lambda n: -share[n])
        motions = list(dict.fromkeys(REVEALED_BY.get(n, f"motions that {n} acts on") for n in group))
        lead = group[0] if len(group) == 1 else f"{' and '.join(group)} (they trade off)"
        out.append(Advice(tuple(group), f"{lead}: excite {'; or '.join(motions)}", False))
    return tuple(out)


def advice_text(u) -> str:
    """`excitation_advice` as one line (empty when every direction is constrained)."""
    return " | ".join(a.text for a in excitation_advice(u))


def unfixed_force_scale(learn, law: str, contact_acts: bool = True, measured_force: bool = False) -> tuple[str, ...]:
    """The learnt values whose common scale nothing fixes when the data carries no known
    force: the rod mass learnt together with every force that acts on the poses (the cables'
    stiffness and damping; under the penalty law, where contact can act (``contact_acts``: a
    floor, or rods that may touch), also its contact stiffness and damping, in newtons; the
    soft law's contact values are per unit mass). Empty when some force that acts is kept at
    a known value (the masses are then determined relative to it), or is measured
    (``measured_force``: the cables' load cells fitted beside the poses)."""
    learn = tuple(learn)
    if measured_force:
        return ()
    acting = ["cable_stiffness", "cable_damping"]
    if law == "penalty" and contact_acts:
        acting += ["contact_stiffness", "contact_damping"]
    if "rod_mass" not in learn or any(n not in learn for n in acting):
        return ()
    return tuple(n for n in learn if n in SCALE_GROUP)


def structure_hints(params, names) -> tuple[str, ...]:
    """`BOUND_HINTS` for the learnt ``names`` pinned at a bound of their range in ``params``
    (a `PhysicalParameters`): the structure the robot may have and the model lacks."""
    from tensegrity_engine.identification.uncertainty import bound_sides

    return tuple(BOUND_HINTS[(name, side)] for name in names for side in bound_sides(params, name)
                 if (name, side) in BOUND_HINTS)
