"""The peer: what a roboticist who skips this package does with the same data (issue 18).

They write a MuJoCo model of the robot (here: this package's own MJCF of the robot config,
the best start such a user could have) and fit it with MuJoCo's ``mujoco.sysid``
(parameters as spec modifiers, bounded Levenberg-Marquardt over ``mujoco.rollout`` with
finite-difference Jacobians), used carefully:

* windows of ``WINDOW`` s, each started from the recorded state (a whole 5 s trajectory is
  chaotic on the floor and drifts when hanging; `mujoco.sysid`'s default use fits those);
* a rotation-safe residual: every rod end's position (``framepos`` sensors on the end sites),
  not quaternion components;
* known external pushes fed to the rollout, as world-frame force actuators at the rod centres;
* each positive parameter fitted as the log of its ratio to the nominal value, inside the
  same broad bounds this package uses (`physics.params.PARAM_SPECS`);
* hanging: cable stiffness, damping, rod mass and the motor time constant; rolling (from the
  hanging fit): sliding friction and MuJoCo's contact time constant (``solref[0]``);
* the integrator is the user's choice: the bench fits with every one in ``INTEGRATORS``.

The initial activation of a window (the filtered command, which no sensor sees) is the
nominal motor filter run over the recorded commands, as the package's own k-step-ahead
evaluation does with its model. `mujoco.sysid` needs MuJoCo's ``sysid`` extras (absl-py,
scipy, ...): ``pip install -r bench/requirements-peer.txt``; `sysid_module` says so when
they are missing (``import mujoco.sysid`` alone then silently exposes nothing).
"""
from __future__ import annotations

import contextlib
import io
import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import mujoco
import mujoco.rollout
import numpy as np

from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin, build_mjcf
from tensegrity_engine.groundtruth.realisation import Realisation
from tensegrity_engine.identification.evaluation import filtered_commands
from tensegrity_engine.physics.params import SPEC_BY_NAME, PhysicalParameters
from tensegrity_engine.physics.state import end_nodes, initial_rod_state

REQUIREMENTS = "bench/requirements-peer.txt"
WINDOW = 1.0                      # s, fitting windows, each from the recorded state
INTEGRATORS = ("Euler", "implicitfast")
FIT = {"noncontact": ("cable_stiffness", "cable_damping", "rod_mass", "actuator_time_constant"),
       "contact": ("friction_sliding", "contact_timeconst")}
CONTACT_TIMECONST = (0.002, 0.2, 0.02)      # s: bounds and MuJoCo's default solref[0]


def sysid_module():
    """(mujoco.sysid, "") or (None, why it cannot be used)."""
    try:
        import mujoco.sysid as sysid
    except ImportError as err:
        return None, f"mujoco.sysid not importable ({err}); pip install -r {REQUIREMENTS}"
    if not hasattr(sysid, "optimize"):        # its __init__ swallows the missing extras
        try:
            from mujoco.sysid._src import optimize  # noqa: F401
            reason = "unknown"
        except ImportError as err:
            reason = str(err)
        return None, f"mujoco.sysid's extras are missing ({reason}); pip install -r {REQUIREMENTS}"
    return sysid, ""


@dataclass
class Window:
    state: np.ndarray             # [nstate] MuJoCo FULLPHYSICS
    control: np.ndarray           # [S + 2, nu] per 1 ms step (S + 1 steps: sensors lag a step; the last
                                  # row only closes mujoco.sysid's control series)
    times: np.ndarray             # [K] measurement times inside the window (s from its start)
    ends: np.ndarray              # [K, 6R] recorded rod end positions
    com: np.ndarray               # [K, 3] recorded CoM


