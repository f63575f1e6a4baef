"""MuJoCo's soft-constraint ground contact (``contact.law: soft``), solved exactly per rod
(the rod pairs' contacts under the same law, and the solve they couple: `soft_pairs`).

The paper's penalty law (`forces.ForceModel`) is a spring-damper per end sphere with smooth
Coulomb friction. MuJoCo instead treats a contact as a soft constraint in acceleration
space: each row i of a pyramidal friction cone (J_i = J_n +- mu_k J_k, k over the sliding,
torsional and rolling directions of the contact frame, as ``condim`` 3, 4 or 6 has them;
condim 1 is the normal row alone) has a reference acceleration

    aref_i = -B (J_i v) - K imp(dist) dist,   B = 2 / (dmax tc),  K = 1 / (dmax^2 tc^2 zeta^2)

(solref = (tc, zeta), solimp's impedance imp in [dmin, dmax] over ``width`` of penetration)
and the accelerations a minimise

    1/2 (a - a0)' M (a - a0) + sum_i 1/2 D_i min(0, J_i a - aref_i)^2,

a0 the accelerations without the contact, D_i = 1 / R_i with MuJoCo's regulariser
R = 2 mu_s^2 (1 - imp)/imp (1 + mu_s^2) / m for every edge of a contact's pyramid (its
``diagApprox`` of a free body, impratio 1). A free rod's ground contacts involve only its
own six velocities, so the problem separates per rod: a convex piecewise quadratic in six
unknowns with up to two contacts x 2 (condim - 1) rows, solved by Newton's method with an
exact line search (``NEWTON_ITERATIONS`` x ``LINE_SEARCH_ITERATIONS``, fixed so a step
batches and differentiates; measured: 10 x 4 solve random 20-row problems to rounding,
where 6 left 4 of 192 at a relative gradient of 6e-3; rolling SUPERball steps need 2-6). The contact
frame is MuJoCo's for a capsule on a plane: the normal, the rod axis projected on the
plane, and their cross product; the point is halfway into the penetration.

Measured on MuJoCo's model of the SUPERball rolling under random commands (its default
solref/solimp, pyramidal condim-6 contacts, Euler): the engine with the robot's values
predicts the centre of mass 0.1 / 0.5 / 1 s ahead within 0.2 / 2.1 / 5.7 mm with this law,
against 5.4 / 46.6 / 130.9 mm with the penalty law; the same robot restarted with a 1 %
velocity error (the chaos floor) is 0.7 / 2.3 / 3.4 mm off.

Rod-rod contacts under this law are MuJoCo's too (`soft_pairs`: they couple the rods'
problems while a pair touches); a ground given by ``ground_contact_fn`` is not supported.
MuJoCo's ``refsafe`` applies: the time constant is at least two steps.
"""
from __future__ import annotations

import torch

from tensegrity_engine.physics.vectors import cross, dot

NEWTON_ITERATIONS = 10
LINE_SEARCH_ITERATIONS = 4


def impedance(violation: torch.Tensor, solimp) -> torch.Tensor:
    """MuJoCo's impedance imp(|violation|): dmin at contact, dmax from ``width`` on, joined
    by two power-law halves at ``midpoint``."""
    dmin, dmax, width, mid, power = (float(v) for v in solimp)
    if dmin == dmax or width <= 1e-15:
        return torch.full_like(violation, 0.5 * (dmin + dmax))
    x = (violation.abs() / width).clamp(0.0, 1.0)
    low = x ** power / mid ** (power - 1.0)
    high = 1.0 - (1.0 - x) ** power / (1.0 - mid) ** (power - 1.0)
    return dmin + (dmax - dmin) * torch.where(x <= mid, low, high)


def solref_gains(p: dict, solimp, h: float):
    """(B, K) of the reference acceleration aref = -B v - K imp dist, from solref (the
    parameters' time constant and damping ratio) and solimp's dmax; MuJoCo's ``refsafe``
    holds the time constant at two steps or more."""
    dmax = float(solimp[1])
    tc = p["contact_time_constant"].reshape(()).clamp(min=2.0 * h)
    ratio = p["contact_damping_ratio"].reshape(())
    return 2.0 / (dmax * tc), 1.0 / (dmax * dmax * tc * tc * ratio * ratio)


