"""MuJoCo's soft-constraint contacts between rods, and the solve that couples them with the
ground's (``contact.law: soft`` on a robot with ``contact.rod_rod``).

A capsule pair's contact is MuJoCo's (``mjc_CapsuleCapsule`` in general position): the
closest points pa, pb of the two axis segments, the normal n = (pb - pa) / |pb - pa| from
the lower-numbered rod a to rod b, the depth dist = |pb - pa| - r_a - r_b (< 0 in contact),
the point pa + n (r_a + dist / 2) and the frame of ``mju_makeFrame``: the first tangent is
(0, 1, 0) made orthogonal to n, or (0, 0, 1) when |n_y| >= 0.5. Its pyramid rows act on the
relative velocity of b against a at the point (the same rows as the ground's,
`soft_contact`), and the regulariser uses both rods' inverse masses (MuJoCo's
``diagApprox``: the sum of the two bodies' translational ``invweight0``; 0 for a rod welded
to the world). Rods and floor share one friction, solref and solimp, as in the robots this
package generates (`groundtruth.mujoco_twin`).

A pair's rows involve twelve velocities, so while any pair touches the problem no longer
separates per rod: `SoftContacts` then minimises MuJoCo's cost over all 6R accelerations at
once (the same Newton solve on a block-diagonal mass matrix). With no pair touching it is
the per-rod solve of the ground alone, or nothing.

Measured on the zoo's ``noisy_mocap`` (implicitfast, condim-4 contacts) hanging, the
engine with the robot's true values predicts 1 s ahead 1.90 mm off with penalty rod-rod
contacts and 0.000 mm with MuJoCo's rod-rod contacts switched off in both; see the README.
"""
from __future__ import annotations

import torch

from tensegrity_engine.physics.collision import segment_closest_points
from tensegrity_engine.physics.jacobians import block_diag
from tensegrity_engine.physics.soft_contact import (SoftGroundContact, impedance, pyramid, regulariser_scale,
                                                     solref_gains)
from tensegrity_engine.physics.vectors import cross, dot


# Newton iterations of the coupled solve: one step length serves every rod of a lane (and
# every lane of the batch solves coupled while one pair touches), so a kink on one rod
# shortens the step of all; more than the per-rod solve's 10, which the C kernel's coupled
# solve (to its own tolerance, only where a pair touches) agrees with to rounding.
COUPLED_NEWTON_ITERATIONS = 30


def _any_on_host(mask: torch.Tensor) -> bool:
    """``mask.any()`` as a Python bool; in a compiled step a deliberate graph break (the
    step resumes compiled on the branch taken) rather than dynamo's warning about it."""
    if torch.compiler.is_compiling():
        return _any_uncompiled(mask)
    return bool(mask.any())


# torch's own lazy form of torch.compiler.disable (torch is pinned): the public decorator
# imports dynamo (~1 s) in every process that imports the engine, compiled or not.
@torch._disable_dynamo
def _any_uncompiled(mask: torch.Tensor) -> bool:
    return bool(mask.any())


class SoftPairRows:
    """The pyramid rows of every rod pair's capsule-capsule contact."""

    def __init__(self, topology):
        contact = topology.robot.contact
        self.topology = topology
        self.solimp = tuple(float(v) for v in contact.solimp)
        self.condim = contact.soft_condim

    def rows(self, S, out, p, h, *, skip_apart: bool = False):
        """(J [..., P, E, 2, 6], aref [..., P, E], D [..., P, E]): each pair's rows on (rod a's,
        rod b's) velocities, E = 2 (condim - 1) (1 for condim 1), D = 0 where the pair is apart.
        ``skip_apart``: None when no pair touches anywhere in the batch, checked on the host
        (not on CUDA, where the rows are always built: a sync per step costs more there). In
        a compiled step on the CPU the check is a graph break, which costs far less than the
        coupled solve and its backward: a compiled implicit training epoch took 21 s with
        the rows always built, 1.4-1.5 s with the break (eager: 2.4 s)."""
        topology = self.topology
        k = topology.constants(S.dtype, S.device)
        pos, vel, w = S[..., 0:3, :], S[..., 7:10, :], S[..., 10:13, :]
        X = torch.cat([pos, out["axis"]], -1) @ k["Nt"]                     # end nodes [..., 3, 2R]
        _, _, pa, pb = segment_closest_points(
            X.index_select(-1, k["pair_a_node0"]), X.index_select(-1, k["pair_a_node1"]),
            X.index_select(-1, k["pair_b_node0"]), X.index_select(-1, k["pair_b_node1"]), dim=-2)
        ra, rb = k["pair_radius_a"], k["pair_radius_b"]
        diff = pb - pa
        length = dot(diff, diff).clamp(min=1e-30).sqrt()
        normal = diff / length.unsqueeze(-2)
        dist = length - ra - rb
        # diagApprox: both sides' translational inverse weights (0 for a rod welded to the world)
        ia, ib = k["pair_a"], k["pair_b"]
        inv_mass = k["free"] / out["mass"]
        inv_pair = inv_mass.index_select(-1, ia) + inv_mass.index_select(-1, ib)
        touching = (dist < 0) & (inv_pair > 0)      # two welded rods do not collide (MuJoCo's static bodies)
        if skip_apart and not S.is_cuda and not _any_on_host(touching):
            return None
        point = pa + (ra + 0.5 * dist).unsqueeze(-2) * normal
        lever_a, lever_b = point - pos.index_select(-1, ia), point - pos.index_select(-1, ib)
        # mju_makeFrame: (0, 1, 0) unless the normal is within 60 degrees of it, then (0, 0, 1)
        side = (normal[..., 1, :].abs() < 0.5).to(S.dtype)
        seed = torch.stack([torch.zeros_like(side), side, 1.0 - side], -2)
        tangent = seed - dot(normal, seed).unsqueeze(-2) * normal
        tangent = tangent / dot(tangent, tangent).sqrt().unsqueeze(-2)
        binormal = cross(normal, tangent)
        zeros = torch.zeros_like(normal)

        def sliding(d):             # b's point velocity minus a's along d: [-d, -la x d, d, lb x d]
            return torch.stack([torch.cat([-d, -cross(lever_a, d)], -2), torch.cat([d, cross(lever_b, d)], -2)], -3)

        def turning(d):             # relative angular velocity along d
            return torch.stack([torch.cat([zeros, -d], -2), torch.cat([zeros, d], -2)], -3)

        J, mu_s = pyramid(self.condim, p, sliding, turning, normal, tangent, binormal, dim=-4)   # [..., E, 2, 6, P]
        twist = torch.stack([torch.cat([vel.index_select(-1, ia), w.index_select(-1, ia)], -2),
                             torch.cat([vel.index_select(-1, ib), w.index_select(-1, ib)], -2)], -3)
        speed = (J * twist.unsqueeze(-4)).sum((-3, -2))                      # [..., E, P]
        B, K = solref_gains(p, self.solimp, h)
        imp = impedance(dist, self.solimp)
        aref = -B * speed - (K * imp * dist).unsqueeze(-2)
        # where the pair is apart (or both rods welded) the regulariser is replaced before the
        # division: 1 / (a clamped 0) would overflow float32 in the backward pass even unused
        regulariser = torch.where(touching, regulariser_scale(imp, mu_s) * inv_pair, torch.ones_like(dist))
        D = torch.where(touching, 1.0 / regulariser, torch.zeros_like(dist)).unsqueeze(-2).expand_as(aref)
        return J.movedim(-1, -4), aref.movedim(-1, -2), D.movedim(-1, -2)


