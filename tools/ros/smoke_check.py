#!/usr/bin/env python3
"""Smoke check for the PyPI ROS 2 wheels + tensegrity_ros_interfaces.

Run with the venv's python (after requirements.txt + build_interfaces.sh):
    python tools/ros/smoke_check.py [--domain-id N] [--json]

Checks, each with a timeout; exits non-zero if any fails:
  (a) cross-process DDS: a child process (its own rclpy context and node)
      echoes every tensegrity_ros_interfaces/CableCommand it receives as a
      geometry_msgs/PoseArray; this process checks the contents and times
      ping-pong round trips.
  (b) latched parameters: the child publishes IdentifiedParameters with
      transient_local durability at start-up; a subscriber created here
      later (late joiner) must still get it.
  (c) throughput: two nodes in this process, each spun by its own
      SingleThreadedExecutor in its own thread, stream PoseArray messages.

Discovery is kept on this host (ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST; the
wheels ignore ROS_LOCALHOST_ONLY) and on a private ROS_DOMAIN_ID (random
unless --domain-id), so parallel runs do not see each other.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

CMD_TOPIC = "smoke/cable_command"
POSE_TOPIC = "smoke/pose_array"
PARAM_TOPIC = "smoke/identified_parameters"
STREAM_TOPIC = "smoke/stream"


def ros_env(domain_id):
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(domain_id)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env.pop("ROS_LOCALHOST_ONLY", None)
    env.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    return env


class Spinner:
    """One SingleThreadedExecutor for one node, spun in its own thread."""

    def __init__(self, node, context):
        from rclpy.executors import SingleThreadedExecutor

        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(node)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"spin-{node.get_name()}", daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=0.05)

    def stop(self):
        self._stop.set()
        self.thread.join(timeout=5.0)
        self.executor.shutdown(timeout_sec=1.0)


def wait_for(pred, timeout, step=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def latched_qos():
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=1,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )


def make_params():
    from tensegrity_ros_interfaces.msg import IdentifiedParameters

    p = IdentifiedParameters()
    p.header.frame_id = "world"
    p.robot_name = "three_bar"
    p.names = ["cable.stiffness", "cable.damping", "rod.mass"]
    p.values = [1234.5, 5.25, 0.125]
    p.lower_bounds = [100.0, 0.0, 0.01]
    p.upper_bounds = [10000.0, 50.0, 1.0]
    p.uncertainty = []
    p.train_loss = 0.0123
    p.validation_loss = 0.0456
    p.stage = "smoke"
    p.engine_dt = 0.001
    p.epoch = 7
    p.tuples_used = 4096
    return p


# ---------------------------------------------------------------------------
# child process: CableCommand -> PoseArray echo + latched parameter publisher
# ---------------------------------------------------------------------------
def run_echo_child():
    import rclpy
    from geometry_msgs.msg import Pose, PoseArray
    from tensegrity_ros_interfaces.msg import CableCommand, IdentifiedParameters

    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("smoke_echo", context=context)
    pose_pub = node.create_publisher(PoseArray, POSE_TOPIC, 100)
    param_pub = node.create_publisher(IdentifiedParameters, PARAM_TOPIC, latched_qos())

    def on_cmd(msg):
        out = PoseArray()
        out.header = msg.header
        for name, length in zip(msg.cable_names, msg.target_rest_lengths):
            pose = Pose()
            pose.position.x = float(length)
            pose.position.y = float(len(name))
            pose.orientation.w = 1.0
            out.poses.append(pose)
        pose_pub.publish(out)

    node.create_subscription(CableCommand, CMD_TOPIC, on_cmd, 100)
    params = make_params()
    params.header.stamp = node.get_clock().now().to_msg()
    param_pub.publish(params)
    spinner = Spinner(node, context)
    print("READY", flush=True)
    # Exit when the parent closes our stdin (or dies).
    try:
        sys.stdin.read()
    finally:
        spinner.stop()
        node.destroy_node()
        rclpy.shutdown(context=context)
    return 0


# ---------------------------------------------------------------------------
# parent checks
# ---------------------------------------------------------------------------
def check_cross_process(node, results, n_roundtrips, timeout):
    """(a) + round-trip latency against the echo child."""
    from geometry_msgs.msg import PoseArray
    from tensegrity_ros_interfaces.msg import CableCommand

    got = []
    cv = threading.Condition()

    def on_pose(msg):
        with cv:
            got.append(msg)
            cv.notify_all()

    node.create_subscription(PoseArray, POSE_TOPIC, on_pose, 100)
    pub = node.create_publisher(CableCommand, CMD_TOPIC, 100)
    t0 = time.monotonic()
    ok = wait_for(lambda: pub.get_subscription_count() > 0 and node.count_publishers(POSE_TOPIC) > 0, timeout)
    results["discovery_s"] = round(time.monotonic() - t0, 3)
    if not ok:
        raise AssertionError(f"echo child not discovered within {timeout}s (domain {os.environ.get('ROS_DOMAIN_ID')})")
    # The child's PoseArray publisher may match our subscriber slightly after
    # our publisher matched its subscriber: retry the first command.
    names = ["cable_0", "cable_10", "c"]
    lengths = [0.25, 0.5, 1.75]

    def send_and_wait(seq, wait):
        cmd = CableCommand()
        cmd.header.frame_id = f"seq{seq}"
        cmd.cable_names = names
        cmd.target_rest_lengths = lengths
        with cv:
            n0 = len(got)
            pub.publish(cmd)
            if not cv.wait_for(lambda: len(got) > n0, timeout=wait):
                return None
            return got[-1]

    reply = None
    deadline = time.monotonic() + timeout
    seq = 0
    while reply is None and time.monotonic() < deadline:
        reply = send_and_wait(seq, 0.5)
        seq += 1
    if reply is None:
        raise AssertionError("no PoseArray reply to CableCommand")
    assert [p.position.x for p in reply.poses] == lengths, reply
    assert [int(p.position.y) for p in reply.poses] == [len(n) for n in names], reply
    assert reply.header.frame_id == f"seq{seq - 1}", reply.header
    with cv:
        got.clear()
    lat = []
    for i in range(n_roundtrips):
        t = time.perf_counter()
        r = send_and_wait(1000 + i, 2.0)
        if r is None:
            raise AssertionError(f"round trip {i} timed out")
        lat.append(time.perf_counter() - t)
    lat.sort()
    results["roundtrips"] = n_roundtrips
    results["roundtrip_ms_p50"] = round(1e3 * lat[len(lat) // 2], 3)
    results["roundtrip_ms_p99"] = round(1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3)
    results["roundtrip_per_s"] = round(n_roundtrips / sum(lat), 1)


def check_latched(context, results, timeout):
    """(b) late-joining transient_local subscriber gets the latched message."""
    import rclpy
    from tensegrity_ros_interfaces.msg import IdentifiedParameters

    time.sleep(0.5)  # make sure the child published well before we join
    node = rclpy.create_node("smoke_late_joiner", context=context)
    got = []
    node.create_subscription(IdentifiedParameters, PARAM_TOPIC, got.append, latched_qos())
    spinner = Spinner(node, context)
    t0 = time.monotonic()
    try:
        ok = wait_for(lambda: len(got) > 0, timeout)
        results["latched_wait_s"] = round(time.monotonic() - t0, 3)
        if not ok:
            raise AssertionError(f"late joiner got no latched IdentifiedParameters within {timeout}s")
        m, ref = got[0], make_params()
        for field in ("robot_name", "stage", "epoch", "tuples_used", "train_loss", "validation_loss", "engine_dt"):
            assert getattr(m, field) == getattr(ref, field), (field, getattr(m, field))
        for field in ("names", "values", "lower_bounds", "upper_bounds", "uncertainty"):
            assert list(getattr(m, field)) == list(getattr(ref, field)), (field, getattr(m, field))
    finally:
        spinner.stop()
        node.destroy_node()


def check_throughput(context, results, seconds, n_poses, min_rate, timeout):
    """(c) PoseArray stream between two nodes, one SingleThreadedExecutor thread each."""
    import rclpy
    from geometry_msgs.msg import Pose, PoseArray
    from rclpy.qos import QoSProfile

    pub_node = rclpy.create_node("smoke_stream_pub", context=context)
    sub_node = rclpy.create_node("smoke_stream_sub", context=context)
    qos = QoSProfile(depth=1000)
    count = [0]

    def on_msg(_msg):
        count[0] += 1

    sub_node.create_subscription(PoseArray, STREAM_TOPIC, on_msg, qos)
    pub = pub_node.create_publisher(PoseArray, STREAM_TOPIC, qos)
    spinners = [Spinner(pub_node, context), Spinner(sub_node, context)]
    try:
        if not wait_for(lambda: pub.get_subscription_count() > 0, timeout):
            raise AssertionError("stream subscriber not matched")
        msg = PoseArray()
        msg.poses = [Pose() for _ in range(n_poses)]
        sent = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            msg.header.frame_id = str(sent)
            pub.publish(msg)
            sent += 1
            if sent % 100 == 0:
                # stay within the subscriber's history so that nothing is
                # dropped on purpose; measures sustained end-to-end rate
                wait_for(lambda s=sent: s - count[0] < 500, 1.0, step=0.0005)
        wait_for(lambda: count[0] >= sent, 2.0)
        dt = time.perf_counter() - t0
        results["stream_poses_per_msg"] = n_poses
        results["stream_sent"] = sent
        results["stream_received"] = count[0]
        results["stream_msgs_per_s"] = round(count[0] / dt, 1)
        if count[0] / dt < min_rate:
            raise AssertionError(f"throughput {count[0] / dt:.0f} msg/s < {min_rate}")
    finally:
        for s in spinners:
            s.stop()
        pub_node.destroy_node()
        sub_node.destroy_node()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: random 1..232)")
    ap.add_argument("--timeout", type=float, default=15.0, help="per-step timeout, s")
    ap.add_argument("--roundtrips", type=int, default=300)
    ap.add_argument("--stream-seconds", type=float, default=2.0)
    ap.add_argument("--stream-poses", type=int, default=12)
    ap.add_argument("--min-rate", type=float, default=200.0, help="min stream msgs/s")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    ap.add_argument("--role", default="main", choices=["main", "echo"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.role == "echo":
        return run_echo_child()

    domain = args.domain_id if args.domain_id is not None else random.randint(1, 232)
    # rcl writes one log file per process to ~/.ros/log unless told otherwise
    log_dir = None
    if not os.environ.get("ROS_LOG_DIR") and not os.environ.get("ROS_HOME"):
        log_dir = tempfile.mkdtemp(prefix="smoke_ros_log_")
        os.environ["ROS_LOG_DIR"] = log_dir
    env = ros_env(domain)
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "RMW_IMPLEMENTATION")})
    os.environ.pop("ROS_LOCALHOST_ONLY", None)

    # hard stop for the whole check
    budget = 6 * args.timeout + args.stream_seconds + 30

    def on_alarm(*_):
        print(f"FAIL: smoke check exceeded {budget:.0f}s", file=sys.stderr, flush=True)
        os._exit(3)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(budget))

    import rclpy

    results = {"domain_id": domain, "rmw": None}
    failures = []
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--role", "echo"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        results["rmw"] = rclpy.get_rmw_implementation_identifier()
        line = [None]
        reader = threading.Thread(target=lambda: line.__setitem__(0, child.stdout.readline()), daemon=True)
        reader.start()
        reader.join(args.timeout)
        if not line[0] or line[0].strip() != "READY":
            raise RuntimeError(f"echo child did not start (rc={child.poll()}, out={line[0]!r})")

        node = rclpy.create_node("smoke_driver", context=context)
        spinner = Spinner(node, context)
        try:
            steps = [
                ("a_cross_process", lambda: check_cross_process(node, results, args.roundtrips, args.timeout)),
                ("b_latched_late_joiner", lambda: check_latched(context, results, args.timeout)),
                (
                    "c_throughput",
                    lambda: check_throughput(
                        context, results, args.stream_seconds, args.stream_poses, args.min_rate, args.timeout
                    ),
                ),
            ]
            for name, fn in steps:
                t0 = time.monotonic()
                try:
                    fn()
                    results[name] = "ok"
                except Exception as exc:  # noqa: BLE001 - report every failing step
                    results[name] = f"FAIL: {exc!r}"
                    failures.append(name)
                results[name + "_s"] = round(time.monotonic() - t0, 3)
        finally:
            spinner.stop()
            node.destroy_node()
    except Exception as exc:  # noqa: BLE001
        results["setup"] = f"FAIL: {exc!r}"
        failures.append("setup")
    finally:
        try:
            child.stdin.close()
            child.wait(timeout=5)
        except Exception:  # noqa: BLE001
            child.kill()
            child.wait()
        results["child_rc"] = child.returncode
        rclpy.shutdown(context=context)
        signal.alarm(0)
        if log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for k, v in results.items():
            print(f"{k}: {v}")
    print("smoke_check:", "FAILED " + ",".join(failures) if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
