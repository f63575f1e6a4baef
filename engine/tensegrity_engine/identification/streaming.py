"""Time-aligned buffering of stamped measurements into identification tuples (ROS-free).

The ROS identifier node feeds this module with what arrives on its topics; it returns
``(X_t, U_t, X_t+T)`` tuples in the format `engine.identification` consumes. Everything
here is plain Python/numpy/torch so that it is unit-tested without ROS.

Inputs (stamps are integer nanoseconds, the measurement / application time):

* ``add_pose(stamp, poses [R, 7])``: rod centre position (m) and orientation quaternion
  (w, x, y, z), world frame, rods in config order (a motion-capture frame);
* ``add_imu(stamp, rod, omega_body [3], quat_wxyz [4] or None)``: optional gyro of one rod;
* ``add_command(stamp, targets [A])``: target rest lengths, held from ``stamp`` until
  the next command (zero-order hold);
* ``add_cable_states(stamp, rest_lengths [C] or None, tensions [C] or None)``: optional
  measured cable states, config order: rest lengths (m, a winch's encoder) and tensions (N, a
  load cell or a winch's current), NaN where a cable has no such sensor; used with the pose
  of the same stamp (within ``stamp_tolerance``).

Output: `TupleBatch` from ``pop_tuples()`` -- N tuples with ``x0 [N, R, 13]`` (state at a
pose stamp t0), ``commands [N, S, A]`` (the zero-order-held command at t0 + j dt,
j = 0..S-1, dt the engine step, S = T / dt), ``x1 [N, R, 13]`` (state at t1 = t0 + T),
``prev_commands [N, 2 S, A]`` (the commands of the two intervals before t0: the actuator
filter's history, which bridges a dropped pose), velocity masks, stamps, the segment (a
chain of poses) and the record (one command timeline: a new one only where the clocks
restart). Velocities are not measured by motion
capture: they are finite differences of the poses (central at x0 when the pose before
t0 is in the same segment: ``vel_known0``; backward at x1: ``vel_known1`` is False),
angular velocities come from the IMU when one matches the pose stamp (within
``stamp_tolerance``).

Stream rules (each rejection is counted by reason in ``counters``; nothing raises):

==================  ============================================================
``nonfinite``       NaN/inf anywhere in a pose, IMU or command message
``rod_count``       a pose array whose length is not R (unknown rod count)
``unknown_rod``     an IMU message for a rod index outside 0..R-1
``wrong_length``    a command whose length is not A, cable states whose length is not C
``bad_quaternion``  a quaternion whose norm is far from 1
``out_of_range``    a position beyond ``max_abs_position`` (m), a gyro rate beyond
                    ``max_abs_angular_velocity`` (rad/s), a tension beyond
                    ``max_abs_tension`` (N), a rest length <= 0 or beyond
                    ``max_abs_position``, a command outside the robot's
                    command range (by more than ``command_tolerance`` of its width)
``duplicate``       a stamp equal to the previous one of that stream
``out_of_order``    a stamp earlier than the previous one (by < clock_jump)
``clock_jump``      a stamp jump of more than ``clock_jump`` s (either direction):
                    the stream restarts from it (not a rejection: the message is used)
``gap``             poses more than T + tolerance apart: the segment is split, no tuple
                    is ever made across a gap (the message is used)
``decimated``       a pose less than T - tolerance after the previous one (higher-rate
                    mocap is decimated to the tuple interval; not an error)
``no_command``      a tuple dropped because no command was known at its start
``late_command``    a command stamped before already-finalised data
``overflow``        oldest finished tuples dropped because ``max_tuples`` were waiting, or
                    the oldest tuple waiting for its commands finished early (with the
                    commands known) because `PENDING` were waiting
==================  ============================================================

Buffers are bounded: a segment keeps its last few poses only, the command history only
what pending tuples still need (and at most ``max_commands``), the IMU cache at most
``max_imu`` entries (the cable states' as many), the output queue at most ``max_tuples`` tuples.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.identification.measurements import (REST_LENGTH, TENSION, StampOrder, cable_state_problem,
                                                           command_problem, imu_problem, pose_problem)
from tensegrity_engine.physics.actuators import held_command_update
from tensegrity_engine.physics.state import (ANG_VEL, LIN_VEL, POS, QUAT, STATE_DIM, canonical_quat, central_rotation,
                                             quat_log_world, quat_rotate)

__all__ = ["StreamConfig", "TupleBatch", "StreamAligner", "StateEstimator", "REASONS", "NS",
           "actuator_estimate", "stamp_intervals"]

NS = 1_000_000_000
# Intervals of commands before each tuple (``prev_commands``): the second bridges a dropped
# pose, whose interval no tuple covers (5 % of frames in the zoo's mocaps; each drop restarted
# the motor settled).
PREV_INTERVALS = 2
# tuples that may wait for their commands (``command_wait``) at once
PENDING = 64
REASONS = ("nonfinite", "rod_count", "unknown_rod", "wrong_length", "bad_quaternion",
           "out_of_range", "duplicate", "out_of_order", "clock_jump", "gap", "decimated",
           "no_command", "late_command", "overflow")
# reasons that reject a message (the others are stream events)
REJECTIONS = ("nonfinite", "rod_count", "unknown_rod", "wrong_length", "bad_quaternion",
              "out_of_range", "duplicate", "out_of_order", "late_command")


@dataclasses.dataclass
class StreamConfig:
    num_rods: int
    num_actuated: int
    engine_dt: float = 0.001          # s, step of the zero-order-held command samples
    interval: float = 0.1             # s, T: time between x0 and x1 (the pose period)
    stamp_tolerance: float = 0.002    # s, poses within T +- this are on the grid
    clock_jump: float = 5.0           # s, a stamp step larger than this restarts the stream
    command_wait: Optional[float] = None  # s, how long after t1 a late command may still
    #                                      arrive (default: T); then the interval is final
    max_abs_position: float = 1e3     # m
    max_abs_angular_velocity: float = 1e3   # rad/s, a gyro reading beyond this is garbage
    num_cables: int = 0               # C: the length of a cable-state message (0: refused)
    cable_names: tuple = ()           # the C cables' names, config order (what a message may name)
    max_abs_tension: float = 1e5      # N, a tension reading beyond this is garbage
    quat_tolerance: float = 0.1       # | |q| - 1 | allowed (q is normalised after)
    command_low: Optional[tuple] = None     # [A] the robot's command range (None: unchecked)
    command_high: Optional[tuple] = None
    command_tolerance: float = 0.01   # fraction of the range width a command may overshoot
    max_tuples: int = 100_000
    max_commands: int = 10_000
    max_imu: int = 1_000

    @property
    def steps(self) -> int:
        return int(round(self.interval / self.engine_dt))

    @classmethod
    def for_robot(cls, robot, **kw) -> "StreamConfig":
        kw.setdefault("engine_dt", robot.dt)
        kw.setdefault("command_low", tuple(float(v) for v in robot.command_low))
        kw.setdefault("command_high", tuple(float(v) for v in robot.command_high))
        kw.setdefault("num_cables", robot.num_cables)
        kw.setdefault("cable_names", tuple(robot.cable_names))
        return cls(num_rods=robot.num_rods, num_actuated=robot.num_actuated, **kw)


@dataclasses.dataclass
class TupleBatch:
    """N identification tuples. Tensors are float64 on the CPU."""

    x0: torch.Tensor             # [N, R, 13]
    commands: torch.Tensor       # [N, S, A] zero-order hold at engine_dt from t0
    x1: torch.Tensor             # [N, R, 13] state at t0 + S * engine_dt
    prev_commands: torch.Tensor  # [N, P S, A] commands over [t0 - P T, t0) (P = PREV_INTERVALS; 1 in old files)
    vel_known0: torch.Tensor     # [N] bool: x0 velocity from a central difference
    vel_known1: torch.Tensor     # [N] bool: x1 velocity from a central difference
    omega_measured0: torch.Tensor  # [N, R] bool: x0 angular velocity from the IMU
    t0: torch.Tensor             # [N] int64 ns
    segment: torch.Tensor        # [N] int64: tuples of one segment are consecutive in time
    engine_dt: float = 0.001
    # [N] int64: tuples of one record share one command timeline (a segment split by a dropped
    # pose does not end it; a restarted clock does); unique per aligner (None: the segment)
    record: Optional[torch.Tensor] = None
    omega_measured1: Optional[torch.Tensor] = None  # [N, R] bool: x1 angular velocity from the IMU (None: none)
    # [N, C, 2] measured cable states at x0 / x1: rest length (m) and tension (N)
    # (`measurements.REST_LENGTH`, `TENSION`), NaN where none (None: none in the batch)
    cables0: Optional[torch.Tensor] = None
    cables1: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.record is None:
            self.record = self.segment.clone()
        if self.omega_measured1 is None:
            self.omega_measured1 = torch.zeros_like(self.omega_measured0)
        if (self.cables0 is None) != (self.cables1 is None):
            raise ValueError("cables0 and cables1 come together")
        if self.cables0 is not None and not (
                self.cables0.ndim == 3 and self.cables0.shape == self.cables1.shape
                and self.cables0.shape[0] == self.x0.shape[0] and self.cables0.shape[2] == 2
                and self.cables0.is_floating_point() and self.cables1.is_floating_point()):
            raise ValueError(f"cable states: [N, C, 2] floats at x0 and x1 for N = {self.x0.shape[0]} tuples, "
                             f"got {tuple(self.cables0.shape)} and {tuple(self.cables1.shape)}")
        S, width = self.commands.shape[1], self.prev_commands.shape[1]
        if width < PREV_INTERVALS * S:        # an older checkpoint's: its first command held before it
            head = self.prev_commands[:, :1].expand(-1, PREV_INTERVALS * S - width, -1)
            self.prev_commands = torch.cat([head, self.prev_commands], 1)

    def __len__(self) -> int:
        return int(self.x0.shape[0])

    @staticmethod
    def cat(batches) -> "TupleBatch":
        batches = [b for b in batches if b is not None and len(b)]
        if not batches:
            raise ValueError("no tuples")
        optional = ("cables0", "cables1")
        fields = {f.name: torch.cat([getattr(b, f.name) for b in batches])
                  for f in dataclasses.fields(TupleBatch) if f.name not in ("engine_dt",) + optional}
        for name in optional:
            width = next((getattr(b, name).shape[1:] for b in batches if getattr(b, name) is not None), None)
            fields[name] = None if width is None else torch.cat(
                [getattr(b, name) if getattr(b, name) is not None
                 else torch.full((len(b), *width), math.nan, dtype=torch.float64) for b in batches])
        return TupleBatch(**fields, engine_dt=batches[0].engine_dt)

    def slice(self, idx) -> "TupleBatch":
        fields = {f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[idx]
                  for f in dataclasses.fields(TupleBatch) if f.name != "engine_dt"}
        return TupleBatch(**fields, engine_dt=self.engine_dt)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "TupleBatch":
        return TupleBatch(**d)


# ------------------------------------------------------------------------- helpers
@dataclasses.dataclass
class _Pose:
    stamp: int
    pos: np.ndarray    # [R, 3]
    quat: np.ndarray   # [R, 4]
    omega_imu: np.ndarray  # [R, 3] world, NaN where unknown
    cables: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, 2)))   # [C, 2], NaN where unknown


def cable_reading_verdict(cfg: StreamConfig, order: StampOrder, stamp: int, rest_lengths, tensions
                          ) -> Optional[str]:
    """Why a reading of the cables' sensors at ``stamp`` is refused (`cable_state_problem`,
    then ``order``'s "duplicate" / "out_of_order"), "clock_jump" (a stream that starts over:
    its caller decides), or None. The identifier's aligner and the controller judge alike."""
    problem = cable_state_problem(rest_lengths, tensions, cfg.num_cables, max_abs_tension=cfg.max_abs_tension,
                                  max_rest_length=cfg.max_abs_position)
    return problem or order.verdict("cables", stamp)


