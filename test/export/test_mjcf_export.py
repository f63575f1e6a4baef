"""The calibrated MJCF export (`tensegrity_engine.export.mjcf`): a file MuJoCo loads that
rolls out as the identified engine does."""
import re

import mujoco
import numpy as np
import pytest
import torch

from tensegrity_engine.export import calibrated_mjcf, init_command_history, write_mjcf
from tensegrity_engine.groundtruth import environments
from tensegrity_engine.physics.actuators import delayed_commands
from tensegrity_engine.physics.config import MUJOCO_INTEGRATORS, load_robot
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.state import center_of_mass

FIXED = (environments.NONCONTACT_FIXED_ROD,)


def _identified(robot, rng, delay: float) -> PhysicalParameters:
    """Values far from the config's, per cable and per rod, every structural option on."""
    C, R = robot.num_cables, robot.num_rods
    values = {
        "cable_stiffness": robot.cable_stiffness * rng.uniform(0.6, 1.6, C),
        "cable_damping": robot.cable_damping * rng.uniform(0.5, 2.0, C),
        "cable_slack_damping": rng.uniform(0.05, 0.9, C),
        "rod_mass": robot.rod_mass * rng.uniform(0.8, 1.4, R),
        "rod_inertia_factor": rng.uniform(1.2, 2.5, R),
        "actuator_time_constant": 0.08, "actuator_gain": 1.04, "actuator_offset": 0.01,
        "actuator_delay": delay,
    }
    return PhysicalParameters.keeping_elements(robot, values)


