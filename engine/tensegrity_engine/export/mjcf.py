"""A calibrated, standalone MuJoCo model (MJCF) of an identified robot.

`calibrated_mjcf(params)` writes the engine's model with every identified value -- per-cable
stiffness, damping and its slack share, rod masses and inertia factors, the motor filter
(time constant, gain, offset), the command dead time, friction -- as MJCF that
``mujoco.MjModel.from_xml_path`` loads and ``mujoco.rollout``, MuJoCo MPC or
``mujoco.sysid`` use directly. Without contact the model takes the engine's own steps
(MuJoCo's semi-implicit Euler is the engine's ``semi_implicit`` integrator, its
``implicitfast`` the engine's ``implicitfast``, its ``RK4`` the engine's ``rk4``: the
model's ``engine.integrator``), so it
reproduces the identified engine to round-off, up to the dead time (MuJoCo's actuator
history, linear interpolation, the engine's law). MuJoCo's RK4 is the one exception (a
note says so): its rollouts of varying commands converge at first order where the
engine's rk4 converges at fourth, and a hanging 0.6 s rollout differs by 0.5-0.8 mm
(measured, three-bar and SUPERball).

What MJCF cannot say is written down, never dropped silently: the export's ``notes`` list
it (and the file's header comment repeats them):

* an ``rk4`` model: MuJoCo's RK4 is not the engine's step to round-off (above);
* a binding winch speed limit (``actuator_max_speed``): MuJoCo's ``filterexact``
  activation has none; the engine's exact law needs a per-step driver
  (`groundtruth.realisation.RestLengthDriver`);
* a negative ``actuator_delay`` (a pose clock running ahead of the command clock) is a
  property of the sensors, not of the robot; the exported robot has none;
* contacts: the engine's penalty spring-damper with smooth Coulomb friction has no MJCF
  equivalent; the export keeps MuJoCo's soft contacts with the identified friction
  coefficients (MuJoCo's torsional and rolling coefficients are lengths, as the engine's).
  A model with the soft contact law (``contact.law: soft``) is exported with its identified
  solref, its solimp and condim, on the floor and between the rods: it then takes the
  engine's steps too.

A model with a dead time has an actuator history: call `init_command_history` after
``mj_resetData`` so the dead time starts from the command then held (MuJoCo's history
starts at zero).
"""
from __future__ import annotations

import dataclasses
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from tensegrity_engine.groundtruth.mujoco_twin import build_mjcf
from tensegrity_engine.groundtruth.realisation import Realisation, driven
from tensegrity_engine.physics.config import MUJOCO_INTEGRATORS
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.stability import stable_substeps
from tensegrity_engine.physics.topology import Topology

__all__ = ["MjcfExport", "calibrated_mjcf", "write_mjcf", "init_command_history"]


@dataclasses.dataclass(frozen=True)
class MjcfExport:
    xml: str
    timestep: float               # s: the identified model's stable step with its integrator
    notes: tuple[str, ...]        # what the MJCF does not represent


def _stable_timestep(params: PhysicalParameters, floor: bool, fixed_rods: Sequence[int]) -> float:
    """The step the engine itself would take with these values (its identification and
    planning sub-step the config step when a stiff, damped or light model needs it)."""
    robot = params.robot
    values = {k: v.detach() for k, v in params.values().items()}
    k = stable_substeps(Topology(robot, fixed_rods), values, robot.dt, floor=floor, integrator=robot.integrator)
    return robot.dt / k


