"""The robot driver contract (docs/driver_contract.md) as checks on what a driver sent.

`DriverContractCheck` collects the pose and IMU messages one listener received (already
converted to arrays, with their stamps and the listener's receipt times) and the graph
facts (publisher QoS, who consumes commands), and `report()` lists every finding: a
*violation* breaks identification or control, a *warning* degrades it, *info* is a
measurement worth knowing (rate, latency). No rclpy here: `check_driver` is the node.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from tensegrity_engine.identification.measurements import imu_problem, pose_problem
from tensegrity_engine.identification.streaming import StreamConfig
from tensegrity_engine.physics.config import RobotConfig

from .conversions import array_to_rod_state
from tensegrity_engine.groundtruth.environments import lowest_point

NS = 1_000_000_000
VIOLATION, WARNING, INFO = "violation", "warning", "info"


@dataclasses.dataclass(frozen=True)
class Finding:
    level: str       # violation | warning | info
    check: str
    detail: str

    def __str__(self) -> str:
        return f"{self.level.upper():9s} {self.check}: {self.detail}"


class DriverContractCheck:
    """What a driver published during one listening window, judged against the contract
    for ``robot`` at pose rate ``rate`` (Hz)."""

    def __init__(self, robot: RobotConfig, rate: float = 10.0, frame: str = "world",
                 stamp_tolerance: float = 0.002):
        self.robot, self.rate, self.frame = robot, float(rate), frame
        self.tolerance_ns = int(stamp_tolerance * NS)
        self.limits = StreamConfig.for_robot(robot)
        self.pose_stamps: list[int] = []
        self.pose_receipts: list[int] = []
        self.poses: list[np.ndarray] = []
        self.pose_rejects: dict = {}
        self.frames: set = set()
        self.imu: dict = {}                 # rod -> [(stamp, omega, quat or None)]
        self.imu_rejects: dict = {}

    def add_pose(self, stamp_ns: int, receipt_ns: int, frame_id: str, arr: np.ndarray) -> None:
        self.frames.add(frame_id)
        problem = pose_problem(arr, self.robot.num_rods, max_abs_position=self.limits.max_abs_position,
                               quat_tolerance=self.limits.quat_tolerance)
        if problem:
            self.pose_rejects[problem] = self.pose_rejects.get(problem, 0) + 1
            return
        self.pose_stamps.append(int(stamp_ns))
        self.pose_receipts.append(int(receipt_ns))
        self.poses.append(np.asarray(arr, dtype=np.float64))

    def add_imu(self, stamp_ns: int, rod: Optional[int], omega, quat) -> None:
        problem = imu_problem(rod, omega, quat, self.robot.num_rods,
                              max_abs_angular_velocity=self.limits.max_abs_angular_velocity,
                              quat_tolerance=self.limits.quat_tolerance)
        if problem:
            self.imu_rejects[problem] = self.imu_rejects.get(problem, 0) + 1
            return
        self.imu.setdefault(int(rod), []).append((int(stamp_ns), np.asarray(omega, float),
                                                  None if quat is None else np.asarray(quat, float)))

    # ------------------------------------------------------------------ report
    def report(self, pose_publisher_reliable: Optional[list] = None,
               command_consumers: Optional[list] = None) -> list[Finding]:
        """``pose_publisher_reliable``: one bool per publisher of the pose topic (None:
        unknown); ``command_consumers``: names of the nodes subscribed to the command topic
        other than this package's."""
        out = self._pose_findings()
        out += self._imu_findings()
        if pose_publisher_reliable is not None:
            if not pose_publisher_reliable:
                out.append(Finding(VIOLATION, "pose_publisher", "nobody publishes the pose topic"))
            elif not all(pose_publisher_reliable):
                out.append(Finding(VIOLATION, "pose_qos", "a pose publisher is BEST_EFFORT: the identifier and "
                                   "controller subscribe RELIABLE and never match it"))
        if command_consumers is not None:
            if command_consumers:
                out.append(Finding(INFO, "command_consumers", ", ".join(sorted(command_consumers))))
            else:
                out.append(Finding(VIOLATION, "command_consumers", "no driver subscribes to the command topic"))
        return out

    def _pose_findings(self) -> list[Finding]:
        out = []
        total = len(self.poses) + sum(self.pose_rejects.values())
        if total == 0:
            return [Finding(VIOLATION, "poses", "no pose arrived")]
        if self.frames - {self.frame}:
            out.append(Finding(VIOLATION, "pose_frame", f"header.frame_id {sorted(self.frames)}; the contract is "
                               f"{self.frame!r} (z up, floor at contact.ground_height)"))
        for reason, n in sorted(self.pose_rejects.items()):
            out.append(Finding(VIOLATION, f"pose_{reason}", f"{n} of {total} pose arrays refused"))
        if len(self.poses) < 3:
            out.append(Finding(VIOLATION, "poses", f"only {len(self.poses)} usable pose arrays"))
            return out
        stamps = np.array(self.pose_stamps)
        steps = np.diff(stamps)
        if (steps <= 0).any():
            out.append(Finding(VIOLATION, "pose_stamps", f"{int((steps <= 0).sum())} stamps not increasing"))
        period = int(round(NS / self.rate))
        on_grid = np.abs(steps - period) <= self.tolerance_ns
        median = float(np.median(steps)) / NS
        level = INFO if on_grid.mean() >= 0.95 else VIOLATION
        out.append(Finding(level, "pose_rate", f"median period {median * 1e3:.1f} ms ({1 / median:.2f} Hz), "
                           f"{100 * on_grid.mean():.0f} % of periods within {self.tolerance_ns / 1e6:g} ms of "
                           f"{1e3 / self.rate:g} ms" + ("" if level == INFO else
                                                        ": the identifier splits the stream off the grid")))
        gaps = int((steps > 1.5 * period).sum())
        if gaps:
            out.append(Finding(WARNING, "pose_gaps", f"{gaps} dropped pose periods (each splits a segment)"))
        age = (np.array(self.pose_receipts) - stamps) / NS
        lat = f"receipt - stamp: median {np.median(age) * 1e3:.1f} ms, 95th pct {np.percentile(age, 95) * 1e3:.1f} ms"
        if np.median(age) < -0.005:
            out.append(Finding(VIOLATION, "pose_clock", lat + ": stamps are ahead of this clock (clocks not "
                               "synchronised, or use_sim_time differs)"))
        elif np.median(age) > 0.25:
            out.append(Finding(WARNING, "pose_latency", lat + ": stamp the measurement time, not a later one"))
        else:
            out.append(Finding(INFO, "pose_latency", lat))
        out += self._floor_findings()
        return out

    def _floor_findings(self) -> list[Finding]:
        """Rod ends below the floor mean a frame with another up axis or origin."""
        lowest = min(lowest_point(self.robot, array_to_rod_state(p)) for p in self.poses)
        worst = self.robot.contact.ground_height - lowest           # depth below the floor
        if worst > 0.02:
            return [Finding(VIOLATION, "pose_floor", f"a rod end is {worst * 100:.1f} cm below the floor: is the "
                            "frame z-up with the floor at contact.ground_height, and the rod axis the pose's z?")]
        return [Finding(INFO, "pose_floor", f"lowest rod surface {-worst * 100:+.1f} cm above the floor")]

    def _imu_findings(self) -> list[Finding]:
        out = [Finding(VIOLATION, f"imu_{r}", f"{n} IMU messages refused") for r, n in sorted(self.imu_rejects.items())]
        if not self.imu:
            return out + [Finding(INFO, "imu", "no IMU (optional): angular velocity from pose differences")]
        missing = sorted(set(range(self.robot.num_rods)) - set(self.imu))
        if missing:
            out.append(Finding(WARNING, "imu_rods", f"no IMU for rods {missing}"))
        out += self._imu_orientation_findings()
        n = sum(len(v) for v in self.imu.values())
        out.append(Finding(INFO, "imu", f"{n} messages from {len(self.imu)} rods"))
        return out

    def _imu_orientation_findings(self) -> list[Finding]:
        """An IMU orientation that disagrees with the pose: the gyro is not in the rod frame."""
        if len(self.poses) == 0:
            return []
        stamps = np.array(self.pose_stamps)
        worst = 0.0
        for rod, samples in self.imu.items():
            for stamp, _, q in samples:
                i = int(np.argmin(np.abs(stamps - stamp)))
                if q is None or abs(stamps[i] - stamp) > self.tolerance_ns:
                    continue
                qp = self.poses[i][rod, 3:]
                worst = max(worst, 2.0 * np.degrees(np.arccos(min(1.0, abs(float(np.dot(q, qp)))))))
        if worst > 5.0:
            return [Finding(VIOLATION, "imu_frame", f"IMU orientation differs from the rod pose by up to "
                            f"{worst:.0f} deg: angular_velocity must be in the rod frame (z = rod axis)")]
        return []
