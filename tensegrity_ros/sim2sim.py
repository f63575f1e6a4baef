"""tensegrity-sim2sim: the sim2sim run without ros2 launch.

Starts mujoco_bridge, identifier and mppi_controller as subprocesses with the same
config/sim2sim.yaml the launch file uses (on a private ROS_DOMAIN_ID, discovery on this
host), publishes the goal, watches the topics from an in-process monitor node, and when
the controller has rolled the robot for ``rolling_duration`` sim seconds with the
identified model (or ``wall_timeout`` passed) stops everything, cleans DDS shared memory,
prints a summary (identified vs true parameters, achieved velocity) and writes plots and
summary.json to the output directory.

    tensegrity-sim2sim [--config sim2sim] [--rolling-duration 10] [--output-dir runs/sim2sim]
                       [--device auto] [--checkpoint-dir DIR] [--domain-id N]
"""
from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional
from pathlib import Path

import numpy as np
import yaml

from .common import reserve_domain_id

NODES = (("mujoco_bridge", "tensegrity_ros.mujoco_bridge"),
         ("identifier", "tensegrity_ros.identifier_node"),
         ("mppi_controller", "tensegrity_ros.mppi_controller"))


def ros_env(domain_id: int, log_dir: str) -> dict:
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(domain_id)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env.pop("ROS_LOCALHOST_ONLY", None)
    env.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    env["ROS_LOG_DIR"] = log_dir
    env["PYTHONUNBUFFERED"] = "1"
    return env


def clean_dds_shm() -> None:
    """Remove Fast DDS shared-memory files that dead processes left in /dev/shm
    (`fastdds shm clean` only removes segments no live process holds)."""
    # the `fastdds` wrapper runs `python3` from PATH; run its script with this Python
    # (psutil is needed) when it is where the ROS wheels put it
    script = Path(sys.prefix) / "tools" / "fastdds" / "fastdds.py"
    if script.exists():
        cmd = [sys.executable, str(script), "shm", "clean"]
    elif shutil.which("fastdds"):
        cmd = [shutil.which("fastdds"), "shm", "clean"]
    else:
        return
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    try:
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired):
        pass
    _remove_unmapped_port_segments()


def _remove_unmapped_port_segments(min_age_s: float = 10.0) -> None:
    """`fastdds shm clean` leaves the per-port segments (fastdds_portNNNN and their
    sem.*_mutex) of dead participants; remove those that no live process maps."""
    shm = Path("/dev/shm")
    files = [f for f in shm.glob("fastdds_port*")] + [f for f in shm.glob("sem.fastdds_port*")]
    if not files:
        return
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            for line in maps.read_text().splitlines():
                if "/dev/shm/" in line:
                    mapped.add(line.rsplit("/dev/shm/", 1)[1].split()[0])
        except OSError:
            continue
    now = time.time()
    for f in files:
        base = f.name[len("sem."):] if f.name.startswith("sem.") else f.name
        port = base.replace("_mutex", "").replace("_el", "")
        if any(m == f.name or m.startswith(port) for m in mapped):
            continue
        try:
            if now - f.stat().st_mtime >= min_age_s:
                f.unlink()
        except OSError:
            pass


STALL_TIMEOUT = 30.0    # wall s without a new pose (a lost track, a dead driver): the run is over
TRUTH_TOPIC = "/sim2sim/true_rod_poses"   # with the camera: the bridge's own poses, to score the tracker


