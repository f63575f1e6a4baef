"""Recurrent progressive identification from sparse (10 Hz) data (paper III-A, III-C, Alg. 1).

Public API (the ROS identifier node uses exactly this)::

    trainer = ProgressiveTrainer(robot, IdentificationConfig(...), device="cpu", dtype=torch.float64,
                                 initial=None)          # initial: PhysicalParameters / dict of values
    trainer.set_data(train, val)       # lists of Trajectory or TupleSet (see dataset.py)
    trainer.add_tuples(tuples)         # streaming: append training tuples (TupleSet / Trajectory)
    trainer.extend_data(tuples)        # streaming: the old tuples first, then new ones (one record)
    while not trainer.done:
        m = trainer.train_epoch()      # {'loss','val_loss','stage','integrator','dt','lr','epoch',
                                       #  'tuples','seconds','diverged', ...}
    trainer.parameters                 # PhysicalParameters (bounded, identified)
    trainer.state_dict() / trainer.load_state_dict(sd)   # resumable (call after set_data)
    evaluate(trainer.parameters, test_trajs, ...)         # CoM error vs time (evaluation.py)
    export_yaml(trainer.parameters, path)                 # loadable robot config

Where each part lives: the loss and residuals in `objective`, the stage decisions of
Algorithm 1 in `schedule`, each solver's epoch in `solvers` (Adam BPTT, tuple
Levenberg-Marquardt, pose-only windowed multiple shooting), random starts in `multistart`.
The trainer owns the run's data, parameters and history and hands each epoch to the solver
the schedule selects.

Velocity data: coarse implicit stages with Adam, then the semi-implicit fine stage with
Levenberg-Marquardt. Pose-only data (mocap): the coarse stages and a first LM stage use
central finite-difference velocities of the poses (biased, but in the basin of the exact
fit: measured on SUPERball K 16.7k, c 1.8k, m 15.8 with K/m and c/m within 15 % of the
truth), then windowed multiple shooting with latent velocities removes the bias.
``fine_optimizer="adam"`` keeps the previous formulation (per-tuple latent velocities
trained with Adam); it does not converge from random starts.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional

import numpy as np
import torch

from tensegrity_engine.identification import checkpoint
from tensegrity_engine.identification.acceptance import heldout_scores
from tensegrity_engine.identification.bounds import bound_for_stability
from tensegrity_engine.identification.config import IdentificationConfig, resolve_learn
from tensegrity_engine.identification.data import TrainingData, as_tuple_set
from tensegrity_engine.identification.dataset import TupleSet
from tensegrity_engine.identification.multistart import multi_start
from tensegrity_engine.identification.objective import RecurrentObjective, validation_loss
from tensegrity_engine.identification.scale import scale_search, speed_limit_search
from tensegrity_engine.identification.schedule import ProgressiveSchedule
from tensegrity_engine.identification.trainer_state import load_trainer_state, trainer_state
from tensegrity_engine.identification.solvers import (AdamSolver, TupleLevenbergMarquardt,
                                                      WindowLevenbergMarquardt)
from tensegrity_engine.identification.solvers.levenberg_marquardt import LM_FREE_LAMBDA
from tensegrity_engine.physics.config import MODEL_INTEGRATORS, RobotConfig
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters


def model_structure(robot: RobotConfig, config: IdentificationConfig) -> tuple[RobotConfig, IdentificationConfig]:
    """The fine stage fits a model stepped with ``fine_integrator``, the model's structure:
    None means the robot's own; a model integrator other than the robot's is the model's."""
    if config.fine_integrator is None:
        return robot, dataclasses.replace(config, fine_integrator=robot.integrator)
    if config.fine_integrator in MODEL_INTEGRATORS and config.fine_integrator != robot.integrator:
        return robot.replace(integrator=config.fine_integrator), config
    return robot, config


