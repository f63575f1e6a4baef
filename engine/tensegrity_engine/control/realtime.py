"""A controller on its own clock, for a robot that does not wait (ROS-free; the
mppi_controller node drives it).

Every ``period`` a tick asks for the next command. It takes effect at
``t_valid = tick + plan_budget + command_latency`` -- when planning is over and the
message has reached the robot -- and is stamped so. It is planned from the state the
model *predicts* for t_valid: the newest measured state rolled through the commands
already sent (`latency.predict_at`); a late or missing pose only makes that roll longer.
Planning is anytime: it stops iterating once the budget is spent. Before a model is
trusted, the excitation signal is sampled at t_valid instead.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

import numpy as np

from tensegrity_engine.control.latency import NS, CommandHistory, predict_at


# ns: an encoder reading this much older than the last one taken starts a new stream (a
# restarted robot or bag), as `measurements.StampOrder` takes a pose stamp's jump
STREAM_RESTART_NS = 5 * NS


class TickSchedule:
    """Ticks at the multiples of ``period`` on a clock that may pause (sim time), jump
    ahead (a slow tick) or go back (a restarted clock)."""

    def __init__(self, period: float):
        self.period = int(round(period * NS))
        self.next: Optional[int] = None
        self.missed = 0

    def due(self, now_ns: int) -> Optional[int]:
        """The tick due at ``now_ns`` (the newest one passed; ticks skipped since the last
        are counted in ``missed``), or None before the next."""
        if now_ns < 0:
            return None
        if self.next is None or now_ns < self.next - 2 * self.period:     # start, or the clock went back
            self.next = -(-now_ns // self.period) * self.period
        if now_ns < self.next:
            return None
        skipped = (now_ns - self.next) // self.period
        self.missed += int(skipped)
        tick = self.next + skipped * self.period
        self.next = tick + self.period
        return tick

    def wait_s(self, now_ns: int) -> float:
        """How long until the next tick (a short poll when unknown)."""
        return 0.005 if self.next is None or now_ns < 0 else max(0.0, (self.next - now_ns) / NS)


@dataclasses.dataclass
class TickResult:
    command: np.ndarray
    valid_ns: int            # stamp: when the command takes effect
    planned: bool            # MPPI (else excitation)
    state: np.ndarray        # the state planned from (predicted for valid_ns)
    act: np.ndarray
    predicted_s: float       # how far the measurement was rolled ahead (s)
    plan_s: float            # wall time spent planning
    iterations: int


class RealTimePlanner:
    """Commands for ticks of a fixed period, planned from the predicted state.

    ``mpc``: an `MPPIController` (its dynamics predict when they have ``advance``);
    ``excitation``: an `ExcitationPolicy` (``command_at(t)``); ``initial`` [A]: the command
    in force before the first one (the actuators settled at it)."""

    def __init__(self, robot, mpc, excitation, initial, *, period: float = 0.1, plan_budget: float = 0.06,
                 command_latency: float = 0.01, compensate: bool = True):
        if not 0 < plan_budget < period:
            raise ValueError(f"plan_budget must be in (0, period={period}), got {plan_budget}")
        self.robot, self.mpc, self.excitation = robot, mpc, excitation
        self.period, self.plan_budget = float(period), float(plan_budget)
        self.command_latency, self.compensate = float(command_latency), bool(compensate)
        self.history = CommandHistory(initial)
        self.tau = float(robot.actuator.time_constant)
        self.max_speed: Optional[float] = float(robot.actuator.max_speed)
        self.delay = float(robot.actuator.delay)
        self.gain = np.broadcast_to(np.asarray(robot.actuator.gain, dtype=np.float64), (robot.num_actuated,)).copy()
        self.offset = np.broadcast_to(np.asarray(robot.actuator.offset, dtype=np.float64),
                                      (robot.num_actuated,)).copy()
        self._act_ref: Optional[tuple[int, np.ndarray]] = None    # (t, actuator state) anchor
        self._measured_ns: Optional[int] = None    # stamp of the last encoder reading taken
        self._reading: Optional[tuple[int, np.ndarray]] = None   # taken, not yet reached by the estimate
        self.encoder_readings = 0                  # readings the estimate restarted from
        self.excite_start_ns: Optional[int] = None

    def warm_up(self, state=None) -> float:
        """Run one plan and one prediction so the first real tick is not the slow one (a
        planner's first call allocates, the native kernel loads): seconds it took. The
        planner's warm start and random stream are reset afterwards."""
        from tensegrity_engine.groundtruth.environments import face_down_pose

        t0 = time.perf_counter()
        s = face_down_pose(self.robot) if state is None else np.asarray(state, dtype=np.float64)
        act = self.history.initial
        self.mpc.plan(s, act)
        if hasattr(self.mpc.dynamics, "advance"):
            self.mpc.dynamics.advance(s, act, np.repeat(act[None], 10, 0))
        self.mpc.reset()
        return time.perf_counter() - t0

    @property
    def lead_ns(self) -> int:
        """From a tick to the moment its command takes effect."""
        return int(round((self.plan_budget + self.command_latency) * NS))

    def set_model(self, params) -> None:
        """The actuator values the estimate follows (the planner's model is swapped by the caller)."""
        def scalar(name):
            return float(np.asarray(params.value(name).detach().cpu()).reshape(-1)[0])
        def per_actuator(name):
            value = np.asarray(params.value(name).detach().cpu(), dtype=np.float64).reshape(-1)
            return np.broadcast_to(value, self.gain.shape).copy()
        self.tau, self.max_speed = scalar("actuator_time_constant"), scalar("actuator_max_speed")
        self.delay = scalar("actuator_delay")
        self.gain, self.offset = per_actuator("actuator_gain"), per_actuator("actuator_offset")

    def restart(self) -> None:
        """The clock went back (a restarted simulation or bag): the commands sent, the
        actuator estimate and the excitation's start belong to the old clock (a command
        stamped on the new one would not follow them); the planner's warm start too."""
        self.history = CommandHistory(self.history.initial)
        self._act_ref = self._measured_ns = self._reading = None
        self.excite_start_ns = None
        self.mpc.reset()

    def sent(self, stamp_ns: int, command) -> None:
        """Record a command that went out (after the caller's limits): it is in force from its stamp."""
        self.history.add(stamp_ns, command)

    def actuator_at(self, t_ns: int) -> np.ndarray:
        """The estimated actuator state at ``t_ns`` (first call: settled at the initial command),
        from the newest encoder reading at or before ``t_ns`` where one was taken."""
        if self._reading is not None and self._reading[0] <= t_ns:
            self._act_ref, self._reading = self._reading, None
            self.encoder_readings += 1
        if self._act_ref is None:
            self._act_ref = (int(t_ns), self.history.initial.copy())
        t0, a0 = self._act_ref
        if t_ns < t0:
            return a0.copy()
        act = self.history.actuator_at(a0, t0, int(t_ns), self.tau, self.max_speed, self.delay)
        self._act_ref = (int(t_ns), act)
        return act

    def measured_rest_lengths(self, t_ns: int, rest_lengths) -> bool:
        """The winches' encoders at ``t_ns``: rest lengths [C] in config order, NaN where a
        cable has none. Where every actuated cable has one, the actuator estimate restarts
        from them (the model's gain and offset map a rest length to its actuator state), so
        what the first-order model gets wrong between commands (a winch's speed limit or dead
        band it lacks, a time constant a little off) stops at the last reading instead of
        adding up. The estimate restarts there once it is asked for a time at or after the
        reading (a reading newer than the pose a tick plans from waits for its pose: it must not
        be rolled on twice). True if taken; a reading older than the last one taken is not,
        unless by more than a clock jump (`STREAM_RESTART_NS`: a restarted stream)."""
        rest = np.asarray(rest_lengths, dtype=np.float64).reshape(-1)
        if rest.shape[0] != self.robot.num_cables:
            raise ValueError(f"{rest.shape[0]} rest lengths for {self.robot.num_cables} cables")
        rest = rest[self.robot.actuated_indices]
        last = self._measured_ns
        if not np.isfinite(rest).all() or (last is not None and last - STREAM_RESTART_NS <= t_ns < last):
            return False
        self._reading = (int(t_ns), (rest - self.offset) / self.gain)
        self._measured_ns = int(t_ns)
        return True

    def tick(self, tick_ns: int, pose_ns: int, state, mode: str, now_ns: Optional[int] = None) -> TickResult:
        """The command for the tick at ``tick_ns`` from the state measured at ``pose_ns``;
        ``mode`` "mppi" or "excitation". ``now_ns``: the robot's clock (the stamps' clock)
        when called: time the tick already lost (a late timer, waiting for its pose) comes off
        the planning budget, which is then spent in wall seconds: the two agree on a robot
        and in a simulation at real-time factor 1 (its /clock steps, 10 ms in the sim2sim,
        can hide up to one step of lateness)."""
        t0 = time.perf_counter()
        lost = 0.0 if now_ns is None else max(0.0, (int(now_ns) - int(tick_ns)) / NS)
        valid = int(tick_ns) + self.lead_ns
        act = self.actuator_at(pose_ns)
        state = np.asarray(state, dtype=np.float64)
        predicted = 0.0
        if self.compensate and hasattr(self.mpc.dynamics, "advance") and valid > pose_ns:
            state, act = predict_at(self.mpc.dynamics, state, act, self.history, int(pose_ns), valid)
            predicted = (valid - pose_ns) / NS
        if self.excite_start_ns is None:
            self.excite_start_ns = valid
        if mode == "excitation":
            u = np.asarray(self.excitation.command_at((valid - self.excite_start_ns) / NS), dtype=np.float64)
            return TickResult(u, valid, False, state, act, predicted, time.perf_counter() - t0, 0)
        left = self.plan_budget - lost - (time.perf_counter() - t0)
        sent = self.history.last                      # what runs until this command: as sent, not as planned
        u = self.mpc.plan(state, act, budget=max(left, 0.0), in_force=None if sent is None else sent[1])
        info = self.mpc.planner.last_info
        return TickResult(np.asarray(u, dtype=np.float64), valid, True, state, act, predicted,
                          time.perf_counter() - t0, int(info.get("iterations", 0)))
