"""The paper's two task environments, as episode samplers for the MuJoCo twin.

Every sampler takes a ``numpy.random.Generator`` and returns numpy float64 arrays at the
robot's native step (``robot.dt``, 1 kHz for the shipped configs):

* `sample_noncontact_episode` -> (rod_state0 [R, 13], act0 [A], commands [S, A],
  wrenches [S, R, 6]); roll it out in ``noncontact_twin(robot)`` (no floor, rod 0 welded
  to the world: the robot hangs from rod 0).
* `sample_contact_episode` -> (rod_state0 [R, 13], act0 [A], commands [S, A]); roll it
  out in ``contact_twin(robot)`` (floor, all rods free).

Dataset code stacks B episodes and calls ``twin.rollout(states, acts, commands, wrenches)``.

Choices (all overridable by keyword):

* Random commands are piecewise constant, independently per cable: each cable holds a
  target drawn uniformly from its command range for a hold time drawn uniformly from
  ``hold_range = (0.1, 0.5)`` s, then draws a new one (the first target applies from
  t = 0, so act0 (nominal) generally steps towards it).
* External forces (non-contact only) are piecewise constant per free rod, with the same
  hold-time law: a uniformly random direction on the sphere and a magnitude uniform in
  ``[0, max_force]``, applied at the rod centre (no torque). ``max_force`` defaults to
  ``FORCE_SCALE * m_rod * |g|`` with ``FORCE_SCALE = 1`` (98 N for SUPERball, 20 N for
  the 3-bar), an eighth of a nominal SUPERball cable pretension (~810 N). With nominal
  commands it swings / deforms the hanging SUPERball by ~0.2 m (median over 3 s
  episodes of the largest node displacement; 0.5 m worst) while no cable goes slack
  (min tension ~700 N).
* Rod 0 welded to the world is a hinge: both of its end nodes lie on its axis, so the
  rest of the robot can rotate about that axis without changing any cable length, and
  nothing damps that pendulum mode but the cables' coupling to the deformation. The
  hanging pose therefore starts from the config pose swung about rod 0's axis until the
  CoM is straight below it (SUPERball's config pose has it 0.42 m above rod 0).
* Contact episodes start from `rest_pose` with a CoM speed uniform in
  ``speed_range = (0.5, 2.0)`` m/s along a uniformly random horizontal direction; every
  rod gets the rigid-body velocity of a rolling body about the CoM:
  ``omega = (z x v) / h`` (h = CoM height above the ground), ``v_rod = v + omega x
  (p_rod - com)``, ``omega_rod = omega``. Commands are held at nominal (or random,
  ``randomize_commands=True``).
* `rest_pose`: the config pose turned onto its lowest convex-hull face (SUPERball's config
  pose would balance on an edge), dropped from 1 cm and settled. Settling (`_settle`)
  uses kinetic damping for the first half of the settle time, then runs free.
"""
from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from tensegrity_engine.physics.config import RobotConfig, robot_to_yaml
from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin, nominal_commands
from tensegrity_engine.groundtruth.realisation import Realisation
from tensegrity_engine.physics.state import (ANG_VEL, LIN_VEL, POS, QUAT, center_of_mass, end_nodes, initial_rod_state,
                    quat_conjugate, quat_from_z_to, quat_multiply, quat_rotate)

__all__ = [
    "NONCONTACT_FIXED_ROD", "contact_twin", "noncontact_twin", "rest_pose", "hanging_pose",
    "random_commands", "random_forces", "sample_noncontact_episode", "sample_contact_episode",
    "lowest_point", "rolling_velocity", "face_down_pose",
]

NONCONTACT_FIXED_ROD = 0
HOLD_RANGE = (0.1, 0.5)          # s, hold time of piecewise-constant commands / forces
SPEED_RANGE = (0.5, 2.0)         # m/s, initial CoM speed of contact episodes
FORCE_SCALE = 1.0                # max external force, in rod weights

_CACHE: dict = {}


def _key(robot: RobotConfig, *extra) -> str:
    """Cache key of a settled pose: the whole robot description and the settling options."""
    return hashlib.sha1((robot_to_yaml(robot) + repr(extra)).encode()).hexdigest()


