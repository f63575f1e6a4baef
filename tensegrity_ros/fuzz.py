"""tensegrity-fuzz: hostile messages against the running nodes over DDS, every one accounted for.

The nodes (identifier, mppi_controller, mujoco_bridge) run with their outputs that would
mix into the fuzzed topics remapped away (the controller's commands, the bridge's poses,
gyros and clock), so the harness knows every message each node receives. `FuzzHarness`
publishes a `HostileStream` in chunks smaller than the subscription queues and, after
each chunk, waits until every node's /diagnostics says it received exactly what was sent
(``in_<topic>``); nothing is lost or skipped, so at the end it checks, per node and topic:

* received == sent, and accepted + rejected == received (no message unaccounted);
* accepted == the messages that are valid (no hostile message ever accepted, no clean
  one refused), for the identifier and the controller, which share the checks;
* every process (thread, in-process) alive; every controller command finite, of the
  robot's length and inside its command range;
* afterwards a clean stream still becomes tuples and the identifier keeps training.

    tensegrity-fuzz [--robot superball] [--messages 20000] [--seed 0] [--output fuzz.json]

runs the nodes as processes (the long version); test/ros/test_fuzz.py runs the short one
in CI with the nodes in the test process.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Optional

import numpy as np

from .common import TOPIC_COMMAND, TOPIC_GOAL, TOPIC_IMU, TOPIC_PARAMS, TOPIC_POSES, goal_qos, latched_qos, stream_qos
from .fuzz_messages import HostileStream, Item

SUBSCRIBED = {"identifier": ("poses", "imu", "commands"),
              "mppi_controller": ("poses", "imu", "parameters", "goals"),
              "mujoco_bridge": ("commands",)}
EXACT = ("identifier", "mppi_controller")   # nodes whose accepted count is predicted
CONTROLLER_COMMANDS = "/fuzz/controller_command"
REMAP = {"mppi_controller": {TOPIC_COMMAND: CONTROLLER_COMMANDS},
         "mujoco_bridge": {TOPIC_POSES: "/fuzz/bridge/rod_poses", TOPIC_IMU: "/fuzz/bridge/imu",
                           "/clock": "/fuzz/bridge/clock", "/tensegrity/markers": "/fuzz/bridge/markers"},
         "identifier": {}}
SINGLE = ("parameters", "goals")             # depth-1 (latched) queues: one per chunk


def remap_args(node: str) -> list:
    args = ["--ros-args"]
    for a, b in REMAP[node].items():
        args += ["-r", f"{a}:={b}"]
    return args


class FuzzLost(RuntimeError):
    """A chunk was not accounted for within the wait: a message lost or never counted."""


class FuzzHarness:
    """Publishes items, waits for the nodes to account for them, keeps the tallies."""

    def __init__(self, node, robot, nodes=tuple(SUBSCRIBED), *, chunk: int = 30, wait_s: float = 60.0):
        from diagnostic_msgs.msg import DiagnosticArray
        from geometry_msgs.msg import PoseArray, Vector3Stamped
        from sensor_msgs.msg import Imu
        from tensegrity_ros_interfaces.msg import CableCommand, IdentifiedParameters

        self.node, self.robot, self.nodes = node, robot, tuple(nodes)
        self.chunk, self.wait_s = int(chunk), float(wait_s)
        self.pubs = {"poses": node.create_publisher(PoseArray, TOPIC_POSES, stream_qos()),
                     "imu": node.create_publisher(Imu, TOPIC_IMU, stream_qos(100)),
                     "commands": node.create_publisher(CableCommand, TOPIC_COMMAND, stream_qos()),
                     "parameters": node.create_publisher(IdentifiedParameters, TOPIC_PARAMS, latched_qos()),
                     "goals": node.create_publisher(Vector3Stamped, TOPIC_GOAL, goal_qos())}
        self._lock = threading.Lock()
        self.diag: dict = {}
        self.sent = collections.Counter()            # topic -> messages published
        self.valid = collections.Counter()           # topic -> of them valid
        self.kinds = collections.Counter()           # (topic, kind) -> messages
        self.identifier_parameters = 0               # parameter messages the identifier published
        self.commands_seen = 0
        self.bad_commands: list = []
        self.lost: list = []
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        every_param = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                                 durability=DurabilityPolicy.TRANSIENT_LOCAL)
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 100)
        node.create_subscription(IdentifiedParameters, TOPIC_PARAMS, self._on_params, every_param)
        node.create_subscription(CableCommand, CONTROLLER_COMMANDS, self._on_command, stream_qos(200))

    # ------------------------------------------------------------------ observation
    def _on_diag(self, msg) -> None:
        with self._lock:
            for st in msg.status:
                self.diag[st.name] = {kv.key: kv.value for kv in st.values}

    def _on_params(self, msg) -> None:
        if msg.stage != "fuzz":
            with self._lock:
                self.identifier_parameters += 1

    def _on_command(self, msg) -> None:
        u = np.asarray(msg.target_rest_lengths, dtype=np.float64)
        ok = (u.shape == (self.robot.num_actuated,) and np.isfinite(u).all()
              and np.all(u >= self.robot.command_low) and np.all(u <= self.robot.command_high))
        with self._lock:
            self.commands_seen += 1
            if not ok and len(self.bad_commands) < 10:
                self.bad_commands.append(u.tolist()[:8])

    def value(self, node: str, key: str, default=0.0):
        with self._lock:
            v = self.diag.get(node, {}).get(key, default)
        try:
            return float(v)
        except (TypeError, ValueError):
            return v

    def expected_in(self, topic: str) -> int:
        return self.sent[topic] + (self.identifier_parameters if topic == "parameters" else 0)

    def _caught_up(self) -> bool:
        return all(self.value(n, f"in_{t}") == self.expected_in(t) for n in self.nodes for t in SUBSCRIBED[n])

    def wait_caught_up(self, timeout: Optional[float] = None) -> bool:
        deadline = time.monotonic() + (self.wait_s if timeout is None else timeout)
        while time.monotonic() < deadline:
            if self._caught_up():
                return True
            time.sleep(0.01)
        return self._caught_up()

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Every node subscribed to every topic and reporting diagnostics."""
        need = {t: sum(t in SUBSCRIBED[n] for n in self.nodes) for t in self.pubs}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                reporting = all(n in self.diag for n in self.nodes)
            if reporting and all(self.pubs[t].get_subscription_count() >= k for t, k in need.items()):
                return True
            time.sleep(0.1)
        return False

    # ------------------------------------------------------------------ sending
    def send(self, items, progress: Optional[Callable[[int], None]] = None) -> int:
        """Publish ``items`` chunk by chunk, waiting after each for the nodes to count it."""
        chunk: list = []

        def flush():
            if not chunk:
                return
            for it in chunk:
                self.pubs[it.topic].publish(it.msg)
                self.sent[it.topic] += 1
                self.valid[it.topic] += int(it.valid)
                self.kinds[(it.topic, it.kind)] += 1
            kinds = [(it.topic, it.kind) for it in chunk]
            chunk.clear()
            if not self.wait_caught_up():
                self.lost.append({"chunk": kinds, "counts": {
                    t: (self.expected_in(t), {n: self.value(n, f"in_{t}") for n in self.nodes
                                              if t in SUBSCRIBED[n]}) for t in self.pubs}})
                raise FuzzLost(self.lost[-1])

        try:
            self._send(items, chunk, flush, progress)
        except FuzzLost:
            pass           # recorded in self.lost; failures() reports it
        return sum(self.sent.values())

    def _send(self, items, chunk, flush, progress) -> None:
        total = 0
        for item in items:
            if (item.barrier_before or len(chunk) >= self.chunk
                    or (item.topic in SINGLE and any(c.topic == item.topic for c in chunk))):
                flush()
            chunk.append(item)
            if item.barrier_after:
                flush()
            total += 1
            if progress is not None and total % 1000 == 0:
                progress(total)
        flush()

    # ------------------------------------------------------------------ verdict
    def accounting(self) -> dict:
        """Per node and topic: sent, received, accepted (and expected), rejected, reasons."""
        out = {}
        for n in self.nodes:
            rows = {}
            for t in SUBSCRIBED[n]:
                expected = self.valid[t] + (self.identifier_parameters if t == "parameters" else 0)
                rows[t] = {"sent": self.expected_in(t), "received": self.value(n, f"in_{t}"),
                           "accepted": self.value(n, f"{t}_accepted"),
                           "rejected": self.value(n, f"{t}_rejected"),
                           "expected_accepted": expected if n in EXACT else None}
            reasons = {k[len("rejected_"):]: self.value(n, k) for k in sorted(self.diag.get(n, {}))
                       if k.startswith("rejected_") and k != "rejected_total"}
            out[n] = {"topics": rows, "rejection_reasons": reasons}
        return out

    def failures(self, accounting: dict) -> list:
        bad = [f"messages not accounted for after a chunk: {x}" for x in self.lost[:3]]
        for n, a in accounting.items():
            for t, r in a["topics"].items():
                if r["received"] != r["sent"]:
                    bad.append(f"{n}/{t}: received {r['received']} of {r['sent']} sent")
                if r["accepted"] + r["rejected"] != r["received"]:
                    bad.append(f"{n}/{t}: accepted {r['accepted']} + rejected {r['rejected']} != "
                               f"received {r['received']}")
                if r["expected_accepted"] is not None and r["accepted"] != r["expected_accepted"]:
                    bad.append(f"{n}/{t}: accepted {r['accepted']}, expected {r['expected_accepted']}")
            rejected = sum(r["rejected"] for r in a["topics"].values())
            if sum(a["rejection_reasons"].values()) != rejected:
                bad.append(f"{n}: {rejected} rejections but only {sum(a['rejection_reasons'].values())} "
                           "under a reason")
        if self.bad_commands:
            bad.append(f"controller commands outside the range: {self.bad_commands[:3]}")
        return bad


def hostile_items(robot, rest_state, n: int, seed: int) -> tuple[HostileStream, list[Item]]:
    stream = HostileStream(robot, rest_state, seed=seed)
    return stream, list(stream.items(n))
