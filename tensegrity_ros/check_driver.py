"""tensegrity-check-driver: listen to a running robot driver and report what breaks the
contract of docs/driver_contract.md (exit 0: none, 1: violations, 2: bad arguments).

    tensegrity-check-driver --robot superball --duration 10
    tensegrity-check-driver --robot my_robot.yaml --rate 20 --poses-topic /mocap/rods

It only listens: it never commands the robot.
"""
from __future__ import annotations

import argparse
import sys
import time

from .common import TOPIC_COMMAND, TOPIC_IMU, TOPIC_POSES, ConfigurationError, ShutdownRequest

OWN_NODES = {"identifier", "mppi_controller", "recorder", "driver_check"}


def listen(robot, args):
    """Subscribe for ``args.duration`` s; the filled `DriverContractCheck` and graph facts."""
    from geometry_msgs.msg import PoseArray
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Imu

    from . import conversions as conv
    from .common import standalone_node
    from .driver_contract import DriverContractCheck

    check = DriverContractCheck(robot, rate=args.rate, frame=args.frame)
    with standalone_node("driver_check", getattr(args, "domain_id", None)) as node:
        clock = node.get_clock()

        def on_pose(msg):
            check.add_pose(conv.stamp_ns(msg.header.stamp), clock.now().nanoseconds, msg.header.frame_id,
                           conv.pose_array_to_array(msg))

        def on_imu(msg):
            rod, w, q = conv.imu_to_arrays(msg)
            check.add_imu(conv.stamp_ns(msg.header.stamp), rod, w, q)

        # best effort hears reliable and best-effort publishers alike (QoS is judged from the graph)
        hear_all = QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT)
        node.create_subscription(PoseArray, args.poses_topic, on_pose, hear_all)
        node.create_subscription(Imu, args.imu_topic, on_imu, hear_all)
        executor = SingleThreadedExecutor(context=node.context)
        executor.add_node(node)
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline and not ShutdownRequest.event.is_set():
            executor.spin_once(timeout_sec=0.05)
        reliable = [p.qos_profile.reliability == ReliabilityPolicy.RELIABLE
                    for p in node.get_publishers_info_by_topic(args.poses_topic)]
        consumers = [s.node_name for s in node.get_subscriptions_info_by_topic(args.command_topic)
                     if s.node_name not in OWN_NODES]
        return check, reliable, consumers


def main(argv=None) -> int:
    ShutdownRequest.install()
    ap = argparse.ArgumentParser(prog="tensegrity-check-driver", description=__doc__.split("\n\n")[0])
    ap.add_argument("--robot", default="superball", help="robot YAML: shipped name or path")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds to listen")
    ap.add_argument("--rate", type=float, default=10.0, help="the pose rate the identifier expects (Hz)")
    ap.add_argument("--frame", default="world", help="the pose frame the nodes expect")
    ap.add_argument("--poses-topic", default=TOPIC_POSES)
    ap.add_argument("--imu-topic", default=TOPIC_IMU)
    ap.add_argument("--command-topic", default=TOPIC_COMMAND)
    args = ap.parse_args(argv)
    if not (args.duration > 0 and args.rate > 0):
        ap.error("--duration and --rate must be > 0")
    from .params import load_robot

    try:
        robot = load_robot(args.robot)
    except ConfigurationError as exc:
        print(f"tensegrity-check-driver: {exc}", file=sys.stderr)
        return 2
    print(f"listening {args.duration:g} s for {robot.name} ({robot.num_rods} rods) on {args.poses_topic}, "
          f"{args.imu_topic}; consumers of {args.command_topic}", flush=True)
    check, reliable, consumers = listen(robot, args)
    findings = check.report(reliable, consumers)
    for f in findings:
        print(f)
    bad = sum(f.level == "violation" for f in findings)
    print(f"{len(check.poses)} pose arrays, {bad} violations, "
          f"{sum(f.level == 'warning' for f in findings)} warnings")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
