"""Sampling-based model-predictive control over batched rollouts (paper Section IV-C).

Pieces (all ROS-free, float32 and gradient-free by default, any torch device):

* **Dynamics adapters** -- callables ``dynamics(state0 [R, 13], act0 [A], plans [N, H, A])
  -> states [N, H, R, 13]``: the rod state at the end of each of the H control intervals
  ("knots", ``control_dt`` long, command held over each) for N candidate plans.
  `EngineDynamics` runs the differentiable engine (`physics.TensegrityEngine`) at a
  configurable planning step and integrator (by default the semi-implicit step in the
  fused C kernel of `tensegrity_engine.physics.native`); `MujocoDynamics` runs ``mujoco.rollout``
  on the MuJoCo twin (the ground truth baseline). The same planner runs on either.
* **Costs** -- callables ``cost(states [N, H, R, 13], plans [N, H, A], state0, prev_command)
  -> [N]``. `LocomotionCost` tracks a desired CoM velocity (optionally steered at a goal)
  from the CoM displacement over each knot, with light penalties on CoM height
  excursions and command changes. Nothing in it is robot-specific: the CoM comes from
  the rod masses of the config.
* **Planners** -- `RandomShooting`, `CEM` and `MPPI` (subclasses of `SamplingPlanner`),
  warm-started from the shifted previous plan, commands clipped to the cable ranges.
* **Controllers** -- `MPPIController` (stateful: ``reset``, ``plan(rod_state, act) ->
  command [A]``, ``set_params``) for the ROS node and the closed-loop runs, and
  `ExcitationPolicy` (smooth random multi-sine commands, same interface) to collect
  informative identification data before a model exists.
* `run_closed_loop` executes a policy on the MuJoCo twin (replanning every
  ``control_dt`` from MuJoCo's measured state) and `summarize` computes the task metrics.

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
of the command range. The temperature ``lambda`` is in cost units; the default cost is
in (m/s)^2 averaged over the horizon, so lambda ~ 0.01-0.1.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.state import POS

__all__ = [
    "PlannerConfig", "EngineDynamics", "MujocoDynamics", "LocomotionCost",
    "SamplingPlanner", "RandomShooting", "CEM", "MPPI", "PLANNERS", "make_planner",
    "MPPIController", "ExcitationPolicy", "run_closed_loop", "summarize", "task_start",
    "com_xy", "params_from_file", "planning_data_points",
]

Dynamics = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Cost = Callable[..., torch.Tensor]
BAD_COST = 1e6          # cost of a rollout that produced NaN/inf


# ----------------------------------------------------------------------------- config
@dataclasses.dataclass
class PlannerConfig:
    """Sizes of a sampling-based planner. Paper (Section IV-C2): 5 iterations x 40 samples,
    1 s horizon, control every 0.1 s."""

    horizon: int = 10                 # knots (control intervals) in the plan
    control_dt: float = 0.1           # s, each knot's command is held this long
    num_samples: int = 40             # N rollouts per iteration
    iterations: int = 5
    noise_scale: float = 0.25         # sampling std / width of the command range
    temperature: float = 0.05         # MPPI lambda (cost units)
    control_cost: float = 0.0         # MPPI gamma (0: Williams' alpha = 1)
    noise_decay: float = 0.8          # std multiplier per iteration (MPPI, CEM start)
    elite_fraction: float = 0.15      # CEM
    cem_smoothing: float = 0.2        # CEM: new = (1 - s) * fitted + s * old
    min_std_scale: float = 0.02       # CEM floor on std / width
    seed: int = 0

    @property
    def horizon_time(self) -> float:
        return self.horizon * self.control_dt


def _as_tensor(x, dtype, device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(dtype=dtype, device=device)
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=device)


# ----------------------------------------------------------------------------- dynamics
_ENGINES: dict = {}


def _inductor_config():
    import torch._inductor.config as config
    return config


def _shared_engine(robot: RobotConfig, floor: bool, actuator_timing: str, device) -> TensegrityEngine:
    """One `TensegrityEngine` per (robot object, floor, actuator timing, device), shared by
    every `EngineDynamics` of the process. Parameters are always passed explicitly to the
    rollout, so sharing is safe; it keeps torch.compile to one trace per step shape (a new
    engine object would fail dynamo's guards and retrace, and after 8 retraces of the same
    code dynamo silently falls back to eager)."""
    key = (id(robot), bool(floor), actuator_timing, str(device))
    hit = _ENGINES.get(key)
    if hit is None or hit[0] is not robot:
        engine = TensegrityEngine(robot, None, floor=floor, actuator_timing=actuator_timing)
        engine.to(device)
        hit = _ENGINES[key] = (robot, engine)
    return hit[1]


class EngineDynamics:
    """Planning rollouts on the differentiable engine (no grad).

    ``dt`` is the planning step (must divide ``control_dt``); ``integrator`` one of the
    engine's. ``actuator_timing`` defaults to "start" (as MuJoCo) at the robot's native
    step and to "mean" (the filter's exact average over the step) at coarser steps.
    Measured on SUPERball vs MuJoCo (40 random 1 s plans from rest): only the native 1 ms
    semi-implicit step keeps per-knot CoM displacements well correlated (r ~ 0.86); the
    implicit integrator is stable at 10-100 ms but its correlation drops (0.56 at 10 ms,
    0.16 at 50 ms), semi-implicit diverges above ~2 ms. Default: 1 ms semi-implicit.
    Closed loop (SUPERball to (5, 0), nominal engine, MPPI 1 it x 40 samples, executed on
    MuJoCo): 1 ms with a 0.5 s horizon reaches 0.85 m/s and ends 0.76 m from the goal;
    2 ms (stable, half the steps) only 0.45 m/s at 0.5 s horizon and 0.05 m/s at 1 s.

    ``backend``: "native" runs the semi-implicit rollouts in the fused C kernel
    (`tensegrity_engine.physics.native`, compiled with the system C compiler on first use and
    cached per user): the same step to rounding, ~40x faster than the compiled torch step
    at 40 samples (MPPI at the paper's sizes, 5 it x 40 samples x 1 s: ~0.03 s per control
    step on one core, vs ~1.0-1.4 s compiled). ``threads`` sets its OpenMP threads (whole
    chunks of samples each): 2 plan ~1.5x faster at 40 samples when the second core is
    idle, slower when another job holds it, hence the default 1. "torch"
    runs the torch engine (any integrator or device). Default (None): native for the
    semi-implicit integrator on CPU unless ``compile`` is given (which asks for torch).
    Without a working C compiler the native backend raises `native.NativeBuildError`
    saying so; pass ``backend="torch"`` (CLI ``--backend torch``) to plan without one.

    ``compile`` (torch backend; default True, not for the "ani" integrator) runs the
    rollouts through the engine's torch.compile'd step: ~2.5-3x faster than eager at 40
    samples, but the first call of a process traces and compiles (~15-25 s at idle, more
    under load; later processes reuse inductor's on-disk cache for the kernels), with
    inductor's C++ wrapper. Each (integrator, dt, batch size) compiles once; if
    compilation fails the adapter warns and runs eager.
    """

    def __init__(self, robot: RobotConfig, params: Optional[PhysicalParameters] = None, *,
                 control_dt: float = 0.1, dt: Optional[float] = None,
                 integrator: str = "semi_implicit", actuator_timing: Optional[str] = None,
                 device="cpu", dtype: torch.dtype = torch.float32, floor: bool = True,
                 compile: Optional[bool] = None, backend: Optional[str] = None, threads: int = 1):
        self.robot = robot
        self.dt = float(robot.dt if dt is None else dt)
        self.control_dt = float(control_dt)
        self.substeps = int(round(self.control_dt / self.dt))
        if self.substeps < 1 or abs(self.substeps * self.dt - self.control_dt) > 1e-9:
            raise ValueError(f"planning dt {self.dt} must divide control_dt {self.control_dt}")
        if actuator_timing is None:
            actuator_timing = "start" if self.dt <= robot.dt * (1 + 1e-9) else "mean"
        self.integrator = integrator
        self.device = torch.device(device)
        self.dtype = dtype
        if backend is None:
            backend = ("native" if integrator == "semi_implicit" and self.device.type == "cpu"
                       and compile is None else "torch")
        if backend not in ("torch", "native"):
            raise ValueError(f"backend must be 'torch' or 'native', got {backend!r}")
        self.backend = backend
        self.threads = int(threads)
        self.engine = _shared_engine(robot, floor, actuator_timing, self.device)
        if backend == "native":
            if integrator != "semi_implicit":
                raise ValueError(f"the native backend runs the 'semi_implicit' integrator, not {integrator!r}; "
                                 f"use backend='torch'")
            if self.device.type != "cpu":
                raise ValueError("the native backend runs on the CPU; use backend='torch' on other devices")
            if compile:
                raise ValueError("compile=True applies to the torch backend, not the native one")
            from tensegrity_engine.physics import native
            native.load_library(dtype)              # compile now: a missing compiler fails here, clearly
            self._native = native.NativeRollout(self.engine, threads=self.threads)
            self.compile = False
        else:
            self.compile = (integrator != "ani") if compile is None else bool(compile)
            if self.compile and integrator == "ani":
                raise ValueError("compile=True supports the 'semi_implicit' and 'implicit' integrators")
        self.set_params(params if params is not None else PhysicalParameters(robot))

    def set_params(self, params: PhysicalParameters) -> None:
        """Swap the model's physical parameters (e.g. after identification)."""
        self._params = params
        with torch.no_grad():
            self._p = {k: v.detach().to(dtype=self.dtype, device=self.device)
                       for k, v in params.values().items()}

    @property
    def params(self) -> PhysicalParameters:
        return self._params

    @torch.no_grad()
    def __call__(self, state0, act0, plans) -> torch.Tensor:
        plans = _as_tensor(plans, self.dtype, self.device)
        N, H, A = plans.shape
        if self.backend == "native":
            s = _as_tensor(state0, self.dtype, self.device)
            a = _as_tensor(act0, self.dtype, self.device)
            return self._native.rollout_held(s.expand(N, *s.shape[-2:]), a.expand(N, A), plans, self.dt,
                                             hold=self.substeps, record_every=self.substeps, params=self._p)[0]
        s = _as_tensor(state0, self.dtype, self.device).expand(N, -1, -1).contiguous()
        a = _as_tensor(act0, self.dtype, self.device).expand(N, A).contiguous()
        fine = plans.repeat_interleave(self.substeps, dim=1)
        run = lambda c: self.engine.rollout(s, a, fine, self.dt, integrator=self.integrator,
                                            record_every=self.substeps, params=self._p, compile=c)[0]
        if self.compile:
            try:
                # C++ wrapper around inductor's kernels: ~20% less fixed overhead per step
                # (0.20 vs 0.25 ms per batched step at 40 samples, 1 thread)
                with _inductor_config().patch(cpp_wrapper=True):
                    return run(True)
            except Exception as err:  # no C compiler, unsupported backend, ...
                import warnings
                warnings.warn(f"EngineDynamics: torch.compile failed ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); running eager")
                self.compile = False
        return run(False)


class MujocoDynamics:
    """Planning rollouts on the MuJoCo twin through ``mujoco.rollout`` (native threads).

    Runs at the twin's own step (robot.dt); returns float32 torch tensors on ``device``.
    """

    def __init__(self, twin, *, control_dt: float = 0.1, device="cpu",
                 dtype: torch.dtype = torch.float32):
        self.twin = twin
        self.robot = twin.robot
        self.control_dt = float(control_dt)
        self.substeps = int(round(self.control_dt / self.robot.dt))
        if self.substeps < 1 or abs(self.substeps * self.robot.dt - self.control_dt) > 1e-9:
            raise ValueError(f"twin step {self.robot.dt} must divide control_dt {control_dt}")
        self.device = torch.device(device)
        self.dtype = dtype

    def __call__(self, state0, act0, plans) -> torch.Tensor:
        to_np = lambda x: (x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor)
                           else np.asarray(x, dtype=np.float64))
        plans = to_np(plans)
        N = plans.shape[0]
        fine = np.repeat(plans, self.substeps, axis=1)
        s0 = np.broadcast_to(to_np(state0), (N,) + to_np(state0).shape[-2:])
        a0 = np.broadcast_to(to_np(act0), (N, plans.shape[-1]))
        states, _ = self.twin.rollout(s0, a0, fine, record_every=self.substeps)
        return torch.as_tensor(states, dtype=self.dtype, device=self.device)


# ----------------------------------------------------------------------------- cost
def com_xy(states: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    w = mass / mass.sum()
    return (states[..., POS] * w[:, None]).sum(-2)


class LocomotionCost:
    """Track a desired CoM velocity over the horizon (robot-agnostic).

    Per knot k the achieved CoM velocity is the displacement over the knot divided by
    ``control_dt`` (robust to the CoM bobbing of a rolling polyhedron). Desired velocity:
    ``target_velocity`` (x, y), or, when ``goal`` (x, y) is given, ``speed`` towards the
    goal from the CoM at the start of the knot (capped so as not to overshoot it within
    the knot). Cost per rollout, averaged over knots::

        |v_xy - v_des|^2 + w_height (z_k - z_0)^2 + w_smooth |u_k - u_{k-1}|^2 / width^2

    with ``u_{-1}`` the command being applied. NaN rollouts cost `BAD_COST`.
    """

    def __init__(self, robot: RobotConfig, *, target_velocity: Sequence[float] = (1.0, 0.0),
                 goal: Optional[Sequence[float]] = None, speed: Optional[float] = None,
                 control_dt: float = 0.1, w_height: float = 0.1, w_smooth: float = 0.002,
                 terminal_weight: float = 1.0):
        self.robot = robot
        self.target_velocity = np.asarray(target_velocity, dtype=np.float64)[:2]
        self.goal = None if goal is None else np.asarray(goal, dtype=np.float64)[:2]
        self.speed = float(np.linalg.norm(self.target_velocity) if speed is None else speed)
        self.control_dt = float(control_dt)
        self.w_height = float(w_height)
        self.w_smooth = float(w_smooth)
        self.terminal_weight = float(terminal_weight)
        self._mass = torch.as_tensor(robot.rod_mass)
        self._width = torch.as_tensor(robot.command_high - robot.command_low)

    def set_goal(self, velocity=None, *, goal=None) -> None:
        """Track ``velocity`` (x, y) m/s (speed = its norm; goal steering off), or, with
        ``goal`` (x, y), head for that point at ``speed`` (or at |velocity| if given)."""
        if velocity is not None:
            self.target_velocity = np.asarray(velocity, dtype=np.float64)[:2]
            self.speed = float(np.linalg.norm(self.target_velocity))
        self.goal = None if goal is None else np.asarray(goal, dtype=np.float64)[:2]

    def desired_velocity(self, com: torch.Tensor) -> torch.Tensor:
        """[..., 2] desired CoM velocity at CoM positions com [..., >=2]."""
        if self.goal is None:
            return torch.as_tensor(self.target_velocity, dtype=com.dtype,
                                   device=com.device).expand(*com.shape[:-1], 2)
        to_goal = torch.as_tensor(self.goal, dtype=com.dtype, device=com.device) - com[..., :2]
        dist = torch.linalg.vector_norm(to_goal, dim=-1, keepdim=True)
        speed = torch.clamp(dist / self.control_dt, max=self.speed)
        return to_goal / dist.clamp_min(1e-6) * speed

    def __call__(self, states: torch.Tensor, plans: torch.Tensor, state0, prev_command) -> torch.Tensor:
        dtype, device = states.dtype, states.device
        mass = self._mass.to(dtype=dtype, device=device)
        s0 = _as_tensor(state0, dtype, device)
        com0 = com_xy(s0, mass)                                  # [3]
        com = com_xy(states, mass)                               # [N, H, 3]
        prev = torch.cat([com0.expand(com.shape[0], 1, 3), com[:, :-1]], 1)
        vel = (com[..., :2] - prev[..., :2]) / self.control_dt   # [N, H, 2]
        v_des = self.desired_velocity(prev)
        H = com.shape[1]
        weights = torch.ones(H, dtype=dtype, device=device)
        weights[-1] = self.terminal_weight
        track = (((vel - v_des) ** 2).sum(-1) * weights).sum(-1) / weights.sum()
        height = ((com[..., 2] - com0[2]) ** 2).mean(-1)
        width = self._width.to(dtype=dtype, device=device)
        u_prev = _as_tensor(prev_command, dtype, device).expand(plans.shape[0], 1, -1)
        du = torch.diff(torch.cat([u_prev, plans], 1), dim=1) / width
        smooth = (du ** 2).sum(-1).mean(-1)
        cost = track + self.w_height * height + self.w_smooth * smooth
        return torch.where(torch.isfinite(cost), cost, torch.full_like(cost, BAD_COST))


# ----------------------------------------------------------------------------- planners
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
        self.low = _as_tensor(low, dtype, self.device)
        self.high = _as_tensor(high, dtype, self.device)
        self.width = self.high - self.low
        self.nominal = (0.5 * (self.low + self.high) if nominal is None
                        else _as_tensor(nominal, dtype, self.device))
        self.generator = torch.Generator(device=self.device)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self, plan=None) -> None:
        """Forget the warm start (``plan`` [H, A] or None: hold the nominal command)."""
        self.generator.manual_seed(int(self.config.seed))
        H = self.config.horizon
        self.mean = (self.nominal.expand(H, -1).clone() if plan is None
                     else self._clip(_as_tensor(plan, self.dtype, self.device)))
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
        cost = self.cost(states.to(self.dtype), plans, state0, prev_command).to(self.dtype)
        return torch.where(torch.isfinite(cost), cost, torch.full_like(cost, BAD_COST))

    # ------------------------------------------------------------------ API
    @torch.no_grad()
    def plan(self, state0, act0, prev_command=None) -> torch.Tensor:
        """Optimise the plan from (state0 [R, 13], act0 [A]); returns the plan [H, A]
        (its first knot is the command to apply). Does not shift: see `MPPIController`."""
        state0 = _as_tensor(state0, self.dtype, self.device)
        act0 = _as_tensor(act0, self.dtype, self.device)
        prev = act0 if prev_command is None else _as_tensor(prev_command, self.dtype, self.device)
        self.mean = self._optimize(state0, act0, prev)
        return self.mean.clone()

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
        for it in range(c.iterations):
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
        for _ in range(c.iterations):
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
        self.last_info = {"best_sample_cost": float(best_cost)}
        return self._clip(mean)


class MPPI(SamplingPlanner):
    """Model predictive path integral control (see the module docstring)."""

    name = "mppi"

    def _optimize(self, state0, act0, prev):
        c = self.config
        H, A = self.mean.shape
        U = self.mean
        sigma = (c.noise_scale * self.width).expand(H, A)
        lam = float(c.temperature)
        ess = []
        for it in range(c.iterations):
            scale = sigma * (c.noise_decay ** it)
            eps = scale * self._randn(c.num_samples, H, A)
            eps[0] = 0.0
            plans = self._clip(U + eps)
            eps = plans - U
            costs = self._evaluate(state0, act0, plans, prev)
            if c.control_cost:
                costs = costs + c.control_cost * ((U - self.nominal) / scale ** 2 * eps).sum((-1, -2))
            beta = torch.min(costs)
            w = torch.exp(-(costs - beta) / lam)
            w = w / w.sum()
            U = U + (w[:, None, None] * eps).sum(0)
            ess.append(float(1.0 / (w * w).sum()))
            self.last_cost = float(beta)
        self.last_info = {"effective_samples": ess}
        return self._clip(U)


PLANNERS = {"rs": RandomShooting, "cem": CEM, "mppi": MPPI}


def make_planner(name: str, dynamics: Dynamics, cost: Cost, low, high,
                 config: Optional[PlannerConfig] = None, **kwargs) -> SamplingPlanner:
    try:
        cls = PLANNERS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}; choose from {sorted(PLANNERS)}") from None
    return cls(dynamics, cost, low, high, config, **kwargs)