class CableReadings:
    """The cables' readings (`StreamAligner.add_cable_states`) by stamp, bounded, until a
    pose of their stamp takes them; their own stamp order (a clock jump starts it over)."""

    def __init__(self, config: StreamConfig, tol_ns: int, jump_ns: int):
        self.cfg, self.tol_ns = config, tol_ns
        self.order = StampOrder(jump_ns)
        self.by_stamp: collections.OrderedDict = collections.OrderedDict()     # stamp -> [C, 2]

    def reset(self) -> None:
        self.by_stamp.clear()
        self.order.forget()

    def add(self, stamp: int, rest_lengths, tensions, poses) -> str:
        """'ok', 'clock_jump' (kept: the stream starts over) or why the reading is refused."""
        cfg = self.cfg
        verdict = cable_reading_verdict(cfg, self.order, stamp, rest_lengths, tensions)
        if verdict not in (None, "clock_jump"):
            return verdict
        if verdict == "clock_jump":
            self.by_stamp.clear()
        values = np.full((cfg.num_cables, 2), np.nan)
        for column, given in ((REST_LENGTH, rest_lengths), (TENSION, tensions)):
            if given is not None:
                values[:, column] = np.asarray(given, dtype=np.float64).reshape(-1)
        self.order.accept("cables", stamp)
        self.by_stamp[stamp] = values
        while len(self.by_stamp) > cfg.max_imu:
            self.by_stamp.popitem(last=False)
        for pose in poses:           # a reading may arrive after its pose
            self.attach(pose, (stamp,))
        return verdict or "ok"

    def attach(self, pose, stamps=None) -> None:
        for stamp in self.by_stamp if stamps is None else stamps:
            if abs(stamp - pose.stamp) <= self.tol_ns:
                pose.cables = self.by_stamp[stamp]


