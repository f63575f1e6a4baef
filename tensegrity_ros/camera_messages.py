"""Depth camera messages: sensor_msgs/Image (32FC1, metres; 16UC1, millimetres),
sensor_msgs/CameraInfo, and the optical frame's world pose (geometry_msgs/PoseStamped).

No tf2 wheel exists for this ROS install, so the camera's pose is a message of its own
(latched, like a static transform) or a parameter: `camera_from_messages` builds the
engine's `PinholeCamera` from CameraInfo + pose. Every decoder returns (value, None) or
(None, (reason, detail)) for the node to count and reject.
"""
from __future__ import annotations

import collections
from typing import Optional

import numpy as np
import transforms3d

from tensegrity_engine.perception.camera import PinholeCamera

from .conversions import ns_to_stamp

CAMERA_NAMESPACE = "/tensegrity/camera"          # the first camera's; others /tensegrity/camera_1, ...
TOPIC_INITIAL_POSES = "/tensegrity/initial_rod_poses"
MAX_PIXELS = 4096 * 4096


def camera_namespace(index: int) -> str:
    """The topic namespace of the ``index``-th camera of a rig (0: /tensegrity/camera)."""
    return CAMERA_NAMESPACE if index == 0 else f"{CAMERA_NAMESPACE}_{index}"


def camera_topics(namespace: str) -> tuple[str, str, str]:
    """(depth image, camera info, optical frame pose) topics of a camera namespace."""
    namespace = namespace.rstrip("/")
    return f"{namespace}/depth", f"{namespace}/camera_info", f"{namespace}/pose"


def optical_frame(namespace: str) -> str:
    """The frame id of a camera namespace's images: tensegrity_camera_optical, ..."""
    return namespace.strip("/").replace("/", "_") + "_optical"


TOPIC_DEPTH, TOPIC_CAMERA_INFO, TOPIC_CAMERA_POSE = camera_topics(CAMERA_NAMESPACE)
OPTICAL_FRAME = optical_frame(CAMERA_NAMESPACE)


def depth_image_msg(depth: np.ndarray, stamp_ns_: int, frame_id: str = OPTICAL_FRAME):
    from sensor_msgs.msg import Image

    d = np.ascontiguousarray(depth, dtype="<f4")
    msg = Image()
    ns_to_stamp(stamp_ns_, msg.header.stamp)
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(d.shape[0]), int(d.shape[1])
    msg.encoding, msg.is_bigendian, msg.step = "32FC1", 0, 4 * msg.width
    msg.data = d.tobytes()
    return msg


def depth_from_msg(msg) -> tuple[Optional[np.ndarray], Optional[tuple[str, str]]]:
    """Image -> depth [H, W] float64 metres (NaN = no return)."""
    h, w = int(msg.height), int(msg.width)
    if h < 1 or w < 1 or h * w > MAX_PIXELS:
        return None, ("bad_image_size", f"{w}x{h}")
    kinds = {"32FC1": ("f4", 4, 1.0), "16UC1": ("u2", 2, 1e-3)}
    if msg.encoding not in kinds:
        return None, ("bad_encoding", f"depth encoding {msg.encoding!r} (32FC1 or 16UC1)")
    code, size, scale = kinds[msg.encoding]
    if int(msg.step) < w * size or len(msg.data) < int(msg.step) * h:
        return None, ("bad_image_size", f"step {msg.step}, {len(msg.data)} bytes for {w}x{h} {msg.encoding}")
    order = ">" if msg.is_bigendian else "<"
    rows = np.frombuffer(bytes(msg.data), dtype=np.uint8)[: int(msg.step) * h].reshape(h, int(msg.step))
    depth = rows[:, : w * size].copy().view(order + code).reshape(h, w).astype(np.float64) * scale
    depth[~np.isfinite(depth) | (depth <= 0)] = np.nan    # 0 mm (16UC1) means no return too
    return depth, None


def camera_info_msg(camera: PinholeCamera, stamp_ns_: int, frame_id: str = OPTICAL_FRAME):
    from sensor_msgs.msg import CameraInfo

    msg = CameraInfo()
    ns_to_stamp(stamp_ns_, msg.header.stamp)
    msg.header.frame_id = frame_id
    msg.height, msg.width = camera.height, camera.width
    msg.distortion_model = "plumb_bob"
    msg.d = [0.0] * 5
    msg.k = [float(v) for v in camera.k.ravel()]
    msg.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    msg.p = [camera.fx, 0.0, camera.cx, 0.0, 0.0, camera.fy, camera.cy, 0.0, 0.0, 0.0, 1.0, 0.0]
    return msg


