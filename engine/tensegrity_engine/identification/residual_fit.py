"""Training and judging the learned residual (`physics.residual.ResidualModel`) on the same
recorded trajectories the parameters were identified from.

The physical parameters are fitted first and stay as they are: the residual learns only
what the identified physics still misses one control period ahead, so the parameters
keep their meaning (the report shows them unchanged, with and without the residual).
Training is teacher-forced on period tuples (x_t, u, x_t+T): the physics' prediction of
each tuple is computed once, and the network learns the remaining error, normalised per
component by its spread in the training data, with weight decay and early stopping on
held-out tuples. `residual_horizon_errors` then judges the recurrent model (physics
segment, correction, next segment, ...) k seconds ahead like `evaluation.horizon_errors`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from tensegrity_engine.identification.acceptance import with_estimated_velocity
from tensegrity_engine.identification.dataset import Trajectory
from tensegrity_engine.identification.evaluation import model_commands, model_substeps
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.residual import ResidualModel, constant_velocity, physics_fingerprint
from tensegrity_engine.physics.state import ANG_VEL, LIN_VEL, POS, QUAT

__all__ = ["PeriodSamples", "period_samples", "fit_residual", "residual_horizon_errors", "ResidualFit",
           "judge_residual", "rollout_with_residual"]


@dataclasses.dataclass
class PeriodSamples:
    """Tuples of one control period from whole trajectories (tensors, float64)."""
    x0: torch.Tensor          # [N, R, 13]
    x1: torch.Tensor          # [N, R, 13]
    act0: torch.Tensor        # [N, A] the model's filtered commands at the start
    commands: torch.Tensor    # [N, S, A]
    wrenches: Optional[torch.Tensor]   # [N, S, R, 6]
    next: torch.Tensor        # [N] the tuple that follows in the same trajectory, or -1

    def __len__(self):
        return len(self.x0)


def period_samples(params: PhysicalParameters, trajs: Sequence[Trajectory], period: float) -> PeriodSamples:
    robot = params.robot
    S = int(round(period / robot.dt))
    x0, x1, act0, cmds, wrs, nxt = [], [], [], [], [], []
    for t in trajs:
        if not t.has_velocity:
            raise ValueError(f"{t.source}: the residual trains on states with velocities")
        states = t.states()
        total = int(math.floor((t.t[-1] - t.t[0]) / robot.dt + 1e-9))
        acts, grid = model_commands(params, t, total)
        wgrid = t.wrench_grid(t.t[0], total, robot.dt)
        last = -1
        for i in range(len(t.t) - 1):
            k0 = int(round((t.t[i] - t.t[0]) / robot.dt))
            if abs(t.t[i + 1] - t.t[i] - period) > 1e-6 or k0 + S > total:
                last = -1
                continue
            if last >= 0:
                nxt[last] = len(x0)
            last = len(x0)
            nxt.append(-1)
            x0.append(states[i])
            x1.append(states[i + 1])
            act0.append(acts[k0])
            cmds.append(grid[k0:k0 + S])
            if wgrid is not None:
                wrs.append(wgrid[k0:k0 + S])
    if not x0:
        raise ValueError("no period tuples in the trajectories")
    f = lambda a: torch.as_tensor(np.stack(a), dtype=torch.float64)
    return PeriodSamples(f(x0), f(x1), f(act0), f(cmds), f(wrs) if wrs else None, torch.as_tensor(nxt))


class _Physics:
    """The identified physics over one period, forward-only (the native kernel on the CPU,
    else torch), plus the rest lengths and tensions the residual reads."""

    def __init__(self, params: PhysicalParameters, fixed_rods, floor: bool, backend: str = "native"):
        self.engine = TensegrityEngine(params.robot, params, fixed_rods=fixed_rods, floor=floor)
        self.p = {k: v.detach() for k, v in self.engine.param_values(torch.float64, "cpu").items()}
        self.substeps = model_substeps(self.engine, self.p, None, params.robot.dt)   # as it is used
        self.native = None
        if backend == "native" and self.engine.native_kernel_applies:     # else torch (external ground)
            from tensegrity_engine.physics import native

            self.native = native.NativeRollout(self.engine)
        elif backend != "torch":
            raise ValueError(f"backend must be 'native' or 'torch', got {backend!r}")

    def period(self, x0, act0, cmds, wrs):
        """(state, act) after the commands [N, S, A] (held one engine step each)."""
        run = self.native.rollout if self.native is not None else self.engine.rollout
        k = self.substeps
        if k > 1:
            cmds = cmds.repeat_interleave(k, dim=-2)
            wrs = None if wrs is None else wrs.repeat_interleave(k, dim=-3)
        with torch.no_grad():
            states, acts = run(x0.detach(), act0.detach(), cmds, self.engine.robot.dt / k, params=self.p,
                               wrenches=wrs, record_every=cmds.shape[-2])
        return states[..., -1, :, :], acts[..., -1, :]

    def inputs(self, x0, act0):
        """(rest lengths, tensions) at the period's start (no gradient to the physics)."""
        with torch.no_grad():
            return self.engine.rest_lengths(act0, self.p), self.engine.cable_tensions(x0.detach(), act0, self.p)


