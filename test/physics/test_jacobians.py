"""The implicit integrator's stiffness and damping Jacobians (`physics.jacobians`) against
their definition, summed pair by pair: each cable or contact with force Jacobian H between
points of rods a and b adds S^T H S, S = G_b E_b - G_a E_a, G = [I, -[r]x]."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tensegrity_engine.groundtruth import environments
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics import jacobians
from tensegrity_engine.physics.jacobians import force_jacobians, implicit_system, own_cable_damping_blocks

from robot_builders import two_rod_robot


@pytest.fixture(autouse=True, params=["scatter", "one_hot"])
def assembly(request, monkeypatch):
    """Both assemblies: eager's scatters and the one-hot products compiled code uses."""
    if request.param == "one_hot":
        monkeypatch.setattr(jacobians, "_compiling", lambda: True)
    return request.param


def _G(r: torch.Tensor) -> torch.Tensor:
    x, y, z = r.tolist()
    skew = torch.tensor([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]], dtype=torch.float64)
    return torch.cat([torch.eye(3, dtype=torch.float64), -skew], 1)


def _add_pair(K: torch.Tensor, H: torch.Tensor, rod_b: int, r_b, rod_a=None, r_a=None) -> None:
    S = torch.zeros(3, K.shape[0], dtype=torch.float64)
    S[:, 6 * rod_b:6 * rod_b + 6] += _G(r_b)
    if rod_a is not None:
        S[:, 6 * rod_a:6 * rod_a + 6] -= _G(r_a)
    K += S.T @ H @ S


def _reference(engine: TensegrityEngine, state: torch.Tensor, out: dict, p: dict):
    """K, D of one unbatched state [R, 13] by loops over the pairs."""
    k = engine.topology.constants(torch.float64, "cpu")
    R = engine.topology.num_rods
    K = torch.zeros(6 * R, 6 * R, dtype=torch.float64)
    D = torch.zeros_like(K)
    eye = torch.eye(3, dtype=torch.float64)
    axis, u = out["axis"].T, out["u"].T
    for c in range(len(k["cable_rod_a"])):
        a, b = int(k["cable_rod_a"][c]), int(k["cable_rod_b"][c])
        ra, rb = axis[a] * k["cable_lever_a"][c], axis[b] * k["cable_lever_b"][c]
        uu = torch.outer(u[c], u[c])
        taut = float(out["stretch"][c] > 0)
        geometric = out["tension"][c] / out["length"][c]
        _add_pair(K, taut * p["cable_stiffness"][c] * uu + geometric * (eye - uu), b, rb, a, ra)
        damping = taut * (1 - p["cable_slack_damping"]) * p["cable_damping"][c] \
            + p["cable_slack_damping"] * p["cable_damping"][c]
        _add_pair(D, damping * uu, b, rb, a, ra)
    kc, cc, mu = p["contact_stiffness"], p["contact_damping"], p["friction_sliding"]
    if "ground" in out:
        X, active, normal, speed, load, spin, roll = out["ground"]
        ez = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
        ezz = torch.outer(ez, ez)
        for node in range(2 * R):
            rod = node // 2
            lever = X[:, node] - state[rod, :3] - k["node_radius"][node] * ez
            act = float(active[node])
            sliding = mu * normal[node] / speed[node]
            _add_pair(K, act * kc * ezz, rod, lever)
            _add_pair(D, act * cc * ezz + sliding * (eye - ezz), rod, lever)
        for rod in range(R):
            rolling = float(p["friction_rolling"] * load[rod] / roll[rod])
            D[6 * rod + 3, 6 * rod + 3] += rolling
            D[6 * rod + 4, 6 * rod + 4] += rolling
            D[6 * rod + 5, 6 * rod + 5] += float(p["friction_torsional"] * load[rod] / spin[rod])
    if "pairs" in out:
        ra, rb, n, active_p, normal_p, speed_p = out["pairs"]
        for q in range(ra.shape[-1]):
            a, b = int(k["pair_a"][q]), int(k["pair_b"][q])
            nn_ = torch.outer(n[:, q], n[:, q])
            act = float(active_p[q])
            sliding = mu * normal_p[q] / speed_p[q]
            _add_pair(K, act * kc * nn_, b, rb[:, q], a, ra[:, q])
            _add_pair(D, act * cc * nn_ + sliding * (eye - nn_), b, rb[:, q], a, ra[:, q])
    return K, D


def _forces(engine, state, act, per_cable_stiffness=None):
    p = {name: v.detach() for name, v in engine.param_values(torch.float64, "cpu").items()}
    if per_cable_stiffness is not None:
        p["cable_stiffness"] = per_cable_stiffness
    C = engine.topology.robot.num_cables
    p["cable_stiffness"] = p["cable_stiffness"].expand(C).clone()
    p["cable_damping"] = p["cable_damping"].expand(C).clone()
    out = engine.force_model(state.transpose(-1, -2), engine.rest_lengths(act, p), p, None, keep=True)
    return p, out


