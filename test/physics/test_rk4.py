"""The ``rk4`` integrator: the classic four-stage Runge-Kutta step, as a model structure."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tensegrity_engine.groundtruth import environments
from tensegrity_engine.groundtruth.realisation import Realisation
from tensegrity_engine.physics.config import ConfigError, load_robot, robot_from_dict, robot_to_dict
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.stability import stable_substeps
from tensegrity_engine.physics.state import center_of_mass

torch.set_num_threads(2)


def _fine(engine, s0, a0, cmds, dt, k, integrator, wrenches=None):
    """Rollout at dt / k (commands and pushes held), sampled every dt."""
    w = None if wrenches is None else wrenches.repeat_interleave(k, 0)
    with torch.no_grad():
        states, _ = engine.rollout(s0, a0, cmds.repeat_interleave(k, 0), dt / k, integrator=integrator, wrenches=w)
    return states[k - 1::k]


def test_rk4_converges_at_fourth_order_where_the_motion_is_smooth():
    """Hanging, every cable taut and rest lengths held (a smooth right-hand side): halving the
    step cuts rk4's error ~16x (fourth order), the semi-implicit step's ~2x (first)."""
    robot = load_robot("three_bar")
    rng = np.random.default_rng(3)
    s0, a0, _, _ = environments.sample_noncontact_episode(robot, rng, 10)
    s0[1:, 7:13] += rng.normal(0.0, 0.5, (robot.num_rods - 1, 6))       # swing and spin
    steps = 300
    s0, a0 = torch.as_tensor(s0), torch.as_tensor(a0)
    cmds = a0.expand(steps, -1).clone()
    engine = TensegrityEngine(robot, fixed_rods=(0,), floor=False)
    reference = _fine(engine, s0, a0, cmds, 2e-3, 32, "rk4")
    p = engine.param_values(torch.float64, "cpu")
    with torch.no_grad():
        stretch = engine.force_model(reference.transpose(-1, -2), engine.rest_lengths(a0.expand(steps, -1), p), p,
                                     keep=True)["stretch"]
    assert (stretch > 0).all()                         # no cable goes slack: the forces are smooth
    assert (reference[-1, 1:, 0:3] - s0[1:, 0:3]).norm(dim=-1).min() > 0.01   # and the rods move

    def error(integrator, k):
        end = _fine(engine, s0, a0, cmds, 2e-3, k, integrator)[-1]
        return float((end[..., 0:3] - reference[-1, ..., 0:3]).abs().max())

    rk4 = [error("rk4", k) for k in (1, 2)]
    semi = [error("semi_implicit", k) for k in (1, 2)]
    assert rk4[0] / rk4[1] > 12.0
    assert 1.5 < semi[0] / semi[1] < 2.5
    assert rk4[0] < 1e-3 * semi[0]
    assert torch.equal(reference[:, 0], s0[0].expand(steps, -1))        # the fixed rod stays put


def test_rk4_on_the_soft_floor_is_closer_to_the_continuous_motion():
    """Rolling on the soft ground (its constraint solved within each stage): the 1 ms rk4
    rollout stays far closer to the continuous motion (rk4 at 1/8 ms) than the 1 ms
    semi-implicit rollout (the contact's onsets and the soft law's step-dependent
    regularisation keep it from fourth order here), and the robot rolls."""
    base = load_robot("three_bar")
    robot = base.replace(contact=dataclasses.replace(base.contact, law="soft"))
    s0, a0, cmds = (torch.as_tensor(x) for x in environments.sample_contact_episode(
        robot, np.random.default_rng(1), 500)[:3])
    engine = TensegrityEngine(robot, floor=True)
    m = torch.as_tensor(robot.rod_mass)
    reference = center_of_mass(_fine(engine, s0, a0, cmds, 1e-3, 8, "rk4"), m)
    gaps = {}
    for integrator in ("rk4", "semi_implicit"):
        com = center_of_mass(_fine(engine, s0, a0, cmds, 1e-3, 1, integrator), m)
        assert float((com[-1] - com[0])[:2].norm()) > 0.05
        gaps[integrator] = float((com - reference).norm(dim=-1).max())
    assert gaps["rk4"] < 0.1 * gaps["semi_implicit"], gaps         # measured 0.065


def test_rk4_is_a_model_structure():
    """A robot model may say ``integrator: rk4``: the YAML round-trips it, its MuJoCo twin
    and export step with MuJoCo's RK4, and it needs no more sub-steps than the semi-implicit
    step; anything else is refused."""
    base = load_robot("three_bar")
    robot = robot_from_dict(robot_to_dict(base.replace(integrator="rk4")))
    assert robot.integrator == "rk4"
    assert Realisation.twin_of(robot).integrator == "RK4"
    with pytest.raises(ConfigError, match="engine.integrator"):
        robot_from_dict({**robot_to_dict(base), "engine": {"integrator": "rk45"}})
    engine = TensegrityEngine(robot, floor=False)
    p = {k: v.detach() for k, v in engine.param_values(torch.float64, "cpu").items()}
    stiff = {**p, "cable_stiffness": p["cable_stiffness"] * 1e5}
    semi = stable_substeps(engine.topology, stiff, robot.dt, floor=False, integrator="semi_implicit")
    assert semi > 10
    assert stable_substeps(engine.topology, stiff, robot.dt, floor=False, integrator="rk4") < semi / 1.3
