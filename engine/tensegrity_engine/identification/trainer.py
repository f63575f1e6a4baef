"""Recurrent progressive identification from sparse (10 Hz) data (paper III-A, III-C, Alg. 1).

Public API (the ROS identifier node uses exactly this)::

    trainer = ProgressiveTrainer(robot, IdentificationConfig(...), device="cpu", dtype=torch.float64,
                                 initial=None)          # initial: PhysicalParameters / dict of values
    trainer.set_data(train, val)       # lists of Trajectory or TupleSet (see dataset.py)
    trainer.add_tuples(tuples)         # streaming: append training tuples (TupleSet / Trajectory)
    while not trainer.done:
        m = trainer.train_epoch()      # {'loss','val_loss','stage','integrator','dt','lr','epoch',
                                       #  'tuples','seconds','diverged', ...}
    trainer.parameters                 # PhysicalParameters (bounded, identified)
    trainer.state_dict() / trainer.load_state_dict(sd)   # resumable (call after set_data)
    evaluate(trainer.parameters, test_trajs, ...)         # CoM error vs time
    export_yaml(trainer.parameters, path)                 # loadable robot config

Tuples and loss. A tuple is (X_t, U_t, X_t+T): T = ``period`` (100 ms), U_t the commands
(and known wrenches) of the T/dt_r engine steps in between. The engine runs T/dt steps of
the current stage's dt from X_t (commands averaged over each coarse step) and the loss is

    L = mean over tuples, free rods and both end nodes of
        |x_hat - x|^2 + w_vel * T^2 |xdot_hat - xdot|^2              (m^2)

on rod END NODES (position and velocity): they carry the rod centre and axis (the paper's
per-rod p, v, axis, omega view; spin about a symmetric rod's axis is unobservable) in one
unit, and T^2 turns a velocity error into the position error it causes over one sample
interval, so both terms are commensurate. Welded rods are excluded. All tuples of a batch
run in parallel on the batch dimension; gradients flow back through time (BPTT).

Actuator state: the filtered command at each tuple start is rebuilt from the trajectory's
initial actuator state and all commands before the tuple with the *current* time constant
(exact first-order filter, differentiable), so it never has to be measured and tau is
identifiable from the rest-length dynamics.

Pose-only data (mocap: no velocities). At 10 Hz a SUPERball is near its sampling limit
(sqrt(K/m) T ~ 3), so finite-difference velocities of the poses are 25-45 % off, and a
velocity error changes the pose one interval later much less than a parameter error does
(cable damping erases most of it within ~10 ms; the rest decays with the slow overdamped
modes). A latent velocity per tuple, fitted to the single pose X_t+T, can therefore absorb
almost any parameter error: that formulation does not identify. What is used instead:

* coarse stage: the velocities of X_t and X_t+T are central finite differences of the poses
  (``_finite_difference_velocity``) and the velocity loss above is used on them. Biased, but
  it lands in the basin of the exact fit (measured on SUPERball: K 16.7k, c 1.8k, m 15.8
  with K/m and c/m within 15 % of the truth);
* fine stage (``fine_optimizer="lm"``): windowed multiple shooting. A window is
  ``pose_window`` (default 3) consecutive tuples; the engine runs the whole window (3 x 100
  ms at 1 ms) from X_t's pose and a *latent* initial velocity (initialised by the finite
  differences) and the residual is every end-node position at the window's samples. 36
  latents against 90 observed coordinates are over-determined, so the parameters are
  identified; Levenberg-Marquardt solves parameters and all window latents jointly, with the
  block-diagonal latent part eliminated by a Schur complement per window (bundle-adjustment
  style) and central-difference Jacobians (window latents perturbed for all windows in one
  batched rollout). Spin about a rod's axis moves no node, so the latent blocks are
  regularised relative to their largest curvature. ``lm_windows`` windows (a fixed random
  subset, their latents persist) are used; the reported validation loss of this stage is
  the normalised window objective.
  Measured (SUPERball, no contact, MuJoCo data with velocities removed): from the coarse
  result above all parameters within 0.1 % in 3 iterations and exact (0.000 %) in 7.
* ``fine_optimizer="adam"``: the previous formulation (per-tuple latent velocities trained
  with Adam, with a multiple-shooting continuity term between consecutive tuples), kept as
  an option; it does not converge from random starts.

The loss is divided by the data's zero-motion loss (``normalize_loss``: the same loss with
x_hat = x_t, computed once on the first training data), so it reads as the fraction of the
motion left unexplained and lr / tolerances mean the same for any robot.

Multi-start (``n_starts``, random init only): that many random starts within the bounds
are scored on the first stage's loss (one implicit step of T, 64 fixed training tuples)
and the best is kept. Starting values are never taken from the truth.

Progressive training (Alg. 1, `schedule="progressive"`): implicit integration with dt = T
and lr = lr0; after ``patience`` epochs without a validation improvement of at least
``min_rel_improvement`` (or ``max_stage_epochs``) the best parameters of the stage are
restored and dt is halved down to the engine step (dt = max(dt/2, dt_r)); at dt_r lr is
halved down to ``coarse_lr_min`` (lr0/4 by default: an implicit step at 1 ms is the most
expensive part and the fine stage is exact anyway); then the fine stage starts from the
best coarse parameters with the semi-implicit (or ANI) integrator at dt_r:

* ``fine_optimizer="lm"`` (default, velocity data): Levenberg-Marquardt in raw space,
  one iteration per epoch on ``lm_tuples`` random tuples, Jacobian by central differences
  (2P no-grad rollouts; P is small), adaptive damping, step bounded to 2 in logit units.
  It ends when the validation loss stops improving (``lm_patience``), reaches ``lm_tol`` (exact
  data: round-off) or after ``lm_max_iters``. Without contact the engine equals MuJoCo,
  so Gauss-Newton converges quadratically to the exact parameters.
* ``fine_optimizer="adam"`` (and always with latent velocities): lr reset to lr0 and
  halved until < lr_min, as in the paper.

A coarse epoch draws at most ``max(1, coarse_work // (T/dt))`` minibatches (an implicit
step costs about the same for any batch size, so this bounds the time per epoch). With
``max_seconds`` the implicit phase may use ``coarse_time_fraction`` of it, then the fine
stage starts regardless. ``implicit_only`` stops after the implicit phase (lr down to
lr_min), ``feedforward`` (the prior work) keeps a single implicit step of T, ``fine_only``
runs only the fine phase (refinement from good values). Divergence (NaN/inf loss or
gradient, parameters saturating their bounds) restores the last good parameters and counts
as a non-improving epoch.

Learning happens on the unconstrained raw parameters of `PhysicalParameters` (Adam with
gradient-norm clipping ``grad_clip``, minibatches of ``batch_size``), so a learning rate is
a step in logit space and never leaves the physical bounds. `add_tuples` keeps the Adam
moments of tensors whose shape is unchanged (the parameters) and drops the rest (the grown
latent velocities).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.identification.dataset import Trajectory, TupleSet, robot_to_yaml, to_tuples
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.state import ANG_VEL, LIN_VEL, POS, QUAT, quat_axis

NONCONTACT_PARAMS = ("cable_stiffness", "cable_damping", "rod_mass", "actuator_time_constant",
                     "actuator_gain", "actuator_offset")
CONTACT_PARAMS = ("contact_stiffness", "contact_damping", "friction_sliding",
                  "friction_torsional", "friction_rolling")
SCHEDULES = ("progressive", "implicit_only", "feedforward", "fine_only")


def default_learnable(floor: bool) -> tuple[str, ...]:
    """Non-contact data (no floor) identifies the robot; contact data identifies contact."""
    return CONTACT_PARAMS if floor else NONCONTACT_PARAMS


@dataclasses.dataclass
class IdentificationConfig:
    period: float = 0.1                 # s, T: sampling interval of the tuples
    learn: Optional[tuple] = None       # parameter names; None: default_learnable(env)
    per_element: tuple = ()             # names identified per cable / per rod
    bounds: Optional[dict] = None       # {name: (lo, hi)} overriding the broad default ranges
    schedule: str = "progressive"
    lr0: float = 0.1
    lr_min: float = 1e-4
    coarse_integrator: str = "implicit"
    fine_integrator: str = "semi_implicit"   # or "ani"
    patience: int = 2                   # non-improving epochs before a stage change
    min_rel_improvement: float = 1e-3   # val loss must fall by this fraction to count
    max_stage_epochs: Optional[int] = None
    max_epochs: int = 10_000
    max_seconds: Optional[float] = None
    batch_size: int = 16
    epoch_tuples: Optional[int] = None  # training tuples drawn per epoch (None: all)
    val_tuples: Optional[int] = None    # fixed validation subset (None: all)
    w_vel: float = 1.0                  # weight of the end-node velocity term
    latent_velocity: Optional[bool] = None   # None: when the data has no velocities
    latent_lr_ratio: float = 0.1        # latent-velocity lr / parameter lr (fine_optimizer="adam")
    pose_window: int = 3                # pose-only LM: tuples per multiple-shooting window
    lm_windows: int = 64                # pose-only LM: windows (fixed subset) per iteration
    max_raw: float = 12.0               # |raw| beyond this = saturated/exploded -> rollback
    init: str = "random"                # "random" (within bounds) or "given" (initial values)
    seed: int = 0
    n_starts: int = 16                  # multi-start: random starts scored on the dt=T loss, best kept
    coarse_work: int = 128              # coarse epoch: at most max(1, coarse_work // (T/dt)) minibatches
    coarse_lr_min: Optional[float] = None   # implicit phase lr floor (None: lr0 / 4)
    grad_clip: Optional[float] = 10.0   # clip the (normalised) parameter gradient norm
    fine_optimizer: str = "lm"          # "lm" (Levenberg-Marquardt) or "adam" for the fine stage
    lm_tuples: int = 256                # tuples per Levenberg-Marquardt iteration (random subset)
    lm_max_iters: int = 40
    lm_patience: int = 4                # non-improving LM iterations before the fine stage ends
    lm_tol: float = 1e-24               # normalised val loss at which LM stops (exact data: round-off)
    lm_step_tol: float = 1e-8           # LM stops when an accepted step moves no raw parameter more
    coarse_time_fraction: float = 0.6   # with max_seconds: share of it the implicit phase may use
    normalize_loss: bool = True         # divide the loss by the zero-motion loss of the data
    collision: str = "differentiable"   # ground collision checker: "differentiable" or "mujoco"
                                        # (MuJoCo's mj_collision per state, no geometry gradient:
                                        # ablation (c) only, much slower)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.fine_optimizer not in ("lm", "adam"):
            raise ValueError(f"fine_optimizer must be 'lm' or 'adam', got {self.fine_optimizer!r}")
        if self.collision not in ("differentiable", "mujoco"):
            raise ValueError(f"collision must be 'differentiable' or 'mujoco', got {self.collision!r}")
        if self.init not in ("random", "given"):
            raise ValueError(f"init must be 'random' or 'given', got {self.init!r}")
        for name in ("period", "lr0", "lr_min"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.pose_window < 2 or self.lm_windows < 1:
            raise ValueError("pose_window must be >= 2 (one pose per latent velocity does not "
                             "identify) and lm_windows >= 1")
        if self.patience < 1 or self.batch_size < 1:
            raise ValueError("patience and batch_size must be >= 1")
        if self.learn is not None:
            self.learn = tuple(self.learn)
        self.per_element = tuple(self.per_element)


# --------------------------------------------------------------------------- helpers
def _as_tuples(data, period: float, dt: float) -> Optional[TupleSet]:
    if data is None:
        return None
    if isinstance(data, (TupleSet, Trajectory)):
        data = [data]
    sets = [d if isinstance(d, TupleSet) else to_tuples(d, period, dt) for d in data]
    return TupleSet.concat(sets) if sets else None


def averaging_matrix(fine: int, coarse: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """[coarse, fine] weights averaging a zero-order-hold signal of ``fine`` equal steps over
    ``coarse`` equal steps of the same interval (exact for fractional overlaps)."""
    edges_c = torch.linspace(0, 1, coarse + 1, dtype=torch.float64)
    edges_f = torch.linspace(0, 1, fine + 1, dtype=torch.float64)
    lo = torch.maximum(edges_c[:-1, None], edges_f[None, :-1])
    hi = torch.minimum(edges_c[1:, None], edges_f[None, 1:])
    w = (hi - lo).clamp(min=0) * coarse
    return w.to(dtype=dtype, device=device)


def node_state(state: torch.Tensor, half_length: torch.Tensor):
    """End-node positions and velocities [..., R, 2, 3]."""
    axis = quat_axis(state[..., QUAT])
    r = axis * half_length[:, None]
    lever = torch.stack([-r, r], -2)
    pos = state[..., None, POS] + lever
    vel = state[..., None, LIN_VEL] + torch.linalg.cross(
        state[..., None, ANG_VEL].expand_as(lever), lever, dim=-1)
    return pos, vel


def _finite_difference_velocity(x0: np.ndarray, x1: np.ndarray, prev: np.ndarray, T: float) -> np.ndarray:
    """[N, R, 6] central (or forward) differences of tuple poses: velocity estimates at x0."""
    before = np.where((prev >= 0)[:, None, None], x0[np.clip(prev, 0, None)], x0)
    span = np.where(prev >= 0, 2.0 * T, T)[:, None, None]
    v = (x1[..., POS] - before[..., POS]) / span
    qa, qb = before[..., QUAT], x1[..., QUAT]
    # world-frame rotation dq = qb * conj(qa) -> rotation vector / span
    w_a, v_a = qa[..., :1], -qa[..., 1:]
    w_b, v_b = qb[..., :1], qb[..., 1:]
    dw = w_b * w_a - (v_b * v_a).sum(-1, keepdims=True)
    dv = w_b * v_a + w_a * v_b + np.cross(v_b, v_a)
    sign = np.where(dw >= 0, 1.0, -1.0)
    dw, dv = dw * sign, dv * sign
    norm = np.linalg.norm(dv, axis=-1, keepdims=True)
    angle = 2.0 * np.arctan2(norm, dw)
    axis = dv / np.maximum(norm, 1e-12)
    return np.concatenate([v, axis * angle / span], -1)


class _Data:
    """A TupleSet as device tensors plus what the loss needs."""

    def __init__(self, ts: TupleSet, dtype, device, latent: bool):
        f = lambda a: torch.as_tensor(np.asarray(a), dtype=dtype, device=device)
        self.ts = ts
        self.x0, self.x1 = f(ts.x0), f(ts.x1)
        self.commands = f(ts.commands)
        self.wrenches = None if ts.wrenches is None else f(ts.wrenches)
        self.next = torch.as_tensor(ts.next, device=device)
        S = ts.steps
        K = max(len(c) // S for c in ts.traj_commands)
        grid = np.zeros((len(ts.traj_commands), K, S, ts.commands.shape[-1]))
        for j, c in enumerate(ts.traj_commands):
            k = len(c) // S
            grid[j, :k] = c[:k * S].reshape(k, S, -1)
            grid[j, k:] = c[-1]
        self.cmd_grid = f(grid)
        self.traj_act0 = f(np.stack(ts.traj_act0))
        self.traj = torch.as_tensor(ts.traj, device=device)
        self.chunk = torch.as_tensor(ts.start_step // S, device=device)
        self.latent = None
        if latent:
            # Velocity estimates by finite differences: x0 central (forward at a chain start),
            # x1 the next tuple's estimate (backward difference at a chain end). They stand in
            # for measured velocities in the coarse stage and initialise the latents.
            v0 = _finite_difference_velocity(ts.x0, ts.x1, ts.prev, ts.period)
            v_back = _finite_difference_velocity(ts.x0, ts.x1, -np.ones(len(ts), dtype=np.int64), ts.period)
            v1 = np.where((ts.next >= 0)[:, None, None], v0[np.clip(ts.next, 0, None)], v_back)
            self.x0 = torch.cat([self.x0[..., :7], f(v0)], -1)
            self.x1 = torch.cat([self.x1[..., :7], f(v1)], -1)
            self.latent = torch.nn.Parameter(f(v0))

    def __len__(self):
        return len(self.ts)


# --------------------------------------------------------------------------- trainer
class ProgressiveTrainer:
    """Algorithm 1 on tuples, one `train_epoch` at a time (see the module docstring)."""

    def __init__(self, robot: RobotConfig, config: Optional[IdentificationConfig] = None, *,
                 device="cpu", dtype: torch.dtype = torch.float64, initial=None,
                 log: Optional[Callable[[str], None]] = None):
        self.robot = robot
        self.config = config or IdentificationConfig()
        self.device = torch.device(device)
        self.dtype = dtype
        self.log = log or (lambda msg: None)
        values = initial.as_dict() if isinstance(initial, PhysicalParameters) else initial
        self._initial_values = values
        self.params = PhysicalParameters(robot, values, per_element=self.config.per_element,
                                         bounds=self.config.bounds)
        self.engine: Optional[TensegrityEngine] = None
        self.train: Optional[_Data] = None
        self.val: Optional[_Data] = None
        self.learn: Optional[tuple] = None
        self.rng = np.random.default_rng(self.config.seed)
        self.history: list[dict] = []
        self.stage_log: list[dict] = []
        self.epoch = 0
        self.phase = "coarse" if self.config.schedule != "fine_only" else "fine"
        self.n_steps = self.full_steps if self.phase == "fine" else 1
        self.lr = self.config.lr0
        self.best_val = math.inf
        self.bad_epochs = 0
        self.stage_epochs = 0
        self.elapsed = 0.0
        self._best_snapshot = None
        self._last_metrics: dict = {}
        self.optimizer = None
        self.rollbacks = 0
        self.coarse_params: Optional[dict] = None   # parameters at the end of the implicit phase
        self.loss_scale: Optional[float] = None     # zero-motion loss of the first training data
        self.lm_lambda = 1e-3                       # Levenberg-Marquardt damping (fine stage)
        self.start_losses: list = []                # multi-start: (coarse loss of each start)
        self.pose_stage = "finite_difference"        # pose-only fine LM: then "window"
        self._windows: Optional[torch.Tensor] = None   # pose-only LM: [N, W] tuple indices
        self._window_vel: Optional[torch.Tensor] = None   # their latent initial velocities

    # ------------------------------------------------------------------ data
    @property
    def full_steps(self) -> int:
        return int(round(self.config.period / self.robot.dt))

    @property
    def dt(self) -> float:
        return self.config.period / self.n_steps

    @property
    def integrator(self) -> str:
        return self.config.coarse_integrator if self.phase == "coarse" else self.config.fine_integrator

    @property
    def done(self) -> bool:
        return self.phase == "done"

    @property
    def parameters(self) -> PhysicalParameters:
        return self.params

    @property
    def latent(self) -> bool:
        return self.train is not None and self.train.latent is not None

    def set_data(self, train, val=None) -> None:
        """Training and validation data (Trajectory / TupleSet or lists of them). Without
        validation data the training loss drives the schedule."""
        ts = _as_tuples(train, self.config.period, self.robot.dt)
        if ts is None or not len(ts):
            raise ValueError("no training tuples")
        vs = _as_tuples(val, self.config.period, self.robot.dt)
        first = self.engine is None
        self._setup(ts)
        self.train = self._to_data(ts)
        self._windows = None                        # pose-only LM windows: rebuilt for new data
        self.val = self._to_data(vs) if vs is not None else None
        if self.loss_scale is None:
            self.loss_scale = self._zero_motion_loss(self.train) if self.config.normalize_loss else 1.0
        if self.val is not None and self.config.val_tuples and len(self.val) > self.config.val_tuples:
            pick = np.sort(np.random.default_rng(self.config.seed + 1).choice(
                len(vs), self.config.val_tuples, replace=False))
            self.val_index = torch.as_tensor(pick, device=self.device)
        else:
            self.val_index = None if self.val is None else torch.arange(len(self.val), device=self.device)
        if first and self.config.init == "random" and self.config.n_starts > 1 \
                and self.config.schedule != "fine_only":
            self._multi_start()
        self._make_optimizer()

    def _zero_motion_loss(self, data: _Data) -> float:
        """Loss of predicting 'nothing moves' (x_hat = x_t): the data's own motion scale, so
        the normalised loss is the fraction of unexplained motion for any robot."""
        half, free = self._half, self._free
        weight = free / (2.0 * free.sum())
        p0, v0 = node_state(data.x0, half)
        p1, v1 = node_state(data.x1, half)
        per = ((p1 - p0) ** 2).sum(-1).sum(-1)
        if data.latent is None:
            per = per + self.config.w_vel * self.config.period ** 2 * ((v1 - v0) ** 2).sum(-1).sum(-1)
        scale = float((per * weight).sum(-1).mean())
        return scale if math.isfinite(scale) and scale > 1e-30 else 1.0

    @torch.no_grad()
    def _multi_start(self) -> None:
        """Score ``n_starts`` random starts (within bounds) on the first stage's loss over a
        fixed subset of training tuples and keep the best one (cheap: one implicit step of T)."""
        cfg = self.config
        rng = np.random.default_rng(cfg.seed + 7919)
        n = len(self.train)
        idx = torch.as_tensor(np.sort(rng.permutation(n)[:min(n, 64)]), device=self.device)
        best, best_loss = None, math.inf
        self.start_losses = []
        for k in range(cfg.n_starts):
            if k:
                self.params.randomize(rng, self.learn)
            p = self.engine.param_values(self.dtype, self.device)
            loss = float(self.batch_loss(self.train, idx, p))
            self.start_losses.append(loss)
            if math.isfinite(loss) and loss < best_loss:
                best, best_loss = self._snapshot(), loss
        if best is not None:
            self._restore(best)
        self.log(f"multi-start: best of {cfg.n_starts} random starts (loss {best_loss:.3e}, worst "
                 f"{max(self.start_losses):.3e}); start {self._fmt_params()}")

    def add_tuples(self, data) -> None:
        """Append training tuples (streaming); latents of old tuples are kept."""
        ts = _as_tuples(data, self.config.period, self.robot.dt)
        if self.train is None:
            return self.set_data(ts)
        old = self.train
        merged = TupleSet.concat([old.ts, ts])
        self.train = self._to_data(merged)
        self._windows = None
        if old.latent is not None:
            with torch.no_grad():
                self.train.latent[:len(old)] = old.latent
        self._make_optimizer(keep_state=True)

    def _to_data(self, ts: TupleSet) -> _Data:
        if self.engine is not None:
            if (ts.fixed_rods, ts.floor) != (self.engine.fixed_rods, self.engine.floor):
                raise ValueError("data from a different environment (fixed rods / floor) than the "
                                 "trainer was set up with")
            if ts.steps != self.full_steps:
                raise ValueError(f"tuples have {ts.steps} steps, expected {self.full_steps}")
        latent = self.config.latent_velocity
        if latent is None:
            latent = not ts.has_velocity
        if not latent and not ts.has_velocity:
            raise ValueError("the data has no velocities: enable latent_velocity")
        return _Data(ts, self.dtype, self.device, latent)

    def _setup(self, ts: TupleSet) -> None:
        if self.engine is not None:
            return
        cfg = self.config
        self.learn = tuple(cfg.learn) if cfg.learn is not None else default_learnable(ts.floor)
        for name, raw in self.params.named_parameters():
            raw.requires_grad_(name in self.learn)
        if cfg.init == "random":
            self.params.randomize(np.random.default_rng(cfg.seed), self.learn)
        ground_fn = None
        if cfg.collision == "mujoco" and ts.floor:
            from tensegrity_engine.groundtruth.mujoco_twin import MujocoGroundChecker
            ground_fn = MujocoGroundChecker(self.robot, fixed_rods=ts.fixed_rods)
        self.engine = TensegrityEngine(self.robot, self.params, fixed_rods=ts.fixed_rods,
                                       floor=ts.floor, ground_contact_fn=ground_fn).to(self.device)
        f = lambda a: torch.as_tensor(a, dtype=self.dtype, device=self.device)
        free = np.ones(self.robot.num_rods)
        free[list(ts.fixed_rods)] = 0.0
        self._half, self._free = f(self.robot.rod_length / 2.0), f(free)
        self._cmd_low, self._cmd_high = f(self.robot.command_low), f(self.robot.command_high)
        if cfg.schedule == "feedforward":
            self.n_steps = 1
        self.log(f"identifying {', '.join(self.learn)} ({'floor' if ts.floor else 'no floor'}, "
                 f"fixed rods {list(ts.fixed_rods)}); start {self._fmt_params()}")

    def _make_optimizer(self, keep_state: bool = False) -> None:
        old = self.optimizer.state_dict() if (keep_state and self.optimizer is not None) else None
        groups = [{"params": [getattr(self.params, n) for n in self.learn], "lr": self.lr, "name": "params"}]
        if self.train is not None and self.train.latent is not None:
            groups.append({"params": [self.train.latent], "lr": self.lr * self.config.latent_lr_ratio,
                           "name": "latent"})
        self.optimizer = torch.optim.Adam(groups)
        if self.val is not None and self.val.latent is not None:
            self.val_optimizer = torch.optim.Adam([self.val.latent], lr=self.lr * self.config.latent_lr_ratio)
        if old is not None and len(old["param_groups"]) == len(self.optimizer.param_groups):
            # Keep the moments of tensors whose shape is unchanged; drop the rest (the latent
            # velocities grow when tuples are appended: their moments start afresh).
            new = self.optimizer.state_dict()
            params = [q for g in self.optimizer.param_groups for q in g["params"]]
            state = {}
            for i, q in enumerate(params):
                st = old["state"].get(i)
                if st and not any(torch.is_tensor(v) and v.dim() > 0 and v.shape != q.shape
                                  for v in st.values()):
                    state[i] = st
            new["state"] = state
            self.optimizer.load_state_dict(new)

    def _set_lr(self, lr: float) -> None:
        self.lr = lr
        for g in self.optimizer.param_groups:
            g["lr"] = lr * (self.config.latent_lr_ratio if g.get("name") == "latent" else 1.0)
        if getattr(self, "val_optimizer", None) is not None:
            for g in self.val_optimizer.param_groups:
                g["lr"] = lr * self.config.latent_lr_ratio

    # ------------------------------------------------------------------ loss
    def act_starts(self, data: _Data, tau: torch.Tensor) -> torch.Tensor:
        """[N, A] filtered command at every tuple start (exact filter, differentiable in tau)."""
        S = data.cmd_grid.shape[2]
        d = torch.exp(-self.robot.dt / tau)
        j = torch.arange(S, dtype=self.dtype, device=self.device)
        weights = (1.0 - d) * d ** (S - 1 - j)
        grid = torch.maximum(torch.minimum(data.cmd_grid, self._cmd_high), self._cmd_low)
        contrib = torch.einsum("s,tksa->tka", weights, grid)
        dS = d ** S
        a = data.traj_act0
        acts = [a]
        for k in range(data.cmd_grid.shape[1] - 1):
            a = dS * a + contrib[:, k]
            acts.append(a)
        acts = torch.stack(acts, 1)
        return acts[data.traj, data.chunk]

    def batch_loss(self, data: _Data, idx: torch.Tensor, p: dict, n_steps: Optional[int] = None,
                   integrator: Optional[str] = None, latent: Optional[torch.Tensor] = None,
                   acts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Mean recurrent loss of tuples ``idx`` (see the module docstring)."""
        T = self.config.period
        lat = data.latent if latent is None else latent
        if not self._latent_adam:
            lat = None          # pose-only coarse stage: finite-difference velocities in x0/x1
        x0 = data.x0[idx]
        if lat is not None:
            x0 = torch.cat([x0[..., :7], lat[idx]], -1)
        act = (self.act_starts(data, p["actuator_time_constant"]) if acts is None else acts)[idx]
        pred = self._predict_end(data, idx, x0, act, p, n_steps, integrator)
        half, free = self._half, self._free
        weight = free / (2.0 * free.sum())                      # mean over free rods and 2 nodes
        pp, pv = node_state(pred, half)
        tp, tv = node_state(data.x1[idx], half)
        per = ((pp - tp) ** 2).sum(-1).sum(-1)                   # [B, R]
        if lat is None:
            per = per + self.config.w_vel * T * T * ((pv - tv) ** 2).sum(-1).sum(-1)
        else:
            nxt = data.next[idx]
            has = (nxt >= 0).to(self.dtype)[:, None]
            nv = torch.cat([data.x1[idx][..., :7], lat[nxt.clamp(min=0)]], -1)
            _, nv = node_state(nv, half)
            per = per + has * self.config.w_vel * T * T * ((pv - nv) ** 2).sum(-1).sum(-1)
        loss = (per * weight).sum(-1).mean()
        return loss / self.loss_scale if self.loss_scale else loss

    def _predict_end(self, data: _Data, idx: torch.Tensor, x0: torch.Tensor, act: torch.Tensor, p: dict,
                     n_steps: Optional[int], integrator: Optional[str]) -> torch.Tensor:
        """Engine state after T from x0 under the tuples' commands (and known wrenches),
        averaged onto n_steps engine steps: the prediction both losses compare with X_t+T."""
        n_steps = self.n_steps if n_steps is None else n_steps
        integrator = self.integrator if integrator is None else integrator
        cmd, wr = data.commands[idx], None if data.wrenches is None else data.wrenches[idx]
        if n_steps != cmd.shape[1]:
            M = averaging_matrix(cmd.shape[1], n_steps, self.dtype, self.device)
            cmd = torch.einsum("cs,bsa->bca", M, cmd)
            wr = None if wr is None else torch.einsum("cs,bsrk->bcrk", M, wr)
        pred, _ = self.engine.rollout(x0, act, cmd, self.config.period / n_steps, integrator=integrator,
                                      wrenches=wr, record_every=n_steps, params=p)
        return pred[:, -1]

    def residuals(self, data: _Data, idx: torch.Tensor, p: dict, n_steps: Optional[int] = None,
                  integrator: Optional[str] = None) -> torch.Tensor:
        """Flat residual vector r with sum(r^2) == batch_loss (velocity data only)."""
        T = self.config.period
        act = self.act_starts(data, p["actuator_time_constant"])[idx]
        pred = self._predict_end(data, idx, data.x0[idx], act, p, n_steps, integrator)
        pp, pv = node_state(pred, self._half)
        tp, tv = node_state(data.x1[idx], self._half)
        w = (self._free / (2.0 * self._free.sum() * len(idx) * (self.loss_scale or 1.0))).sqrt()
        w = w[None, :, None, None]
        r = torch.cat([(pp - tp) * w, (pv - tv) * (w * T * math.sqrt(self.config.w_vel))], -1)
        return r.reshape(-1)

    # ------------------------------------------------------------------ epochs
    def _snapshot(self):
        snap = {n: getattr(self.params, n).detach().clone() for n in self.learn}
        if self.latent:
            snap["__latent"] = self.train.latent.detach().clone()
        if self._windows is not None:
            snap["__window_vel"] = self._window_vel.clone()
        return snap

    @torch.no_grad()
    def _restore(self, snap) -> None:
        for n in self.learn:
            getattr(self.params, n).copy_(snap[n])
        if "__latent" in snap and self.latent and snap["__latent"].shape == self.train.latent.shape:
            self.train.latent.copy_(snap["__latent"])
        if "__window_vel" in snap and self._windows is not None \
                and snap["__window_vel"].shape == self._window_vel.shape:
            self._window_vel = snap["__window_vel"].clone()

    def _healthy(self) -> bool:
        for n in self.learn:
            raw = getattr(self.params, n)
            if not torch.isfinite(raw).all() or raw.abs().max() > self.config.max_raw:
                return False
        return not self.latent or bool(torch.isfinite(self.train.latent).all())

    def validate(self) -> float:
        """Validation loss (training loss if there is no validation data)."""
        data, idx = (self.val, self.val_index) if self.val is not None else (self.train, None)
        if idx is None:
            idx = torch.arange(len(data), device=self.device)
        p = {k: v.detach() for k, v in self.engine.param_values(self.dtype, self.device).items()}
        acts = self.act_starts(data, p["actuator_time_constant"])
        total, count = 0.0, 0
        bs = self.config.batch_size
        for b in range(0, len(idx), bs):
            sub = idx[b:b + bs]
            if data.latent is not None and self._latent_adam:
                # Pose-only validation: one latent-velocity step with the parameters frozen.
                opt = self.val_optimizer if data is self.val else None
                loss = self.batch_loss(data, sub, p, acts=acts)
                if opt is not None and torch.isfinite(loss):
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                loss = loss.detach()
            else:
                with torch.no_grad():
                    loss = self.batch_loss(data, sub, p, acts=acts)
            total += float(loss) * len(sub)
            count += len(sub)
        return total / max(count, 1)

    def train_epoch(self) -> dict:
        """One epoch of the current stage, then Algorithm 1's stage update. Returns metrics."""
        if self.train is None:
            raise RuntimeError("call set_data() or add_tuples() first")
        if self.done:
            return dict(self._last_metrics)
        cfg = self.config
        if self._use_lm:
            return self._lm_epoch()
        start = time.perf_counter()
        n = len(self.train)
        count = cfg.epoch_tuples or n
        if self.phase == "coarse" and cfg.coarse_work:
            # An implicit step costs about the same for any batch: bound the work per epoch.
            count = min(count, max(1, cfg.coarse_work // self.n_steps) * cfg.batch_size)
        order = self.rng.permutation(n)[:count]
        losses, diverged, used = [], False, 0
        for b in range(0, len(order), cfg.batch_size):
            idx = torch.as_tensor(order[b:b + cfg.batch_size], device=self.device)
            good = self._snapshot()
            p = self.engine.param_values(self.dtype, self.device)
            loss = self.batch_loss(self.train, idx, p)
            if not torch.isfinite(loss):
                diverged = True
                break
            self.optimizer.zero_grad()
            loss.backward()
            grads = [q.grad for g in self.optimizer.param_groups for q in g["params"] if q.grad is not None]
            if not all(torch.isfinite(g).all() for g in grads):
                diverged = True
                break
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], cfg.grad_clip)
            self.optimizer.step()
            if not self._healthy():
                self._restore(good)
                diverged = True
                break
            losses.append(float(loss.detach()))
            used += len(idx)
        if diverged:
            self._restore(good)
            self.rollbacks += 1
            self._make_optimizer()    # Adam moments may carry the blow-up
            self.log(f"epoch {self.epoch}: diverged at {self.integrator} dt {self.dt * 1e3:g} ms, "
                     f"lr {self.lr:g}: restored the last good parameters")
        val = self.validate() if not diverged else math.inf
        if not math.isfinite(val) and not diverged:
            diverged = True
            self._restore(good)
            self.rollbacks += 1
        seconds = time.perf_counter() - start
        self.elapsed += seconds
        metrics = {"epoch": self.epoch, "loss": float(np.mean(losses)) if losses else math.nan,
                   "val_loss": val, "stage": self.phase, "integrator": self.integrator,
                   "dt": self.dt, "lr": self.lr, "tuples": used, "seconds": seconds,
                   "diverged": diverged, "params": self.params.as_dict()}
        self.history.append(metrics)
        self.epoch += 1
        self._schedule(val)
        metrics["next_stage"] = self.phase
        self._last_metrics = metrics
        return dict(metrics)

    def _schedule(self, val: float) -> None:
        cfg = self.config
        self.stage_epochs += 1
        if val < self.best_val * (1.0 - cfg.min_rel_improvement):
            self.best_val = val
            self.bad_epochs = 0
            self._best_snapshot = self._snapshot()
        else:
            self.bad_epochs += 1
        out_of_time = cfg.max_seconds is not None and self.elapsed >= cfg.max_seconds
        coarse_out = (cfg.max_seconds is not None and self.phase == "coarse" and cfg.schedule == "progressive"
                      and self.elapsed >= cfg.coarse_time_fraction * cfg.max_seconds)
        if coarse_out and not out_of_time and self.epoch < cfg.max_epochs:
            # Keep time for the fine stage: leave the implicit phase early.
            if self._best_snapshot is not None:
                self._restore(self._best_snapshot)
            before = self._stage_name()
            self._enter_fine()
            self.best_val, self._best_snapshot, self.bad_epochs, self.stage_epochs = math.inf, None, 0, 0
            self._log_stage(before + " (coarse time budget spent)", val)
            return
        if self.epoch >= cfg.max_epochs or out_of_time:
            self._finish("epoch/time limit reached")
            return
        patience = cfg.lm_patience if self._use_lm else cfg.patience
        stalled = self.bad_epochs >= patience or (
            cfg.max_stage_epochs is not None and not self._use_lm and self.stage_epochs >= cfg.max_stage_epochs)
        if not stalled:
            return
        if self._best_snapshot is not None:
            self._restore(self._best_snapshot)
        before = self._stage_name()
        reset_best = False
        if self.phase == "coarse" and cfg.schedule != "feedforward" and self.n_steps < self.full_steps:
            self.n_steps = min(2 * self.n_steps, self.full_steps)   # dt = max(dt / 2, dt_r)
            reset_best = True
        elif self.phase == "fine" and self._use_lm:
            self._lm_finish("Levenberg-Marquardt converged")
            return
        elif self.lr / 2.0 >= self._lr_floor:
            self._set_lr(self.lr / 2.0)
        elif self.phase == "coarse" and cfg.schedule == "progressive":
            # What implicit-only training would have returned (ablation b, for free).
            self._enter_fine()
            reset_best = True
        else:
            self._finish("lr below lr_min")
            return
        if reset_best:
            self.best_val = math.inf
            self._best_snapshot = None
        self.bad_epochs = 0
        self.stage_epochs = 0
        self._log_stage(before, val)

    def _enter_fine(self) -> None:
        # What implicit-only training would have returned (ablation b, for free).
        self.coarse_params = self.params.as_dict()
        self.phase = "fine"
        self.n_steps = self.full_steps
        self.lr = self.config.lr0
        self._make_optimizer()

    @property
    def _lr_floor(self) -> float:
        cfg = self.config
        if self.phase == "coarse" and cfg.schedule == "progressive":
            return cfg.coarse_lr_min if cfg.coarse_lr_min is not None else cfg.lr0 / 4.0
        return cfg.lr_min

    @property
    def _use_lm(self) -> bool:
        return self.phase == "fine" and self.config.fine_optimizer == "lm"

    @property
    def _latent_adam(self) -> bool:
        """Per-tuple latent velocities trained by Adam (pose-only, fine_optimizer="adam")."""
        return self.phase == "fine" and self.config.fine_optimizer == "adam"

    def _stage_name(self) -> str:
        if self._use_lm:
            what = ""
            if self.latent:
                what = (" (windows, latent velocities)" if self.pose_stage == "window"
                        else " (finite-difference velocities)")
            return f"{self.phase} {self.integrator} dt={self.dt * 1e3:g}ms Levenberg-Marquardt{what}"
        return f"{self.phase} {self.integrator} dt={self.dt * 1e3:g}ms lr={self.lr:g}"

    # ------------------------------------------------------------------ Levenberg-Marquardt
    def _raw_vector(self) -> torch.Tensor:
        return torch.cat([getattr(self.params, n).detach().reshape(-1) for n in self.learn]).clone()

    @torch.no_grad()
    def _set_raw_vector(self, theta: torch.Tensor) -> None:
        i = 0
        for n in self.learn:
            raw = getattr(self.params, n)
            raw.copy_(theta[i:i + raw.numel()].reshape(raw.shape))
            i += raw.numel()

    @torch.no_grad()
    def _lm_residual(self, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        self._set_raw_vector(theta)
        p = self.engine.param_values(self.dtype, self.device)
        return self.residuals(self.train, idx, p)

    def _lm_epoch(self) -> dict:
        """One Levenberg-Marquardt iteration in raw space on ``lm_tuples`` random training
        tuples (few parameters, exact model: Gauss-Newton converges quadratically near the
        optimum). Jacobian by central differences (2P no-grad rollouts)."""
        if self.latent and self.pose_stage == "window":
            return self._lm_window_epoch()
        cfg = self.config
        start = time.perf_counter()
        n = len(self.train)
        idx = torch.as_tensor(np.sort(self.rng.permutation(n)[:min(n, cfg.lm_tuples)]), device=self.device)
        theta0 = self._raw_vector()
        r0 = self._lm_residual(theta0, idx)
        f0 = float((r0 ** 2).sum())
        diverged, accepted, f, step = False, False, f0, math.inf
        if not math.isfinite(f0):
            diverged = True
        else:
            eps = 1e-5
            cols = []
            for j in range(len(theta0)):
                e = torch.zeros_like(theta0)
                e[j] = eps
                cols.append((self._lm_residual(theta0 + e, idx) - self._lm_residual(theta0 - e, idx)) / (2 * eps))
            J = torch.stack(cols, -1)
            ok = bool(torch.isfinite(J).all())
            g, H = J.T @ r0, J.T @ J
            d = H.diagonal().clamp(min=1e-12 * float(H.diagonal().max().clamp(min=1e-300)))
            for _ in range(10 if ok else 0):
                A = H + self.lm_lambda * torch.diag(d)
                try:
                    delta = -torch.linalg.solve(A, g)
                except RuntimeError:
                    delta = torch.full_like(g, math.nan)
                big = float(delta.abs().max()) if bool(torch.isfinite(delta).all()) else math.inf
                if big > 2.0:                          # trust region in raw (logit) space
                    delta = delta * (2.0 / big) if math.isfinite(big) else delta
                theta = theta0 + delta
                if bool(torch.isfinite(theta).all()) and float(theta.abs().max()) <= cfg.max_raw:
                    f = float((self._lm_residual(theta, idx) ** 2).sum())
                    if math.isfinite(f) and f < f0:
                        accepted = True
                        step = float(delta.abs().max())
                        self.lm_lambda = max(self.lm_lambda / 3.0, 1e-12)
                        break
                self.lm_lambda = min(self.lm_lambda * 4.0, 1e12)
            if not accepted:
                f = f0
                self._set_raw_vector(theta0)
        val = self.validate()
        if not math.isfinite(val):
            self._set_raw_vector(theta0)
            diverged = True
            self.rollbacks += 1
            val = math.inf
        seconds = time.perf_counter() - start
        self.elapsed += seconds
        return self._end_lm_epoch(f, val, len(idx), seconds, diverged, accepted, step)

    def _end_lm_epoch(self, f, val, count, seconds, diverged, accepted, step) -> dict:
        """Record one Levenberg-Marquardt iteration, then the schedule and LM's own stops."""
        cfg = self.config
        metrics = {"epoch": self.epoch, "loss": f, "val_loss": val, "stage": self.phase,
                   "integrator": self.integrator, "dt": self.dt, "lr": self.lr, "tuples": count,
                   "seconds": seconds, "diverged": diverged, "params": self.params.as_dict(),
                   "lm_lambda": self.lm_lambda, "lm_accepted": accepted}
        self.history.append(metrics)
        self.epoch += 1
        stage = (self.phase, self.pose_stage)
        self._schedule(val)
        if (self.phase, self.pose_stage) != stage:      # the schedule already moved on
            pass
        elif self.phase == "fine" and self.stage_epochs >= cfg.lm_max_iters:
            self._lm_finish("Levenberg-Marquardt iteration limit")
        elif self.phase == "fine" and val <= cfg.lm_tol:
            self._lm_finish("Levenberg-Marquardt reached round-off")
        elif self.phase == "fine" and step < cfg.lm_step_tol:
            self._lm_finish("Levenberg-Marquardt step below lm_step_tol")
        metrics["next_stage"] = self.phase
        self._last_metrics = metrics
        return dict(metrics)

    # ------------------------------------------------------------------ pose-only LM
    def _lm_finish(self, why: str) -> None:
        """End of a Levenberg-Marquardt stage. Pose-only data: the tuple LM on
        finite-difference velocities is followed by the windowed latent-velocity LM."""
        if not (self.latent and self.pose_stage == "finite_difference"):
            return self._finish(why)
        if self._best_snapshot is not None:
            self._restore(self._best_snapshot)
        before = self._stage_name() + f" ({why})"
        self.pose_stage = "window"
        self.lm_lambda = 1e-3
        self.best_val, self._best_snapshot, self.bad_epochs, self.stage_epochs = math.inf, None, 0, 0
        self._log_stage(before, self.history[-1]["val_loss"] if self.history else math.nan)

    def _window_setup(self) -> None:
        """Fixed random subset of multiple-shooting windows (chains of ``pose_window``
        consecutive tuples, shorter if the data has no chain that long) and their latent
        initial velocities, initialised by the finite-difference estimates."""
        cfg = self.config
        nxt = self.train.ts.next
        chains = {}
        for i in range(len(nxt)):
            c = [i]
            while len(c) < cfg.pose_window and nxt[c[-1]] >= 0:
                c.append(int(nxt[c[-1]]))
            chains.setdefault(len(c), []).append(c)
        width = max(chains)
        if width < 2:
            raise ValueError("pose-only identification needs consecutive tuples (chains of at "
                             "least 2 sample intervals); the data has only isolated tuples")
        if width < cfg.pose_window:
            self.log(f"pose-only: no chain of {cfg.pose_window} tuples, using windows of {width}")
        pool = np.array(chains[width])
        pick = np.sort(self.rng.permutation(len(pool))[:cfg.lm_windows])
        self._windows = torch.as_tensor(pool[pick], device=self.device)
        self._window_vel = self.train.x0[self._windows[:, 0]][..., 7:].detach().clone()
        free = np.flatnonzero(self._free.cpu().numpy() > 0)
        self._latent_cols = torch.as_tensor([r * 6 + j for r in free for j in range(6)], device=self.device)
        self.log(f"pose-only Levenberg-Marquardt: {len(pick)} windows of {width} x "
                 f"{self.config.period * 1e3:g} ms, {len(self._latent_cols)} latent velocities each")

    @torch.no_grad()
    def _window_residual(self, theta: torch.Tensor, windows: torch.Tensor, vel: torch.Tensor) -> torch.Tensor:
        """[N, M] weighted end-node position errors at every sample of each window, from the
        window's first pose and latent velocity ``vel`` [N, R, 6]; sum(r^2) is the normalised
        position loss averaged over windows and samples."""
        self._set_raw_vector(theta)
        p = self.engine.param_values(self.dtype, self.device)
        data, S = self.train, self.train.commands.shape[1]
        first = windows[:, 0]
        x0 = torch.cat([data.x0[first][..., :7], vel], -1)
        act = self.act_starts(data, p["actuator_time_constant"])[first]
        cmd = data.commands[windows].flatten(1, 2)
        wr = None if data.wrenches is None else data.wrenches[windows].flatten(1, 2)
        pred, _ = self.engine.rollout(x0, act, cmd, self.robot.dt, integrator=self.config.fine_integrator,
                                      wrenches=wr, record_every=S, params=p)
        pos, _ = node_state(pred, self._half)                          # [N, W, R, 2, 3]
        target, _ = node_state(data.x1[windows], self._half)
        w = self._free / (2.0 * self._free.sum() * windows.shape[0] * windows.shape[1]
                          * (self.loss_scale or 1.0))
        return ((pos - target) * w.sqrt()[:, None, None]).flatten(1)

    @torch.no_grad()
    def _window_jacobians(self, theta, windows, vel, r0):
        """Central-difference Jacobians: A [N, M, P] w.r.t. raw parameters, B [N, M, L] w.r.t.
        each window's own latents (latent j of every window perturbed in one batched run)."""
        eps = 1e-5
        cols = []
        for j in range(len(theta)):
            e = torch.zeros_like(theta)
            e[j] = eps
            cols.append((self._window_residual(theta + e, windows, vel)
                         - self._window_residual(theta - e, windows, vel)) / (2 * eps))
        A = torch.stack(cols, -1)
        N, R = vel.shape[0], vel.shape[1]
        L = len(self._latent_cols)
        pert = torch.zeros(2 * L, R * 6, dtype=vel.dtype, device=vel.device)
        pert[torch.arange(L), self._latent_cols] = eps
        pert[torch.arange(L) + L, self._latent_cols] = -eps
        chunk = max(1, 4096 // (2 * L))           # bounded rollout batch (memory)
        blocks = []
        for a in range(0, N, chunk):
            v = (vel[a:a + chunk, None] + pert.reshape(2 * L, R, 6)).flatten(0, 1)
            w = windows[a:a + chunk].repeat_interleave(2 * L, 0)
            rb = self._window_residual(theta, w, v).reshape(-1, 2, L, r0.shape[-1])
            # the residual weight scales with 1 / (number of windows): undo the chunk's count
            rb = rb * math.sqrt(len(w) / N)
            blocks.append(((rb[:, 0] - rb[:, 1]) / (2 * eps)).transpose(1, 2))
        self._set_raw_vector(theta)
        return A, torch.cat(blocks)

    def _lm_window_epoch(self) -> dict:
        """One joint Levenberg-Marquardt iteration on the parameters and the windows' latent
        velocities; the latent blocks are eliminated per window (Schur complement)."""
        cfg = self.config
        start = time.perf_counter()
        if self._windows is None:
            self._window_setup()
        windows, vel = self._windows, self._window_vel
        theta0 = self._raw_vector()
        r0 = self._window_residual(theta0, windows, vel)
        f0 = float((r0 ** 2).sum())
        diverged, accepted, f, step = not math.isfinite(f0), False, f0, math.inf
        if not diverged:
            A, B = self._window_jacobians(theta0, windows, vel, r0)
            ok = bool(torch.isfinite(A).all() and torch.isfinite(B).all())
            At, Bt = A.transpose(1, 2), B.transpose(1, 2)
            AtA, AtB, BtB = At @ A, At @ B, Bt @ B
            Atr, Btr = (At @ r0[..., None])[..., 0], Bt @ r0[..., None]
            dA = AtA.sum(0).diagonal()
            dA = torch.maximum(dA, 1e-12 * dA.max())
            # Spin about a rod axis moves no node: floor the latent curvature per window.
            dB = BtB.diagonal(dim1=1, dim2=2)
            dB = torch.maximum(dB, 1e-6 * dB.amax(-1, keepdim=True))
            BtB = BtB + 1e-9 * torch.diag_embed(dB)
            for _ in range(10 if ok else 0):
                try:
                    Binv = torch.linalg.inv(BtB + self.lm_lambda * torch.diag_embed(dB))
                    schur = (AtA - AtB @ Binv @ AtB.transpose(1, 2)).sum(0) + self.lm_lambda * torch.diag(dA)
                    g = Atr.sum(0) - (AtB @ Binv @ Btr)[..., 0].sum(0)
                    delta = -torch.linalg.solve(schur, g)
                except RuntimeError:
                    delta = torch.full_like(theta0, math.nan)
                big = float(delta.abs().max()) if bool(torch.isfinite(delta).all()) else math.inf
                if math.isfinite(big):
                    if big > 2.0:                      # trust region in raw (logit) space
                        delta = delta * (2.0 / big)
                    d_lat = -(Binv @ (Btr + AtB.transpose(1, 2) @ delta[None, :, None]))[..., 0]
                    vel_new = vel.flatten(1).clone()
                    vel_new[:, self._latent_cols] += d_lat
                    vel_new = vel_new.reshape(vel.shape)
                    theta = theta0 + delta
                    if float(theta.abs().max()) <= cfg.max_raw:
                        f = float((self._window_residual(theta, windows, vel_new) ** 2).sum())
                        if math.isfinite(f) and f < f0:
                            accepted = True
                            step = float(delta.abs().max())
                            self._window_vel = vel_new
                            self.lm_lambda = max(self.lm_lambda / 3.0, 1e-12)
                            break
                self.lm_lambda = min(self.lm_lambda * 4.0, 1e12)
            if not accepted:
                f = f0
                self._set_raw_vector(theta0)
        seconds = time.perf_counter() - start
        self.elapsed += seconds
        val = f if math.isfinite(f) else math.inf
        return self._end_lm_epoch(f, val, len(windows), seconds, diverged, accepted, step)

    def _log_stage(self, before: str, val: float) -> None:
        entry = {"epoch": self.epoch, "from": before, "to": self._stage_name(), "val_loss": val}
        self.stage_log.append(entry)
        self.log(f"epoch {self.epoch}: stage {before} -> {entry['to']} (val {val:.3e}); "
                 f"{self._fmt_params()}")

    def _finish(self, why: str) -> None:
        if self._best_snapshot is not None:
            self._restore(self._best_snapshot)
        before = self._stage_name()
        self.phase = "done"
        self.stage_log.append({"epoch": self.epoch, "from": before, "to": "done", "why": why})
        self.log(f"epoch {self.epoch}: done ({why}); {self._fmt_params()}")

    def _fmt_params(self) -> str:
        vals = self.params.as_dict()
        names = self.learn or tuple(vals)
        return ", ".join(f"{n}={np.mean(vals[n]):.5g}" for n in names)

    def run(self, progress: bool = False, callback: Optional[Callable[[dict], None]] = None) -> list[dict]:
        """Train until done; optional tqdm bar and per-epoch callback."""
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(desc="identify", unit="epoch")
        try:
            while not self.done:
                m = self.train_epoch()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"{m['integrator'][:4]} dt={m['dt'] * 1e3:g}ms lr={m['lr']:.2g} "
                                        f"val={m['val_loss']:.2e}")
                if callback is not None:
                    callback(m)
        finally:
            if bar is not None:
                bar.close()
        return self.history

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        return {
            "config": dataclasses.asdict(self.config), "params": copy.deepcopy(self.params.state_dict()),
            "learn": self.learn, "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "phase": self.phase, "n_steps": self.n_steps, "lr": self.lr, "best_val": self.best_val,
            "bad_epochs": self.bad_epochs, "stage_epochs": self.stage_epochs, "epoch": self.epoch,
            "elapsed": self.elapsed, "history": self.history, "stage_log": self.stage_log,
            "best_snapshot": self._best_snapshot, "rng": self.rng.bit_generator.state,
            "latent": None if not self.latent else self.train.latent.detach().clone(),
            "val_latent": None if self.val is None or self.val.latent is None else self.val.latent.detach().clone(),
            "rollbacks": self.rollbacks, "coarse_params": self.coarse_params,
            "loss_scale": self.loss_scale, "lm_lambda": self.lm_lambda,
            "windows": self._windows, "window_vel": self._window_vel, "pose_stage": self.pose_stage,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Resume (call after `set_data` with the same data)."""
        if self.engine is None:
            raise RuntimeError("call set_data() before load_state_dict()")
        with torch.no_grad():
            self.params.load_state_dict(sd["params"])
        self.learn = tuple(sd["learn"])
        for name, raw in self.params.named_parameters():
            raw.requires_grad_(name in self.learn)
        for key in ("phase", "n_steps", "lr", "best_val", "bad_epochs", "stage_epochs", "epoch",
                    "elapsed", "history", "stage_log", "rollbacks", "coarse_params"):
            setattr(self, key, sd[key])
        self._best_snapshot = sd["best_snapshot"]
        self.loss_scale = sd.get("loss_scale", self.loss_scale)
        self.lm_lambda = sd.get("lm_lambda", self.lm_lambda)
        self.pose_stage = sd.get("pose_stage", self.pose_stage)
        if sd.get("windows") is not None and self.latent and int(sd["windows"].max()) < len(self.train):
            self._windows, self._window_vel = sd["windows"].to(self.device), sd["window_vel"].to(self.device)
        self.rng.bit_generator.state = sd["rng"]
        with torch.no_grad():
            if sd["latent"] is not None and self.latent and sd["latent"].shape == self.train.latent.shape:
                self.train.latent.copy_(sd["latent"])
            if sd["val_latent"] is not None and self.val is not None and self.val.latent is not None:
                self.val.latent.copy_(sd["val_latent"])
        self._make_optimizer()
        if sd["optimizer"] is not None:
            self.optimizer.load_state_dict(sd["optimizer"])

    def save_checkpoint(self, path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(path) + ".tmp")
        torch.save(self.state_dict(), tmp)
        tmp.replace(path)

    def load_checkpoint(self, path) -> None:
        self.load_state_dict(torch.load(path, map_location=self.device, weights_only=False))


# --------------------------------------------------------------------------- evaluation
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


def export_yaml(params: PhysicalParameters, path, comment: str = "") -> Path:
    """Write the identified parameters as a complete robot config (loadable by load_robot)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = "# Identified by tensegrity_engine.identification.trainer\n"
    if comment:
        head += "".join(f"# {line}\n" for line in comment.splitlines())
    path.write_text(head + robot_to_yaml(params.to_robot_config()))
    return path


def parameter_errors(params: PhysicalParameters, reference: RobotConfig, names: Sequence[str]) -> dict:
    """Relative error of identified values against a reference config, per name."""
    ref = PhysicalParameters(reference).as_dict()
    got = params.as_dict()
    out = {}
    for n in names:
        r = np.broadcast_to(np.asarray(ref[n]), np.shape(got[n])) if len(got[n]) > 1 else np.mean(ref[n])
        out[n] = float(np.max(np.abs(np.asarray(got[n]) - r) / np.maximum(np.abs(r), 1e-12)))
    return out
