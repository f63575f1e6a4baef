"""The counted rollout work (`physics.work`): the clock `bench/online.py --clock work` runs on."""
import dataclasses

import pytest
import torch

from tensegrity_engine.physics.config import CONTACT_LAWS, MODEL_INTEGRATORS, load_robot
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.native import NativeRollout
from tensegrity_engine.physics.state import initial_rod_state
from tensegrity_engine.physics.work import METER, REFERENCE_SECONDS, WorkMeter


@pytest.mark.parametrize("law", CONTACT_LAWS)
@pytest.mark.parametrize("integrator", MODEL_INTEGRATORS)
def test_every_native_rollout_counts_its_rod_steps_at_its_integrators_and_laws_cost(integrator, law):
    robot = load_robot("three_bar")
    robot = robot.replace(contact=dataclasses.replace(robot.contact, law=law))
    R, A = robot.num_rods, robot.num_actuated
    native = NativeRollout(TensegrityEngine(robot), integrator=integrator)
    x = torch.as_tensor(initial_rod_state(robot), dtype=torch.float64).expand(4, 2, R, 13)
    act = torch.as_tensor(robot.cable_rest_length[robot.actuated_indices], dtype=torch.float64)
    commands = act.expand(4, 2, 5, A)
    steps, seconds = METER.rod_steps, METER.seconds
    with torch.no_grad():
        native.rollout_held(x, act.expand(4, 2, A), commands, 1e-3, hold=3)
    assert METER.rod_steps - steps == 4 * 2 * 5 * 3 * R
    assert METER.seconds - seconds == pytest.approx(4 * 2 * 5 * 3 * R * REFERENCE_SECONDS[(integrator, law)])
    # a rollout refused before it runs costs nothing
    with pytest.raises(ValueError), torch.no_grad():
        native.rollout(x[..., :2, :], act.expand(4, 2, A), commands, 1e-3)
    assert METER.rod_steps - steps == 4 * 2 * 5 * 3 * R


def test_the_meter_refuses_a_structure_it_has_no_cost_for():
    with pytest.raises(KeyError):
        WorkMeter().add("implicit", "soft", 10)
    with pytest.raises(KeyError):
        WorkMeter().add("semi_implicit", "rigid", 10)
    assert set(REFERENCE_SECONDS) == {(i, law) for i in MODEL_INTEGRATORS for law in CONTACT_LAWS}


def test_an_explicit_step_under_the_soft_law_costs_more_than_under_the_penalty_law():
    # the soft law's Newton solve per contact (measured 1.6-2.7x on the floor); a meter
    # that prices both alike lets a soft-law challenger compute for free (four-bar, docs/online_identification.md)
    for integrator in ("semi_implicit", "rk4"):
        assert REFERENCE_SECONDS[(integrator, "soft")] >= 1.5 * REFERENCE_SECONDS[(integrator, "penalty")]
