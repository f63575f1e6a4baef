"""Cables with sensors: winch encoders (rest lengths) and load cells (tensions) in pose-only
identification. Poses see a cable's force only through the motion it causes, and a motor's
lag only mixed with the cables'; a measured force fixes the force's scale, a measured rest
length the motor's lag."""
import math

import numpy as np
import pytest
import torch

from rolling_records import rolling_twin_run
from tensegrity_engine.identification.cable_rows import window_cable_rows
from tensegrity_engine.identification.measurements import REST_LENGTH, TENSION
from tensegrity_engine.identification.solvers.windows import chain_windows
from tensegrity_engine.identification.streaming import StreamAligner, StreamConfig, TupleBatch

UNSENSED = (3, 17)          # cables without a load cell
NO_ENCODER = (5,)           # a winch without an encoder
WEIGHTS = (2.0, 5e-4)       # rest length (m/m), tension (m/N)


@pytest.fixture(scope="module")
def with_cables(superball):
    return rolling_twin_run(superball, cables=True, unsensed=UNSENSED, no_encoder=NO_ENCODER,
                            config=dict(rest_length_weight=WEIGHTS[0], tension_weight=WEIGHTS[1],
                                        learn=("cable_stiffness", "cable_damping", "actuator_time_constant")))


def _windows(run):
    windows = torch.as_tensor(chain_windows(run.train.ts.next, 3)[0])
    return windows[windows[:, 0] >= 10]         # after the first second: the motors settled from rest


def _truth(run):
    return {k: v.detach() for k, v in run.engine.param_values(torch.float64, "cpu").items()}


def _rows(run, windows, vel, p, weights=(1.0, 1.0)):
    """Unweighted (model - measured) cable rows: [N, W + 1, C, kinds]."""
    objective, data = run.objective, run.train
    with torch.no_grad():
        pred, acts = objective.window_rollout(data, windows, p, vel, record_every=data.commands.shape[1],
                                              with_acts=True)
        rows = window_cable_rows(objective, data, windows, vel, pred, acts, p, weights=weights)
    kinds = sum(bool(w) for w in weights)
    return rows.reshape(len(windows), kinds, windows.shape[1] + 1, run.robot.num_cables).transpose(1, 3)


def test_measured_cable_states_reach_both_ends_of_each_tuple_and_a_missing_sensor_stays_unmeasured(with_cables):
    run, _ = with_cables
    data, robot = run.train, run.robot
    C = robot.num_cables
    assert data.cables0.shape == data.cables1.shape == (len(data), C, 2)
    sensed = torch.ones(C, 2, dtype=torch.bool)
    sensed[list(UNSENSED), TENSION] = False
    sensed[list(NO_ENCODER), REST_LENGTH] = False
    sensed[torch.as_tensor(~robot.cable_actuated), REST_LENGTH] = False       # a passive cable has no winch
    # a reading that came after the pose closing a tuple is the next tuple's start's: the
    # last tuple's end has none
    nxt = torch.as_tensor(data.ts.next)
    has = nxt >= 0
    assert int((~has).sum()) == 1
    for seen in (data.cables_seen0, data.cables_seen1[has]):
        assert torch.equal(seen, sensed.expand_as(seen))
    assert not bool(data.cables_seen1[~has].any())
    assert float(data.cables0[..., TENSION][:, sensed[:, TENSION]].abs().min()) > 10.0       # the cables pull (N)
    assert float(data.cables0[:, ~sensed].abs().max()) == 0.0
    assert torch.equal(data.cables1[has], data.cables0[nxt[has]])


