"""The MuJoCo bridge's depth cameras: what RGB-D sensors on tripods would publish.

MuJoCo renders the played robot (`groundtruth.depth_camera.MujocoDepthCamera`: its own
capsules and floor, range-dependent noise, dropped pixels) at ``depth_rate`` in the
simulation thread, which owns the OpenGL contexts. ``depth_cameras`` tripods stand
``depth_camera_spacing`` degrees apart around the robot's start (the first at
``depth_camera_eye``), all capturing at the same instants. Published per camera, under ``/tensegrity/camera`` for the first and
``/tensegrity/camera_<k>`` for the others: the depth image (32FC1, metres, NaN = no
return) and CameraInfo stamped at capture, the optical frame's world pose (latched, the
static transform a calibration gives); and, latched, the robot's first rod poses: how a
robot whose poses come from a camera announces where it starts.
"""
from __future__ import annotations

import math

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import PoseArray, PoseStamped
from sensor_msgs.msg import CameraInfo, Image

from tensegrity_engine.groundtruth.depth_camera import DepthNoise, DepthRenderingUnavailable, MujocoDepthCamera
from tensegrity_engine.perception.camera import look_at, tripods

from . import camera_messages as cm
from . import conversions as conv
from .common import ConfigurationError, latched_qos, stream_qos
from .params import declare


class DepthCameraOutput:
    def __init__(self, node, robot, start_com: np.ndarray):
        d = lambda *a, **k: declare(node, *a, **k)
        self.enabled = d("depth_camera", False, "render and publish a depth camera (sensor_msgs/Image 32FC1)",
                         read_only=True)
        self.rate = d("depth_rate", 10.0, "depth image rate (Hz, sim time)", range=(0.1, 100.0))
        width = d("depth_width", 160, "depth image width (pixels)", range=(8, 4096), read_only=True)
        height = d("depth_height", 120, "depth image height (pixels)", range=(8, 4096), read_only=True)
        fov = d("depth_fov", 70.0, "vertical field of view (deg)", range=(5.0, 150.0), read_only=True)
        noise = d("depth_noise", 0.001, "depth noise sigma at 1 m (m; grows with z^2)", range=(0.0, 0.1))
        dropout = d("depth_dropout", 0.02, "share of pixels with no return", range=(0.0, 0.9))
        eye = d("depth_camera_eye", [1.8, -1.8, 1.4],
                "camera position from the robot's start, in rod lengths (x, y, z)", read_only=True)
        aim = d("depth_camera_aim_height", 0.3, "the camera looks at the start this many rod lengths up",
                range=(0.0, 10.0), read_only=True)
        self.follow = d("depth_camera_follow", 0.0, "when the robot is this far (m, horizontally) from where the "
                        "camera looks, the camera is carried along by as much (0 = a fixed tripod)",
                        range=(0.0, 1e3), read_only=True)
        count = d("depth_cameras", 1, "number of depth cameras, on tripods around the start",
                  range=(1, 8), read_only=True)
        spacing = d("depth_camera_spacing", 90.0, "azimuth between consecutive tripods (deg; 90: two cameras see "
                    "a rod across its axis, where opposite ones share its blind direction)", range=(0.0, 180.0),
                    read_only=True)
        if not self.enabled:
            return
        if len(eye) != 3 or not all(math.isfinite(float(v)) for v in eye):
            raise ConfigurationError("parameter depth_camera_eye: expected 3 finite numbers")
        size = float(np.max(robot.rod_length))
        self.target = start_com + np.array([0.0, 0.0, aim * size])
        offset = size * np.asarray(eye, dtype=np.float64)
        self.cameras = tripods(start_com, offset, self.target, count, spacing, width=width, height=height,
                               fov_y=math.radians(fov))
        self.robot_mass = robot.rod_mass
        self.noise = DepthNoise(noise, dropout)
        self.node = node
        self.sensors = []                   # made in the simulation thread: it owns the GL contexts
        self.namespaces = [cm.camera_namespace(k) for k in range(count)]
        self.frames = [cm.optical_frame(ns) for ns in self.namespaces]
        self.pub_depth, self.pub_info, self.pub_pose = [], [], []
        for ns in self.namespaces:
            depth_topic, info_topic, pose_topic = cm.camera_topics(ns)
            self.pub_depth.append(node.create_publisher(Image, depth_topic, stream_qos(5)))
            self.pub_info.append(node.create_publisher(CameraInfo, info_topic, stream_qos(5)))
            self.pub_pose.append(node.create_publisher(PoseStamped, pose_topic, latched_qos()))
        self.pub_initial = node.create_publisher(PoseArray, cm.TOPIC_INITIAL_POSES, latched_qos())
        self.images = 0
        self.moves = 0

    @property
    def period_ns(self) -> int:
        return int(round(1e9 / self.rate))

    def announce(self, t_ns: int, rod_state: np.ndarray) -> None:
        """Latched: the cameras' poses and the robot's first rod poses."""
        for cam, pub in zip(self.cameras, self.pub_pose):
            pub.publish(cm.camera_pose_msg(cam, t_ns))
        self.pub_initial.publish(conv.rod_state_to_pose_array(rod_state, t_ns))

    def publish(self, twin, t_ns: int, rod_state: np.ndarray, rng: np.random.Generator) -> None:
        if not self.sensors:
            try:
                for cam in self.cameras:        # one at a time: a failure frees those made
                    self.sensors.append(MujocoDepthCamera(twin, cam, noise=self.noise, rng=rng))
            except DepthRenderingUnavailable as exc:
                self.close()
                self.enabled = False
                self.node.get_logger().error(f"depth camera off: {exc}")
                self.node.diag.count("depth_camera_unavailable")
                # with the camera as the only pose source nothing can track the robot now
                level = DiagnosticStatus.WARN if self.node.publish_poses else DiagnosticStatus.ERROR
                self.node.diag.set_status(level, f"depth camera unavailable: {exc}")
                return
        com = (rod_state[:, 0:3] * self.robot_mass[:, None]).sum(0) / self.robot_mass.sum()
        away = com[:2] - self.target[:2]
        if self.follow > 0 and np.linalg.norm(away) > self.follow:   # carry the tripods along
            self.target[:2] += away
            shift = np.array([away[0], away[1], 0.0])
            for k, (cam, sensor) in enumerate(zip(self.cameras, self.sensors)):
                self.cameras[k] = look_at(cam.position + shift, self.target, width=cam.width, height=cam.height,
                                          fov_y=2.0 * math.atan(0.5 * cam.height / cam.fy))
                sensor.move(self.cameras[k])
                self.pub_pose[k].publish(cm.camera_pose_msg(self.cameras[k], t_ns))   # before its image
            self.moves += 1
        for cam, sensor, pub_info, pub_depth, frame in zip(self.cameras, self.sensors, self.pub_info,
                                                           self.pub_depth, self.frames):
            depth = sensor.render(rod_state)
            pub_info.publish(cm.camera_info_msg(cam, t_ns, frame))      # first: a tracker needs it
            pub_depth.publish(cm.depth_image_msg(depth, t_ns, frame))
            self.images += 1

    def close(self) -> None:
        """Free the renderers: call it from the thread that rendered (it owns the contexts)."""
        for sensor in getattr(self, "sensors", []):
            sensor.close()
        self.sensors = []
