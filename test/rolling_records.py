"""A short record of the SUPERball twin rolling under a multisine, streamed as 10 Hz poses
(and, optionally, every rod's gyro) and commands through the stream aligner, shared by the
pose-only identification tests."""
import numpy as np
import torch

from tensegrity_engine.control.excitation import ExcitationPolicy
from tensegrity_engine.groundtruth.environments import rest_pose
from tensegrity_engine.groundtruth.sensors import noisy_rod_poses
from tensegrity_engine.groundtruth.zoo import ground_truth
from tensegrity_engine.identification import IdentificationConfig
from tensegrity_engine.identification.online import default_trainer_factory
from tensegrity_engine.identification.streaming import StreamAligner, StreamConfig, to_tuple_set
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.state import ANG_VEL, QUAT, quat_conjugate, quat_rotate

PERIOD = 0.1


def rolling_twin_run(superball, *, gyro_noise=None, seconds: float = 8.0, config: dict = None, dropped=(),
                     cables: bool = False, unsensed=(), no_encoder=(), pose_noise=None):
    """(trainer at the true values, holding the record as pose-only training data; the true
    states at every tuple start). ``gyro_noise`` (rad/s) not None: each rod's IMU reports
    with every pose, after it (as a bridge publishes them). ``dropped``: the mocap frames
    (by index, 1 the first) that never arrive. ``cables``: every winch's encoder and every cable's
    load cell report the true rest length and tension with every pose, after it, but the load
    cells of the cables ``unsensed`` (NaN), and passive cables have no encoder. ``pose_noise``
    (position m, rotation rad) not None: the mocap's poses get that noise (`noisy_rod_poses`)."""
    z = ground_truth("twin/as_built", superball)
    robot = z.nominal.replace(rod_mass=z.truth.rod_mass.copy())
    n_cmd = int(round(seconds / PERIOD)) + 2
    cmd = ExcitationPolicy(robot, seed=1, kind="multisine", amplitude=0.8, control_dt=PERIOD).command_at(
        np.arange(n_cmd) * PERIOD)
    rs, act = rest_pose(z.truth, realisation=z.realisation)
    held = int(round(PERIOD / robot.dt))
    with z.twin(floor=True, nthread=1) as twin:
        states, acts = twin.rollout(rs, act, np.repeat(cmd, held, 0))
        dense = np.concatenate([rs[None], states[0]])
        dense_act = np.concatenate([np.asarray(act)[None], acts[0]])
        pose_steps = np.arange(1, n_cmd - 1) * held
        measured = None
        if cables:
            measured = (twin.rest_lengths(dense_act[pose_steps]),
                        twin.cable_tensions(dense[pose_steps], dense_act[pose_steps]))
            measured[0][:, ~robot.cable_actuated] = np.nan
            measured[0][:, list(no_encoder)] = np.nan
            measured[1][:, list(unsensed)] = np.nan
    aligner = StreamAligner(StreamConfig.for_robot(robot, interval=PERIOD))
    rng, noise_rng = np.random.default_rng(3), np.random.default_rng(4)
    for k in range(n_cmd):
        stamp = int(round(k * PERIOD * 1e9))
        aligner.add_command(stamp, cmd[k])
        if 0 < k < n_cmd - 1 and k not in dropped:
            state = dense[k * held]
            pose = state if pose_noise is None else noisy_rod_poses(state, noise_rng, pos_noise=pose_noise[0],
                                                                    rot_noise=pose_noise[1])
            aligner.add_pose(stamp, pose[:, :7])
            if gyro_noise is not None:
                body = quat_rotate(quat_conjugate(state[:, QUAT]), state[:, ANG_VEL])
                body = body + rng.normal(0.0, gyro_noise, body.shape)
                for rod in range(robot.num_rods):
                    assert aligner.add_imu(stamp, rod, body[rod], state[rod, QUAT]) == (True, "ok")
            if measured is not None:
                assert aligner.add_cable_states(stamp, measured[0][k - 1], measured[1][k - 1]) == (True, "ok")
    batch = aligner.pop_tuples()
    start = (batch.t0.numpy() // 1_000_000).astype(int)        # ms: the dense index
    settings = dict(period=PERIOD, learn=("cable_stiffness",), init="given")
    settings.update(config or {})
    run = default_trainer_factory(robot, IdentificationConfig(**settings), "cpu", PhysicalParameters(robot, {
        k: v for k, v in z.true_values().items() if k in PhysicalParameters(robot).as_dict()}))
    run.set_data(to_tuple_set(batch, robot, period=PERIOD, floor=True))
    return run, torch.as_tensor(dense[start])
