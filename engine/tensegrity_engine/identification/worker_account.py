"""Where an online session's compute goes: seconds of the worker per kind of work (ROS-free).

On one core the solver shares the worker with the structure challengers, the held-out gate
and the published sigma's estimate, and what the solver reaches within the robot's first
minute depends on its share. Measured (`bench/online.py --truth zoo/stiff_light --clock
work`, seeds 3 and 4, 2026-12-07): of the 76 / 61 reference seconds the worker spent in 60 s
of sim time, the two sigma estimates took 31 / 25 (41 %; the second alone 21 / 17 s, the
lag-split check 9 of them), the challengers 26 / 19, the gate 9 / 6, the solver's epochs 8 /
10. Counted exclusively: a gate inside a challenger's verdict is the gate's, not the
challenger's. The node publishes the shares in its diagnostics, the bench prints them.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import threading
from typing import Callable, Iterator

__all__ = ["WorkerAccount", "accounted", "WORK_KINDS"]

# the kinds in the order they are reported (an unlisted label is reported after them)
WORK_KINDS = ("solver", "challengers", "gate", "sigma")


class WorkerAccount:
    """Seconds per label of the calls timed with `timed`, exclusive of the timed calls
    nested in them. One thread times (the worker's); any may read (`summary`: a node's
    diagnostics)."""

    def __init__(self):
        self.seconds: collections.Counter = collections.Counter()
        self._inner: list[float] = []        # per open call: the seconds its nested calls took
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def timed(self, clock: Callable[[], float], label: str) -> Iterator[None]:
        start = clock()
        self._inner.append(0.0)
        try:
            yield
        finally:
            spent = clock() - start
            inner = self._inner.pop()
            with self._lock:
                self.seconds[label] += spent - inner
            if self._inner:
                self._inner[-1] += spent

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self.seconds)

    def total(self) -> float:
        return float(sum(self.snapshot().values()))

    def summary(self, worker_total: float = None) -> str:
        """"solver 7.9 s (10 %), ..." per label; with the worker's ``worker_total`` seconds
        what none of the labels took is "other"."""
        seconds = self.snapshot()
        if worker_total is not None:
            seconds["other"] = max(float(worker_total) - self.total(), 0.0)
        whole = sum(seconds.values())
        order = [k for k in WORK_KINDS if k in seconds] + sorted(k for k in seconds if k not in WORK_KINDS)
        return ", ".join(f"{k} {seconds[k]:.1f} s ({100.0 * seconds[k] / whole:.0f} %)" if whole > 0
                         else f"{k} {seconds[k]:.1f} s" for k in order)


def accounted(label: str):
    """A method of an object with ``work`` (a `WorkerAccount`) and ``compute_clock``: each
    call's seconds counted under ``label``."""
    def wrap(method):
        @functools.wraps(method)
        def timed_method(self, *args, **kwargs):
            with self.work.timed(self.compute_clock, label):
                return method(self, *args, **kwargs)
        return timed_method
    return wrap
