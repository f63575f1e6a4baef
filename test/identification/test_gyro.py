"""Rods with IMUs: the gyro's angular velocity in pose-only identification (the spin about a
rod's axis moves no node, and 10 Hz poses alias it)."""
import dataclasses

import numpy as np
import pytest
import torch

from rolling_records import rolling_twin_run
from tensegrity_engine.groundtruth.sensors import SensorModel
from tensegrity_engine.identification.data import TrainingData
from tensegrity_engine.identification.dataset import DatasetError, TupleSet
from tensegrity_engine.identification.solvers.windows import chain_windows, fit_start_velocities
from tensegrity_engine.physics.state import quat_axis


@pytest.fixture(scope="module")
def pose_only(superball):
    return rolling_twin_run(superball)


@pytest.fixture(scope="module")
def with_gyros(superball):
    return rolling_twin_run(superball, gyro_noise=0.0, config=dict(gyro_weight=1.0))


def _windows(run):
    windows = torch.as_tensor(chain_windows(run.train.ts.next, 3)[0])
    return windows[windows[:, 0] >= 10]         # after the first second: the motors settled from rest


def _spin(v, states):
    return (v[..., 3:] * quat_axis(states[..., 3:7])).sum(-1)


def test_gyro_rates_streamed_after_their_poses_reach_both_ends_of_each_tuple(with_gyros, pose_only):
    run, true_states = with_gyros
    ts, data = run.train.ts, run.train
    assert ts.gyro0 is not None and ts.gyro0.all()
    # the IMU follows its pose, so the stream closed each tuple before its end's gyro came;
    # the next tuple's start has it
    has_next = ts.next >= 0
    assert bool(data.gyro1[torch.as_tensor(has_next)].all())
    assert torch.allclose(data.x0[..., 10:], true_states[..., 10:], atol=1e-9)
    # pose-only: the finite differences' spin, off where the rod turns or spins fast within
    # 0.1 s (0.48 rad/s on average; 5.1 before they went through the middle pose, which
    # `test_velocity_estimates` checks)
    bare = pose_only[0].train
    assert bare.gyro0 is None and bare.ts.gyro0 is None
    assert float((_spin(bare.x0[..., 7:], true_states) - _spin(true_states[..., 7:], true_states)).abs().mean()) > 0.2


def test_the_gyro_holds_the_spin_the_window_fit_cannot_see(with_gyros, pose_only):
    """At the true values, each window's start velocity fitted to its poses: with gyros the
    spin stays the measured one and the poses fit far better than from poses alone."""
    fits = {}
    for name, (run, true_states) in (("gyro", with_gyros), ("poses", pose_only)):
        data, objective = run.train, run.objective
        windows = _windows(run)
        n_pos = windows.shape[1] * run.robot.num_rods * 6
        with torch.no_grad():
            p = {k: v.detach() for k, v in run.engine.param_values(torch.float64, "cpu").items()}
            truth = true_states[windows[:, 0]][..., 7:]
            r_true = objective.window_residual(data, windows, truth, p)
            assert float((r_true ** 2).sum()) < 1e-9                          # the model is the robot
            vel = fit_start_velocities(objective, data, windows, p, iterations=4, chain=True)
            r = objective.window_residual(data, windows, vel, p)
        spin_error = (_spin(vel, true_states[windows[:, 0]]) - _spin(truth, true_states[windows[:, 0]])).abs()
        fits[name] = (float((r[:, :n_pos] ** 2).sum()), float(spin_error.mean()), r.shape[1] - n_pos)
    assert fits["gyro"][2] == 6 * 3 and fits["poses"][2] == 0     # one start row per rod and axis
    assert fits["gyro"][1] < 1e-3 < 0.03 < fits["poses"][1]
    assert fits["gyro"][0] < fits["poses"][0] / 3.0        # 4.4x (46x from the aliased spins)


def test_a_start_off_the_gyro_costs_what_its_weight_says(with_gyros):
    run, true_states = with_gyros
    data, objective = run.train, run.objective
    windows = _windows(run)[:4]
    with torch.no_grad():
        p = {k: v.detach() for k, v in run.engine.param_values(torch.float64, "cpu").items()}
        truth = true_states[windows[:, 0]][..., 7:].clone()
        base = objective.window_residual(data, windows, truth, p)
        kicked = truth.clone()
        kicked[0, 2, 3] += 1.0                          # rod 2 of window 0: +1 rad/s about x
        r = objective.window_residual(data, windows, kicked, p)
    n_pos = windows.shape[1] * run.robot.num_rods * 6
    w = objective.free[2] / (2.0 * objective.free.sum() * windows.shape[0] * windows.shape[1]
                             * (objective.loss_scale or 1.0))
    expected = (2.0 * w).sqrt() * objective.half[2] * run.config.period
    gyro = (r - base)[:, n_pos:].reshape(len(windows), run.robot.num_rods, 3)
    assert float(gyro[0, 2, 0]) == pytest.approx(float(expected), rel=1e-9)
    gyro[0, 2, 0] = 0.0
    assert float(gyro.abs().max()) == 0.0


