"""recorder: write the tensegrity topics to an MCAP bag (rosbag2-compatible layout, no
rosbag2 needed), and read a bag back as `tensegrity_engine.identification.dataset.Trajectory` for the
offline identification.

    python -m tensegrity_ros.recorder --ros-args -p output:=run.mcap        # record
    python -m tensegrity_ros.recorder --to-npz run.mcap run.npz [--robot superball]

Messages are stored as CDR bytes exactly as received (``raw`` subscriptions), with
``ros2msg`` schemas (the full concatenated message definitions), so `ros2 bag info`,
Foxglove and `mcap_ros2` read them. The conversion keeps the first pose array of every
stamp (rejecting what `StreamAligner` would reject is left to the trainer's loader:
the file is validated by `Trajectory`) and every command (zero-order hold).
"""
from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Optional

import numpy as np

TOPICS = {
    "/tensegrity/rod_poses": "geometry_msgs/msg/PoseArray",
    "/tensegrity/imu": "sensor_msgs/msg/Imu",
    "/tensegrity/cable_states": "sensor_msgs/msg/JointState",
    "/tensegrity/cable_command": "tensegrity_ros_interfaces/msg/CableCommand",
    "/tensegrity/applied_command": "tensegrity_ros_interfaces/msg/CableCommand",
    "/tensegrity/identified_parameters": "tensegrity_ros_interfaces/msg/IdentifiedParameters",
    "/tensegrity/goal": "geometry_msgs/msg/Vector3Stamped",
    "/tensegrity/initial_rod_poses": "geometry_msgs/msg/PoseArray",
}
# depth cameras, for `tensegrity-track-bag` (camera_messages.camera_namespace's names; nothing
# is recorded where none publishes)
CAMERA_NAMESPACES = ["/tensegrity/camera"] + [f"/tensegrity/camera_{k}" for k in range(1, 4)]
for _ns in CAMERA_NAMESPACES:
    TOPICS.update({f"{_ns}/depth": "sensor_msgs/msg/Image", f"{_ns}/camera_info": "sensor_msgs/msg/CameraInfo",
                   f"{_ns}/pose": "geometry_msgs/msg/PoseStamped"})
LATCHED_TOPICS = ("/tensegrity/identified_parameters", "/tensegrity/goal", "/tensegrity/initial_rod_poses",
                  *(f"{ns}/pose" for ns in CAMERA_NAMESPACES))
NS = 1_000_000_000
_PRIMITIVES = {"bool", "byte", "char", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
               "uint32", "int64", "uint64", "string", "wstring"}


def _msg_file(pkg: str, name: str) -> Path:
    try:
        from ament_index_python.packages import get_package_share_directory

        base = Path(get_package_share_directory(pkg))
    except Exception:  # noqa: BLE001 - the PyPI wheels: the venv is the prefix
        base = Path(sys.prefix) / "share" / pkg
    return base / "msg" / f"{name}.msg"


def message_definition(datatype: str) -> str:
    """Concatenated ROS 2 message definition (rosbag2's ros2msg schema) of 'pkg/msg/Type'."""
    pkg, _, name = datatype.split("/")
    seen, order = set(), []

    def deps(p, n):
        text = _msg_file(p, n).read_text()
        out = []
        for line in text.splitlines():
            tokens = line.split("#", 1)[0].split()
            if len(tokens) < 2:
                continue
            tok = re.sub(r"\[.*\]$", "", tokens[0])
            if tok.split("<=")[0] in _PRIMITIVES:
                continue
            if tok == "Header":
                dp, dn = "std_msgs", "Header"
            elif "/" in tok:
                parts = tok.split("/")
                dp, dn = parts[0], parts[-1]
            else:
                dp, dn = p, tok
            out.append((dp, dn))
        return text, out

    main_text, first = deps(pkg, name)
    stack = list(first)
    while stack:
        dp, dn = stack.pop(0)
        if (dp, dn) in seen:
            continue
        seen.add((dp, dn))
        text, more = deps(dp, dn)
        order.append((dp, dn, text))
        stack.extend(more)
    parts = [main_text.rstrip("\n")]
    for dp, dn, text in order:
        parts.append("=" * 80 + f"\nMSG: {dp}/{dn}\n" + text.rstrip("\n"))
    return "\n".join(parts) + "\n"


