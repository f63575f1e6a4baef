"""The explicit-integrator stability bound that identification puts on contact parameters:
under it a rolling robot behaves like the nominal model, well past it the same rollout
gains energy or diverges (so the bound is neither vacuous nor far too tight)."""
import numpy as np
import pytest
import torch

from tensegrity_engine.groundtruth import environments as envs
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.stability import contact_upper_bounds, explicit_step_limit


def _max_speed(robot, values, episode) -> float:
    s0, a0, cmd = episode
    engine = TensegrityEngine(robot, PhysicalParameters(robot, values), floor=True)
    with torch.no_grad():
        states, _ = engine.rollout(torch.as_tensor(s0)[None], torch.as_tensor(a0)[None],
                                   torch.as_tensor(cmd)[None], robot.dt)
    speed = states[..., 7:10].norm(dim=-1).max().item()
    return speed if np.isfinite(speed) else np.inf


@pytest.mark.parametrize("name,past", [("contact_damping", 20.0), ("contact_stiffness", 5.0)])
def test_contact_bound_separates_stable_from_energy_gaining_rollouts(three_bar, name, past):
    robot = three_bar
    episode = envs.sample_contact_episode(robot, np.random.default_rng(0), 1000)[:3]
    nominal = PhysicalParameters(robot)
    limits = contact_upper_bounds(TensegrityEngine(robot, nominal, floor=True).topology,
                                  nominal.values(), robot.dt)
    assert limits[name] > 2 * nominal.as_dict()[name][0]          # the nominal model is inside
    reference = _max_speed(robot, nominal.as_dict(), episode)
    assert 0.5 < reference < 5.0                                   # it rolls
    at = lambda f: _max_speed(robot, {**nominal.as_dict(), name: [f * limits[name]]}, episode)
    assert at(1.0) < 1.1 * reference
    assert at(past) > 1.5 * reference                              # past the bound: energy from nowhere


def test_step_limit_is_the_engine_step_at_the_contact_bounds(three_bar):
    nominal = PhysicalParameters(three_bar)
    topology = TensegrityEngine(three_bar, nominal, floor=True).topology
    limits = contact_upper_bounds(topology, nominal.values(), three_bar.dt)
    # deadbeat on the whole end mass is ANI's stability limit on half of it (relative modes)
    values = {**nominal.as_dict(), "contact_damping": [limits["contact_damping"]], "contact_stiffness": [1.0]}
    assert explicit_step_limit(topology, values, floor=True) == pytest.approx(three_bar.dt, rel=1e-9)


def test_a_model_past_the_step_runs_true_at_the_substeps_it_is_given(superball):
    """SUPERball with 1.4x the cable damping: the config's 1 ms step runs away (2.4x the
    bound), the step `stable_substeps` chooses (0.5 ms) agrees with a 1/8 ms reference up to
    the floor's chaos, and the config's own values keep the 1 ms step."""
    from tensegrity_engine.control.excitation import ExcitationPolicy
    from tensegrity_engine.physics.stability import STEP_MARGIN, modal_step_limit, stable_substeps

    robot = superball
    topology = TensegrityEngine(robot, floor=True).topology
    assert stable_substeps(topology, PhysicalParameters(robot).values(), robot.dt, floor=True) == 1
    damped = PhysicalParameters(robot, {"cable_damping": 1.4 * robot.cable_damping.mean()})
    k = stable_substeps(topology, damped.values(), robot.dt, floor=True)
    assert k == 2 and robot.dt / modal_step_limit(topology, damped.values(), floor=True) > STEP_MARGIN
    # contact damping acts against the ground on the whole end mass: 10x the config's keeps 1 ms
    sticky = PhysicalParameters(robot, {"contact_damping": 10.0 * robot.contact.damping})
    assert stable_substeps(topology, sticky.values(), robot.dt, floor=True) == 1
    s0, a0 = envs.rest_pose(robot)
    cmd = ExcitationPolicy(robot, seed=0, kind="multisine", amplitude=0.8, control_dt=0.1).command_at(
        np.arange(5) * 0.1)
    from tensegrity_engine.physics import native

    engine = TensegrityEngine(robot, damped, floor=True)
    kernel = native.NativeRollout(engine)          # the same step as the torch engine, faster
    p = {name: v.detach() for name, v in damped.values().items()}

    def com_path(n):
        c = torch.as_tensor(np.repeat(cmd, 100 * n, 0))[None]
        states, _ = kernel.rollout(torch.as_tensor(s0)[None], torch.as_tensor(a0)[None], c, robot.dt / n,
                                   record_every=100 * n, params=p)
        return states[0, :, :, :3].mean(-2).numpy()

    reference = com_path(8)
    err = lambda n: np.nan_to_num(np.abs(com_path(n) - reference).max(), nan=np.inf)    # noqa: E731
    assert err(k) < 0.01
    assert err(1) > 10 * err(k)


def test_the_soft_laws_ground_takes_nothing_from_the_explicit_step(three_bar):
    """Under the soft law the ground is an implicit constraint: penalty contact values that
    would need sub-steps under the penalty law need none, and a soft rollout at the config's
    step with a stiff, fast contact (time constant 2 ms, the step's refsafe limit) stays at
    rest on the floor instead of gaining energy."""
    import dataclasses

    from tensegrity_engine.physics.stability import stable_substeps

    soft = three_bar.replace(contact=dataclasses.replace(three_bar.contact, law="soft"))
    stiff = {"contact_stiffness": 50.0 * three_bar.contact.stiffness, "contact_damping": 50.0 * three_bar.contact.damping}
    for robot, expected in ((three_bar, lambda k: k > 1), (soft, lambda k: k == 1)):
        topology = TensegrityEngine(robot, floor=True).topology
        k = stable_substeps(topology, PhysicalParameters(robot, stiff).values(), robot.dt, floor=True)
        assert expected(k), (robot.contact.law, k)
    fast = {**PhysicalParameters(soft).as_dict(), "contact_time_constant": [2.0 * soft.dt]}
    s0, a0 = envs.rest_pose(soft)
    cmd = np.repeat(a0[None], 500, 0)
    speed = _max_speed(soft, fast, (s0, a0, cmd))
    assert speed < 0.05
