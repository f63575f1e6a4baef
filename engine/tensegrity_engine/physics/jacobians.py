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


def _plucker(r: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """j = G^T u = (u, r x u) [..., P, 6]: the generalised force of a unit force along u at
    lever r."""
    return torch.cat([u, torch.linalg.cross(r, u, dim=-1)], -1)


def _pair_terms(topology: Topology, state: torch.Tensor, out: dict, p: dict):
    """The cables' and contacts' Jacobian terms: rank-one ``(s [..., P, 6R], wK, wD)``
    (K += s^T diag(wK) s, D likewise; s_p = j_b E_b - j_a E_a, each end's generalised force
    of a unit force along the pair's direction), isotropic ``(ends, wK, wD)`` with ends
    ``(rod_b, r_b, rod_a, r_a)`` (`_isotropic`; rod_a None: the ground), and D's diagonal
    [..., 6R] (rolling and torsional friction) or None; a weight None adds nothing."""
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
    rank = [(_by_rod(R, rod_b, j_b, rod_a, j_a).flatten(-2), taut * p["cable_stiffness"] - geometric,
             taut * (1.0 - s) * c + s * c)]
    iso = [((rod_b, lever_b, rod_a, lever_a), geometric, None)]
    diagonal = None
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
        rank.append((_by_rod(R, node_rod, j_c).flatten(-2), act * kc, act * cc - sliding))
        iso.append(((node_rod, r_c, None, None), None, sliding))
        roll_d = (p["friction_rolling"] * load / roll).unsqueeze(-1)
        diagonal = torch.cat([torch.zeros_like(roll_d).expand(*roll_d.shape[:-1], 3), roll_d, roll_d,
                              (p["friction_torsional"] * load / spin).unsqueeze(-1)], -1).flatten(-2)
    if "pairs" in out:
        ra, rb, n, active_p, normal_p, speed_p = out["pairs"]
        ra, rb, n = T(ra), T(rb), T(n)
        pa, pb = k["pair_a"], k["pair_b"]
        jp_a, jp_b = _plucker(ra, n), _plucker(rb, n)
        act = active_p.to(dtype)
        sliding = mu * normal_p / speed_p
        rank.append((_by_rod(R, pb, jp_b, pa, jp_a).flatten(-2), act * kc, act * cc - sliding))
        iso.append(((pb, rb, pa, ra), None, sliding))
    return rank, iso, diagonal


def _rank_sum(s: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """sum_p weight_p s_p s_p^T [..., 6R, 6R] (s [..., P, 6R])."""
    return (s * weight.unsqueeze(-1)).transpose(-1, -2) @ s


def _summed(parts):
    parts = [x for x in parts if x is not None]
    total = parts[0]
    for x in parts[1:]:
        total = total + x
    return total


def force_jacobians(topology: Topology, state: torch.Tensor, out: dict, p: dict):
    """Linearisation (K, D) of cable and contact forces for the implicit integrator.

    ``state`` is rod-major [..., R, 13]; ``out`` is a `ForceModel` result computed with
    ``keep=True`` (its intermediates are reused, not recomputed). Every pair's force Jacobian
    is a rank-one term along its direction plus an isotropic one, assembled over all pairs
    by a few matmuls (`_rank_sum`, `_isotropic`). The implicit step assembles h D + h^2 K
    at once instead (`implicit_system`).
    """
    rank, iso, diagonal = _pair_terms(topology, state, out, p)
    R = topology.num_rods
    Kmat = _summed([_rank_sum(s, wK) for s, wK, _ in rank]
                   + [_isotropic(wK, *_signed_levers(R, *ends)) for ends, wK, _ in iso if wK is not None])
    Dmat = _summed([_rank_sum(s, wD) for s, _, wD in rank]
                   + [_isotropic(wD, *_signed_levers(R, *ends)) for ends, _, wD in iso if wD is not None]
                   + [None if diagonal is None else torch.diag_embed(diagonal)])
    return Kmat, Dmat


def _step_weight(wK: Optional[torch.Tensor], wD: Optional[torch.Tensor], h: float) -> torch.Tensor:
    """h wD + h^2 wK, either weight None (absent)."""
    if wD is None:
        return (h * h) * wK
    return h * wD if wK is None else torch.add(h * wD, wK, alpha=h * h)


def _isotropic_times(weight: torch.Tensor, R: int, rod_b: torch.Tensor, r_b: torch.Tensor,
                     rod_a: torch.Tensor, r_a: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
    """`_isotropic`'s matrix of a two-ended pair set times xi [..., 6R] without forming it:
    each pair's relative point velocity S_p xi = (v_b + w_b x r_b) - (v_a + w_a x r_a),
    weighted, mapped back by S_p^T (the force y and the torque r x y at each end). Rods are
    gathered and scattered by one-hot products (no scatter in compiled code, as `_by_rod`)."""
    motion = xi.unflatten(-1, (R, 6))
    v, w = motion[..., :3], motion[..., 3:]
    eye = torch.eye(R, dtype=xi.dtype, device=xi.device)
    at_b, at_a = eye[rod_b], eye[rod_a]                                  # [P, R]
    rel = (at_b @ v + torch.linalg.cross(at_b @ w, r_b, dim=-1)
           - at_a @ v - torch.linalg.cross(at_a @ w, r_a, dim=-1))
    y = weight.unsqueeze(-1) * rel                                       # [..., P, 3]
    moments = at_b.T @ torch.cat([y, torch.linalg.cross(r_b, y, dim=-1)], -1) \
        - at_a.T @ torch.cat([y, torch.linalg.cross(r_a, y, dim=-1)], -1)
    return moments.flatten(-2)


def implicit_system(topology: Topology, state: torch.Tensor, out: dict, p: dict, h: float,
                    xi: torch.Tensor, free6: Optional[torch.Tensor] = None):
    """(h D + h^2 K, K xi) for the linearised backward Euler step, without forming K and D:
    each rank-one term enters once with the weight h wD + h^2 wK, and K xi is taken pair by
    pair. ``free6`` [6R] (fixed rods: 0) zeroes the fixed rods' rows and columns, so that
    with the rods' mass blocks added the system decouples them (a zero right-hand side
    there keeps them still) without masking the whole matrix. K xi is unmasked (K's own, as
    the step's right-hand side takes it before zeroing the fixed rods' rows)."""
    rank, iso, diagonal = _pair_terms(topology, state, out, p)
    R = topology.num_rods
    parts, kxi = [], []
    for s, wK, wD in rank:
        kxi.append((s.transpose(-1, -2) @ (wK.unsqueeze(-1) * (s @ xi.unsqueeze(-1)))).squeeze(-1))
        parts.append(_rank_sum(s if free6 is None else s * free6, _step_weight(wK, wD, h)))
    for ends, wK, wD in iso:
        M, Q = _signed_levers(R, *ends)
        if free6 is not None:
            free = free6[::6]
            M, Q = M * free, Q * free.repeat_interleave(3)
        parts.append(_isotropic(_step_weight(wK, wD, h), M, Q))
        if wK is not None:            # the cables' geometric stiffness: two-ended
            kxi.append(_isotropic_times(wK, R, *ends, xi))
    if diagonal is not None:
        parts.append(torch.diag_embed(h * (diagonal if free6 is None else diagonal * free6)))
    return _summed(parts), _summed(kxi)


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
