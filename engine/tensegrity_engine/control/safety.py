"""What a controller on hardware must enforce whatever its planner says: command range
and rate limits from the robot's YAML, and a latched hold (stale poses, a rejected model,
an operator's request) that only an explicit resume clears.

Times are integer nanoseconds of the caller's clock (ROS time on a robot, sim time in a
simulation), so the same logic serves both and tests need no clock.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from tensegrity_engine.physics.config import RobotConfig

NS = 1_000_000_000

# Why a controller holds. Latched: the first reason stays until an explicit resume.
STALE_POSES = "stale_poses"
MODEL_REJECTED = "model_rejected"
PLANNING_FAILED = "planning_failed"
OPERATOR = "operator"
HOLD_REASONS = (STALE_POSES, MODEL_REJECTED, PLANNING_FAILED, OPERATOR)


class CommandLimits:
    """Per-cable command range and a rate limit on the commanded target (m/s)."""

    def __init__(self, low, high, max_rate: float = math.inf):
        self.low = np.asarray(low, dtype=np.float64)
        self.high = np.asarray(high, dtype=np.float64)
        if self.low.shape != self.high.shape or not (self.low <= self.high).all():
            raise ValueError("command limits: low and high must have one value per cable, low <= high")
        if not max_rate > 0:
            raise ValueError(f"command rate limit must be > 0, got {max_rate!r}")
        self.max_rate = float(max_rate)

    @classmethod
    def for_robot(cls, robot: RobotConfig, max_rate: Optional[float] = None) -> "CommandLimits":
        """The robot YAML's command ranges and `actuator.max_command_rate`, or the tighter of
        it and ``max_rate``."""
        rate = robot.actuator.max_command_rate
        if max_rate is not None and max_rate > 0:
            rate = min(rate, float(max_rate))
        return cls(robot.command_low, robot.command_high, rate)

    def apply(self, command, previous: Optional[np.ndarray] = None, dt: float = 0.0
              ) -> tuple[np.ndarray, bool]:
        """(the command within range and within ``max_rate * dt`` of ``previous``, whether
        any limit bound). A non-finite entry keeps the previous value (or the range's
        middle without one)."""
        u = np.array(command, dtype=np.float64).reshape(self.low.shape)
        fallback = previous if previous is not None else 0.5 * (self.low + self.high)
        bad = ~np.isfinite(u)
        limited = bool(bad.any())
        u = np.where(bad, fallback, u)
        if previous is not None and math.isfinite(self.max_rate):
            step = self.max_rate * max(float(dt), 0.0)
            stepped = np.clip(u, previous - step, previous + step)
            limited |= bool((stepped != u).any())
            u = stepped
        clipped = np.clip(u, self.low, self.high)
        limited |= bool((clipped != u).any())
        return clipped, limited


class HoldLatch:
    """The controller holds from the first trip until `resume` succeeds.

    ``pose_timeout_ns`` (0: no watchdog) trips `STALE_POSES` once poses are older than it;
    the watchdog is armed by the first pose (before it, there is nothing to control)."""

    def __init__(self, pose_timeout_ns: int):
        self.pose_timeout_ns = int(pose_timeout_ns)
        self.reason: Optional[str] = None
        self.detail = ""
        self.since_ns: Optional[int] = None
        self.last_pose_ns: Optional[int] = None
        # the newest pose's age when the watchdog started this hold (None for other reasons):
        # kept, since poses that arrive during the hold move last_pose_ns
        self.age_at_trip_s: Optional[float] = None
        self.trips = {r: 0 for r in HOLD_REASONS}

    @property
    def holding(self) -> bool:
        return self.reason is not None

    def pose_received(self, now_ns: int) -> None:
        self.last_pose_ns = int(now_ns)

    def pose_age_s(self, now_ns: int) -> Optional[float]:
        return None if self.last_pose_ns is None else (int(now_ns) - self.last_pose_ns) / NS

    def trip(self, reason: str, detail: str, now_ns: int) -> bool:
        """Hold for ``reason``; True if this started a hold (False: already holding)."""
        if reason not in HOLD_REASONS:
            raise ValueError(f"unknown hold reason {reason!r}")
        if self.holding:
            return False
        self.reason, self.detail, self.since_ns = reason, detail, int(now_ns)
        self.age_at_trip_s = None
        self.trips[reason] += 1
        return True

    def check(self, now_ns: int) -> bool:
        """The watchdog: trips on stale poses; True if this started a hold."""
        age = self.pose_age_s(now_ns)
        if self.pose_timeout_ns <= 0 or age is None or age * NS <= self.pose_timeout_ns:
            return False
        started = self.trip(STALE_POSES, f"newest pose {age:.2f} s old (timeout "
                            f"{self.pose_timeout_ns / NS:g} s)", now_ns)
        if started:
            self.age_at_trip_s = age
        return started

    def resume(self, now_ns: int) -> tuple[bool, str]:
        """Clear the hold if the poses are fresh again: (resumed, why / why not)."""
        if not self.holding:
            return True, "not holding"
        age = self.pose_age_s(now_ns)
        if self.pose_timeout_ns > 0 and (age is None or age * NS > self.pose_timeout_ns):
            return False, ("no pose received yet" if age is None else
                           f"poses are {age:.2f} s old (timeout {self.pose_timeout_ns / NS:g} s): still holding")
        was = self.reason
        self.reason, self.detail, self.since_ns, self.age_at_trip_s = None, "", None, None
        return True, f"resumed (was holding: {was})"
