"""Evaluation of identified parameters on whole trajectories."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

from tensegrity_engine.identification.dataset import Trajectory
from tensegrity_engine.physics.config import MODEL_INTEGRATORS, RobotConfig
from tensegrity_engine.physics import native
from tensegrity_engine.physics.actuators import actuator_update, delayed_commands
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.stability import stable_substeps
from tensegrity_engine.physics.state import POS


def model_substeps(engine: TensegrityEngine, p: dict, integrator: Optional[str], dt: float) -> int:
    """Sub-steps of ``dt`` the model ``p`` needs to run true with its integrator (as its
    identification and its planner step it, `stability.stable_substeps`): a model is judged
    the way it is used. 1 for the explicit "implicit" and "ani" solvers."""
    integrator = engine.robot.integrator if integrator is None else integrator
    if integrator not in MODEL_INTEGRATORS:
        return 1
    return stable_substeps(engine.topology, p, dt, floor=engine.floor, integrator=integrator)


def _stepped_rollout(engine, x0, act0, cmd, dt, integrator, wr, p, k: int, record_every: int = 1):
    """engine.rollout with every step split into ``k`` sub-steps (commands and pushes held), in
    the C kernel where it applies (`native.forward_rollout`)."""
    if k > 1:
        cmd = cmd.repeat_interleave(k, dim=1)
        wr = None if wr is None else wr.repeat_interleave(k, dim=1)
    return native.forward_rollout(engine, x0, act0, cmd, dt / k, integrator=integrator, wrenches=wr, params=p,
                                  record_every=record_every * k)


def evaluate(params: PhysicalParameters, trajs: Sequence[Trajectory], *,
             integrator: Optional[str] = None, dt: Optional[float] = None,
             device="cpu", dtype: torch.dtype = torch.float64, batch_size: int = 16) -> dict:
    """Roll the engine out for each whole trajectory from its first state under the
    recorded commands as they act on the model (its ``actuator_delay``) and the recorded
    wrenches; CoM error at every sample on the dt grid.

    Needs velocities in the first state (pose-only test data: zero initial velocity is
    assumed, which is right for trajectories that start at rest). A model that diverges
    has error inf from there on. Returns dict with
    times [K], com_error [B, K], path_length [B], final_error [B], relative [B].
    """
    if not trajs:
        raise ValueError("no trajectories to evaluate")
    robot = params.robot
    dt = robot.dt if dt is None else float(dt)
    first = trajs[0]
    engine = TensegrityEngine(robot, params, fixed_rods=first.fixed_rods, floor=first.floor).to(device)
    duration = min(float(t.t[-1] - t.t[0]) for t in trajs)
    steps = int(math.floor(duration / dt + 1e-9))
    fine = int(round(dt / robot.dt))
    if abs(fine * robot.dt - dt) > 1e-12:
        raise ValueError("evaluation dt must be a whole number of engine steps")
    times = dt * np.arange(1, steps + 1)
    w = robot.rod_mass / robot.rod_mass.sum()
    errors, lengths = [], []
    with torch.no_grad():
        p = engine.param_values(dtype, device)
        for b0 in range(0, len(trajs), batch_size):
            chunk = trajs[b0:b0 + batch_size]
            f = lambda a: torch.as_tensor(np.stack(a), dtype=dtype, device=device)
            x0 = f([t.states()[0] for t in chunk])
            act0 = f([t.initial_act() for t in chunk])
            cmd = f([t.command_grid(t.t[0], steps * fine, robot.dt) for t in chunk])
            cmd = delayed_commands(cmd, p["actuator_delay"], robot.dt)       # as they act on the model
            cmd = cmd.reshape(len(chunk), steps, fine, -1).mean(2)
            wr = None
            if chunk[0].wrench is not None:
                wr = f([t.wrench_grid(t.t[0], steps * fine, robot.dt) for t in chunk])
                wr = wr.reshape(len(chunk), steps, fine, *wr.shape[2:]).mean(2)
            k = model_substeps(engine, p, integrator, robot.dt) if fine == 1 else 1
            pred, _ = _stepped_rollout(engine, x0, act0, cmd, dt, integrator, wr, p, k)
            com_pred = (pred[..., POS].cpu().double().numpy() * w[:, None]).sum(-2)   # [B, steps, 3]
            for i, t in enumerate(chunk):
                rel = t.t - t.t[0]
                k = np.rint(rel / dt).astype(int)
                ok = (np.abs(k * dt - rel) < 1e-6) & (k >= 1) & (k <= steps)
                err = np.full(steps, np.nan)
                gap = np.linalg.norm(com_pred[i, k[ok] - 1] - t.center_of_mass()[ok], axis=-1)
                err[k[ok] - 1] = np.where(np.isfinite(gap), gap, np.inf)    # a diverged model
                errors.append(err)
                lengths.append(t.path_length())
    err = np.stack(errors)
    valid = ~np.all(np.isnan(err), axis=0)
    err, times = err[:, valid], times[valid]
    lengths = np.array(lengths)
    final = err[:, -1]
    return {"times": times, "com_error": err, "path_length": lengths, "final_error": final,
            "relative": final / np.maximum(lengths, 1e-12)}


def parameter_errors(params: PhysicalParameters, reference: RobotConfig, names: Sequence[str]) -> dict:
    """Relative error of identified values against a reference config, per name."""
    ref = PhysicalParameters(reference).as_dict()
    got = params.as_dict()
    out = {}
    for n in names:
        r = np.broadcast_to(np.asarray(ref[n]), np.shape(got[n])) if len(got[n]) > 1 else np.mean(ref[n])
        out[n] = float(np.max(np.abs(np.asarray(got[n]) - r) / np.maximum(np.abs(r), 1e-12)))
    return out


def model_commands(params: PhysicalParameters, traj: Trajectory, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The model's actuator timeline over ``steps`` engine steps from the trajectory's start:
    ([steps + 1, A] filter states, [steps, A] commands as they act on the model): the
    recorded (clamped) commands delayed by its ``actuator_delay``, through its rate-limited
    first-order filter (``actuator_time_constant``, ``actuator_max_speed``), as the objective
    and the planner run it. A plain filter of the undelayed commands started a slow winch's
    model from filter states it cannot reach and fed a late robot's model early commands."""
    robot = params.robot
    v = {k: torch.as_tensor(np.asarray(x, dtype=np.float64)) for k, x in params.as_dict().items()}
    cmd = np.clip(traj.command_grid(traj.t[0], steps, robot.dt), robot.command_low, robot.command_high)
    acting = delayed_commands(torch.as_tensor(cmd, dtype=torch.float64), v["actuator_delay"], robot.dt)
    a = torch.as_tensor(np.asarray(traj.initial_act(), dtype=np.float64))
    states = a.new_empty(steps + 1, a.shape[-1])
    states[0] = a
    # The filter's closed form holds for any stretch of one command (the exact solution of its
    # ODE), so each stretch is one batched evaluation at 1..K steps, not K chained ones: the
    # same states up to rounding, and 10 Hz commands make ~100 steps a stretch (a Python loop
    # of steps was a third of a structure selection's wall time)
    changes = (acting[1:] != acting[:-1]).any(-1).nonzero().flatten() + 1
    bounds = [0] + changes.tolist() + [steps]
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e <= s:
            continue
        h = torch.arange(1, e - s + 1, dtype=torch.float64)[:, None] * robot.dt
        end = actuator_update(a.expand(e - s, -1), acting[s].expand(e - s, -1), v["actuator_time_constant"], h,
                              v["actuator_max_speed"])[0]
        states[s + 1:e + 1] = end
        a = end[-1]
    return states.numpy(), acting.numpy()


