"""The soft contact law between rods: MuJoCo's capsule-capsule soft constraints, solved with
the ground's over all rods while a pair touches (`physics.soft_pairs`)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tensegrity_engine.groundtruth import environments
from tensegrity_engine.physics import collision, native
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.jacobians import block_diag
from tensegrity_engine.physics.soft_contact import SoftGroundContact
from tensegrity_engine.physics.state import center_of_mass

from step_checks import one_step_gradcheck

torch.set_num_threads(2)


def _fat_three_bar(law="soft", condim=4, integrator="semi_implicit"):
    """The 3-bar with rods three times as thick: its rods touch in most samples."""
    base = load_robot("three_bar")
    return base.replace(rod_radius=3.0 * base.rod_radius, integrator=integrator,
                        contact=dataclasses.replace(base.contact, law=law, condim=condim))


def _touching(engine, states) -> torch.Tensor:
    """[...] whether some rod pair overlaps in each state."""
    k = engine.constants(states.dtype, "cpu")
    nodes = engine.end_nodes(states)
    depth = collision.rod_rod_contacts(nodes, torch.as_tensor(engine.robot.rod_radius), k["pair_a"], k["pair_b"]).depth
    return (depth > 0).any(-1)


def _episodes(robot, floor: bool, seeds=(3, 4, 5), steps=300):
    if floor:
        eps = [environments.sample_contact_episode(robot, np.random.default_rng(s), steps, randomize_commands=True)
               for s in seeds]
    else:
        eps = [environments.sample_noncontact_episode(robot, np.random.default_rng(s), steps)[:3] for s in seeds]
    return [np.stack(x) for x in zip(*eps)]


@pytest.mark.parametrize("integrator,condim", [("semi_implicit", 4), ("implicitfast", 3), ("semi_implicit", 6)])
def test_soft_rod_pairs_are_mujocos_contacts(integrator, condim):
    """Rolling under random commands with rods that touch in most samples: the engine takes
    MuJoCo's steps (its twin: capsule-capsule soft constraints, pyramidal cone, the rods'
    problems coupled) to rounding over 0.3 s; the penalty law between the rods, with
    MuJoCo's ground, is millimetres off. Before soft pairs the engine had only that."""
    soft = _fat_three_bar("soft", condim, integrator)
    s0, a0, cmds = _episodes(soft, floor=True, seeds=(3,))
    mj, _ = environments.contact_twin(soft, nthread=1).rollout(s0, a0, cmds)
    mj = torch.as_tensor(mj)
    engine = TensegrityEngine(soft)
    assert engine.force_model.soft_pairs
    with torch.no_grad():
        states, _ = engine.rollout(*(torch.as_tensor(x) for x in (s0, a0, cmds)), soft.dt)
    assert _touching(engine, states).double().mean() > 0.5                        # the pairs are there
    assert states[..., 10:13].norm(dim=-1).max() > 1.0                           # rods tumbling
    assert (states[..., :3] - mj[..., :3]).abs().max() < 1e-6
    # the same ground with penalty rod pairs: what the engine had before
    mass = torch.as_tensor(soft.rod_mass)
    with torch.no_grad():
        pen, _ = _penalty_pairs_rollout(soft, s0, a0, cmds)
    assert (center_of_mass(pen, mass) - center_of_mass(mj, mass)).norm(dim=-1).max() > 1e-3


def _penalty_pairs_rollout(robot, s0, a0, cmds):
    """The engine with the soft ground and penalty rod pairs (the engine before soft pairs):
    a robot whose pairs are penalty contacts and whose ground is soft is not a config, so it
    is built by switching the pairs' rows off."""
    engine = TensegrityEngine(robot)
    engine.force_model.soft_pairs = False
    for integrator in engine.integrators.values():
        soft = getattr(integrator, "soft", None)
        if soft is not None:
            soft.pairs = None
    return engine.rollout(*(torch.as_tensor(x) for x in (s0, a0, cmds)), robot.dt)


def test_hanging_rods_touch_as_in_mujoco():
    """A rod welded to the world (hanging data, no floor): the pairs it makes with the free
    rods are one-sided (its columns vanish, MuJoCo's invweight0 of a static body is 0); the
    engine takes MuJoCo's implicitfast steps under random commands and pushes."""
    robot = _fat_three_bar("soft", 4, "implicitfast")
    s0, a0, cmds, wrenches = (np.stack(x) for x in zip(*[
        environments.sample_noncontact_episode(robot, np.random.default_rng(s), 400)[:4] for s in (1,)]))
    twin = environments.noncontact_twin(robot, nthread=1)
    mj, _ = twin.rollout(s0, a0, cmds, external_wrench=wrenches)
    engine = TensegrityEngine(robot, floor=False, fixed_rods=(environments.NONCONTACT_FIXED_ROD,))
    assert engine.force_model.soft_pairs and not engine.force_model.soft_ground
    with torch.no_grad():
        states, _ = engine.rollout(*(torch.as_tensor(x) for x in (s0, a0, cmds)), robot.dt,
                                   wrenches=torch.as_tensor(wrenches))
    assert _touching(engine, states).double().mean() > 0.1                        # measured 0.15
    assert (states[..., :3] - torch.as_tensor(mj)[..., :3]).abs().max() < 1e-6


