"""Differentiable tensegrity engine (paper Section III, Fig. 2).

Pipeline of one step, all batched over any leading dimensions of the state:

  cable actuator    command -> rest length (first-order filter, gain/offset calibration)
  CFG               tension-only spring-dampers between rod end nodes
  DCC + CRG         capsule/ground and capsule/capsule contacts, penalty normal force,
                    smooth Coulomb friction (sliding, torsional, rolling)
  RAG               Newton-Euler accelerations of the rigid rods (gyroscopic term included)
  integrator        semi-implicit Euler, linearised backward Euler ("implicit"), or ANI

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
``ani``            adaptive naive integration: semi-implicit Euler split into n equal
                   sub-steps, n = ceil(h / h_stable), where h_stable comes from the current
                   parameters (largest node stiffness and damping over the smallest
                   effective end mass).  n is chosen without gradient, each sub-step is
                   differentiable, so gradients are those of a stable explicit simulation
                   at any requested step, which is what the paper asks of ANI.

Force conventions: cable tension T = max(0, K (l - l0) + c dl/dt), identical to the MuJoCo
twin's clamped actuator.  Contact normal force F = max(0, k d - c dd) for depth d > 0.
Friction: F_t = -mu F v_t / sqrt(|v_t|^2 + eps^2) (smooth Coulomb, eps = friction_smoothing).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import nn

from . import collision
from .config import RobotConfig
from .params import PhysicalParameters
from .state import ANG_VEL, LIN_VEL, POS, QUAT, quat_multiply, quat_to_matrix

INTEGRATORS = ("semi_implicit", "implicit", "ani")


def _skew(v: torch.Tensor) -> torch.Tensor:
    x, y, z = v.unbind(-1)
    o = torch.zeros_like(x)
    return torch.stack([torch.stack([o, -z, y], -1), torch.stack([z, o, -x], -1),
                        torch.stack([-y, x, o], -1)], -2)


def _point_jacobian(r: torch.Tensor) -> torch.Tensor:
    """G = [I, -[r]x]: velocity of a point at lever arm r from (v, w). [..., 3, 6]"""
    eye = torch.eye(3, dtype=r.dtype, device=r.device).expand(*r.shape[:-1], 3, 3)
    return torch.cat([eye, -_skew(r)], -1)


def _outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.unsqueeze(-1) * b.unsqueeze(-2)


def quat_exp_world(q: torch.Tensor, w: torch.Tensor, h) -> torch.Tensor:
    """Rotate orientation q by the world-frame rotation vector w h (exact exponential)."""
    half = 0.5 * h * w
    angle = torch.sqrt((half * half).sum(-1, keepdim=True) + 1e-30)
    # sinc has a proper gradient at 0; the epsilon keeps sqrt's gradient finite.
    dq = torch.cat([torch.cos(angle), half * torch.sinc(angle / math.pi)], -1)
    q = quat_multiply(dq, q)
    return q / torch.linalg.vector_norm(q, dim=-1, keepdim=True)


def actuator_update(act: torch.Tensor, command: torch.Tensor, tau: torch.Tensor, h):
    """Exact first-order filter over a step with held command.

    Returns (act at the end of the step, act averaged over the step).  Using the
    average for the rest length makes coarse steps consistent with fine ones.
    """
    decay = torch.exp(-h / tau)
    gap = act - command
    end = command + gap * decay
    mean = command + gap * (tau / h) * (1.0 - decay)
    return end, mean


class TensegrityEngine(nn.Module):
    """Differentiable engine for one robot topology.

    state:   [..., R, 13] (see ``engine.state``), act: [..., A] filtered commands (m),
    command: [..., A] target rest lengths (m), wrench: [..., R, 6] external force and
    torque at each rod centre, world frame.  Any float dtype and device.
    """

    def __init__(self, robot: RobotConfig, params: Optional[PhysicalParameters] = None, *,
                 fixed_rods=(), floor: bool = True, friction_smoothing: float = 0.01,
                 angular_smoothing: float = 0.05, ani_safety: float = 0.5,
                 actuator_timing: str = "start"):
        super().__init__()
        self.robot = robot
        self.params = params if params is not None else PhysicalParameters(robot)
        self.floor = floor
        self.rod_rod = robot.contact.rod_rod
        self.friction_smoothing = friction_smoothing
        self.angular_smoothing = angular_smoothing
        self.ani_safety = ani_safety
        if actuator_timing not in ("start", "mean"):
            raise ValueError(f"actuator_timing must be 'start' or 'mean', got {actuator_timing!r}")
        # "start": the step's force uses the activation at the start of the step, like a
        # motor loop and MuJoCo (actearly=false). "mean": the exact average of the filter
        # over the step, better for coarse steps.
        self.actuator_timing = actuator_timing
        self.fixed_rods = tuple(sorted(int(i) for i in fixed_rods))
        for i in self.fixed_rods:
            if not 0 <= i < robot.num_rods:
                raise ValueError(f"fixed rod index {i} out of range")
        R, C = robot.num_rods, robot.num_cables
        f64 = torch.float64
        buf = lambda name, value, dtype=f64: self.register_buffer(name, torch.as_tensor(value, dtype=dtype))
        buf("half_length", robot.rod_length / 2.0)
        buf("radius", robot.rod_radius)
        buf("inertia_per_mass", robot.rod_inertia() / robot.rod_mass[:, None])
        buf("gravity", robot.gravity)
        nodes = robot.cable_node_index
        buf("cable_node_a", nodes[:, 0], torch.long)
        buf("cable_node_b", nodes[:, 1], torch.long)
        incidence = np.zeros((2 * R, C))  # force on node n from cable c is incidence[n, c] * T u
        incidence[nodes[:, 0], np.arange(C)] += 1.0
        incidence[nodes[:, 1], np.arange(C)] -= 1.0
        buf("incidence", incidence)
        act_idx = robot.actuated_indices
        passive_idx = np.flatnonzero(~robot.cable_actuated)
        order = np.concatenate([act_idx, passive_idx])
        buf("rest_gather", np.argsort(order), torch.long)  # [act | passive] -> cable order
        buf("passive_rest", robot.cable_rest_length[passive_idx])
        buf("command_low", robot.command_low)
        buf("command_high", robot.command_high)
        free = np.ones(R)
        free[list(self.fixed_rods)] = 0.0
        buf("free_mask", free)
        pairs = collision.all_pairs(R) if (self.rod_rod and R > 1) else torch.zeros((0, 2), dtype=torch.long)
        buf("pairs", pairs, torch.long)
        onehot_a = np.zeros((R, len(pairs)))
        onehot_b = np.zeros((R, len(pairs)))
        if len(pairs):
            onehot_a[pairs[:, 0].numpy(), np.arange(len(pairs))] = 1.0
            onehot_b[pairs[:, 1].numpy(), np.arange(len(pairs))] = 1.0
        buf("pair_onehot_a", onehot_a)
        buf("pair_onehot_b", onehot_b)
        # Cables attached to each node (for ANI's stability bound).
        buf("node_cable_count", np.abs(incidence))

    # ------------------------------------------------------------------ helpers
    @property
    def num_rods(self) -> int:
        return self.robot.num_rods

    def param_values(self, dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
        return {k: v.to(dtype=dtype, device=device) for k, v in self.params.values().items()}

    def initial_act(self, like: torch.Tensor) -> torch.Tensor:
        """Filtered commands that reproduce the config rest lengths (nominal calibration)."""
        act = torch.as_tensor(self.robot.cable_rest_length[self.robot.actuated_indices],
                              dtype=like.dtype, device=like.device)
        return act.expand(*like.shape[:-2], act.shape[-1]).clone()

    def clamp_command(self, command: torch.Tensor) -> torch.Tensor:
        low = self.command_low.to(command)
        high = self.command_high.to(command)
        return torch.maximum(torch.minimum(command, high), low)

    def rest_lengths(self, act: torch.Tensor, p: dict) -> torch.Tensor:
        """[..., C] rest lengths from filtered commands [..., A]."""
        actuated = p["actuator_gain"] * act + p["actuator_offset"]
        passive = self.passive_rest.to(act).expand(*act.shape[:-1], -1)
        return torch.cat([actuated, passive], -1).index_select(-1, self.rest_gather)

    def node_kinematics(self, state: torch.Tensor):
        """Lever arms r [..., R, 2, 3], positions and velocities of every end node."""
        half = self.half_length.to(state)
        rot = quat_to_matrix(state[..., QUAT])
        axis = rot[..., :, 2]
        lever = axis * half[:, None]
        r_nodes = torch.stack([-lever, lever], -2)
        x_nodes = state[..., None, POS] + r_nodes
        v_nodes = state[..., None, LIN_VEL] + torch.linalg.cross(
            state[..., None, ANG_VEL].expand_as(r_nodes), r_nodes, dim=-1)
        return rot, r_nodes, x_nodes, v_nodes

    # ------------------------------------------------------------------ forces
    def forces(self, state: torch.Tensor, rest: torch.Tensor, p: dict,
               wrench: Optional[torch.Tensor] = None, jacobians: bool = False):
        """Net force and torque on every rod (world frame), plus implicit Jacobians.

        Returns dict with F [..., R, 3], tau [..., R, 3], rot, mass [R], inertia [R, 3],
        and when ``jacobians``: K, D as [..., 6R, 6R] (positive semi-definite).
        """
        R = self.num_rods
        dtype = state.dtype
        rot, r_nodes, x_nodes, v_nodes = self.node_kinematics(state)
        batch = state.shape[:-2]
        X = x_nodes.reshape(*batch, 2 * R, 3)
        V = v_nodes.reshape(*batch, 2 * R, 3)
        # ---- cables (CFG)
        xa, xb = X.index_select(-2, self.cable_node_a), X.index_select(-2, self.cable_node_b)
        va, vb = V.index_select(-2, self.cable_node_a), V.index_select(-2, self.cable_node_b)
        d = xb - xa
        length = torch.linalg.vector_norm(d, dim=-1)
        u = d / length.unsqueeze(-1)
        length_rate = ((vb - va) * u).sum(-1)
        K, c = p["cable_stiffness"], p["cable_damping"]
        stretch = K * (length - rest) + c * length_rate
        tension = torch.relu(stretch)
        f_cable = tension.unsqueeze(-1) * u                   # on node a; node b gets -f
        node_force = torch.einsum("nc,...cd->...nd", self.incidence.to(dtype), f_cable)
        node_force = node_force.reshape(*batch, R, 2, 3)
        force = node_force.sum(-2)
        torque = torch.linalg.cross(r_nodes, node_force, dim=-1).sum(-2)

        mass = p["rod_mass"].expand(R)
        inertia = mass[:, None] * self.inertia_per_mass.to(dtype)
        force = force + mass[:, None] * self.gravity.to(dtype)
        if wrench is not None:
            force = force + wrench[..., 0:3]
            torque = torque + wrench[..., 3:6]
        out = {"rot": rot, "mass": mass, "inertia": inertia, "tension": tension}

        if jacobians:
            G_nodes = _point_jacobian(r_nodes.reshape(*batch, 2 * R, 3))
            taut = (stretch > 0).to(dtype).unsqueeze(-1).unsqueeze(-1)
            uu = _outer(u, u)
            eye3 = torch.eye(3, dtype=dtype, device=state.device)
            H = taut * (K.unsqueeze(-1).unsqueeze(-1) * uu
                        + (tension / length).unsqueeze(-1).unsqueeze(-1) * (eye3 - uu))
            Dc = taut * c.unsqueeze(-1).unsqueeze(-1) * uu
            rod_a = torch.div(self.cable_node_a, 2, rounding_mode="floor")
            rod_b = torch.div(self.cable_node_b, 2, rounding_mode="floor")
            Ga = G_nodes.index_select(-3, self.cable_node_a)
            Gb = G_nodes.index_select(-3, self.cable_node_b)
            Kmat = self._pair_blocks(H, Ga, Gb, rod_a, rod_b, batch, dtype, state.device)
            Dmat = self._pair_blocks(Dc, Ga, Gb, rod_a, rod_b, batch, dtype, state.device)

        # ---- contacts (DCC + CRG)
        kc, cc = p["contact_stiffness"], p["contact_damping"]
        mu, mu_t, mu_r = p["friction_sliding"], p["friction_torsional"], p["friction_rolling"]
        eps, eps_w = self.friction_smoothing, self.angular_smoothing
        w = state[..., ANG_VEL]
        if self.floor:
            contacts = collision.ground_contacts(x_nodes, self.radius.to(dtype), self.robot.contact.ground_height)
            r_c = contacts.point - state[..., None, POS]                   # [..., R, 2, 3]
            v_c = state[..., None, LIN_VEL] + torch.linalg.cross(
                w.unsqueeze(-2).expand_as(r_c), r_c, dim=-1)
            active = (contacts.depth > 0).to(dtype)
            normal_force = active * torch.relu(kc * contacts.depth - cc * v_c[..., 2])
            v_t = v_c[..., :2]
            speed = torch.sqrt((v_t * v_t).sum(-1) + eps * eps)
            f_t = -(mu * normal_force / speed).unsqueeze(-1) * v_t
            f_c = torch.cat([f_t, normal_force.unsqueeze(-1)], -1)
            force = force + f_c.sum(-2)
            torque = torque + torch.linalg.cross(r_c, f_c, dim=-1).sum(-2)
            load = normal_force.sum(-1)                                      # [..., R]
            w_n, w_t = w[..., 2:3], w[..., :2]
            spin = torch.sqrt(w_n * w_n + eps_w * eps_w)
            roll = torch.sqrt((w_t * w_t).sum(-1, keepdim=True) + eps_w * eps_w)
            torque = torque - torch.cat([mu_r * load.unsqueeze(-1) * w_t / roll,
                                         mu_t * load.unsqueeze(-1) * w_n / spin], -1)
            if jacobians:
                G_c = _point_jacobian(r_c)                                   # [..., R, 2, 3, 6]
                ez = torch.zeros(3, dtype=dtype, device=state.device)
                ez[2] = 1.0
                nn_ = _outer(ez, ez)
                tang = torch.diag(torch.tensor([1.0, 1.0, 0.0], dtype=dtype, device=state.device))
                Hc = (active * kc)[..., None, None] * nn_
                Dcon = (active * cc)[..., None, None] * nn_ + (mu * normal_force / speed)[..., None, None] * tang
                Kblk = (G_c.transpose(-1, -2) @ Hc @ G_c).sum(-3)           # [..., R, 6, 6]
                Dblk = (G_c.transpose(-1, -2) @ Dcon @ G_c).sum(-3)
                rot_damp = torch.cat([(mu_r * load.unsqueeze(-1) / roll).expand(*load.shape, 2),
                                      mu_t * load.unsqueeze(-1) / spin], -1)
                Dblk = Dblk + torch.diag_embed(torch.cat([torch.zeros_like(rot_damp), rot_damp], -1))
                Kmat = Kmat + self._block_diag(Kblk)
                Dmat = Dmat + self._block_diag(Dblk)
        if self.pairs.shape[0] > 0:
            rc = collision.rod_rod_contacts(x_nodes, self.radius.to(dtype), self.pairs)
            ia, ib = self.pairs[:, 0], self.pairs[:, 1]
            pos, vel = state[..., POS], state[..., LIN_VEL]
            ra = rc.point_a - pos.index_select(-2, ia)
            rb = rc.point_b - pos.index_select(-2, ib)
            vpa = vel.index_select(-2, ia) + torch.linalg.cross(w.index_select(-2, ia), ra, dim=-1)
            vpb = vel.index_select(-2, ib) + torch.linalg.cross(w.index_select(-2, ib), rb, dim=-1)
            v_rel = vpa - vpb
            v_n = (v_rel * rc.normal).sum(-1)
            active = (rc.depth > 0).to(dtype)
            normal_force = active * torch.relu(kc * rc.depth - cc * v_n)
            v_t = v_rel - v_n.unsqueeze(-1) * rc.normal
            speed = torch.sqrt((v_t * v_t).sum(-1) + eps * eps)
            f_a = normal_force.unsqueeze(-1) * rc.normal - (mu * normal_force / speed).unsqueeze(-1) * v_t
            oa, ob = self.pair_onehot_a.to(dtype), self.pair_onehot_b.to(dtype)
            force = force + torch.einsum("rp,...pd->...rd", oa - ob, f_a)
            torque = (torque + torch.einsum("rp,...pd->...rd", oa, torch.linalg.cross(ra, f_a, dim=-1))
                      - torch.einsum("rp,...pd->...rd", ob, torch.linalg.cross(rb, f_a, dim=-1)))
            if jacobians:
                nn_ = _outer(rc.normal, rc.normal)
                eye3 = torch.eye(3, dtype=dtype, device=state.device)
                Hp = (active * kc)[..., None, None] * nn_
                Dp = (active * cc)[..., None, None] * nn_ + (mu * normal_force / speed)[..., None, None] * (eye3 - nn_)
                Ga, Gb = _point_jacobian(ra), _point_jacobian(rb)
                Kmat = Kmat + self._pair_blocks(Hp, Ga, Gb, ia, ib, batch, dtype, state.device)
                Dmat = Dmat + self._pair_blocks(Dp, Ga, Gb, ia, ib, batch, dtype, state.device)

        out["force"], out["torque"] = force, torque
        if jacobians:
            out["K"], out["D"] = Kmat, Dmat
        return out

    def _pair_blocks(self, H, Ga, Gb, rod_a, rod_b, batch, dtype, device):
        """Assemble sum_c S_c^T H_c S_c with S_c = G_b E_b - G_a E_a into [..., 6R, 6R]."""
        R = self.num_rods
        GaT, GbT = Ga.transpose(-1, -2), Gb.transpose(-1, -2)
        blocks = torch.cat([GaT @ H @ Ga, GbT @ H @ Gb, -(GaT @ H @ Gb), -(GbT @ H @ Ga)], -3)
        index = torch.cat([rod_a * R + rod_a, rod_b * R + rod_b, rod_a * R + rod_b, rod_b * R + rod_a])
        full = torch.zeros(*batch, R * R, 6, 6, dtype=dtype, device=device)
        full = full.index_add(-3, index, blocks)
        return full.reshape(*batch, R, R, 6, 6).transpose(-3, -2).reshape(*batch, 6 * R, 6 * R)

    def _block_diag(self, blocks):
        """[..., R, 6, 6] -> block-diagonal [..., 6R, 6R]."""
        R = self.num_rods
        eye = torch.eye(R, dtype=blocks.dtype, device=blocks.device)
        full = eye[:, None, :, None] * blocks.unsqueeze(-2)  # [..., R, 6, R, 6]
        return full.reshape(*blocks.shape[:-3], 6 * R, 6 * R)

    # ------------------------------------------------------------------ dynamics
    def accelerations(self, state, out):
        """Newton-Euler: a = F/m, alpha = I_w^-1 (tau - w x I_w w)."""
        rot, mass, inertia = out["rot"], out["mass"], out["inertia"]
        w = state[..., ANG_VEL]
        w_body = (rot.transpose(-1, -2) @ w.unsqueeze(-1)).squeeze(-1)
        L_world = (rot @ (inertia * w_body).unsqueeze(-1)).squeeze(-1)
        tau = out["torque"] - torch.linalg.cross(w, L_world, dim=-1)
        tau_body = (rot.transpose(-1, -2) @ tau.unsqueeze(-1)).squeeze(-1)
        alpha = (rot @ (tau_body / inertia).unsqueeze(-1)).squeeze(-1)
        acc = out["force"] / mass[:, None]
        free = self.free_mask.to(state.dtype)[:, None]
        return acc * free, alpha * free

    def _advance(self, state, v_new, w_new, h):
        free = self.free_mask.to(state.dtype)[:, None]
        v_new, w_new = v_new * free, w_new * free
        pos = state[..., POS] + h * v_new
        quat = quat_exp_world(state[..., QUAT], w_new, h)
        return torch.cat([pos, quat, v_new, w_new], -1)

    def _semi_implicit(self, state, rest, p, h, wrench):
        out = self.forces(state, rest, p, wrench)
        acc, alpha = self.accelerations(state, out)
        return self._advance(state, state[..., LIN_VEL] + h * acc, state[..., ANG_VEL] + h * alpha, h)

    def _implicit(self, state, rest, p, h, wrench):
        R = self.num_rods
        out = self.forces(state, rest, p, wrench, jacobians=True)
        rot, mass, inertia = out["rot"], out["mass"], out["inertia"]
        batch = state.shape[:-2]
        dtype = state.dtype
        w = state[..., ANG_VEL]
        I_world = rot @ torch.diag_embed(inertia.expand(*batch, R, 3)) @ rot.transpose(-1, -2)
        gyro = torch.linalg.cross(w, (I_world @ w.unsqueeze(-1)).squeeze(-1), dim=-1)
        Q = torch.cat([out["force"], out["torque"] - gyro], -1)                 # [..., R, 6]
        M_blocks = torch.zeros(*batch, R, 6, 6, dtype=dtype, device=state.device)
        M_blocks[..., :3, :3] = mass[:, None, None] * torch.eye(3, dtype=dtype, device=state.device)
        M_blocks[..., 3:, 3:] = I_world
        free6 = self.free_mask.to(dtype).repeat_interleave(6)
        A = self._block_diag(M_blocks) + h * out["D"] + h * h * out["K"]
        xi = torch.cat([state[..., LIN_VEL], w], -1).reshape(*batch, 6 * R)
        rhs = h * (Q.reshape(*batch, 6 * R) - h * (out["K"] @ xi.unsqueeze(-1)).squeeze(-1))
        # Fixed rods: identity rows/columns, zero right-hand side.
        A = A * free6[:, None] * free6[None, :] + torch.diag(1.0 - free6)
        delta = torch.linalg.solve(A, (rhs * free6).unsqueeze(-1)).squeeze(-1)
        xi_new = (xi + delta).reshape(*batch, R, 6)
        return self._advance(state, xi_new[..., :3], xi_new[..., 3:], h)

    @torch.no_grad()
    def stable_step(self, p: dict) -> float:
        """Largest semi-implicit step the current parameters allow (ANI's bound)."""
        mass = p["rod_mass"].expand(self.num_rods).double()
        inertia = mass[:, None] * self.inertia_per_mass
        end_mass = 1.0 / (1.0 / mass + self.half_length ** 2 / inertia[:, 0])     # [R]
        m_min = float(end_mass.min())
        count = self.node_cable_count.sum(-1)
        k_node = float((self.node_cable_count @ p["cable_stiffness"].double().expand(self.robot.num_cables)).max())
        c_node = float((self.node_cable_count @ p["cable_damping"].double().expand(self.robot.num_cables)).max())
        if self.floor or self.pairs.shape[0]:
            k_node += float(p["contact_stiffness"].max())
            c_node += float(p["contact_damping"].max())
        del count
        # Two-body relative modes see half the effective mass.
        omega = math.sqrt(2.0 * k_node / m_min)
        h_spring = 2.0 / omega
        h_damp = 2.0 * m_min / (2.0 * max(c_node, 1e-9))
        return self.ani_safety * min(h_spring, h_damp)

    def step(self, state: torch.Tensor, act: torch.Tensor, command: torch.Tensor, dt: float, *,
             integrator: str = "semi_implicit", wrench: Optional[torch.Tensor] = None,
             params: Optional[dict] = None):
        """Advance (state, act) by dt under a command held over the step."""
        if integrator not in INTEGRATORS:
            raise ValueError(f"integrator must be one of {INTEGRATORS}, got {integrator!r}")
        p = params if params is not None else self.param_values(state.dtype, state.device)
        command = self.clamp_command(command)
        if integrator == "ani":
            n = max(1, math.ceil(dt / self.stable_step(p) - 1e-9))
            h = dt / n
            for _ in range(n):
                act_end, act_mean = actuator_update(act, command, p["actuator_time_constant"], h)
                rest = self.rest_lengths(act if self.actuator_timing == "start" else act_mean, p)
                state = self._semi_implicit(state, rest, p, h, wrench)
                act = act_end
            return state, act
        act_end, act_mean = actuator_update(act, command, p["actuator_time_constant"], dt)
        rest = self.rest_lengths(act if self.actuator_timing == "start" else act_mean, p)
        if integrator == "implicit":
            state = self._implicit(state, rest, p, dt, wrench)
        else:
            state = self._semi_implicit(state, rest, p, dt, wrench)
        return state, act_end

    def rollout(self, state: torch.Tensor, act: torch.Tensor, commands: torch.Tensor, dt: float, *,
                integrator: str = "semi_implicit", wrenches: Optional[torch.Tensor] = None,
                record_every: int = 1, params: Optional[dict] = None):
        """Run commands [..., S, A] (one per step of length dt).

        Returns (states [..., S // record_every, R, 13], acts [..., S // record_every, A]),
        the state after steps record_every, 2 record_every, ...
        """
        p = params if params is not None else self.param_values(state.dtype, state.device)
        steps = commands.shape[-2]
        states, acts = [], []
        for i in range(steps):
            wrench = None if wrenches is None else wrenches[..., i, :, :]
            state, act = self.step(state, act, commands[..., i, :], dt, integrator=integrator,
                                   wrench=wrench, params=p)
            if (i + 1) % record_every == 0:
                states.append(state)
                acts.append(act)
        return torch.stack(states, -3), torch.stack(acts, -2)

    # ------------------------------------------------------------------ diagnostics
    def energy(self, state: torch.Tensor, act: torch.Tensor, params: Optional[dict] = None) -> torch.Tensor:
        """Total mechanical energy [...]: kinetic + gravity + cable + contact springs."""
        p = params if params is not None else self.param_values(state.dtype, state.device)
        rest = self.rest_lengths(act, p)
        rot, _, x_nodes, _ = self.node_kinematics(state)
        R = self.num_rods
        mass = p["rod_mass"].expand(R)
        inertia = mass[:, None] * self.inertia_per_mass.to(state.dtype)
        w_body = (rot.transpose(-1, -2) @ state[..., ANG_VEL].unsqueeze(-1)).squeeze(-1)
        v = state[..., LIN_VEL]
        kinetic = 0.5 * (mass * (v * v).sum(-1)).sum(-1) + 0.5 * (inertia * w_body * w_body).sum((-1, -2))
        gravity = -(mass[:, None] * self.gravity.to(state.dtype) * state[..., POS]).sum((-1, -2))
        X = x_nodes.reshape(*state.shape[:-2], 2 * R, 3)
        length = torch.linalg.vector_norm(
            X.index_select(-2, self.cable_node_b) - X.index_select(-2, self.cable_node_a), dim=-1)
        cable = 0.5 * (p["cable_stiffness"] * torch.relu(length - rest) ** 2).sum(-1)
        total = kinetic + gravity + cable
        if self.floor:
            depth = collision.ground_contacts(x_nodes, self.radius.to(state.dtype),
                                              self.robot.contact.ground_height).depth
            total = total + 0.5 * (p["contact_stiffness"] * torch.relu(depth) ** 2).sum((-1, -2))
        return total

    def cable_tensions(self, state, act, params: Optional[dict] = None) -> torch.Tensor:
        p = params if params is not None else self.param_values(state.dtype, state.device)
        return self.forces(state, self.rest_lengths(act, p), p)["tension"]
