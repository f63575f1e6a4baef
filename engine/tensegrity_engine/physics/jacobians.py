"""Stiffness and damping Jacobians of the force model, for the implicit integrator.

K and D [..., 6R, 6R] are the (PSD) linearisations of cable and contact forces w.r.t. the
rod displacements and velocities xi = (v, w), rod-major: each spring or contact with force
Jacobian H at points of rods a and b adds S^T H S, S = G_b E_b - G_a E_a, where
G = [I, -[r]x] maps (v, w) to the velocity of the point at lever r.
"""
from __future__ import annotations

import torch

from tensegrity_engine.physics.state import POS
from tensegrity_engine.physics.topology import Topology
from tensegrity_engine.physics.vectors import outer


def skew(v: torch.Tensor) -> torch.Tensor:
    x, y, z = v.unbind(-1)
    o = torch.zeros_like(x)
    return torch.stack([torch.stack([o, -z, y], -1), torch.stack([z, o, -x], -1),
                        torch.stack([-y, x, o], -1)], -2)


def _point_jacobian(r: torch.Tensor) -> torch.Tensor:
    """G = [I, -[r]x]: velocity of a point at lever arm r from (v, w). [..., 3, 6]"""
    eye = torch.eye(3, dtype=r.dtype, device=r.device).expand(*r.shape[:-1], 3, 3)
    return torch.cat([eye, -skew(r)], -1)


def block_diag(blocks: torch.Tensor) -> torch.Tensor:
    """[..., R, 6, 6] -> block-diagonal [..., 6R, 6R]."""
    R = blocks.shape[-3]
    eye = torch.eye(R, dtype=blocks.dtype, device=blocks.device)
    full = eye[:, None, :, None] * blocks.unsqueeze(-2)  # [..., R, 6, R, 6]
    return full.reshape(*blocks.shape[:-3], 6 * R, 6 * R)


def _pair_blocks(H, Ga, Gb, rod_a, rod_b, R, batch, dtype, device):
    """Assemble sum_c S_c^T H_c S_c with S_c = G_b E_b - G_a E_a into [..., 6R, 6R]."""
    GaT, GbT = Ga.transpose(-1, -2), Gb.transpose(-1, -2)
    blocks = torch.cat([GaT @ H @ Ga, GbT @ H @ Gb, -(GaT @ H @ Gb), -(GbT @ H @ Ga)], -3)
    index = torch.cat([rod_a * R + rod_a, rod_b * R + rod_b, rod_a * R + rod_b, rod_b * R + rod_a])
    full = torch.zeros(*batch, R * R, 6, 6, dtype=dtype, device=device)
    full = full.index_add(-3, index, blocks)
    return full.reshape(*batch, R, R, 6, 6).transpose(-3, -2).reshape(*batch, 6 * R, 6 * R)