def regulariser_scale(imp: torch.Tensor, mu_sliding):
    """MuJoCo's regulariser R per unit of ``diagApprox``'s translational inverse weight:
    (1 - imp)/imp for a frictionless contact (``mu_sliding`` None); for every edge of a
    pyramid 2 mu^2 (1 - imp)/imp (1 + mu^2) (``Rpy`` at impratio 1)."""
    if mu_sliding is None:
        return (1.0 - imp) / imp
    return 2.0 * mu_sliding * mu_sliding * (1.0 - imp) / imp * (1.0 + mu_sliding * mu_sliding)


def pyramid(condim: int, p: dict, sliding, turning, normal, tangent, binormal, dim: int):
    """(J, mu) of a contact's pyramidal cone: the rows J_n +- mu_k J_k stacked on ``dim``,
    k over the sliding (tangent, binormal), torsional (normal) and rolling (tangent,
    binormal) directions as ``condim`` 3, 4 or 6 has them, ``sliding`` and ``turning`` giving
    a point or angular direction's row; condim 1: J_n alone and mu None. mu is the sliding
    friction (the regulariser's, `regulariser_scale`)."""
    mu_s = p["friction_sliding"].reshape(())
    directions = [(sliding(tangent), mu_s), (sliding(binormal), mu_s)] if condim >= 3 else []
    if condim >= 4:
        directions.append((turning(normal), p["friction_torsional"].reshape(())))
    if condim == 6:
        directions += [(turning(tangent), p["friction_rolling"].reshape(())),
                       (turning(binormal), p["friction_rolling"].reshape(()))]
    J_n = sliding(normal)
    if not directions:
        return J_n.unsqueeze(dim), None
    return torch.stack([J_n + sign * mu * J_k for J_k, mu in directions for sign in (1.0, -1.0)], dim), mu_s