def _quat_log(q_to: torch.Tensor, q_from: torch.Tensor) -> torch.Tensor:
    """Rotation vector of q_to * conj(q_from) (world frame), [..., 3]."""
    w1, v1 = q_to[..., :1], q_to[..., 1:]
    w0, v0 = q_from[..., :1], -q_from[..., 1:]
    dw = w1 * w0 - (v1 * v0).sum(-1, keepdim=True)
    dv = w1 * v0 + w0 * v1 + torch.linalg.cross(v1, v0)
    sign = torch.where(dw >= 0, 1.0, -1.0)
    dw, dv = dw * sign, dv * sign
    norm = dv.norm(dim=-1, keepdim=True)
    return dv / norm.clamp_min(1e-15) * 2.0 * torch.atan2(norm, dw)


def _targets(x1: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """The correction that would make x̂ exact, [..., R, 12] (Δp, Δv, Δω, rotation)."""
    return torch.cat([x1[..., POS] - x_hat[..., POS], x1[..., LIN_VEL] - x_hat[..., LIN_VEL],
                      x1[..., ANG_VEL] - x_hat[..., ANG_VEL], _quat_log(x1[..., QUAT], x_hat[..., QUAT])], -1)


@dataclasses.dataclass
class ResidualFit:
    model: ResidualModel
    train_loss: float          # normalised one-period loss, start (physics alone) -> end
    val_start: float
    val_loss: float
    epochs: int
    wall: float


def _base(physics: _Physics, data: PeriodSamples, use_physics: bool, period: float):
    x_hat = physics.period(data.x0, data.act0, data.commands, data.wrenches)[0] if use_physics else \
        constant_velocity(data.x0, period)
    return (x_hat, *physics.inputs(data.x0, data.act0))


def _huber(e: torch.Tensor, delta: float = 3.0) -> torch.Tensor:
    """Mean Huber loss of normalised errors: quadratic to ``delta`` typical errors, then linear
    (a few samples the physics gets badly wrong must not set the fit)."""
    a = e.abs()
    return torch.where(a < delta, 0.5 * a * a, delta * (a - 0.5 * delta)).mean()


def _unrolled_loss(model, physics: _Physics, data: PeriodSamples, start: torch.Tensor, periods: int,
                   period: float, free: torch.Tensor) -> torch.Tensor:
    """Mean normalised error over ``periods`` recurrent periods from tuples ``start``: the
    model's own corrected states feed the next period (the physics without gradient), so it
    learns from the states it will meet in a rollout, not only from recorded ones."""
    idx, x, act = start, data.x0[start], data.act0[start]
    total = 0.0
    for _ in range(periods):
        wrs = None if data.wrenches is None else data.wrenches[idx]
        if model.use_physics:
            x_hat, act_next = physics.period(x, act, data.commands[idx], wrs)
        else:
            x_hat, act_next = constant_velocity(x, period), physics.period(x, act, data.commands[idx], wrs)[1]
        rest, tension = physics.inputs(x, act)
        x = model(x, x_hat, rest, tension, period)
        total = total + _huber((_targets(data.x1[idx], x) / model.scale)[:, free])
        idx, act = data.next[idx], act_next
    return total / periods


def fit_residual(params: PhysicalParameters, train: Sequence[Trajectory], val: Sequence[Trajectory], *,
                 period: float = 0.1, use_physics: bool = True, hidden: int = 32, epochs: int = 400,
                 lr: float = 3e-3, weight_decay: float = 1e-4, batch_size: int = 128, patience: int = 40,
                 unroll: int = 5, unroll_epochs: int = 60, backend: str = "native", seed: int = 0,
                 log: Callable[[str], None] = lambda m: None) -> ResidualFit:
    """Train a residual on ``train`` trajectories (early-stopped on ``val``) on top of the
    physics of ``params`` (``use_physics=False``: the purely learned model of the same size):
    teacher-forced on single periods, then on ``unroll`` recurrent periods
    (`_unrolled_loss`), each stage keeping its best held-out state."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    fixed, floor = train[0].fixed_rods, train[0].floor
    physics = _Physics(params, fixed, floor, backend)
    tr, va = period_samples(params, train, period), period_samples(params, val, period)
    base_tr, base_va = _base(physics, tr, use_physics, period), _base(physics, va, use_physics, period)
    y_tr, y_va = _targets(tr.x1, base_tr[0]), _targets(va.x1, base_va[0])
    free = torch.ones(params.robot.num_rods, dtype=torch.bool)
    free[list(fixed)] = False
    model = ResidualModel(params.robot, hidden=hidden, use_physics=use_physics, fixed_rods=fixed,
                          ground_height=params.robot.contact.ground_height, period=period)
    # Robust scales (90th percentile of the absolute errors): the errors are heavy-tailed (a
    # rod-rod contact the physics models differently), and a standard deviation would be set
    # by the tail, a median by the many samples the physics already gets right.
    typical = y_tr[:, free].reshape(-1, 4, 3).abs().quantile(0.9, dim=0).mean(-1).clamp_min(1e-9)
    model.scale.copy_(typical.repeat_interleave(3))
    with torch.no_grad():
        rod, _, _ = model.features(tr.x0, base_tr[0], base_tr[1], base_tr[2], period)
        flat = rod[:, free].reshape(-1, rod.shape[-1])
        model.feature_scale.copy_((flat - flat.median(0).values).abs().median(0).values.clamp_min(1e-6))

    def loss(data, base, y, idx=None):
        idx = slice(None) if idx is None else idx
        d = model.delta(data.x0[idx], base[0][idx], base[1][idx], base[2][idx], period)
        return _huber(((d - y[idx]) / model.scale)[:, free])

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        train_start = float(loss(tr, base_tr, y_tr))
    val_start, first, epoch = _train_stage(
        model, opt, torch.arange(len(tr)), lambda idx: loss(tr, base_tr, y_tr, idx),
        lambda: loss(va, base_va, y_va), epochs, patience, batch_size, gen)
    best = first
    if unroll > 1 and unroll_epochs:
        chains, val_chains = _chain_starts(tr, unroll), _chain_starts(va, unroll)
        if len(chains) and len(val_chains):
            _, best, _ = _train_stage(
                model, opt, chains, lambda idx: _unrolled_loss(model, physics, tr, idx, unroll, period, free),
                lambda: _unrolled_loss(model, physics, va, val_chains, unroll, period, free),
                unroll_epochs, max(4, patience // 4), batch_size, gen)
    model.eval()
    model.physics = physics_fingerprint(params)
    log(f"residual ({'physics' if use_physics else 'pure'}): one-period val loss {val_start:.3g} -> {first:.3g} "
        f"(train start {train_start:.3g}) in {epoch} epochs; {unroll}-period unrolled val loss {best:.3g}")
    return ResidualFit(model, train_start, val_start, first, epoch, time.perf_counter() - t0)


def _train_stage(model, opt, items: torch.Tensor, batch_loss, val_loss, epochs: int, patience: int,
                 batch_size: int, gen) -> tuple[float, float, int]:
    """Minibatch epochs over ``items`` until the validation loss stops improving for
    ``patience`` epochs; the model ends in its best state. (start loss, best loss, epochs)."""
    with torch.no_grad():
        start = float(val_loss())
    best, best_state, since, epoch = start, {k: v.clone() for k, v in model.state_dict().items()}, 0, 0
    for epoch in range(1, epochs + 1):
        order = items[torch.randperm(len(items), generator=gen)]
        for b in range(0, len(order), batch_size):
            opt.zero_grad()
            batch_loss(order[b:b + batch_size]).backward()
            opt.step()
        with torch.no_grad():
            v = float(val_loss())
        if v < best * (1 - 1e-4):
            best, best_state, since = v, {k: t.clone() for k, t in model.state_dict().items()}, 0
        else:
            since += 1
            if since >= patience:
                break
    model.load_state_dict(best_state)
    return start, best, epoch


def _chain_starts(data: PeriodSamples, periods: int) -> torch.Tensor:
    """Tuples followed by at least ``periods`` - 1 more of the same trajectory."""
    ok = torch.ones(len(data), dtype=torch.bool)
    idx = torch.arange(len(data))
    for _ in range(periods - 1):
        idx = torch.where(idx >= 0, data.next[idx.clamp_min(0)], idx)
        ok &= idx >= 0
    return torch.nonzero(ok).squeeze(-1)


def rollout_with_residual(physics: _Physics, model: Optional[ResidualModel], x0, act0, cmds, wrs, period: float):
    """Periods of physics, each followed by the residual: states [B, K, R, 13] after each
    period (K = steps / period). ``model`` None: physics alone; a model without physics
    (``use_physics=False``) replaces the physics by constant velocity."""
    S = int(round(period / physics.engine.robot.dt))
    out, x, act = [], x0, act0
    with torch.no_grad():
        for k in range(cmds.shape[1] // S):
            sl = slice(k * S, (k + 1) * S)
            x_hat, act_next = physics.period(x, act, cmds[:, sl], None if wrs is None else wrs[:, sl])
            if model is not None:
                if not model.use_physics:
                    x_hat = constant_velocity(x, period)
                x_hat = model(x, x_hat, *physics.inputs(x, act), period)
            out.append(x_hat)
            x, act = x_hat, act_next
    return torch.stack(out, 1)


def residual_horizon_errors(params: PhysicalParameters, model: Optional[ResidualModel], trajs: Sequence[Trajectory],
                            horizons=(0.1, 0.5, 1.0), *, stride: float = 0.5, period: float = 0.1,
                            backend: str = "native") -> dict:
    """`evaluation.horizon_errors` for physics + residual (periods of ``period``): CoM error
    k seconds ahead, restarted from the recorded state every ``stride`` s. {h: errors}.
    Pose-only trajectories get velocities from their poses (`with_estimated_velocity`)."""
    robot = params.robot
    trajs = [with_estimated_velocity(t) for t in trajs]
    physics = _Physics(params, trajs[0].fixed_rods, trajs[0].floor, backend)
    S, H = int(round(period / robot.dt)), max(horizons)
    K = int(round(H / period))
    w = torch.as_tensor(robot.rod_mass / robot.rod_mass.sum(), dtype=torch.float64)
    x0, a0, cmds, wrs, truth = [], [], [], [], []
    for t in trajs:
        states, com = t.states(), t.center_of_mass()
        total = int(math.floor((t.t[-1] - t.t[0]) / robot.dt + 1e-9))
        acts, acting = model_commands(params, t, total + K * S)     # + K S: a window may end at t[-1]
        for start in np.arange(t.t[0], t.t[-1] - H + 1e-9, stride):
            i0 = int(np.argmin(np.abs(t.t - start)))
            targets = [int(np.argmin(np.abs(t.t - (t.t[i0] + h)))) for h in horizons]
            if abs(t.t[i0] - start) > 1e-6 or any(abs(t.t[j] - t.t[i0] - h) > 1e-6
                                                   for j, h in zip(targets, horizons)):
                continue        # a dropped sample: no window there (as evaluation.horizon_errors)
            s0 = int(round((t.t[i0] - t.t[0]) / robot.dt))
            x0.append(states[i0])
            a0.append(acts[s0])
            cmds.append(acting[s0:s0 + K * S])
            wg = t.wrench_grid(t.t[i0], K * S, robot.dt)
            if wg is not None:
                wrs.append(wg)
            truth.append(com[targets])
    f = lambda a: torch.as_tensor(np.stack(a), dtype=torch.float64)
    pred = rollout_with_residual(physics, model, f(x0), f(a0), f(cmds), f(wrs) if wrs else None, period)
    com = (pred[..., POS] * w[:, None]).sum(-2)                                # [B, K, 3]
    idx = [int(round(h / period)) - 1 for h in horizons]
    err = (com[:, idx] - f(truth)).norm(dim=-1).numpy()
    err = np.where(np.isfinite(err), err, np.inf)
    return {h: err[:, i] for i, h in enumerate(horizons)} | {"windows": len(x0)}


def judge_residual(params: PhysicalParameters, model: ResidualModel, heldout: Sequence[Trajectory], *,
                   horizons=(0.1, 0.5, 1.0), sigmas: float = 3.0, period: float = 0.1) -> tuple[bool, str]:
    """Keep a residual only if, on held-out trajectories, it predicts better than the physics
    alone at *every* horizon, and at the longest by more than ``sigmas`` standard errors of
    the paired per-window difference (rolling is chaotic: a correction that wins 0.1 s
    ahead can lose 1 s ahead, and small held-out sets give lucky wins). Three, not the two
    a structure option needs: a network has thousands of weights, and on the zoo the one
    residual that passed at 2.2 standard errors (payload, hanging: 3.4 -> 1.5 mm on two
    validation trajectories) was worse on the test ones (4.3 -> 8.8 mm)."""
    with_ = residual_horizon_errors(params, model, heldout, horizons, period=period)
    without = residual_horizon_errors(params, None, heldout, horizons, period=period)
    worse = [h for h in horizons if not np.mean(with_[h]) < np.mean(without[h])]
    if worse:
        return False, "worse " + ", ".join(f"{h:g} s ahead ({1e3 * np.mean(without[h]):.1f} -> "
                                          f"{1e3 * np.mean(with_[h]):.1f} mm)" for h in worse)
    h = max(horizons)
    diff = without[h] - with_[h]
    se = float(np.std(diff, ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("inf")
    if not np.all(np.isfinite(with_[h])) or diff.mean() <= sigmas * se:
        return False, f"{h:g} s ahead {1e3 * np.mean(without[h]):.1f} -> {1e3 * np.mean(with_[h]):.1f} mm, " \
                      f"within {sigmas:g} standard errors"
    return True, f"{h:g} s ahead {1e3 * np.mean(without[h]):.1f} -> {1e3 * np.mean(with_[h]):.1f} mm " \
                 f"({diff.mean() / max(se, 1e-15):.1f} standard errors)"
