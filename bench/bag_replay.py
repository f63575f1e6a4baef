"""Bag replay bench (issue 17): the same recording identified live and offline.

    python bench/bag_replay.py [--truth zoo/soft_slow] [--seed 0] [--duration 60] [--rate 1]
                               [--params-file config/robot.yaml] [--out runs/bench_bag]

MuJoCo plays a foreign robot (``--truth``) under the controller's multisine for
``--duration`` s; its noisy, late mocap (the zoo robot's sensor model) and the commands are
written to an MCAP bag as a recorder would have recorded them. Then:

* **live**: an `identifier` process (``--params-file``, as robot.launch.py starts it) gets
  the bag from `tensegrity-play-bag` at ``--rate``; the newest model it published once the
  data is exhausted and its session has finished is its result (the config's values if
  it published none);
* **offline**: `tensegrity-identify-bag` on the same bag and parameter file.

Printed: per learnt parameter the truth, the config, both results and their difference
in units of the offline 1-sigma, and the held-out CoM error 1 s ahead of both results and
of the config on the same held-out blocks.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from online import record  # noqa: E402
from zoo import machine  # noqa: E402

NS = 1_000_000_000


def write_bag(events, robot, path) -> int:
    """The recorded run as a bag: poses and commands stamped and logged at their stamps."""
    from tensegrity_engine.identification.dataset import Trajectory
    from tensegrity_ros.recorder import trajectory_to_bag

    poses = [(t, p) for t, kind, p in events if kind == "pose"]
    cmds = [(t, u) for t, kind, u in events if kind == "cmd"]
    arr = np.array([p for _, p in poses])
    quat = arr[..., 3:] / np.linalg.norm(arr[..., 3:], axis=-1, keepdims=True)
    traj = Trajectory(robot=robot, t=np.array([t for t, _ in poses]) / NS, position=arr[..., :3], quaternion=quat,
                      command_time=np.array([t for t, _ in cmds]) / NS, command=np.array([u for _, u in cmds]))
    return trajectory_to_bag(traj, path, imu=False)


def live(bag, params_file, robot_name, rate, log_dir, timeout) -> tuple[dict, str]:
    """(values of the newest published model, its stage) after the identifier has seen the
    whole bag and finished."""
    from rclpy.executors import SingleThreadedExecutor
    from tensegrity_ros_interfaces.msg import IdentifiedParameters

    from tensegrity_ros import conversions as conv
    from tensegrity_ros.bag_player import play, read_bag
    from tensegrity_ros.common import TOPIC_PARAMS, latched_qos, reserve_domain_id, standalone_node
    from tensegrity_ros.sim2sim import stop_processes

    domain = reserve_domain_id()
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               ROS_LOG_DIR=str(log_dir), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "tensegrity_ros.identifier_node", "--ros-args", "--params-file", str(params_file),
           "-p", f"robot:={robot_name}", "-p", "device:=cpu"]
    log_path = Path(log_dir) / "identifier.log"
    with open(log_path, "w") as log, standalone_node("bench_observer", domain) as node:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        executor = SingleThreadedExecutor(context=node.context)
        executor.add_node(node)
        got = []
        node.create_subscription(IdentifiedParameters, TOPIC_PARAMS, got.append, latched_qos())
        try:
            played = play(read_bag(bag), rate=rate, wait_subscribers=1, domain_id=domain, wait_timeout=120)
            print(f"live: played {sum(played.values())} messages; waiting for the identifier to finish", flush=True)
            deadline = time.monotonic() + timeout
            quiet_since = time.monotonic()
            n = 0
            while time.monotonic() < deadline and proc.poll() is None:
                executor.spin_once(timeout_sec=0.5)
                if len(got) != n:
                    n, quiet_since = len(got), time.monotonic()
                text = log_path.read_text()
                done = "identification converged" in text or "identification final" in text
                if done and time.monotonic() - quiet_since > 10.0:
                    break
        finally:
            stop_processes([proc], timeout=60.0)
    if not got:
        return {}, "none published"
    return conv.msg_to_param_values(got[-1]), got[-1].stage


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--truth", default="zoo/soft_slow")
    ap.add_argument("--robot", default="superball")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--params-file", default=str(ROOT / "config" / "robot.yaml"))
    ap.add_argument("--timeout", type=float, default=900.0, help="wall s the live identifier may take")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from tensegrity_engine.groundtruth.zoo import ground_truth
    from tensegrity_engine.physics.config import load_robot
    from tensegrity_engine.physics.params import PhysicalParameters
    from tensegrity_ros.bag_identify import identify_bag, load_settings

    print(machine(), flush=True)
    robot = load_robot(args.robot)
    z = ground_truth(args.truth, robot)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_bag_"))
    out.mkdir(parents=True, exist_ok=True)
    bag = out / "run.mcap"
    n = write_bag(record(z, args.seed, args.duration, noise="robot"), robot, bag)
    print(f"{args.truth}: {args.duration:g} s recorded, {n} messages in {bag}", flush=True)

    values, _ = load_settings(args.params_file, args.robot)
    t0 = time.monotonic()
    live_values, stage = live(bag, args.params_file, args.robot, args.rate, out, args.timeout)
    print(f"live: {time.monotonic() - t0:.0f} s, last stage {stage!r}", flush=True)
    t0 = time.monotonic()
    offline = identify_bag(bag, robot, values, score={"live": live_values} if live_values else None,
                           log=lambda m: print("offline:", m, flush=True))
    print(f"offline: {time.monotonic() - t0:.0f} s", flush=True)

    truth = PhysicalParameters(z.truth).as_dict()
    config = PhysicalParameters(robot).as_dict()
    accepted = offline["gate"]["accepted"]
    print(f"\noffline gate: {offline['gate']['reason']} (its values would {'' if accepted else 'not '}be published)")
    print(f"{'parameter':26s} {'truth':>10s} {'config':>10s} {'offline':>10s} {'live':>10s} {'diff/sigma':>10s}")
    for name, v in offline["values"].items():
        if name not in offline["sigma"]:
            continue
        off = float(np.mean(v)) if accepted else float(np.mean(config[name]))
        liv = float(np.mean(live_values.get(name, config[name])))
        sig = float(np.mean(offline["sigma"][name]))
        diff = abs(liv - off) / sig if sig > 0 and np.isfinite(sig) else float("nan")
        print(f"{name:26s} {np.mean(truth[name]):10.4g} {np.mean(config[name]):10.4g} {off:10.4g} {liv:10.4g} "
              f"{diff:10.2f}")
    g = offline["gate"]
    lv = offline["scored"].get("live", {})
    print(f"held-out CoM error 1 s ahead (the offline session's held-out blocks): offline "
          f"{g['heldout_com_error'] * 1e3:.1f} mm, live {lv.get('heldout_com_error', float('nan')) * 1e3:.1f} mm, "
          f"config {g['config_com_error'] * 1e3:.1f} mm")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
