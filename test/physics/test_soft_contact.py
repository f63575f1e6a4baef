"""The soft contact law: MuJoCo's soft-constraint ground contact, solved per rod."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tensegrity_engine.groundtruth import environments
from tensegrity_engine.physics import native
from tensegrity_engine.physics.config import ConfigError, load_robot, robot_from_dict, robot_to_dict
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.soft_contact import SoftGroundContact
from tensegrity_engine.physics.state import center_of_mass

from step_checks import one_step_gradcheck

torch.set_num_threads(2)


def _with_law(robot, law, **kw):
    return robot.replace(contact=dataclasses.replace(robot.contact, law=law, **kw))


def _rolling(robot, seed=1, steps=600):
    rng = np.random.default_rng(seed)
    return environments.sample_contact_episode(robot, rng, steps, randomize_commands=True)


@pytest.mark.parametrize("name,integrator,condim", [("superball", "semi_implicit", 0), ("three_bar", "implicitfast", 0),
                                                    ("three_bar", "semi_implicit", 4), ("superball", "semi_implicit", 1)])
def test_soft_contact_is_mujocos_contact(name, integrator, condim):
    """Rolling under random commands from a push: the engine with the soft law takes
    MuJoCo's steps (its twin of the same robot: solref/solimp, pyramidal condim-6 or 4 cone
    or frictionless, Euler or implicitfast) over 0.6 s: to rounding (measured 2e-15 m) on
    three runs, within 1.2e-6 m on the SUPERball's condim-6 run (the rows, regularisers and
    reference accelerations agree to rounding there too, and the engine's solution has the
    lower cost: MuJoCo's Newton solver stops after two iterations, short of the minimum
    along the rods' axial spin, whose inertia is tiny), while the penalty law with
    the same values is millimetres off within 0.1 s. The run has what it claims: end
    spheres in the floor most of the time, rods rolling and sliding over it."""
    base = load_robot(name).replace(integrator=integrator)
    soft = _with_law(base, "soft", condim=condim)
    s0, a0, cmds = _rolling(soft)
    mj, _ = environments.contact_twin(soft, nthread=1).rollout(s0[None], a0[None], cmds[None])
    mj = torch.as_tensor(mj[0])
    inputs = [torch.as_tensor(x) for x in (s0, a0, cmds)]
    mass = torch.as_tensor(base.rod_mass)
    gaps = {}
    for law in ("soft", "penalty"):
        engine = TensegrityEngine(_with_law(base, law, condim=condim))
        with torch.no_grad():
            states, _ = engine.rollout(*inputs, base.dt)
        gaps[law] = (center_of_mass(states, mass) - center_of_mass(mj, mass)).norm(dim=-1)
        if law == "soft":
            assert (states[..., :3] - mj[..., :3]).abs().max() < 5e-6
            nodes = engine.end_nodes(states)
            touching = (nodes[..., 2] < torch.as_tensor(base.rod_radius)[:, None]).flatten(-2).any(-1)
            assert touching.float().mean() > 0.75
            assert states[..., 10:13].norm(dim=-1).max() > 1.0                        # rolling
            assert states[..., 7:9].norm(dim=-1).max() > 0.2                          # moving over the floor
    assert gaps["soft"].max() < 5e-6
    assert gaps["penalty"][:100].max() > 1e-3


def test_the_solver_finds_the_constrained_minimum():
    """Random per-rod problems (rows on and off, some far inside the cone): at the returned
    accelerations the objective's gradient vanishes, and no small move lowers it."""
    gen = torch.Generator().manual_seed(0)
    B, R, E = 64, 3, 20
    L = torch.randn(B, R, 6, 6, dtype=torch.float64, generator=gen)
    M = L @ L.transpose(-1, -2) + 0.5 * torch.eye(6, dtype=torch.float64)
    a0 = torch.randn(B, R, 6, dtype=torch.float64, generator=gen)
    J = torch.randn(B, R, E, 6, dtype=torch.float64, generator=gen)
    aref = torch.randn(B, R, E, dtype=torch.float64, generator=gen) * 3
    D = torch.rand(B, R, E, dtype=torch.float64, generator=gen) * 50 * (torch.rand(B, R, E, generator=gen) > 0.3)

    def cost(a):
        jar = (J @ a.unsqueeze(-1)).squeeze(-1) - aref
        d = a - a0
        return 0.5 * (d * (M @ d.unsqueeze(-1)).squeeze(-1)).sum(-1) + 0.5 * (D * jar.clamp(max=0) ** 2).sum(-1)

    a = SoftGroundContact.solve(M, a0, J, aref, D)
    jar = (J @ a.unsqueeze(-1)).squeeze(-1) - aref
    grad = (M @ (a - a0).unsqueeze(-1)).squeeze(-1) + (J.transpose(-1, -2) @ (D * jar.clamp(max=0)).unsqueeze(-1)).squeeze(-1)
    scale = (M @ a0.unsqueeze(-1)).squeeze(-1).norm(dim=-1, keepdim=True) + (D * aref.abs()).sum(-1, keepdim=True)
    assert (grad.norm(dim=-1, keepdim=True) / scale).max() < 1e-9
    assert (jar < 0).any() and (jar > 0).any()
    best = cost(a)
    for _ in range(20):
        trial = a + 1e-4 * torch.randn(a.shape, dtype=torch.float64, generator=gen)
        assert (cost(trial) >= best - 1e-12 * best.abs().clamp(min=1)).all()


