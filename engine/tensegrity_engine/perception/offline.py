"""Tracking a recording after the fact: the frames of a run through a `TrackingSession`,
every frame's outcome kept.

A recording is a sequence of `DepthFrame` (time, one depth image per camera, and the
cameras when they moved: a tripod carried along, a calibration that changed). `track_frames`
gives each to the session in time order and logs the outcome in a `TrackingLog`, which
saves as a plain npz (no pickled objects) and hands the good frames on as rod poses, e.g.
for a trajectory file that `tensegrity-identify` reads.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from tensegrity_engine.perception.camera import PinholeCamera
from tensegrity_engine.perception.session import Commands, TrackedFrame, TrackingSession

__all__ = ["DepthFrame", "TrackingLog", "track_frames", "held_commands", "STATUSES"]

STATUSES = ("tracked", "reacquired", "lost", "rejected")


@dataclasses.dataclass
class DepthFrame:
    t: float                                          # capture time (s)
    depths: Sequence[np.ndarray]                      # [H, W] metres per camera, NaN = no return
    cameras: Optional[Sequence[PinholeCamera]] = None  # when they changed at this frame


class TrackingLog:
    """Every frame's outcome, in order."""

    def __init__(self, num_rods: int):
        self.num_rods = num_rods
        self.t: list[float] = []
        self.status: list[str] = []
        self.reason: list[str] = []
        self.ends: list[np.ndarray] = []     # NaN where no estimate
        self.std: list[np.ndarray] = []
        self.state: list[np.ndarray] = []    # [R, 13] rod poses of good frames, NaN otherwise
        self.iou: list[float] = []
        self.rms: list[float] = []

    def add(self, t: float, out: TrackedFrame) -> None:
        R = self.num_rods
        est = out.estimate
        self.t.append(float(t))
        self.status.append(out.status)
        self.reason.append(out.reason)
        self.ends.append(est.ends if est is not None else np.full((R, 2, 3), np.nan))
        self.std.append(est.std if est is not None else np.full((R, 5), np.nan))
        self.state.append(out.state if out.good else np.full((R, 13), np.nan))
        self.iou.append(est.iou if est is not None else np.nan)
        self.rms.append(est.rms if est is not None else np.nan)

    def __len__(self) -> int:
        return len(self.t)

    @property
    def good(self) -> np.ndarray:
        return np.array([s in ("tracked", "reacquired") for s in self.status], dtype=bool)

    def counts(self) -> dict:
        return {s: self.status.count(s) for s in STATUSES}

    def arrays(self) -> dict:
        """Plain arrays: t [F], status [F] (index into STATUSES), ends [F, R, 2, 3], std
        [F, R, 5], position [F, R, 3], quaternion [F, R, 4] (w, x, y, z; NaN on frames
        not tracked), iou, rms [F]."""
        state = np.array(self.state).reshape(-1, self.num_rods, 13)
        return {"t": np.array(self.t), "status": np.array([STATUSES.index(s) for s in self.status], dtype=np.int8),
                "status_names": np.array(STATUSES), "reason": np.array(self.reason, dtype=str),
                "ends": np.array(self.ends).reshape(-1, self.num_rods, 2, 3),
                "std": np.array(self.std).reshape(-1, self.num_rods, 5),
                "position": state[:, :, 0:3], "quaternion": state[:, :, 3:7],
                "iou": np.array(self.iou), "rms": np.array(self.rms)}

    def summary(self, wall: float, what: str) -> str:
        """One line: frames by status, overlap of the good ones, time per frame."""
        iou = np.array(self.iou)[self.good]
        return (f"{len(self)} frames from {what}: " + ", ".join(f"{k} {v}" for k, v in self.counts().items())
                + (f"; overlap median {np.median(iou):.2f}, min {iou.min():.2f}" if len(iou) else "")
                + f"; {wall / max(len(self), 1) * 1e3:.0f} ms per frame")

    def save(self, path) -> None:
        """An npz of `arrays` (readable with ``np.load(path)``, no pickle)."""
        np.savez_compressed(path, **self.arrays())


def track_frames(session: TrackingSession, frames: Iterable[DepthFrame], *, first_state: np.ndarray,
                 first_time: float, commands: Optional[Commands] = None,
                 on_frame: Optional[Callable[[DepthFrame, TrackedFrame], None]] = None) -> TrackingLog:
    """Track ``frames`` (in time order) from the announced rod state ``first_state`` [R, 13]
    at ``first_time`` (s). A track that ends (lost too long, a gap) is not restarted: a
    recording announces its first pose once, so the rest of the frames are logged as
    rejected. ``on_frame`` sees each frame and its outcome (e.g. to draw an overlay)."""
    session.start(first_state, first_time, commands)
    log = TrackingLog(session.robot.num_rods)
    for frame in frames:
        if frame.cameras is not None:
            session.set_cameras(frame.cameras)
        out = session.frame(frame.t, frame.depths, commands)
        log.add(frame.t, out)
        if on_frame is not None:
            on_frame(frame, out)
    return log


def held_commands(command_time: np.ndarray, command: np.ndarray, before: np.ndarray) -> Commands:
    """A command table as the prior's input: times [S] -> [S, A], each command held from its
    time (zero-order hold), ``before`` [A] in force before the first."""
    command_time = np.asarray(command_time, dtype=np.float64)
    table = np.concatenate([np.asarray(before, dtype=np.float64)[None], np.asarray(command, dtype=np.float64)])

    def commands(times):
        return table[np.searchsorted(command_time, np.asarray(times), side="right")]
    return commands