def filtered_commands(robot: RobotConfig, tau: float, traj: Trajectory, steps: int) -> np.ndarray:
    """[steps + 1, A] a plain first-order filter (time constant ``tau`` > 0) over the recorded
    (clamped) commands from the trajectory's start: a MuJoCo model's ``filterexact``
    activation, which integrates the same way (the engine's models: `model_commands`)."""
    decay = math.exp(-robot.dt / tau)
    cmd = np.clip(traj.command_grid(traj.t[0], steps, robot.dt), robot.command_low, robot.command_high)
    out = np.empty((steps + 1, robot.num_actuated))
    out[0] = traj.initial_act()
    for k in range(steps):
        out[k + 1] = cmd[k] + (out[k] - cmd[k]) * decay
    return out


def horizon_errors(params: PhysicalParameters, trajs: Sequence[Trajectory], horizons=(0.1, 0.5, 1.0), *,
                   stride: float = 0.5, integrator: Optional[str] = None, device="cpu",
                   dtype: torch.dtype = torch.float64, batch_size: int = 64) -> dict:
    """k-step-ahead prediction: restart the model from the recorded state every ``stride``
    s (the data's state, its own filter state: `model_commands`) and roll it ``h`` s ahead
    under the recorded commands as they act on it; CoM error at each horizon. The test for models of chaotic motion
    (rolling), where open-loop error over seconds measures the chaos more than the model.

    Needs velocities in the data. The model runs sub-stepped as it is used
    (`model_substeps`). Returns {h: errors [windows]} plus "windows".
    A model that diverges gives inf at the horizons it cannot reach."""
    if not trajs or not all(t.has_velocity for t in trajs):
        raise ValueError("horizon_errors needs trajectories with velocities")
    robot = params.robot
    horizons = sorted(float(h) for h in horizons)
    n_steps = [int(round(h / robot.dt)) for h in horizons]
    H = n_steps[-1]
    engine = TensegrityEngine(robot, params, fixed_rods=trajs[0].fixed_rods, floor=trajs[0].floor).to(device)
    w = robot.rod_mass / robot.rod_mass.sum()
    windows = []                                   # (x0, act0, commands, wrenches, true CoM per horizon)
    for t in trajs:
        states, com = t.states(), t.center_of_mass()
        total = int(math.floor((t.t[-1] - t.t[0]) / robot.dt + 1e-9))
        acts, acting = model_commands(params, t, total + H)     # + H: a window may end at t[-1] (rounding)
        for start in np.arange(t.t[0], t.t[-1] - horizons[-1] + 1e-9, stride):
            i0 = int(np.argmin(np.abs(t.t - start)))
            s0 = int(round((t.t[i0] - t.t[0]) / robot.dt))
            targets = [np.argmin(np.abs(t.t - (t.t[i0] + h))) for h in horizons]
            if abs(t.t[i0] - start) > 1e-6 or any(abs(t.t[j] - t.t[i0] - h) > 1e-6 for j, h in zip(targets, horizons)):
                continue
            wr = t.wrench_grid(t.t[i0], H, robot.dt)
            windows.append((states[i0], acts[s0], acting[s0:s0 + H], wr, com[targets]))
    if not windows:
        raise ValueError("no prediction window fits in the trajectories")
    errs = []
    with torch.no_grad():
        p = engine.param_values(dtype, device)
        k = model_substeps(engine, p, integrator, robot.dt)
        f = lambda a: torch.as_tensor(np.stack(a), dtype=dtype, device=device)
        for b0 in range(0, len(windows), batch_size):
            chunk = windows[b0:b0 + batch_size]
            wr = None if chunk[0][3] is None else f([c[3] for c in chunk])
            pred, _ = _stepped_rollout(engine, f([c[0] for c in chunk]), f([c[1] for c in chunk]),
                                       f([c[2] for c in chunk]), robot.dt, integrator, wr, p, k)
            com = (pred[:, [n - 1 for n in n_steps], :, 0:3].cpu().double().numpy() * w[:, None]).sum(-2)
            e = np.linalg.norm(com - np.stack([c[4] for c in chunk]), axis=-1)
            errs.append(np.where(np.isfinite(e), e, np.inf))
    errs = np.concatenate(errs)
    out = {h: errs[:, i] for i, h in enumerate(horizons)}
    out["windows"] = len(windows)
    return out
