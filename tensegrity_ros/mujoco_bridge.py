"""mujoco_bridge: MuJoCo as the robot (ground truth) over ROS topics.

``robot_truth`` picks the robot MuJoCo plays: the config's twin, one with other values
(``twin/<name>``, config/zoo.yaml's twins: the engine's equations), a zoo robot
(``zoo/<name>``: other values, integrator, contacts, actuators; see
`tensegrity_engine.groundtruth.zoo`) or another robot YAML of the same topology. The
other nodes only ever see ``robot`` (the nominal config), as on a real robot.

Steps `tensegrity_engine.groundtruth.mujoco_twin.MujocoTwin` at the robot's step (1 ms) in a
simulation thread, real time or faster (``real_time_factor``; 0 = as fast as possible),
applies every received cable command from its stamp on (zero-order hold), and publishes
rod poses at a low rate (optional noise and latency), per-rod IMU, RViz markers,
/diagnostics and /clock (sim time); with ``depth_camera`` also a depth camera's images
(`depth_publisher`), and with ``publish_poses`` off no poses (a camera tracker's job).
``lockstep`` makes the simulation wait (wall clock, up to ``lockstep_timeout``) after
each pose for the controller's command stamped at or after that pose, so that a slow planner sees the same closed loop as a fast one. Until
the first command arrives, the waiting pose is re-sent every ``FIRST_POSE_REPEAT`` s: the
graph can show the controller before DDS has matched its subscription, and a first pose
lost then would stall the loop for the whole timeout (receivers that did get it count the
repeat as a duplicate).
"""
from __future__ import annotations

import bisect
import collections
import threading
import time

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import PoseArray
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Imu, JointState
from tensegrity_ros_interfaces.msg import CableCommand
from visualization_msgs.msg import MarkerArray

from tensegrity_engine.groundtruth.environments import rest_pose
from tensegrity_engine.groundtruth.mujoco_twin import GroundTruthDiverged, nominal_commands
from tensegrity_engine.groundtruth.zoo import ground_truth
from tensegrity_engine.physics.config import ConfigError
from tensegrity_engine.groundtruth.sensors import SensorModel, noisy_rod_poses
from tensegrity_engine.physics.state import center_of_mass

from . import conversions as conv
from .common import (TOPIC_APPLIED, TOPIC_CABLE_STATES, TOPIC_COMMAND, TOPIC_IMU, TOPIC_MARKERS, TOPIC_POSES,
                     ConfigurationError, run_node, stream_qos)
from .depth_publisher import DepthCameraOutput
from .diagnostics import Diagnostics
from .params import declare, load_robot, refuse_undeclared

NS = conv.NS
FIRST_POSE_REPEAT = 2.0   # s (wall): re-send the waiting pose until the first command arrives


