"""Where an online session's compute goes: seconds of the worker per kind of work (ROS-free).

On one core the solver shares the worker with the structure challengers, the held-out gate
and the published sigma's estimates, and what the solver reaches within the robot's first
minute depends on its share. Measured (`bench/online.py --clock work`, 2026-12-07): of the
75.6 reference seconds stiff_light seed 3's worker spent in 60 s of sim time, the solver's
epochs took 23.0, the challengers 10.5, the gate 8.9 and the two sigma estimates 31.2 (41 %;
the second alone 20.8, its lag-split check 4.6 of them); kitchen_sink seed 3: 16.0, 10.2,
9.5 and 23.5 of 62.6 (38 %). Counted exclusively: a gate inside a challenger's verdict is
the gate's, not the challenger's. The node publishes the account in its diagnostics
(``worker_compute``), the bench prints it per run.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import threading
from typing import Callable, Iterator

__all__ = ["WorkerAccount", "TimedCall", "accounted", "work_summary", "WORK_KINDS"]

# the kinds in the order they are reported (an unlisted label is reported after them)
WORK_KINDS = ("solver", "challengers", "gate", "sigma")


class TimedCall:
    """What `WorkerAccount.timed` yields: the call's whole seconds, nested ones included,
    once it has returned (a challenger's share counts them all)."""
    seconds = 0.0


def work_summary(seconds: dict, other: float = None) -> str:
    """"solver 7.9 s (10 %), ..." per kind of work in ``seconds``; ``other``: the worker's
    seconds none of them took."""
    seconds = dict(seconds) if other is None else {**seconds, "other": max(float(other), 0.0)}
    whole = sum(seconds.values())
    order = [k for k in WORK_KINDS if k in seconds] + sorted(k for k in seconds if k not in WORK_KINDS)
    return ", ".join(f"{k} {seconds[k]:.1f} s ({100.0 * seconds[k] / whole:.0f} %)" if whole > 0
                     else f"{k} {seconds[k]:.1f} s" for k in order)


class WorkerAccount:
    """Seconds per label of the calls timed with `timed`, exclusive of the timed calls
    nested in them (per thread: a node's worker, and its start-up publishing a checkpoint's
    values); any thread may read (`summary`: a node's diagnostics)."""

    def __init__(self):
        self.seconds: collections.Counter = collections.Counter()
        self._open = threading.local()       # per thread: the seconds each open call's nested calls took
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def timed(self, clock: Callable[[], float], label: str) -> Iterator[TimedCall]:
        stack = self._open.__dict__.setdefault("inner", [])
        call = TimedCall()
        start = clock()
        stack.append(0.0)
        try:
            yield call
        finally:
            spent = call.seconds = clock() - start
            inner = stack.pop()
            with self._lock:
                self.seconds[label] += spent - inner
            if stack:
                stack[-1] += spent

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self.seconds)

    def total(self) -> float:
        return float(sum(self.snapshot().values()))

    def summary(self, worker_total: float = None) -> str:
        """"solver 7.9 s (10 %), ..." per label; with the worker's ``worker_total`` seconds
        what none of the labels took is "other"."""
        seconds = self.snapshot()
        return work_summary(seconds, None if worker_total is None else float(worker_total) - sum(seconds.values()))


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
