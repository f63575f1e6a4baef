"""Force model: cables (CFG), ground contacts (DCC + CRG) and rod-rod contacts.

Force conventions: cable tension T = max(0, K (l - l0) + (1 - s) c dl/dt) + s c dl/dt, with s
the share of the damping that acts on a slack cable too (a tendon damper; tiny by default),
identical to the MuJoCo twin's clamped actuator plus tendon damping.
Contact normal force F = max(0, k d - c dd) for depth d > 0.
Friction: F_t = -mu F v_t / sqrt(|v_t|^2 + eps^2) (smooth Coulomb, eps = friction_smoothing);
torsional and rolling friction use eps = angular_smoothing.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from tensegrity_engine.physics import collision
from tensegrity_engine.physics.topology import Topology
from tensegrity_engine.physics.vectors import cross, dot


def per_rod(node_values: torch.Tensor) -> torch.Tensor:
    """Sum [..., 2R] end-node values per rod (nodes are ordered 2 r + end)."""
    return node_values[..., 0::2] + node_values[..., 1::2]


def cables(S: torch.Tensor, rest: torch.Tensor, p: dict, k: dict) -> dict:
    """The cables (CFG) of the components-first state S [..., 13, R]: tension-only
    spring-dampers between end nodes. Also what the rest of the force model builds on (the
    rod axes and the generalised node coordinates Y = [centres, axes])."""
    pos, vel, w = S[..., 0:3, :], S[..., 7:10, :], S[..., 10:13, :]
    qw, qx, qy, qz = S[..., 3, :], S[..., 4, :], S[..., 5, :], S[..., 6, :]
    axis = torch.stack([2.0 * (qx * qz + qw * qy), 2.0 * (qy * qz - qw * qx),
                        qw * qw - qx * qx - qy * qy + qz * qz], -2)
    axis_rate = cross(w, axis)
    Y = torch.cat([pos, axis], -1)                                     # [..., 3, 2R]
    Ydot = torch.cat([vel, axis_rate], -1)
    d = Y @ k["Wt"]                                                    # [..., 3, C]
    length = torch.sqrt(dot(d, d))
    u = d / length.unsqueeze(-2)
    length_rate = dot(Ydot @ k["Wt"], u)
    K, c, s = p["cable_stiffness"], p["cable_damping"], p["cable_slack_damping"]
    stretch = K * (length - rest) + ((1.0 - s) * c) * length_rate
    tension = torch.relu(stretch) + (s * c) * length_rate
    return {"axis": axis, "axis_rate": axis_rate, "Y": Y, "Ydot": Ydot, "d": d, "length": length, "u": u,
            "length_rate": length_rate, "stretch": stretch, "tension": tension}


class ForceModel:
    """Net force and torque on every rod of the components-first state S [..., 13, R].

    ``ground_contact_fn``: optional external (non-differentiable) ground collision checker,
    e.g. `mujoco_twin.MujocoGroundChecker`: fn(nodes [..., 3, 2R] float64 numpy, node radius
    [2R]) -> per-node penetration depth [..., 2R] (> 0: in contact). When set, the ground
    block uses that depth as a constant (no gradient through the contact geometry);
    everything else is unchanged. Used by the identification ablation (c).

    Under the soft contact law (``contact.law: soft``) neither the ground nor the rod pairs
    are forces here: the integrators solve them with the accelerations
    (`soft_pairs.SoftContacts`).
    """

    def __init__(self, topology: Topology, *, floor: bool, friction_smoothing: float,
                 angular_smoothing: float, ground_contact_fn: Optional[Callable] = None):
        self.topology = topology
        self.floor = floor
        soft = topology.robot.contact.law == "soft"
        self.soft_ground = bool(floor and soft)
        # rod pairs under the soft law are constraints too (`soft_pairs.SoftContacts`)
        self.soft_pairs = bool(soft and topology.num_pairs)
        if self.soft_ground and ground_contact_fn is not None:
            raise ValueError("the soft contact law solves the engine's own floor plane; an external "
                             "ground_contact_fn needs contact.law 'penalty'")
        self.friction_smoothing = friction_smoothing
        self.angular_smoothing = angular_smoothing
        self.ground_contact_fn = ground_contact_fn

    @property
    def soft_contacts(self) -> bool:
        """Whether the integrators solve soft-constraint contacts (ground or rod pairs)."""
        return self.soft_ground or self.soft_pairs

    @property
    def has_contacts(self) -> bool:
        return bool(self.floor or self.topology.num_pairs)

    def __call__(self, S: torch.Tensor, rest: torch.Tensor, p: dict,
                 wrench: Optional[torch.Tensor] = None, keep: bool = False,
                 defer_friction: bool = False) -> dict:
        """Forces on the components-first state S [..., 13, R]; vectors are [..., 3, n].

        ``keep`` also returns the intermediates `jacobians.force_jacobians` linearises.
        ``defer_friction`` leaves ground sliding friction out (the semi-implicit step adds
        it velocity-implicitly, see `ground_friction`).
        """
        k = self.topology.constants(S.dtype, S.device)
        R = self.topology.num_rods
        cab = cables(S, rest, p, k)
        axis, axis_rate, Y, Ydot = cab["axis"], cab["axis_rate"], cab["Y"], cab["Ydot"]
        d, length, u, stretch, tension = cab["d"], cab["length"], cab["u"], cab["stretch"], cab["tension"]
        pos, vel, w = S[..., 0:3, :], S[..., 7:10, :], S[..., 10:13, :]
        general = -((tension.unsqueeze(-2) * u) @ k["W"])                  # on Y, [..., 3, 2R]
        mass = p["rod_mass"].expand(R)
        out = {"axis": axis, "axis_rate": axis_rate, "mass": mass, "tension": tension,
               "inertia_factor": p["rod_inertia_factor"].expand(R)}
        if keep:
            out.update(d=d, length=length, u=u, stretch=stretch)
        kc, cc = p["contact_stiffness"], p["contact_damping"]
        mu_t, mu_r = p["friction_torsional"], p["friction_rolling"]
        eps_w = self.angular_smoothing
        X = None
        # ---- ground contacts (DCC + CRG): the two end spheres of every capsule
        ground_force = ground_torque = None
        if self.floor and not self.soft_ground:
            X = Y @ k["Nt"]                                                # end nodes [..., 3, 2R]
            Xdot = Ydot @ k["Nt"]
            r = k["node_radius"]
            if self.ground_contact_fn is not None:
                depth = torch.as_tensor(
                    np.asarray(self.ground_contact_fn(X.detach().cpu().numpy().astype(np.float64),
                                                      self.topology.numpy_constants["node_radius"])),
                    dtype=S.dtype, device=S.device).reshape(X.shape[:-2] + X.shape[-1:])
            else:
                depth = r - (X[..., 2, :] - self.topology.robot.contact.ground_height)
            w_nodes = w.repeat_interleave(2, dim=-1)
            # Lever from the rod centre to the contact point (node - r e_z); the contact
            # point's velocity adds w x (-r e_z) = r (-w_y, w_x, 0).
            lever = X - pos.repeat_interleave(2, dim=-1)
            lever_c = torch.cat([lever[..., :2, :], lever[..., 2:, :] - r], -2)
            vcx = Xdot[..., 0, :] - r * w_nodes[..., 1, :]
            vcy = Xdot[..., 1, :] + r * w_nodes[..., 0, :]
            active = depth > 0
            normal = torch.where(active, torch.relu(kc * depth - cc * Xdot[..., 2, :]),
                                 torch.zeros_like(depth))
            load = per_rod(normal)                                          # [..., R]
            wx, wy, wz = w[..., 0, :], w[..., 1, :], w[..., 2, :]
            spin = torch.sqrt(wz * wz + eps_w * eps_w)
            roll = torch.sqrt(wx * wx + wy * wy + eps_w * eps_w)
            roll_coef = mu_r * load / roll
            # Normal force (0, 0, N) at the lever: torque (l_y N, -l_x N, 0).
            zeros = torch.zeros_like(load)
            ground_force = torch.stack([zeros, zeros, load], -2)
            ground_torque = torch.stack([per_rod(lever_c[..., 1, :] * normal) - roll_coef * wx,
                                         -per_rod(lever_c[..., 0, :] * normal) - roll_coef * wy,
                                         -mu_t * load * wz / spin], -2)
            out["ground_slip"] = (vcx, vcy, normal, lever_c)
            if not defer_friction:
                f_fric, t_fric, speed = self.ground_friction(out, p, k)
                ground_force, ground_torque = ground_force + f_fric, ground_torque + t_fric
                if keep:
                    out["ground"] = (X, active, normal, speed, load, spin, roll)
        force = general[..., :R]
        torque = cross(axis, general[..., R:])
        if ground_force is not None:
            force, torque = force + ground_force, torque + ground_torque
        # ---- rod-rod contacts (capsule-capsule)
        if self.topology.num_pairs and not self.soft_pairs:
            if X is None:
                X = Y @ k["Nt"]
            contact = collision.capsule_contacts(
                X.index_select(-1, k["pair_a_node0"]), X.index_select(-1, k["pair_a_node1"]),
                X.index_select(-1, k["pair_b_node0"]), X.index_select(-1, k["pair_b_node1"]),
                k["pair_radius_a"], k["pair_radius_b"], dim=-2)
            active_p = contact.depth > 0
            # With no pair touching, the response below is exactly zero (forces and
            # gradients), so skip it; on CUDA (and in compiled graphs) the host sync would
            # cost more than the ops.
            if S.is_cuda or keep or torch.compiler.is_compiling() or bool(active_p.any()):
                force, torque = self.rod_rod_response(contact, active_p, pos, vel, w, force, torque,
                                                      p, k, out if keep else None)
        force = force + mass * k["gravity_col"]
        if wrench is not None:
            force = force + wrench[..., 0:3, :]
            torque = torque + wrench[..., 3:6, :]
        out["force"], out["torque"] = force, torque
        return out

    def ground_friction(self, out, p, k, h=None, acc=None, alpha=None):
        """Smooth Coulomb sliding friction at the ground contacts -> (force, torque, speed).

        Explicit (h None): F = -mu N v_t / sqrt(|v_t|^2 + eps^2).  Its damping coefficient
        mu N / eps (~1e4 N s/m for a SUPERball rod) is far beyond what an explicit 1 ms step
        can integrate: contacts chatter and the robot random-walks. With a step h the
        friction is velocity-implicit per contact: the tangential velocity the point would
        have after the step under all other forces, v* = v_t + h a_t, is damped by
        c / (1 + h c / m_eff) with c = mu N / sqrt(|v*|^2 + eps^2), so friction can stop a
        point within one step (static friction) but never reverse it. m_eff is a lower
        bound of the point's effective mass, 1 / (1/m + (L/2)^2/I_t + r^2/I_a).
        """
        vcx, vcy, normal, lever_c = out["ground_slip"]
        mu, eps = p["friction_sliding"], self.friction_smoothing
        if h is not None:
            acc_c = acc.repeat_interleave(2, dim=-1) + cross(alpha.repeat_interleave(2, dim=-1), lever_c)
            vcx, vcy = vcx + h * acc_c[..., 0, :], vcy + h * acc_c[..., 1, :]
        speed = torch.sqrt(vcx * vcx + vcy * vcy + eps * eps)
        coef = mu * normal / speed
        if h is not None:
            compliance = (k["node_compliance_axial"]
                          + k["node_compliance_transverse"] / out["inertia_factor"].repeat_interleave(2))
            inv_mass = compliance / out["mass"].repeat_interleave(2)
            coef = coef / (1.0 + h * coef * inv_mass)
        fx, fy = -coef * vcx, -coef * vcy
        zeros = torch.zeros_like(fx)
        force = torch.stack([per_rod(fx), per_rod(fy), zeros[..., 0::2]], -2)
        # lever x (fx, fy, 0) = (-l_z fy, l_z fx, l_x fy - l_y fx)
        lx, ly, lz = lever_c[..., 0, :], lever_c[..., 1, :], lever_c[..., 2, :]
        torque = torch.stack([per_rod(-lz * fy), per_rod(lz * fx), per_rod(lx * fy - ly * fx)], -2)
        return force, torque, speed

    def rod_rod_response(self, contact, active_p, pos, vel, w, force, torque, p, k, keep_out):
        """Add the capsule-capsule contact forces (normal penalty plus smooth Coulomb
        friction) of every rod pair to force and torque [..., 3, R]."""
        kc, cc, mu = p["contact_stiffness"], p["contact_damping"], p["friction_sliding"]
        eps = self.friction_smoothing
        ia, ib = k["pair_a"], k["pair_b"]
        ra = contact.point_a - pos.index_select(-1, ia)
        rb = contact.point_b - pos.index_select(-1, ib)
        v_rel = (vel.index_select(-1, ia) + cross(w.index_select(-1, ia), ra)
                 - vel.index_select(-1, ib) - cross(w.index_select(-1, ib), rb))
        v_n = dot(v_rel, contact.normal)
        normal_p = torch.where(active_p, torch.relu(kc * contact.depth - cc * v_n), torch.zeros_like(v_n))
        v_t = v_rel - v_n.unsqueeze(-2) * contact.normal
        speed_p = torch.sqrt(dot(v_t, v_t) + eps * eps)
        f_a = normal_p.unsqueeze(-2) * contact.normal - (mu * normal_p / speed_p).unsqueeze(-2) * v_t
        force = force + f_a @ k["pair_diff_T"]
        torque = torque + cross(ra, f_a) @ k["pair_onehot_a_T"] - cross(rb, f_a) @ k["pair_onehot_b_T"]
        if keep_out is not None:
            keep_out["pairs"] = (ra, rb, contact.normal, active_p, normal_p, speed_p)
        return force, torque