class MujocoBridge(Node):
    def __init__(self, **kwargs):
        super().__init__("mujoco_bridge", **kwargs)
        d = lambda *a, **k: declare(self, *a, **k)
        robot_name = d("robot", "superball", "robot config: name of a shipped config or a YAML path",
                       read_only=True)
        self.pose_rate = d("pose_rate", 10.0, "rod pose publishing rate (Hz, sim time)", range=(0.1, 1000.0))
        self.pos_noise = d("pose_noise_position", 0.0, "std of Gaussian position noise (m)", range=(0.0, 1.0))
        self.rot_noise = d("pose_noise_rotation", 0.0, "std of Gaussian rotation noise (rad)", range=(0.0, 1.0))
        self.latency = d("latency", 0.0, "delay between measurement and publication of poses/IMU (s)",
                         range=(0.0, 5.0))
        self.imu_enabled = d("imu", True, "publish one sensor_msgs/Imu per rod with every pose")
        self.imu_noise = d("imu_noise", 0.0, "std of gyro noise (rad/s)", range=(0.0, 10.0))
        self.cable_states = d("cable_states", True, "publish a sensor_msgs/JointState of the cables with every "
                              "pose: each winch's rest length (position) and each cable's tension (effort)")
        self.cable_sensors = SensorModel(
            tension_noise=d("tension_noise", 0.0, "std of the load cells' noise (N)", range=(0.0, 1e4)),
            rest_length_noise=d("rest_length_noise", 0.0, "std of the winch encoders' noise (m)", range=(0.0, 1.0)))
        self.marker_rate = d("marker_rate", 2.0, "marker publishing rate (Hz, sim time; 0 = off)",
                             range=(0.0, 100.0))
        self.publish_clock = d("publish_clock", True, "publish /clock (sim time) for use_sim_time nodes")
        self.clock_period = d("clock_period", 0.01, "sim-time period of /clock messages (s)",
                              range=(0.001, 1.0))
        self.rtf = d("real_time_factor", 1.0, "sim speed / wall speed; 0 = as fast as possible",
                     range=(0.0, 1000.0))
        self.lockstep = d("lockstep", False, "after each pose wait for a command stamped at or after it")
        self.lockstep_timeout = d("lockstep_timeout", 30.0, "longest wall-clock wait in lockstep (s)",
                                  range=(0.0, 3600.0))
        self.start_x = d("start_x", 0.0, "initial CoM x (m)", range=(-1e3, 1e3))
        self.start_y = d("start_y", 0.0, "initial CoM y (m)", range=(-1e3, 1e3))
        self.seed = d("seed", 0, "noise seed", range=(0, 2**31 - 1))
        self.max_duration = d("max_duration", 0.0, "stop stepping after this sim time (s); 0 = never",
                              range=(0.0, 1e6))
        self.clock_jump = d("command_clock_jump", 5.0,
                            "commands stamped further than this in the future are rejected (s)",
                            range=(0.0, 1e6))
        truth_spec = d("robot_truth", "twin",
                       "the robot MuJoCo plays: 'twin' (the config's values, the engine's equations), "
                       "'twin/<name>' (config/zoo.yaml's twins: the engine's equations, other values), "
                       "'zoo/<name>' (a config/zoo.yaml robot: other values, integrator, contacts, "
                       "actuators), 'random/<seed>' (a robot drawn from the seed: the same, nobody tuned "
                       "for it) or a robot-config YAML path of the same topology", read_only=True)
        self.robot = load_robot(robot_name)
        try:
            self.truth = ground_truth(truth_spec, self.robot)
        except ConfigError as err:
            raise ConfigurationError(f"robot_truth {truth_spec!r}: {err}") from None
        self.rng = np.random.default_rng(self.seed)
        try:                # the robot settles into its rest pose in MuJoCo: a robot that cannot be
            self.twin = self.truth.twin(floor=True, nthread=1)          # simulated as given says so
            rs, act = rest_pose(self.truth.truth, realisation=self.truth.realisation)
            com = center_of_mass(rs, self.truth.truth.rod_mass)
            rs[:, 0:2] += np.array([self.start_x, self.start_y]) - com[:2]
            self.twin.reset(rs, act)
        except GroundTruthDiverged as err:
            raise ConfigurationError(f"robot {robot_name!r} as {truth_spec!r}: {err}") from None
        self.publish_poses = d("publish_poses", True,
                               "publish rod poses (off when a camera tracker publishes them instead)")
        if self.lockstep and not self.publish_poses:
            raise ConfigurationError("lockstep waits for a command after each pose the bridge publishes: it "
                                     "needs publish_poses")
        self.depth = DepthCameraOutput(self, self.robot, center_of_mass(rs, self.truth.truth.rod_mass))
        self.command = nominal_commands(self.robot).copy()
        self.A = self.robot.num_actuated
        self.cable_names = [self.robot.cable_names[i] for i in self.robot.actuated_indices]
        self.low, self.high = self.robot.command_low, self.robot.command_high

        self.pub_pose = self.create_publisher(PoseArray, TOPIC_POSES, stream_qos())
        self.pub_imu = self.create_publisher(Imu, TOPIC_IMU, stream_qos(100))
        self.pub_cables = self.create_publisher(JointState, TOPIC_CABLE_STATES, stream_qos())
        self.pub_applied = self.create_publisher(CableCommand, TOPIC_APPLIED, stream_qos())
        self.pub_markers = self.create_publisher(MarkerArray, TOPIC_MARKERS, 5)
        self.pub_clock = self.create_publisher(Clock, "/clock", 10)
        self.create_subscription(CableCommand, TOPIC_COMMAND, self._on_command, stream_qos())

        self._cv = threading.Condition()
        self._queue: list = []           # sorted [(stamp_ns, seq, command)]
        self._seq = 0
        self._last_cmd_stamp = None
        self._latest_cmd_stamp = -1
        self._applied_ns = -1
        self._leads = collections.deque(maxlen=1000)   # ms each command arrived before its stamp (sim time)
        self._late = collections.deque(maxlen=8)       # (sim time s, ms late) of the latest late arrivals
        self.step_count = 0
        self.poses_published = 0
        self.lockstep_timeouts = 0
        self._wall0 = time.monotonic()
        self._stop = threading.Event()
        self.diag = Diagnostics(self, extra=self._diag_values)
        refuse_undeclared(self)      # all declared by now, Diagnostics' period too
        self._thread = threading.Thread(target=self._run, name="mujoco_sim", daemon=True)
        self._thread.start()
        self.get_logger().info(
            f"MuJoCo bridge: {self.robot.name} played by {self.truth.name!r}, poses at {self.pose_rate} Hz, "
            f"rtf={self.rtf or 'max'}, lockstep={self.lockstep}")

    # ------------------------------------------------------------------ commands
    def _on_command(self, msg: CableCommand) -> None:
        self.diag.received("commands")
        problem = conv.header_problem(msg.header)
        if problem:
            return self.diag.reject(*problem, topic="commands")
        stamp = conv.stamp_ns(msg.header.stamp)
        u, problem = conv.checked_command(msg, self.cable_names)
        if problem:
            return self.diag.reject(problem, f"cable command ({len(msg.target_rest_lengths)} values, "
                                    f"expected {self.A} finite)", topic="commands")
        with self._cv:
            now = int(round(self.twin.time * NS))
            if stamp > now + int(self.clock_jump * NS):
                return self.diag.reject("clock_jump", f"command stamped {(stamp - now) / NS:.1f} s in the future",
                                        topic="commands")
            if self._last_cmd_stamp is not None and stamp <= self._last_cmd_stamp and stamp != 0:
                reason = "duplicate" if stamp == self._last_cmd_stamp else "out_of_order"
                return self.diag.reject(reason, "command stamp not increasing", topic="commands")
            if stamp != 0:              # an unset stamp (ros2 topic pub) acts now; the order stays the stamped ones
                self._last_cmd_stamp = stamp
            lead_ms = (stamp - now) / 1e6             # > 0: arrived before it was due
            self._leads.append(lead_ms)
            if lead_ms < 0:
                self.diag.count("commands_arrived_late")
                self._late.append((now / NS, -lead_ms))
            # the actuators saturate: a command beyond the range is applied at its limit
            clipped = np.clip(u, self.low, self.high)
            if np.any(clipped != u):
                self.diag.count("commands_clipped")
            bisect.insort(self._queue, (stamp, self._seq, clipped))
            self._seq += 1
            self._latest_cmd_stamp = max(self._latest_cmd_stamp, stamp)
            self.diag.accept("commands")
            self._cv.notify_all()

    # ------------------------------------------------------------------ sim thread
    def _measure(self, t_ns: int):
        rs, act = self.twin.get_state()
        cables = None
        if self.cable_states:       # the winches' encoders (none on a passive cable) and load cells
            cables = self.cable_sensors.measure_cables(self.twin.rest_lengths(act), self.twin.cable_tensions(rs, act),
                                                       self.rng, actuated=self.robot.cable_actuated)
        return t_ns, noisy_rod_poses(rs, self.rng, pos_noise=self.pos_noise, rot_noise=self.rot_noise), rs, cables

    def _publish_measurement(self, t_ns: int, meas: np.ndarray, truth: np.ndarray, cables) -> None:
        if self.publish_poses:
            self.pub_pose.publish(conv.rod_state_to_pose_array(meas, t_ns))
            self.poses_published += 1
        if self.imu_enabled:
            for m in conv.rod_imu_messages(truth, t_ns, noise_std=self.imu_noise, rng=self.rng):
                self.pub_imu.publish(m)
        if cables is not None:
            self.pub_cables.publish(conv.cable_states_message(*cables, t_ns, self.robot.cable_names))

    def _publish_clock(self, t_ns: int) -> None:
        if self.publish_clock:
            c = Clock()
            conv.ns_to_stamp(t_ns, c.clock)
            self.pub_clock.publish(c)

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 - report, do not kill the process silently
            self.get_logger().error(f"simulation thread stopped: {exc!r}")
            self.diag.set_status(DiagnosticStatus.ERROR, f"simulation stopped: {exc!r}")
        finally:
            self.depth.close()              # in this thread: it owns the renderer's GL context

    def _loop(self) -> None:
        dt_ns = int(round(self.robot.dt * NS))
        pose_ns = max(dt_ns, int(round(NS / self.pose_rate)))
        clock_ns = max(dt_ns, int(round(self.clock_period * NS)))
        marker_ns = int(round(NS / self.marker_rate)) if self.marker_rate > 0 else None
        lat_ns = int(round(self.latency * NS))
        t = int(round(self.twin.time * NS))
        next_pose, next_clock = t, t
        next_marker = t if marker_ns else None
        depth_ns = self.depth.period_ns if self.depth.enabled else None
        next_depth = t if depth_ns else None
        if depth_ns:
            self.depth.announce(t, self.twin.get_state()[0])
        delayed: list = []               # [(publish_at, t_meas, meas, truth, cables)]
        wall0, sim0 = time.monotonic(), t
        end_ns = int(self.max_duration * NS) if self.max_duration > 0 else None
        self._publish_clock(t)
        while not self._stop.is_set():
            if end_ns is not None and t >= end_ns:
                self.diag.set_status(DiagnosticStatus.OK, "max_duration reached; paused")
                self._stop.wait(0.2)
                continue
            # events due now
            if t >= next_clock:
                self._publish_clock(t)
                next_clock += clock_ns
            if t >= next_pose:
                meas = self._measure(t)
                next_pose += pose_ns
                if lat_ns > 0:
                    delayed.append((t + lat_ns,) + meas)
                else:
                    self._publish_clock(t)
                    self._publish_measurement(*meas)
                    if self._wait_lockstep(t, meas[1]):
                        wall0, sim0 = time.monotonic(), t      # paced from here: no catching up
            while delayed and delayed[0][0] <= t:
                _, tm, meas, truth, cables = delayed.pop(0)
                self._publish_clock(t)
                self._publish_measurement(tm, meas, truth, cables)
                if self._wait_lockstep(tm, meas):
                    wall0, sim0 = time.monotonic(), t
            if marker_ns and t >= next_marker:
                self._publish_markers(t)
                next_marker += marker_ns
            if depth_ns and t >= next_depth:
                self.depth.publish(self.twin, t, self.twin.get_state()[0], self.rng)
                next_depth += depth_ns
                depth_ns = self.depth.period_ns if self.depth.enabled else None
            # commands due now
            with self._cv:
                applied = False
                while self._queue and self._queue[0][0] <= t + dt_ns // 2:
                    self.command = self._queue.pop(0)[2]
                    self.diag.count("commands_applied")
                    applied = True
                if applied:                    # the echo a driver can give: when it really took effect
                    self.pub_applied.publish(conv.make_cable_command(self.command, max(t, self._applied_ns + 1)))
                    self._applied_ns = max(t, self._applied_ns + 1)
                next_cmd = self._queue[0][0] if self._queue else None
            # step to the next event
            events = [next_pose, next_clock] + ([next_marker] if marker_ns else []) + ([next_depth] if depth_ns else [])
            if delayed:
                events.append(delayed[0][0])
            if next_cmd is not None:
                events.append(next_cmd)
            if end_ns is not None:
                events.append(end_ns)
            n = max(1, min(100, int(-(-(min(events) - t) // dt_ns))))
            self.twin.step(self.command, nsteps=n)
            self.step_count += n
            t = int(round(self.twin.time * NS))
            if self.rtf > 0:
                ahead = (t - sim0) / NS / self.rtf - (time.monotonic() - wall0)
                if ahead > 0:
                    self._stop.wait(ahead)

    def _wait_lockstep(self, t_meas: int, meas: np.ndarray) -> bool:
        """Lockstep: wait until a command stamped at or after the pose arrived. True if it
        waited (the real-time pacing restarts from here instead of catching up)."""
        if not self.lockstep or self.count_subscribers(TOPIC_POSES) == 0:
            return False
        if self.count_publishers(TOPIC_COMMAND) == 0:
            return False
        waited = False
        deadline = time.monotonic() + self.lockstep_timeout
        resend_at = time.monotonic() + FIRST_POSE_REPEAT
        with self._cv:
            while self._latest_cmd_stamp < t_meas and not self._stop.is_set():
                if self._latest_cmd_stamp < 0 and time.monotonic() >= resend_at:
                    self.pub_pose.publish(conv.rod_state_to_pose_array(meas, t_meas))
                    self.diag.count("first_pose_resent")
                    resend_at = time.monotonic() + FIRST_POSE_REPEAT
                left = deadline - time.monotonic()
                if left <= 0:
                    self.lockstep_timeouts += 1
                    self.diag.warn_throttled("lockstep", f"no command for t={t_meas / NS:.3f}s within "
                                             f"{self.lockstep_timeout}s; continuing")
                    return True
                self._cv.wait(min(left, 0.1))
                waited = True
        return waited

    def _publish_markers(self, t_ns: int) -> None:
        rs, act = self.twin.get_state()
        arr = MarkerArray()
        colors = conv.tension_colors(self.twin.cable_tensions(rs, act))     # the played robot's own tensions
        arr.markers = conv.rod_cable_markers(self.robot, rs, t_ns, "measured", (0.1, 0.4, 1.0, 1.0),
                                             cable_colors=colors)
        self.pub_markers.publish(arr)

    def _diag_values(self) -> dict:
        wall = time.monotonic() - self._wall0
        return {"sim_time": round(self.twin.time, 3), "steps": self.step_count,
                "poses_published": self.poses_published,
                **({"depth_images_published": self.depth.images, "depth_camera_moves": self.depth.moves}
                   if self.depth.enabled else {}),
                "real_time_factor_achieved": round(self.twin.time / wall, 3) if wall > 0 else 0.0,
                "lockstep_timeouts": self.lockstep_timeouts,
                **({"command_lead_ms_median": round(float(np.median(self._leads)), 2),
                    "command_lead_ms_min": round(float(np.min(self._leads)), 2)} if self._leads else {}),
                # when in the run commands came late (start-up or steady state), and by how much
                **({"commands_late_at": " ".join(f"{t:.2f}s/{ms:.0f}ms" for t, ms in self._late)}
                   if self._late else {}),
                "command": np.array2string(self.command, precision=3, max_line_width=10**6)}

    def close(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        self._thread.join(timeout=5.0)


def main(args=None) -> int:
    return run_node(MujocoBridge, args)


if __name__ == "__main__":
    raise SystemExit(main())