class BagWriter:
    """Thread-safe MCAP writer of raw CDR messages."""

    def __init__(self, path):
        from mcap.writer import Writer

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "wb")
        self._w = Writer(self._fh)
        self._w.start(profile="ros2", library="tensegrity_ros")
        self._lock = threading.Lock()
        self._channels: dict = {}
        self._seq: dict = {}
        self.count = 0

    def channel(self, topic: str, datatype: str) -> int:
        if topic not in self._channels:
            schema = self._w.register_schema(name=datatype, encoding="ros2msg",
                                             data=message_definition(datatype).encode())
            self._channels[topic] = self._w.register_channel(topic=topic, message_encoding="cdr",
                                                             schema_id=schema)
            self._seq[topic] = 0
        return self._channels[topic]

    def write(self, topic: str, data: bytes, log_time_ns: int, publish_time_ns: Optional[int] = None) -> None:
        with self._lock:
            if self._w is None:
                return
            ch = self._channels[topic]
            self._w.add_message(channel_id=ch, log_time=int(log_time_ns),
                                publish_time=int(publish_time_ns if publish_time_ns is not None else log_time_ns),
                                data=bytes(data), sequence=self._seq[topic])
            self._seq[topic] += 1
            self.count += 1

    def close(self) -> None:
        with self._lock:
            if self._w is not None:
                self._w.finish()
                self._fh.close()
                self._w = None


def _node_class():
    from rclpy.node import Node
    import importlib

    def get_message(datatype):
        pkg, _, name = datatype.split("/")
        return getattr(importlib.import_module(f"{pkg}.msg"), name)

    from .common import latched_qos, stream_qos
    from .params import declare, refuse_undeclared

    class Recorder(Node):
        def __init__(self, **kwargs):
            super().__init__("recorder", **kwargs)
            out = declare(self, "output", "tensegrity.mcap", "MCAP file to write")
            topics = declare(self, "topics", list(TOPICS), "topics to record")
            refuse_undeclared(self)      # before the file is created
            self.bag = BagWriter(out)
            for topic in topics:
                datatype = TOPICS.get(topic)
                if datatype is None:
                    self.get_logger().warning(f"unknown topic {topic} (known: {list(TOPICS)}): skipped")
                    continue
                self.bag.channel(topic, datatype)
                qos = latched_qos() if topic in LATCHED_TOPICS else stream_qos(100)
                self.create_subscription(get_message(datatype), topic,
                                         lambda data, t=topic: self.bag.write(t, data, self.get_clock().now().nanoseconds),
                                         qos, raw=True)
            self.get_logger().info(f"recording {len(topics)} topics to {out}")

        def close(self):
            self.bag.close()

    return Recorder


def trajectory_to_bag(traj, path, *, imu: bool = True) -> int:
    """Write a trajectory file's poses (+ IMU when it has velocities) and commands as the
    recorder would have recorded them from a driver (header stamps = the file's times,
    log time = stamp): a bag from any mocap data set. Returns the message count."""
    from rclpy.serialization import serialize_message

    from . import conversions as conv

    events = [(int(round(t * NS)), 0, k) for k, t in enumerate(traj.command_time)]
    events += [(int(round(t * NS)), 1, k) for k, t in enumerate(traj.t)]
    states = traj.states()
    bag = BagWriter(path)
    for topic in ("/tensegrity/rod_poses", "/tensegrity/cable_command") + (("/tensegrity/imu",) if imu else ()):
        bag.channel(topic, TOPICS[topic])
    try:
        for stamp, kind, k in sorted(events):
            if kind == 0:
                bag.write("/tensegrity/cable_command",
                          serialize_message(conv.make_cable_command(traj.command[k], stamp)), stamp)
                continue
            bag.write("/tensegrity/rod_poses", serialize_message(conv.rod_state_to_pose_array(states[k], stamp)),
                      stamp)
            if imu and traj.has_velocity:
                for m in conv.rod_imu_messages(states[k], stamp):
                    bag.write("/tensegrity/imu", serialize_message(m), stamp)
        return bag.count
    finally:
        bag.close()


