"""tensegrity-soak: the sim2sim for a long run, with a flood, a kill -9 and a failing disk.

Runs mujoco_bridge, identifier and mppi_controller as processes (config/sim2sim.yaml,
the bridge as fast as MuJoCo runs, without lockstep, identification without a time
limit so it is still training when it is killed) and, on a wall-clock timeline:

* samples the resident memory (VmRSS) of every node once a second;
* from 20 % to 40 % of the run floods the poses topic at 1 kHz and the gyros at 100 Hz
  (copies of the newest measurement: a mocap that publishes every frame twice);
* at 50 % sends SIGKILL to the identifier once it has checkpointed, restarts it on the
  same checkpoint directory and measures the epochs lost and the time until it publishes
  again;
* from 70 % to 80 % replaces the checkpoint directory by a file (every write fails, as on
  a full disk, even for root) and checks that training goes on and the errors are counted.

It prints, and writes as JSON, the RSS of each node (first, peak, growth over the second
half), the flood rates and rejections, the resume figures and the checkpoint errors.

    tensegrity-soak [--duration 1800] [--output soak.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from .common import reserve_domain_id
from .sim2sim import NODES, clean_dds_shm, ros_env, start_node, stop_processes

SOAK_OVERRIDES = {
    # no lockstep: the simulation runs as fast as MuJoCo can, the nodes keep up as they can
    "mujoco_bridge": [("real_time_factor", "0.0"), ("lockstep", "false"), ("marker_rate", "0.0")],
    "identifier": [("max_seconds", "0.0"), ("max_epochs", "10000000"), ("checkpoint_period", "0.1"),
                   ("device", "cpu"), ("lr_min", "1e-9")],
    "mppi_controller": [("max_excitation_time", "20.0"), ("device", "cpu")],
}


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


class Watcher:
    """Sim time, parameter messages, the newest measurements and every node's diagnostics."""

    def __init__(self):
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from geometry_msgs.msg import PoseArray
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Imu
        from tensegrity_ros_interfaces.msg import IdentifiedParameters

        from .common import TOPIC_IMU, TOPIC_PARAMS, TOPIC_POSES, Spinner, latched_qos, stream_qos

        rclpy.init()
        self.node = rclpy.create_node("soak_watcher")
        self.lock = threading.Lock()
        self.sim_t, self.params, self.diag = 0.0, [], {}
        self.pose, self.imu = None, {}
        n = self.node
        n.create_subscription(Clock, "/clock", self._clock, 10)
        n.create_subscription(IdentifiedParameters, TOPIC_PARAMS, self._params, latched_qos())
        n.create_subscription(DiagnosticArray, "/diagnostics", self._diag, 50)
        n.create_subscription(PoseArray, TOPIC_POSES, self._pose, stream_qos())
        n.create_subscription(Imu, TOPIC_IMU, self._imu, stream_qos(100))
        self.pub_pose = n.create_publisher(PoseArray, TOPIC_POSES, stream_qos())
        self.pub_imu = n.create_publisher(Imu, TOPIC_IMU, stream_qos(100))
        self.spinner = Spinner(n)

    def _clock(self, m):
        with self.lock:
            self.sim_t = m.clock.sec + 1e-9 * m.clock.nanosec

    def _params(self, m):
        with self.lock:
            self.params.append((time.monotonic(), m.stage, m.epoch))

    def _diag(self, m):
        with self.lock:
            for st in m.status:
                self.diag[st.name] = {kv.key: kv.value for kv in st.values}

    def _pose(self, m):
        with self.lock:
            self.pose = m

    def _imu(self, m):
        with self.lock:
            self.imu[m.header.frame_id] = m

    def value(self, node, key, default=0.0):
        with self.lock:
            v = self.diag.get(node, {}).get(key, default)
        try:
            return float(v)
        except (TypeError, ValueError):
            return default

    def flood(self, stop: threading.Event, counts: dict) -> None:
        """Poses at 1 kHz and each rod's gyro at 100 Hz (paced by the clock, catching up
        after a slow sleep): copies of the newest ones, with their stamps."""
        f0 = time.monotonic()
        while not stop.is_set():
            with self.lock:
                pose, imus = self.pose, list(self.imu.values())
            elapsed = time.monotonic() - f0
            if pose is not None:
                for _ in range(max(0, int(elapsed * 1000) - counts["poses"])):
                    self.pub_pose.publish(pose)
                    counts["poses"] += 1
            if imus and int(elapsed * 100) * len(imus) > counts["imu"]:
                for m in imus:
                    self.pub_imu.publish(m)
                    counts["imu"] += 1
            time.sleep(0.0005)

    def close(self):
        import rclpy

        self.spinner.stop()
        self.node.destroy_node()
        rclpy.try_shutdown()


