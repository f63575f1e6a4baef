"""Pose-only windows' latents chained along the record (`solvers.chaining`)."""
import dataclasses

import numpy as np
import pytest
import torch

from rolling_records import rolling_twin_run
from tensegrity_engine.identification.solvers.chaining import chain_latents, window_predecessors
from tensegrity_engine.identification.solvers.windows import chain_windows, fit_start_velocities
from tensegrity_engine.physics.state import quat_axis


def test_a_window_knows_the_one_it_continues():
    nxt = np.array([1, 2, 3, 4, 5, -1, 7, 8, -1])          # chains 0..5 and 6..8
    windows = torch.as_tensor([[6, 7], [0, 1], [4, 5], [2, 3]])
    assert window_predecessors(nxt, windows).tolist() == [-1, -1, 3, 1]


@pytest.fixture(scope="module")
def rolling_twin(superball):
    """8 s of the SUPERball twin rolling, pose-only (`rolling_records`)."""
    return rolling_twin_run(superball)


def test_chained_latents_find_the_spin_the_poses_alias(rolling_twin):
    """On the floor at the true values: the finite-difference spin about the rod axes is
    off (10 Hz poses: 0.41 rad/s on average through the middle pose, 5.6 aliased straight
    from the pose before to the one after), Gauss-Newton from it stalls (the spin moves no
    node), and latents chained from each window's predecessor fit the poses many times
    better (7x here; 41x from the aliased spins, whose fit was 60x worse)."""
    run, true_states = rolling_twin
    data, objective = run.train, run.objective
    windows = torch.as_tensor(chain_windows(data.ts.next, 3)[0])
    windows = windows[windows[:, 0] >= 10]      # after the first second: the motors settled from rest
    with torch.no_grad():
        p = {k: v.detach() for k, v in run.engine.param_values(torch.float64, "cpu").items()}
        truth = true_states[windows[:, 0]][..., 7:]
        axis = quat_axis(true_states[windows[:, 0]][..., 3:7])
        spin = lambda v: (v[..., 3:] * axis).sum(-1)                     # noqa: E731
        fd = data.x0[windows[:, 0]][..., 7:]
        # what the test is about: rods that spin fast, which finite differences miss
        assert float(spin(truth).abs().mean()) > 3.0
        assert float((spin(fd) - spin(truth)).abs().mean()) > 0.2
        loss = lambda v: float((objective.window_residual(data, windows, v, p) ** 2).sum())   # noqa: E731
        assert loss(truth) < 1e-9                                        # the model is the robot
        alone = fit_start_velocities(objective, data, windows, p, iterations=4)
        chained = fit_start_velocities(objective, data, windows, p, iterations=4, chain=True)
        assert loss(chained) < loss(alone) / 5.0
        # only windows with a predecessor change, and none fits worse
        first = window_predecessors(data.ts.next, windows) < 0
        assert torch.equal(chained[first], alone[first])
        per = lambda v: (objective.window_residual(data, windows, v, p) ** 2).sum(-1)   # noqa: E731
        assert bool((per(chained) <= per(alone)).all())


def test_the_solver_chains_its_new_windows_and_only_them(rolling_twin):
    run, _ = rolling_twin
    solver = run.window_lm
    solver.reset()
    solver.setup(run, announce=False)
    assert solver.chained > 0
    kept = solver.window_vel.clone()
    before = solver.chained
    solver.grow()
    solver.setup(run, announce=False)               # the same windows: latents kept, none chained
    assert solver.chained == before
    assert torch.equal(solver.window_vel, kept)
    on = run.config
    solver.config = dataclasses.replace(on, chain_latents=False)
    try:
        solver.reset()
        solver.setup(run, announce=False)
        assert solver.chained == before
        fd = run.train.x0[solver.windows[:, 0]][..., 7:]
        assert torch.equal(solver.window_vel, fd)
    finally:
        solver.config = on
