"""MuJoCo ground truth ("twin") generated from the same `RobotConfig` as the engine.

Model (see `build_mjcf`):

* every rod is a body at its centre, body z = rod axis (end 0 -> end 1), with a capsule
  geom of half-length L/2 and the config radius, an explicit ``<inertial>`` equal to
  ``robot.rod_inertia()`` (engine and twin share mass and inertia exactly), a free joint
  (or none: welded to the world, for rods in ``fixed_rods``) and a site on each end node;
* every cable is a spatial tendon between two end-node sites, driven by a ``general``
  actuator realising a tension-only spring-damper with an actuated rest length::

      force = clamp(K*(gain*act + offset - l) - c*ldot, -1e9, 0)      (MuJoCo sign)
      T     = -force = max(0, K*(l - l0) + c*ldot),  l0 = gain*act + offset

  actuated cables use ``filterexact`` activation dynamics (time constant tau), so ``act``
  is the filtered command; MuJoCo's default ``actearly=false`` means the force of a step
  uses the activation at the *start* of the step, and the activation is then advanced
  exactly: ``act' = act + (ctrl - act) * (1 - exp(-dt/tau))``. Commands and activations
  are clamped to ``command_range`` (ctrllimited / actlimited). Passive cables have no
  activation and a fixed rest length.
* actuators are ordered: actuated cables (config order) first, then passive ones, so
  ``ctrl[:A]`` are the commands and ``act[:A]`` the filtered commands.
* contacts use MuJoCo's *default* soft-constraint model (solref/solimp defaults,
  pyramidal cone, Newton solver). This deliberately differs from the engine's penalty
  spring-damper + smooth Coulomb model: the mismatch between the two is the premise of
  the system-identification experiments, so do not "tune" one to the other here.
  Friction is (sliding, torsional, rolling) from the config on floor and rods alike
  (MuJoCo's torsional and rolling coefficients are lengths in metres); condim 6 when
  torsional or rolling friction is non-zero, else 3. Rod-rod contacts are enabled iff
  ``contact.rod_rod`` (contype/conaffinity bits, no ``<exclude>``); all rod pairs may
  collide, including pairs joined by cables.

Integration: MuJoCo's default semi-implicit ``Euler`` at the config step (1 ms), the
integrator the paper's MuJoCo model used; with no contact it is the same scheme as the
engine's ``semi_implicit`` integrator, so MuJoCo's and the engine's non-contact physics
agree to round-off at equal parameters (tested). ``implicitfast`` would add implicit cable
damping that the identified parameters would then have to absorb.

State conversion: the engine's rod state is ``[..., R, 13]`` = (p, q wxyz, v world,
omega world) (see `state.py`); a free joint stores (p, q, v world, omega *body*), so
angular velocities are rotated on the way in and out. Rods welded to the world have no
joint; `rod_state_from` fills them with their config pose and zero velocity.

The task environments of the paper (rest pose, non-contact and contact episode samplers)
live in `environments.py`.
"""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from typing import Iterable, Optional, Sequence

import mujoco
import mujoco.rollout
import numpy as np

from tensegrity_engine.groundtruth.realisation import Realisation, RestLengthDriver, driven, rod_inertia
from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.physics.state import ANG_VEL, LIN_VEL, POS, QUAT, STATE_DIM, canonical_quat, initial_rod_state

__all__ = ["build_mjcf", "MujocoTwin", "GroundTruthDiverged", "MujocoGroundChecker", "nominal_commands", "FULLPHYSICS"]

MAX_SPEED = 100.0    # m/s: no rod of a robot moves this fast; MuJoCo has diverged


class GroundTruthDiverged(RuntimeError):
    """The MuJoCo ground truth blew up: its robot definition is not simulable as given."""


FULLPHYSICS = int(mujoco.mjtState.mjSTATE_FULLPHYSICS.value)
_RESETS = tuple(int(w.value) for w in (mujoco.mjtWarning.mjWARN_BADQACC, mujoco.mjtWarning.mjWARN_BADQPOS,
                                        mujoco.mjtWarning.mjWARN_BADQVEL))
_CTRL = int(mujoco.mjtState.mjSTATE_CTRL.value)
_XFRC = int(mujoco.mjtState.mjSTATE_XFRC_APPLIED.value)
# Floats of rollout output held at once (the rollout returns every step; batches are
# processed in chunks so that record_every > 1 does not need B*S*nstate memory).
_ROLLOUT_BUFFER_FLOATS = 16_000_000


