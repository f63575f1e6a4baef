"""A stream's motors are assumed settled at the first command heard: the pose-only windows
keep clear of that assumption (`solvers.windows.training_windows`)."""
import dataclasses

import numpy as np
import pytest
import torch

from rolling_records import rolling_twin_run
from tensegrity_engine.identification import IdentificationConfig
from tensegrity_engine.identification.dataset import DatasetError, TupleSet
from tensegrity_engine.identification.solvers.settle import motor_settled, settle_steps
from tensegrity_engine.identification.solvers.windows import chain_windows, training_windows


@pytest.fixture(scope="module")
def rolling(superball):
    return rolling_twin_run(superball)


def test_only_a_records_first_piece_has_an_assumed_motor_state(rolling):
    ts = rolling[0].train.ts
    assert ts.traj_act0_assumed is not None
    assert np.array_equal(ts.traj_act0_assumed, ts.traj_prev < 0)
    steps = 500
    settled = motor_settled(ts, steps)
    root = ts.traj_act0_assumed[ts.traj]
    assert np.array_equal(settled[root], ts.start_step[root] >= steps)
    assert settled[~root].all()                              # a continued piece runs on from its record
    assert not settled.all() and settled.any()
    # measured motor states (offline trajectories) wait for nothing
    assert motor_settled(dataclasses.replace(ts, traj_act0_assumed=None), steps).all()


def test_the_windows_leave_out_what_no_start_velocity_can_fit(rolling):
    """At the true values and true start velocities the model is the robot, but for the
    windows whose motors the stream could only assume: their error stays; after five time
    constants what is left of the assumption is far below a fitted window's misfit."""
    run, true_states = rolling
    data, objective = run.train, run.objective
    with torch.no_grad():
        p = {k: v.detach() for k, v in run.engine.param_values(torch.float64, "cpu").items()}
        every = torch.as_tensor(chain_windows(data.ts.next, 3)[0])
        settle = settle_steps(run.robot, p, IdentificationConfig().motor_settle)
        kept = torch.as_tensor(training_windows(data.ts, 3, settle)[0])
        per = lambda w: (objective.window_residual(data, w, true_states[w[:, 0]][..., 7:], p) ** 2).sum(-1)  # noqa: E731
        left_out = every[~torch.isin(every[:, 0], kept[:, 0])]
    assert 0 < len(left_out) < len(every) / 10
    assert float(per(kept).max()) < 1e-7
    assert float(per(left_out).max()) > 1e4 * float(per(kept).max())
    # tau 0.1 s of the robot, 0.05 s in its config: five of the larger
    assert settle == pytest.approx(5 * 0.1 / run.robot.dt, abs=1)


def test_the_solver_draws_settled_windows_and_none_when_told_not_to_wait(rolling):
    run, _ = rolling
    solver = run.window_lm
    on = run.config
    try:
        solver.reset()
        solver.setup(run, announce=False)
        waited = set(solver.windows[:, 0].tolist())
        solver.config = dataclasses.replace(on, motor_settle=0.0)
        solver.reset()
        solver.setup(run, announce=False)
        every = set(solver.windows[:, 0].tolist())
    finally:
        solver.config = on
        solver.reset()
    assert waited < every
    assert min(every) == 0 and min(waited) > 0


def test_tuple_sets_check_and_concatenate_their_motor_flags(rolling):
    ts = rolling[0].train.ts
    with pytest.raises(DatasetError, match="traj_act0_assumed"):
        dataclasses.replace(ts, traj_act0_assumed=np.ones(len(ts.traj_act0) + 1, dtype=bool))
    measured = dataclasses.replace(ts, traj_act0_assumed=None)
    both = TupleSet.concat([measured, ts])
    n = len(ts.traj_act0)
    assert not both.traj_act0_assumed[:n].any() and np.array_equal(both.traj_act0_assumed[n:], ts.traj_act0_assumed)
    assert TupleSet.concat([measured, measured]).traj_act0_assumed is None
    with pytest.raises(ValueError, match="motor_settle"):
        IdentificationConfig(motor_settle=-1.0)


def _filter_runs(commands: np.ndarray, starts: np.ndarray, tau: float, speed: float, dt: float) -> np.ndarray:
    """[steps + 1, starts, A] the rate-limited filter stepped one engine step at a time."""
    from tensegrity_engine.physics.actuators import actuator_update
    a = torch.as_tensor(starts)
    out = [a]
    for u in torch.as_tensor(commands):
        a = actuator_update(a, u, torch.tensor(tau, dtype=torch.float64), dt, torch.tensor(speed, dtype=torch.float64))[0]
        out.append(a)
    return torch.stack(out).numpy()


