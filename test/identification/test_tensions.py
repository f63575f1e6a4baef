"""Cables with load cells: measured tensions in pose-only identification. Poses see a cable's
force only through the motion it causes; a measured force fixes its scale."""
import math

import numpy as np
import pytest
import torch

from rolling_records import rolling_twin_run
from tensegrity_engine.identification.solvers.windows import chain_windows
from tensegrity_engine.identification.streaming import StreamAligner, StreamConfig, TupleBatch

UNSENSED = (3, 17)


@pytest.fixture(scope="module")
def with_tensions(superball):
    return rolling_twin_run(superball, tensions=True, unsensed=UNSENSED,
                            config=dict(tension_weight=5e-4, learn=("cable_stiffness", "cable_damping")))


def _windows(run):
    windows = torch.as_tensor(chain_windows(run.train.ts.next, 3)[0])
    return windows[windows[:, 0] >= 10]         # after the first second: the motors settled from rest


def _truth(run):
    return {k: v.detach() for k, v in run.engine.param_values(torch.float64, "cpu").items()}


def test_measured_tensions_reach_both_ends_of_each_tuple_and_a_cable_without_a_cell_stays_unmeasured(with_tensions):
    run, _ = with_tensions
    data = run.train
    C = run.robot.num_cables
    assert data.tension0.shape == data.tension1.shape == (len(data), C)
    sensed = torch.ones(C, dtype=torch.bool)
    sensed[list(UNSENSED)] = False
    # a reading that came after the pose closing a tuple is the next tuple's start's: the
    # last tuple's end has none
    nxt = torch.as_tensor(data.ts.next)
    has = nxt >= 0
    assert int((~has).sum()) == 1
    for seen in (data.tension_seen0, data.tension_seen1[has]):
        assert torch.equal(seen, sensed.expand_as(seen))
    assert not bool(data.tension_seen1[~has].any())
    assert float(data.tension0[:, sensed].abs().max()) > 10.0          # the cables pull (N)
    assert float(data.tension0[:, ~sensed].abs().max()) == 0.0
    assert torch.equal(data.tension1[has], data.tension0[nxt[has]])


def test_the_tension_rows_vanish_at_the_truth_and_weigh_what_the_weight_says(with_tensions):
    run, true_states = with_tensions
    data, objective = run.train, run.objective
    windows = _windows(run)
    C, n_pos = run.robot.num_cables, windows.shape[1] * run.robot.num_rods * 6
    p = _truth(run)
    with torch.no_grad():
        r = objective.window_residual(data, windows, true_states[windows[:, 0]][..., 7:], p)
        rows = objective.tension_rows(data, windows, true_states[windows[:, 0]][..., 7:],
                                      *objective.window_rollout(data, windows, p, true_states[windows[:, 0]][..., 7:],
                                                                record_every=data.commands.shape[1], with_acts=True), p)
    assert r.shape[1] == n_pos + (windows.shape[1] + 1) * C
    # the twin's MuJoCo tensions are the engine's at the same state (its load cells exact):
    # to round-off once the motors' start is forgotten, within 5 mN of ~1.5 kN before
    assert float(rows.abs().max()) < 1e-2
    assert float(rows.abs().median()) < 1e-9
    # unmeasured cables give zero rows whatever the model says
    p_off = dict(p, cable_stiffness=p["cable_stiffness"] * 1.1)
    with torch.no_grad():
        r_off = objective.window_residual(data, windows, true_states[windows[:, 0]][..., 7:], p_off)
    tension_part = r_off[:, n_pos:].reshape(len(windows), windows.shape[1] + 1, C)
    assert float(tension_part[..., list(UNSENSED)].abs().max()) == 0.0
    assert float(tension_part.abs().max()) > 0.0
    # 1 N off weighs as tension_weight m in one free rod's node
    node = 1.0 / (2.0 * run.robot.num_rods * windows.shape[0] * windows.shape[1] * objective.loss_scale)
    with torch.no_grad():
        raw = objective.tension_rows(data, windows, true_states[windows[:, 0]][..., 7:],
                                     *objective.window_rollout(data, windows, p_off, true_states[windows[:, 0]][..., 7:],
                                                               record_every=data.commands.shape[1], with_acts=True),
                                     p_off)
    assert torch.allclose(tension_part.flatten(1), raw * 5e-4 * math.sqrt(node), rtol=1e-12, atol=0.0)


