"""State layout shared by the engine, the MuJoCo twin, datasets and the ROS nodes.

A rod state is 13 numbers, stored as ``[..., R, 13]``:

====  =========  ===========================================================
0:3   p          centre-of-mass position, world frame (m)
3:7   q          unit quaternion (w, x, y, z), body -> world; body z = rod axis
7:10  v          linear velocity of the centre, world frame (m/s)
10:13 w          angular velocity, world frame (rad/s)
====  =========  ===========================================================

The paper's 72-dimensional view of the 6-bar robot is, per rod, ``(p, v, axis, w)``
(12 numbers): the axis replaces the quaternion because a symmetric rod's spin about its
own axis is not observable from end points.  Functions here work on numpy arrays and on
torch tensors alike (they only use operators and ``stack``/``cat`` helpers chosen by type).
"""
from __future__ import annotations

import numpy as np
import torch

POS = slice(0, 3)
QUAT = slice(3, 7)
LIN_VEL = slice(7, 10)
ANG_VEL = slice(10, 13)
STATE_DIM = 13
PAPER_DIM_PER_ROD = 12


def _lib(x):
    return torch if isinstance(x, torch.Tensor) else np


def _stack(xs, axis):
    return torch.stack(xs, dim=axis) if isinstance(xs[0], torch.Tensor) else np.stack(xs, axis=axis)


def _cat(xs, axis):
    return torch.cat(xs, dim=axis) if isinstance(xs[0], torch.Tensor) else np.concatenate(xs, axis=axis)


def quat_multiply(a, b):
    """Hamilton product a * b, (w, x, y, z) on the last axis."""
    aw, ax, ay, az = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    bw, bx, by, bz = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return _stack([
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ], -1)


def quat_to_matrix(q):
    """Rotation matrix [..., 3, 3] of a unit quaternion [..., 4] (w, x, y, z)."""
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    rows = [
        _stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        _stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        _stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ]
    return _stack(rows, -2)


def quat_axis(q):
    """World direction of the body z axis (the rod axis): third column of R(q)."""
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    return _stack([2 * (x * z + w * y), 2 * (y * z - w * x), 1 - 2 * (x * x + y * y)], -1)


def quat_rotate(q, v):
    """Rotate vectors v [..., 3] by unit quaternions q [..., 4]."""
    qv = q[..., 1:4]
    lib = _lib(q)
    t = 2.0 * (lib.cross(qv, v, axis=-1) if lib is np else torch.linalg.cross(qv, v, dim=-1))
    cross_t = np.cross(qv, t, axis=-1) if lib is np else torch.linalg.cross(qv, t, dim=-1)
    return v + q[..., 0:1] * t + cross_t


def quat_conjugate(q):
    return _cat([q[..., 0:1], -q[..., 1:4]], -1)


def quat_from_rotvec(r: torch.Tensor) -> torch.Tensor:
    """Unit quaternion [..., 4] (w, x, y, z) of rotation vectors r [..., 3] (torch, smooth at 0)."""
    half = 0.5 * torch.sqrt((r * r).sum(-1, keepdim=True) + 1e-30)
    return torch.cat([torch.cos(half), r * 0.5 * torch.sinc(half / np.pi)], -1)


def quat_log_world(q_from: np.ndarray, q_to: np.ndarray) -> np.ndarray:
    """World-frame rotation vector [..., 3] of q_to * conj(q_from) [..., 4], the shorter way
    round (numpy): divided by the time between them, the angular velocity that turns one
    into the other."""
    w1, v1 = q_from[..., 0], q_from[..., 1:]
    w2, v2 = q_to[..., 0], q_to[..., 1:]
    dw = w2 * w1 + (v2 * v1).sum(-1)
    dv = -w2[..., None] * v1 + w1[..., None] * v2 - np.cross(v2, v1)
    sign = np.where(dw < 0, -1.0, 1.0)
    dw, dv = dw * sign, dv * sign[..., None]
    n = np.linalg.norm(dv, axis=-1)
    angle = 2.0 * np.arctan2(n, dw)
    scale = np.where(n > 1e-12, angle / np.maximum(n, 1e-300), 2.0)
    return dv * scale[..., None]


