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

__all__ = ["ConstantVelocityPrior"]


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


class ConstantVelocityPrior:
    def __init__(self, period: float, *, acceleration: float = 5.0, angular_acceleration: float = 5.0,
                 first_sigma: tuple[float, float] = (0.05, 0.1)):
        if not (period > 0 and acceleration > 0 and angular_acceleration > 0):
            raise ValueError("period and accelerations must be positive")
        self.period = float(period)
        self.process = np.array([acceleration] * 3 + [angular_acceleration] * 2) * self.period ** 2
        self.first_sigma = np.array([first_sigma[0]] * 3 + [first_sigma[1]] * 2)
        self.history: list[tuple[np.ndarray, np.ndarray]] = []

    def reset(self, ends: np.ndarray, std: Optional[np.ndarray] = None) -> None:
        """Start again from a known pose ``ends`` [R, 2, 3] (e.g. the robot's announced one)."""
        ends = np.asarray(ends, dtype=np.float64)
        self.history = [(ends, np.zeros((len(ends), 5)) if std is None else np.asarray(std))]

    def update(self, ends: np.ndarray, std: np.ndarray) -> None:
        self.history = (self.history + [(np.asarray(ends, dtype=np.float64), np.asarray(std))])[-2:]

    def predict(self, frames: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(ends [R, 2, 3], sigma [R, 5]) ``frames`` periods after the last estimate (a frame
        that was dropped is bridged by predicting two ahead)."""
        if not self.history:
            raise RuntimeError("reset the prior with a first pose before predicting")
        last, s_last = self.history[-1]
        if len(self.history) < 2:
            return last, np.maximum(self.first_sigma, s_last)
        before, s_before = self.history[-2]
        k = float(frames)
        centre = (1.0 + k) * last.mean(1) - k * before.mean(1)
        axis_now, axis_then = _unit(last[:, 1] - last[:, 0]), _unit(before[:, 1] - before[:, 0])
        axis = _unit((1.0 + k) * axis_now - k * axis_then)
        half = 0.5 * np.linalg.norm(last[:, 1] - last[:, 0], axis=-1, keepdims=True)
        sigma = np.sqrt((1.0 + k) ** 2 * s_last ** 2 + k ** 2 * s_before ** 2 + (k * k * self.process) ** 2)
        return np.stack([centre - half * axis, centre + half * axis], 1), sigma