def _f(x: float) -> str:
    return repr(float(x))


def _vec(xs: Iterable[float]) -> str:
    return " ".join(_f(x) for x in xs)


def nominal_commands(robot: RobotConfig) -> np.ndarray:
    """(A,) command that holds every actuated cable at its config rest length."""
    idx = robot.actuated_indices
    return (robot.cable_rest_length[idx] - robot.actuator.offset) / robot.actuator.gain


def _actuator_order(robot: RobotConfig) -> np.ndarray:
    """Config cable index of each actuator: actuated cables first, then passive ones."""
    return np.concatenate([robot.actuated_indices, np.flatnonzero(~robot.cable_actuated)])


def build_mjcf(robot: RobotConfig, *, fixed_rods: Sequence[int] = (), floor: bool = True,
               rod_state: Optional[np.ndarray] = None, realisation: Optional[Realisation] = None) -> str:
    """MJCF text of the robot. ``rod_state`` ([R, 13], optional) overrides the body poses
    (default: the config pose); for rods in ``fixed_rods`` that pose is welded to the world.
    ``realisation`` (default: the twin) chooses the integrator, contacts, slack damping,
    actuation and rod inertia (`realisation.py`)."""
    real = Realisation.twin_of(robot) if realisation is None else realisation
    R = robot.num_rods
    fixed = {int(i) for i in fixed_rods}
    if any(not 0 <= i < R for i in fixed):
        raise ValueError(f"fixed_rods {sorted(fixed)} out of range 0..{R - 1}")
    pose = initial_rod_state(robot) if rod_state is None else np.asarray(rod_state, np.float64)
    # an end-heavy realisation replaces the config's inertia factor
    inertia = (robot.rod_inertia() if real.end_mass_fraction == 0.0 else
               rod_inertia(robot.rod_mass, robot.rod_radius, robot.rod_length, real.end_mass_fraction))
    fr = robot.contact.friction
    friction = _vec([fr.sliding, fr.torsional, fr.rolling])
    condim = str(real.contact.condim) if real.contact.condim else (
        "6" if (fr.torsional > 0 or fr.rolling > 0) else "3")
    contact_attrs = {"condim": condim, "friction": friction}
    if real.contact.solref is not None:
        contact_attrs["solref"] = _vec(real.contact.solref)
    if real.contact.solimp is not None:
        contact_attrs["solimp"] = _vec(real.contact.solimp)
    # Collision bits: rod-rod on -> everything is 1/1; off -> rods only meet the floor.
    if robot.contact.rod_rod:
        rod_bits, floor_bits = ("1", "1"), ("1", "1")
    else:
        rod_bits, floor_bits = ("2", "1"), ("1", "2")

    root = ET.Element("mujoco", model=robot.name)
    ET.SubElement(root, "compiler", angle="radian", autolimits="true")
    ET.SubElement(root, "option", timestep=_f(robot.dt / real.substeps), integrator=real.integrator,
                  cone=real.contact.cone, gravity=_vec(robot.gravity))
    world = ET.SubElement(root, "worldbody")
    if floor:
        ET.SubElement(world, "geom", name="floor", type="plane", size="0 0 1",
                      pos=_vec([0.0, 0.0, robot.contact.ground_height]), **contact_attrs,
                      contype=floor_bits[0], conaffinity=floor_bits[1])
    for r in range(R):
        half = 0.5 * robot.rod_length[r]
        body = ET.SubElement(world, "body", name=f"rod{r}", pos=_vec(pose[r, POS]),
                             quat=_vec(pose[r, QUAT]))
        ET.SubElement(body, "inertial", pos="0 0 0", mass=_f(robot.rod_mass[r]),
                      diaginertia=_vec(inertia[r]))
        if r not in fixed:
            ET.SubElement(body, "freejoint", name=f"rod{r}_free")
        ET.SubElement(body, "geom", name=f"rod{r}_capsule", type="capsule",
                      size=_vec([robot.rod_radius[r], half]), **contact_attrs,
                      contype=rod_bits[0], conaffinity=rod_bits[1], mass="0")
        for end, z in ((0, -half), (1, half)):
            ET.SubElement(body, "site", name=f"rod{r}_end{end}", pos=_vec([0.0, 0.0, z]),
                          size=_f(robot.rod_radius[r] * 0.5))
    kind = real.actuation.kind
    tendon_spring = kind == "spring_length"
    tendon = ET.SubElement(root, "tendon")
    # The share of the damping acting taut or slack is the tendon's own damping; the rest is
    # the tension-only actuator's.
    slack_share = np.ones(robot.num_cables) if real.slack_damping else robot.cable_slack_damping
    for c in range(robot.num_cables):
        sp_attrs = dict(name=f"cable{c}", width="0.005", damping=_f(slack_share[c] * robot.cable_damping[c]))
        if tendon_spring:     # dead band [0, l0]: pulls back only past the rest length
            sp_attrs.update(stiffness=_f(robot.cable_stiffness[c]),
                            springlength=_vec([0.0, robot.cable_rest_length[c]]))
        sp = ET.SubElement(tendon, "spatial", **sp_attrs)
        for rod, end in robot.cable_ends[c]:
            ET.SubElement(sp, "site", site=f"rod{int(rod)}_end{int(end)}")
    actuator = ET.SubElement(root, "actuator")
    g, off, tau = robot.actuator.gain, robot.actuator.offset, robot.actuator.time_constant
    for c in _actuator_order(robot):
        K = 0.0 if tendon_spring else robot.cable_stiffness[c]
        damp = (1.0 - slack_share[c]) * robot.cable_damping[c]
        attrs = dict(name=f"act_cable{c}", tendon=f"cable{c}", gaintype="fixed",
                     biastype="affine", forcelimited="true", forcerange="-1e9 0")
        if robot.cable_actuated[c]:
            lo, hi = robot.cable_command_range[c]
            attrs.update(gainprm=_f(K * g), biasprm=_vec([K * off, -K, -damp]),
                         actlimited="true", actrange=_vec([lo, hi]))
            if not driven(robot, real):
                attrs.update(dyntype="filterexact", dynprm=_f(tau), ctrllimited="true",
                             ctrlrange=_vec([lo, hi]))
            else:             # act integrates a rate set each step by `RestLengthDriver`
                speed = real.actuation.max_speed / g
                attrs.update(dyntype="integrator", ctrllimited=str(math.isfinite(speed)).lower())
                if math.isfinite(speed):
                    attrs["ctrlrange"] = _vec([-speed, speed])
        else:
            attrs.update(dyntype="none", gainprm="0",
                         biasprm=_vec([K * robot.cable_rest_length[c], -K, -damp]),
                         ctrllimited="false")
        ET.SubElement(actuator, "general", **attrs)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode")


