"""Latency compensation: the commands sent, as they act, and the model's prediction of the
state when a new command takes effect."""
import math

import numpy as np
import pytest

from tensegrity_engine.control.dynamics import EngineDynamics
from tensegrity_engine.control.latency import NS, CommandHistory, predict_at
from tensegrity_engine.groundtruth.environments import rest_pose
from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin


def test_history_grid_holds_each_command_from_its_stamp_and_applies_the_dead_time():
    h = CommandHistory(initial=[0.0])
    h.add(100_000_000, [1.0])
    h.add(200_000_000, [2.0])
    g = h.grid(50_000_000, 250, 0.001)[:, 0]          # 50 ms .. 300 ms in 1 ms steps
    assert (g[:50] == 0.0).all() and (g[50:150] == 1.0).all() and (g[150:] == 2.0).all()
    late = h.grid(50_000_000, 250, 0.001, delay=0.02)[:, 0]
    assert (late[:70] == 0.0).all() and (late[70:170] == 1.0).all() and (late[170:] == 2.0).all()
    assert h.at(150_000_000)[0] == 1.0 and h.at(0)[0] == 0.0
    with pytest.raises(ValueError):
        h.add(200_000_000, [3.0])


def test_actuator_estimate_follows_the_commands_through_the_filter():
    h = CommandHistory(initial=[0.0])
    h.add(0, [1.0])
    a = h.actuator_at([0.0], 0, 50_000_000, tau=0.05)
    assert a[0] == pytest.approx(1 - math.exp(-1), rel=1e-9)
    h.add(50_000_000, [0.0])
    b = h.actuator_at([0.0], 0, 100_000_000, tau=0.05)
    assert b[0] == pytest.approx((1 - math.exp(-1)) * math.exp(-1), rel=1e-9)


def test_prediction_to_the_command_time_beats_planning_from_the_measurement(superball):
    """MuJoCo plays the robot through a command step; the model, rolled from the state
    measured 150 ms earlier through the commands sent, lands far closer to the true state at
    the new command's time than the measurement itself (what an uncompensated planner uses)."""
    robot = superball
    rs, act = rest_pose(robot)
    low, high = robot.command_low, robot.command_high
    history = CommandHistory(initial=act)
    history.add(0, high)                                      # all cables long: the robot unfolds
    with MujocoTwin(robot, floor=True, nthread=1) as twin:
        twin.reset(rs, act)
        twin.step(history.at(0), nsteps=300)
        measured, measured_act = twin.get_state()             # pose at t = 0.3 s
        history.add(320_000_000, low)                         # sent while the robot moved
        for k in range(150):                                  # the robot runs on
            twin.step(history.at(300_000_000 + k * 1_000_000), nsteps=1)
        truth, _ = twin.get_state()                           # at t = 0.45 s
    dyn = EngineDynamics(robot, control_dt=0.1, dtype=__import__("torch").float64)
    act_pose = history.actuator_at(act, 0, 300_000_000, robot.actuator.time_constant)
    np.testing.assert_allclose(act_pose, measured_act, atol=1e-6)   # the estimate matches the robot's
    predicted, _ = predict_at(dyn, measured, act_pose, history, 300_000_000, 450_000_000)
    err_meas = np.linalg.norm(measured[:, :3] - truth[:, :3], axis=-1).max()
    err_pred = np.linalg.norm(predicted[:, :3] - truth[:, :3], axis=-1).max()
    assert err_meas > 0.05, err_meas                           # the robot did move (~10 cm)
    assert err_pred < 0.3 * err_meas, (err_pred, err_meas)     # measured: 19 mm against 104 mm
    same, _ = predict_at(dyn, measured, act_pose, history, 300_000_000, 300_000_000)
    np.testing.assert_array_equal(same, measured)
    assert NS == 1_000_000_000
    # poses stamped on another clock (a mocap's own epoch, 1000 s against a node clock at the
    # Unix time): a clear error, not 1.8e12 steps asked of memory
    with pytest.raises(ValueError, match="controller's clock"):
        predict_at(dyn, measured, act_pose, history, 1000 * NS, 1_796_000_000 * NS)


def test_ticks_fall_on_multiples_of_the_period_and_missed_ones_are_counted():
    from tensegrity_engine.control.realtime import TickSchedule

    assert TickSchedule(0.1).due(0) == 0                      # a sim clock held at 0 ticks at 0
    s = TickSchedule(0.1)
    assert s.due(230_000_000) is None                         # the first tick is at 0.3 s
    assert s.due(300_000_000) == 300_000_000
    assert s.due(350_000_000) is None
    assert s.due(620_000_000) == 600_000_000 and s.missed == 2   # 0.4 and 0.5 s skipped
    assert s.due(100_000_000) == 100_000_000                  # the clock went back: start over
    assert s.wait_s(150_000_000) == pytest.approx(0.05)


