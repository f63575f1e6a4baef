"""Sensor models of the simulated robot: what a motion-capture system would report."""
from __future__ import annotations

import dataclasses

import numpy as np

from tensegrity_engine.physics.state import ANG_VEL, POS, QUAT, quat_multiply


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


@dataclasses.dataclass(frozen=True)
class SensorModel:
    """A motion-capture system: what it reports of the dense ground truth at its stamps.

    A frame stamped t shows the robot at ``t - latency + e`` (e ~ N(0, jitter^2) s, the
    stamp error), rounded to the ground truth's step; positions get N(0, position_noise^2)
    m per axis and orientations a random rotation of N(0, rotation_noise^2) rad per axis;
    each frame but the first is lost with probability ``drop_rate``. No velocities: a
    mocap measures poses; with ``gyro`` each rod's IMU adds its angular velocity at the same
    instant (N(0, gyro_noise^2) rad/s per axis); `measure_cables` gives each frame the cables'
    load cells (N(0, tension_noise^2) N) and the winches' encoders (N(0, rest_length_noise^2) m)
    at that instant.
    """

    position_noise: float = 0.0      # m
    rotation_noise: float = 0.0      # rad
    latency: float = 0.0             # s
    jitter: float = 0.0              # s, standard deviation of the stamp error
    drop_rate: float = 0.0           # fraction of frames lost
    gyro_noise: float = 0.0          # rad/s, per axis
    tension_noise: float = 0.0       # N, per cable
    rest_length_noise: float = 0.0   # m, per winch

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if not (np.isfinite(getattr(self, f.name)) and getattr(self, f.name) >= 0):
                raise ValueError(f"{f.name} must be finite and >= 0")
        if self.drop_rate >= 1:
            raise ValueError("drop_rate must be < 1")

    @property
    def ideal(self) -> bool:
        return self == SensorModel()

    def measure(self, dense_states: np.ndarray, dt: float, stamps: np.ndarray,
                rng: np.random.Generator, gyro: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """dense_states [N, R, 13] at t = k dt; stamps [K] (s) -> (kept stamps, poses [K', R, 13]
        with zero velocities, but for the gyros' world-frame angular velocity with ``gyro``)."""
        stamps, poses, _ = self.measure_at(dense_states, dt, stamps, rng, gyro)
        return stamps, poses

    def measure_cables(self, rest_lengths: np.ndarray, tensions: np.ndarray, rng: np.random.Generator,
                       actuated=None) -> tuple[np.ndarray, np.ndarray]:
        """The winches' encoders and the load cells: the true rest lengths and tensions [..., C]
        (of the frames `measure_at` kept), each with its noise; NaN rest lengths where a cable
        is not ``actuated`` [C] (no winch, so no encoder; None: every cable has one)."""
        rest, tension = (np.asarray(v, dtype=np.float64) for v in (rest_lengths, tensions))
        if self.rest_length_noise:
            rest = rest + rng.normal(0.0, self.rest_length_noise, rest.shape)
        if self.tension_noise:
            tension = tension + rng.normal(0.0, self.tension_noise, tension.shape)
        if actuated is not None:
            rest = np.where(np.asarray(actuated, dtype=bool), rest, np.nan)
        return rest, tension

    def measure_at(self, dense_states: np.ndarray, dt: float, stamps: np.ndarray,
                   rng: np.random.Generator, gyro: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`measure`, and the dense index each kept frame shows (for `measure_cables`)."""
        stamps = np.asarray(stamps, dtype=np.float64)
        seen = stamps - self.latency + (rng.normal(0.0, self.jitter, stamps.shape) if self.jitter else 0.0)
        idx = np.clip(np.rint(seen / dt).astype(int), 0, len(dense_states) - 1)
        keep = rng.random(len(stamps)) >= self.drop_rate
        keep[0] = True
        out = []
        for i in np.flatnonzero(keep):
            pose = noisy_rod_poses(dense_states[idx[i]], rng, pos_noise=self.position_noise,
                                   rot_noise=self.rotation_noise)
            pose[:, 7:] = 0.0
            if gyro:
                pose[:, ANG_VEL] = dense_states[idx[i]][:, ANG_VEL]
            out.append(pose)
        poses = np.stack(out)
        if gyro and self.gyro_noise:      # drawn after the poses: their noise is the same with or without
            poses[..., ANG_VEL] += rng.normal(0.0, self.gyro_noise, poses[..., ANG_VEL].shape)
        return stamps[keep], poses, idx[keep]
