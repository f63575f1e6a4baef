"""A seeded stream of clean and hostile messages for every topic the nodes subscribe to.

`HostileStream` interleaves a clean 10 Hz robot (poses, one gyro per rod, the cables'
encoders and load cells, commands) with
malformed and hostile messages: NaN/inf, wrong sizes (0, R-1, R+1, 1000), zero and
non-unit quaternions, 1e30 values, negative and malformed stamps, duplicate and
out-of-order stamps, clock jumps both ways, wrong frame ids and cable names, forged
parameters and NaN goals. Each message carries whether a node that applies the project's
checks must accept it (`Item.valid`); the fuzz harness compares that with what every node
counted. Clock jumps are valid (a restarted clock; the stream starts over from it) and
move the clean clock with them.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterator, Optional

import numpy as np

from . import conversions as conv

NS = conv.NS
TICK_NS = 100_000_000          # the clean stream's pose period (10 Hz)

POSE_KINDS = ("nan", "inf", "size_0", "size_short", "size_long", "size_1000", "zero_quat", "long_quat",
              "huge_position", "wrong_frame", "no_frame", "negative_stamp", "bad_nanosec",
              "duplicate", "out_of_order", "jump_forward", "jump_back")
IMU_KINDS = ("nan", "inf", "huge_rate", "unknown_rod", "negative_rod", "no_frame", "other_frame",
             "long_quat", "nan_quat", "negative_stamp", "bad_nanosec", "duplicate", "out_of_order")
CABLE_KINDS = ("nan_all", "inf", "huge_tension", "negative_rest", "unknown_name", "duplicate_name",
               "values_mismatch", "nothing", "negative_stamp", "bad_nanosec", "duplicate", "out_of_order")
COMMAND_KINDS = ("nan", "inf", "size_0", "size_short", "size_long", "size_1000", "huge", "negative",
                 "unknown_name", "duplicate_name", "names_values_mismatch", "negative_stamp",
                 "bad_nanosec", "duplicate", "out_of_order")
PARAMETER_KINDS = ("wrong_robot", "negative", "huge", "nan", "inf", "fewer_values", "unknown_name",
                   "unparsable_name", "duplicate_name", "widened_bounds", "bounds_length", "empty",
                   "thousand_names", "valid")
GOAL_KINDS = ("nan", "inf", "huge", "too_fast", "wrong_frame", "valid")
TOPICS = ("poses", "imu", "cables", "commands", "parameters", "goals")


@dataclasses.dataclass
class Item:
    topic: str        # one of TOPICS
    msg: object
    valid: bool       # a node applying the project's checks must accept it
    kind: str         # "clean" or the hostile kind
    # A node sees the topics in whatever order its executor takes them; what it accepts
    # depends on that order only across a pose tick (the command watermark) or a clock
    # jump (a restart forgets the other streams). The harness lets the nodes catch up
    # at these barriers, so the verdict of every message is determined.
    barrier_before: bool = False
    barrier_after: bool = False


def _stamp(msg, ns: int, *, sec: Optional[int] = None, nanosec: Optional[int] = None) -> None:
    conv.ns_to_stamp(max(ns, 0), msg.header.stamp)
    if sec is not None:
        msg.header.stamp.sec = int(sec)
    if nanosec is not None:
        msg.header.stamp.nanosec = int(nanosec)


class HostileStream:
    """``items(n)`` yields about ``n`` messages, about half of them clean."""

    def __init__(self, robot, rest_state: np.ndarray, seed: int = 0, *, hostile_per_tick: float = 3.0,
                 pose_frame: str = "world", start_ns: int = 1000 * NS):
        from tensegrity_engine.physics.params import PhysicalParameters

        self.robot, self.rng = robot, np.random.default_rng(seed)
        self.rest = np.asarray(rest_state, dtype=np.float64)
        self.R, self.A = robot.num_rods, robot.num_actuated
        self.cable_names = [robot.cable_names[i] for i in robot.actuated_indices]
        self.all_cables = list(robot.cable_names)
        self.low, self.high = robot.command_low, robot.command_high
        self.frame = pose_frame
        self.rate = float(hostile_per_tick)
        self.t = int(start_ns)
        self.last: dict = {}           # stream key -> last accepted stamp (None: unknown)
        self.nominal = PhysicalParameters(robot)

    # ------------------------------------------------------------------ clean messages
    def _pose_msg(self, t: int, arr: Optional[np.ndarray] = None):
        state = self.rest.copy()
        state[:, 0:3] += self.rng.normal(0.0, 1e-4, (self.R, 3))
        msg = conv.rod_state_to_pose_array(state, t, frame_id=self.frame)
        return msg

    def _imu_msg(self, t: int, rod: int):
        state = self.rest.copy()
        state[:, 10:13] = self.rng.normal(0.0, 0.1, (self.R, 3))
        return conv.rod_imu_messages(state, t)[rod]

    def _cables_msg(self, t: int):
        """Every cable's rest length and tension; one load cell missing (NaN: a valid reading)."""
        C = len(self.all_cables)
        rest = self.robot.cable_rest_length * self.rng.uniform(0.9, 1.1, C)
        tension = self.rng.uniform(0.0, 500.0, C)
        tension[int(self.rng.integers(C))] = math.nan
        return conv.cable_states_message(rest, tension, t, self.all_cables)

    def _command(self, t: int, values=None, names=()):
        u = self.low + (self.high - self.low) * self.rng.uniform(0.1, 0.9, self.A) if values is None else values
        msg = conv.make_cable_command(u, t, cable_names=names, frame_id="fuzz")
        return msg

    def clean_tick(self) -> list:
        """One 100 ms step of the clean robot: a pose, a command, the cables' states, gyros of
        some rods."""
        self.t += TICK_NS
        out = [Item("poses", self._pose_msg(self.t), True, "clean", barrier_before=True),
               Item("commands", self._command(self.t), True, "clean"),
               Item("cables", self._cables_msg(self.t), True, "clean")]
        self.last["pose"] = self.last["command"] = self.last["cables"] = self.t
        for rod in np.flatnonzero(self.rng.uniform(size=self.R) < 0.5):
            out.append(Item("imu", self._imu_msg(self.t, int(rod)), True, "clean"))
            self.last[("imu", int(rod))] = self.t
        return out

    # ------------------------------------------------------------------ hostile messages
    def _stamp_kind(self, kind: str, key) -> Optional[int]:
        """Stamp of a duplicate / out-of-order message of stream ``key`` (None: unknown)."""
        last = self.last.get(key)
        if last is None:
            return None
        return last if kind == "duplicate" else last - 30_000_000

    def _hostile_pose(self, kind: str) -> Optional[Item]:
        t = self.t
        msg = self._pose_msg(t)
        poses = list(msg.poses)
        if kind in ("nan", "inf"):
            p = poses[int(self.rng.integers(self.R))]
            setattr(p.position if self.rng.uniform() < 0.5 else p.orientation, "x",
                    math.nan if kind == "nan" else -math.inf)
        elif kind.startswith("size_"):
            n = {"size_0": 0, "size_short": self.R - 1, "size_long": self.R + 1, "size_1000": 1000}[kind]
            msg.poses = [poses[i % self.R] for i in range(n)]
        elif kind == "zero_quat":
            o = poses[0].orientation
            o.w = o.x = o.y = o.z = 0.0
        elif kind == "long_quat":
            o = poses[-1].orientation
            o.w, o.x, o.y, o.z = 2.0 * o.w, 2.0 * o.x, 2.0 * o.y, 2.0 * o.z
        elif kind == "huge_position":
            poses[0].position.z = 1e30
        elif kind == "wrong_frame":
            msg.header.frame_id = "map" if self.rng.uniform() < 0.5 else "x" * 10_000
        elif kind == "no_frame":
            msg.header.frame_id = ""
        elif kind == "negative_stamp":
            _stamp(msg, t, sec=-int(self.rng.integers(1, 2**31 - 1)))
        elif kind == "bad_nanosec":
            _stamp(msg, t, nanosec=int(self.rng.integers(NS, 2**32)))
        elif kind in ("duplicate", "out_of_order"):
            stamp = self._stamp_kind(kind, "pose")
            if stamp is None:
                return None
            _stamp(msg, stamp)
        elif kind in ("jump_forward", "jump_back"):
            if kind == "jump_back" and self.t < 300 * NS:
                kind = "jump_forward"
            self.t += 100 * NS if kind == "jump_forward" else -50 * NS
            _stamp(msg, self.t)
            # every other stream's order is unknown until its next clean message
            self.last = {"pose": self.t}
            return Item("poses", msg, True, kind, barrier_before=True, barrier_after=True)
        return Item("poses", msg, False, kind)

    def _hostile_imu(self, kind: str) -> Optional[Item]:
        rod = int(self.rng.integers(self.R))
        msg = self._imu_msg(self.t, rod)
        w = msg.angular_velocity
        if kind == "nan":
            w.y = math.nan
        elif kind == "inf":
            w.z = math.inf
        elif kind == "huge_rate":
            w.x = -1e30
        elif kind == "unknown_rod":
            msg.header.frame_id = f"rod_{self.R + int(self.rng.integers(0, 10**6))}"
        elif kind == "negative_rod":
            msg.header.frame_id = "rod_-1"
        elif kind == "no_frame":
            msg.header.frame_id = ""
        elif kind == "other_frame":
            msg.header.frame_id = "imu_link"
        elif kind == "long_quat":
            msg.orientation.w, msg.orientation.x = 3.0, 1.0
        elif kind == "nan_quat":
            msg.orientation.z = math.nan
        elif kind == "negative_stamp":
            _stamp(msg, self.t, sec=-1)
        elif kind == "bad_nanosec":
            _stamp(msg, self.t, nanosec=2**32 - 1)
        elif kind in ("duplicate", "out_of_order"):
            stamp = self._stamp_kind(kind, ("imu", rod))
            if stamp is None:
                return None
            _stamp(msg, stamp)
        return Item("imu", msg, False, kind)

    def _hostile_cables(self, kind: str) -> Optional[Item]:
        msg = self._cables_msg(self.t)
        position, effort = list(msg.position), list(msg.effort)
        if kind == "nan_all":
            position, effort = [math.nan] * len(position), [math.nan] * len(effort)
        elif kind == "inf":
            effort[0] = math.inf
        elif kind == "huge_tension":
            effort[-1] = 1e30
        elif kind == "negative_rest":
            position[0] = -0.5
        elif kind == "unknown_name":
            msg.name = list(msg.name[:-1]) + ["warp_drive"]
        elif kind == "duplicate_name":
            msg.name = [msg.name[0]] + list(msg.name[:-1])
        elif kind == "values_mismatch":
            effort = effort[:-1]
        elif kind == "nothing":
            position, effort = [], []
        elif kind == "negative_stamp":
            _stamp(msg, self.t, sec=-3)
        elif kind == "bad_nanosec":
            _stamp(msg, self.t, nanosec=2**31)
        else:
            stamp = self._stamp_kind(kind, "cables")
            if stamp is None:
                return None
            _stamp(msg, stamp)
        msg.position, msg.effort = position, effort
        return Item("cables", msg, False, kind)

    def _hostile_command(self, kind: str) -> Optional[Item]:
        t, A = self.t, self.A
        u = 0.5 * (self.low + self.high)
        if kind in ("nan", "inf"):
            u = u.copy()
            u[int(self.rng.integers(A))] = math.nan if kind == "nan" else math.inf
            msg = self._command(t, u)
        elif kind.startswith("size_"):
            n = {"size_0": 0, "size_short": A - 1, "size_long": A + 1, "size_1000": 1000}[kind]
            msg = self._command(t, np.full(n, float(u[0])))
        elif kind == "huge":
            msg = self._command(t, np.full(A, 1e30))
        elif kind == "negative":
            msg = self._command(t, -np.abs(u))
        elif kind == "unknown_name":
            msg = self._command(t, u, names=self.cable_names[:-1] + ["warp_drive"])
        elif kind == "duplicate_name":
            msg = self._command(t, u, names=[self.cable_names[0]] + self.cable_names[:-1])
        elif kind == "names_values_mismatch":
            msg = self._command(t, u[:-1], names=self.cable_names)
        elif kind == "negative_stamp":
            msg = self._command(t, u)
            _stamp(msg, t, sec=-7)
        elif kind == "bad_nanosec":
            msg = self._command(t, u)
            _stamp(msg, t, nanosec=1_500_000_000)
        else:
            stamp = self._stamp_kind(kind, "command")
            if stamp is None:
                return None
            msg = self._command(stamp, u)
        return Item("commands", msg, False, kind)

    def _parameters(self, kind: str) -> Item:
        msg = conv.params_to_msg(self.nominal, self.robot.name, self.t, stage="fuzz")
        names, values = list(msg.names), list(msg.values)
        i = int(self.rng.integers(len(names)))
        if kind == "wrong_robot":
            msg.robot_name = "not_" + self.robot.name
        elif kind == "negative":        # below a bound that is not negative itself
            i = int(self.rng.choice(np.flatnonzero(np.asarray(msg.lower_bounds) >= 0.0)))
            values[i] = -abs(values[i]) - 1.0
        elif kind in ("huge", "nan", "inf"):
            values[i] = {"huge": 1e30, "nan": math.nan, "inf": -math.inf}[kind]
        elif kind == "fewer_values":
            values = values[:-1]
        elif kind == "unknown_name":
            names[i] = "warp_drive"
        elif kind == "unparsable_name":
            names[i] = names[i] + "[x]"
        elif kind == "duplicate_name":
            names[i] = names[(i + 1) % len(names)]
        elif kind == "widened_bounds":
            msg.lower_bounds = [-1e40] * len(names)
        elif kind == "bounds_length":
            msg.upper_bounds = [1.0]
        elif kind == "empty":
            names, values = [], []
            msg.lower_bounds, msg.upper_bounds = [], []
        elif kind == "thousand_names":
            names = [f"cable_stiffness[{j}]" for j in range(1000)]
            values = [1.0] * 1000
            msg.lower_bounds, msg.upper_bounds = [], []
        elif kind == "valid":
            scale = float(np.exp(self.rng.uniform(-0.2, 0.2)))
            values = [v * scale if n.startswith("cable_stiffness") else v for n, v in zip(names, values)]
        msg.names, msg.values = names, values
        return Item("parameters", msg, kind == "valid", kind)

    def _goal(self, kind: str) -> Item:
        from geometry_msgs.msg import Vector3Stamped

        msg = Vector3Stamped()
        msg.header.frame_id = self.frame
        v = msg.vector
        v.x, v.y = (float(x) for x in self.rng.uniform(-1.0, 1.0, 2))
        if kind == "nan":
            v.x = math.nan
        elif kind == "inf":
            v.y = math.inf
        elif kind == "huge":
            v.x = 1e30
        elif kind == "too_fast":
            v.x, v.y = 8.0, 8.0
        elif kind == "wrong_frame":
            msg.header.frame_id = "base_link"
        return Item("goals", msg, kind == "valid", kind)

    def hostile(self) -> Optional[Item]:
        """One random hostile (or rare valid parameter / goal) message."""
        topic = self.rng.choice(TOPICS, p=(0.3, 0.2, 0.15, 0.25, 0.05, 0.05))
        kinds = {"poses": POSE_KINDS, "imu": IMU_KINDS, "cables": CABLE_KINDS, "commands": COMMAND_KINDS,
                 "parameters": PARAMETER_KINDS, "goals": GOAL_KINDS}[topic]
        kind = str(self.rng.choice(kinds))
        return {"poses": self._hostile_pose, "imu": self._hostile_imu, "cables": self._hostile_cables,
                "commands": self._hostile_command, "parameters": self._parameters, "goals": self._goal}[topic](kind)

    def items(self, n: int) -> Iterator[Item]:
        sent = 0
        while sent < n:
            batch = self.clean_tick()
            for _ in range(int(self.rng.poisson(self.rate))):
                item = self.hostile()
                if item is not None:
                    batch.append(item)
            # a clock jump inside the batch moves the clean clock: the clean messages of
            # this tick were already stamped, so they keep their place before it
            for item in batch:
                yield item
                sent += 1

    def clean(self, ticks: int, jump_ns: int = 1000 * NS) -> list:
        """A clean stretch after a forward clock jump (the fuzz run's recovery check)."""
        self.t += jump_ns
        self.last = {}
        return [item for _ in range(ticks) for item in self.clean_tick()]
