"""Velocities estimated from 10 Hz poses resolve a rod's fast spin about its own axis.

A light rod rolling on a grippy floor spins at 20-150 rad/s about its axis (MuJoCo,
zoo/stiff_light); a rotation straight from the pose before to the pose after (0.2 s)
aliases past pi / 0.2 s = 15.7 rad/s. Each estimator (the tuples' latent start, the
held-out trajectories', the live aligner's) goes through the middle pose instead."""
import math

import numpy as np
import pytest

from tensegrity_engine.identification.acceptance import with_estimated_velocity
from tensegrity_engine.identification.data import finite_difference_velocity
from tensegrity_engine.identification.dataset import Trajectory
from tensegrity_engine.identification.streaming import NS, StreamAligner, StreamConfig
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.state import central_rotation, quat_log_world, quat_multiply

T = 0.1
SPIN = 22.0                        # rad/s about the rod's axis: 2.2 rad a sample, 4.4 over two
TILT = np.array([math.cos(0.3), math.sin(0.3), 0.0, 0.0])       # the axis tilted 0.6 rad about x
V = np.array([0.4, -0.1, 0.05])


def pose(t: float, rods: int) -> np.ndarray:
    """[rods, 7]: every rod moving at V and spinning at SPIN about its own (tilted) axis."""
    spin = np.array([math.cos(SPIN * t / 2), 0.0, 0.0, math.sin(SPIN * t / 2)])
    q = quat_multiply(TILT, spin)
    return np.stack([np.concatenate([np.array([r, 0.0, 1.0]) + V * t, q]) for r in range(rods)])


def world_spin() -> np.ndarray:
    """The spin as a world-frame angular velocity: SPIN along the tilted axis."""
    return SPIN * np.array([0.0, -math.sin(0.6), math.cos(0.6)])


def test_the_direct_rotation_aliases_the_spin_and_the_central_one_does_not():
    a, b, c = pose(0.0, 1)[0, 3:], pose(T, 1)[0, 3:], pose(2 * T, 1)[0, 3:]
    direct = quat_log_world(a, c) / (2 * T)
    assert np.linalg.norm(direct - world_spin()) > 10.0            # 4.4 rad wraps to -1.9
    np.testing.assert_allclose(central_rotation(a, b, c) / (2 * T), world_spin(), atol=1e-9)


def test_tuple_latents_start_at_the_spin():
    x = np.stack([pose(k * T, 2) for k in range(4)])           # 4 poses -> 3 tuples
    x0, x1 = x[:-1], x[1:]
    prev = np.array([-1, 0, 1])
    v = finite_difference_velocity(x0, x1, prev, T)
    np.testing.assert_allclose(v[1:, :, 3:], np.broadcast_to(world_spin(), (2, 2, 3)), atol=1e-9)
    np.testing.assert_allclose(v[..., :3], np.broadcast_to(V, (3, 2, 3)), atol=1e-9)
    # a chain's first tuple has only the forward difference, still within pi / T
    np.testing.assert_allclose(v[0, :, 3:], np.broadcast_to(world_spin(), (2, 3)), atol=1e-9)


def test_held_out_trajectories_and_the_live_aligner_estimate_the_spin():
    robot = load_robot("three_bar")
    R, A = robot.num_rods, robot.num_actuated
    t = np.arange(6) * T
    traj = Trajectory(robot=robot, t=t, position=np.stack([pose(s, R)[:, :3] for s in t]),
                      quaternion=np.stack([pose(s, R)[:, 3:] for s in t]),
                      command_time=np.array([0.0]), command=np.full((1, A), 0.9))
    est = with_estimated_velocity(traj)
    np.testing.assert_allclose(est.angular_velocity, np.broadcast_to(world_spin(), (6, R, 3)), atol=1e-9)

    al = StreamAligner(StreamConfig(num_rods=R, num_actuated=A))
    for k in range(6):
        stamp = int(round(k * T * NS))
        assert al.add_pose(stamp, pose(k * T, R))[0] and al.add_command(stamp, np.full(A, 0.9))[0]
    batch = al.pop_tuples()
    known = batch.vel_known0.numpy()
    assert known.sum() >= 3
    np.testing.assert_allclose(batch.x0[known][..., 10:13].numpy(),
                               np.broadcast_to(world_spin(), (int(known.sum()), R, 3)), atol=1e-9)


@pytest.mark.parametrize("spin", [0.0, 5.0, -14.0])
def test_slow_spins_are_unchanged(spin):
    """Within pi / 2T both ways agree: nothing but the aliasing changed."""
    q = lambda t: quat_multiply(TILT, np.array([math.cos(spin * t / 2), 0.0, 0.0,     # noqa: E731
                                                math.sin(spin * t / 2)]))
    np.testing.assert_allclose(central_rotation(q(0), q(T), q(2 * T)), quat_log_world(q(0), q(2 * T)),
                               atol=1e-12)