def test_a_tick_plans_from_the_prediction_within_its_budget_and_stamps_the_valid_time(superball):
    import torch

    from tensegrity_engine.control import ExcitationPolicy, MPPIController, PlannerConfig, task_start
    from tensegrity_engine.control.realtime import RealTimePlanner

    s0, a0 = task_start(superball)
    mpc = MPPIController(superball, config=PlannerConfig(iterations=50, num_samples=16, horizon=5),
                         dtype=torch.float64)
    rt = RealTimePlanner(superball, mpc, ExcitationPolicy(superball, seed=1), a0, plan_budget=0.02,
                         command_latency=0.01)
    res = rt.tick(1_000_000_000, 950_000_000, s0, "mppi")
    assert res.valid_ns == 1_030_000_000 and res.planned
    assert res.predicted_s == pytest.approx(0.08)              # pose at 0.95 s, command at 1.03 s
    assert 1 <= res.iterations < 50                           # the budget, not the count, ended it
    assert (res.command >= superball.command_low).all() and (res.command <= superball.command_high).all()
    rt.sent(res.valid_ns, res.command)
    ex = rt.tick(1_100_000_000, 1_050_000_000, s0, "excitation")
    assert not ex.planned and ex.valid_ns == 1_130_000_000
    np.testing.assert_allclose(ex.command, rt.excitation.command_at((ex.valid_ns - rt.excite_start_ns) / NS))
    off = RealTimePlanner(superball, mpc, ExcitationPolicy(superball), a0, compensate=False)
    assert off.tick(1_000_000_000, 950_000_000, s0, "excitation").predicted_s == 0.0
    # a tick that starts after its whole budget is gone (a late timer): one iteration only,
    # where the same tick on time plans until the budget ends
    wide = RealTimePlanner(superball, mpc, ExcitationPolicy(superball, seed=1), a0, plan_budget=0.09,
                           command_latency=0.01)
    late = wide.tick(1_200_000_000, 1_150_000_000, s0, "mppi", now_ns=1_200_000_000 + 95_000_000)
    on_time = wide.tick(1_300_000_000, 1_250_000_000, s0, "mppi", now_ns=1_300_000_000)
    assert late.iterations == 1 < on_time.iterations


def test_a_restarted_clock_starts_the_planner_over(superball):
    """After the clock went back, commands stamped on the new clock are taken (the old ones
    would have refused them: stamps must increase), the actuator estimate starts settled at
    the initial command, and the excitation starts from its beginning."""
    import torch

    from tensegrity_engine.control import ExcitationPolicy, MPPIController, PlannerConfig, task_start
    from tensegrity_engine.control.realtime import RealTimePlanner

    s0, a0 = task_start(superball)
    mpc = MPPIController(superball, config=PlannerConfig(iterations=2, num_samples=8, horizon=3),
                         dtype=torch.float64)
    rt = RealTimePlanner(superball, mpc, ExcitationPolicy(superball, seed=1), a0)
    first = rt.tick(100 * NS, 100 * NS, s0, "excitation")
    rt.sent(first.valid_ns, first.command + 0.01)
    later = rt.tick(101 * NS, 101 * NS, s0, "excitation")
    assert not np.allclose(rt.actuator_at(later.valid_ns + NS), a0)
    with pytest.raises(ValueError, match="increase"):
        rt.sent(NS, first.command)
    rt.restart()
    again = rt.tick(NS, NS, s0, "excitation")
    np.testing.assert_allclose(again.command, first.command)       # the excitation from its start
    np.testing.assert_allclose(rt.actuator_at(again.valid_ns), a0)
    rt.sent(again.valid_ns, again.command)
    assert rt.history.last[0] == again.valid_ns and len(rt.history) == 1


def test_the_planner_takes_the_command_in_force_as_sent(superball):
    """A safety layer sends less than the plan asked (a rate limit), or an excitation ran
    before: the next plan's dead time and smoothness run from the command the robot got,
    not the one planned."""
    import torch

    from tensegrity_engine.control import ExcitationPolicy, MPPIController, PlannerConfig, task_start
    from tensegrity_engine.control.realtime import RealTimePlanner

    s0, a0 = task_start(superball)
    mpc = MPPIController(superball, config=PlannerConfig(iterations=1, num_samples=8, horizon=3),
                         dtype=torch.float64)
    rt = RealTimePlanner(superball, mpc, ExcitationPolicy(superball, seed=1), a0)
    first = rt.tick(NS, NS, s0, "mppi")
    limited = 0.5 * (first.command + a0)                        # what the rate limit let through
    rt.sent(first.valid_ns, limited)
    rt.tick(NS + 100_000_000, NS + 100_000_000, s0, "mppi")
    np.testing.assert_allclose(mpc.dynamics.in_force, limited)
    ex = rt.tick(NS + 200_000_000, NS + 200_000_000, s0, "excitation")
    rt.sent(ex.valid_ns, ex.command)
    mpc.reset()                                                  # excitation -> MPPI
    rt.tick(NS + 300_000_000, NS + 300_000_000, s0, "mppi")
    np.testing.assert_allclose(mpc.dynamics.in_force, ex.command)


