"""Sampling-based planners over batched rollouts (paper Section IV-C): `RandomShooting`,
`CEM` and `MPPI` (subclasses of `SamplingPlanner`), warm-started from the shifted previous
plan, commands clipped to the cable ranges. The same planner runs on any dynamics.

MPPI (Williams et al. 2017, information-theoretic MPC), per planning call::

    U <- shift(U_prev)                            # warm start, last knot repeated
    repeat `iterations` times:
        eps_n ~ N(0, diag(sigma^2)),  n = 1..N     # sample 0 is the mean itself (eps=0)
        V_n = clip(U + eps_n, low, high);  eps_n = V_n - U   # control bounds respected
        S_n = cost(rollout(V_n)) + gamma * sum_t (U_t - u_c)^T Sigma^-1 eps_n,t
        w_n = exp(-(S_n - min S) / lambda) / sum(...)         # importance weights
        U  <- U + sum_n w_n eps_n                  # a convex combination: stays in bounds
    return U[0]

``gamma`` (``control_cost``) defaults to 0 (Williams' alpha = 1), ``u_c`` is the centre
of the command range. The temperature ``lambda`` is in cost units (the default cost is in
(m/s)^2 averaged over the horizon) unless ``target_ess`` is set: then each iteration picks
the lambda whose weights have that effective sample size, a share of N (`ess_temperature`).
A fixed lambda averages more samples the flatter a model's cost landscape is (the ESS is
not the model's to choose), and its useful value moves with the cost's scale.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.control.interfaces import BAD_COST, Cost, Dynamics, as_tensor


@dataclasses.dataclass
class PlannerConfig:
    """Sizes of a sampling-based planner. Paper (Section IV-C2): 5 iterations x 40 samples,
    1 s horizon, control every 0.1 s."""

    horizon: int = 10                 # knots (control intervals) in the plan
    control_dt: float = 0.1           # s, each knot's command is held this long
    num_samples: int = 40             # N rollouts per iteration
    iterations: int = 5
    noise_scale: float = 0.25         # sampling std / width of the command range
    temperature: float = 0.05         # MPPI lambda (cost units), when target_ess is 0
    # MPPI: lambda per iteration for this effective sample size / N (0: the fixed temperature).
    # Measured (bench/mppi_temperature.py, SUPERball, three- and four-bar, 2026-11-30): the
    # fixed 0.05 averaged 15-37 of 40 samples on the true-values models, 0.2 made more
    # distance rolling and reached and stopped on 12 of 12 runs against 9 (README)
    target_ess: float = 0.2
    control_cost: float = 0.0         # MPPI gamma (0: Williams' alpha = 1)
    noise_decay: float = 0.8          # std multiplier per iteration (MPPI, CEM start)
    elite_fraction: float = 0.15      # CEM
    cem_smoothing: float = 0.2        # CEM: new = (1 - s) * fitted + s * old
    min_std_scale: float = 0.02       # CEM floor on std / width
    seed: int = 0

    @property
    def horizon_time(self) -> float:
        return self.horizon * self.control_dt


class SamplingPlanner:
    """Base class: holds the warm-start plan and the bookkeeping of one `plan` call.

    ``dynamics(state0, act0, plans [N, H, A]) -> states [N, H, R, 13]``;
    ``cost(states, plans, state0, prev_command) -> [N]``. ``low``/``high`` [A] bound
    every command. Subclasses implement `_optimize`.
    """

    name = "base"

    def __init__(self, dynamics: Dynamics, cost: Cost, low, high, config: Optional[PlannerConfig] = None,
                 *, device="cpu", dtype: torch.dtype = torch.float32, nominal=None):
        self.dynamics = dynamics
        self.cost = cost
        self.config = config or PlannerConfig()
        self.device = torch.device(device)
        self.dtype = dtype
        self.low = as_tensor(low, dtype, self.device)
        self.high = as_tensor(high, dtype, self.device)
        self.width = self.high - self.low
        self.nominal = (0.5 * (self.low + self.high) if nominal is None
                        else as_tensor(nominal, dtype, self.device))
        self.generator = torch.Generator(device=self.device)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self, plan=None) -> None:
        """Forget the warm start (``plan`` [H, A] or None: hold the nominal command)."""
        self.generator.manual_seed(int(self.config.seed))
        H = self.config.horizon
        self.mean = (self.nominal.expand(H, -1).clone() if plan is None
                     else self._clip(as_tensor(plan, self.dtype, self.device)))
        self.rollouts_evaluated = 0
        self.last_cost = float("nan")
        self.last_info: dict = {}

    def shift(self) -> None:
        """Advance the warm start by one knot, repeating the last one."""
        self.mean = torch.cat([self.mean[1:], self.mean[-1:]], 0)

    def _clip(self, u: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(u, self.high), self.low)

    def _randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator, dtype=self.dtype, device=self.device)

    def _evaluate(self, state0, act0, plans, prev_command) -> torch.Tensor:
        states = self.dynamics(state0, act0, plans)
        self.rollouts_evaluated += plans.shape[0]
        if not bool(torch.isfinite(states).flatten(1).all(1).any()):
            # every cost would be BAD_COST, the weights uniform, the plan the noise's mean:
            # a finite command with nothing behind it, so none
            raise FloatingPointError("no rollout of the planning model stayed finite (a diverging model or "
                                     "state): no plan")
        cost = self.cost(states.to(self.dtype), plans, state0, prev_command).to(self.dtype)
        return torch.where(torch.isfinite(cost), cost, torch.full_like(cost, BAD_COST))

    # ------------------------------------------------------------------ API
    @torch.no_grad()
    def plan(self, state0, act0, prev_command=None, deadline: float = math.inf) -> torch.Tensor:
        """Optimise the plan from (state0 [R, 13], act0 [A]); returns the plan [H, A]
        (its first knot is the command to apply). Does not shift: see `MPPIController`.
        Anytime: no iteration starts after ``deadline`` (``time.perf_counter()`` seconds)
        except the first; ``last_info["iterations"]`` says how many ran."""
        state0 = as_tensor(state0, self.dtype, self.device)
        act0 = as_tensor(act0, self.dtype, self.device)
        prev = act0 if prev_command is None else as_tensor(prev_command, self.dtype, self.device)
        self._deadline = float(deadline)
        self.mean = self._optimize(state0, act0, prev)
        return self.mean.clone()

    def _iterations(self):
        """Iteration indices, stopping before an iteration that would end after the deadline
        (judged by the slowest one so far; the first always runs)."""
        deadline = getattr(self, "_deadline", math.inf)
        slowest, start = 0.0, time.perf_counter()
        for it in range(self.config.iterations):
            now = time.perf_counter()
            if it > 0:
                slowest = max(slowest, now - start)
                if now + slowest > deadline:
                    break
            start = now
            self.iterations_run = it + 1
            yield it

    def _optimize(self, state0, act0, prev) -> torch.Tensor:
        raise NotImplementedError


class RandomShooting(SamplingPlanner):
    """Random shooting (Nagabandi et al.): ``iterations * num_samples`` plans with every
    knot uniform in the command range (plus the shifted previous plan); keep the best."""

    name = "rs"

    def _optimize(self, state0, act0, prev):
        c = self.config
        H, A = self.mean.shape
        best, best_cost = self.mean, None
        for it in self._iterations():
            u = torch.rand(c.num_samples, H, A, generator=self.generator, dtype=self.dtype,
                           device=self.device)
            plans = self.low + u * self.width
            if it == 0:
                plans[0] = self.mean
            costs = self._evaluate(state0, act0, plans, prev)
            i = int(torch.argmin(costs))
            if best_cost is None or costs[i] < best_cost:
                best, best_cost = plans[i].clone(), costs[i]
        self.last_cost = float(best_cost)
        self.last_info = {"iterations": self.iterations_run}
        return best


class CEM(SamplingPlanner):
    """Cross-entropy method: Gaussian around the shifted plan, refit to the elites
    (``elite_fraction`` of the samples) each iteration, std floored at ``min_std_scale``."""

    name = "cem"

    def _optimize(self, state0, act0, prev):
        c = self.config
        H, A = self.mean.shape
        mean = self.mean
        std = (c.noise_scale * self.width).expand(H, A).clone()
        n_elite = max(2, int(round(c.elite_fraction * c.num_samples)))
        best_cost = None
        for _ in self._iterations():
            plans = self._clip(mean + std * self._randn(c.num_samples, H, A))
            plans[0] = mean
            costs = self._evaluate(state0, act0, plans, prev)
            order = torch.argsort(costs)[:n_elite]
            elites = plans[order]
            if best_cost is None or costs[order[0]] < best_cost:
                best_cost = costs[order[0]]
            s = c.cem_smoothing
            mean = (1 - s) * elites.mean(0) + s * mean
            std = (1 - s) * elites.std(0) + s * std
            std = torch.maximum(std, c.min_std_scale * self.width)
        self.last_cost = float(best_cost)
        # The refitted mean is the plan (it is the distribution CEM converged to); the best
        # single sample is kept in info for diagnostics.
        self.last_info = {"best_sample_cost": float(best_cost), "iterations": self.iterations_run}
        return self._clip(mean)


class MPPI(SamplingPlanner):
    """Model predictive path integral control (see the module docstring)."""

    name = "mppi"

    def _optimize(self, state0, act0, prev):
        c = self.config
        H, A = self.mean.shape
        U = self.mean
        sigma = (c.noise_scale * self.width).expand(H, A)
        ess, lams = [], []
        for it in self._iterations():
            scale = sigma * (c.noise_decay ** it)
            eps = scale * self._randn(c.num_samples, H, A)
            eps[0] = 0.0
            plans = self._clip(U + eps)
            eps = plans - U
            costs = self._evaluate(state0, act0, plans, prev)
            if c.control_cost:
                costs = costs + c.control_cost * ((U - self.nominal) / scale ** 2 * eps).sum((-1, -2))
            beta = torch.min(costs)
            lam = ess_temperature(costs - beta, c.target_ess) if c.target_ess else float(c.temperature)
            w = torch.exp(-(costs - beta) / lam)
            w = w / w.sum()
            U = U + (w[:, None, None] * eps).sum(0)
            ess.append(float(1.0 / (w * w).sum()))
            lams.append(lam)
            self.last_cost = float(beta)
        self.last_info = {"effective_samples": ess, "temperature": lams, "iterations": self.iterations_run}
        return self._clip(U)


# `ess_temperature`'s candidates: decades of the costs' median excess either side of it
ESS_DECADES = (-4.0, 3.0)
_ESS_GRID = np.logspace(*ESS_DECADES, 128)


def ess_temperature(excess: torch.Tensor, share: float) -> float:
    """The temperature lambda whose MPPI weights exp(-excess / lambda) have an effective
    sample size (sum w)^2 / sum w^2 closest to ``share`` of the samples (log scale), from
    a log grid around the median excess (cost over the best, >= 0; outliers such as
    `BAD_COST` leave the median alone). Every excess equal: 1.0 (the weights are uniform).
    In numpy on the host: for a few dozen numbers torch's per-op dispatch costs 0.33 ms a
    call, numpy 0.06 ms (40 samples, one core)."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"target_ess is a share of the samples, in (0, 1]; got {share}")
    excess = excess.detach().to("cpu", torch.float64).numpy()
    positive = excess[excess > 0]
    if positive.size == 0:
        return 1.0
    lams = float(np.median(positive)) * _ESS_GRID
    w = np.exp(-excess[None, :] / lams[:, None])
    ess = w.sum(-1) ** 2 / (w * w).sum(-1)
    return float(lams[np.argmin(np.abs(np.log(ess) - math.log(share * excess.size)))])


PLANNERS = {"rs": RandomShooting, "cem": CEM, "mppi": MPPI}


def make_planner(name: str, dynamics: Dynamics, cost: Cost, low, high,
                 config: Optional[PlannerConfig] = None, **kwargs) -> SamplingPlanner:
    try:
        cls = PLANNERS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}; choose from {sorted(PLANNERS)}") from None
    return cls(dynamics, cost, low, high, config, **kwargs)