class ProgressiveTrainer:
    """Algorithm 1 on tuples, one `train_epoch` at a time (see the module docstring)."""

    def __init__(self, robot: RobotConfig, config: Optional[IdentificationConfig] = None, *,
                 device="cpu", dtype: torch.dtype = torch.float64, initial=None,
                 log: Optional[Callable[[str], None]] = None):
        self.robot, self.config = model_structure(robot, config or IdentificationConfig())
        self.device = torch.device(device)
        self.dtype = dtype
        self.log = log or (lambda msg: None)
        values = initial.as_dict() if isinstance(initial, PhysicalParameters) else initial
        self.params = PhysicalParameters(self.robot, values, per_element=self.config.per_element,
                                         bounds=self.config.bounds)
        self.engine: Optional[TensegrityEngine] = None
        self.objective: Optional[RecurrentObjective] = None
        self.train: Optional[TrainingData] = None
        self.val: Optional[TrainingData] = None
        self.val_index: Optional[torch.Tensor] = None
        self.learn: Optional[tuple] = None
        self.rng = np.random.default_rng(self.config.seed)
        self.history: list[dict] = []
        self.epoch = 0
        self.elapsed = 0.0
        self.rollbacks = 0
        self.coarse_params: Optional[dict] = None   # parameters at the end of the implicit phase
        self.start_losses: list = []                # multi-start: coarse loss of each start
        self.schedule = ProgressiveSchedule(self.config, self.full_steps, self)
        self.adam = AdamSolver(self.config)
        self.tuple_lm = TupleLevenbergMarquardt(self.config)
        self.window_lm = WindowLevenbergMarquardt(self.config)
        self.sigma_scratch = None                  # the uncertainty's scratch windows
        self._last_metrics: dict = {}

    # ------------------------------------------------------------------ state of the run
    @property
    def full_steps(self) -> int:
        return int(round(self.config.period / self.robot.dt))

    phase = property(lambda self: self.schedule.phase)
    n_steps = property(lambda self: self.schedule.n_steps)
    lr = property(lambda self: self.schedule.lr)
    dt = property(lambda self: self.schedule.dt)
    integrator = property(lambda self: self.schedule.integrator)
    done = property(lambda self: self.schedule.done)
    pose_stage = property(lambda self: self.schedule.pose_stage)
    stage_log = property(lambda self: self.schedule.stage_log)
    loss_scale = property(lambda self: self.objective.loss_scale if self.objective else None)

    @property
    def parameters(self) -> PhysicalParameters:
        return self.params

    @property
    def latent(self) -> bool:
        return self.train is not None and self.train.latent is not None

    # ------------------------------------------------------------------ data
    def set_data(self, train, val=None) -> None:
        """Training and validation data (Trajectory / TupleSet or lists of them). Without
        validation data the training loss drives the schedule."""
        ts = as_tuple_set(train, self.config.period, self.robot.dt)
        if ts is None or not len(ts):
            raise ValueError("no training tuples")
        vs = as_tuple_set(val, self.config.period, self.robot.dt)
        first = self.engine is None
        self._setup(ts)
        self.train = self._to_data(ts)
        self.window_lm.reset()
        if not first and not self.schedule.done:
            # another problem (an online window that slid): the stage's best and patience were the
            # old data's; kept, the stage would end on them and restore the values from before
            self.schedule.restart(self.epoch, "new training data")
        self.val = self._to_data(vs) if vs is not None else None
        if self.objective.loss_scale is None:
            self.objective.loss_scale = (self.objective.zero_motion_loss(self.train)
                                         if self.config.normalize_loss else 1.0)
        if self.val is not None and self.config.val_tuples and len(self.val) > self.config.val_tuples:
            pick = np.sort(np.random.default_rng(self.config.seed + 1).choice(
                len(vs), self.config.val_tuples, replace=False))
            self.val_index = torch.as_tensor(pick, device=self.device)
        else:
            self.val_index = None if self.val is None else torch.arange(len(self.val), device=self.device)
        if first and ts.floor and self.robot.contact.law == "soft":      # with the data: the stage change reads it
            self.schedule.skip_coarse("the soft contact law's ground needs the fine step")
        if first and self.config.init in ("random", "given+random") and self.config.n_starts > 1 \
                and self.config.schedule != "fine_only":     # "online" from random: the multi-start too
            multi_start(self)
            scale_search(self)
        if first:
            speed_limit_search(self)
        self.adam.rebuild(self)

    def add_tuples(self, data) -> None:
        """Append training tuples (their own trajectories); latents of old tuples are kept."""
        ts = as_tuple_set(data, self.config.period, self.robot.dt)
        if self.train is None:
            return self.set_data(ts)
        self.extend_data(TupleSet.concat([self.train.ts, ts]))

    def extend_data(self, data) -> None:
        """The training data grown (streaming): ``data`` begins with the tuples trained so far,
        in their order (a stream converted anew with what arrived since, its records and
        trajectories as they now run); their latents and the optimiser's state are kept.
        Anything else is new data (`set_data`)."""
        ts = as_tuple_set(data, self.config.period, self.robot.dt)
        old = self.train
        if old is None or len(ts) < len(old) or not (
                np.array_equal(ts.x0[:len(old)], old.ts.x0) and np.array_equal(ts.x1[:len(old)], old.ts.x1)):
            if old is not None:
                self.log("new training data does not extend the old: latents start afresh")
            return self.set_data(ts)
        self.train = self._to_data(ts)
        self.window_lm.grow()
        if old.latent is not None:
            with torch.no_grad():
                self.train.latent[:len(old)] = old.latent
        self.adam.rebuild(self, keep_state=True)
        self.window_lm.refresh(self)      # a running windowed stage on all the data, once it doubled

    def _to_data(self, ts: TupleSet) -> TrainingData:
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
        return TrainingData(ts, self.dtype, self.device, latent, gyro=self.config.gyro_weight > 0)

    def _setup(self, ts: TupleSet) -> None:
        """On the first data: what is learnt, the engine for its environment, the objective."""
        if self.engine is not None:
            return
        cfg = self.config
        self.learn = resolve_learn(cfg.learn, self.robot.contact.law, floor=ts.floor)
        for name, raw in self.params.named_parameters():
            raw.requires_grad_(name in self.learn)
        bound_for_stability(self, ts)
        if cfg.init == "random":
            self.params.randomize(np.random.default_rng(cfg.seed), self.learn)
        ground_fn = None
        if cfg.collision == "mujoco" and ts.floor:
            # Ablation (c) only: the non-differentiable MuJoCo checker (a lower layer).
            from tensegrity_engine.groundtruth.mujoco_twin import MujocoGroundChecker
            ground_fn = MujocoGroundChecker(self.robot, fixed_rods=ts.fixed_rods)
        self.engine = TensegrityEngine(self.robot, self.params, fixed_rods=ts.fixed_rods,
                                       floor=ts.floor, ground_contact_fn=ground_fn).to(self.device)
        self.objective = RecurrentObjective(self.robot, cfg, self.engine, ts.fixed_rods, self.dtype, self.device)
        if cfg.schedule == "feedforward":
            self.schedule.n_steps = 1
        self.log(f"identifying {', '.join(self.learn)} ({'floor' if ts.floor else 'no floor'}, "
                 f"fixed rods {list(ts.fixed_rods)}); start {self.format_parameters()}")

    # ------------------------------------------------------------------ loss
    def act_starts(self, data: TrainingData, p: dict) -> torch.Tensor:
        return self.objective.act_starts(data, p)

    def batch_loss(self, data: TrainingData, idx: torch.Tensor, p: dict, n_steps: Optional[int] = None,
                   integrator: Optional[str] = None, latent: Optional[torch.Tensor] = None,
                   acts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The recurrent loss of tuples ``idx`` at the current stage (or the given one)."""
        return self.objective.batch_loss(
            data, idx, p, self.n_steps if n_steps is None else n_steps,
            self.integrator if integrator is None else integrator,
            use_latent=self.schedule.latent_adam, latent=latent, acts=acts)

    def heldout_loss(self, data, values: dict, chain: int = 0, per_block: bool = False,
                     known: Optional[dict] = None):
        """`acceptance.heldout_scores` of ``values`` on tuples the trainer never saw."""
        return heldout_scores(self, data, values, chain, per_block, known)

    def validate(self) -> float:
        """Validation loss (training loss if there is no validation data)."""
        data, idx = (self.val, self.val_index) if self.val is not None else (self.train, None)
        if idx is None:
            idx = torch.arange(len(data), device=self.device)
        p = {k: v.detach() for k, v in self.engine.param_values(self.dtype, self.device).items()}
        use_latent = self.schedule.latent_adam
        step = self.adam.val_latent_step if (use_latent and data is self.val and data.latent is not None) else None
        return validation_loss(self.objective, data, idx, p, self.n_steps, self.integrator,
                               use_latent=use_latent, latent_step=step)

    # ------------------------------------------------------------------ epochs
    def snapshot(self) -> dict:
        snap = {n: getattr(self.params, n).detach().clone() for n in self.learn}
        if self.latent:
            snap["__latent"] = self.train.latent.detach().clone()
        if self.window_lm.windows is not None:
            snap["__window_vel"] = self.window_lm.window_vel.clone()
        return snap

    @torch.no_grad()
    def restore(self, snap: dict) -> None:
        for n in self.learn:
            getattr(self.params, n).copy_(snap[n])
        if "__latent" in snap and self.latent and snap["__latent"].shape == self.train.latent.shape:
            self.train.latent.copy_(snap["__latent"])
        lm = self.window_lm
        if "__window_vel" in snap and lm.windows is not None and snap["__window_vel"].shape == lm.window_vel.shape:
            lm.window_vel = snap["__window_vel"].clone()

    def healthy(self) -> bool:
        for n in self.learn:
            raw = getattr(self.params, n)
            if not torch.isfinite(raw).all() or raw.abs().max() > self.config.max_raw:
                return False
        return not self.latent or bool(torch.isfinite(self.train.latent).all())

    def train_epoch(self) -> dict:
        """One epoch of the solver the schedule selects, then Algorithm 1's stage update."""
        if self.train is None:
            raise RuntimeError("call set_data() or add_tuples() first")
        if self.done:
            return dict(self._last_metrics)
        self.schedule.before_epoch()
        lm = self.schedule.use_lm
        solver = (self.window_lm if self.schedule.windows else self.tuple_lm) if lm else self.adam
        start = time.perf_counter()
        with torch.no_grad():       # an epoch keeps one step: its losses compare one discretisation
            self.objective.step_for(self.engine.param_values(self.dtype, self.device), self.log)
        result = solver.epoch(self)
        seconds = time.perf_counter() - start
        self.elapsed += seconds
        step = result.pop("step", None)
        reduction = result.pop("reduction", None)       # the tuple LM's own step's progress
        settled = result.pop("settled_sigmas", None)    # the windowed LM's values' recent path in sigmas
        if result.get("lm_lambda", 0.0) > LM_FREE_LAMBDA:
            # a short step under heavy damping is the trust region, not convergence
            step = math.inf
            settled = None if settled is None else math.inf
        metrics = {"epoch": self.epoch, "loss": result.pop("loss"), "val_loss": result.pop("val_loss"),
                   "stage": self.phase, "integrator": self.integrator, "dt": self.dt, "lr": self.lr,
                   "tuples": result.pop("tuples"), "seconds": seconds, "diverged": result.pop("diverged"),
                   "params": self.params.as_dict(), "reduction": reduction, "settled_sigmas": settled, **result}
        self.history.append(metrics)
        self.epoch += 1
        if lm:
            # its own progress counts online only, where its validation tuples grow
            self.schedule.after_lm_iteration(metrics["val_loss"], step, self.epoch, self.elapsed,
                                             reduction if self.config.schedule == "online" else None,
                                             settled=settled)
        else:
            self.schedule.after_epoch(metrics["val_loss"], self.epoch, self.elapsed)
        metrics["next_stage"] = self.phase
        self._last_metrics = metrics
        return dict(metrics)

    def stage_changed(self, kind: str) -> None:
        """Carry out a stage change of the schedule (ScheduleHost)."""
        if kind == "fine":
            # What implicit-only training would have returned (ablation b, for free).
            self.coarse_params = self.params.as_dict()
            scale_search(self)
            speed_limit_search(self)
            self.adam.rebuild(self)
        elif kind == "lr":
            self.adam.set_lr(self.lr)

    def set_budget(self, max_epochs: int, max_seconds: Optional[float], fd_max_iters: Optional[int] = None) -> None:
        """Another budget for the schedule, its finite differences' cap too (an adopted challenger's)."""
        self.config = dataclasses.replace(self.config, max_epochs=max_epochs, max_seconds=max_seconds,
                                          fd_max_iters=fd_max_iters)
        self.schedule.config = self.config

    def reopen(self, why: str) -> None:
        """Schedule "online": resume after the end on all the data (new windows join)."""
        if self.config.schedule != "online":
            raise RuntimeError(f"only the 'online' schedule resumes after its end, not {self.config.schedule!r}")
        self.schedule.reopen(self.epoch, why)
        self.window_lm.lm_lambda = self.tuple_lm.lm_lambda = 1e-3      # new data: a fresh trust region
        self.window_lm.settled.clear()                                # new data: a new problem
        if self.window_lm.stale:
            self.window_lm.setup(self)

    def log_stage(self, entry: dict) -> None:
        if entry["from"] == "done":
            self.log(f"epoch {entry['epoch']}: resumed, {entry['to']} ({entry['why']})")
        elif entry["from"] == entry["to"]:
            self.log(f"epoch {entry['epoch']}: restarted on more data, {entry['to']} ({entry['why']})")
        elif entry["to"] == "done":
            self.log(f"epoch {entry['epoch']}: done ({entry['why']}); {self.format_parameters()}")
        else:
            self.log(f"epoch {entry['epoch']}: stage {entry['from']} -> {entry['to']} "
                     f"(val {entry['val_loss']:.3e}); {self.format_parameters()}")

    def format_parameters(self) -> str:
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
        return trainer_state(self)

    def load_state_dict(self, sd: dict) -> None:
        """Resume (call after `set_data` with the same data)."""
        load_trainer_state(self, sd)

    def save_checkpoint(self, path) -> None:
        """`state_dict` as a pickle-free checkpoint file (see `checkpoint`)."""
        checkpoint.save_checkpoint(path, self.state_dict(), robot=self.robot, kind="trainer")

    def load_checkpoint(self, path) -> None:
        """Resume from `save_checkpoint` (after `set_data`); `checkpoint.CheckpointError`
        for a file of another format, version or robot topology."""
        self.load_state_dict(checkpoint.load_checkpoint(path, robot=self.robot, kind="trainer",
                                                         device=self.device))