def test_gradcheck_through_the_soft_contact():
    """One step of a rod pair resting on the floor (both end spheres in it): the gradient
    w.r.t. the state, the soft law's values and the friction is the finite differences'."""
    robot = _with_law(load_robot("three_bar"), "soft")
    engine = TensegrityEngine(robot)
    state0, act0 = environments.rest_pose(robot)
    state = torch.as_tensor(state0).clone()
    state[..., 7] += 0.3
    state[..., 10:13] += torch.tensor([0.4, -0.3, 0.2], dtype=torch.float64)
    nodes = engine.end_nodes(state)
    assert (nodes[..., 2] < torch.as_tensor(robot.rod_radius)[:, None]).sum() >= 3      # the contact is there
    act = torch.as_tensor(act0)
    names = ("contact_time_constant", "contact_damping_ratio", "friction_sliding", "friction_rolling")
    assert one_step_gradcheck(engine, state, act, names)


def test_soft_law_config_round_trip_and_validation():
    robot = _with_law(load_robot("three_bar"), "soft", solref=(0.01, 0.8), condim=3)
    again = robot_from_dict(robot_to_dict(robot))
    assert again.contact.law == "soft" and again.contact.solref == (0.01, 0.8) and again.contact.soft_condim == 3
    assert PhysicalParameters(again).as_dict()["contact_time_constant"][0] == pytest.approx(0.01)
    data = robot_to_dict(robot)
    for key, bad in (("law", "rigid"), ("solref", [0.02]), ("solimp", [0.9, 0.8, 0.001, 0.5, 2]), ("condim", 2)):
        broken = {**data, "contact": {**data["contact"], key: bad}}
        with pytest.raises(ConfigError, match=f"contact.{key}"):
            robot_from_dict(broken)


@pytest.mark.parametrize("integrator,condim", [("semi_implicit", 0), ("implicitfast", 0), ("semi_implicit", 3)])
def test_native_kernel_takes_the_torch_engines_soft_steps(integrator, condim):
    """The C kernel's soft ground against the torch engine: a batch of SUPERballs launched
    from rest, rolling and sliding under random commands, to rounding over 300 steps
    (rows open and close; the kernel stops a lane's Newton iterations once exact)."""
    robot = _with_law(load_robot("superball").replace(integrator=integrator), "soft", condim=condim)
    engine = TensegrityEngine(robot)
    assert engine.native_kernel_applies
    episodes = [_rolling(robot, seed=s, steps=300) for s in (3, 4, 5)]
    inputs = [torch.as_tensor(np.stack(x)) for x in zip(*episodes)]
    with torch.no_grad():
        ref, ref_act = engine.rollout(*inputs, robot.dt, integrator=integrator)
        out, out_act = native.NativeRollout(engine, integrator=integrator).rollout(*inputs, robot.dt)
    assert (out[..., :3] - ref[..., :3]).abs().max() < 1e-9
    assert (out[..., 7:13] - ref[..., 7:13]).abs().max() < 1e-6
    torch.testing.assert_close(out_act, ref_act, rtol=1e-12, atol=1e-14)
    nodes = engine.end_nodes(ref)
    touching = nodes[..., 2] < torch.as_tensor(robot.rod_radius)[:, None]
    assert touching.flatten(-2).any(-1).double().mean() > 0.75
    assert (touching[..., 1:, :, :] != touching[..., :-1, :, :]).any()          # contacts open and close
    assert ref[..., 7:9].norm(dim=-1).max() > 0.2 and ref[..., 10:13].norm(dim=-1).max() > 1.0


def test_a_planner_follows_a_swapped_in_contact_law():
    """MPPI's dynamics built from the penalty config plan a swapped-in soft-contact model
    with the soft law (the same steps as that model's own engine), and go back on a swap
    back; the two laws' predictions differ, so the swap is what matches."""
    from tensegrity_engine.control.dynamics import EngineDynamics

    robot = load_robot("three_bar")
    soft = PhysicalParameters(_with_law(robot, "soft"), {"contact_time_constant": 0.015})
    s0, a0, cmds = _rolling(robot, steps=200)
    dyn = EngineDynamics(robot, PhysicalParameters(robot), dtype=torch.float64, backend="native")
    penalty_end, _ = dyn.advance(s0, a0, cmds)
    dyn.set_params(soft)
    assert dyn.engine.force_model.soft_ground
    soft_end, _ = dyn.advance(s0, a0, cmds)
    engine = TensegrityEngine(soft.robot, soft)
    with torch.no_grad():
        ref, _ = engine.rollout(*(torch.as_tensor(x) for x in (s0, a0, cmds)), robot.dt)
    assert np.abs(soft_end[:, :3] - ref[-1, :, :3].numpy()).max() < 1e-9
    assert np.abs(soft_end[:, :3] - penalty_end[:, :3]).max() > 1e-3
    dyn.set_params(PhysicalParameters(robot))
    assert not dyn.engine.force_model.soft_ground
    back, _ = dyn.advance(s0, a0, cmds)
    assert np.abs(back - penalty_end).max() < 1e-12