class StreamAligner:
    """Validates stamped poses / IMU / commands and emits `TupleBatch` es.

    Not thread-safe: call it from one thread (the ROS node uses a lock).
    """

    def __init__(self, config: StreamConfig):
        self.cfg = config
        self.R, self.A = config.num_rods, config.num_actuated
        self.S = config.steps
        if self.S < 1 or abs(self.S * config.engine_dt - config.interval) > 1e-9:
            raise ValueError(f"interval {config.interval} s must be a multiple of engine_dt {config.engine_dt}")
        self.T_ns = int(round(config.interval * NS))
        self.dt_ns = int(round(config.engine_dt * NS))
        self.tol_ns = int(round(config.stamp_tolerance * NS))
        self.jump_ns = int(round(config.clock_jump * NS))
        self.wait_ns = int(round((config.interval if config.command_wait is None
                                  else config.command_wait) * NS))
        self.counters: collections.Counter = collections.Counter()
        self.accepted: collections.Counter = collections.Counter()
        self.last_reason: Optional[str] = None
        self._segment_id = 0
        # records of different aligners never share an id (a restored session's window holds
        # tuples of an earlier run, whose stamps a restarted sim clock repeats)
        self._record_id = int.from_bytes(os.urandom(6), "little") << 8
        self._poses: collections.deque = collections.deque(maxlen=3)   # current segment
        self._pending: collections.deque = collections.deque(maxlen=PENDING)  # (p_prev, p0, p1, seg, rec)
        self._cmd_t: collections.deque = collections.deque()
        self._cmd_u: collections.deque = collections.deque()
        self._imu: collections.OrderedDict = collections.OrderedDict()
        self._cables = CableReadings(config, self.tol_ns, self.jump_ns)
        self._out: collections.deque = collections.deque()
        self._order = StampOrder(self.jump_ns)   # keys: "pose", "command", ("imu", rod)
        self._final_before: int = -(1 << 62)   # commands before this stamp are final
        self.tuples_made = 0

    # ------------------------------------------------------------------ bookkeeping
    def _reject(self, reason: str) -> tuple[bool, str]:
        self.counters[reason] += 1
        self.last_reason = reason
        return False, reason

    def _event(self, reason: str, count: int = 1) -> None:
        self.counters[reason] += count
        self.last_reason = reason

    @property
    def rejected_total(self) -> int:
        return sum(v for k, v in self.counters.items() if k in REJECTIONS)

    def stats(self) -> dict:
        return {
            "poses_accepted": self.accepted["pose"], "commands_accepted": self.accepted["command"],
            "imu_accepted": self.accepted["imu"], "cable_states_accepted": self.accepted["cables"],
            "tuples_made": self.tuples_made,
            "tuples_waiting": len(self._out), "pending": len(self._pending),
            "segment": self._segment_id, "commands_buffered": len(self._cmd_t),
            "rejected_total": self.rejected_total,
            **{f"count_{r}": self.counters[r] for r in REASONS},
        }

    def reset(self, keep_commands: bool = False) -> None:
        """Forget all stream state (finished tuples stay in the output queue);
        ``keep_commands``: not the commands, already on the restarted clock."""
        self._new_segment()
        self._record_id += 1
        self._imu.clear()
        self._cables.reset()
        if keep_commands:            # final up to the newest command (old poses moved the watermark)
            self._order.forget(("pose", "imu"))
            self._final_before = self._order.get("command")
            return
        self._cmd_t.clear()
        self._cmd_u.clear()
        self._order.forget()
        self._final_before = -(1 << 62)

    def _new_segment(self) -> None:
        self._flush_pending(force=True)
        self._poses.clear()
        self._segment_id += 1

    # ------------------------------------------------------------------ inputs
    def add_pose(self, stamp: int, poses) -> tuple[bool, str]:
        """poses [R, 7] = (x, y, z, qw, qx, qy, qz). Returns (accepted, reason or 'ok')."""
        problem = pose_problem(poses, self.R, max_abs_position=self.cfg.max_abs_position,
                               quat_tolerance=self.cfg.quat_tolerance)
        if problem:
            return self._reject(problem)
        arr = np.asarray(poses, dtype=np.float64)
        qn = np.linalg.norm(arr[:, 3:], axis=-1)
        stamp = int(stamp)
        last = self._order.get("pose")
        verdict = self._order.verdict("pose", stamp)
        if verdict in ("duplicate", "out_of_order"):
            return self._reject(verdict)
        if verdict == "clock_jump":
            self._event("clock_jump")
            if stamp < last:
                commands = self._order.get("command")
                if (commands is not None and commands < last - self._order.jump_ns
                        and abs(commands - stamp) <= self._order.jump_ns):
                    # the command clock restarted first (its commands are on the new pose's
                    # clock): the old poses' commands are gone, the new ones are kept
                    if self._pending:
                        self._event("no_command", len(self._pending))
                    self._pending.clear()
                    self.reset(keep_commands=True)
                else:
                    self.reset()
            else:
                self._new_segment()
        elif last is not None:
            gap = stamp - last
            if gap < self.T_ns - self.tol_ns:
                self._event("decimated")
                return True, "decimated"
            if gap > self.T_ns + self.tol_ns:
                self._event("gap")
                self._new_segment()
        self._order.accept("pose", stamp)
        self.accepted["pose"] += 1
        pose = _Pose(stamp, arr[:, :3].copy(), arr[:, 3:] / qn[:, None],
                     np.full((self.R, 3), np.nan), np.full((self.cfg.num_cables, 2), np.nan))
        self._attach_imu(pose)
        self._cables.attach(pose)
        self._poses.append(pose)
        if len(self._poses) >= 2:
            p_prev = self._poses[-3] if len(self._poses) >= 3 else None
            if len(self._pending) == self._pending.maxlen:      # a command_wait of PENDING intervals
                self._event("overflow")
                made = self._made(*self._pending.popleft())
                if made is not None:
                    self._emit([made])
            self._pending.append((p_prev, self._poses[-2], self._poses[-1], self._segment_id, self._record_id))
        self._advance_watermark(stamp - self.wait_ns)
        self._flush_pending()
        return True, "ok"

    def add_command(self, stamp: int, targets) -> tuple[bool, str]:
        problem = command_problem(targets, self.A, self.cfg.command_low, self.cfg.command_high,
                                  tolerance=self.cfg.command_tolerance)
        if problem:
            return self._reject(problem)
        u = np.asarray(targets, dtype=np.float64).reshape(-1)
        stamp = int(stamp)
        last = self._order.get("command")
        verdict = self._order.verdict("command", stamp)
        if verdict in ("duplicate", "out_of_order"):
            return self._reject(verdict)
        if verdict == "clock_jump":
            self._event("clock_jump")
            if stamp < last:
                # the command clock restarted: old commands mean nothing on the new clock; the
                # tuples waiting for commands get the old ones, final now, first
                self._flush_pending(force=True)
                self._cmd_t.clear()
                self._cmd_u.clear()
                self._final_before = -(1 << 62)
        elif stamp < self._final_before:
            return self._reject("late_command")
        self._order.accept("command", stamp)
        self.accepted["command"] += 1
        self._cmd_t.append(stamp)
        self._cmd_u.append(u.copy())
        while len(self._cmd_t) > self.cfg.max_commands:
            self._cmd_t.popleft()
            self._cmd_u.popleft()
        self._advance_watermark(stamp)
        self._flush_pending()
        return True, "ok"

    def add_imu(self, stamp: int, rod: int, omega_body, quat_wxyz=None) -> tuple[bool, str]:
        """Gyro of one rod: body-frame angular velocity; ``quat_wxyz`` its orientation if
        valid (else the pose's orientation at that stamp is used)."""
        try:
            rod = None if rod is None else int(rod)
        except (TypeError, ValueError):
            rod = None
        problem = imu_problem(rod, omega_body, quat_wxyz, self.R,
                              max_abs_angular_velocity=self.cfg.max_abs_angular_velocity,
                              quat_tolerance=self.cfg.quat_tolerance)
        if problem:
            return self._reject(problem)
        w = np.asarray(omega_body, dtype=np.float64).reshape(-1)
        q = None
        if quat_wxyz is not None:
            q = np.asarray(quat_wxyz, dtype=np.float64).reshape(-1)
            q = q / np.linalg.norm(q)
        stamp = int(stamp)
        verdict = self._order.verdict(("imu", rod), stamp)
        if verdict in ("duplicate", "out_of_order"):
            return self._reject(verdict)
        if verdict == "clock_jump":
            self._event("clock_jump")
            self._imu.clear()
        self._order.accept(("imu", rod), stamp)
        self.accepted["imu"] += 1
        self._imu[(stamp, rod)] = (w, q)
        while len(self._imu) > self.cfg.max_imu:
            self._imu.popitem(last=False)
        # an IMU sample may arrive after its pose
        for pose in self._poses:
            if abs(pose.stamp - stamp) <= self.tol_ns:
                self._set_imu(pose, rod, w, q)
        return True, "ok"

    def add_cable_states(self, stamp: int, rest_lengths=None, tensions=None) -> tuple[bool, str]:
        """Measured rest lengths [C] (m) and tensions [C] (N) of the cables, either None, NaN
        where a cable has no such sensor (`CableReadings`)."""
        reason = self._cables.add(int(stamp), rest_lengths, tensions, self._poses)
        if reason not in ("ok", "clock_jump"):
            return self._reject(reason)
        if reason == "clock_jump":
            self._event(reason)
        self.accepted["cables"] += 1
        return True, "ok"

    # ------------------------------------------------------------------ internals
    def _set_imu(self, pose: _Pose, rod: int, w: np.ndarray, q: Optional[np.ndarray]) -> None:
        q = pose.quat[rod] if q is None else q
        pose.omega_imu[rod] = quat_rotate(q[None], w[None])[0]

    def _attach_imu(self, pose: _Pose) -> None:
        for (stamp, rod), (w, q) in self._imu.items():
            if abs(stamp - pose.stamp) <= self.tol_ns:
                self._set_imu(pose, rod, w, q)

    def _advance_watermark(self, t: int) -> None:
        self._final_before = max(self._final_before, t)

    def _commands_over(self, t_start: int, intervals: int = 1) -> Optional[np.ndarray]:
        """[intervals S, A] zero-order-held commands at t_start + j dt, or None if none is known."""
        if not self._cmd_t or self._cmd_t[0] > t_start:
            return None
        stamps = np.fromiter(self._cmd_t, dtype=np.int64, count=len(self._cmd_t))
        grid = t_start + self.dt_ns * np.arange(intervals * self.S, dtype=np.int64)
        # a command stamped within half a step of a grid time applies from that step
        idx = np.searchsorted(stamps, grid + self.dt_ns // 2, side="right") - 1
        U = np.stack(list(self._cmd_u))
        return U[idx]

    def _state(self, pose: _Pose, before: Optional[_Pose], after: Optional[_Pose]) -> tuple[np.ndarray, bool]:
        s = np.zeros((self.R, STATE_DIM))
        s[:, POS] = pose.pos
        s[:, QUAT] = canonical_quat(pose.quat)
        a = before if before is not None else pose
        b = after if after is not None else pose
        span = (b.stamp - a.stamp) / NS
        if span > 0:
            s[:, LIN_VEL] = (b.pos - a.pos) / span
            s[:, ANG_VEL] = central_rotation(a.quat, pose.quat, b.quat) / span
        imu = np.isfinite(pose.omega_imu).all(-1)
        s[imu, ANG_VEL] = pose.omega_imu[imu]
        return s, before is not None and after is not None

    def _flush_pending(self, force: bool = False) -> None:
        keep = collections.deque(maxlen=self._pending.maxlen)
        made = []
        for p_prev, p0, p1, seg, rec in self._pending:
            if p1.stamp > self._final_before and not force:
                keep.append((p_prev, p0, p1, seg, rec))
                continue
            one = self._made(p_prev, p0, p1, seg, rec)
            if one is not None:
                made.append(one)
        self._pending = keep
        if made:
            self._emit(made)
        self._trim_commands()

    def _made(self, p_prev, p0, p1, seg, rec) -> Optional[tuple]:
        """The tuple ``p0`` -> ``p1`` with the commands known now; None (counted) without one at its start."""
        cmd = self._commands_over(p0.stamp)
        if cmd is None:
            self._event("no_command")
            return None
        prev = self._prev_commands(p0.stamp, cmd)
        x0, known0 = self._state(p0, p_prev, p1)
        x1, known1 = self._state(p1, p0, None)
        return (x0, cmd, x1, prev, known0, known1, np.isfinite(p0.omega_imu).all(-1),
                p0.stamp, seg, rec, np.isfinite(p1.omega_imu).all(-1), p0.cables, p1.cables)

    def _prev_commands(self, t0: int, cmd: np.ndarray) -> np.ndarray:
        """[PREV_INTERVALS S, A] commands before t0; where the stream began later, the first
        known one held before it (the actuator assumed settled there)."""
        for k in range(PREV_INTERVALS, 0, -1):
            known = self._commands_over(t0 - k * self.T_ns, k)
            if known is not None:
                head = np.broadcast_to(known[0], ((PREV_INTERVALS - k) * self.S, self.A))
                return np.concatenate([head, known])
        return np.broadcast_to(cmd[0], (PREV_INTERVALS * self.S, self.A)).copy()

    def _trim_commands(self) -> None:
        # keep what pending tuples (and the next one, which needs the previous intervals)
        # still need: commands from the one in force at (oldest needed stamp - P T) on
        needed = [p0.stamp for _, p0, _, _, _ in self._pending]
        if self._poses:
            needed.append(self._poses[-1].stamp)
        if not needed or (self._cmd_t and min(needed) > self._cmd_t[-1] + self.jump_ns):
            return       # poses on a clock ahead of the commands' (theirs restarted first): not theirs to trim
        t_keep = min(needed) - PREV_INTERVALS * self.T_ns
        while len(self._cmd_t) >= 2 and self._cmd_t[1] <= t_keep:
            self._cmd_t.popleft()
            self._cmd_u.popleft()

    def _emit(self, made) -> None:
        for item in made:
            self._out.append(item)
            self.tuples_made += 1
        while len(self._out) > self.cfg.max_tuples:
            self._out.popleft()
            self._event("overflow")

    # ------------------------------------------------------------------ output
    def flush(self) -> None:
        """Finalise every pending tuple now (end of a recording)."""
        self._flush_pending(force=True)

    @property
    def num_waiting(self) -> int:
        return len(self._out)

    def pop_tuples(self, max_count: Optional[int] = None) -> Optional[TupleBatch]:
        """Finished tuples (oldest first) as one `TupleBatch`, or None if there are none."""
        n = len(self._out) if max_count is None else min(len(self._out), int(max_count))
        if n == 0:
            return None
        return _batch_of([self._out.popleft() for _ in range(n)], self.cfg.engine_dt)


def _batch_of(items: list, engine_dt: float) -> TupleBatch:
    """The `TupleBatch` of finished tuples (`StreamAligner._made`'s)."""
    cols = list(zip(*items))
    f64 = torch.float64
    return TupleBatch(
        x0=torch.as_tensor(np.stack(cols[0]), dtype=f64),
        commands=torch.as_tensor(np.stack(cols[1]), dtype=f64),
        x1=torch.as_tensor(np.stack(cols[2]), dtype=f64),
        prev_commands=torch.as_tensor(np.stack(cols[3]), dtype=f64),
        vel_known0=torch.as_tensor(np.array(cols[4], dtype=bool)),
        vel_known1=torch.as_tensor(np.array(cols[5], dtype=bool)),
        omega_measured0=torch.as_tensor(np.stack(cols[6])),
        t0=torch.as_tensor(np.array(cols[7], dtype=np.int64)),
        segment=torch.as_tensor(np.array(cols[8], dtype=np.int64)),
        engine_dt=engine_dt,
        record=torch.as_tensor(np.array(cols[9], dtype=np.int64)),
        omega_measured1=torch.as_tensor(np.stack(cols[10])),
        **_measured_cables(cols[11], cols[12]),
    )


def _measured_cables(at0, at1) -> dict:
    """A batch's cable-state fields: None where no tuple has a reading."""
    c0, c1 = np.stack(at0), np.stack(at1)
    if c0.shape[1] == 0 or not (np.isfinite(c0).any() or np.isfinite(c1).any()):
        return {}
    return {"cables0": torch.as_tensor(c0, dtype=torch.float64), "cables1": torch.as_tensor(c1, dtype=torch.float64)}


class StateEstimator:
    """Latest full rod state [R, 13] from stamped poses (+ optional IMU): velocities by a
    backward difference of the last two poses (at most ``max_age`` s apart, else zero),
    angular velocity from the IMU when one matches the newest pose stamp."""

    def __init__(self, num_rods: int, *, max_age: float = 0.5, stamp_tolerance: float = 0.002):
        self.R = int(num_rods)
        self.max_age_ns = int(max_age * NS)
        self.tol_ns = int(stamp_tolerance * NS)
        self.prev: Optional[_Pose] = None
        self.last: Optional[_Pose] = None
        self._imu: dict = {}

    def add_pose(self, stamp: int, poses: np.ndarray) -> None:
        """Already validated [R, 7] poses (x, y, z, qw, qx, qy, qz), increasing stamps."""
        arr = np.asarray(poses, dtype=np.float64)
        q = arr[:, 3:] / np.linalg.norm(arr[:, 3:], axis=-1, keepdims=True)
        pose = _Pose(int(stamp), arr[:, :3].copy(), q, np.full((self.R, 3), np.nan))
        for rod, (t, w) in self._imu.items():
            if abs(t - pose.stamp) <= self.tol_ns:
                pose.omega_imu[rod] = quat_rotate(pose.quat[rod][None], w[None])[0]
        self.prev, self.last = self.last, pose

    def add_imu(self, stamp: int, rod: int, omega_body) -> None:
        self._imu[int(rod)] = (int(stamp), np.asarray(omega_body, dtype=np.float64))
        if self.last is not None and abs(self.last.stamp - int(stamp)) <= self.tol_ns:
            self.last.omega_imu[int(rod)] = quat_rotate(self.last.quat[int(rod)][None],
                                                        self._imu[int(rod)][1][None])[0]

    @property
    def stamp(self) -> Optional[int]:
        return None if self.last is None else self.last.stamp

    def state(self) -> Optional[np.ndarray]:
        if self.last is None:
            return None
        p = self.last
        s = np.zeros((self.R, STATE_DIM))
        s[:, POS] = p.pos
        s[:, QUAT] = canonical_quat(p.quat)
        b = self.prev
        if b is not None and 0 < p.stamp - b.stamp <= self.max_age_ns:
            span = (p.stamp - b.stamp) / NS
            s[:, LIN_VEL] = (p.pos - b.pos) / span
            s[:, ANG_VEL] = quat_log_world(b.quat, p.quat) / span
        imu = np.isfinite(p.omega_imu).all(-1)
        s[imu, ANG_VEL] = p.omega_imu[imu]
        return s


def actuator_estimate(act: np.ndarray, command: np.ndarray, tau: float, duration: float,
                      max_speed: Optional[float] = None) -> np.ndarray:
    """The engine's (rate-limited) first-order actuator filter advanced exactly over
    ``duration`` s under a held command: the controller's estimate of the unmeasured
    filtered commands."""
    duration = max(0.0, float(duration))
    if duration == 0.0:
        return np.asarray(act, dtype=np.float64).copy()
    return held_command_update(act, command, max(tau, 1e-9), duration, max_speed)


# Known commands walked back before a record's first tuple: 5x the time constant's upper bound
# (1 s), so even the slowest motor has forgotten the settled start (to e^-5 of a step).
HISTORY_SECONDS = 5.0


def to_tuple_set(batch: TupleBatch, robot, *, period: Optional[float] = None, floor: bool = True,
                 fixed_rods=(), max_chain: Optional[int] = None, has_velocity: bool = False,
                 context=(), history: float = HISTORY_SECONDS):
    """`TupleBatch` -> `dataset.TupleSet` (what `ProgressiveTrainer` consumes).

    Consecutive tuples of one segment (t0 exactly T apart) form chains (``prev``/``next``
    linked, for the recurrent multiple-shooting loss). The actuator state follows the
    command record instead (`TupleBatch.record`), which runs on where the chains break:
    each tuple knows the commands of its interval and of the intervals before it
    (``prev_commands``: across a dropped pose), and ``context`` (`TupleBatch` es of the same
    stream, e.g. the held-out tuples between training blocks, or the training tuples before
    a held-out block) gives the commands of intervals without a tuple here. A record runs on
    across gaps of up to ``history`` s whose commands are all known; it starts with the
    earliest known commands at most ``history`` s before its first tuple, with the actuator
    settled at the first of them, and is cut into trajectories of ``max_chain`` intervals,
    each continuing the last (``traj_prev``). Restarting the motor settled at every break
    instead biased a motor slower than the interval (the SUPERball twin, tau 0.1 s, 60 s
    with a held-out second in five: damping +4.2 %, tau -3.4 %; one unbroken record: +1.3 /
    -0.9 %). Tuples come out ordered by segment (in order of appearance) and time, so
    appending to a stream appends to the set. Pose-only data: ``has_velocity=False`` lets
    the trainer optimise latent velocities.
    """
    from tensegrity_engine.identification.dataset import MAX_CHAIN, TupleSet

    max_chain = MAX_CHAIN if max_chain is None else int(max_chain)
    if max_chain < 1:
        raise ValueError("max_chain must be >= 1")
    n = len(batch)
    S = batch.commands.shape[1]
    T = S * batch.engine_dt if period is None else float(period)
    T_ns = int(round(T * NS))
    reach = max(1, int(math.ceil(history / T - 1e-9)))
    t0 = batch.t0.numpy()
    # segments of different records (aligners) may share an id: group by both
    _, first_seen, group = np.unique(np.stack([batch.record.numpy(), batch.segment.numpy()], 1), axis=0,
                                     return_index=True, return_inverse=True)
    group = np.argsort(np.argsort(first_seen))[group.reshape(-1)]
    order = np.lexsort((t0, group))
    ordered = bool(np.all(order == np.arange(n)))        # a stream's window: no copies
    take = (lambda x: x) if ordered else (lambda x: x[order])      # noqa: E731
    x0, x1, cmd = take(batch.x0.numpy()), take(batch.x1.numpy()), take(batch.commands.numpy())
    gyro0, gyro1 = take(batch.omega_measured0.numpy()), take(batch.omega_measured1.numpy())
    cables0, cables1 = ((None, None) if batch.cables0 is None
                        else (take(batch.cables0.numpy()), take(batch.cables1.numpy())))
    t0, seg, rec = take(t0), take(group), take(batch.record.numpy())
    known, index = _known_intervals([batch] + _batches(context), set(rec.tolist()),
                                    int(t0.min()) - reach * T_ns if n else 0, int(t0.max()) if n else -1, T_ns)
    k0 = np.array([index[(int(r), int(t))] for r, t in zip(rec, t0)], dtype=np.int64)
    linked = np.zeros(n, dtype=bool)
    if n > 1:
        linked[1:] = (seg[1:] == seg[:-1]) & (k0[1:] - k0[:-1] == 1)
    prev = np.where(linked, np.arange(n) - 1, -1)
    nxt = -np.ones(n, dtype=np.int64)
    nxt[:-1] = np.where(linked[1:], np.arange(1, n), -1)

    runs = []            # [grid chunks, act0, [(tuple, chunk)]]
    end = None           # (record, interval) where the current run's commands end
    for i in range(n):
        r, k = int(rec[i]), int(k0[i])
        gap = None if end is None or end[0] != r or k < end[1] else k - end[1]
        bridged = gap is not None and gap <= reach and all((r, end[1] + g) in known for g in range(gap))
        if bridged:
            runs[-1][0].extend(known[(r, end[1] + g)] for g in range(gap))
        else:
            back = 0
            while back < reach and (r, k - back - 1) in known:
                back += 1
            before = ([known[(r, k - g)] for g in range(back, 0, -1)]
                      or [np.broadcast_to(cmd[i][0], cmd[i].shape)])      # no interval before it known
            runs.append([before, before[0][0].copy(), []])
        runs[-1][2].append((i, len(runs[-1][0])))
        runs[-1][0].append(cmd[i])
        end = (r, k + 1)

    traj = np.zeros(n, dtype=np.int64)
    start = np.zeros(n, dtype=np.int64)
    traj_act0, traj_commands, traj_prev = [], [], []
    for chunks, act0, members in runs:
        first = len(traj_commands)
        for p in range(0, len(chunks), max_chain):
            piece = chunks[p:p + max_chain]
            traj_prev.append(-1 if p == 0 else len(traj_commands) - 1)      # a run's first: its motors assumed
            traj_act0.append(act0 if p == 0 else piece[0][0].copy())
            traj_commands.append(np.concatenate(piece))
        for i, c in members:
            traj[i] = first + c // max_chain
            start[i] = (c % max_chain) * S
    return TupleSet(
        x0=x0, x1=x1, commands=cmd, wrenches=None, traj=traj, start_step=start,
        prev=prev.astype(np.int64), next=nxt, traj_act0=traj_act0, traj_commands=traj_commands,
        has_velocity=has_velocity, period=T, dt=batch.engine_dt, fixed_rods=tuple(fixed_rods),
        floor=bool(floor), robot=robot, traj_prev=np.asarray(traj_prev, dtype=np.int64),
        gyro0=gyro0 if gyro0.any() else None, gyro1=gyro1 if gyro1.any() else None,
        cables0=cables0, cables1=cables1, traj_act0_assumed=np.asarray(traj_prev, dtype=np.int64) < 0)


def _batches(context) -> list:
    if isinstance(context, TupleBatch):
        return [context]
    return [b for b in context if b is not None and len(b)]


def stamp_intervals(stamps, period_ns: float) -> np.ndarray:
    """Each of a record's increasing ``stamps`` (ns) as its interval counted from the first:
    each step their spacing in whole intervals, at least one. A clock a little off T (a mocap
    at 99.98 Hz stamped by its own clock) still tiles the record, where exact multiples of T
    would link nothing."""
    steps = np.maximum(np.rint(np.diff(np.asarray(stamps, dtype=np.float64)) / period_ns), 1).astype(np.int64)
    return np.concatenate([[0], np.cumsum(steps)])


def _known_intervals(batches, records: set, lo: int, hi: int, T_ns: int) -> tuple[dict, dict]:
    """({(record, interval): its commands [S, A]}, {(record, t0): interval}) known from the
    tuples of ``batches`` in ``records`` with t0 in [lo, hi] (and a little after: their
    ``prev_commands`` reach back): each tuple's own interval, then those its
    ``prev_commands`` cover. Intervals are counted along each record's stamps
    (`stamp_intervals`)."""
    rows = []            # (record, t0, commands, prev_commands)
    for b in batches:
        t, g = b.t0.numpy(), b.record.numpy()
        pick = np.flatnonzero((t >= lo - T_ns) & (t <= hi + 2 * T_ns) & np.isin(g, list(records)))
        cmd, prev_cmd = b.commands.numpy(), b.prev_commands.numpy()
        rows += [(int(g[i]), int(t[i]), cmd[i], prev_cmd[i]) for i in pick]
    index = {}
    for r in {row[0] for row in rows}:
        stamps = np.unique([row[1] for row in rows if row[0] == r])
        index.update(zip(((r, int(t)) for t in stamps), stamp_intervals(stamps, T_ns).tolist()))
    known, before = {}, {}
    for r, t, cmd, prev_cmd in rows:
        k = index[(r, t)]
        known[(r, k)] = cmd
        S = cmd.shape[0]
        P = prev_cmd.shape[0] // S
        for j in range(P):
            before.setdefault((r, k - (P - j)), prev_cmd[j * S:(j + 1) * S])
    for key, value in before.items():
        known.setdefault(key, value)
    return known, index


def stamp_to_ns(sec: int, nanosec: int) -> int:
    return int(sec) * NS + int(nanosec)


def ns_to_sec(ns: int) -> float:
    return ns / NS


def is_finite_number(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