# ----------------------------------------------------------------------------- controllers
class MPPIController:
    """Stateful receding-horizon controller (one call per ``control_dt``).

    ``plan(rod_state [R, 13], act [A]) -> command [A]`` (numpy float64, inside the command
    range): optimises from the measured state, returns the plan's first knot and shifts
    the plan for the next call (warm start). ``reset()`` forgets the plan.
    ``set_params(PhysicalParameters)`` swaps the engine model (engine dynamics only).

    Default: MPPI over the engine (`EngineDynamics`; ``backend``, ``compile`` and ``threads``
    are passed to it) with `LocomotionCost` (1 m/s along +x).
    Pass ``dynamics=MujocoDynamics(twin)`` to plan on MuJoCo, ``planner="cem"``/``"rs"``
    for the other planners.
    """

    def __init__(self, robot: RobotConfig, *, params: Optional[PhysicalParameters] = None,
                 dynamics: Optional[Dynamics] = None, cost: Optional[Cost] = None,
                 planner: str = "mppi", config: Optional[PlannerConfig] = None,
                 engine_dt: Optional[float] = None, integrator: str = "semi_implicit",
                 device="cpu", dtype: torch.dtype = torch.float32, compile: Optional[bool] = None,
                 backend: Optional[str] = None, threads: int = 1):
        self.robot = robot
        self.config = config or PlannerConfig()
        if dynamics is None:
            dynamics = EngineDynamics(robot, params, control_dt=self.config.control_dt,
                                      dt=engine_dt, integrator=integrator, device=device, dtype=dtype,
                                      compile=compile, backend=backend, threads=threads)
        elif params is not None:
            raise ValueError("give either params (engine dynamics) or dynamics, not both")
        self.dynamics = dynamics
        self.cost = cost or LocomotionCost(robot, control_dt=self.config.control_dt)
        self.planner = make_planner(planner, dynamics, self.cost, robot.command_low,
                                    robot.command_high, self.config, device=device, dtype=dtype)
        self.last_plan_time = float("nan")
        self.plan_times: list[float] = []
        self._prev = None

    @property
    def control_dt(self) -> float:
        return self.config.control_dt

    def reset(self) -> None:
        self.planner.reset()
        self.plan_times = []
        self._prev = None

    def set_goal(self, velocity=None, *, goal=None) -> None:
        """New task for the cost (see `LocomotionCost.set_goal`); the warm start is kept."""
        self.cost.set_goal(velocity, goal=goal)

    def set_params(self, params: PhysicalParameters) -> None:
        if not hasattr(self.dynamics, "set_params"):
            raise TypeError(f"{type(self.dynamics).__name__} has no physical parameters to set")
        self.dynamics.set_params(params)

    @property
    def current_plan(self) -> np.ndarray:
        return self.planner.mean.detach().cpu().double().numpy()

    def plan(self, rod_state, act) -> np.ndarray:
        t0 = time.perf_counter()
        prev = act if self._prev is None else self._prev
        plan = self.planner.plan(rod_state, act, prev)
        command = plan[0].detach().cpu().double().numpy()
        self.planner.shift()
        self._prev = command
        self.last_plan_time = time.perf_counter() - t0
        self.plan_times.append(self.last_plan_time)
        return command

    __call__ = plan