def test_gyro_weight_zero_leaves_the_imu_unused(with_gyros):
    run, _ = with_gyros
    ts = run.train.ts
    off = TrainingData(ts, torch.float64, "cpu", latent=True, gyro=False)
    on = TrainingData(ts, torch.float64, "cpu", latent=True, gyro=True)
    assert off.gyro0 is None and off.gyro1 is None
    assert not torch.allclose(off.x0[..., 10:], on.x0[..., 10:])
    assert torch.equal(off.x0[..., 7:10], on.x0[..., 7:10])        # the linear part: differences both


def test_the_trainer_uses_the_gyro_only_with_a_weight(superball, with_gyros):
    run, _ = with_gyros
    assert run.train.gyro0 is not None
    off, _ = rolling_twin_run(superball, gyro_noise=0.0, seconds=2.0)       # gyro_weight 0: the default
    assert off.config.gyro_weight == 0.0 and off.train.ts.gyro0 is not None and off.train.gyro0 is None


def test_the_residual_keeps_its_size_when_gyro_data_starts(with_gyros, pose_only):
    """With a gyro weight the rows are there with or without gyro data (zero without), so
    cached latent Jacobians keep their shape when an IMU starts reporting."""
    run, true_states = with_gyros
    bare = TrainingData(pose_only[0].train.ts, torch.float64, "cpu", latent=True, gyro=True)
    assert bare.gyro0 is None
    windows = _windows(run)[:3]
    with torch.no_grad():
        p = {k: v.detach() for k, v in run.engine.param_values(torch.float64, "cpu").items()}
        vel = true_states[windows[:, 0]][..., 7:]
        with_rows = run.objective.window_residual(run.train, windows, vel + 0.5, p)
        without = run.objective.window_residual(bare, windows, vel + 0.5, p)
    n_pos = windows.shape[1] * run.robot.num_rods * 6
    assert with_rows.shape == without.shape
    assert float(without[:, n_pos:].abs().max()) == 0.0 < float(with_rows[:, n_pos:].abs().max())


def test_tuple_sets_check_and_concatenate_their_gyro_flags(with_gyros):
    ts = with_gyros[0].train.ts
    with pytest.raises(DatasetError, match="gyro0"):
        dataclasses.replace(ts, gyro0=np.ones((len(ts), 2), dtype=bool))
    bare = dataclasses.replace(ts, gyro0=None, gyro1=None)
    both = TupleSet.concat([bare, ts])
    assert both.gyro0.shape == (2 * len(ts), ts.x0.shape[1])
    assert not both.gyro0[:len(ts)].any() and both.gyro0[len(ts):].all()
    assert TupleSet.concat([bare, bare]).gyro0 is None


def test_the_sensor_model_reports_gyro_rates_with_their_noise():
    rng = np.random.default_rng(0)
    dense = np.zeros((50, 3, 13))
    dense[..., 3] = 1.0
    dense[..., 10:] = [0.5, -1.0, 2.0]
    stamps = np.arange(1, 40) * 0.001
    _, poses = SensorModel().measure(dense, 0.001, stamps, rng)
    assert not poses[..., 7:].any()                               # a mocap: no velocities
    _, exact = SensorModel().measure(dense, 0.001, stamps, rng, gyro=True)
    assert np.allclose(exact[..., 10:], [0.5, -1.0, 2.0]) and not exact[..., 7:10].any()
    _, noisy = SensorModel(gyro_noise=0.05).measure(dense, 0.001, stamps, rng, gyro=True)
    spread = (noisy[..., 10:] - exact[..., 10:]).std()
    assert 0.03 < spread < 0.07
    # a gyro leaves the mocap's own noise as it was: runs with and without it compare
    mocap = SensorModel(position_noise=0.002, drop_rate=0.2, gyro_noise=0.05)
    kept, bare = mocap.measure(dense, 0.001, stamps, np.random.default_rng(5))
    kept_too, with_gyro = mocap.measure(dense, 0.001, stamps, np.random.default_rng(5), gyro=True)
    assert np.array_equal(kept, kept_too) and np.array_equal(bare[..., :7], with_gyro[..., :7])
