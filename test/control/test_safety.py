"""Command limits and the latched hold a controller enforces on hardware."""
import math

import numpy as np
import pytest

from tensegrity_engine.control.safety import (MODEL_REJECTED, NS, OPERATOR, STALE_POSES, CommandLimits,
                                              HoldLatch)
from tensegrity_engine.physics.config import ConfigError, robot_from_dict, robot_to_dict


def test_limits_clip_range_rate_and_replace_nonfinite():
    lim = CommandLimits([0.1, 0.1], [0.5, 0.5], max_rate=0.2)
    u, bound = lim.apply([0.3, 0.3], np.array([0.3, 0.3]), 0.1)
    assert not bound and np.allclose(u, [0.3, 0.3])
    u, bound = lim.apply([0.9, 0.0], np.array([0.3, 0.3]), 0.1)   # 0.02 m per 0.1 s at most
    assert bound and np.allclose(u, [0.32, 0.28])
    u, bound = lim.apply([0.9, 0.0], np.array([0.49, 0.11]), 1.0)  # rate allows it: range clips
    assert bound and np.allclose(u, [0.5, 0.1])
    u, bound = lim.apply([math.nan, 0.2], np.array([0.4, 0.3]), 0.1)
    assert bound and np.allclose(u, [0.4, 0.28])
    u, bound = lim.apply([math.inf, 0.2])                          # no previous: the range's middle
    assert bound and np.allclose(u, [0.3, 0.2])
    with pytest.raises(ValueError):
        CommandLimits([0.5], [0.1])


def test_rate_limit_comes_from_the_robot_yaml_and_round_trips(superball):
    assert math.isinf(superball.actuator.max_command_rate)
    data = robot_to_dict(superball)
    data["actuator"]["max_command_rate"] = 0.05
    robot = robot_from_dict(data)
    assert robot.actuator.max_command_rate == 0.05
    assert robot_from_dict(robot_to_dict(robot)).actuator.max_command_rate == 0.05
    assert CommandLimits.for_robot(robot).max_rate == 0.05
    assert CommandLimits.for_robot(robot, max_rate=0.01).max_rate == 0.01   # the tighter one
    assert CommandLimits.for_robot(superball, max_rate=0.3).max_rate == 0.3
    data["actuator"]["max_command_rate"] = -1.0
    with pytest.raises(ConfigError, match="max_command_rate"):
        robot_from_dict(data)


def test_hold_latches_until_an_explicit_resume_with_fresh_poses():
    latch = HoldLatch(pose_timeout_ns=int(0.5 * NS))
    assert not latch.check(100 * NS)                       # unarmed before the first pose
    latch.pose_received(1 * NS)
    assert not latch.check(int(1.4 * NS))
    assert latch.check(int(1.6 * NS)) and latch.reason == STALE_POSES
    assert "0.60 s old" in latch.detail and latch.age_at_trip_s == pytest.approx(0.6)
    assert not latch.check(int(1.9 * NS)) and latch.age_at_trip_s == pytest.approx(0.6)   # the trip's age stays
    assert not latch.trip(MODEL_REJECTED, "later reason", 2 * NS)   # the first reason stays
    assert latch.reason == STALE_POSES
    ok, why = latch.resume(2 * NS)                          # poses still stale
    assert not ok and latch.holding and "still holding" in why
    latch.pose_received(int(2.1 * NS))                      # poses back: still holding ...
    assert latch.holding and latch.age_at_trip_s == pytest.approx(0.6)   # poses during the hold leave it
    ok, why = latch.resume(int(2.2 * NS))                   # ... until resumed
    assert ok and not latch.holding and STALE_POSES in why and latch.age_at_trip_s is None
    assert latch.trip(OPERATOR, "hold service", 3 * NS) and latch.trips[OPERATOR] == 1
    assert latch.age_at_trip_s is None


def test_without_a_watchdog_only_trips_hold():
    latch = HoldLatch(pose_timeout_ns=0)
    latch.pose_received(0)
    assert not latch.check(10**6 * NS)
    assert latch.trip(OPERATOR, "hold", 1)
    assert latch.resume(2) == (True, f"resumed (was holding: {OPERATOR})")
