"""How a MuJoCo ground-truth robot realises physics the engine models its own way.

The default `Realisation()` is the engine's twin (`Realisation.twin_of` a robot model stepped
with ``implicitfast``: the same with MuJoCo's implicitfast): MuJoCo's semi-implicit Euler, the cable
force realised by a tension-only actuator whose rest length follows a first-order filter,
uniform solid-cylinder rods. Every other option makes a robot that is *not* the engine's
equations, as a robot someone built is not:

* ``integrator``: ``Euler`` | ``implicitfast`` (implicit in the damping) | ``RK4``;
* ``contact``: MuJoCo's own soft contacts with their own ``solref``/``solimp``, condim 3/4/6
  and cone (the engine uses a penalty spring-damper with smooth Coulomb friction);
* ``slack_damping``: cable damping acts on the tendon whether the cable is taut or slack
  (the engine's cable force ``max(0, K (l - l0) + c ldot)`` has none when slack);
* ``actuation``: how a command becomes a rest length (see `Actuation`);
* ``end_mass_fraction``: that share of each rod's mass sits at its two ends (motors and
  batteries on SUPERball), so the transverse inertia is ``m L^2/12 (1 + 2 f)`` instead of a
  uniform cylinder's;
* ``substeps``: MuJoCo steps per step of the robot's ``dt`` (commands held over them), so a
  robot whose motion at ``dt`` is mostly MuJoCo's discretisation error is played as the
  physical system it stands for (`bench/discretisation.py` measures that error).

Per-cable stiffness/damping spread, payloads and capsule radii are values of the truth's
`RobotConfig` (the engine can represent them); only the structure lives here.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from tensegrity_engine.physics.config import MUJOCO_INTEGRATORS

__all__ = ["Contact", "Actuation", "Realisation", "INTEGRATORS", "ACTUATIONS", "rod_inertia"]

INTEGRATORS = ("Euler", "implicitfast", "RK4")
ACTUATIONS = ("filter", "spring_length", "motor")


@dataclasses.dataclass(frozen=True)
class Contact:
    """MuJoCo contact options of every geom; None keeps MuJoCo's defaults."""

    condim: Optional[int] = None            # None: 6 if torsional/rolling friction, else 3
    cone: str = "pyramidal"                 # or "elliptic"
    solref: Optional[tuple] = None          # (time constant s, damping ratio)
    solimp: Optional[tuple] = None          # (dmin, dmax, width m, midpoint, power)

    def __post_init__(self):
        if self.condim not in (None, 1, 3, 4, 6):
            raise ValueError(f"condim must be 1, 3, 4 or 6, got {self.condim}")
        if self.cone not in ("pyramidal", "elliptic"):
            raise ValueError(f"cone must be 'pyramidal' or 'elliptic', got {self.cone!r}")
        if self.solref is not None and (len(self.solref) != 2 or not self.solref[0] > 0):
            raise ValueError(f"solref must be (timeconst > 0, dampratio), got {self.solref}")
        if self.solimp is not None and len(self.solimp) != 5:
            raise ValueError(f"solimp needs 5 values, got {self.solimp}")


@dataclasses.dataclass(frozen=True)
class Actuation:
    """How a cable command (target rest length, in command units) moves the rest length.

    * ``filter``: first-order filter with the truth's time constant, integrated exactly by
      MuJoCo (``filterexact``); the cable force is a tension-only actuator (the twin's).
    * ``spring_length``: the same filter integrated by forward Euler in a per-step loop,
      which moves the dead band ``[0, l0]`` of the tendon's own spring: the spring only
      pulls past l0 and the tendon's damping acts always (implies ``slack_damping``).
    * ``motor``: a winch that runs towards the command at ``(command - act) / tau`` but at
      most ``max_speed`` (m/s of rest length), and stops inside ``deadband`` (m) of it; the
      force is the tension-only actuator's.
    """

    kind: str = "filter"
    max_speed: float = math.inf
    deadband: float = 0.0

    def __post_init__(self):
        if self.kind not in ACTUATIONS:
            raise ValueError(f"actuation must be one of {ACTUATIONS}, got {self.kind!r}")
        if not self.max_speed > 0 or not self.deadband >= 0:
            raise ValueError("max_speed must be > 0 and deadband >= 0")
        if self.kind != "motor" and (math.isfinite(self.max_speed) or self.deadband):
            raise ValueError("max_speed and deadband belong to the 'motor' actuation")

    @property
    def stepped(self) -> bool:
        """Needs a Python step loop (MuJoCo cannot express it in the model alone)."""
        return self.kind != "filter"