def test_the_cable_rows_vanish_at_the_truth_and_weigh_what_their_weights_say(with_cables):
    run, true_states = with_cables
    data, objective = run.train, run.objective
    windows = _windows(run)
    C, n_pos = run.robot.num_cables, windows.shape[1] * run.robot.num_rods * 6
    vel = true_states[windows[:, 0]][..., 7:]
    p = _truth(run)
    with torch.no_grad():
        r = objective.window_residual(data, windows, vel, p)
    assert r.shape[1] == n_pos + 2 * (windows.shape[1] + 1) * C
    # the twin's MuJoCo cables are the engine's at the same state (its sensors exact): to
    # round-off once the motors' start is forgotten, within 5 mN of ~1.5 kN before
    rows = _rows(run, windows, vel, p)
    assert float(rows[..., TENSION].abs().max()) < 1e-2 and float(rows[..., TENSION].abs().median()) < 1e-9
    assert float(rows[..., REST_LENGTH].abs().max()) < 1e-6
    # a missing sensor's rows are zero whatever the model says
    off = dict(p, cable_stiffness=p["cable_stiffness"] * 1.1, actuator_time_constant=p["actuator_time_constant"] * 2)
    rows = _rows(run, windows, vel, off)
    assert float(rows[:, list(UNSENSED), :, TENSION].abs().max()) == 0.0
    assert float(rows[:, list(NO_ENCODER), :, REST_LENGTH].abs().max()) == 0.0
    assert float(rows[..., TENSION].abs().max()) > 1.0 and float(rows[..., REST_LENGTH].abs().max()) > 1e-4
    # 1 N off weighs as tension_weight m in one free rod's node; 1 m of rest length as
    # rest_length_weight m
    node = 1.0 / (2.0 * run.robot.num_rods * windows.shape[0] * windows.shape[1] * objective.loss_scale)
    with torch.no_grad():
        weighted = objective.window_residual(data, windows, vel, off)[:, n_pos:]
    raw = torch.cat([_rows(run, windows, vel, off, (1.0, 0.0)).transpose(1, 3).flatten(1) * WEIGHTS[0],
                     _rows(run, windows, vel, off, (0.0, 1.0)).transpose(1, 3).flatten(1) * WEIGHTS[1]], 1)
    assert torch.allclose(weighted, raw * math.sqrt(node), rtol=1e-12, atol=0.0)


def test_the_load_cells_see_the_force_scale_and_the_encoders_the_motor_lag_better_than_the_poses(with_cables):
    """Stiffness and damping scaled together (c / K, the cables' relaxation, kept), and the
    motors' time constant doubled: over windows of 0.3 s the poses move by 2.9 and 21 of a
    1 mm mocap's noise, the load cells by 82 of their 2 N, the encoders by 92 of their 0.2 mm
    (the SUPERball twin rolling; an overdamped robot's poses see less still)."""
    run, true_states = with_cables
    data, objective = run.train, run.objective
    windows = _windows(run)
    p = _truth(run)
    vel = true_states[windows[:, 0]][..., 7:]
    every = data.commands.shape[1]
    with torch.no_grad():
        base = objective.window_rollout(data, windows, p, vel, record_every=every)[..., :3]
    snr = {}
    for name, values, kind, noise in (
            ("scale", dict(p, cable_stiffness=p["cable_stiffness"] * 1.1, cable_damping=p["cable_damping"] * 1.1),
             TENSION, 2.0),
            ("lag", dict(p, actuator_time_constant=p["actuator_time_constant"] * 2.0), REST_LENGTH, 2e-4)):
        with torch.no_grad():
            moved = objective.window_rollout(data, windows, values, vel, record_every=every)[..., :3]
            moved = (moved - base).norm(dim=-1)
        sensed = _rows(run, windows, vel, values)[..., kind]
        seen = sensed != 0
        snr[name] = (float(moved.mean()) / 1e-3, float(sensed[seen].abs().mean()) / noise)
    assert snr["scale"][1] > 10.0 * snr["scale"][0]
    assert snr["lag"][1] > 3.0 * snr["lag"][0]


def _aligner(num_cables=4):
    return StreamAligner(StreamConfig(num_rods=1, num_actuated=1, num_cables=num_cables, interval=0.1,
                                      engine_dt=0.01))


POSE = np.array([[0.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0]])
NS = 1_000_000_000
NAN = math.nan