def _episode(robot, steps: int, seed: int):
    rng = np.random.default_rng(seed)
    s0, a0, commands, _ = environments.sample_noncontact_episode(robot, rng, steps)
    commands[steps // 2:] = robot.command_high        # cables let out: slack, where only the tendon damps
    return s0, a0, commands


def _engine_com(params, s0, a0, commands, dt):
    engine = TensegrityEngine(params.robot, params, fixed_rods=FIXED, floor=False)
    c = torch.as_tensor(commands, dtype=torch.float64)
    held = torch.cat([c[:1].expand(200, -1), c], 0)         # the first command held before: the dead time's
    acting = delayed_commands(held, params.value("actuator_delay").detach(), dt)[200:]
    with torch.no_grad():
        states, _ = engine.rollout(torch.as_tensor(s0), torch.as_tensor(a0), acting, dt,
                                   params={k: v.detach() for k, v in params.values().items()})
    return center_of_mass(states, torch.as_tensor(params.to_robot_config().rod_mass)).numpy()


def _mujoco_com(path, robot, s0, a0, commands):
    model = mujoco.MjModel.from_xml_path(str(path))
    data = mujoco.MjData(model)
    free = [r for r in range(robot.num_rods) if r not in FIXED]
    for j, r in enumerate(free):
        data.qpos[7 * j:7 * j + 3] = s0[r, :3]
        data.qpos[7 * j + 3:7 * j + 7] = s0[r, 3:7]
        # free joint: world linear velocity, body-frame angular velocity
        rot = np.zeros(9)
        mujoco.mju_quat2Mat(rot, s0[r, 3:7])
        data.qvel[6 * j:6 * j + 3] = s0[r, 7:10]
        data.qvel[6 * j + 3:6 * j + 6] = rot.reshape(3, 3).T @ s0[r, 10:13]
    A = robot.num_actuated
    data.act[:A] = a0
    init_command_history(model, data, commands[0])
    bodies = [model.body(f"rod{r}").id for r in range(robot.num_rods)]
    mass = model.body_mass[bodies]
    out = []
    for u in commands:
        data.ctrl[:A] = u
        mujoco.mj_step(model, data)
        mujoco.mj_kinematics(model, data)        # xpos of the new qpos (mj_step leaves the old)
        out.append((mass[:, None] * data.xpos[bodies]).sum(0) / mass.sum())
    return np.array(out)


@pytest.mark.parametrize("delay, integrator", [(0.0, "semi_implicit"), (0.0345, "semi_implicit"),
                                               (0.0345, "implicitfast"), (0.0, "rk4")])
def test_exported_model_rolls_out_as_the_identified_engine(tmp_path, delay, integrator):
    """Hanging SUPERball, 1 s of random commands then every cable let out: the exported
    file, loaded by plain MuJoCo, keeps the identified engine's CoM within 5 mm (the
    issue's target; measured ~1e-15 m, a fractional dead time included, for a model stepped
    semi-implicitly or with implicitfast; MuJoCo's RK4 is no round-off twin of the
    engine's rk4, within a millimetre), while the config's values land far off (the
    export carries the values, not the config) and so does the same file without its dead
    time."""
    robot = load_robot("superball").replace(integrator=integrator)
    params = _identified(robot, np.random.default_rng(3), delay)
    export = write_mjcf(params, tmp_path / "identified.xml", floor=False, fixed_rods=FIXED)
    assert f'integrator="{MUJOCO_INTEGRATORS[integrator]}"' in export.xml
    # nothing left out without contact, but that MuJoCo's RK4 is not the engine's rk4
    assert export.notes == (() if integrator != "rk4" else export.notes[:1])
    assert integrator != "rk4" or "RK4" in export.notes[0]
    s0, a0, commands = _episode(robot, 1000, seed=5)
    engine = _engine_com(params, s0, a0, commands, export.timestep)
    mj = _mujoco_com(tmp_path / "identified.xml", robot, s0, a0, commands)
    path = np.linalg.norm(np.diff(engine, axis=0), axis=1).sum()
    assert path > 0.1                                        # it moved
    assert np.linalg.norm(engine[-1] - mj[-1]) < 5e-3
    assert np.abs(engine - mj).max() < 5e-3
    nominal = write_mjcf(PhysicalParameters(robot), tmp_path / "nominal.xml", floor=False, fixed_rods=FIXED)
    assert nominal.timestep == robot.dt
    config_com = _mujoco_com(tmp_path / "nominal.xml", robot, s0, a0, commands)
    assert np.abs(engine - config_com).max() > 10 * max(np.abs(engine - mj).max(), 1e-4)
    if delay:
        text = (tmp_path / "identified.xml").read_text()
        (tmp_path / "no_delay.xml").write_text(re.sub(r'delay="[^"]+"', 'delay="0"', text))
        undelayed = _mujoco_com(tmp_path / "no_delay.xml", robot, s0, a0, commands)
        assert np.abs(engine - undelayed).max() > 10 * max(np.abs(engine - mj).max(), 1e-4)


def test_export_lists_what_mjcf_cannot_say():
    import dataclasses

    base = load_robot("superball")               # the penalty law has no MJCF equivalent (the soft law has)
    robot = base.replace(contact=dataclasses.replace(base.contact, law="penalty"))
    params = PhysicalParameters(robot, {"actuator_max_speed": 0.2, "actuator_delay": -0.01})
    export = calibrated_mjcf(params, floor=True)
    text = " ".join(export.notes)
    assert "max_speed" in text and "negative" in text and "contact" in text
    assert all(n in export.xml for n in export.notes)        # the file says so too
    model = mujoco.MjModel.from_xml_string(export.xml)
    assert (model.actuator_delay == 0).all()
    assert model.ngeom == robot.num_rods + 1                 # rods and the floor
    # hanging, the rods still meet each other under the penalty law: said too, unless they cannot
    hanging = " ".join(calibrated_mjcf(params, floor=False, fixed_rods=(0,)).notes)
    assert "contact between the rods" in hanging and "floor" not in hanging
    apart = robot.replace(contact=dataclasses.replace(robot.contact, rod_rod=False))
    assert not any("contact" in n for n in calibrated_mjcf(PhysicalParameters(apart), floor=False,
                                                           fixed_rods=(0,)).notes)


def test_a_stiff_identified_model_gets_a_step_it_is_stable_at():
    robot = load_robot("superball")
    stiff = PhysicalParameters(robot, {"cable_stiffness": 8e5, "rod_mass": 1.0})
    export = calibrated_mjcf(stiff, floor=False, fixed_rods=FIXED)
    assert export.timestep < robot.dt / 2
    assert mujoco.MjModel.from_xml_string(export.xml).opt.timestep == pytest.approx(export.timestep)


def test_per_cable_values_survive_every_export_path(tmp_path):
    """A model whose cables differ (a file, a published message) is exported cable by cable,
    never averaged: through `keeping_elements` and through the CLI's parameter file."""
    from tensegrity_engine.cli.identify import main as cli_main
    from tensegrity_engine.physics.config import robot_to_yaml

    robot = load_robot("three_bar")
    spread = robot.cable_stiffness * np.linspace(0.7, 1.3, robot.num_cables)
    params = PhysicalParameters.keeping_elements(robot, {"cable_stiffness": spread})
    assert "cable_stiffness" in params.per_element and "cable_damping" not in params.per_element
    np.testing.assert_allclose(params.as_dict()["cable_stiffness"], spread, rtol=1e-9)
    path = tmp_path / "spread.yaml"
    path.write_text(robot_to_yaml(robot.replace(cable_stiffness=spread)))
    assert cli_main(["export", "--params", str(path), "--mjcf", str(tmp_path / "spread.xml")]) == 0
    model = mujoco.MjModel.from_xml_path(str(tmp_path / "spread.xml"))
    order = np.concatenate([robot.actuated_indices, np.flatnonzero(~robot.cable_actuated)])
    np.testing.assert_allclose(-model.actuator_biasprm[:, 1], spread[order], rtol=1e-9)
    assert cli_main(["export", "--params", str(path), "--mjcf", str(tmp_path / "x.xml"), "--fixed-rods", "9"]) == 2


def test_an_exported_robot_yaml_keeps_the_robots_command_rate_limit(tmp_path):
    """The identified values replace the model's; the hardware's safety limit on commands
    (`actuator.max_command_rate`, no model value) comes through the export (it was dropped,
    and a controller loading the export sent commands at any rate)."""
    import dataclasses

    from tensegrity_engine.physics.parameter_files import export_yaml

    robot = load_robot("three_bar")
    robot = robot.replace(actuator=dataclasses.replace(robot.actuator, max_command_rate=0.05))
    params = PhysicalParameters(robot, {"actuator_time_constant": 0.12, "cable_stiffness": 0.8 * robot.cable_stiffness})
    exported = load_robot(export_yaml(params, tmp_path / "identified.yaml"))
    assert exported.actuator.max_command_rate == pytest.approx(0.05)
    assert exported.actuator.time_constant == pytest.approx(0.12)
    np.testing.assert_allclose(exported.cable_stiffness, 0.8 * robot.cable_stiffness, rtol=1e-6)


def test_a_soft_contact_model_rolls_out_as_the_engine_on_the_floor(tmp_path):
    """A SUPERball with the soft contact law and identified values far from MuJoCo's
    defaults (time constant 12 ms, damping ratio 0.8, friction 0.6): the exported file
    carries them, and plain MuJoCo rolls it as the engine does: 0.09 mm off 0.1 s into
    rolling under random commands, against 3.3 mm for the same file with MuJoCo's default
    solref. (The rows and reference accelerations agree to rounding; MuJoCo's Newton stops
    after one iteration here, 1e-8 m short in the first step, and the rolling amplifies
    it: 1 mm at 0.25 s.)"""
    import dataclasses

    base = load_robot("superball")
    robot = base.replace(contact=dataclasses.replace(base.contact, law="soft"))
    params = PhysicalParameters(robot, {"contact_time_constant": 0.012, "contact_damping_ratio": 0.8,
                                        "friction_sliding": 0.6, "cable_stiffness": 8000.0})
    export = write_mjcf(params, tmp_path / "soft.xml", floor=True)
    model = mujoco.MjModel.from_xml_path(str(tmp_path / "soft.xml"))
    np.testing.assert_allclose(model.geom_solref[0], [0.012, 0.8], rtol=1e-9)
    assert not any(n.startswith("contact") for n in export.notes)     # the soft law is MuJoCo's: nothing lost
    rng = np.random.default_rng(4)
    s0, a0, commands = environments.sample_contact_episode(params.to_robot_config(), rng, 500,
                                                           randomize_commands=True)
    engine = TensegrityEngine(robot, params)
    with torch.no_grad():
        states, _ = engine.rollout(*(torch.as_tensor(x) for x in (s0, a0, commands)), robot.dt,
                                   params={k: v.detach() for k, v in params.values().items()})
    mass = torch.as_tensor(robot.rod_mass)
    com = center_of_mass(states, mass).numpy()

    def mujoco_com(path):
        model = mujoco.MjModel.from_xml_path(str(path))
        data = mujoco.MjData(model)
        for r in range(robot.num_rods):
            data.qpos[7 * r:7 * r + 7] = s0[r, :7]
            rot = np.zeros(9)
            mujoco.mju_quat2Mat(rot, s0[r, 3:7])
            data.qvel[6 * r:6 * r + 3] = s0[r, 7:10]
            data.qvel[6 * r + 3:6 * r + 6] = rot.reshape(3, 3).T @ s0[r, 10:13]
        data.act[:robot.num_actuated] = a0
        bodies = [model.body(f"rod{r}").id for r in range(robot.num_rods)]
        out = []
        for u in commands:
            data.ctrl[:robot.num_actuated] = u
            mujoco.mj_step(model, data)
            mujoco.mj_kinematics(model, data)
            out.append((robot.rod_mass[:, None] * data.xpos[bodies]).sum(0) / robot.rod_mass.sum())
        return np.array(out)

    mj = mujoco_com(tmp_path / "soft.xml")
    assert np.linalg.norm(np.diff(com, axis=0), axis=1).sum() > 0.3          # it rolled
    err = np.linalg.norm(com - mj, axis=1)
    assert err[99] < 5e-4
    text = (tmp_path / "soft.xml").read_text()
    (tmp_path / "default.xml").write_text(re.sub(r'solref="[^"]+"', 'solref="0.02 1"', text))
    other = np.linalg.norm(com - mujoco_com(tmp_path / "default.xml"), axis=1)
    assert other[99] > 10 * err[99]
