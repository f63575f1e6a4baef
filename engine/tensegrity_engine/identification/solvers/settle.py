"""Where a stream's assumed motor state no longer shows.

A stream cannot know where the motors were when it heard its first command, so it takes
them as settled there (``TupleSet.traj_act0_assumed``). The tuples that follow carry that
guess until the filter has forgotten its start. For a plain first-order filter that is a
few time constants. A rate-limited winch forgets only while it is not running flat out,
and a winch that chases its commands at top speed keeps its start's offset: on the zoo's
slow_winch (0.25 m/s against commands moving up to 1 m/s, motors 0.2 m from the first
command) the solver fitted damping +556 / +454 / +36 % and tau -72 / -58 / -4 % with the
winch speed learnt (seeds 0-2, `bench/online.py`), and -1.6 / +1.4 / -2.3 % and
+1.0 / -1.0 / +0.6 % from motors that had settled at the first command.

So the wait is measured on the record's own commands: the filter run from both ends of the
command range. Any start inside the range stays between those two runs (the filter is
monotone in its state), so once they are within exp(-``time_constants``) of each actuator's
span, no start shows by more than that. Without a binding speed limit this is exactly
``time_constants`` time constants. The run uses the larger of the current and the config's
time constant and the current speed limit: a guard against a time constant not yet
identified, not a bound for every value (with a binding limit a larger time constant is
not always the slower to forget).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tensegrity_engine.physics.actuators import actuator_update, speed_limit_binds


def _largest(v) -> float:
    return float(torch.as_tensor(v).detach().max())


def settle_steps(robot, p: dict, time_constants: float, ts=None):
    """Engine steps after a record's first command from which its assumed motor state no
    longer shows, plus the delay; 0 when ``time_constants`` is 0 (no wait).

    The filter's time constant is the larger of the current and the config's (the config's
    guards a value not yet identified); the speed limit is the current one. Without a speed
    limit that can bind, an int: ``time_constants`` of them. With one, and ``ts`` (a
    ``TupleSet``) given, an array with one count per trajectory (read at a record's first
    piece): the filter run over that record's commands from both ends of the command range
    (`record_settle_steps`), never less than the int."""
    if not time_constants:
        return 0
    tau = max(_largest(p["actuator_time_constant"]), float(robot.actuator.time_constant))
    delay_steps = max(_largest(p.get("actuator_delay", robot.actuator.delay)), 0.0) / robot.dt
    plain = int(math.ceil(time_constants * tau / robot.dt + delay_steps))
    speed = p.get("actuator_max_speed")
    if ts is None or speed is None or not ts.act0_assumed().any():
        return plain
    low = np.asarray(robot.command_low, dtype=np.float64)
    high = np.asarray(robot.command_high, dtype=np.float64)
    tau_t = torch.tensor(tau, dtype=torch.float64)
    speed_t = torch.as_tensor(speed).detach().to("cpu", torch.float64).reshape(-1)     # any device
    if not speed_limit_binds(tau_t, speed_t, torch.as_tensor(high - low)):
        return plain
    steps = record_settle_steps(ts, low, high, tau_t, speed_t, robot.dt, time_constants)
    return np.maximum(np.ceil(steps + delay_steps).astype(np.int64), plain)


def record_settle_steps(ts, low: np.ndarray, high: np.ndarray, tau: torch.Tensor, speed: torch.Tensor,
                        dt: float, time_constants: float) -> np.ndarray:
    """[traj] engine steps from each assumed record's first command until the filter run
    from the low and from the high end of the command range is within exp(-``time_constants``)
    of each actuator's span on every actuator (a record that never gets there: its length);
    0 for measured records and for pieces that continue one. Remembered on ``ts`` per
    (tau, speed, time constants): the solvers ask once per iteration."""
    key = (float(tau), tuple(speed.tolist()), float(dt), float(time_constants),
           tuple(low.tolist()), tuple(high.tolist()))
    memo = ts.__dict__.setdefault("_settle_memo", {})
    if key in memo:
        return memo[key]
    root, _ = _records(ts)
    out = np.zeros(len(root), dtype=np.float64)
    tolerance = torch.as_tensor(math.exp(-time_constants) * (high - low))
    for r in np.flatnonzero((ts.traj_prev < 0) & ts.act0_assumed()):
        pieces = np.flatnonzero(root == r)                   # r first, then its pieces in order
        commands = np.clip(np.concatenate([ts.traj_commands[t] for t in pieces]), low, high)
        out[r] = _steps_to_forget(commands, low, high, tau, speed, dt, tolerance)
    memo.clear()                                             # one entry: the values move on
    memo[key] = out
    return out


def _steps_to_forget(commands: np.ndarray, low, high, tau, speed, dt: float, tolerance: torch.Tensor) -> int:
    """Steps until the runs from ``low`` and ``high`` are within ``tolerance`` [A]: stretch by
    stretch of constant command, then bisected inside the stretch where it first holds (under
    a held command the gap between the runs never grows)."""
    change = np.flatnonzero(np.any(commands[1:] != commands[:-1], axis=1)) + 1
    begins = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(commands)]])
    a = torch.as_tensor(np.stack([low, high]))

    def after(start, u, steps):
        return actuator_update(start, u, tau, steps * dt, speed)[0]

    def within(x) -> bool:
        return bool(((x[1] - x[0]) <= tolerance).all())

    if within(a):
        return 0
    for b, e in zip(begins, ends):
        u = torch.as_tensor(commands[b])
        end = after(a, u, e - b)
        if within(end):
            lo, hi = 0, int(e - b)                       # not within after lo steps, within after hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if within(after(a, u, mid)) else (mid, hi)
            return int(b + hi)
        a = end
    return len(commands)


def motor_settled(ts, settle) -> np.ndarray:
    """[N] bool: the tuple starts ``settle`` engine steps or more after the start of its
    record's command timeline, where that start's actuator state is assumed
    (``TupleSet.traj_act0_assumed``); True wherever it is measured. ``settle``: one count
    for every record, or one per trajectory (`settle_steps` with ``ts``)."""
    assumed = ts.act0_assumed()
    root, offset = _records(ts)
    elapsed = offset[ts.traj] + ts.start_step
    wait = np.broadcast_to(np.asarray(settle), (len(root),))[root[ts.traj]]
    return ~assumed[root[ts.traj]] | (elapsed >= wait)


def _records(ts) -> tuple[np.ndarray, np.ndarray]:
    """([traj] the first piece of each trajectory's record, [traj] engine steps from that
    record's first command to the trajectory's start)."""
    n_traj = len(ts.traj_act0)
    offset, root = np.zeros(n_traj, dtype=np.int64), np.arange(n_traj)
    for t in np.flatnonzero(ts.traj_prev >= 0):            # traj_prev[t] < t: in order
        q = ts.traj_prev[t]
        offset[t], root[t] = offset[q] + len(ts.traj_commands[q]), root[q]
    return root, offset
