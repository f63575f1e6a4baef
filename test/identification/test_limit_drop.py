"""A winch speed limit the windowed solver settled with must pay for itself
(`solvers.limit_drop`): a spurious one (slow motors taken for a limit) is dropped and tau
found again; a real one is kept."""
import dataclasses

import pytest
import torch
from rolling_records import rolling_twin_run
from tensegrity_engine.identification.solvers.levenberg_marquardt import raw_vector, set_raw_vector
from tensegrity_engine.identification.solvers.limit_drop import LIMIT, TAU, drop_speed_limit
from tensegrity_engine.identification.solvers.windows import fit_start_velocities
from tensegrity_engine.identification.uncertainty import bound_sides
from tensegrity_engine.physics.actuators import speed_limit_binds

LEARN = ("actuator_time_constant", "actuator_max_speed")


def _windows_at_the_values(run):
    solver = run.window_lm
    solver.reset()
    solver.setup(run, announce=False)
    p = run.engine.param_values(run.dtype, run.device)
    vel = fit_start_velocities(run.objective, run.train, solver.windows, p, start=solver.window_vel)

    def refit(values, start):
        return fit_start_velocities(run.objective, run.train, solver.windows, values, 4, start=start)
    return solver.windows, vel, refit


def _window_loss(run, windows, vel) -> float:
    p = run.engine.param_values(run.dtype, run.device)
    return float((run.objective.window_residual(run.train, windows, vel, p) ** 2).sum())


def _binds(run) -> bool:
    p = run.engine.param_values(run.dtype, run.device)
    return speed_limit_binds(p[TAU], p[LIMIT], run.objective.cmd_high - run.objective.cmd_low)


@pytest.fixture(scope="module")
def unlimited_run(superball):
    return rolling_twin_run(superball, seconds=6.0, config={"learn": LEARN})[0]


@pytest.fixture
def unlimited(unlimited_run):
    """The rolling twin's run at its true values, as each test found it: the tests move its
    values and its solver's state."""
    run = unlimited_run
    raw = raw_vector(run.params, run.learn)
    yield run
    set_raw_vector(run.params, run.learn, raw)
    run.window_lm.reset()
    run.window_lm.latent_jac, run.window_lm.lm_lambda = None, 1e-3
    run.window_lm.settled.clear()


def test_a_limit_that_stands_in_for_slow_motors_is_dropped_and_tau_found_again(unlimited):
    run = unlimited
    true_tau = float(run.params.value(TAU).detach().max())
    assert not _binds(run)
    # the basin the limit search can leave: a limit that binds, tau off to make up for it
    run.params.set_value(LIMIT, 0.3)
    run.params.set_value(TAU, 0.6 * true_tau)
    assert _binds(run)
    windows, vel, refit = _windows_at_the_values(run)
    before = _window_loss(run, windows, vel)
    dropped = drop_speed_limit(run, windows, vel, refit)
    assert dropped is not None
    after, new_vel = dropped
    assert after < 0.5 * before
    assert after == pytest.approx(_window_loss(run, windows, new_vel), rel=1e-9)
    assert not _binds(run)
    assert bound_sides(run.params, LIMIT) == ()            # "none" as the config says it, not pinned
    tau = float(run.params.value(TAU).detach().max())
    assert abs(tau - true_tau) < 0.4 * true_tau           # the line search ran on the limit's latents
    # the solver goes on from there: without the limit tau has a gradient again
    solver = run.window_lm
    solver.window_vel, solver.latent_jac = new_vel, None
    for _ in range(6):
        solver.epoch(run)
    assert not _binds(run)
    assert float(run.params.value(TAU).detach().max()) == pytest.approx(true_tau, rel=0.05)


@pytest.fixture(scope="module")
def limited(superball):
    robot = superball.replace(actuator=dataclasses.replace(superball.actuator, max_speed=0.3))
    return rolling_twin_run(robot, seconds=6.0, config={"learn": LEARN})[0]


def test_a_limit_the_robot_has_is_kept_and_the_values_left_as_they_were(limited):
    run = limited
    assert float(run.params.value(LIMIT).detach().max()) == pytest.approx(0.3)
    assert _binds(run)
    windows, vel, refit = _windows_at_the_values(run)
    raw = raw_vector(run.params, run.learn)
    assert drop_speed_limit(run, windows, vel, refit) is None
    assert torch.equal(raw_vector(run.params, run.learn), raw)
    # the limit is felt: without it the same windows fit far worse at the same tau
    with_limit = _window_loss(run, windows, vel)
    run.params.set_value(LIMIT, 900.0)
    without = _window_loss(run, windows, vel)
    run.params.set_value(LIMIT, 0.3)
    assert without > 2.0 * with_limit


def test_what_a_refit_of_the_latents_gains_is_not_counted_for_dropping_the_limit(limited):
    """The limit-free fit is scored on refitted latents; the fit with the limit must be too,
    or latents the solver left off their optimum (stale, after the data grew) make a real
    limit look worse than none."""
    run = limited
    windows, vel, refit = _windows_at_the_values(run)
    fitted = _window_loss(run, windows, vel)
    stale = vel + 0.5 * torch.randn(vel.shape, generator=torch.Generator().manual_seed(0), dtype=vel.dtype)
    # far off: a refit gains more than the limit does (without it the windows fit ~0.12)
    assert _window_loss(run, windows, stale) > 1e4 * fitted
    raw = raw_vector(run.params, run.learn)
    assert drop_speed_limit(run, windows, stale, refit) is None
    assert torch.equal(raw_vector(run.params, run.learn), raw)


@pytest.mark.parametrize("settled", [True, False])
def test_the_windowed_solver_tests_its_limit_where_it_settles_and_only_there(unlimited, monkeypatch, settled):
    run = unlimited
    true_tau = float(run.params.value(TAU).detach().max())
    run.params.set_value(LIMIT, 0.3)
    run.params.set_value(TAU, 0.6 * true_tau)
    windows, vel, _ = _windows_at_the_values(run)
    solver = run.window_lm
    solver.window_vel, solver.latent_jac = vel, None
    # the values' path within lm_settle_sigmas of their sigma, or far from it
    monkeypatch.setattr(solver.settled, "span", lambda *a, **k: 0.0 if settled else 10.0)
    metrics = solver.epoch(run)
    assert metrics["lm_accepted"]
    if settled:      # dropped: the stage is not settled, its loss the limit-free fit's
        assert metrics["settled_sigmas"] == float("inf")
        assert metrics["step"] == float("inf")      # the step before the drop is no convergence test
        assert not _binds(run)
        assert metrics["loss"] == pytest.approx(_window_loss(run, windows, solver.window_vel), rel=1e-9)
    else:
        assert metrics["settled_sigmas"] == 10.0
        assert _binds(run)


def test_a_test_that_fails_on_the_way_leaves_the_values_as_they_were(unlimited):
    run = unlimited
    run.params.set_value(LIMIT, 0.3)
    windows, vel, _ = _windows_at_the_values(run)
    raw = raw_vector(run.params, run.learn)

    def singular(values, start):
        raise RuntimeError("linalg.solve: the matrix is singular")
    assert drop_speed_limit(run, windows, vel, singular) is None
    assert torch.equal(raw_vector(run.params, run.learn), raw)
