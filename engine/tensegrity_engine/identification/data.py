"""Training data on the device: a `TupleSet` as tensors, with finite-difference velocity
estimates (and the per-tuple latents of the Adam formulation) when the data has poses only."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.identification.dataset import Trajectory, TupleSet, to_tuples
from tensegrity_engine.physics.params import SPEC_BY_NAME
from tensegrity_engine.physics.state import ANG_VEL, POS, QUAT, central_rotation


def as_tuple_set(data, period: float, dt: float) -> Optional[TupleSet]:
    """One TupleSet from a Trajectory / TupleSet or a list of them (None stays None)."""
    if data is None:
        return None
    if isinstance(data, (TupleSet, Trajectory)):
        data = [data]
    sets = [d if isinstance(d, TupleSet) else to_tuples(d, period, dt) for d in data]
    return TupleSet.concat(sets) if sets else None


def finite_difference_velocity(x0: np.ndarray, x1: np.ndarray, prev: np.ndarray, T: float) -> np.ndarray:
    """[N, R, 6] central (or forward) differences of tuple poses: velocity estimates at x0."""
    before = np.where((prev >= 0)[:, None, None], x0[np.clip(prev, 0, None)], x0)
    span = np.where(prev >= 0, 2.0 * T, T)[:, None, None]
    v = (x1[..., POS] - before[..., POS]) / span
    # through x0: a spin up to pi / T resolves, not pi / 2T (`central_rotation`)
    return np.concatenate([v, central_rotation(before[..., QUAT], x0[..., QUAT], x1[..., QUAT]) / span], -1)


def piece_depths(prev: np.ndarray) -> np.ndarray:
    """How many trajectories each one continues, back to its record's first (``prev`` < index)."""
    depth = np.zeros(len(prev), dtype=np.int64)
    for j in np.flatnonzero(prev >= 0):
        depth[j] = depth[prev[j]] + 1
    return depth