class ExcitationPolicy:
    """Smooth random excitation for identification data (no model needed).

    Each actuated cable follows ``mid + amp * sum_j a_j sin(2 pi f_j t + phi_j)`` with
    ``num_sines`` random frequencies log-uniform in ``freq_range`` Hz, random phases and
    weights (normalised so the sum stays within +-1), ``amp = amplitude * width / 2`` around
    the range centre ``mid``; ``kind="chirp"`` instead sweeps each cable's frequency
    log-linearly from ``freq_range[0]`` to ``freq_range[1]`` over ``duration`` s (random
    phase). Always inside the command range. Same call as `MPPIController`:
    ``plan(rod_state, act) -> command`` (state ignored), one call per ``control_dt``; or
    `command_at(t)` for any time, `commands(num_steps, dt)` for a whole open-loop run.
    """

    def __init__(self, robot: RobotConfig, *, seed: int = 0, kind: str = "multisine",
                 amplitude: float = 0.8, freq_range=(0.2, 2.0), num_sines: int = 3,
                 control_dt: float = 0.1, duration: float = 5.0):
        if kind not in ("multisine", "chirp"):
            raise ValueError(f"kind must be 'multisine' or 'chirp', got {kind!r}")
        if not 0.0 < amplitude <= 1.0:
            raise ValueError("amplitude must be in (0, 1]")
        self.robot, self.kind, self.seed = robot, kind, int(seed)
        self.amplitude, self.freq_range = float(amplitude), tuple(float(f) for f in freq_range)
        self.num_sines, self.control_dt, self.duration = int(num_sines), float(control_dt), float(duration)
        self.low, self.high = robot.command_low, robot.command_high
        self.reset()

    def reset(self) -> None:
        rng = np.random.default_rng(self.seed)
        A = self.robot.num_actuated
        lo, hi = np.log(self.freq_range[0]), np.log(self.freq_range[1])
        self._freq = np.exp(rng.uniform(lo, hi, (A, self.num_sines)))
        self._phase = rng.uniform(0, 2 * np.pi, (A, self.num_sines))
        w = rng.uniform(0.5, 1.0, (A, self.num_sines))
        self._weight = w / w.sum(-1, keepdims=True)
        self._t = 0.0

    def command_at(self, t) -> np.ndarray:
        """Commands [..., A] at times t (s, scalar or array)."""
        t = np.asarray(t, dtype=np.float64)[..., None, None]
        if self.kind == "multisine":
            s = (self._weight * np.sin(2 * np.pi * self._freq * t + self._phase)).sum(-1)
        else:
            f0, f1 = self.freq_range
            k = np.log(f1 / f0) / self.duration
            phase = 2 * np.pi * f0 * (np.exp(k * t[..., 0]) - 1.0) / k
            s = np.sin(phase + self._phase[:, 0])
        mid, half = 0.5 * (self.low + self.high), 0.5 * (self.high - self.low)
        return np.clip(mid + self.amplitude * half * s, self.low, self.high)

    def commands(self, num_steps: int, dt: float) -> np.ndarray:
        """[S, A] commands at every step of length dt from t = 0."""
        return self.command_at(np.arange(num_steps) * dt)

    def plan(self, rod_state=None, act=None) -> np.ndarray:
        u = self.command_at(self._t)
        self._t += self.control_dt
        return u

    __call__ = plan