def _check_batch(engine, states, act, p, out):
    K, D = force_jacobians(engine.topology, states, out, p)
    for b in range(states.shape[0]):
        one = {key: (tuple(t[b] for t in v) if isinstance(v, tuple) else v[b]) for key, v in out.items()
               if key in ("axis", "u", "stretch", "tension", "length", "ground", "pairs")}
        K_ref, D_ref = _reference(engine, states[b], one, p)
        assert torch.allclose(K[b], K_ref, rtol=1e-10, atol=1e-9 * K_ref.abs().max())
        assert torch.allclose(D[b], D_ref, rtol=1e-10, atol=1e-9 * D_ref.abs().max())
    assert torch.allclose(K, K.transpose(-1, -2), atol=1e-9 * K.abs().max())
    _check_implicit_system(engine, states, out, p, K, D)
    return K, D


def _check_implicit_system(engine, states, out, p, K, D, h=1e-3):
    """The implicit step's system, assembled without K and D, is h D + h^2 K and K xi; with
    a rod fixed, its rows and columns are zero and the rest is unchanged."""
    g = torch.Generator().manual_seed(7)
    xi = torch.randn(*states.shape[:-2], K.shape[-1], generator=g, dtype=torch.float64)
    A_ref = h * D + h * h * K
    A, Kxi = implicit_system(engine.topology, states, out, p, h, xi)
    assert torch.allclose(A, A_ref, rtol=1e-10, atol=1e-12 * A_ref.abs().max())
    Kxi_ref = (K @ xi.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(Kxi, Kxi_ref, rtol=1e-10, atol=1e-12 * Kxi_ref.abs().max())
    free6 = torch.ones(K.shape[-1], dtype=torch.float64)
    free6[6:12] = 0.0                                                   # rod 1 fixed
    A_fixed, Kxi_fixed = implicit_system(engine.topology, states, out, p, h, xi, free6)
    mask = free6[:, None] * free6[None, :]
    assert A_ref[..., 6:12, :].abs().max() > 0                          # there was something to drop
    assert (A_fixed[..., 6:12, :] == 0).all() and (A_fixed[..., :, 6:12] == 0).all()
    assert torch.allclose(A_fixed, A_ref * mask, rtol=1e-10, atol=1e-12 * A_ref.abs().max())
    assert torch.equal(Kxi_fixed, Kxi)


def test_jacobians_are_the_pairwise_sum_with_floor_contacts_and_slack_cables():
    robot = load_robot("superball")
    robot = robot.replace(contact=dataclasses.replace(robot.contact, law="penalty"))
    engine = TensegrityEngine(robot, floor=True)
    state0, act0 = environments.rest_pose(robot)
    g = torch.Generator().manual_seed(4)
    states = torch.tensor(state0).unsqueeze(0).repeat(3, 1, 1)
    states[..., 7:13] += 0.4 * torch.randn(states[..., 7:13].shape, generator=g, dtype=torch.float64)
    states[..., 2] -= 0.01                                  # the lowest ends into the floor
    act = torch.tensor(act0).unsqueeze(0).repeat(3, 1)
    act[:, : act.shape[1] // 2] *= 1.4                      # half the actuated cables go slack
    stiffness = 1e4 * (1 + 0.3 * torch.rand(engine.topology.robot.num_cables, generator=g, dtype=torch.float64))
    p, out = _forces(engine, states, act, stiffness)
    # The cases are really there: floor contacts, taut and slack cables, unequal stiffnesses.
    assert out["ground"][1].any() and not out["ground"][1].all()
    assert (out["stretch"] > 0).any() and (out["stretch"] <= 0).any()
    _check_batch(engine, states, act, p, out)


def test_jacobians_with_rod_rod_contacts():
    robot = two_rod_robot(gap=0.095)                       # capsules overlap by 5 mm
    engine = TensegrityEngine(robot, floor=False)
    from tensegrity_engine.physics.state import initial_rod_state
    g = torch.Generator().manual_seed(2)
    states = torch.tensor(initial_rod_state(robot)).unsqueeze(0).repeat(2, 1, 1)
    states[..., 7:13] += 0.3 * torch.randn(states[..., 7:13].shape, generator=g, dtype=torch.float64)
    act = torch.tensor([[0.55, 0.5], [0.4, 0.7]], dtype=torch.float64)
    p, out = _forces(engine, states, act)
    assert out["pairs"][3].all()                            # the contact is active
    _check_batch(engine, states, act, p, out)


def test_own_cable_damping_blocks_are_the_diagonal_of_D():
    """implicitfast's per-rod blocks are D's diagonal blocks (cables only: no floor)."""
    robot = load_robot("superball")
    engine = TensegrityEngine(robot, floor=False)
    state0, act0 = environments.rest_pose(robot)
    states = torch.tensor(state0).unsqueeze(0).repeat(2, 1, 1)
    act = torch.tensor(act0).unsqueeze(0).repeat(2, 1)
    act[0, :4] *= 1.4
    p, out = _forces(engine, states, act)
    _, D = force_jacobians(engine.topology, states, out, p)
    blocks = own_cable_damping_blocks(engine.topology, states.transpose(-1, -2), out, p)
    R = engine.topology.num_rods
    diagonal = torch.stack([D[:, 6 * r:6 * r + 6, 6 * r:6 * r + 6] for r in range(R)], 1)
    assert blocks.abs().max() > 0
    assert torch.allclose(blocks, diagonal, rtol=1e-12, atol=1e-12 * blocks.abs().max())