def _rotate(q: np.ndarray, v: np.ndarray, inverse: bool = False) -> np.ndarray:
    """Rotate v [..., 3] by unit quaternions q [..., 4] (wxyz), or by their inverse.
    Component arithmetic: several times faster than building matrices for big batches."""
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    if inverse:
        x, y, z = -x, -y, -z
    vx, vy, vz = v[..., 0], v[..., 1], v[..., 2]
    # t = 2 * (q_vec x v); v' = v + w t + q_vec x t
    tx = 2.0 * (y * vz - z * vy)
    ty = 2.0 * (z * vx - x * vz)
    tz = 2.0 * (x * vy - y * vx)
    out = np.empty(np.broadcast_shapes(q.shape[:-1], v.shape[:-1]) + (3,))
    out[..., 0] = vx + w * tx + (y * tz - z * ty)
    out[..., 1] = vy + w * ty + (z * tx - x * tz)
    out[..., 2] = vz + w * tz + (x * ty - y * tx)
    return out


def _state_offsets(model: mujoco.MjModel) -> dict[str, int]:
    """Offsets of the FULLPHYSICS components (they are stored in mjtState bit order)."""
    out, off = {}, 0
    for name in ("TIME", "QPOS", "QVEL", "ACT"):
        out[name] = off
        off += mujoco.mj_stateSize(model, int(getattr(mujoco.mjtState, f"mjSTATE_{name}").value))
    return out