class SoftContacts:
    """The soft-constraint contacts of the robot: the ground's (with a floor) and the rod
    pairs' (``contact.rod_rod``). `accelerations` for semi-implicit steps, `wrench` for
    integrators that solve their own velocity update."""

    def __init__(self, topology, rods, *, ground: bool, pairs: bool):
        if not (ground or pairs):
            raise ValueError("SoftContacts needs the ground, the rod pairs or both")
        self.topology, self.rods = topology, rods
        self.ground = SoftGroundContact(topology, rods) if ground else None
        self.pairs = SoftPairRows(topology) if pairs and topology.num_pairs else None

    def _solved(self, S, out, p, h, acc, alpha):
        """(M, a0, a) [..., R, 6(, 6)]: mass matrices, accelerations without the contacts
        and with them."""
        M = self.rods.mass_matrix(S, out)
        a0 = torch.cat([acc, alpha], -2).transpose(-1, -2)
        # With no pair touching the coupled solve is the per-rod one (or none); on CUDA the
        # host sync would cost more than solving coupled
        pair_rows = self.pairs.rows(S, out, p, h, skip_apart=True) if self.pairs is not None else None
        if pair_rows is None:
            if self.ground is None:
                return M, a0, a0
            return M, a0, SoftGroundContact.solve(M, a0, *self.ground.rows(S, out, p, h))
        R = self.topology.num_rods
        k = self.topology.constants(S.dtype, S.device)
        batch = a0.shape[:-2]
        J_p, aref, D = pair_rows
        # pair rows on all 6R velocities: rod a's block at a, rod b's at b
        onehot = torch.stack([k["pair_onehot_a"].T, k["pair_onehot_b"].T], -2)   # [P, 2, R]
        J = torch.einsum("...pesc,psr->...perc", J_p, onehot).flatten(-2).flatten(-3, -2)
        aref, D = aref.flatten(-2), D.flatten(-2)
        if self.ground is not None:
            J_g, aref_g, D_g = self.ground.rows(S, out, p, h)                  # [..., R, E, 6]
            eye = torch.eye(R, dtype=S.dtype, device=S.device)
            J_g = (J_g.unsqueeze(-2) * eye[:, None, :, None]).flatten(-2).flatten(-3, -2)
            J, aref, D = torch.cat([J.expand(*batch, *J.shape[-2:]), J_g], -2), torch.cat(
                [aref.expand(*batch, aref.shape[-1]), aref_g.flatten(-2)], -1), torch.cat(
                [D.expand(*batch, D.shape[-1]), D_g.flatten(-2)], -1)
        if self.topology.fixed_rods:        # a welded rod does not move: its columns vanish
            J = J * k["free"].repeat_interleave(6)
        a = SoftGroundContact.solve(block_diag(M), a0.flatten(-2), J, aref, D, COUPLED_NEWTON_ITERATIONS)
        return M, a0, a.unflatten(-1, (R, 6))

    def accelerations(self, S, out, p, h, acc, alpha):
        """(acc, alpha) [..., 3, R] with the contacts, from those without them."""
        a = self._solved(S, out, p, h, acc, alpha)[2].transpose(-1, -2)
        acc, alpha = a[..., :3, :], a[..., 3:, :]
        if self.topology.fixed_rods:
            free = self.topology.constants(S.dtype, S.device)["free"]
            acc, alpha = acc * free, alpha * free
        return acc, alpha

    def wrench(self, S, out, p, h, acc, alpha):
        """(force, torque) [..., 3, R] the contacts apply: M (a - a0), with a0 = (acc, alpha)."""
        M, a0, a = self._solved(S, out, p, h, acc, alpha)
        w = (M @ (a - a0).unsqueeze(-1)).squeeze(-1).transpose(-1, -2)
        return w[..., :3, :], w[..., 3:, :]
