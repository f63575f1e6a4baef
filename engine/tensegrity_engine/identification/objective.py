"""The recurrent loss on (X_t, U_t, X_t+T) tuples (paper III-A) and the residuals of the
Levenberg-Marquardt solvers.

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

Timing: the commands act ``actuator_delay`` s after their stamps as the pose stamps see it
(motor dead time plus mocap latency; `physics.actuators.delayed_commands`), so a latency
is a parameter of the fit rather than a bias in tau.

Step: semi-implicit rollouts split each engine step into ``substeps`` (set per model by
`step_for` / `stepped_for` from `physics.stability.stable_substeps`), so a robot stiffer,
more damped or lighter than the config's step allows is still rolled out true.

The loss is divided by the data's zero-motion loss (``normalize_loss``: the same loss with
x_hat = x_t, computed once on the first training data), so it reads as the fraction of the
motion left unexplained and lr / tolerances mean the same for any robot.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Optional

import numpy as np
import torch

from tensegrity_engine.identification.config import IdentificationConfig
from tensegrity_engine.identification.data import TrainingData
from tensegrity_engine.identification.cable_rows import sensed, tuple_cable_rows, window_cable_rows
from tensegrity_engine.physics.actuators import delayed_commands, limited_filter_states, speed_limit_binds
from tensegrity_engine.physics.config import MODEL_INTEGRATORS, RobotConfig
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.stability import stable_substeps
from tensegrity_engine.physics.state import ANG_VEL, LIN_VEL, POS, QUAT, quat_axis


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


def command_stretches(grid: torch.Tensor, S: int):
    """Per trajectory of ``grid`` [traj, steps, A]: the first step [traj, L] and length in
    steps [traj, L] of each stretch of constant command (split at every tuple start,
    padded with empty stretches), and the stretch each tuple starts [traj, steps // S]."""
    traj, steps = grid.shape[:2]
    changed = torch.zeros(traj, steps, dtype=torch.bool, device=grid.device)
    changed[:, 1:] = (grid[:, 1:] != grid[:, :-1]).any(-1)
    changed[:, ::S] = True
    count = changed.sum(1)
    L = int(count.max())
    rank = changed.cumsum(1) - 1                                   # stretch of every step
    t, step = changed.nonzero(as_tuple=True)                       # by trajectory, then step
    following = torch.cat([step[1:], step.new_full((1,), steps)])
    following = torch.where(torch.cat([t[1:] != t[:-1], t.new_ones(1, dtype=torch.bool)]), steps, following)
    begins = torch.zeros(traj, L, dtype=torch.long, device=grid.device)
    durations = torch.zeros(traj, L, dtype=torch.long, device=grid.device)
    begins[t, rank[t, step]] = step
    durations[t, rank[t, step]] = following - step
    return begins, durations, rank[:, ::S]


def chained_starts(act0: torch.Tensor, prev: torch.Tensor, forced_end: torch.Tensor,
                   decay: torch.Tensor, longest: int) -> torch.Tensor:
    """[traj, A] start state of each trajectory of a linear filter: ``act0`` where ``prev`` is
    -1, else the end state of trajectory ``prev``, ``decay[prev] * start[prev] +
    forced_end[prev]``. Pointer jumping: log2 of the ``longest`` chain of pieces in vectorised
    steps (differentiable), instead of one step per piece."""
    linked = (prev >= 0)[:, None]
    ptr = torch.where(prev >= 0, prev, torch.arange(len(prev), device=prev.device))
    gain = torch.where(linked, decay[ptr], torch.zeros_like(decay[ptr]))
    offset = torch.where(linked, forced_end[ptr], act0)
    # a count from the data's links (no test on the values: torch.func traces this)
    for _ in range(int(longest).bit_length()):
        offset = offset + gain * offset[ptr]     # start = gain * start[ptr] + offset
        gain = gain * gain[ptr]
        ptr = ptr[ptr]
    return offset


def _stepped(config: IdentificationConfig) -> str:
    """The model integrator the fine stage's rollouts step with ("ani" sub-steps semi_implicit)."""
    return config.fine_integrator if config.fine_integrator in MODEL_INTEGRATORS else "semi_implicit"


def gyro_start_rows(data: TrainingData, windows: torch.Tensor, vel: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[N, R*3] the latent start's angular velocity error where a gyro measured it
    (``data.gyro0``; zero rows where none did, so the residual keeps its size when gyro data
    starts or stops), ``scale`` [R] per rod: (2 w)^1/2 x half rod length x T x gyro_weight^1/2,
    so 1 rad/s weighs as (half rod length x T) m in each end node. Only a gyro sees the spin
    about a rod's axis, which moves no node and which 10 Hz poses alias. Not the gyro at the
    window's later samples: the rollout's angular velocity after a contact event hangs on the
    latent start too steeply for Gauss-Newton (measured, bench/online.py twin/as_built, seeds
    0-2, damping / tau: +5.9 / -9.0, +7.5 / -7.3, +1.2 / -2.1 % with them, +1.1 / -1.2,
    +3.2 / -2.8, +1.7 / -1.7 % without the gyro, +1.0 / -1.0, +3.1 / -3.0, +1.9 / -2.1 % with
    these rows)."""
    first = windows[:, 0]
    if data.gyro0 is None:
        return vel.new_zeros(vel.shape[0], vel.shape[1] * 3)
    err = vel[..., 3:] - data.x0[first][..., ANG_VEL]
    return (err * (data.gyro0[first].to(vel.dtype) * scale)[..., None]).flatten(1)


def sample_weights(windows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[N, W, R] weight of each window sample's rod errors, ``w`` [R] where every sample has
    its pose; a window with dropped poses (-1, `gapped_windows`) weighs its other samples up
    to its mean over those, the dropped ones 0."""
    present = windows >= 0
    if bool(present.all()):
        return w.expand(*windows.shape, -1)
    per = present.to(w.dtype) * (windows.shape[1] / present.sum(1, keepdim=True).to(w.dtype))
    return per[..., None] * w


def window_inputs(data: TrainingData, windows: torch.Tensor, commands: torch.Tensor,
                  grid: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """([N, W S, A] commands, [N, W S, R, 6] wrenches or None) over ``windows`` from the timed
    ``commands`` per tuple, or across dropped poses (-1) from the record's command ``grid``."""
    if bool((windows >= 0).all()):
        return (commands[windows].flatten(1, 2),
                None if data.wrenches is None else data.wrenches[windows].flatten(1, 2))
    if data.wrenches is not None:
        raise ValueError("windows across dropped poses need data without applied wrenches")
    return grid[data.interval_cells(windows)].flatten(1, 2), None


def _training_dtype(objective, x0: torch.Tensor, p: dict) -> Optional[torch.dtype]:
    """The dtype a rollout from ``x0`` runs in when it trains parameters and ``gradient_dtype``
    is lower than the trainer's (the loss stays in the trainer's dtype); None otherwise (not
    a validation's latent step either: its parameters are detached)."""
    low = objective.gradient_dtype
    learns = torch.is_grad_enabled() and any(torch.is_tensor(v) and v.requires_grad for v in p.values())
    return low if low is not None and low != x0.dtype and learns and not objective._functional else None


class RecurrentObjective:
    """Engine predictions of tuples and their losses for one robot and environment.

    Stateless during training but for ``loss_scale`` (set once, from the first data)."""

    def __init__(self, robot: RobotConfig, config: IdentificationConfig, engine: TensegrityEngine,
                 fixed_rods, dtype: torch.dtype, device):
        self.robot, self.config, self.engine = robot, config, engine
        self.dtype, self.device = dtype, device
        f = lambda a: torch.as_tensor(a, dtype=dtype, device=device)
        free = np.ones(robot.num_rods)
        free[list(fixed_rods)] = 0.0
        self.half, self.free = f(robot.rod_length / 2.0), f(free)
        self.cmd_low, self.cmd_high = f(robot.command_low), f(robot.command_high)
        self.loss_scale: Optional[float] = None
        self.native = self._native_rollout(config, engine, device)
        self._timed = None        # (data, delay, commands, grid) of the last gradient-free call
        self._act_starts = None   # (data, (tau, speed, delay), filter states) of the last gradient-free call
        self._functional = False  # inside `functional`: torch rollouts, no caches
        # training rollouts (with gradient) step a torch.compile'd engine step: on by default on
        # CUDA (fused kernels instead of ~350 launches per step); off by default on the CPU,
        # where each integrator, dt and batch shape compiles anew (27-60 s) for a 2.5x epoch
        device_type = torch.device(device).type
        self.compile_training = (device_type == "cuda") if config.compile_training is None else config.compile_training
        self.gradient_dtype = {None: None, "float32": torch.float32, "float64": torch.float64}[config.gradient_dtype]
        self.substeps = 1         # per engine step, semi-implicit rollouts (see step_for)

    @staticmethod
    def _native_rollout(config: IdentificationConfig, engine: TensegrityEngine, device):
        """The C kernel for gradient-free rollouts of a model integrator (the same numbers as
        the torch engine, ~20x faster at Levenberg-Marquardt batch sizes), or None where it
        does not apply (other devices, an external ground, ANI). Asked for explicitly, a
        missing compiler raises; by default too (it says how to choose
        ``forward_backend="torch"``), since nothing falls back silently."""
        backend = config.forward_backend
        if backend is None:
            applies = (torch.device(device).type == "cpu" and engine.native_kernel_applies
                       and config.fine_integrator in MODEL_INTEGRATORS)
            backend = "native" if applies else "torch"
        if backend == "torch":
            return None
        from tensegrity_engine.physics import native

        if torch.device(device).type != "cpu" or engine.ground_contact_fn is not None:
            raise ValueError("forward_backend='native' runs on the CPU with the engine's own ground "
                             "collision; use forward_backend='torch'")
        native.load_library(torch.float64)
        return native.NativeRollout(engine, integrator=_stepped(config), threads=int(config.native_threads))

    def step_for(self, p: dict, log: Optional[Callable[[str], None]] = None) -> int:
        """Set (and return) the sub-steps the semi-implicit rollouts of ``p`` need; ``log``
        hears of a change."""
        before = self.substeps
        self.substeps = stable_substeps(self.engine.topology, p, self.robot.dt, floor=self.engine.floor,
                                        integrator=_stepped(self.config))
        if log is not None and self.substeps != before:
            log(f"engine step {1e3 * self.robot.dt / before:.3g} -> {1e3 * self.robot.dt / self.substeps:.3g} ms "
                f"({self.substeps} sub-steps): the values' stiffness, damping and masses need it")
        return self.substeps

    @contextlib.contextmanager
    def stepped_for(self, p: dict):
        """Within: rollouts sub-stepped as model ``p`` needs (a model judged, not trained)."""
        kept = self.substeps
        self.step_for(p)
        try:
            yield self.substeps
        finally:
            self.substeps = kept

    @contextlib.contextmanager
    def functional(self):
        """Within: every rollout in torch and no cached commands or filter states, so
        ``torch.func`` transforms (forward-mode Jacobians) see the parameters everywhere."""
        native, functional = self.native, self._functional
        self.native, self._functional = None, True
        try:
            yield
        finally:
            self.native, self._functional = native, functional

    def rollout(self, x0, act, cmd, dt: float, integrator: str, wrenches, record_every: int, p: dict):
        """The engine's rollout; in the native kernel when no gradient is wanted."""
        k = self.substeps if integrator in MODEL_INTEGRATORS else 1
        if k > 1:                 # each command (and push) held over its step's k sub-steps
            cmd = cmd.repeat_interleave(k, dim=1)
            wrenches = None if wrenches is None else wrenches.repeat_interleave(k, dim=1)
            dt, record_every = dt / k, record_every * k
        if (self.native is not None and integrator == self.native.integrator and not torch.is_grad_enabled()
                and x0.dtype in (torch.float32, torch.float64)):
            return self.native.rollout(x0, act, cmd, dt, record_every=record_every, params=p, wrenches=wrenches)
        # training rollouts step a torch.compile'd step (its backward compiled too) when asked
        compile = self.compile_training and torch.is_grad_enabled() and integrator != "ani" and not self._functional
        return self.engine.rollout(x0, act, cmd, dt, integrator=integrator, wrenches=wrenches,
                                   record_every=record_every, params=p, compile=compile)

    def zero_motion_loss(self, data: TrainingData) -> float:
        """Loss of predicting 'nothing moves' (x_hat = x_t): the data's own motion scale, so
        the normalised loss is the fraction of unexplained motion for any robot."""
        half, free = self.half, self.free
        weight = free / (2.0 * free.sum())
        p0, v0 = node_state(data.x0, half)
        p1, v1 = node_state(data.x1, half)
        per = ((p1 - p0) ** 2).sum(-1).sum(-1)
        if data.latent is None:
            per = per + self.config.w_vel * self.config.period ** 2 * ((v1 - v0) ** 2).sum(-1).sum(-1)
        scale = float((per * weight).sum(-1).mean())
        return scale if math.isfinite(scale) and scale > 1e-30 else 1.0

    def timed_commands(self, data: TrainingData, p: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(commands [N, S, A], command grid [traj, chunks, S, A]) as they act on the robot:
        the data's, ``actuator_delay`` late. Gradient-free calls reuse the last result for the
        same data and delay (a Levenberg-Marquardt iteration asks once per column)."""
        delay = p["actuator_delay"].reshape(())
        if not (self._functional or delay.requires_grad) and float(delay) == 0.0:
            return data.commands, data.cmd_grid
        key = None if (self._functional or delay.requires_grad or torch.is_grad_enabled()) else float(delay)
        if key is not None and self._timed is not None and self._timed[0] is data and self._timed[1] == key:
            return self._timed[2], self._timed[3]
        traj, chunks, S, A = data.cmd_grid.shape
        # the padded grids run on into the neighbouring pieces of a record (`data._padded_grids`):
        # a delay shifts commands across the cut
        wide = data.cmd_grid_wide.shape[1]
        grid = delayed_commands(data.cmd_grid_wide.reshape(traj, wide * S, A), delay,
                                self.robot.dt).reshape(traj, wide, S, A)[:, data.pad:data.pad + chunks]
        commands = grid[data.traj, data.chunk]
        if key is not None:
            self._timed = (data, key, commands, grid)
        return commands, grid

    def act_starts(self, data: TrainingData, p: dict) -> torch.Tensor:
        """[N, A] filtered command at every tuple start (exact filter, differentiable in tau
        and the speed limit). A filter whose speed limit cannot bind is linear: every tuple
        start at once by superposition; else the closed form runs over the stretches of
        constant command in order."""
        tau, speed = p["actuator_time_constant"], p["actuator_max_speed"]
        key = None
        if not (torch.is_grad_enabled() or self._functional):
            # a Levenberg-Marquardt column that moves neither tau, the speed limit nor the
            # delay sees the same filter states: reuse them (the rate-limited filter is sequential)
            key = (tuple(tau.reshape(-1).tolist()), tuple(speed.reshape(-1).tolist()),
                   float(p["actuator_delay"].reshape(())))
            if self._act_starts is not None and self._act_starts[0] is data and self._act_starts[1] == key:
                return self._act_starts[2]
        acts = self._act_starts_of(data, p, tau, speed)
        if key is not None:
            self._act_starts = (data, key, acts)
        return acts

    def _act_starts_of(self, data: TrainingData, p: dict, tau: torch.Tensor, speed: torch.Tensor) -> torch.Tensor:
        cmd_grid = self.timed_commands(data, p)[1]
        if speed_limit_binds(tau, speed, self.cmd_high - self.cmd_low):
            return self._limited_act_starts(data, cmd_grid, tau, speed)
        S = cmd_grid.shape[2]
        d = torch.exp(-self.robot.dt / tau)
        j = torch.arange(S, dtype=self.dtype, device=self.device)
        weights = (1.0 - d) * d ** (S - 1 - j)
        grid = torch.maximum(torch.minimum(cmd_grid, self.cmd_high), self.cmd_low)
        contrib = torch.einsum("s,tksa->tka", weights, grid)
        dS = d ** S
        a = torch.zeros_like(data.traj_act0)
        forced = [a]                      # each trajectory's response from rest
        for k in range(cmd_grid.shape[1]):
            a = dS * a + contrib[:, k]
            forced.append(a)
        forced = torch.stack(forced, 1)                                          # [traj, K + 1, A]
        rows = torch.arange(len(forced), device=forced.device)
        decay = dS ** data.traj_chunks.to(self.dtype)[:, None]                   # [traj, 1 or A]
        starts = chained_starts(data.traj_act0, data.traj_prev, forced[rows, data.traj_chunks], decay,
                                int(data.piece_depth.max()))
        k = data.chunk.to(self.dtype)[:, None]
        return forced[data.traj, data.chunk] + dS ** k * starts[data.traj]

    def _limited_act_starts(self, data: TrainingData, cmd_grid: torch.Tensor, tau: torch.Tensor,
                            speed: torch.Tensor) -> torch.Tensor:
        """The limited filter is not linear: it runs over each trajectory's own stretches of
        constant command (and every tuple start), all trajectories side by side. A union of
        every trajectory's stretches would take ~7x more sequential steps on random commands."""
        traj, chunks, S, A = cmd_grid.shape
        grid = torch.maximum(torch.minimum(cmd_grid, self.cmd_high), self.cmd_low).reshape(traj, chunks * S, A)
        begins, durations, tuple_stretch = command_stretches(grid, S)
        rows = torch.arange(traj, device=grid.device)[:, None]
        held = grid[rows, begins]                                      # [traj, L, A]
        h = durations.to(self.dtype) * self.robot.dt                   # [traj, L]; padding lasts 0 s
        L = held.shape[1]
        ends = torch.cat([tuple_stretch, tuple_stretch.new_full((traj, 1), L)], 1)[rows[:, 0], data.traj_chunks]
        # pieces of one record: each starts where the one it continues ends. All pieces run
        # side by side from the last pass's ends until no start moves: a few passes where the
        # filter forgets its start within a piece, at most one per piece of the longest record
        # (a winch that never catches up; exact either way); under torch.func (no test on
        # values) always that many
        linked = (data.traj_prev >= 0)[:, None]
        source = data.traj_prev.clamp(min=0)
        tolerance = 1e-14 * float((self.cmd_high - self.cmd_low).abs().max())
        a0 = data.traj_act0
        for _ in range(int(data.piece_depth.max()) + 1):
            acts = limited_filter_states(a0, held, h, tau, speed, scan=not self._functional)   # [traj, L + 1, A]
            starts = torch.where(linked, acts[rows[:, 0], ends][source], data.traj_act0)
            if not self._functional and float((starts - a0).abs().max()) <= tolerance:
                break
            a0 = starts
        return acts[rows, tuple_stretch][data.traj, data.chunk]

    def batch_loss(self, data: TrainingData, idx: torch.Tensor, p: dict, n_steps: int, integrator: str, *,
                   use_latent: bool, latent: Optional[torch.Tensor] = None,
                   acts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Mean recurrent loss of tuples ``idx``. ``use_latent``: start from the per-tuple
        latent velocities (Adam formulation); otherwise pose-only data runs on its
        finite-difference velocities. Measured cable states count as in `residuals`."""
        T = self.config.period
        lat = (data.latent if latent is None else latent) if use_latent else None
        x0 = data.x0[idx]
        if lat is not None:
            x0 = torch.cat([x0[..., :7], lat[idx]], -1)
        act = (self.act_starts(data, p) if acts is None else acts)[idx]
        pred, act_end = self.predict_end(data, idx, x0, act, p, n_steps, integrator, with_act=True)
        half, free = self.half, self.free
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
        if sensed(self.config, data):
            cables = tuple_cable_rows(self, data, idx, x0, act, pred, act_end, p)
            loss = loss + (cables ** 2).sum(-1).mean() / (2.0 * free.sum())
        return loss / self.loss_scale if self.loss_scale else loss

    def predict_end(self, data: TrainingData, idx: torch.Tensor, x0: torch.Tensor, act: torch.Tensor,
                    p: dict, n_steps: int, integrator: str, with_act: bool = False):
        """Engine state after T from x0 under the tuples' commands (and known wrenches),
        averaged onto n_steps engine steps: the prediction both losses compare with X_t+T
        (``with_act``: and the actuator state then)."""
        cmd = self.timed_commands(data, p)[0][idx]
        wr = None if data.wrenches is None else data.wrenches[idx]
        if n_steps != cmd.shape[1]:
            M = averaging_matrix(cmd.shape[1], n_steps, self.dtype, self.device)
            cmd = torch.einsum("cs,bsa->bca", M, cmd)
            wr = None if wr is None else torch.einsum("cs,bsrk->bcrk", M, wr)
        low = _training_dtype(self, x0, p)
        cast = (lambda t: t) if low is None else (lambda t: None if t is None else t.to(low))   # noqa: E731
        pred, acts = self.rollout(cast(x0), cast(act), cast(cmd), self.config.period / n_steps, integrator, cast(wr),
                                  n_steps, {k: cast(v) for k, v in p.items()})
        end = pred[:, -1].to(x0.dtype)
        return (end, acts[:, -1].to(x0.dtype)) if with_act else end

    def residuals(self, data: TrainingData, idx: torch.Tensor, p: dict, n_steps: int,
                  integrator: str) -> torch.Tensor:
        """Flat residual vector r with sum(r^2) == batch_loss (velocity data only), tuple by
        tuple; measured cable states (`cable_rows`) after each tuple's own rows."""
        T = self.config.period
        act = self.act_starts(data, p)[idx]
        pred, act_end = self.predict_end(data, idx, data.x0[idx], act, p, n_steps, integrator, with_act=True)
        pp, pv = node_state(pred, self.half)
        tp, tv = node_state(data.x1[idx], self.half)
        w = (self.free / (2.0 * self.free.sum() * len(idx) * (self.loss_scale or 1.0))).sqrt()
        w = w[None, :, None, None]
        r = torch.cat([(pp - tp) * w, (pv - tv) * (w * T * math.sqrt(self.config.w_vel))], -1).flatten(1)
        if sensed(self.config, data):
            node = 2.0 * float(self.free.sum()) * len(idx) * (self.loss_scale or 1.0)
            r = torch.cat([r, tuple_cable_rows(self, data, idx, data.x0[idx], act, pred, act_end, p, node ** -0.5)], 1)
        return r.reshape(-1)

    def window_residual(self, data: TrainingData, windows: torch.Tensor, vel: torch.Tensor,
                        p: dict) -> torch.Tensor:
        """[N, M] weighted end-node position errors at every sample of each multiple-shooting
        window, from the window's first pose and latent velocity ``vel`` [N, R, 6];
        sum(r^2) is the normalised position loss averaged over windows and samples. Then,
        where gyros measured the window's start, `gyro_start_rows`; where cable states were
        measured, `cable_rows.window_cable_rows`."""
        pred, acts = self.window_rollout(data, windows, p, vel, record_every=data.commands.shape[1],
                                         with_acts=True)
        pos, _ = node_state(pred, self.half)                          # [N, W, R, 2, 3]
        target, _ = node_state(data.x1[windows.clamp(min=0)], self.half)     # -1: a dropped pose
        w = self.free / (2.0 * self.free.sum() * windows.shape[0] * windows.shape[1]
                         * (self.loss_scale or 1.0))
        rows = [((pos - target) * sample_weights(windows, w).sqrt()[..., None, None]).flatten(1)]
        if self.config.gyro_weight:
            scale = (2.0 * w).sqrt() * self.half * self.config.period * math.sqrt(self.config.gyro_weight)
            rows.append(gyro_start_rows(data, windows, vel, scale))
        if sensed(self.config, data):     # as one free rod's end node
            node = 2.0 * float(self.free.sum()) * windows.shape[0] * windows.shape[1] * (self.loss_scale or 1.0)
            rows.append(window_cable_rows(self, data, windows, vel, pred, acts, p, node ** -0.5))
        return torch.cat(rows, 1) if len(rows) > 1 else rows[0]

    def window_rollout(self, data: TrainingData, windows: torch.Tensor, p: dict,
                       vel: Optional[torch.Tensor] = None, record_every: Optional[int] = None,
                       with_acts: bool = False):
        """[N, K, R, 13] the model's states over each window of consecutive tuples (-1: an
        interval whose pose was dropped), rolled out open loop from its first tuple's pose and
        latent velocity ``vel`` [N, R, 6] (None: its state as estimated), every
        ``record_every`` engine steps (None: the end only); ``with_acts``: (states, the
        actuator states [N, K, A])."""
        first = windows[:, 0]
        x0 = data.x0[first] if vel is None else torch.cat([data.x0[first][..., :7], vel], -1)
        act = self.act_starts(data, p)[first]
        cmd, wr = window_inputs(data, windows, *self.timed_commands(data, p))
        pred, acts = self.rollout(x0, act, cmd, self.robot.dt, self.config.fine_integrator, wr,
                                  record_every or cmd.shape[1], p)
        return (pred, acts) if with_acts else pred

    @torch.no_grad()
    def chain_com_error(self, data: TrainingData, chains: torch.Tensor, p: dict,
                        vel: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[N] distance (m) between the predicted and the measured centre of mass of the free
        rods at the end of each chain of consecutive tuples, rolled out open loop from its
        first tuple's state as estimated (or its pose and ``vel`` [N, R, 6])."""
        if bool((chains[:, -1] < 0).any()):
            raise ValueError("a chain must end at a tuple: its measured pose is the reference")
        pred = self.window_rollout(data, chains, p, vel)
        w = self.free * p["rod_mass"].to(self.dtype).reshape(-1).expand_as(self.free)
        com = lambda x: (x[..., :3] * w[:, None]).sum(-2) / w.sum()          # noqa: E731
        return (com(pred[:, -1]) - com(data.x1[chains[:, -1]])).norm(dim=-1)


def validation_loss(objective, data: TrainingData, idx: torch.Tensor, p: dict, n_steps: int,
                    integrator: str, *, use_latent: bool,
                    latent_step: Optional[Callable[[torch.Tensor], None]] = None) -> float:
    """Mean loss over ``idx`` in minibatches. With ``latent_step`` (pose-only Adam
    formulation) each minibatch also takes one step of its latent velocities, with the
    parameters frozen."""
    acts = objective.act_starts(data, p)
    total, count = 0.0, 0
    bs = objective.config.batch_size
    for b in range(0, len(idx), bs):
        sub = idx[b:b + bs]
        if latent_step is not None:
            loss = objective.batch_loss(data, sub, p, n_steps, integrator, use_latent=use_latent, acts=acts)
            if torch.isfinite(loss):
                latent_step(loss)
            loss = loss.detach()
        else:
            with torch.no_grad():
                loss = objective.batch_loss(data, sub, p, n_steps, integrator, use_latent=use_latent,
                                            acts=acts)
        total += float(loss) * len(sub)
        count += len(sub)
    return total / max(count, 1)