class MujocoTwin:
    """MuJoCo model + data of a robot config, with rod-state conversion and rollouts.

    ``rod_state`` arrays follow `state.py`; ``act`` arrays are the A filtered commands
    (activations of the actuated cables, config order of the actuated cables).
    """

    def __init__(self, robot: RobotConfig, *, fixed_rods: Sequence[int] = (), floor: bool = True,
                 nthread: int = 2, realisation: Optional[Realisation] = None):
        if robot.actuator.delay:        # a robot played here must not silently lose its dead time
            raise ValueError(f"actuator.delay = {robot.actuator.delay} s: the MuJoCo twin plays no command "
                             "dead time; give the played robot's latency to its sensor model")
        self.robot = robot
        self.fixed_rods = tuple(sorted({int(i) for i in fixed_rods}))
        self.floor = floor
        self.realisation = Realisation.twin_of(robot) if realisation is None else realisation
        # Stepped actuations need Python between steps: no mujoco.rollout for them.
        self.driver = RestLengthDriver(robot, self.realisation) if driven(robot, self.realisation) else None
        self.xml = build_mjcf(robot, fixed_rods=self.fixed_rods, floor=floor, realisation=self.realisation)
        self.model = mujoco.MjModel.from_xml_string(self.xml)
        self.data = mujoco.MjData(self.model)
        R = robot.num_rods
        self.num_rods = R
        self.num_actuated = robot.num_actuated
        self.free_rods = np.array([r for r in range(R) if r not in self.fixed_rods], dtype=int)
        self.fixed_mask = np.zeros(R, dtype=bool)
        self.fixed_mask[list(self.fixed_rods)] = True
        self.body_ids = np.array([self.model.body(f"rod{r}").id for r in range(R)])
        self.actuator_cable = _actuator_order(robot)        # actuator -> config cable
        self.cable_actuator = np.argsort(self.actuator_cable)  # config cable -> actuator
        self.nstate = mujoco.mj_stateSize(self.model, FULLPHYSICS)
        self._off = _state_offsets(self.model)
        assert self.model.na == self.num_actuated and self.model.nu == robot.num_cables
        self._pose0 = initial_rod_state(robot)
        self.nthread = max(1, int(nthread))
        self._datas = [mujoco.MjData(self.model) for _ in range(self.nthread)]
        self._rollout = mujoco.rollout.Rollout(nthread=self.nthread if self.nthread > 1 else 0)
        self.reset(self._pose0, nominal_commands(robot))

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if getattr(self, "_rollout", None) is not None:
            self._rollout.close()
            self._rollout = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ conversion
    def mj_state_from(self, rod_state, act) -> np.ndarray:
        """[B, R, 13] or [R, 13] rod states + [B, A] or [A] activations -> [B, nstate]."""
        rs = np.asarray(rod_state, dtype=np.float64)
        rs = rs.reshape(-1, self.num_rods, STATE_DIM)
        a = np.asarray(act, dtype=np.float64).reshape(-1, self.num_actuated)
        B = max(rs.shape[0], a.shape[0])
        rs = np.broadcast_to(rs, (B,) + rs.shape[1:])
        a = np.broadcast_to(a, (B, self.num_actuated))
        free = rs[:, self.free_rods]                                   # [B, F, 13]
        q = free[..., QUAT]
        q = q / np.linalg.norm(q, axis=-1, keepdims=True)
        w_body = _rotate(q, free[..., ANG_VEL], inverse=True)            # R^T w
        out = np.zeros((B, self.nstate))
        F = len(self.free_rods)
        qpos = np.concatenate([free[..., POS], q], axis=-1).reshape(B, 7 * F)
        qvel = np.concatenate([free[..., LIN_VEL], w_body], axis=-1).reshape(B, 6 * F)
        o = self._off
        out[:, o["QPOS"]:o["QPOS"] + 7 * F] = qpos
        out[:, o["QVEL"]:o["QVEL"] + 6 * F] = qvel
        out[:, o["ACT"]:o["ACT"] + self.num_actuated] = a
        return out

    def rod_state_from(self, mj_state) -> tuple[np.ndarray, np.ndarray]:
        """[..., nstate] -> (rod_state [..., R, 13] with world omega, act [..., A])."""
        s = np.asarray(mj_state, dtype=np.float64)
        lead = s.shape[:-1]
        F, o = len(self.free_rods), self._off
        qpos = s[..., o["QPOS"]:o["QPOS"] + 7 * F].reshape(lead + (F, 7))
        qvel = s[..., o["QVEL"]:o["QVEL"] + 6 * F].reshape(lead + (F, 6))
        q = qpos[..., 3:7]
        if self.fixed_rods:
            out = np.zeros(lead + (self.num_rods, STATE_DIM))
            view = out[..., self.free_rods, :]        # fancy index: a copy, written back below
        else:
            out = np.empty(lead + (self.num_rods, STATE_DIM))
            view = out
        view[..., POS] = qpos[..., 0:3]
        view[..., QUAT] = canonical_quat(q)
        view[..., LIN_VEL] = qvel[..., 0:3]
        view[..., ANG_VEL] = _rotate(q, qvel[..., 3:6])
        if self.fixed_rods:
            out[..., self.free_rods, :] = view
            fixed = list(self.fixed_rods)
            out[..., fixed, :] = self._pose0[fixed]
            out[..., fixed, 3:7] = canonical_quat(self._pose0[fixed, 3:7])
        act = s[..., o["ACT"]:o["ACT"] + self.num_actuated].copy()
        return out, act

    # ------------------------------------------------------------------ rollouts
    def _control(self, commands: np.ndarray, wrench: Optional[np.ndarray]) -> tuple[np.ndarray, int]:
        B, S, _ = commands.shape
        nu = self.model.nu
        if wrench is None:
            ctrl = np.zeros((B, S, nu))
            ctrl[..., :self.num_actuated] = commands
            return ctrl, _CTRL
        nb = self.model.nbody
        ctrl = np.zeros((B, S, nu + 6 * nb))
        ctrl[..., :self.num_actuated] = commands
        xfrc = ctrl[..., nu:].reshape(B, S, nb, 6)
        w = np.array(wrench, dtype=np.float64, copy=True)
        w[..., self.fixed_mask, :] = 0.0
        xfrc[:, :, self.body_ids, :] = w
        return ctrl, _CTRL | _XFRC

    def rollout(self, rod_state0, act0, commands, external_wrench=None, *,
                record_every: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Open-loop batched rollout in `mujoco.rollout` (no per-step Python).

        rod_state0 [B, R, 13] (or [R, 13]), act0 [B, A] (or [A]), commands [B, S, A] (or
        [S, A]: target rest-length commands, clipped by MuJoCo to the command range),
        external_wrench [B, S, R, 6] (or [S, R, 6]) world force then torque at each rod
        centre, held over each step (ignored for fixed rods). Returns the states after
        steps record_every, 2*record_every, ...: (rod_states [B, S//k, R, 13],
        acts [B, S//k, A]).
        """
        k = int(record_every)
        if k < 1:
            raise ValueError("record_every must be >= 1")
        cmd = np.asarray(commands, dtype=np.float64)
        if cmd.ndim == 2:
            cmd = cmd[None]
        rs = np.asarray(rod_state0, dtype=np.float64).reshape(-1, self.num_rods, STATE_DIM)
        a0 = np.asarray(act0, dtype=np.float64).reshape(-1, self.num_actuated)
        wr = None if external_wrench is None else np.asarray(external_wrench, dtype=np.float64)
        if wr is not None and wr.ndim == 3:
            wr = wr[None]
        B = max(rs.shape[0], a0.shape[0], cmd.shape[0], 1 if wr is None else wr.shape[0])
        S = cmd.shape[1]
        cmd = np.broadcast_to(cmd, (B, S, self.num_actuated))
        if wr is not None:
            wr = np.broadcast_to(wr, (B, S, self.num_rods, 6))
        init = self.mj_state_from(np.broadcast_to(rs, (B,) + rs.shape[1:]),
                                  np.broadcast_to(a0, (B, self.num_actuated)))
        n_rec = S // k
        sub = self.realisation.substeps            # MuJoCo steps per step of dt, each input held
        S, kk = S * sub, k * sub                   # in MuJoCo's steps
        out_rs = np.empty((B, n_rec, self.num_rods, STATE_DIM))
        out_act = np.empty((B, n_rec, self.num_actuated))
        if S == 0:
            return out_rs, out_act
        # one episode's every state must fit the buffer (sub-steps multiply it: stiff_light's
        # 80 s at dt / 40 would be 2.8 GB); else step it in Python, keeping every k-th state
        if self.driver is not None or S * self.nstate > _ROLLOUT_BUFFER_FLOATS:
            self._stepped_rollout(init, cmd, wr, sub, kk, out_rs, out_act)
            return self._checked(rs, out_rs, k), out_act
        if sub > 1:
            cmd = np.repeat(cmd, sub, axis=1)
            wr = None if wr is None else np.repeat(wr, sub, axis=1)
        chunk = max(1, min(B, _ROLLOUT_BUFFER_FLOATS // max(1, S * self.nstate)))
        buf = np.empty((chunk, S, self.nstate))
        for b0 in range(0, B, chunk):
            b1 = min(B, b0 + chunk)
            ctrl, spec = self._control(cmd[b0:b1], None if wr is None else wr[b0:b1])
            st = buf[:b1 - b0]
            st, _ = self._rollout.rollout(self.model, self._datas, init[b0:b1], ctrl,
                                          control_spec=spec, nstep=S, state=st)
            rec = st[:, kk - 1:n_rec * kk:kk]
            out_rs[b0:b1], out_act[b0:b1] = self.rod_state_from(rec)
        return self._checked(rs, out_rs, k), out_act

    def _checked(self, rod_state0, rod_states, k: int):
        """``rod_states``, or `GroundTruthDiverged` when MuJoCo blew up: non-finite values,
        or speeds (state or between records) over MAX_SPEED. MuJoCo's answer to a bad
        acceleration is to reset the robot to its model pose, which looks finite."""
        start = np.broadcast_to(rod_state0[:, None, :, POS], rod_states[:, :1, :, POS].shape)
        pos = np.concatenate([start, rod_states[..., POS]], axis=1)
        jump = np.linalg.norm(np.diff(pos, axis=1), axis=-1).max(initial=0.0) / (k * self.robot.dt)
        speed = np.abs(rod_states[..., LIN_VEL]).max(initial=0.0)
        if not np.isfinite(rod_states).all() or max(jump, speed) > MAX_SPEED:
            raise GroundTruthDiverged(
                f"{self.robot.name}: MuJoCo diverged (speed {max(jump, speed):.3g} m/s > {MAX_SPEED} m/s) "
                f"with integrator {self.realisation.integrator} at dt {self.model.opt.timestep} s; a stiffer or "
                "more damped robot needs an implicit integrator or a smaller step")
        return rod_states

    def _stepped_rollout(self, init, cmd, wr, sub, k, out_rs, out_act):
        """`rollout` in a Python loop, one episode after another: for stepped actuations, and
        for episodes whose every state would not fit the rollout buffer. Each input (per step
        of dt) is held over ``sub`` MuJoCo steps; ``k``: MuJoCo steps per record."""
        S = cmd.shape[1] * sub
        d = mujoco.MjData(self.model)
        state = np.empty(self.nstate)
        for b in range(len(init)):
            mujoco.mj_setState(self.model, d, init[b], FULLPHYSICS)
            d.xfrc_applied[:] = 0.0
            d.ctrl[:] = 0.0
            for s in range(S):
                if wr is not None:
                    self._set_wrench(d, wr[b, s // sub])
                if self.driver is None:
                    d.ctrl[:self.num_actuated] = cmd[b, s // sub]
                else:
                    self.driver.before_step(self.model, d, cmd[b, s // sub])
                mujoco.mj_step(self.model, d)
                if (s + 1) % k == 0 and (s + 1) // k <= out_rs.shape[1]:
                    mujoco.mj_getState(self.model, d, state, FULLPHYSICS)
                    out_rs[b, (s + 1) // k - 1], out_act[b, (s + 1) // k - 1] = self.rod_state_from(state)
        return out_rs, out_act

    def _set_wrench(self, data, wrench) -> None:
        w = np.array(wrench, dtype=np.float64, copy=True).reshape(self.num_rods, 6)
        w[self.fixed_mask] = 0.0
        data.xfrc_applied[self.body_ids] = w

    # ------------------------------------------------------------------ live stepping
    def reset(self, rod_state, act) -> None:
        """Reset ``self.data`` to a rod state ([R, 13]) and activations ([A])."""
        mujoco.mj_resetData(self.model, self.data)
        mujoco.mj_setState(self.model, self.data, self.mj_state_from(rod_state, act)[0], FULLPHYSICS)
        act = np.asarray(act, dtype=np.float64).reshape(-1)
        if self.driver is None:
            self.data.ctrl[:self.num_actuated] = act
        else:
            self.driver.before_step(self.model, self.data, act)
        mujoco.mj_forward(self.model, self.data)

    def step(self, command, wrench=None, nsteps: int = 1) -> None:
        """Hold command [A] (and wrench [R, 6], world force/torque at rod centres) for nsteps.
        `GroundTruthDiverged` if MuJoCo hit a bad acceleration on the way (it would
        otherwise reset the robot to its model pose and carry on)."""
        command = np.asarray(command, dtype=np.float64).reshape(-1)
        self.data.ctrl[:] = 0.0
        self.data.xfrc_applied[:] = 0.0
        if wrench is not None:
            self._set_wrench(self.data, wrench)
        before = [self.data.warning[w].number for w in _RESETS]
        t0 = self.data.time
        if self.driver is not None:
            self.driver.step(self.model, self.data, command, int(nsteps) * self.realisation.substeps)
        else:
            self.data.ctrl[:self.num_actuated] = command
            mujoco.mj_step(self.model, self.data, nstep=int(nsteps) * self.realisation.substeps)
        # A reset restarts the clock and may leave a warning count at 1: any change is one.
        if [self.data.warning[w].number for w in _RESETS] != before or self.data.time < t0:
            raise GroundTruthDiverged(
                f"{self.robot.name}: MuJoCo diverged after t={t0:.3f} s (bad acceleration, position or "
                f"velocity) with integrator {self.realisation.integrator}; it reset the robot to its model pose")

    def get_state(self) -> tuple[np.ndarray, np.ndarray]:
        """(rod_state [R, 13], act [A]) of ``self.data``."""
        s = np.empty(self.nstate)
        mujoco.mj_getState(self.model, self.data, s, FULLPHYSICS)
        return self.rod_state_from(s)

    @property
    def time(self) -> float:
        return float(self.data.time)

    # ------------------------------------------------------------------ diagnostics
    def cable_tensions(self, rod_state, act) -> np.ndarray:
        """Tension (N, >= 0) of every cable in config order ([C]; [B, C] for batched input)."""
        states = self.mj_state_from(rod_state, act)
        d = mujoco.MjData(self.model)
        out = np.empty((states.shape[0], self.robot.num_cables))
        m = self.model
        for b, s in enumerate(states):
            mujoco.mj_setState(m, d, s, FULLPHYSICS)
            if self.driver is not None:
                self.driver.before_step(m, d, d.act[:self.num_actuated])
            mujoco.mj_forward(m, d)
            out[b, self.actuator_cable] = -d.actuator_force
            # Tendon springs (dead band [0, l0]) and tendon damping, where the realisation has them.
            stretch = np.maximum(d.ten_length - m.tendon_lengthspring[:, 1], 0.0)
            out[b] += m.tendon_stiffness * stretch + m.tendon_damping * d.ten_velocity
        single = np.asarray(rod_state).ndim == 2 and np.asarray(act).ndim == 1
        return out[0] if single else out

    def rest_lengths(self, act) -> np.ndarray:
        """Rest lengths (m) of every cable in config order ([..., C]) at actuator states [..., A]
        (the actuated cables in config order): what a winch's encoder reads."""
        robot = self.robot
        act = np.asarray(act, dtype=np.float64)
        out = np.broadcast_to(robot.cable_rest_length, act.shape[:-1] + (robot.num_cables,)).copy()
        out[..., robot.actuated_indices] = robot.actuator.gain * act + robot.actuator.offset
        return out

    def cable_lengths(self, rod_state) -> np.ndarray:
        """Cable lengths [C] (config order) of a rod state [R, 13] (tendon lengths)."""
        d = mujoco.MjData(self.model)
        state = self.mj_state_from(rod_state, nominal_commands(self.robot))[0]
        mujoco.mj_setState(self.model, d, state, FULLPHYSICS)
        mujoco.mj_forward(self.model, d)
        return d.ten_length.copy()


class MujocoGroundChecker:
    """MuJoCo's (non-differentiable) rod-floor collision check as the engine's
    ``ground_contact_fn`` (identification ablation (c), paper Section IV-A3).

    ``checker(nodes, radius)``: end nodes [..., 3, 2R] (engine layout: node 2r+e, e = 0 at
    the -L/2 end of rod r) -> per-node penetration depth [..., 2R] (``-dist`` of MuJoCo's
    capsule-plane contact at that end, 0 where there is none). One ``mj_kinematics`` +
    ``mj_collision`` per batch element, in a Python loop: that per-state cost on the CPU
    is what the ablation measures. The rod poses are rebuilt from the nodes (centre and
    axis; the spin about the axis does not matter for a capsule). Rods in ``fixed_rods``
    are welded at their config pose, as in `MujocoTwin`. ``radius`` is unused (the model
    carries the config radii).
    """

    def __init__(self, robot: RobotConfig, *, fixed_rods: Sequence[int] = ()):
        self.robot = robot
        fixed = tuple(sorted({int(i) for i in fixed_rods}))
        self.model = mujoco.MjModel.from_xml_string(build_mjcf(robot, fixed_rods=fixed, floor=True))
        self.data = mujoco.MjData(self.model)
        R = robot.num_rods
        self.num_rods = R
        self.free_rods = np.array([r for r in range(R) if r not in fixed], dtype=int)
        self.floor_id = self.model.geom("floor").id
        self.geom_rod = np.full(self.model.ngeom, -1, dtype=int)
        for r in range(R):
            self.geom_rod[self.model.geom(f"rod{r}_capsule").id] = r
        self.calls = 0                       # collision queries (states) so far
        self.seconds = 0.0                   # time spent in them

    def rod_qpos(self, nodes: np.ndarray) -> np.ndarray:
        """[B, 3, 2R] end nodes -> [B, 7F] free-joint qpos (centre, quaternion wxyz)."""
        n0, n1 = nodes[..., 0::2], nodes[..., 1::2]                     # [B, 3, R]
        centre = np.swapaxes(0.5 * (n0 + n1), -1, -2)                    # [B, R, 3]
        a = np.swapaxes(n1 - n0, -1, -2)
        a = a / np.linalg.norm(a, axis=-1, keepdims=True)
        # Shortest rotation e_z -> a: q = (1 + a_z, e_z x a) normalised; a = -e_z: 180 deg about x.
        q = np.stack([1.0 + a[..., 2], -a[..., 1], a[..., 0], np.zeros_like(a[..., 0])], -1)
        flip = q[..., 0] < 1e-9
        q[flip] = (0.0, 1.0, 0.0, 0.0)
        q = q / np.linalg.norm(q, axis=-1, keepdims=True)
        return np.concatenate([centre, q], -1)[:, self.free_rods].reshape(len(nodes), -1)

    def __call__(self, nodes, radius=None) -> np.ndarray:
        import time

        t0 = time.perf_counter()
        X = np.asarray(nodes, dtype=np.float64)
        lead, n = X.shape[:-2], X.shape[-1]
        if X.shape[-2] != 3 or n != 2 * self.num_rods:
            raise ValueError(f"nodes must be [..., 3, {2 * self.num_rods}], got {X.shape}")
        Xf = X.reshape(-1, 3, n)
        qpos = self.rod_qpos(Xf)
        depth = np.zeros((len(Xf), n))
        m, d = self.model, self.data
        for b in range(len(Xf)):
            d.qpos[:] = qpos[b]
            mujoco.mj_kinematics(m, d)
            mujoco.mj_collision(m, d)
            nc = d.ncon
            if not nc:
                continue
            con = d.contact
            g1, g2, dist = con.geom1[:nc], con.geom2[:nc], con.dist[:nc]
            floor = (g1 == self.floor_id) | (g2 == self.floor_id)
            if not floor.any():
                continue
            rod = self.geom_rod[np.where(g1 == self.floor_id, g2, g1)[floor]]
            pos = con.pos[:nc][floor]
            # Nearest end node of the rod to the contact point.
            e0 = Xf[b][:, 2 * rod].T                                     # [k, 3]
            e1 = Xf[b][:, 2 * rod + 1].T
            end = (np.linalg.norm(pos - e1, axis=-1) < np.linalg.norm(pos - e0, axis=-1)).astype(int)
            node = 2 * rod + end
            np.maximum.at(depth[b], node, -dist[floor])
        self.calls += len(Xf)
        self.seconds += time.perf_counter() - t0
        return depth.reshape(lead + (n,))