def test_warm_up_leaves_the_planner_as_new(superball):
    import torch

    from tensegrity_engine.control import ExcitationPolicy, MPPIController, PlannerConfig
    from tensegrity_engine.control.realtime import RealTimePlanner

    mpc = MPPIController(superball, config=PlannerConfig(iterations=1, num_samples=8, horizon=3))
    fresh = mpc.planner.mean.clone()
    rt = RealTimePlanner(superball, mpc, ExcitationPolicy(superball), superball.command_low + 0.5 * (
        superball.command_high - superball.command_low))
    assert rt.warm_up() > 0.0
    assert mpc.planner.rollouts_evaluated == 0 and torch.equal(mpc.planner.mean, fresh)


def test_the_winches_encoders_restart_the_actuator_estimate():
    """Encoders' rest lengths replace the commands' first-order estimate at their stamp,
    through the model's gain and offset, and the estimate runs on from them; a reading that
    misses an actuated cable, or is older than the last one taken, is not taken (a passive
    cable has no winch: its NaN is no loss); a restart forgets them."""
    import torch

    from tensegrity_engine.control import ExcitationPolicy, MPPIController, PlannerConfig, task_start
    from tensegrity_engine.control.realtime import RealTimePlanner
    from tensegrity_engine.physics.config import load_robot
    from tensegrity_engine.physics.params import PhysicalParameters

    robot = load_robot("three_bar")                       # passive cables beside the winches

    s0, a0 = task_start(robot)
    mpc = MPPIController(robot, config=PlannerConfig(iterations=2, num_samples=8, horizon=3),
                         dtype=torch.float64)
    rt = RealTimePlanner(robot, mpc, ExcitationPolicy(robot, seed=1), a0)
    idx = robot.actuated_indices
    assert len(idx) < robot.num_cables                     # passive cables too
    rt.actuator_at(NS)
    rt.sent(NS, a0 + 0.05)                                     # a command step at 1 s
    lagging = a0 + 0.02                                        # where the winches really are at 2 s
    rest = np.full(robot.num_cables, np.nan)
    rest[idx] = robot.actuator.gain * lagging + robot.actuator.offset
    unmeasured = rt.actuator_at(2 * NS)
    np.testing.assert_allclose(unmeasured, a0 + 0.05, atol=1e-6)    # the model followed the step
    assert rt.measured_rest_lengths(2 * NS, rest) and rt.encoder_readings == 0
    np.testing.assert_allclose(rt.actuator_at(2 * NS), lagging, atol=1e-12)
    assert rt.encoder_readings == 1
    later = rt.actuator_at(2 * NS + 50_000_000)
    expected = rt.history.actuator_at(lagging, 2 * NS, 2 * NS + 50_000_000, rt.tau, rt.max_speed, rt.delay)
    np.testing.assert_allclose(later, expected, atol=1e-12)
    assert np.all(later > lagging + 1e-4) and np.all(later < a0 + 0.05)   # on its way from the reading
    gap = rest.copy()
    gap[idx[0]] = np.nan
    assert not rt.measured_rest_lengths(3 * NS, gap)
    assert not rt.measured_rest_lengths(NS, rest)              # older than the last one taken
    assert rt.encoder_readings == 1
    # a reading newer than the pose a tick plans from waits for it (not rolled on twice)
    ahead = rest.copy()
    ahead[idx] += 0.01
    assert rt.measured_rest_lengths(2 * NS + 150_000_000, ahead)
    before = rt.actuator_at(2 * NS + 100_000_000)
    np.testing.assert_allclose(before, rt.history.actuator_at(lagging, 2 * NS, 2 * NS + 100_000_000, rt.tau,
                                                              rt.max_speed, rt.delay), atol=1e-12)
    np.testing.assert_allclose(rt.actuator_at(2 * NS + 150_000_000), (ahead[idx] - robot.actuator.offset)
                               / robot.actuator.gain, atol=1e-12)
    assert rt.encoder_readings == 2
    # a stream that starts over (stamps a clock jump back) is taken; one stamped far ahead by
    # mistake does not hold the later ones off
    assert rt.measured_rest_lengths(2 * NS + 150_000_000 + 10 * NS, ahead)
    assert rt.measured_rest_lengths(2 * NS + 200_000_000, rest)
    np.testing.assert_allclose(rt.actuator_at(2 * NS + 200_000_000), lagging, atol=1e-12)
    with pytest.raises(ValueError, match="rest lengths"):
        rt.measured_rest_lengths(3 * NS, rest[:-1])
    params = PhysicalParameters(robot)                     # another model's actuator calibration
    params.set_value("actuator_gain", np.array([1.2]))
    params.set_value("actuator_offset", np.array([0.01]))
    rt.set_model(params)
    assert rt.measured_rest_lengths(3 * NS, rest)
    np.testing.assert_allclose(rt.actuator_at(3 * NS), (rest[idx] - 0.01) / 1.2, atol=1e-12)
    assert not rt.measured_rest_lengths(2 * NS + 500_000_000, rest)     # older, within a clock jump
    rt.restart()
    np.testing.assert_allclose(rt.actuator_at(4 * NS), a0)
    assert rt.measured_rest_lengths(NS, rest)                  # a new clock: its first reading is taken
