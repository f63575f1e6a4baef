"""Rollout work, counted: a clock that does not depend on the machine or its load.

A session that budgets wall time (online identification) makes different decisions from
run to run, so two runs of one bench seed differ (three-bar damping +20 to +60 % in three
identical runs). Every rod-step the native kernel takes is counted here at a fixed
reference cost per integrator; a bench that advances its clock by this count instead of
the wall clock runs the same way on any machine, at any load.

Reference costs: the native kernel on one core of the 2-core AMD EPYC (Zen 4) these
benches ran on, float64, SUPERball and three-bar, batches of 16 and 128: semi-implicit
115-160 ns per rod-step, implicitfast 390-490, RK4 200-290; times `OVERHEAD` for the Python
around the rollouts, so that a reference second is about a wall second of an online session
on that machine (two 40 s SUPERball sessions, soft_slow and noisy_mocap, spent 37 s wall
where the kernel's count at 1.5x was 32-33 s).
"""
from __future__ import annotations

import threading

__all__ = ["REFERENCE_SECONDS", "WorkMeter", "METER"]

OVERHEAD = 1.7
REFERENCE_SECONDS = {"semi_implicit": OVERHEAD * 140e-9, "implicitfast": OVERHEAD * 430e-9,
                     "rk4": OVERHEAD * 250e-9}


class WorkMeter:
    """Rod-steps taken, and their reference seconds (`REFERENCE_SECONDS`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.rod_steps = 0
        self.seconds = 0.0

    def add(self, integrator: str, rod_steps: int) -> None:
        cost = REFERENCE_SECONDS[integrator]
        with self._lock:
            self.rod_steps += int(rod_steps)
            self.seconds += cost * int(rod_steps)


# every native rollout adds to this one (`NativeRollout.rollout_held`)
METER = WorkMeter()
