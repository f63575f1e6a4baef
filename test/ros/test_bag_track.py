"""tensegrity-track-bag: a recorded camera bag tracked offline with the node's decoders and
the engine's tracking session, the tripod moved half way, garbage refused and counted."""
import numpy as np
import pytest

try:
    from rclpy.serialization import serialize_message
except ImportError as exc:  # pragma: no cover
    pytest.skip(f"rclpy not importable ({exc})", allow_module_level=True)

from tensegrity_engine.groundtruth.depth_camera import (DepthNoise, DepthRenderingUnavailable,  # noqa: E402
                                                        MujocoDepthCamera)
from tensegrity_engine.identification.dataset import load_trajectory  # noqa: E402
from tensegrity_engine.perception.camera import look_at  # noqa: E402
from tensegrity_engine.physics.state import end_nodes  # noqa: E402
from tensegrity_ros import bag_track  # noqa: E402
from tensegrity_ros import camera_messages as cm  # noqa: E402
from tensegrity_ros import conversions as conv  # noqa: E402
from tensegrity_ros.common import TOPIC_COMMAND  # noqa: E402
from tensegrity_ros.recorder import TOPICS, BagWriter  # noqa: E402

from camera_scenes import rolling_three_bar  # noqa: E402

NS = 1_000_000_000


def test_track_bag_follows_a_moved_tripod_and_counts_garbage(tmp_path):
    robot, twin, rng, cmd, states = rolling_three_bar(2)
    steps = len(cmd)
    bag_path = tmp_path / "camera.mcap"
    bag = BagWriter(bag_path)
    for topic in (cm.TOPIC_DEPTH, cm.TOPIC_CAMERA_INFO, cm.TOPIC_CAMERA_POSE, cm.TOPIC_INITIAL_POSES, TOPIC_COMMAND):
        bag.channel(topic, TOPICS[topic])
    write = lambda topic, msg, t_ns: bag.write(topic, serialize_message(msg), t_ns)
    try:
        start = states[0, :, 0:3].mean(0)
        cam_a = look_at(start + [1.8, -1.8, 1.4], start + [0.2, 0.2, 0.2])
        cam_b = look_at(start + [-1.6, -2.0, 1.6], start + [0.4, 0.3, 0.2])       # the tripod, moved
        try:
            sensor = MujocoDepthCamera(twin, cam_a, noise=DepthNoise(0.0005, 0.02), rng=rng)
        except DepthRenderingUnavailable as exc:      # says what to install; CI images carry EGL
            pytest.fail(str(exc))
        with sensor:
            early = sensor.render(states[0])
            write(cm.TOPIC_DEPTH, cm.depth_image_msg(early, 1), 1)         # before any camera info: refused
            write(cm.TOPIC_CAMERA_POSE, cm.camera_pose_msg(cam_a, 2), 2)
            write(cm.TOPIC_INITIAL_POSES, conv.rod_state_to_pose_array(states[0], 3), 3)
            for k in range(0, steps, 100):                                  # commands as sent, every 0.1 s
                write(TOPIC_COMMAND, conv.make_cable_command(cmd[k], k * robot.dt * NS + 3), k * robot.dt * NS + 3)
            write(TOPIC_COMMAND, conv.make_cable_command(np.full(robot.num_actuated, np.nan), 5 * NS), 5 * NS)
            for i, s in enumerate(states):
                t_ns = int(round(0.1 * i * NS)) + 3
                if i == len(states) // 2:
                    sensor.move(cam_b)
                    write(cm.TOPIC_CAMERA_POSE, cm.camera_pose_msg(cam_b, t_ns), t_ns)
                camera = cam_a if i < len(states) // 2 else cam_b
                write(cm.TOPIC_CAMERA_INFO, cm.camera_info_msg(camera, t_ns), t_ns)
                write(cm.TOPIC_DEPTH, cm.depth_image_msg(sensor.render(s), t_ns), t_ns)
            bad = cm.depth_image_msg(early, len(states) * NS)
            bad.encoding = "rgb8"
            write(cm.TOPIC_DEPTH, bad, len(states) * NS)
    finally:
        twin.close()
        bag.close()
    out, traj = tmp_path / "tracked.npz", tmp_path / "traj.npz"
    rc = bag_track.main([str(bag_path), "--robot", "three_bar", "--noise", "0.0005", "--out", str(out),
                         "--trajectory", str(traj), "--overlay", str(tmp_path / "overlay")])
    assert rc == 0
    res = np.load(out)
    assert len(res["t"]) == len(states)               # garbage never became a frame
    good = res["status"] <= 1
    assert good.all(), res["reason"]
    half = robot.rod_length / 2
    err = np.linalg.norm(res["ends"] - end_nodes(states, half), axis=-1)
    second_half = err[len(states) // 2:]
    assert np.median(err) < 0.02 and err.max() < 0.05, np.round(err.max(axis=(1, 2)), 3)
    assert np.median(second_half) < 0.02         # seen by the moved camera: its new pose was used
    frames, *_, refused = bag_track.read_camera_bag(bag_path, robot)
    assert refused == {"image_before_camera": 1, "bad_encoding": 1, "nonfinite": 1}, refused
    t = load_trajectory(traj, robot)
    assert t.num_samples == len(states) and len(t.command_time) == steps // 100
    assert list((tmp_path / "overlay").glob("*.png"))


def test_recorder_records_every_camera_the_tracker_can_take():
    for k in range(4):
        for topic in cm.camera_topics(cm.camera_namespace(k)):
            assert topic in TOPICS
