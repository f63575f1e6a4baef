"""Rigid-rod dynamics (RAG): Newton-Euler accelerations and the exact-exponential advance.

Everything works on the components-first state S [..., 13, R]; fixed rods get zero
accelerations and velocities.
"""
from __future__ import annotations

import math

import torch

from tensegrity_engine.physics.topology import Topology
from tensegrity_engine.physics.vectors import cross, dot, outer


class RigidRods:
    """Newton-Euler and kinematic update of the axisymmetric rods of one topology."""

    def __init__(self, topology: Topology):
        self.topology = topology

    def accelerations(self, S, out):
        """Newton-Euler for axisymmetric rods: a = F/m, alpha = I_w^-1 (tau - w x I_w w).

        With axis a: I_w w = I_t w + (I_a - I_t) a (a.w), so the gyroscopic torque is
        (I_a - I_t)(a.w)(w x a) and I_w^-1 t = t / I_t + (1/I_a - 1/I_t) a (a.t).
        """
        k = self.topology.constants(S.dtype, S.device)
        axis, mass = out["axis"], out["mass"]
        w = S[..., 10:13, :]
        it, ia = mass * k["it"] * out["inertia_factor"], mass * k["ia"]
        gyro = ((ia - it) * dot(axis, w)).unsqueeze(-2) * out["axis_rate"]
        tau = out["torque"] - gyro
        inv_t, inv_a = 1.0 / it, 1.0 / ia
        alpha = tau * inv_t + ((inv_a - inv_t) * dot(axis, tau)).unsqueeze(-2) * axis
        acc = out["force"] / mass
        if self.topology.fixed_rods:
            acc, alpha = acc * k["free"], alpha * k["free"]
        return acc, alpha

    def world_inertia(self, S, out):
        """(I_w [..., R, 3, 3] the world-frame inertia, w x I_w w [..., 3, R]) for the
        implicit integrators, which need the matrix, not only its inverse."""
        k = self.topology.constants(S.dtype, S.device)
        mass, axis = out["mass"], out["axis"].transpose(-1, -2)
        it, ia = mass * k["it"] * out["inertia_factor"], mass * k["ia"]
        aa = outer(axis, axis)
        eye3 = torch.eye(3, dtype=S.dtype, device=S.device)
        I_world = it[:, None, None] * (eye3 - aa) + ia[:, None, None] * aa
        gyro = ((ia - it) * dot(out["axis"], S[..., 10:13, :])).unsqueeze(-2) * out["axis_rate"]
        return I_world, gyro

    def mass_matrix(self, S, out, inertia=None):
        """[..., R, 6, 6] each rod's mass and world inertia (acting on (v, w)); ``inertia``:
        the world inertia when the caller has it (`world_inertia`)."""
        if inertia is None:
            inertia, _ = self.world_inertia(S, out)
        eye = torch.eye(3, dtype=S.dtype, device=S.device)
        lin = (out["mass"][:, None, None] * eye).expand_as(inertia)
        zero = torch.zeros_like(inertia)
        return torch.cat([torch.cat([lin, zero], -1), torch.cat([zero, inertia], -1)], -2)

    def advance(self, S, v_new, w_new, h):
        """Positions with the new velocity, orientation by the exact exponential of w h."""
        if self.topology.fixed_rods:
            free = self.topology.constants(S.dtype, S.device)["free"]
            v_new, w_new = v_new * free, w_new * free
        pos = S[..., 0:3, :] + h * v_new
        half = (0.5 * h) * w_new
        angle = torch.sqrt(dot(half, half) + 1e-30)
        # sinc has a proper gradient at 0; the epsilon keeps sqrt's gradient finite.
        dw, dv = torch.cos(angle), half * torch.sinc(angle / math.pi).unsqueeze(-2)
        qw, qv = S[..., 3, :], S[..., 4:7, :]
        new_w = dw * qw - dot(dv, qv)
        new_v = dw.unsqueeze(-2) * qv + qw.unsqueeze(-2) * dv + cross(dv, qv)
        norm = torch.sqrt(new_w * new_w + dot(new_v, new_v)).unsqueeze(-2)
        return torch.cat([pos, new_w.unsqueeze(-2) / norm, new_v / norm, v_new, w_new], -2)
