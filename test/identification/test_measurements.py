"""The measurement checks the identifier and the controller share."""
import math

import numpy as np
import pytest

from tensegrity_engine.identification.measurements import (StampOrder, command_problem, imu_problem,
                                                           pose_problem)
from tensegrity_engine.identification.streaming import StreamAligner, StreamConfig

LIMITS = dict(max_abs_position=1e3, quat_tolerance=0.1)


def _poses(n=3):
    p = np.zeros((n, 7))
    p[:, 3] = 1.0
    return p


@pytest.mark.parametrize("edit, reason", [
    (lambda p: p[:2], "rod_count"),
    (lambda p: np.vstack([p, p]), "rod_count"),
    (lambda p: p[:, :6], "wrong_length"),
    (lambda p: p.reshape(-1), "wrong_length"),
    (lambda p: np.where(np.arange(7) == 2, math.nan, p), "nonfinite"),
    (lambda p: np.where(np.arange(7) == 0, 1e30, p), "out_of_range"),
    (lambda p: np.where(np.arange(7) == 3, 0.0, p), "bad_quaternion"),
    (lambda p: np.where(np.arange(7) == 3, 2.0, p), "bad_quaternion"),
])
def test_pose_problems(edit, reason):
    assert pose_problem(_poses(), 3, **LIMITS) is None
    assert pose_problem(edit(_poses()), 3, **LIMITS) == reason


def test_imu_and_command_problems():
    kw = dict(max_abs_angular_velocity=100.0, quat_tolerance=0.1)
    assert imu_problem(1, [0, 0, 1], [1, 0, 0, 0], 3, **kw) is None
    assert imu_problem(1, [0, 0, 1], None, 3, **kw) is None
    assert imu_problem(None, [0, 0, 1], None, 3, **kw) == "unknown_rod"
    assert imu_problem(3, [0, 0, 1], None, 3, **kw) == "unknown_rod"
    assert imu_problem(0, [0, 0, math.inf], None, 3, **kw) == "nonfinite"
    assert imu_problem(0, [0, 0, 1e30], None, 3, **kw) == "out_of_range"
    assert imu_problem(0, [0, 0, 1], [0, 0, 0, 0], 3, **kw) == "bad_quaternion"
    lo, hi = np.full(2, 0.5), np.full(2, 1.5)
    assert command_problem([1.0, 1.5], 2, lo, hi) is None
    assert command_problem([1.0, 1.5 + 0.005], 2, lo, hi) is None        # within 1 % of the width
    assert command_problem([1.0, 1.6], 2, lo, hi) == "out_of_range"
    assert command_problem([1.0, 1e30], 2) is None                       # no range given
    assert command_problem([1.0], 2, lo, hi) == "wrong_length"
    assert command_problem([1.0, math.nan], 2, lo, hi) == "nonfinite"


def test_stamp_order():
    order = StampOrder(jump_ns=1000)
    assert order.verdict("pose", 5) is None
    order.accept("pose", 5)
    assert order.verdict("pose", 5) == "duplicate"
    assert order.verdict("pose", 4) == "out_of_order"
    assert order.verdict("pose", 6) is None
    assert order.verdict("pose", 5 + 1001) == "clock_jump"
    assert order.verdict("pose", 5 - 1001) == "clock_jump"
    assert order.verdict(("imu", 0), 1) is None                          # streams are separate
    order.accept(("imu", 0), 1)
    order.forget(("imu",))
    assert order.get(("imu", 0)) is None and order.get("pose") == 5


def test_aligner_refuses_commands_the_robot_cannot_apply(three_bar):
    aligner = StreamAligner(StreamConfig.for_robot(three_bar))
    lo, hi = three_bar.command_low, three_bar.command_high
    assert aligner.add_command(0, 0.5 * (lo + hi)) == (True, "ok")
    far = hi + 0.5 * (hi - lo)
    assert aligner.add_command(1, far) == (False, "out_of_range")
    assert aligner.add_command(2, np.full(three_bar.num_actuated, 1e30)) == (False, "out_of_range")
    assert aligner.counters["out_of_range"] == 2 and aligner.accepted["command"] == 1