def test_float32_rollouts_stay_finite_and_follow_float64():
    """The planner's dtype: rods off the floor (zero Newton steps) and rolling ones stay
    finite in float32, torch and C, and follow the float64 run."""
    robot = _with_law(load_robot("three_bar"), "soft")
    engine = TensegrityEngine(robot)
    s0, a0, cmds = _rolling(robot, steps=200)
    lifted = s0.copy()
    lifted[:, 2] += 0.5
    inputs = [torch.as_tensor(np.stack(x)) for x in ((s0, lifted), (a0, a0), (cmds, cmds))]
    with torch.no_grad():
        ref, _ = engine.rollout(*inputs, robot.dt)
        for run in (engine.rollout, native.NativeRollout(engine).rollout):
            out, _ = run(*(x.float() for x in inputs), robot.dt)
            assert torch.isfinite(out).all()
            assert (out[..., :3].double() - ref[..., :3]).abs().max() < 1e-3


def test_a_steep_rods_contact_frame_is_mujocos():
    """A rod 80 degrees from the floor, pushed sideways while its end rests in the floor:
    MuJoCo's contact frame follows the rod axis projected on the plane however steep (not
    a fixed tangent); the engine takes MuJoCo's step."""
    import mujoco

    from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin

    robot = _with_law(load_robot("three_bar"), "soft", rod_rod=False)
    state = torch.as_tensor(environments.rest_pose(robot)[0]).clone()
    tilt = np.deg2rad(80.0)
    q = np.array([np.cos((np.pi / 2 - tilt) / 2), np.sin((np.pi / 2 - tilt) / 2) * 0.6,
                  np.sin((np.pi / 2 - tilt) / 2) * 0.8, 0.0])
    half = 0.5 * robot.rod_length[0]
    axis = np.array([2 * (q[1] * q[3] + q[0] * q[2]), 2 * (q[2] * q[3] - q[0] * q[1]),
                     q[0] ** 2 - q[1] ** 2 - q[2] ** 2 + q[3] ** 2])
    state[0, 3:7] = torch.as_tensor(q)
    state[0, :3] = torch.as_tensor(half * axis + np.array([0.0, 0.0, robot.rod_radius[0] - 0.002]))
    state[0, 7:10] = torch.tensor([0.4, -0.3, 0.0])
    state[1:, 2] += 3.0                                   # the other rods far above
    act = torch.as_tensor(environments.rest_pose(robot)[1])
    cmds = act.expand(20, -1).clone()
    twin = MujocoTwin(robot, floor=True, nthread=1)
    twin.reset(state.numpy(), act.numpy())
    mujoco.mj_forward(twin.model, twin.data)
    assert twin.data.ncon >= 1
    frame = twin.data.contact[0].frame.reshape(3, 3)
    flat = axis * np.array([1.0, 1.0, 0.0])
    assert abs(abs(frame[1] @ flat / np.linalg.norm(flat)) - 1.0) < 1e-9       # the projected axis
    mj, _ = twin.rollout(state.numpy()[None], act.numpy()[None], cmds.numpy()[None])
    with torch.no_grad():
        out, _ = TensegrityEngine(robot).rollout(state, act, cmds, robot.dt)
    assert (out[..., :3] - torch.as_tensor(mj[0][..., :3])).abs().max() < 1e-9


def test_a_soft_model_file_keeps_its_law(tmp_path):
    from tensegrity_engine.physics.parameter_files import export_yaml, params_from_file
    from tensegrity_engine.physics.residual import physics_fingerprint

    robot = load_robot("three_bar")
    soft = PhysicalParameters(_with_law(robot, "soft", condim=4), {"contact_time_constant": 0.015})
    path = export_yaml(soft, tmp_path / "soft.yaml")
    again = params_from_file(robot, path)
    assert again.robot.contact.law == "soft" and again.robot.contact.soft_condim == 4
    assert again.as_dict()["contact_time_constant"][0] == pytest.approx(0.015)
    assert physics_fingerprint(again) == physics_fingerprint(soft)
    assert physics_fingerprint(PhysicalParameters(robot)) != physics_fingerprint(
        PhysicalParameters(_with_law(robot, "soft")))