def central_rotation(q_before: np.ndarray, q_at: np.ndarray, q_after: np.ndarray) -> np.ndarray:
    """World-frame rotation vector [..., 3] from ``q_before`` through ``q_at`` to ``q_after``:
    the sum of the two shorter rotations, so a central difference (divided by the time from
    before to after) resolves a spin up to pi over the larger sample interval, not pi over
    the two together (10 Hz poses of a rod rolling on the floor: spins of 20-150 rad/s about
    its axis, which the direct rotation from before to after aliased beyond 15.7 rad/s)."""
    return quat_log_world(q_before, q_at) + quat_log_world(q_at, q_after)


def quat_from_z_to(axis: np.ndarray) -> np.ndarray:
    """Minimal rotation (numpy) taking the body z axis onto unit vectors ``axis`` [..., 3]."""
    axis = np.asarray(axis, dtype=np.float64)
    axis = axis / np.linalg.norm(axis, axis=-1, keepdims=True)
    z = np.broadcast_to(np.array([0.0, 0.0, 1.0]), axis.shape)
    cross = np.cross(z, axis)
    dot = np.sum(z * axis, axis=-1, keepdims=True)
    q = np.concatenate([1.0 + dot, cross], axis=-1)
    # Antiparallel: rotate by pi about x.
    anti = (1.0 + dot[..., 0]) < 1e-9
    q[anti] = np.array([0.0, 1.0, 0.0, 0.0])
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def canonical_quat(q):
    """Sign-fixed quaternion (w >= 0): q and -q are the same rotation."""
    sign = (q[..., 0:1] >= 0) * 2.0 - 1.0
    return q * sign


def initial_rod_state(robot) -> np.ndarray:
    """[R, 13] float64 state of the robot at its config pose, at rest."""
    ends = robot.rod_end_nodes
    state = np.zeros((robot.num_rods, STATE_DIM))
    state[:, POS] = ends.mean(axis=1)
    state[:, QUAT] = quat_from_z_to(ends[:, 1] - ends[:, 0])
    return state


def end_nodes(state, half_length):
    """End-node positions [..., R, 2, 3] of rods; half_length broadcasts against [R]."""
    axis = quat_axis(state[..., QUAT])
    offset = axis * half_length[..., None]
    centre = state[..., POS]
    return _stack([centre - offset, centre + offset], -2)


def to_paper_view(state):
    """[..., R, 13] -> [..., R * 12] the paper's (p, v, axis, w) per rod."""
    per_rod = _cat([state[..., POS], state[..., LIN_VEL], quat_axis(state[..., QUAT]),
                    state[..., ANG_VEL]], -1)
    return per_rod.reshape(*per_rod.shape[:-2], per_rod.shape[-2] * PAPER_DIM_PER_ROD)


def from_paper_view(view, num_rods: int):
    """Inverse of `to_paper_view` up to spin about the rod axis (chosen minimal)."""
    per_rod = view.reshape(*view.shape[:-1], num_rods, PAPER_DIM_PER_ROD)
    p, v, axis, w = per_rod[..., 0:3], per_rod[..., 3:6], per_rod[..., 6:9], per_rod[..., 9:12]
    if isinstance(view, torch.Tensor):
        q = torch.as_tensor(quat_from_z_to(axis.detach().cpu().numpy()), dtype=view.dtype,
                            device=view.device)
    else:
        q = quat_from_z_to(axis)
    return _cat([p, q, v, w], -1)


def center_of_mass(state, mass):
    """Robot CoM [..., 3] from rod states and rod masses [R]."""
    weights = mass / mass.sum()
    return (state[..., POS] * weights[..., :, None]).sum(-2)


def rod_pose_errors(est_nodes, true_nodes):
    """Per rod, from end nodes [..., R, 2, 3] (ends in order, numpy): centre error (m), its
    part along the true axis (m) and the angle between the axes (deg)."""
    gap = est_nodes.mean(-2) - true_nodes.mean(-2)
    a, b = est_nodes[..., 1, :] - est_nodes[..., 0, :], true_nodes[..., 1, :] - true_nodes[..., 0, :]
    b_unit = b / np.linalg.norm(b, axis=-1, keepdims=True)
    cos = (a * b_unit).sum(-1) / np.linalg.norm(a, axis=-1)
    return (np.linalg.norm(gap, axis=-1), np.abs((gap * b_unit).sum(-1)),
            np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))))
