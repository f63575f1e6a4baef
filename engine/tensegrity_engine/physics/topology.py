"""Constant matrices and index tables of one robot topology, cached per dtype and device.

Rods are axisymmetric (capsules), so with axis a the world inertia is
I_t (1 - a a^T) + I_a a a^T and no rotation matrix is needed. End-node kinematics are
linear in Y = [p; a] (2R x 3): node = N Y, cable vector = W Y; by virtual work the
generalised forces of cable forces f are -W^T f, of node forces N^T f, and a generalised
force Q_a on the axis is the torque a x Q_a. Small constant matmuls replace per-node
gathers and scatters: that is where the engine's speed comes from.
"""
from __future__ import annotations

import numpy as np
import torch

from tensegrity_engine.physics import collision
from tensegrity_engine.physics.config import RobotConfig

# Rod axis (body z in world) as a quadratic form of the unit quaternion (w, x, y, z):
# axis = (2(xz + wy), 2(yz - wx), w^2 - x^2 - y^2 + z^2) = (q q^T) : M_k.
_AXIS_FORM = np.zeros((4, 4, 3))
_AXIS_FORM[1, 3, 0] = _AXIS_FORM[3, 1, 0] = _AXIS_FORM[0, 2, 0] = _AXIS_FORM[2, 0, 0] = 1.0
_AXIS_FORM[2, 3, 1] = _AXIS_FORM[3, 2, 1] = 1.0
_AXIS_FORM[0, 1, 1] = _AXIS_FORM[1, 0, 1] = -1.0
_AXIS_FORM[[0, 1, 2, 3], [0, 1, 2, 3], 2] = [1.0, -1.0, -1.0, 1.0]