def camera_pose_msg(camera: PinholeCamera, stamp_ns_: int, frame_id: str = "world"):
    from geometry_msgs.msg import PoseStamped

    msg = PoseStamped()
    ns_to_stamp(stamp_ns_, msg.header.stamp)
    msg.header.frame_id = frame_id
    p, q = camera.position, transforms3d.quaternions.mat2quat(camera.rotation)
    msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = (float(v) for v in p)
    msg.pose.orientation.w, msg.pose.orientation.x, msg.pose.orientation.y, msg.pose.orientation.z = \
        (float(v) for v in q)
    return msg


def camera_from_messages(info, pose) -> tuple[Optional[PinholeCamera], Optional[tuple[str, str]]]:
    """CameraInfo (rectified: its distortion is ignored only if it is zero) + the optical
    frame's world pose -> PinholeCamera."""
    if not (1 <= int(info.width) and 1 <= int(info.height) and int(info.width) * int(info.height) <= MAX_PIXELS):
        return None, ("bad_camera_info", f"image size {info.width}x{info.height}")
    k = np.asarray(info.k, dtype=np.float64)
    if k.shape != (9,) or not np.isfinite(k).all() or k[0] <= 0 or k[4] <= 0:
        return None, ("bad_camera_info", "K must hold positive, finite focal lengths")
    if len(info.d) and np.any(np.abs(np.asarray(info.d, dtype=np.float64)) > 1e-9):
        return None, ("distorted_camera", "depth images must be rectified (distortion d = 0)")
    o, t = pose.pose.orientation, pose.pose.position
    q = np.array([o.w, o.x, o.y, o.z], dtype=np.float64)
    if not np.isfinite(q).all() or abs(np.linalg.norm(q) - 1.0) > 1e-3:
        return None, ("bad_camera_pose", "camera orientation must be a unit quaternion")
    try:
        cam = PinholeCamera.from_camera_info(k, int(info.width), int(info.height),
                                             transforms3d.quaternions.quat2mat(q / np.linalg.norm(q)),
                                             np.array([t.x, t.y, t.z], dtype=np.float64))
    except ValueError as exc:
        return None, ("bad_camera_info", str(exc))
    return cam, None


class FrameSync:
    """Images of several cameras matched into frames by their stamps.

    `add` takes camera ``index``'s image at ``stamp`` (ns) and returns (frames completed:
    [(stamp of camera 0's image, [item per camera])], items dropped). A frame is complete
    when every camera has an image within ``tolerance_ns`` of the others; an image that can
    no longer be matched (an older one than another camera's oldest by more than the
    tolerance) or that overflows ``depth`` waiting images is dropped, for the caller to
    count. One camera: every image is a frame at once."""

    def __init__(self, cameras: int, tolerance_ns: int, depth: int = 5):
        if cameras < 1 or tolerance_ns < 0 or depth < 1:
            raise ValueError("at least one camera, a tolerance >= 0, depth >= 1")
        self.tolerance = int(tolerance_ns)
        self.depth = int(depth)
        self.pending = [collections.deque() for _ in range(cameras)]

    def add(self, index: int, stamp: int, item) -> tuple[list, list]:
        dropped = []
        queue = self.pending[index]
        queue.append((int(stamp), item))
        while len(queue) > self.depth:
            dropped.append(queue.popleft()[1])
        frames = []
        while all(self.pending):
            heads = [q[0][0] for q in self.pending]
            if max(heads) - min(heads) <= self.tolerance:
                items = [q.popleft()[1] for q in self.pending]
                frames.append((heads[0], items))
            else:                               # the oldest head has no partner any more
                dropped.append(self.pending[int(min(range(len(heads)), key=heads.__getitem__))].popleft()[1])
        return frames, dropped


class StampedHistory:
    """The last few stamped values of a stream (e.g. a camera's pose, which a tripod carried
    along changes): `at` gives the one in force at a stamp, so an image is fitted with the
    pose it was taken from even when a newer pose overtook it on the way."""

    def __init__(self, depth: int = 16):
        self.items: collections.deque = collections.deque(maxlen=depth)

    def add(self, stamp: int, value) -> None:
        items = list(self.items)
        at = len(items)
        while at and items[at - 1][0] > stamp:           # out of order: keep them sorted
            at -= 1
        items.insert(at, (int(stamp), value))
        self.items = collections.deque(items[-self.items.maxlen:], maxlen=self.items.maxlen)

    def at(self, stamp: int):
        """The newest value stamped at or before ``stamp``; None when all are later."""
        for s, value in reversed(self.items):
            if s <= stamp:
                return value
        return None

    @property
    def latest(self):
        return self.items[-1][1] if self.items else None