def start_node(module: str, params_file: str, env: dict, log_path: Path, overrides=(), remaps=()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", module, "--ros-args", "--params-file", params_file]
    for k, v in overrides:
        cmd += ["-p", f"{k}:={v}"]
    for a, b in remaps:
        cmd += ["-r", f"{a}:={b}"]
    fh = open(log_path, "w")
    return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def stop_processes(procs, timeout: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Monitor:
    """In-process observer node: records poses / parameters / controller mode; publishes the goal."""

    def __init__(self, robot, goal, truth_topic: Optional[str] = None):
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from geometry_msgs.msg import PoseArray, Vector3Stamped
        from tensegrity_ros_interfaces.msg import CableCommand, IdentifiedParameters

        from . import conversions as conv
        from .common import (TOPIC_COMMAND, TOPIC_GOAL, TOPIC_PARAMS, TOPIC_POSES, Spinner,
                             goal_qos, latched_qos, stream_qos)

        from tensegrity_engine.groundtruth.environments import lowest_point
        from tensegrity_engine.physics.state import center_of_mass

        self.conv = conv
        self.lowest_point, self.center_of_mass = lowest_point, center_of_mass
        self.robot = robot
        self.context = rclpy.Context()
        # args=[]: the runner's own command line (its -p node:name:=value overrides) is not
        # rcl's (rcl read them as old-style remap rules and warned)
        rclpy.init(args=[], context=self.context)
        self.node = rclpy.create_node("sim2sim_monitor", context=self.context)
        self.lock = threading.Lock()
        self.pose_t, self.com, self.lowest = [], [], []     # lowest: the lowest capsule point (m)
        self.params = []            # (t_sim, stage, {name: values}, val_loss, {name: 1-sigma},
        #                             (held-out CoM error 1 s ahead, the replaced model's))
        self.commands = []          # (t, [A])
        self.structure = None       # the newest message's (integrator, contact_condim)
        self.mode = "unknown"
        self.mode_switch_t = None
        self.last_pose_t = 0.0
        self.diag = {}
        self.scored = bool(truth_topic)
        self.seen = {}              # with a truth topic: stamp (ns) -> published rod poses [R, 7]
        self.truth = {}             # stamp (ns) -> the true rod poses [R, 7]
        n = self.node
        n.create_subscription(PoseArray, TOPIC_POSES, self._on_pose, stream_qos())
        if truth_topic:
            n.create_subscription(PoseArray, truth_topic, self._on_truth, stream_qos())
        n.create_subscription(IdentifiedParameters, TOPIC_PARAMS, self._on_params, latched_qos())
        n.create_subscription(CableCommand, TOPIC_COMMAND, self._on_cmd, stream_qos())
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        self.goal_pub = n.create_publisher(Vector3Stamped, TOPIC_GOAL, goal_qos())
        g = Vector3Stamped()
        g.header.frame_id = "world"
        g.vector.x, g.vector.y = float(goal[0]), float(goal[1])
        self.goal_pub.publish(g)
        self.spinner = Spinner(n, self.context)

    def _on_pose(self, msg):
        arr = self.conv.pose_array_to_array(msg)
        if arr.shape[0] != self.robot.num_rods or not np.isfinite(arr).all():
            return
        stamp = self.conv.stamp_ns(msg.header.stamp)
        low = self.lowest_point(self.robot, self.conv.array_to_rod_state(arr)) - self.robot.contact.ground_height
        with self.lock:
            self.pose_t.append(stamp / 1e9)
            self.com.append(self.center_of_mass(arr, self.robot.rod_mass))
            self.lowest.append(low)
            self.last_pose_t = stamp / 1e9
            if self.scored:
                self.seen[stamp] = arr

    def _on_truth(self, msg):
        arr = self.conv.pose_array_to_array(msg)
        if arr.shape[0] == self.robot.num_rods and np.isfinite(arr).all():
            with self.lock:
                self.truth[self.conv.stamp_ns(msg.header.stamp)] = arr

    def _on_params(self, msg):
        try:
            values = self.conv.msg_to_params(msg, self.robot).as_dict()
        except ValueError as exc:      # ParameterError: not a model of this robot
            print(f"sim2sim monitor: parameters rejected ({exc})", flush=True)
            return
        try:
            sigmas = self.conv.msg_to_sigmas(msg)
        except ValueError as exc:
            print(f"sim2sim monitor: uncertainty rejected ({exc})", flush=True)
            sigmas = {}
        with self.lock:
            self.structure = (str(msg.integrator), int(msg.contact_condim))
            self.params.append((self.last_pose_t, msg.stage, {k: np.asarray(v) for k, v in values.items()},
                                float(msg.validation_loss), sigmas,
                                (float(msg.heldout_com_error), float(msg.replaced_com_error))))

    def _on_cmd(self, msg):
        with self.lock:
            self.commands.append((self.conv.stamp_ns(msg.header.stamp) / 1e9, list(msg.target_rest_lengths)))

    def _on_diag(self, msg):
        for st in msg.status:
            vals = {kv.key: kv.value for kv in st.values}
            with self.lock:
                self.diag[st.name] = vals
                if st.name == "mppi_controller" and vals.get("mode") == "mppi" and self.mode_switch_t is None:
                    self.mode_switch_t = self.last_pose_t
                if st.name == "mppi_controller":
                    self.mode = vals.get("mode", self.mode)

    def close(self):
        import rclpy

        self.spinner.stop()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def realtime_figures(mon, rolling_start, period: float) -> dict:
    """What a robot that cannot pause would feel: command period jitter (stamps), commands
    the identifier refused as late, ticks the controller missed, late plans, how early
    commands reached the robot, and how much of the rolling the robot was airborne."""
    out = {}
    stamps = np.array([c[0] for c in mon.commands])
    if rolling_start is not None:
        stamps = stamps[stamps >= rolling_start]
    if len(stamps) > 2:
        jitter = np.abs(np.diff(stamps) - period)
        out["command_period_jitter_p99_ms"] = float(np.percentile(jitter, 99) * 1e3)
    ident, ctrl, bridge = (mon.diag.get(n, {}) for n in ("identifier", "mppi_controller", "mujoco_bridge"))
    num = lambda d, k: float(d.get(k, 0) or 0)
    out["late_command_rejections"] = num(ident, "rejected_late_command")
    out["controller_ticks_missed"] = num(ctrl, "ticks_missed")
    out["controller_commands_late"] = num(ctrl, "commands_late")
    for key in ("command_lead_ms_median", "command_lead_ms_min", "commands_arrived_late"):
        if key in bridge:
            out[key] = num(bridge, key)
    if bridge.get("commands_late_at"):
        out["commands_late_at"] = str(bridge["commands_late_at"])
    t, low = np.array(mon.pose_t), np.array(mon.lowest)
    if rolling_start is not None and len(t):
        sel = t >= rolling_start
        if sel.any():
            out["airborne_fraction"] = float((low[sel] > 0.01).mean())
    return out


def true_values(robot, robot_truth: str = "twin") -> dict:
    """The values of the robot the bridge plays (``robot_truth``: twin, twin/<name>, zoo/<name>,
    random/<seed> or a YAML)."""
    from tensegrity_engine.groundtruth.zoo import RANDOM_PREFIX, ZOO_PREFIX, ground_truth
    from tensegrity_engine.physics.params import nominal_values

    played = ground_truth(robot_truth, robot)
    # a zoo robot's contacts are MuJoCo's own: no engine value is "true" for them
    foreign = robot_truth.startswith((ZOO_PREFIX, RANDOM_PREFIX))
    values = played.true_values() if foreign else nominal_values(played.truth)
    return {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}


WEIGHED_FILE = "robot_weighed.yaml"
# the nodes that model the robot: with a robot_truth other than the config's twin they get
# the YAML its builder would write (`weighed_robot_file`)
MODEL_NODES = ("identifier", "mppi_controller", "camera_tracker")
# The runner's own section of the parameter file (``sim2sim: ros__parameters:``)
RUN_SETTINGS = ("rolling_duration", "wall_timeout", "goal_vx", "goal_vy", "output_dir", "pose_source", "cameras",
                "weigh_rods")


def weighed_robot_file(robot, robot_truth: str, out_dir: Path) -> Optional[Path]:
    """The robot YAML the played robot's builder would write (`ZooRobot.weighed`: the
    config with the rods' weighed masses and measured radii), written to ``out_dir`` for the
    nodes that model the robot; None where that is the config itself (the twin). Without it
    a zoo robot whose rods are 1.3x the config's is identified per unit of the wrong mass,
    and poses alone cannot tell (`identification.scale`)."""
    from tensegrity_engine.groundtruth.zoo import ground_truth
    from tensegrity_engine.physics.config import robot_to_yaml

    weighed = ground_truth(robot_truth, robot).weighed()
    if np.array_equal(weighed.rod_mass, robot.rod_mass) and np.array_equal(weighed.rod_radius, robot.rod_radius):
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / WEIGHED_FILE
    path.write_text("# written by tensegrity-sim2sim: the config with the played robot's rods weighed and "
                    f"measured ({robot_truth})\n" + robot_to_yaml(weighed))
    return path


def launch_robot(params_file: str, node: str, robot: str = "") -> str:
    """``node``'s ``robot`` under sim2sim.launch.py. ``robot`` (the launch argument; '': none)
    is the played robot's YAML for the bridge and every node that models it; otherwise each
    node's own from the parameter file. A node that models the robot gets, where the run's
    ``weigh_rods`` is on and the bridge plays another robot than the config's twin, the
    weighed robot's YAML instead (`weighed_robot_file`, in a fresh temporary folder)."""
    data = yaml.safe_load(Path(params_file).read_text()) or {}
    bridge = (data.get("mujoco_bridge") or {}).get("ros__parameters", {})
    played = robot or str(bridge.get("robot", "superball"))
    own = robot or str(((data.get(node) or {}).get("ros__parameters", {})).get("robot", played))
    if node == "mujoco_bridge" or not bool(((data.get("sim2sim") or {}).get("ros__parameters", {})).get("weigh_rods", True)):
        return own
    path = _launch_weighed_file(played, str(bridge.get("robot_truth", "twin")))
    return own if path is None else str(path)


@functools.lru_cache(maxsize=None)
def _launch_weighed_file(robot_name: str, robot_truth: str) -> Optional[Path]:
    """`weighed_robot_file` once per launch for all the nodes that model the robot, in a
    folder removed when the launch process exits (the nodes read it when they start)."""
    from .params import load_robot

    folder = Path(tempfile.mkdtemp(prefix="sim2sim_weighed_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return weighed_robot_file(load_robot(robot_name), robot_truth, folder)


def true_com(robot, mon: Monitor) -> tuple[np.ndarray, np.ndarray]:
    """(stamps (s), CoM [N, 3]) of the true rod poses the monitor heard (none without a truth topic)."""
    with mon.lock:
        stamps = sorted(mon.truth)
        poses = [mon.truth[k] for k in stamps]
    if not stamps:
        return np.zeros(0), np.zeros((0, 3))
    return np.array(stamps) / 1e9, mon.center_of_mass(np.stack(poses), robot.rod_mass)


def tracking_figures(robot, mon: Monitor, rolling_start) -> dict:
    """With a truth topic (the camera in the loop): the published rod poses against the true
    ones at the same stamps, while MPPI rolls (all of the run before it), and the velocity
    measured on the true poses."""
    from tensegrity_engine.physics.state import end_nodes, rod_pose_errors

    with mon.lock:
        common = sorted(set(mon.seen) & set(mon.truth))
        seen = [mon.seen[k] for k in common]
        true = [mon.truth[k] for k in common]
    if not common:
        return {}
    t = np.array(common) / 1e9
    half = robot.rod_length / 2
    est = end_nodes(np.stack([mon.conv.array_to_rod_state(a) for a in seen]), half)
    ref = end_nodes(np.stack([mon.conv.array_to_rod_state(a) for a in true]), half)
    centre, _, axis = rod_pose_errors(est, ref)                                  # [F, R] each
    sel = t >= rolling_start if rolling_start is not None and (t >= rolling_start).sum() > 1 else np.ones_like(t, bool)
    out = {"tracking_poses_scored": int(sel.sum()), "tracking_centre_mm_median": float(1e3 * np.median(centre[sel])),
           "tracking_centre_mm_p90": float(1e3 * np.percentile(centre[sel], 90)),
           "tracking_axis_deg_median": float(np.median(axis[sel]))}
    truth_t, truth_com = true_com(robot, mon)
    if rolling_start is not None and len(truth_t):
        keep = truth_t >= rolling_start
        if keep.sum() > 1:
            com, tt = truth_com[keep], truth_t[keep]
            out["true_vx"] = float((com[-1, 0] - com[0, 0]) / (tt[-1] - tt[0]))
    return out


def summary_learn(learn, robot) -> Optional[list]:
    """The identifier's ``learn`` parameter as the names the trainer resolves for the robot's
    contact law; None (every published value) for none or ``[default]``."""
    if not learn or list(learn) == ["default"]:
        return None
    from tensegrity_engine.identification.config import resolve_learn
    return list(resolve_learn(learn, robot.contact.law))


def lacks_limit(name: str, truth: dict) -> bool:
    """The robot has no such limit: its winches' true top speed is the default (none). Then
    there is no value to reach: any value above what the motion reaches predicts the same."""
    from tensegrity_engine.physics.config import DEFAULT_MAX_SPEED
    return name == "actuator_max_speed" and name in truth and float(np.mean(truth[name])) >= DEFAULT_MAX_SPEED


def parameter_rows(published: list, truth: dict, config: dict, learn,
                   tolerance: float = 0.05) -> tuple[list, Optional[float]]:
    """Each learnt value with a true one, from the published messages ``(t, stage, values, loss,
    sigma, ...)``: true, config, first and last published, 1-sigma, errors; and the sim time
    from which every published value (limits aside) stays within ``tolerance`` of the truth."""
    from tensegrity_engine.identification.uncertainty import element_mean_sigma, elements_covered
    from tensegrity_engine.physics.params import SPEC_BY_NAME
    final = published[-1] if published else None
    start_vals = published[0][2] if published else None
    rows = []
    if final is not None:
        for name in learn or sorted(final[2]):
            if name not in final[2] or name not in truth:     # no true value (a zoo robot's contacts)
                continue
            got = float(np.mean(final[2][name]))
            ref = float(np.mean(truth[name]))
            first = float(np.mean(start_vals[name])) if start_vals and name in start_vals else float("nan")
            # per-element values: the row is their mean, its sigma the most their correlations allow
            sig = np.asarray(final[4].get(name, [np.nan]), dtype=np.float64)
            sigma = element_mean_sigma(sig)
            nominal = float(np.mean(config[name])) if name in config else float("nan")
            limit = bool(SPEC_BY_NAME[name].limit) if name in SPEC_BY_NAME else False
            unlimited = lacks_limit(name, truth)        # no error to give against "none"
            rows.append({"name": name, "true": ref, "identified": got, "sigma": sigma, "first_published": first,
                         "rel_error": None if unlimited else abs(got - ref) / abs(ref), "config": nominal,
                         "config_rel_error": None if unlimited else abs(nominal - ref) / abs(ref),
                         "limit": limit, "unlimited": unlimited,
                         "elements_covered": elements_covered(final[2][name], truth[name], sig)})
    return rows, time_within(published, truth, rows, tolerance)


def time_within(published: list, truth: dict, rows: list, tolerance: float) -> Optional[float]:
    """The sim time from which every scored value of ``rows`` (`parameter_rows`; limits aside)
    stays within ``tolerance`` of the truth in the ``published`` messages (None: never, or
    nothing scored)."""
    # a limit is not waited for (as the node's 'converged'): its sigma is one-sided
    names = [r["name"] for r in rows if not r["limit"]]
    if not names:
        return None
    within = None
    for entry in published:
        ok = all(abs(np.mean(entry[2][n]) / np.mean(truth[n]) - 1.0) <= tolerance for n in names if n in entry[2])
        within = (within if within is not None else entry[0]) if ok else None
    return within


def published_structure(model, structure) -> Optional[dict]:
    """The structure a message's values were fitted in (its ``integrator`` and
    ``contact_condim``: empty / 0 keep the consumer's own, > 0 is the soft law) on the nodes'
    robot ``model``, and whether it differs from the robot YAML's (adopted online)."""
    if structure is None:
        return None
    from tensegrity_engine.identification.online_structure import structure_key

    from .conversions import in_message_structure

    def fields(key):
        return {"integrator": key[0], "contact_law": key[1], "condim": key[2]}

    key, own = structure_key(in_message_structure(model, *structure)), structure_key(model)
    return {**fields(key), "adopted_online": key != own, "yaml": fields(own)}


def summarize(robot, mon: Monitor, rolling_start, out_dir: Path, wall_s: float, learn,
              robot_truth: str = "twin", period: float = 0.1, model=None) -> dict:
    """``robot`` the config the truth is built from, ``model`` the config the nodes had (its
    rods weighed, `weighed_robot_file`; default ``robot``)."""
    model = robot if model is None else model
    t = np.array(mon.pose_t)
    com = np.array(mon.com) if mon.com else np.zeros((0, 3))
    truth = true_values(robot, robot_truth)
    from tensegrity_engine.physics.params import nominal_values
    config = nominal_values(model)          # what the user had before identifying: beside the result
    final = mon.params[-1] if mon.params else None
    rows, within = parameter_rows(mon.params, truth, config, learn)
    # the targets: 5 % from a noise-free mocap, 10 % from a noisy one
    within_10 = time_within(mon.params, truth, rows, 0.10)
    from tensegrity_engine.groundtruth.zoo import ground_truth
    summary = {"robot_truth": robot_truth, "robot_description": ground_truth(robot_truth, robot).description,
               "within_5_percent_from_sim_t": within, "within_10_percent_from_sim_t": within_10,
               "heldout_com_error_1s": final[5][0] if final else None,
               "replaced_com_error_1s": final[5][1] if final else None,
               "config_com_error_1s": published_config_com_error(mon), "wall_seconds": round(wall_s, 1),
               "sim_seconds": float(t[-1] - t[0]) if len(t) > 1 else 0.0,
               "poses": int(len(t)), "parameters_published": len(mon.params),
               "final_stage": final[1] if final else None, "parameters": rows,
               "refused_candidate": refused_candidate(mon, truth),
               "mppi_start_sim_t": rolling_start, "per_unit_mass": per_unit_mass(rows, truth, config),
               "published_structure": published_structure(model, mon.structure),
               "sigma_state": identifier_diagnostic(mon, "uncertainty"),
               "identifier_worker": identifier_diagnostic(mon, "worker_compute")}
    if len(t) > 1:
        summary["pose_rate_sim_hz"] = float((len(t) - 1) / (t[-1] - t[0]))
    if rolling_start is not None and len(t) > 1:
        sel = t >= rolling_start
        if sel.sum() > 1:
            tt, cc = t[sel], com[sel]
            summary["rolling_sim_seconds"] = float(tt[-1] - tt[0])
            summary["rolling_distance_x"] = float(cc[-1, 0] - cc[0, 0])
            summary["achieved_vx"] = float((cc[-1, 0] - cc[0, 0]) / (tt[-1] - tt[0]))
            summary["achieved_vy"] = float((cc[-1, 1] - cc[0, 1]) / (tt[-1] - tt[0]))
    if len(t) > 1:
        summary["excitation_drift_m"] = float(np.linalg.norm(
            com[(t < rolling_start) if rolling_start else slice(None)][-1, :2] - com[0, :2])) \
            if (rolling_start is None or (t < rolling_start).any()) else 0.0
    summary.update(realtime_figures(mon, rolling_start, period))
    summary.update(tracking_figures(model, mon, rolling_start))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    t_true, com_true = true_com(model, mon)                # the camera in the loop: the true CoM too
    extra = {"t_true": t_true, "com_true": com_true} if len(t_true) else {}
    np.savez(out_dir / "trajectory.npz", t=t, com=com, **extra)
    try:
        _plots(mon, robot, truth, rolling_start, out_dir, learn)
        summary["plots"] = str(out_dir / "sim2sim.png")
    except Exception as exc:  # noqa: BLE001 - plots are a bonus
        summary["plots_error"] = repr(exc)
    return summary


def _plots(mon, robot, truth, rolling_start, out_dir: Path, learn) -> None:
    import matplotlib
    from tensegrity_engine.identification.uncertainty import element_mean_sigma

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array(mon.pose_t)
    com = np.array(mon.com)
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    ax[0, 0].plot(com[:, 0], com[:, 1])
    ax[0, 0].set(xlabel="x (m)", ylabel="y (m)", title="CoM path (measured poses)")
    ax[0, 0].axis("equal")
    if len(t) > 3:
        v = np.diff(com[:, 0]) / np.diff(t)
        k = 5
        vs = np.convolve(v, np.ones(k) / k, mode="same")
        ax[0, 1].plot(t[1:], vs, label="CoM vx (0.5 s mean)")
        ax[0, 1].axhline(1.0, color="k", ls="--", lw=0.8, label="goal")
    if rolling_start is not None:
        for a in (ax[0, 1], ax[1, 0], ax[1, 1]):
            a.axvline(rolling_start, color="r", lw=0.8)
    ax[0, 1].set(xlabel="sim time (s)", ylabel="m/s", title="velocity (red: MPPI starts)")
    ax[0, 1].legend()
    if mon.params:
        pt = np.array([p[0] for p in mon.params])
        names = [n for n in (learn or []) if n in mon.params[-1][2] and n in truth
                 and not lacks_limit(n, truth)][:4]
        for n in names:
            ref = np.mean(truth[n])
            vals = np.array([np.mean(p[2][n]) for p in mon.params]) / ref
            line, = ax[1, 0].semilogy(pt, vals, marker=".", label=n)
            sig = np.array([element_mean_sigma(p[4].get(n, [np.nan])) for p in mon.params]) / ref
            band = np.isfinite(sig)
            if band.any():          # 1-sigma band (floored so the log axis can draw it)
                ax[1, 0].fill_between(pt[band], np.maximum(vals[band] - sig[band], 1e-3 * vals[band]),
                                      vals[band] + sig[band], color=line.get_color(), alpha=0.2, lw=0)
        ax[1, 0].axhline(1.0, color="k", ls="--", lw=0.8)
        ax[1, 0].set(xlabel="sim time (s)", ylabel="identified / true (band: 1 sigma)",
                     title="identified parameters")
        ax[1, 0].legend(fontsize=7)
        # the gate's yardstick at each publication, in mm (the message's loss is normalised)
        for k, label in ((0, "published model"), (1, "the model it replaced")):
            ax[1, 1].plot(pt, [1e3 * p[5][k] for p in mon.params], marker=".", label=label)
        ax[1, 1].set(xlabel="sim time (s)", ylabel="mm", title="held-out CoM error 1 s ahead")
        ax[1, 1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "sim2sim.png", dpi=90)
    plt.close(fig)


def published_config_com_error(mon) -> Optional[float]:
    """The config's CoM error 1 s ahead (m) on the held-out blocks the identifier judged its
    latest publication on (its diagnostics); None before any."""
    value = identifier_diagnostic(mon, "published_config_com_error")
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if np.isfinite(value) else None


def identifier_diagnostic(mon, key: str) -> Optional[str]:
    """The identifier's latest diagnostic ``key`` (e.g. "uncertainty": the published values'
    sigma, "estimated" or why not); None before any."""
    with mon.lock:
        return mon.diag.get("identifier", {}).get(key)


def refused_candidate(mon, truth: dict) -> dict:
    """The identifier's newest refused candidate (its diagnostics), relative to the truth."""
    with mon.lock:
        diag = dict(mon.diag.get("identifier", {}))
    out = {}
    for key, value in diag.items():
        name = key.removeprefix("refused_")
        if key.startswith("refused_") and name in truth:
            out[name] = float(value) / float(np.mean(truth[name])) - 1.0
    return out


def per_unit_mass(rows: list, truth: dict, config: dict) -> Optional[dict]:
    """Where rod mass was not learnt and the robot's rods are all one factor (> 1 % from 1) of the config's:
    the config's and the robot's mean rod mass, and each identified force value's error per
    unit mass (identified / config mass against true / true mass), which is what poses
    without a known force determine. None otherwise."""
    if any(r["name"] == "rod_mass" for r in rows) or "rod_mass" not in truth or "rod_mass" not in config:
        return None
    m_config, m_true = float(np.mean(config["rod_mass"])), float(np.mean(truth["rod_mass"]))
    ratio = np.asarray(truth["rod_mass"], dtype=np.float64) / np.asarray(config["rod_mass"], dtype=np.float64)
    # one factor on every rod (a payload on one rod is not a scale: no per-unit-mass figure)
    if abs(m_config / m_true - 1.0) <= 0.01 or np.ptp(ratio) > 0.01 * ratio.mean():
        return None
    errors = {r["name"]: (r["identified"] / m_config) / (r["true"] / m_true) - 1.0
              for r in rows if r["name"] in ("cable_stiffness", "cable_damping")}
    return {"config_mass": m_config, "true_mass": m_true, "rel_error": errors}


def _since(t: Optional[float]) -> str:
    return f"from sim t={t:.1f} s" if t is not None else "never"


def print_summary(s: dict) -> None:
    print("\n=== sim2sim summary ===")
    print(f"the robot: {s.get('robot_truth', 'twin')} (values below are its true ones)"
          + (f": {s['robot_description']}" if s.get("robot_description") else ""))
    if s.get("robot_truth", "twin") == "twin":
        print("  the twin is MuJoCo with the config's own values: a check of the pipeline, not of accuracy "
              "(robots unlike the engine: -p mujoco_bridge:robot_truth:=zoo/<name>; bench/online.py)")
    elif str(s.get("robot_truth")).startswith("twin/"):
        print("  the engine's own equations with values unlike the config's: a check of identification alone "
              "(robots unlike the engine: -p mujoco_bridge:robot_truth:=zoo/<name>; bench/online.py)")
    print(f"wall time {s['wall_seconds']} s, sim time {s['sim_seconds']:.1f} s, {s['poses']} poses "
          f"({s.get('pose_rate_sim_hz', float('nan')):.2f} Hz sim), {s['parameters_published']} parameter "
          f"messages, final stage: {s['final_stage']}")
    if s.get("published_structure"):
        st = s["published_structure"]
        def text(x):
            return f"{x['integrator']} integrator, {x['contact_law']} ground law" + (
                f" (condim {x['condim']})" if x["condim"] else "")
        print(f"published model: {text(st)}" + (f"; adopted online (the robot YAML: {text(st['yaml'])})"
                                                 if st["adopted_online"] else ", the robot YAML's"))
    if s["parameters"]:
        print(f"{'parameter':28s} {'true':>12s} {'config':>12s} {'start':>12s} {'identified':>12s} {'1-sigma':>10s} "
              f"{'rel.err':>8s} {'err/sigma':>9s} {'config err':>10s}")
        for r in s["parameters"]:
            sigma = r.get("sigma", float("nan"))
            ratio = abs(r["identified"] - r["true"]) / sigma if sigma > 0 else float("nan")
            if r.get("unlimited"):
                print(f"{r['name']:28s} {'none':>12s} {r.get('config', float('nan')):12.5g} "
                      f"{r['first_published']:12.5g} {r['identified']:12.5g} {sigma:10.3g}  "
                      "(the robot has no such limit)")
                continue
            print(f"{r['name']:28s} {r['true']:12.5g} {r.get('config', float('nan')):12.5g} "
                  f"{r['first_published']:12.5g} {r['identified']:12.5g} "
                  f"{sigma:10.3g} {100 * r['rel_error']:7.1f}% {ratio:9.1f} "
                  f"{100 * r.get('config_rel_error', float('nan')):9.1f}%")
        for r in s["parameters"]:
            if r.get("elements_covered"):
                hits, given = r["elements_covered"]
                print(f"{r['name']}: one value per element, the row their mean and its 1-sigma the mean of "
                      "theirs (errors that compensate move together); "
                      + (f"{hits} of {given} elements within 2 sigma of their own true value" if given
                         else "no element has a finite sigma"))
        if s.get("sigma_state") not in (None, "estimated"):
            print(f"the published 1-sigma: {s['sigma_state']}")
        print("all within 5 % of the truth " + ("(limits aside) " if any(r.get("limit") for r in s["parameters"])
                                                else "")
              + _since(s.get("within_5_percent_from_sim_t"))
              + f", within 10 % (the target from a mocap with noise) {_since(s.get('within_10_percent_from_sim_t'))}")
        if per := s.get("per_unit_mass"):
            print(f"rod mass not learnt: the config's {per['config_mass']:.4g} kg per rod, the robot's "
                  f"{per['true_mass']:.4g} kg ({per['true_mass'] / per['config_mass']:.2f}x); poses without a known "
                  "force determine forces per unit mass, and per unit mass the identified values are off by "
                  + ", ".join(f"{n} {100 * e:+.1f}%" for n, e in per["rel_error"].items())
                  + " (weigh the rods: the robot YAML's rod mass)")
        com, old, nominal = (s.get(k) for k in ("heldout_com_error_1s", "replaced_com_error_1s", "config_com_error_1s"))
        if com is not None and np.isfinite(com):
            print(f"held-out CoM error 1 s ahead: {1e3 * com:.1f} mm (the model it replaced: {1e3 * old:.1f} mm"
                  + (f"; the config: {1e3 * nominal:.1f} mm)" if nominal is not None else ")"))
    if s.get("identifier_worker"):
        print(f"the identifier's worker: {s['identifier_worker']}")
    if s.get("refused_candidate"):
        print("the newest candidate, refused by the hold-out gate (not published), relative to the truth: "
              + ", ".join(f"{n} {100 * e:+.1f}%" for n, e in s["refused_candidate"].items()))
    if "achieved_vx" in s:
        print(f"MPPI from sim t={s['mppi_start_sim_t']:.1f} s for {s['rolling_sim_seconds']:.1f} s: "
              f"CoM moved {s['rolling_distance_x']:+.2f} m in x, achieved velocity "
              f"vx={s['achieved_vx']:+.3f} m/s, vy={s['achieved_vy']:+.3f} m/s (goal +1.0 m/s along x)")
    else:
        print("MPPI phase not reached (see the node logs)")
    rt = [f"{label} {s[key]:.{prec}f}{unit}" for key, label, prec, unit in (
        ("command_period_jitter_p99_ms", "command period jitter p99", 1, " ms"),
        ("late_command_rejections", "late-command rejections", 0, ""),
        ("controller_ticks_missed", "ticks missed", 0, ""),
        ("controller_commands_late", "plans over budget", 0, ""),
        ("command_lead_ms_min", "commands reached the robot >=", 1, " ms early"),
        ("airborne_fraction", "airborne", 3, " of the rolling time")) if key in s]
    if rt:
        print("real time: " + ", ".join(rt))
    if "tracking_poses_scored" in s:
        print(f"camera tracking while MPPI rolls: rod centre {s['tracking_centre_mm_median']:.1f} mm median "
              f"(p90 {s['tracking_centre_mm_p90']:.1f}), axis {s['tracking_axis_deg_median']:.2f} deg over "
              f"{s['tracking_poses_scored']} poses" + (f"; velocity on the true poses vx={s['true_vx']:+.3f} m/s"
                                                      if "true_vx" in s else ""))
    if s.get("commands_late_at"):
        print(f"commands that reached the robot late (sim time / how late): {s['commands_late_at']}")
    if "plots" in s:
        print(f"plots: {s['plots']}")


def main(argv=None) -> int:
    """`_main`; a config it cannot use (the robot YAML, the robot_truth, the parameter
    file) is one line on stderr and exit status 2, before any node starts."""
    from tensegrity_engine.physics.config import ConfigError

    from .common import ConfigurationError

    try:
        return _main(argv)
    except (ConfigError, ConfigurationError) as exc:
        sys.stderr.write(f"tensegrity-sim2sim: error: {exc}\n")
        return 2


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="sim2sim over ROS 2 topics without ros2 launch")
    ap.add_argument("--config", default="sim2sim", help="parameter YAML (name in config/ or a path)")
    ap.add_argument("--rolling-duration", type=float, default=None, help="sim seconds of MPPI")
    ap.add_argument("--wall-timeout", type=float, default=None)
    ap.add_argument("--output-dir", default=None)
    ap.add_argument("--device", default=None, choices=("auto", "cpu", "cuda"))
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--domain-id", type=int, default=None)
    ap.add_argument("--pose-source", default=None, choices=("mocap", "camera"),
                    help="rod poses from the bridge (mocap) or from its depth camera through camera_tracker")
    ap.add_argument("--cameras", type=int, default=None,
                    help="with --pose-source camera: depth cameras around the robot, fitted together (default 1)")
    ap.add_argument("--robot", default=None,
                    help="robot YAML (name in config/ or a path) that the bridge plays and every node models "
                         "(default: the parameter file's)")
    ap.add_argument("-p", "--param", action="append", default=[],
                    help="node:name:=value override, e.g. identifier:max_seconds:=30")
    args = ap.parse_args(argv)

    from .camera_messages import camera_namespace
    from .params import load_robot, resolve_config

    cfg_path = resolve_config(args.config)
    data = yaml.safe_load(cfg_path.read_text())
    if not isinstance(data, dict):
        ap.error(f"{cfg_path}: expected a ROS 2 parameter file (node: ros__parameters: ...)")
    sections = sorted(set(data) - {name for name, _ in NODES} - {"camera_tracker", "sim2sim", "/**"})
    if sections:            # a misspelt node's section would reach no node
        ap.error(f"{cfg_path}: no node {', '.join(map(repr, sections))} runs in the sim2sim; the sections: "
                 f"{', '.join(name for name, _ in NODES)}, camera_tracker, sim2sim")
    run = (data.get("sim2sim") or {}).get("ros__parameters", {})
    unread = sorted(set(run) - set(RUN_SETTINGS))
    if unread:
        ap.error(f"{cfg_path}: sim2sim has no setting {', '.join(map(repr, unread))}; "
                 f"the settings: {', '.join(RUN_SETTINGS)}")
    rolling = args.rolling_duration if args.rolling_duration is not None else float(run.get("rolling_duration", 10.0))
    wall_timeout = args.wall_timeout if args.wall_timeout is not None else float(run.get("wall_timeout", 900.0))
    out_dir = Path(args.output_dir or run.get("output_dir", "runs/sim2sim"))
    goal = (float(run.get("goal_vx", 1.0)), float(run.get("goal_vy", 0.0)))
    bridge = data["mujoco_bridge"]["ros__parameters"]
    robot_truth = str(bridge.get("robot_truth", "twin"))
    learn_setting = data.get("identifier", {}).get("ros__parameters", {}).get("learn")
    domain = args.domain_id if args.domain_id is not None else reserve_domain_id()
    log_root = Path(tempfile.mkdtemp(prefix="sim2sim_ros_log_"))
    env = ros_env(domain, str(log_root))
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE",
                                           "RMW_IMPLEMENTATION", "ROS_LOG_DIR")})
    os.environ.pop("ROS_LOCALHOST_ONLY", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    nodes = list(NODES)
    overrides = {name: [] for name, _ in NODES}
    remaps: dict = {}
    pose_source = args.pose_source or str(run.get("pose_source", "mocap"))
    if pose_source not in ("mocap", "camera"):
        raise SystemExit(f"pose_source must be mocap or camera, got {pose_source!r}")
    if pose_source == "camera":
        nodes.append(("camera_tracker", "tensegrity_ros.camera_tracker"))
        count = args.cameras if args.cameras is not None else int(run.get("cameras", 1))
        if not 1 <= count <= 8:
            raise SystemExit(f"cameras must be 1..8, got {count}")
        namespaces = ", ".join(f"'{camera_namespace(k)}'" for k in range(count))
        overrides["camera_tracker"] = [("cameras", f"[{namespaces}]")]
        # the bridge's own poses go to the monitor only, to score the tracker
        overrides["mujoco_bridge"] += [("depth_camera", "true"), ("depth_cameras", str(count))]
        remaps["mujoco_bridge"] = [("/tensegrity/rod_poses", TRUTH_TOPIC)]
    if args.device:
        overrides["identifier"].append(("device", args.device))
        overrides["mppi_controller"].append(("device", args.device))
    if args.checkpoint_dir:
        overrides["identifier"].append(("checkpoint_dir", args.checkpoint_dir))
    played = args.robot or str(bridge.get("robot", "superball"))
    if args.robot:          # the bridge plays it and every node models it (weighed below)
        for name in ("mujoco_bridge",) + MODEL_NODES:
            overrides.setdefault(name, []).append(("robot", args.robot))
    running = [name for name, _ in nodes]
    for item in args.param:
        node, _, rest = item.partition(":")
        key, assign, value = rest.partition(":=")
        if not assign or not key:
            ap.error(f"-p {item!r}: expected node:name:=value")
        if node not in running:         # the override would reach no node
            ap.error(f"-p {item!r}: no node {node!r} runs here; the nodes: {', '.join(running)}")
        overrides.setdefault(node, []).append((key, value))
        if (node, key) == ("mujoco_bridge", "robot_truth"):
            robot_truth = value
        if (node, key) == ("mujoco_bridge", "robot"):       # the monitor and the summary follow the bridge
            played = value
        if (node, key) == ("identifier", "learn"):          # the summary scores what is learnt
            learn_setting = yaml.safe_load(value)
    robot = load_robot(played)
    learn = summary_learn(learn_setting, robot)
    true_values(robot, robot_truth)          # a bad robot_truth fails here, before any node starts
    model = robot
    weighed = weighed_robot_file(robot, robot_truth, out_dir) if bool(run.get("weigh_rods", True)) else None
    if weighed is not None:
        model = load_robot(str(weighed))
        for name in MODEL_NODES:         # -p node:robot:=... wins; --robot gives way to the weighed file
            given = [item for item in overrides.get(name, ()) if item[0] == "robot"]
            if not given or given == [("robot", args.robot)]:
                overrides[name] = [("robot", str(weighed))] + [i for i in overrides.get(name, ()) if i[0] != "robot"]
        print(f"sim2sim: the identifier, controller and tracker model the robot with its rods weighed and "
              f"measured ({weighed})", flush=True)
    print(f"sim2sim: {cfg_path} on ROS_DOMAIN_ID={domain}, poses from {pose_source}; logs in {out_dir}/*.log",
          flush=True)
    wall0 = time.monotonic()
    procs = []
    mon = None
    rolling_start = None
    try:
        mon = Monitor(model, goal, TRUTH_TOPIC if pose_source == "camera" else None)
        for name, module in nodes:
            procs.append(start_node(module, str(cfg_path), env, out_dir / f"{name}.log", overrides.get(name, ()),
                                    remaps.get(name, ())))
        last_print = 0.0
        last_progress = (0.0, None)          # (wall s, sim t) when poses last moved on
        while True:
            time.sleep(0.5)
            wall = time.monotonic() - wall0
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                name = nodes[procs.index(dead[0])][0]
                log = out_dir / f"{name}.log"
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
                print(f"node {name} exited early (rc={dead[0].returncode}): {tail[0] if tail else '(no output)'}; "
                      f"see {log}", flush=True)
                break
            with mon.lock:
                t_sim = mon.last_pose_t
                rolling_start = mon.mode_switch_t
                n_params = len(mon.params)
                stage = mon.params[-1][1] if mon.params else "-"
                ident = mon.diag.get("identifier", {})
            if wall - last_print >= 10.0:
                last_print = wall
                print(f"[{wall:6.0f} s wall] sim t={t_sim:6.1f} s, controller: {mon.mode}, "
                      f"identifier: {ident.get('status', '?')} epochs={ident.get('epochs', '?')} "
                      f"tuples={ident.get('window_tuples', '?')}, params published: {n_params} ({stage})",
                      flush=True)
            if rolling_start is not None and t_sim - rolling_start >= rolling:
                break
            if t_sim != last_progress[1]:
                last_progress = (wall, t_sim)
            elif last_progress[1] is not None and wall - last_progress[0] > STALL_TIMEOUT:
                print(f"no new pose for {STALL_TIMEOUT:.0f} s wall (controller: {mon.mode}; see {out_dir}/*.log): "
                      "stopping", flush=True)
                break
            if wall > wall_timeout:
                print(f"wall timeout ({wall_timeout} s) reached", flush=True)
                break
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        stop_processes(procs)
        summary = None
        if mon is not None:
            period = float(data.get("mppi_controller", {}).get("ros__parameters", {}).get("control_period", 0.1))
            summary = summarize(robot, mon, rolling_start, out_dir, time.monotonic() - wall0, learn, robot_truth,
                                period, model)
            mon.close()
        clean_dds_shm()
        shutil.rmtree(log_root, ignore_errors=True)
    if summary is not None:
        print_summary(summary)
        return 0 if "achieved_vx" in summary else 1
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