def test_bad_cable_readings_are_refused_and_counted_and_a_late_one_still_joins_its_pose():
    a = _aligner()
    a.add_command(0, [1.0])
    assert a.add_cable_states(0, None, [1.0, 2.0]) == (False, "wrong_length")
    assert a.add_cable_states(0) == (False, "wrong_length")                          # measures nothing
    assert a.add_cable_states(0, [NAN] * 4, [NAN] * 4) == (False, "nonfinite")
    assert a.add_cable_states(0, None, [1.0, math.inf, 0.0, 0.0]) == (False, "nonfinite")
    assert a.add_cable_states(0, None, [1.0, 2e5, 0.0, 0.0]) == (False, "out_of_range")
    assert a.add_cable_states(0, [1.0, -0.1, NAN, NAN], None) == (False, "out_of_range")   # a rest length <= 0
    assert a.add_cable_states(0, None, "garbage") == (False, "wrong_length")
    # a cell's noise about a slack cable's 0 is a reading; an encoder on one winch of four
    assert a.add_cable_states(0, [0.9, NAN, NAN, NAN], [10.0, NAN, -0.5, 3.0]) == (True, "ok")
    assert a.add_cable_states(0, None, [10.0, 1.0, 1.0, 1.0]) == (False, "duplicate")
    assert a.add_pose(0, POSE)[0]
    assert a.add_pose(NS // 10, POSE)[0]
    # after its pose, 1 ms off
    assert a.add_cable_states(NS // 10 + 1_000_000, None, [20.0, 21.0, 22.0, 23.0]) == (True, "ok")
    assert a.add_cable_states(NS // 20, None, [1.0, 1.0, 1.0, 1.0]) == (False, "out_of_order")
    a.add_command(NS // 5, [1.0])
    a.flush()
    batch = a.pop_tuples()
    assert len(batch) == 1
    np.testing.assert_array_equal(batch.cables0[0].numpy(), [[0.9, 10.0], [NAN, NAN], [NAN, -0.5], [NAN, 3.0]])
    np.testing.assert_array_equal(batch.cables1[0, :, TENSION].numpy(), [20.0, 21.0, 22.0, 23.0])
    assert bool(batch.cables1[0, :, REST_LENGTH].isnan().all())
    stats = a.stats()
    assert stats["cable_states_accepted"] == 2
    assert (stats["count_wrong_length"], stats["count_nonfinite"], stats["count_out_of_range"],
            stats["count_duplicate"], stats["count_out_of_order"]) == (3, 2, 2, 1, 1)
    assert a.rejected_total == 9


def test_batches_with_and_without_cable_sensors_join_and_a_malformed_one_is_refused():
    plain, sensed = _aligner(), _aligner()
    for a, t in ((plain, None), (sensed, [5.0, 6.0, 7.0, 8.0])):
        a.add_command(0, [1.0])
        for k in range(3):
            a.add_pose(k * NS // 10, POSE)
            if t is not None:
                a.add_cable_states(k * NS // 10, None, t)
        a.flush()
    b_plain, b_sensed = plain.pop_tuples(), sensed.pop_tuples()
    assert b_plain.cables0 is None and b_sensed.cables0.shape == (2, 4, 2)
    both = TupleBatch.cat([b_plain, b_sensed])
    assert bool(both.cables0[:2].isnan().all()) and torch.equal(both.cables0[2:].nan_to_num(-1.0),
                                                                b_sensed.cables0.nan_to_num(-1.0))
    assert TupleBatch.cat([b_plain, b_plain]).cables0 is None
    assert both.slice(slice(0, 1)).cables1.shape == (1, 4, 2)
    # a file's batch (a checkpoint's window) with cable states of the wrong shape is refused
    fields = b_sensed.to_dict()
    with pytest.raises(ValueError, match="cable states"):
        TupleBatch.from_dict(dict(fields, cables1=fields["cables1"][:1]))
    with pytest.raises(ValueError, match="cable states"):
        TupleBatch.from_dict(dict(fields, cables1=fields["cables1"][..., :1], cables0=fields["cables0"][..., :1]))
    with pytest.raises(ValueError, match="together"):
        TupleBatch.from_dict(dict(fields, cables1=None))


def test_the_tuple_stage_fits_the_cable_states_and_its_loss_counts_them_alike(with_cables):
    """The finite-difference stage (tuples, not windows) has the cable rows too, weighed as
    its loss weighs them: a fit that starts in the motors' wrong basin meets the encoders
    before the windows do."""
    run, _ = with_cables
    data, objective = run.train, run.objective
    idx = torch.arange(10, 40)
    p = _truth(run)
    off = dict(p, actuator_time_constant=p["actuator_time_constant"] * 0.2)
    n_pos = run.robot.num_rods * 2 * 6
    with torch.no_grad():
        for values in (p, off):
            r = objective.residuals(data, idx, values, data.commands.shape[1], "semi_implicit").reshape(len(idx), -1)
            assert r.shape[1] == n_pos + 2 * 2 * run.robot.num_cables
            loss = objective.batch_loss(data, idx, values, data.commands.shape[1], "semi_implicit", use_latent=False)
            assert torch.allclose((r ** 2).sum(), loss, rtol=1e-10, atol=0.0)
        cable_part = (r[:, n_pos:] ** 2).sum()
    # the wrong motor costs far more in the encoders' rows than in the poses'
    assert float(cable_part) > 10.0 * float((r[:, :n_pos] ** 2).sum())
