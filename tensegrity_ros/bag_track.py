"""tensegrity-track-bag: rod poses from the depth images in a recorded MCAP bag, offline,
with the camera tracker's own code (`tensegrity_engine.perception.session`).

    tensegrity-track-bag run.mcap --robot superball [--out tracked.npz] [--trajectory traj.npz]
                         [--overlay overlay/] [--params identified.yaml] [--budget 1.0]

Reads what `camera_tracker` subscribes to (``recorder`` records these topics): depth
images, CameraInfo, the camera's pose (each image is fitted with the camera pose stamped
at or before it and the intrinsics last received: a tripod carried along is followed), per camera (``--cameras``
namespaces; images within ``--sync-tolerance`` are one frame), the announced first rod
poses (the track starts at the first announcement) and the cable commands (the engine
motion prior's input; the applied-command echo when the bag has it). Every message goes
through the node's decoders and checks; refused ones are counted. Writes the per-frame
result (npz), optionally a trajectory file of the tracked poses with the bag's commands
(``tensegrity-identify identify`` reads it) and overlay PNGs. Offline there is time: the
default fitting budget per frame is 1 s, not the live node's 0.08.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import camera_messages as cm
from . import conversions as conv
from .common import ConfigurationError, TOPIC_COMMAND

TOPIC_APPLIED = "/tensegrity/applied_command"
TOPIC_TYPES = {"depth": "sensor_msgs/msg/Image", "info": "sensor_msgs/msg/CameraInfo",
               "pose": "geometry_msgs/msg/PoseStamped"}
NS = conv.NS


def read_camera_bag(path, robot, *, start: float = 0.0, end=None, namespaces=(cm.CAMERA_NAMESPACE,),
                    sync_tolerance: float = 0.005):
    """(frames [DepthFrame], first rod state [R, 13], its time (s), command times [C],
    commands [C, A], counts of refused messages by reason). Several cameras (topic
    ``namespaces``): images within ``sync_tolerance`` s of each other are one frame."""
    from rclpy.serialization import deserialize_message

    from tensegrity_engine.identification.measurements import pose_problem
    from tensegrity_engine.identification.streaming import StreamConfig
    from tensegrity_engine.perception.offline import DepthFrame

    from .bag_player import _message_type, read_bag

    role = {}
    for k, ns in enumerate(namespaces):
        depth_topic, info_topic, pose_topic = cm.camera_topics(ns)
        role.update({depth_topic: ("depth", k), info_topic: ("info", k), pose_topic: ("pose", k)})
    topics = list(role) + [cm.TOPIC_INITIAL_POSES, TOPIC_COMMAND, TOPIC_APPLIED]
    cable_names = [robot.cable_names[i] for i in robot.actuated_indices]
    types: dict = {}
    refused: dict = {}
    n = len(namespaces)
    info, used = [None] * n, [None] * n
    poses = [cm.StampedHistory() for _ in range(n)]          # an image takes the pose of its stamp
    first = None
    sync = cm.FrameSync(n, int(round(sync_tolerance * NS)))
    frames, matched, commands = [], [], {TOPIC_COMMAND: [], TOPIC_APPLIED: []}

    def refuse(reason):
        refused[reason] = refused.get(reason, 0) + 1

    expected = {t: TOPIC_TYPES[kind] for t, (kind, _) in role.items()}
    expected.update({cm.TOPIC_INITIAL_POSES: "geometry_msgs/msg/PoseArray",
                     TOPIC_COMMAND: "tensegrity_ros_interfaces/msg/CableCommand",
                     TOPIC_APPLIED: "tensegrity_ros_interfaces/msg/CableCommand"})
    checks = StreamConfig(robot.num_rods, robot.num_actuated)
    for m in read_bag(path, topics, start, end):
        if m.datatype != expected[m.topic]:
            refuse("wrong_type")
            continue
        try:
            msg = deserialize_message(m.data, types.setdefault(m.datatype, _message_type(m.datatype)))
        except Exception:  # noqa: BLE001 - bytes that are not the message: counted, never used
            refuse("undecodable")
            continue
        if (problem := conv.header_problem(msg.header)):
            refuse(problem[0])
            continue
        stamp = conv.stamp_ns(msg.header.stamp)
        kind, k = role.get(m.topic, (None, None))
        if kind == "info":
            info[k] = msg
        elif kind == "pose":
            poses[k].add(stamp, msg)
        elif m.topic == cm.TOPIC_INITIAL_POSES:
            if first is None:                   # the node's checks
                arr = conv.pose_array_to_array(msg)
                bad = conv.header_problem(msg.header, "world") or pose_problem(
                    arr, robot.num_rods, max_abs_position=checks.max_abs_position,
                    quat_tolerance=checks.quat_tolerance)
                if bad:
                    refuse("bad_initial_poses")
                else:
                    first = (conv.array_to_rod_state(arr), stamp / NS)
        elif m.topic in commands:
            u, problem = conv.checked_command(msg, cable_names)
            series = commands[m.topic]
            if problem or (series and stamp <= series[-1][0]):
                refuse(problem or "command_out_of_order")
            else:
                series.append((stamp, np.clip(u, robot.command_low, robot.command_high)))
        else:
            pose = poses[k].at(stamp)
            if info[k] is None or pose is None:
                refuse("image_before_camera")
                continue
            new, problem = cm.camera_from_messages(info[k], pose)
            depth, bad = cm.depth_from_msg(msg)
            if problem or bad:
                refuse((problem or bad)[0])
                continue
            if depth.shape != (new.height, new.width):
                refuse("bad_image_size")
                continue
            done, dropped = sync.add(k, stamp, (depth, new))
            for _ in dropped:
                refuse("unmatched")
            matched.extend(done)
    matched.sort(key=lambda item: item[0])           # in time order, then: which frames change a camera
    for t_ns, items in matched:
        cams = [c for _, c in items]
        changed = any(old is None or not old.same_as(c) for old, c in zip(used, cams))
        used = cams if changed else used
        frames.append(DepthFrame(t_ns / NS, [d for d, _ in items], cams if changed else None))
    if first is None:
        raise ValueError(f"{path}: no announced first rod poses on {cm.TOPIC_INITIAL_POSES}: a camera track "
                         "cannot start (a depth camera cannot tell rods apart)")
    if not frames:
        raise ValueError(f"{path}: no usable depth images on {[cm.camera_topics(ns)[0] for ns in namespaces]} "
                         f"(refused: {refused})")
    series = commands[TOPIC_APPLIED] or commands[TOPIC_COMMAND]
    ct = np.array([s for s, _ in series], dtype=np.float64) / NS
    cmd = np.array([u for _, u in series]).reshape(len(series), robot.num_actuated)
    return frames, first[0], first[1], ct, cmd, refused


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tensegrity-track-bag", description=__doc__.split("\n\n")[0])
    ap.add_argument("bag")
    ap.add_argument("--robot", default="superball", help="robot config: shipped name or YAML path")
    ap.add_argument("--params", help="identified parameters YAML for the engine motion prior (default: the config's)")
    ap.add_argument("--prior", choices=["auto", "engine", "velocity"], default="auto",
                    help="auto: the engine when the bag has commands, else constant velocity")
    ap.add_argument("--noise", type=float, default=0.001, help="the sensor's depth sigma at 1 m (m; grows with z^2)")
    ap.add_argument("--budget", type=float, default=1.0, help="fitting time per frame (s)")
    ap.add_argument("--cameras", nargs="+", default=[cm.CAMERA_NAMESPACE],
                    help="topic namespaces of the depth cameras fitted together")
    ap.add_argument("--sync-tolerance", type=float, default=0.005, help="images within this (s) are one frame")
    ap.add_argument("--no-floor", action="store_true", help="no ground plane behind the robot (e.g. hanging)")
    ap.add_argument("--start", type=float, default=0.0, help="s after the bag's first message")
    ap.add_argument("--end", type=float, default=None)
    ap.add_argument("--out", default="tracked.npz", help="per-frame result (npz)")
    ap.add_argument("--trajectory", help="the tracked poses and the bag's commands as a trajectory file")
    ap.add_argument("--overlay", help="folder for overlay PNGs")
    ap.add_argument("--overlay-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args(argv)
    import torch

    from tensegrity_engine.export.tracking import write_tracked_trajectory
    from tensegrity_engine.groundtruth.mujoco_twin import nominal_commands
    from tensegrity_engine.perception.offline import held_commands, track_frames
    from tensegrity_engine.perception.overlay import overlay_writer
    from tensegrity_engine.perception.session import TrackingSession
    from tensegrity_engine.perception.tracker import TrackerConfig
    from tensegrity_engine.physics.parameter_files import params_from_file

    from .params import load_robot

    torch.set_num_threads(max(1, args.threads))
    try:
        robot = load_robot(args.robot)
        frames, first, first_t, ct, cmd, refused = read_camera_bag(args.bag, robot, start=args.start, end=args.end,
                                                                    namespaces=args.cameras,
                                                                    sync_tolerance=args.sync_tolerance)
        commands = held_commands(ct, cmd, nominal_commands(robot)) if len(ct) else None
        prior = args.prior if args.prior != "auto" else ("engine" if commands is not None else "velocity")
        if prior == "engine" and commands is None:
            raise ValueError(f"{args.bag}: no cable commands: the engine motion prior needs them (--prior velocity)")
        model = params_from_file(robot, args.params) if args.params else None
        period = float(np.median(np.diff([f.t for f in frames]))) if len(frames) > 1 else 0.1
        session = TrackingSession(robot, frames[0].cameras, TrackerConfig(noise_at_1m=args.noise,
                                                                          time_budget=args.budget),
                                  motion_prior=prior, model=model, period=period,
                                  floor=None if args.no_floor else "robot")
    except (ConfigurationError, FileNotFoundError, ValueError) as exc:
        print(f"tensegrity-track-bag: {exc}", file=sys.stderr)
        return 2
    if refused:
        print("refused messages: " + ", ".join(f"{k} {v}" for k, v in sorted(refused.items())))
    draw = overlay_writer(args.overlay, args.overlay_every, robot, session) if args.overlay else None
    wall = time.perf_counter()
    log = track_frames(session, frames, first_state=first, first_time=first_t, commands=commands, on_frame=draw)
    log.save(args.out)
    print(log.summary(time.perf_counter() - wall, f"{args.bag}, {prior} prior") + f" -> {args.out}")
    if args.trajectory:
        if commands is None:
            print("tensegrity-track-bag: no trajectory: the bag has no cable commands", file=sys.stderr)
            return 2
        try:
            traj = write_tracked_trajectory(args.trajectory, robot, log, ct, cmd, floor=not args.no_floor,
                                            meta={"prior": prior, "bag": args.bag})
        except ValueError as exc:
            print(f"tensegrity-track-bag: {exc}", file=sys.stderr)
            return 2
        print(f"{args.trajectory}: {traj.num_samples} poses from the camera, {len(ct)} commands")
    return 0 if log.good.any() else 1


if __name__ == "__main__":
    raise SystemExit(main())