def _wait(pred, timeout, step=0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="long sim2sim run with a flood, a kill -9 and a failing disk")
    ap.add_argument("--duration", type=float, default=1800.0, help="wall seconds")
    ap.add_argument("--config", default="sim2sim")
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)

    from .params import resolve_config

    cfg = str(resolve_config(args.config))
    work = Path(tempfile.mkdtemp(prefix="tensegrity_soak_"))
    ckpt = work / "checkpoints"
    ckpt.mkdir()
    env = ros_env(reserve_domain_id(), str(work / "ros_log"))
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE",
                                           "RMW_IMPLEMENTATION", "ROS_LOG_DIR")})
    overrides = {k: list(v) for k, v in SOAK_OVERRIDES.items()}
    overrides["identifier"].append(("checkpoint_dir", str(ckpt)))
    procs = {name: start_node(module, cfg, env, work / f"{name}.log", overrides[name]) for name, module in NODES}
    watcher = Watcher()
    rss = {name: [] for name in procs}
    report: dict = {"duration_wall_s": args.duration, "work_dir": str(work), "events": []}
    stop_sampling = threading.Event()

    def sample():
        while not stop_sampling.wait(1.0):
            for name, p in procs.items():
                rss[name].append((time.monotonic() - t0, rss_mb(p.pid), watcher.sim_t))

    t0 = time.monotonic()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    at = lambda frac: t0 + frac * args.duration  # noqa: E731
    log = lambda text: print(f"[{time.monotonic() - t0:7.0f} s, sim {watcher.sim_t:7.1f} s] {text}", flush=True)  # noqa: E731
    try:
        time.sleep(max(0.0, at(0.2) - time.monotonic()))
        before = {k: watcher.value(n, f"{k}_rejected") for n in ("identifier", "mppi_controller") for k in ("poses",)}
        counts = {"poses": 0, "imu": 0}
        stop_flood = threading.Event()
        flood = threading.Thread(target=watcher.flood, args=(stop_flood, counts), daemon=True)
        f0 = time.monotonic()
        flood.start()
        log("flood on")
        time.sleep(max(0.0, at(0.4) - time.monotonic()))
        stop_flood.set()
        flood.join()
        span = time.monotonic() - f0
        report["flood"] = {"seconds": span, "poses": counts["poses"], "imu": counts["imu"],
                           "pose_rate_hz": counts["poses"] / span, "imu_rate_hz": counts["imu"] / span,
                           "identifier_pose_rejections": watcher.value("identifier", "poses_rejected") - before["poses"],
                           "controller_pose_rejections": watcher.value("mppi_controller", "poses_rejected")}
        log(f"flood off: {report['flood']}")

        time.sleep(max(0.0, at(0.5) - time.monotonic()))
        _wait(lambda: watcher.value("identifier", "checkpoints_saved") >= 1, 300)
        epochs_at_kill = watcher.value("identifier", "epochs")
        time.sleep(0.3)                       # the newest diagnostics (period 1 s) may lag
        epochs_at_kill = max(epochs_at_kill, watcher.value("identifier", "epochs"))
        procs["identifier"].send_signal(signal.SIGKILL)
        procs["identifier"].wait()
        n_params = len(watcher.params)
        t_restart = time.monotonic()
        procs["identifier"] = start_node(NODES[1][1], cfg, env, work / "identifier_restarted.log",
                                         overrides["identifier"])
        republished = _wait(lambda: len(watcher.params) > n_params, 120, 0.05)
        t_pub = (watcher.params[n_params][0] - t_restart) if republished else None
        _wait(lambda: watcher.value("identifier", "resumed") >= 1, 60)
        resumed_stage = watcher.params[n_params][1] if republished else None
        resumed_epoch = watcher.params[n_params][2] if republished else None
        report["kill"] = {"epochs_at_kill": epochs_at_kill, "epochs_resumed": resumed_epoch,
                          "epochs_lost": None if resumed_epoch is None else epochs_at_kill - resumed_epoch,
                          "republish_s": t_pub, "republished_stage": resumed_stage}
        log(f"identifier killed and restarted: {report['kill']}")

        time.sleep(max(0.0, at(0.7) - time.monotonic()))
        moved = work / "checkpoints.moved"
        ckpt.rename(moved)
        ckpt.write_text("not a directory: every checkpoint write fails\n")
        errors0, epochs0 = watcher.value("identifier", "checkpoint_errors"), watcher.value("identifier", "epochs")
        log("checkpoint directory replaced by a file")
        time.sleep(max(0.0, at(0.8) - time.monotonic()))
        report["disk"] = {"checkpoint_errors": watcher.value("identifier", "checkpoint_errors") - errors0,
                          "epochs_meanwhile": watcher.value("identifier", "epochs") - epochs0,
                          "alive": procs["identifier"].poll() is None}
        ckpt.unlink()
        moved.rename(ckpt)
        log(f"checkpoint directory restored: {report['disk']}")
        time.sleep(max(0.0, at(1.0) - time.monotonic()))
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        stop_sampling.set()
        sampler.join()
        report["alive_at_end"] = {n: p.poll() is None for n, p in procs.items()}
        report["sim_seconds"] = watcher.sim_t
        report["controller"] = {k: watcher.value("mppi_controller", k) for k in ("commands_sent", "plans", "models_swapped")}
        stop_processes(list(procs.values()))
        watcher.close()
        clean_dds_shm()
    report["rss_mb"] = rss_summary(rss)
    print(json.dumps(report, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps({**report, "rss_samples": rss}, indent=1))
    ok = (all(report["alive_at_end"].values()) and report.get("kill", {}).get("republish_s") is not None
          and report.get("disk", {}).get("checkpoint_errors", 0) > 0)
    shutil.rmtree(work / "ros_log", ignore_errors=True)
    return 0 if ok else 1


def rss_summary(rss: dict) -> dict:
    """Per node: RSS after warm-up (the first quarter: models built, buffers allocated),
    the peak of the middle and of the last part, and the growth between those peaks (a
    leak grows; a plateau does not). The identifier is a new process after the kill."""
    out = {}
    for name, samples in rss.items():
        vals = [(t, v) for t, v, _ in samples if v == v]
        if len(vals) < 10:
            continue
        t_end = vals[-1][0]
        first = [v for t, v in vals if 0.25 * t_end <= t < 0.625 * t_end]
        second = [v for t, v in vals if t >= 0.625 * t_end]
        out[name] = {"after_warmup": first[0] if first else None, "peak_middle": max(first, default=None),
                     "peak_last": max(second, default=None), "final": vals[-1][1],
                     "growth": (max(second) - max(first)) if first and second else None}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