def calibrated_mjcf(params: PhysicalParameters, *, floor: bool = True, fixed_rods: Sequence[int] = (),
                    rod_state: Optional[np.ndarray] = None, source: str = "") -> MjcfExport:
    """MJCF of the robot with the values of ``params`` (see the module docstring);
    ``floor``/``fixed_rods``/``rod_state`` as `groundtruth.mujoco_twin.build_mjcf`."""
    robot = params.to_robot_config()
    notes = []
    if robot.integrator == "rk4":
        notes.append("integrator: MuJoCo's RK4 is not the engine's rk4 to round-off (its rollouts of varying "
                     "commands converge at first order; 0.5-0.8 mm apart over 0.6 s hanging, measured)")
    act = robot.actuator
    if driven(robot, Realisation()):
        notes.append(f"actuator_max_speed {act.max_speed:.4g} m/s binds (tau x speed = "
                     f"{act.time_constant * act.max_speed:.3g} m < the command span): MuJoCo's filterexact "
                     f"winches have no speed limit")
    delay = float(act.delay)
    if delay < 0:
        notes.append(f"actuator_delay {delay:.4g} s is negative (a pose clock ahead of the command clock, "
                     f"a sensor property): the exported robot has no dead time")
        delay = 0.0
    # the soft law is MuJoCo's on the floor and between the rods: nothing of it is lost
    rods_meet = robot.contact.rod_rod and robot.num_rods > 1
    where = " and ".join(w for w, on in (("on the floor", floor), ("between the rods", rods_meet)) if on)
    if where and robot.contact.law != "soft":
        notes.append(f"contact {where}: MuJoCo soft contacts (default solref/solimp) with the identified friction; "
                     f"the engine's penalty contact (stiffness {robot.contact.stiffness:.4g} N/m, damping "
                     f"{robot.contact.damping:.4g} N s/m) has no MJCF equivalent")
    timestep = _stable_timestep(params, floor, fixed_rods)
    plain = robot.replace(dt=timestep, actuator=dataclasses.replace(act, max_speed=math.inf, delay=0.0))
    root = ET.fromstring(build_mjcf(plain, fixed_rods=fixed_rods, floor=floor, rod_state=rod_state))
    if delay > 0:
        # MuJoCo keeps nsample past controls; the dead time must fit inside them
        nsample = int(math.ceil(delay / timestep)) + 2
        for general in root.iter("general"):
            if general.get("dyntype") != "none":
                general.set("delay", repr(delay))
                general.set("nsample", str(nsample))
                general.set("interp", "linear")
    values = params.as_dict()
    lines = [f"Calibrated MuJoCo model of {robot.name}, written by tensegrity_engine.export"
             + (f" from {source}" if source else ""),
             f"timestep {timestep:g} s, integrator "
             + f"{MUJOCO_INTEGRATORS[robot.integrator]} (the model's {robot.integrator})"
             + ": the engine's step for these values"]
    lines += [f"{name} = {np.round(np.atleast_1d(v), 6).tolist()}" for name, v in values.items()]
    lines += [f"NOTE: {n}" for n in notes]
    if delay > 0:
        lines.append("dead time: after mj_resetData fill the actuator history with the held command "
                     "(mujoco.mj_initCtrlHistory, or tensegrity_engine.export.init_command_history)")
    root.insert(0, ET.Comment("\n  " + "\n  ".join(lines).replace("--", "- -") + "\n"))
    ET.indent(root)
    return MjcfExport(ET.tostring(root, encoding="unicode"), timestep, tuple(notes))


def write_mjcf(params: PhysicalParameters, path, **kwargs) -> MjcfExport:
    """`calibrated_mjcf` written to ``path``; the file is checked to load in MuJoCo."""
    import mujoco

    export = calibrated_mjcf(params, **kwargs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(export.xml)
    mujoco.MjModel.from_xml_path(str(path))       # a file we write must load: fail here, not later
    return export


def init_command_history(model, data, command: np.ndarray) -> None:
    """Fill the dead-time history of the actuated cables (actuators 0..A-1) with
    ``command`` [A], as if it had been held forever: the engine's convention."""
    import mujoco

    command = np.asarray(command, dtype=np.float64).reshape(-1)
    for i, value in enumerate(command):
        if model.actuator_historyadr[i] < 0:
            continue
        samples = int(model.actuator_history[i, 0])
        mujoco.mj_initCtrlHistory(model, data, i, None, np.full(samples, value))