class Topology:
    """What the engine needs of a `RobotConfig`, as numpy constants built once.

    ``fixed_rods``: indices of rods welded in place (kept sorted; zero entries of ``free``).
    Rod-rod pairs exist only when the config enables rod-rod contact.
    """

    def __init__(self, robot: RobotConfig, fixed_rods=()):
        self.robot = robot
        self.fixed_rods = tuple(sorted(int(i) for i in fixed_rods))
        for i in self.fixed_rods:
            if not 0 <= i < robot.num_rods:
                raise ValueError(f"fixed rod index {i} out of range")
        R, C = robot.num_rods, robot.num_cables
        half = robot.rod_length / 2.0
        # per unit mass, uniform rods: the inertia factor is a parameter (p["rod_inertia_factor"])
        inertia = robot.uniform_rod_inertia() / robot.rod_mass[:, None]
        if not np.allclose(inertia[:, 0], inertia[:, 1]):
            raise ValueError("rods must be axisymmetric (equal transverse inertia)")
        nodes = robot.cable_node_index
        rod_of = nodes // 2
        sign_of = (nodes % 2) * 2.0 - 1.0                   # end 0 -> -1, end 1 -> +1
        W = np.zeros((C, 2 * R))                            # cable vector x_b - x_a = W Y
        cidx = np.arange(C)
        np.add.at(W, (cidx, rod_of[:, 1]), 1.0)
        np.add.at(W, (cidx, rod_of[:, 0]), -1.0)
        np.add.at(W, (cidx, R + rod_of[:, 1]), sign_of[:, 1] * half[rod_of[:, 1]])
        np.add.at(W, (cidx, R + rod_of[:, 0]), -sign_of[:, 0] * half[rod_of[:, 0]])
        N = np.zeros((2 * R, 2 * R))                        # end nodes 2r + e = N Y
        N[np.arange(2 * R), np.repeat(np.arange(R), 2)] = 1.0
        N[np.arange(2 * R), R + np.repeat(np.arange(R), 2)] = np.tile([-1.0, 1.0], R) * np.repeat(half, 2)
        act_idx = robot.actuated_indices
        passive_idx = np.flatnonzero(~robot.cable_actuated)
        free = np.ones(R)
        free[list(self.fixed_rods)] = 0.0
        pairs = (collision.all_pairs(R).numpy() if (robot.contact.rod_rod and R > 1)
                 else np.zeros((0, 2), dtype=np.int64))
        onehot_a = np.zeros((R, len(pairs)))
        onehot_b = np.zeros((R, len(pairs)))
        onehot_a[pairs[:, 0], np.arange(len(pairs))] = 1.0
        onehot_b[pairs[:, 1], np.arange(len(pairs))] = 1.0
        self.numpy_constants = {
            "half": half, "radius": robot.rod_radius, "node_radius": np.repeat(robot.rod_radius, 2),
            "inv_it": 1.0 / inertia[:, 0], "inv_ia": 1.0 / inertia[:, 2],
            "it": inertia[:, 0], "ia": inertia[:, 2],
            "gravity": robot.gravity, "W": W, "Wt": W.T.copy(), "N": N, "Nt": N.T.copy(),
            "axis_form": _AXIS_FORM.reshape(16, 3), "passive_rest": robot.cable_rest_length[passive_idx],
            "command_low": robot.command_low, "command_high": robot.command_high,
            "free": free, "pair_onehot_a": onehot_a, "pair_onehot_b": onehot_b,
            "ez": np.array([0.0, 0.0, 1.0]),
            # per-node compliance 1/m_eff * m = 1 + (L/2)^2 m / I_t + r^2 m / I_a; the I_t part is
            # divided by the rod inertia factor at run time
            "node_compliance_axial": np.repeat(1.0 + robot.rod_radius ** 2 / inertia[:, 2], 2),
            "node_compliance_transverse": np.repeat(half ** 2 / inertia[:, 0], 2),
        }
        lever = np.stack([sign_of[:, 0] * half[rod_of[:, 0]], sign_of[:, 1] * half[rod_of[:, 1]]], -1)
        self.numpy_constants.update({
            "gravity_col": robot.gravity[:, None],
            "pair_diff_T": (onehot_a - onehot_b).T.copy(),
            "pair_onehot_a_T": onehot_a.T.copy(), "pair_onehot_b_T": onehot_b.T.copy(),
            "pair_radius_a": robot.rod_radius[pairs[:, 0]], "pair_radius_b": robot.rod_radius[pairs[:, 1]],
            "cable_lever_a": lever[:, 0], "cable_lever_b": lever[:, 1],
        })
        self.index_constants = {
            "pair_a_node0": 2 * pairs[:, 0], "pair_a_node1": 2 * pairs[:, 0] + 1,
            "pair_b_node0": 2 * pairs[:, 1], "pair_b_node1": 2 * pairs[:, 1] + 1,
            "rest_gather": np.argsort(np.concatenate([act_idx, passive_idx])),
            "pair_a": pairs[:, 0], "pair_b": pairs[:, 1],
            "cable_rod_a": rod_of[:, 0], "cable_rod_b": rod_of[:, 1],
            "cable_node_a": nodes[:, 0], "cable_node_b": nodes[:, 1],
        }
        self.num_pairs = len(pairs)
        # Cables per node (ANI's stability bound).
        self.node_cable_count = np.zeros((2 * R, C))
        np.add.at(self.node_cable_count, (nodes[:, 0], cidx), 1.0)
        np.add.at(self.node_cable_count, (nodes[:, 1], cidx), 1.0)
        self._cache: dict = {}

    @property
    def num_rods(self) -> int:
        return self.robot.num_rods

    def constants(self, dtype: torch.dtype, device) -> dict:
        """Topology constants as tensors of this dtype/device (cached: no per-step copies)."""
        key = (dtype, torch.device(device))
        if key not in self._cache:
            c = {k: torch.as_tensor(v, dtype=dtype, device=device) for k, v in self.numpy_constants.items()}
            c.update({k: torch.as_tensor(v, dtype=torch.long, device=device)
                      for k, v in self.index_constants.items()})
            self._cache[key] = c
        return self._cache[key]
