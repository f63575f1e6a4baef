"""Stiffness and damping Jacobians of the force model, for the implicit integrator.

K and D [..., 6R, 6R] are the (PSD) linearisations of cable and contact forces w.r.t. the
rod displacements and velocities xi = (v, w), rod-major: each spring or contact with force
Jacobian H at points of rods a and b adds S^T H S, S = G_b E_b - G_a E_a, where
G = [I, -[r]x] maps (v, w) to the velocity of the point at lever r.
"""
from __future__ import annotations

from typing import Optional

import torch

from tensegrity_engine.physics.state import POS
from tensegrity_engine.physics.topology import Topology
from tensegrity_engine.physics.vectors import outer


def skew(v: torch.Tensor) -> torch.Tensor:
    x, y, z = v.unbind(-1)
    o = torch.zeros_like(x)
    return torch.stack([torch.stack([o, -z, y], -1), torch.stack([z, o, -x], -1),
                        torch.stack([-y, x, o], -1)], -2)


def block_diag(blocks: torch.Tensor) -> torch.Tensor:
    """[..., R, 6, 6] -> block-diagonal [..., 6R, 6R]."""
    R = blocks.shape[-3]
    eye = torch.eye(R, dtype=blocks.dtype, device=blocks.device)
    full = eye[:, None, :, None] * blocks.unsqueeze(-2)  # [..., R, 6, R, 6]
    return full.reshape(*blocks.shape[:-3], 6 * R, 6 * R)


_compiling = torch.compiler.is_compiling     # the tests run the compiled forms eagerly through it


def _by_rod(R: int, rod_b: torch.Tensor, v_b: torch.Tensor, rod_a: Optional[torch.Tensor] = None,
            v_a: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[..., P, R, k]: each pair's v_b [..., P, k] at its rod b's slot, minus v_a at rod a's.
    Eager: scatters (the faster here). Compiled: products with one-hot rows, because
    inductor's multithreaded CPU code for the scatter corrupted the heap (torch 2.13: the
    compiled implicit step crashed on 2 threads with "free(): invalid next size")."""
    if _compiling():
        eye = torch.eye(R, dtype=v_b.dtype, device=v_b.device)
        out = v_b.unsqueeze(-2) * eye[rod_b].unsqueeze(-1)
        return out if rod_a is None else out - v_a.unsqueeze(-2) * eye[rod_a].unsqueeze(-1)
    P = rod_b.shape[0]
    slots = torch.arange(P, device=v_b.device) * R
    out = v_b.new_zeros(*v_b.shape[:-2], P * R, v_b.shape[-1]).index_add(-2, slots + rod_b, v_b)
    if rod_a is not None:
        out = out.index_add(-2, slots + rod_a, v_a, alpha=-1.0)
    return out.unflatten(-2, (P, R))


def _signed_levers(R: int, rod_b: torch.Tensor, r_b: torch.Tensor,
                   rod_a: Optional[torch.Tensor] = None, r_a: Optional[torch.Tensor] = None):
    """Each pair's ends as rod columns: the signed incidence M [P, R] (+1 at rod b, -1 at rod
    a) and the signed levers Q [..., P, 3R] (r_b at rod b's columns, -r_a at rod a's), so that
    S_p = [M_p (x) I, -[Q_p]x] rod by rod (S_p = G_b E_b - G_a E_a, G = [I, -[r]x])."""
    eye = torch.eye(R, dtype=r_b.dtype, device=r_b.device)
    Q = _by_rod(R, rod_b, r_b, rod_a, r_a)                              # [..., P, R, 3]
    M = eye[rod_b] if rod_a is None else eye[rod_b] - eye[rod_a]
    return M, Q.flatten(-2)


def _isotropic(weight: torch.Tensor, M: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """sum_p weight_p S_p^T S_p [..., 6R, 6R] from `_signed_levers`: by rod blocks (y, z),
    [[L I, -[V_yz]x], [[V_zy]x, (W_yz . I) I - W_zy]] with L = M^T w M, V = M^T w Q and
    W = Q^T w Q: three small matmuls over the pairs instead of a 3 x 6R map per pair."""
    R = M.shape[-1]
    wM = (weight.unsqueeze(-1) * M).transpose(-1, -2)                   # [..., R, P]
    L = wM @ M                                                          # [..., R, R]
    V = (wM @ Q).unflatten(-1, (R, 3))                                  # [..., y, z, 3]
    W = ((weight.unsqueeze(-1) * Q).transpose(-1, -2) @ Q)              # [..., 3R (y, j), 3R (z, i)]
    W = W.unflatten(-1, (R, 3)).unflatten(-3, (R, 3))                   # [..., y, j, z, i]
    nb = W.dim() - 4
    W_yzij = W.permute(*range(nb), nb, nb + 2, nb + 3, nb + 1)          # [..., y, z, i, j] = W[y, j, z, i]
    eye3 = torch.eye(3, dtype=W.dtype, device=W.device)
    trace = W.diagonal(dim1=-3, dim2=-1).sum(-1)                        # [..., y, z]: Q_y . Q_z
    top = torch.cat([(L[..., None, None] * eye3).expand_as(W_yzij), -skew(V)], -1)
    bottom = torch.cat([skew(V.transpose(-2, -3)), trace[..., None, None] * eye3 - W_yzij], -1)
    blocks = torch.cat([top, bottom], -2)                               # [..., y, z, 6, 6]
    return blocks.transpose(-3, -2).reshape(*blocks.shape[:-4], 6 * R, 6 * R)


def _rank_one(weight: torch.Tensor, R: int, rod_b: torch.Tensor, j_b: torch.Tensor,
              rod_a: Optional[torch.Tensor] = None, j_a: Optional[torch.Tensor] = None) -> torch.Tensor:
    """sum_p weight_p s_p s_p^T [..., 6R, 6R], s_p = j_b E_b - j_a E_a, from each end's
    generalised force of a unit force along the pair's direction (j [..., P, 6])."""
    s = _by_rod(R, rod_b, j_b, rod_a, j_a).flatten(-2)                  # [..., P, 6R]
    return (s * weight.unsqueeze(-1)).transpose(-1, -2) @ s


