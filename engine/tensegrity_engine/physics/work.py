"""Rollout work, counted: a clock that does not depend on the machine or its load.

A session that budgets wall time (online identification) makes different decisions from
run to run, so two runs of one bench seed differ (three-bar damping +20 to +60 % in three
identical runs). Every rod-step the native kernel takes is counted here at a fixed
reference cost per integrator and ground contact law; a bench that advances its clock by
this count instead of the wall clock runs the same way on any machine, at any load.

Reference costs: the native kernel on one core of the 2-core AMD EPYC (Zen 4, AVX-512) these
benches run on, float64, the SUPERball (every online table's robot) rolling on the floor
under excitation, batches of 16 and 128 (`bench/engine_throughput.py`'s scenario; ns per
rod-step, penalty / soft law, 2026-12-07): semi-implicit 60, 47 / 92, 74; implicitfast
399, 371 / 306, 289; RK4 145, 123 / 267, 237. The three- and four-bar's cost up to 1.6x as
much under the soft law (three-bar semi-implicit soft 178, 122). Times `OVERHEAD` for the
Python around the rollouts, so that a reference second is about a wall second of an online
session on that machine: two SUPERball sessions run side by side (`bench/online.py --clock
work`, stiff_light and kitchen_sink seed 3) spent 30 and 28 s of wall for 3.19e8 and 2.65e8
rod-steps, 94 and 106 ns each.

Repriced 2026-12-07: the prices of 2026-11-29 (semi-implicit 80 / 140 ns, implicitfast 430,
RK4 250 / 500, times 1.7) predate the kernel's changes of 2026-11-30 and 2026-12-06, and
the Python around the rollouts costs less than it did; on them the same two sessions were
charged 76 and 63 reference seconds for 30 and 28 wall seconds, so a work-clock bench gave
the identifier 0.4 of the compute a robot's CPU gives it. Work-clock figures before this
date are at the old prices.
"""
from __future__ import annotations

import threading

__all__ = ["REFERENCE_SECONDS", "WorkMeter", "METER"]

OVERHEAD = 1.2
# (integrator, ground contact law) -> reference seconds per rod-step
REFERENCE_SECONDS = {
    ("semi_implicit", "penalty"): OVERHEAD * 54e-9, ("semi_implicit", "soft"): OVERHEAD * 82e-9,
    ("implicitfast", "penalty"): OVERHEAD * 385e-9, ("implicitfast", "soft"): OVERHEAD * 298e-9,
    ("rk4", "penalty"): OVERHEAD * 134e-9, ("rk4", "soft"): OVERHEAD * 252e-9,
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