@pytest.mark.parametrize("integrator,floor,dtype", [("semi_implicit", True, torch.float64),
                                                    ("implicitfast", True, torch.float64),
                                                    ("rk4", True, torch.float64),
                                                    ("implicitfast", False, torch.float64),
                                                    ("semi_implicit", True, torch.float32)])
def test_native_kernel_takes_the_torch_engines_coupled_steps(integrator, floor, dtype):
    """The C kernel's coupled solve (a lane with a pair touching is solved whole, in vectors
    of lanes over the union of their rods) against the torch engine's: a batch of thick-rod
    3-bars rolling, or hanging from a welded rod, to rounding over 300 steps; float32 within
    a millimetre."""
    robot = _fat_three_bar("soft", 4, integrator)
    fixed = () if floor else (environments.NONCONTACT_FIXED_ROD,)
    engine = TensegrityEngine(robot, floor=floor, fixed_rods=fixed)
    assert engine.native_kernel_applies
    inputs = [torch.as_tensor(x) for x in _episodes(robot, floor)]
    with torch.no_grad():
        ref, ref_act = engine.rollout(*inputs, robot.dt, integrator=integrator)
        out, out_act = native.NativeRollout(engine, integrator=integrator).rollout(
            *(x.to(dtype) for x in inputs), robot.dt)
    touching = _touching(engine, ref)
    assert touching.double().mean() > 0.2 and not touching.all()                  # pairs meet and part
    tolerance = 1e-9 if dtype == torch.float64 else 1e-3
    assert (out[..., :3].double() - ref[..., :3]).abs().max() < tolerance
    if dtype == torch.float64:
        assert (out[..., 7:13] - ref[..., 7:13]).abs().max() < 1e-6
        torch.testing.assert_close(out_act, ref_act, rtol=1e-12, atol=1e-14)


def test_the_coupled_solve_finds_the_constrained_minimum():
    """Random coupled problems (rows on one rod or across two, block-diagonal mass): at the
    returned accelerations the objective's gradient vanishes, and no small move lowers it."""
    gen = torch.Generator().manual_seed(1)
    B, R, E = 32, 3, 24
    L = torch.randn(B, R, 6, 6, dtype=torch.float64, generator=gen)
    M = block_diag(L @ L.transpose(-1, -2) + 0.5 * torch.eye(6, dtype=torch.float64))
    a0 = torch.randn(B, 6 * R, dtype=torch.float64, generator=gen)
    J = torch.randn(B, E, R, 6, dtype=torch.float64, generator=gen)
    rods = torch.rand(B, E, R, 1, generator=gen) < 0.5          # each row on some of the rods
    J = (J * rods).flatten(-2)
    aref = torch.randn(B, E, dtype=torch.float64, generator=gen) * 3
    D = torch.rand(B, E, dtype=torch.float64, generator=gen) * 50 * (torch.rand(B, E, generator=gen) > 0.3)
    a = SoftGroundContact.solve(M, a0, J, aref, D)
    jar = (J @ a.unsqueeze(-1)).squeeze(-1) - aref
    grad = (M @ (a - a0).unsqueeze(-1)).squeeze(-1) + (J.transpose(-1, -2) @ (D * jar.clamp(max=0)).unsqueeze(-1)).squeeze(-1)
    scale = (M @ a0.unsqueeze(-1)).squeeze(-1).norm(dim=-1, keepdim=True) + (D * aref.abs()).sum(-1, keepdim=True)
    assert (grad.norm(dim=-1, keepdim=True) / scale).max() < 1e-9
    assert ((jar < 0) & (D > 0)).any() and (jar > 0).any()


