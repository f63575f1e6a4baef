"""The simulated motion-capture sensor: noise of the stated size, unit quaternions."""
import numpy as np

from tensegrity_engine.groundtruth.sensors import noisy_rod_poses
from tensegrity_engine.physics.state import POS, QUAT, initial_rod_state


def test_mocap_noise_has_the_stated_size_and_keeps_rotations_proper(superball):
    rs = initial_rod_state(superball)
    rng = np.random.default_rng(0)
    draws = np.stack([noisy_rod_poses(rs, rng, pos_noise=0.002, rot_noise=0.01) for _ in range(2000)])
    assert np.allclose(np.linalg.norm(draws[..., QUAT], axis=-1), 1.0)
    np.testing.assert_allclose((draws[..., POS] - rs[:, POS]).std(), 0.002, rtol=0.05)
    # rotation angle between measured and true orientation: |q_true . q_meas| = cos(angle / 2);
    # the angle of a 3-D Gaussian rotation vector has RMS sqrt(3) * rot_noise
    cos_half = np.abs((draws[..., QUAT] * rs[:, QUAT]).sum(-1)).clip(max=1.0)
    np.testing.assert_allclose(np.sqrt(np.mean((2 * np.arccos(cos_half)) ** 2)), np.sqrt(3) * 0.01, rtol=0.05)
    assert np.array_equal(draws[..., 7:], np.broadcast_to(rs[:, 7:], draws[..., 7:].shape))   # velocities untouched
    clean = noisy_rod_poses(rs, rng)
    assert np.array_equal(clean, rs) and clean is not rs