# ----------------------------------------------------------------------------- read back
def bag_to_trajectory(path, robot, *, environment: Optional[dict] = None):
    """MCAP bag -> `tensegrity_engine.identification.dataset.Trajectory` (poses + commands, stamps from
    the message headers). Pose arrays with the wrong rod count or non-finite values and
    repeated / decreasing stamps are dropped (as the online aligner does)."""
    from mcap_ros2.reader import read_ros2_messages

    from tensegrity_engine.identification.dataset import Trajectory

    cable_names = [robot.cable_names[i] for i in robot.actuated_indices]
    t, pos, quat, ct, cmd = [], [], [], [], []
    for m in read_ros2_messages(str(path), topics=["/tensegrity/rod_poses", "/tensegrity/cable_command"]):
        msg = m.ros_msg
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        if m.channel.topic.endswith("rod_poses"):
            arr = np.array([[p.position.x, p.position.y, p.position.z, p.orientation.w, p.orientation.x,
                             p.orientation.y, p.orientation.z] for p in msg.poses], dtype=np.float64)
            if arr.shape != (robot.num_rods, 7) or not np.isfinite(arr).all() or (t and stamp <= t[-1]):
                continue
            q = arr[:, 3:] / np.linalg.norm(arr[:, 3:], axis=-1, keepdims=True)
            t.append(stamp)
            pos.append(arr[:, :3])
            quat.append(q * np.where(q[:, :1] < 0, -1.0, 1.0))
        else:
            vals = np.asarray(msg.target_rest_lengths, dtype=np.float64)
            names = list(msg.cable_names)
            if names:
                if sorted(names) != sorted(cable_names) or len(names) != len(vals):
                    continue
                order = {n: i for i, n in enumerate(names)}
                vals = vals[[order[n] for n in cable_names]]
            if vals.shape != (robot.num_actuated,) or not np.isfinite(vals).all() or (ct and stamp <= ct[-1]):
                continue
            ct.append(stamp)
            cmd.append(vals)
    if not t or not ct:
        raise ValueError(f"{path}: no usable poses ({len(t)}) or commands ({len(ct)})")
    t, ct = np.array(t), np.array(ct)
    keep = t >= ct[0]                         # the first command must not be later than t[0]
    env = environment or {"name": "recorded", "floor": True, "fixed_rods": []}
    return Trajectory(robot=robot, t=t[keep], position=np.array(pos)[keep], quaternion=np.array(quat)[keep],
                      command_time=ct, command=np.array(cmd), environment=env,
                      meta={"source": str(path)}, source=str(path))


def main(args=None) -> int:
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] == "--to-npz":
        import argparse

        from .params import load_robot

        ap = argparse.ArgumentParser(prog="recorder --to-npz")
        ap.add_argument("bag")
        ap.add_argument("npz")
        ap.add_argument("--robot", default="superball")
        a = ap.parse_args(argv[1:])
        traj = bag_to_trajectory(a.bag, load_robot(a.robot))
        traj.save(a.npz)
        print(f"{a.npz}: {traj.num_samples} poses, {len(traj.command_time)} commands")
        return 0
    from .common import run_node

    return run_node(_node_class(), args)


if __name__ == "__main__":
    raise SystemExit(main())