def _padded_grids(ts: TupleSet) -> tuple[np.ndarray, int]:
    """([traj, pad + K + pad, S, A], pad): every trajectory's command grid in chunks of an
    interval, padded to the longest (K), between ``pad`` chunks of the record before it (the
    trajectories it continues; else its own first command held) and ``pad`` after it (the
    ones continuing it; else its own last held), enough for the longest command delay
    (`physics.params`' bound on ``actuator_delay``) to shift commands across the cuts."""
    S, A = ts.steps, ts.commands.shape[-1]
    reach = max(abs(SPEC_BY_NAME["actuator_delay"].lower), abs(SPEC_BY_NAME["actuator_delay"].upper))
    pad = max(1, int(math.ceil(reach / ts.period - 1e-9)))
    chunks = [len(c) // S for c in ts.traj_commands]
    K = max(chunks)
    following = -np.ones(len(chunks), dtype=np.int64)
    linked = np.flatnonzero(ts.traj_prev >= 0)
    following[ts.traj_prev[linked]] = linked
    grid = np.empty((len(chunks), pad + K + pad, S, A))
    for j, c in enumerate(ts.traj_commands):
        k = chunks[j]
        grid[j, pad:pad + k] = c[:k * S].reshape(k, S, A)
        lead, p = [], ts.traj_prev[j]
        while len(lead) < pad and p >= 0:
            lead = list(ts.traj_commands[p][:chunks[p] * S].reshape(chunks[p], S, A)) + lead
            p = ts.traj_prev[p]
        lead = lead[-pad:]
        grid[j, :pad - len(lead)] = (lead[0] if lead else c[:S])[0]
        if lead:
            grid[j, pad - len(lead):pad] = np.stack(lead)
        trail, q = [], following[j]
        while len(trail) < pad and q >= 0:
            trail += list(ts.traj_commands[q][:chunks[q] * S].reshape(chunks[q], S, A))
            q = following[q]
        trail = trail[:pad]
        if trail:
            grid[j, pad + k:pad + k + len(trail)] = np.stack(trail)
        grid[j, pad + k + len(trail):] = (trail[-1] if trail else c[:k * S])[-1]
    return grid, pad


class TrainingData:
    """A TupleSet as device tensors plus what the loss needs."""

    def __init__(self, ts: TupleSet, dtype, device, latent: bool, gyro: bool = True):
        f = lambda a: torch.as_tensor(np.asarray(a), dtype=dtype, device=device)
        self.ts = ts
        self.x0, self.x1 = f(ts.x0), f(ts.x1)
        self.commands = f(ts.commands)
        self.wrenches = None if ts.wrenches is None else f(ts.wrenches)
        self.next = torch.as_tensor(ts.next, device=device)
        S = ts.steps
        grid, self.pad = _padded_grids(ts)
        self.cmd_grid_wide = f(grid)
        self.cmd_grid = self.cmd_grid_wide[:, self.pad:-self.pad]
        self.traj_act0 = f(np.stack(ts.traj_act0))
        self.traj_prev = torch.as_tensor(ts.traj_prev, device=device)
        self.traj_chunks = torch.as_tensor([len(c) // S for c in ts.traj_commands], device=device)
        self.piece_depth = piece_depths(ts.traj_prev)
        self.traj = torch.as_tensor(ts.traj, device=device)
        self.chunk = torch.as_tensor(ts.start_step // S, device=device)
        self.latent = None
        # [N, R] bool, where a gyro measured x0's / x1's angular velocity (None: nowhere, or
        # ``gyro`` off): pose-only windows fit them too (`objective.window_residual`)
        self.gyro0 = self.gyro1 = None
        if gyro and ts.has_gyro:
            self.gyro0, self.gyro1 = (torch.as_tensor(g, device=device) for g in ts.gyro_masks())
        # [N, C, 2] measured cable states at x0 / x1 (rest length, tension; 0 where none) and
        # where they were measured (None: nowhere; `identification.cable_rows`)
        self.cables0 = self.cables1 = self.cables_seen0 = self.cables_seen1 = None
        if ts.has_cable_states:
            c0, c1 = ts.cable_states()
            # x1 is the next tuple's x0, whose reading a stream has where it came after the
            # pose that closed this tuple (as a gyro's, below)
            has_next = (ts.next >= 0)[:, None, None]
            c1 = np.where(np.isfinite(c1) | ~has_next, c1, c0[np.clip(ts.next, 0, None)])
            self.cables_seen0, self.cables_seen1 = (torch.as_tensor(np.isfinite(c), device=device) for c in (c0, c1))
            self.cables0, self.cables1 = (f(np.where(np.isfinite(c), c, 0.0)) for c in (c0, c1))
        if latent:
            # Velocity estimates by finite differences: x0 central (forward at a chain start),
            # x1 the next tuple's estimate (backward difference at a chain end). They stand in
            # for measured velocities in the coarse stage and initialise the latents. A gyro's
            # angular velocity replaces the difference's: 10 Hz poses miss the spin about a
            # rod's axis that friction changes within 0.1 s (measured, the SUPERball twin
            # rolling: 0.48 rad/s off on average; 5.1 when the differences aliased it).
            v0 = finite_difference_velocity(ts.x0, ts.x1, ts.prev, ts.period)
            v_back = finite_difference_velocity(ts.x0, ts.x1, -np.ones(len(ts), dtype=np.int64), ts.period)
            v1 = np.where((ts.next >= 0)[:, None, None], v0[np.clip(ts.next, 0, None)], v_back)
            if self.gyro0 is not None:
                g0, g1 = ts.gyro_masks()
                v0[..., 3:] = np.where(g0[..., None], ts.x0[..., ANG_VEL], v0[..., 3:])
                v1[..., 3:] = np.where(g1[..., None], ts.x1[..., ANG_VEL], v1[..., 3:])
                # x1 is the next tuple's x0, whose gyro rate a stream has (its IMU arrives
                # after the pose that ends this tuple)
                has_next = ts.next >= 0
                g1 = g1 | (has_next[:, None] & g0[np.clip(ts.next, 0, None)])
                v1 = np.where(has_next[:, None, None], v0[np.clip(ts.next, 0, None)], v1)
                self.gyro1 = torch.as_tensor(g1, device=device)
            self.x0 = torch.cat([self.x0[..., :7], f(v0)], -1)
            self.x1 = torch.cat([self.x1[..., :7], f(v1)], -1)
            self.latent = torch.nn.Parameter(f(v0))

    def __len__(self):
        return len(self.ts)

    def run_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """([N] command run, [N] interval within it) of every tuple: a run is a record's
        trajectories that continue one another (``traj_prev``), so it goes on across a
        dropped pose whose interval's commands are known (`streaming.to_tuple_set`)."""
        prev = np.asarray(self.ts.traj_prev)
        chunks = self.traj_chunks.cpu().numpy()
        root, offset = np.arange(len(prev)), np.zeros(len(prev), dtype=np.int64)
        for j in np.flatnonzero(prev >= 0):          # a piece continues an earlier one
            root[j], offset[j] = root[prev[j]], offset[prev[j]] + chunks[prev[j]]
        traj = np.asarray(self.ts.traj)
        return root[traj], offset[traj] + np.asarray(self.ts.start_step) // self.ts.steps

    def interval_cells(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([N, W] trajectory, [N, W] chunk) of ``cmd_grid`` holding each interval of
        ``windows`` (tuple indices; -1: an interval without a tuple, a dropped pose's), walked
        along the run from each window's first tuple."""
        succ = torch.full_like(self.traj_prev, -1)
        linked = torch.nonzero(self.traj_prev >= 0).reshape(-1)
        succ[self.traj_prev[linked]] = linked
        traj, chunk = [self.traj[windows[:, 0]]], [self.chunk[windows[:, 0]]]
        for _ in range(1, windows.shape[1]):
            t, c = traj[-1], chunk[-1] + 1
            over = c >= self.traj_chunks[t]
            traj.append(torch.where(over, succ[t], t))
            chunk.append(torch.where(over, torch.zeros_like(c), c))
        traj, chunk = torch.stack(traj, 1), torch.stack(chunk, 1)
        here = windows >= 0
        if bool((traj < 0).any()) or not (torch.equal(traj[here], self.traj[windows[here]])
                                          and torch.equal(chunk[here], self.chunk[windows[here]])):
            raise ValueError("a window's tuples are not consecutive intervals of one command run")
        return traj, chunk

