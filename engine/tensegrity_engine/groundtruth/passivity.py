"""Is a ground truth physical? A passive robot must not gain energy.

A tensegrity launched on a floor under constant commands and no external force can only
lose mechanical energy: cables, dampers, contacts and friction are passive. Some MuJoCo
settings are not: a capsule with a tiny axial inertia on a ``condim 3`` contact (no
torsional friction) can spin up about its own axis and sink through the floor, gaining
joules every second (measured on the zoo's three-bar: 0.8 J -> 5.6 J in 3 s at constant
commands; Euler integration of the same robot reaches 23 kJ). A benchmark recorded on
such a robot measures MuJoCo's artefact, not a model, so recording refuses it
(`check_passive`).

Mechanical energy = kinetic + gravity + tendon springs (MuJoCo's own ``mj_energyPos`` /
``mj_energyVel``) + the elastic energy of the tension-only actuated cables,
K relu(l - l0)^2 / 2 with l0 = gain * act + offset (passive cables: their rest length).
Energy stored in MuJoCo's soft contacts is not counted: it is small and only makes the
check more tolerant.
"""
from __future__ import annotations

import numpy as np
import mujoco

from tensegrity_engine.groundtruth.mujoco_twin import FULLPHYSICS, MujocoTwin

__all__ = ["GroundTruthNotPassive", "mechanical_energy", "energy_gain", "check_passive"]

# A rise of the energy above its running minimum larger than this share of the energy the
# run started with (above its lowest) is a gain no passive robot has. MuJoCo's soft
# pyramidal contacts are not exactly passive either: the zoo's SUPERball robots rise by up
# to 30 % of their launch energy right after launch, then settle; the three-bar on condim 3
# rose by 72 % and 1 700 % and kept spinning.
GAIN_TOLERANCE = 0.5


class GroundTruthNotPassive(RuntimeError):
    """The MuJoCo ground truth gained energy it had no source for."""


def mechanical_energy(twin: MujocoTwin, rod_states: np.ndarray, act: np.ndarray) -> np.ndarray:
    """Mechanical energy (J) of rod states [..., R, 13] with activations [..., A] (or [A])."""
    rs = np.asarray(rod_states, dtype=np.float64)
    lead = rs.shape[:-2]
    flat = rs.reshape(-1, *rs.shape[-2:])
    a = np.broadcast_to(np.asarray(act, dtype=np.float64), lead + (twin.num_actuated,)).reshape(len(flat), -1)
    robot = twin.robot
    m, d = twin.model, mujoco.MjData(twin.model)
    saved_flags, saved_springs = int(m.opt.enableflags), m.tendon_lengthspring.copy()   # the twin's, restored
    m.opt.enableflags |= int(mujoco.mjtEnableBit.mjENBL_ENERGY)
    spring_length = twin.realisation.actuation.kind == "spring_length"
    stiffness = np.zeros(robot.num_cables) if spring_length else robot.cable_stiffness
    rest = robot.cable_rest_length.copy()
    actuated = np.asarray(robot.actuated_indices)
    g, off = robot.actuator.gain, robot.actuator.offset
    states = twin.mj_state_from(flat, a)
    out = np.empty(len(flat))
    for i in range(len(flat)):
        mujoco.mj_setState(m, d, states[i], FULLPHYSICS)
        if spring_length:         # the driver keeps the springs' dead band at the activation
            m.tendon_lengthspring[actuated, 1] = g * a[i] + off
        mujoco.mj_forward(m, d)
        rest[actuated] = g * a[i] + off
        stretch = np.maximum(d.ten_length[:robot.num_cables] - rest, 0.0)
        out[i] = d.energy[0] + d.energy[1] + 0.5 * float(np.sum(stiffness * stretch * stretch))
    m.opt.enableflags = saved_flags
    m.tendon_lengthspring[:] = saved_springs
    return out.reshape(lead)


def energy_gain(energy: np.ndarray, floor: float = 1e-9) -> float:
    """Largest rise of ``energy`` [T] above its running minimum, as a share of how far the
    run's energy lies above its lowest value at the start, or of ``floor`` (J) if more (a
    run that starts at rest would otherwise judge round-off)."""
    e = np.asarray(energy, dtype=np.float64)
    rise = float(np.max(e - np.minimum.accumulate(e)))
    scale = max(float(e[0] - e.min()), floor)
    return rise / scale


def check_passive(twin: MujocoTwin, rod_states: np.ndarray, act: np.ndarray, *, label: str = "") -> None:
    """`GroundTruthNotPassive` when a run at constant commands, with no external force,
    (rod states [T, R, 13], activations held at ``act`` [A]) gained energy."""
    # floor: the energy of lifting the whole robot by 5 mm
    floor = 0.005 * float(np.sum(twin.robot.rod_mass)) * float(np.linalg.norm(twin.robot.gravity))
    gain = energy_gain(mechanical_energy(twin, rod_states, act), floor)
    if gain > GAIN_TOLERANCE:
        real = twin.realisation
        raise GroundTruthNotPassive(
            f"{twin.robot.name}{label}: the MuJoCo ground truth gained energy under constant commands "
            f"(a rise of {100 * gain:.0f} % of its launch energy; integrator {real.integrator}, contact "
            f"{real.contact}); a passive robot cannot. Its contact settings are not physical for these "
            "rods (e.g. condim 3 lets a thin capsule spin up about its axis): use condim >= 4 or another "
            "realisation")
