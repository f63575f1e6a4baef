"""Shared node plumbing: QoS profiles, topic names, running a node from main()."""
from __future__ import annotations

import os
import sys
import threading

TOPIC_POSES = "/tensegrity/rod_poses"
TOPIC_IMU = "/tensegrity/imu"
TOPIC_COMMAND = "/tensegrity/cable_command"
TOPIC_PARAMS = "/tensegrity/identified_parameters"
TOPIC_GOAL = "/tensegrity/goal"
TOPIC_MARKERS = "/tensegrity/markers"


def latched_qos():
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)


def stream_qos(depth: int = 50):
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth,
                      reliability=ReliabilityPolicy.RELIABLE)


def goal_qos():
    """The goal is a setting: latched so a late controller gets it."""
    return latched_qos()


def resolve_device(name: str) -> str:
    import torch

    name = str(name).lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda requested but torch.cuda.is_available() is False")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ValueError(f"device must be auto|cpu|cuda, got {name!r}")
    return name


class Spinner:
    """One SingleThreadedExecutor for one node, spun in its own thread."""

    def __init__(self, node, context=None):
        from rclpy.executors import SingleThreadedExecutor

        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(node)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"spin-{node.get_name()}", daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.executor.spin_once(timeout_sec=0.05)
            except Exception as exc:  # noqa: BLE001 - shutting down
                if self._stop.is_set():
                    break
                import rclpy

                if not rclpy.ok(context=self.executor.context):
                    break
                raise exc

    def stop(self):
        self._stop.set()
        self.thread.join(timeout=5.0)
        try:
            self.executor.shutdown(timeout_sec=1.0)
        except Exception:  # noqa: BLE001
            pass


def run_node(node_cls, args=None) -> int:
    """main() body: init, spin the node on its own SingleThreadedExecutor until SIGINT /
    SIGTERM, shut down cleanly (so DDS shared memory is released)."""
    import signal

    import rclpy
    from rclpy.executors import ExternalShutdownException

    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    rclpy.init(args=args if args is not None else sys.argv)
    node = None
    try:
        node = node_cls()
        signal.signal(signal.SIGTERM, lambda *_: rclpy.try_shutdown())
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            try:
                node.close()
            except Exception:  # noqa: BLE001
                pass
            node.destroy_node()
        rclpy.try_shutdown()
    return 0
