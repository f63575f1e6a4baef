"""Camera-tracked rod poses as a trajectory file: what `tensegrity-identify` reads."""
from __future__ import annotations

import numpy as np

from tensegrity_engine.identification.dataset import Trajectory
from tensegrity_engine.perception.offline import TrackingLog

__all__ = ["write_tracked_trajectory"]


def write_tracked_trajectory(path, robot, log: TrackingLog, command_time: np.ndarray, command: np.ndarray, *,
                             floor: bool, meta: dict) -> Trajectory:
    """The log's good frames under known commands (pose-only; the frames before the first
    command are dropped: a trajectory starts under a known command) saved at ``path``."""
    a, good = log.arrays(), log.good
    t = a["t"][good]
    keep = t >= command_time[0]
    if keep.sum() < 2:
        raise ValueError("fewer than 2 tracked frames under known commands: no trajectory")
    traj = Trajectory(robot=robot, t=t[keep], position=a["position"][good][keep],
                      quaternion=a["quaternion"][good][keep], command_time=command_time, command=command,
                      environment={"name": "camera", "floor": floor, "fixed_rods": []},
                      meta={"source": "camera tracking", **meta}, source=str(path))
    traj.save(path)
    return traj
