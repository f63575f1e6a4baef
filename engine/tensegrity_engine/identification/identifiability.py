"""What would determine the values the data leaves undetermined, in words an operator can act on.

`ParameterUncertainty.weak_directions` are the directions of the Gauss-Newton normal matrix
that the data does not constrain. Each is explained by the parameters it moves:

- *The force scale.* Multiplying every mass, stiffness and damping by the same factor
  leaves the motion unchanged (`scale.py`): a direction that moves only those, all the same
  way, is that one. No motion determines it; a weighed mass in the robot YAML (rod_mass left
  out of `learn`) or a known force (a wrench on the data) does.
- *Anything else.* The parameters that carry the direction (a squared component of at least
  `CARRIES`) and, for each, the motion that makes it act (`REVEALED_BY`): a friction the
  robot never slid on, a winch speed the commands never reached, a contact never struck.
  Two parameters in one direction trade off: the motion that reveals either separates them.
"""
from __future__ import annotations

import dataclasses
import re

from tensegrity_engine.identification.scale import SCALE_GROUP

__all__ = ["Advice", "REVEALED_BY", "CARRIES", "excitation_advice", "advice_text", "unfixed_force_scale"]

# The motion (or measurement) that makes each learnable parameter act on the poses.
REVEALED_BY = {
    "cable_stiffness": "cables stretched by different amounts (large rest-length changes under load)",
    "cable_damping": "fast cable-length changes (command steps and the oscillation after them)",
    "cable_slack_damping": "cables going slack and taut again (commands that slacken them)",
    "rod_mass": "rods lifted or swung against gravity by the cables",
    "rod_inertia_factor": "rods spinning or tumbling (fast changes of their orientation)",
    "actuator_time_constant": "command steps faster than the motors follow (steps, a fast multisine)",
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

_MASSES = {"rod_mass"}
# A parameter carries a direction when its squared component is at least this (of 1).
CARRIES = 0.1
# The force scale: its parameters hold at least this much of the direction, all one way.
SCALE_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class Advice:
    names: tuple           # the parameters the direction moves (names, not element labels)
    text: str              # what would determine it
    force_scale: bool      # no motion would: a weighed mass or a known force


def _name(label: str) -> str:
    return re.sub(r"\[\d+\]$", "", label)


def _force_scale(direction: dict) -> bool:
    carried = {lab: c for lab, c in direction.items() if c * c >= CARRIES / 10.0}
    share = sum(c * c for lab, c in direction.items() if _name(lab) in SCALE_GROUP)
    names = {_name(lab) for lab in carried}
    signs = {c > 0 for c in carried.values()}
    return share >= SCALE_SHARE and bool(names & _MASSES) and bool(names - _MASSES) and len(signs) == 1


def excitation_advice(weak_directions) -> tuple[Advice, ...]:
    """One `Advice` per distinct explanation of the unconstrained ``weak_directions``
    (`ParameterUncertainty.weak_directions`), the force scale first."""
    out: list[Advice] = []
    for direction in weak_directions:
        if not direction:
            continue
        ranked = sorted(direction.items(), key=lambda kv: -kv[1] * kv[1])
        names = tuple(dict.fromkeys(_name(lab) for lab, c in ranked if c * c >= CARRIES)) \
            or (_name(ranked[0][0]),)
        if _force_scale(direction):
            moved = tuple(dict.fromkeys(_name(lab) for lab, _ in ranked if _name(lab) in SCALE_GROUP))
            text = (f"the force scale ({', '.join(moved)} together): poses fix only forces per unit mass, so no "
                    "motion determines it; weigh the rods (the robot YAML's rod mass, rod_mass left out of "
                    "learn) or give the data a known force (a wrench)")
            advice = Advice(moved, text, True)
        else:
            motions = list(dict.fromkeys(REVEALED_BY.get(n, f"motions that {n} acts on") for n in names))
            lead = names[0] if len(names) == 1 else f"{' and '.join(names)} (they trade off)"
            advice = Advice(names, f"{lead}: excite {'; or '.join(motions)}", False)
        if all(a.text != advice.text for a in out):
            out.append(advice)
    return tuple(sorted(out, key=lambda a: not a.force_scale))


def advice_text(weak_directions) -> str:
    """`excitation_advice` as one line (empty when every direction is constrained)."""
    return " | ".join(a.text for a in excitation_advice(weak_directions))


def unfixed_force_scale(learn, law: str, floor: bool) -> tuple[str, ...]:
    """The learnt values whose common scale nothing fixes when the data carries no known
    force: the rod mass learnt together with every force that acts on the poses (the cables'
    stiffness and damping; on a floor under the penalty law also its stiffness and damping,
    which are in newtons; the soft law's are per unit mass). Empty when some force that acts
    is kept at a known value (then the masses are determined relative to it)."""
    learn = tuple(learn)
    acting = ["cable_stiffness", "cable_damping"]
    if floor and law == "penalty":
        acting += ["contact_stiffness", "contact_damping"]
    if "rod_mass" not in learn or any(n not in learn for n in acting):
        return ()
    return tuple(n for n in learn if n in SCALE_GROUP)
