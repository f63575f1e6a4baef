"""Checks every consumer of measurements applies before using one (ROS-free).

The identifier's `StreamAligner` and the controller's state estimate take poses, gyros
and commands from the same topics; both refuse a message for the same reasons, in the
same order, so a message is either usable everywhere or counted as rejected everywhere.
Each check returns None for a usable value or the reason (a counter name) it is refused.
"""
from __future__ import annotations

from typing import Hashable, Optional

import numpy as np

__all__ = ["pose_problem", "imu_problem", "command_problem", "cable_state_problem", "REST_LENGTH", "TENSION",
           "StampOrder"]


def pose_problem(arr, num_rods: int, *, max_abs_position: float, quat_tolerance: float) -> Optional[str]:
    """``arr`` [R, 7] = (x, y, z, qw, qx, qy, qz) per rod."""
    try:
        arr = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError):
        return "wrong_length"
    if arr.ndim != 2 or arr.shape[1] != 7:
        return "wrong_length"
    if arr.shape[0] != num_rods:
        return "rod_count"
    if not np.isfinite(arr).all():
        return "nonfinite"
    if np.abs(arr[:, :3]).max() > max_abs_position:
        return "out_of_range"
    if np.abs(np.linalg.norm(arr[:, 3:], axis=-1) - 1.0).max() > quat_tolerance:
        return "bad_quaternion"
    return None


def imu_problem(rod, omega, quat, num_rods: int, *, max_abs_angular_velocity: float,
                quat_tolerance: float) -> Optional[str]:
    """One rod's gyro: ``rod`` index (None: not a rod frame), body rate [3], orientation
    [4] (w, x, y, z) or None when the sensor gives none."""
    if rod is None or not 0 <= int(rod) < num_rods:
        return "unknown_rod"
    try:
        w = np.asarray(omega, dtype=np.float64).reshape(-1)
        q = None if quat is None else np.asarray(quat, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return "wrong_length"
    if w.shape[0] != 3 or (q is not None and q.shape[0] != 4):
        return "wrong_length"
    if not np.isfinite(w).all() or (q is not None and not np.isfinite(q).all()):
        return "nonfinite"
    if np.abs(w).max() > max_abs_angular_velocity:
        return "out_of_range"
    if q is not None and abs(np.linalg.norm(q) - 1.0) > quat_tolerance:
        return "bad_quaternion"
    return None


def command_problem(u, num_actuated: int, low=None, high=None, *, tolerance: float = 0.01) -> Optional[str]:
    """Target rest lengths [A]. With ``low``/``high`` (the robot's command range) a value
    more than ``tolerance`` x the range width outside it is refused: the robot never
    applied it, so a tuple built on it would teach the model something false."""
    try:
        u = np.asarray(u, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return "wrong_length"
    if u.shape[0] != num_actuated:
        return "wrong_length"
    if not np.isfinite(u).all():
        return "nonfinite"
    if low is not None and high is not None:
        low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
        slack = tolerance * (high - low)
        if np.any(u < low - slack) or np.any(u > high + slack):
            return "out_of_range"
    return None


# the last axis of a cable reading [..., C, 2] (NaN where not measured)
REST_LENGTH, TENSION = 0, 1


def cable_state_problem(rest_lengths, tensions, num_cables: int, *, max_abs_tension: float,
                        max_rest_length: float) -> Optional[str]:
    """Measured cable states, config order: a winch encoder's rest lengths [C] (m) and a load
    cell's tensions [C] (N), either None; NaN where a cable has no such sensor (at least one
    value measured). A negative tension is allowed (a load cell's noise about a slack cable's
    0, a tendon damper); a rest length must be positive."""
    values = []
    for given in (rest_lengths, tensions):
        if given is None:
            values.append(None)
            continue
        try:
            arr = np.asarray(given, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            return "wrong_length"
        if arr.shape[0] != num_cables or num_cables == 0:
            return "wrong_length"
        values.append(arr)
    rest, tension = values
    given = [v for v in values if v is not None]
    if not given:
        return "wrong_length"
    if any(np.isinf(v).any() for v in given) or all(np.isnan(v).all() for v in given):
        return "nonfinite"
    if rest is not None and np.isfinite(rest).any():
        r = rest[np.isfinite(rest)]
        if r.min() <= 0.0 or r.max() > max_rest_length:
            return "out_of_range"
    if tension is not None and np.isfinite(tension).any() and np.nanmax(np.abs(tension)) > max_abs_tension:
        return "out_of_range"
    return None


class StampOrder:
    """Last accepted stamp per stream (a pose stream, a command stream, one gyro per rod).

    ``verdict`` says what a new stamp is: None (in order), 'duplicate', 'out_of_order'
    (earlier by at most ``jump_ns``) or 'clock_jump' (a step of more than ``jump_ns``
    either way: a restarted clock, the stream starts over from it). Nothing is stored
    until ``accept``."""

    def __init__(self, jump_ns: int):
        self.jump_ns = int(jump_ns)
        self.last: dict = {}

    def verdict(self, key: Hashable, stamp: int) -> Optional[str]:
        last = self.last.get(key)
        if last is None:
            return None
        if stamp == last:
            return "duplicate"
        if abs(stamp - last) > self.jump_ns:
            return "clock_jump"
        return "out_of_order" if stamp < last else None

    def accept(self, key: Hashable, stamp: int) -> None:
        self.last[key] = int(stamp)

    def get(self, key: Hashable) -> Optional[int]:
        return self.last.get(key)

    def forget(self, keys=None) -> None:
        if keys is None:
            self.last.clear()
        else:
            for k in list(self.last):
                if k in keys or (isinstance(k, tuple) and k[0] in keys):
                    del self.last[k]