# ----------------------------------------------------------------------------- execution
def task_start(robot: RobotConfig, start_xy=(0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """(rod_state [R, 13], act [A]): the robot at rest on the floor with its CoM above
    ``start_xy``."""
    from tensegrity_engine.groundtruth.environments import rest_pose
    from tensegrity_engine.physics.state import center_of_mass

    rs, act = rest_pose(robot)
    com = center_of_mass(rs, robot.rod_mass)
    rs[:, 0:2] += np.asarray(start_xy, dtype=np.float64) - com[:2]
    return rs, act


def run_closed_loop(policy, twin, state0, act0, *, num_steps: int = 50, control_dt: float = 0.1,
                    record_dt: float = 0.01, progress: Optional[Callable[[int, dict], None]] = None) -> dict:
    """Execute ``policy.plan(rod_state, act) -> command`` on the MuJoCo twin, replanning
    every ``control_dt`` from the twin's state. Returns a dict of numpy arrays: ``t``
    [T], ``states`` [T, R, 13] every ``record_dt`` (t = 0 included), ``commands``
    [num_steps, A], ``plan_time`` [num_steps] (s)."""
    robot = twin.robot
    per_ctrl = int(round(control_dt / robot.dt))
    per_rec = int(round(record_dt / robot.dt))
    if per_ctrl * robot.dt - control_dt > 1e-9 or per_ctrl % per_rec:
        raise ValueError("record_dt must divide control_dt, which must be a multiple of robot.dt")
    twin.reset(state0, act0)
    states, times, commands, plan_time = [twin.get_state()[0]], [0.0], [], []
    for k in range(num_steps):
        rs, act = twin.get_state()
        t0 = time.perf_counter()
        u = np.asarray(policy.plan(rs, act), dtype=np.float64)
        plan_time.append(time.perf_counter() - t0)
        commands.append(u)
        for j in range(per_ctrl // per_rec):
            twin.step(u, nsteps=per_rec)
            states.append(twin.get_state()[0])
            times.append(times[-1] + record_dt)
        if progress is not None:
            progress(k, {"state": states[-1], "plan_time": plan_time[-1]})
    return {"t": np.array(times), "states": np.array(states), "commands": np.array(commands),
            "plan_time": np.array(plan_time), "control_dt": control_dt}


def summarize(robot: RobotConfig, traj: dict, goal=(5.0, 0.0)) -> dict:
    """Task metrics of a closed-loop run: mean x velocity (displacement / duration),
    final CoM xy, distance to ``goal``, per-control-step CoM velocity [K, 2]."""
    from tensegrity_engine.physics.state import center_of_mass

    com = center_of_mass(traj["states"], robot.rod_mass)
    t = traj["t"]
    per = int(round(traj["control_dt"] / (t[1] - t[0])))
    knots = com[::per]
    vel = np.diff(knots[:, :2], axis=0) / traj["control_dt"]
    duration = t[-1] - t[0]
    return {
        "com": com,
        "knot_t": t[::per][1:],
        "knot_velocity": vel,
        "mean_vx": float((com[-1, 0] - com[0, 0]) / duration),
        "final_xy": com[-1, :2].copy(),
        "distance": float(np.linalg.norm(com[-1, :2] - np.asarray(goal, dtype=np.float64))),
        "plan_time_mean": float(np.mean(traj["plan_time"])),
    }


def planning_data_points(config: PlannerConfig, num_control_steps: int, sample_interval: float = 0.1) -> int:
    """Ground-truth data points consumed by planning directly on the ground truth
    (paper IV-C2): steps x iterations x samples x horizon / sampling interval."""
    return int(round(num_control_steps * config.iterations * config.num_samples
                     * config.horizon_time / sample_interval))


def params_from_file(robot: RobotConfig, path) -> PhysicalParameters:
    """`PhysicalParameters` of ``robot`` from a YAML file: either a robot config (the
    identification's export; its physical values are taken, topology must match) or a
    mapping ``{name: value or [values]}`` (``PhysicalParameters.as_dict()``), optionally
    under a ``parameters:`` key."""
    import yaml

    from tensegrity_engine.physics.config import robot_from_dict
    from tensegrity_engine.physics.params import SPEC_BY_NAME, nominal_values

    with open(path) as fh:
        data = yaml.safe_load(fh)
    if isinstance(data, dict) and "rods" in data and "cables" in data:
        other = robot_from_dict(data, source=str(path))
        if (other.num_rods, other.num_cables) != (robot.num_rods, robot.num_cables):
            raise ValueError(f"{path}: robot topology differs from {robot.name}")
        values = nominal_values(other)
    else:
        values = data.get("parameters", data) if isinstance(data, dict) else None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a robot config or a mapping of parameters")
        unknown = set(values) - set(SPEC_BY_NAME)
        if unknown:
            raise ValueError(f"{path}: unknown parameter(s) {sorted(unknown)}")
    per_element = [k for k, v in values.items() if np.size(v) > 1 and np.ptp(np.asarray(v)) > 0]
    return PhysicalParameters(robot, values=values, per_element=per_element)
