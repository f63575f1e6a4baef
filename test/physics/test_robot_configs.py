"""Every robot description in `config/` is one the stack can play: MuJoCo settles it on the
floor, and the engine, started in that rest pose at the same commands, stays there."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tensegrity_engine.groundtruth import environments
from tensegrity_engine.physics import collision, native
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.state import center_of_mass

CONFIG = Path(__file__).resolve().parents[2] / "config"
ROBOTS = sorted(p.stem for p in CONFIG.glob("*.yaml") if "rods" in (yaml.safe_load(p.read_text()) or {}))
TOUCHING = {"two_rod_cross"}        # its rods are pressed into each other by design


def test_the_robot_descriptions_are_found():
    assert {"superball", "three_bar", "four_bar", "six_prism", "two_rod_cross"} <= set(ROBOTS)


@pytest.mark.parametrize("name", ROBOTS)
def test_every_robot_rests_on_the_floor_in_mujoco_and_in_the_engine(name):
    robot = load_robot(name)
    rest, act = environments.rest_pose(robot)
    assert np.isfinite(rest).all() and np.abs(rest[:, 7:]).max() < 1e-3      # settled: at rest
    engine = TensegrityEngine(robot)
    s0, a0 = torch.as_tensor(rest)[None], torch.as_tensor(act)[None]
    steps = int(round(1.0 / robot.dt))
    cmds = a0[:, None].expand(1, steps, -1).contiguous()
    with torch.no_grad():
        out, _ = native.NativeRollout(engine).rollout(s0, a0, cmds, robot.dt)
    mass = torch.as_tensor(robot.rod_mass)
    drift = (center_of_mass(out[0], mass) - center_of_mass(s0[0], mass)).norm(dim=-1).max()
    assert drift < 0.005                                                    # its contact law is not MuJoCo's: mm
    assert out[0, -1, :, 7:].abs().max() < 0.02
    k = engine.constants(torch.float64, "cpu")
    depth = collision.rod_rod_contacts(engine.end_nodes(out[0, -1]), torch.as_tensor(robot.rod_radius),
                                       k["pair_a"], k["pair_b"]).depth
    assert bool((depth > 0).any()) == (name in TOUCHING)                    # rods apart, but the cross's