def force_jacobians(topology: Topology, state: torch.Tensor, out: dict, p: dict):
    """Linearisation (K, D) of cable and contact forces for the implicit integrator.

    ``state`` is rod-major [..., R, 13]; ``out`` is a `ForceModel` result computed with
    ``keep=True`` (its intermediates are reused, not recomputed).
    """
    k = topology.constants(state.dtype, state.device)
    R = topology.num_rods
    dtype, device = state.dtype, state.device
    batch = state.shape[:-2]
    eye3 = torch.eye(3, dtype=dtype, device=device)
    T = lambda x: x.transpose(-1, -2)
    axis, u = T(out["axis"]), T(out["u"])
    length, tension, stretch = out["length"], out["tension"], out["stretch"]
    rod_a, rod_b = k["cable_rod_a"], k["cable_rod_b"]
    lever_a = axis.index_select(-2, rod_a) * k["cable_lever_a"].unsqueeze(-1)
    lever_b = axis.index_select(-2, rod_b) * k["cable_lever_b"].unsqueeze(-1)
    Ga, Gb = _point_jacobian(lever_a), _point_jacobian(lever_b)
    taut = (stretch > 0).to(dtype)[..., None, None]
    uu = outer(u, u)
    c, s = p["cable_damping"], p["cable_slack_damping"]
    H = (taut * p["cable_stiffness"][..., None, None] * uu
         + (tension / length)[..., None, None] * (eye3 - uu))
    Dc = (taut * ((1.0 - s) * c)[..., None, None] + (s * c)[..., None, None]) * uu
    Kmat = _pair_blocks(H, Ga, Gb, rod_a, rod_b, R, batch, dtype, device)
    Dmat = _pair_blocks(Dc, Ga, Gb, rod_a, rod_b, R, batch, dtype, device)
    kc, cc, mu = p["contact_stiffness"], p["contact_damping"], p["friction_sliding"]
    if "ground" in out:
        X, active, normal, speed, load, spin, roll = out["ground"]
        r = k["node_radius"]
        node_lever = T(X).unflatten(-2, (R, 2)) - state[..., None, POS]
        r_c = node_lever - r.unflatten(-1, (R, 2)).unsqueeze(-1) * k["ez"]
        G_c = _point_jacobian(r_c)                                      # [..., R, 2, 3, 6]
        ezz = outer(k["ez"], k["ez"])
        act = active.to(dtype).unflatten(-1, (R, 2))[..., None, None]
        Hc = act * kc * ezz
        Dcon = act * cc * ezz + (mu * normal / speed).unflatten(-1, (R, 2))[..., None, None] * (eye3 - ezz)
        GcT = G_c.transpose(-1, -2)
        Kblk = (GcT @ Hc @ G_c).sum(-3)
        Dblk = (GcT @ Dcon @ G_c).sum(-3)
        roll_d = (p["friction_rolling"] * load / roll).unsqueeze(-1)
        rot_damp = torch.cat([roll_d, roll_d, (p["friction_torsional"] * load / spin).unsqueeze(-1)], -1)
        Dblk = Dblk + torch.diag_embed(torch.cat([torch.zeros_like(rot_damp), rot_damp], -1))
        Kmat = Kmat + block_diag(Kblk)
        Dmat = Dmat + block_diag(Dblk)
    if "pairs" in out:
        ra, rb, n, active_p, normal_p, speed_p = out["pairs"]
        ra, rb, n = T(ra), T(rb), T(n)
        nn_ = outer(n, n)
        act = active_p.to(dtype)[..., None, None]
        Hp = act * kc * nn_
        Dp = act * cc * nn_ + (mu * normal_p / speed_p)[..., None, None] * (eye3 - nn_)
        Ga, Gb = _point_jacobian(ra), _point_jacobian(rb)
        Kmat = Kmat + _pair_blocks(Hp, Ga, Gb, k["pair_a"], k["pair_b"], R, batch, dtype, device)
        Dmat = Dmat + _pair_blocks(Dp, Ga, Gb, k["pair_a"], k["pair_b"], R, batch, dtype, device)
    return Kmat, Dmat


def own_cable_damping_blocks(topology: Topology, S: torch.Tensor, out: dict, p: dict) -> torch.Tensor:
    """Each rod's own 6x6 block of the cable damping Jacobian D [..., R, 6, 6] (components-first
    S [..., 13, R], ``out`` a `ForceModel` result with ``keep=True``): sum over the rod's cable
    ends of c_eff G^T u u^T G, where c_eff is the slack share s c always plus (1 - s) c while
    the clamped part pulls (K (l - l0) + (1 - s) c dl/dt > 0). These are the rows MuJoCo's
    ``implicitfast`` keeps for a free body: its tendon damping always, an actuator's velocity
    bias only while its force is inside the force range, and nothing across bodies."""
    k = topology.constants(S.dtype, S.device)
    R = topology.num_rods
    T = lambda x: x.transpose(-1, -2)
    axis, u = T(out["axis"]), T(out["u"])                            # [..., R, 3], [..., C, 3]
    rod_a, rod_b = k["cable_rod_a"], k["cable_rod_b"]
    Ga = _point_jacobian(axis.index_select(-2, rod_a) * k["cable_lever_a"].unsqueeze(-1))
    Gb = _point_jacobian(axis.index_select(-2, rod_b) * k["cable_lever_b"].unsqueeze(-1))
    c, s = p["cable_damping"], p["cable_slack_damping"]
    pulls = (out["stretch"] > 0).to(S.dtype)
    c_eff = (pulls * (1.0 - s) * c + s * c)[..., None, None]
    H = c_eff * outer(u, u)                                          # [..., C, 3, 3]
    blocks = torch.cat([Ga.transpose(-1, -2) @ H @ Ga, Gb.transpose(-1, -2) @ H @ Gb], -3)
    out_blocks = torch.zeros(*blocks.shape[:-3], R, 6, 6, dtype=S.dtype, device=S.device)
    return out_blocks.index_add(-3, torch.cat([rod_a, rod_b]), blocks)