class PeerModel:
    """The user's MuJoCo model: the config's MJCF plus end-position sensors and push actuators."""

    def __init__(self, robot, *, floor: bool, fixed_rods: Sequence[int], integrator: str):
        self.robot = robot
        self.floor, self.fixed_rods = floor, tuple(fixed_rods)
        xml = build_mjcf(robot, fixed_rods=self.fixed_rods, floor=floor, realisation=Realisation(integrator=integrator))
        self.spec = mujoco.MjSpec.from_string(xml)
        R = robot.num_rods
        self.free = [r for r in range(R) if r not in self.fixed_rods]
        self.spec.worldbody.add_site(name="world_origin", pos=[0, 0, 0])
        for r in range(R):
            self.spec.body(f"rod{r}").add_site(name=f"rod{r}_centre", pos=[0, 0, 0])
        for r in self.free:                  # a welded rod tells nothing (and its constant columns break
            for e in (0, 1):                 # mujoco.sysid's per-column normalisation)
                self.spec.add_sensor(name=f"rod{r}_end{e}_pos", type=mujoco.mjtSensor.mjSENS_FRAMEPOS,
                                     objtype=mujoco.mjtObj.mjOBJ_SITE, objname=f"rod{r}_end{e}")
        for r in self.free:                  # known pushes: a world-frame force at each free rod's centre
            for k in range(3):
                gear = [0.0] * 6
                gear[k] = 1.0
                self.spec.add_actuator(name=f"push{r}_{'xyz'[k]}", trntype=mujoco.mjtTrn.mjTRN_SITE,
                                       target=f"rod{r}_centre", refsite="world_origin", gear=gear,
                                       ctrllimited=False)
        self.nominal = PhysicalParameters(robot).as_dict()
        self.twin = MujocoTwin(robot, floor=floor, fixed_rods=self.fixed_rods, nthread=1)   # state conversion

    # -------------------------------------------------------------- parameters
    def apply(self, spec: mujoco.MjSpec, name: str, value: float) -> None:
        """Write one physical value into a spec (the user's modifiers)."""
        r = self.robot
        A = set(int(i) for i in r.actuated_indices)
        g, off = r.actuator.gain, r.actuator.offset
        if name == "cable_stiffness":
            for c in range(r.num_cables):
                a = spec.actuator(f"act_cable{c}")
                a.gainprm[0] = value * g if c in A else 0.0
                a.biasprm[0] = value * (off if c in A else r.cable_rest_length[c])
                a.biasprm[1] = -value
        elif name == "cable_damping":
            for c in range(r.num_cables):
                share = r.cable_slack_damping[c]
                spec.actuator(f"act_cable{c}").biasprm[2] = -(1.0 - share) * value
                spec.tendon(f"cable{c}").damping[0] = share * value
        elif name == "rod_mass":
            inertia = r.rod_inertia()
            for rod in range(r.num_rods):
                body = spec.body(f"rod{rod}")
                body.mass = value
                body.inertia = inertia[rod] * value / r.rod_mass[rod]
        elif name == "actuator_time_constant":
            for c in A:
                spec.actuator(f"act_cable{c}").dynprm[0] = value
        elif name in ("friction_sliding", "contact_timeconst"):
            for geom in spec.geoms:
                if name == "friction_sliding":
                    geom.friction[0] = value
                else:
                    geom.solref[0] = value
        else:
            raise KeyError(name)

    def nominal_value(self, name: str) -> float:
        return CONTACT_TIMECONST[2] if name == "contact_timeconst" else float(np.mean(self.nominal[name]))

    def bounds(self, name: str) -> tuple[float, float]:
        if name == "contact_timeconst":
            return CONTACT_TIMECONST[:2]
        spec = SPEC_BY_NAME[name]
        # the package's bounds are open; a fit may end on its bound: keep it representable
        return spec.lower * (1 + 1e-6), spec.upper * (1 - 1e-6)

    def compile(self, values: dict) -> mujoco.MjModel:
        spec = self.spec.copy()
        for name, value in values.items():
            self.apply(spec, name, value)
        return spec.compile()

    # -------------------------------------------------------------- data
    def windows(self, trajs, length: float, stride: float, tau: Optional[float] = None) -> list[Window]:
        """Windows of ``length`` s every ``stride`` s from the recorded states; the initial
        activation is the motor filter with time constant ``tau`` (default nominal) run over
        the recorded commands."""
        robot, dt = self.robot, self.robot.dt
        S = int(round(length / dt))
        tau = float(robot.actuator.time_constant if tau is None else tau)
        w = robot.rod_mass / robot.rod_mass.sum()
        order = np.concatenate([robot.actuated_indices, np.flatnonzero(~robot.cable_actuated)])
        act_col = {int(c): i for i, c in enumerate(robot.actuated_indices)}
        out = []
        for t in trajs:
            total = int(math.floor((t.t[-1] - t.t[0]) / dt + 1e-9))
            acts = filtered_commands(robot, tau, t, total)
            states, ends = t.states(), end_nodes(t.states(), 0.5 * robot.rod_length)
            for start in np.arange(t.t[0], t.t[-1] - length + 1e-9, stride):
                i0 = int(np.argmin(np.abs(t.t - start)))
                if abs(t.t[i0] - start) > 1e-6:
                    continue
                s0 = int(round((t.t[i0] - t.t[0]) / dt))
                inside = (t.t > t.t[i0] + 1e-9) & (t.t <= t.t[i0] + length + 1e-9)
                cmd = t.command_grid(t.t[i0], S + 2, dt)
                control = np.zeros((S + 2, len(order) + 3 * len(self.free)))
                for j, c in enumerate(order):
                    if int(c) in act_col:
                        control[:, j] = cmd[:, act_col[int(c)]]
                wr = t.wrench_grid(t.t[i0], S + 2, dt)
                if wr is not None:
                    control[:, len(order):] = wr[:, self.free, :3].reshape(S + 2, -1)
                state = self.twin.mj_state_from(states[i0], acts[s0])[0]
                out.append(Window(state, control, t.t[inside] - t.t[i0],
                                  ends[inside][:, self.free].reshape(int(inside.sum()), -1),
                                  (states[inside][..., 0:3] * w[:, None]).sum(-2)))
        return out

    def predict_com(self, model: mujoco.MjModel, windows: Sequence[Window], nthread: int = 2) -> list:
        """The model's CoM at each window's measurement times, from its recorded start."""
        if not windows:
            return []
        steps = windows[0].control.shape[0] - 1                # S + 1
        state0 = np.stack([w.state for w in windows])
        control = np.stack([w.control[:steps] for w in windows])
        datas = [mujoco.MjData(model) for _ in range(max(1, nthread))]
        # rollout's sensor row j is computed before step j integrates: the state at time j dt
        _, sensordata = mujoco.rollout.rollout(model, datas, state0, control)
        R = self.robot.num_rods
        centres = np.broadcast_to(initial_rod_state(self.robot)[:, 0:3], (len(windows), steps, R, 3)).copy()  # welded
        centres[:, :, self.free] = sensordata.reshape(len(windows), steps, len(self.free), 2, 3).mean(-2)
        w = self.robot.rod_mass / self.robot.rod_mass.sum()
        com = (centres * w[:, None]).sum(-2)                                  # [B, S + 1, 3]
        return [com[b, np.clip(np.rint(win.times / self.robot.dt).astype(int), 0, steps - 1)]
                for b, win in enumerate(windows)]


