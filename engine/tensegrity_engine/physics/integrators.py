"""Time integrators of the engine, one object each, looked up by name.

Integrators
-----------
``semi_implicit``  symplectic Euler: v+ = v + h a(x, v); x+ = x + h v+; q+ = exp(h w+) q.
``implicit``       linearised backward Euler of the whole system (Baraff & Witkin 1998):
                   (M + h D + h^2 K) dxi = h (Q - h K xi), xi = (v, w) of every rod, where
                   K and D are the stiffness/damping Jacobians of cable and contact forces
                   mapped through the point Jacobians [I, -[r]x]. Unconditionally stable for
                   the linearised system, dissipative: the paper's choice for large steps.
                   (The paper's per-rod 21x21 system is the same linearisation written per
                   spring; solving the whole 6R x 6R system couples all rods at once.)
``implicitfast``   semi-implicit Euler whose velocity update is implicit, per rod, in the
                   rod's own cable damping and its gyroscopic torque:
                   (M_r + h D_rr + h dG/dw) dxi_r = h Q_r, D_rr the rod's block of the cable
                   damping Jacobian (`jacobians.own_cable_damping_blocks`), G = w x I w.
                   Coupling between rods, contacts and friction stay explicit (friction
                   velocity-implicit as in ``semi_implicit``). This is MuJoCo's
                   ``implicitfast`` for free bodies to round-off: a robot simulated or built
                   around it is predicted with it, and heavily damped cables stay stable.
``rk4``            the classic four-stage Runge-Kutta step of the rods' state (MuJoCo's
                   ``RK4``): each stage takes the accelerations the semi-implicit step would
                   (ground friction velocity-implicit over the step, the soft ground solved
                   over it) at the step's rest lengths (the actuators' ``timing``, held over
                   the step as a motor loop holds them; MuJoCo's RK4, whose stages move the
                   activation, is not this step to round-off: measured, its 1 ms rollouts of
                   varying commands converge at first order); poses move by the stages' weighted
                   velocities, the orientation by the exponential of their weighted angular
                   velocity plus the Magnus term h/12 w_end x w0 (fourth order; tested).
                   Four force evaluations a step: a robot simulated (or built) with more
                   accurate time stepping than a step's explicit error.
``ani``            adaptive naive integration: semi-implicit Euler split into n equal
                   sub-steps, n = ceil(h / h_stable), where h_stable comes from the current
                   parameters (largest node stiffness and damping over the smallest
                   effective end mass).  n is chosen without gradient, each sub-step is
                   differentiable, so gradients are those of a stable explicit simulation
                   at any requested step, which is what the paper asks of ANI.

Under the soft contact law (`soft_contact`, `soft_pairs`) the semi-implicit step takes the
accelerations the soft constraints of the ground and the rod pairs leave; ``implicitfast``
and ``implicit`` add the wrench those constraints apply at the explicit accelerations and
then solve their own velocity update (as MuJoCo's implicit integrators do with its
constraint force).

Every integrator's ``step(S, act, command, dt, wrench, p)`` advances the components-first
state S [..., 13, R] and the filtered commands act [..., A] by dt under a clamped command.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from tensegrity_engine.physics.actuators import CableActuators
from tensegrity_engine.physics.forces import ForceModel
from tensegrity_engine.physics.jacobians import skew, implicit_system, own_cable_damping_blocks
from tensegrity_engine.physics.rigid_body import RigidRods
from tensegrity_engine.physics.soft_pairs import SoftContacts
from tensegrity_engine.physics.stability import explicit_step_limit
from tensegrity_engine.physics.state import ANG_VEL, LIN_VEL

INTEGRATORS = ("semi_implicit", "implicit", "ani", "implicitfast", "rk4")


class SemiImplicitEuler:
    """Symplectic Euler with velocity-implicit ground friction."""

    def __init__(self, forces: ForceModel, rods: RigidRods, actuators: CableActuators,
                 soft: Optional[SoftContacts] = None):
        self.forces, self.rods, self.actuators, self.soft = forces, rods, actuators, soft

    def accelerations(self, S, rest, p, h, wrench):
        """(acc, alpha) [..., 3, R] at state S and rest lengths ``rest``, ground friction
        velocity-implicit (and the soft ground solved) over a step h."""
        out = self.forces(S, rest, p, wrench, defer_friction=True)
        acc, alpha = self.rods.accelerations(S, out)
        if self.soft is not None:
            acc, alpha = self.soft.accelerations(S, out, p, h, acc, alpha)
        elif "ground_slip" in out:
            k = self.forces.topology.constants(S.dtype, S.device)
            f_fric, t_fric, _ = self.forces.ground_friction(out, p, k, h, acc, alpha)
            out["force"], out["torque"] = out["force"] + f_fric, out["torque"] + t_fric
            acc, alpha = self.rods.accelerations(S, out)
        return acc, alpha

    def advance(self, S, rest, p, h, wrench):
        """One step h at fixed rest lengths."""
        acc, alpha = self.accelerations(S, rest, p, h, wrench)
        return self.rods.advance(S, S[..., 7:10, :] + h * acc, S[..., 10:13, :] + h * alpha, h)

    def step(self, S, act, command, dt, wrench, p):
        act_end, rest = self.actuators.advance(act, command, p, dt)
        return self.advance(S, rest, p, dt, wrench), act_end


class LinearizedBackwardEuler:
    """Linearised backward Euler on the rod-major system (see the module docstring)."""

    def __init__(self, forces: ForceModel, rods: RigidRods, actuators: CableActuators,
                 soft: Optional[SoftContacts] = None):
        self.forces, self.rods, self.actuators, self.soft = forces, rods, actuators, soft

    def advance(self, S, rest, p, h, wrench):
        topology = self.forces.topology
        R = topology.num_rods
        k = topology.constants(S.dtype, S.device)
        state = S.transpose(-1, -2)
        out = self.forces(S, rest, p, wrench, keep=True)
        if self.soft is not None:
            add_soft_contact(self.soft, self.rods, S, out, p, h)
        w = state[..., ANG_VEL]
        xi = torch.cat([state[..., LIN_VEL], w], -1).flatten(-2)
        # Fixed rods: no rows or columns in h D + h^2 K, zero right-hand side, so their block
        # of A is their mass block alone and their velocity change is zero.
        free6 = k["free"].repeat_interleave(6) if topology.fixed_rods else None
        A, Kxi = implicit_system(topology, state, out, p, h, xi, free6)
        I_world, gyro = self.rods.world_inertia(S, out)
        Q = torch.cat([out["force"], out["torque"] - gyro], -2).transpose(-1, -2)   # [..., R, 6]
        batch = A.shape[:-2]
        M_blocks = self.rods.mass_matrix(S, out, I_world).expand(*batch, R, 6, 6)
        # The rods' mass blocks go on A's block diagonal in place (a fresh tensor), not as a
        # block-diagonal matrix of mostly zeros: A's size is what a step's ops cost here.
        A.view(*batch, R, 6, R, 6).diagonal(dim1=-4, dim2=-2).add_(M_blocks.permute(*range(len(batch)), -2, -1, -3))
        rhs = h * (Q.flatten(-2) - h * Kxi)
        if free6 is not None:
            rhs = rhs * free6
        delta = torch.linalg.solve(A, rhs.unsqueeze(-1)).squeeze(-1)
        xi_new = (xi + delta).unflatten(-1, (R, 6)).transpose(-1, -2)               # [..., 6, R]
        return self.rods.advance(S, xi_new[..., :3, :], xi_new[..., 3:, :], h)

    def step(self, S, act, command, dt, wrench, p):
        act_end, rest = self.actuators.advance(act, command, p, dt)
        return self.advance(S, rest, p, dt, wrench), act_end


class ImplicitFast:
    """Semi-implicit Euler, implicit per rod in its cable damping and gyroscopic torque
    (see the module docstring)."""

    def __init__(self, forces: ForceModel, rods: RigidRods, actuators: CableActuators,
                 soft: Optional[SoftContacts] = None):
        self.forces, self.rods, self.actuators, self.soft = forces, rods, actuators, soft

    def _solve(self, A, force, torque):
        """Per-rod (acc, alpha) [..., 3, R] from A [..., R, 6, 6] and the net wrench."""
        rhs = torch.cat([force, torque], -2).transpose(-1, -2).unsqueeze(-1)     # [..., R, 6, 1]
        x = torch.linalg.solve(A, rhs).squeeze(-1).transpose(-1, -2)            # [..., 6, R]
        acc, alpha = x[..., :3, :], x[..., 3:, :]
        if self.forces.topology.fixed_rods:
            free = self.forces.topology.constants(x.dtype, x.device)["free"]
            acc, alpha = acc * free, alpha * free
        return acc, alpha

    def advance(self, S, rest, p, h, wrench):
        topology = self.forces.topology
        k = topology.constants(S.dtype, S.device)
        out = self.forces(S, rest, p, wrench, keep=True, defer_friction=True)
        if self.soft is not None:
            add_soft_contact(self.soft, self.rods, S, out, p, h)
        mass, w = out["mass"], S[..., 10:13, :]
        eye3 = torch.eye(3, dtype=S.dtype, device=S.device)
        I_world, gyro = self.rods.world_inertia(S, out)                           # gyro = w x I w
        w_r = w.transpose(-1, -2)
        I_w_w = (I_world @ w_r.unsqueeze(-1)).squeeze(-1)
        A = h * own_cable_damping_blocks(topology, S, out, p)
        lin = mass[:, None, None] * eye3
        rot = I_world + h * (skew(w_r) @ I_world - skew(I_w_w))               # + h d(w x I w)/dw
        A = A + torch.cat([torch.cat([lin.expand_as(rot), torch.zeros_like(rot)], -1),
                           torch.cat([torch.zeros_like(rot), rot], -1)], -2)
        torque = out["torque"] - gyro
        acc, alpha = self._solve(A, out["force"], torque)
        if "ground_slip" in out:
            f_fric, t_fric, _ = self.forces.ground_friction(out, p, k, h, acc, alpha)
            acc, alpha = self._solve(A, out["force"] + f_fric, torque + t_fric)
        return self.rods.advance(S, S[..., 7:10, :] + h * acc, w + h * alpha, h)

    def step(self, S, act, command, dt, wrench, p):
        act_end, rest = self.actuators.advance(act, command, p, dt)
        return self.advance(S, rest, p, dt, wrench), act_end


class RungeKutta4:
    """Classic four-stage Runge-Kutta on poses and velocities (see the module docstring)."""

    def __init__(self, semi_implicit: SemiImplicitEuler):
        self.semi_implicit = semi_implicit

    def _moved(self, S0, v_pose, w_pose, v, w, h):
        """S0 with its pose moved by (v_pose, w_pose) over h and velocities (v, w)."""
        rods = self.semi_implicit.rods
        moved = rods.advance(S0, v_pose, w_pose, h)
        if rods.topology.fixed_rods:
            free = rods.topology.constants(S0.dtype, S0.device)["free"]
            v, w = v * free, w * free
        return torch.cat([moved[..., :7, :], v, w], -2)

    def step(self, S, act, command, dt, wrench, p):
        semi = self.semi_implicit
        act_end, rest = semi.actuators.advance(act, command, p, dt)
        v0, w0 = S[..., 7:10, :], S[..., 10:13, :]
        a1, b1 = semi.accelerations(S, rest, p, dt, wrench)
        v2, w2 = v0 + 0.5 * dt * a1, w0 + 0.5 * dt * b1
        a2, b2 = semi.accelerations(self._moved(S, v0, w0, v2, w2, 0.5 * dt), rest, p, dt, wrench)
        v3, w3 = v0 + 0.5 * dt * a2, w0 + 0.5 * dt * b2
        a3, b3 = semi.accelerations(self._moved(S, v2, w2, v3, w3, 0.5 * dt), rest, p, dt, wrench)
        v4, w4 = v0 + dt * a3, w0 + dt * b3
        a4, b4 = semi.accelerations(self._moved(S, v3, w3, v4, w4, dt), rest, p, dt, wrench)
        v_end = v0 + dt * (a1 + 2.0 * a2 + 2.0 * a3 + a4) / 6.0
        w_end = w0 + dt * (b1 + 2.0 * b2 + 2.0 * b3 + b4) / 6.0
        v_pose = (v0 + 2.0 * v2 + 2.0 * v3 + v4) / 6.0
        # Rotations do not commute: the Magnus term of a turning angular velocity keeps the
        # orientation at fourth order (the weighted mean alone is second order)
        w_pose = (w0 + 2.0 * w2 + 2.0 * w3 + w4) / 6.0 + (dt / 12.0) * torch.linalg.cross(w_end, w0, dim=-2)
        return self._moved(S, v_pose, w_pose, v_end, w_end, dt), act_end


class AdaptiveNaive:
    """ANI: semi-implicit sub-steps no longer than `stable_step` allows.

    ``safety`` scales the stability bound (< 1 leaves a margin).
    """

    def __init__(self, semi_implicit: SemiImplicitEuler, safety: float):
        self.semi_implicit = semi_implicit
        self.safety = safety

    @torch.no_grad()
    def stable_step(self, p: dict) -> float:
        """Largest semi-implicit step the current parameters allow (ANI's bound, see
        `stability.explicit_step_limit`), times ``safety``."""
        forces = self.semi_implicit.forces
        return self.safety * explicit_step_limit(forces.topology, p, floor=forces.has_contacts)

    def step(self, S, act, command, dt, wrench, p):
        # The sub-step count is a Python int chosen at run time: this step cannot be compiled.
        n = max(1, math.ceil(dt / self.stable_step(p) - 1e-9))
        h = dt / n
        semi = self.semi_implicit
        for _ in range(n):
            act_end, rest = semi.actuators.advance(act, command, p, h)
            S = semi.advance(S, rest, p, h, wrench)
            act = act_end
        return S, act


def add_soft_contact(soft: SoftContacts, rods: RigidRods, S, out, p, h) -> None:
    """Add the soft contacts' wrench at the explicit accelerations to ``out``."""
    acc, alpha = rods.accelerations(S, out)
    force, torque = soft.wrench(S, out, p, h, acc, alpha)
    out["force"], out["torque"] = out["force"] + force, out["torque"] + torque


def make_integrators(forces: ForceModel, rods: RigidRods, actuators: CableActuators, *,
                     ani_safety: float) -> dict:
    """The name -> integrator table, in `INTEGRATORS` order."""
    soft = (SoftContacts(forces.topology, rods, ground=forces.soft_ground, pairs=forces.soft_pairs)
            if forces.soft_contacts else None)
    semi = SemiImplicitEuler(forces, rods, actuators, soft)
    return {"semi_implicit": semi, "implicit": LinearizedBackwardEuler(forces, rods, actuators, soft),
            "ani": AdaptiveNaive(semi, ani_safety), "implicitfast": ImplicitFast(forces, rods, actuators, soft),
            "rk4": RungeKutta4(semi)}
