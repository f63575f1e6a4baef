"""When the session's candidates meet the hold-out gate (`OnlineIdentification.gate`).

The gate rolls every held-out block out for the candidate (its start velocities fitted
first), which on the SUPERball costs most of an epoch: gated at every improvement (as
`bench/online.py` did), it took 15-17 s of a 60 s session's 50 s of compute on one core
(soft_slow, payload; 54-56 gates, 1-2 of them passed). So candidates wait: the newest
improvement replaces the one waiting, and it meets the gate once ``min_interval`` has
passed since the last publication and the gate has been idle ``spacing`` times as long as
it last took (at most 1 / (1 + spacing) of the worker's time). The identifier node and
`bench/online.py` pace their gates with this one object, so the bench measures the solver
with the compute the node gives it.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Optional

__all__ = ["GatePacing", "GATE_SPACING"]

# The gate idles this many times its own last duration: <= 1/5 of the worker's time.
GATE_SPACING = 4.0


class GatePacing:
    """The candidate waiting for the gate, and when it may meet it. ``clock`` returns
    seconds of the worker's time (``time.monotonic`` in the node; the bench's compute clock)."""

    def __init__(self, min_interval: float = 1.0, spacing: float = GATE_SPACING,
                 clock: Callable[[], float] = time.monotonic):
        if not (min_interval >= 0.0 and spacing >= 0.0):
            raise ValueError(f"min_interval and spacing must be >= 0 (got {min_interval}, {spacing})")
        self.min_interval, self.spacing, self.clock = float(min_interval), float(spacing), clock
        self.pending = None                  # the newest improvement not yet gated
        self.last_publish = -math.inf
        self.next_gate = -math.inf
        self.gates = 0

    def offer(self, candidate) -> None:
        """A newer improvement: it replaces the one waiting."""
        self.pending = candidate

    def drop(self) -> None:
        """The waiting candidate no longer applies (another structure was adopted, the
        schedule ended and its final values are gated at once)."""
        self.pending = None

    def due(self, force: bool = False):
        """The waiting candidate, taken off, if it may meet the gate now (``force``: whenever
        there is one); else None."""
        if self.pending is None:
            return None
        now = self.clock()
        if not force and (now - self.last_publish < self.min_interval or now < self.next_gate):
            return None
        candidate, self.pending = self.pending, None
        return candidate

    def gated(self, started: float) -> None:
        """A gate that began at ``started`` (``clock()``) has just ended: the next waits."""
        now = self.clock()
        self.gates += 1
        self.next_gate = now + self.spacing * max(0.0, now - started)

    def published(self) -> None:
        self.last_publish = self.clock()

    def gate(self, judge, force: bool = False) -> Optional[tuple]:
        """(candidate, ``judge(candidate)``) for the candidate that is due, timed; None if
        none is."""
        candidate = self.due(force)
        if candidate is None:
            return None
        started = self.clock()
        try:
            return candidate, judge(candidate)
        finally:
            self.gated(started)