def fit(sysid, peer: PeerModel, windows: Sequence[Window], names: Sequence[str], start: dict, *,
        max_iters: int = 30, threads: int = 2) -> tuple[dict, float, str]:
    """Fit ``names`` (log ratio to the nominal value, in the package's bounds) on the
    windows with mujoco.sysid's Levenberg-Marquardt; returns (values, wall seconds, how the
    optimiser stopped)."""
    model0 = peer.compile(start)
    ctrl_map = sysid.TimeSeries.compute_all_control_mapping(model0)
    dt = peer.robot.dt
    states, controls, sensors = [], [], []
    for w in windows:
        rows = w.control.shape[0]
        controls.append(sysid.TimeSeries(dt * np.arange(rows), w.control, ctrl_map))
        # mujoco.sysid stamps a step's sensors (computed before it integrates) with the time
        # after it: a measurement at t is declared at t + dt so that like meets like
        sensors.append(sysid.TimeSeries.from_names(w.times + dt, w.ends, model0))
        states.append(w.state)
    spec = peer.spec.copy()
    for name, value in start.items():
        if name not in names:
            peer.apply(spec, name, value)
    sequences = sysid.ModelSequences("peer", spec, [f"w{i}" for i in range(len(windows))], states, controls,
                                     sensors)
    params = sysid.ParameterDict()
    for name in names:
        nominal = peer.nominal_value(name)
        lo, hi = peer.bounds(name)
        x0 = math.log(start.get(name, nominal) / nominal)

        def modifier(spec, p, _name=name, _nominal=nominal):
            peer.apply(spec, _name, _nominal * math.exp(float(p.value[0])))

        params.add(sysid.Parameter(name, x0, math.log(lo / nominal), math.log(hi / nominal), modifier=modifier))
    residual = sysid.build_residual_fn(models_sequences=[sequences], n_threads=threads)
    t0 = time.perf_counter()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):      # the mujoco backend prints every iteration
        fitted, _ = sysid.optimize(params, residual, optimizer="mujoco", verbose=False, max_iters=max_iters)
    wall = time.perf_counter() - t0
    ends = [line for line in printed.getvalue().splitlines() if line.startswith("Terminated")]

    values = dict(start)
    for name in names:
        values[name] = peer.nominal_value(name) * math.exp(float(fitted[name].value[0]))
    return values, wall, (ends[-1] if ends else "?")


