"""engine/streaming.py: time alignment, validation and bounded buffering (no ROS)."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.identification.streaming import (NS, StateEstimator, StreamAligner, StreamConfig,
                                         TupleBatch, actuator_estimate, to_tuple_set)

R, A = 3, 4
T_NS = 100_000_000
V = np.array([0.5, -0.2, 0.1])          # m/s, every rod
W = 0.7                                 # rad/s about world z


def poses_at(t_s: float) -> np.ndarray:
    """[R, 7] analytic motion: constant velocity V, constant rotation W about z."""
    out = np.zeros((R, 7))
    for r in range(R):
        out[r, :3] = np.array([r, 0.0, 1.0]) + V * t_s
        ang = W * t_s + 0.3 * r
        out[r, 3:] = [math.cos(ang / 2), 0.0, 0.0, math.sin(ang / 2)]
    return out


def command_at(k: int) -> np.ndarray:
    return 0.8 + 0.01 * k + 0.001 * np.arange(A)


def aligner(**kw) -> StreamAligner:
    return StreamAligner(StreamConfig(num_rods=R, num_actuated=A, **kw))


def feed(al, k0, k1, *, commands=True, t_offset=0):
    """Poses and commands at t = k * T for k in [k0, k1) (command k stamped at the pose)."""
    for k in range(k0, k1):
        t = t_offset + k * T_NS
        assert al.add_pose(t, poses_at(t / NS))[0]
        if commands:
            assert al.add_command(t, command_at(k))[0]


def test_tuples_zero_order_hold_and_states():
    al = aligner()
    feed(al, 0, 10)
    b = al.pop_tuples()
    assert isinstance(b, TupleBatch) and len(b) == 9          # 10 poses -> 9 intervals
    assert b.x0.shape == (9, R, 13) and b.commands.shape == (9, 100, A) and b.x1.shape == (9, R, 13)
    for i in range(9):
        k = int(b.t0[i]) // T_NS
        assert torch.allclose(b.commands[i], torch.as_tensor(command_at(k)).expand(100, A))
        np.testing.assert_allclose(b.x1[i, :, :3].numpy(), poses_at((k + 1) * 0.1)[:, :3])
        # the two intervals before t0; before the first command, that command held
        assert b.prev_commands.shape[1] == 200
        np.testing.assert_allclose(b.prev_commands[i, 0].numpy(), command_at(max(k - 2, 0)))
        np.testing.assert_allclose(b.prev_commands[i, 199].numpy(), command_at(max(k - 1, 0)))
    # velocities: exact for linear motion / constant rotation; central difference at x0
    assert bool(b.vel_known0[1:].all()) and not bool(b.vel_known0[0])
    np.testing.assert_allclose(b.x0[3, :, 7:10].numpy(), np.broadcast_to(V, (R, 3)), atol=1e-9)
    np.testing.assert_allclose(b.x0[3, :, 10:13].numpy(), np.broadcast_to([0, 0, W], (R, 3)), atol=1e-9)
    assert al.pop_tuples() is None


def test_command_changes_inside_an_interval():
    al = aligner()
    al.add_command(0, np.full(A, 0.7))
    al.add_pose(0, poses_at(0.0))
    al.add_command(37_000_000, np.full(A, 0.9))     # applies from step 37
    al.add_pose(T_NS, poses_at(0.1))
    al.add_command(T_NS, np.full(A, 1.0))           # makes the interval final
    b = al.pop_tuples()
    assert len(b) == 1
    c = b.commands[0, :, 0].numpy()
    assert (c[:37] == 0.7).all() and (c[37:] == 0.9).all()


def test_waits_for_commands_then_finalises_on_later_poses():
    al = aligner()
    al.add_command(0, command_at(0))
    al.add_pose(0, poses_at(0))
    al.add_pose(T_NS, poses_at(0.1))
    assert al.pop_tuples() is None                  # a command stamped < t1 may still come
    al.add_pose(2 * T_NS, poses_at(0.2))            # t1 + command_wait passed: final
    b = al.pop_tuples()
    assert len(b) == 1 and int(b.t0[0]) == 0
    # a command for that finished interval now is late
    assert al.add_command(50_000_000, command_at(1)) == (False, "late_command")


@pytest.mark.parametrize("bad, reason", [
    (np.full((R, 7), np.nan), "nonfinite"),
    (np.where(np.eye(R, 7) > 0, np.inf, poses_at(0.0)), "nonfinite"),
    (np.zeros((R + 1, 7)), "rod_count"),
    (np.zeros((R, 6)), "wrong_length"),
    (np.zeros((R, 7)), "bad_quaternion"),
    ("garbage", "wrong_length"),
])
def test_bad_poses_rejected_good_data_kept(bad, reason):
    al = aligner()
    feed(al, 0, 3)
    ok, why = al.add_pose(3 * T_NS, bad)
    assert not ok and why == reason and al.counters[reason] == 1
    feed(al, 3, 6)
    al.flush()
    b = al.pop_tuples()
    assert len(b) == 5 and torch.isfinite(b.x0).all()
    assert al.stats()["rejected_total"] == 1


def test_bad_commands_rejected():
    al = aligner()
    assert al.add_command(0, [0.8] * (A + 1)) == (False, "wrong_length")
    assert al.add_command(0, [float("nan")] * A) == (False, "nonfinite")
    assert al.add_command(0, [0.8] * A)[0]
    assert al.add_command(0, [0.8] * A) == (False, "duplicate")
    assert al.add_command(10, [0.8] * A)[0]
    assert al.add_command(5, [0.8] * A) == (False, "out_of_order")
    assert al.counters["wrong_length"] == 1 and al.counters["nonfinite"] == 1


def test_duplicate_and_out_of_order_poses():
    al = aligner()
    feed(al, 0, 4)
    assert al.add_pose(3 * T_NS, poses_at(0.3)) == (False, "duplicate")
    assert al.add_pose(2 * T_NS, poses_at(0.2)) == (False, "out_of_order")
    feed(al, 4, 6)
    al.flush()
    b = al.pop_tuples()
    assert len(b) == 5
    assert (torch.diff(b.t0) == T_NS).all()


def test_gap_splits_segment_no_tuple_across():
    al = aligner()
    feed(al, 0, 5)
    feed(al, 8, 12)                                  # poses 5..7 missing: a gap
    al.flush()
    b = al.pop_tuples()
    assert al.counters["gap"] == 1
    assert len(b) == 4 + 3
    t1 = b.t0 + T_NS
    assert not ((b.t0 < 5 * T_NS) & (t1 > 5 * T_NS)).any()
    assert len(set(b.segment.tolist())) == 2
    ts = to_tuple_set(b, load_robot_stub())
    assert (ts.prev == -1).sum() == 2 and (ts.next == -1).sum() == 2


def test_clock_jump_backwards_restarts_stream():
    al = aligner()
    feed(al, 0, 5, t_offset=1000 * NS)
    feed(al, 0, 4)                                   # clock restarted (e.g. simulator restart)
    al.flush()
    b = al.pop_tuples()
    assert al.counters["clock_jump"] >= 1
    assert len(b) == 4 + 3
    assert ((b.t0 >= 1000 * NS) | (b.t0 + T_NS <= 3 * T_NS)).all()


def test_a_restart_whose_commands_come_first_keeps_both_clocks_apart():
    """A restarted simulation whose first command arrives before its first pose: the tuples
    still waiting on the old clock get the old commands (not the new one as if it had been
    in force at t = 100 s), and the new command is kept for the new poses (before, the pose
    restart threw it away and the new run made no tuple until the command changed)."""
    al = aligner()
    feed(al, 0, 10, t_offset=100 * NS)
    for k in range(3):                                      # the new clock's commands, before its poses
        assert al.add_command(k * T_NS, command_at(70 + k))[0]
    for k in range(4):                                      # its poses
        assert al.add_pose(k * T_NS, poses_at(k * 0.1))[0]
    al.flush()
    b = al.pop_tuples()
    old, new = b.t0 >= 100 * NS, b.t0 < 100 * NS
    assert int(old.sum()) == 9 and int(new.sum()) == 3
    for i in np.flatnonzero(old.numpy()):
        k = (int(b.t0[i]) - 100 * NS) // T_NS
        assert torch.allclose(b.commands[i], torch.as_tensor(command_at(k)).expand(100, A))
    for i in np.flatnonzero(new.numpy()):                   # each its own (not the newest one held)
        k = int(b.t0[i]) // T_NS
        assert torch.allclose(b.commands[i], torch.as_tensor(command_at(70 + k)).expand(100, A))


def test_poses_that_jump_ahead_and_back_do_not_make_the_commands_late():
    """Poses jump 100 s ahead and, before any command follows, 50 s back: the commands were
    not restarted first (they are on neither pose clock), so the stream starts over and the
    commands on the new clock are taken (not refused as late against the watermark the
    poses 100 s ahead had moved)."""
    al = aligner()
    feed(al, 0, 10, t_offset=1000 * NS)
    assert al.add_pose(1100 * NS, poses_at(0.0))[0]             # ahead, no command yet
    base = 1050 * NS                                            # and back
    for k in range(5):
        assert al.add_pose(base + k * T_NS, poses_at(k * 0.1))[0]
        assert al.add_command(base + k * T_NS, command_at(k)) == (True, "ok")
    assert al.counters["late_command"] == 0


def test_clock_jump_forward_is_a_new_segment():
    al = aligner(clock_jump=2.0)
    feed(al, 0, 3)
    feed(al, 100, 103)
    al.flush()
    b = al.pop_tuples()
    assert al.counters["clock_jump"] >= 1 and len(b) == 4
    assert len(set(b.segment.tolist())) == 2


def test_higher_rate_poses_are_decimated():
    al = aligner()
    for k in range(0, 31):                             # 100 Hz mocap, T = 0.1 s
        t = k * 10_000_000
        al.add_pose(t, poses_at(t / NS))
        al.add_command(t, np.full(A, 0.8))
    al.flush()
    b = al.pop_tuples()
    assert len(b) == 3 and al.counters["decimated"] == 27


def test_tuples_waiting_longer_than_the_pending_bound_are_finished_not_lost():
    """A command_wait longer than `PENDING` intervals: the oldest waiting tuple is finished
    with the commands known (counted as overflow), not dropped without a trace."""
    from tensegrity_engine.identification.streaming import PENDING

    al = aligner(command_wait=10.0)
    assert al.add_command(0, command_at(0))[0]
    n = PENDING + 16
    for k in range(n):
        assert al.add_pose(k * T_NS, poses_at(k * 0.1))[0]
    assert al.counters["overflow"] == n - 1 - PENDING
    al.flush()
    b = al.pop_tuples()
    assert len(b) == n - 1 and sorted(b.t0.tolist()) == [k * T_NS for k in range(n - 1)]


def test_buffers_bounded_and_overflow_counted():
    al = aligner(max_tuples=5, max_commands=50)
    for k in range(1000):                              # commands only: nothing consumes them
        al.add_command(k * 1_000_000, np.full(A, 0.8))
    assert len(al._cmd_t) <= 50
    al2 = aligner(max_tuples=5)
    feed(al2, 0, 20)
    al2.flush()
    assert al2.num_waiting == 5 and al2.counters["overflow"] == 14
    # commands no longer needed are trimmed as poses go by
    al3 = aligner()
    for k in range(300):
        t = k * T_NS
        al3.add_pose(t, poses_at(t / NS))
        for j in range(10):
            al3.add_command(t + j * 10_000_000, np.full(A, 0.8))
    assert len(al3._cmd_t) <= 40 and len(al3._poses) <= 3 and len(al3._pending) <= 3


def test_no_command_before_interval_drops_tuple():
    al = aligner()
    feed(al, 0, 3, commands=False)
    al.add_command(2 * T_NS, command_at(2))
    feed(al, 3, 5)
    al.flush()
    b = al.pop_tuples()
    assert al.counters["no_command"] == 2
    assert int(b.t0.min()) == 2 * T_NS


def test_imu_angular_velocity_and_unknown_rod():
    al = aligner()
    assert al.add_imu(0, R, [0, 0, 1]) == (False, "unknown_rod")
    assert al.add_imu(0, 0, [0, 0, float("nan")]) == (False, "nonfinite")
    assert al.add_imu(0, 0, [0, 0]) == (False, "wrong_length")
    feed(al, 0, 2)
    # body-frame gyro of rod 1 at t = 0.2, about the rod's body x: the tuple holds it in
    # the world frame, body x turned by the pose's yaw (a test about body z would pass
    # without the rotation)
    al.add_imu(2 * T_NS, 1, [2.0, 0.0, 0.0])
    feed(al, 2, 4)
    al.flush()
    b = al.pop_tuples()
    i = int(torch.nonzero(b.t0 == 2 * T_NS)[0, 0])
    assert bool(b.omega_measured0[i, 1]) and not bool(b.omega_measured0[i, 0])
    yaw = W * 0.2 + 0.3 * 1
    np.testing.assert_allclose(b.x0[i, 1, 10:13].numpy(), [2.0 * math.cos(yaw), 2.0 * math.sin(yaw), 0.0],
                               atol=1e-9)
    np.testing.assert_allclose(b.x0[i, 0, 10:13].numpy(), [0, 0, W], atol=1e-9)
    # the tuple ending at t = 0.2 had its end's gyro (it came before the pose that closed it)
    j = int(torch.nonzero(b.t0 == 1 * T_NS)[0, 0])
    assert bool(b.omega_measured1[j, 1]) and not bool(b.omega_measured1[j, 0])
    assert not bool(b.omega_measured1[i].any())
    np.testing.assert_allclose(b.x1[j, 1, 10:13].numpy(), b.x0[i, 1, 10:13].numpy(), atol=1e-12)
    ts = to_tuple_set(b, load_robot_stub(), floor=False)
    assert ts.gyro0[i].tolist() == [False, True] + [False] * (R - 2) and ts.gyro1[j, 1]


def test_state_estimator_and_actuator_estimate():
    est = StateEstimator(R)
    assert est.state() is None
    est.add_pose(0, poses_at(0.0))
    est.add_pose(T_NS, poses_at(0.1))
    s = est.state()
    np.testing.assert_allclose(s[:, 7:10], np.broadcast_to(V, (R, 3)), atol=1e-9)
    np.testing.assert_allclose(s[:, 10:13], np.broadcast_to([0, 0, W], (R, 3)), atol=1e-9)
    a = actuator_estimate(np.zeros(2), np.ones(2), 0.05, 0.05)
    np.testing.assert_allclose(a, 1 - math.exp(-1))


def load_robot_stub():
    """A 3-rod robot for TupleSet conversion (three_bar)."""
    return load_robot("three_bar")


def test_tuple_set_for_trainer():
    robot = load_robot("three_bar")
    assert robot.num_rods == R and robot.num_actuated >= 1
    al = StreamAligner(StreamConfig.for_robot(robot))
    for k in range(12):
        t = k * T_NS
        al.add_pose(t, poses_at(t / NS))
        al.add_command(t, np.full(robot.num_actuated, float(np.mean(robot.command_low + robot.command_high) / 2)))
    al.flush()
    b = al.pop_tuples()
    ts = to_tuple_set(b, robot, max_chain=5)
    assert len(ts) == 11 and ts.steps == 100
    assert list(ts.prev[:3]) == [-1, 0, 1] and ts.next[-1] == -1
    # one record of 13 intervals (the two before the first tuple too) in pieces of at most 5
    assert [len(c) for c in ts.traj_commands] == [500, 500, 300] and ts.traj_prev.tolist() == [-1, 0, 1]
    assert np.bincount(ts.traj).tolist() == [3, 5, 3]
    assert (ts.start_step % 100 == 0).all() and ts.start_step[0] == 200 and ts.start_step[3] == 0
    identification = pytest.importorskip("tensegrity_engine.identification.trainer")
    cfg = identification.IdentificationConfig(learn=("cable_stiffness",), max_epochs=1, batch_size=16)
    tr = identification.ProgressiveTrainer(robot, cfg)
    tr.set_data(ts)
    m = tr.train_epoch()
    assert math.isfinite(m["loss"])
    # TupleBatch round trip (checkpoints)
    b2 = TupleBatch.from_dict(b.to_dict())
    assert torch.equal(b2.x0, b.x0) and len(TupleBatch.cat([b, b2])) == 22


def _commanded_stream(robot, n: int, dropped=()) -> list:
    """n tuples of three_bar's analytic motion under commands that change within intervals
    too (every 30 ms), popped a few at a time as an online session does; the poses of
    intervals ``dropped`` never arrive."""
    low, high = robot.command_low, robot.command_high
    rng = np.random.default_rng(3)
    al = StreamAligner(StreamConfig.for_robot(robot))
    batches = []
    for k in range(n + 1):
        t = k * T_NS
        for j in range(0, T_NS, 30_000_000):
            if k < n or j == 0:
                assert al.add_command(t + j, low + (high - low) * rng.uniform(0.2, 0.8, robot.num_actuated))[0]
        if k not in dropped:
            assert al.add_pose(t, poses_at(t / NS))[0]
        if k % 4 == 3:
            batches.append(al.pop_tuples())
    al.flush()
    batches.append(al.pop_tuples())
    return [b for b in batches if b is not None]


def _act_starts(trainer, ts, values: dict) -> np.ndarray:
    """[N, A] filtered command at each tuple start of ``ts`` (its tuples in stamp order)."""
    data = trainer._to_data(ts)
    p = {k: v.detach() for k, v in trainer.engine.param_values(torch.float64, "cpu").items()}
    p.update({k: torch.as_tensor(np.atleast_1d(v), dtype=torch.float64) for k, v in values.items()})
    return trainer.objective.act_starts(data, p).numpy()


@pytest.mark.parametrize("limit", [None, 0.05])
def test_actuator_state_runs_on_across_cuts_and_held_out_blocks(limit):
    """A streamed record cut into pieces of max_chain intervals, broken by held-out blocks
    (their commands known from the context, only their poses held out) or by a dropped pose
    (its interval known from the tuple after it), starts every
    tuple with the actuator state of the whole stream converted as one trajectory: the
    unlimited filter chained by pointer jumping, the rate-limited one piece by piece, with
    a command delay shifting commands across the cuts (either sign). Without the context
    each block restarts the motor settled, which the slow motor has not forgotten."""
    identification = pytest.importorskip("tensegrity_engine.identification.trainer")
    robot = load_robot("three_bar")
    batches = _commanded_stream(robot, 40)
    stream = TupleBatch.cat(batches)
    whole = to_tuple_set(stream, robot, max_chain=1000)
    assert len(whole) == 40 and len(whole.traj_act0) == 1
    cut = to_tuple_set(stream, robot, max_chain=7)
    assert len(cut.traj_act0) == 6 and cut.traj_prev.tolist() == [-1, 0, 1, 2, 3, 4]
    held = (np.arange(40) // 5) % 3 == 2                     # blocks of 5: [10, 15), [25, 30)
    train_b, held_b = stream.slice(torch.as_tensor(~held)), stream.slice(torch.as_tensor(held))
    train = to_tuple_set(train_b, robot, max_chain=7, context=held_b)
    heldout = to_tuple_set(held_b, robot, max_chain=7, context=train_b)
    alone = to_tuple_set(train_b, robot, max_chain=7)
    assert (train.prev < 0).sum() == 3 and (alone.traj_prev < 0).sum() == 3   # chains break, records not
    assert (train.traj_prev < 0).sum() == 1 and (heldout.traj_prev < 0).sum() == 1
    # a dropped pose splits the segment (its two tuples are lost), not the record
    dropped_b = TupleBatch.cat(_commanded_stream(robot, 40, dropped=(17,)))
    assert len(set(dropped_b.segment.tolist())) == 2 and len(set(dropped_b.record.tolist())) == 1
    dropped = to_tuple_set(dropped_b, robot, max_chain=7)
    assert len(dropped) == 38 and (dropped.prev < 0).sum() == 2 and (dropped.traj_prev < 0).sum() == 1
    kept = ~np.isin(np.arange(40), (16, 17))

    # a record walks back at most `history` s of known commands before its first tuple
    short = to_tuple_set(held_b, robot, max_chain=100, context=train_b, history=0.35)
    assert short.start_step[0] == 4 * 100 and short.start_step[5] == 4 * 100    # 0.35 s: 4 intervals

    cfg = identification.IdentificationConfig(learn=("actuator_time_constant",), max_epochs=1)
    tr = identification.ProgressiveTrainer(robot, cfg)
    tr.set_data(whole)
    for tau, delay in ((0.3, 0.0), (0.3, 0.037), (0.3, -0.021), (0.02, 0.037)):   # 0.02: the limited
        values = {"actuator_time_constant": tau, "actuator_delay": delay}        # passes stop early
        if limit is not None:
            values["actuator_max_speed"] = limit
        ref = _act_starts(tr, whole, values)
        np.testing.assert_allclose(_act_starts(tr, cut, values), ref, rtol=0, atol=1e-12)
        np.testing.assert_allclose(_act_starts(tr, train, values), ref[~held], rtol=0, atol=1e-12)
        np.testing.assert_allclose(_act_starts(tr, heldout, values), ref[held], rtol=0, atol=1e-12)
        np.testing.assert_allclose(_act_starts(tr, dropped, values), ref[kept], rtol=0, atol=1e-12)
        if tau > 0.1:          # a motor slower than the interval has not forgotten a settled restart
            assert np.abs(_act_starts(tr, alone, values) - ref[~held]).max() > 1e-3
    if limit is not None:
        from tensegrity_engine.physics.actuators import speed_limit_binds
        assert speed_limit_binds(torch.tensor([0.3]), torch.tensor([limit]), tr.objective.cmd_high - tr.objective.cmd_low)


def test_a_stream_converted_anew_extends_the_trainers_data():
    """An online session converts its window anew on every append: the old tuples come
    first in their order, so the trainer keeps their latents; other data starts afresh."""
    identification = pytest.importorskip("tensegrity_engine.identification.trainer")
    robot = load_robot("three_bar")
    batches = _commanded_stream(robot, 24)
    cfg = identification.IdentificationConfig(learn=("cable_stiffness",), max_epochs=1, batch_size=8)
    tr = identification.ProgressiveTrainer(robot, cfg)
    first = to_tuple_set(TupleBatch.cat(batches[:3]), robot, max_chain=5)
    tr.set_data(first)
    with torch.no_grad():
        tr.train.latent.add_(0.25)
    kept = tr.train.latent.detach().clone()
    grown = to_tuple_set(TupleBatch.cat(batches), robot, max_chain=5)
    tr.extend_data(grown)
    assert len(tr.train) == 24 > len(first)
    torch.testing.assert_close(tr.train.latent[:len(first)], kept)
    assert math.isfinite(tr.train_epoch()["loss"])
    shifted = dataclasses.replace(grown, x0=grown.x0 + 1.0, x1=grown.x1 + 1.0)
    tr.extend_data(shifted)                                  # not a continuation: new data
    assert not torch.allclose(tr.train.latent[:len(first)], kept[:len(first)])




def test_old_checkpoints_and_other_aligners_stay_apart():
    """A checkpoint's batches from before the two-interval history (prev_commands of one
    interval) are padded with their first command and join new ones; tuples of another
    aligner (a restarted node: segment ids from 0 again, the sim clock's stamps repeated)
    form their own chains and records, ordered after the first aligner's."""
    robot = load_robot("three_bar")
    first = TupleBatch.cat(_commanded_stream(robot, 12))
    old = first.to_dict()
    old["prev_commands"] = old["prev_commands"][:, 100:]
    del old["record"]
    restored = TupleBatch.from_dict(old)
    assert restored.prev_commands.shape == first.prev_commands.shape
    torch.testing.assert_close(restored.prev_commands[:, 100:], first.prev_commands[:, 100:])
    assert bool((restored.prev_commands[:, :100] == restored.prev_commands[:, 100:101]).all())
    again = TupleBatch.cat(_commanded_stream(robot, 12))
    assert torch.equal(again.segment, first.segment) and torch.equal(again.t0, first.t0)
    assert not bool(torch.isin(again.record, first.record).any())
    both = to_tuple_set(TupleBatch.cat([restored, again]), robot)
    assert len(both) == 24 and (both.prev < 0).sum() == 2 and (both.traj_prev < 0).sum() == 2
    np.testing.assert_array_equal(both.x0[:12], restored.x0.numpy())


def test_a_clock_a_little_off_the_interval_still_links_its_tuples():
    """A mocap stamped by its own clock at 99.98 Hz decimated to 10 Hz: poses 100.02 ms apart,
    which the aligner accepts as consecutive. They chain and run as one command record;
    linking only exact multiples of T left every tuple alone (no multiple-shooting window)."""
    robot = load_robot("three_bar")
    al = StreamAligner(StreamConfig.for_robot(robot))
    period = 100_020_000
    for k in range(31):
        t = k * period
        assert al.add_command(t, robot.command_low + (robot.command_high - robot.command_low) * (0.3 + 0.01 * k))[0]
        assert al.add_pose(t, poses_at(t / NS))[0]
    al.flush()
    b = al.pop_tuples()
    assert len(b) == 30 and set(np.diff(b.t0.numpy()).tolist()) == {period}
    ts = to_tuple_set(b, robot, max_chain=7)
    assert (ts.prev < 0).sum() == 1 and (ts.traj_prev < 0).sum() == 1
    held = torch.arange(30) % 10 >= 7
    train = to_tuple_set(b.slice(~held), robot, context=b.slice(held))
    assert (train.prev < 0).sum() == 3 and (train.traj_prev < 0).sum() == 1
