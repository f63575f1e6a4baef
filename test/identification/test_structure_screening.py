"""Screening a structure option on the solver's windows before a challenger is fitted for it
(`structure_screening`, `online_structure.StructureTrials.maybe_start`)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tensegrity_engine import identification as idf
from tensegrity_engine.groundtruth.realisation import Realisation
from tensegrity_engine.groundtruth.sensors import SensorModel
from tensegrity_engine.groundtruth.zoo import ZooRobot
from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.identification.solvers.levenberg_marquardt import raw_vector
from tensegrity_engine.identification.structure_screening import SCREEN_MIN_GAIN, screen_structure
from tensegrity_engine.physics.config import load_robot

PERIOD = 0.1
LEARN = ("cable_stiffness", "cable_damping")


def _pose_only(robot_integrator: str, root):
    """Hanging three-bar tuples (pose-only, 10 Hz) from MuJoCo stepping with
    ``robot_integrator``, its damping 2.5x and stiffness 0.7x the config's (as
    test_structure's selection test, where implicitfast predicts 30x better than the
    engine's step on the implicitfast robot and 30x worse on the Euler one)."""
    base = load_robot("three_bar")
    truth = base.replace(cable_damping=base.cable_damping * 2.5, cable_stiffness=base.cable_stiffness * 0.7)
    robot = ZooRobot("test", "", base, truth, Realisation(integrator=robot_integrator), SensorModel())
    ds.generate_dataset(base, "noncontact", root, counts={"train": 3}, seed=1, dense=False, truth=robot,
                        duration=3.0, period=PERIOD)
    trajectories = ds.load_split(root / "noncontact", "train", robot=base)
    return base, ds.tuples_from([t.without_velocity() for t in trajectories], period=PERIOD)


def _solver(base, tuples, iterations: int = 16):
    """The engine's step, fitted on its windows by Levenberg-Marquardt."""
    cfg = idf.IdentificationConfig(period=PERIOD, learn=LEARN, init="given", schedule="fine_only",
                                   lm_windows=24, seed=0)
    tr = idf.ProgressiveTrainer(base, cfg, log=lambda m: None)
    tr.set_data(tuples)
    tr.window_lm.setup(tr)
    for _ in range(iterations):
        tr.window_lm.epoch(tr)
    return tr


def _challenger(base, solver):
    cfg = dataclasses.replace(solver.config, fine_integrator=None)
    return idf.ProgressiveTrainer(base.replace(integrator="implicitfast"), cfg, log=lambda m: None)


@pytest.mark.parametrize("robot_integrator", ["implicitfast", "Euler"])
def test_the_robots_integrator_is_screened_in_and_another_screened_out(tmp_path, robot_integrator):
    """Once the solver's own next step gains little, implicitfast is predicted to fit the
    solver's windows at least `SCREEN_MIN_GAIN` better exactly when the robot steps with it;
    before, the option is not evaluated (its look-ahead then said 45 % better on the Euler
    robot). The solver's values, windows and latents are left as they were."""
    base, tuples = _pose_only(robot_integrator, tmp_path)
    made = []

    def challenger():
        made.append(_challenger(base, solver))
        return made[-1]

    solver = _solver(base, tuples, iterations=4)
    early = screen_structure(solver, challenger)
    assert early.solver_moving and early.option_ahead is None and made == []
    for _ in range(12):
        solver.window_lm.epoch(solver)
    kept = (raw_vector(solver.params, solver.learn), solver.window_lm.windows.clone(),
            solver.window_lm.window_vel.clone(), solver.window_lm.latent_jac.clone())
    screen = screen_structure(solver, challenger)
    assert not screen.solver_moving and len(made) == 1
    if robot_integrator == "implicitfast":
        assert screen.gain >= SCREEN_MIN_GAIN
    else:
        assert screen.gain < SCREEN_MIN_GAIN
    assert torch.equal(raw_vector(solver.params, solver.learn), kept[0])
    assert torch.equal(solver.window_lm.windows, kept[1]) and torch.equal(solver.window_lm.window_vel, kept[2])
    assert torch.equal(solver.window_lm.latent_jac, kept[3])
    # the option was screened at the solver's values, on its windows, at its loss scale
    option = made[0]
    assert torch.equal(option.window_lm.windows, kept[1])
    assert option.objective.loss_scale == solver.objective.loss_scale
    for name in LEARN:
        assert torch.allclose(torch.as_tensor(option.parameters.as_dict()[name]),
                              torch.as_tensor(solver.parameters.as_dict()[name]), rtol=1e-9)


def test_a_solver_without_windows_is_not_screened_yet(tmp_path):
    base, tuples = _pose_only("Euler", tmp_path)
    cfg = idf.IdentificationConfig(period=PERIOD, learn=LEARN, init="given", schedule="fine_only", seed=0)
    solver = idf.ProgressiveTrainer(base, cfg, log=lambda m: None)
    solver.set_data(tuples)
    assert solver.window_lm.windows is None
    assert screen_structure(solver, lambda: _challenger(base, solver)) is None
