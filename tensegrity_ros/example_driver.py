"""example_driver: the smallest robot driver that honours docs/driver_contract.md.

It replays a recorded trajectory file (`tensegrity_engine.identification.dataset` format,
e.g. from `recorder --to-npz`) as a robot would: rod poses on /tensegrity/rod_poses at
the file's sample times (stamped with this node's clock), per-rod IMU when the file has
velocities, and it consumes /tensegrity/cable_command the way a motor driver must
(validated, saturated to the command range, held from its stamp on). A replay cannot
obey the commands: it counts them (`/diagnostics`) and, with ``publish_commands``, sends
the file's own commands instead, so that the identifier learns from a recording with no
controller running. When the file ends it stops publishing (``loop`` replays it again).

    example_driver --ros-args -p trajectory:=run.npz -p robot:=superball

Copy it for a real robot: replace the replay by the mocap/IMU reader and the counting by
the motor interface; keep the stamps, frames, units and checks.
"""
from __future__ import annotations

import numpy as np
from geometry_msgs.msg import PoseArray
from rclpy.node import Node
from sensor_msgs.msg import Imu
from tensegrity_ros_interfaces.msg import CableCommand

from tensegrity_engine.identification.dataset import DatasetError, load_trajectory
from tensegrity_engine.identification.measurements import StampOrder

from . import conversions as conv
from .common import TOPIC_COMMAND, TOPIC_IMU, TOPIC_POSES, ConfigurationError, run_node, stream_qos
from .diagnostics import Diagnostics
from .params import declare, load_robot, refuse_undeclared, resolve_config

NS = conv.NS


class ExampleDriver(Node):
    def __init__(self, **kwargs):
        super().__init__("example_driver", **kwargs)
        d = lambda *a, **k: declare(self, *a, **k)
        self.robot = load_robot(d("robot", "superball", "robot config: shipped name or YAML path",
                                  read_only=True))
        path = d("trajectory", "", "trajectory file (.npz) to replay", read_only=True)
        self.loop = d("loop", False, "replay the file again when it ends")
        self.publish_commands = d("publish_commands", False, "publish the file's commands on the command "
                                  "topic (identification from a recording, no controller)")
        self.imu = d("imu", True, "publish per-rod IMU (body-frame gyro) when the file has velocities")
        if not path:
            raise ConfigurationError("parameter trajectory: a trajectory file is required")
        try:
            self.traj = load_trajectory(resolve_config(path, suffix=".npz"), self.robot)
        except DatasetError as exc:
            raise ConfigurationError(str(exc)) from None
        self.states = self.traj.states()
        self.imu = self.imu and self.traj.has_velocity
        self.cable_names = [self.robot.cable_names[i] for i in self.robot.actuated_indices]
        self.low, self.high = self.robot.command_low, self.robot.command_high
        self.order = StampOrder(int(5 * NS))
        self.applied = None                       # the command in force (what a motor would track)
        self.pub_poses = self.create_publisher(PoseArray, TOPIC_POSES, stream_qos())
        self.pub_imu = self.create_publisher(Imu, TOPIC_IMU, stream_qos(100))
        self.pub_cmd = self.create_publisher(CableCommand, TOPIC_COMMAND, stream_qos()) \
            if self.publish_commands else None
        self.create_subscription(CableCommand, TOPIC_COMMAND, self._on_command, stream_qos())
        self.diag = Diagnostics(self, extra=lambda: {"sample": self.index, "samples": self.traj.num_samples,
                                                     "replays": self.replays})
        refuse_undeclared(self)      # all declared by now, Diagnostics' period too
        self.index = self.next_command = self.replays = 0
        self.start_ns = None
        self.timer = self.create_timer(0.005, self._tick)    # stamps come from the file; this sets the latency
        self.get_logger().info(f"example driver: replaying {self.traj.num_samples} poses "
                               f"({self.traj.t[-1] - self.traj.t[0]:.1f} s) of {self.robot.name}")

    def _tick(self) -> None:
        now = self.get_clock().now().nanoseconds
        t0 = self.traj.t[0]
        if self.start_ns is None:
            self.start_ns = now
        elapsed = (now - self.start_ns) / NS
        while self.pub_cmd is not None and self.next_command < len(self.traj.command_time) and \
                self.traj.command_time[self.next_command] - t0 <= elapsed:
            stamp = self.start_ns + int(round(max(self.traj.command_time[self.next_command] - t0, 0.0) * NS))
            self.pub_cmd.publish(conv.make_cable_command(self.traj.command[self.next_command], stamp))
            self.next_command += 1
        while self.index < self.traj.num_samples and self.traj.t[self.index] - t0 <= elapsed:
            stamp = self.start_ns + int(round((self.traj.t[self.index] - t0) * NS))
            self.pub_poses.publish(conv.rod_state_to_pose_array(self.states[self.index], stamp))
            if self.imu:
                for m in conv.rod_imu_messages(self.states[self.index], stamp):
                    self.pub_imu.publish(m)
            self.diag.count("poses_sent")
            self.index += 1
        if self.index >= self.traj.num_samples and self.loop:
            self.restart()

    def restart(self) -> None:
        """Replay the file again from its start, one pose period from now."""
        self.index = self.next_command = 0
        self.start_ns = self.get_clock().now().nanoseconds + int(0.1 * NS)
        self.replays += 1

    def _on_command(self, msg: CableCommand) -> None:
        """What a motor driver does with a command: validate, saturate, hold from its stamp."""
        self.diag.received("commands")
        problem = conv.header_problem(msg.header)
        if problem:
            return self.diag.reject(*problem, topic="commands")
        u, problem = conv.checked_command(msg, self.cable_names)
        if problem:
            return self.diag.reject(problem, "cable command", topic="commands")
        verdict = self.order.verdict("command", conv.stamp_ns(msg.header.stamp))
        if verdict in ("duplicate", "out_of_order"):
            return self.diag.reject(verdict, "command stamp not increasing", topic="commands")
        self.order.accept("command", conv.stamp_ns(msg.header.stamp))
        self.applied = np.clip(u, self.low, self.high)
        if np.any(self.applied != u):
            self.diag.count("commands_saturated")
        self.diag.accept("commands")

    def close(self) -> None:
        self.timer.cancel()


def main(args=None) -> int:
    return run_node(ExampleDriver, args)


if __name__ == "__main__":
    raise SystemExit(main())
