"""camera_tracker: rod poses from a depth camera, published as if motion capture made them.

Subscribes, per camera (``cameras``: topic namespaces, ``/tensegrity/camera`` by default),
to a depth image (``<ns>/depth``, 32FC1 metres or 16UC1 mm), its CameraInfo
(``<ns>/camera_info``), the optical frame's world pose (``<ns>/pose``, latched: the static
transform of the camera's calibration) and, latched, the robot's announced first
rod poses (``/tensegrity/initial_rod_poses``): a depth camera cannot tell which rod is
which, so the track starts from a known pose and keeps rod identity by continuity. With
several cameras, images whose stamps lie within ``sync_tolerance`` of each other are one
frame, fitted together at the first camera's stamp; an image left without partners is
counted (``rejected_unmatched``) and dropped. Each image is fitted with its camera's pose
stamped at or before it (a tripod that moves publishes its new pose before the images it
applies to; an older image still waiting takes the older pose).

Each image goes to `tensegrity_engine.perception.session.TrackingSession` (what the offline
`tensegrity-track` runs too) and is fitted by its `RodTracker` (within
``time_budget``), starting from the motion prior's prediction for the image's stamp: by
default the engine with the identified parameters (``/tensegrity/identified_parameters``,
checked as the controller checks them; the config's values until then) rolled from the
last estimates under the commands sent (``/tensegrity/cable_command``), else a constant
velocity; the result goes out on ``/tensegrity/rod_poses`` with the image's stamp, so the
identifier and the controller run unchanged. A frame whose fit is lost (the rendered
silhouette overlaps the observed one less than the tracker's threshold, or the images
contradict a rod: the camera sees past it) is fitted again
by moving the last good shape as one body onto the image (`RodTracker.reacquire`,
counted as ``reacquired``); if that fails too it is not published (counted); the prior
keeps predicting from the last good estimate, and after ``max_lost_frames`` lost in a row
the track waits for a new announced pose. Bad images,
camera info, camera poses or first poses are counted and rejected, never used.
"""
from __future__ import annotations

import collections
import time

import numpy as np
import torch
from geometry_msgs.msg import PoseArray, PoseStamped
from rclpy.node import Node
from sensor_msgs.msg import CameraInfo, Image
from tensegrity_ros_interfaces.msg import CableCommand, IdentifiedParameters

from tensegrity_engine.control.latency import CommandHistory
from tensegrity_engine.groundtruth.mujoco_twin import nominal_commands
from tensegrity_engine.identification.measurements import pose_problem
from tensegrity_engine.identification.streaming import StreamConfig
from tensegrity_engine.perception.session import MOTION_PRIORS, TrackingSession
from tensegrity_engine.perception.tracker import TrackerConfig
from tensegrity_engine.physics.params import ParameterError, PhysicalParameters

from . import camera_messages as cm
from . import conversions as conv
from .common import TOPIC_COMMAND, TOPIC_PARAMS, TOPIC_POSES, ConfigurationError, latched_qos, run_node, \
    stream_qos
from .diagnostics import Diagnostics
from .params import declare, load_robot, refuse_undeclared

NS = conv.NS