def test_gradcheck_through_a_soft_rod_pair():
    """One step of two thick rods pressed into each other on the floor (the pair overlaps,
    end spheres in the floor): the gradient w.r.t. the state, the soft law's values and the
    friction is the finite differences'."""
    robot = _fat_three_bar("soft", 4)
    engine = TensegrityEngine(robot)
    s0, a0, cmds = _episodes(robot, floor=True, seeds=(3,), steps=120)
    with torch.no_grad():
        states, acts = engine.rollout(*(torch.as_tensor(x) for x in (s0, a0, cmds)), robot.dt)
    states, acts = states[0], acts[0]
    k = int(torch.nonzero(_touching(engine, states)).flatten()[-1])
    state, act = states[k].clone(), acts[k].clone()
    assert _touching(engine, state) and (engine.end_nodes(state)[..., 2] < torch.as_tensor(robot.rod_radius)[:, None]).any()
    names = ("contact_time_constant", "contact_damping_ratio", "friction_sliding", "friction_torsional", "rod_mass")
    assert one_step_gradcheck(engine, state, act, names)


def test_six_rods_solved_coupled_agree_with_the_kernel():
    """The coupled solve on a 6-bar (36 unknowns, up to 15 pairs): SUPERballs with rods four
    times as thick, rolling under random commands, pairs meeting and parting; torch (one
    batch, every lane coupled while one touches) and the C kernel (touching lanes alone)
    agree to rounding, so a lane's result does not depend on the rest of its batch."""
    base = load_robot("superball")
    robot = base.replace(rod_radius=4.0 * base.rod_radius,
                         contact=dataclasses.replace(base.contact, law="soft", condim=6))
    engine = TensegrityEngine(robot)
    inputs = [torch.as_tensor(x) for x in _episodes(robot, floor=True, seeds=(3, 4, 5, 6), steps=200)]
    with torch.no_grad():
        ref, _ = engine.rollout(*inputs, robot.dt)
        out, _ = native.NativeRollout(engine).rollout(*inputs, robot.dt)
        alone, _ = engine.rollout(*(x[:1] for x in inputs), robot.dt)
    touching = _touching(engine, ref)
    assert touching.double().mean() > 0.1 and not touching.all()
    assert (out[..., :3] - ref[..., :3]).abs().max() < 1e-9
    assert (alone[..., :3] - ref[:1, ..., :3]).abs().max() < 1e-9


def test_float32_gradients_stay_finite_with_welded_pairs():
    """Two rods welded to the world form a pair that never collides (MuJoCo's static
    bodies): its rows are dead, and in float32 their unused regulariser does not overflow
    into NaN gradients while another pair touches."""
    robot = _fat_three_bar("soft", 4)
    engine = TensegrityEngine(robot, floor=True, fixed_rods=(0, 1))
    s0, a0, cmds = _episodes(robot, floor=True, seeds=(3,), steps=120)
    with torch.no_grad():
        states, acts = engine.rollout(*(torch.as_tensor(x) for x in (s0, a0, cmds)), robot.dt)
    states, acts = states[0], acts[0]
    kc = engine.constants(torch.float64, "cpu")
    depth = collision.rod_rod_contacts(engine.end_nodes(states), torch.as_tensor(robot.rod_radius),
                                       kc["pair_a"], kc["pair_b"]).depth             # pairs (0, 1), (0, 2), (1, 2)
    k = int(torch.nonzero((depth[:, 1:] > 0).any(-1)).flatten()[-1])                # the free rod touches
    state = states[k].float().clone().requires_grad_(True)
    p = {n: v.float().detach().clone().requires_grad_(True) for n, v in engine.param_values(torch.float64, "cpu").items()}
    nxt, _ = engine.step(state, acts[k].float(), acts[k].float(), 1e-3, params=p)
    nxt.sum().backward()
    assert torch.isfinite(state.grad).all()
    assert all(torch.isfinite(v.grad).all() for v in p.values() if v.grad is not None)
    assert state.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_lanes_coupled_solve_does_not_depend_on_its_neighbours(dtype):
    """The kernel solves the lanes of a vector together, over the union of their rods: a
    lane's rods alone enter its solve, so each sample's rollout is bit for bit the same
    beside other samples (the batch reversed puts each in another lane, beside others,
    some touching and some not)."""
    robot = _fat_three_bar("soft", 4)
    engine = TensegrityEngine(robot)
    episodes = _episodes(robot, floor=True, seeds=tuple(range(3, 13)), steps=200)
    inputs = [torch.as_tensor(x).to(dtype) for x in episodes]
    with torch.no_grad():
        out, _ = native.NativeRollout(engine).rollout(*inputs, robot.dt)
        back, _ = native.NativeRollout(engine).rollout(*(x.flip(0) for x in inputs), robot.dt)
    touching = _touching(engine, out.double())
    assert touching.double().mean() > 0.2
    assert (touching != touching[:1]).any()                           # lanes of a step differ
    assert torch.equal(out, back.flip(0))
