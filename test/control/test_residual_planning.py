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
    torch.manual_seed(0)
    model = ResidualModel(robot, hidden=8)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
        model.scale.fill_(1e-3)
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
