"""Planning for a robot that does not wait: the commands already sent, as they act, and the
model's prediction of the state at the moment a new command takes effect.

A controller measures the robot at t_pose, plans during some tens of milliseconds and its
command reaches the robot later still; the robot meanwhile runs the commands sent before.
Planning from the measured state would plan for the past. `CommandHistory` keeps what was
sent (stamp = the time a command takes effect, zero-order held until the next), and
`predict_at` rolls the model from the newest pose through those commands to the new
command's stamp. Times are integer nanoseconds of the controller's clock.
"""
from __future__ import annotations

import collections
from typing import Optional

import numpy as np

from tensegrity_engine.physics.actuators import held_command_update

NS = 1_000_000_000
# s the measured state is rolled ahead at most: further apart, the pose stamps are not on the
# clock of the commands (a mocap's own epoch: 1.8e9 s of steps were asked for, a MemoryError)
MAX_PREDICTION_S = 10.0


class CommandHistory:
    """The commands sent, oldest first (bounded); each holds from its stamp to the next."""

    def __init__(self, initial, maxlen: int = 256):
        self._items: collections.deque = collections.deque(maxlen=maxlen)
        self.initial = np.asarray(initial, dtype=np.float64)      # in force before the first command

    def __len__(self) -> int:
        return len(self._items)

    def add(self, stamp_ns: int, command) -> None:
        if self._items and stamp_ns <= self._items[-1][0]:
            raise ValueError("command stamps must increase")
        self._items.append((int(stamp_ns), np.asarray(command, dtype=np.float64)))

    @property
    def last(self) -> Optional[tuple[int, np.ndarray]]:
        return self._items[-1] if self._items else None

    def at(self, t_ns: int) -> np.ndarray:
        """The command in force at ``t_ns``."""
        u = self.initial
        for stamp, c in self._items:
            if stamp > t_ns:
                break
            u = c
        return u

    def grid(self, t0_ns: int, steps: int, dt: float, delay: float = 0.0) -> np.ndarray:
        """[steps, A] the command acting during each step of ``dt`` from ``t0_ns`` (sampled
        at the step's start), ``delay`` s after it was stamped (the model's dead time)."""
        times = t0_ns + np.round(np.arange(steps) * dt * NS).astype(np.int64) - int(round(delay * NS))
        stamps = np.array([s for s, _ in self._items], dtype=np.int64)
        rows = np.searchsorted(stamps, times, side="right") - 1
        table = np.stack([self.initial] + [c for _, c in self._items])
        return table[rows + 1]

    def actuator_at(self, act0, t0_ns: int, t1_ns: int, tau: float, max_speed: Optional[float] = None,
                    delay: float = 0.0) -> np.ndarray:
        """The first-order actuator state at ``t1_ns`` from ``act0`` at ``t0_ns`` through the
        commands in force (the controller's estimate of the unmeasured rest lengths)."""
        act = np.asarray(act0, dtype=np.float64)
        d = int(round(delay * NS))
        edges = sorted({t0_ns, t1_ns, *(s + d for s, _ in self._items if t0_ns < s + d < t1_ns)})
        for a, b in zip(edges[:-1], edges[1:]):
            act = held_command_update(act, self.at(a - d), tau, (b - a) / NS, max_speed)
        return act


def predict_at(dynamics, rod_state, act, history: CommandHistory, t_pose_ns: int, t_target_ns: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """The model's (rod_state [R, 13], act [A]) at ``t_target_ns`` from the measured state
    at ``t_pose_ns`` through the commands sent (engine dynamics with ``advance``). A target
    at or before the pose returns the measurement."""
    span = (t_target_ns - t_pose_ns) / NS
    if span > MAX_PREDICTION_S:
        raise ValueError(f"the newest pose is stamped {span:.3g} s before the command's time: poses and "
                         "commands must be stamped on the controller's clock")
    steps = int(round(span / dynamics.dt))
    if steps <= 0:
        return np.asarray(rod_state, dtype=np.float64), np.asarray(act, dtype=np.float64)
    commands = history.grid(t_pose_ns, steps, dynamics.dt, delay=getattr(dynamics, "delay", 0.0))
    return dynamics.advance(rod_state, act, commands)
