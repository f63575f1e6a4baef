"""``tensegrity-track``: rod poses from a folder of depth images, offline, as `camera_tracker`
would have published them live (the same `perception.session.TrackingSession`).

A recording folder (one per camera: several ``--camera`` folders are fitted together,
frame by frame in file order)::

    camera.yaml        width, height, fx, fy, cx, cy; position [3] and orientation [w, x, y, z]
                       of the optical frame (z forward, x right, y down) in the world;
                       optional depth_scale (metres per PNG unit, default 0.001)
    depth/*.npy|*.png  one depth image per frame, in name order: npy float metres, or 16-bit
                       PNG (the RealSense convention: millimetres); NaN / 0 = no return
    times.txt          optional: one capture time (s) per image (else ``--rate``)

and, in the first camera's folder or given explicitly::

    first_pose.yaml    rods: [[x, y, z, qw, qx, qy, qz], ...] at the first image's time
                       (a depth camera cannot tell rods apart: the track starts from it)
    commands.csv       optional: t, u_0 .. u_{A-1} per row, each held from t (the engine
                       motion prior rolls the robot under them; without, constant velocity)

Writes ``--out`` (npz: per frame t, status, rod ends, their 1-sigma, poses, overlap, depth
rms; ``np.load`` reads it), with commands ``--trajectory`` (a trajectory file of the good
frames that ``tensegrity-identify identify`` reads), and ``--overlay DIR`` (every n-th frame
as a PNG: the tracked rods over the depth image, a person's check). Examples::

    tensegrity-track recording/ --out tracked.npz --overlay overlay/
    tensegrity-track --camera left/ --camera right/ --robot three_bar --params identified.yaml \\
        --trajectory tracked_traj.npz
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

DEPTH_SUFFIXES = (".npy", ".png")


class RecordingError(ValueError):
    """A recording folder is malformed."""


def _yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RecordingError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise RecordingError(f"{path}: expected a mapping")
    return data


def load_camera(path: Path):
    """camera.yaml -> (PinholeCamera, depth_scale for PNGs)."""
    import transforms3d

    from tensegrity_engine.perception.camera import PinholeCamera

    d = _yaml(path)
    try:
        q = np.asarray(d["orientation"], dtype=np.float64)
        position = np.asarray(d["position"], dtype=np.float64)
        if q.shape != (4,) or position.shape != (3,) or not np.isfinite(q).all() or abs(np.linalg.norm(q) - 1) > 1e-3:
            raise ValueError("orientation must be a unit quaternion [w, x, y, z], position 3 numbers")
        cam = PinholeCamera(int(d["width"]), int(d["height"]), float(d["fx"]), float(d["fy"]), float(d["cx"]),
                            float(d["cy"]), transforms3d.quaternions.quat2mat(q / np.linalg.norm(q)), position)
        scale = float(d.get("depth_scale", 0.001))
        if not scale > 0:
            raise ValueError("depth_scale must be positive")
    except KeyError as exc:
        raise RecordingError(f"{path}: missing {exc}") from None
    except (TypeError, ValueError) as exc:
        raise RecordingError(f"{path}: {exc}") from None
    return cam, scale


def read_depth(path: Path, scale: float, shape: Optional[tuple] = None) -> np.ndarray:
    """A depth image in metres (NaN = no return), of ``shape`` (H, W) when given."""
    try:
        if path.suffix == ".npy":
            depth = np.load(path, allow_pickle=False)
            if depth.dtype.kind not in "fiu":
                raise RecordingError(f"{path}: a depth image holds numbers, not {depth.dtype}")
            depth = depth.astype(np.float64)
        else:
            from PIL import Image

            with Image.open(path) as im:
                if im.mode not in ("I;16", "I;16B", "I;16L", "I"):
                    raise RecordingError(f"{path}: a depth PNG must be 16-bit single channel, not mode {im.mode}")
                depth = np.asarray(im, dtype=np.float64) * scale
    except (OSError, ValueError) as exc:               # unreadable, truncated, not an image
        if isinstance(exc, RecordingError):
            raise
        raise RecordingError(f"{path}: {exc}") from None
    if depth.ndim != 2:
        raise RecordingError(f"{path}: a depth image is 2-D, got shape {depth.shape}")
    if shape is not None and depth.shape != tuple(shape):
        raise RecordingError(f"{path}: {depth.shape[1]}x{depth.shape[0]} pixels, the camera's are "
                             f"{shape[1]}x{shape[0]}")
    depth[~np.isfinite(depth) | (depth <= 0)] = np.nan
    return depth


def load_camera_folder(folder: Path, rate: Optional[float]):
    """(camera, depth scale, image paths, times)."""
    camera, scale = load_camera(folder / "camera.yaml")
    paths = sorted(p for p in (folder / "depth").glob("*") if p.suffix in DEPTH_SUFFIXES)
    if not paths:
        raise RecordingError(f"{folder / 'depth'}: no .npy or .png depth images")
    times_file = folder / "times.txt"
    if times_file.exists():
        try:
            times = np.loadtxt(times_file, dtype=np.float64, ndmin=1)
        except ValueError as exc:
            raise RecordingError(f"{times_file}: {exc}") from None
        if len(times) != len(paths):
            raise RecordingError(f"{times_file}: {len(times)} times for {len(paths)} images")
    elif rate:
        times = np.arange(len(paths)) / rate
    else:
        raise RecordingError(f"{folder}: no times.txt; give --rate")
    if not np.isfinite(times).all() or np.any(np.diff(times) <= 0):
        raise RecordingError(f"{folder}: image times must be finite and increasing")
    return camera, scale, paths, times


def load_first_pose(path: Path, num_rods: int) -> np.ndarray:
    from tensegrity_engine.physics.state import STATE_DIM

    try:
        rods = np.asarray(_yaml(path).get("rods"), dtype=np.float64)
    except (TypeError, ValueError):                     # missing, ragged, not numbers
        rods = np.zeros(0)
    if rods.shape != (num_rods, 7) or not np.isfinite(rods).all():
        raise RecordingError(f"{path}: rods must be {num_rods} rows of [x, y, z, qw, qx, qy, qz]")
    norms = np.linalg.norm(rods[:, 3:7], axis=-1)
    if np.any(np.abs(norms - 1.0) > 1e-3):
        raise RecordingError(f"{path}: rod orientations must be unit quaternions")
    state = np.zeros((num_rods, STATE_DIM))
    state[:, 0:3], state[:, 3:7] = rods[:, 0:3], rods[:, 3:7] / norms[:, None]
    return state


def load_commands(path: Path, robot) -> tuple[np.ndarray, np.ndarray]:
    """commands.csv -> (times [C], commands [C, A]), checked against the robot."""
    try:
        try:
            table = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2, comments="#")
        except ValueError:                                  # a header row
            table = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2, comments="#", skiprows=1)
    except (OSError, ValueError) as exc:
        raise RecordingError(f"{path}: {exc}") from None
    if table.shape[1] != 1 + robot.num_actuated or not np.isfinite(table).all():
        raise RecordingError(f"{path}: each row must be t and {robot.num_actuated} finite commands")
    if np.any(np.diff(table[:, 0]) <= 0):
        raise RecordingError(f"{path}: command times must increase")
    return table[:, 0], np.clip(table[:, 1:], robot.command_low, robot.command_high)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tensegrity-track", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recording", nargs="?", help="the recording folder (= --camera for one camera)")
    ap.add_argument("--camera", action="append", default=[], help="a camera's folder (repeat for more cameras)")
    ap.add_argument("--robot", default="superball", help="robot config: shipped name or YAML path")
    ap.add_argument("--first-pose", help="first_pose.yaml (default: in the first camera's folder)")
    ap.add_argument("--commands", help="commands.csv (default: in the first camera's folder, if there)")
    ap.add_argument("--params", help="identified parameters YAML for the engine motion prior (default: the config's)")
    ap.add_argument("--prior", choices=["auto", "engine", "velocity"], default="auto",
                    help="motion prior (auto: the engine when there are commands, else constant velocity)")
    ap.add_argument("--rate", type=float, help="frame rate (Hz) when a folder has no times.txt")
    ap.add_argument("--noise", type=float, default=0.001, help="the sensor's depth sigma at 1 m (m; grows with z^2)")
    ap.add_argument("--budget", type=float, default=1.0, help="fitting time per frame (s); offline, take it")
    ap.add_argument("--no-floor", action="store_true", help="no ground plane behind the robot (e.g. hanging)")
    ap.add_argument("--out", help="per-frame result npz (default: tracked.npz in the first camera's folder)")
    ap.add_argument("--trajectory", help="write the good frames as a trajectory file (needs commands)")
    ap.add_argument("--overlay", help="folder for overlay PNGs (the rods over the first camera's depth)")
    ap.add_argument("--overlay-every", type=int, default=10, help="draw every n-th frame (and every lost one)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    return ap


def main(argv=None) -> int:
    from tensegrity_engine.physics.config import ConfigError

    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (RecordingError, FileNotFoundError, ConfigError) as exc:
        print(f"tensegrity-track: {exc}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import torch

    from tensegrity_engine.perception.offline import DepthFrame, held_commands, track_frames
    from tensegrity_engine.perception.overlay import overlay_writer
    from tensegrity_engine.perception.session import TrackingSession
    from tensegrity_engine.perception.tracker import TrackerConfig
    from tensegrity_engine.physics.params import load_representable
    from tensegrity_engine.physics.parameter_files import params_from_file

    torch.set_num_threads(max(1, args.threads))
    folders = [Path(p) for p in ([args.recording] if args.recording else []) + args.camera]
    if not folders:
        raise RecordingError("give a recording folder or --camera folders")
    robot = load_representable(args.robot)
    cams = [load_camera_folder(f, args.rate) for f in folders]
    count = min(len(c[2]) for c in cams)
    if any(len(c[2]) != count for c in cams):
        print(f"cameras have {[len(c[2]) for c in cams]} images: tracking the first {count} of each")
    times = cams[0][3][:count]
    period = float(np.median(np.diff(times))) if count > 1 else 0.1
    for f, c in zip(folders[1:], cams[1:]):           # frames pair by index: their times must agree
        gap = np.abs(c[3][:count] - times).max()
        if gap > 0.5 * period:
            raise RecordingError(f"{f}: its images are up to {gap:.3f} s from the first camera's at the same "
                                 "index: cameras must capture together (times.txt)")
    first = load_first_pose(Path(args.first_pose) if args.first_pose else folders[0] / "first_pose.yaml",
                            robot.num_rods)
    commands_path = Path(args.commands) if args.commands else folders[0] / "commands.csv"
    commands = None
    if args.commands or commands_path.exists():
        from tensegrity_engine.groundtruth.mujoco_twin import nominal_commands

        command_time, command = load_commands(commands_path, robot)
        commands = held_commands(command_time, command, nominal_commands(robot))
    prior = args.prior if args.prior != "auto" else ("engine" if commands is not None else "velocity")
    if prior == "engine" and commands is None:
        raise RecordingError("the engine motion prior needs commands.csv (or use --prior velocity)")
    model = params_from_file(robot, args.params) if args.params else None
    config = TrackerConfig(noise_at_1m=args.noise, time_budget=args.budget)
    session = TrackingSession(robot, [c[0] for c in cams], config, motion_prior=prior, model=model,
                              period=period, floor=None if args.no_floor else "robot")
    frames = (DepthFrame(float(times[i]), [read_depth(c[2][i], c[1], (c[0].height, c[0].width)) for c in cams])
              for i in range(count))
    draw = overlay_writer(args.overlay, args.overlay_every, robot, session) if args.overlay else None
    wall = time.perf_counter()
    log = track_frames(session, frames, first_state=first, first_time=float(times[0]), commands=commands,
                       on_frame=draw)
    out = Path(args.out) if args.out else folders[0] / "tracked.npz"
    log.save(out)
    print(log.summary(time.perf_counter() - wall, f"{len(cams)} camera(s), {prior} prior") + f" -> {out}")
    if args.trajectory:
        if commands is None:
            raise RecordingError("--trajectory needs the commands (commands.csv)")
        from tensegrity_engine.export.tracking import write_tracked_trajectory

        try:
            traj = write_tracked_trajectory(args.trajectory, robot, log, command_time, command,
                                            floor=not args.no_floor,
                                            meta={"prior": prior, "cameras": [str(f) for f in folders]})
        except ValueError as exc:
            raise RecordingError(str(exc)) from None
        print(f"{args.trajectory}: {traj.num_samples} poses from the camera, {len(command_time)} commands")
    return 0 if log.good.any() else 1


if __name__ == "__main__":
    sys.exit(main())
