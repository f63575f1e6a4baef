"""A camera track over time: motion prior, fit, re-acquisition, and when a track ends.

`TrackingSession` is what the `camera_tracker` node and the offline `tensegrity-track`
tool both run, so a recording tracked offline gives the poses the node would have
published live. A track starts from an announced rod state (a depth camera cannot tell
rods apart: identity comes from the announcement and continuity). Each frame (one depth
image per camera, one time):

1. the motion prior predicts the rods at the frame's time: the engine (``"engine"``, e.g.
   with identified values, rolled under the commands sent) or a constant velocity;
2. `RodTracker.track` fits the images from there;
3. a lost fit (silhouette overlap below the tracker's ``lost_iou``, or a rod the images
   contradict) is fitted again by moving the last good shape as one body onto the images
   (`RodTracker.reacquire`); the prior then restarts there at rest;
4. a frame still lost is not a pose; after ``max_lost`` lost frames in a row, or a frame
   more than ``max_gap`` s after the last good one (nothing can be predicted that far),
   the track ends and waits for a new announcement.

Rejections (a frame older than the track, a diverged prior, no track) come back as
``status == "rejected"`` with a reason, for the caller to count. What the caller must
have checked raises ValueError: images of the cameras' sizes, one per camera, and the
commands when the prior is the engine.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np

from tensegrity_engine.perception.camera import PinholeCamera
from tensegrity_engine.perception.motion import ConstantVelocityPrior, EnginePrior, rod_poses_from_ends
from tensegrity_engine.perception.tracker import RodPoseEstimate, RodTracker, TrackerConfig
from tensegrity_engine.physics.state import end_nodes

__all__ = ["TrackedFrame", "TrackingSession", "MOTION_PRIORS"]

MOTION_PRIORS = ("engine", "velocity")
# fn: evenly spaced times [S] (s) -> the commands in force then [S, A]
Commands = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass
class TrackedFrame:
    status: str                           # tracked | reacquired | lost | rejected
    estimate: Optional[RodPoseEstimate] = None
    state: Optional[np.ndarray] = None    # [R, 13] rod poses (zero velocities) when tracked / reacquired
    reason: str = ""                      # why rejected or lost, a short token
    detail: str = ""
    track_ended: bool = False             # this frame ended the track: a new announcement is needed

    @property
    def good(self) -> bool:
        return self.status in ("tracked", "reacquired")


class TrackingSession:
    """Rod poses from a stream of depth frames (see the module docstring)."""

    def __init__(self, robot, cameras: Sequence[PinholeCamera], config: TrackerConfig = TrackerConfig(), *,
                 motion_prior: str = "engine", model=None, acceleration: Optional[float] = None,
                 max_lost: int = 10, max_gap: float = 5.0, period: float = 0.1, floor="robot"):
        """``model``: the engine prior's `PhysicalParameters` (the config's when None).
        ``acceleration``: the prior's unmodelled acceleration (m/s^2 and rad/s^2; None: 2
        for the engine, 5 for a constant velocity). ``period``: the expected frame
        interval (the constant-velocity prior's default step)."""
        if motion_prior not in MOTION_PRIORS:
            raise ValueError(f"motion_prior must be one of {MOTION_PRIORS}, not {motion_prior!r}")
        if not (max_lost >= 1 and max_gap > 0 and period > 0):
            raise ValueError("max_lost >= 1, max_gap > 0 and period > 0 are required")
        from tensegrity_engine.physics.params import PhysicalParameters

        self.robot = robot
        self.config = config
        self.floor = floor
        self.motion_prior = motion_prior
        self.model = model if model is not None else PhysicalParameters(robot)
        self.acceleration = acceleration if acceleration is not None else (2.0 if motion_prior == "engine" else 5.0)
        self.max_lost, self.max_gap, self.period = int(max_lost), float(max_gap), float(period)
        self.tracker: Optional[RodTracker] = None
        self.cameras: list[PinholeCamera] = []
        self.set_cameras(cameras)
        self.prior = None               # None: no track, waiting for an announced pose
        self.quat = None                # [R, 4] the spin the camera cannot see, carried on
        self.last_t = None              # time (s) of the last good pose
        self.last_ends = None           # the last good shape: a lost track is re-found with it
        self.fresh = False              # one frame at the announced instant is still welcome
        self.lost_in_row = 0

    @property
    def tracking(self) -> bool:
        return self.prior is not None

    def set_cameras(self, cameras: Sequence[PinholeCamera]) -> None:
        """New calibration(s): the tracker is rebuilt; the track goes on."""
        cameras = list(cameras)
        if not cameras:
            raise ValueError("the tracker needs at least one camera")
        self.cameras = cameras
        self.tracker = RodTracker(self.robot, cameras, self.config, floor=self.floor)

    def set_model(self, params) -> None:
        """The engine prior's model from now on (e.g. newly identified values); the track
        (estimates and the model's actuator state) goes on."""
        self.model = params
        if isinstance(self.prior, EnginePrior):
            self.prior = self.prior.with_params(params)

    def start(self, rod_state: np.ndarray, t: float, commands: Optional[Commands] = None) -> None:
        """(Re)start the track from an announced rod state [R, 13] at time ``t`` (s), the
        robot's actuators at the command in force then (``commands``: required by the
        engine prior)."""
        rod_state = np.asarray(rod_state, dtype=np.float64)
        if rod_state.shape != (self.robot.num_rods, 13) or not np.isfinite(rod_state).all():
            raise ValueError(f"the announced state must be finite [{self.robot.num_rods}, 13]")
        if self.motion_prior == "engine":
            if commands is None:
                raise ValueError("the engine motion prior needs the commands sent")
            self.prior = EnginePrior(self.model, acceleration=self.acceleration,
                                     angular_acceleration=self.acceleration)
            self.prior.reset(rod_state, self._command_at(commands, t), t)
        else:
            self.prior = ConstantVelocityPrior(self.period, acceleration=self.acceleration,
                                               angular_acceleration=self.acceleration)
            self.prior.reset(end_nodes(rod_state, self.robot.rod_length / 2), t)
        self.quat, self.last_t, self.lost_in_row = rod_state[:, 3:7].copy(), float(t), 0
        self.last_ends = end_nodes(rod_state, self.robot.rod_length / 2)
        self.fresh = True

    @staticmethod
    def _command_at(commands: Commands, t: float) -> np.ndarray:
        return np.asarray(commands(np.array([float(t)])), dtype=np.float64)[0]

    def _end(self) -> None:
        self.prior = None

    # ------------------------------------------------------------------ frames
    def frame(self, t: float, depths: Sequence[np.ndarray], commands: Optional[Commands] = None) -> TrackedFrame:
        """Track one frame: ``depths`` one image per camera (metres, NaN = no return) at
        time ``t`` (s); ``commands`` the commands sent (required by the engine prior)."""
        if self.prior is None:
            return TrackedFrame("rejected", reason="no_track", detail="waiting for the robot's announced pose")
        t = float(t)
        if t < self.last_t or (t == self.last_t and not self.fresh):
            return TrackedFrame("rejected", reason="out_of_order", detail="frame not newer than the last pose")
        if t - self.last_t > self.max_gap:
            self._end()
            return TrackedFrame("rejected", reason="gap", track_ended=True,
                                detail=f"{t - self.last_t:.2f} s since the last pose (over {self.max_gap} s): "
                                       "waiting for a new announced pose")
        if isinstance(self.prior, EnginePrior) and commands is None:
            raise ValueError("the engine motion prior needs the commands sent")
        try:
            guess, sigma = self.prior.predict(t, commands)
        except FloatingPointError as exc:          # the model diverged: back to an announced pose
            self._end()
            return TrackedFrame("rejected", reason="prior_diverged", detail=str(exc), track_ended=True)
        est = self.tracker.track(depths, guess, sigma)
        status = "tracked"
        if est.lost and self.last_ends is not None:
            try:                                   # the last good shape, moved as one body
                found = self.tracker.reacquire(depths, self.last_ends)
            except ValueError:                     # too few robot pixels: nothing to find it in
                found = est
            if not found.lost:
                est, status = found, "reacquired"
                self._restart(est.ends, t, commands)
        if est.lost:
            self.lost_in_row += 1
            ended = self.lost_in_row >= self.max_lost
            if ended:
                self._end()
            bad = [] if est.contradicted is None else np.flatnonzero(est.contradicted).tolist()
            why = f"rods {bad} contradicted by the images" if bad else f"silhouette overlap {est.iou:.2f}"
            return TrackedFrame("lost", est, reason="contradicted" if bad else "low_overlap", track_ended=ended,
                                detail=f"{why}, {t - self.last_t:.2f} s after the last good pose"
                                       + (f"; {self.lost_in_row} lost in a row: track ended" if ended else ""))
        self.lost_in_row = 0
        self.fresh = False
        self.last_ends = est.ends
        if t > self.last_t:                        # not the announced instant, not a re-found robot
            self.prior.update(est.ends, est.std, t, commands)
        state = rod_poses_from_ends(est.ends, self.quat)
        self.quat, self.last_t = state[:, 3:7], t
        return TrackedFrame(status, est, state)

    def _restart(self, ends: np.ndarray, t: float, commands: Optional[Commands]) -> None:
        """The prior starts again at a re-found pose, at rest (its velocity unknown)."""
        if isinstance(self.prior, EnginePrior):
            self.prior.reset(rod_poses_from_ends(ends, self.quat), self._command_at(commands, t), t)
        else:
            self.prior.reset(ends, t)
        self.last_t = t
