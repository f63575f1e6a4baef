"""The gate a model passes before it replaces another: stable, and no worse on held-out data.

Training scores a model on T-long tuples; a model can fit them and still blow up over a
second (e.g. contact damping far past the explicit integrator's stability limit chatters
for 100 ms and diverges over 1 s), or fit the training robot's quirks and predict held-out
motion worse than the model it replaces. `judge` rolls both models out ``horizon`` ahead
from the recorded states of held-out trajectories, every ``stride`` seconds, in the
integrator the model will be used with and sub-stepped as it will be
(`evaluation.model_substeps`: a damped model its planner sub-steps is judged so, not at an
engine step it would never be run at), and accepts the candidate only if every rollout is
finite and its mean CoM error is at most the incumbent's.

Pose-only data gets central finite-difference velocities (`with_estimated_velocity`):
noisy starting velocities hurt both models alike, so the comparison stays fair.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Optional, Sequence

import numpy as np
import torch

from tensegrity_engine.identification.data import as_tuple_set
from tensegrity_engine.identification.dataset import Trajectory
from tensegrity_engine.identification.evaluation import horizon_errors
from tensegrity_engine.identification.objective import validation_loss, window_inputs
from tensegrity_engine.identification.solvers.settle import settle_steps
from tensegrity_engine.identification.solvers.windows import fit_start_velocities, gapped_windows, training_windows
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.state import central_rotation

__all__ = ["Verdict", "judge", "select", "with_estimated_velocity", "heldout_scores", "log_ratio_gain", "window_fit"]

HELDOUT_FIT = 3     # pose-only held-out chains: tuples that fix each chain's start velocity


def heldout_scores(run, data, values: dict, chain: int = 0, per_block: bool = False,
                   known: Optional[dict] = None):
    """Loss of the parameter ``values`` on tuples ``data`` (a TupleSet ``run``, a
    `ProgressiveTrainer`, never saw) at the engine step with the fine-stage integrator: one
    yardstick for any stage. ``chain`` > 0: (loss, mean CoM error (m) at the end of its
    chains of ``chain`` consecutive tuples, rolled out from each chain's first state; NaN if
    there is no such chain) instead; ``per_block``: both per chain (arrays; the loss has one
    entry where the data has velocities). Pose-only data with such chains: each chain's
    start velocity is first fitted to its first ``HELDOUT_FIT`` tuples with these values
    (`fit_start_velocities`), and the loss is the pose error over the whole chain.
    ``known`` (pose-only chains): {chain key: (loss, CoM error)} of these values scored
    before (`chain_keys`); only the chains not in it are rolled out, and it is left holding
    this data's chains."""
    per_element = [k for k, v in values.items() if len(v) > 1]
    model = PhysicalParameters(run.robot, values, per_element=per_element)
    p = {k: v.detach().to(run.dtype).to(run.device) for k, v in model.values().items()}
    held = run._to_data(as_tuple_set(data, run.config.period, run.robot.dt))
    with run.objective.stepped_for(p):           # each model at the step it needs
        loss, com = _scores(run, held, p, chain, known)
    if not chain:
        return float(loss.mean())
    if per_block:
        return loss, com
    return float(loss.mean()), float(com.mean())


@torch.no_grad()
def _model_values(run, values: dict) -> dict:
    model = PhysicalParameters(run.robot, values, per_element=[k for k, v in values.items() if np.size(v) > 1])
    return {k: v.to(run.dtype).to(run.device) for k, v in model.values().items()}


def window_fit(run, values: dict, width: int, max_windows: int = 256,
               settle_values: Optional[dict] = None) -> np.ndarray:
    """The pose-only windowed objective of ``values`` on ``run``'s training data (a
    `ProgressiveTrainer`'s): the squared position error per window of ``width`` tuples (an
    even subset of at most ``max_windows``, none where the motors may still be settling:
    under ``settle_values`` where given, so that two sets of values score the same windows),
    each window's start velocity fitted to it with the values fixed. Two fits of one model
    to one data set compare on it with no held-out data: empty if there are no windows."""
    data = run.train
    p = _model_values(run, values)
    settle = p if settle_values is None else _model_values(run, settle_values)
    chains, got = training_windows(data.ts, width, settle_steps(run.robot, settle, run.config.motor_settle, data.ts))
    if got < 2 or not len(chains):
        return np.zeros(0)
    chains = torch.as_tensor(chains[np.linspace(0, len(chains) - 1, min(len(chains), max_windows)).astype(int)],
                             device=run.device)
    with run.objective.stepped_for(p):
        vel = fit_start_velocities(run.objective, data, chains, p, chain=run.config.chain_latents)
        r = run.objective.window_residual(data, chains, vel, p)
    return (r ** 2).sum(-1).double().cpu().numpy()


