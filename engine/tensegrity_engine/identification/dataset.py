"""Trajectory files for identification: format, validation, generation, tuples.

File format (one trajectory per ``.npz``, ``numpy.savez``; all float arrays float64)
===================================================================================

==================  ===========  ============================================================
key                 shape        meaning
==================  ===========  ============================================================
format              ()  str      ``"tensegrity-trajectory"``
version             ()  int      ``1``
robot_yaml          ()  str      the robot config (YAML text, `config.py` schema) the data
                                 belongs to; for simulated data it carries the true values
environment         ()  str      JSON: ``{"name": ..., "floor": bool, "fixed_rods": [..]}``
                                 (rods welded to the world; a floor at contact.ground_height)
t                   (N,)         sample time stamps (s), strictly increasing
position            (N, R, 3)    rod centre positions, world frame (m)
quaternion          (N, R, 4)    rod orientation, w first, body z = rod axis (end 0 -> 1)
linear_velocity     (N, R, 3)    OPTIONAL world-frame centre velocity (m/s)
angular_velocity    (N, R, 3)    OPTIONAL world-frame angular velocity (rad/s)
command_time        (M,)         stamps (s) at which commands were sent, increasing
command             (M, A)       target rest lengths (m) of the actuated cables (config
                                 order); command k holds (zero-order hold) on
                                 [command_time[k], command_time[k+1]); the first stamp must
                                 not be later than t[0]
act0                (A,)         OPTIONAL filtered command (actuator state) at t[0]; when
                                 absent the actuators are assumed settled at the command
                                 active at t[0]
wrench_time         (W,)         OPTIONAL stamps of known external wrenches (zero-order hold)
wrench              (W, R, 6)    OPTIONAL world force (N) then torque (N m) at each rod centre
meta                ()  str      OPTIONAL JSON, free-form (seed, generator, ...)
==================  ===========  ============================================================

Both velocities must be given or neither (mocap gives poses only). Samples need not be
uniform; `to_tuples` picks the samples that lie on a grid of period T.
Every reading error is a `DatasetError` naming the file and the field.

Generated data sets (`generate_dataset`) are laid out as
``<root>/<env>/<split>/traj_XXX.{sparse,dense}.npz`` with split in train/val/test:
sparse = every T (10 Hz), dense = every engine step (1 kHz).

Which parameters an environment can identify: in the non-contact environment (robot
hanging from a welded rod, known external forces) cable stiffness/damping, rod mass and the
actuator (time constant, gain, offset); mass is identifiable only because the known wrenches
fix the force scale (gravity does not: scaling every mass, stiffness and damping together
leaves the motion unchanged, see `scale`). In the contact environment (rolling, nominal commands, no
known forces) the contact normal stiffness/damping and the friction coefficients, with the
cable/rod parameters taken from the non-contact stage (as the paper does).
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import yaml

from tensegrity_engine.physics.collision import rods_overlapping
from tensegrity_engine.physics.config import ConfigError, RobotConfig, robot_from_dict, robot_to_dict, robot_to_yaml
from tensegrity_engine.physics.state import ANG_VEL, LIN_VEL, POS, QUAT, STATE_DIM, canonical_quat

FORMAT = "tensegrity-trajectory"
VERSION = 1
_TIME_TOL = 1e-6   # s, stamps closer than this to a grid point count as on it


class DatasetError(ValueError):
    """A trajectory file or array is malformed or does not match the robot."""


def check_same_topology(a: RobotConfig, b: RobotConfig, where: str) -> None:
    """Raise if two configs do not describe the same rods/cables/actuators."""
    problems = []
    if a.num_rods != b.num_rods:
        problems.append(f"{a.num_rods} vs {b.num_rods} rods")
    if a.num_cables != b.num_cables:
        problems.append(f"{a.num_cables} vs {b.num_cables} cables")
    elif not np.array_equal(a.cable_ends, b.cable_ends):
        problems.append("different cable end points")
    elif not np.array_equal(a.cable_actuated, b.cable_actuated):
        problems.append("different actuated cables")
    if a.num_rods == b.num_rods and not np.allclose(a.rod_length, b.rod_length, rtol=1e-6):
        problems.append("different rod lengths")
    if problems:
        raise DatasetError(f"{where}: recorded for robot {a.name!r} which does not match "
                           f"robot {b.name!r}: " + ", ".join(problems))


# --------------------------------------------------------------------------- trajectory
@dataclasses.dataclass
class Trajectory:
    """One recorded trajectory (arrays as in the file format above)."""

    robot: RobotConfig
    t: np.ndarray
    position: np.ndarray
    quaternion: np.ndarray
    command_time: np.ndarray
    command: np.ndarray
    linear_velocity: Optional[np.ndarray] = None
    angular_velocity: Optional[np.ndarray] = None
    act0: Optional[np.ndarray] = None
    wrench_time: Optional[np.ndarray] = None
    wrench: Optional[np.ndarray] = None
    environment: dict = dataclasses.field(default_factory=lambda: {"name": "unknown", "floor": True,
                                                                    "fixed_rods": []})
    meta: dict = dataclasses.field(default_factory=dict)
    source: str = "<memory>"

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        w = self.source
        R, A = self.robot.num_rods, self.robot.num_actuated

        def arr(name, shape):
            x = getattr(self, name)
            try:
                x = np.asarray(x, dtype=np.float64)
            except (TypeError, ValueError):
                raise DatasetError(f"{w}: {name}: not a numeric array") from None
            if x.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape)):
                want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
                raise DatasetError(f"{w}: {name}: expected shape {want}, got {x.shape}")
            if not np.all(np.isfinite(x)):
                raise DatasetError(f"{w}: {name}: contains NaN or inf")
            setattr(self, name, x)
            return x

        t = arr("t", (None,))
        N = len(t)
        if N < 2:
            raise DatasetError(f"{w}: t: need at least 2 samples, got {N}")
        if np.any(np.diff(t) <= 0):
            raise DatasetError(f"{w}: t: time stamps must be strictly increasing")
        arr("position", (N, R, 3))
        q = arr("quaternion", (N, R, 4))
        norm = np.linalg.norm(q, axis=-1)
        if np.any(np.abs(norm - 1.0) > 1e-3):
            raise DatasetError(f"{w}: quaternion: not unit quaternions (|q| up to "
                               f"{norm.max():.4g}, down to {norm.min():.4g}); w must come first")
        self.quaternion = canonical_quat(q / norm[..., None])
        has_v = self.linear_velocity is not None, self.angular_velocity is not None
        if has_v[0] != has_v[1]:
            raise DatasetError(f"{w}: give both linear_velocity and angular_velocity or neither")
        if has_v[0]:
            arr("linear_velocity", (N, R, 3))
            arr("angular_velocity", (N, R, 3))
        ct = arr("command_time", (None,))
        if len(ct) == 0:
            raise DatasetError(f"{w}: command_time: no commands")
        if np.any(np.diff(ct) <= 0):
            raise DatasetError(f"{w}: command_time: stamps must be strictly increasing")
        if ct[0] > t[0] + _TIME_TOL:
            raise DatasetError(f"{w}: command_time: first command at {ct[0]} s comes after the "
                               f"first sample at {t[0]} s (the command at t[0] is unknown)")
        arr("command", (len(ct), A))
        if self.act0 is not None:
            arr("act0", (A,))
        if (self.wrench is None) != (self.wrench_time is None):
            raise DatasetError(f"{w}: give both wrench_time and wrench or neither")
        if self.wrench is not None:
            wt = arr("wrench_time", (None,))
            if len(wt) == 0 or np.any(np.diff(wt) <= 0):
                raise DatasetError(f"{w}: wrench_time: need increasing stamps")
            if wt[0] > t[0] + _TIME_TOL:
                raise DatasetError(f"{w}: wrench_time: first wrench comes after the first sample")
            arr("wrench", (len(wt), R, 6))
        env = self.environment
        if not isinstance(env, dict) or not isinstance(env.get("floor"), bool):
            raise DatasetError(f"{w}: environment: expected a mapping with a boolean 'floor'")
        fixed = env.get("fixed_rods", [])
        if not isinstance(fixed, (list, tuple)) or any(
                not isinstance(i, int) or not 0 <= i < R for i in fixed):
            raise DatasetError(f"{w}: environment.fixed_rods: expected rod indices in 0..{R - 1}")

    # ------------------------------------------------------------------ views
    @property
    def num_samples(self) -> int:
        return len(self.t)

    @property
    def has_velocity(self) -> bool:
        return self.linear_velocity is not None

    @property
    def fixed_rods(self) -> tuple[int, ...]:
        return tuple(int(i) for i in self.environment.get("fixed_rods", []))

    @property
    def floor(self) -> bool:
        return bool(self.environment["floor"])

    def states(self) -> np.ndarray:
        """[N, R, 13] rod states; velocities are zero when the file has none."""
        out = np.zeros((self.num_samples, self.robot.num_rods, STATE_DIM))
        out[..., POS] = self.position
        out[..., QUAT] = self.quaternion
        if self.has_velocity:
            out[..., LIN_VEL] = self.linear_velocity
            out[..., ANG_VEL] = self.angular_velocity
        return out

    def without_velocity(self) -> "Trajectory":
        return dataclasses.replace(self, linear_velocity=None, angular_velocity=None)

    @staticmethod
    def _hold(stamps: np.ndarray, values: np.ndarray, times: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(stamps, times + _TIME_TOL, side="right") - 1
        return values[np.clip(idx, 0, None)]

    def command_grid(self, start: float, steps: int, dt: float) -> np.ndarray:
        """[steps, A] commands held over engine steps [start + k dt, start + (k+1) dt)."""
        return self._hold(self.command_time, self.command, start + dt * np.arange(steps))

    def wrench_grid(self, start: float, steps: int, dt: float) -> Optional[np.ndarray]:
        if self.wrench is None:
            return None
        return self._hold(self.wrench_time, self.wrench, start + dt * np.arange(steps))

    def initial_act(self) -> np.ndarray:
        if self.act0 is not None:
            return self.act0.copy()
        return self._hold(self.command_time, self.command, self.t[:1])[0].copy()

    def subsample(self, period: float) -> "Trajectory":
        """Samples on the grid t[0] + k * period (e.g. dense 1 kHz -> sparse 10 Hz)."""
        idx = self.grid_indices(period)
        keep = idx[idx >= 0]
        pick = lambda x: None if x is None else x[keep]
        return dataclasses.replace(self, t=self.t[keep], position=self.position[keep],
                                   quaternion=self.quaternion[keep],
                                   linear_velocity=pick(self.linear_velocity),
                                   angular_velocity=pick(self.angular_velocity))

    def grid_indices(self, period: float) -> np.ndarray:
        """Index of the sample at t[0] + k period for k = 0.. (or -1 where missing)."""
        if period <= 0:
            raise ValueError("period must be > 0")
        k_max = int(np.floor((self.t[-1] - self.t[0]) / period + 1e-9))
        grid = self.t[0] + period * np.arange(k_max + 1)
        pos = np.clip(np.searchsorted(self.t, grid), 0, len(self.t) - 1)
        best = np.where((pos > 0) & (np.abs(self.t[pos - 1] - grid) < np.abs(self.t[pos] - grid)),
                        pos - 1, pos)
        ok = np.abs(self.t[best] - grid) <= max(_TIME_TOL, 1e-3 * period)
        return np.where(ok, best, -1)

    def center_of_mass(self) -> np.ndarray:
        w = self.robot.rod_mass / self.robot.rod_mass.sum()
        return (self.position * w[:, None]).sum(-2)

    def path_length(self) -> float:
        com = self.center_of_mass()
        return float(np.linalg.norm(np.diff(com, axis=0), axis=-1).sum())

    # ------------------------------------------------------------------ I/O
    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = dict(format=np.array(FORMAT), version=np.array(VERSION),
                    robot_yaml=np.array(robot_to_yaml(self.robot)),
                    environment=np.array(json.dumps(self.environment)),
                    meta=np.array(json.dumps(self.meta)),
                    t=self.t, position=self.position, quaternion=self.quaternion,
                    command_time=self.command_time, command=self.command)
        for key in ("linear_velocity", "angular_velocity", "act0", "wrench_time", "wrench"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        with open(path, "wb") as f:      # a file handle: savez would append ".npz"
            np.savez(f, **data)
        return path


def _scalar_str(data, key, where) -> str:
    if key not in data:
        raise DatasetError(f"{where}: missing required field {key!r}")
    value = data[key]
    if value.shape != () or value.dtype.kind not in "US":
        raise DatasetError(f"{where}: {key}: expected a string")
    return str(value)


def load_trajectory(path: str | os.PathLike, robot: Optional[RobotConfig] = None) -> Trajectory:
    """Read and validate a trajectory file; with ``robot``, check it belongs to that robot
    (same topology) and use that config (the file's values are kept in ``meta``)."""
    where = str(path)
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise DatasetError(f"{where}: no such file") from None
    except Exception as err:
        raise DatasetError(f"{where}: not a readable .npz file ({err})") from None
    with data:
        fmt = _scalar_str(data, "format", where)
        if fmt != FORMAT:
            raise DatasetError(f"{where}: format is {fmt!r}, expected {FORMAT!r}")
        if "version" not in data or int(data["version"]) != VERSION:
            raise DatasetError(f"{where}: unsupported version (this reader knows {VERSION})")
        try:
            file_robot = robot_from_dict(yaml.safe_load(_scalar_str(data, "robot_yaml", where)),
                                         source=f"{where}:robot_yaml")
        except (ConfigError, yaml.YAMLError) as err:
            raise DatasetError(f"{where}: robot_yaml: {err}") from None
        try:
            env = json.loads(_scalar_str(data, "environment", where))
            meta = json.loads(str(data["meta"])) if "meta" in data else {}
        except json.JSONDecodeError as err:
            raise DatasetError(f"{where}: environment/meta: not valid JSON ({err})") from None
        for key in ("t", "position", "quaternion", "command_time", "command"):
            if key not in data:
                raise DatasetError(f"{where}: missing required field {key!r}")
        if robot is not None:
            check_same_topology(file_robot, robot, where)
        get = lambda k: data[k] if k in data else None
        return Trajectory(
            robot=robot if robot is not None else file_robot, t=data["t"],
            position=data["position"], quaternion=data["quaternion"],
            command_time=data["command_time"], command=data["command"],
            linear_velocity=get("linear_velocity"), angular_velocity=get("angular_velocity"),
            act0=get("act0"), wrench_time=get("wrench_time"), wrench=get("wrench"),
            environment=env, meta=dict(meta, file_robot=robot_to_dict(file_robot)) if robot else meta,
            source=where)


def load_split(root: str | os.PathLike, split: str, kind: str = "sparse",
               robot: Optional[RobotConfig] = None) -> list[Trajectory]:
    """All ``traj_*.{kind}.npz`` of ``root/split`` (sorted)."""
    folder = Path(root) / split
    files = sorted(folder.glob(f"traj_*.{kind}.npz"))
    if not files:
        raise DatasetError(f"{folder}: no traj_*.{kind}.npz files")
    return [load_trajectory(f, robot) for f in files]


# --------------------------------------------------------------------------- tuples
@dataclasses.dataclass
class TupleSet:
    """Tuples (X_t, U_t, X_t+T) of one or more trajectories, numpy float64.

    x0, x1 [N, R, 13]; commands [N, S, A] and wrenches [N, S, R, 6] (or None) per engine
    step of the interval; ``traj`` [N] index into ``traj_act0`` / ``traj_commands``
    (per-trajectory actuator state at its start and its whole command grid [S_tot, A]),
    from which the actuator state at each tuple start is rebuilt (it depends on the
    actuator time constant being identified); ``start_step`` [N] engine steps from the
    trajectory start; ``prev`` / ``next`` [N] index of the neighbouring tuple of the same
    trajectory or -1; ``has_velocity`` says whether x0/x1 carry measured velocities;
    ``traj_prev`` [traj] the trajectory whose command grid this one's continues (its actuator
    state starts where that one's ends: a long streamed record cut into pieces, or bridged
    over held-out tuples), or -1 where ``traj_act0`` is the start (all -1 when None).
    ``traj_act0_assumed`` [traj] bool (or None: none): that trajectory's ``traj_act0`` is
    not measured but assumed (a stream's motors taken as settled at the first command heard),
    so its first tuples carry the motors' unknown start (`solvers.windows.training_windows`).
    ``gyro0`` / ``gyro1`` [N, R] bool (or None: none): the angular velocity of that rod in
    x0 / x1 is a gyro's (world frame), not an estimate, also where the velocities are not
    measured (pose-only data from rods with IMUs).
    ``cables0`` / ``cables1`` [N, C, 2] float (or None: none): measured cable states at x0 / x1,
    rest length (m) and tension (N) (`measurements.REST_LENGTH`, `TENSION`), NaN (or any
    non-finite value) where not measured.
    """

    x0: np.ndarray
    x1: np.ndarray
    commands: np.ndarray
    wrenches: Optional[np.ndarray]
    traj: np.ndarray
    start_step: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    traj_act0: list
    traj_commands: list
    has_velocity: bool
    period: float
    dt: float
    fixed_rods: tuple
    floor: bool
    robot: RobotConfig
    traj_prev: Optional[np.ndarray] = None
    gyro0: Optional[np.ndarray] = None
    gyro1: Optional[np.ndarray] = None
    cables0: Optional[np.ndarray] = None
    cables1: Optional[np.ndarray] = None
    traj_act0_assumed: Optional[np.ndarray] = None

    def __post_init__(self):
        n = len(self.traj_act0)
        prev = -np.ones(n, dtype=np.int64) if self.traj_prev is None else np.asarray(self.traj_prev, dtype=np.int64)
        if prev.shape != (n,) or np.any(prev >= np.arange(n)) or np.any(prev < -1):
            raise DatasetError("traj_prev: each trajectory continues an earlier one or none (-1)")
        self.traj_prev = prev
        for name in ("gyro0", "gyro1"):
            mask = getattr(self, name)
            if mask is not None:
                mask = np.asarray(mask, dtype=bool)
                if mask.shape != self.x0.shape[:2]:
                    raise DatasetError(f"{name}: one flag per tuple and rod {self.x0.shape[:2]}, got {mask.shape}")
                setattr(self, name, mask)
        if (self.cables0 is None) != (self.cables1 is None):
            raise DatasetError("cables0 and cables1 come together")
        if self.cables0 is not None:
            shape = (len(self.x0), self.robot.num_cables, 2)
            for name in ("cables0", "cables1"):
                values = np.asarray(getattr(self, name), dtype=np.float64)
                if values.shape != shape:
                    raise DatasetError(f"{name}: a rest length and a tension per tuple and cable {shape}, "
                                       f"got {values.shape}")
                setattr(self, name, values)
        if self.traj_act0_assumed is not None:
            self.traj_act0_assumed = np.asarray(self.traj_act0_assumed, dtype=bool)
            if self.traj_act0_assumed.shape != (n,):
                raise DatasetError(f"traj_act0_assumed: one flag per trajectory ({n}), "
                                   f"got {self.traj_act0_assumed.shape}")

    def act0_assumed(self) -> np.ndarray:
        """[traj] bool, all False where None."""
        n = len(self.traj_act0)
        return np.zeros(n, dtype=bool) if self.traj_act0_assumed is None else self.traj_act0_assumed

    @property
    def has_gyro(self) -> bool:
        return self.gyro0 is not None or self.gyro1 is not None

    @property
    def has_cable_states(self) -> bool:
        return self.cables0 is not None

    def cable_states(self) -> tuple[np.ndarray, np.ndarray]:
        """(cables0, cables1) as arrays, NaN where None."""
        if self.cables0 is not None:
            return self.cables0, self.cables1
        none = np.full((len(self.x0), self.robot.num_cables, 2), np.nan)
        return none, none

    def gyro_masks(self) -> tuple[np.ndarray, np.ndarray]:
        """(gyro0, gyro1) as arrays, all False where None."""
        none = np.zeros(self.x0.shape[:2], dtype=bool)
        return (none if self.gyro0 is None else self.gyro0), (none if self.gyro1 is None else self.gyro1)

    def __len__(self) -> int:
        return len(self.x0)

    @property
    def steps(self) -> int:
        return self.commands.shape[1]

    @property
    def data_points(self) -> int:
        """Ground-truth samples these tuples use (distinct states)."""
        starts = set(zip(self.traj.tolist(), self.start_step.tolist()))
        ends = set(zip(self.traj.tolist(), (self.start_step + self.steps).tolist()))
        return len(starts | ends)

    @staticmethod
    def concat(sets: Sequence["TupleSet"]) -> "TupleSet":
        sets = [s for s in sets if s is not None and len(s)]
        if not sets:
            raise DatasetError("no tuples to concatenate")
        first = sets[0]
        for s in sets[1:]:
            if (s.steps, s.has_velocity, s.fixed_rods, s.floor) != (first.steps, first.has_velocity,
                                                                     first.fixed_rods, first.floor):
                raise DatasetError("tuple sets differ in period/steps, velocity availability "
                                   "or environment; they cannot be trained together")
            if (s.wrenches is None) != (first.wrenches is None):
                raise DatasetError("some tuple sets have external wrenches and others do not")
            check_same_topology(s.robot, first.robot, "tuples")
        traj_off = np.cumsum([0] + [len(s.traj_act0) for s in sets])[:-1]
        tup_off = np.cumsum([0] + [len(s) for s in sets])[:-1]
        shift = lambda a, o: np.where(a >= 0, a + o, -1)
        gyro = [s.gyro_masks() for s in sets] if any(s.has_gyro for s in sets) else None
        assumed = any(s.traj_act0_assumed is not None for s in sets)
        cables = [s.cable_states() for s in sets] if any(s.has_cable_states for s in sets) else None
        return TupleSet(
            x0=np.concatenate([s.x0 for s in sets]), x1=np.concatenate([s.x1 for s in sets]),
            commands=np.concatenate([s.commands for s in sets]),
            wrenches=None if first.wrenches is None else np.concatenate([s.wrenches for s in sets]),
            traj=np.concatenate([s.traj + o for s, o in zip(sets, traj_off)]),
            start_step=np.concatenate([s.start_step for s in sets]),
            prev=np.concatenate([shift(s.prev, o) for s, o in zip(sets, tup_off)]),
            next=np.concatenate([shift(s.next, o) for s, o in zip(sets, tup_off)]),
            traj_act0=[a for s in sets for a in s.traj_act0],
            traj_commands=[c for s in sets for c in s.traj_commands],
            has_velocity=first.has_velocity, period=first.period, dt=first.dt,
            fixed_rods=first.fixed_rods, floor=first.floor, robot=first.robot,
            traj_prev=np.concatenate([shift(s.traj_prev, o) for s, o in zip(sets, traj_off)]),
            gyro0=None if gyro is None else np.concatenate([g[0] for g in gyro]),
            gyro1=None if gyro is None else np.concatenate([g[1] for g in gyro]),
            cables0=None if cables is None else np.concatenate([c[0] for c in cables]),
            cables1=None if cables is None else np.concatenate([c[1] for c in cables]),
            traj_act0_assumed=np.concatenate([s.act0_assumed() for s in sets]) if assumed else None)


# Engine intervals per trajectory of streamed data (`streaming.to_tuple_set` cuts a long
# record into pieces this long, each continuing the last): the command grids of a set are
# padded to the longest trajectory.
MAX_CHAIN = 50


def to_tuples(traj: Trajectory, period: float = 0.1, dt: Optional[float] = None) -> TupleSet:
    """Split a trajectory into tuples (X_t, U_t, X_t+T) on the grid t[0] + k T.

    ``dt`` is the engine step (default the robot's); T must be a whole number of steps.
    Missing grid samples just drop the tuples that need them.
    """
    dt = traj.robot.dt if dt is None else float(dt)
    steps = int(round(period / dt))
    if steps < 1 or abs(steps * dt - period) > 1e-9 * max(1.0, period):
        raise DatasetError(f"{traj.source}: period {period} s is not a whole number of "
                           f"engine steps of {dt} s")
    idx = traj.grid_indices(period)
    K = len(idx) - 1
    if K < 1:
        raise DatasetError(f"{traj.source}: shorter than one period ({period} s)")
    states = traj.states()
    t0 = traj.t[0]
    grid_cmd = traj.command_grid(t0, K * steps, dt)
    grid_wr = traj.wrench_grid(t0, K * steps, dt)
    ks = [k for k in range(K) if idx[k] >= 0 and idx[k + 1] >= 0]
    if not ks:
        raise DatasetError(f"{traj.source}: no pair of samples {period} s apart")
    pos = {k: i for i, k in enumerate(ks)}
    x0 = states[[idx[k] for k in ks]]
    x1 = states[[idx[k + 1] for k in ks]]
    cmd = np.stack([grid_cmd[k * steps:(k + 1) * steps] for k in ks])
    wr = None if grid_wr is None else np.stack([grid_wr[k * steps:(k + 1) * steps] for k in ks])
    return TupleSet(
        x0=x0, x1=x1, commands=cmd, wrenches=wr, traj=np.zeros(len(ks), dtype=np.int64),
        start_step=np.array([k * steps for k in ks], dtype=np.int64),
        prev=np.array([pos.get(k - 1, -1) for k in ks], dtype=np.int64),
        next=np.array([pos.get(k + 1, -1) for k in ks], dtype=np.int64),
        traj_act0=[traj.initial_act()], traj_commands=[grid_cmd], has_velocity=traj.has_velocity,
        period=period, dt=dt, fixed_rods=traj.fixed_rods, floor=traj.floor, robot=traj.robot)


def tuples_from(trajs: Sequence[Trajectory], period: float = 0.1, dt: Optional[float] = None) -> TupleSet:
    return TupleSet.concat([to_tuples(t, period, dt) for t in trajs])


# --------------------------------------------------------------------------- generation
def _change_points(values: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Compress a per-step signal to the stamps where it changes (zero-order hold)."""
    flat = values.reshape(len(values), -1)
    keep = np.concatenate([[True], np.any(flat[1:] != flat[:-1], axis=1)])
    return np.flatnonzero(keep) * dt, values[keep]


ENVIRONMENTS = ("noncontact", "contact")
SPLITS = {"train": 10, "val": 2, "test": 10}


def _check_passive(twin, states, act0, commands, wrenches, label: str) -> None:
    """Refuse a ground truth that gains energy (`groundtruth.passivity`) on the episodes
    where that is decidable: no external force, commands constant and already reached."""
    from tensegrity_engine.groundtruth.passivity import check_passive

    if wrenches is not None:
        return
    for b in range(len(states)):
        if np.all(commands[b] == commands[b, :1]) and np.allclose(act0[b], commands[b, 0], atol=1e-6):
            check_passive(twin, states[b], act0[b], label=f"{label}, episode {b}")


def generate_dataset(robot: RobotConfig, env: str, root: str | os.PathLike, *,
                     counts: Optional[dict] = None, duration: float = 5.0, period: float = 0.1,
                     seed: int = 0, dense: bool = True, progress: bool = False,
                     truth=None, sensing=None, contact_commands: str = "nominal",
                     hold_range: Optional[tuple[float, float]] = None) -> dict:
    """Run the MuJoCo ground truth and write sparse (every ``period``) and dense (every
    engine step) trajectory files under ``root/env/split``. Returns {split: [paths]}.

    Contact episodes roll at the nominal commands unless ``contact_commands="random"``
    (the robot actuating while it rolls); ``hold_range`` (s) is how long each random
    command and push is held (default `environments.HOLD_RANGE`).
    ``truth`` (a `groundtruth.zoo.ZooRobot`, default the twin of ``robot``) is the robot
    that runs; the files carry ``robot`` (what the user knows), never the truth's values.
    ``sensing`` (a `groundtruth.sensors.SensorModel`) records the sparse files as a mocap
    would: noisy, late, jittered poses with dropped frames and no velocities."""
    from tensegrity_engine.groundtruth import environments as envs

    if env not in ENVIRONMENTS:
        raise ValueError(f"env must be one of {ENVIRONMENTS}, got {env!r}")
    if contact_commands not in ("nominal", "random"):
        raise ValueError(f"contact_commands must be 'nominal' or 'random', got {contact_commands!r}")
    hold = envs.HOLD_RANGE if hold_range is None else tuple(float(h) for h in hold_range)
    if not 0.0 < hold[0] <= hold[1]:
        raise ValueError(f"hold_range must be 0 < low <= high seconds, got {hold_range!r}")
    counts = dict(SPLITS if counts is None else counts)
    dt = robot.dt
    S = int(round(duration / dt))
    every = int(round(period / dt))
    if S % every:
        raise ValueError("duration must be a whole number of periods")
    rng = np.random.default_rng(seed)
    out: dict = {}
    true_robot = robot if truth is None else truth.truth
    realisation = None if truth is None else truth.realisation
    if truth is not None:
        check_same_topology(robot, true_robot, "ground truth")
    make_twin = envs.noncontact_twin if env == "noncontact" else envs.contact_twin
    twin = make_twin(true_robot, realisation=realisation)
    environment = ({"name": env, "floor": False, "fixed_rods": [envs.NONCONTACT_FIXED_ROD]}
                   if env == "noncontact" else {"name": env, "floor": True, "fixed_rods": []})
    try:
        for split, n in counts.items():
            eps = []
            for _ in range(n):
                if env == "noncontact":
                    eps.append(envs.sample_noncontact_episode(true_robot, rng, S, hold_range=hold,
                                                              realisation=realisation))
                else:
                    eps.append(envs.sample_contact_episode(true_robot, rng, S, hold_range=hold,
                                                           randomize_commands=contact_commands == "random",
                                                           realisation=realisation) + (None,))
            if not eps:
                continue
            s0 = np.stack([e[0] for e in eps])
            a0 = np.stack([e[1] for e in eps])
            cmd = np.stack([e[2] for e in eps])
            wr = None if eps[0][3] is None else np.stack([e[3] for e in eps])
            states, _ = twin.rollout(s0, a0, cmd, wr, record_every=1)
            states = np.concatenate([s0[:, None], states], axis=1)       # [B, S+1, R, 13]
            _check_passive(twin, states[:, ::every], a0, cmd, wr, f" ({env}/{split})")
            # held in the air, a small robot still folds its rods into each other: there the
            # engine's and MuJoCo's rod-rod contact models part (by design), so say so
            # (one trajectory at a time: all at once holds [B, S, pairs, 3] several times over)
            touching = np.array([int(rods_overlapping(true_robot, states[b]).sum()) if env == "noncontact" else 0
                                 for b in range(n)], dtype=int)
            times = dt * np.arange(S + 1)
            paths = []
            for b in range(n):
                ct, cv = _change_points(cmd[b], dt)
                kw = dict(robot=robot, command_time=ct, command=cv, act0=a0[b],
                          environment=environment,
                          meta={"generator": "tensegrity_engine.identification.dataset", "seed": seed,
                                "split": split, "index": b, "hold_range": list(hold),
                                "contact_commands": contact_commands if env != "noncontact" else "random",
                                "ground_truth": "twin" if truth is None else truth.name,
                                "rod_contact_steps": int(touching[b]),
                                "sensing": None if sensing is None else dataclasses.asdict(sensing)})
                if wr is not None:
                    kw["wrench_time"], kw["wrench"] = _change_points(wr[b], dt)
                for kind, sel in (("sparse", slice(None, None, every)), ("dense", slice(None))):
                    if kind == "dense" and not dense:
                        continue
                    st, t_rec, vel = states[b, sel], times[sel], True
                    if kind == "sparse" and sensing is not None:
                        t_rec, st = sensing.measure(states[b], dt, t_rec, rng)
                        vel = False
                    traj = Trajectory(t=t_rec, position=st[..., POS], quaternion=st[..., QUAT],
                                      linear_velocity=st[..., LIN_VEL] if vel else None,
                                      angular_velocity=st[..., ANG_VEL] if vel else None, **kw)
                    paths.append(traj.save(Path(root) / env / split / f"traj_{b:03d}.{kind}.npz"))
            out[split] = paths
            if progress:
                print(f"  {env}/{split}: {n} trajectories of {duration} s written"
                      + (f"; rods touched each other in {int((touching > 0).sum())} of them "
                         f"({100 * touching.sum() / (n * (S + 1)):.1f} % of the steps), where the engine's "
                         "and MuJoCo's rod-rod contact models differ" if touching.any() else ""))
    finally:
        twin.close()
    return out
