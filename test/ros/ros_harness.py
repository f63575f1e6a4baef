"""Shared by the ROS tests: a private rclpy context per test (its own reserved
ROS_DOMAIN_ID, discovery on this host), nodes spun by one SingleThreadedExecutor each, a
recorder of the product topics, and waits on conditions (never sleeps as
synchronisation). An exception raised in any node's callback fails the test that
started the node: rclpy would only print it from the spinner thread."""
import os
import shutil
import tempfile
import threading
import time

import numpy as np
import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseArray
from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Imu, JointState
from tensegrity_ros_interfaces.msg import CableCommand, IdentifiedParameters

from tensegrity_engine.physics.state import center_of_mass
from tensegrity_ros import conversions as conv
from tensegrity_ros.common import (TOPIC_CABLE_STATES, TOPIC_COMMAND, TOPIC_IMU, TOPIC_PARAMS, TOPIC_POSES, Spinner,
                                   latched_qos, release_domain_id, reserve_domain_id, stream_qos)
from tensegrity_ros.sim2sim import clean_dds_shm

NS = 1_000_000_000
LOG_DIR = tempfile.mkdtemp(prefix="tensegrity_test_ros_log_")
os.environ.setdefault("ROS_LOG_DIR", LOG_DIR)
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.pop("ROS_LOCALHOST_ONLY", None)
os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")


def wait_for(pred, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


class CheckedSpinner(Spinner):
    """A Spinner that keeps the exception that ended its thread instead of losing it."""

    def __init__(self, node, context):
        self.error = None
        super().__init__(node, context)

    def _run(self):
        try:
            super()._run()
        except BaseException as exc:  # noqa: BLE001 - reported by Ros.close
            self.error = exc


class Ros:
    """A context on a private domain + nodes spun by their own executors."""

    def __init__(self):
        self.domain = reserve_domain_id()
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=self.domain)
        self.nodes, self.spinners = [], []

    def add(self, node):
        self.nodes.append(node)
        self.spinners.append(CheckedSpinner(node, self.context))
        return node

    def node(self, cls, overrides=None, **kwargs):
        params = [Parameter(k, value=v) for k, v in (overrides or {}).items()]
        return self.add(cls(context=self.context, parameter_overrides=params, **kwargs))

    def plain(self, name):
        return self.add(rclpy.create_node(name, context=self.context))

    def errors(self) -> list:
        return [(s.thread.name, s.error) for s in self.spinners if s.error is not None]

    def close(self):
        for n in self.nodes:
            if hasattr(n, "close"):
                try:
                    n.close()
                except Exception:  # noqa: BLE001
                    pass
        for s in self.spinners:
            s.stop()
        for n in self.nodes:
            n.destroy_node()
        rclpy.try_shutdown(context=self.context)
        release_domain_id(self.domain)


@pytest.fixture
def ros():
    r = Ros()
    try:
        yield r
    finally:
        r.close()
    errors = r.errors()
    if errors:
        pytest.fail(f"a node callback raised: {errors}")


@pytest.fixture(scope="session", autouse=True)
def _clean_shm():
    yield
    clean_dds_shm()
    shutil.rmtree(LOG_DIR, ignore_errors=True)


class Recorder:
    """Subscribes to the product topics and keeps what arrives."""

    def __init__(self, node):
        self.lock = threading.Lock()
        self.poses, self.pose_wall, self.imu, self.clock, self.params, self.diag = [], [], [], [], [], {}
        self.commands, self.cables = [], []
        node.create_subscription(PoseArray, TOPIC_POSES, self._pose, stream_qos())
        node.create_subscription(JointState, TOPIC_CABLE_STATES, lambda m: self._add(self.cables, m), stream_qos())
        node.create_subscription(Imu, TOPIC_IMU, lambda m: self._add(self.imu, m), stream_qos(100))
        node.create_subscription(Clock, "/clock", lambda m: self._add(self.clock, m), 10)
        node.create_subscription(IdentifiedParameters, TOPIC_PARAMS, lambda m: self._add(self.params, m),
                                 latched_qos())
        node.create_subscription(CableCommand, TOPIC_COMMAND, lambda m: self._add(self.commands, m), stream_qos())
        node.create_subscription(DiagnosticArray, "/diagnostics", self._diag, 50)

    def _add(self, lst, m):
        with self.lock:
            lst.append(m)

    def _pose(self, m):
        with self.lock:
            self.poses.append(m)
            self.pose_wall.append(time.monotonic())

    def _diag(self, m):
        with self.lock:
            for st in m.status:
                self.diag[st.name] = {kv.key: kv.value for kv in st.values}

    def value(self, node, key, default=0):
        with self.lock:
            v = self.diag.get(node, {}).get(key, default)
        try:
            return float(v)
        except (TypeError, ValueError):
            return v

    def com(self, robot):
        with self.lock:
            arr = [conv.pose_array_to_array(m) for m in self.poses]
            t = [conv.stamp_ns(m.header.stamp) / NS for m in self.poses]
        if not arr:
            return np.zeros(0), np.zeros((0, 3))
        return np.array(t), np.array([center_of_mass(conv.array_to_rod_state(a), robot.rod_mass) for a in arr])