def chain_keys(run, held, chains: torch.Tensor, p: dict) -> list:
    """A digest per chain of everything its pose-only score under ``p`` depends on: its poses
    and velocity estimates, where poses were dropped, the actuator state at its start, the
    commands (and wrenches) over it as they act, the gyro's share. Equal keys, equal scores:
    a held-out block keeps its key while the window that gives it its actuator state moves
    on, so the gate scores a reference model only on the blocks it has not seen."""
    objective = run.objective
    with torch.no_grad():
        cmd, wrench = window_inputs(held, chains, *objective.timed_commands(held, p))
        cells = chains.clamp(min=0)
        parts = [held.x0[cells], held.x1[cells], chains >= 0, objective.act_starts(held, p)[chains[:, 0]], cmd]
        parts += [] if wrench is None else [wrench]
        parts += [] if held.gyro0 is None else [held.gyro0[chains[:, 0]]]
    arrays = [t.detach().cpu().numpy().reshape(len(chains), -1) for t in parts]
    # and how the model is stepped and its loss scaled
    setting = repr((objective.loss_scale, run.config.fine_integrator, run.robot.dt)).encode()
    keys = []
    for i in range(len(chains)):
        digest = hashlib.blake2b(setting, digest_size=16)
        for a in arrays:
            digest.update(np.ascontiguousarray(a[i]).tobytes())
        keys.append(digest.digest())
    return keys


def _scores(run, held, p: dict, chain: int, known: Optional[dict] = None) -> tuple[np.ndarray, np.ndarray]:
    """(loss per chain, or one overall; CoM error per chain, or [NaN])."""
    pose_only = held.latent is not None and chain > HELDOUT_FIT
    chains = gapped_windows(held, chain, HELDOUT_FIT if pose_only else 0) if chain else None
    whole = bool(chain) and len(chains) > 0
    if whole and pose_only and known is not None:
        chains = torch.as_tensor(chains, device=run.device)
        keys = chain_keys(run, held, chains, p)
        todo = [i for i, k in enumerate(keys) if k not in known]
        if todo:
            loss, com = _scores_of(run, held, p, chains[todo])
            known.update({keys[i]: (float(a), float(b)) for i, a, b in zip(todo, loss, com)})
        scored = {k: known[k] for k in keys}
        known.clear()                            # only this data's chains: the cache stays small
        known.update(scored)
        return (np.array([scored[k][0] for k in keys], dtype=np.float64),
                np.array([scored[k][1] for k in keys], dtype=np.float64))
    if whole and pose_only:
        return _scores_of(run, held, p, torch.as_tensor(chains, device=run.device))
    idx = torch.arange(len(held), device=run.device)
    loss = np.array([validation_loss(run.objective, held, idx, p, run.full_steps, run.config.fine_integrator,
                                     use_latent=False)])
    if not whole:
        return loss, np.array([math.nan])
    com = run.objective.chain_com_error(held, torch.as_tensor(chains, device=run.device), p)
    return loss, com.cpu().double().numpy()


