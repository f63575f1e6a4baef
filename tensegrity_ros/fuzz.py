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

from .common import (TOPIC_CABLE_STATES, TOPIC_COMMAND, TOPIC_GOAL, TOPIC_IMU, TOPIC_PARAMS, TOPIC_POSES, goal_qos,
                     latched_qos, stream_qos)
from .common import reserve_domain_id
from .fuzz_messages import HostileStream, Item

SUBSCRIBED = {"identifier": ("poses", "imu", "cables", "commands"),
              "mppi_controller": ("poses", "imu", "cables", "parameters", "goals"),
              "mujoco_bridge": ("commands",)}
EXACT = ("identifier", "mppi_controller")   # nodes whose accepted count is predicted
CONTROLLER_COMMANDS = "/fuzz/controller_command"
IDENTIFIER_PARAMETERS = "/fuzz/identifier_parameters"
REMAP = {"mppi_controller": {TOPIC_COMMAND: CONTROLLER_COMMANDS},
         "mujoco_bridge": {TOPIC_POSES: "/fuzz/bridge/rod_poses", TOPIC_IMU: "/fuzz/bridge/imu",
                           TOPIC_CABLE_STATES: "/fuzz/bridge/cable_states",
                           "/clock": "/fuzz/bridge/clock", "/tensegrity/markers": "/fuzz/bridge/markers"},
         # the identifier's models would race the fuzzed ones into the controller's
         # depth-1 (latched) queue, where the newer replaces the older unseen
         "identifier": {TOPIC_PARAMS: IDENTIFIER_PARAMETERS}}
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
        from sensor_msgs.msg import Imu, JointState
        from tensegrity_ros_interfaces.msg import CableCommand, IdentifiedParameters

        self.node, self.robot, self.nodes = node, robot, tuple(nodes)
        self.chunk, self.wait_s = int(chunk), float(wait_s)
        self.pubs = {"poses": node.create_publisher(PoseArray, TOPIC_POSES, stream_qos()),
                     "imu": node.create_publisher(Imu, TOPIC_IMU, stream_qos(100)),
                     "cables": node.create_publisher(JointState, TOPIC_CABLE_STATES, stream_qos()),
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
        node.create_subscription(IdentifiedParameters, IDENTIFIER_PARAMETERS, self._on_params, every_param)
        node.create_subscription(CableCommand, CONTROLLER_COMMANDS, self._on_command, stream_qos(200))

    # ------------------------------------------------------------------ observation
    def _on_diag(self, msg) -> None:
        with self._lock:
            for st in msg.status:
                self.diag[st.name] = {kv.key: kv.value for kv in st.values}

    def _on_params(self, msg) -> None:
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
        return self.sent[topic]

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
                expected = self.valid[t]
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


# ----------------------------------------------------------------------------- the long run
NODE_MODULES = {"identifier": "tensegrity_ros.identifier_node", "mppi_controller": "tensegrity_ros.mppi_controller",
                "mujoco_bridge": "tensegrity_ros.mujoco_bridge"}


def node_parameters(robot_name: str) -> dict:
    """The nodes' settings for a fuzz run (also used by the CI test). The hold-out gate is off
    (``holdout_every: 0``): a fuzz run checks that every message is accounted for and that the
    identifier still publishes, not what the gate decides on a few seconds of data (it
    publishes nothing before 3 held-out blocks, which a loaded machine may not reach)."""
    fast = {"robot": robot_name, "diagnostics_period": 0.02}
    return {"identifier": {**fast, "device": "cpu", "torch_threads": 1, "min_tuples": 10, "max_tuples": 64,
                           "epoch_tuples": 16, "schedule": "implicit_only", "learn": ["cable_stiffness"],
                           "init": "given", "lr_min": 1e-9, "publish_markers": False,
                           "min_publish_interval": 0.0, "holdout_every": 0},
            "mppi_controller": {**fast, "device": "cpu", "torch_threads": 1},
            "mujoco_bridge": {**fast, "pose_rate": 10.0, "marker_rate": 0.0, "real_time_factor": 1.0}}


def _param_arg(key, value) -> str:
    if isinstance(value, (list, tuple)):
        value = "[" + ",".join(str(v) for v in value) + "]"
    elif isinstance(value, bool):
        value = str(value).lower()
    return f"{key}:={value}"


def print_table(accounting: dict, harness: "FuzzHarness", wall_s: float) -> None:
    print(f"{'node/topic':28s} {'sent':>7s} {'received':>8s} {'accepted':>8s} {'expected':>8s} {'rejected':>8s}")
    for n, a in accounting.items():
        for t, r in a["topics"].items():
            exp = "-" if r["expected_accepted"] is None else f"{r['expected_accepted']:.0f}"
            print(f"{n + '/' + t:28s} {r['sent']:7.0f} {r['received']:8.0f} {r['accepted']:8.0f} {exp:>8s} "
                  f"{r['rejected']:8.0f}")
        print(f"  reasons: {', '.join(f'{k} {v:.0f}' for k, v in a['rejection_reasons'].items())}")
    print(f"{sum(harness.sent.values())} messages in {wall_s:.0f} s; controller commands checked: "
          f"{harness.commands_seen}, outside the range: {len(harness.bad_commands)}")


def main(argv=None) -> int:
    import argparse
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import rclpy

    from tensegrity_engine.groundtruth.environments import rest_pose

    from .params import load_robot
    from .sim2sim import clean_dds_shm, ros_env, stop_processes

    ap = argparse.ArgumentParser(description="fuzz the identifier, controller and bridge over DDS")
    ap.add_argument("--robot", default="superball")
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recovery-ticks", type=int, default=60, help="clean 10 Hz ticks after the storm")
    ap.add_argument("--output", default=None, help="write the accounting as JSON here")
    args = ap.parse_args(argv)

    robot = load_robot(args.robot)
    log_dir = Path(tempfile.mkdtemp(prefix="tensegrity_fuzz_"))
    env = ros_env(reserve_domain_id(), str(log_dir))
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE",
                                           "RMW_IMPLEMENTATION", "ROS_LOG_DIR")})
    procs = {}
    for name, params in node_parameters(args.robot).items():
        cmd = [sys.executable, "-m", NODE_MODULES[name]] + remap_args(name)
        for k, v in params.items():
            cmd += ["-p", _param_arg(k, v)]
        procs[name] = subprocess.Popen(cmd, env=env, stdout=open(log_dir / f"{name}.log", "w"),
                                       stderr=subprocess.STDOUT, start_new_session=True)
    rclpy.init()
    node = rclpy.create_node("fuzzer")
    from .common import Spinner

    spinner = Spinner(node)
    problems = ["nodes never became ready"]
    try:
        harness = FuzzHarness(node, robot)
        if harness.wait_ready(120):
            stream = HostileStream(robot, rest_pose(robot)[0], seed=args.seed)
            t0 = time.monotonic()
            harness.send(stream.items(args.messages), progress=lambda k: print(f"  {k} sent", flush=True))
            wall = time.monotonic() - t0
            tuples = harness.value("identifier", "stream_tuples_made")
            epochs = harness.value("identifier", "epochs")
            harness.send(stream.clean(args.recovery_ticks))
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not (
                    harness.value("identifier", "stream_tuples_made") >= tuples + args.recovery_ticks - 10
                    and harness.value("identifier", "epochs") > epochs):
                time.sleep(0.5)
            harness.wait_caught_up(30)
            report = harness.accounting()
            problems = harness.failures(report)
            recovered = {"tuples_after": harness.value("identifier", "stream_tuples_made") - tuples,
                         "epochs_after": harness.value("identifier", "epochs") - epochs,
                         "identifier_parameter_messages": harness.identifier_parameters}
            if recovered["tuples_after"] < args.recovery_ticks - 10 or recovered["epochs_after"] <= 0:
                problems.append(f"no recovery after the storm: {recovered}")
            dead = [n for n, p in procs.items() if p.poll() is not None]
            if dead:
                problems.append(f"processes died: {dead}")
            print_table(report, harness, wall)
            print(f"recovery: {recovered}; processes alive: {[n for n in procs if n not in dead]}")
            if args.output:
                Path(args.output).write_text(json.dumps({"accounting": report, "recovery": recovered,
                                                         "sent": dict(harness.sent), "problems": problems,
                                                         "kinds": {f"{t}/{k}": v for (t, k), v in
                                                                   sorted(harness.kinds.items())}}, indent=1))
    finally:
        spinner.stop()
        node.destroy_node()
        rclpy.try_shutdown()
        stop_processes(list(procs.values()))
        clean_dds_shm()
    for p in problems:
        print(f"FAIL: {p}")
    print("fuzz: " + ("FAILED" if problems else "passed") + f" (node logs in {log_dir})")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
