"""Pose-only identification by windowed multiple shooting (``fine_optimizer="lm"``).

At 10 Hz a SUPERball is near its sampling limit (sqrt(K/m) T ~ 3), so finite-difference
velocities of the poses are 25-45 % off, and a velocity error changes the pose one interval
later much less than a parameter error does (cable damping erases most of it within
~10 ms). A latent velocity per tuple, fitted to the single pose X_t+T, can therefore absorb
almost any parameter error: that formulation does not identify. Instead a window is
``pose_window`` (default 3) consecutive tuples; the engine runs the whole window (3 x 100 ms
at 1 ms) from X_t's pose and a *latent* initial velocity (initialised by the finite
differences) and the residual is every end-node position at the window's samples. 36
latents against 90 observed coordinates are over-determined, so the parameters are
identified; Levenberg-Marquardt solves parameters and all window latents jointly, with the
block-diagonal latent part eliminated by a Schur complement per window (bundle-adjustment
style) and forward-difference Jacobians (window latents perturbed for all windows in one
batched rollout; a window's latent block, most of the rollouts, is reused for
``latent_jacobian_reuse`` iterations). Spin about a rod's axis moves no node, so the latent
blocks are regularised relative to their largest curvature. Each tuple is in at most one
window; up to ``lm_windows`` of them are used (a random subset beyond) and their latents
persist, also when data is appended (`grow`); the reported validation loss of this stage is
the normalised window objective. Measured (SUPERball, no contact, MuJoCo data with velocities
removed): from the finite-difference result all parameters within 0.1 % in 3 iterations
and exact (0.000 %) in 7.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.identification.solvers.chaining import chain_latents
from tensegrity_engine.identification.solvers.covariance import SettledValues, raw_sigmas
from tensegrity_engine.identification.solvers.levenberg_marquardt import (JUMP_RATIO, LM_FREE_LAMBDA, boxed_step,
                                                                          jacobian_mode, one_sided_jacobian,
                                                                          parameter_jacobian, raw_vector,
                                                                          set_raw_vector)
from tensegrity_engine.identification.solvers.limit_drop import REFIT_ITERATIONS, drop_speed_limit
from tensegrity_engine.identification.solvers.settle import motor_settled, settle_steps

SCORE_CLUSTERS = 10     # groups of consecutive windows behind the cluster-robust sigma
EPS = 1e-6              # forward-difference step (raw parameter units; m/s and rad/s for latents)
# The joint solver's latent blocks take a coarser step (m/s, rad/s). On the floor a window's
# residual is piecewise smooth in its start velocity, with kinks within 1e-4-1e-3 m/s of most
# starts (the contacts' per-step states): a 1e-6 step gives one piece's slope, which holds
# only to the next kink, and the Schur-reduced step built on it moves the latents where they
# cannot follow a parameter step. Measured (three-bar soft_slow rolling, soft law, 110
# windows, rod 0's velocity): slopes over 1e-7 and 1e-6 agree, but differ from the 1e-2 secant
# by 20-100 % (median); over 1e-4 and 1e-3 kinks dominate (90th percentile 4-27x); over 1e-2
# to 1e-1 they agree within 16-70 %. With 1e-6 blocks the solver stalled at damping +19 %
# (every step refused up to lambda 1e12) while its objective still fell toward the truth; with
# 1e-2 blocks it moved on (+19 -> +13 %, that objective 0.0393 -> 0.0384). A window's own
# start-velocity fit (`fit_start_velocities`, the gate's and the uncertainty's) keeps the fine
# step: within a piece it fits better (0.0435 against 0.0441 with 1e-2 steps).
LATENT_STEP = 1e-2
LATENT_SWEEPS = 3       # per iteration: Gauss-Newton sweeps on the latents alone (`_polish_latents`)
# First damping (relative to the latent normal matrix's diagonal) of `fit_start_velocities`:
# finite-difference starts are far off, and full Gauss-Newton steps from them overshoot on
# the floor; it falls 10x per accepted step, so a smooth window is back to Gauss-Newton in a
# few. Measured (twin rolling, 30 s online, 78 windows, 6 iterations; per step /3 or /10):
# objective 0.032 from 1e-6 (/3), 1.7e-3 from 1e-3 (/10), 6.5e-4 from 0.1 (/10), 4.8e-4 from
# 0.1 (/3, but a hanging window's exact model then kept 6e-8 where it reaches 1e-10).
START_DAMPING = 0.1
# Gauss-Newton iterations of a new window chained from its predecessor (`chaining`)
CHAIN_ITERATIONS = 2


def chain_windows(nxt, width: int) -> tuple[np.ndarray, int]:
    """([N, w] tuple indices, w): every chain of consecutive tuples (``nxt[i]``: the tuple
    after i, -1 at a chain end) cut from its start into non-overlapping windows of ``width``
    tuples (a shorter rest is left out); w < ``width`` when no chain is that long."""
    nxt = np.asarray(nxt)
    has_prev = np.zeros(len(nxt), dtype=bool)
    has_prev[nxt[nxt >= 0]] = True
    chains = []
    for start in np.flatnonzero(~has_prev):
        c = [int(start)]
        while nxt[c[-1]] >= 0:
            c.append(int(nxt[c[-1]]))
        chains.append(c)
    width = min(width, max((len(c) for c in chains), default=0))
    pool = [c[k:k + width] for c in chains for k in range(0, len(c) - width + 1, width)] if width else []
    return np.array(pool, dtype=np.int64).reshape(-1, max(width, 1)), width


def window_fits(present, start: int, width: int, fit: int = 0) -> bool:
    """A `gapped_windows` window of ``width`` intervals can start at interval ``start`` of a
    run whose intervals with a tuple are ``present`` (a set or mapping of positions): it ends
    at a tuple and, with ``fit`` > 0, has tuples at two (or ``fit``) of its first ``fit``
    intervals."""
    need = min(int(fit), 2) if fit else 0
    return ((start + width - 1) in present
            and sum((start + j) in present for j in range(max(int(fit), 1))) >= need)


def gapped_windows(data, width: int, fit: int = 0) -> np.ndarray:
    """[N, ``width``] tuple indices: windows of ``width`` consecutive intervals of one command
    run (`TrainingData.run_positions`: a record goes on across a dropped pose), -1 at an
    interval without a tuple (a dropped pose's: the rollout runs through it on the commands
    the record holds, only its pose is not compared). Each starts and ends at a tuple and has
    poses at two or more of its first ``fit`` intervals (with ``fit`` > 0: the samples that fix
    its start velocity, `fit_start_velocities`, over-determine it); cut greedily in time
    order without overlap. Without dropped poses these are `chain_windows`' of that width, and
    so are they on data with applied wrenches (known per tuple only).
    At 10 Hz with 5 % of frames lost, 43 % of 1 s chains break: scoring only unbroken chains
    left a hold-out gate waiting for blocks."""
    run, pos = data.run_positions()
    sealed = data.wrenches is not None          # known wrenches are per tuple: none across a hole
    found = []
    for r in np.unique(run):
        members = np.flatnonzero(run == r)
        at = dict(zip(pos[members].tolist(), members.tolist()))
        free_from = None
        for start in sorted(at):
            if free_from is not None and start < free_from:
                continue
            cells = [at.get(start + j, -1) for j in range(width)]
            if not window_fits(at, start, width, fit) or (sealed and min(cells) < 0):
                continue
            found.append(cells)
            free_from = start + width
    found.sort(key=lambda cells: cells[0])
    return np.array(found, dtype=np.int64).reshape(-1, width)


def training_windows(ts, width: int, settle=0) -> tuple[np.ndarray, int]:
    """`chain_windows` of a training set, less those starting within ``settle`` engine steps
    (one count, or one per trajectory: `settle_steps`) of an assumed motor state
    (`motor_settled`; kept all if none would be left). A stream
    takes its motors as settled at the first command it hears: measured on 30 s of the twin
    rolling with gyros (motors from rest, tau 0.1 s), the record's first window held 94 % of
    the converged objective, irreducible by any start velocity, and the parameters bent to
    it: K / c / tau -0.6 / +3.3 / -3.4 %; without it -0.14 / -0.06 / -0.02 % (poses only:
    -0.5 / +4.0 / -3.4 % against -0.2 / +1.6 / -1.0 %)."""
    pool, width = chain_windows(ts.next, width)
    if np.any(np.asarray(settle) > 0) and len(pool):
        keep = motor_settled(ts, settle)[pool[:, 0]]
        if keep.any():
            pool = pool[keep]
    return pool, width


@torch.no_grad()
def latent_jacobian(residual, windows: torch.Tensor, vel: torch.Tensor, r0: torch.Tensor, cols: torch.Tensor,
                    total: int, step: float = EPS) -> torch.Tensor:
    """[n, M, L] forward-difference Jacobian of each window's residual w.r.t. its own latent
    velocity components ``cols`` (component j of every window perturbed in one batched run).
    ``residual(windows, vel)`` weighs by 1 / sqrt(number of windows): ``total`` is the count
    behind ``r0``. A column `JUMP_RATIO` times the median window's of its component is taken
    again from the backward difference, and the smaller kept: a contact that opens a step
    earlier within the difference step jumps (measured, the SUPERball rolling under the soft
    law: 8 of 2808 columns, 10^2-10^5 times the median, all the backward difference's
    slope), and one such column would turn that window's latent direction into the jump's.
    ``step``: the difference step (`LATENT_STEP` for the joint solver's blocks)."""
    N, R, L = vel.shape[0], vel.shape[1], len(cols)

    def differences(vel_rows, window_rows, comps, step):
        v = vel_rows.flatten(1).clone()
        v[torch.arange(len(v)), comps] += step
        return residual(window_rows, v.reshape(-1, R, 6)) * math.sqrt(len(window_rows) / total)

    chunk = max(1, 4096 // L)                 # bounded rollout batch (memory)
    blocks = []
    for a in range(0, N, chunk):
        n = min(chunk, N - a)
        comps = cols.to(vel.device).repeat(n)
        rb = differences(vel[a:a + n].repeat_interleave(L, 0), windows[a:a + n].repeat_interleave(L, 0), comps, step)
        blocks.append(((rb.reshape(n, L, -1) - r0[a:a + n, None]) / step).transpose(1, 2))
    B = torch.cat(blocks)
    size = B.norm(dim=1)                                               # [n, L]
    suspect = (size > JUMP_RATIO * size.nanmedian(0).values) | ~torch.isfinite(size)
    if N > 2 and bool(suspect.any()):
        w_idx, c_idx = suspect.nonzero(as_tuple=True)
        rb = differences(vel[w_idx], windows[w_idx], cols.to(vel.device)[c_idx], -step)
        back = (r0[w_idx] - rb) / step
        take = torch.isfinite(back.norm(dim=-1)) & ~(back.norm(dim=-1) >= size[w_idx, c_idx])
        B[w_idx[take], :, c_idx[take]] = back[take]
    return B


def latent_normal(B: torch.Tensor):
    """(B', B'B, its diagonal floored at 1e-6 of the largest) per window, from the latent
    blocks B [N, M, L]. Spin about a rod axis moves no node: the floor keeps it solvable."""
    Bt = B.transpose(1, 2)
    BtB = Bt @ B
    d = BtB.diagonal(dim1=1, dim2=2)
    return Bt, BtB, torch.maximum(d, 1e-6 * d.amax(-1, keepdim=True))


@torch.no_grad()
def latent_step(residual, windows, vel, r0, f0, cols, normal, damping: torch.Tensor):
    """One damped Gauss-Newton step on each window's latents ``cols`` (``normal`` from
    `latent_normal`, ``damping`` [N] per window), kept only by the windows whose own residual
    falls -> (vel, r0, f0, better)."""
    Bt, BtB, d = normal
    step = -torch.linalg.solve(BtB + damping[:, None, None] * torch.diag_embed(d), Bt @ r0[..., None])[..., 0]
    trial = vel.flatten(1).clone()
    trial[:, cols] += torch.where(torch.isfinite(step), step, torch.zeros_like(step))
    trial = trial.reshape(vel.shape)
    r1 = residual(windows, trial)
    f1 = (r1 ** 2).sum(-1)
    better = torch.isfinite(f1) & (f1 < f0)
    return (torch.where(better[:, None, None], trial, vel), torch.where(better[:, None], r1, r0),
            torch.where(better, f1, f0), better)


def score_groups(g: torch.Tensor, information: Optional[torch.Tensor] = None):
    """[G, P] the per-unit gradients g [N, P] (windows or tuples, in time order) summed over
    groups of consecutive units: ``SCORE_CLUSTERS`` of them, or twice the parameters where
    that is more (the sandwich's meat must have a rank to spare), each unit alone when there
    are fewer than twice as many units. The scores of the cluster-robust sigma: mismatch that
    drifts with the excitation is correlated over seconds, not only within a unit. With
    ``information`` [N, P, P] (each unit's share of the normal matrix) also that, summed over
    the same groups: ([G, P], [G, P, P]) for the cluster jackknife."""
    N, P = g.shape
    want = max(SCORE_CLUSTERS, 2 * P)
    groups = want if N >= 2 * want else N
    scores = torch.stack([part.sum(0) for part in torch.tensor_split(g, groups)])
    if information is None:
        return scores
    return scores, torch.stack([part.sum(0) for part in torch.tensor_split(information, groups)])


def reduced_information(A: torch.Tensor, B: torch.Tensor, r: torch.Tensor, rtol: float = 1e-6) -> dict:
    """The windowed problem's information on the parameters with every window's latents
    eliminated, from the parameter blocks A [N, M, P], the latent blocks B [N, M, L] and the
    residuals r [N, M] (windows in time order): the reduced normal matrix H = sum_i A_i'(I -
    P_i)A_i with P_i the projector onto the range of B_i (its SVD; directions below ``rtol``
    of the median window's largest singular value dropped: spin about a rod axis moves no
    node; the median, so one window whose latent column jumped at a contact switch does not
    lose its real directions), each window's reduced gradient g_i = A_i'(I - P_i)r_i in
    groups (`score_groups`), the reduced residual sum of squares |(I - P_i)r_i|^2 and its
    degrees of freedom, and each group's share of H ("HG",
    for the cluster jackknife).
    Projecting the columns keeps H positive semi-definite; A'A -
    A'B(B'B)^-1 B'A formed from normal matrices cancels badly on floor contact (measured:
    negative variances on the diagonal, the twin rolling)."""
    U, S, _ = torch.linalg.svd(B, full_matrices=False)
    keep = S > rtol * S[:, 0].median()
    U = U * keep[:, None, :].to(U.dtype)
    A_red = A - U @ (U.transpose(1, 2) @ A)
    r_red = r - (U @ (U.transpose(1, 2) @ r[..., None]))[..., 0]
    per_window = A_red.transpose(1, 2) @ A_red
    g = (A_red.transpose(1, 2) @ r_red[..., None])[..., 0]
    dof = max(r.numel() - A.shape[-1] - int(keep.sum()), 1)
    scores, group_information = score_groups(g, per_window)
    return {"H": per_window.sum(0), "G": scores, "HG": group_information, "rss": float((r_red ** 2).sum()),
            "dof": dof}


@torch.no_grad()
def fit_start_velocities(objective, data, windows: torch.Tensor, p: dict, iterations: int = 6,
                         start: Optional[torch.Tensor] = None, chain: bool = False) -> torch.Tensor:
    """[N, R, 6] initial velocities of ``windows`` (chains of tuples) that make the model
    ``p`` best reproduce their poses: Gauss-Newton per window, the parameters fixed, from
    the finite-difference estimates. What the model predicts *after* them is then a fair
    measure of the model: finite-difference velocities are 25-45 % off at 10 Hz, and which
    model happens to suit that error says nothing about the robot. Each window's damping
    adapts (Levenberg-Marquardt, from `START_DAMPING`): with a fixed one, a window whose step
    was refused computed the same step again at every later iteration and never moved
    (measured on the SUPERball twin rolling, 30 s of online data: the exact model's 78
    windows fitted 0.066 in all, their true start velocities 1.4e-4; now 6.5e-4, and the
    held-out CoM error 1 s ahead of the exact model fell from 36.8 to 1.6 mm). ``start``
    [N, R, 6]: start there instead. ``chain``: then each window that continues another of
    ``windows`` also tries its predecessor's predicted end velocity (`chaining.chain_latents`):
    the spin about a rod's axis, which 10 Hz poses alias, otherwise stays where the finite
    differences put it."""
    vel = (data.x0[windows[:, 0]][..., 7:] if start is None else start).clone()
    N, R = vel.shape[0], vel.shape[1]
    cols = torch.as_tensor([r * 6 + j for r in range(R) for j in range(6)
                            if float(objective.free[r]) > 0], device=vel.device)
    residual = lambda w, v: objective.window_residual(data, w, v, p)        # noqa: E731
    r0 = residual(windows, vel)
    f0 = (r0 ** 2).sum(-1)
    damping = torch.full_like(f0, START_DAMPING)
    for _ in range(iterations):
        normal = latent_normal(latent_jacobian(residual, windows, vel, r0, cols, N))
        vel, r0, f0, better = latent_step(residual, windows, vel, r0, f0, cols, normal, damping)
        damping = torch.where(better, damping / 10.0, damping * 10.0).clamp(1e-12, 1e9)
    if chain:
        vel, _ = chain_latents(objective, data, windows, vel, p, torch.ones(len(windows), dtype=torch.bool),
                               iterations=iterations)
    return vel


@torch.no_grad()
def restart_latents(objective, data, windows: torch.Tensor, vel: torch.Tensor, r0: torch.Tensor, p: dict,
                    every: int, turn: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(vel, r0, restarted): the windows whose index is ``turn`` modulo ``every`` have their
    start velocity fitted afresh from the finite differences (`fit_start_velocities`) at the
    values ``p``, and take it where it fits the window better than the solver's own
    (``vel`` [N, R, 6], residuals ``r0`` [N, M] weighed for all N windows). On the floor a
    window's residual is piecewise smooth in its start velocity, and the joint solver's
    latents, moved a step at a time from where the first values put them, stay on a piece
    that a model with other values no longer suits. Measured (the four-bar's twin rolling,
    noise-free, seed 0, at its last redraw): a fresh fit was better on 56 of 104 windows,
    their objective 1.8e-3 -> 6.4e-4."""
    N = windows.shape[0]
    pick = (torch.arange(N, device=windows.device) % every == turn % every).nonzero()[:, 0]
    restarted = torch.zeros(N, dtype=torch.bool, device=windows.device)
    if not len(pick):
        return vel, r0, restarted
    fresh = fit_start_velocities(objective, data, windows[pick], p)
    r_new = objective.window_residual(data, windows[pick], fresh, p) * math.sqrt(len(pick) / N)
    better = torch.isfinite(r_new).all(-1) & ((r_new ** 2).sum(-1) < (r0[pick] ** 2).sum(-1))
    take = pick[better]
    vel, r0 = vel.clone(), r0.clone()
    vel[take], r0[take] = fresh[better], r_new[better]
    restarted[take] = True
    return vel, r0, restarted


def blocks_cached(latent_jac: Optional[torch.Tensor], jac_age: Optional[torch.Tensor], windows: int,
                  rows: int) -> bool:
    """The cached latent blocks (and their ages) are those of ``windows`` windows of ``rows``
    residual rows."""
    return (latent_jac is not None and jac_age is not None
            and latent_jac.shape[:2] == (windows, rows) and len(jac_age) == windows)


def polish_blocks(residual, windows: torch.Tensor, vel: torch.Tensor, r0: torch.Tensor, cols: torch.Tensor,
                  latent_jac: Optional[torch.Tensor], jac_age: Optional[torch.Tensor], reuse: int) -> torch.Tensor:
    """Latent blocks good enough to polish with: the solver's cached ones where they are
    younger than ``reuse`` iterations (its own steps use them so), fresh ones for the rest.
    The block the information is taken from is then computed afresh at the polished latents;
    before, the polish had its own fresh blocks too, and the two latent Jacobians were two
    thirds of an estimate's rollouts."""
    N = windows.shape[0]
    if not blocks_cached(latent_jac, jac_age, N, r0.shape[-1]):
        return latent_jacobian(residual, windows, vel, r0, cols, N, step=LATENT_STEP)
    B = latent_jac.clone()
    due = (jac_age >= reuse).nonzero()[:, 0].to(r0.device)
    if len(due):
        B[due] = latent_jacobian(residual, windows[due], vel[due], r0[due], cols, N, step=LATENT_STEP)
    return B


class WindowLevenbergMarquardt:
    def __init__(self, config):
        self.config = config
        self.lm_lambda = 1e-3
        self.windows: Optional[torch.Tensor] = None      # [N, W] tuple indices
        self.window_vel: Optional[torch.Tensor] = None   # their latent initial velocities
        self.latent_cols: Optional[torch.Tensor] = None
        self.stale = False                               # data appended since setup
        self.latent_jac: Optional[torch.Tensor] = None   # [N, M, L] cached latent blocks
        self.jac_age: Optional[torch.Tensor] = None      # iterations since each was computed
        self.chained = 0                                 # new windows' latents taken from their predecessor
        self.drawn_from = 0                              # training tuples when the windows were drawn
        self.settled = SettledValues()                   # the values' path on this problem

    def reset(self) -> None:
        """New data (tuple indices changed): the windows are drawn again at the next epoch."""
        self.windows, self.stale = None, False

    def grow(self) -> None:
        """Tuples were appended (old indices still hold). The windows stay as they are while
        a stage runs (its losses compare the same problem); `setup` after ``grow`` (the
        schedule "online" resuming) adds the new windows, the old ones keep their latents."""
        self.stale = self.windows is not None

    def setup(self, run, rng: Optional[np.random.Generator] = None, announce: bool = True,
              chain: bool = True) -> None:
        """The multiple-shooting windows: every chain of consecutive tuples cut into
        non-overlapping pieces of ``pose_window`` (shorter if the data has no chain that
        long), so each tuple is in at most one window, none in a record's first
        ``motor_settle`` time constants (`training_windows`); at most ``lm_windows`` of them (a
        random subset, drawn again when data arrives, from ``rng`` or the run's). Latent
        initial velocities: kept for windows seen before, the finite-difference estimates for
        new ones, or (``chain`` and the config's ``chain_latents``) chained from the window they
        continue (`_chained`)."""
        cfg = self.config
        p = run.engine.param_values(run.dtype, run.device)
        settle = settle_steps(run.robot, p, cfg.motor_settle, run.train.ts)
        pool, width = training_windows(run.train.ts, cfg.pose_window, settle)
        if width < 2:
            raise ValueError("pose-only identification needs consecutive tuples (chains of at "
                             "least 2 sample intervals); the data has only isolated tuples")
        if width < cfg.pose_window and self.windows is None and announce:
            run.log(f"pose-only: no chain of {cfg.pose_window} tuples, using windows of {width}")
        if len(pool) > cfg.lm_windows:
            pool = pool[np.sort((rng or run.rng).permutation(len(pool))[:cfg.lm_windows])]
        windows = torch.as_tensor(pool, device=run.device)
        vel = run.train.x0[windows[:, 0]][..., 7:].detach().clone()
        reuse = cfg.latent_jacobian_reuse
        jac, age = None, torch.full((len(pool),), reuse, dtype=torch.long)     # new: due now
        fresh = torch.ones(len(pool), dtype=torch.bool, device=run.device)   # latents not kept
        if self.stale and self.windows.shape[1] == width:
            known = {tuple(w): i for i, w in enumerate(self.windows.tolist())}
            pairs = [(j, known[tuple(w)]) for j, w in enumerate(pool.tolist()) if tuple(w) in known]
            if pairs:
                new_idx, old_idx = (torch.as_tensor(x, device=run.device) for x in zip(*pairs))
                fresh[new_idx] = False
                vel[new_idx] = self.window_vel[old_idx]
                if self.latent_jac is not None:
                    # residuals weigh 1 / sqrt(number of windows): a block kept from the old
                    # windows is rescaled to the new count (unscaled, the joint steps and the
                    # polish after a redraw used it sqrt(old / new) too large, until recomputed)
                    jac = self.latent_jac.new_zeros((len(pool),) + self.latent_jac.shape[1:])
                    jac[new_idx] = self.latent_jac[old_idx] * math.sqrt(self.windows.shape[0] / len(pool))
                    age[new_idx.cpu()] = self.jac_age[old_idx.cpu()]
        if chain:
            vel = self._chained(run, windows, vel, fresh)
        first = self.windows is None
        self.windows, self.window_vel, self.stale = windows, vel, False
        self.settled.clear()                             # a new problem: its own convergence
        self.drawn_from = len(run.train)
        self.latent_jac, self.jac_age = jac, age
        self._set_latent_cols(run)
        if first and announce:
            run.log(f"pose-only Levenberg-Marquardt: {len(pool)} windows of {width} x "
                    f"{cfg.period * 1e3:g} ms, {len(self.latent_cols)} latent velocities each")

    def refresh(self, run) -> bool:
        """A running windowed stage keeps its windows (its losses compare one problem) until
        its end, when "online" reopens on all the data. Online, the first windows are drawn
        from the first seconds, and a stage on them ran on while the data grew many times:
        the sim2sim's twin converged on 13 windows of the first 5 s (damping +25 %, tau -23 %)
        with 70 new tuples waiting, and its controller took that for the model. So once the
        data has grown ``window_refresh`` times since the windows were drawn (and while they
        are fewer than ``lm_windows``), the stage starts again on all of it: new windows join,
        old ones keep their latents. True if it did."""
        growth = self.config.window_refresh
        if not (growth and self.stale and not run.done and run.schedule.windows):
            return False
        if len(run.train) < growth * max(self.drawn_from, 1) or self.windows.shape[0] >= self.config.lm_windows:
            return False
        before = self.windows.shape[0]
        self.setup(run, announce=False)
        self.lm_lambda = 1e-3                       # a new problem: a fresh trust region
        run.schedule.restart(run.epoch, f"{len(run.train)} tuples: {before} -> {self.windows.shape[0]} windows")
        return True

    @torch.no_grad()
    def _chained(self, run, windows: torch.Tensor, vel: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
        """New windows' latents: those that continue another window start from its predicted
        end velocity where that fits them better (`chaining.chain_latents`; 10 Hz poses alias
        the spin about a rod's axis). A new window's own latents are the raw finite
        differences here, so the chained start, fitted for `CHAIN_ITERATIONS`, nearly always
        wins; the first window of a chain keeps them (the solver's iterations fit it)."""
        if not bool(fresh.any()) or not self.config.chain_latents:
            return vel
        p = {k: v.detach() for k, v in run.engine.param_values(run.dtype, run.device).items()}
        vel, replaced = chain_latents(run.objective, run.train, windows, vel, p, fresh,
                                      iterations=CHAIN_ITERATIONS)
        self.chained += replaced
        return vel

    def _set_latent_cols(self, run) -> None:
        free = np.flatnonzero(run.objective.free.cpu().numpy() > 0)
        self.latent_cols = torch.as_tensor([r * 6 + j for r in free for j in range(6)], device=run.device)

    @torch.no_grad()
    def _residual(self, run, theta: torch.Tensor, windows: torch.Tensor, vel: torch.Tensor) -> torch.Tensor:
        set_raw_vector(run.params, run.learn, theta)
        p = run.engine.param_values(run.dtype, run.device)
        return run.objective.window_residual(run.train, windows, vel, p)

    @torch.no_grad()
    def _param_jacobian(self, run, theta, windows, vel, r0, one_sided: bool = False) -> torch.Tensor:
        """[N, M, P] Jacobian w.r.t. the raw parameters: forward differences, one-sided ones
        or forward-mode AD (``IdentificationConfig.jacobian``, `levenberg_marquardt.jacobian_mode`;
        exact on each smooth piece, ``one_sided`` does not apply). One-sided: each window's
        column is the smaller (in norm) of the forward and backward difference, with
        ``one_sided`` also those at 100x the step: on the floor a window whose rollout
        crosses a contact or stick-slip switch within a step has a jump, not a slope, on
        that side (measured: the twin rolling, one window's stiffness column 10^6 times the
        median's, which made the stiffness' sigma 0.00 %). The other sides are rolled out
        only for the windows whose forward difference is far above the median window's
        (`one_sided_jacobian`), so a column costs about one rollout of all windows."""
        mode = jacobian_mode(run.config, run.objective)
        if mode == "forward":
            return parameter_jacobian(run, theta, lambda p: run.objective.window_residual(run.train, windows, vel, p))
        sides = (-1.0, 100.0, -100.0) if one_sided else (-1.0,) if mode == "one_sided" else ()
        N = len(r0)
        rows = lambda th, sub: self._residual(run, th, windows[sub], vel[sub]) * math.sqrt(len(sub) / N)  # noqa: E731
        J = one_sided_jacobian(lambda th: self._residual(run, th, windows, vel), theta, r0, N, EPS, sides,
                               units_residual=rows)
        set_raw_vector(run.params, run.learn, theta)
        return J

    @torch.no_grad()
    def _latent_blocks(self, run, theta, r0) -> torch.Tensor:
        """B [N, M, L] of all windows: the blocks computed within the last
        ``latent_jacobian_reuse`` iterations are reused (the latent Jacobian changes slowly,
        and is ~90 % of an iteration's rollouts), new windows' and the oldest share are
        computed, so the cost is spread evenly over iterations."""
        N = self.windows.shape[0]
        reuse = self.config.latent_jacobian_reuse
        if not blocks_cached(self.latent_jac, self.jac_age, N, r0.shape[-1]):
            self.latent_jac = r0.new_zeros((N, r0.shape[-1], len(self.latent_cols)))
            self.jac_age = torch.full((N,), reuse, dtype=torch.long)
        stale = self.jac_age >= reuse
        due = int(stale.sum())
        quota = max(due, -(-N // reuse)) if reuse > 1 else N
        pick = torch.argsort(self.jac_age, descending=True, stable=True)[:quota].to(r0.device)
        residual = lambda w, v: self._residual(run, theta, w, v)            # noqa: E731
        self.latent_jac[pick] = latent_jacobian(residual, self.windows[pick], self.window_vel[pick], r0[pick],
                                                self.latent_cols, N, step=LATENT_STEP)
        self.jac_age[pick.cpu()] = 0
        self.jac_age += 1
        return self.latent_jac

    def epoch(self, run) -> dict:
        """One joint Levenberg-Marquardt iteration on the parameters and the windows' latent
        velocities; the latent blocks are eliminated per window (Schur complement)."""
        cfg = self.config
        if self.windows is None:
            self.setup(run)
        windows, vel = self.windows, self.window_vel
        theta0 = raw_vector(run.params, run.learn)
        r0 = self._residual(run, theta0, windows, vel)
        f0 = float((r0 ** 2).sum())
        diverged, accepted, f, step = not math.isfinite(f0), False, f0, math.inf
        if not diverged:
            B = self._latent_blocks(run, theta0, r0)
            normal = latent_normal(B)
            vel, r0 = self._polish_latents(run, theta0, normal, vel, r0)
            if cfg.latent_restart_every:
                vel, r0, restarted = restart_latents(run.objective, run.train, windows, vel, r0,
                                                     run.engine.param_values(run.dtype, run.device),
                                                     cfg.latent_restart_every, run.epoch)
                self.jac_age[restarted.cpu()] = cfg.latent_jacobian_reuse      # their blocks: due
            self.window_vel = vel
            f0 = float((r0 ** 2).sum())
            A = self._param_jacobian(run, theta0, windows, vel, r0)
            ok = bool(torch.isfinite(A).all() and torch.isfinite(B).all())
            At, (Bt, BtB, dB) = A.transpose(1, 2), normal
            AtA, AtB = At @ A, At @ B
            Atr, Btr = (At @ r0[..., None])[..., 0], Bt @ r0[..., None]
            dA = AtA.sum(0).diagonal()
            dA = torch.maximum(dA, 1e-12 * dA.max())
            BtB = BtB + 1e-9 * torch.diag_embed(dB)
            for _ in range(10 if ok else 0):
                try:
                    Binv = torch.linalg.inv(BtB + self.lm_lambda * torch.diag_embed(dB))
                    schur = (AtA - AtB @ Binv @ AtB.transpose(1, 2)).sum(0) + self.lm_lambda * torch.diag(dA)
                    g = Atr.sum(0) - (AtB @ Binv @ Btr)[..., 0].sum(0)
                    delta = boxed_step(schur, g, theta0, cfg.max_raw)
                except RuntimeError:
                    delta = torch.full_like(theta0, math.nan)
                if bool(torch.isfinite(delta).all()):
                    d_lat = -(Binv @ (Btr + AtB.transpose(1, 2) @ delta.to(AtB.dtype)[None, :, None]))[..., 0]
                    vel_new = vel.flatten(1).clone()
                    vel_new[:, self.latent_cols] += d_lat
                    vel_new = vel_new.reshape(vel.shape)
                    theta = theta0 + delta
                    vel_new, r_new = self._trial_latents(run, theta, normal, vel, vel_new)
                    f = float((r_new ** 2).sum())
                    if math.isfinite(f) and f < f0:
                        accepted = True
                        step = float(delta.abs().max())
                        self.settled.add(theta)
                        self.window_vel = vel_new
                        self.lm_lambda = max(self.lm_lambda / 3.0, 1e-12)
                        break
                self.lm_lambda = min(self.lm_lambda * 4.0, 1e12)
            if not accepted:
                f = f0
                set_raw_vector(run.params, run.learn, theta0)
        settled = (self.settled.span(self.config.lm_patience, lambda: raw_sigmas(reduced_information(A, B, r0)))
                   if accepted else math.inf)       # the values' path in their sigma at the iteration's start
        # settled as the trainer reads it (under heavy damping a short path is the trust region)
        if cfg.lm_settle_sigmas > 0 and settled <= cfg.lm_settle_sigmas and self.lm_lambda <= LM_FREE_LAMBDA:
            refit = lambda p, v: fit_start_velocities(run.objective, run.train, windows, p, REFIT_ITERATIONS, start=v)  # noqa: E731
            dropped = drop_speed_limit(run, windows, self.window_vel, refit)
            if dropped is not None:          # neither settled nor converged: a better basin, a new path
                (f, self.window_vel), settled, step = dropped, math.inf, math.inf
                self.latent_jac, self.lm_lambda = None, 1e-3
                self.settled.clear()
        val = f if math.isfinite(f) else math.inf
        return {"loss": f, "val_loss": val, "tuples": len(windows), "diverged": diverged,
                "lm_lambda": self.lm_lambda, "lm_accepted": accepted, "step": step, "settled_sigmas": settled}

    @torch.no_grad()
    def _trial_latents(self, run, theta, normal, vel_old, vel_joint):
        """The latents a trial parameter step is judged with: per window the better of the
        joint step's latents and the current ones, then polished (`_polish_latents`). So
        the step is judged on the objective with the latents (nearly) minimised, as the
        Schur-reduced model predicts it, not on a few windows whose latent step from a
        reused Jacobian overshot (measured: the twin on the floor rejected every step of
        2e-4 in raw units, the actual loss rising where the model predicted a 12 % fall)."""
        r_joint = self._residual(run, theta, self.windows, vel_joint)
        r_old = self._residual(run, theta, self.windows, vel_old)
        f_joint, f_old = (r_joint ** 2).sum(-1), (r_old ** 2).sum(-1)
        take = torch.isfinite(f_joint) & ~(f_joint > f_old)
        vel = torch.where(take[:, None, None], vel_joint, vel_old)
        r = torch.where(take[:, None], r_joint, r_old)
        return self._polish_latents(run, theta, normal, vel, r, sweeps=1)

    @torch.no_grad()
    def _polish_latents(self, run, theta, normal, vel, r0, sweeps: int = LATENT_SWEEPS):
        """Gauss-Newton on each window's latent velocities alone, the parameters fixed, with
        the cached latent blocks (``normal``: `latent_normal`); a window keeps its step only if its own residual falls.
        The joint step accepts or rejects all windows at once, so on contact data (where a
        few windows' residuals are rough in their latents) its damping grows until no window
        moves: the latents then stay far from their optimum and the parameters compensate
        (measured: a SUPERball twin on the floor, its latents re-fitted with the parameters
        fixed, dropped the objective 0.67 -> 0.21). One batched rollout per sweep."""
        f0 = (r0 ** 2).sum(-1)
        mu = torch.full_like(f0, 1e-3)
        residual = lambda w, v: self._residual(run, theta, w, v)              # noqa: E731
        for _ in range(sweeps):
            try:
                vel, r0, f0, better = latent_step(residual, self.windows, vel, r0, f0, self.latent_cols, normal, mu)
            except RuntimeError:
                break
            mu = torch.where(better, mu / 3.0, mu * 10.0).clamp(1e-9, 1e9)
        return vel, r0

    @torch.no_grad()
    def information_at(self, run, theta: torch.Tensor, refit: bool = False) -> Optional[dict]:
        """What the uncertainty needs at the raw values ``theta``, the latents eliminated
        (`reduced_information`), from fresh blocks: every window's latents polished at
        ``theta`` (with `polish_blocks`; ``refit``: fitted from scratch,
        `fit_start_velocities`, for latents that are still the finite-difference estimates)
        and its latent block recomputed there (an iteration's cached blocks may be
        ``latent_jacobian_reuse`` iterations old). The
        solver's state (latents, cached blocks, damping) and the parameters are left as they
        were; the latents used are returned (``vel``). None without windows, or where a
        residual or Jacobian is not finite."""
        if self.windows is None or self.window_vel is None:
            return None
        before = raw_vector(run.params, run.learn)
        windows, vel, N = self.windows, self.window_vel, self.windows.shape[0]
        residual = lambda w, v: self._residual(run, theta, w, v)               # noqa: E731
        try:
            if refit:       # Gauss-Newton with a fresh block every iteration: no polish needed
                set_raw_vector(run.params, run.learn, theta)
                vel = fit_start_velocities(run.objective, run.train, windows,
                                           run.engine.param_values(run.dtype, run.device),
                                           chain=run.config.chain_latents)
                r0 = residual(windows, vel)
            else:
                r0 = residual(windows, vel)
                B = polish_blocks(residual, windows, vel, r0, self.latent_cols, self.latent_jac, self.jac_age,
                                  self.config.latent_jacobian_reuse)
                vel, r0 = self._polish_latents(run, theta, latent_normal(B), vel, r0)
            B = latent_jacobian(residual, windows, vel, r0, self.latent_cols, N)
            A = self._param_jacobian(run, theta, windows, vel, r0, one_sided=True)
            if not bool(torch.isfinite(A).all() and torch.isfinite(B).all() and torch.isfinite(r0).all()):
                return None
            return {"theta": theta.clone(), "vel": vel, **reduced_information(A, B, r0)}
        finally:
            set_raw_vector(run.params, run.learn, before)

    def load(self, run, windows: Optional[torch.Tensor], window_vel: Optional[torch.Tensor],
             latent_jac: Optional[torch.Tensor] = None, jac_age: Optional[torch.Tensor] = None,
             drawn_from: Optional[int] = None) -> bool:
        """Resume saved windows (and the cached latent Jacobians: a resumed run takes the
        same steps) if they index the current data; True if they did."""
        if windows is not None and run.latent and int(windows.max()) < len(run.train):
            self.windows, self.window_vel = windows.to(run.device), window_vel.to(run.device)
            same = latent_jac is not None and jac_age is not None and latent_jac.shape[0] == windows.shape[0]
            self.latent_jac = latent_jac.to(run.device) if same else None
            self.jac_age = jac_age.cpu().long() if same else None
            self._set_latent_cols(run)
            self.drawn_from = len(run.train) if drawn_from is None else int(drawn_from)
            return True
        return False


def inherit_windows(lm: WindowLevenbergMarquardt, run, donor: Optional[WindowLevenbergMarquardt],
                    donor_data) -> bool:
    """Give ``lm`` (``run``'s windowed solver, without windows) the windows and fitted latents
    of ``donor``, another model's windowed solver on the same stream (``donor_data``: its
    training data), where it has them: those of its windows that lie within ``run``'s data
    and start at the same poses there, if the width is ``lm``'s (the rods' velocities they
    hold are the robot's, whatever the model; a donor that has grown past ``run``'s data
    since gives the windows within it). When they were drawn is kept, so they are drawn
    again on the same growth (`WindowLevenbergMarquardt.refresh`). True if any were taken."""
    if lm.windows is not None or donor is None or donor.windows is None or donor.window_vel is None \
            or donor_data is None or getattr(run, "train", None) is None \
            or donor.windows.shape[1] != lm.config.pose_window:
        return False
    inside = torch.nonzero((donor.windows < min(len(run.train), len(donor_data))).all(1)).flatten()
    starts = donor.windows[inside, 0]
    same = (run.train.x0[starts] == donor_data.x0[starts]).reshape(len(starts), -1).all(1)
    keep = inside[same]
    if not len(keep):
        return False
    return lm.load(run, donor.windows[keep].clone(), donor.window_vel[keep].clone(),
                   drawn_from=min(donor.drawn_from, len(run.train)))
