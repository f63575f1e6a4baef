"""The driver contract checks (tensegrity_ros.driver_contract; no ROS needed): a clean
recording passes, and each way a real driver gets the contract wrong is named."""
import numpy as np
import pytest

from tensegrity_engine.groundtruth.environments import rest_pose
from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin
from tensegrity_engine.physics.state import POS, QUAT
from tensegrity_ros.driver_contract import DriverContractCheck

NS = 1_000_000_000


@pytest.fixture(scope="module")
def stream(three_bar):
    """(stamps ns, [N, R, 7] poses, [N, R, 13] states): the 3-bar on the floor, cables
    swinging between their range ends, 10 Hz."""
    rs, act = rest_pose(three_bar)
    stamps, poses, states = [], [], []
    with MujocoTwin(three_bar, floor=True, nthread=1) as twin:
        twin.reset(rs, act)
        for k in range(30):
            u = three_bar.command_low if (k // 5) % 2 else three_bar.command_high
            twin.step(u, nsteps=100)
            s, _ = twin.get_state()
            stamps.append((k + 1) * NS // 10)
            poses.append(np.concatenate([s[:, POS], s[:, QUAT]], -1))
            states.append(s)
    return np.array(stamps), np.array(poses), np.array(states)


def _violations(findings):
    return {f.check for f in findings if f.level == "violation"}


def _feed(check, stamps, poses, latency=0.02, frame="world"):
    for t, p in zip(stamps, poses):
        check.add_pose(int(t), int(t + latency * NS), frame, p)


def test_a_clean_stream_passes_and_its_rate_and_latency_are_measured(three_bar, stream):
    stamps, poses, _ = stream
    check = DriverContractCheck(three_bar)
    _feed(check, stamps, poses)
    findings = check.report([True], ["robot_driver"])
    assert not _violations(findings), [str(f) for f in findings]
    text = "\n".join(map(str, findings))
    assert "median period 100.0 ms" in text and "median 20.0 ms" in text


@pytest.mark.parametrize("fault,expected", [
    ("frame", {"pose_frame"}), ("rod_count", {"pose_rod_count", "poses"}), ("rate", {"pose_rate"}),
    ("clock_ahead", {"pose_clock"}), ("floor", {"pose_floor"}), ("best_effort", {"pose_qos"}),
    ("no_consumer", {"command_consumers"}), ("bad_quaternion", {"pose_bad_quaternion"}),
])
def test_each_contract_fault_is_named(three_bar, stream, fault, expected):
    stamps, poses, _ = stream
    check = DriverContractCheck(three_bar)
    poses = poses.copy()
    kw = {}
    if fault == "frame":
        kw["frame"] = "map"
    elif fault == "rod_count":
        poses = poses[:, :2]
    elif fault == "rate":
        stamps = stamps * 2                                   # 5 Hz against the 10 Hz grid
    elif fault == "clock_ahead":
        kw["latency"] = -0.05
    elif fault == "floor":
        poses[..., 2] -= 0.5                                  # origin not on the floor
    elif fault == "bad_quaternion":
        poses[10, :, 3:] *= 1.2                               # one bad frame
    _feed(check, stamps, poses, **kw)
    reliable = [True, False] if fault == "best_effort" else [True]
    consumers = [] if fault == "no_consumer" else ["robot_driver"]
    assert _violations(check.report(reliable, consumers)) == expected


def test_a_gyro_not_in_the_rod_frame_is_caught_by_its_orientation(three_bar, stream):
    stamps, poses, states = stream
    turn = np.array([np.cos(np.pi / 4), np.sin(np.pi / 4), 0.0, 0.0])   # 90 deg about x
    for mounted, expected in ((False, set()), (True, {"imu_frame"})):
        check = DriverContractCheck(three_bar)
        _feed(check, stamps, poses)
        for t, s in zip(stamps, states):
            for rod in range(three_bar.num_rods):
                q = s[rod, QUAT]
                if mounted:                                   # q * turn
                    w1, v1, w2, v2 = q[0], q[1:], turn[0], turn[1:]
                    q = np.concatenate([[w1 * w2 - v1 @ v2], w1 * v2 + w2 * v1 + np.cross(v1, v2)])
                check.add_imu(int(t), rod, np.zeros(3), q)
        assert _violations(check.report([True], ["driver"])) == expected
