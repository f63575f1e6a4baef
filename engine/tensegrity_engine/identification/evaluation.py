"""Evaluation of identified parameters on whole trajectories."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

from tensegrity_engine.identification.dataset import Trajectory
from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.state import POS


def evaluate(params: PhysicalParameters, trajs: Sequence[Trajectory], *,
             integrator: str = "semi_implicit", dt: Optional[float] = None,
             device="cpu", dtype: torch.dtype = torch.float64, batch_size: int = 16) -> dict:
    """Roll the engine out for each whole trajectory from its first state under the
    recorded commands (and wrenches); CoM error at every sample on the dt grid.

    Needs velocities in the first state (pose-only test data: zero initial velocity is
    assumed, which is right for trajectories that start at rest). Returns dict with
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
            cmd = cmd.reshape(len(chunk), steps, fine, -1).mean(2)
            wr = None
            if chunk[0].wrench is not None:
                wr = f([t.wrench_grid(t.t[0], steps * fine, robot.dt) for t in chunk])
                wr = wr.reshape(len(chunk), steps, fine, *wr.shape[2:]).mean(2)
            pred, _ = engine.rollout(x0, act0, cmd, dt, integrator=integrator, wrenches=wr, params=p)
            com_pred = (pred[..., POS].cpu().double().numpy() * w[:, None]).sum(-2)   # [B, steps, 3]
            for i, t in enumerate(chunk):
                rel = t.t - t.t[0]
                k = np.rint(rel / dt).astype(int)
                ok = (np.abs(k * dt - rel) < 1e-6) & (k >= 1) & (k <= steps)
                err = np.full(steps, np.nan)
                err[k[ok] - 1] = np.linalg.norm(com_pred[i, k[ok] - 1] - t.center_of_mass()[ok], axis=-1)
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
