"""The ``implicitfast`` integrator: MuJoCo's implicitfast for free rods, as a model structure."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from tensegrity_engine.groundtruth import environments
from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin
from tensegrity_engine.groundtruth.realisation import Realisation
from tensegrity_engine.physics.config import ConfigError, load_robot, robot_from_dict, robot_to_dict
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.stability import stable_substeps
from tensegrity_engine.physics.state import center_of_mass, initial_rod_state

torch.set_num_threads(2)


def _damped(name: str, factor: float):
    """The config's robot with ``factor`` x its cable damping, 30 % of it acting on slack
    cables too, stepped with implicitfast."""
    base = load_robot(name)
    return base.replace(cable_damping=base.cable_damping * factor,
                        cable_slack_damping=np.full(base.num_cables, 0.3), integrator="implicitfast")


def _episode(robot, spin: bool):
    rng = np.random.default_rng(0)
    s0, a0, cmds, wr = environments.sample_noncontact_episode(robot, rng, 1000)
    if spin:   # gyroscopic torques that matter: every free rod spins at a few rad/s
        s0[1:, 10:13] += rng.normal(0.0, 4.0, (robot.num_rods - 1, 3))
    cmds[500:] = robot.command_high        # cables let out: slack, where only the tendon share damps
    return s0, a0, cmds, wr


def _run(engine, episode, integrator=None):
    s0, a0, cmds, wr = (torch.as_tensor(x) for x in episode)
    with torch.no_grad():
        states, acts = engine.rollout(s0, a0, cmds, 1e-3, integrator=integrator, wrenches=wr)
    return states, acts


@pytest.mark.parametrize("name", ["three_bar", "superball"])
def test_implicitfast_is_mujocos_implicitfast(name):
    """Same values, no floor: the engine's implicitfast and MuJoCo's take the same steps
    (measured: positions 2e-15 m, velocities 3e-13 m/s over 1 s), with heavily damped
    cables, slack ones among them, and spinning rods; the semi-implicit step of the same
    values is far off, so the structure is what matches."""
    robot = _damped(name, 8.0)
    episode = _episode(robot, spin=True)
    twin = MujocoTwin(robot, floor=False, fixed_rods=(0,), nthread=1)
    assert twin.realisation == Realisation.twin_of(robot) and twin.realisation.integrator == "implicitfast"
    mj, _ = twin.rollout(*(x[None] for x in episode))
    mj = torch.as_tensor(mj[0])
    engine = TensegrityEngine(robot, fixed_rods=(0,), floor=False)
    states, acts = _run(engine, episode)
    # The run has what it claims: spin, and cables whose clamped (taut-only) part both pulls
    # (implicit in MuJoCo) and is off (there only the tendon share is implicit).
    assert mj[..., 1:, 10:13].norm(dim=-1).max() > 2.0
    p = engine.param_values(torch.float64, "cpu")
    with torch.no_grad():
        pulls = engine.force_model(states.transpose(-1, -2), engine.rest_lengths(acts, p), p, keep=True)["stretch"] > 0
    assert pulls.any() and (~pulls).sum() > 100
    assert (states[..., 0:3] - mj[..., 0:3]).abs().max() < 1e-10
    assert (states[..., 7:13] - mj[..., 7:13]).abs().max() < 1e-9
    m = torch.as_tensor(robot.rod_mass)
    semi, _ = _run(engine, episode, integrator="semi_implicit")
    gap = (center_of_mass(semi, m) - center_of_mass(mj, m)).norm(dim=-1)
    assert not torch.isfinite(gap).all() or gap.max() > 1e-3


def test_implicitfast_needs_no_substeps_for_damping():
    """Cables damped 40x: the semi-implicit 1 ms step is past its limit (sub-steps) and its
    1 ms rollout runs away; implicitfast takes 1 ms steps and stays bounded."""
    robot = _damped("three_bar", 40.0)
    params = PhysicalParameters(robot)
    engine = TensegrityEngine(robot, params, fixed_rods=(0,), floor=False)
    values = engine.param_values(torch.float64, "cpu")
    assert stable_substeps(engine.topology, values, 1e-3, floor=False, integrator="semi_implicit") > 1
    assert stable_substeps(engine.topology, values, 1e-3, floor=False, integrator="implicitfast") == 1
    episode = _episode(robot, spin=False)
    fast, _ = _run(engine, episode)
    semi, _ = _run(engine, episode, integrator="semi_implicit")
    assert torch.isfinite(fast).all() and fast[..., 7:10].abs().max() < 10.0
    assert not torch.isfinite(semi).all() or semi[..., 7:10].abs().max() > 100.0


def test_implicitfast_gradcheck():
    """d(next state)/d(state, damping, stiffness, mass) matches finite differences, with
    taut cables in the implicit block."""
    robot = _damped("three_bar", 4.0)
    engine = TensegrityEngine(robot, fixed_rods=(0,), floor=False)
    g = torch.Generator().manual_seed(3)
    state = torch.as_tensor(initial_rod_state(robot))
    state[1:, 7:13] += 0.3 * torch.randn(state[1:, 7:13].shape, generator=g, dtype=state.dtype)
    base = {k: v.detach().clone() for k, v in engine.param_values(torch.float64, "cpu").items()}
    act = engine.initial_act(state) - 0.05
    command = act - 0.02
    assert (engine.cable_tensions(state, act) > 1.0).any()
    names = ("cable_damping", "cable_stiffness", "rod_mass", "cable_slack_damping")

    def one_step(s, *values):
        p = {**base, **dict(zip(names, values))}
        return engine.step(s, act, command, 2e-3, integrator="implicitfast", params=p)[0]

    inputs = (state.requires_grad_(True), *[base[n].clone().requires_grad_(True) for n in names])
    assert torch.autograd.gradcheck(one_step, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_integrator_is_part_of_the_robot_model(tmp_path):
    """engine.integrator round-trips through YAML, is the engine's default, and a value
    that is not a model integrator is refused naming the field."""
    robot = _damped("three_bar", 1.0)
    data = robot_to_dict(robot)
    assert data["engine"]["integrator"] == "implicitfast"
    assert "integrator" not in robot_to_dict(load_robot("three_bar"))["engine"]
    again = robot_from_dict(yaml.safe_load(yaml.safe_dump(data)))
    assert again.integrator == "implicitfast"
    episode = _episode(robot, spin=True)
    engine = TensegrityEngine(robot, fixed_rods=(0,), floor=False)
    default, _ = _run(engine, episode)
    named, _ = _run(engine, episode, integrator="implicitfast")
    assert torch.equal(default, named)
    data["engine"]["integrator"] = "RK4"
    with pytest.raises(ConfigError, match="engine.integrator"):
        robot_from_dict(data)


def test_an_identified_implicitfast_model_is_planned_with_it(tmp_path):
    """The planner steps the model it is given the way that model steps: an implicitfast
    model loaded from its YAML onto the semi-implicit config (`params_from_file`), also when
    it is swapped in later; an integrator given explicitly stays."""
    from tensegrity_engine.control.dynamics import EngineDynamics
    from tensegrity_engine.physics.parameter_files import export_yaml, params_from_file

    config = load_robot("three_bar")
    identified = PhysicalParameters(_damped("three_bar", 2.0))
    export_yaml(identified, tmp_path / "identified.yaml")
    params = params_from_file(config, tmp_path / "identified.yaml")
    assert params.robot.integrator == "implicitfast"
    dyn = EngineDynamics(config, params, dtype=torch.float64)
    assert dyn.integrator == "implicitfast" and dyn._native.integrator == "implicitfast"
    swapped = EngineDynamics(config, dtype=torch.float64)
    assert swapped.integrator == "semi_implicit"
    swapped.set_params(params)
    assert swapped.integrator == "implicitfast" and swapped._native.integrator == "implicitfast"
    pinned = EngineDynamics(config, integrator="semi_implicit", dtype=torch.float64)
    pinned.set_params(params)
    assert pinned.integrator == "semi_implicit"
