"""Ground truths that are not the engine: realisations, the zoo, the mocap sensor model."""
import dataclasses

import mujoco
import numpy as np
import pytest

from tensegrity_engine.groundtruth import environments as envs
from tensegrity_engine.groundtruth.mujoco_twin import GroundTruthDiverged, MujocoTwin, build_mjcf
from tensegrity_engine.groundtruth.realisation import Actuation, Contact, Realisation
from tensegrity_engine.groundtruth.sensors import SensorModel
from tensegrity_engine.groundtruth.zoo import ground_truth, twin_names, twin_robot, zoo_names, zoo_robot
from tensegrity_engine.physics.config import ConfigError
from tensegrity_engine.physics.state import center_of_mass


def _parsed(xml):
    m = mujoco.MjModel.from_xml_string(xml)
    return m


def test_default_realisation_is_the_twin(three_bar):
    a, b = _parsed(build_mjcf(three_bar)), _parsed(build_mjcf(three_bar, realisation=Realisation()))
    for field in ("actuator_gainprm", "actuator_biasprm", "actuator_dynprm", "body_inertia", "geom_solref",
                  "tendon_damping", "tendon_stiffness"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert Realisation().is_twin and not Realisation(integrator="RK4").is_twin


def _rollout(robot, realisation, seconds=1.0, seed=0):
    s0, a0 = envs.rest_pose(robot)                       # the same start for every realisation
    cmd = envs.random_commands(robot, np.random.default_rng(seed), int(round(seconds / robot.dt)))
    with MujocoTwin(robot, realisation=realisation, nthread=1) as twin:
        states, acts = twin.rollout(s0, a0, cmd, record_every=10)
    return states[0], acts[0], cmd


REALISATIONS = {
    "RK4": Realisation(integrator="RK4"),
    "implicitfast": Realisation(integrator="implicitfast"),
    "slack_damping": Realisation(slack_damping=True),
    "elliptic_condim4": Realisation(contact=Contact(condim=4, cone="elliptic", solref=(0.01, 0.8))),
    "spring_length": Realisation(actuation=Actuation("spring_length"), slack_damping=True),
    "motor": Realisation(actuation=Actuation("motor", max_speed=0.2, deadband=0.002)),
    "end_heavy": Realisation(end_mass_fraction=0.6),
}


@pytest.mark.parametrize("name", sorted(REALISATIONS))
def test_every_realisation_runs_and_is_not_the_twin(three_bar, name):
    twin_states, _, _ = _rollout(three_bar, Realisation())
    states, acts, _ = _rollout(three_bar, REALISATIONS[name])
    assert np.isfinite(states).all()
    gap = np.abs(center_of_mass(states[-1], three_bar.rod_mass) - center_of_mass(twin_states[-1], three_bar.rod_mass))
    assert gap.max() > 1e-5, f"{name} moves like the twin: it would not test model mismatch"


def test_motor_is_rate_limited_with_a_dead_band(three_bar):
    speed, band = 0.2, 0.004
    real = Realisation(actuation=Actuation("motor", max_speed=speed, deadband=band))
    s0, a0 = envs.rest_pose(three_bar)
    target = three_bar.command_high.copy()
    cmd = np.broadcast_to(target, (1500, three_bar.num_actuated))
    with MujocoTwin(three_bar, realisation=real, nthread=1) as twin:
        _, acts = twin.rollout(s0, a0, cmd, record_every=1)
    moved = acts[0, 99] - a0                                     # after 0.1 s
    np.testing.assert_array_less(moved, speed * 0.1 + 1e-9)      # a filter would move (hi - a0)(1 - e^-2)
    assert moved.max() > 0.9 * speed * 0.1
    gap = target - acts[0, -1]
    assert (gap <= band + 1e-9).all() and (gap > 0).any()        # stops inside the dead band


def test_slack_damping_acts_on_a_slack_cable(three_bar):
    """Slack cables that change length: a tendon-damped cable's tension is c * ldot (either
    sign); the twin's carries only the config's slack share s of it (1e-3 by default)."""
    s0, a0 = envs.rest_pose(three_bar)
    longest = three_bar.command_high + 0.3                         # act beyond the range: every cable slack
    state = s0.copy()
    state[0, 7:10] = [0.5, 0.3, 0.0]                              # rod 0 moves: its cables change length
    out = {}
    for slack in (False, True):
        with MujocoTwin(three_bar, realisation=Realisation(slack_damping=slack), nthread=1) as twin:
            twin.model.actuator_actrange[:] = [0, 10]
            out[slack] = twin.cable_tensions(state, longest)
    actuated = three_bar.actuated_indices
    assert np.abs(out[True][actuated]).max() > 1.0
    np.testing.assert_allclose(out[False][actuated], three_bar.cable_slack_damping[actuated] * out[True][actuated],
                               rtol=1e-9, atol=1e-12)


def test_end_heavy_inertia(three_bar):
    f = 0.5
    m = _parsed(build_mjcf(three_bar, realisation=Realisation(end_mass_fraction=f)))
    mass, L = three_bar.rod_mass[0], three_bar.rod_length[0]
    uniform = three_bar.rod_inertia()[0, 0]
    assert m.body_inertia[1, 0] == pytest.approx((1 - f) * uniform + f * mass * L**2 / 4, rel=1e-9)
    assert m.body_inertia[1, 0] > 1.4 * uniform


def test_a_diverging_ground_truth_is_refused(superball):
    """Explicit RK4 with 3x the cable damping on light rods is past its stability limit:
    MuJoCo resets the robot instead of failing; the twin must say so, not return it."""
    robot = superball.replace(cable_damping=superball.cable_damping * 3, rod_mass=superball.rod_mass * 0.5)
    s0, a0 = envs.hanging_pose(superball)
    cmd = np.broadcast_to(a0, (500, superball.num_actuated))
    with MujocoTwin(robot, realisation=Realisation(integrator="RK4"), nthread=1, floor=False,
                    fixed_rods=(0,)) as twin:
        with pytest.raises(GroundTruthDiverged, match="diverged"):
            twin.rollout(s0, a0, cmd, record_every=10)
        twin.reset(s0, a0)                      # stepping (the bridge, closed loops) says so too
        with pytest.raises(GroundTruthDiverged, match="diverged after"):
            for _ in range(50):
                twin.step(a0, nsteps=10)
    with MujocoTwin(robot, realisation=Realisation(integrator="implicitfast"), nthread=1, floor=False,
                    fixed_rods=(0,)) as twin:
        assert np.isfinite(twin.rollout(s0, a0, cmd, record_every=10)[0]).all()


@pytest.mark.parametrize("base", ["superball", "three_bar"])
def test_zoo_robots_are_far_from_nominal(base):
    names = zoo_names()
    assert len(names) >= 8
    kinds = set()
    for name in names:
        z = zoo_robot(name, base)
        n, t = z.nominal, z.truth
        ratios = {"K": t.cable_stiffness.mean() / n.cable_stiffness.mean(),
                  "c": t.cable_damping.mean() / n.cable_damping.mean(),
                  "m": t.rod_mass.min() / n.rod_mass.min(),
                  "tau": t.actuator.time_constant / n.actuator.time_constant}
        assert 0.4 <= ratios["K"] <= 1.6 and 0.25 <= ratios["c"] <= 2.1 and 0.65 <= ratios["m"] <= 1.6
        assert 0.5 <= ratios["tau"] <= 4.0 and 0.4 <= t.contact.friction.sliding <= 1.2
        # far: at least two of the four are 20 % or more off
        assert sum(abs(np.log(r)) >= np.log(1.2) for r in ratios.values()) >= 2, (name, ratios)
        assert not z.realisation.is_twin
        kinds |= {z.realisation.integrator, z.realisation.actuation.kind, z.realisation.slack_damping,
                  z.realisation.end_mass_fraction > 0, z.sensing.latency > 0}
        assert z.nominal is not z.truth and t.num_cables == n.num_cables
        # the same robot every time (spread seeded by the name)
        np.testing.assert_array_equal(zoo_robot(name, base).truth.cable_stiffness, t.cable_stiffness)
    assert {"Euler", "implicitfast", "RK4", "filter", "motor", "spring_length", True, False} <= kinds


def test_zoo_errors_are_clear(tmp_path, three_bar):
    with pytest.raises(ConfigError, match="no zoo robot"):
        zoo_robot("nope", three_bar)
    bad = tmp_path / "zoo.yaml"
    bad.write_text("robots:\n  r: {scale: {cable_stiffness: -1}}\n")
    with pytest.raises(ConfigError, match="cable_stiffness"):
        zoo_robot("r", three_bar, path=bad)
    bad.write_text("robots:\n  r: {realisation: {integrator: leapfrog}}\n")
    with pytest.raises(ConfigError, match="integrator"):
        zoo_robot("r", three_bar, path=bad)
    bad.write_text("robots:\n  r: {wheels: 4}\n")
    with pytest.raises(ConfigError, match="unknown key"):
        zoo_robot("r", three_bar, path=bad)
    with pytest.raises(ConfigError, match="topology"):
        ground_truth("superball", three_bar)
    assert ground_truth("twin", three_bar).realisation.is_twin
    assert ground_truth("zoo/payload", three_bar).truth.rod_mass[0] > three_bar.rod_mass[0] * 1.5


def test_a_twin_entry_is_the_engines_twin_with_values_far_from_the_config(superball, tmp_path):
    """``twin/<name>``: the entry's values on the engine's own equations (the realisation
    `Realisation.twin_of` gives the config's twin), an ideal mocap; not a zoo robot; a twin
    entry that names a realisation or sensing is refused."""
    z = ground_truth("twin/as_built", superball)
    assert "as_built" in twin_names() and "as_built" not in zoo_names()
    assert z.realisation == Realisation.twin_of(z.truth) == Realisation.twin_of(superball)
    assert z.sensing.ideal and z.name == "twin/as_built"
    far = {n: np.mean(z.true_values()[n]) / np.mean(v) for n, v in (
        ("cable_stiffness", superball.cable_stiffness), ("cable_damping", superball.cable_damping),
        ("actuator_time_constant", [superball.actuator.time_constant]))}
    assert all(abs(f - 1.0) >= 0.3 for f in far.values()), far
    np.testing.assert_array_equal(z.truth.rod_mass, superball.rod_mass)     # weighed
    with pytest.raises(ConfigError, match="no twin"):
        ground_truth("twin/nope", superball)
    bad = tmp_path / "zoo.yaml"
    bad.write_text("robots:\n  r: {}\ntwins:\n  t: {realisation: {integrator: RK4}}\n")
    with pytest.raises(ConfigError, match="unknown key"):
        twin_robot("t", superball, path=bad)


def test_sensor_model_delays_drops_and_blurs():
    dt = 0.001
    N = 5001
    t = dt * np.arange(N)
    dense = np.zeros((N, 2, 13))
    dense[:, :, 0] = t[:, None]                     # x = t: position reads the time seen
    dense[:, :, 3] = 1.0
    stamps = np.arange(0.1, 5.0, 0.1)
    rng = np.random.default_rng(0)
    late = SensorModel(latency=0.03)
    kept, poses = late.measure(dense, dt, stamps, rng)
    np.testing.assert_allclose(poses[:, 0, 0], stamps - 0.03, atol=1e-9)
    assert (poses[:, :, 7:] == 0).all()
    noisy = SensorModel(position_noise=0.002, rotation_noise=0.01, drop_rate=0.3)
    kept, poses = noisy.measure(dense, dt, np.arange(0.0, 100.0, 0.1), np.random.default_rng(1))
    assert 0.6 < len(kept) / 1000 < 0.8 and kept[0] == 0.0
    err = poses[:, :, 1]                             # y is 0 in truth
    assert 0.0015 < err.std() < 0.0025
    np.testing.assert_allclose(np.linalg.norm(poses[..., 3:7], axis=-1), 1.0, atol=1e-12)
    with pytest.raises(ValueError):
        SensorModel(drop_rate=1.0)
    with pytest.raises(ValueError):
        dataclasses.replace(late, latency=-0.01)


@pytest.mark.parametrize("spec", ["zoo/payload", "zoo/kitchen_sink", "zoo/soft_slow", "twin"])
def test_the_true_contact_is_the_one_mujoco_runs(superball, spec):
    """`true_contact` (what the online bench compares a soft-law fit with) is the solref and
    sliding friction of every geom of the MuJoCo model the robot is played by: the zoo's own
    (payload 5 ms, kitchen_sink 30 ms and 0.7), MuJoCo's default where an entry sets none,
    the config's for the twin."""
    z = ground_truth(spec, superball)
    m = _parsed(build_mjcf(z.truth, realisation=z.realisation))
    true = z.true_contact()
    solref = np.array([true["contact_time_constant"][0], true["contact_damping_ratio"][0]])
    np.testing.assert_allclose(m.geom_solref, np.broadcast_to(solref, m.geom_solref.shape))
    np.testing.assert_allclose(m.geom_friction[:, 0], true["friction_sliding"][0])
    assert true["friction_sliding"][0] == z.true_values()["friction_sliding"][0]
    expected = {"zoo/payload": (0.005, 1.0), "zoo/kitchen_sink": (0.03, 0.7)}.get(spec)
    if expected is not None:
        np.testing.assert_allclose(solref, expected)


def test_a_limited_robots_winch_limit_stays_where_its_filter_is_the_engines(superball):
    """A base with a winch limit: its twin and a zoo robot on the engine's filter keep the
    limit (MuJoCo then drives the rest lengths: `realisation.driven`); a stepped actuation
    has its own speed law (slow_winch's motor, spring_driven's springs), not the base's."""
    limited = superball.replace(actuator=dataclasses.replace(superball.actuator, max_speed=0.3))
    assert twin_robot("as_built", limited).max_speed() == pytest.approx(0.3)
    assert zoo_robot("soft_slow", limited).max_speed() == pytest.approx(0.3)
    assert zoo_robot("slow_winch", limited).max_speed() == pytest.approx(0.25)
    assert zoo_robot("spring_driven", limited).max_speed() > 100.0
    # the base without one: as before
    assert twin_robot("as_built", superball).max_speed() > 100.0


@pytest.mark.parametrize("base", ["superball", "three_bar"])
def test_drawn_robots_are_far_from_nominal_varied_and_the_same_on_every_draw(base):
    """``random/<seed>``: robots nobody tuned for. Every scaled value at least FAR from the
    config's (either way), each seed the same robot every time, and over a few seeds every
    mismatch the zoo knows turns up."""
    from tensegrity_engine.groundtruth.random_robots import FAR, FARTHEST, random_entry

    kinds, sides = set(), set()
    for seed in range(24):
        z = ground_truth(f"random/{seed}", base)
        n, t = z.nominal, z.truth
        payload = t.rod_mass.max() / n.rod_mass.max() > t.rod_mass.min() / n.rod_mass.min() * 1.01
        ratios = {"K": np.exp(np.log(t.cable_stiffness / n.cable_stiffness).mean()),
                  "c": np.exp(np.log(t.cable_damping / n.cable_damping).mean()),
                  "tau": t.actuator.time_constant / n.actuator.time_constant,
                  "m": t.rod_mass.min() / n.rod_mass.min()}
        for key, r in ratios.items():
            # a cable spread moves the geometric mean by a few percent at most
            assert 1 / (FARTHEST * 1.05) <= r <= FARTHEST * 1.05, (seed, key, r)
            if key != "m":
                assert abs(np.log(r)) >= np.log(FAR) - 0.05, (seed, key, r)
            sides.add((key, r > 1))
        assert not z.realisation.is_twin and not z.sensing.ideal
        kinds |= {z.realisation.integrator, z.realisation.actuation.kind, z.realisation.slack_damping,
                  z.realisation.end_mass_fraction > 0, z.realisation.contact.condim, payload}
        assert z.description.startswith("drawn: ")
        again = ground_truth(f"random/{seed}", base)
        np.testing.assert_array_equal(again.truth.cable_stiffness, t.cable_stiffness)
        assert again.realisation == z.realisation and again.sensing == z.sensing
    assert random_entry(0) != random_entry(1)
    assert {"Euler", "implicitfast", "RK4", "filter", "motor", "spring_length", True, False, 4, 6} <= kinds
    assert len(sides) == 8, "every value drawn both above and below the config's"
    for bad in ("random/", "random/x", "random/-1"):
        with pytest.raises(ConfigError, match="random/<seed>"):
            ground_truth(bad, base)


def test_a_drawn_robot_is_never_stepped_past_its_integrators_damping_limit():
    """Euler and RK4 step MuJoCo's tendon damping explicitly: a draw with more damping per
    unit mass than they were measured to take is stepped implicitly instead (it diverged:
    random/2 and random/7 of the first draws)."""
    from tensegrity_engine.groundtruth.random_robots import EXPLICIT_DAMPING_LIMIT, random_entry

    stepped = {}
    for seed in range(60):
        e = random_entry(seed)
        ratio = e["scale"]["cable_damping"] / e["scale"]["rod_mass"]
        integrator, slack = e["realisation"]["integrator"], e["realisation"]["slack_damping"]
        assert ratio <= EXPLICIT_DAMPING_LIMIT[slack].get(integrator, np.inf), (seed, integrator, ratio)
        stepped.setdefault(integrator, []).append(ratio)
    assert max(stepped["implicitfast"]) > EXPLICIT_DAMPING_LIMIT[False]["RK4"]     # the limit was needed
    assert set(stepped) == {"Euler", "RK4", "implicitfast"}


@pytest.mark.parametrize("seed", range(6))
def test_a_drawn_robot_runs_in_mujoco(three_bar, seed):
    z = ground_truth(f"random/{seed}", three_bar)
    states, _, _ = _rollout(z.truth, z.realisation, seconds=0.5, seed=seed)
    assert np.isfinite(states).all()
