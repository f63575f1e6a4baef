"""Rollout work, counted: a clock that does not depend on the machine or its load.

A session that budgets wall time (online identification) makes different decisions from
run to run, so two runs of one bench seed differ (three-bar damping +20 to +60 % in three
identical runs). Every rod-step the native kernel takes is counted here at a fixed
reference cost per integrator and ground contact law; a bench that advances its clock by
this count instead of the wall clock runs the same way on any machine, at any load.

Reference costs: the native kernel on one core of the 2-core AMD EPYC (Zen 4) these
benches ran on, float64, rolling on the floor under excitation, batches of 16 and 128,
SUPERball, three- and four-bar (2026-11-30; ns per rod-step, penalty / soft law):
semi-implicit 58-94 / 120-204, implicitfast 430-508 / 406-553, RK4 186-241 / 405-636.
The soft law's Newton solve per contact is what doubles the explicit steps; implicitfast
pays for its own solve either way. Times `OVERHEAD` for the Python around the rollouts, so
that a reference second is about a wall second of an online session on that machine (two
40 s SUPERball sessions, soft_slow and noisy_mocap, spent 37 s wall where the kernel's count
at 1.5x was 32-33 s). The soft semi-implicit and implicitfast prices are those the meter
had before it priced the law (SUPERball figures on the work clock stand).
"""
from __future__ import annotations

import threading

__all__ = ["REFERENCE_SECONDS", "WorkMeter", "METER"]

OVERHEAD = 1.7
# (integrator, ground contact law) -> reference seconds per rod-step
REFERENCE_SECONDS = {
    ("semi_implicit", "penalty"): OVERHEAD * 80e-9, ("semi_implicit", "soft"): OVERHEAD * 140e-9,
    ("implicitfast", "penalty"): OVERHEAD * 430e-9, ("implicitfast", "soft"): OVERHEAD * 430e-9,
    ("rk4", "penalty"): OVERHEAD * 250e-9, ("rk4", "soft"): OVERHEAD * 500e-9,
}


class WorkMeter:
    """Rod-steps taken, and their reference seconds (`REFERENCE_SECONDS`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.rod_steps = 0
        self.seconds = 0.0

    def add(self, integrator: str, law: str, rod_steps: int) -> None:
        cost = REFERENCE_SECONDS[(integrator, law)]
        with self._lock:
            self.rod_steps += int(rod_steps)
            self.seconds += cost * int(rod_steps)


# every native rollout adds to this one (`NativeRollout.rollout_held`)
METER = WorkMeter()
