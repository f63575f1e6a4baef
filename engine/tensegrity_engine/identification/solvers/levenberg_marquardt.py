"""Levenberg-Marquardt on tuples: the fine stage (``fine_optimizer="lm"``).

One iteration per epoch in raw (logit) space on ``lm_tuples`` random training tuples,
Jacobian by central differences (2P no-grad rollouts in the C kernel; P is small; one-sided
ones under the soft contact law, `one_sided_jacobian`) or by
forward-mode automatic differentiation (`forward_jacobian`: every column in one batched torch
pass, exact; ``IdentificationConfig.jacobian``), adaptive damping, each parameter's step
bounded to 2 in logit units. Without contact the engine equals MuJoCo, so
Gauss-Newton converges quadratically to the exact parameters. Pose-only data runs it on the
finite-difference velocities first (biased, but it lands in the basin of the exact fit).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.identification.solvers.settle import motor_settled, settle_steps

LM_FREE_LAMBDA = 1.0     # Levenberg-Marquardt damping above which a short step is not convergence
JUMP_RATIO = 30.0       # a difference column this many times the median unit's is checked from the other side


def raw_vector(params, names) -> torch.Tensor:
    """The raw (unconstrained) values of the learnt parameters as one vector."""
    return torch.cat([getattr(params, n).detach().reshape(-1) for n in names]).clone()


@torch.no_grad()
def set_raw_vector(params, names, theta: torch.Tensor) -> None:
    for n, value in split_raw(params, names, theta).items():
        getattr(params, n).copy_(value)


def residual_jacobian(residual, theta0: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """[n, P] Jacobian of ``residual(theta)`` by central differences (2P evaluations)."""
    cols = []
    for j in range(len(theta0)):
        e = torch.zeros_like(theta0)
        e[j] = eps
        cols.append((residual(theta0 + e) - residual(theta0 - e)) / (2 * eps))
    return torch.stack(cols, -1)


def one_sided_jacobian(residual, theta0: torch.Tensor, r0: torch.Tensor, units: int,
                       eps: float = 1e-6, sides: tuple = (-1.0,), units_residual=None) -> torch.Tensor:
    """[n, P] Jacobian of ``residual(theta)`` by one-sided differences (2P evaluations, as
    central ones): for each of the ``units`` equal blocks of the residual (a tuple's, a
    window's) the forward or the backward difference, whichever is smaller in norm
    (``sides``: the steps tried besides the forward one, in multiples of ``eps``; () gives
    plain forward differences). A
    rollout whose contact opens a step earlier within the difference step jumps (the soft
    law's damping acts at once): that side reads the jump as a slope, the other side has
    the slope (measured on the SUPERball rolling, 240 tuples: central differences were
    10-5600x off forward-mode AD on 4-17 tuples per parameter, this at most 6e-4 off on
    none). ``units_residual(theta, idx)``: the rows [len(idx), n / units] of the units
    ``idx`` alone, scaled as in the whole; with it the other sides are taken only for the
    units whose forward difference is `JUMP_RATIO` times the median unit's (or not
    finite), so a column costs about one evaluation instead of two: a jump read over a
    1e-6 step is orders of magnitude above any slope, and without one both sides agree to
    O(step)."""
    cols = []
    for j in range(len(theta0)):
        e = torch.zeros_like(theta0)
        e[j] = eps
        col = ((residual(theta0 + e) - r0) / eps).reshape(units, -1)
        check = torch.arange(units, device=col.device)
        subset = units_residual is not None and units > 2 and bool(sides)
        if subset:
            size = col.norm(dim=-1)
            check = (~(size <= JUMP_RATIO * size.nanmedian())).nonzero()[:, 0]
        for h in sides:
            if not len(check):
                break
            if not subset:
                other = ((residual(theta0 + h * e) - r0) / (h * eps)).reshape(units, -1)
            else:
                other = (units_residual(theta0 + h * e, check) - r0.reshape(units, -1)[check]) / (h * eps)
            part = col[check]
            size, other_size = part.norm(dim=-1), other.norm(dim=-1)
            take = torch.isfinite(other_size) & ~(other_size >= size)      # smaller, or col not finite
            col[check] = torch.where(take[:, None], other, part)
        cols.append(col.reshape(r0.shape))
    return torch.stack(cols, -1)


def tuple_rows(objective, data, idx: torch.Tensor, n_steps: int, integrator: str):
    """``rows(p, sub)``: the residual rows [len(sub), m] of the tuples ``idx[sub]`` alone, for
    parameter values ``p``, weighted as within all of ``idx`` (`objective.residuals` weighs
    by 1 / sqrt(number of tuples)): `one_sided_jacobian`'s ``units_residual``."""
    def rows(p, sub):
        r = objective.residuals(data, idx[sub], p, n_steps, integrator)
        return r.reshape(len(sub), -1) * math.sqrt(len(sub) / len(idx))
    return rows


def split_raw(params, names, theta: torch.Tensor) -> dict[str, torch.Tensor]:
    """``theta`` (as `raw_vector` lays it out) as one raw tensor per name: `set_raw_vector`
    without writing into the module (for `PhysicalParameters.values_with`)."""
    out, i = {}, 0
    for n in names:
        raw = getattr(params, n)
        out[n] = theta[i:i + raw.numel()].reshape(raw.shape)
        i += raw.numel()
    return out


def forward_jacobian(residual, theta0: torch.Tensor) -> torch.Tensor:
    """[n, P] Jacobian of a functional ``residual(theta)`` by forward-mode AD: one pass that
    carries all P tangents at once (``torch.func.jacfwd``), exact to rounding. On a GPU that
    is one batched rollout where central differences launch 2P; on the CPU the C kernel's
    central differences are faster (bench/performance.py)."""
    return torch.func.jacfwd(residual)(theta0)


def jacobian_mode(config, objective) -> str:
    """The configured Jacobian, or by default: forward mode on a GPU (one batched pass instead
    of 2P launch-bound rollouts); otherwise differences, in the C kernel where it runs (in
    torch on the CPU forward mode is slower, measured, and MuJoCo's collision checker,
    ablation c, reads tensors forward-mode AD cannot carry): one-sided under the soft
    contact law, central under the penalty law. The soft law's force jumps where a contact
    opens (its damping acts at once), so a difference step that moves a contact's onset
    reads a jump as a slope: fitting a three-bar's contact from a time constant of 0.04 s
    (truth 0.02), central differences never moved it (the column 34.5 in norm, its gradient
    0.05); forward mode, exact on each smooth piece, reached 0.0201 s in 6 iterations, and
    `one_sided_jacobian` agrees with it (5x faster than forward mode on the SUPERball's
    rolling tuples). The penalty law has kinks, not jumps: there the central difference is
    the better one (one-sided ones in the solver measured worse, twin K +9.8 % against +5.3 %)."""
    if config.jacobian is not None:
        return config.jacobian
    engine = objective.engine
    if torch.device(objective.device).type == "cuda" and engine.ground_contact_fn is None:
        return "forward"
    if engine.force_model.soft_ground:
        return "one_sided"
    # Without a floor the dynamics are smooth but for slack cables' kinks and rare rod touches,
    # and Levenberg-Marquardt needs the Jacobian only to steer: at its 1e-6 step a forward
    # difference is that close to the slope, and converges to the same minimum with P rollouts
    # instead of 2P (as the windowed solver's). Penalty contact keeps central differences.
    return "forward_difference" if not engine.floor else "central"


def parameter_jacobian(run, theta0: torch.Tensor, residual_of, r0: Optional[torch.Tensor] = None,
                       units: Optional[int] = None, units_of=None) -> torch.Tensor:
    """[..., P] Jacobian of the residuals w.r.t. the raw learnt parameters at ``theta0``,
    ``residual_of(p)`` the residuals of a parameter dict (``r0`` at ``theta0``, in ``units``
    equal blocks for one-sided differences; None: its leading dimension, each entry of a flat
    vector; ``units_of(p, idx)``: the rows of the blocks ``idx`` alone, see
    `one_sided_jacobian`): differences set the raw values in place (and
    leave ``theta0`` set), forward mode sees them functionally."""
    def values(theta, functional: bool) -> dict:
        if functional:
            p = run.params.values_with(split_raw(run.params, run.learn, theta))
            return {k: v.to(dtype=run.dtype, device=run.device) for k, v in p.items()}
        set_raw_vector(run.params, run.learn, theta)
        return run.engine.param_values(run.dtype, run.device)

    mode = jacobian_mode(run.config, run.objective)
    if mode == "forward":
        with run.objective.functional():
            return forward_jacobian(lambda theta: residual_of(values(theta, True)), theta0)
    try:
        with torch.no_grad():
            residual = lambda theta: residual_of(values(theta, False))      # noqa: E731
            if mode in ("one_sided", "forward_difference"):
                r0 = residual(theta0) if r0 is None else r0
                rows = None if units_of is None else (lambda theta, idx: units_of(values(theta, False), idx))
                return one_sided_jacobian(residual, theta0, r0, r0.shape[0] if units is None else units,
                                          sides=(-1.0,) if mode == "one_sided" else (), units_residual=rows)
            return residual_jacobian(residual, theta0)
    finally:
        set_raw_vector(run.params, run.learn, theta0)


RAW_STEP_LIMIT = 2.0     # logit units a parameter may move in one iteration


def bounded_step(delta: torch.Tensor) -> torch.Tensor:
    """Trust region in raw (logit) space, per parameter: each component moves at most
    RAW_STEP_LIMIT. Scaling the whole step instead would let one barely observable
    parameter (a near-zero Jacobian column, a huge Gauss-Newton step) freeze all others."""
    return delta.clamp(-RAW_STEP_LIMIT, RAW_STEP_LIMIT)


def boxed_step(system: torch.Tensor, g: torch.Tensor, theta0: torch.Tensor, max_raw: float) -> torch.Tensor:
    """The damped Gauss-Newton step ``-system^-1 g`` in the trust region (`bounded_step`) that
    keeps every raw value within +-``max_raw`` (beyond it a value is saturated: the trainer
    rolls back): a component that would leave that box is held on its face and the others are
    solved again given it. Rejecting the whole step instead froze every parameter once one
    saturated at its bound (measured: noisy_mocap's contact damping ratio at 19.999 of its
    bound 20, raw 11.7: no step accepted from 12 s to the end of the 60 s run). NaN
    components (a singular system) come back NaN; a ``theta0`` outside the box is moved onto
    its face. Solved in ``theta0``'s dtype (the raw values: float64 also under a float32
    trainer), so the face is reached exactly."""
    system, g = system.to(theta0.dtype), g.to(theta0.dtype)
    delta = bounded_step(-torch.linalg.solve(system, g))
    fixed = torch.zeros_like(delta, dtype=torch.bool)
    for _ in range(delta.numel()):
        out = ~fixed & ((theta0 + delta).abs() > max_raw)
        if not bool(out.any()):
            break
        fixed = fixed | out
        delta = torch.where(out, torch.sign(theta0 + delta) * max_raw - theta0, delta)
        free = ~fixed
        if bool(free.any()):
            rhs = g[free] + system[free][:, fixed] @ delta[fixed]
            delta = delta.clone()
            delta[free] = bounded_step(-torch.linalg.solve(system[free][:, free], rhs))
    return delta


class TupleLevenbergMarquardt:
    def __init__(self, config):
        self.config = config
        self.lm_lambda = 1e-3

    @staticmethod
    def _residual_of(run, idx: torch.Tensor):
        """The tuple residuals of parameter values ``p`` (a dict) on the tuples ``idx``."""
        return lambda p: run.objective.residuals(run.train, idx, p, run.schedule.n_steps, run.integrator)

    @torch.no_grad()
    def _residual(self, run, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        set_raw_vector(run.params, run.learn, theta)
        return self._residual_of(run, idx)(run.engine.param_values(run.dtype, run.device))

    def epoch(self, run) -> dict:
        cfg = self.config
        # as the windows: none where a stream's assumed motor start still shows (`settle`)
        p = run.engine.param_values(run.dtype, run.device)
        pool = np.flatnonzero(motor_settled(run.train.ts, settle_steps(run.robot, p, cfg.motor_settle, run.train.ts)))
        if not len(pool):
            pool = np.arange(len(run.train))
        idx = torch.as_tensor(np.sort(pool[run.rng.permutation(len(pool))[:min(len(pool), cfg.lm_tuples)]]),
                              device=run.device)
        theta0 = raw_vector(run.params, run.learn)
        r0 = self._residual(run, theta0, idx)
        f0 = float((r0 ** 2).sum())
        diverged, accepted, f, step = False, False, f0, math.inf
        if not math.isfinite(f0):
            diverged = True
        else:
            J = parameter_jacobian(run, theta0, self._residual_of(run, idx), r0=r0, units=len(idx),
                                   units_of=tuple_rows(run.objective, run.train, idx, run.schedule.n_steps,
                                                       run.integrator))
            ok = bool(torch.isfinite(J).all())
            g, H = J.T @ r0, J.T @ J
            d = H.diagonal().clamp(min=1e-12 * float(H.diagonal().max().clamp(min=1e-300)))
            for _ in range(10 if ok else 0):
                A = H + self.lm_lambda * torch.diag(d)
                try:
                    delta = boxed_step(A, g, theta0, cfg.max_raw)
                except RuntimeError:
                    delta = torch.full_like(g, math.nan)
                theta = theta0 + delta
                if bool(torch.isfinite(theta).all()) and float(theta.abs().max()) <= cfg.max_raw:
                    f = float((self._residual(run, theta, idx) ** 2).sum())
                    if math.isfinite(f) and f < f0:
                        accepted = True
                        step = float(delta.abs().max())
                        self.lm_lambda = max(self.lm_lambda / 3.0, 1e-12)
                        break
                self.lm_lambda = min(self.lm_lambda * 4.0, 1e12)
            if not accepted:
                f = f0
                set_raw_vector(run.params, run.learn, theta0)
        val = run.validate()
        if not math.isfinite(val):
            set_raw_vector(run.params, run.learn, theta0)
            diverged, accepted, step = True, False, math.inf    # rolled back: no step was taken
            run.rollbacks += 1
            val = math.inf
        # how much the step lowered its own tuples' objective: online the validation loss also
        # moves as tuples arrive, with the values standing still (measured: it fell 58 % over
        # 25 iterations whose values agreed to 4-5 digits), so only this says the solver moves
        reduction = (f0 - f) / f0 if accepted and not diverged and f0 > 0 else 0.0
        return {"loss": f, "val_loss": val, "tuples": len(idx), "diverged": diverged,
                "lm_lambda": self.lm_lambda, "lm_accepted": accepted, "step": step, "reduction": reduction}
