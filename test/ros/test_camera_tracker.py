"""The camera in the loop over topics: the bridge renders depth images of the robot it
plays, the camera tracker turns them into rod poses on the mocap topic."""
import threading

import numpy as np
import pytest

try:
    import rclpy  # noqa: F401
    from rclpy.parameter import Parameter  # noqa: F401
except ImportError as exc:  # pragma: no cover
    pytest.skip(f"rclpy not importable ({exc})", allow_module_level=True)

from geometry_msgs.msg import PoseArray  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tensegrity_engine.physics.config import load_robot  # noqa: E402
from tensegrity_engine.physics.state import end_nodes  # noqa: E402
from tensegrity_ros import camera_messages as cm  # noqa: E402
from tensegrity_ros import conversions as conv  # noqa: E402
from tensegrity_ros.common import TOPIC_COMMAND, TOPIC_POSES, stream_qos  # noqa: E402

from ros_harness import wait_for  # noqa: E402

TRUTH_TOPIC = "/truth/rod_poses"


def _collect(node, topic):
    got, lock = {}, threading.Lock()

    def keep(m):
        with lock:
            got[conv.stamp_ns(m.header.stamp)] = conv.array_to_rod_state(conv.pose_array_to_array(m))
    node.create_subscription(PoseArray, topic, keep, stream_qos())
    return got, lock