def contact_twin(robot: RobotConfig, *, nthread: int = 2, realisation: Optional[Realisation] = None) -> MujocoTwin:
    """Ground truth for the contact environment: floor, all rods free (``realisation``:
    how MuJoCo realises the robot; default the engine's twin)."""
    return MujocoTwin(robot, floor=True, nthread=nthread, realisation=realisation)


def noncontact_twin(robot: RobotConfig, *, nthread: int = 2, realisation: Optional[Realisation] = None) -> MujocoTwin:
    """Ground truth for the non-contact environment: no floor, rod 0 welded to the world."""
    return MujocoTwin(robot, floor=False, fixed_rods=(NONCONTACT_FIXED_ROD,), nthread=nthread,
                      realisation=realisation)


def lowest_point(robot: RobotConfig, rod_state) -> float:
    """Lowest z of the rod capsules of a state [R, 13]."""
    nodes = end_nodes(np.asarray(rod_state), 0.5 * robot.rod_length)
    return float((nodes[..., 2].min(axis=-1) - robot.rod_radius).min())


def _settle(twin: MujocoTwin, state: np.ndarray, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """Hold nominal commands for ``seconds``. The first half uses kinetic damping (dynamic
    relaxation: all velocities are zeroed whenever the kinetic energy passes a peak), which
    removes slow, lightly damped modes (e.g. the 3-bar's ~3 s swing when hanging); the
    second half runs free, so the returned state is a genuine MuJoCo state at rest."""
    import mujoco

    robot = twin.robot
    act = nominal_commands(robot)
    steps = max(1, int(round(seconds / robot.dt)))
    twin.reset(state, act)
    m, d = twin.model, twin.data
    mv = np.zeros(m.nv)
    prev = 0.0
    for _ in range(steps // 2):
        twin.step(act)
        mujoco.mj_mulM(m, d, mv, d.qvel)
        ke = 0.5 * float(d.qvel @ mv)
        if ke < prev:
            d.qvel[:] = 0.0
            ke = 0.0
        prev = ke
    twin.step(act, nsteps=steps - steps // 2)
    return twin.get_state()


def _hull_down_normals(points: np.ndarray) -> np.ndarray:
    """Outward unit normals [F, 3] of the convex-hull facets of a small point set."""
    n = len(points)
    normals = []
    scale = np.abs(points).max() + 1e-12
    for i in range(n):
        for j in range(i + 1, n):
            for k in range(j + 1, n):
                nrm = np.cross(points[j] - points[i], points[k] - points[i])
                if np.linalg.norm(nrm) < 1e-9 * scale**2:
                    continue
                nrm /= np.linalg.norm(nrm)
                side = (points - points[i]) @ nrm
                tol = 1e-9 * scale
                if np.all(side <= tol):
                    normals.append(nrm)
                elif np.all(side >= -tol):
                    normals.append(-nrm)
    return np.array(normals)


def face_down_pose(robot: RobotConfig) -> np.ndarray:
    """Config pose [R, 13] rotated about its CoM so that the convex-hull facet of the end
    nodes that points most nearly downwards faces straight down (a stable resting face;
    SUPERball's config pose would otherwise balance on an edge)."""
    state = initial_rod_state(robot)
    normals = _hull_down_normals(robot.rod_end_nodes.reshape(-1, 3))
    down = normals[np.argmin(normals[:, 2])] if len(normals) else np.array([0.0, 0.0, -1.0])
    # rotation taking `down` onto -z: z -> down inverted, then pi about x (z -> -z).
    to_z = quat_conjugate(quat_from_z_to(down))
    rot = quat_multiply(np.array([0.0, 1.0, 0.0, 0.0]), to_z)
    com = center_of_mass(state, robot.rod_mass)
    rot_b = np.broadcast_to(rot, state[:, QUAT].shape)
    state[:, POS] = com + quat_rotate(rot_b, state[:, POS] - com)
    state[:, QUAT] = quat_multiply(rot_b, state[:, QUAT])
    return state


def rest_pose(robot: RobotConfig, *, settle_time: float = 3.0,
              realisation: Optional[Realisation] = None) -> tuple[np.ndarray, np.ndarray]:
    """(rod_state [R, 13], act [A]) of the robot resting on the floor at nominal commands.

    The config pose, turned onto its lowest convex-hull face (`face_down_pose`), is lifted
    so that its lowest capsule point is 1 cm above the ground, dropped and settled for
    ``settle_time`` s (`_settle`). Cached per robot in-process (copies returned).
    """
    key = _key(robot, "rest", float(settle_time), realisation)
    if key not in _CACHE:
        state = face_down_pose(robot)
        state[:, 2] += robot.contact.ground_height + 0.01 - lowest_point(robot, state)
        with MujocoTwin(robot, floor=True, nthread=1, realisation=realisation) as twin:
            _CACHE[key] = _settle(twin, state, settle_time)
    rs, act = _CACHE[key]
    return rs.copy(), act.copy()


def _hang_below(robot: RobotConfig, fixed_rod: int) -> np.ndarray:
    """Config pose [R, 13] rotated about the axis of ``fixed_rod`` (which maps that rod onto
    itself) so that the robot's CoM lies straight below the axis. Both end nodes of the
    fixed rod lie on the axis, so this rotation leaves every cable length unchanged: it is
    a hinge (zero-stiffness) mode, and the config pose of SUPERball would balance upside
    down on it (CoM above rod 0)."""
    state = initial_rod_state(robot)
    pivot = state[fixed_rod, POS]
    ends = robot.rod_end_nodes[fixed_rod]
    axis = (ends[1] - ends[0]) / np.linalg.norm(ends[1] - ends[0])
    d = center_of_mass(state, robot.rod_mass) - pivot
    d_perp = d - axis * (d @ axis)
    down = np.array([0.0, 0.0, -1.0])
    down_perp = down - axis * (down @ axis)
    if np.linalg.norm(d_perp) < 1e-12 or np.linalg.norm(down_perp) < 1e-12:
        return state
    angle = np.arctan2(np.cross(d_perp, down_perp) @ axis, d_perp @ down_perp)
    rot = np.concatenate([[np.cos(angle / 2)], np.sin(angle / 2) * axis])
    rot_b = np.broadcast_to(rot, state[:, QUAT].shape)
    state[:, POS] = pivot + quat_rotate(rot_b, state[:, POS] - pivot)
    state[:, QUAT] = quat_multiply(rot_b, state[:, QUAT])
    state[fixed_rod] = initial_rod_state(robot)[fixed_rod]
    return state


def hanging_pose(robot: RobotConfig, *, settle_time: float = 2.0,
                 realisation: Optional[Realisation] = None) -> tuple[np.ndarray, np.ndarray]:
    """(rod_state, act) of the robot hanging from rod 0 (welded at its config pose, no
    floor, gravity on): the config pose swung about rod 0's axis until the CoM is below
    it (`_hang_below`), relaxed for ``settle_time`` s at nominal commands. Cached."""
    key = _key(robot, "hang", float(settle_time), realisation)
    if key not in _CACHE:
        with noncontact_twin(robot, nthread=1, realisation=realisation) as twin:
            _CACHE[key] = _settle(twin, _hang_below(robot, NONCONTACT_FIXED_ROD), settle_time)
    rs, act = _CACHE[key]
    return rs.copy(), act.copy()


def _piecewise_constant(rng: np.random.Generator, num_steps: int, dt: float, draw,
                        hold_range=HOLD_RANGE) -> np.ndarray:
    """[num_steps, ...] signal holding ``draw()`` values for hold times uniform in
    ``hold_range`` seconds (at least one step each)."""
    lo, hi = hold_range
    value = np.asarray(draw(), dtype=np.float64)
    out = np.empty((num_steps,) + value.shape)
    t = 0
    while t < num_steps:
        hold = max(1, int(round(rng.uniform(lo, hi) / dt)))
        out[t:t + hold] = value
        t += hold
        value = np.asarray(draw(), dtype=np.float64)
    return out


def random_commands(robot: RobotConfig, rng: np.random.Generator, num_steps: int, *,
                    hold_range=HOLD_RANGE) -> np.ndarray:
    """[S, A] piecewise-constant commands, uniform within each cable's command range."""
    lo, hi = robot.command_low, robot.command_high
    A = robot.num_actuated
    out = np.empty((num_steps, A))
    for a in range(A):
        out[:, a] = _piecewise_constant(rng, num_steps, robot.dt,
                                        lambda: rng.uniform(lo[a], hi[a]), hold_range)
    return out


def random_forces(robot: RobotConfig, rng: np.random.Generator, num_steps: int, *,
                  max_force: Optional[float] = None, fixed_rods=(NONCONTACT_FIXED_ROD,),
                  hold_range=HOLD_RANGE) -> np.ndarray:
    """[S, R, 6] piecewise-constant world forces at rod centres (torques 0; fixed rods 0)."""
    if max_force is None:
        max_force = FORCE_SCALE * float(robot.rod_mass.max()) * float(np.linalg.norm(robot.gravity))

    def draw():
        d = rng.normal(size=3)
        return d / np.linalg.norm(d) * rng.uniform(0.0, max_force)

    out = np.zeros((num_steps, robot.num_rods, 6))
    for r in range(robot.num_rods):
        if r in fixed_rods:
            continue
        out[:, r, :3] = _piecewise_constant(rng, num_steps, robot.dt, draw, hold_range)
    return out


def sample_noncontact_episode(robot: RobotConfig, rng: np.random.Generator, num_steps: int, *,
                              max_force: Optional[float] = None, hold_range=HOLD_RANGE,
                              settle_time: float = 2.0, realisation: Optional[Realisation] = None):
    """Robot hanging from rod 0 (no floor): random commands and random external forces.

    Returns rod_state0 [R, 13], act0 [A], commands [S, A], wrenches [S, R, 6]; use with
    ``noncontact_twin(robot)``.
    """
    state, act = hanging_pose(robot, settle_time=settle_time, realisation=realisation)
    commands = random_commands(robot, rng, num_steps, hold_range=hold_range)
    wrenches = random_forces(robot, rng, num_steps, max_force=max_force, hold_range=hold_range)
    return state, act, commands, wrenches


def rolling_velocity(robot: RobotConfig, state: np.ndarray, velocity) -> np.ndarray:
    """State [R, 13] with the rigid-body velocity of rolling at CoM velocity ``velocity``
    (horizontal, [3]) about the CoM: omega = (z x v) / h, v_rod = v + omega x (p - com)."""
    state = np.array(state, dtype=np.float64, copy=True)
    v = np.asarray(velocity, dtype=np.float64)
    com = center_of_mass(state, robot.rod_mass)
    height = com[2] - robot.contact.ground_height
    omega = np.cross([0.0, 0.0, 1.0], v) / height
    state[:, LIN_VEL] = v + np.cross(omega, state[:, POS] - com)
    state[:, ANG_VEL] = omega
    return state


def sample_contact_episode(robot: RobotConfig, rng: np.random.Generator, num_steps: int, *,
                           speed_range=SPEED_RANGE, randomize_commands: bool = False,
                           hold_range=HOLD_RANGE, settle_time: float = 3.0,
                           realisation: Optional[Realisation] = None):
    """Robot launched from its rest pose at a random horizontal CoM speed, rolling.

    Returns rod_state0 [R, 13], act0 [A], commands [S, A] (nominal, or random when
    ``randomize_commands``); use with ``contact_twin(robot)``.
    """
    state, act = rest_pose(robot, settle_time=settle_time, realisation=realisation)
    speed = rng.uniform(*speed_range)
    heading = rng.uniform(0.0, 2.0 * np.pi)
    v = speed * np.array([np.cos(heading), np.sin(heading), 0.0])
    state = rolling_velocity(robot, state, v)
    if randomize_commands:
        commands = random_commands(robot, rng, num_steps, hold_range=hold_range)
    else:
        commands = np.broadcast_to(nominal_commands(robot), (num_steps, robot.num_actuated)).copy()
    return state, act, commands