def _scores_of(run, held, p: dict, chains: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(loss, CoM error) per pose-only chain, each chain's start velocity fitted first."""
    with torch.no_grad():
        vel = fit_start_velocities(run.objective, held, chains[:, :HELDOUT_FIT], p)
        r = run.objective.window_residual(held, chains, vel, p)
    loss = (r ** 2).sum(-1).cpu().double().numpy() * len(chains)    # each chain's; mean = the total
    loss = np.where(np.isfinite(loss), loss, np.inf)
    com = run.objective.chain_com_error(held, chains, p, vel)
    return loss, com.cpu().double().numpy()


def log_ratio_gain(candidate, reference) -> float:
    """How many standard errors the mean log ratio reference / candidate of paired errors
    (per window or held-out block) is above 0 (inf: the same ratio everywhere, > 0). Errors
    are multiplicative and span orders of magnitude between windows, so their absolute
    differences are heavy-tailed: one block the reference misses by 14 makes a candidate
    40x better on every block "within 2 standard errors" (measured online, a three-bar under
    the soft law against the penalty law). Values are floored at 1e-9 of the largest."""
    c, r = (np.asarray(x, dtype=np.float64) for x in (candidate, reference))
    floor = 1e-9 * max(float(np.max(c, initial=0.0)), float(np.max(r, initial=0.0)), 1e-300)
    ratio = np.log(np.maximum(r, floor) / np.maximum(c, floor))
    if ratio.size < 2:
        return math.nan
    se = float(ratio.std(ddof=1)) / math.sqrt(ratio.size)
    mean = float(ratio.mean())
    if se > 0:
        return mean / se
    return math.copysign(math.inf, mean) if mean else 0.0


@dataclasses.dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str              # "better", "not_worse", "unstable", "worse"
    candidate_error: float   # m, mean CoM error at the horizon (inf: diverged)
    incumbent_error: float
    horizon: float
    windows: int

    def __str__(self) -> str:
        return (f"{'accepted' if self.accepted else 'rejected'} ({self.reason}): CoM error "
                f"{self.horizon:.2g} s ahead {1e3 * self.candidate_error:.2f} mm vs "
                f"{1e3 * self.incumbent_error:.2f} mm for the model it would replace "
                f"({self.windows} held-out windows)")


def with_estimated_velocity(traj: Trajectory) -> Trajectory:
    """The trajectory with velocities from its poses: central differences (one-sided at the
    ends) of positions and of orientations (world-frame rotation vectors through the middle
    pose, `central_rotation`)."""
    if traj.has_velocity:
        return traj
    t, p, q = traj.t, traj.position, traj.quaternion
    n = len(t)
    if n < 2:
        raise ValueError(f"{traj.source}: needs two samples to estimate velocities")
    lo = np.clip(np.arange(n) - 1, 0, n - 1)
    hi = np.clip(np.arange(n) + 1, 0, n - 1)
    span = (t[hi] - t[lo])[:, None, None]
    lin = (p[hi] - p[lo]) / span
    ang = central_rotation(q[lo], q, q[hi]) / span
    return dataclasses.replace(traj, linear_velocity=lin, angular_velocity=ang)


def judge(candidate: PhysicalParameters, incumbent: PhysicalParameters, trajs: Sequence[Trajectory], *,
          horizon: float = 1.0, stride: float = 0.5, integrator: Optional[str] = None,
          tolerance: float = 0.0) -> Verdict:
    """``tolerance`` (m): a candidate this much worse still counts as not worse (two exact
    models differ by rounding)."""
    if not trajs:
        raise ValueError("judge needs held-out trajectories")
    trajs = [with_estimated_velocity(t) for t in trajs]
    horizon = min(float(horizon), min(float(t.t[-1] - t.t[0]) for t in trajs))
    horizon = round(horizon / candidate.robot.dt) * candidate.robot.dt
    cand = horizon_errors(candidate, trajs, (horizon,), stride=stride, integrator=integrator)
    inc = horizon_errors(incumbent, trajs, (horizon,), stride=stride, integrator=integrator)
    c, i = float(np.mean(cand[horizon])), float(np.mean(inc[horizon]))
    if not np.isfinite(c):
        reason = "unstable"
    elif c <= i + tolerance:
        reason = "better" if c < i else "not_worse"
    else:
        reason = "worse"
    return Verdict(accepted=reason in ("better", "not_worse"), reason=reason, candidate_error=c,
                   incumbent_error=i, horizon=horizon, windows=int(cand["windows"]))


def select(candidates: Sequence[tuple[str, PhysicalParameters]], incumbent: PhysicalParameters,
           held_out: dict, **judge_kw) -> tuple[str, PhysicalParameters, dict]:
    """The first candidate (name, params) that ``judge`` accepts against ``incumbent`` on
    every held-out set of ``held_out`` ({regime: trajectories}, e.g. hanging and rolling);
    ("incumbent", incumbent, ...) if none. A stage is gated on its own regime's data, but a
    model is used in all of them: one fitted hanging can roll worse than the one it replaced.
    Returns (name, params, {candidate: {regime: Verdict}})."""
    if not held_out or not all(held_out.values()):
        raise ValueError("select needs held-out trajectories for every regime")
    verdicts = {}
    for name, params in candidates:
        verdicts[name] = {regime: judge(params, incumbent, trajs, **judge_kw) for regime, trajs in held_out.items()}
        if all(v.accepted for v in verdicts[name].values()):
            return name, params, verdicts
    return "incumbent", incumbent, verdicts