def _plucker(r: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """j = G^T u = (u, r x u) [..., P, 6]: the generalised force of a unit force along u at
    lever r."""
    return torch.cat([u, torch.linalg.cross(r, u, dim=-1)], -1)


def force_jacobians(topology: Topology, state: torch.Tensor, out: dict, p: dict):
    """Linearisation (K, D) of cable and contact forces for the implicit integrator.

    ``state`` is rod-major [..., R, 13]; ``out`` is a `ForceModel` result computed with
    ``keep=True`` (its intermediates are reused, not recomputed). Every pair's force Jacobian
    is a rank-one term along its direction plus an isotropic one, assembled over all pairs
    by a few matmuls (`_rank_one`, `_isotropic`).
    """
    k = topology.constants(state.dtype, state.device)
    R = topology.num_rods
    dtype = state.dtype
    T = lambda x: x.transpose(-1, -2)
    axis, u = T(out["axis"]), T(out["u"])
    length, tension, stretch = out["length"], out["tension"], out["stretch"]
    rod_a, rod_b = k["cable_rod_a"], k["cable_rod_b"]
    lever_a = axis.index_select(-2, rod_a) * k["cable_lever_a"].unsqueeze(-1)
    lever_b = axis.index_select(-2, rod_b) * k["cable_lever_b"].unsqueeze(-1)
    j_a, j_b = _plucker(lever_a, u), _plucker(lever_b, u)
    taut = (stretch > 0).to(dtype)
    c, s = p["cable_damping"], p["cable_slack_damping"]
    # A cable's stiffness is K u u^T while taut plus its geometric term (T / l)(I - u u^T).
    geometric = tension / length
    Kmat = (_rank_one(taut * p["cable_stiffness"] - geometric, R, rod_b, j_b, rod_a, j_a)
            + _isotropic(geometric, *_signed_levers(R, rod_b, lever_b, rod_a, lever_a)))
    Dmat = _rank_one(taut * (1.0 - s) * c + s * c, R, rod_b, j_b, rod_a, j_a)
    kc, cc, mu = p["contact_stiffness"], p["contact_damping"], p["friction_sliding"]
    if "ground" in out:
        X, active, normal, speed, load, spin, roll = out["ground"]
        r = k["node_radius"]
        node_lever = T(X).unflatten(-2, (R, 2)) - state[..., None, POS]
        r_c = (node_lever - r.unflatten(-1, (R, 2)).unsqueeze(-1) * k["ez"]).flatten(-3, -2)   # [..., 2R, 3]
        node_rod = torch.arange(R, device=state.device).repeat_interleave(2)
        j_c = _plucker(r_c, k["ez"].expand_as(r_c))
        act = active.to(dtype)
        # Sliding friction damps the tangential plane: mu N / |v_t| (I - ez ez^T).
        sliding = mu * normal / speed
        Kmat = Kmat + _rank_one(act * kc, R, node_rod, j_c)
        Dmat = (Dmat + _rank_one(act * cc - sliding, R, node_rod, j_c)
                + _isotropic(sliding, *_signed_levers(R, node_rod, r_c)))
        roll_d = (p["friction_rolling"] * load / roll).unsqueeze(-1)
        rot_damp = torch.cat([torch.zeros_like(roll_d).expand(*roll_d.shape[:-1], 3), roll_d, roll_d,
                              (p["friction_torsional"] * load / spin).unsqueeze(-1)], -1)       # [..., R, 6]
        Dmat = Dmat + torch.diag_embed(rot_damp.flatten(-2))
    if "pairs" in out:
        ra, rb, n, active_p, normal_p, speed_p = out["pairs"]
        ra, rb, n = T(ra), T(rb), T(n)
        pa, pb = k["pair_a"], k["pair_b"]
        jp_a, jp_b = _plucker(ra, n), _plucker(rb, n)
        act = active_p.to(dtype)
        sliding = mu * normal_p / speed_p
        Kmat = Kmat + _rank_one(act * kc, R, pb, jp_b, pa, jp_a)
        Dmat = (Dmat + _rank_one(act * cc - sliding, R, pb, jp_b, pa, jp_a)
                + _isotropic(sliding, *_signed_levers(R, pb, rb, pa, ra)))
    return Kmat, Dmat


def own_cable_damping_blocks(topology: Topology, S: torch.Tensor, out: dict, p: dict) -> torch.Tensor:
    """Each rod's own 6x6 block of the cable damping Jacobian D [..., R, 6, 6] (components-first
    S [..., 13, R], ``out`` a `ForceModel` result with ``keep=True``): sum over the rod's cable
    ends of c_eff j j^T, j = G^T u, where c_eff is the slack share s c always plus (1 - s) c
    while the clamped part pulls (K (l - l0) + (1 - s) c dl/dt > 0). These are the rows MuJoCo's
    ``implicitfast`` keeps for a free body: its tendon damping always, an actuator's velocity
    bias only while its force is inside the force range, and nothing across bodies."""
    k = topology.constants(S.dtype, S.device)
    R = topology.num_rods
    T = lambda x: x.transpose(-1, -2)
    axis, u = T(out["axis"]), T(out["u"])                            # [..., R, 3], [..., C, 3]
    rod_a, rod_b = k["cable_rod_a"], k["cable_rod_b"]
    j_a = _plucker(axis.index_select(-2, rod_a) * k["cable_lever_a"].unsqueeze(-1), u)
    j_b = _plucker(axis.index_select(-2, rod_b) * k["cable_lever_b"].unsqueeze(-1), u)
    c, s = p["cable_damping"], p["cable_slack_damping"]
    pulls = (out["stretch"] > 0).to(S.dtype)
    c_eff = (pulls * (1.0 - s) * c + s * c)[..., None, None]
    blocks = torch.cat([c_eff * outer(j_a, j_a), c_eff * outer(j_b, j_b)], -3)   # [..., 2C, 6, 6]
    ends = torch.cat([rod_a, rod_b])
    if _compiling():                            # no scatter in compiled code, as `_by_rod`
        return torch.einsum("er,...eij->...rij", torch.eye(R, dtype=S.dtype, device=S.device)[ends], blocks)
    out_blocks = torch.zeros(*blocks.shape[:-3], R, 6, 6, dtype=S.dtype, device=S.device)
    return out_blocks.index_add(-3, ends, blocks)
