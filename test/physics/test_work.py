"""The counted rollout work (`physics.work`): the clock `bench/online.py --clock work` runs on."""
import pytest
import torch

from tensegrity_engine.physics.config import MODEL_INTEGRATORS, load_robot
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.native import NativeRollout
from tensegrity_engine.physics.state import initial_rod_state
from tensegrity_engine.physics.work import METER, REFERENCE_SECONDS, WorkMeter


@pytest.mark.parametrize("integrator", MODEL_INTEGRATORS)
def test_every_native_rollout_counts_its_rod_steps_at_the_integrators_cost(integrator):
    robot = load_robot("three_bar")
    R, A = robot.num_rods, robot.num_actuated
    native = NativeRollout(TensegrityEngine(robot), integrator=integrator)
    x = torch.as_tensor(initial_rod_state(robot), dtype=torch.float64).expand(4, 2, R, 13)
    act = torch.as_tensor(robot.cable_rest_length[robot.actuated_indices], dtype=torch.float64)
    commands = act.expand(4, 2, 5, A)
    steps, seconds = METER.rod_steps, METER.seconds
    with torch.no_grad():
        native.rollout_held(x, act.expand(4, 2, A), commands, 1e-3, hold=3)
    assert METER.rod_steps - steps == 4 * 2 * 5 * 3 * R
    assert METER.seconds - seconds == pytest.approx(4 * 2 * 5 * 3 * R * REFERENCE_SECONDS[integrator])
    # a rollout refused before it runs costs nothing
    with pytest.raises(ValueError), torch.no_grad():
        native.rollout(x[..., :2, :], act.expand(4, 2, A), commands, 1e-3)
    assert METER.rod_steps - steps == 4 * 2 * 5 * 3 * R


def test_the_meter_refuses_an_integrator_it_has_no_cost_for():
    with pytest.raises(KeyError):
        WorkMeter().add("implicit", 10)
    assert set(REFERENCE_SECONDS) == set(MODEL_INTEGRATORS)
