"""The learned residual (`physics.residual`): it starts as the physics, treats every rod alike
(relabelling rods relabels its output), is the same for a robot turned about the vertical,
runs on any topology, and round-trips through its file without pickling."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.residual import ResidualModel, constant_velocity, load_residual, save_residual
from tensegrity_engine.physics.state import initial_rod_state


def _random_model(robot, seed=0):
    torch.manual_seed(seed)
    model = ResidualModel(robot, hidden=16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
        model.scale.copy_(torch.linspace(0.01, 0.2, 12, dtype=torch.float64))
    return model


def _inputs(robot, seed=1):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.as_tensor(initial_rod_state(robot)).repeat(4, 1, 1)
    x0[..., 7:13] += torch.randn(x0[..., 7:13].shape, generator=g, dtype=torch.float64)
    x_hat = constant_velocity(x0, 0.1)
    x_hat[..., 7:13] += 0.1 * torch.randn(x_hat[..., 7:13].shape, generator=g, dtype=torch.float64)
    rest = torch.as_tensor(robot.cable_rest_length).expand(4, -1) * (1 + 0.05 * torch.rand(4, robot.num_cables, generator=g,
                                                                                            dtype=torch.float64))
    tension = 100.0 * torch.rand(4, robot.num_cables, generator=g, dtype=torch.float64)
    return x0, x_hat, rest, tension


def test_an_untrained_residual_is_the_physics():
    robot = load_robot("superball")
    model = ResidualModel(robot)
    x0, x_hat, rest, tension = _inputs(robot)
    assert torch.equal(model(x0, x_hat, rest, tension, 0.1)[..., 7:13], x_hat[..., 7:13])
    assert torch.allclose(model(x0, x_hat, rest, tension, 0.1), x_hat, atol=1e-15)


def test_relabelling_rods_relabels_the_correction():
    robot = load_robot("three_bar")
    perm = np.array([2, 0, 1])                       # new rod i is old rod perm[i]
    inverse = np.argsort(perm)
    ends = robot.cable_ends.copy()
    ends[..., 0] = inverse[ends[..., 0]]
    relabelled = robot.replace(rod_names=tuple(robot.rod_names[i] for i in perm), rod_end_nodes=robot.rod_end_nodes[perm],
                               rod_mass=robot.rod_mass[perm], rod_radius=robot.rod_radius[perm],
                               rod_length=robot.rod_length[perm], rod_inertia_factor=robot.rod_inertia_factor[perm],
                               cable_ends=ends)
    a = _random_model(robot)
    b = ResidualModel(relabelled, hidden=16)
    b.load_state_dict({k: v for k, v in a.state_dict().items()
                       if k not in ("cable_rod", "cable_end", "other", "half_length", "free")}, strict=False)
    x0, x_hat, rest, tension = _inputs(robot)
    out_a = a.delta(x0, x_hat, rest, tension, 0.1)
    out_b = b.delta(x0[:, perm], x_hat[:, perm], rest, tension, 0.1)
    assert out_a.abs().max() > 1e-3                  # the network does something
    torch.testing.assert_close(out_b, out_a[:, perm], rtol=1e-10, atol=1e-12)


def test_turning_the_robot_about_the_vertical_turns_the_correction():
    robot = load_robot("superball")
    model = _random_model(robot)
    x0, x_hat, rest, tension = _inputs(robot)
    angle = 0.7
    c, s = math.cos(angle), math.sin(angle)
    Rz = torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    qz = torch.tensor([math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2)], dtype=torch.float64)

    def turn(x):
        from tensegrity_engine.physics.state import quat_multiply
        return torch.cat([x[..., 0:3] @ Rz.T, quat_multiply(qz.expand(x.shape[:-1] + (4,)), x[..., 3:7]),
                          x[..., 7:10] @ Rz.T, x[..., 10:13] @ Rz.T], -1)

    d = model.delta(x0, x_hat, rest, tension, 0.1)
    d_turned = model.delta(turn(x0), turn(x_hat), rest, tension, 0.1)
    assert d.abs().max() > 1e-3
    for i in range(4):
        torch.testing.assert_close(d_turned[..., 3 * i:3 * i + 3], d[..., 3 * i:3 * i + 3] @ Rz.T,
                                   rtol=1e-9, atol=1e-12)


def test_file_round_trip_and_topology_check(tmp_path):
    three, six = load_robot("three_bar"), load_robot("superball")
    model = _random_model(three)
    save_residual(model, three, tmp_path / "r.safetensors")
    again = load_residual(three, tmp_path / "r.safetensors")
    x0, x_hat, rest, tension = _inputs(three)
    torch.testing.assert_close(again(x0, x_hat, rest, tension, 0.1), model(x0, x_hat, rest, tension, 0.1))
    with pytest.raises(ValueError, match="another topology"):
        load_residual(six, tmp_path / "r.safetensors")
    moved = load_residual(six, tmp_path / "r.safetensors", any_topology=True)   # the same weights on 6 rods
    x6 = _inputs(six)
    assert torch.isfinite(moved(*x6, 0.1)).all()
    (tmp_path / "bad.safetensors").write_bytes(b"not a file")
    with pytest.raises(Exception):
        load_residual(three, tmp_path / "bad.safetensors")