class CameraTrackerNode(Node):
    def __init__(self, **kwargs):
        super().__init__("camera_tracker", **kwargs)
        d = lambda *a, **k: declare(self, *a, **k)
        self.robot = load_robot(d("robot", "superball", "robot config: shipped name or YAML path", read_only=True))
        self.config = TrackerConfig(
            noise_at_1m=d("depth_noise", 0.001, "the sensor's depth sigma at 1 m (m; grows with z^2)",
                          range=(0.0, 0.1)),
            time_budget=d("time_budget", 0.08, "fitting time per image (s)", range=(0.005, 10.0)),
            floor_margin=d("floor_margin", 0.02, "a return this much nearer than the floor is the robot (m)",
                           range=(0.001, 1.0)))
        self.motion_prior = d("motion_prior", "engine", "engine: the identified model (else the config's) rolled "
                              "under the commands sent; velocity: constant velocity", choices=MOTION_PRIORS)
        self.acceleration = d("prior_acceleration", 0.0, "unmodelled acceleration of the motion prior (m/s^2; "
                              "0 = 2 for the engine, 5 for constant velocity)", range=(0.0, 1000.0))
        threads = d("torch_threads", 1, "torch intra-op threads: 1 keeps a fit from fighting the other nodes "
                    "for the cores (0 = torch default)", range=(0, 256))
        if threads:
            torch.set_num_threads(threads)
        self.max_lost = d("max_lost_frames", 10, "lost frames in a row before waiting for a new first pose",
                          range=(1, 100000))
        self.max_age = d("max_image_age", 5.0, "longest gap the motion prior bridges (s); an image after a "
                         "longer one ends the track until a new first pose", range=(0.01, 60.0))
        namespaces = d("cameras", [cm.CAMERA_NAMESPACE], "topic namespaces of the depth cameras fitted together "
                       "(each: depth, camera_info, pose)", read_only=True)
        tolerance = d("sync_tolerance", 0.005, "images of several cameras within this of each other (s) are "
                      "one frame", range=(0.0, 1.0))
        if not namespaces or len(set(namespaces)) != len(namespaces):
            raise ConfigurationError("parameter cameras: one or more distinct topic namespaces")
        self.namespaces = list(namespaces)
        self.sync = cm.FrameSync(len(namespaces), int(round(tolerance * NS)))
        self.infos = [None] * len(namespaces)
        self.camera_poses = [None] * len(namespaces)          # the newest checked pose of each camera
        self.pose_history = [cm.StampedHistory() for _ in namespaces]   # an image takes the pose of its stamp
        self.cameras = [None] * len(namespaces)               # each camera at its newest pose
        self.pub = self.create_publisher(PoseArray, TOPIC_POSES, stream_qos())
        for k, ns in enumerate(namespaces):
            depth_topic, info_topic, pose_topic = cm.camera_topics(ns)
            # pose and info first: the executor serves ready subscriptions in the order they were
            # made, and a moved tripod's pose sent before its image must be known when the image is
            self.create_subscription(PoseStamped, pose_topic, lambda m, k=k: self._on_camera_pose(k, m),
                                     latched_qos())
            self.create_subscription(CameraInfo, info_topic, lambda m, k=k: self._on_info(k, m), stream_qos(2))
            self.create_subscription(Image, depth_topic, lambda m, k=k: self._on_depth(k, m), stream_qos(5))
        self.create_subscription(PoseArray, cm.TOPIC_INITIAL_POSES, self._on_initial, latched_qos())
        self.create_subscription(IdentifiedParameters, TOPIC_PARAMS, self._on_params, latched_qos())
        self.create_subscription(CableCommand, TOPIC_COMMAND, self._on_command, stream_qos())
        self.model = PhysicalParameters(self.robot)           # the config's, until one is identified
        self.commands = CommandHistory(nominal_commands(self.robot), maxlen=1024)
        self.cable_names = [self.robot.cable_names[i] for i in self.robot.actuated_indices]
        self.session = None             # made when every camera is known (perception.session)
        self.pending_start = None       # an announced pose that came before the cameras
        self.walls: collections.deque = collections.deque(maxlen=200)    # fit times (s) and overlaps, recent
        self.ious: collections.deque = collections.deque(maxlen=200)
        self.diag = Diagnostics(self, extra=self._diag_values)
        refuse_undeclared(self)      # all declared by now, Diagnostics' period too
        self.get_logger().info(f"camera tracker for {self.robot.name}: waiting for camera info, camera pose "
                               "and the robot's first pose")

    # ------------------------------------------------------------------ inputs
    def _on_camera_pose(self, k: int, msg: PoseStamped) -> None:
        self.diag.received("camera_pose")
        if (problem := conv.header_problem(msg.header)):
            return self.diag.reject(*problem, topic="camera_pose")
        if self.infos[k] is not None:
            _, problem = cm.camera_from_messages(self.infos[k], msg)
            if problem:
                return self.diag.reject(*problem, topic="camera_pose")
        self.camera_poses[k] = msg
        self.pose_history[k].add(conv.stamp_ns(msg.header.stamp), msg)
        self._maybe_make_tracker(k)
        self.diag.accept("camera_pose")

    def _on_info(self, k: int, msg: CameraInfo) -> None:
        self.diag.received("camera_info")
        if (problem := conv.header_problem(msg.header)):
            return self.diag.reject(*problem, topic="camera_info")
        if self.camera_poses[k] is not None:
            _, problem = cm.camera_from_messages(msg, self.camera_poses[k])
            if problem:
                return self.diag.reject(*problem, topic="camera_info")
        self.infos[k] = msg
        self._maybe_make_tracker(k)
        self.diag.accept("camera_info")

    def _camera(self, k: int, pose: PoseStamped):
        """Camera ``k`` at ``pose`` with its newest intrinsics (both checked on arrival)."""
        return cm.camera_from_messages(self.infos[k], pose)[0]

    def _maybe_make_tracker(self, k: int) -> None:
        """Camera ``k`` at its newest pose; the tracking session once every camera is known
        (a camera that moves later is set frame by frame, from the pose of each image)."""
        if self.infos[k] is None or self.camera_poses[k] is None:
            return
        self.cameras[k] = self._camera(k, self.camera_poses[k])
        if self.session is None and all(c is not None for c in self.cameras):
            self.session = TrackingSession(self.robot, list(self.cameras), self.config,
                                           motion_prior=self.motion_prior, model=self.model,
                                           acceleration=self.acceleration or None, max_lost=self.max_lost,
                                           max_gap=self.max_age)
            if self.pending_start is not None:      # the first pose came before the cameras
                self._start(*self.pending_start)

    def _on_initial(self, msg: PoseArray) -> None:
        self.diag.received("initial_poses")
        if (problem := conv.header_problem(msg.header, "world")):
            return self.diag.reject(*problem, topic="initial_poses")
        arr = conv.pose_array_to_array(msg)
        checks = StreamConfig(self.robot.num_rods, self.robot.num_actuated)
        if (problem := pose_problem(arr, self.robot.num_rods, max_abs_position=checks.max_abs_position,
                                    quat_tolerance=checks.quat_tolerance)):
            return self.diag.reject(problem, "initial rod poses", topic="initial_poses")
        self._start(conv.array_to_rod_state(arr), conv.stamp_ns(msg.header.stamp))
        self.diag.accept("initial_poses")

    def _on_params(self, msg: IdentifiedParameters) -> None:
        """The identified model becomes the motion prior, after every check; a bad message
        is counted and the current model stays."""
        self.diag.received("parameters")
        try:
            params = conv.msg_to_params(msg, self.robot)
        except ParameterError as exc:
            return self.diag.reject(f"parameters_{exc.reason}", str(exc), topic="parameters")
        except Exception as exc:  # noqa: BLE001 - a bad message: keep the current model
            return self.diag.reject("parameters_invalid", repr(exc), topic="parameters")
        self.model = params
        if self.session is not None:
            self.session.set_model(params)
        self.diag.accept("parameters")

    def _on_command(self, msg: CableCommand) -> None:
        self.diag.received("commands")
        if (problem := conv.header_problem(msg.header)):
            return self.diag.reject(*problem, topic="commands")
        u, problem = conv.checked_command(msg, self.cable_names)
        if problem:
            return self.diag.reject(problem, "cable command", topic="commands")
        stamp = conv.stamp_ns(msg.header.stamp)
        last = self.commands.last
        if last is not None and stamp <= last[0]:
            return self.diag.reject("out_of_order", "command stamp not increasing", topic="commands")
        self.commands.add(stamp, np.clip(u, self.robot.command_low, self.robot.command_high))
        self.diag.accept("commands")

    def _held(self, times: np.ndarray) -> np.ndarray:
        """[S, A] the command in force at each (evenly spaced) time (s): the prior's input."""
        step = float(times[1] - times[0]) if len(times) > 1 else self.robot.dt
        return self.commands.grid(int(round(times[0] * NS)), len(times), step)

    def _start(self, state: np.ndarray, stamp: int) -> None:
        if self.session is None:             # tracked once the camera is known
            self.pending_start = (state, stamp)
            return
        self.pending_start = None
        self.session.start(state, stamp / NS, self._held)
        self.get_logger().info("track (re)started from the announced first pose")

    # ------------------------------------------------------------------ tracking
    def _on_depth(self, k: int, msg: Image) -> None:
        self.diag.received("depth")
        if (problem := conv.header_problem(msg.header)):
            return self.diag.reject(*problem, topic="depth")
        depth, problem = cm.depth_from_msg(msg)
        if problem:
            return self.diag.reject(*problem, topic="depth")
        if self.session is None:
            return self.diag.reject("no_camera", "no camera info / camera pose yet", topic="depth")
        if not self.session.tracking:
            return self.diag.reject("no_first_pose", "waiting for the robot's first pose", topic="depth")
        stamp = conv.stamp_ns(msg.header.stamp)
        pose = self.pose_history[k].at(stamp)
        if pose is None:
            return self.diag.reject("no_camera_pose", "no camera pose stamped at or before the image",
                                    topic="depth")
        camera = self._camera(k, pose)
        if depth.shape != (camera.height, camera.width):
            return self.diag.reject("bad_image_size", f"{depth.shape} is not the camera's "
                                    f"{(camera.height, camera.width)}", topic="depth")
        frames, dropped = self.sync.add(k, stamp, (depth, camera))
        for _ in dropped:
            self.diag.reject("unmatched", "no image of the other camera(s) within sync_tolerance", topic="depth")
        for frame_stamp, items in frames:
            self._track(frame_stamp, items)

    def _track(self, stamp: int, items: list) -> None:
        """Fit one frame (an image per camera with the camera it was taken from, ``stamp``
        ns); each image is counted."""
        depths, cameras = [d for d, _ in items], [c for _, c in items]
        n = len(depths)
        if not all(c.same_as(s) for c, s in zip(cameras, self.session.cameras)):
            self.session.set_cameras(cameras)          # a tripod moved (or moved back for a late image)
        t0 = time.perf_counter()
        out = self.session.frame(stamp / NS, depths, self._held)
        if out.status == "rejected":
            if out.track_ended:
                self.diag.warn_throttled("lost", f"track ended: {out.detail}")
            for _ in range(n):
                self.diag.reject(out.reason, out.detail, topic="depth")
            return
        self.walls.append(time.perf_counter() - t0)
        self.ious.append(out.estimate.iou)
        for _ in range(n):
            self.diag.accept("depth")
        if out.status == "reacquired":
            self.diag.count("reacquired")
        if out.status == "lost":
            self.diag.count("frames_lost")
            self.diag.warn_throttled("frame_lost", f"frame lost at t={stamp / NS:.2f} s: {out.detail}, fitted in "
                                     f"{1e3 * self.walls[-1]:.0f} ms")
            if out.track_ended:
                self.diag.warn_throttled("lost", "track lost: waiting for a new first pose")
            return
        self.pub.publish(conv.rod_state_to_pose_array(out.state, stamp))
        self.diag.count("poses_published")

    def close(self) -> None:
        """Nothing runs outside the executor: images are fitted in their callback."""

    def _diag_values(self) -> dict:
        tracking = self.session is not None and self.session.tracking
        out = {"tracking": tracking, "lost_in_row": self.session.lost_in_row if self.session else 0}
        if self.walls:
            out.update(track_ms_median=round(1e3 * float(np.median(self.walls)), 1),
                       iou_median=round(float(np.median(self.ious)), 3))
        return out


def main(args=None) -> int:
    return run_node(CameraTrackerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