@dataclasses.dataclass(frozen=True)
class Realisation:
    integrator: str = "Euler"
    contact: Contact = Contact()
    actuation: Actuation = Actuation()
    slack_damping: bool = False
    end_mass_fraction: float = 0.0
    substeps: int = 1

    def __post_init__(self):
        if isinstance(self.substeps, bool) or not isinstance(self.substeps, (int, np.integer)) or self.substeps < 1:
            raise ValueError(f"substeps must be an integer >= 1, got {self.substeps!r}")
        if self.integrator not in INTEGRATORS:
            raise ValueError(f"integrator must be one of {INTEGRATORS}, got {self.integrator!r}")
        if not 0.0 <= self.end_mass_fraction < 1.0:
            raise ValueError(f"end_mass_fraction must be in [0, 1), got {self.end_mass_fraction}")
        if self.actuation.kind == "spring_length" and not self.slack_damping:
            raise ValueError("spring_length actuation damps through the tendon: set slack_damping")

    @property
    def is_twin(self) -> bool:
        """The twin of a semi-implicit robot model (see `twin_of` for any model)."""
        return self == Realisation()

    @staticmethod
    def twin_of(robot) -> "Realisation":
        """The engine's twin of ``robot``: its equations, stepped as the robot model says
        (``engine.integrator``: semi_implicit is MuJoCo's Euler, implicitfast and rk4 its
        implicitfast and RK4, the one twin that is not the engine to round-off: its rollouts
        of varying commands converge at first order, the engine's rk4 at fourth); a
        robot with the soft contact law gets its solref, solimp and condim (on the floor and
        between the rods, as in the engine)."""
        integrator = MUJOCO_INTEGRATORS[robot.integrator]
        con = robot.contact
        if con.law == "soft":
            return Realisation(integrator=integrator, contact=Contact(condim=con.soft_condim, solref=tuple(con.solref),
                                                                      solimp=tuple(con.solimp)))
        return Realisation(integrator=integrator)

    @staticmethod
    def from_dict(data: dict) -> "Realisation":
        data = dict(data or {})
        unknown = set(data) - {f.name for f in dataclasses.fields(Realisation)}
        if unknown:
            raise ValueError(f"unknown realisation option(s) {sorted(unknown)}")
        contact = data.pop("contact", {}) or {}
        actuation = data.pop("actuation", {}) or {}
        if isinstance(actuation, str):
            actuation = {"kind": actuation}
        for key in ("solref", "solimp"):
            if contact.get(key) is not None:
                contact[key] = tuple(float(v) for v in contact[key])
        if "max_speed" in actuation:
            actuation["max_speed"] = float(actuation["max_speed"])
        return Realisation(contact=Contact(**contact), actuation=Actuation(**actuation), **data)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        for key in ("solref", "solimp"):
            if out["contact"][key] is not None:
                out["contact"][key] = list(out["contact"][key])
        return out


def rod_inertia(mass: np.ndarray, radius: np.ndarray, length: np.ndarray, end_mass_fraction: float) -> np.ndarray:
    """(R, 3) principal inertia about the rod centre (z = axis): a uniform solid cylinder
    carrying ``1 - f`` of the mass plus two point masses ``f m / 2`` at its ends."""
    f = float(end_mass_fraction)
    transverse = mass * ((1.0 - f) * (3.0 * radius**2 + length**2) / 12.0 + f * length**2 / 4.0)
    axial = 0.5 * mass * radius**2 * max(1.0 - f, 1e-3)      # point masses on the axis add none
    return np.stack([transverse, transverse, axial], axis=-1)


def driven(robot, realisation: Realisation) -> bool:
    """Whether the actuation needs `RestLengthDriver`: a stepped one, or the engine's filter
    with a speed limit that binds (MuJoCo's ``filterexact`` has none)."""
    a = robot.actuator
    span = float(np.max(robot.command_high - robot.command_low, initial=0.0))
    return realisation.actuation.stepped or a.time_constant * a.max_speed < span


class RestLengthDriver:
    """The per-step part of a `driven` actuation (`Actuation`).

    The model's actuated cables have ``integrator`` dynamics: ``act`` (the rest length in
    command units, as for the twin) integrates the rate this driver writes to ``ctrl``
    before every step; MuJoCo clamps it to the motor's speed and ``act`` to the command
    range. ``spring_length`` also moves the tendon springs' dead band to the new l0;
    ``filter`` writes the rate that lands exactly on the engine's rate-limited filter.
    """

    def __init__(self, robot, realisation: Realisation):
        act = realisation.actuation
        if not driven(robot, realisation):
            raise ValueError("this filter actuation needs no driver")
        self.kind = act.kind
        self.max_speed = float(robot.actuator.max_speed)
        self.num_actuated = robot.num_actuated
        self.tau = float(robot.actuator.time_constant)
        self.gain, self.offset = float(robot.actuator.gain), float(robot.actuator.offset)
        self.low, self.high = robot.command_low, robot.command_high
        self.deadband = act.deadband / self.gain                # in command units
        self.tendons = np.asarray(robot.actuated_indices)      # tendon c is config cable c

    def before_step(self, model, data, command: np.ndarray) -> None:
        A = self.num_actuated
        act = data.act[:A]
        target = np.clip(command, self.low, self.high)
        if self.kind == "filter":
            from tensegrity_engine.physics.actuators import held_command_update

            h = float(model.opt.timestep)
            data.ctrl[:A] = (held_command_update(act, target, self.tau, h, self.max_speed) - act) / h
            return
        error = target - act
        rate = error / self.tau
        if self.deadband > 0:
            rate[np.abs(error) <= self.deadband] = 0.0
        data.ctrl[:A] = rate
        if self.kind == "spring_length":
            model.tendon_lengthspring[self.tendons, 1] = self.gain * act + self.offset

    def step(self, model, data, command: np.ndarray, nsteps: int = 1) -> None:
        import mujoco

        for _ in range(int(nsteps)):
            self.before_step(model, data, command)
            mujoco.mj_step(model, data)