def test_a_winch_at_top_speed_waits_until_no_start_in_the_range_shows(rolling):
    """A rate-limited winch chasing its commands flat out keeps its start's offset: the wait is
    measured on the record's commands, not taken as a few time constants, and after it no
    start inside the command range is more than exp(-motor_settle) of the span away."""
    run, _ = rolling
    ts, robot = run.train.ts, run.robot
    p = {k: v.detach() for k, v in run.engine.param_values(torch.float64, "cpu").items()}
    time_constants = IdentificationConfig().motor_settle
    plain = settle_steps(robot, p, time_constants, ts)
    assert np.ndim(plain) == 0                                  # the twin's winch is not limited
    tau, speed = 0.2, 0.15                                      # m/s: below the commands' speed
    limited = settle_steps(robot, {**p, "actuator_time_constant": torch.tensor([tau]),
                                   "actuator_max_speed": torch.tensor([speed])}, time_constants, ts)
    root = int(np.flatnonzero(ts.traj_prev < 0)[0])
    wait = int(limited[root])
    assert wait > 2 * time_constants * tau / robot.dt           # far beyond five time constants
    delay = int(round(float(p["actuator_delay"]) / robot.dt))
    first = np.arange(len(ts.traj_act0))
    for t in np.flatnonzero(ts.traj_prev >= 0):
        first[t] = first[ts.traj_prev[t]]
    later = [t for t in np.flatnonzero(first == root) if t != root]    # the pieces that continue it
    commands = np.clip(np.concatenate([ts.traj_commands[t] for t in [root] + later]),
                       robot.command_low, robot.command_high)
    assert wait - delay < len(commands)                         # it does settle within the record
    low, high = robot.command_low, robot.command_high
    starts = np.concatenate([np.stack([low, high]), np.random.default_rng(0).uniform(low, high, (6, len(low)))])
    runs = _filter_runs(commands[:wait - delay], starts, tau, speed, robot.dt)
    tolerance = np.exp(-time_constants) * (high - low)
    assert (runs[-1].max(0) - runs[-1].min(0) <= tolerance * (1 + 1e-9)).all()
    assert not (runs[-2, 1] - runs[-2, 0] <= tolerance).all()        # the first step where it holds
    # every start stays between the runs from the range's two ends
    assert (runs[:, 2:] >= runs[:, :1] - 1e-12).all() and (runs[:, 2:] <= runs[:, 1:2] + 1e-12).all()
    # half-way through the wait the starts still show
    assert not ((runs[(wait - delay) // 2, 1] - runs[(wait - delay) // 2, 0]) <= tolerance).all()
    settled = motor_settled(ts, limited)
    assert np.array_equal(settled[ts.traj == root], ts.start_step[ts.traj == root] >= wait)


def test_a_held_command_is_forgotten_within_its_hold_not_at_its_end():
    """The wait is the first engine step where the runs from the range's ends agree, also
    inside a long stretch of one command (found by bisection there), as stepping the filter
    one engine step at a time finds it; a record whose start is measured waits for nothing."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.solvers.settle import record_settle_steps
    dt, low, high = 1e-3, np.array([0.5, 0.6]), np.array([0.95, 0.9])
    rng = np.random.default_rng(4)
    held = np.repeat(rng.uniform(low, high, (3, 2)), [400, 5000, 300], axis=0)    # 0.4 s, 5 s, 0.3 s
    ts = SimpleNamespace(traj_act0=[held[0], held[0]], traj_prev=np.array([-1, -1]), traj_commands=[held, held],
                         act0_assumed=lambda: np.array([True, False]))
    tau, speed = torch.tensor(0.2, dtype=torch.float64), torch.tensor([0.1], dtype=torch.float64)
    got = record_settle_steps(ts, low, high, tau, speed, dt, 5.0)
    runs = _filter_runs(held, np.stack([low, high]), 0.2, 0.1, dt)
    tolerance = np.exp(-5.0) * (high - low)
    expected = int(np.flatnonzero(((runs[:, 1] - runs[:, 0]) <= tolerance).all(-1))[0])
    assert 400 < expected < 5400                                      # inside the long hold
    assert got[0] == expected and got[1] == 0


def test_the_finite_difference_stage_fits_only_settled_tuples(rolling):
    """The tuple Levenberg-Marquardt draws its tuples where the windows do: none within
    `motor_settle` time constants of the assumed start; all of them when told not to wait."""
    from tensegrity_engine.identification.solvers.levenberg_marquardt import (TupleLevenbergMarquardt, raw_vector,
                                                                              set_raw_vector)
    run, _ = rolling
    ts = run.train.ts
    p = {k: v.detach() for k, v in run.engine.param_values(torch.float64, "cpu").items()}
    settled = np.flatnonzero(motor_settled(ts, settle_steps(run.robot, p, IdentificationConfig().motor_settle, ts)))
    assert 0 < len(settled) < len(ts.x0)
    seen, start = [], raw_vector(run.params, run.learn)
    original = TupleLevenbergMarquardt._residual_of

    def recording(r, idx):
        seen.append(idx.tolist())
        return original(r, idx)

    try:
        TupleLevenbergMarquardt._residual_of = staticmethod(recording)
        for motor_settle, expected in ((IdentificationConfig().motor_settle, settled.tolist()),
                                       (0.0, list(range(len(ts.x0))))):
            seen.clear()
            config = dataclasses.replace(run.config, motor_settle=motor_settle, lm_tuples=10_000)
            TupleLevenbergMarquardt(config).epoch(run)
            assert seen and all(s == expected for s in seen), motor_settle
    finally:
        TupleLevenbergMarquardt._residual_of = staticmethod(original)
        set_raw_vector(run.params, run.learn, start)
