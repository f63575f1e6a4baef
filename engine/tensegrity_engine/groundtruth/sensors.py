"""Sensor models of the simulated robot: what a motion-capture system would report."""
from __future__ import annotations

import numpy as np

from tensegrity_engine.physics.state import POS, QUAT, quat_multiply


def noisy_rod_poses(rod_state: np.ndarray, rng: np.random.Generator, *, pos_noise: float = 0.0,
                    rot_noise: float = 0.0) -> np.ndarray:
    """A copy of rod states [R, 13] with Gaussian position noise (m) and a random rotation
    per rod (rotation vector ~ N(0, rot_noise^2) rad per axis) applied in the world frame."""
    meas = rod_state.copy()
    if pos_noise > 0:
        meas[:, POS] += rng.normal(0.0, pos_noise, meas[:, POS].shape)
    if rot_noise > 0:
        rv = rng.normal(0.0, rot_noise, (meas.shape[0], 3))
        ang = np.linalg.norm(rv, axis=-1, keepdims=True)
        dq = np.concatenate([np.cos(ang / 2), np.sinc(ang / (2 * np.pi)) * rv / 2], -1)
        meas[:, QUAT] = quat_multiply(dq, meas[:, QUAT])
    return meas
