"""A structure challenger's windowed stage starts on the windows and latents of the session's solver."""
import dataclasses

import numpy as np
import pytest
import torch

from tensegrity_engine import identification as idf
from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.identification.online_structure import solvers_windows

PERIOD = 0.02


@pytest.fixture(scope="module")
def poses(tmp_path_factory, superball):
    root = tmp_path_factory.mktemp("challenger_windows")
    ds.generate_dataset(superball, "noncontact", root, counts={"train": 2, "val": 1, "test": 1},
                        duration=0.6, period=PERIOD, seed=11, dense=False)
    return {s: ds.tuples_from([t.without_velocity() for t in ds.load_split(root / "noncontact", s)], period=PERIOD)
            for s in ("train", "val")}


def _config(**kw):
    return idf.IdentificationConfig(period=PERIOD, learn=("cable_stiffness", "cable_damping"), schedule="online",
                                    init="given", lm_max_iters=40, lm_windows=12, seed=0, **kw)


def _in_finite_differences(superball, data):
    tr = idf.ProgressiveTrainer(superball, _config(per_element=("cable_stiffness",)), log=lambda m: None)
    tr.set_data(data)
    tr.train_epoch()
    assert tr.schedule.pose_stage == "finite_difference" and not tr.done and tr.window_lm.windows is None
    return tr


def test_windows_are_taken_only_where_they_index_the_same_tuples(superball, poses):
    """The donor's windows are refused where their start poses are not the trainer's, where
    they are wider than the trainer's windows, or where the trainer has windows of its own."""
    from tensegrity_engine.identification.solvers.windows import WindowLevenbergMarquardt, inherit_windows

    donor = idf.ProgressiveTrainer(superball, _config(), log=lambda m: None)
    donor.set_data(poses["train"])
    while donor.window_lm.windows is None:
        donor.train_epoch()
    tr = _in_finite_differences(superball, poses["train"])
    assert inherit_windows(WindowLevenbergMarquardt(tr.config), tr, donor.window_lm, donor.train)
    wide = WindowLevenbergMarquardt(dataclasses.replace(tr.config, pose_window=tr.config.pose_window + 1))
    assert not inherit_windows(wide, tr, donor.window_lm, donor.train)
    same_size = ds.TupleSet.concat([poses["val"], poses["val"]])                # other start poses
    assert len(same_size) == len(poses["train"])
    other = _in_finite_differences(superball, same_size)
    assert not inherit_windows(WindowLevenbergMarquardt(other.config), other, donor.window_lm, donor.train)
    assert not inherit_windows(donor.window_lm, donor, donor.window_lm, donor.train)     # has windows


def test_a_challenger_entering_its_windows_takes_the_solvers_windows_within_its_tuples(superball, poses):
    """A challenger fitted on the window as it was when it started enters its windowed stage
    (its finite-difference stage capped, `CHALLENGER_FD_ITERS`) after the solver has grown
    past its tuples: it takes the solver's windows that lie within them, with their latents,
    not the others; before its windows, or with windows of its own, it takes nothing."""
    grown = ds.TupleSet.concat([poses["train"], poses["val"]])
    solver = idf.ProgressiveTrainer(superball, _config(), log=lambda m: None)
    solver.set_data(grown)
    while solver.window_lm.windows is None:
        solver.train_epoch()
    within = (solver.window_lm.windows < len(poses["train"])).all(1)
    assert 0 < int(within.sum()) < len(within)                  # some windows lie past its tuples

    challenger = idf.ProgressiveTrainer(superball, _config(per_element=("cable_stiffness",), fd_max_iters=1),
                                        log=lambda m: None)
    challenger.set_data(poses["train"])
    assert not solvers_windows(challenger, solver)                # still on finite differences
    challenger.train_epoch()
    assert challenger.schedule.windows and challenger.window_lm.windows is None
    assert solvers_windows(challenger, solver)
    assert torch.equal(challenger.window_lm.windows, solver.window_lm.windows[within])
    assert torch.equal(challenger.window_lm.window_vel, solver.window_lm.window_vel[within])
    assert not solvers_windows(challenger, solver)                # it has its own now
    m = challenger.train_epoch()
    assert not m["diverged"] and torch.equal(challenger.window_lm.windows, solver.window_lm.windows[within])
