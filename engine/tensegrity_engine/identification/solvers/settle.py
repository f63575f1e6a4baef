"""Where a stream's assumed motor state no longer shows.

A stream cannot know where the motors were when it heard its first command, so it takes
them as settled there (``TupleSet.traj_act0_assumed``). The tuples that follow carry that
guess until the filter has forgotten its start. For a plain first-order filter that is a
few time constants. A rate-limited winch forgets only while it is not running flat out,
and a winch that chases its commands at top speed keeps its start's offset: on the zoo's
slow_winch (0.25 m/s against commands moving up to 1 m/s, motors 0.2 m from the first
command) the windowed solver fitted damping +450-830 % and tau -60-75 % with the winch
speed learnt, and -1.6 / +1.4 / -2.3 % and +1.0 / -1.0 / +0.6 % from motors that had
settled at the first command (`bench/online.py`, seeds 0-2).

So the wait is measured on the record's own commands: the filter run from both ends of the
command range. Any start inside the range stays between those two runs (the filter is
monotone in its state), so once they are within exp(-``time_constants``) of the span, no
start shows by more than that. Without a binding speed limit this is exactly
``time_constants`` time constants.
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
    guards a value not yet identified). Without a speed limit that can bind, an int:
    ``time_constants`` of them. With one, and ``ts`` (a ``TupleSet``) given, an array with one
    count per trajectory (read at a record's first piece): the filter run over that record's
    commands from both ends of the command range (`record_settle_steps`)."""
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
    tau_t = torch.as_tensor(tau, dtype=torch.float64)
    speed_t = torch.as_tensor(speed, dtype=torch.float64).detach().reshape(-1)
    if not speed_limit_binds(tau_t, speed_t, torch.as_tensor(high - low)):
        return plain
    steps = record_settle_steps(ts, low, high, tau_t, speed_t, robot.dt, time_constants)
    return np.maximum(np.ceil(steps + delay_steps).astype(np.int64), plain)


def record_settle_steps(ts, low: np.ndarray, high: np.ndarray, tau: torch.Tensor, speed: torch.Tensor,
                        dt: float, time_constants: float) -> np.ndarray:
    """[traj] engine steps from each record's first command until the filter run from the
    low and from the high end of the command range is within exp(-``time_constants``) of the
    span on every actuator (at the end of the stretch of constant command where that first
    holds; a record that never gets there: its length). Counted on a record's first piece;
    0 for pieces that continue one."""
    n = len(ts.traj_act0)
    out = np.zeros(n, dtype=np.float64)
    later = [[] for _ in range(n)]
    root = np.arange(n)
    for t in np.flatnonzero(ts.traj_prev >= 0):              # traj_prev[t] < t: in order
        root[t] = root[ts.traj_prev[t]]
        later[root[t]].append(t)
    tolerance = math.exp(-time_constants) * float((high - low).max())
    for r in np.flatnonzero(ts.traj_prev < 0):
        commands = np.clip(np.concatenate([ts.traj_commands[t] for t in [r] + later[r]]), low, high)
        out[r] = _steps_to_forget(commands, low, high, tau, speed, dt, tolerance)
    return out


def _steps_to_forget(commands: np.ndarray, low, high, tau, speed, dt: float, tolerance: float) -> float:
    change = np.flatnonzero(np.any(commands[1:] != commands[:-1], axis=1)) + 1
    begins = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(commands)]])
    a = torch.as_tensor(np.stack([low, high]))
    for b, e in zip(begins, ends):
        a = actuator_update(a, torch.as_tensor(commands[b]), tau, (e - b) * dt, speed)[0]
        if float((a[1] - a[0]).max()) <= tolerance:
            return float(e)
    return float(len(commands))


def motor_settled(ts, settle) -> np.ndarray:
    """[N] bool: the tuple starts ``settle`` engine steps or more after the start of its
    record's command timeline, where that start's actuator state is assumed
    (``TupleSet.traj_act0_assumed``); True wherever it is measured. ``settle``: one count
    for every record, or one per trajectory (`settle_steps` with ``ts``)."""
    assumed = ts.act0_assumed()
    n_traj = len(ts.traj_act0)
    offset, root = np.zeros(n_traj, dtype=np.int64), np.arange(n_traj)
    for t in np.flatnonzero(ts.traj_prev >= 0):            # traj_prev[t] < t: in order
        q = ts.traj_prev[t]
        offset[t], root[t] = offset[q] + len(ts.traj_commands[q]), root[q]
    elapsed = offset[ts.traj] + ts.start_step
    wait = np.broadcast_to(np.asarray(settle), (n_traj,))[root[ts.traj]]
    return ~assumed[root[ts.traj]] | (elapsed >= wait)