def test_the_load_cells_see_the_force_scale_that_the_poses_barely_do(with_tensions):
    """Stiffness and damping scaled together (c / K, the cables' relaxation, kept): over
    windows of 0.3 s the poses move by 2.9 of a mocap's noise, the tensions by 75 of a load
    cell's (the SUPERball twin rolling; an overdamped robot's poses see less still)."""
    run, true_states = with_tensions
    data, objective = run.train, run.objective
    windows = _windows(run)
    p = _truth(run)
    vel = true_states[windows[:, 0]][..., 7:]
    scaled = dict(p, cable_stiffness=p["cable_stiffness"] * 1.1, cable_damping=p["cable_damping"] * 1.1)
    with torch.no_grad():
        pred, _ = objective.window_rollout(data, windows, scaled, vel, record_every=data.commands.shape[1],
                                           with_acts=True)
        moved = (pred[..., :3] - objective.window_rollout(data, windows, p, vel,
                                                            record_every=data.commands.shape[1])[..., :3]).norm(dim=-1)
        tension = objective.tension_rows(data, windows, vel, *objective.window_rollout(
            data, windows, scaled, vel, record_every=data.commands.shape[1], with_acts=True), scaled)
    # over a 1 mm mocap's noise and a 2 N load cell's
    pose_snr, cell_snr = float(moved.mean()) / 1e-3, float(tension.abs().mean()) / 2.0
    assert cell_snr > 10.0 * pose_snr


def _aligner(num_cables=4):
    return StreamAligner(StreamConfig(num_rods=1, num_actuated=1, num_cables=num_cables, interval=0.1,
                                      engine_dt=0.01))


POSE = np.array([[0.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0]])
NS = 1_000_000_000


def test_bad_tension_readings_are_refused_and_counted_and_a_late_one_still_joins_its_pose():
    a = _aligner()
    a.add_command(0, [1.0])
    assert a.add_tensions(0, [1.0, 2.0]) == (False, "wrong_length")
    assert a.add_tensions(0, [math.nan] * 4) == (False, "nonfinite")
    assert a.add_tensions(0, [1.0, math.inf, 0.0, 0.0]) == (False, "nonfinite")
    assert a.add_tensions(0, [1.0, 2e5, 0.0, 0.0]) == (False, "out_of_range")
    assert a.add_tensions(0, "garbage") == (False, "wrong_length")
    assert a.add_tensions(0, [10.0, math.nan, -0.5, 3.0]) == (True, "ok")     # a cell's noise about a slack cable's 0
    assert a.add_tensions(0, [10.0, 1.0, 1.0, 1.0]) == (False, "duplicate")
    assert a.add_pose(0, POSE)[0]
    assert a.add_pose(NS // 10, POSE)[0]
    assert a.add_tensions(NS // 10 + 1_000_000, [20.0, 21.0, 22.0, 23.0]) == (True, "ok")   # after its pose, 1 ms off
    assert a.add_tensions(NS // 20, [1.0, 1.0, 1.0, 1.0]) == (False, "out_of_order")
    a.add_command(NS // 5, [1.0])
    a.flush()
    batch = a.pop_tuples()
    assert len(batch) == 1
    np.testing.assert_array_equal(batch.tension0[0].numpy(), [10.0, math.nan, -0.5, 3.0])
    np.testing.assert_array_equal(batch.tension1[0].numpy(), [20.0, 21.0, 22.0, 23.0])
    stats = a.stats()
    assert stats["tensions_accepted"] == 2
    assert (stats["count_wrong_length"], stats["count_nonfinite"], stats["count_out_of_range"],
            stats["count_duplicate"], stats["count_out_of_order"]) == (2, 2, 1, 1, 1)
    assert a.rejected_total == 7


def test_batches_with_and_without_load_cells_join_and_a_malformed_one_is_refused():
    plain, sensed = _aligner(), _aligner()
    for a, t in ((plain, None), (sensed, [5.0, 6.0, 7.0, 8.0])):
        a.add_command(0, [1.0])
        for k in range(3):
            a.add_pose(k * NS // 10, POSE)
            if t is not None:
                a.add_tensions(k * NS // 10, t)
        a.flush()
    b_plain, b_sensed = plain.pop_tuples(), sensed.pop_tuples()
    assert b_plain.tension0 is None and b_sensed.tension0.shape == (2, 4)
    both = TupleBatch.cat([b_plain, b_sensed])
    assert bool(both.tension0[:2].isnan().all()) and torch.equal(both.tension0[2:], b_sensed.tension0)
    assert TupleBatch.cat([b_plain, b_plain]).tension0 is None
    assert both.slice(slice(0, 1)).tension1.shape == (1, 4)
    # a file's batch (a checkpoint's window) with tensions of the wrong shape is refused
    fields = b_sensed.to_dict()
    with pytest.raises(ValueError, match="tensions"):
        TupleBatch.from_dict(dict(fields, tension1=fields["tension1"][:1]))
    with pytest.raises(ValueError, match="together"):
        TupleBatch.from_dict(dict(fields, tension1=None))