class SoftGroundContact:
    """The soft-constraint ground contact of every rod: its pyramid `rows` and the Newton
    `solve` (the integrators use both through `soft_pairs.SoftContacts`)."""

    def __init__(self, topology, rods):
        contact = topology.robot.contact
        if contact.law != "soft":
            raise ValueError(f"SoftGroundContact needs contact.law 'soft', the robot has {contact.law!r}")
        self.topology, self.rods = topology, rods
        self.solimp = tuple(float(v) for v in contact.solimp)
        self.condim = contact.soft_condim

    # ------------------------------------------------------------------ the problem
    def rows(self, S, out, p, h):
        """(J [..., R, E, 6], aref [..., R, E], D [..., R, E] with 0 on rows whose contact
        is open): each rod's pyramid rows, both end spheres, E = 4 (condim - 1) (2 for
        condim 1: the normal rows alone)."""
        topology = self.topology
        k = topology.constants(S.dtype, S.device)
        R = topology.num_rods
        pos, vel, w = S[..., 0:3, :], S[..., 7:10, :], S[..., 10:13, :]
        axis = out["axis"]
        ends = torch.cat([pos, axis], -1) @ k["Nt"]                          # [..., 3, 2R]
        radius = k["node_radius"]
        dist = ends[..., 2, :] - radius - topology.robot.contact.ground_height
        normal = torch.zeros_like(ends)
        normal[..., 2, :] = 1.0
        point = ends - (radius + 0.5 * dist).unsqueeze(-2) * normal
        lever = point - pos.repeat_interleave(2, dim=-1)
        # the frame's first tangent: the rod axis on the plane ((0, 1, 0) for a vertical rod)
        tangent = axis.repeat_interleave(2, dim=-1) * (1.0 - normal)
        upright = dot(tangent, tangent) < 1e-12       # MuJoCo's frame: the projected axis unless ~zero
        fallback = torch.zeros_like(tangent)
        fallback[..., 1, :] = 1.0
        tangent = torch.where(upright.unsqueeze(-2), fallback, tangent)
        tangent = tangent / dot(tangent, tangent).sqrt().unsqueeze(-2)
        binormal = cross(normal, tangent)
        zeros = torch.zeros_like(normal)

        def sliding(d):                      # a point direction: [d; lever x d]
            return torch.cat([d, cross(lever, d)], -2)

        def turning(d):                      # an angular direction: [0; d]
            return torch.cat([zeros, d], -2)

        J, mu_s = pyramid(self.condim, p, sliding, turning, normal, tangent, binormal, dim=-3)
        speed = (J * torch.cat([vel, w], -2).repeat_interleave(2, dim=-1).unsqueeze(-3)).sum(-2)   # [..., E', 2R]
        B, K = solref_gains(p, self.solimp, h)
        imp = impedance(dist, self.solimp)
        aref = -B * speed - (K * imp * dist).unsqueeze(-2)
        regulariser = regulariser_scale(imp, mu_s) * (1.0 / out["mass"].repeat_interleave(2))
        D = torch.where(dist < 0, 1.0 / regulariser, torch.zeros_like(dist)).unsqueeze(-2).expand_as(aref)

        # per rod: end sphere 2r's rows, then 2r+1's
        J = J.movedim(-1, -3).unflatten(-3, (R, 2)).flatten(-3, -2)          # [..., R, 2 E', 6]
        per_rod = lambda x: x.movedim(-1, -2).unflatten(-2, (R, 2)).flatten(-2, -1)    # noqa: E731
        return J, per_rod(aref), per_rod(D)

    @staticmethod
    def solve(M, a0, J, aref, D, iterations: int = NEWTON_ITERATIONS):
        """argmin_a 1/2 (a - a0)'M(a - a0) + sum 1/2 D min(0, J a - aref)^2, per rod:
        M [..., R, 6, 6], a0 [..., R, 6], J [..., R, E, 6], aref and D [..., R, E].

        The iterations run on detached values; one Newton step from their solution carries
        the derivatives. At the minimum the gradient g vanishes, so the step changes no value
        and its derivative is the implicit function theorem's, -H^-1 dg (on the solution's
        active rows): what differentiating every iteration converges to, at the cost of one
        (measured: SUPERball's forward-mode parameter Jacobian 3.5x faster, same values)."""
        a = SoftGroundContact._minimise(M.detach(), a0.detach(), J.detach(), aref.detach(), D.detach(), iterations)
        jar = (J @ a.unsqueeze(-1)).squeeze(-1) - aref
        active = D * (jar.detach() < 0).to(a.dtype)
        H = M + J.transpose(-1, -2) @ (active.unsqueeze(-1) * J)
        g = (M @ (a - a0).unsqueeze(-1)).squeeze(-1) + (J.transpose(-1, -2) @ (active * jar).unsqueeze(-1)).squeeze(-1)
        return a - torch.linalg.solve_ex(H, g.unsqueeze(-1))[0].squeeze(-1)

    @staticmethod
    def _minimise(M, a0, J, aref, D, iterations: int = NEWTON_ITERATIONS):
        """The Newton iterations with an exact line search (`solve`'s problem)."""
        a = a0
        for _ in range(iterations):
            jar = (J @ a.unsqueeze(-1)).squeeze(-1) - aref
            active = D * (jar < 0).to(a.dtype)
            H = M + J.transpose(-1, -2) @ (active.unsqueeze(-1) * J)
            Mda = (M @ (a - a0).unsqueeze(-1)).squeeze(-1)
            g = Mda + (J.transpose(-1, -2) @ (active * jar).unsqueeze(-1)).squeeze(-1)
            step = -torch.linalg.solve_ex(H, g.unsqueeze(-1))[0].squeeze(-1)     # no host sync (CUDA graphs)
            J_step = (J @ step.unsqueeze(-1)).squeeze(-1)
            curvature = (step * (M @ step.unsqueeze(-1)).squeeze(-1)).sum(-1)
            slope = (step * Mda).sum(-1)
            alpha = torch.ones_like(curvature)
            for _ in range(LINE_SEARCH_ITERATIONS):      # Newton on the piecewise-linear derivative
                z = jar + alpha.unsqueeze(-1) * J_step
                on = D * (z < 0).to(a.dtype)
                first = alpha * curvature + slope + (on * z * J_step).sum(-1)
                second = curvature + (on * J_step * J_step).sum(-1)
                # a zero step (no rows, or none active) has no curvature: keep alpha (0/0 in float32)
                alpha = torch.where(second > 0, alpha - first / torch.where(second > 0, second, 1.0),
                                    alpha).clamp(min=0.0)
            a = a + alpha.unsqueeze(-1) * step
        return a
