"""Planning with physics + a learned residual: each control step is a physics segment
followed by the residual, the same rollout the residual was judged with."""
from __future__ import annotations

import numpy as np
import torch

from tensegrity_engine.control.dynamics import EngineDynamics
from tensegrity_engine.groundtruth import environments
from tensegrity_engine.identification.residual_fit import _Physics, rollout_with_residual
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.residual import ResidualModel


def _random_residual(robot) -> ResidualModel:
    """A residual whose corrections are clearly not zero (seeded)."""
    torch.manual_seed(0)
    model = ResidualModel(robot, hidden=8)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
        model.scale.fill_(1e-3)
    return model


def test_planning_rollouts_apply_the_residual_every_control_step():
    robot = load_robot("three_bar")
    rest, act0 = environments.rest_pose(robot)
    rng = np.random.default_rng(0)
    plans = torch.as_tensor(np.stack([environments.random_commands(robot, rng, 10, hold_range=(0.1, 0.1))
                                      for _ in range(4)]))[:, :10]
    dyn = EngineDynamics(robot, dtype=torch.float64)
    plain = dyn(rest, act0, plans)
    zero = ResidualModel(robot)
    dyn.set_residual(zero)
    torch.testing.assert_close(dyn(rest, act0, plans), plain, rtol=1e-12, atol=1e-12)   # starts as the physics
    model = _random_residual(robot)
    dyn.set_residual(model)
    planned = dyn(rest, act0, plans)
    assert (planned - plain).abs().max() > 1e-4
    physics = _Physics(PhysicalParameters(robot), (), True)
    fine = plans.repeat_interleave(dyn.substeps, dim=1)
    s = torch.as_tensor(rest).expand(4, -1, -1).contiguous()
    a = torch.as_tensor(act0).expand(4, -1).contiguous()
    reference = rollout_with_residual(physics, model, s, a, fine, None, dyn.control_dt)
    torch.testing.assert_close(planned, reference, rtol=1e-9, atol=1e-12)
    dyn.set_residual(None)
    torch.testing.assert_close(dyn(rest, act0, plans), plain)


def test_a_residual_is_applied_only_on_the_physics_it_was_trained_on(tmp_path):
    """A residual records its physics (`physics_fingerprint`, kept through its file); a model
    swapped in by identification leaves it inactive instead of misapplied."""
    from tensegrity_engine.physics.residual import load_residual, physics_fingerprint, save_residual

    robot = load_robot("three_bar")
    rest, act0 = environments.rest_pose(robot)
    plans = torch.as_tensor(np.random.default_rng(1).uniform(robot.command_low, robot.command_high,
                                                             (3, 4, robot.num_actuated)))
    base, heavy = PhysicalParameters(robot), PhysicalParameters(robot, values={"rod_mass": 3.0})
    assert physics_fingerprint(base) != physics_fingerprint(heavy)
    model = _random_residual(robot)
    model.physics = physics_fingerprint(base)
    save_residual(model, robot, tmp_path / "r.safetensors")
    loaded = load_residual(robot, tmp_path / "r.safetensors")
    assert loaded.physics == model.physics
    dyn = EngineDynamics(robot, base, dtype=torch.float64)
    plain = dyn(rest, act0, plans)
    dyn.set_residual(loaded)
    assert dyn.residual_active and (dyn(rest, act0, plans) - plain).abs().max() > 1e-4
    dyn.set_params(heavy)                                   # identification swaps the physics
    assert not dyn.residual_active
    alone = EngineDynamics(robot, heavy, dtype=torch.float64)
    torch.testing.assert_close(dyn(rest, act0, plans), alone(rest, act0, plans))
    dyn.set_params(PhysicalParameters(robot))               # the same values again: active again
    assert dyn.residual_active