@pytest.mark.parametrize("cameras", [1, 2])
def test_camera_tracker_follows_the_robot_the_bridge_renders(ros, cameras):
    """One camera, or two on opposite sides fitted together frame by frame."""
    from tensegrity_ros.camera_tracker import CameraTrackerNode
    from tensegrity_ros.mujoco_bridge import MujocoBridge

    robot = load_robot("three_bar")
    probe = ros.plain("probe")
    tracked, lock_t = _collect(probe, TOPIC_POSES)
    truth, lock_r = _collect(probe, TRUTH_TOPIC)
    # the bridge's own (true) poses go to another topic: the tracker's are the only mocap
    bridge = ros.add(MujocoBridge(context=ros.context, cli_args=["--ros-args", "-r", f"{TOPIC_POSES}:={TRUTH_TOPIC}"],
                                  parameter_overrides=[Parameter(k, value=v) for k, v in {
                                      "robot": "three_bar", "robot_truth": "zoo/end_heavy", "real_time_factor": 0.25,
                                      "marker_rate": 0.0, "publish_clock": False, "max_duration": 3.0,
                                      "imu": False, "depth_camera": True, "depth_noise": 0.0005,
                                      "depth_cameras": cameras}.items()]))
    # a generous fitting budget at a quarter of real time: the result must not hang on CI load
    tracker = ros.node(CameraTrackerNode, {"robot": "three_bar", "depth_noise": 0.0005, "time_budget": 0.3,
                                           "cameras": [cm.camera_namespace(k) for k in range(cameras)]})
    # squeeze and release cables so the robot moves under the camera
    pub = probe.create_publisher(conv.make_cable_command(np.zeros(1), 0).__class__, TOPIC_COMMAND, stream_qos())
    lo, hi = robot.command_low, robot.command_high
    half = np.arange(robot.num_actuated) < robot.num_actuated // 2
    for i in range(30):
        if wait_for(lambda: bridge.twin.time > 0.1 * i, 10):
            u = np.where(half, lo, hi) if (i // 5) % 2 else np.where(half, hi, lo)
            pub.publish(conv.make_cable_command(u, int(round((0.1 * i + 0.05) * 1e9))))
    assert wait_for(lambda: bridge.twin.time >= 2.9, 60)
    assert wait_for(lambda: len(tracked) >= 20, 30), f"{len(tracked)} tracked poses"
    with lock_t, lock_r:
        common = sorted(set(tracked) & set(truth))
        est = np.stack([end_nodes(tracked[s], robot.rod_length / 2) for s in common])
        ref = np.stack([end_nodes(truth[s], robot.rod_length / 2) for s in common])
    assert len(common) >= 20              # of 31 images: a loaded machine may drop a few
    moved = np.linalg.norm(ref[-1] - ref[0], axis=-1).max()
    assert moved > 0.05, "the robot must move for this to test tracking"
    centre = np.linalg.norm(est.mean(-2) - ref.mean(-2), axis=-1)
    assert np.median(centre) < 0.02 and centre.max() < 0.1, np.round(centre, 3)
    ends = np.linalg.norm(est - ref, axis=-1)          # rods and ends in order: identity kept
    assert np.median(ends) < 0.03
    assert tracker.diag.counters["frames_lost"] <= 2
    # images that came before the camera info or the first pose (start-up races across topics)
    # are the only rejects
    c = tracker.diag.counters
    # (with two cameras, an image whose partner came before the tracker knew both cameras has
    # none: unmatched)
    start_up = c["rejected_no_camera"] + c["rejected_no_first_pose"]
    assert c["depth_rejected"] == start_up + c.get("rejected_unmatched", 0) <= 3 * cameras, c
    assert c.get("rejected_unmatched", 0) <= start_up, c
    # every published pose came from one image of each camera
    assert c["depth_accepted"] == cameras * (c["poses_published"] + c.get("frames_lost", 0)), c
    assert len(tracker.session.tracker.views) == cameras


def test_stamped_history_gives_the_value_in_force_at_a_stamp():
    h = cm.StampedHistory(depth=3)
    assert h.at(5) is None and h.latest is None
    h.add(10, "a")
    h.add(30, "c")
    h.add(20, "b")                                      # arrived late: kept in stamp order
    assert [h.at(t) for t in (9, 10, 25, 31)] == [None, "a", "b", "c"] and h.latest == "c"
    h.add(40, "d")                                      # the oldest goes
    assert h.at(15) is None and h.at(40) == "d"


def test_frame_sync_matches_images_across_cameras():
    sync = cm.FrameSync(2, tolerance_ns=5)
    assert sync.add(0, 100, "a0") == ([], [])
    assert sync.add(1, 102, "b0") == ([(100, ["a0", "b0"])], [])
    assert sync.add(1, 200, "b1") == ([], [])              # waits for camera 0
    assert sync.add(0, 300, "a2") == ([], ["b1"])          # camera 0's 200 never came: b1 is dropped
    assert sync.add(1, 298, "b2") == ([(300, ["a2", "b2"])], [])
    one = cm.FrameSync(1, 0)
    assert one.add(0, 7, "x") == ([(7, ["x"])], [])
    deep = cm.FrameSync(2, 0, depth=2)
    for t in (1, 2, 3):
        _, dropped = deep.add(0, t, t)
    assert dropped == [1] and [t for t, _ in deep.pending[0]] == [2, 3]


def test_camera_tracker_rejects_bad_images(ros):
    from tensegrity_ros.camera_tracker import CameraTrackerNode
    from tensegrity_engine.perception.camera import look_at

    tracker = ros.node(CameraTrackerNode, {"robot": "three_bar"})
    probe = ros.plain("probe")
    cam = look_at([3.0, -3.0, 2.0], [0.0, 0.0, 0.4], width=32, height=24)
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import CameraInfo
    from tensegrity_ros.common import latched_qos
    probe.create_publisher(PoseStamped, cm.TOPIC_CAMERA_POSE, latched_qos()).publish(cm.camera_pose_msg(cam, 1))
    info = probe.create_publisher(CameraInfo, cm.TOPIC_CAMERA_INFO, stream_qos())
    images = probe.create_publisher(Image, cm.TOPIC_DEPTH, stream_qos())
    assert wait_for(lambda: tracker.count_publishers(cm.TOPIC_DEPTH) > 0 and images.get_subscription_count() > 0, 10)
    info.publish(cm.camera_info_msg(cam, 1))
    assert wait_for(lambda: tracker.session is not None, 10)
    bad = cm.depth_image_msg(np.ones((24, 32)), 2_000_000_000)
    bad.encoding = "rgb8"
    short = cm.depth_image_msg(np.ones((24, 32)), 2_100_000_000)
    short.data = short.data[:100]
    for i, m in enumerate((bad, short, cm.depth_image_msg(np.ones((24, 32)), 2_200_000_000))):  # last: no first pose
        images.publish(m)
        assert wait_for(lambda: tracker.diag.counters["in_depth"] == i + 1, 10)
    assert wait_for(lambda: tracker.diag.counters["depth_rejected"] == 3, 10), tracker.diag.counters
    c = tracker.diag.counters
    assert c["rejected_bad_encoding"] == 1 and c["rejected_bad_image_size"] == 1 and c["rejected_no_first_pose"] == 1
    assert c["in_depth"] == c["depth_accepted"] + c["depth_rejected"]
    # a camera pose that is no rotation, a first pose with a zero quaternion: refused, the
    # camera stays, nothing crashes
    camera_before = tracker.cameras[0]
    broken = cm.camera_pose_msg(cam, 3)
    broken.pose.orientation.w = 0.0
    broken.pose.orientation.x = 0.0
    probe.create_publisher(PoseStamped, cm.TOPIC_CAMERA_POSE, latched_qos()).publish(broken)
    first = conv.rod_state_to_pose_array(np.tile([0.0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0], (3, 1)), 3)
    first.poses[1].orientation.w = 0.0
    probe.create_publisher(PoseArray, cm.TOPIC_INITIAL_POSES, latched_qos()).publish(first)
    assert wait_for(lambda: c["camera_pose_rejected"] == 1 and c["initial_poses_rejected"] == 1, 10), c
    assert tracker.cameras[0] is camera_before and not tracker.session.tracking
    images.publish(cm.depth_image_msg(np.ones((24, 32)), 2_300_000_000))
    assert wait_for(lambda: c["rejected_no_first_pose"] == 2, 10), c
