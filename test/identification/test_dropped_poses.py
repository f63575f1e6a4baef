"""Held-out chains across a dropped mocap frame: the rollout runs through the missing
interval on the commands the record holds, and only the missing pose goes unscored."""
import numpy as np
import pytest
import torch

from rolling_records import rolling_twin_run
from tensegrity_engine.identification.acceptance import heldout_scores
from tensegrity_engine.identification.solvers.windows import chain_windows, gapped_windows

WIDTH = 10
DROPPED = (14,)      # frame 14 lost: the tuples that start at frames 13 and 14 are never made


@pytest.fixture(scope="module")
def records(superball):
    full = rolling_twin_run(superball, seconds=4.2)
    gapped = rolling_twin_run(superball, seconds=4.2, dropped=DROPPED)
    return full, gapped


def _values(run):
    return {k: v.detach() for k, v in run.engine.param_values(run.dtype, run.device).items()}


def test_windows_reach_across_a_dropped_pose_where_chains_break(records):
    (full, _), (gapped, _) = records
    w_full = gapped_windows(full.train, WIDTH, fit=3)
    w_gap = gapped_windows(gapped.train, WIDTH, fit=3)
    assert np.array_equal(w_full, chain_windows(full.train.ts.next, WIDTH)[0])     # unbroken: the same
    assert len(chain_windows(gapped.train.ts.next, WIDTH)[0]) == len(w_full) - 1    # broken: one lost
    assert w_gap.shape == w_full.shape and (w_gap < 0).sum() == 2                   # here: kept, 2 holes
    assert (w_gap[:, 0] >= 0).all() and (w_gap[:, -1] >= 0).all()
    # known wrenches are per tuple, none for a dropped interval: unbroken chains only there
    data = gapped.train
    data.wrenches = torch.zeros(len(data), data.commands.shape[1], data.x0.shape[1], 6, dtype=data.x0.dtype)
    try:
        assert np.array_equal(gapped_windows(data, WIDTH, fit=3), chain_windows(data.ts.next, WIDTH)[0])
    finally:
        data.wrenches = None
    # a window must start and end at a tuple: a drop at either end moves or loses it
    run, pos = gapped.train.run_positions()
    assert len(np.unique(run)) == 1 and np.all(np.diff(pos) >= 1) and np.diff(pos).max() == 3


def test_the_rollout_through_the_gap_is_the_unbroken_one(records):
    """Same start, same model: the states at every sample match the record without the drop,
    so the missing intervals' commands and the actuator state were carried across it."""
    (full, states), (gapped, _) = records
    w_full = torch.as_tensor(gapped_windows(full.train, WIDTH, fit=3))
    w_gap = torch.as_tensor(gapped_windows(gapped.train, WIDTH, fit=3))
    p = _values(full)
    vel = states[w_full[:, 0]][..., 7:].to(full.dtype)            # true start velocities
    S = full.train.commands.shape[1]
    a = full.objective.window_rollout(full.train, w_full, p, vel, record_every=S)
    b = full.objective.window_rollout(gapped.train, w_gap, p, vel, record_every=S)
    assert a.shape == b.shape and float((a - b).abs().max()) < 1e-9
    # and it moved: the window with the gap is not at rest
    assert float((a[:, -1, :, :3] - a[:, 0, :, :3]).norm(dim=-1).max()) > 0.02


def test_the_missing_pose_is_not_scored_and_the_rest_weigh_as_before(records):
    (full, states), (gapped, _) = records
    w_full = torch.as_tensor(gapped_windows(full.train, WIDTH, fit=3))
    w_gap = torch.as_tensor(gapped_windows(gapped.train, WIDTH, fit=3))
    p = _values(full)
    wrong = {**p, "cable_stiffness": 1.5 * p["cable_stiffness"]}
    vel = states[w_full[:, 0]][..., 7:].to(full.dtype)
    r_full = full.objective.window_residual(full.train, w_full, vel, wrong).reshape(len(w_full), WIDTH, -1)
    r_gap = full.objective.window_residual(gapped.train, w_gap, vel, wrong).reshape(len(w_gap), WIDTH, -1)
    present = (w_gap >= 0)
    per_sample = (r_full ** 2).sum(-1)
    expected = (per_sample * present).sum(1) * WIDTH / present.sum(1)
    assert torch.allclose((r_gap ** 2).sum((1, 2)), expected, rtol=1e-9, atol=0)
    assert float((r_gap[~present] ** 2).sum()) == 0.0 and float(per_sample[~present].min()) > 0


def test_a_held_out_block_with_a_dropped_pose_is_scored(records):
    """The gate's scores: one per window, the gapped one too, about as the unbroken record
    scores it (its start velocity is fitted to one pose fewer after the drop); a wrong model
    is worse on every block. The first block carries the record's unknown motor start."""
    (full, _), (gapped, _) = records
    truth = {k: v.tolist() for k, v in _values(full).items()}
    wrong = {**truth, "cable_stiffness": [1.5 * v for v in truth["cable_stiffness"]]}
    loss, com = heldout_scores(gapped, gapped.train.ts, truth, chain=WIDTH, per_block=True)
    unbroken, unbroken_com = heldout_scores(full, full.train.ts, truth, chain=WIDTH, per_block=True)
    loss_w, com_w = heldout_scores(gapped, gapped.train.ts, wrong, chain=WIDTH, per_block=True)
    assert len(loss) == len(com) == len(unbroken) == 4
    assert np.allclose(loss, unbroken, rtol=0.2) and np.allclose(com, unbroken_com, rtol=0.2)
    assert (loss_w[1:] > 100 * loss[1:]).all() and (com[1:] < 2e-3).all() and (com_w[1:] > 5 * com[1:]).all()
    # a dropped pose at a window's end: that window cannot be scored to its end
    with pytest.raises(ValueError, match="end at a tuple"):
        w = torch.as_tensor(gapped_windows(gapped.train, WIDTH, fit=3))
        w[0, -1] = -1
        gapped.objective.chain_com_error(gapped.train, w, _values(gapped))