def horizon_errors(peer: PeerModel, values: dict, trajs, horizons, stride: float = 0.5) -> dict:
    """Mean CoM error h s ahead, restarted from the recorded state every ``stride`` s, the
    package's `identification.evaluation.horizon_errors` protocol on the MuJoCo model."""
    model = peer.compile(values)
    wins = peer.windows(trajs, max(horizons), stride, values.get("actuator_time_constant"))
    pred = peer.predict_com(model, wins)
    out = {}
    for h in horizons:
        errs = []
        for w, p in zip(wins, pred):
            k = int(np.argmin(np.abs(w.times - h)))
            errs.append(np.linalg.norm(p[k] - w.com[k]) if abs(w.times[k] - h) < 1e-6 else np.nan)
        out[h] = float(np.nanmean(errs))
    return out


def open_loop_error(peer: PeerModel, values: dict, trajs) -> float:
    """Mean CoM error at the end of each whole trajectory, from its first state and act."""
    model = peer.compile(values)
    errors = []
    for t in trajs:                       # one rollout each: recorded trajectories differ in length
        length = float(t.t[-1] - t.t[0])
        # at a trajectory's start the filter has not run: the activation is the recorded one
        wins = peer.windows([t], length, length + 1.0)
        errors += [np.linalg.norm(p[-1] - w.com[-1]) for w, p in zip(wins, peer.predict_com(model, wins))]
    return float(np.mean(errors)) if errors else math.nan


def as_parameters(robot, values: dict) -> PhysicalParameters:
    """The package's view of a peer fit (its values on the package's names; MuJoCo-only ones
    such as the contact time constant have no counterpart and are left out)."""
    return PhysicalParameters(robot, {k: v for k, v in values.items() if k in SPEC_BY_NAME})


def fit_robot(peer_models: dict, data: dict, env: str, start: dict, *, max_iters: int, threads: int,
              log=print) -> dict:
    """Fit every integrator's model on ``data['train']`` windows; keep the one whose
    validation CoM error 1 s ahead is lowest (the user's integrator choice). Returns
    {integrator: {"values", "wall", "val_1s"}, "best": integrator}."""
    sysid, why = sysid_module()
    if sysid is None:
        raise RuntimeError(why)
    out: dict = {}
    for integrator, peer in peer_models.items():
        tau = start.get(integrator, {}).get("actuator_time_constant")
        wins = peer.windows(data["train"], WINDOW, WINDOW, tau)
        values, wall, stop = fit(sysid, peer, wins, FIT[env], start.get(integrator, {}), max_iters=max_iters,
                           threads=threads)
        val = horizon_errors(peer, values, data["val"], (WINDOW,))[WINDOW]
        out[integrator] = {"values": values, "wall": wall, "val_1s": val}
        log(f"     mujoco.sysid ({integrator}, {len(wins)} windows of {WINDOW:g} s): {wall:.0f} s, "
            + ", ".join(f"{k} {v:.4g}" for k, v in values.items()) + f"; validation 1 s ahead {1e3 * val:.1f} mm"
            + f" ({stop})")
    out["best"] = min((k for k in out), key=lambda k: out[k]["val_1s"])
    return out


def peer_models(robot, env: str, fixed_rods: Sequence[int], integrators: Optional[Sequence[str]] = None) -> dict:
    return {i: PeerModel(robot, floor=env == "contact", fixed_rods=fixed_rods if env != "contact" else (),
                         integrator=i) for i in (integrators or INTEGRATORS)}
