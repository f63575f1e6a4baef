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
        if k > 0:
            np.testing.assert_allclose(b.prev_commands[i, 0].numpy(), command_at(k - 1))
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
    assert len(ts.traj_commands) == 3                    # chains of at most 5
    for j, cmds in enumerate(ts.traj_commands):
        n = int((ts.traj == j).sum())
        assert cmds.shape == ((n + 1) * 100, robot.num_actuated)
    assert (ts.start_step % 100 == 0).all() and ts.start_step.min() == 100
    identification = pytest.importorskip("tensegrity_engine.identification.trainer")
    cfg = identification.IdentificationConfig(learn=("cable_stiffness",), max_epochs=1, batch_size=16)
    tr = identification.ProgressiveTrainer(robot, cfg)
    tr.set_data(ts)
    m = tr.train_epoch()
    assert math.isfinite(m["loss"])
    # TupleBatch round trip (checkpoints)
    b2 = TupleBatch.from_dict(b.to_dict())
    assert torch.equal(b2.x0, b.x0) and len(TupleBatch.cat([b, b2])) == 22


def test_streamed_appends_continue_their_chains_as_the_whole_stream_does():
    """Tuples appended a few at a time (as an online session does) join the chain they
    continue: the same chains and actuator starts as the whole stream converted at once
    (each append restarted the motor settled at the command in force, a bias in tau and
    damping for a motor slower than the interval); a chain never grows past max_chain
    tuples in one trajectory, also when one append brings more than that, and a batch that
    does not continue any chain, or is not laid out as `to_tuple_set` lays chains out (a
    trajectory file's tuples), stays its own."""
    from tensegrity_engine.identification.dataset import TupleSet, concat_continuing

    robot = load_robot("three_bar")
    A_ = robot.num_actuated
    al = StreamAligner(StreamConfig.for_robot(robot))
    low, high = robot.command_low, robot.command_high
    batches = []
    for k in range(40):
        t = k * T_NS
        al.add_pose(t, poses_at(t / NS))
        al.add_command(t, low + (high - low) * (0.5 + 0.4 * np.sin(0.7 * k + np.arange(A_))))
        if k in (2, 5, 8, 30, 33, 36):                    # appends of 3 tuples, and one of 22 (> max_chain)
            b = al.pop_tuples()
            if b is not None:
                batches.append(b)
    al.flush()
    batches.append(al.pop_tuples())
    assert len(batches) == 7
    whole = to_tuple_set(TupleBatch.cat(batches), robot, max_chain=15)
    streamed = to_tuple_set(batches[0], robot, max_chain=15)
    plain = streamed
    for b in batches[1:]:
        part = to_tuple_set(b, robot, max_chain=15)
        streamed = concat_continuing(streamed, part, max_chain=15)
        plain = TupleSet.concat([plain, part])
    assert len(plain.traj_act0) >= len(batches) > 3          # each append a settled restart
    assert len(streamed.traj_act0) == len(whole.traj_act0) == 3
    assert np.bincount(whole.traj).tolist() == [15, 15, 9]
    for name in ("traj", "start_step", "prev", "next"):
        np.testing.assert_array_equal(getattr(streamed, name), getattr(whole, name), err_msg=name)
    for a, b in zip(streamed.traj_commands, whole.traj_commands):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.stack(streamed.traj_act0), np.stack(whole.traj_act0))
    # a batch from elsewhere (no chain ends where it starts) is appended as it is
    other = to_tuple_set(batches[1], robot, max_chain=15)
    other = dataclasses.replace(other, x0=other.x0 + 1.0, x1=other.x1 + 1.0)
    joined = concat_continuing(whole, other, max_chain=15)
    assert len(joined.traj_act0) == len(whole.traj_act0) + len(other.traj_act0)
    assert joined.prev[len(whole)] == -1
    # a continuing chain laid out as a trajectory file's (its grid starts at its first tuple)
    start = batches[0]
    head = to_tuple_set(start, robot, max_chain=15)
    tail = to_tuple_set(batches[1], robot, max_chain=15)
    file_like = dataclasses.replace(tail, start_step=tail.start_step - tail.steps,
                                    traj_commands=[c[tail.steps:] for c in tail.traj_commands])
    assert concat_continuing(head, tail, max_chain=15).prev[len(head)] == len(head) - 1    # joined
    kept = concat_continuing(head, file_like, max_chain=15)
    assert kept.prev[len(head)] == -1 and len(kept.traj_act0) == len(head.traj_act0) + len(tail.traj_act0)
