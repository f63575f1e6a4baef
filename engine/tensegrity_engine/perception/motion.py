"""Where the rods should be in the next frame, and how sure that is: the tracker's prior.

`ConstantVelocityPrior` moves each rod on at the velocity of its last two estimates (centre
and axis alike) and widens the estimates' own uncertainty by what an unmodelled
acceleration does over a frame: sigma^2 = 5 sigma_est^2 + (a T^2)^2 (the 5: the
extrapolation 2 x_t - x_(t-1) of two independent estimates). ``acceleration`` is the
robot's typical unmodelled acceleration (m/s^2, and rad/s^2 for the axis), not its peak: a
frame with an impact is caught by the images, not the prior. With no velocity yet (the
first frame after a reset) the prior is the last pose with the first-frame sigmas.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["ConstantVelocityPrior", "EnginePrior", "rod_poses_from_ends"]


def _prior_sigma(t: float, last: tuple, before: Optional[tuple], acceleration: np.ndarray,
                 first_sigma: np.ndarray) -> np.ndarray:
    """[R, 5] sigma at ``t`` of the extrapolation from estimates ``last`` and ``before``
    (each (time, sigma [R, 5])): the estimates' own, carried as (1+k) x_t - k x_(t-1) is,
    plus ``acceleration`` * dt^2; with no ``before`` (no velocity yet), the first-frame
    sigmas."""
    t_last, s_last = last
    if before is None:
        return np.maximum(first_sigma, s_last)
    t_before, s_before = before
    k = (t - t_last) / (t_last - t_before)
    drift = acceleration * (t - t_last) ** 2
    return np.sqrt((1.0 + k) ** 2 * s_last ** 2 + k ** 2 * s_before ** 2 + drift ** 2)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


class ConstantVelocityPrior:
    """Estimates go in with their time (`update`); `predict` extrapolates to any time."""

    def __init__(self, period: float, *, acceleration: float = 5.0, angular_acceleration: float = 5.0,
                 first_sigma: tuple[float, float] = (0.05, 0.1)):
        if not (period > 0 and acceleration > 0 and angular_acceleration > 0):
            raise ValueError("period and accelerations must be positive")
        self.period = float(period)
        self.acceleration = np.array([acceleration] * 3 + [angular_acceleration] * 2)
        self.first_sigma = np.array([first_sigma[0]] * 3 + [first_sigma[1]] * 2)
        self.history: list[tuple[float, np.ndarray, np.ndarray]] = []

    def reset(self, ends: np.ndarray, t: float = 0.0, std: Optional[np.ndarray] = None) -> None:
        """Start again from a known pose ``ends`` [R, 2, 3] at time ``t`` (s)."""
        ends = np.asarray(ends, dtype=np.float64)
        self.history = [(float(t), ends, np.zeros((len(ends), 5)) if std is None else np.asarray(std))]

    def update(self, ends: np.ndarray, std: np.ndarray, t: Optional[float] = None, commands=None) -> None:
        """An estimate at time ``t`` (default: one period after the last). ``commands`` is
        ignored (`EnginePrior`'s signature: the two priors are interchangeable)."""
        if not self.history:
            raise RuntimeError("reset the prior with a first pose before updating it")
        t = self.history[-1][0] + self.period if t is None else float(t)
        if t <= self.history[-1][0]:
            raise ValueError("estimates must come in time order")
        self.history = (self.history + [(t, np.asarray(ends, dtype=np.float64), np.asarray(std))])[-2:]

    def predict(self, t: Optional[float] = None, commands=None) -> tuple[np.ndarray, np.ndarray]:
        """(ends [R, 2, 3], sigma [R, 5]) at time ``t`` (default: one period after the last
        estimate; a dropped frame is bridged by predicting further). ``commands`` is ignored."""
        if not self.history:
            raise RuntimeError("reset the prior with a first pose before predicting")
        t_last, last, s_last = self.history[-1]
        t = t_last + self.period if t is None else float(t)
        if len(self.history) < 2:
            return last, _prior_sigma(t, (t_last, s_last), None, self.acceleration, self.first_sigma)
        t_before, before, s_before = self.history[-2]
        k = (t - t_last) / (t_last - t_before)
        centre = (1.0 + k) * last.mean(1) - k * before.mean(1)
        axis_now, axis_then = _unit(last[:, 1] - last[:, 0]), _unit(before[:, 1] - before[:, 0])
        axis = _unit((1.0 + k) * axis_now - k * axis_then)
        half = 0.5 * np.linalg.norm(last[:, 1] - last[:, 0], axis=-1, keepdims=True)
        sigma = _prior_sigma(t, (t_last, s_last), (t_before, s_before), self.acceleration, self.first_sigma)
        return np.stack([centre - half * axis, centre + half * axis], 1), sigma


def rod_poses_from_ends(ends: np.ndarray, previous_quat: np.ndarray) -> np.ndarray:
    """Rod states [R, 13] (zero velocities) at end nodes ``ends`` [R, 2, 3]. A depth image
    cannot see a rod spin about its own axis: each quaternion is the previous one
    ``previous_quat`` [R, 4] (w, x, y, z) turned by the smallest rotation that takes its
    axis onto the new one."""
    from tensegrity_engine.physics.state import POS, QUAT, STATE_DIM, canonical_quat, quat_axis, quat_multiply

    ends = np.asarray(ends, dtype=np.float64)
    old = quat_axis(np.asarray(previous_quat, dtype=np.float64))
    new = _unit(ends[:, 1] - ends[:, 0])
    cross = np.cross(old, new)
    turn = np.concatenate([1.0 + np.sum(old * new, -1, keepdims=True), cross], -1)
    flipped = turn[:, 0] < 1e-9                  # antiparallel: the tracker never flips an axis
    turn[flipped] = np.array([0.0, 1.0, 0.0, 0.0])
    turn /= np.linalg.norm(turn, axis=-1, keepdims=True)
    state = np.zeros((len(ends), STATE_DIM))
    state[:, POS] = ends.mean(1)
    state[:, QUAT] = canonical_quat(quat_multiply(turn, previous_quat))
    return state


class EnginePrior:
    """The engine (an identified model, or the config's) as the tracker's motion prior.

    Each estimate becomes a rod state: poses from the end nodes (the spin carried over),
    velocities from the last two estimates (backward differences: the mean over the last
    interval). `predict` rolls the engine from the newest state to the image's time under
    the commands the robot was sent, carrying the model's own actuator state, so gravity,
    cables, contacts and friction move the rods across a gap that a constant velocity
    would overshoot. Its sigma is the estimates' extrapolation sigma plus ``acceleration``
    (the model's unexplained acceleration) over the time ahead, as `ConstantVelocityPrior`.
    """

    def __init__(self, params, *, acceleration: float = 2.0, angular_acceleration: float = 2.0,
                 first_sigma: tuple[float, float] = (0.05, 0.1), native: bool = True):
        import torch

        from tensegrity_engine.physics.engine import TensegrityEngine

        self.robot = params.robot
        self.engine = TensegrityEngine(self.robot, params, floor=True)
        self.native = native
        if native and self.engine.native_kernel_applies:     # C kernel: a 0.1 s prediction in < 1 ms
            from tensegrity_engine.physics.native import NativeRollout

            self.rollout = NativeRollout(self.engine).rollout
        else:
            self.rollout = self.engine.rollout
        from tensegrity_engine.physics.stability import stable_substeps

        # stiff, damped values need sub-steps to run true (as the planner steps them)
        with torch.no_grad():
            values = self.engine.param_values(torch.float64, "cpu")
        self.substeps = stable_substeps(self.engine.topology, values, self.robot.dt, floor=True,
                                        integrator=self.robot.integrator)
        self.torch = torch
        self.acceleration = np.array([acceleration] * 3 + [angular_acceleration] * 2)
        self.first_sigma = np.array([first_sigma[0]] * 3 + [first_sigma[1]] * 2)
        self.history: list = []       # (t, rod state [R, 13], act [A], sigma [R, 5])
        self._last_roll = None

    def with_params(self, params) -> "EnginePrior":
        """The same track (estimates and actuator state) predicted by another model, e.g.
        newly identified values."""
        other = EnginePrior(params, acceleration=float(self.acceleration[0]),
                            angular_acceleration=float(self.acceleration[3]),
                            first_sigma=(float(self.first_sigma[0]), float(self.first_sigma[3])),
                            native=self.native)
        other.history = list(self.history)       # the cached roll was the old model's: not carried
        return other

    def reset(self, rod_state: np.ndarray, act: np.ndarray, t: float = 0.0) -> None:
        """Start from a known rod state [R, 13] (velocities as known, often zero) and
        actuator state ``act`` [A] (the filtered commands) at time ``t``."""
        self.history = [(float(t), np.asarray(rod_state, dtype=np.float64).copy(),
                         np.asarray(act, dtype=np.float64).copy(), np.zeros((self.robot.num_rods, 5)))]

    def _roll(self, t: float, commands):
        """(rod state [R, 13], act [A]) at ``t``, rolled from the newest state under
        ``commands`` (fn: evenly spaced times [S] -> the commands held then [S, A]). The
        roll to the time `predict` was last asked for is kept for `update`."""
        t0, state, act, _ = self.history[-1]
        if self._last_roll is not None and self._last_roll[:2] == (t0, t):
            return self._last_roll[2]
        dt = self.robot.dt / self.substeps
        steps = max(1, int(round((t - t0) / dt)))
        cmd = np.asarray(commands(t0 + dt * np.arange(steps)), dtype=np.float64)
        f = lambda a: self.torch.as_tensor(a, dtype=self.torch.float64)
        with self.torch.no_grad():
            states, acts = self.rollout(f(state)[None], f(act)[None], f(cmd)[None], dt, record_every=steps)
        out = (states[0, -1].numpy(), acts[0, -1].numpy())
        if not np.isfinite(out[0]).all():
            raise FloatingPointError("the engine prior's model diverged: its values are not stable at this step")
        self._last_roll = (t0, t, out)
        return out

    def predict(self, t: float, commands) -> tuple[np.ndarray, np.ndarray]:
        """(end nodes [R, 2, 3], sigma [R, 5]) at time ``t``."""
        from tensegrity_engine.physics.state import end_nodes

        if not self.history:
            raise RuntimeError("reset the prior with a first state before predicting")
        state, _ = self._roll(t, commands)
        ends = end_nodes(state, self.robot.rod_length / 2)
        t_last, _, _, s_last = self.history[-1]
        before = (self.history[-2][0], self.history[-2][3]) if len(self.history) > 1 else None
        return ends, _prior_sigma(t, (t_last, s_last), before, self.acceleration, self.first_sigma)

    def update(self, ends: np.ndarray, std: np.ndarray, t: float, commands) -> None:
        """An estimate (end nodes [R, 2, 3], its sigma [R, 5]) at time ``t``."""
        from tensegrity_engine.physics.state import ANG_VEL, LIN_VEL, quat_log_world

        t_last, last, _, _ = self.history[-1]
        if t <= t_last:
            raise ValueError("estimates must come in time order")
        _, act = self._roll(t, commands)                   # the model's actuators, carried on
        state = rod_poses_from_ends(ends, last[:, 3:7])
        span = t - t_last
        state[:, LIN_VEL] = (state[:, 0:3] - last[:, 0:3]) / span
        state[:, ANG_VEL] = quat_log_world(last[:, 3:7], state[:, 3:7]) / span
        self.history = (self.history + [(float(t), state, act, np.asarray(std))])[-2:]

